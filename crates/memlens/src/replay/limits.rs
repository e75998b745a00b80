//! The limits a recorded run had, inferred, so that what-if runs (`simulate`,
//! `tune`) judge a setting against the memory the run really had rather than
//! an unlimited device.
//!
//! A snapshot does not store the cap (`set_per_process_memory_fraction`) nor
//! the device's total, but an `oom` event in its trace bounds them: it holds
//! the device's free memory at the failure, and the replay of the segment
//! events gives what PyTorch held then. With R the segment the allocator
//! tried to get, H what it held and F the device's free memory:
//!
//! * F >= R: the device had room, so a per-process cap refused the segment.
//!   Every segment the run made fitted under it, so the cap is at least the
//!   peak of reserved memory over the trace (a run goes on past an `oom`
//!   entry PyTorch caught itself, a cuDNN workspace given up, and past one
//!   the program caught), and below H + R. The lower
//!   end is used (predictions then err on the side of an OOM); an OOM message
//!   that prints "X allowed" gives the cap itself.
//! * F < R: the device was full: this process could hold at most H + F.
//!
//! The device's total and other processes' memory are only printed by the
//! message. Flags (`--device-memory`, `--memory-fraction`) override all this.

use super::config::recorded_config;
use super::simulate::SimulateOptions;
use crate::sim::rounding::allocation_size;
use crate::snapshot::{Action, Snapshot};
use crate::units::format_bytes;
use serde::Serialize;

/// The limits an OOM message printed (`crate::oom::OomMessage::limits`), or
/// `memlens.record` wrote beside the snapshot (`crate::device_file`): plain
/// figures, so that the replay needs nothing of the message parser.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrintedLimits {
    /// The per-process cap ("allowed").
    pub memory_cap: Option<u64>,
    /// The device's total memory.
    pub device_total: Option<u64>,
    /// Memory other processes held.
    pub other_processes: u64,
    /// Where the figures come from.
    pub origin: LimitsOrigin,
}

/// Where known limits come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LimitsOrigin {
    /// The OOM error message.
    #[default]
    Message,
    /// `<snapshot>.device.json`, written by `memlens.record` at the dump.
    Recorder,
}

impl LimitsOrigin {
    /// The source of the cap, in words.
    fn cap_source(self) -> &'static str {
        match self {
            LimitsOrigin::Message => "the OOM message (\"allowed\")",
            LimitsOrigin::Recorder => {
                "recorded by memlens.record beside the snapshot (the per-process memory \
                 fraction times the device's total)"
            }
        }
    }

    /// The source of the other figures, in words.
    fn source(self) -> &'static str {
        match self {
            LimitsOrigin::Message => "the OOM message",
            LimitsOrigin::Recorder => "recorded by memlens.record beside the snapshot",
        }
    }
}

/// One inferred figure and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Limit {
    /// The value in bytes.
    pub bytes: u64,
    /// Where it came from, in words (`"oom event 950: ..."`, `"message"`, `"option"`).
    pub source: String,
}

/// The limits of the recorded run, as far as the snapshot (and the OOM
/// message, when given) tells them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RunLimits {
    /// The per-process cap (`set_per_process_memory_fraction`), when one refused a segment.
    pub memory_cap: Option<Limit>,
    /// The most this process's allocator could hold when the device itself was full.
    pub device_room: Option<Limit>,
    /// The device's total memory (message or option only).
    pub device_total: Option<Limit>,
    /// Memory other processes held on the device (message only).
    pub other_processes: Option<Limit>,
}

impl RunLimits {
    /// The most the allocator may reserve: the tighter of the cap and the room
    /// the device had.
    pub fn allocator_limit(&self) -> Option<u64> {
        match (&self.memory_cap, &self.device_room) {
            (Some(c), Some(d)) => Some(c.bytes.min(d.bytes)),
            (Some(c), None) => Some(c.bytes),
            (None, Some(d)) => Some(d.bytes),
            (None, None) => None,
        }
    }

    /// True when nothing was inferred.
    pub fn is_empty(&self) -> bool {
        self.memory_cap.is_none()
            && self.device_room.is_none()
            && self.device_total.is_none()
            && self.other_processes.is_none()
    }
}

/// Infers the limits of `device`'s run from the `oom` events of its trace
/// (and `message`, the error text, when given).
pub fn infer(snap: &Snapshot, device: u32, message: Option<&PrintedLimits>) -> RunLimits {
    infer_from(
        snap,
        device,
        message,
        &super::initial::before_trace(snap, device),
    )
}

/// [`infer`] given the state before the trace (`initial`), already rebuilt.
pub fn infer_from(
    snap: &Snapshot,
    device: u32,
    message: Option<&PrintedLimits>,
    initial: &super::initial::InitialState,
) -> RunLimits {
    let mut out = RunLimits::default();
    let config = recorded_config(&snap.settings);
    let events = snap.device_trace(device);
    let mut reserved: u64 = initial.segments.iter().map(|s| s.size).sum();
    let mut peak = reserved;
    // Tightest bounds over every OOM of the run: the cap did not change.
    let mut cap: Option<(u64, u64, usize)> = None; // (lower, upper, event)
    let mut room: Option<(u64, usize)> = None;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                reserved += e.size;
                peak = peak.max(reserved);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                reserved = reserved.saturating_sub(e.size)
            }
            Action::Oom => {
                let tried = allocation_size(&config, e.size);
                let free = e.addr;
                if free >= tried {
                    let hi = reserved + tried;
                    cap = Some(match cap {
                        Some((lo0, hi0, at)) => (lo0.max(peak), hi0.min(hi), at),
                        None => (peak, hi, i),
                    });
                } else {
                    let r = reserved + free;
                    room = Some(match room {
                        Some((r0, at)) if r0 <= r => (r0, at),
                        _ => (r, i),
                    });
                }
            }
            _ => {}
        }
    }
    // Segments made after an OOM fitted under the same cap.
    let cap = cap.map(|(lo, hi, at)| (if peak < hi { lo.max(peak) } else { lo }, hi, at));
    let printed_cap = message.and_then(|m| m.memory_cap.map(|c| (c, m.origin)));
    out.memory_cap = match (printed_cap, cap) {
        (Some((c, origin)), _) => Some(Limit {
            bytes: c,
            source: origin.cap_source().to_string(),
        }),
        (None, Some((lo, hi, at))) => Some(Limit {
            bytes: lo,
            source: format!(
                "inferred from {} at event {at}: the device had room for the segment, so a \
                 per-process cap refused it; the cap is at least {} (the most PyTorch held \
                 in the run) and below {}; the lower end is used",
                oom_entry(snap, events, at),
                format_bytes(lo),
                format_bytes(hi)
            ),
        }),
        (None, None) => None,
    };
    out.device_room = room.map(|(r, at)| Limit {
        bytes: r,
        source: format!(
            "inferred from {} at event {at}: the device was full; PyTorch held what it \
             had and the device had {} more",
            oom_entry(snap, events, at),
            format_bytes(r)
        ),
    });
    if let Some(m) = message {
        out.device_total = m.device_total.map(|bytes| Limit {
            bytes,
            source: m.origin.source().to_string(),
        });
        let others = m.other_processes;
        if others > 0 {
            out.other_processes = Some(Limit {
                bytes: others,
                source: m.origin.source().to_string(),
            });
        }
    }
    out
}

/// The `oom` entry at `at`, in words: the run's OOM, or a cuDNN workspace
/// PyTorch gave up ([`Snapshot::oom_caught_by_pytorch`]).
fn oom_entry(snap: &Snapshot, events: &[crate::snapshot::TraceEvent], at: usize) -> &'static str {
    match events.get(at) {
        Some(e) if snap.oom_caught_by_pytorch(e) => {
            "the `oom` entry of a cuDNN workspace PyTorch gave up"
        }
        _ => "the OOM",
    }
}

/// `opts` with the inferred limits filled in where the caller set none
/// (no `--device-memory`, no `--memory-fraction`), and the limits used.
pub fn with_inferred(
    snap: &Snapshot,
    device: u32,
    opts: &SimulateOptions,
    message: Option<&PrintedLimits>,
) -> (SimulateOptions, RunLimits) {
    with_inferred_from(snap, device, opts, message, None)
}

/// [`with_inferred`] given the state before the trace when the caller has
/// it (`None`: rebuilt from the dump).
pub fn with_inferred_from(
    snap: &Snapshot,
    device: u32,
    opts: &SimulateOptions,
    message: Option<&PrintedLimits>,
    initial: Option<&super::initial::InitialState>,
) -> (SimulateOptions, RunLimits) {
    let mut limits = match initial {
        Some(i) => infer_from(snap, device, message, i),
        None => infer(snap, device, message),
    };
    let mut opts = opts.clone();
    if let Some(total) = opts.device_memory {
        limits.device_total = Some(Limit {
            bytes: total,
            source: "option (--device-memory)".to_string(),
        });
        // The device total given: the overhead estimate of the replay
        // handles the device's room; the cap still applies.
        limits.device_room = None;
    }
    if let Some(cap) = opts.allowed_memory_maximum {
        limits.memory_cap = Some(Limit {
            bytes: cap,
            source: "option (--memory-fraction)".to_string(),
        });
    }
    if opts.allowed_memory_maximum.is_none() {
        opts.allowed_memory_maximum = limits.allocator_limit();
    }
    (opts, limits)
}
