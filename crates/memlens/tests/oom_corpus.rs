//! Issue 16 on real OOMs: tests/corpus/oom, recorded on an H100 by
//! tests/gpu/oom_harness.py (truth.json holds the memory figures at each OOM,
//! the true largest batch found on the GPU, and reruns under allocator
//! settings). The figures asserted here come from truth.json.

use memlens::doctor::{diagnose, DoctorOptions};
use memlens::oom::batch_model::BatchSlopeSource;
use memlens::oom::whatif::WhatIf;
use memlens::oom::{
    analyze_snapshot, chosen_oom, explain_message, simulate_what_if_exact, Cause, FixKind,
    OomOptions, OomReport, WhatIfSpec,
};
use memlens::replay::limits::{infer, with_inferred};
use memlens::replay::simulate::{simulate, SimulateOptions};
use memlens::replay::tune::tune;
use memlens::sim::program::Op;
use memlens::sim::AllocatorConfig;
use memlens::snapshot::Action;
use memlens::Snapshot;
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/oom")
}

fn load(name: &str) -> Snapshot {
    Snapshot::load(&dir().join(format!("{name}.pickle.zst"))).expect("corpus snapshot loads")
}

fn truth() -> Value {
    let text = std::fs::read_to_string(dir().join("truth.json")).expect("truth.json");
    serde_json::from_str(&text).expect("valid truth.json")
}

fn recorded(name: &str) -> Value {
    truth()["workloads"][name]["recorded"].clone()
}

fn u(v: &Value) -> u64 {
    v.as_u64().expect("a number")
}

fn message(name: &str) -> memlens::oom::OomMessage {
    let text = std::fs::read_to_string(dir().join(format!("{name}.message.txt"))).expect("message");
    memlens::oom::message::find(&text).expect("an OOM message")
}

fn analyze(name: &str, with_message: bool, batch: u64) -> OomReport {
    let opts = OomOptions {
        message: with_message.then(|| message(name)),
        batch: Some(batch),
        ..Default::default()
    };
    analyze_snapshot(&load(name), &opts)
        .expect("analysis runs")
        .expect("the trace holds an OOM")
}

/// The rerun of `workload` under `conf` at the recorded batch.
fn rerun(workload: &str, conf: &str) -> Value {
    truth()["reruns"]
        .as_array()
        .expect("reruns")
        .iter()
        .find(|r| r["workload"] == workload && r["conf"] == conf)
        .cloned()
        .expect("that rerun")
}

#[test]
fn the_cap_is_inferred_from_the_oom_event_and_read_from_the_message() {
    let r = recorded("frag_cap");
    let snap = load("frag_cap");
    let l = infer(&snap, 0, None);
    let cap = l.memory_cap.expect("a cap");
    // The lower end: what PyTorch held (3,800 MiB), below the real 4 GiB cap.
    assert_eq!(cap.bytes, u(&r["at_oom"]["reserved_bytes"]));
    assert!(cap.bytes < u(&r["cap_bytes"]));
    assert!(cap.source.contains("event 950"), "{}", cap.source);
    let l = infer(&snap, 0, Some(&message("frag_cap").limits()));
    assert_eq!(l.memory_cap.expect("a cap").bytes, u(&r["cap_bytes"]));
    // "79.18 GiB" as printed: within the rounding of two decimals.
    let total = l.device_total.expect("printed total").bytes as f64;
    let real = u(&r["device_total_bytes"]) as f64;
    assert!(
        (total - real).abs() <= 0.005 * (1u64 << 30) as f64,
        "{total} vs {real}"
    );
}

#[test]
fn fragmentation_under_a_cap_is_fragmentation_on_both_paths() {
    for with_message in [false, true] {
        let rep = analyze("frag_cap", with_message, 1);
        assert_eq!(rep.cause, Cause::Fragmentation);
        // 380 free pieces of 7 MiB, 2.41 GiB in all, for a 2 GiB request.
        assert_eq!(rep.largest_free_block_bytes, 7 << 20);
        assert_eq!(
            rep.reserved_unallocated_bytes,
            u(&recorded("frag_cap")["at_oom"]["inactive_split_bytes"])
        );
    }
    let text = std::fs::read_to_string(dir().join("frag_cap.message.txt")).expect("message");
    assert_eq!(
        explain_message(&text).expect("parses").cause,
        Cause::Fragmentation
    );
    // A cap with little cached memory stays memory_cap.
    assert_eq!(analyze("gpt_first", false, 16).cause, Cause::MemoryCap);
}

#[test]
fn simulate_with_no_flags_reproduces_the_oom_and_predicts_the_expandable_rerun() {
    let snap = load("frag_cap");
    let oom_at = snap.traces[0]
        .events
        .iter()
        .position(|e| e.action == Action::Oom)
        .expect("an oom event");
    let (opts, _) = with_inferred(&snap, 0, &SimulateOptions::default(), None);
    let base = simulate(&snap, 0, &opts).expect("simulates");
    assert_eq!(base.num_ooms, 1);
    assert_eq!(base.first_oom.expect("the OOM").event_index, oom_at);

    let expandable = SimulateOptions {
        config: AllocatorConfig::parse("expandable_segments:True").expect("valid"),
        ..SimulateOptions::default()
    };
    let (opts, _) = with_inferred(&snap, 0, &expandable, None);
    let sim = simulate(&snap, 0, &opts).expect("simulates");
    let real = rerun("frag_cap", "expandable_segments:True");
    assert_eq!(real["oom"], true);
    assert!(
        sim.num_ooms > 0,
        "the rerun under expandable segments OOMed too"
    );
    let peak = u(&real["peak_reserved_bytes"]) as f64;
    let err = (sim.peak_reserved_bytes as f64 - peak).abs() / peak;
    assert!(
        err <= 0.02,
        "peak reserved {} vs rerun {peak} ({:.2}%)",
        sim.peak_reserved_bytes,
        err * 100.0
    );
}

#[test]
fn tune_never_shows_zero_ooms_for_a_setting_whose_rerun_oomed() {
    let snap = load("frag_cap");
    let (opts, _) = with_inferred(&snap, 0, &SimulateOptions::default(), None);
    let t = tune(&snap, 0, &opts).expect("tunes");
    let mut checked = 0;
    for r in truth()["reruns"].as_array().expect("reruns") {
        if r["workload"] != "frag_cap" || r["oom"] != true {
            continue;
        }
        if let Some(c) = t
            .candidates
            .iter()
            .find(|c| c.config == r["conf"].as_str().unwrap_or(""))
        {
            assert!(
                c.num_ooms > 0,
                "{} showed 0 OOMs; its rerun OOMed",
                c.config
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "expandable_segments and max_split_size_mb:64 were checked"
    );
    assert!(
        !t.advice.contains("set PYTORCH_CUDA_ALLOC_CONF"),
        "{}",
        t.advice
    );
}

#[test]
fn two_ooms_in_one_trace_oom_and_doctor_speak_of_the_last() {
    let snap = load("two_ooms");
    let events = &snap.traces[0].events;
    let ooms: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Oom)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ooms.len(), u(&recorded("two_ooms")["num_ooms"]) as usize);
    let last = *ooms.last().expect("two");
    assert_eq!(chosen_oom(&snap), Some((0, last)));
    let rep = analyze("two_ooms", false, 128);
    assert_eq!(rep.event_index, last);
    // The first failed for 256 MiB in training, the last for 1 GiB in evaluation.
    assert_eq!(events[ooms[0]].size, 256 << 20);
    assert_eq!(rep.tried_to_allocate_bytes, 1 << 30);
    let d = diagnose(
        &[("two_ooms".to_string(), &snap)],
        &DoctorOptions::default(),
    );
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == "oom")
        .expect("an oom finding");
    assert_eq!(f.bytes, Some(1 << 30));
    assert!(f.title.contains(rep.cause.as_str()), "{}", f.title);
    let doc = d.oom.expect("doctor's OOM report");
    assert_eq!((doc.event_index, doc.cause), (last, rep.cause));
}

#[test]
fn fits_only_with_margin_and_never_from_a_step_cut_at_the_failure() {
    let truth = truth();
    // gpt_warm: three good steps at batch 4, 6, 8 before batch 16 failed: a
    // modelled step; with the printed cap, the batch said to fit is within
    // one of the largest that ran on the GPU (12).
    let rep = analyze("gpt_warm", true, 16);
    let cap = rep.memory_cap.as_ref().expect("cap").bytes;
    assert_eq!(cap, u(&recorded("gpt_warm")["cap_bytes"]));
    let fits: Vec<_> = rep.fixes.iter().filter(|f| f.fits == Some(true)).collect();
    assert!(!fits.is_empty());
    let snap = load("gpt_warm");
    let margin = rep.step_model.as_ref().expect("a step model").fit_margin();
    for f in &fits {
        // The margin: a little more of the batch still fits under the same limits.
        let spec = f.what_if.as_ref().expect("a what-if");
        let more = WhatIfSpec {
            batch_fraction: spec.batch_fraction * (1.0 + margin),
            ..spec.clone()
        };
        let sim = simulate_what_if_exact(&snap, &rep, &more).expect("simulates");
        assert_eq!(sim.num_ooms, 0, "{}", f.action);
        let limit = spec.memory_cap_bytes.expect("a cap");
        assert!(f.predicted_peak_reserved_bytes.expect("a peak") <= limit);
    }
    let said = rep
        .batch
        .as_ref()
        .and_then(|b| b.max_batch)
        .expect("a batch");
    let real = u(&truth["workloads"]["gpt_warm"]["largest_batch"]);
    assert!(said <= real && real - said <= 1, "said {said}, true {real}");
    // gpt_first failed in its first step: the step is known only up to the
    // failure, so nothing is promised to fit.
    let rep = analyze("gpt_first", true, 16);
    assert!(rep.fixes.iter().all(|f| f.fits != Some(true)));
    // What would answer it: the whole step traced with fake tensors, under
    // the cap inferred here (bytes, as memlens.predict takes them).
    let pointer = format!("limit={}, largest=True", cap_of(&rep));
    assert!(
        rep.warnings
            .iter()
            .any(|w| w.contains("memlens.predict(") && w.contains(&pointer)),
        "{:?}",
        rep.warnings
    );
    let warm = analyze("gpt_warm", true, 16);
    assert!(
        !warm.warnings.iter().any(|w| w.contains("memlens.predict(")),
        "a modelled step needs no trace"
    );
}

fn cap_of(rep: &OomReport) -> u64 {
    rep.memory_cap.as_ref().expect("cap").bytes
}

/// The measured truth of gpt_warm's memory per sample (`oom_harness.sh slope`
/// on the GPU: one step at each of batch 4, 6, 8, 10, 12, what each added at
/// its peak, and the least-squares line through them).
fn slope_truth() -> Value {
    let text = std::fs::read_to_string(dir().join("slope.json")).expect("slope.json");
    serde_json::from_str(&text).expect("valid slope.json")
}

#[test]
fn gpt_warms_slope_is_fitted_on_its_steps_at_batch_4_6_8() {
    let rep = analyze("gpt_warm", false, 16);
    let m = rep.batch_model.as_ref().expect("a batch model");
    assert_eq!(m.source, BatchSlopeSource::FittedSteps);
    assert!(!m.estimate && !m.lower_bound);
    // The steps before the failing one ran at batch 4, 6 and 8 (the run's log).
    let log: Vec<String> = recorded("gpt_warm")["log"]
        .as_array()
        .expect("log")
        .iter()
        .map(|l| l.as_str().unwrap_or("").to_string())
        .collect();
    let batches: Vec<f64> = log
        .iter()
        .take(3)
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|b| b.parse().ok())
                .expect("a batch")
        })
        .collect();
    let fitted: Vec<f64> = m.points.iter().filter_map(|p| p.batch).collect();
    assert_eq!(fitted.len(), batches.len());
    for (f, b) in fitted.iter().zip(&batches) {
        assert!((f - b).abs() < 0.05, "fitted batch {f}, ran at {b}");
    }
    // Bytes per sample against the GPU's.
    let truth = slope_truth();
    let real = truth["slope_bytes_per_sample"].as_f64().expect("a slope");
    let said = m
        .slope_bytes_per_sample
        .expect("per sample (--batch given)");
    let err = (said - real).abs() / real;
    assert!(
        err <= 0.01,
        "slope {said} vs measured {real} ({:.2}%)",
        err * 100.0
    );
    // What does not scale: the parameters and AdamW's two moments of them
    // (and its step counters).
    let params = m.fixed.parameters_bytes as f64;
    assert!(params > 0.0);
    let moments = m.fixed.optimizer_state_bytes as f64 / params;
    assert!((moments - 2.0).abs() < 0.03, "{moments}");
    // The cache: reserved but unallocated at the failure, as the run measured it.
    let at_oom = &recorded("gpt_warm")["at_oom"];
    assert_eq!(
        m.fixed.cache_bytes,
        u(&at_oom["reserved_bytes"]) - u(&at_oom["allocated_bytes"])
    );
}

#[test]
fn a_step_known_only_to_the_failure_gives_an_estimate_and_a_lower_bound() {
    let rep = analyze("gpt_first", false, 16);
    let m = rep.batch_model.as_ref().expect("a batch model");
    assert_eq!(m.source, BatchSlopeSource::FailingStep);
    assert!(m.estimate && m.lower_bound);
    assert_eq!(m.points.len(), 1);
    assert!(!m.points[0].complete);
    assert!(m.text.contains("lower bound"), "{}", m.text);
    // Every simulated fix on it says so.
    for f in rep.fixes.iter().filter(|f| f.what_if.is_some()) {
        assert!(f.action.contains("bound"), "{}", f.action);
        assert_ne!(f.fits, Some(true), "{}", f.action);
    }
}

#[test]
fn the_what_if_program_is_typed_operations() {
    let snap = load("gpt_warm");
    let rep = analyze("gpt_warm", true, 16);
    let an = memlens::trace::Analysed::new(&snap);
    let w = WhatIf::new(&an, 0, rep.event_index, None).expect("a model");
    let base = rep
        .fixes
        .iter()
        .find(|f| f.kind == FixKind::SmallerBatch)
        .and_then(|f| f.what_if.clone())
        .expect("a smaller-batch fix");
    let plain = w.ops(&base);
    let with = w.ops(&WhatIfSpec {
        empty_cache_at_step_start: true,
        free_blocks: vec![1, 2],
        ..base.clone()
    });
    let count = |ops: &[Op], f: fn(&Op) -> bool| ops.iter().filter(|o| f(o)).count();
    let empties = |o: &Op| matches!(o, Op::EmptyCache);
    let frees = |o: &Op| matches!(o, Op::Free { .. });
    assert_eq!(count(&with, empties), count(&plain, empties) + 1);
    assert_eq!(count(&with, frees), count(&plain, frees) + 2);
    // The recorded run up to the failing step keeps the trace's allocations.
    let allocs_before = snap.traces[0].events[..w.model.failing_step_start]
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .count();
    let alloc = |o: &Op| matches!(o, Op::Alloc { .. });
    assert_eq!(count(&plain, alloc), allocs_before + w.model.allocations);
    // At the recorded batch, under the printed cap, the program fails where
    // the run did: a 256 MiB segment that does not fit the 3 GiB cap.
    let at_failure = WhatIfSpec {
        batch_fraction: 1.0,
        ..base
    };
    let sim = w.simulate(&at_failure).expect("simulates");
    let oom = sim.first_oom.expect("the failing batch fails");
    assert_eq!(oom.alloc_size, rep.tried_to_allocate_bytes);
    assert!(oom.reserved_bytes + oom.alloc_size > u(&recorded("gpt_warm")["cap_bytes"]));
}
