//! The capture checks (issue 35 item 3) on the recordings users have: the
//! `stacks="all"` recordings of the corpus (PyTorch's default) are told to
//! record Python stacks; no other fixture or corpus recording (Python
//! stacks, with a trace) raises any check; a snapshot without its trace
//! is told to turn recording on.

mod common;

use memlens::analysis::capture::capture_checks;
use memlens::Snapshot;
use std::path::PathBuf;

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus")
        .join(name)
}

#[test]
fn pytorchs_default_stacks_are_named_with_the_setting_to_change() {
    let snap = Snapshot::load(&corpus("default_all.pickle.zst")).expect("reads");
    let checks = capture_checks(&snap);
    assert_eq!(checks.len(), 1, "{checks:#?}");
    assert_eq!(checks[0].check, "cpp_stacks");
    assert!(checks[0].fix.contains("stacks=\"python\""));
}

#[test]
fn python_stack_recordings_raise_no_capture_check() {
    let mut names: Vec<PathBuf> = Vec::new();
    for dir in [common::fixtures_dir(), corpus("")] {
        for e in std::fs::read_dir(&dir).expect("lists") {
            let p = e.expect("entry").path();
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if n.ends_with(".pickle.zst")
                && !n.starts_with("default_all")
                && !n.starts_with("legacy")
            {
                names.push(p);
            }
        }
    }
    assert!(names.len() > 20, "{names:?}");
    let mut flagged = Vec::new();
    for p in names {
        let Ok(snap) = Snapshot::load(&p) else {
            continue;
        };
        if snap.event_count() == 0 {
            continue; // judged by the test below
        }
        let checks = capture_checks(&snap);
        let n = p
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if !checks.is_empty() {
            assert!(
                checks.iter().all(|c| c.check == "cpp_stacks"),
                "{n}: {checks:#?}"
            );
            flagged.push(n);
        }
    }
    // The recordings tests/corpus/README.md says were made with C++ stacks
    // ("stacks all" in its table, and the two every-N-steps runs), and
    // nothing else.
    flagged.sort();
    assert_eq!(
        flagged,
        [
            "clean_every.pickle.zst",
            "compiled.pickle.zst",
            "hf_default.pickle.zst",
            "leak_every10.pickle.zst",
            "notebook.pickle.zst",
            "one_step.pickle.zst",
            "prog_all.pickle.zst"
        ]
    );
}

#[test]
fn a_snapshot_without_its_trace_is_told_to_turn_recording_on() {
    let mut snap = Snapshot::load(&common::fixture("gpt2_train.pickle.zst")).expect("reads");
    for t in &mut snap.traces {
        t.events.clear();
        t.extras.clear();
    }
    let checks = capture_checks(&snap);
    assert_eq!(checks[0].check, "no_history", "{checks:#?}");
    assert!(checks[0]
        .fix
        .contains("_record_memory_history(max_entries=100_000)"));
    let d = memlens::doctor::diagnose(
        &[("no-trace".to_string(), &snap)],
        &memlens::doctor::DoctorOptions::default(),
    );
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == "capture")
        .expect("a capture finding");
    assert!(f
        .suggestion
        .as_deref()
        .unwrap_or("")
        .contains("memlens.record()"));
}
