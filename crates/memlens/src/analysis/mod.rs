//! Analyses: pure functions of a snapshot (and its replay) that return plain data.

pub mod categories;
pub mod check;
pub mod diff;
pub mod inputs;
pub mod leaks;
pub mod lines;
pub mod modules;
pub mod peak;
pub mod ranks;
pub mod sites;
pub mod steps;
pub mod summary;
pub mod trace_tally;
