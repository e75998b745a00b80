//! `memlens fit` against what the GPU measured (issue 30): five workloads
//! (a hand-written GPT, an HF GPT-2 through its own loss, a ResNet-50 with
//! bf16 autocast, an HF T5 encoder-decoder, a torchvision ViT) recorded at
//! batch 2 and 4 on an H200, then run at 8, 16 and 32 and, under a cap,
//! bisected for the largest batch that completes (`tests/gpu/fit_probes.py`;
//! the probes and the measurements are in `tests/corpus/fit`).
//!
//! The ViT is where the model falls short today: its allocated peak is
//! right (within 1.4%) but its reserved peak is 6% under at batch 16 and 32,
//! and the largest batch it names under the cap (26) is one the GPU could
//! not run (25 was the largest). Its tests hold what is right and no more.

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

fn probes(w: &str) -> (Snapshot, Snapshot) {
    let load = |b: u32| {
        Snapshot::load(&corpus().join(format!("{w}.b{b}.pickle.zst"))).expect("probe reads")
    };
    (load(2), load(4))
}

/// The workloads whose reserved peaks the model gets within 3%.
/// `fit` on workload `w`'s two probes (batch 2 and 4) under `opts`.
fn fit_workload(w: &str, opts: &FitOptions) -> memlens::fit::FitReport {
    let (a, b) = probes(w);
    let ps = [
        Probe {
            name: "b2",
            snap: &a,
            batch: 2,
        },
        Probe {
            name: "b4",
            snap: &b,
            batch: 4,
        },
    ];
    fit(&ps, opts).unwrap_or_else(|e| panic!("{w}: {e}"))
}

const WORKLOADS: [&str; 4] = ["gpt", "hf_gpt2", "resnet_amp", "t5"];

#[test]
fn batch_predictions_from_two_probes_are_within_three_percent_of_the_gpu() {
    let t = truth();
    for w in WORKLOADS {
        let measured = t["workloads"][w]["measured"].as_object().expect("measured");
        assert_eq!(measured.len(), 3, "{w}");
        for (batch, m) in measured {
            let n: u32 = batch.parse().expect("batch");
            let opts = FitOptions {
                batch: Some(n),
                ..FitOptions::default()
            };
            let p = fit_workload(w, &opts).predicted.expect("a prediction");
            let want = m["max_reserved"].as_u64().expect("reserved") as f64;
            let err = p.peak_reserved_bytes as f64 / want - 1.0;
            assert!(err.abs() <= 0.03, "{w} batch {n}: {err:+.3}");
        }
    }
}

#[test]
fn the_largest_batch_under_a_cap_never_claims_more_than_the_gpu_ran() {
    let t = truth();
    for w in WORKLOADS {
        let capped = &t["workloads"][w]["capped"];
        let opts = FitOptions {
            limit: capped["cap"].as_u64(),
            ..FitOptions::default()
        };
        let predicted = fit_workload(w, &opts)
            .largest_batch
            .expect("some batch fits");
        let truth = capped["largest_batch"].as_u64().expect("largest") as u32;
        // Never a batch the GPU could not run; exact on the two LMs, 3 below
        // on the ResNet (its cuDNN workspaces do not scale linearly).
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
        let opts = FitOptions {
            batch: Some(n),
            ..FitOptions::default()
        };
        let p = fit_workload("vit", &opts).predicted.expect("a prediction");
        let want = m["max_allocated"].as_u64().expect("allocated") as f64;
        let err = p.peak_allocated_bytes as f64 / want - 1.0;
        assert!(err.abs() <= 0.02, "vit batch {n}: {err:+.3}");
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
