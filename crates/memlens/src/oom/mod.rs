//! The OOM explainer: parse `CUDA out of memory` messages and analyse snapshots at an OOM.
//!
//! * [`message`] finds an out-of-memory message in any text and reads its figures.
//! * [`triage`] gives a first diagnosis from the message alone.
//! * [`cause`] is the shared vocabulary: [`Cause`] and [`Fix`].
//! * [`snapshot`] analyses a snapshot whose trace holds the OOM
//!   ([`analyze_snapshot`]): the state right before it, the cause, and fixes
//!   ([`fixes`]) checked by simulating a model of the failing step ([`whatif`]);
//!   a step that failed in its forward is completed by a model of its
//!   backward ([`completion`]); [`batch_model`] splits that step's memory into what scales with the
//!   batch and what does not.

pub mod batch_model;
pub mod cause;
pub mod completion;
pub mod fixes;
pub mod message;
pub mod snapshot;
pub mod triage;
pub mod whatif;

pub use cause::{Cause, Fix};

use crate::snapshot::Snapshot;

/// The OOM every command explains when a snapshot holds several: the last one
/// of the first trace that has one (the one that ended the run; the earlier
/// ones were caught by the program), PyTorch's own caught ones aside
/// ([`Snapshot::oom_caught_by_pytorch`]). `oom`, `doctor`, `report` and the Python OOM hook
/// all use this, so they speak of the same failure.
/// Returns (trace index, event index).
pub fn chosen_oom(snap: &Snapshot) -> Option<(usize, usize)> {
    snap.traces.iter().enumerate().find_map(|(ti, t)| {
        t.events
            .iter()
            .rposition(|e| snap.is_oom_failure(e))
            .map(|i| (ti, i))
    })
}

pub use fixes::{BatchFit, FixKind, OomFix};
pub use message::{parse, OomMessage};
pub use snapshot::{
    analyze_snapshot, simulate_what_if, simulate_what_if_exact, OomOptions, OomReport,
};
pub use triage::{diagnose, explain_message, MessageDiagnosis};
pub use whatif::{FirstStepOptimizer, WhatIfSpec};
