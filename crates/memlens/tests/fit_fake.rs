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
/// recordings' C++ frames), which no fake tensor shows.
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
        // Transformers: allocated within 1.5%, reserved from 3% under to
        // 1.5% over (measured: -0.1..+1.1% and -2.6..+1.0%). Convolutional
        // models: under by the kernels' scratch, at most 8% reserved
        // (measured: allocated -5.2..+0.6%, reserved -7.2..-1.5%; the ViT's
        // were -6.5% and -8.1% before the reductions' staging buffers).
        let ok = if has_convolutions(workload) {
            (-0.06..=0.015).contains(&a) && (-0.08..=0.0).contains(&v)
        } else {
            a.abs() <= 0.015 && (-0.03..=0.015).contains(&v)
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
            // only just (891.3 MB of an 892.3 MB cap). The ViT: without its
            // reductions' staging buffers the trace called batch 26, which
            // ran out of memory on the GPU, a fit; with them, 25 (the true
            // largest, which ran) is called too big under the cap: an error
            // on the safe side whose cause was not found (the workspaces
            // the trace still lacks, cuDNN's and attention's, would push
            // the other way).
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
    // A step with convolutions is told the headroom its workspaces took.
    for file in ["resnet_amp.fp32.pickle.zst", "vit.bf16.pickle.zst"] {
        let w = &predict(file, None).warnings[0];
        assert!(
            w.contains("runs convolutions") && w.contains("headroom"),
            "{w}"
        );
    }
}
