//! The `memlens` binary: JSON contract and exit codes.

use std::path::PathBuf;

mod run;
use run::{fixture, json_block, json_snapshot, memlens, memlens_in};

/// Bad input: exit code 2 and exactly one line on stderr naming the file.
fn assert_bad_input(args: &[&str], needle: &str) {
    let out = memlens(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("memlens: error: "), "{err}");
    assert!(err.contains(needle), "{err} should mention {needle}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn summary_json_carries_the_contract_keys() {
    let out = memlens(&["summary", &fixture("gpt2_train.pickle.zst"), "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["schema"], "memlens/1");
    for key in [
        "reserved_bytes",
        "allocated_bytes",
        "active_bytes",
        "requested_bytes",
        "inactive_split_bytes",
        "segments",
        "expandable_ranges",
        "trace_events",
        "largest_free_block_bytes",
        "devices",
    ] {
        assert!(!v[key].is_null(), "missing {key}");
    }
    assert_eq!(v["segments"], 77);
}

#[test]
fn summary_text_is_readable() {
    let out = memlens(&["summary", &fixture("oom.at_oom.pickle.zst")]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("reserved"), "{text}");
    assert!(text.contains("GiB"), "{text}");
    assert!(text.contains("oom 1"), "{text}");
}

#[test]
fn bad_inputs_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pickle");
    std::fs::write(&empty, b"").unwrap();
    assert_bad_input(
        &["summary", empty.to_str().unwrap()],
        "empty.pickle: the file is empty",
    );

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, b"just some text\n").unwrap();
    assert_bad_input(
        &["summary", text.to_str().unwrap()],
        "not a memory snapshot",
    );

    let trunc = dir.path().join("trunc.pickle.zst");
    let zst = std::fs::read(fixture("gpt2_train.pickle.zst")).unwrap();
    std::fs::write(&trunc, &zst[..zst.len() / 2]).unwrap();
    assert_bad_input(&["summary", trunc.to_str().unwrap()], "trunc.pickle.zst");

    let evil = dir.path().join("evil.pickle");
    std::fs::write(
        &evil,
        b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.",
    )
    .unwrap();
    assert_bad_input(
        &["summary", evil.to_str().unwrap()],
        "asks to run code (GLOBAL os.system)",
    );

    assert_bad_input(
        &["summary", "/nonexistent/x.pickle"],
        "/nonexistent/x.pickle: no such file",
    );
    assert_bad_input(&["summary", dir.path().to_str().unwrap()], "is a directory");
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    assert_eq!(memlens(&["summary"]).status.code(), Some(2));
    assert_eq!(memlens(&["no-such-command"]).status.code(), Some(2));
    assert_eq!(memlens(&["--help"]).status.code(), Some(0));
    assert_eq!(memlens(&["--version"]).status.code(), Some(0));
}

#[test]
fn leaks_fail_on_leak_exits_1_only_for_a_leak() {
    let out = memlens(&["leaks", &fixture("cache_leak.pickle.zst"), "--fail-on-leak"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("Leak: 64.00 MiB per step at /home/user/train/workloads.py:75 in forward"),
        "{text}"
    );
    let out = memlens(&["leaks", &fixture("gpt2_train.pickle.zst"), "--fail-on-leak"]);
    assert_eq!(out.status.code(), Some(0));
    let out = memlens(&["leaks", &fixture("gpt2_eval_leak.pickle.zst"), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = &v["leaks"][0];
    for key in [
        "site",
        "function",
        "bytes",
        "bytes_per_step",
        "count",
        "steps",
        "confidence",
        "suggestion",
    ] {
        assert!(!first[key].is_null(), "missing {key}");
    }
}

#[test]
fn diff_json_has_grown_and_shrunk() {
    let out = memlens(&[
        "diff",
        &fixture("gpt2_eval_leak.step1.pickle.zst"),
        &fixture("gpt2_eval_leak.step11.pickle.zst"),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["grown"][0]["site"], "/home/user/train/workloads.py:55");
    assert!(v["shrunk"].is_array());
}

#[test]
fn check_gates_on_the_exact_peak() {
    let f = fixture("gpt2_train.pickle.zst");
    // allocated_bytes.all.peak is 4583255040.
    assert_eq!(
        memlens(&["check", &f, "--max-peak", "4583255040"])
            .status
            .code(),
        Some(0)
    );
    let out = memlens(&["check", &f, "--max-peak", "4583255039", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["peak_allocated_bytes"], 4583255040u64);
    assert_eq!(v["peak_reserved_bytes"], 5169479680u64);
    assert_eq!(
        memlens(&["check", &f, "--max-reserved", "5GiB"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        memlens(&["check", &f, "--max-peak", "lots"]).status.code(),
        Some(2)
    );
}

#[test]
fn doctor_on_the_example_names_the_leak_and_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.html");
    let out = memlens(&["doctor", "-o", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("!! Leak: 498.02 MiB per step at /home/user/train/workloads.py:55"),
        "{text}"
    );
    assert!(text.contains("torch.no_grad()"), "{text}");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("id=\"memlens-data\""));
    for attr in ["src=\"http", "href=\"http", "url(http", "import(\"http"] {
        assert!(
            !html.contains(attr),
            "offline: no external resource ({attr})"
        );
    }
}

#[test]
fn doctor_json_has_findings_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.html");
    let out = memlens(&[
        "doctor",
        &fixture("oom.at_oom.pickle.zst"),
        "-o",
        report.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["findings"][0]["kind"], "oom");
    assert_eq!(v["findings"][0]["severity"], "critical");
    assert_eq!(v["report"], report.to_str().unwrap());
    for key in ["kind", "severity", "title", "site", "bytes"] {
        assert!(v["findings"][0].get(key).is_some(), "{key}");
    }
}

/// memlens in `dir` as the working directory.
#[test]
fn doctor_writes_its_report_beside_the_input_and_never_over_a_users_file() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("run.pickle.zst");
    std::fs::copy(fixture("cache_leak.pickle.zst"), &snap).unwrap();
    let snap_arg = snap.to_str().unwrap();
    let report = dir.path().join("run.memlens.html");
    // --json writes nothing unless asked.
    let out = memlens_in(dir.path(), &["doctor", snap_arg, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!report.exists());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["report"].is_null());
    // Text: beside the snapshot, named after it; again over its own report.
    for _ in 0..2 {
        let out = memlens_in(dir.path(), &["doctor", snap_arg]);
        assert_eq!(out.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&out.stdout).contains("run.memlens.html"));
        assert!(memlens::report::written_by_memlens(&report));
    }
    // A file of the user's at that path is kept, and said so.
    std::fs::write(&report, "my notes").unwrap();
    let out = memlens_in(dir.path(), &["doctor", snap_arg]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "my notes");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no report written"));
    // --force replaces it; the example writes example.memlens.html in the cwd.
    let out = memlens_in(dir.path(), &["doctor", snap_arg, "--force"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(memlens::report::written_by_memlens(&report));
    let out = memlens_in(dir.path(), &["doctor"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(dir.path().join("example.memlens.html").exists());
    assert!(!dir.path().join("memlens-report.html").exists());
}

fn modules_corpus(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/modules")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn modules_truth() -> serde_json::Value {
    let text = std::fs::read_to_string(modules_corpus("truth.json")).expect("truth");
    serde_json::from_str(&text).expect("JSON")
}

#[test]
fn peak_by_module_prints_the_tree_and_its_json_sums_to_the_peak() {
    let snap = modules_corpus("named.pickle.zst");
    let out = memlens(&["peak", &snap, "--by", "module", "--depth", "5"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("transformer.h.1.attn (GPT2Attention)"),
        "{text}"
    );
    let out = memlens(&["peak", &snap, "--by", "module", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["schema"], "memlens/1");
    assert_eq!(v["naming"], "instances");
    let top: u64 = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["bytes"].as_u64().unwrap())
        .sum();
    let want = modules_truth()["named"]["allocated_bytes.all.peak"]
        .as_u64()
        .unwrap();
    assert_eq!(
        (v["peak_allocated_bytes"].as_u64(), top),
        (Some(want), want)
    );
}

#[test]
fn lines_prints_the_planted_sizes() {
    let out = memlens(&[
        "lines",
        &modules_corpus("planted.pickle.zst"),
        "modules.py:planted",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let truth = modules_truth();
    let want = truth["planted"]["lines"].as_object().unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for r in rows {
        let w = &want[&r["line"].to_string()];
        assert_eq!(r["allocated_bytes"], w["allocated"]);
        assert_eq!(r["freed_bytes"], w["freed"]);
        assert_eq!(r["peak_allocated_bytes"], w["peak"]);
    }
}

#[test]
fn a_profiler_trace_is_read_by_summary_and_peak() {
    let trace = modules_corpus("trace.json.zst");
    let max = modules_truth()["trace"]["max_memory_allocated"].clone();
    let out = memlens(&["peak", &trace, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["peak_allocated_bytes"], max);
    let out = memlens(&["summary", &trace]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("A memory snapshot of the same run would add"),
        "{text}"
    );
    // A JSON file that is neither: one line naming the file, exit 2.
    let dir = std::env::temp_dir().join(format!("memlens-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The report: one page with the timeline and the peak by operator.
    let page = dir.join("trace.html");
    let out = memlens(&["report", &trace, "-o", page.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<polyline") && html.contains("aten::linear"),
        "{html}"
    );
    let bad = dir.join("bad.json");
    std::fs::write(&bad, b"{\"traceEvents\": [1, 2").unwrap();
    assert_bad_input(&["peak", bad.to_str().unwrap()], "bad.json");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 31 item 5: the commands that need a snapshot refuse a profiler
/// trace with what reads it instead (exit 2, one line), not with the pickle
/// reader's complaint about its first byte.
#[test]
fn the_commands_that_need_a_snapshot_say_why_a_profiler_trace_is_refused() {
    let trace = modules_corpus("trace.json.zst");
    for args in [
        vec!["doctor", &trace, "--no-report"],
        vec!["leaks", &trace],
        vec!["check", &trace, "--max-peak", "1GiB"],
        vec!["oom", &trace],
        vec!["tune", &trace],
        vec!["simulate", &trace],
    ] {
        assert_bad_input(
            &args,
            "a torch.profiler trace (Chrome JSON), not a memory snapshot: `memlens summary`, `peak` and `report` read it",
        );
    }
}

/// A JSON snapshot compressed with zstd reads like the plain JSON.
#[test]
fn a_compressed_json_snapshot_reads() {
    let dir = tempfile::tempdir().unwrap();
    let json = serde_json::json!({
        "segments": [{"device": 0, "address": 4096, "total_size": 2097152, "stream": 0,
            "segment_type": "small", "allocated_size": 512, "active_size": 512,
            "requested_size": 500, "blocks": [
                {"size": 512, "requested_size": 500, "state": "active_allocated", "frames": []},
                {"size": 2096640, "requested_size": 0, "state": "inactive", "frames": []}]}],
        "device_traces": [[]]})
    .to_string();
    let plain = dir.path().join("s.json");
    std::fs::write(&plain, &json).unwrap();
    let packed = dir.path().join("s.json.zst");
    std::fs::write(&packed, zstd::encode_all(json.as_bytes(), 3).unwrap()).unwrap();
    let a = memlens(&["summary", plain.to_str().unwrap(), "--json"]);
    let b = memlens(&["summary", packed.to_str().unwrap(), "--json"]);
    assert_eq!(
        b.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&b.stderr)
    );
    let (a, b): (serde_json::Value, serde_json::Value) = (
        serde_json::from_slice(&a.stdout).unwrap(),
        serde_json::from_slice(&b.stdout).unwrap(),
    );
    assert_eq!(a["allocated_bytes"], b["allocated_bytes"]);
    assert_eq!(b["allocated_bytes"], 512);
}

/// Issue 31 item 6: `peak` shows one row a line (its categories under it),
/// and `peak --by module` shows what a parent module's bytes are made of.
#[test]
fn peak_rows_name_each_line_once_and_parents_show_their_mix() {
    let out = memlens(&["peak", &fixture("gpt2_eval_leak.pickle.zst")]);
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = text
        .lines()
        .filter(|l| l.contains("blocks") && l.ends_with("workloads.py:55 in w_gpt2_eval_leak"))
        .count();
    assert_eq!(rows, 1, "{text}");
    assert!(
        text.contains("(activation 5.49 GiB, temporary 625.03 MiB)"),
        "{text}"
    );
    let out = memlens(&["peak", "--by", "module", &fixture("gpt2_train.pickle.zst")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(activation 2.47 GiB, other 32.00 MiB)"),
        "{text}"
    );
}

/// Issue 31 item 5: the step table stops at the last step: gpt2_train ran
/// six optimizer steps; what follows the sixth only frees (the teardown).
#[test]
fn the_step_table_stops_at_the_last_step() {
    let snap = fixture("gpt2_train.pickle.zst");
    let out = memlens(&["peak", &snap]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  step   6:"), "{text}");
    assert!(!text.contains("  step   7:"), "{text}");
    let out = memlens(&["peak", &snap, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["step_count"], 6);
    assert_eq!(v["steps"].as_array().unwrap().len(), 6);
}

/// Issue 31 item 2: a folder of runs holds other files: one that is not a
/// snapshot is skipped with a warning naming it and why, and the rest are
/// analysed; the files memlens writes beside snapshots (a holders file, a
/// report) are not taken for snapshots. Named on the command line, a bad
/// file is still the error (exit 2).
#[test]
fn a_bad_file_in_a_folder_is_skipped_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    for n in ["step1", "step5", "step9"] {
        std::fs::copy(
            fixture(&format!("cache_leak.{n}.pickle.zst")),
            dir.path().join(format!("cache_leak.{n}.pickle.zst")),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("broken.pickle"), b"garbage").unwrap();
    std::fs::write(
        dir.path().join("cache_leak.step9.pickle.zst.holders.json"),
        br#"{"format":"memlens-holders/1","sites":{}}"#,
    )
    .unwrap();
    let folder = dir.path().to_str().unwrap();
    for command in ["leaks", "doctor"] {
        let mut args = vec![command, folder];
        if command == "doctor" {
            args.push("--no-report");
        }
        let out = memlens(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{command}: {err}");
        assert_eq!(err.lines().count(), 1, "{command}: {err}");
        assert!(
            err.starts_with("memlens: warning: skipped ") && err.contains("broken.pickle: "),
            "{command}: {err}"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("workloads.py:75"), "{command}: {text}");
    }
    let broken = dir.path().join("broken.pickle");
    assert_bad_input(&["leaks", broken.to_str().unwrap()], "broken.pickle");
}

/// Issue 31 item 2: `leaks` never reads unrelated runs (or the ranks of a
/// job) as one time series: each process is searched on its own and each
/// leak names its process; periodic snapshots of one process stay a series.
#[test]
fn leaks_searches_each_process_on_its_own() {
    let clean = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/clean.pickle.zst")
        .to_string_lossy()
        .into_owned();
    let leaky = fixture("gpt2_eval_leak.pickle.zst");
    let out = memlens(&["leaks", &clean, &leaky, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["method"], "per_process");
    let found: Vec<&serde_json::Value> = v["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["confidence"] != "low")
        .collect();
    assert!(!found.is_empty());
    for l in &found {
        assert_eq!(l["process"], "gpt2_eval_leak.pickle.zst", "{l}");
    }
    // Alone, the leaky run gives the same findings, unlabelled.
    let alone = memlens(&["leaks", &leaky, "--json"]);
    let a: serde_json::Value = serde_json::from_slice(&alone.stdout).unwrap();
    assert_eq!(a["leaks"][0]["site"], found[0]["site"]);
    assert!(a["leaks"][0]["process"].is_null());
    // A series of one process is still read across its snapshots.
    let series: Vec<String> = ["step1", "step5", "step9"]
        .iter()
        .map(|s| fixture(&format!("cache_leak.{s}.pickle.zst")))
        .collect();
    let mut args = vec!["leaks"];
    args.extend(series.iter().map(String::as_str));
    args.push("--json");
    let v: serde_json::Value = serde_json::from_slice(&memlens(&args).stdout).unwrap();
    assert_eq!(v["method"], "across_snapshots");
}

/// Issue 31 item 5: `check` on a trace that began after the allocator did
/// says its verdict covers the recorded window only (text and JSON); on a
/// trace recorded from the start it says nothing more.
#[test]
fn check_says_when_its_verdict_covers_the_recorded_window_only() {
    let late = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/clean.pickle.zst")
        .to_string_lossy()
        .into_owned();
    let out = memlens(&["check", &late, "--max-peak", "100GiB"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("ok: "), "{text}");
    assert!(
        text.contains("this verdict covers the recorded window only"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_slice(
        &memlens(&["check", &late, "--max-peak", "100GiB", "--json"]).stdout,
    )
    .unwrap();
    assert!(v["partial"]
        .as_str()
        .unwrap()
        .contains("recorded window only"));
    let whole = fixture("gpt2_train.pickle.zst");
    let out = memlens(&["check", &whole, "--max-peak", "100GiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("note:"), "{text}");
}

/// Issue 31 item 2: growth of memory with no stack over a few snapshots is
/// not a critical leak (a 12-step DDP folder gave two "!! Leak at <no
/// stack>" findings that a longer run showed to be noise); with a stack, the
/// same growth is.
#[test]
fn growth_with_no_stack_over_few_steps_is_not_of_high_confidence() {
    let dir = tempfile::tempdir().unwrap();
    let mib = 1u64 << 20;
    let frame = serde_json::json!({"filename": "/home/u/train.py", "line": 40, "name": "train"});
    let mut paths = Vec::new();
    for with_stack in [false, true] {
        let mut run = Vec::new();
        for (k, n) in [2u64, 4, 6, 8, 10, 12].into_iter().enumerate() {
            let frames = if with_stack {
                vec![frame.clone()]
            } else {
                vec![]
            };
            let blocks: Vec<serde_json::Value> = (0..n)
                .map(|_| json_block(4 * mib, serde_json::json!(frames)))
                .collect();
            let snap = json_snapshot(blocks);
            let path = dir.path().join(format!("{with_stack}.step{k}.json"));
            std::fs::write(&path, snap.to_string()).unwrap();
            run.push(path.to_string_lossy().into_owned());
        }
        paths.push(run);
    }
    let confidence = |run: &[String]| {
        let mut args = vec!["leaks"];
        args.extend(run.iter().map(String::as_str));
        args.push("--json");
        let v: serde_json::Value = serde_json::from_slice(&memlens(&args).stdout).unwrap();
        (
            v["leaks"][0]["site"].as_str().unwrap_or("").to_string(),
            v["leaks"][0]["confidence"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    };
    assert_eq!(
        confidence(&paths[0]),
        ("<no stack>".to_string(), "medium".to_string())
    );
    assert_eq!(
        confidence(&paths[1]),
        ("/home/u/train.py:40".to_string(), "high".to_string())
    );
}

/// Issue 31 item 3: a holder whose bytes are all of one category, made
/// through two library lines under one user line (a model's layers under
/// `model(x)`), is not "of which <category> <part>" (it read "288.00 MiB,
/// of which parameter 192.00 MiB" when all 288 MiB were parameters).
#[test]
fn a_holder_of_one_category_is_not_said_to_be_part_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let mib = 1u64 << 20;
    let user = serde_json::json!({"filename": "/home/u/train.py", "line": 40, "name": "train"});
    let lib = |file: &str, line: u32| {
        serde_json::json!({"filename": format!("/usr/lib/python3/site-packages/timm/{file}"),
            "line": line, "name": "forward"})
    };
    let mut blocks = Vec::new();
    for _ in 0..3 {
        blocks.push(json_block(
            64 * mib,
            serde_json::json!([lib("models/resnet.py", 90), user]),
        ));
        blocks.push(json_block(
            32 * mib,
            serde_json::json!([lib("layers/mlp.py", 40), user]),
        ));
    }
    let snap = json_snapshot(blocks);
    let path = dir.path().join("s.json");
    std::fs::write(&path, snap.to_string()).unwrap();
    let out = memlens(&["doctor", "--no-report", "--json", path.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let title = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "peak")
        .and_then(|f| f["title"].as_str())
        .unwrap()
        .to_string();
    assert!(
        title.ends_with("largest holder /home/u/train.py:40 (parameter, 288.00 MiB)"),
        "{title}"
    );
    assert!(!title.contains("of which"), "{title}");
}

/// `memlens report --serve`: the address on the first line of stdout, then
/// the page and the state at an event over HTTP; a bad address is one line.
#[test]
fn report_serve_answers_the_page_and_states_over_http() {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args([
            "report",
            &fixture("varlen.pickle.zst"),
            "--serve",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("memlens runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the address");
    let addr = line
        .trim()
        .strip_prefix("http://")
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("an address: {line}"))
        .to_string();
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(&addr).expect("connects");
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("asks");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("answer");
        out
    };
    let page = get("/");
    let state = get("/api/state?event=42");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        page.starts_with("HTTP/1.1 200 OK\r\n"),
        "{}",
        &page[..80.min(page.len())]
    );
    assert!(page.contains("\"state_url\":\"/api/state\""));
    assert!(state.starts_with("HTTP/1.1 200 OK\r\n"));
    let body = state.split("\r\n\r\n").nth(1).expect("a body");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(v["state"]["event_index"], 42);

    let out = memlens(&[
        "report",
        &fixture("varlen.pickle.zst"),
        "--serve",
        "256.0.0.1:1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--serve 256.0.0.1:1: cannot listen"), "{err}");

    let trace = format!(
        "{}/../../tests/corpus/modules/trace.json.zst",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = memlens(&["report", &trace, "--serve", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--serve needs a memory snapshot"), "{err}");
    assert!(out.stdout.is_empty(), "no address printed");
}
