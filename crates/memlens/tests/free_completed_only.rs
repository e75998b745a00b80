//! A trace recorded without `free_requested` entries (PyTorch's
//! `_record_memory_history(..., skip_actions=["free_requested"])`, a third
//! fewer entries for torch's `_snapshot()` to convert: the lever on
//! `memlens.record`'s overhead that issue 35 names) reads and diagnoses as
//! the whole trace does: a free is its `free_completed`. Checked on real
//! fixtures by removing those entries from them.

mod common;

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
