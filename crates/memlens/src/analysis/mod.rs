//! Analyses: pure functions of a snapshot (and its replay) that return plain data.

pub mod capture;
pub mod check;
pub mod diff;
pub mod fsdp;
pub mod inputs;
pub mod leaks;
pub mod lines;
pub mod modules;
pub mod peak;
pub mod ranks;
pub mod state;
pub mod summary;
pub mod trace_tally;

// The analysed trace's own parts (one frame rulebook: sites, categories,
// steps) live in `crate::trace`; their old paths stay.
pub use crate::trace::{categories, sites, steps};
