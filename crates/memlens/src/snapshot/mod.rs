//! The typed snapshot model: what `torch.cuda.memory._snapshot()` holds, in a
//! compact form.
//!
//! * Segments and their blocks, as the allocator reported them at dump time.
//! * One trace per device: allocation events in order, each a small `Copy`
//!   struct with a [`StackId`] (no per-event heap allocation).
//! * Frames and whole stacks interned once: every distinct `(filename, line,
//!   name)` is one [`FrameId`], every distinct list of frames one [`StackId`].
//! * Allocator settings and `record_function` annotations.
//!
//! [`Snapshot::load`] reads a file of any supported format; the parsing lives in
//! [`build`] and [`crate::pickle`].

pub mod build;
mod heap;
mod strings;
pub mod validate;

pub use strings::{StrId, Strings};
// The container belongs to the input layer; re-exported for the model's users.
pub use crate::input::Container;

use serde::Serialize;
use std::path::Path;

/// Index of an interned frame in [`Snapshot::frames`].
pub type FrameId = u32;

/// Index of an interned stack in [`Snapshot::stack_ranges`] (its frames
/// through [`Snapshot::stack`]). Stack 0 is always the empty stack (no frames
/// recorded).
pub type StackId = u32;

/// The stack id used when no frames were recorded.
pub const EMPTY_STACK: StackId = 0;

/// A set of stacks, by id (see [`Snapshot::cudnn_workspace_stacks`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackSet(Vec<bool>);

impl StackSet {
    /// Whether `id` is in the set.
    pub fn contains(&self, id: StackId) -> bool {
        self.0.get(id as usize).copied().unwrap_or(false)
    }

    /// Whether no stack is.
    pub fn is_empty(&self) -> bool {
        !self.0.contains(&true)
    }
}

/// One Python (or C++) frame: `filename:line` in function `name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Source file.
    pub filename: StrId,
    /// Line number (0 when unknown).
    pub line: u32,
    /// Function name.
    pub name: StrId,
}

/// What a trace event records (`TraceEntry::Action` in PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Action {
    /// A block was handed to the user; `size` is the unrounded request.
    Alloc = 0,
    /// The user freed a block; it may wait on stream events before reuse.
    FreeRequested = 1,
    /// The block went back to the pool and may be reused.
    FreeCompleted = 2,
    /// `cudaMalloc` of a new segment; `size` is the segment size.
    SegmentAlloc = 3,
    /// `cudaFree` of a whole segment.
    SegmentFree = 4,
    /// Pages mapped into an expandable segment.
    SegmentMap = 5,
    /// Pages unmapped from an expandable segment.
    SegmentUnmap = 6,
    /// A snapshot was taken; `size` is the total active bytes.
    Snapshot = 7,
    /// An allocation failed; `size` is the rounded request and `addr` holds
    /// the `device_free` bytes.
    Oom = 8,
}

impl Action {
    /// All actions, in discriminant order.
    pub const ALL: [Action; 9] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
    ];

    /// The name PyTorch uses in the snapshot.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
        }
    }

    /// Parses PyTorch's action name.
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.as_str() == s)
    }
}

/// Takes a snapshot's trace events while the file is still being read (the
/// peak's replay runs beside the reader: [`crate::replay::during_read`]).
pub trait EventSink: Send {
    /// Events `first..first + events.len()` in the order they were read, and
    /// the raw streams their `stream` indices name so far.
    fn events(&mut self, first: usize, events: &[TraceEvent], streams: &[i64]);
    /// Every event read (`events` of them) became the trace of `device`.
    fn whole_trace(&mut self, device: u32, events: usize);
}

/// Whether `events` record `free_requested` at all. PyTorch writes one
/// before every `free_completed` unless recording was told to skip them
/// (`_record_memory_history(skip_actions=["free_requested"])`, which
/// `memlens.record` does: they are a third of a trace); a free is then its
/// `free_completed` alone, and a block freed after the trace began was not
/// waiting on another stream before it.
pub fn records_free_requests(events: &[TraceEvent]) -> bool {
    events.iter().any(|e| e.action == Action::FreeRequested)
        || !events.iter().any(|e| e.action == Action::FreeCompleted)
}

/// One entry of a device trace, 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Block or segment address; for [`Action::Oom`] the `device_free` bytes.
    pub addr: u64,
    /// Size in bytes; its meaning depends on the action (see [`Action`]).
    pub size: u64,
    /// Epoch microseconds, or 0 when the snapshot has no `time_us`.
    pub time_us: i64,
    /// The stack recorded with the event ([`EMPTY_STACK`] when none).
    pub stack: StackId,
    /// Index into [`Snapshot::streams`].
    pub stream: u16,
    /// What happened.
    pub action: Action,
    /// Bit flags, see [`TraceEvent::HAS_FRAMES`].
    pub flags: u8,
}

impl TraceEvent {
    /// Flag: the event carried a `frames` key (even an empty one).
    pub const HAS_FRAMES: u8 = 1;
    /// Flag: the event carried a non-default `compile_context` or `user_metadata`
    /// (see [`DeviceTrace::extras`]).
    pub const HAS_EXTRAS: u8 = 2;

    /// For an [`Action::Oom`] event, the free device bytes PyTorch saw.
    pub fn device_free(&self) -> Option<u64> {
        (self.action == Action::Oom).then_some(self.addr)
    }
}

/// Rarely-set string fields of a trace event, kept aside to keep events small.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventExtras {
    /// Index of the event in its device trace.
    pub index: u32,
    /// `compile_context` (`"N/A"` is the default and not stored).
    pub compile_context: Option<StrId>,
    /// `user_metadata` (`""` is the default and not stored).
    pub user_metadata: Option<StrId>,
}

/// The trace of one device, oldest event first.
#[derive(Clone, Debug, Default)]
pub struct DeviceTrace {
    /// The device ordinal.
    pub device: u32,
    /// Events in the order PyTorch recorded them.
    pub events: Vec<TraceEvent>,
    /// Non-default `compile_context` / `user_metadata`, sorted by event index.
    pub extras: Vec<EventExtras>,
}

impl DeviceTrace {
    /// Whether the trace records memory changing hands: an event other than
    /// `snapshot` and `oom`, which move no memory. A trace of one entry (what
    /// PyTorch 2.0's `_record_memory_history(True)` kept) holds only the
    /// dump's `snapshot` or the failure's `oom`: nothing to replay.
    pub fn has_allocations(&self) -> bool {
        self.events
            .iter()
            .any(|e| !matches!(e.action, Action::Snapshot | Action::Oom))
    }
}

/// State of a block at dump time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Held by a tensor.
    ActiveAllocated,
    /// Freed by the user but waiting on stream events (`record_stream`).
    ActivePendingFree,
    /// Free in the pool.
    Inactive,
}

/// A block inside a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Address of the block.
    pub address: u64,
    /// Size in bytes (rounded; may include an unsplit remainder).
    pub size: u64,
    /// The original request; stale for inactive blocks, 0 for split-off ones.
    pub requested_size: u64,
    /// Allocated, pending free, or free.
    pub state: BlockState,
    /// Stack recorded when the block was allocated.
    pub stack: StackId,
}

/// Which of the allocator's two pools a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Blocks of at most 1 MiB, in 2 MiB segments.
    Small,
    /// Everything else.
    Large,
}

/// A segment: one `cudaMalloc` (or one mapped range of an expandable segment).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// Device ordinal.
    pub device: u32,
    /// Address of the first block.
    pub address: u64,
    /// Bytes reserved by the segment.
    pub total_size: u64,
    /// Bytes in allocated blocks, as PyTorch reported it.
    pub allocated_size: u64,
    /// Bytes in active blocks, as PyTorch reported it.
    pub active_size: u64,
    /// Requested bytes of active blocks (0 in legacy snapshots).
    pub requested_size: u64,
    /// Index into [`Snapshot::streams`].
    pub stream: u16,
    /// Small or large pool.
    pub pool: PoolKind,
    /// `segment_pool_id`: `(0, 0)` is the default pool; anything else a private
    /// pool (CUDA graphs, `torch.cuda.MemPool`).
    pub pool_id: (i64, i64),
    /// The segment is a mapped range of an expandable segment.
    pub is_expandable: bool,
    /// Stack recorded when the segment was allocated.
    pub stack: StackId,
    /// Blocks in address order.
    pub blocks: Vec<Block>,
}

/// A `record_function` annotation (`external_annotations`).
#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    /// Device ordinal.
    pub device: u32,
    /// Epoch microseconds.
    pub time_us: i64,
    /// The scope's name, e.g. `Optimizer.step#AdamW.step`.
    pub name: StrId,
    /// True for `START`, false for `END`.
    pub start: bool,
}

/// The allocator settings recorded with the snapshot (`allocator_settings`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AllocatorSettings {
    /// Whether the snapshot had an `allocator_settings` dict at all.
    pub present: bool,
    /// The raw `PYTORCH_CUDA_ALLOC_CONF` string last parsed.
    pub alloc_conf: String,
    /// `max_split_size` in bytes; `None` when unlimited (-1).
    pub max_split_size: Option<u64>,
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `roundup_power2_divisions`, one value per power-of-two interval starting
    /// at 1 MiB (16 intervals); empty when not recorded.
    pub roundup_power2_divisions: Vec<u32>,
    /// `trace_alloc_overflowed`, when recorded.
    pub trace_alloc_overflowed: Option<bool>,
    /// `trace_alloc_max_entries`, when recorded.
    pub trace_alloc_max_entries: Option<u64>,
    /// Every other key, verbatim as JSON, for display.
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// How `memlens.record` recorded a snapshot it wrote (the snapshot's
/// `"memlens"` key): where its trace begins and whether the ring lost events
/// on the way, so the analysis can tell a trace memlens cut on purpose (each
/// periodic snapshot's trace runs from the one before) from one that lost its
/// start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recording {
    /// `periodic`, `final` or `oom`.
    pub kind: String,
    /// Training steps (`memlens.step()` calls) finished at the dump.
    pub step: u64,
    /// Steps finished before the trace begins; 0 where recording began.
    pub trace_from_step: u64,
    /// `every` of the recording, when periodic snapshots were asked for.
    pub every: Option<u64>,
    /// `steps_kept` of the recording.
    pub steps_kept: u64,
    /// The trace ring's size at the dump.
    pub max_entries: u64,
    /// The caller chose `max_entries` (else memlens sized the ring).
    pub sized_by_user: bool,
    /// The ring wrapped since the trace began: the trace lost its start.
    pub ring_wrapped: bool,
    /// `PYTORCH_CUDA_ALLOC_CONF` in the process's environment at the dump,
    /// when set: compared with the settings the allocator ran with.
    pub alloc_conf_env: Option<String>,
}

/// A training step traced with fake tensors by `memlens.trace_step` (the
/// snapshot's `"memlens"` key, schema `memlens-fake-trace/1`): every
/// allocation and free the step's operators made, with no GPU and no
/// allocator state (no segments); what the allocator would reserve is the
/// allocator model's to say (`memlens fit`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeTrace {
    /// Training steps traced.
    pub steps: u64,
    /// `fp32`, or the autocast precision the steps ran under.
    pub precision: String,
    /// cuBLAS's workspace per thread the trace assumed.
    pub workspace_bytes: u64,
    /// Values the step read back from the GPU, which a fake tensor has not
    /// got (taken as False or 1).
    pub unknown_values: u64,
    /// The ranks of the DistributedDataParallel job the step is one rank
    /// of (1: not distributed).
    pub world_size: u64,
    /// Comm hooks the step registered and the trace ran without.
    pub comm_hooks_ignored: u64,
    /// One set of the DDP modules' gradient buckets, in bytes (0: none, or
    /// a trace that did not say).
    pub ddp_bucket_bytes: u64,
    /// Whether the tracer measured the scratch of kernels that take it
    /// inside their call (cuDNN's convolutions) by running each layout once
    /// on the GPU (false: an older trace, or `measure_scratch=False`).
    pub scratch_measuring: bool,
    /// Whether the tracer let an optimizer (and `clip_grad_norm_`) built
    /// without `foreach`/`fused` pick its multi-tensor kernels as it does
    /// for real CUDA tensors (false: a trace by a memlens before it, which
    /// ran such an optimizer one tensor at a time).
    pub foreach_as_gpu: bool,
    /// Layouts of such kernels measured on the GPU.
    pub scratch_measured: u64,
    /// Layouts of such kernels the GPU could not run (out of memory, or
    /// the allocator already recording): traced without their scratch.
    pub scratch_unmeasured: u64,
}

impl FakeTrace {
    /// The bytes some runs of a DDP job held at the peak beyond what one
    /// rank's trace holds: one set of gradient buckets that outlived their
    /// rebuild (0: not distributed, or a trace that did not give the size).
    pub fn outliving_buckets(&self) -> u64 {
        if self.world_size > 1 {
            self.ddp_bucket_bytes
        } else {
            0
        }
    }
}

/// A PyTorch CUDA memory snapshot.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Segments of all devices, as dumped.
    pub segments: Vec<Segment>,
    /// One trace per device ordinal (possibly empty).
    pub traces: Vec<DeviceTrace>,
    /// Allocator settings.
    pub settings: AllocatorSettings,
    /// `record_function` annotations.
    pub annotations: Vec<Annotation>,
    /// Interned frames.
    pub frames: Vec<Frame>,
    /// Interned stacks: stack `i` is `stack_frames[stack_ranges[i].0 .. stack_ranges[i].1]`,
    /// innermost frame first. Stack 0 is empty.
    pub stack_ranges: Vec<(u32, u32)>,
    /// Frame ids of all stacks, concatenated.
    pub stack_frames: Vec<FrameId>,
    /// The raw `cudaStream_t` values; events and segments store an index here.
    /// Index 0 is always stream 0 (the default stream).
    pub streams: Vec<i64>,
    /// Interned strings.
    pub strings: Strings,
    /// The snapshot is the legacy bare list of segments (PyTorch <= 2.0).
    pub legacy: bool,
    /// How `memlens.record` recorded it; `None` for snapshots written by
    /// anything else.
    pub recording: Option<Recording>,
    /// Set when the snapshot is a step traced with fake tensors
    /// (`memlens.trace_step`), not a recording of a GPU.
    pub fake_trace: Option<FakeTrace>,
    /// Problems found while reading that do not stop the analysis.
    pub warnings: Vec<String>,
}

impl Snapshot {
    /// An error when this is a step traced with fake tensors (named `name`
    /// in it), for the analyses that read the allocator's state: such a file
    /// holds what a step allocated, not where the allocator put it, so every
    /// segment figure would read zero. `fit` and `simulate` replay it.
    pub fn refuse_fake_trace(&self, name: &str) -> crate::Result<()> {
        if self.fake_trace.is_none() {
            return Ok(());
        }
        Err(crate::Error::usage(format!(
            "{name}: a step traced with fake tensors (memlens.trace_step), not a recording: it \
             holds what the step allocated but no allocator state; `memlens fit {name}` replays \
             it through the allocator model"
        )))
    }

    /// Reads a snapshot from a file in any supported format.
    pub fn load(path: &Path) -> crate::Result<Snapshot> {
        build::load_path(path)
    }

    /// Reads several snapshot files in parallel (one rayon task a file), in
    /// the order given; each file's result is its own, so one bad file does
    /// not hide the others.
    pub fn load_many<P: AsRef<Path> + Sync>(paths: &[P]) -> Vec<crate::Result<Snapshot>> {
        use rayon::prelude::*;
        paths
            .par_iter()
            .map(|p| build::load_path(p.as_ref()))
            .collect()
    }

    /// [`Snapshot::load_many`] that calls `done` (from the reading thread)
    /// as each file is read, e.g. to move a progress bar.
    pub fn load_many_with<P: AsRef<Path> + Sync>(
        paths: &[P],
        done: impl Fn() + Sync,
    ) -> Vec<crate::Result<Snapshot>> {
        use rayon::prelude::*;
        paths
            .par_iter()
            .map(|p| {
                let r = build::load_path(p.as_ref());
                done();
                r
            })
            .collect()
    }

    /// [`Snapshot::load`] that gives up with [`crate::Error::Cancelled`] soon
    /// after `cancel` is set from another thread.
    pub fn load_cancellable(
        path: &Path,
        cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> crate::Result<Snapshot> {
        build::load_path_cancellable(path, cancel)
    }

    /// Reads a snapshot from bytes already in memory; `name` is used in errors.
    pub fn from_bytes(bytes: &[u8], name: &Path) -> crate::Result<Snapshot> {
        build::load_bytes(bytes, name)
    }

    /// The example snapshot built into the binary.
    pub fn example() -> Snapshot {
        // The embedded bytes are a fixture read by the test suite; failing to
        // read them is a build defect, not bad input.
        build::load_bytes(
            crate::example::EXAMPLE_SNAPSHOT,
            Path::new(crate::example::EXAMPLE_NAME),
        )
        .expect("the embedded example snapshot is valid")
    }

    /// The frames of a stack, innermost first.
    pub fn stack(&self, id: StackId) -> &[FrameId] {
        match self.stack_ranges.get(id as usize) {
            Some(&(a, b)) => &self.stack_frames[a as usize..b as usize],
            None => &[],
        }
    }

    /// A frame by id.
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    /// An interned string.
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id)
    }

    /// The raw `cudaStream_t` of a stream index.
    pub fn stream(&self, index: u16) -> i64 {
        self.streams.get(index as usize).copied().unwrap_or(0)
    }

    /// Total number of trace events over all devices.
    pub fn event_count(&self) -> usize {
        self.traces.iter().map(|t| t.events.len()).sum()
    }

    /// True when some trace holds an event other than `snapshot`: a history of
    /// allocations to replay. Legacy snapshots and traces that hold only
    /// `snapshot` entries give the state at dump time alone.
    pub fn has_allocation_trace(&self) -> bool {
        self.traces.iter().any(DeviceTrace::has_allocations)
    }

    /// Whether the `oom` entry `e` is one PyTorch caught itself: a cuDNN
    /// convolution's workspace (its C++ frames name the function that
    /// allocates it, [`crate::frames::is_cudnn_workspace`]), given up for
    /// another algorithm. A ResNet-50 under a cap that ran its steps logged
    /// four such entries at batches 22 and 23 (an H200, 2026-11-29), and
    /// memlens called the run an OOM. With Python frames only it cannot be
    /// told: such an entry stays the program's.
    pub fn oom_caught_by_pytorch(&self, e: &TraceEvent) -> bool {
        e.action == Action::Oom && self.is_cudnn_workspace_stack(e.stack)
    }

    /// Every `oom` entry PyTorch caught itself
    /// ([`Snapshot::oom_caught_by_pytorch`]), over all traces, in order.
    pub fn oom_entries_caught_by_pytorch(&self) -> impl Iterator<Item = &TraceEvent> {
        self.traces
            .iter()
            .flat_map(|t| &t.events)
            .filter(|e| self.oom_caught_by_pytorch(e))
    }

    /// Whether stack `id` allocates a cuDNN convolution's workspace: one of
    /// its frames is the function that does
    /// ([`crate::frames::is_cudnn_workspace`]).
    pub fn is_cudnn_workspace_stack(&self, id: StackId) -> bool {
        self.stack_has_function(id, crate::frames::is_cudnn_workspace)
    }

    /// Whether a frame of stack `id` names a function `rule` picks.
    fn stack_has_function(&self, id: StackId, rule: impl Fn(&str) -> bool) -> bool {
        self.stack(id)
            .iter()
            .any(|&f| rule(self.str(self.frame(f).name)))
    }

    /// Every stack that allocates a cuDNN convolution's workspace
    /// ([`Snapshot::is_cudnn_workspace_stack`]), found once for a walk over
    /// many events: frames first, so that a snapshot with Python frames only
    /// costs one pass over its frames.
    pub fn cudnn_workspace_stacks(&self) -> StackSet {
        self.stacks_with_frame(|_, function| crate::frames::is_cudnn_workspace(function))
    }

    /// Stacks that run a loss function ([`crate::frames::is_loss`]).
    pub fn loss_stacks(&self) -> StackSet {
        self.stacks_with_frame(crate::frames::is_loss)
    }

    /// Stacks that compute `log_softmax`'s forward ([`crate::frames::is_log_softmax_forward`]:
    /// its native kernel, as `stacks="all"` records it, or `F.log_softmax`'s Python frame).
    pub fn log_softmax_stacks(&self) -> StackSet {
        self.stacks_with_frame(|_, function| crate::frames::is_log_softmax_forward(function))
    }

    /// Whether stack `id` is NLL loss's backward ([`crate::frames::is_nll_loss_backward`]).
    pub fn is_nll_loss_backward_stack(&self, id: StackId) -> bool {
        self.stack_has_function(id, crate::frames::is_nll_loss_backward)
    }

    /// Stacks with a frame that `rule` (file name, function) picks; each
    /// frame is judged once, and a snapshot with no such frame pays no pass
    /// over its stacks.
    fn stacks_with_frame(&self, rule: impl Fn(&str, &str) -> bool) -> StackSet {
        let frames: Vec<bool> = self
            .frames
            .iter()
            .map(|f| rule(self.str(f.filename), self.str(f.name)))
            .collect();
        if !frames.contains(&true) {
            return StackSet::default();
        }
        let stacks = (0..self.stack_ranges.len())
            .map(|id| {
                self.stack(id as StackId)
                    .iter()
                    .any(|&f| frames.get(f as usize).copied().unwrap_or(false))
            })
            .collect();
        StackSet(stacks)
    }

    /// Whether `e` is an `oom` entry the program saw (not one PyTorch caught
    /// itself: [`Snapshot::oom_caught_by_pytorch`]).
    pub fn is_oom_failure(&self, e: &TraceEvent) -> bool {
        e.action == Action::Oom && !self.oom_caught_by_pytorch(e)
    }

    /// Device ordinals that appear in segments or traces, sorted.
    pub fn devices(&self) -> Vec<u32> {
        let mut d: Vec<u32> = self.segments.iter().map(|s| s.device).collect();
        d.extend(
            self.traces
                .iter()
                .filter(|t| !t.events.is_empty())
                .map(|t| t.device),
        );
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The first device whose trace has events (0 when none has): the one a
    /// single-device analysis replays.
    pub fn first_traced_device(&self) -> u32 {
        self.traces
            .iter()
            .find(|t| !t.events.is_empty())
            .map_or(0, |t| t.device)
    }

    /// The trace of `device` (empty when the snapshot has none for it).
    pub fn device_trace(&self, device: u32) -> &[TraceEvent] {
        self.traces
            .iter()
            .find(|t| t.device == device)
            .map_or(&[], |t| &t.events)
    }

    /// Formats a frame as `file:line` (the short form users know).
    pub fn frame_location(&self, id: FrameId) -> String {
        let f = self.frame(id);
        format!("{}:{}", self.str(f.filename), f.line)
    }
}
