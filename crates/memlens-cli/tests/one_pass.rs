//! `memlens doctor` replays each trace once under its recorded settings and
//! builds its analysed trace once (issue 29): the counts of
//! [`memlens::work`], as the binary prints them when `MEMLENS_WORK_COUNTS`
//! is set. The what-if simulations (a typed program each) are not counted
//! among the replays under the recorded settings.

mod run;

use std::process::Command;

/// The counts of `memlens ARGS`.
fn counts(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args(args)
        .env("MEMLENS_WORK_COUNTS", "1")
        .output()
        .expect("memlens runs");
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("memlens work counts: "))
        .unwrap_or_else(|| panic!("no counts in: {err}"));
    serde_json::from_str(line).expect("counts are JSON")
}

fn doctor(names: &[&str], report: bool) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("r.html");
    let out = out.to_string_lossy().into_owned();
    let files: Vec<String> = names.iter().map(|n| run::fixture(n)).collect();
    let mut args = vec!["doctor", "--json"];
    if report {
        args.extend(["-o", out.as_str()]);
    } else {
        args.push("--no-report");
    }
    args.extend(files.iter().map(String::as_str));
    counts(&args)
}

#[test]
fn doctor_on_the_oom_with_the_report_replays_once_and_analyses_once() {
    let c = doctor(&["oom.at_oom.pickle.zst"], true);
    assert_eq!(c["recorded_replays"], 1, "{c}");
    assert_eq!(c["analysed_traces"], 1, "{c}");
    // The what-ifs take the state before the trace from that one replay.
    assert_eq!(c["backward_rebuilds"], 0, "{c}");
}

#[test]
fn doctor_without_the_report_on_a_healthy_run_replays_once() {
    let c = doctor(&["gpt2_train.pickle.zst"], false);
    assert_eq!(c["recorded_replays"], 1, "{c}");
    assert_eq!(c["analysed_traces"], 1, "{c}");
    assert_eq!(c["backward_rebuilds"], 0, "{c}");
}

#[test]
fn doctor_on_periodic_snapshots_replays_each_once() {
    let names = [
        "cache_leak.step1.pickle.zst",
        "cache_leak.step5.pickle.zst",
        "cache_leak.step9.pickle.zst",
    ];
    for report in [true, false] {
        let c = doctor(&names, report);
        assert_eq!(c["recorded_replays"], 3, "report {report}: {c}");
        assert_eq!(c["analysed_traces"], 1, "report {report}: {c}");
    }
}

#[test]
fn doctor_on_two_ranks_with_the_report_replays_each_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("r.html");
    let corpus =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/ranks");
    let ranks: Vec<String> = ["ddp_ema.rank0.pickle.zst", "ddp_ema.rank1.pickle.zst"]
        .iter()
        .map(|n| corpus.join(n).to_string_lossy().into_owned())
        .collect();
    let out = out.to_string_lossy().into_owned();
    let c = counts(&["doctor", "--json", "-o", &out, &ranks[0], &ranks[1]]);
    assert_eq!(c["recorded_replays"], 2, "{c}");
    assert_eq!(c["analysed_traces"], 2, "{c}");
}
