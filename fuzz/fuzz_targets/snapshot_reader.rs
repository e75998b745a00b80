//! Fuzzes the reading path and the analyses behind it: container detection,
//! the pickle reader, the builder, then summary, replay, peak, leaks, oom and
//! simulate (see `../exercise.rs`). Any input must give a result or an error,
//! never a panic, a hang or unbounded memory.
#![no_main]

#[path = "../exercise.rs"]
mod exercise;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = exercise::exercise(data);
});
