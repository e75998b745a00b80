//! Fuzzes the whole reading path: container detection, the pickle reader, the
//! builder and the snapshot assembly, then the summary. Any input must give a
//! snapshot or an error, never a panic, a hang or unbounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(snap) = memlens::Snapshot::from_bytes(data, Path::new("fuzz.pickle")) {
        let _ = memlens::analysis::summary::summarize(&snap);
    }
});
