//! `memlens fit` on training steps traced with fake tensors, no GPU memory
//! used (`memlens.trace_step`, issue 30), against the same steps run on a
//! GPU (`tests/gpu/fake_step.py`, H100 and H200; traces and measurements in
//! `tests/corpus/fit/fake`): twelve models of different shapes (a
//! hand-written GPT, HF GPT-2, T5, Llama, GPT-NeoX, OPT, Gemma2, Phi-3,
//! BERT and Mixtral (a mixture of experts) from their configs, a torchvision
//! ViT, a ResNet-50 under autocast), in fp32 and under bf16 autocast.

use memlens::fit::{fit_run, FitOptions, RunReport};
use memlens::Snapshot;
use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/fit/fake")
}

fn truth() -> serde_json::Value {
    let text = std::fs::read_to_string(corpus().join("truth.json")).expect("truth");
    serde_json::from_str(&text).expect("JSON")
}

fn predict(file: &str, limit: Option<u64>) -> RunReport {
    let snap = Snapshot::load(&corpus().join(file)).expect("trace reads");
    let opts = FitOptions {
        limit,
        ..FitOptions::default()
    };
    fit_run(file, &snap, &opts).expect("prediction")
}

fn error(predicted: u64, measured: &serde_json::Value) -> f64 {
    predicted as f64 / measured.as_u64().expect("measured") as f64 - 1.0
}

/// Models whose every allocation an operator returns or the tracer adds
/// (cuBLAS's workspaces, reductions' staging buffers): transformers. The
/// convolutional ones (ResNet-50, the ViT's patch embedding) run kernels
/// with scratch memory of their own (cuDNN's workspaces, seen in their
/// recordings' C++ frames), which no fake tensor shows: the tracer measures
/// them on the GPU (`python/memlens/_kernel_scratch.py`).
fn has_convolutions(workload: &str) -> bool {
    matches!(workload, "resnet_amp" | "vit")
}

#[test]
fn fake_traces_of_transformers_predict_the_gpu_within_about_one_percent() {
    let t = truth();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, case) in t["cases"].as_object().expect("cases") {
        let Some(file) = case["trace"].as_str() else {
            continue;
        };
        let r = predict(file, None);
        let a = error(r.predicted.peak_allocated_bytes, &case["max_allocated"]);
        let v = error(r.predicted.peak_reserved_bytes, &case["max_reserved"]);
        let workload = case["workload"].as_str().expect("workload");
        // Transformers: allocated and reserved within 1.5% (measured:
        // -0.1..+1.1% and -0.4..+1.2%; -2.6..+1.0% reserved before the
        // optimizer ran its foreach kernels as on the GPU). Convolutional
        // models, their cuDNN workspaces measured: allocated within 2%,
        // reserved from 4% under to 2.5% over (measured: allocated +0.2..
        // +0.6%, reserved -3.3..+2.2%; the ViT in bf16 was -1.6% / -1.2%
        // with the one-tensor optimizer, ResNet-50 -1.0% / -2.7% without
        // the workspaces, and before the reductions' staging buffers the
        // ViT's reserved -6.5% and -8.1%).
        let ok = if has_convolutions(workload) {
            a.abs() <= 0.02 && (-0.04..=0.025).contains(&v)
        } else {
            a.abs() <= 0.015 && v.abs() <= 0.015
        };
        if !ok {
            failures.push(format!("{name}: allocated {a:+.3}, reserved {v:+.3}"));
        }
        assert_eq!(r.basis.source, "fake tensors");
        assert_eq!(r.basis.steps, Some(3));
        checked += 1;
    }
    assert_eq!(checked, 23, "every traced case is checked");
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn the_largest_batch_from_fake_traces_is_the_gpu_s_or_one_below() {
    let t = truth();
    let workloads = t["largest"]["workloads"].as_object().expect("workloads");
    for (w, case) in workloads {
        let cap = case["cap"].as_u64().expect("cap");
        let largest = case["largest_batch"].as_u64().expect("largest");
        let fits = |b: u64| {
            let file = case["traces"][b.to_string()].as_str().expect("trace");
            predict(file, Some(cap)).predicted.fits == Some(true)
        };
        match w.as_str() {
            // The true largest batch, exactly.
            "gpt" | "hf_gpt2" | "t5" => {
                assert!(
                    fits(largest - 1) && fits(largest),
                    "{w}: the true largest fits"
                );
                assert!(!fits(largest + 1), "{w}: one more does not");
            }
            // One below. The ResNet: what the GPU ran at the largest fits
            // only just (891.3 MB of an 892.3 MB cap); with its cuDNN
            // workspaces measured (done without where they cannot be had)
            // the answer is unchanged. The ViT: without its reductions'
            // staging buffers the trace called batch 26, which ran out of
            // memory on the GPU, a fit; with them, 25 (the true largest,
            // which ran) is called too big under the cap: an error on the
            // safe side whose cause was not found (the attention kernels'
            // workspaces the trace still lacks would push the other way).
            "resnet_amp" | "vit" => {
                assert!(fits(largest - 1), "{w}: one below fits");
                assert!(
                    !fits(largest),
                    "{w}: the model calls the true largest too big"
                );
            }
            other => panic!("unexpected workload {other}"),
        }
    }
}

#[test]
fn a_fake_trace_is_known_by_its_schema_and_carries_its_caveats() {
    let snap = Snapshot::load(&corpus().join("llama.bf16.pickle.zst")).expect("reads");
    let fake = snap.fake_trace.as_ref().expect("a fake trace");
    assert_eq!(fake.steps, 3);
    assert_eq!(fake.precision, "bf16");
    assert_eq!(fake.workspace_bytes, 32 << 20);
    assert!(snap.recording.is_none(), "not a memlens.record recording");
    assert!(snap.segments.is_empty(), "no allocator state");
    let r = predict("llama.bf16.pickle.zst", None);
    assert!(r.warnings[0].contains("scratch memory"), "{:?}", r.warnings);
    assert_eq!(r.basis.precision.as_deref(), Some("bf16"));
    // A step with convolutions is told its workspaces were measured.
    for file in ["resnet_amp.fp32.pickle.zst", "vit.bf16.pickle.zst"] {
        let snap = Snapshot::load(&corpus().join(file)).expect("reads");
        let fake = snap.fake_trace.as_ref().expect("a fake trace");
        assert!(fake.scratch_measuring && fake.scratch_unmeasured == 0);
        assert!(fake.scratch_measured > 0);
        let w = &predict(file, None).warnings[0];
        assert!(
            w.contains("runs convolutions") && w.contains("were measured on the GPU"),
            "{w}"
        );
    }
    // Their workspaces are cuDNN's, as a recording's C++ frames name them:
    // the allocator model does without one that cannot be had.
    let snap = Snapshot::load(&corpus().join("resnet_amp.fp32.pickle.zst")).expect("reads");
    let workspaces = snap.cudnn_workspace_stacks();
    let device = snap.first_traced_device();
    let in_workspaces = snap
        .device_trace(device)
        .iter()
        .filter(|e| e.action == memlens::snapshot::Action::Alloc)
        .filter(|e| workspaces.contains(e.stack))
        .count();
    assert!(in_workspaces > 0, "cuDNN's workspaces are marked");
}

#[test]
fn the_least_limit_is_where_the_model_s_verdict_turns() {
    // What memlens.predict's search steers by: the trace fits under its
    // least limit and not 2 MiB below it, which is at most the reserved peak
    // (under which every run fits) and at least the allocated peak less the
    // workspaces a run under a limit does without.
    let file = "resnet_amp.b22.pickle.zst";
    let snap = Snapshot::load(&corpus().join(file)).expect("trace reads");
    let at = |limit: u64, least_limit: bool| {
        let opts = FitOptions {
            limit: Some(limit),
            least_limit,
            ..FitOptions::default()
        };
        fit_run(file, &snap, &opts).expect("prediction").predicted
    };
    let p = at(1 << 40, true);
    let least = p.least_limit_bytes.expect("asked for");
    assert_eq!(least % (2 << 20), 0);
    assert!(least <= p.peak_reserved_bytes && least > p.peak_allocated_bytes / 2);
    // A convolution's largest workspaces are done without near the edge:
    // the least limit is well under the reserved peak (844 against 912 MiB).
    assert!(least < p.peak_reserved_bytes - (32 << 20), "{least} {p:?}");
    assert_eq!(at(least, false).fits, Some(true));
    assert_eq!(at(least - (2 << 20), false).fits, Some(false));
    assert_eq!(at(least, false).least_limit_bytes, None, "only when asked");
}

#[test]
fn fake_traces_at_batch_two_hold_the_optimizer_step_s_foreach_temporaries() {
    // At batch 2 the step's peak is the optimizer's (AdamW's multi-tensor
    // kernels hold one more copy of the parameters at once): traced with the
    // one-tensor-at-a-time loop a fake parameter used to get, the ViT was
    // 15.4% under the GPU's allocated peak and the GPT 9.4%. Measured on the
    // H200 with no cap (tests/gpu/least_limit_check.py --uncapped).
    let t = truth();
    let cases = t["small_batch"]["workloads"]
        .as_object()
        .expect("small_batch");
    assert_eq!(cases.len(), 5);
    let mut failures = Vec::new();
    for (name, case) in cases {
        let r = predict(case["trace"].as_str().expect("trace"), None);
        let a = error(r.predicted.peak_allocated_bytes, &case["max_allocated"]);
        let v = error(r.predicted.peak_reserved_bytes, &case["max_reserved"]);
        // Measured: allocated -0.7..+0.3%, reserved -0.9..+1.9%.
        if a.abs() > 0.01 || v.abs() > 0.025 {
            failures.push(format!("{name}: allocated {a:+.3}, reserved {v:+.3}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
