//! The OOM explainer: parse `CUDA out of memory` messages and analyse snapshots at an OOM.
//!
//! * [`message`] finds an out-of-memory message in any text and reads its figures.
//! * [`triage`] gives a first diagnosis from the message alone.
//! * [`cause`] is the shared vocabulary: [`Cause`] and [`Fix`].

pub mod cause;
pub mod message;
pub mod triage;

pub use cause::{Cause, Fix};
pub use message::{parse, OomMessage};
pub use triage::{diagnose, explain_message, MessageDiagnosis};
