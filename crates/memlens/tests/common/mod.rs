//! Shared helpers for integration tests: where the real fixtures live.
#![allow(dead_code)]

use std::path::PathBuf;

/// The fixtures directory: `$MEMLENS_FIXTURES`, else `../shared/fixtures`
/// beside the repository root.
pub fn fixtures_dir() -> PathBuf {
    if let Ok(d) = std::env::var("MEMLENS_FIXTURES") {
        return PathBuf::from(d);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
}

/// Path of a fixture file, e.g. `fixture("gpt2_train.pickle.zst")`.
pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

/// The ground truth `NAME.stats.json` of a fixture.
pub fn stats(name: &str) -> serde_json::Value {
    let p = fixture(&format!("{name}.stats.json"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("valid stats.json")
}

/// Fixture names (without extension) that have a `.stats.json`.
pub const FIXTURES: &[&str] = &[
    "cache_leak",
    "checkpointed",
    "gpt2_eval_leak",
    "gpt2_train",
    "gpt2_train@expandable",
    "long",
    "oom",
    "resnet",
    "varlen",
    "varlen@expandable",
    "varlen@gc06",
    "varlen@maxsplit64",
];

/// `NAME.pickle.zst` read once per test binary and shared by its tests.
pub fn load_cached(name: &str) -> std::sync::Arc<memlens::Snapshot> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<memlens::Snapshot>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(s) = cache.lock().unwrap().get(name) {
        return Arc::clone(s);
    }
    let snap = Arc::new(
        memlens::Snapshot::load(&fixture(&format!("{name}.pickle.zst"))).expect("fixture loads"),
    );
    cache
        .lock()
        .unwrap()
        .insert(name.to_string(), Arc::clone(&snap));
    snap
}

/// A `memory_stats` figure of a fixture's stats.json.
pub fn stat(name: &str, key: &str) -> u64 {
    stats(name)["memory_stats"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("{name}: {key}"))
}
