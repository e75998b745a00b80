//! A trace recorded without `free_requested` entries (PyTorch's
//! `_record_memory_history(..., skip_actions=["free_requested"])`, a third
//! fewer entries for torch's `_snapshot()` to convert: the lever on
//! `memlens.record`'s overhead that issue 35 names) reads and diagnoses as
//! the whole trace does: a free is its `free_completed`. Checked on real
//! fixtures by removing those entries from them.

mod common;

use memlens::replay::{Replay, ReplayOptions};
use memlens::snapshot::{Action, Snapshot};

/// `snap` with every `free_requested` entry gone (each event's extras
/// moved to its new index).
fn without_free_requested(snap: &Snapshot) -> Snapshot {
    let mut out = snap.clone();
    for t in &mut out.traces {
        let mut new_index = Vec::with_capacity(t.events.len());
        let mut kept = Vec::with_capacity(t.events.len());
        for e in &t.events {
            new_index.push(kept.len() as u32);
            if e.action != Action::FreeRequested {
                kept.push(*e);
            }
        }
        let events = &t.events;
        t.extras
            .retain(|x| events[x.index as usize].action != Action::FreeRequested);
        for x in &mut t.extras {
            x.index = new_index[x.index as usize];
        }
        t.events = kept;
    }
    out
}

#[test]
fn doctor_says_the_same_without_free_requested_entries() {
    let fixtures = [
        "gpt2_train.pickle.zst",
        "resnet.pickle.zst",
        "oom.at_oom.pickle.zst",
        "varlen.pickle.zst",
        "checkpointed.pickle.zst",
        "cache_leak.step9.pickle.zst",
    ];
    for name in fixtures {
        let whole = Snapshot::load(&common::fixture(name)).expect("reads");
        let cut = without_free_requested(&whole);
        let before: usize = whole.traces.iter().map(|t| t.events.len()).sum();
        let after: usize = cut.traces.iter().map(|t| t.events.len()).sum();
        assert!(
            after * 10 < before * 7,
            "{name}: a free_requested entry per free ({before} -> {after})"
        );
        let opts = memlens::doctor::DoctorOptions::default();
        let text = |s: &Snapshot| {
            let d = memlens::doctor::diagnose(&[(name.to_string(), s)], &opts);
            memlens::render::doctor::text(&d, &[name], false)
        };
        let told = text(&whole);
        assert!(told.contains("Peak:"), "{name}: a diagnosis: {told}");
        assert_eq!(text(&cut), told, "{name}");
    }
}

/// Totals after every event of a replay of device 0.
fn totals(snap: &Snapshot) -> Vec<memlens::replay::Totals> {
    let mut r = Replay::new(snap, 0, &ReplayOptions::default());
    std::iter::from_fn(|| r.step().map(|s| s.totals)).collect()
}

/// Traces that begin after some of their blocks were allocated (a ring
/// that wrapped, or a periodic snapshot of `memlens.record` holding the
/// trace since the one before), recorded without `free_requested`: a free
/// before its allocation is counted at its `free_completed` (as many as
/// the whole trace counts at their `free_requested`), the blocks live when
/// the trace began are allocated, not waiting on a stream, and the replay
/// follows the trace with requests event for event, to the exact end state.
#[test]
fn traces_that_begin_mid_run_read_the_same_without_free_requested() {
    for name in ["gpt2_train", "resnet", "oom", "varlen@expandable"] {
        let whole = common::load_cached(name);
        let full = totals(&whole);
        let n = whole.traces[0].events.len();
        for cut in [n / 3, n / 2, n - 500] {
            // Not between a free's two entries: the whole trace would count
            // that free at its request, before the cut, and not at all.
            let cut = match whole.traces[0].events[cut - 1].action {
                Action::FreeRequested => cut + 1,
                _ => cut,
            };
            let mut begun_late = (*whole).clone();
            begun_late.traces[0].events.drain(..cut);
            begun_late.traces[0].extras.clear();
            let unrequested = without_free_requested(&begun_late);
            let (a, b) = (
                memlens::analysis::summary::summarize(&begun_late),
                memlens::analysis::summary::summarize(&unrequested),
            );
            assert!(
                a.frees_without_alloc > 0,
                "{name} cut {cut}: frees before their allocation"
            );
            assert_eq!(
                b.frees_without_alloc, a.frees_without_alloc,
                "{name} cut {cut}"
            );
            // The replay of the trace begun late follows it event for event
            // (the events kept, by their index in it), up to the end state.
            let late = totals(&begun_late);
            let kept: Vec<usize> = (0..n - cut)
                .filter(|&i| begun_late.traces[0].events[i].action != Action::FreeRequested)
                .collect();
            let mut r = Replay::new(&unrequested, 0, &ReplayOptions::default());
            for &k in &kept {
                let s = r.step().expect("one step an event");
                assert_eq!(s.totals, late[k], "{name} cut {cut}: event {}", cut + k);
            }
            assert_eq!(
                r.totals(),
                *full.last().expect("events"),
                "{name} cut {cut}"
            );
            assert_eq!(r.run().mismatches, 0, "{name} cut {cut}");
        }
    }
}

/// A real recording made as `memlens.record` records by default (torch
/// 2.11 on an H200, `skip_actions=["free_requested"]`; tests/corpus/README):
/// each periodic snapshot's two frees of blocks allocated before its trace
/// are counted and put on memlens.record having begun the trace there, the
/// replay reaches the dumped state, and the diagnosis finds nothing wrong.
#[test]
fn a_real_recording_without_free_requested_reads_whole() {
    for name in [
        "no_free_requested.step2.pickle.zst",
        "no_free_requested.step4.pickle.zst",
        "no_free_requested.pickle.zst",
    ] {
        let snap = Snapshot::load(&corpus(name)).expect("reads");
        let events = &snap.traces[0].events;
        assert!(!memlens::snapshot::records_free_requests(events), "{name}");
        let allocs = events.iter().filter(|e| e.action == Action::Alloc).count();
        let frees = events
            .iter()
            .filter(|e| e.action == Action::FreeCompleted)
            .count();
        assert!(
            allocs > 1000 && frees > 1000,
            "{name}: {allocs} allocs, {frees} frees"
        );
        let s = memlens::analysis::summary::summarize(&snap);
        let begun_by_memlens = s
            .warnings
            .iter()
            .any(|w| w.contains("memlens.record began this trace after step"));
        if name.contains(".step2.") {
            // The first periodic snapshot's trace begins where recording did.
            assert_eq!(s.frees_without_alloc, 0, "{name}");
        } else {
            assert_eq!(s.frees_without_alloc, 2, "{name}");
            assert!(begun_by_memlens, "{name}: {:?}", s.warnings);
        }
        assert!(
            !s.warnings.iter().any(|w| w.contains("max_entries")),
            "{name}: {:?}",
            s.warnings
        );
        let replayed = Replay::new(&snap, 0, &ReplayOptions::default()).run();
        assert_eq!(replayed.mismatches, 0, "{name}: {:?}", replayed.warnings);
        let d = memlens::doctor::diagnose(
            &[(name.to_string(), &snap)],
            &memlens::doctor::DoctorOptions::default(),
        );
        let told = memlens::render::doctor::text(&d, &[name], false);
        assert!(
            told.contains("Verdict: no leak, no OOM, no fragmentation worth fixing."),
            "{name}: {told}"
        );
    }
}

fn corpus(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus")
        .join(name)
}
