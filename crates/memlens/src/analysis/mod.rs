//! Analyses: pure functions of a snapshot (and its replay) that return plain data.

pub mod summary;
