//! The OOM explainer on the real `oom` fixture: GPT-2 training under
//! `set_per_process_memory_fraction(0.10)` on an 80 GB H100, batch doubled
//! each step from 2 until batch 32 failed. `oom.at_oom` was dumped in the
//! `except` handler; `oom` is the final snapshot of the same run.

mod common;

use common::{fixture, stats};
use memlens::analysis::summary::summarize;
use memlens::oom::fixes::Basis;
use memlens::oom::snapshot::CapSource;
use memlens::oom::{
    analyze_snapshot, simulate_what_if, simulate_what_if_exact, Cause, FixKind, OomOptions,
    OomReport, WhatIfSpec,
};
use memlens::snapshot::{Action, DeviceTrace};
use memlens::Snapshot;

const MIB: u64 = 1 << 20;

fn load(name: &str) -> Snapshot {
    Snapshot::load(&fixture(name)).expect("fixture loads")
}

fn message() -> memlens::oom::OomMessage {
    let st = stats("oom");
    memlens::oom::parse(st["oom_message"].as_str().expect("oom_message")).expect("parses")
}

fn analyze(snap: &Snapshot, opts: &OomOptions) -> OomReport {
    analyze_snapshot(snap, opts)
        .expect("analysis runs")
        .expect("the trace holds an OOM")
}

fn with_message() -> OomOptions {
    OomOptions {
        message: Some(message()),
        batch: Some(32),
        ..Default::default()
    }
}

fn current(st: &serde_json::Value, key: &str) -> u64 {
    st["stats_at_oom"][key].as_u64().expect(key)
}

/// The figures right before the `oom` event are the ones the message prints.
///
/// `stats_at_oom` was read in the `except` handler, after the failing frame
/// unwound: autocast's cached casts and the frame's two linear outputs
/// (~71 MiB) were freed by then, so its `allocated_bytes` (7899146240) is
/// lower and its reserved-but-unallocated (reserved - allocated = 520.8 MiB)
/// higher than the message's "7.43 GiB allocated" and "449.83 MiB reserved
/// but unallocated". The state replayed to just before the `oom` event
/// agrees with the message; the state at the end of `oom.at_oom`'s trace
/// agrees with `stats_at_oom`; reserved memory is the same in both (no
/// segment was freed in between).
#[test]
fn state_at_the_oom_agrees_with_message_and_stats() {
    let st = stats("oom");
    let msg = message();
    let snap = load("oom.at_oom.pickle.zst");
    let r = analyze(&snap, &with_message());

    // The request: the rounded size in the trace, and "Tried to allocate".
    assert_eq!(r.requested_bytes, 1000 * MIB);
    assert_eq!(r.tried_to_allocate_bytes, 1000 * MIB);
    assert!(msg
        .requested
        .as_ref()
        .is_some_and(|f| f.admits(r.tried_to_allocate_bytes)));
    assert_eq!(r.pool, "large");
    assert_eq!(r.stream, 0);
    assert_eq!(r.device_memory.free_bytes, 46327988224);
    assert_eq!(r.site, "/home/user/train/workloads.py:112");
    assert_eq!(r.ooms_in_trace as u64, current(&st, "num_ooms"));

    // Reserved: exactly stats_at_oom's.
    assert_eq!(r.reserved_bytes, current(&st, "reserved_bytes.all.current"));
    // Allocated and reserved-but-unallocated: the message's figures.
    assert!(msg
        .allocated
        .as_ref()
        .is_some_and(|f| f.admits(r.allocated_bytes)));
    assert_eq!(r.reserved_unallocated_bytes, 471684096);
    assert!(msg
        .reserved_unallocated
        .as_ref()
        .is_some_and(|f| f.admits(r.reserved_unallocated_bytes)));
    assert!(
        r.message_check.iter().all(|c| c.agrees),
        "{:?}",
        r.message_check
    );
    assert_eq!(r.message_check.len(), 4);
    // stats_at_oom is the state after the handler freed the frame's tensors.
    let after = summarize(&snap);
    assert_eq!(
        after.allocated_bytes,
        current(&st, "allocated_bytes.all.current")
    );
    let freed = r.allocated_bytes - after.allocated_bytes;
    assert_eq!(freed, 74400768, "~71 MiB freed by the unwinding");
    let stats_unallocated =
        current(&st, "reserved_bytes.all.current") - current(&st, "allocated_bytes.all.current");
    assert!(!msg
        .reserved_unallocated
        .as_ref()
        .is_some_and(|f| f.admits(stats_unallocated)));

    // The free space: 37 pieces, the largest 144 MiB, far from 1000 MiB. The
    // allocator had returned every wholly free segment before raising, so all
    // cached free memory is in pieces of segments that hold live tensors.
    assert_eq!(r.largest_free_block_bytes, 144 * MIB);
    assert!(r.largest_free_block_bytes < r.requested_bytes);
    assert!(r.largest_free_block_bytes <= after.largest_free_block_bytes);
    assert_eq!(r.free_pieces.count, 37);
    assert_eq!(r.free_pieces.segments, 37);
    assert_eq!(
        r.free_pieces.largest.first(),
        Some(&r.largest_free_block_bytes)
    );
    let pool_free: u64 = r.pools.iter().map(|p| p.free_bytes).sum();
    let pending: u64 = r.pools.iter().map(|p| p.pending_free_bytes).sum();
    assert_eq!(pool_free + pending, r.reserved_unallocated_bytes);
    assert_eq!(
        r.pools.iter().map(|p| p.reserved_bytes).sum::<u64>(),
        r.reserved_bytes
    );
    assert_eq!(r.other_streams_reserved_bytes, 0);
    assert_eq!(r.private_pools_reserved_bytes, 0);

    // The device: 79.18 GiB from the message; outside PyTorch = the other
    // processes plus this process's own non-PyTorch memory.
    assert_eq!(r.device_memory.total_source, Some("message"));
    let outside = r.device_memory.outside_pytorch_bytes.expect("total known");
    let parts = r.device_memory.other_processes_bytes.unwrap_or(0)
        + r.device_memory.this_process_non_pytorch_bytes.unwrap_or(0);
    assert!(outside.abs_diff(parts) < 64 * MIB, "{outside} vs {parts}");

    // What was live: the step's activations dominate.
    let act = r.categories.get("activation").copied().unwrap_or(0);
    assert!(act > r.allocated_bytes * 8 / 10, "{:?}", r.categories);
    assert_eq!(r.categories.values().sum::<u64>(), r.allocated_bytes);
    assert!(r.categories.get("parameter").copied().unwrap_or(0) > 200 * MIB);
    assert!(r.categories.get("optimizer_state").copied().unwrap_or(0) > 400 * MIB);
    assert!(!r.live_at_oom.is_empty());
}

/// The cause is the 10% cap, from the message or inferred from the trace.
#[test]
fn cause_is_the_memory_cap() {
    let snap = load("oom.at_oom.pickle.zst");
    let r = analyze(&snap, &with_message());
    assert_eq!(r.cause, Cause::MemoryCap);
    let cap = r.memory_cap.as_ref().expect("cap");
    assert_eq!(cap.source, CapSource::Message);
    assert_eq!(cap.fraction, Some(0.1));
    assert!(r.explanation.contains("7.92 GiB"), "{}", r.explanation);
    assert!(
        r.explanation.contains("43.15 GiB free"),
        "{}",
        r.explanation
    );

    // No message, no device: the device had 43 GiB free, so a cap refused;
    // it lies between what PyTorch held before and that plus the segment.
    let r = analyze(&snap, &OomOptions::default());
    assert_eq!(r.cause, Cause::MemoryCap);
    let cap = r.memory_cap.as_ref().expect("inferred cap");
    assert_eq!(cap.source, CapSource::Inferred);
    let (lo, hi) = cap.range_bytes.expect("range");
    assert_eq!(lo, 8451522560, "reserved_bytes.all.peak before the OOM");
    assert_eq!(hi, 8445231104 + 1000 * MIB);
    assert_eq!(cap.bytes, lo);
    assert!(cap.fraction.is_none());
    assert!(cap.how.contains("43.15 GiB free"), "{}", cap.how);

    // With the GPU named, the round fraction in that range is 0.10.
    let r = analyze(
        &snap,
        &OomOptions {
            device_memory: Some(memlens::units::parse_device_memory("H100").expect("H100")),
            ..Default::default()
        },
    );
    assert_eq!(r.cause, Cause::MemoryCap);
    let cap = r.memory_cap.as_ref().expect("inferred cap");
    assert_eq!(cap.fraction, Some(0.1));
    assert!(cap.how.contains("0.1"), "{}", cap.how);
}

/// The final snapshot of the same run (its trace goes on after the handler)
/// gives the same analysis of the same OOM.
#[test]
fn final_snapshot_gives_the_same_figures() {
    let a = analyze(&load("oom.at_oom.pickle.zst"), &with_message());
    let b = analyze(&load("oom.pickle.zst"), &with_message());
    assert_eq!(b.cause, Cause::MemoryCap);
    assert_eq!(a.event_index, b.event_index);
    assert_eq!(
        (
            a.requested_bytes,
            a.largest_free_block_bytes,
            a.reserved_unallocated_bytes
        ),
        (
            b.requested_bytes,
            b.largest_free_block_bytes,
            b.reserved_unallocated_bytes
        )
    );
    assert_eq!(a.allocated_bytes, b.allocated_bytes);
    assert_eq!(a.categories, b.categories);
    assert_eq!(
        a.batch.as_ref().map(|x| x.max_batch),
        b.batch.as_ref().map(|x| x.max_batch)
    );
}

/// The fixes say how much the batch must shrink: the run itself proved batch
/// 16 fits and 32 does not, and the simulation agrees.
#[test]
fn batch_must_halve() {
    let st = stats("oom");
    let ok: Vec<u64> = st["batches_ok"]
        .as_array()
        .expect("batches_ok")
        .iter()
        .filter_map(|b| b.as_u64())
        .collect();
    assert_eq!(st["oom_batch"].as_u64(), Some(32));
    assert!(ok.contains(&16));

    let snap = load("oom.at_oom.pickle.zst");
    let r = analyze(&snap, &with_message());
    let model = r.step_model.as_ref().expect("step model");
    assert_eq!((model.failing_step, model.template_step), (5, Some(4)));
    assert!((model.growth - 2.0).abs() < 1e-9, "batch 32 over 16");
    assert!(model.agreement > 0.99, "{model:?}");
    let b = r.batch.as_ref().expect("batch search");
    assert_eq!(b.failing_batch, Some(32));
    // Batch 16 ran (step 4), but at 7.87 of the 7.92 GiB cap: with the
    // margin a "fits" keeps (5% more batch), 15 is the largest said to fit,
    // within one of the truth.
    assert_eq!(b.max_batch, Some(15));
    assert_eq!(b.power_of_two_batch, Some(8));
    assert!((b.max_fraction - 15.0 / 32.0).abs() < 1e-9);
    assert!(!b.lower_bound);
    let fix = r
        .fixes
        .iter()
        .find(|f| f.kind == FixKind::SmallerBatch)
        .expect("a smaller-batch fix");
    assert_eq!(fix.fits, Some(true));
    assert!(
        fix.action.contains("from 32 to at most 15"),
        "{}",
        fix.action
    );
    // It comes right after raising the cap, the fix for the cause.
    assert_eq!(
        r.fixes.first().map(|f| f.kind),
        Some(FixKind::RaiseMemoryCap)
    );
    assert_eq!(r.fixes.get(1).map(|f| f.kind), Some(FixKind::SmallerBatch));

    // Without the batch: a fraction.
    let r = analyze(&snap, &OomOptions::default());
    let b = r.batch.as_ref().expect("batch search");
    // Below half (batch 16 is "may fit"), by at most the 5% margin.
    assert!(
        b.max_fraction < 0.5 && b.max_fraction >= 0.5 / 1.05 - 0.01,
        "{}",
        b.max_fraction
    );
    assert!((b.power_of_two_fraction - 0.25).abs() < 1e-9);
    let fix = r
        .fixes
        .iter()
        .find(|f| f.kind == FixKind::SmallerBatch)
        .expect("a smaller-batch fix");
    let pct = format!("{}%", (b.max_fraction * 100.0).round());
    assert!(fix.action.contains(&pct), "{}", fix.action);
    assert!(fix.action.contains("dividing it by 4"), "{}", fix.action);
}

/// The what-if model of the failing step reproduces the real failure: at
/// the failing batch, under the recorded settings and the cap, the simulator
/// fails on the same 1000 MiB segment with the same reserved memory.
#[test]
fn what_if_reproduces_the_real_oom() {
    let snap = load("oom.at_oom.pickle.zst");
    let r = analyze(&snap, &with_message());
    let cap = r.memory_cap.as_ref().map(|c| c.bytes);
    let base = WhatIfSpec {
        config: String::new(),
        batch_fraction: 1.0,
        memory_cap_bytes: cap,
        device_memory_bytes: r.device_memory.total_bytes,
        overhead_bytes: r.device_memory.outside_pytorch_bytes,
        empty_cache_at_step_start: false,
        free_blocks: Vec::new(),
    };
    let sim = simulate_what_if_exact(&snap, &r, &base).expect("simulates");
    let oom = sim.first_oom.expect("the failing batch fails");
    assert_eq!(oom.alloc_size, 1000 * MIB);
    assert_eq!(oom.reserved_bytes, r.reserved_bytes);
    // Batch 16 (what the run did in step 4) fits; a hair more does not.
    let half = simulate_what_if_exact(
        &snap,
        &r,
        &WhatIfSpec {
            batch_fraction: 0.5,
            ..base.clone()
        },
    )
    .expect("simulates");
    assert_eq!(half.num_ooms, 0);
    assert!(half.peak_reserved_bytes <= cap.unwrap_or(0));
    let more = simulate_what_if_exact(
        &snap,
        &r,
        &WhatIfSpec {
            batch_fraction: 17.0 / 32.0,
            ..base
        },
    )
    .expect("simulates");
    assert!(more.num_ooms > 0);
}

/// Every simulated fix is checked by running the simulator again on its
/// what-if: `fits: true` fits, `fits: false` does not; fixes rejected as not
/// helpful do not fit either.
#[test]
fn predicted_fixes_hold_in_the_simulator() {
    let snap = load("oom.at_oom.pickle.zst");
    for opts in [with_message(), OomOptions::default()] {
        let r = analyze(&snap, &opts);
        let mut seen = (0, 0);
        for fix in r.fixes.iter().chain(&r.not_helpful) {
            let (Some(fits), Some(spec)) = (fix.fits, fix.what_if.as_ref()) else {
                continue;
            };
            assert_eq!(fix.basis, Basis::Simulated);
            let sim = simulate_what_if(&snap, &r, spec).expect("simulates");
            assert_eq!(sim.num_ooms == 0, fits, "{}", fix.action);
            if fits {
                seen.0 += 1;
                let limit = spec.memory_cap_bytes.unwrap_or(u64::MAX);
                assert!(sim.peak_reserved_bytes <= limit, "{}", fix.action);
                assert_eq!(
                    fix.predicted_peak_reserved_bytes,
                    Some(sim.peak_reserved_bytes)
                );
            } else {
                seen.1 += 1;
            }
        }
        assert!(seen.0 >= 1 && seen.1 >= 1, "{seen:?}");
        // Nothing the simulation rejects is recommended, and every rejected
        // one still fails.
        assert!(r.not_helpful.iter().all(|f| f.fits == Some(false)));
        for f in &r.fixes {
            assert!(
                !r.not_helpful.iter().any(|n| n.action == f.action),
                "{}",
                f.action
            );
        }
        // max_split_size_mb makes this run need more, not less.
        assert!(r
            .not_helpful
            .iter()
            .any(|f| f.kind == FixKind::MaxSplitSize));
        assert!(!r.fixes.iter().any(|f| f.kind == FixKind::MaxSplitSize));
        // Autocast is on: no mixed-precision advice.
        assert!(!r.fixes.iter().any(|f| f.kind == FixKind::MixedPrecision));
        // Fixes are ranked: those that fit first.
        let order: Vec<u8> = r
            .fixes
            .iter()
            .map(|f| match f.fits {
                Some(true) => 0,
                None => 1,
                Some(false) => 2,
            })
            .collect();
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
    }
    // The empty_cache() what-if does replay one more call than the run made.
    let r = analyze(&snap, &with_message());
    let calls = |spec: &WhatIfSpec| {
        simulate_what_if(&snap, &r, spec)
            .expect("simulates")
            .empty_cache_calls
    };
    let ec = r
        .fixes
        .iter()
        .chain(&r.not_helpful)
        .find(|f| f.kind == FixKind::EmptyCache)
        .and_then(|f| f.what_if.clone())
        .expect("an empty_cache what-if");
    let base = WhatIfSpec {
        empty_cache_at_step_start: false,
        ..ec.clone()
    };
    assert_eq!(calls(&ec), calls(&base) + 1);

    // Raising the cap: the fraction is one the simulator checked, and with
    // the device known the fix fits it too.
    let raise = r
        .fixes
        .iter()
        .find(|f| f.kind == FixKind::RaiseMemoryCap)
        .expect("raise the cap");
    assert_eq!(raise.fits, Some(true));
    assert!(
        raise.action.contains("set_per_process_memory_fraction(0."),
        "{}",
        raise.action
    );
    let spec = raise.what_if.as_ref().expect("what-if");
    assert!(spec.memory_cap_bytes > r.memory_cap.as_ref().map(|c| c.bytes));
    assert_eq!(spec.device_memory_bytes, r.device_memory.total_bytes);
}

/// A snapshot without an OOM in its trace gives `None`.
#[test]
fn no_oom_no_report() {
    let snap = Snapshot::example();
    assert!(analyze_snapshot(&snap, &OomOptions::default())
        .expect("runs")
        .is_none());
}

/// A trace that holds only the failing step (recording started late): the
/// state before it is rebuilt from the dump, the step is modelled up to the
/// failure only, and the predictions say they are lower bounds.
#[test]
fn failing_step_alone_is_a_lower_bound() {
    let full = load("oom.at_oom.pickle.zst");
    let r_full = analyze(&full, &OomOptions::default());
    let start = r_full
        .step_model
        .as_ref()
        .map_or(0, |m| m.failing_step_start);
    let mut snap = full.clone();
    let t = &full.traces[0];
    snap.traces = vec![DeviceTrace {
        device: t.device,
        events: t.events[start..].to_vec(),
        extras: Vec::new(),
    }];
    assert!(snap.traces[0]
        .events
        .iter()
        .any(|e| e.action == Action::Oom));
    let r = analyze(&snap, &with_message());
    assert_eq!(r.cause, Cause::MemoryCap);
    assert_eq!(r.requested_bytes, 1000 * MIB);
    assert_eq!(r.reserved_bytes, r_full.reserved_bytes);
    assert_eq!(r.allocated_bytes, r_full.allocated_bytes);
    let b = r.batch.as_ref().expect("batch search");
    assert!(b.lower_bound);
    assert!(r.warnings.iter().any(|w| w.contains("lower bounds")));
    for fix in r.fixes.iter().filter(|f| f.what_if.is_some()) {
        // A step known only up to the failure promises nothing ("may fit");
        // what it rejects fails in the simulator.
        assert_ne!(fix.fits, Some(true), "{}", fix.action);
        let sim = simulate_what_if(&snap, &r, fix.what_if.as_ref().expect("spec")).expect("runs");
        if fix.fits == Some(false) {
            assert!(sim.num_ooms > 0, "{}", fix.action);
        }
    }
}

/// The same snapshot with the `oom` event edited so that the device, not a
/// cap, was full (and, second, so that the request was smaller than the
/// cached free memory): the cause follows the numbers.
#[test]
fn cause_follows_the_numbers() {
    let full = load("oom.at_oom.pickle.zst");
    let k = analyze(&full, &OomOptions::default()).event_index;
    let edit = |size: u64, free: u64| {
        let mut s = full.clone();
        let e = &mut s.traces[0].events[k];
        e.size = size;
        e.addr = free;
        s
    };
    // The device had 200 MiB free: no cap; the process's own tensors.
    let snap = edit(1000 * MIB, 200 * MIB);
    let r = analyze(&snap, &OomOptions::default());
    assert_eq!(r.cause, Cause::Capacity);
    assert!(r.memory_cap.is_none());
    // The simulated device is what PyTorch held plus what was free.
    let fix = r
        .fixes
        .iter()
        .find(|f| f.kind == FixKind::SmallerBatch)
        .expect("a smaller batch");
    assert_eq!(fix.fits, Some(true));
    let spec = fix.what_if.as_ref().expect("spec");
    assert_eq!(spec.device_memory_bytes, Some(r.reserved_bytes + 200 * MIB));
    for f in r.fixes.iter().filter(|f| f.what_if.is_some()) {
        let sim = simulate_what_if(&snap, &r, f.what_if.as_ref().expect("spec")).expect("runs");
        assert_eq!(Some(sim.num_ooms == 0), f.fits, "{}", f.action);
    }
    // A 300 MiB request with 448 MiB cached in pieces of at most 144 MiB.
    let snap = edit(300 * MIB, 200 * MIB);
    let r = analyze(&snap, &OomOptions::default());
    assert_eq!(r.cause, Cause::Fragmentation);
    assert!(r.explanation.contains("fragmented"), "{}", r.explanation);
    assert_eq!(
        r.fixes
            .iter()
            .filter(|f| f.kind == FixKind::SteadyShapes)
            .count(),
        1
    );
}

/// The batch model finds the batches the run's good steps ran at (2, 4, 8,
/// 16 before 32 failed, stats.json's `batches_ok`) from the sizes of their
/// allocations alone, and fits what each step makes against them.
#[test]
fn the_batch_model_finds_the_steps_batches_and_fits_them() {
    let snap = load("oom.at_oom.pickle.zst");
    let r = analyze(&snap, &with_message());
    let m = r.batch_model.as_ref().expect("a batch model");
    let st = stats("oom");
    assert_eq!(st["oom_batch"].as_u64(), m.failing_batch);
    let ok: Vec<f64> = st["batches_ok"]
        .as_array()
        .expect("batches_ok")
        .iter()
        .map(|b| b.as_f64().expect("a batch"))
        .collect();
    let found: Vec<f64> = m.points.iter().filter_map(|p| p.batch).collect();
    assert_eq!(found.len(), ok.len());
    for (f, b) in found.iter().zip(&ok) {
        assert!((f - b).abs() < 0.05, "found batch {f}, ran at {b}");
    }
    assert!(!m.estimate);
    // The line goes through every step's own peak within 1%.
    let x_of = |b: f64| b / 32.0;
    for p in &m.points {
        let line = m.intercept_bytes + m.slope_bytes_per_batch * x_of(p.batch.unwrap_or(0.0));
        let err = (line - p.own_peak_bytes as f64).abs() / p.own_peak_bytes as f64;
        assert!(
            err < 0.01,
            "step {}: {line} vs {}",
            p.step,
            p.own_peak_bytes
        );
    }
    // What does not scale includes the cache the message prints.
    assert_eq!(m.fixed.cache_bytes, r.reserved_unallocated_bytes);
    assert!(m.fixed.parameters_bytes > 0 && m.fixed.optimizer_state_bytes > 0);
}
