//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`).
//!
//! One model, two uses: replaying a recorded trace under the settings it was
//! recorded with (block sizes come out exact, so allocated and reserved bytes
//! match `torch.cuda.memory_stats()` to the byte), and answering what-if
//! questions under other settings (`simulate`, `tune`, OOM fixes).
//!
//! * [`config`]: the settings that change placement (`PYTORCH_CUDA_ALLOC_CONF`).
//! * [`rounding`]: `round_size` and the segment sizes.
//! * [`allocator`]: pools, best fit, splitting, merging, the retry order on
//!   failure, garbage collection, `empty_cache`, expandable segments.
//! * `free_set`: each pool's free blocks in best-fit order.
//! * [`device`]: what the model asks of the GPU; replay answers from the trace,
//!   what-if runs from a [`device::SyntheticDevice`] with a capacity.
//! * [`stats`]: `memory_stats()` semantics; [`state`]: views for display.
//! * [`program`]: typed operations (alloc, free, `empty_cache`, a failing
//!   request) run through the model, for what-if questions and simulation.

pub mod allocator;
pub mod config;
pub mod device;
mod free_set;
pub mod program;
pub mod rounding;
pub mod state;
pub mod stats;

pub use allocator::{Allocator, BlockStatus, DeviceLimits, Handle, OomInfo, DEFAULT_POOL};
pub use config::{AllocatorConfig, ConfigError, TorchVersion};
pub use device::{AddressOrder, Device, DeviceOp, SyntheticDevice};
pub use state::{BlockView, SegmentView};
pub use stats::{MemoryStats, Stat, StatArray};

#[cfg(test)]
mod tests;
