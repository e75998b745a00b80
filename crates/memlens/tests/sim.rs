//! What-if simulation on the real fixtures (issue 5): the trace's requests run
//! through the allocator model free of the recorded addresses and segment
//! events, and the predictions are checked against real runs of the same
//! workload under those settings.

mod common;

use common::{load_cached, stat, stats};
use memlens::replay::simulate::{
    estimate_overhead, simulate, simulate_ops, Prepared, SimulateOptions, SimulationResult,
};
use memlens::replay::tune::tune;
use memlens::sim::program::Op;
use memlens::sim::AllocatorConfig;
use memlens::snapshot::Action;
use memlens::Snapshot;

/// Runs `from`'s trace under the settings `to` was recorded with.
fn predict(from: &str, to: &str) -> SimulationResult {
    let conf = stats(to)["alloc_conf"].as_str().unwrap().to_string();
    let opts = SimulateOptions {
        config: AllocatorConfig::parse(&conf).unwrap(),
        ..Default::default()
    };
    simulate(&load_cached(from), 0, &opts).unwrap()
}

fn assert_within(pred: u64, real: u64, tol: f64, what: &str) {
    let err = (pred as f64 - real as f64).abs() / real as f64;
    assert!(
        err <= tol,
        "{what}: predicted {pred}, real {real} ({:.3}%)",
        err * 100.0
    );
}

#[test]
fn recorded_settings_reproduce_the_run_without_its_addresses() {
    for name in ["gpt2_train", "resnet", "gpt2_eval_leak", "long"] {
        let snap = load_cached(name);
        let opts = SimulateOptions {
            config: memlens::replay::config::recorded_config(&snap.settings),
            ..Default::default()
        };
        let r = simulate(&snap, 0, &opts).unwrap();
        assert_eq!(
            r.peak_reserved_bytes,
            stat(name, "reserved_bytes.all.peak"),
            "{name}"
        );
        assert_eq!(r.num_device_alloc, stat(name, "num_device_alloc"), "{name}");
        assert_eq!(r.num_device_free, 0, "{name}");
        assert_eq!(r.num_ooms, 0, "{name}");
        // Where equal-size free blocks tie, made-up addresses can pick a
        // different one than CUDA's did: allocated bytes are close, not exact.
        assert_within(
            r.peak_allocated_bytes,
            stat(name, "allocated_bytes.all.peak"),
            0.005,
            name,
        );
        let recorded: Vec<u64> = snap.traces[0]
            .events
            .iter()
            .filter(|e| e.action == Action::SegmentAlloc)
            .map(|e| e.size)
            .collect();
        assert_eq!(r.segment_sizes.len(), recorded.len(), "{name}");
    }
    let r = predict("varlen", "varlen");
    assert_within(
        r.peak_reserved_bytes,
        stat("varlen", "reserved_bytes.all.peak"),
        0.005,
        "varlen",
    );
    assert_eq!(r.num_device_alloc, stat("varlen", "num_device_alloc"));
}

#[test]
fn varlen_under_expandable_segments() {
    let r = predict("varlen", "varlen@expandable");
    let real = stat("varlen@expandable", "reserved_bytes.all.peak");
    assert_within(r.peak_reserved_bytes, real, 0.02, "varlen -> expandable");
    // In fact exact, mappings included.
    assert_eq!(r.peak_reserved_bytes, real);
    assert_eq!(
        r.num_device_alloc,
        stat("varlen@expandable", "num_device_alloc")
    );
}

#[test]
fn varlen_under_max_split_size_64() {
    let r = predict("varlen", "varlen@maxsplit64");
    let real = stat("varlen@maxsplit64", "reserved_bytes.all.peak");
    assert_within(r.peak_reserved_bytes, real, 0.02, "varlen -> maxsplit64");
    assert_eq!(r.peak_reserved_bytes, real);
    // The advice against fragmentation made it 2.5 times worse.
    assert!(r.peak_reserved_bytes > 2 * stat("varlen", "reserved_bytes.all.peak"));
}

#[test]
fn varlen_under_gc_threshold_without_a_memory_fraction() {
    // The run set no memory fraction, so the GC never ran (section 3.8): only
    // max_split_size_mb:128 acted.
    let r = predict("varlen", "varlen@gc06");
    let real = stat("varlen@gc06", "reserved_bytes.all.peak");
    assert_within(r.peak_reserved_bytes, real, 0.02, "varlen -> gc06");
    assert_eq!(r.peak_reserved_bytes, real);
    assert_eq!(r.num_device_free, 0);
    let only_split = SimulateOptions {
        config: AllocatorConfig::parse("max_split_size_mb:128").unwrap(),
        ..Default::default()
    };
    let s = simulate(&load_cached("varlen"), 0, &only_split).unwrap();
    assert_eq!(s.peak_reserved_bytes, r.peak_reserved_bytes);
}

#[test]
fn gpt2_train_under_expandable_segments() {
    let r = predict("gpt2_train", "gpt2_train@expandable");
    let real = stat("gpt2_train@expandable", "reserved_bytes.all.peak");
    assert_within(
        r.peak_reserved_bytes,
        real,
        0.02,
        "gpt2_train -> expandable",
    );
    assert_eq!(r.peak_reserved_bytes, real);
}

#[test]
fn back_from_expandable_to_default() {
    let r = predict("varlen@expandable", "varlen");
    assert_within(
        r.peak_reserved_bytes,
        stat("varlen", "reserved_bytes.all.peak"),
        0.02,
        "varlen@expandable -> default",
    );
    let r = predict("gpt2_train@expandable", "gpt2_train");
    assert_within(
        r.peak_reserved_bytes,
        stat("gpt2_train", "reserved_bytes.all.peak"),
        0.02,
        "gpt2_train@expandable -> default",
    );
}

#[test]
fn back_from_max_split_and_gc_to_default() {
    let real = stat("varlen", "reserved_bytes.all.peak");
    for from in ["varlen@maxsplit64", "varlen@gc06"] {
        let r = predict(from, "varlen");
        assert_within(r.peak_reserved_bytes, real, 0.02, from);
    }
}

/// The fixtures' GPU: "a total capacity of 79.18 GiB".
const H100_TOTAL: u64 = 85_018_877_624;

#[test]
fn the_oom_run_fails_where_it_did_under_its_memory_fraction() {
    let snap = load_cached("oom");
    let opts = SimulateOptions {
        config: AllocatorConfig::parse("per_process_memory_fraction:0.1").unwrap(),
        device_memory: Some(H100_TOTAL),
        overhead: Some(0),
        ..Default::default()
    };
    let r = simulate(&snap, 0, &opts).unwrap();
    let oom_at = snap.traces[0]
        .events
        .iter()
        .position(|e| e.action == Action::Oom);
    let first = r.first_oom.expect("an OOM");
    assert_eq!(Some(first.event_index), oom_at);
    assert_eq!(first.requested_bytes, 1_048_576_000);
    let at_oom = &stats("oom")["stats_at_oom"];
    assert_eq!(
        Some(first.reserved_bytes),
        at_oom["reserved_bytes.all.current"].as_u64()
    );
    assert_eq!(r.num_ooms, 1);
    assert_eq!(r.num_alloc_retries, stat("oom", "num_alloc_retries"));
    assert_eq!(r.num_device_alloc, stat("oom", "num_device_alloc"));
    assert_eq!(r.num_device_free, stat("oom", "num_device_free"));
    assert_eq!(
        r.peak_reserved_bytes,
        stat("oom", "reserved_bytes.all.peak")
    );
    // Without the cap it fits.
    let free = SimulateOptions {
        device_memory: Some(H100_TOTAL),
        overhead: Some(0),
        ..Default::default()
    };
    assert_eq!(simulate(&snap, 0, &free).unwrap().num_ooms, 0);
}

#[test]
fn overhead_is_estimated_from_the_oom_event() {
    let snap = load_cached("oom");
    // device_free 46327988224 at the OOM, 8445231104 reserved then: the rest
    // of the GPU was in use by others.
    let o = estimate_overhead(&snap, 0, H100_TOTAL).unwrap();
    assert_eq!(o, H100_TOTAL - 46_327_988_224 - 8_445_231_104);
    assert_eq!(
        estimate_overhead(&load_cached("gpt2_train"), 0, H100_TOTAL),
        None
    );
    // A device too small for the run OOMs.
    let opts = SimulateOptions {
        device_memory: Some(4 << 30),
        ..Default::default()
    };
    let r = simulate(&load_cached("gpt2_train"), 0, &opts).unwrap();
    assert!(r.num_ooms > 0);
    assert!(r.first_oom.is_some());
    assert_eq!(r.capacity_bytes, Some(4 << 30));
}

#[test]
fn a_memory_fraction_needs_the_device_memory() {
    let opts = SimulateOptions {
        config: AllocatorConfig::parse("per_process_memory_fraction:0.5").unwrap(),
        ..Default::default()
    };
    assert!(simulate(&load_cached("cache_leak"), 0, &opts).is_err());
}

#[test]
fn tune_ranks_expandable_segments_first_for_varlen() {
    let t = tune(&load_cached("varlen"), 0, &SimulateOptions::default()).unwrap();
    let best = &t.candidates[0];
    assert_eq!(best.config, "expandable_segments:True");
    assert_eq!(
        best.peak_reserved_bytes,
        stat("varlen@expandable", "reserved_bytes.all.peak")
    );
    assert!(
        t.advice.contains("expandable_segments:True"),
        "{}",
        t.advice
    );
    let recorded = t.candidates.iter().find(|c| c.recorded).unwrap();
    assert_eq!(
        recorded.peak_reserved_bytes,
        stat("varlen", "reserved_bytes.all.peak")
    );
    let m64 = t
        .candidates
        .iter()
        .find(|c| c.config == "max_split_size_mb:64")
        .unwrap();
    assert_eq!(
        m64.peak_reserved_bytes,
        stat("varlen@maxsplit64", "reserved_bytes.all.peak")
    );
    for w in t.candidates.windows(2) {
        assert!(
            (w[0].num_ooms, w[0].peak_reserved_bytes) <= (w[1].num_ooms, w[1].peak_reserved_bytes)
        );
    }
}

#[test]
fn tune_prefers_settings_that_avoid_the_oom() {
    let opts = SimulateOptions {
        device_memory: Some(H100_TOTAL),
        overhead: Some(0),
        allowed_memory_maximum: Some(H100_TOTAL / 10),
        ..Default::default()
    };
    let t = tune(&load_cached("oom"), 0, &opts).unwrap();
    let recorded = t.candidates.iter().find(|c| c.recorded).unwrap();
    assert_eq!(recorded.num_ooms, 1);
    // Whatever wins has no more OOMs than the recorded settings.
    assert!(t.candidates[0].num_ooms <= 1);
}

/// A hand-made trace: `empty_cache()` after a step, then a request the cache
/// cannot serve, for which the allocator frees the cache and retries.
fn empty_cache_trace() -> Snapshot {
    use memlens::snapshot::{
        Block, BlockState, DeviceTrace, PoolKind, Segment, TraceEvent, EMPTY_STACK,
    };
    const MIB: u64 = 1 << 20;
    let ev = |action, addr, size| TraceEvent {
        addr,
        size,
        time_us: 0,
        stack: EMPTY_STACK,
        stream: 0,
        action,
        flags: 0,
    };
    let (a, b, c) = (
        0x7f00_0000_0000u64,
        0x7f00_4000_0000u64,
        0x7f00_8000_0000u64,
    );
    let events = vec![
        ev(Action::SegmentAlloc, a, 20 * MIB),
        ev(Action::Alloc, a, 5 * MIB),
        ev(Action::FreeRequested, a, 5 * MIB),
        ev(Action::FreeCompleted, a, 5 * MIB),
        // empty_cache(): A is freed although it could serve the next request.
        ev(Action::SegmentFree, a, 20 * MIB),
        ev(Action::SegmentAlloc, b, 20 * MIB),
        ev(Action::Alloc, b, 5 * MIB),
        ev(Action::FreeRequested, b, 5 * MIB),
        ev(Action::FreeCompleted, b, 5 * MIB),
        // 30 MiB does not fit in B: cudaMalloc failed, B freed, retried.
        ev(Action::SegmentFree, b, 20 * MIB),
        ev(Action::SegmentAlloc, c, 30 * MIB),
        ev(Action::Alloc, c, 30 * MIB),
    ];
    Snapshot {
        segments: vec![Segment {
            device: 0,
            address: c,
            total_size: 30 * MIB,
            allocated_size: 30 * MIB,
            active_size: 30 * MIB,
            requested_size: 30 * MIB,
            stream: 0,
            pool: PoolKind::Large,
            pool_id: (0, 0),
            is_expandable: false,
            stack: EMPTY_STACK,
            blocks: vec![Block {
                address: c,
                size: 30 * MIB,
                requested_size: 30 * MIB,
                state: BlockState::ActiveAllocated,
                stack: EMPTY_STACK,
            }],
        }],
        traces: vec![DeviceTrace {
            device: 0,
            events,
            extras: Vec::new(),
        }],
        streams: vec![0],
        stack_ranges: vec![(0, 0)],
        ..Default::default()
    }
}

#[test]
fn empty_cache_calls_are_told_from_retries_and_replayed() {
    use memlens::replay::{release_runs, replay_device, ReleaseCause, ReplayOptions};
    let snap = empty_cache_trace();
    let runs = release_runs(&snap, 0, &ReplayOptions::default());
    let causes: Vec<(usize, ReleaseCause)> = runs.iter().map(|r| (r.start, r.cause)).collect();
    assert_eq!(
        causes,
        vec![(4, ReleaseCause::EmptyCache), (9, ReleaseCause::MakeRoom)]
    );
    let r = replay_device(&snap, 0, &ReplayOptions::default());
    assert_eq!(r.mismatches, 0, "{:?}", r.warnings);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(r.stats.num_alloc_retries, 1);
    assert_eq!(r.peak_reserved_bytes, 30 << 20);
    // Free of the recorded segments, with no capacity limit: the empty_cache()
    // is replayed, the retry is not needed.
    let s = simulate(&snap, 0, &SimulateOptions::default()).unwrap();
    assert_eq!(s.empty_cache_calls, 1);
    assert_eq!(s.num_device_alloc, 3);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.peak_reserved_bytes, 50 << 20);
    // With 40 MiB of device the model needs the retry itself, as the run did.
    let tight = SimulateOptions {
        device_memory: Some(40 << 20),
        ..Default::default()
    };
    let s = simulate(&snap, 0, &tight).unwrap();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_ooms, 0);
    assert_eq!(s.peak_reserved_bytes, 30 << 20);
}

#[test]
fn a_cut_trace_is_simulated_from_the_recorded_state() {
    let mut snap = (*load_cached("gpt2_train")).clone();
    let n = snap.traces[0].events.len();
    snap.traces[0].events.drain(..n / 2);
    let r = simulate(
        &snap,
        0,
        &SimulateOptions {
            config: memlens::replay::config::recorded_config(&snap.settings),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.warnings.is_empty());
    // The second half of the run never needed a new segment.
    assert_eq!(r.num_device_alloc, 0);
    assert_eq!(
        r.peak_reserved_bytes,
        stat("gpt2_train", "reserved_bytes.all.current")
    );
}

/// The trace written by hand as a program of typed operations (what a what-if
/// question gives the model: no addresses read back, no segment events).
fn program_of(snap: &Snapshot) -> Vec<Op> {
    let prep = Prepared::new(snap, 0);
    let empty_cache_at = prep.empty_cache_points();
    snap.traces[0]
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let stream = snap.stream(e.stream) as u64;
            let tag = u64::from(e.stack);
            Some(match e.action {
                Action::Alloc => Op::Alloc {
                    id: e.addr,
                    size: e.size,
                    stream,
                    tag,
                },
                Action::FreeRequested => Op::FreeRequested { id: e.addr },
                Action::FreeCompleted => Op::FreeCompleted { id: e.addr },
                Action::Oom => Op::FailedRequest {
                    size: e.size,
                    stream,
                    tag,
                },
                _ if empty_cache_at.contains(&i) => Op::EmptyCache,
                _ => return None,
            })
        })
        .collect()
}

#[test]
fn a_program_of_typed_operations_fails_where_the_run_did() {
    let snap = load_cached("oom");
    let opts = SimulateOptions {
        config: AllocatorConfig::parse("per_process_memory_fraction:0.1").unwrap(),
        device_memory: Some(H100_TOTAL),
        overhead: Some(0),
        ..Default::default()
    };
    let ops = program_of(&snap);
    let r = simulate_ops(&ops, 0, &opts).unwrap();
    let first = r.first_oom.expect("an OOM");
    assert!(matches!(ops[first.event_index], Op::FailedRequest { .. }));
    assert_eq!(first.requested_bytes, 1_048_576_000);
    let at_oom = &stats("oom")["stats_at_oom"];
    assert_eq!(
        Some(first.reserved_bytes),
        at_oom["reserved_bytes.all.current"].as_u64()
    );
    assert_eq!(r.num_alloc_retries, stat("oom", "num_alloc_retries"));
    assert_eq!(r.num_device_alloc, stat("oom", "num_device_alloc"));
    assert_eq!(
        r.peak_reserved_bytes,
        stat("oom", "reserved_bytes.all.peak")
    );
    // The trace's own run goes through the same operations: the same figures.
    let t = simulate(&snap, 0, &opts).unwrap();
    assert_eq!(
        (t.peak_reserved_bytes, t.peak_allocated_bytes, t.num_ooms),
        (r.peak_reserved_bytes, r.peak_allocated_bytes, r.num_ooms)
    );
    assert_eq!(t.segment_sizes, r.segment_sizes);
    assert_eq!(t.stats, r.stats);
}

#[test]
fn empty_cache_in_a_program_returns_the_cache() {
    // gpt2_train under its recorded settings, with torch.cuda.empty_cache()
    // at the end: every segment goes back (nothing is live after the last free).
    let snap = load_cached("gpt2_train");
    let mut ops = program_of(&snap);
    let opts = SimulateOptions {
        config: memlens::replay::config::recorded_config(&snap.settings),
        ..Default::default()
    };
    let before = simulate_ops(&ops, 0, &opts).unwrap();
    assert_eq!(
        before.peak_reserved_bytes,
        stat("gpt2_train", "reserved_bytes.all.peak")
    );
    assert_eq!(
        before.num_device_alloc,
        stat("gpt2_train", "num_device_alloc")
    );
    ops.push(Op::EmptyCache);
    let after = simulate_ops(&ops, 0, &opts).unwrap();
    assert_eq!(after.empty_cache_calls, 1);
    // What stays reserved is what the segments still holding live blocks take.
    assert!(after.stats.reserved_bytes.all.current < before.stats.reserved_bytes.all.current);
    assert_eq!(
        after.stats.allocated_bytes.all.current,
        before.stats.allocated_bytes.all.current
    );
}

#[test]
fn a_workspace_that_cannot_be_had_is_done_without_not_a_failure() {
    // A cuDNN convolution whose workspace does not fit under the cap runs
    // with the next algorithm (PyTorch catches the OutOfMemoryError): the
    // allocator's attempt is counted, the program goes on.
    let opts = SimulateOptions {
        config: AllocatorConfig::parse("per_process_memory_fraction:0.01").unwrap(),
        device_memory: Some(H100_TOTAL),
        overhead: Some(0),
        ..Default::default()
    };
    let mib = 1 << 20;
    let program = |workspace: Op| {
        vec![
            Op::Alloc {
                id: 1,
                size: 600 * mib,
                stream: 0,
                tag: 0,
            },
            workspace,
            Op::Free { id: 2 },
            Op::Alloc {
                id: 3,
                size: 100 * mib,
                stream: 0,
                tag: 0,
            },
        ]
    };
    let r = simulate_ops(&program(Op::allocation(2, 400 * mib, 0, 0, true)), 0, &opts).unwrap();
    assert!(r.first_oom.is_none(), "{:?}", r.first_oom);
    // Not the program's OOM; PyTorch's own count has it.
    assert_eq!((r.num_ooms, r.workspaces_given_up), (0, 1));
    assert_eq!(r.stats.num_ooms, 1);
    assert_eq!(r.peak_allocated_bytes, 700 * mib);
    // The same request as a tensor the program needs: its failure.
    let r = simulate_ops(
        &program(Op::allocation(2, 400 * mib, 0, 0, false)),
        0,
        &opts,
    )
    .unwrap();
    assert_eq!(r.first_oom.map(|f| f.event_index), Some(1));
}

/// The capped ResNet-50 runs of tests/corpus/oom (an H200, 2026-11-29) replayed
/// as recorded: the workspaces PyTorch gave up are given up again and are not
/// OOMs, and the one OOM the program saw is where it happened. Before, `tune`
/// counted every workspace entry an OOM and told a run that did not fail that
/// expandable segments "avoid the OOM".
#[test]
fn workspaces_the_recorded_run_gave_up_are_given_up_again_not_counted_as_ooms() {
    use memlens::replay::limits::with_inferred;
    let corpus =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/oom");
    let caught_entries = |snap: &Snapshot| {
        snap.traces[0]
            .events
            .iter()
            .filter(|e| snap.oom_caught_by_pytorch(e))
            .count() as u64
    };
    let as_recorded = |snap: &Snapshot| {
        let (opts, limits) = with_inferred(snap, 0, &SimulateOptions::default(), None);
        (simulate(snap, 0, &opts).unwrap(), limits, opts)
    };

    // Batch 23 ran its steps: 4 workspaces given up, no OOM.
    let ran = Snapshot::load(&corpus.join("conv_workspace_caught.pickle.zst")).unwrap();
    let (r, limits, opts) = as_recorded(&ran);
    // The cap is at least the most PyTorch held in the whole run (850 MiB,
    // after the first workspace entry), not what it held before that entry.
    let recorded = memlens::replay::replay_device(&ran, 0, &Default::default());
    assert_eq!(
        limits.memory_cap.map(|c| c.bytes),
        Some(recorded.peak_reserved_bytes)
    );
    assert!(r.first_oom.is_none(), "{:?}", r.first_oom);
    assert_eq!(r.num_ooms, 0);
    assert_eq!(r.workspaces_given_up, caught_entries(&ran));
    assert_eq!(r.workspaces_given_up, 4);
    assert_eq!(r.stats.num_ooms, 4);
    assert_eq!(r.peak_reserved_bytes, recorded.peak_reserved_bytes);
    assert_eq!(r.peak_allocated_bytes, recorded.peak_allocated_bytes);
    let t = tune(&ran, 0, &opts).unwrap();
    let rec = t.candidates.iter().find(|c| c.recorded).unwrap();
    assert_eq!((rec.num_ooms, rec.workspaces_given_up), (0, 4));
    assert!(!t.advice.contains("avoids the OOM"), "{}", t.advice);
    assert!(
        t.advice
            .ends_with("cuDNN gives up 0 convolution workspace(s) instead of 4"),
        "{}",
        t.advice
    );

    // Batch 24 failed once, at its last entry, after 82 workspaces given up.
    let failed = Snapshot::load(&corpus.join("conv_workspace_oom.pickle.zst")).unwrap();
    let (r, _, _) = as_recorded(&failed);
    let (_, last) = memlens::oom::chosen_oom(&failed).unwrap();
    assert_eq!(r.first_oom.map(|o| o.event_index), Some(last));
    assert_eq!((r.num_ooms, r.workspaces_given_up), (1, 82));
    assert_eq!(r.workspaces_given_up, caught_entries(&failed));
}

/// `tune`'s claims about expandable segments on the capped ResNet-50, each
/// checked by a rerun on the GPU (`conv_workspace_reruns.json`, an H200):
/// whether the run fails, how many workspaces it gives up (none: with
/// expandable segments the cache gives them room), and the peak reserved
/// of the runs that ran, within 2%.
#[test]
fn tunes_expandable_segments_verdicts_on_the_capped_resnet_hold_when_rerun() {
    use memlens::replay::limits::with_inferred;
    let corpus =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/oom");
    let text = std::fs::read_to_string(corpus.join("conv_workspace_reruns.json")).unwrap();
    let truth: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rerun = |batch: u64| {
        truth["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["batch"] == batch && r["conf"] == "expandable_segments:True")
            .unwrap()
            .clone()
    };
    for (file, batch) in [
        ("conv_workspace_caught.pickle.zst", 23),
        ("conv_workspace_oom.pickle.zst", 24),
    ] {
        let snap = Snapshot::load(&corpus.join(file)).unwrap();
        let (opts, _) = with_inferred(&snap, 0, &SimulateOptions::default(), None);
        let t = tune(&snap, 0, &opts).unwrap();
        let c = t
            .candidates
            .iter()
            .find(|c| c.config == "expandable_segments:True")
            .unwrap();
        let r = rerun(batch);
        assert_eq!(c.num_ooms == 0, r["ok"].as_bool().unwrap(), "{file}: {c:?}");
        assert_eq!(
            c.workspaces_given_up,
            r["workspace_oom_entries"].as_u64().unwrap(),
            "{file}"
        );
        if c.num_ooms == 0 {
            assert_within(
                c.peak_reserved_bytes,
                r["max_reserved"].as_u64().unwrap(),
                0.02,
                file,
            );
        }
    }
}
