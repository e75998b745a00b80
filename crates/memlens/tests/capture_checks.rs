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

/// Recording turned off before the dump (issue 35): the blocks live at the
/// trace's end that the dump no longer holds are named, with the order to
/// dump in; the whole trace of the same run raises nothing.
#[test]
fn recording_turned_off_before_the_dump_is_named() {
    use memlens::analysis::capture::recording_stopped;
    use memlens::replay::{Replay, ReplayOptions};
    let live_at_end = |snap: &Snapshot| {
        let device = snap.traces[0].device;
        let mut replay = Replay::new(snap, device, &ReplayOptions::default());
        replay.run_to(snap.traces[0].events.len());
        let live: Vec<u64> = replay.live_blocks().iter().map(|b| b.addr).collect();
        (device, live)
    };
    let mut snap = Snapshot::load(&common::fixture("gpt2_train.pickle.zst")).expect("reads");
    let (device, live) = live_at_end(&snap);
    assert!(recording_stopped(&snap, device, &live).is_none());
    // Recording off after 60% of the steps' events; the dump at the end.
    let keep = snap.traces[0].events.len() * 6 / 10;
    snap.traces[0].events.truncate(keep);
    let (device, live) = live_at_end(&snap);
    let c = recording_stopped(&snap, device, &live).expect("named");
    assert_eq!(c.check, "recording_stopped");
    assert!(c.serious);
    assert!(
        c.problem.contains("blocks live at its last event are gone"),
        "{}",
        c.problem
    );
    assert!(c.fix.contains("_dump_snapshot(path)`, then"), "{}", c.fix);
    assert!(c.problem.contains("enabled=\"state\""), "{}", c.problem);
}

/// No recording of the fixtures or the corpus (every one dumped with
/// recording on, OOM handlers and wrapped ring buffers included) ends
/// before its dump.
#[test]
fn no_recording_here_ends_before_its_dump() {
    use memlens::analysis::capture::recording_stopped;
    let mut judged = 0;
    for dir in [
        common::fixtures_dir(),
        corpus(""),
        corpus("oom"),
        corpus("ranks"),
        corpus("fit"),
    ] {
        for e in std::fs::read_dir(&dir).expect("lists") {
            let p = e.expect("entry").path();
            if !p.to_string_lossy().ends_with(".pickle.zst") {
                continue;
            }
            let Ok(snap) = Snapshot::load(&p) else {
                continue;
            };
            for t in snap.traces.iter().filter(|t| t.has_allocations()) {
                let mut replay = memlens::replay::Replay::new(
                    &snap,
                    t.device,
                    &memlens::replay::ReplayOptions::default(),
                );
                replay.run_to(t.events.len());
                let live: Vec<u64> = replay.live_blocks().iter().map(|b| b.addr).collect();
                judged += 1;
                let c = recording_stopped(&snap, t.device, &live);
                assert!(c.is_none(), "{}: {c:#?}", p.display());
            }
        }
    }
    assert!(
        judged > 30,
        "only {judged} recordings replayed beside the reader"
    );
}
