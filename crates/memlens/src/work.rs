//! Counts of the passes that cost the most: replays of a trace through the
//! allocator model, analysed traces built, states rebuilt backwards from the
//! dump. A test reads them to show that a command does each once
//! (`tests/one_pass.rs`); nothing else depends on them.
//!
//! The counters are process-wide (relaxed atomics: a few increments per
//! command, never per event), so a test that reads them runs its command
//! alone, after [`reset`].

use std::sync::atomic::{AtomicU64, Ordering};

static RECORDED_REPLAYS: AtomicU64 = AtomicU64::new(0);
static WHATIF_REPLAYS: AtomicU64 = AtomicU64::new(0);
static ANALYSED_TRACES: AtomicU64 = AtomicU64::new(0);
static BACKWARD_REBUILDS: AtomicU64 = AtomicU64::new(0);

/// How often each costly pass ran since the last [`reset`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkCounts {
    /// Replays of a device trace under the settings it was recorded with
    /// (the one the analyses observe), whole or up to an event.
    pub recorded_replays: u64,
    /// Replays under other settings or of a transformed step: the what-if
    /// simulations (`simulate`, `tune`, the fixes' checks).
    pub whatif_replays: u64,
    /// Analysed traces built ([`crate::trace::Analysed`]).
    pub analysed_traces: u64,
    /// States before a trace rebuilt backwards from the dump
    /// ([`crate::replay::initial::reconstruct`]).
    pub backward_rebuilds: u64,
}

/// The counts since the last [`reset`].
pub fn counts() -> WorkCounts {
    WorkCounts {
        recorded_replays: RECORDED_REPLAYS.load(Ordering::Relaxed),
        whatif_replays: WHATIF_REPLAYS.load(Ordering::Relaxed),
        analysed_traces: ANALYSED_TRACES.load(Ordering::Relaxed),
        backward_rebuilds: BACKWARD_REBUILDS.load(Ordering::Relaxed),
    }
}

/// The counts as one line of JSON, for `MEMLENS_WORK_COUNTS=1 memlens ...`
/// (the binary prints it on stderr when it ends; `tests/one_pass.rs` reads it).
pub fn counts_line() -> String {
    serde_json::to_string(&counts()).unwrap_or_default()
}

/// Sets every count back to zero.
pub fn reset() {
    for c in [
        &RECORDED_REPLAYS,
        &WHATIF_REPLAYS,
        &ANALYSED_TRACES,
        &BACKWARD_REBUILDS,
    ] {
        c.store(0, Ordering::Relaxed);
    }
}

/// Notes a replay: under the recorded settings, or a what-if.
pub(crate) fn note_replay(recorded: bool) {
    let c = if recorded {
        &RECORDED_REPLAYS
    } else {
        &WHATIF_REPLAYS
    };
    c.fetch_add(1, Ordering::Relaxed);
}

/// Notes an analysed trace built.
pub(crate) fn note_analysed() {
    ANALYSED_TRACES.fetch_add(1, Ordering::Relaxed);
}

/// Notes a state rebuilt backwards from the dump.
pub(crate) fn note_backward_rebuild() {
    BACKWARD_REBUILDS.fetch_add(1, Ordering::Relaxed);
}
