//! What one fuzz input goes through, shared by the fuzz target
//! (`fuzz_targets/snapshot_reader.rs`) and the stable test that replays the
//! seeds (`crates/memlens/tests/fuzz_seeds.rs`): reading (container detection,
//! pickle reader, builder), then summary, replay, peak, leaks, the OOM
//! explainer and a what-if simulation. Any input must give a result or an
//! error, never a panic, a hang or unbounded memory.

use memlens::replay::simulate::SimulateOptions;
use memlens::replay::ReplayOptions;
use std::path::Path;

/// Runs every analysis the fuzz target covers on `data`; returns whether the
/// bytes were a snapshot.
pub fn exercise(data: &[u8]) -> bool {
    let Ok(snap) = memlens::Snapshot::from_bytes(data, Path::new("fuzz.pickle")) else {
        return false;
    };
    let _ = memlens::analysis::summary::summarize(&snap);
    let device = snap.first_traced_device();
    let _ = memlens::replay::replay_device(&snap, device, &ReplayOptions::default());
    let _ = memlens::analysis::peak::peak(&snap, 5);
    let _ = memlens::analysis::leaks::find(&[("fuzz.pickle".to_string(), &snap)]);
    let _ = memlens::oom::analyze_snapshot(&snap, &memlens::oom::OomOptions::default());
    let opts = SimulateOptions {
        config: memlens::replay::config::recorded_config(&snap.settings),
        // A small device, so the simulation reaches its OOM paths too.
        device_memory: Some(1 << 30),
        ..SimulateOptions::default()
    };
    let _ = memlens::replay::simulate::simulate(&snap, device, &opts);
    true
}
