//! memlens: a GPU memory doctor for PyTorch.
//!
//! The library holds every piece of logic; the CLI and the Python package only
//! parse arguments and render. Data flows one way:
//!
//! ```text
//! bytes -> input -> pickle -> snapshot -> replay (sim) -> analysis -> oom -> doctor -> report, render
//! ```
//!
//! * [`input`] detects the container (raw pickle, gzip, zstd, JSON) from the bytes.
//! * [`pickle`] is a safe streaming reader of the pickle opcodes PyTorch emits; it
//!   never runs code.
//! * [`snapshot`] is the typed model: segments, blocks, trace events per device,
//!   allocator settings, annotations, with frames and stacks interned.
//! * [`sim`] models PyTorch's CUDA caching allocator; [`replay`] walks a trace
//!   through it.
//! * [`analysis`] holds the analyses (summary, peak, diff, leaks, ...), each a pure
//!   function returning a plain data struct.
//! * [`doctor`] composes the analyses, the OOM explainer and `tune` into findings.
//! * [`oom`], [`estimate`], [`live`] and [`report`] are the other capabilities;
//!   [`source`] quotes the user's lines in findings.
//! * [`render`] owns every result document (the `memlens/1` envelope) and the
//!   text a person reads; the CLI and the Python binding only print them.

pub mod analysis;
pub mod beside;
pub mod device_file;
pub mod doctor;
pub mod error;
pub mod estimate;
pub mod example;
#[cfg(feature = "export")]
pub mod export;
pub mod fit;
pub mod frames;
pub mod holders;
pub mod http;
pub mod input;
pub mod job;
pub mod live;
pub mod oom;
pub mod pickle;
mod prefault;
pub mod profiler;
pub mod render;
pub mod replay;
pub mod report;
pub mod session;
pub mod sim;
pub mod snapshot;
pub mod source;
pub mod trace;
pub mod units;
pub mod work;

pub use error::{Error, Result};
pub use snapshot::Snapshot;

/// The schema tag every JSON document memlens writes carries (`"schema": "memlens/1"`).
pub const JSON_SCHEMA: &str = "memlens/1";

/// Helpers for the unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    /// A xorshift64 generator from `seed`: the same numbers on every run,
    /// for tests that compare two ways of computing on many random inputs.
    pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }
}
