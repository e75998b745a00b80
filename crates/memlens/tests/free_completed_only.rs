//! A trace recorded without `free_requested` entries (PyTorch's
//! `_record_memory_history(..., skip_actions=["free_requested"])`, what
//! `memlens.record` records since issue 35: a third fewer entries for
//! torch's `_snapshot()` to convert and pickle) reads and diagnoses as the
//! whole trace does: a free is its `free_completed`. Checked on real
//! fixtures and recordings with those entries removed (the diagnosis, cut
//! traces, OOM explanations and fixes, `fit` from probes and
//! `fit --checkpoint`), and on a real recording made that way.

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

/// A file or folder of tests/corpus.
fn corpus(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus")
        .join(name)
}

/// `v` with every key ending in `_index` or `_indices` and every
/// `alloc_event` and `failing_step_start` (event indices) removed:
/// the same event has another index once the requests are gone.
fn without_indices(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|k, _| {
                !k.ends_with("_index")
                    && !k.ends_with("_indices")
                    && k != "alloc_event"
                    && k != "failing_step_start"
            });
            m.values_mut().for_each(without_indices);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(without_indices),
        _ => {}
    }
}

/// The OOMs of the corpus (first step, warm steps, an eval spike, a
/// fragmentation OOM under a cap, two OOMs in one trace) analysed from
/// traces without `free_requested`: the same cause, step model, batch
/// model and fixes with their figures, but for the events' indices.
#[test]
fn an_oom_without_free_requested_is_explained_the_same() {
    let dir = corpus("oom");
    for name in [
        "gpt_first",
        "gpt_warm",
        "eval_spike",
        "frag_cap",
        "two_ooms",
    ] {
        let whole = Snapshot::load(&dir.join(format!("{name}.pickle.zst"))).expect("reads");
        let cut = without_free_requested(&whole);
        let opts = memlens::oom::OomOptions {
            batch: Some(8),
            ..Default::default()
        };
        let report = |s: &Snapshot| {
            let r = memlens::oom::analyze_snapshot(s, &opts)
                .expect("analysis runs")
                .expect("an OOM");
            let mut v = serde_json::to_value(&r).expect("JSON");
            without_indices(&mut v);
            v
        };
        let (a, b) = (report(&whole), report(&cut));
        assert!(
            a["fixes"].as_array().is_some_and(|f| !f.is_empty()),
            "{name}"
        );
        let differ: Vec<(&String, &serde_json::Value)> = a
            .as_object()
            .expect("an object")
            .iter()
            .filter(|(k, v)| b.get(k.as_str()) != Some(*v))
            .collect();
        for (k, v) in &differ {
            eprintln!(
                "{name} {k}:\n  with requests    {v}\n  without requests {}",
                b[k.as_str()]
            );
        }
        assert!(differ.is_empty(), "{name}: {} keys differ", differ.len());
    }
}

/// `fit --checkpoint` from recordings without `free_requested` (as
/// `memlens.record(model=...)` now records them): the same prediction.
#[test]
fn checkpointing_predicts_the_same_without_free_requested() {
    let dir = corpus("fit/checkpoint");
    for (file, block) in [("gpt.late", "Block"), ("hf_gpt2", "GPT2Block")] {
        let whole = Snapshot::load(&dir.join(format!("{file}.pickle.zst"))).expect("reads");
        let cut = without_free_requested(&whole);
        let opts = memlens::fit::FitOptions::default();
        let predict = |s: &Snapshot| {
            let r = memlens::fit::fit_checkpoint(file, s, block, &opts).expect("a prediction");
            (
                r.recorded.peak_allocated_bytes,
                r.recorded.peak_reserved_bytes,
                r.predicted.peak_allocated_bytes,
                r.predicted.peak_reserved_bytes,
            )
        };
        let (a, b) = (predict(&whole), predict(&cut));
        assert!(a.2 < a.0, "{file}: checkpointing lowers the peak: {a:?}");
        assert_eq!(b, a, "{file}");
    }
}

/// `fit` from two probes recorded without `free_requested`: the same
/// prediction at batch 16 and the same largest batch under a limit.
#[test]
fn batch_predictions_are_the_same_without_free_requested() {
    use memlens::fit::{fit, probes::Probe, FitOptions};
    let dir = corpus("fit");
    for w in ["gpt", "resnet_amp"] {
        let load = |b: u32| {
            Snapshot::load(&dir.join(format!("{w}.b{b}.pickle.zst"))).expect("probe reads")
        };
        let (a, b) = (load(2), load(4));
        let (ca, cb) = (without_free_requested(&a), without_free_requested(&b));
        let opts = FitOptions {
            batch: Some(16),
            limit: Some(8 << 30),
            ..FitOptions::default()
        };
        let answer = |x: &Snapshot, y: &Snapshot| {
            let ps = [
                Probe {
                    name: "b2",
                    snap: x,
                    batch: 2,
                },
                Probe {
                    name: "b4",
                    snap: y,
                    batch: 4,
                },
            ];
            let r = fit(&ps, &opts).unwrap_or_else(|e| panic!("{w}: {e}"));
            let p = r.predicted.expect("a prediction");
            (
                p.peak_allocated_bytes,
                p.peak_reserved_bytes,
                r.largest_batch,
            )
        };
        let whole = answer(&a, &b);
        assert!(whole.2.is_some(), "{w}: a largest batch");
        assert_eq!(answer(&ca, &cb), whole, "{w}");
    }
}
