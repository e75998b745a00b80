//! Replay of the real fixtures through the allocator model (issue 3).

mod common;

use common::{fixture, stats, FIXTURES};
use memlens::replay::{replay_device, ReplayOptions};
use memlens::Snapshot;

#[test]
fn explore() {
    for name in FIXTURES {
        let snap = Snapshot::load(&fixture(&format!("{name}.pickle.zst"))).unwrap();
        let t = std::time::Instant::now();
        let r = replay_device(&snap, 0, &ReplayOptions::default());
        let el = t.elapsed();
        let st = stats(name);
        let ms = &st["memory_stats"];
        println!(
            "{name}: events {} in {:?} alloc {} vs {} reserved {} vs {} mism {} retries {} vs {} ooms {} dev_alloc {} vs {} warnings {:?}",
            r.events, el,
            r.peak_allocated_bytes, ms["allocated_bytes.all.peak"],
            r.peak_reserved_bytes, ms["reserved_bytes.all.peak"],
            r.mismatches, r.stats.num_alloc_retries, ms["num_alloc_retries"], r.stats.num_ooms,
            r.stats.num_device_alloc, ms["num_device_alloc"],
            r.warnings
        );
    }
}

#[test]
fn explore_stats() {
    for name in FIXTURES {
        let snap = Snapshot::load(&fixture(&format!("{name}.pickle.zst"))).unwrap();
        let r = replay_device(&snap, 0, &ReplayOptions::default());
        let st = stats(name);
        let ms = st["memory_stats"].as_object().unwrap();
        let mine = r.stats.to_flat_map();
        let mut diffs = vec![];
        for (k, v) in ms {
            match mine.get(k) {
                Some(m) if *m == v.as_i64().unwrap() => {}
                Some(m) => diffs.push(format!("{k}: {m} vs {v}")),
                None => diffs.push(format!("{k}: missing")),
            }
        }
        println!("{name}: {} diffs {:?}", diffs.len(), diffs);
    }
}
