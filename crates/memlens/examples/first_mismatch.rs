//! Prints where the allocator model first placed an allocation differently
//! from the recorded trace, with the events before it: the first question
//! when a what-if run disagrees with the GPU (it found none on the ViT of
//! tests/corpus/fit: the addresses were the cause there, not the model).
//!
//! Usage: cargo run --release -p memlens --example first_mismatch -- SNAPSHOT
use memlens::replay::{Replay, ReplayOptions};
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: first_mismatch SNAPSHOT")?;
    let snap = memlens::Snapshot::load(std::path::Path::new(&path))?;
    let device = snap.first_traced_device();
    let opts = ReplayOptions::default();
    let mut r = Replay::new(&snap, device, &opts);
    let events = snap.device_trace(device);
    let mut last = 0;
    let mut shown = 0;
    for i in 0..events.len() {
        r.run_to(i);
        if r.mismatches() != last {
            last = r.mismatches();
            let e = &events[i];
            println!(
                "mismatch #{last} at event {i}: {:?} addr {:#x} size {}",
                e.action, e.addr, e.size
            );
            let from = i.saturating_sub(6);
            for (j, p) in events[from..i].iter().enumerate() {
                println!("    {}: {:?} {:#x} {}", from + j, p.action, p.addr, p.size);
            }
            shown += 1;
            if shown >= 5 {
                break;
            }
        }
    }
    println!("total mismatches: {}", r.mismatches());
    Ok(())
}
