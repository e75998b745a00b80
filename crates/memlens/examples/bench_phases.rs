//! Times each phase of memlens on one snapshot: reading, replay (peak),
//! simulation under the recorded settings, and `tune`. Used by bench/run.sh;
//! figures go to BENCHMARKS.md.
//!
//! Usage: cargo run --release -p memlens --example bench_phases -- SNAPSHOT [--tune]

use memlens::replay::simulate::{simulate, SimulateOptions};
use memlens::replay::{replay_device, ReplayOptions};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: bench_phases SNAPSHOT [--tune]")?;
    let with_tune = args.any(|a| a == "--tune");
    let size = std::fs::metadata(&path)?.len() as f64;

    let t = Instant::now();
    let snap = memlens::Snapshot::load(std::path::Path::new(&path))?;
    let read = t.elapsed().as_secs_f64();
    let events = snap.event_count() as f64;
    println!(
        "read      {read:8.3} s  {:8.1} MB/s  {:6.2} M events",
        size / 1e6 / read,
        events / 1e6
    );

    let device = snap.first_traced_device();
    let t = Instant::now();
    let r = replay_device(&snap, device, &ReplayOptions::default());
    let replay = t.elapsed().as_secs_f64();
    println!(
        "replay    {replay:8.3} s  {:8.2} M events/s  (peak allocated {}, reserved {})",
        events / 1e6 / replay,
        r.peak_allocated_bytes,
        r.peak_reserved_bytes
    );

    let t = Instant::now();
    let initial = memlens::replay::initial::before_trace(&snap, device);
    let rebuild = t.elapsed().as_secs_f64();
    println!(
        "rebuild   {rebuild:8.3} s  (initial state: {} segments, {} blocks)",
        initial.segments.len(),
        initial.blocks.len()
    );
    let t = Instant::now();
    let pass = memlens::replay::during_read::PeakPass::after_read(&snap, device, initial);
    let watched = t.elapsed().as_secs_f64();
    println!(
        "watched   {watched:8.3} s  {:8.2} M events/s  (peak allocated {})",
        events / 1e6 / watched,
        pass.peaks.allocated.0
    );

    let config = memlens::replay::config::recorded_config(&snap.settings);
    let opts = SimulateOptions {
        config,
        device_memory: None,
        overhead: None,
        allowed_memory_maximum: None,
    };
    let t = Instant::now();
    let s = simulate(&snap, device, &opts)?;
    let sim = t.elapsed().as_secs_f64();
    println!(
        "simulate  {sim:8.3} s  {:8.2} M events/s  (peak reserved {})",
        events / 1e6 / sim,
        s.peak_reserved_bytes
    );

    if with_tune {
        let t = Instant::now();
        let tuned = memlens::replay::tune::tune(&snap, device, &opts)?;
        println!(
            "tune      {:8.3} s  ({} candidates)",
            t.elapsed().as_secs_f64(),
            tuned.candidates.len()
        );
    }
    Ok(())
}
