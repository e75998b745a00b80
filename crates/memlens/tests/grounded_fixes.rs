//! A fix is offered only where the recording grounds it (issue 30): no
//! autocast without activations live at the failure, no "keep shapes
//! steady" where every line allocated one size.

use memlens::oom::{analyze_snapshot, OomOptions};
use memlens::Snapshot;
use std::path::PathBuf;

fn oom_fix_kinds(name: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/oom")
        .join(name);
    let snap = Snapshot::load(&path).expect("reads");
    let r = analyze_snapshot(&snap, &OomOptions::default())
        .expect("analyses")
        .expect("has an OOM");
    let v = serde_json::to_value(&r).expect("serializes");
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

#[test]
fn a_training_step_with_activations_live_still_gets_autocast() {
    let kinds = oom_fix_kinds("gpt_warm.pickle.zst");
    assert!(kinds.iter().any(|k| k == "mixed_precision"), "{kinds:?}");
}
