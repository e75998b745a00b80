//! Times each part of `memlens doctor` on one snapshot (reading, the summary,
//! the analysed trace, the peak, the leak search, the OOM, the module tree),
//! so that what doctor costs beyond `summary` can be told apart. Used when
//! working on doctor's speed; figures go to BENCHMARKS.md.
//!
//! Usage: cargo run --release -p memlens --example doctor_phases -- SNAPSHOT

use memlens::analysis::{categories::Phases, leaks, peak, sites::SiteIndex, summary};
use memlens::doctor::{diagnose, DoctorOptions};
use memlens::trace::Analysed;
use std::time::Instant;

fn timed<T>(label: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let v = f();
    println!("{label:<24} {:8.3} s", t.elapsed().as_secs_f64());
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: doctor_phases SNAPSHOT")?;
    let snap = timed("read", || {
        memlens::Snapshot::load(std::path::Path::new(&path))
    })?;
    timed("summary", || summary::summarize(&snap));
    timed("  site index", || SiteIndex::new(&snap));
    timed("  phases", || Phases::new(&snap));
    let an = timed("analysed (all)", || Analysed::new(&snap));
    let p = timed("peak", || peak::peak_analysed(&an, 20));
    let named = [(path.clone(), &snap)];
    timed("leaks", || leaks::find_analysed(&named, &an));
    timed("oom", || memlens::oom::chosen_oom(&snap));
    let _ = p;
    timed("diagnose (all)", || {
        diagnose(&named, &DoctorOptions::default())
    });
    Ok(())
}
