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
/// bytes were a snapshot. Also reads them with trace entries decoded ahead
/// on other threads (forced on at any size, in tiny pieces), which must give
/// the same snapshot or the same error.
pub fn exercise(data: &[u8]) -> bool {
    let name = Path::new("fuzz.pickle");
    let read = memlens::Snapshot::from_bytes(data, name);
    let ahead = memlens::snapshot::build::load_bytes_with(data, name, read_ahead_always());
    match (&read, &ahead) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.traces.len(), b.traces.len(), "read ahead: traces differ");
            for (x, y) in a.traces.iter().zip(&b.traces) {
                assert_eq!(x.events, y.events, "read ahead: events differ");
            }
            assert_eq!(a.stack_frames, b.stack_frames, "read ahead: stacks differ");
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "read ahead: errors differ"),
        _ => panic!("read ahead: one way reads, the other fails"),
    }
    let Ok(snap) = read else {
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

/// The reader's limits with reading ahead on at any size, in pieces of 256
/// bytes, four at a time.
fn read_ahead_always() -> memlens::pickle::Limits {
    memlens::pickle::Limits {
        read_ahead: memlens::pickle::ReadAhead {
            pieces: 4,
            piece_bytes: 256,
            min_bytes: 0,
        },
        ..memlens::pickle::Limits::default()
    }
}
