//! A fix is offered only where the recording grounds it (issue 30): no
//! autocast without activations live at the failure, no "keep shapes
//! steady" where no line allocated other sizes from one step to the next.

use memlens::oom::{analyze_snapshot, OomOptions};
use memlens::Snapshot;
use std::path::PathBuf;

/// `oom`'s analysis of the OOM in tests/corpus/oom/`name`.
fn oom_report(name: &str) -> memlens::oom::OomReport {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/oom")
        .join(name);
    let snap = Snapshot::load(&path).expect("reads");
    analyze_snapshot(&snap, &OomOptions::default())
        .expect("analyses")
        .expect("has an OOM")
}

fn oom_fix_kinds(name: &str) -> Vec<String> {
    let v = serde_json::to_value(oom_report(name)).expect("serializes");
    v["fixes"]
        .as_array()
        .expect("fixes")
        .iter()
        .map(|f| f["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_fragmentation_oom_of_equal_tensors_gets_no_autocast_and_no_steady_shapes() {
    // 400 equal tensors and one 2 GiB request: no forward pass, one size a line.
    let kinds = oom_fix_kinds("frag_cap.pickle.zst");
    assert!(!kinds.iter().any(|k| k == "mixed_precision"), "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "steady_shapes"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "raise_memory_cap"), "{kinds:?}");
}

/// The capped ResNet-50 of a constant shape (batch 24 under 851 MiB, an
/// H200): its layers allocate many sizes from one line in every step alike,
/// and only its cuDNN workspaces changed between steps (a workspace given up
/// runs another algorithm with another workspace). "Keep shapes steady" led
/// its fix list; shapes did not vary.
#[test]
fn a_constant_shape_cnn_under_a_cap_gets_no_steady_shapes() {
    let kinds = oom_fix_kinds("conv_workspace_oom.pickle.zst");
    assert!(!kinds.iter().any(|k| k == "steady_shapes"), "{kinds:?}");
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("smaller_batch"),
        "{kinds:?}"
    );
}

/// A fragmentation OOM under a cap with the device roomy (138 GiB free on an
/// H200): the cap refused the new segment, and the explanation says so
/// rather than "the device had only 138.23 GiB free".
#[test]
fn a_fragmentation_oom_under_a_cap_names_the_cap_not_the_devices_free_memory() {
    for name in ["conv_workspace_oom.pickle.zst", "frag_cap.pickle.zst"] {
        let r = oom_report(name);
        assert!(
            r.explanation.contains("the process's cap of"),
            "{}",
            r.explanation
        );
        assert!(r.explanation.contains("left no room"), "{}", r.explanation);
        assert!(
            !r.explanation.contains("device had only"),
            "{}",
            r.explanation
        );
    }
}

#[test]
fn a_training_step_with_activations_live_still_gets_autocast() {
    let kinds = oom_fix_kinds("gpt_warm.pickle.zst");
    assert!(kinds.iter().any(|k| k == "mixed_precision"), "{kinds:?}");
}

/// The fragmentation OOM of equal tensors in a plain loop (no model, no
/// batch): no batch advice anywhere (no smaller batch, no batch model, no
/// "combine it with a smaller batch"), and the first fix is the one the GPU
/// held: freeing the tensors kept at the `keep.append` line
/// (`tests/gpu/frag_cap_fix.py`: as recorded it fails under the 4 GiB cap,
/// with them freed the 2 GiB request succeeds, H100 2026-11-27).
#[test]
fn the_fragmentation_oom_without_a_model_gets_no_batch_advice_and_leads_with_the_fix_that_held() {
    let v = serde_json::to_value(oom_report("frag_cap.pickle.zst")).expect("serializes");
    assert!(v["batch"].is_null(), "{}", v["batch"]);
    assert!(v["batch_model"].is_null(), "{}", v["batch_model"]);
    let all: Vec<&serde_json::Value> = v["fixes"]
        .as_array()
        .expect("fixes")
        .iter()
        .chain(v["not_helpful"].as_array().expect("not_helpful"))
        .collect();
    for f in &all {
        assert_ne!(f["kind"], "smaller_batch", "{f}");
        let action = f["action"].as_str().unwrap_or_default();
        assert!(!action.contains("batch"), "{action}");
    }
    let first = &v["fixes"][0];
    assert_eq!(first["kind"], "free_tensors");
    assert!(
        first["action"]
            .as_str()
            .unwrap_or_default()
            .contains("train_oom.py:108"),
        "{first}"
    );
}

/// In that loop the `drop` list (line 107) grew as `keep` did but was freed
/// before the failure: growth given back is no leak. The `keep` list (108)
/// was still held: it is, with no autograd advice (no model ran).
#[test]
fn growth_freed_before_the_end_is_no_leak_and_no_model_means_no_no_grad_advice() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/oom/frag_cap.pickle.zst");
    let snap = Snapshot::load(&path).expect("reads");
    let report = memlens::analysis::leaks::within_trace(&snap);
    let sites: Vec<&str> = report.leaks.iter().map(|l| l.site.as_str()).collect();
    assert_eq!(sites, ["/home/user/proj/train_oom.py:108"], "{sites:?}");
    assert!(
        !report.leaks[0].suggestion.contains("no_grad"),
        "{}",
        report.leaks[0].suggestion
    );
}
