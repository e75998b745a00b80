//! `memlens fit` against what the GPU measured (issue 30): five workloads
//! (a hand-written GPT, an HF GPT-2 through its own loss, a ResNet-50 with
//! bf16 autocast, an HF T5 encoder-decoder, a torchvision ViT) recorded at
//! batch 2 and 4 on an H200, then run at 8, 16 and 32 and, under a cap,
//! bisected for the largest batch that completes (`tests/gpu/fit_probes.py`;
//! the probes and the measurements are in `tests/corpus/fit`).
//!
//! The ViT is where the model falls short today: its reserved peak from the
//! batch 2 and 4 probes is 6% under at batch 16 and 32. The cause is in the
//! probes, not the allocator model: past batch 8 the bias gradients' sum
//! (`gpu_reduce_kernel`) reduces across blocks and allocates staging
//! buffers (4-17 MiB at batch 16, twice that at 32) that no small probe
//! shows; probes at 16 and 32 (`vit.b16`, `vit.b32`, recorded on an H100)
//! give both peaks exactly. Its largest batch under the cap is right (25)
//! since every run is replayed with new segments at rising and at falling
//! addresses (one order alone named 26, a batch the GPU could not run).

use memlens::fit::{fit, probes::Probe, FitOptions};
use memlens::Snapshot;
use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/fit")
}

fn truth() -> serde_json::Value {
    let text = std::fs::read_to_string(corpus().join("fit_truth.json")).expect("truth");
    serde_json::from_str(&text).expect("JSON")
}

fn probe(w: &str, batch: u32) -> Snapshot {
    Snapshot::load(&corpus().join(format!("{w}.b{batch}.pickle.zst"))).expect("probe reads")
}

fn probes(w: &str) -> (Snapshot, Snapshot) {
    (probe(w, 2), probe(w, 4))
}

/// `fit` on workload `w`'s probes at `batches` under `opts`.
fn fit_probes_at(w: &str, batches: [u32; 2], opts: &FitOptions) -> memlens::fit::FitReport {
    let (a, b) = (probe(w, batches[0]), probe(w, batches[1]));
    let names = batches.map(|n| format!("b{n}"));
    let ps = [
        Probe {
            name: &names[0],
            snap: &a,
            batch: batches[0],
        },
        Probe {
            name: &names[1],
            snap: &b,
            batch: batches[1],
        },
    ];
    fit(&ps, opts).unwrap_or_else(|e| panic!("{w}: {e}"))
}

/// `fit` on workload `w`'s two probes (batch 2 and 4) under `opts`.
fn fit_workload(w: &str, opts: &FitOptions) -> memlens::fit::FitReport {
    fit_probes_at(w, [2, 4], opts)
}

/// The prediction at batch `n` from workload `w`'s probes at `batches`.
fn predicted_at(w: &str, batches: [u32; 2], n: u32) -> memlens::fit::Prediction {
    let opts = FitOptions {
        batch: Some(n),
        ..FitOptions::default()
    };
    fit_probes_at(w, batches, &opts)
        .predicted
        .expect("a prediction")
}

/// The workloads whose reserved peaks the model gets within 3%.
const WORKLOADS: [&str; 4] = ["gpt", "hf_gpt2", "resnet_amp", "t5"];

#[test]
fn batch_predictions_from_two_probes_are_within_three_percent_of_the_gpu() {
    let t = truth();
    for w in WORKLOADS {
        let measured = t["workloads"][w]["measured"].as_object().expect("measured");
        assert_eq!(measured.len(), 3, "{w}");
        for (batch, m) in measured {
            let n: u32 = batch.parse().expect("batch");
            let p = predicted_at(w, [2, 4], n);
            let want = m["max_reserved"].as_u64().expect("reserved") as f64;
            let err = p.peak_reserved_bytes as f64 / want - 1.0;
            assert!(err.abs() <= 0.03, "{w} batch {n}: {err:+.3}");
        }
    }
}

#[test]
fn the_largest_batch_under_a_cap_never_claims_more_than_the_gpu_ran() {
    let t = truth();
    for w in WORKLOADS.into_iter().chain(["vit"]) {
        let capped = &t["workloads"][w]["capped"];
        let opts = FitOptions {
            limit: capped["cap"].as_u64(),
            ..FitOptions::default()
        };
        let predicted = fit_workload(w, &opts)
            .largest_batch
            .expect("some batch fits");
        let truth = capped["largest_batch"].as_u64().expect("largest") as u32;
        // Never a batch the GPU could not run; exact on the LMs and the ViT,
        // 3 below on the ResNet (its cuDNN workspaces do not scale linearly).
        assert!(predicted <= truth, "{w}: {predicted} > {truth}");
        if w != "resnet_amp" {
            assert_eq!(predicted, truth, "{w}");
        } else {
            assert!(predicted + 3 >= truth, "{w}: {predicted} vs {truth}");
        }
    }
}

#[test]
fn the_vit_allocated_peak_is_within_two_percent() {
    let t = truth();
    for (batch, m) in t["workloads"]["vit"]["measured"]
        .as_object()
        .expect("measured")
    {
        let n: u32 = batch.parse().expect("batch");
        let p = predicted_at("vit", [2, 4], n);
        let want = m["max_allocated"].as_u64().expect("allocated") as f64;
        let err = p.peak_allocated_bytes as f64 / want - 1.0;
        assert!(err.abs() <= 0.02, "vit batch {n}: {err:+.3}");
    }
}

/// At a batch it recorded, fit replays that probe's own operations: its
/// peak must be the GPU's, exactly. With new segments only at falling
/// addresses the ViT's batch 4 came out 2 MiB under and its batch 16 probe
/// 21 MiB under; the higher of both orders is exact on every probe.
#[test]
fn at_a_probed_batch_the_prediction_is_what_the_gpu_measured() {
    let t = truth();
    for w in WORKLOADS.into_iter().chain(["vit"]) {
        for n in [2u32, 4] {
            let p = predicted_at(w, [2, 4], n);
            let gpu = &t["workloads"][w]["probes"][n.to_string()];
            assert_eq!(
                Some(p.peak_reserved_bytes),
                gpu["max_reserved"].as_u64(),
                "{w} batch {n}"
            );
        }
    }
    let text = std::fs::read_to_string(corpus().join("vit_large_probes.json")).expect("truth");
    let large: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for n in [16u32, 32] {
        let p = predicted_at("vit", [16, 32], n);
        let gpu = &large[n.to_string()];
        assert_eq!(
            Some(p.peak_reserved_bytes),
            gpu["max_reserved"].as_u64(),
            "vit batch {n}"
        );
        // Allocated bytes include the remainders left unsplit in the blocks
        // chosen, which the addresses decide too: within 0.5%.
        let want = gpu["max_allocated"].as_u64().expect("allocated") as f64;
        let err = p.peak_allocated_bytes as f64 / want - 1.0;
        assert!(err.abs() <= 0.005, "vit batch {n}: {err:+.4}");
    }
}

#[test]
fn probes_that_do_not_pair_are_refused_not_guessed() {
    let (a, _) = probes("gpt");
    let (other, _) = probes("resnet_amp");
    let ps = [
        Probe {
            name: "gpt",
            snap: &a,
            batch: 2,
        },
        Probe {
            name: "resnet",
            snap: &other,
            batch: 4,
        },
    ];
    let e = fit(&ps, &FitOptions::default()).expect_err("different code");
    assert!(e.to_string().contains("did not run the same code"), "{e}");
    let same = [
        Probe {
            name: "x",
            snap: &a,
            batch: 2,
        },
        Probe {
            name: "y",
            snap: &a,
            batch: 2,
        },
    ];
    assert!(fit(&same, &FitOptions::default()).is_err());
}
