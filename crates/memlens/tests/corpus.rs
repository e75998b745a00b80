//! The diagnosis on real-world-like recordings (tests/corpus, recorded on an
//! H100: PyTorch's default `stacks="all"`, one-step and forward-only traces,
//! torch.compile, a notebook, Hugging Face, planted leaks under
//! memlens.record, legacy per-block history), checked against the ground
//! truth each recording carries in `NAME.truth.json`.

mod common;

use memlens::analysis::leaks::{find, Confidence, LeakReport};
use memlens::analysis::peak::{peak, PeakReport};
use memlens::analysis::sites::{BEFORE_RECORDING, NO_STACK};
use memlens::analysis::steps::StepMethod;
use memlens::frames::{classify, FrameKind};
use memlens::Snapshot;
use serde_json::Value;
use std::path::PathBuf;

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus")
        .join(name)
}

fn load(name: &str) -> Snapshot {
    Snapshot::load(&corpus(&format!("{name}.pickle.zst"))).expect("corpus file loads")
}

fn truth(name: &str) -> Value {
    let text = std::fs::read_to_string(corpus(&format!("{name}.truth.json"))).expect("truth");
    serde_json::from_str(&text).expect("truth is JSON")
}

/// Every recording of the corpus (final snapshots).
const ALL: [&str; 16] = [
    "default_all",
    "prog_python",
    "prog_all",
    "one_step",
    "forward_only",
    "forward_only_preloaded",
    "compiled",
    "notebook",
    "hf_default",
    "clean",
    "leak_kept_logits",
    "leak_losses",
    "leak_eval_nograd",
    "legacy_kept_logits",
    "legacy_forward_only_list",
    "legacy_oom",
];

/// Runs without a planted leak.
const CLEAN: [&str; 10] = [
    "default_all",
    "prog_python",
    "prog_all",
    "one_step",
    "forward_only",
    "forward_only_preloaded",
    "compiled",
    "notebook",
    "hf_default",
    "clean",
];

const LEAKS: [&str; 3] = ["leak_kept_logits", "leak_losses", "leak_eval_nograd"];

/// A site is either the user's own line or a pseudo-site in angle brackets:
/// never a C/C++/object frame, never generated code, never library code.
fn assert_site_is_users(name: &str, site: &str) {
    if site.starts_with('<') {
        assert!(site.ends_with('>'), "{name}: pseudo-site {site}");
        return;
    }
    let (file, line) = site.rsplit_once(':').expect("file:line");
    assert!(line.parse::<u32>().is_ok(), "{name}: {site}");
    assert_eq!(classify(file, ""), FrameKind::User, "{name}: site {site}");
}

fn assert_sites_are_users(name: &str, p: &PeakReport, l: &LeakReport) {
    for s in &p.live_at_peak {
        assert_site_is_users(name, &s.site);
        for step in &s.path {
            assert_site_is_users(name, step);
        }
    }
    for k in &l.leaks {
        assert_site_is_users(name, &k.site);
    }
}

#[test]
fn no_native_library_or_generated_frame_is_ever_a_site() {
    for name in ALL {
        let snap = load(name);
        let p = peak(&snap, 50);
        let l = find(&[(name.to_string(), &snap)]);
        assert_sites_are_users(name, &p, &l);
        // Where stacks were recorded, nothing is a bare `<no stack>`.
        assert!(
            p.live_at_peak.iter().all(|s| s.site != NO_STACK),
            "{name}: {:?}",
            p.live_at_peak.iter().map(|s| &s.site).collect::<Vec<_>>()
        );
    }
    for name in common::FIXTURES {
        let snap = common::load_cached(name);
        let p = peak(&snap, 50);
        let l = find(&[(name.to_string(), &snap)]);
        assert_sites_are_users(name, &p, &l);
    }
}

#[test]
fn clean_runs_and_one_step_recordings_report_no_leak() {
    for name in CLEAN {
        let snap = load(name);
        let l = find(&[(name.to_string(), &snap)]);
        assert!(
            l.leaks.iter().all(|k| k.confidence == Confidence::Low),
            "{name}: {}",
            l.verdict
        );
        assert!(l.verdict.starts_with("No "), "{name}: {}", l.verdict);
    }
    // The clean run's periodic snapshots, alone and with the final one.
    let files = [
        "clean.step2",
        "clean.step4",
        "clean.step6",
        "clean.step8",
        "clean",
    ];
    let snaps: Vec<Snapshot> = files.iter().map(|f| load(f)).collect();
    let named: Vec<(String, &Snapshot)> = files
        .iter()
        .zip(&snaps)
        .map(|(f, s)| (format!("{f}.pickle.zst"), s))
        .collect();
    for set in [&named[..4], &named[..]] {
        let l = find(set);
        assert!(l.verdict.starts_with("No leak"), "{}", l.verdict);
    }
}

#[test]
fn one_step_and_forward_only_are_one_step_with_no_verdict() {
    for name in ["one_step", "forward_only", "forward_only_preloaded"] {
        let snap = load(name);
        let p = peak(&snap, 10);
        assert_eq!(p.step_count, 1, "{name}");
        assert_eq!(p.step_method, StepMethod::None, "{name}");
        let l = find(&[(name.to_string(), &snap)]);
        assert!(
            l.verdict.starts_with("No verdict: one step"),
            "{name}: {}",
            l.verdict
        );
    }
}

#[test]
fn steps_come_from_markers_when_memlens_recorded_them() {
    for name in [
        "clean",
        "leak_kept_logits",
        "leak_losses",
        "leak_eval_nograd",
    ] {
        let p = peak(&load(name), 10);
        assert_eq!(p.step_method, StepMethod::Markers, "{name}");
        // Eight marked steps (the truth's `steps`); what ran after the last
        // marker only freed (the teardown): not a step (issue 31 item 5).
        assert_eq!(p.step_count, 8, "{name}");
        assert_eq!(p.steps.len(), 8, "{name}");
    }
}

/// Sum of the medium/high findings' growth per step.
fn leaking_per_step(l: &LeakReport) -> u64 {
    l.leaks
        .iter()
        .filter(|k| k.confidence >= Confidence::Medium)
        .map(|k| k.bytes_per_step)
        .sum()
}

fn assert_planted_leak_found(name: &str, l: &LeakReport, how: &str) {
    let t = truth(name);
    let leak = &t["leak"];
    let top = &l.leaks[0];
    assert_eq!(
        top.confidence,
        Confidence::High,
        "{name} {how}: {}",
        l.verdict
    );
    // The allocation's call path from the training loop, as planted.
    let alloc_path: Vec<&str> = leak["alloc_path"]
        .as_array()
        .expect("alloc_path")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for step in &alloc_path {
        assert!(
            top.path.iter().any(|p| p == step),
            "{name} {how}: {step} not in {:?}",
            top.path
        );
    }
    // The bytes kept per step, all growing sites together, within 5%.
    let kept = leak["bytes_kept_per_step"].as_u64().expect("bytes") as f64;
    let found = leaking_per_step(l) as f64;
    assert!(
        (found / kept - 1.0).abs() < 0.05,
        "{name} {how}: {found} vs {kept} per step"
    );
}

#[test]
fn planted_leaks_are_found_from_one_trace() {
    for name in LEAKS {
        let snap = load(name);
        let l = find(&[(name.to_string(), &snap)]);
        assert_planted_leak_found(name, &l, "trace");
    }
}

/// `leaks` over the periodic snapshots `NAME.step{2,4,6,8}` of the corpus.
fn leaks_over_steps(name: &str) -> LeakReport {
    let files: Vec<String> = [2, 4, 6, 8]
        .iter()
        .map(|k| format!("{name}.step{k}"))
        .collect();
    let snaps: Vec<Snapshot> = files.iter().map(|f| load(f)).collect();
    let named: Vec<(String, &Snapshot)> = files
        .iter()
        .zip(&snaps)
        .map(|(f, s)| (format!("{f}.pickle.zst"), s))
        .collect();
    find(&named)
}

#[test]
fn planted_leaks_are_found_from_periodic_snapshots_alone() {
    for name in LEAKS {
        let l = leaks_over_steps(name);
        assert_planted_leak_found(name, &l, "periodic");
        // Rates are per step (snapshots are two steps apart).
        let kept = truth(name)["leak"]["bytes_kept_per_step"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            leaking_per_step(&l) < kept * 21 / 20,
            "{name}: per snapshot, not per step"
        );
    }
}

#[test]
fn eval_without_no_grad_is_told_apart_from_training() {
    // No backward ran in the steps where the eval outputs grew.
    let l = find(&[("e".into(), &load("leak_eval_nograd"))]);
    assert!(
        l.leaks[0].suggestion.contains("no_grad"),
        "{}",
        l.leaks[0].suggestion
    );
    // Training leaks: backward ran, so no_grad is not the advice.
    for name in ["leak_kept_logits", "leak_losses"] {
        let l = find(&[(name.into(), &load(name))]);
        assert!(
            !l.leaks[0].suggestion.contains("no_grad"),
            "{name}: {}",
            l.leaks[0].suggestion
        );
    }
}

#[test]
fn categories_do_not_depend_on_the_recording_mode() {
    let a = peak(&load("prog_python"), 10);
    let b = peak(&load("prog_all"), 10);
    assert_eq!(a.peak_allocated_bytes, b.peak_allocated_bytes);
    assert_eq!(a.categories, b.categories);
    // The hand-written AdamW's state (m, v: 2 x 4 bytes x 7,484,928
    // parameters) is optimizer state, made in its first step.
    let t = truth("one_step");
    let state = t["optimizer_state_bytes"].as_u64().expect("state bytes");
    assert_eq!(a.categories.get("optimizer_state").copied(), Some(state));
}

#[test]
fn weights_moved_to_the_gpu_are_parameters_and_older_memory_is_named() {
    let t = truth("forward_only");
    let p = peak(&load("forward_only"), 10);
    let top = &p.live_at_peak[0];
    assert_eq!(Some(top.site.as_str()), t["lines"]["weights_cuda"].as_str());
    assert_eq!(top.category.as_str(), "parameter");
    let p = peak(&load("forward_only_preloaded"), 10);
    assert_eq!(p.live_at_peak[0].site, BEFORE_RECORDING);
    assert_eq!(p.live_at_peak[0].bytes, top.bytes);
}

#[test]
fn notebook_cells_and_compiled_code_name_the_users_lines() {
    let p = peak(&load("notebook"), 10);
    assert!(
        p.live_at_peak[0].site.starts_with("/tmp/ipykernel_"),
        "{:?}",
        p.live_at_peak[0]
    );
    let t = truth("compiled");
    let forward = t["lines"]["forward_call"].as_str().expect("line");
    let p = peak(&load("compiled"), 50);
    assert!(
        p.live_at_peak
            .iter()
            .all(|s| !s.site.contains("torchinductor")),
        "{:?}",
        p.live_at_peak
    );
    assert!(
        p.live_at_peak
            .iter()
            .any(|s| s.path.iter().any(|x| x == forward)),
        "the compiled forward's call line {forward} is on a site's path"
    );
}

#[test]
fn legacy_history_gives_each_block_its_stack() {
    for name in ["legacy_kept_logits", "legacy_forward_only_list"] {
        let t = truth(name);
        let expected = &t["allocated_by_user_line"][0];
        let p = peak(&load(name), 10);
        let top = &p.live_at_peak[0];
        assert_eq!(Some(top.site.as_str()), expected["site"].as_str(), "{name}");
        assert_eq!(Some(top.bytes), expected["bytes"].as_u64(), "{name}");
        assert_eq!(Some(top.count), expected["count"].as_u64(), "{name}");
    }
}

/// Issue 31 item 1: a series of legacy snapshots (PyTorch <= 2.0: stacks only
/// in each block's history, no trace) finds the leak by the blocks' history:
/// the kept-logits leak's periodic snapshots in that form (`gen/legacy.py`).
#[test]
fn a_leak_is_found_across_legacy_snapshots_by_their_block_history() {
    let l = leaks_over_steps("legacy_kept_logits");
    // Its truth is the recording's: the same call path and bytes a step.
    assert_planted_leak_found("legacy_kept_logits.step8", &l, "legacy series");
    assert_eq!(l.leaks[0].site, "/home/user/proj/model.py:77", "{l:#?}");
}

/// A tensor kept every 10th step of 300 (`gen/leak_every.py`, recorded from
/// the start with PyTorch's default recording): 25.6 KiB a step on average,
/// below the per-step noise floor, and no growth in 9 steps of 10. The same
/// loop keeping nothing is the control.
#[test]
fn a_tensor_kept_every_few_steps_is_a_leak_and_its_control_is_clean() {
    let snap = load("leak_every10");
    let l = find(&[("leak_every10.pickle".to_string(), &snap)]);
    let top = l.leaks.first().expect("a leak");
    assert_eq!(top.site, "/home/user/proj/leak_every.py:23", "{l:#?}");
    assert_eq!(top.confidence, Confidence::High);
    // 30 tensors of 256 KiB (each made after its step's optimizer step, so
    // in the next step: none is in step 1's baseline).
    assert_eq!(top.bytes, 30 * 256 * 1024);
    assert_eq!(top.count, 30);
    // A backward pass runs every step, and the kept tensor is made outside
    // any forward: no no_grad advice.
    assert!(!top.suggestion.contains("no_grad"), "{}", top.suggestion);
    assert!(l.verdict.starts_with("Leak:"), "{}", l.verdict);

    let clean = load("clean_every");
    let l = find(&[("clean_every.pickle".to_string(), &clean)]);
    assert!(
        l.leaks.iter().all(|k| k.confidence == Confidence::Low),
        "{l:#?}"
    );
    assert!(l.verdict.starts_with("No leak"), "{}", l.verdict);
}
