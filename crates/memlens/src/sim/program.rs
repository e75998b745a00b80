//! Programs for the allocator model: typed operations (a tensor made, a
//! tensor freed, `empty_cache()`, the request that failed) run in order
//! through one [`Allocator`] on a [`SyntheticDevice`], with the figures a
//! what-if question asks for (peaks, the first failure, the statistics).
//!
//! Two callers build programs: `replay::simulate` turns a recorded trace into
//! operations (one per event, at the event's index), and the OOM what-if
//! model (`oom::whatif`) writes the recorded run up to the failing step
//! followed by its model of that step. Neither goes through trace events
//! forged for the other to read back.

use super::allocator::{Allocator, DeviceLimits, Handle, DEFAULT_POOL};
use super::config::AllocatorConfig;
use super::device::{DeviceOp, SyntheticDevice};
use super::stats::MemoryStats;
use hashbrown::HashMap;

/// Names of the cuDNN workspaces a recorded run gave up (its `oom` entries
/// PyTorch caught), this bit or'd with the entry's event index: above any
/// address a trace records (below 2^57). See [`Op::workspace_tried_again`].
const GIVEN_UP_IDS: u64 = 1 << 63;

/// One operation of a program. Tensors are named by `id`, any number the
/// caller chooses (a recorded address, a number of its own); an `id` made
/// again before its free names the newer tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A tensor of `size` bytes (as requested, before rounding) made on
    /// `stream` (the allocator's stream key). `tag` is the caller's, given
    /// back with a failure (replay puts the stack id there).
    Alloc {
        /// The tensor's name.
        id: u64,
        /// Bytes requested.
        size: u64,
        /// Stream key.
        stream: u64,
        /// The caller's tag.
        tag: u64,
    },
    /// An allocation the program can do without: a cuDNN convolution's
    /// workspace. PyTorch runs a convolution with the next algorithm its
    /// heuristics list when the workspace cannot be had (`try_plans` in
    /// `aten/src/ATen/native/cudnn/Conv_v8.cpp` catches the
    /// `OutOfMemoryError`; the last algorithms need none). Where it fails,
    /// the allocator's attempt happened (its cache flushed, the failure
    /// counted in `num_ooms`) and the program goes on without it: not the
    /// program's failure.
    Optional {
        /// The tensor's name.
        id: u64,
        /// Bytes requested.
        size: u64,
        /// Stream key.
        stream: u64,
        /// The caller's tag.
        tag: u64,
    },
    /// The user freed `id`; the block waits for other streams' work until
    /// [`Op::FreeCompleted`].
    FreeRequested {
        /// The tensor's name.
        id: u64,
    },
    /// The block of `id` returns to its pool.
    FreeCompleted {
        /// The tensor's name.
        id: u64,
    },
    /// Both halves of a free (a `del` with no other stream using the tensor).
    Free {
        /// The tensor's name.
        id: u64,
    },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// The request that failed in the recorded run. Its lifetime is unknown,
    /// so where it now succeeds it is freed at once.
    FailedRequest {
        /// Bytes requested.
        size: u64,
        /// Stream key.
        stream: u64,
        /// The caller's tag.
        tag: u64,
    },
}

impl Op {
    /// An allocation of `size` bytes named `id`: [`Op::Optional`] when the
    /// program can do without it, else [`Op::Alloc`].
    pub fn allocation(id: u64, size: u64, stream: u64, tag: u64, optional: bool) -> Op {
        if optional {
            Op::Optional {
                id,
                size,
                stream,
                tag,
            }
        } else {
            Op::Alloc {
                id,
                size,
                stream,
                tag,
            }
        }
    }

    /// The tensor the operation names (none for `EmptyCache` and a failed
    /// request).
    pub fn id(&self) -> Option<u64> {
        match *self {
            Op::Alloc { id, .. }
            | Op::Optional { id, .. }
            | Op::FreeRequested { id }
            | Op::FreeCompleted { id }
            | Op::Free { id } => Some(id),
            Op::EmptyCache | Op::FailedRequest { .. } => None,
        }
    }

    /// The operation with its tensor renamed by `rename`.
    pub fn renamed(self, rename: impl Fn(u64) -> u64) -> Op {
        match self {
            Op::Alloc {
                id,
                size,
                stream,
                tag,
            } => Op::Alloc {
                id: rename(id),
                size,
                stream,
                tag,
            },
            Op::Optional {
                id,
                size,
                stream,
                tag,
            } => Op::Optional {
                id: rename(id),
                size,
                stream,
                tag,
            },
            Op::FreeRequested { id } => Op::FreeRequested { id: rename(id) },
            Op::FreeCompleted { id } => Op::FreeCompleted { id: rename(id) },
            Op::Free { id } => Op::Free { id: rename(id) },
            op => op,
        }
    }

    /// The cuDNN workspace a recorded run gave up at its `oom` entry
    /// `index` (PyTorch caught the failure), tried again as `simulate`'s
    /// and `fit`'s programs do: its allocation ([`Op::Optional`] when
    /// `optional`; fit's probes mark theirs by role later) and its free at
    /// once, so that where it now fits it is held for its convolution only.
    pub fn workspace_tried_again(
        index: usize,
        size: u64,
        stream: u64,
        tag: u64,
        optional: bool,
    ) -> [Op; 2] {
        let id = GIVEN_UP_IDS | index as u64;
        [
            Op::allocation(id, size, stream, tag, optional),
            Op::Free { id },
        ]
    }
}

/// The first allocation that failed in a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Where the caller applied the operation (its `at`).
    pub at: usize,
    /// The request in bytes.
    pub requested_bytes: u64,
    /// The segment it needed ("Tried to allocate").
    pub alloc_size: u64,
    /// Allocated bytes then.
    pub allocated_bytes: u64,
    /// Reserved bytes then.
    pub reserved_bytes: u64,
    /// The operation's tag.
    pub tag: u64,
}

/// What a finished program gives.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The `at` of the operation after which reserved bytes peaked (`None`:
    /// the peak is the starting state).
    pub peak_reserved_at: Option<usize>,
    /// The `at` of the operation after which allocated bytes peaked.
    pub peak_allocated_at: Option<usize>,
    /// Share of reserved bytes not allocated at the reserved peak.
    pub fragmentation_at_peak: f64,
    /// `inactive_split_bytes` at the reserved peak.
    pub inactive_split_bytes_at_peak: u64,
    /// The first failed allocation.
    pub first_failure: Option<Failure>,
    /// `empty_cache()` calls run.
    pub empty_cache_calls: u64,
    /// Sizes of segment allocations (and expandable mappings), in order.
    pub segment_sizes: Vec<u64>,
    /// Allocations that failed and that the program needed ([`Op::Alloc`],
    /// [`Op::FailedRequest`]).
    pub failures: u64,
    /// [`Op::Optional`] allocations that failed and were done without,
    /// before the program's first failure (the run would stop there).
    pub given_up: u64,
    /// All statistics at the end (`num_ooms` counts every failure, both
    /// kinds, as PyTorch's does).
    pub stats: MemoryStats,
}

/// A program being run: the model, its device and the live tensors.
pub struct Run {
    /// The allocator model (public so a caller can load a starting state
    /// before the first operation; then call [`Run::started`]).
    pub model: Allocator,
    /// The device it allocates from.
    pub device: SyntheticDevice,
    /// Live tensors by id (`None`: its allocation failed).
    pub live: HashMap<u64, Option<Handle>>,
    peak_reserved: (u64, Option<usize>),
    peak_allocated: (u64, Option<usize>),
    frag: (f64, u64),
    first_failure: Option<Failure>,
    failures: u64,
    given_up: u64,
    empty_cache_calls: u64,
}

impl Run {
    /// A model under `config` on a device with `capacity` bytes for the
    /// allocator (`None`: unlimited), capped at `allowed_maximum` bytes
    /// (`set_per_process_memory_fraction`), with `total_memory` the device's
    /// total the config's own fraction applies to.
    pub fn new(
        config: AllocatorConfig,
        total_memory: Option<u64>,
        capacity: Option<u64>,
        allowed_maximum: Option<u64>,
    ) -> Run {
        crate::work::note_replay(false);
        let mut model = Allocator::new(config, DeviceLimits { total_memory });
        if allowed_maximum.is_some() {
            model.set_allowed_memory_maximum(allowed_maximum);
        }
        Run {
            model,
            device: SyntheticDevice::recording(capacity),
            live: HashMap::with_capacity(1024),
            peak_reserved: (0, None),
            peak_allocated: (0, None),
            frag: (0.0, 0),
            first_failure: None,
            failures: 0,
            given_up: 0,
            empty_cache_calls: 0,
        }
    }

    /// Marks the starting state (after any loading): peaks count from here.
    pub fn started(&mut self) {
        let st = self.model.stats();
        self.peak_reserved = (st.reserved_bytes.all.current, None);
        self.peak_allocated = (st.allocated_bytes.all.current, None);
    }

    /// Applies `op`; `at` names it in the outcome (an event index, an
    /// operation's position).
    pub fn apply(&mut self, at: usize, op: Op) {
        match op {
            Op::Alloc {
                id,
                size,
                stream,
                tag,
            } => {
                let h = self.malloc(at, size, stream, tag);
                self.live.insert(id, h);
            }
            Op::Optional {
                id, size, stream, ..
            } => {
                let h = self
                    .model
                    .malloc(size, stream, DEFAULT_POOL, at as u64, &mut self.device)
                    .ok();
                // Counted up to the program's first failure: a real run
                // stops there, and gives up no workspace after it.
                if self.first_failure.is_none() {
                    self.given_up += u64::from(h.is_none());
                }
                self.live.insert(id, h);
            }
            Op::FailedRequest { size, stream, tag } => {
                if let Some(h) = self.malloc(at, size, stream, tag) {
                    self.model.free(h);
                }
            }
            Op::FreeRequested { id } => {
                if let Some(Some(h)) = self.live.get(&id) {
                    self.model.free_requested(*h);
                }
            }
            Op::FreeCompleted { id } => {
                if let Some(Some(h)) = self.live.remove(&id) {
                    self.model.free_completed(h);
                }
            }
            Op::Free { id } => {
                if let Some(Some(h)) = self.live.remove(&id) {
                    self.model.free_requested(h);
                    self.model.free_completed(h);
                }
            }
            Op::EmptyCache => {
                self.model.empty_cache(&mut self.device);
                self.empty_cache_calls += 1;
            }
        }
        self.observe(at);
    }

    /// The allocation, or `None` when it fails (the first failure is kept;
    /// the program would have stopped there, later operations go on without
    /// the tensor so that they stay meaningful).
    fn malloc(&mut self, at: usize, size: u64, stream: u64, tag: u64) -> Option<Handle> {
        match self
            .model
            .malloc(size, stream, DEFAULT_POOL, at as u64, &mut self.device)
        {
            Ok(h) => Some(h),
            Err(oom) => {
                self.failures += 1;
                if self.first_failure.is_none() {
                    self.first_failure = Some(Failure {
                        at,
                        requested_bytes: size,
                        alloc_size: oom.alloc_size,
                        allocated_bytes: oom.allocated_bytes,
                        reserved_bytes: oom.reserved_bytes,
                        tag,
                    });
                }
                None
            }
        }
    }

    fn observe(&mut self, at: usize) {
        let st = self.model.stats();
        let r = st.reserved_bytes.all.current;
        if r > self.peak_reserved.0 {
            self.peak_reserved = (r, Some(at));
            self.frag = (
                1.0 - st.allocated_bytes.all.current as f64 / r as f64,
                st.inactive_split_bytes.all.current,
            );
        }
        let a = st.allocated_bytes.all.current;
        if a > self.peak_allocated.0 {
            self.peak_allocated = (a, Some(at));
        }
    }

    /// Ends the program.
    pub fn finish(self) -> Outcome {
        let segment_sizes = self
            .device
            .log
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .filter_map(|op| match op {
                DeviceOp::SegmentAlloc { size, .. } | DeviceOp::SegmentMap { size, .. } => {
                    Some(*size)
                }
                _ => None,
            })
            .collect();
        Outcome {
            peak_reserved_at: self.peak_reserved.1,
            peak_allocated_at: self.peak_allocated.1,
            fragmentation_at_peak: self.frag.0,
            inactive_split_bytes_at_peak: self.frag.1,
            first_failure: self.first_failure,
            empty_cache_calls: self.empty_cache_calls,
            segment_sizes,
            failures: self.failures,
            given_up: self.given_up,
            stats: self.model.stats().clone(),
        }
    }
}
