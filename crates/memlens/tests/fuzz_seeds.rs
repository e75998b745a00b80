//! The fuzz target's code (`fuzz/exercise.rs`) over the fuzz seeds, as a plain
//! test on stable Rust: every seed goes through reading, summary, replay, peak,
//! leaks, oom and simulate without a panic (overflow checks are on in tests),
//! and the real snapshots among them read as snapshots.

#[path = "../../../fuzz/exercise.rs"]
mod exercise;

use std::path::PathBuf;

#[test]
fn every_fuzz_seed_goes_through_every_analysis() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fuzz/seeds")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 8, "{} seeds", seeds.len());
    let mut snapshots = Vec::new();
    for seed in &seeds {
        let data = std::fs::read(seed).expect("seed readable");
        if exercise::exercise(&data) {
            snapshots.push(seed.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    // The two minimised fixtures (an OOM, a leak) are real snapshots.
    for name in ["oom_at_oom.min.pickle", "cache_leak_step1.min.pickle"] {
        assert!(
            snapshots.iter().any(|s| s == name),
            "{name} read: {snapshots:?}"
        );
    }
}
