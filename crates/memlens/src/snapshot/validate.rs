//! Checks a freshly built [`Snapshot`] once, so that no analysis downstream
//! (summary, replay, the initial-state reconstruction, the simulator) can
//! overflow on what a file claims.
//!
//! The rules:
//! * every size (segment, block, trace event, `device_free`) is at most
//!   [`MAX_SIZE`]; every `address + size` is at most [`MAX_ADDRESS_END`];
//! * the sum of every size in the file is at most [`MAX_TOTAL`], so any running
//!   total an analysis keeps (live bytes, reserved bytes, rounded sizes) fits
//!   in a `u64` with room to spare;
//! * blocks lie inside their segment, in address order, without overlap, and
//!   an allocated block never asks for more than its size; segments of one
//!   device do not overlap; a segment's reported `allocated_size` and
//!   `active_size` fit in it.
//!
//! What PyTorch itself cannot write is rejected with one line; what it can
//! (gaps between blocks of a mapped range, stale `requested_size` of free
//! blocks) is accepted.

use super::{Action, BlockState, Snapshot, TraceEvent};

/// The largest size accepted: 256 TiB, a thousand times the largest GPU.
pub const MAX_SIZE: u64 = 1 << 48;

/// The largest `address + size` accepted. PyTorch's C++ writer casts addresses
/// to `int64_t`, and no GPU virtual address comes near 2^63.
pub const MAX_ADDRESS_END: u64 = 1 << 63;

/// The largest sum of every size in the file. Bounded well below 2^64 so that
/// sums of rounded sizes (at most 20 MiB added per item) cannot overflow.
pub const MAX_TOTAL: u128 = 1 << 62;

/// Checks `snap`; the error is one line naming the part at fault.
pub fn check(snap: &Snapshot) -> Result<(), String> {
    let mut total: u128 = 0;
    for (i, seg) in snap.segments.iter().enumerate() {
        // Names are built only for an error: this runs for every block.
        let what = || format!("segments[{i}]");
        size(what, "total_size", seg.total_size)?;
        size(what, "allocated_size", seg.allocated_size)?;
        size(what, "active_size", seg.active_size)?;
        size(what, "requested_size", seg.requested_size)?;
        let seg_end = end(what, seg.address, seg.total_size)?;
        for (name, v) in [
            ("allocated_size", seg.allocated_size),
            ("active_size", seg.active_size),
        ] {
            if v > seg.total_size {
                return Err(format!(
                    "{} has {name} = {v}, more than its total_size {}",
                    what(),
                    seg.total_size
                ));
            }
        }
        total += seg.total_size as u128;
        let mut next = seg.address;
        for (j, b) in seg.blocks.iter().enumerate() {
            let what = || format!("{}.blocks[{j}]", what());
            size(what, "size", b.size)?;
            let b_end = end(what, b.address, b.size)?;
            if b.address < next {
                return Err(if j == 0 {
                    format!(
                        "{} starts at {:#x}, before its segment at {:#x}",
                        what(),
                        b.address,
                        seg.address
                    )
                } else {
                    format!(
                        "{} at {:#x} overlaps the block before it (which ends at {next:#x})",
                        what(),
                        b.address
                    )
                });
            }
            if b_end > seg_end {
                return Err(format!(
                    "{} ends at {b_end:#x}, past the end of its segment at {seg_end:#x}",
                    what()
                ));
            }
            if b.state != BlockState::Inactive && b.requested_size > b.size {
                return Err(format!(
                    "{} is allocated with requested_size {} larger than its size {}",
                    what(),
                    b.requested_size,
                    b.size
                ));
            }
            next = b_end;
        }
    }
    // Segments of one device never overlap: each is its own cudaMalloc or
    // mapped range.
    let mut order: Vec<usize> = (0..snap.segments.len()).collect();
    order.sort_unstable_by_key(|&i| (snap.segments[i].device, snap.segments[i].address));
    for w in order.windows(2) {
        let (a, b) = (&snap.segments[w[0]], &snap.segments[w[1]]);
        if a.device == b.device && a.address + a.total_size > b.address {
            return Err(format!(
                "segments[{}] and segments[{}] overlap on device {} (at {:#x})",
                w[0], w[1], a.device, b.address
            ));
        }
    }
    for t in &snap.traces {
        // A pass without branches over millions of events, in pieces on
        // every core; the pass that names the first bad one runs only when
        // there is one.
        use rayon::prelude::*;
        let (bad, sum) = t
            .events
            .par_chunks(1 << 18)
            .map(check_events)
            .reduce(|| (false, 0), |a, b| (a.0 | b.0, a.1 + b.1));
        total += sum;
        if !bad {
            continue;
        }
        for (k, e) in t.events.iter().enumerate() {
            let what = || format!("device_traces[{}][{k}]", t.device);
            size(what, "size", e.size)?;
            match e.action {
                Action::Oom => size(what, "device_free", e.addr)?,
                _ => {
                    end(what, e.addr, e.size)?;
                }
            }
        }
    }
    if total > MAX_TOTAL {
        return Err(format!(
            "the sizes in the file sum to {total} bytes, past any real GPU memory (at most {MAX_TOTAL} accepted)"
        ));
    }
    Ok(())
}

/// Whether any of `events` is out of bounds, and the sum of their sizes
/// (`snapshot` entries carry the active total, not a size of their own).
fn check_events(events: &[TraceEvent]) -> (bool, u128) {
    let mut bad = false;
    let mut total: u128 = 0;
    for e in events {
        let limit = match e.action {
            Action::Oom => e.addr > MAX_SIZE,
            _ => e
                .addr
                .checked_add(e.size)
                .is_none_or(|x| x > MAX_ADDRESS_END),
        };
        bad |= (e.size > MAX_SIZE) | limit;
        total += (e.action != Action::Snapshot) as u128 * e.size as u128;
    }
    (bad, total)
}

fn size(what: impl Fn() -> String, key: &str, v: u64) -> Result<(), String> {
    if v > MAX_SIZE {
        return Err(format!(
            "{} has {key} = {v}, an impossible size (more than 256 TiB)",
            what()
        ));
    }
    Ok(())
}

fn end(what: impl Fn() -> String, address: u64, size: u64) -> Result<u64, String> {
    match address.checked_add(size) {
        Some(e) if e <= MAX_ADDRESS_END => Ok(e),
        _ => Err(format!(
            "{} has address {address:#x} + size {size} past any GPU address (2^63)",
            what()
        )),
    }
}
