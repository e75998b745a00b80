//! Live GPU memory (`memlens top`): the sampling model, alerts and data sources.
//!
//! One tick of `memlens top` flows through these pieces:
//!
//! ```text
//! GpuSource (NVML, or FakeSource in tests)  --\
//! ProcFs (/proc: command line, user, PID ns) ---> Sampler -> Sample -> Model (history, alerts)
//! publication files (memlens.record)        --/
//! ```
//!
//! * [`source`]: the [`GpuSource`] trait the sampler reads, and [`FakeSource`].
//! * `nvml` (feature `nvml`): the real source over the NVIDIA driver.
//! * [`procfs`]: who a PID is (command line, user) and whether it is really
//!   the GPU process NVML names, or a PID of another namespace.
//! * [`publication`]: the small JSON files `memlens.record` writes with the
//!   allocator's own figures (allocated, reserved, step, leak alarm).
//! * [`sample`]: one sample of every GPU and process, and the [`Sampler`] that
//!   makes it.
//! * [`history`], [`alerts`], [`model`]: the sample history, growth and
//!   near-full detection, and the edge-triggered alert state.
//! * [`record`]: appends samples to a JSONL or CSV history file.
//! * [`openmetrics`], [`serve`]: a sample as OpenMetrics text, and the tiny
//!   HTTP server of `memlens top --serve` that Prometheus scrapes.

pub mod alerts;
pub mod history;
pub mod model;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod openmetrics;
pub mod procfs;
pub mod publication;
pub mod record;
pub mod sample;
pub mod serve;
pub mod source;

pub use alerts::{AboveRule, Alert, AlertKind, GrowthRule};
pub use model::{Model, ModelConfig};
pub use sample::{GpuSample, ProcessSample, Sample, Sampler, TorchView};
pub use source::{FakeSource, GpuReading, GpuSource, ProcessReading};

use std::path::PathBuf;

/// What can go wrong while sampling live GPU memory.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The NVIDIA driver (libnvidia-ml.so.1, or its kernel module) is absent.
    #[error("no NVIDIA driver found ({0}); `memlens top` needs an NVIDIA GPU and its driver")]
    NoDriver(String),
    /// The driver answered with an error.
    #[error("NVML: {0}")]
    Source(String),
    /// A file (the record file) could not be written.
    // The OS error is part of the message, not a `source`: the CLI prints
    // the whole chain on one line and would show it twice.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        error: std::io::Error,
    },
    /// A bad option value (a rate, a threshold, a record file name).
    #[error("{0}")]
    Usage(String),
}

/// The current time as Unix seconds, the clock of every sample.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
