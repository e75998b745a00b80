//! `memlens simulate` and `memlens tune`: JSON contract and exit codes.

mod run;
use run::{fixture, json, memlens};

/// The row of the default settings in `tune`'s ranking.
fn defaults_row(v: &serde_json::Value) -> &serde_json::Value {
    v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["config"] == "")
        .expect("the defaults row")
}

#[test]
fn simulate_json_carries_the_contract_keys() {
    let v = json(&[
        "simulate",
        &fixture("varlen.pickle.zst"),
        "--config",
        "expandable_segments:True",
        "--json",
    ]);
    assert_eq!(v["schema"], "memlens/1");
    // The real varlen@expandable run reserved exactly this much.
    assert_eq!(v["peak_reserved_bytes"], 12847153152u64);
    assert_eq!(v["num_device_alloc"], 67);
    for k in [
        "peak_allocated_bytes",
        "num_device_free",
        "num_alloc_retries",
        "num_ooms",
        "first_oom_index",
        "fragmentation_at_peak",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["segment_sizes"].as_array().map(Vec::len), Some(67));
    assert_eq!(v["recorded"]["peak_reserved_bytes"], 13254000640u64);
}

#[test]
fn simulate_finds_the_oom_under_the_memory_cap() {
    let v = json(&[
        "simulate",
        &fixture("oom.pickle.zst"),
        "--device-memory",
        "85018877624",
        "--memory-fraction",
        "0.1",
        "--overhead",
        "0",
        "--json",
    ]);
    assert_eq!(v["num_ooms"], 1);
    assert_eq!(v["first_oom_index"], 9609);
    assert!(v["first_oom_site"]["site"]
        .as_str()
        .unwrap()
        .contains("workloads.py"));
    let text = memlens(&[
        "simulate",
        &fixture("oom.pickle.zst"),
        "--device-memory",
        "85018877624",
        "--memory-fraction",
        "0.1",
    ]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("first OOM at event #9609"));
}

#[test]
fn tune_ranks_candidates_best_first() {
    let v = json(&["tune", &fixture("varlen.pickle.zst"), "--json"]);
    let c = v["candidates"].as_array().unwrap();
    assert!(c.len() >= 8);
    assert_eq!(c[0]["config"], "expandable_segments:True");
    for w in c.windows(2) {
        let key = |x: &serde_json::Value| {
            (
                x["num_ooms"].as_u64().unwrap(),
                x["peak_reserved_bytes"].as_u64().unwrap(),
            )
        };
        assert!(key(&w[0]) <= key(&w[1]));
    }
    assert!(v["advice"]
        .as_str()
        .unwrap()
        .contains("expandable_segments:True"));
}

#[test]
fn bad_settings_are_usage_errors() {
    for args in [
        vec!["simulate", "X", "--config", "max_split_size_mb:5"],
        vec!["simulate", "X", "--config", "no_such_key:1"],
        vec!["simulate", "X", "--device-memory", "lots"],
        vec!["simulate", "X", "--memory-fraction", "0.5"],
        vec![
            "tune",
            "X",
            "--memory-fraction",
            "2",
            "--device-memory",
            "80GB",
        ],
    ] {
        let snap = fixture("cache_leak.pickle.zst");
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "X" { snap.as_str() } else { a })
            .collect();
        let out = memlens(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("memlens: error: "), "{err}");
    }
}

/// Issue 31 item 5 (open): a run recorded with expandable segments that hit
/// a 4 GiB per-process cap (`tests/corpus/oom/frag_cap_expandable`, H200).
/// From the trace alone the cap is only bounded (at least the most reserved
/// before the OOM, below that plus the failed request: 2.60 to 4.60 GiB);
/// tune uses the lower end, too low for the defaults. Given the run's cap
/// (`--memory-fraction` with `--device-memory`), tune gives the defaults the
/// one OOM and the 3.71 GiB peak the real default run had
/// (`tests/corpus/oom/truth.json`, frag_cap: one OOM, reserved peak 3,984,588,800 B).
#[test]
fn tune_on_an_expandable_run_with_its_cap_matches_the_default_run() {
    let snap = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/oom/frag_cap_expandable.pickle.zst")
        .to_string_lossy()
        .into_owned();
    let cap = 4u64 << 30;
    let total = 150_109_880_320u64;
    let v = json(&[
        "tune",
        &snap,
        "--json",
        "--device-memory",
        &format!("{total}B"),
        "--memory-fraction",
        &format!("{}", cap as f64 / total as f64),
    ]);
    let defaults = defaults_row(&v);
    assert_eq!(defaults["num_ooms"], 1, "{defaults}");
    assert_eq!(
        defaults["peak_reserved_bytes"], 3_984_588_800u64,
        "{defaults}"
    );
    // Without it, the inferred bounds hold the true cap.
    let v = json(&["tune", &snap, "--json"]);
    let lower = v["limits"]["memory_cap"]["bytes"].as_u64().unwrap();
    assert!(lower <= cap, "{lower}");
    assert!(v["limits"]["memory_cap"]["source"]
        .as_str()
        .unwrap()
        .contains("below 4.60 GiB"));
}

/// The same run with the device file `memlens.record` writes beside each
/// snapshot (its total and the per-process fraction): `tune` takes the cap
/// from it, with no flags, and gives the defaults the one OOM and the peak
/// the real default run had; `simulate` and `doctor` read it too.
#[test]
fn tune_takes_the_cap_memlens_record_wrote_beside_the_snapshot() {
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/oom/frag_cap_expandable.pickle.zst");
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("run.oom.pickle.zst");
    std::fs::copy(&src, &snap).unwrap();
    let total = 150_109_880_320u64;
    let fraction = (4u64 << 30) as f64 / total as f64;
    std::fs::write(
        dir.path().join("run.oom.pickle.zst.device.json"),
        format!(
            r#"{{"format": "memlens-device/1", "devices": [{{"device": 0, "total_memory": {total}, "memory_fraction": {fraction}, "free_memory": 146769231872}}]}}"#
        ),
    )
    .unwrap();
    let snap = snap.to_string_lossy().into_owned();
    let v = json(&["tune", &snap, "--json"]);
    let cap = &v["limits"]["memory_cap"];
    assert!(
        cap["source"]
            .as_str()
            .unwrap()
            .contains("recorded by memlens.record"),
        "{cap}"
    );
    assert!(
        cap["bytes"].as_u64().unwrap().abs_diff(4 << 30) <= 1,
        "{cap}"
    );
    assert_eq!(v["limits"]["device_total"]["bytes"], total);
    let defaults = defaults_row(&v);
    assert_eq!(defaults["num_ooms"], 1, "{defaults}");
    assert_eq!(
        defaults["peak_reserved_bytes"], 3_984_588_800u64,
        "{defaults}"
    );
    let sim = json(&["simulate", &snap, "--json"]);
    assert!(sim["limits"]["memory_cap"]["source"]
        .as_str()
        .unwrap()
        .contains("recorded by memlens.record"));
    // `oom` and `doctor` take the total and the cap from it too (no --message).
    let oom = json(&["oom", &snap, "--json"]);
    assert_eq!(
        oom["memory_cap"]["source"], "recorded",
        "{}",
        oom["memory_cap"]
    );
    assert!(
        oom["memory_cap"]["bytes"]
            .as_u64()
            .unwrap()
            .abs_diff(4 << 30)
            <= 1
    );
    assert_eq!(oom["device_memory"]["total_bytes"], total);
    assert_eq!(oom["device_memory"]["total_source"], "memlens.record");
    let doctor = json(&["doctor", &snap, "--json", "--no-report"]);
    assert_eq!(
        doctor["diagnosis"]["oom"]["memory_cap"]["source"], "recorded",
        "{}",
        doctor["diagnosis"]["oom"]["memory_cap"]
    );
    // A bad device file is ignored: the bounds inferred from the OOM again.
    std::fs::write(
        dir.path().join("run.oom.pickle.zst.device.json"),
        "{not json",
    )
    .unwrap();
    let v = json(&["tune", &snap, "--json"]);
    assert!(v["limits"]["memory_cap"]["source"]
        .as_str()
        .unwrap()
        .contains("below 4.60 GiB"));
}
