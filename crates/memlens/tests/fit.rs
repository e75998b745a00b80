//! `memlens fit` against what the GPU measured (issue 30): five workloads
//! (a hand-written GPT, an HF GPT-2 through its own loss, a ResNet-50 with
//! bf16 autocast, an HF T5 encoder-decoder, a torchvision ViT) recorded at
//! batch 2 and 4 on an H200, then run at 8, 16 and 32 and, under a cap,
//! bisected for the largest batch that completes (`tests/gpu/fit_probes.py`;
//! the probes and the measurements are in `tests/corpus/fit`). Two more,
//! an HF BERT and a ViT-B/16-shaped model, were recorded the same way on an
//! H200 after the model below was built, to test it out of sample: before
//! it the BERT's probes did not even pair (their staging buffers, only at
//! batch 4, were an eighth of the operations) and the ViT-B's reserved
//! peaks were 3.8-7.5% under; with it both are within 0.7%.
//!
//! The ViT was where the model fell short: its reserved peak from the batch
//! 2 and 4 probes came out 6% under at batch 16 and 32. The cause was in
//! the probes, not the allocator model: past batch 8 the bias gradients'
//! sum (`gpu_reduce_kernel`) reduces across blocks and allocates staging
//! buffers (4-17 MiB at batch 16, twice that at 32) that no small probe
//! shows; probes at 16 and 32 (`vit.b16`, `vit.b32`, recorded on an H100)
//! give both peaks exactly, and so do the recordings at 16 and 32 with
//! those buffers taken out. `fit` now computes them at every batch from the
//! sums the probes' C++ frames name (`fit::reduce_scratch`). Its largest
//! batch under the cap is right (25) since every run is replayed with new
//! segments at rising and at falling addresses (one order alone named 26, a
//! batch the GPU could not run).

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

/// The workloads of the corpus: five the model was read against, and two
/// recorded after the staging buffers were modelled (an HF BERT with a bias
/// on every linear layer, a ViT-B/16-shaped model at 224x224), out of
/// sample.
const WORKLOADS: [&str; 7] = ["gpt", "hf_gpt2", "resnet_amp", "t5", "vit", "bert", "vit_b"];

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
        // Never a batch the GPU could not run; exact on the LMs and the ViT,
        // one below on the ResNet: its cuDNN workspaces, which cuDNN sizes
        // anew for each shape, are extrapolated over (its allocated peak 3-5%
        // high), but a convolution runs without one when memory is short, as
        // under the cap, so none of them decides whether a batch fits (it
        // was 3 below, 20 against 23, when they did).
        assert!(predicted <= truth, "{w}: {predicted} > {truth}");
        if w != "resnet_amp" {
            assert_eq!(predicted, truth, "{w}");
        } else {
            assert_eq!(predicted + 1, truth, "{w}: {predicted} vs {truth}");
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
    for w in WORKLOADS {
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

/// The sizes of the reduction kernel's staging buffers (not its 16-64 byte
/// semaphores) in recording `snap`, sorted.
fn recorded_staging(snap: &Snapshot) -> Vec<u64> {
    let mut sizes: Vec<u64> = snap
        .traces
        .iter()
        .flat_map(|t| &t.events)
        .filter(|e| e.action == memlens::snapshot::Action::Alloc && e.size > 1024)
        .filter(|e| {
            snap.stack(e.stack)
                .iter()
                .any(|&f| snap.str(snap.frame(f).name).contains("gpu_reduce_kernel"))
        })
        .map(|e| e.size)
        .collect();
    sizes.sort_unstable();
    sizes
}

/// The staging buffers fit computes at batch 16 and 32 from the batch 2 and
/// 4 probes (which ran none) are those the GPU allocated at 16 and 32, size
/// for size, but for the patch embedding's: a convolution's bias, whose sum
/// over a permuted gradient fit does not model (one a step: 4 MiB at 16, 8
/// MiB at 32; their peaks are exact without them, the buffer fits in
/// memory the step cached).
#[test]
fn staging_buffers_computed_from_small_probes_are_those_the_gpu_allocated() {
    use memlens::fit::reduce_scratch::{Gpu, Reduction};
    let (a, b) = probes("vit");
    let pa = Probe {
        name: "b2",
        snap: &a,
        batch: 2,
    };
    let pb = Probe {
        name: "b4",
        snap: &b,
        batch: 4,
    };
    let run = memlens::fit::probes::ScaledRun::from_probes(&pa, &pb).expect("pairs");
    // The linear layers' bias gradients: 25 sums a step (four in each of
    // six blocks, the head's), in three steps.
    assert_eq!(run.modelled_reductions, 75);
    assert!(run.staging_at(4).is_empty(), "none at the probes' batches");
    for n in [16u64, 32] {
        let mut expected: Vec<u64> = run.staging_at(n as u32).iter().map(|s| s.0).collect();
        assert_eq!(expected.len(), 72, "batch {n}");
        let conv = Reduction {
            shape: vec![n, 512, 8, 8],
            strides: vec![64 * 512, 1, 8 * 512, 512],
            reduced: vec![0, 2, 3],
            elem_size: 4,
            acc_size: 4,
        };
        let (patch, _) = conv.scratch(Gpu::default());
        expected.extend([patch; 3]);
        expected.sort_unstable();
        assert_eq!(
            expected,
            recorded_staging(&probe("vit", n as u32)),
            "batch {n}"
        );
    }
}

/// The GPU `memlens.record` wrote beside the larger probe
/// (`<probe>.device.json`) is the one the staging buffers are computed for:
/// an H100's 132 multiprocessors give the same answer as none recorded
/// (taken as an H100's or H200's); an A100's 108 are read and split the sums
/// otherwise.
#[test]
fn staging_buffers_follow_the_gpu_recorded_beside_the_probes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = |n: u32| {
        let to = dir.path().join(format!("vit.b{n}.pickle.zst"));
        std::fs::copy(corpus().join(format!("vit.b{n}.pickle.zst")), &to).expect("copy");
        to
    };
    let (pa, pb) = (copy(2), copy(4));
    let (a, b) = (
        Snapshot::load(&pa).expect("reads"),
        Snapshot::load(&pb).expect("reads"),
    );
    let (na, nb) = (pa.display().to_string(), pb.display().to_string());
    let predict = |sms: Option<u64>| {
        let device = pb.display().to_string() + ".device.json";
        match sms {
            Some(n) => std::fs::write(
                &device,
                format!(
                    r#"{{"format": "memlens-device/1", "devices": [{{"device": 0, "total_memory": 85520809984, "multiprocessors": {n}, "threads_per_multiprocessor": 2048}}]}}"#
                ),
            )
            .expect("device file"),
            None => {
                let _ = std::fs::remove_file(&device);
            }
        }
        let ps = [
            Probe {
                name: &na,
                snap: &a,
                batch: 2,
            },
            Probe {
                name: &nb,
                snap: &b,
                batch: 4,
            },
        ];
        let opts = FitOptions {
            batch: Some(32),
            ..FitOptions::default()
        };
        fit(&ps, &opts).expect("fit")
    };
    let assumed = predict(None);
    assert!(!assumed.basis.multiprocessors_recorded);
    assert_eq!(assumed.basis.multiprocessors, 132);
    let h100 = predict(Some(132));
    assert!(h100.basis.multiprocessors_recorded);
    assert_eq!(h100.predicted, assumed.predicted);
    let a100 = predict(Some(108));
    assert_eq!(a100.basis.multiprocessors, 108);
    // On 108 multiprocessors a sum long enough to fill the GPU splits
    // otherwise (at batch 32 the ViT's sums are split by their length
    // alone, and the peak did not move; at 512 the GPU's size bounds them).
    let mut run = memlens::fit::probes::ScaledRun::from_probes(
        &Probe {
            name: &na,
            snap: &a,
            batch: 2,
        },
        &Probe {
            name: &nb,
            snap: &b,
            batch: 4,
        },
    )
    .expect("pairs");
    let on_h100 = run.staging_at(512);
    run.gpu.sms = 108;
    assert_ne!(run.staging_at(512), on_h100);
}

/// One recording replayed as it ran (`memlens fit FILE --limit`): the capped
/// ResNet-50 that ran its steps with 4 cuDNN workspaces given up is a run
/// that completed (it was refused as one that "ran out of memory"); its
/// workspaces are ones it can do without, so under its cap, with new
/// segments placed as CUDA mostly places them (downward), it fits, as it did.
/// The run that failed is still refused.
#[test]
fn a_recording_whose_only_oom_entries_are_workspaces_given_up_is_a_run_that_completed() {
    use memlens::fit::fit_run;
    use memlens::replay::simulate::{simulate_ops, SimulateOptions};
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/oom");
    let cap = 892_338_175;
    let ran = Snapshot::load(&corpus.join("conv_workspace_caught.pickle.zst")).expect("reads");
    let opts = FitOptions {
        limit: Some(cap),
        ..Default::default()
    };
    let r = fit_run("conv_workspace_caught", &ran, &opts).expect("a run that completed");
    assert!(r.predicted.fits.is_some());
    // The program as fit builds it, under the cap, new segments downward.
    let probe = Probe {
        name: "conv_workspace_caught",
        snap: &ran,
        batch: 1,
    };
    let ops = memlens::fit::recorded_program(&probe).expect("ops");
    let sim = simulate_ops(
        &ops,
        0,
        &SimulateOptions {
            overhead: Some(0),
            allowed_memory_maximum: Some(cap),
            ..Default::default()
        },
    )
    .expect("runs");
    assert!(sim.first_oom.is_none(), "{:?}", sim.first_oom);
    assert_eq!(sim.workspaces_given_up, 4);

    let failed = Snapshot::load(&corpus.join("conv_workspace_oom.pickle.zst")).expect("reads");
    let err = fit_run("conv_workspace_oom", &failed, &opts)
        .expect_err("a run that failed")
        .to_string();
    assert!(err.contains("ran out of memory"), "{err}");
}
