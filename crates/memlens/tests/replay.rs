//! Replay of the real fixtures through the allocator model (issue 3): the
//! replay must reproduce `torch.cuda.memory_stats()` exactly.

mod common;

use common::{fixture, load_cached, stat, stats, FIXTURES};
use memlens::replay::{replay_device, state_at, Delta, Replay, ReplayOptions, Totals};
use memlens::sim::AllocatorConfig;
use memlens::snapshot::Action;
use memlens::Snapshot;

#[test]
fn peaks_match_memory_stats_exactly() {
    for name in FIXTURES {
        let snap = load_cached(name);
        let r = replay_device(&snap, 0, &ReplayOptions::default());
        assert_eq!(
            r.peak_allocated_bytes,
            stat(name, "allocated_bytes.all.peak"),
            "{name}: peak allocated"
        );
        assert_eq!(
            r.peak_reserved_bytes,
            stat(name, "reserved_bytes.all.peak"),
            "{name}: peak reserved"
        );
        assert_eq!(r.mismatches, 0, "{name}: {:?}", r.warnings);
        assert!(r.warnings.is_empty(), "{name}: {:?}", r.warnings);
        assert!(r.starts_at_birth, "{name}");
        assert!(r.peak_allocated_index.is_some() && r.peak_reserved_index.is_some());
    }
}

#[test]
fn every_memory_stat_matches() {
    for name in FIXTURES {
        let snap = load_cached(name);
        let r = replay_device(&snap, 0, &ReplayOptions::default());
        let mine = r.stats.to_flat_map();
        let truth = stats(name);
        let truth = truth["memory_stats"].as_object().expect("memory_stats");
        for (k, v) in truth {
            assert_eq!(mine.get(k).copied(), v.as_i64(), "{name}: {k}");
        }
        // The running totals end where the model's stats end.
        let t = r.final_totals.all;
        assert_eq!(t.allocated, r.stats.allocated_bytes.all.current, "{name}");
        assert_eq!(t.reserved, r.stats.reserved_bytes.all.current, "{name}");
        assert_eq!(t.active, r.stats.active_bytes.all.current, "{name}");
        assert_eq!(t.requested, r.stats.requested_bytes.all.current, "{name}");
    }
}

#[test]
fn snapshot_taken_at_the_oom_matches_its_stats() {
    let snap = Snapshot::load(&fixture("oom.at_oom.pickle.zst")).unwrap();
    let r = replay_device(&snap, 0, &ReplayOptions::default());
    let truth = stats("oom");
    let truth = truth["stats_at_oom"].as_object().unwrap();
    let mine = r.stats.to_flat_map();
    for k in [
        "allocated_bytes.all.peak",
        "allocated_bytes.all.current",
        "reserved_bytes.all.peak",
        "reserved_bytes.all.current",
        "num_alloc_retries",
        "num_ooms",
        "num_device_alloc",
        "num_device_free",
        "inactive_split_bytes.all.current",
    ] {
        assert_eq!(mine.get(k).copied(), truth[k].as_i64(), "{k}");
    }
    assert_eq!(r.mismatches, 0, "{:?}", r.warnings);
}

#[test]
fn model_segments_equal_the_traces_in_order() {
    for name in FIXTURES {
        let snap = load_cached(name);
        let r = replay_device(&snap, 0, &ReplayOptions::default());
        let recorded: Vec<u64> = snap.traces[0]
            .events
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
            .map(|e| e.size)
            .collect();
        assert!(!recorded.is_empty(), "{name}");
        assert_eq!(r.segment_sizes, recorded, "{name}");
    }
}

#[test]
fn streaming_steps_give_the_peaks_and_the_state_there() {
    let snap = load_cached("gpt2_train");
    let mut r = Replay::new(&snap, 0, &ReplayOptions::default());
    let mut peak = (0, 0);
    let mut alloc_deltas = 0u64;
    while let Some(s) = r.step() {
        if s.totals.all.allocated > peak.0 {
            peak = (s.totals.all.allocated, s.index);
        }
        if let Delta::Alloc {
            size, requested, ..
        } = s.delta
        {
            assert!(size >= requested);
            alloc_deltas += 1;
        }
        assert_eq!(
            s.totals.all.allocated,
            s.totals.small.allocated + s.totals.large.allocated
        );
    }
    assert_eq!(peak.0, stat("gpt2_train", "allocated_bytes.all.peak"));
    assert_eq!(alloc_deltas, stat("gpt2_train", "allocation.all.allocated"));
    let st = state_at(&snap, 0, peak.1, &ReplayOptions::default());
    assert_eq!(st.index, peak.1);
    let live: u64 = st
        .live
        .iter()
        .filter(|b| !b.pending_free)
        .map(|b| b.size)
        .sum();
    assert_eq!(live, peak.0);
    assert!(st.live.iter().all(|b| b.alloc_index.is_some()));
    assert!(st.live.iter().any(|b| b.stack != 0), "stacks are kept");
    let reserved: u64 = st.segments.iter().map(|s| s.total_size).sum();
    assert_eq!(reserved, st.totals.all.reserved);
}

/// Totals after every event of a full replay.
fn full_totals(snap: &Snapshot) -> Vec<Totals> {
    let mut r = Replay::new(snap, 0, &ReplayOptions::default());
    std::iter::from_fn(|| r.step().map(|s| s.totals)).collect()
}

#[test]
fn a_cut_trace_starts_from_the_dumped_state() {
    // As if the ring buffer had wrapped: drop the first events. The replay
    // must rebuild the state before the cut from the dumped segments and then
    // follow the full replay event for event.
    for name in ["gpt2_train", "resnet", "oom", "varlen@expandable"] {
        let snap = load_cached(name);
        let full = full_totals(&snap);
        let n = full.len();
        for cut in [7, 100, n / 3, n / 2, n - 50] {
            let mut cs = (*snap).clone();
            cs.traces[0].events.drain(..cut);
            let mut r = Replay::new(&cs, 0, &ReplayOptions::default());
            assert!(!r.initial_state().is_empty(), "{name} cut {cut}");
            let mut k = cut;
            while let Some(s) = r.step() {
                assert_eq!(s.totals, full[k], "{name} cut {cut}: event {k}");
                k += 1;
            }
            let sum = r.run();
            assert_eq!(sum.mismatches, 0, "{name} cut {cut}: {:?}", sum.warnings);
            assert!(!sum.starts_at_birth);
            assert!(sum.warnings[0].starts_with(memlens::replay::initial::LATE_START));
            assert_eq!(
                sum.warnings.len(),
                1,
                "{name} cut {cut}: {:?}",
                sum.warnings
            );
        }
    }
}

#[test]
fn a_cut_trace_converges_when_a_block_size_is_unknowable() {
    // A block allocated before the cut whose unsplit remainder nothing in the
    // trace reveals: totals may differ by that remainder until it is freed,
    // never by more than 1 MiB per such block, and the end state is exact.
    let snap = load_cached("varlen");
    let full = full_totals(&snap);
    let n = full.len();
    let mut cs = (*snap).clone();
    cs.traces[0].events.drain(..n / 2);
    let mut r = Replay::new(&cs, 0, &ReplayOptions::default());
    let blocks_before = r.initial_state().blocks.len() as u64;
    let mut k = n / 2;
    while let Some(s) = r.step() {
        assert_eq!(s.totals.all.reserved, full[k].all.reserved);
        let d = s.totals.all.allocated.abs_diff(full[k].all.allocated);
        assert!(d <= blocks_before << 20, "event {k}: off by {d}");
        k += 1;
    }
    assert_eq!(r.totals(), *full.last().unwrap());
}

#[test]
fn wrong_settings_still_follow_the_trace() {
    // Replaying under settings the run did not use: the model disagrees, the
    // trace wins, reserved bytes stay exact and nothing panics.
    let snap = load_cached("gpt2_train");
    let opts = ReplayOptions {
        config: Some(AllocatorConfig::parse("roundup_power2_divisions:8").unwrap()),
        ..Default::default()
    };
    let r = replay_device(&snap, 0, &opts);
    assert!(r.mismatches > 0);
    assert!(!r.warnings.is_empty());
    assert_eq!(
        r.peak_reserved_bytes,
        stat("gpt2_train", "reserved_bytes.all.peak")
    );
}

#[test]
fn a_snapshot_without_trace_replays_to_nothing() {
    let mut snap = (*load_cached("cache_leak")).clone();
    snap.traces.clear();
    let r = replay_device(&snap, 0, &ReplayOptions::default());
    assert_eq!(r.events, 0);
    assert_eq!(r.peak_allocated_index, None);
    // The state is the dumped one.
    assert_eq!(
        r.final_totals.all.reserved,
        stat("cache_leak", "reserved_bytes.all.current")
    );
    assert_eq!(
        r.final_totals.all.allocated,
        stat("cache_leak", "allocated_bytes.all.current")
    );
}
