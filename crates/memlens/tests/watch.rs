//! The one replay of a trace keeps states for every analysis (issue 29):
//! each must be the state a replay to that event gives. Checked on every
//! real snapshot, for the replay beside the reader and the one after it.

mod common;

use memlens::replay::during_read::{self, PendingPass, RecordedPasses};
use memlens::replay::initial::before_trace_with;
use memlens::replay::observe::{observe, StateBefore};
use memlens::replay::{state_at, ReplayOptions};
use memlens::Snapshot;
use std::path::PathBuf;

/// The real snapshots of `../shared/fixtures`, `tests/corpus` and its
/// OOM and ranks folders.
fn snapshots() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let corpus = root.join("../../tests/corpus");
    let mut files = Vec::new();
    for dir in [
        common::fixtures_dir(),
        corpus.clone(),
        corpus.join("oom"),
        corpus.join("ranks"),
    ] {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
        for e in entries.flatten() {
            let p = e.path();
            if p.to_string_lossy().ends_with(".pickle.zst") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// Checks every state `pass` kept of trace `trace` against a replay to it.
fn check(name: &str, snap: &Snapshot, pass: &memlens::replay::during_read::PeakPass) -> usize {
    let opts = ReplayOptions::default();
    let device = pass.device;
    let mut checked = 0;
    for s in &pass.watched.spaced {
        assert_eq!(
            *s,
            state_at(snap, device, s.index, &opts),
            "{name}: event {}",
            s.index
        );
        checked += 1;
    }
    if let (Some(st), Some(i)) = (pass.at_peak(), pass.peaks.allocated.1) {
        assert_eq!(st, state_at(snap, device, i, &opts), "{name}: the peak");
        checked += 1;
    }
    for m in &pass.watched.before_oom {
        let mut before = StateBefore::new(m.index);
        observe(snap, device, &opts, &mut [&mut before]);
        let want = before.into_state().expect("the trace reaches its OOM");
        let got = pass.before_oom(snap, m.index).expect("kept");
        assert_eq!(got.segments, want.segments, "{name}: OOM {}", m.index);
        assert_eq!(got.live, want.live, "{name}: OOM {}", m.index);
        assert_eq!(
            (got.allocated, got.reserved, got.peak_reserved),
            (want.allocated, want.reserved, want.peak_reserved),
            "{name}: OOM {}",
            m.index
        );
        assert_eq!(got.warnings, want.warnings, "{name}: OOM {}", m.index);
        checked += 1;
    }
    checked
}

#[test]
fn every_state_the_one_replay_kept_is_the_state_a_replay_to_it_gives() {
    let (mut fed, mut after) = (0, 0);
    for path in snapshots() {
        let name = path.display().to_string();
        let read = during_read::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let snap = &read.snap;
        let Some(trace) = snap.traces.iter().position(|t| !t.events.is_empty()) else {
            continue;
        };
        // The replay beside the reader, where it is the trace's replay.
        if let Some(p) = read.pass.as_deref().and_then(PendingPass::get) {
            let device = snap.traces[trace].device;
            let initial = before_trace_with(snap, device, Some(p));
            if p.fits(snap, device, &initial, &ReplayOptions::default()) {
                fed += check(&name, snap, p);
            }
        }
        // The replay after the read (what a trace that began late gets).
        let own = RecordedPasses::default();
        after += check(&name, snap, &own.of(snap, trace));
    }
    assert!(
        fed > 200 && after > 400,
        "{fed} fed, {after} after the read"
    );
}
