//! `memlens doctor` on several inputs (issue 17): the ranks of one job
//! (tests/corpus/ranks, recorded on one H100 by tests/gpu/ranks.sh) in either
//! file order and from a folder, and unrelated runs analysed one by one.

use std::path::PathBuf;

mod run;
use run::{fixture, memlens};

/// A file of tests/corpus/`folder`.
fn corpus_in(folder: &str, name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus")
        .join(folder)
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn corpus(name: &str) -> String {
    corpus_in("ranks", name)
}

fn truth() -> serde_json::Value {
    let text = std::fs::read_to_string(corpus("ddp_ema.truth.json")).expect("truth");
    serde_json::from_str(&text).expect("json")
}

fn doctor_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    let out = memlens(&all);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The per-rank peaks equal each rank's own `torch.cuda.max_memory_*`, and the
/// imbalance names rank 0, the planted line and its bytes within 5%.
fn assert_planted(v: &serde_json::Value) {
    let t = truth();
    let d = &v["diagnosis"];
    assert_eq!(d["inputs"]["kind"], "ranks");
    let rows = d["ranks"]["ranks"].as_array().expect("rank rows");
    assert_eq!(rows.len(), 2);
    for (row, tr) in rows.iter().zip(t["ranks"].as_array().expect("ranks")) {
        assert_eq!(row["rank"], tr["rank"]);
        assert_eq!(row["peak_allocated_bytes"], tr["max_memory_allocated"]);
        assert_eq!(row["peak_reserved_bytes"], tr["max_memory_reserved"]);
    }
    let f = &v["findings"][0];
    assert_eq!(f["kind"], "imbalance", "{f}");
    assert!(
        f["title"].as_str().expect("title").contains("rank 0"),
        "{f}"
    );
    assert_eq!(f["site"], t["planted"]["line"]);
    let planted = t["planted"]["bytes"].as_f64().expect("bytes");
    let found = f["bytes"].as_f64().expect("bytes");
    assert!(
        (found - planted).abs() <= 0.05 * planted,
        "{found} vs {planted}"
    );
}

#[test]
fn doctor_on_two_ranks_finds_the_planted_copy_in_either_order() {
    let (r0, r1) = (
        corpus("ddp_ema.rank0.pickle.zst"),
        corpus("ddp_ema.rank1.pickle.zst"),
    );
    let a = doctor_json(&[&r0, &r1]);
    let b = doctor_json(&[&r1, &r0]);
    assert_planted(&a);
    assert_planted(&b);
    assert_eq!(
        a["findings"], b["findings"],
        "the verdict does not depend on the file order"
    );
    // The text gives each rank's exact peak.
    let out = memlens(&["doctor", "--no-report", &r1, &r0]);
    let text = String::from_utf8_lossy(&out.stdout);
    for tr in truth()["ranks"].as_array().expect("ranks") {
        let exact = tr["max_memory_allocated"].as_u64().expect("bytes");
        let grouped = exact
            .to_string()
            .as_bytes()
            .rchunks(3)
            .rev()
            .map(|c| std::str::from_utf8(c).expect("digits"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(
            text.contains(&format!("{grouped} B")),
            "{grouped} missing from:\n{text}"
        );
    }
    assert!(text.contains("Imbalance: rank 0"), "{text}");
}

#[test]
fn doctor_takes_a_folder_and_a_pattern_of_ranks() {
    let dir = tempfile::tempdir().expect("tempdir");
    for r in [0, 1] {
        let name = format!("ddp_ema.rank{r}.pickle.zst");
        std::fs::copy(corpus(&name), dir.path().join(&name)).expect("copy");
    }
    std::fs::copy(
        corpus("ddp_ema.truth.json"),
        dir.path().join("ddp_ema.truth.json"),
    )
    .expect("copy");
    assert_planted(&doctor_json(&[dir.path().to_str().expect("utf-8")]));
    let pattern = dir.path().join("*.rank?.pickle.zst");
    assert_planted(&doctor_json(&[pattern.to_str().expect("utf-8")]));
}

#[test]
fn unrelated_runs_each_get_their_own_verdict() {
    let files = [
        fixture("resnet.pickle.zst"),
        fixture("varlen.pickle.zst"),
        fixture("gpt2_eval_leak.pickle.zst"),
    ];
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    let v = doctor_json(&args);
    let d = &v["diagnosis"];
    assert_eq!(d["inputs"]["kind"], "runs");
    assert_eq!(d["parts"].as_array().expect("parts").len(), 3);
    // The leak of the last file alone is not hidden by the others.
    let leak = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["kind"] == "leak")
        .expect("a leak finding");
    assert!(
        leak["title"]
            .as_str()
            .expect("title")
            .starts_with("gpt2_eval_leak.pickle.zst: "),
        "{leak}"
    );
    let out = memlens(&["doctor", "--no-report", &files[0], &files[1], &files[2]]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("unrelated runs"), "{text}");
    assert_eq!(
        text.matches("Verdict:").count(),
        4,
        "one overall, one per run:\n{text}"
    );
}

/// Issue 31 item 2: the JSON `ranks` list sits at the top level of the
/// document, as the contract says, and `doctor -v` prints the summary under
/// the name of the file it describes (the rank closest to OOM, rank 0 here),
/// not under the last file named.
#[test]
fn ranks_are_at_the_top_level_and_the_summary_names_its_own_file() {
    let (r0, r1) = (
        corpus("ddp_ema.rank0.pickle.zst"),
        corpus("ddp_ema.rank1.pickle.zst"),
    );
    let v = doctor_json(&[&r0, &r1]);
    let ranks = v["ranks"].as_array().expect("top-level ranks");
    assert_eq!(ranks.len(), 2);
    for (i, row) in ranks.iter().enumerate() {
        assert_eq!(row["rank"], i as u64);
        for key in [
            "file",
            "device",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
        ] {
            assert!(!row[key].is_null(), "{key} in {row}");
        }
    }
    assert_eq!(v["ranks"], v["diagnosis"]["ranks"]["ranks"]);
    let out = memlens(&["doctor", "-v", "--no-report", &r0, &r1]);
    let text = String::from_utf8_lossy(&out.stdout);
    let after = text.split("--- summary ---").nth(1).expect("a summary");
    let named = after.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    assert!(named.ends_with("ddp_ema.rank0.pickle.zst"), "{named}");
}

/// Issue 31 item 2: over a folder of periodic snapshots of two ranks, each
/// rank's peak is the highest of its snapshots' peaks (the run's peak), not
/// its last snapshot's: here rank 0's higher peak is in its first file.
#[test]
fn each_ranks_peak_is_the_highest_of_its_snapshots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = [
        ("ddp_ema.rank0", "job.rank0.step1"),
        ("ddp_balanced.rank0", "job.rank0.step2"),
        ("ddp_ema.rank1", "job.rank1.step1"),
        ("ddp_balanced.rank1", "job.rank1.step2"),
    ];
    let peak_of = |path: &str| {
        let out = memlens(&["peak", path, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["peak_allocated_bytes"].as_u64().expect("bytes")
    };
    let mut peaks = std::collections::HashMap::new();
    for (from, to) in files {
        let dest = dir.path().join(format!("{to}.pickle.zst"));
        std::fs::copy(corpus(&format!("{from}.pickle.zst")), &dest).expect("copy");
        peaks.insert(to, peak_of(dest.to_str().unwrap()));
    }
    assert!(peaks["job.rank0.step1"] > peaks["job.rank0.step2"]);
    let v = doctor_json(&[dir.path().to_str().unwrap()]);
    let ranks = v["ranks"].as_array().expect("ranks");
    for (rank, row) in ranks.iter().enumerate() {
        let want = (1..=2)
            .map(|s| peaks[format!("job.rank{rank}.step{s}").as_str()])
            .max()
            .unwrap();
        assert_eq!(row["peak_allocated_bytes"], want, "rank {rank}: {row}");
    }
    assert!(ranks[0]["file"]
        .as_str()
        .unwrap()
        .ends_with("job.rank0.step1.pickle.zst"));
}

/// `doctor --json` took its inputs as an A/B pair: two runs, not ranks.
fn assert_ab_runs(v: &serde_json::Value) {
    let inputs = &v["diagnosis"]["inputs"];
    assert_eq!(inputs["kind"], "runs", "{inputs}");
    assert!(
        inputs["reason"]
            .as_str()
            .unwrap()
            .contains("A/B comparison"),
        "{inputs}"
    );
}

/// Issue 31 item 2: one program run twice on one GPU at the same time under
/// different allocator settings (an A/B pair) is two runs, not two ranks.
/// The same pair under one setting, or named as ranks, is still a job.
#[test]
fn an_ab_pair_on_one_gpu_is_two_runs_not_two_ranks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let frame = serde_json::json!({"filename": "/home/u/train.py", "line": 40, "name": "train"});
    let write = |name: &str, conf: &str, expandable: bool, shift: u64| {
        // The same allocations, at about the same times, on device 0 (each
        // process its own addresses and clock ticks).
        let mut events = Vec::new();
        let mut addr = (1u64 << 32) + (shift << 24);
        for k in 0..20u64 {
            let size = (k % 5 + 1) << 20;
            events.push(
                serde_json::json!({"action": "alloc", "addr": addr, "size": size,
                "stream": 0, "time_us": 1_000_000 + 10 * k, "frames": [frame]}),
            );
            events.push(
                serde_json::json!({"action": "free_requested", "addr": addr, "size": size,
                "stream": 0, "time_us": 1_000_005 + 10 * k, "frames": [frame]}),
            );
            events.push(
                serde_json::json!({"action": "free_completed", "addr": addr, "size": size,
                "stream": 0, "time_us": 1_000_006 + 10 * k, "frames": [frame]}),
            );
            addr += size;
        }
        let snap = serde_json::json!({
            "segments": [], "device_traces": [events],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf,
                "expandable_segments": expandable}});
        let path = dir.path().join(name);
        std::fs::write(&path, snap.to_string()).expect("write");
        path.to_string_lossy().into_owned()
    };
    let a = write("run_a.json", "", false, 1);
    let b = write("run_b.json", "expandable_segments:True", true, 2);
    let v = doctor_json(&["--no-report", &a, &b]);
    assert_ab_runs(&v);
    assert!(v["ranks"].is_null());
    // Under one setting, the same pair is one job's two ranks.
    let c = write("run_c.json", "", false, 3);
    let v = doctor_json(&["--no-report", &a, &c]);
    assert_eq!(v["diagnosis"]["inputs"]["kind"], "ranks");
}

fn runs_dir(name: &str) -> String {
    corpus_in("runs", name)
}

fn runs_truth(dir: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(format!("{}/truth.json", runs_dir(dir))).expect("truth");
    serde_json::from_str(&text).expect("json")
}

/// Issue 31 item 2, on a real A/B pair (tests/corpus/runs/ab, recorded on an
/// H200 by tests/corpus/gen/runs.sh): two processes of one program on one GPU
/// at the same time, one with expandable segments. Two runs, each with its
/// own exact peaks, not "rank 0 / rank 1".
#[test]
fn a_recorded_ab_pair_is_two_runs_with_their_own_peaks() {
    let dir = runs_dir("ab");
    let a = format!("{dir}/ab_default.pickle.zst");
    let b = format!("{dir}/ab_expandable.pickle.zst");
    let v = doctor_json(&["--no-report", &a, &b]);
    assert_ab_runs(&v);
    assert!(v["ranks"].is_null(), "no ranks: {}", v["ranks"]);
    let truth = runs_truth("ab");
    for (file, run) in [(&a, "ab_default"), (&b, "ab_expandable")] {
        let p = run::json(&["peak", "--json", file]);
        let stats = &truth["runs"][run]["memory_stats"];
        assert_eq!(
            p["peak_allocated_bytes"], stats["allocated_bytes.all.peak"],
            "{run}"
        );
        assert_eq!(
            p["peak_reserved_bytes"], stats["reserved_bytes.all.peak"],
            "{run}"
        );
    }
}

/// Issue 31 item 2, on a real 12-step DDP folder (tests/corpus/runs/ddp12: two
/// ranks, a snapshot every 2 steps, memory flat from step 1): the ranks of one
/// job with each rank's exact peak, and no leak found from so little
/// evidence: nothing above low confidence, and "no leak" said.
#[test]
fn a_short_clean_ddp_folder_raises_no_leak() {
    let dir = runs_dir("ddp12");
    let truth = runs_truth("ddp12");
    let v = doctor_json(&["--no-report", &dir]);
    assert_eq!(v["diagnosis"]["inputs"]["kind"], "ranks");
    let ranks = v["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2);
    for (r, row) in ranks.iter().enumerate() {
        let stats = &truth["ranks"][format!("rank{r}")]["memory_stats"];
        assert_eq!(
            row["peak_allocated_bytes"], stats["allocated_bytes.all.peak"],
            "rank {r}"
        );
    }
    let text =
        String::from_utf8_lossy(&memlens(&["doctor", "--no-report", &dir]).stdout).into_owned();
    assert!(text.contains("no leak"), "{text}");
    assert!(!text.contains("Leak"), "{text}");
    let l = run::json(&["leaks", "--json", &dir]);
    for leak in l["leaks"].as_array().expect("leaks") {
        assert_eq!(leak["confidence"], "low", "{leak}");
    }
}
