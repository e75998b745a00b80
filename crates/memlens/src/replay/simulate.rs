//! What-if runs: the trace's allocation requests and frees, in order, through
//! the allocator model under any settings, free of the recorded addresses and
//! segment events. The model decides when to make, split, merge, release,
//! map and unmap segments; a [`crate::sim::SyntheticDevice`] with the
//! device's capacity decides when memory runs out. `empty_cache()` calls are
//! replayed where the trace shows them. The trace reaches the model as typed
//! operations ([`crate::sim::program`]), as a what-if program does
//! ([`simulate_ops`]).

use super::initial::{self, InitialState};
use super::{ReleaseCause, ReplayOptions};
use crate::sim::program::{Op, Outcome, Run};
use crate::sim::rounding::SMALL_BUFFER;
use crate::sim::{AddressOrder, AllocatorConfig, MemoryStats};
use crate::snapshot::{Action, Snapshot, StackId, StackSet};
use serde::Serialize;

/// Settings of a what-if run.
#[derive(Clone, Debug, Default)]
pub struct SimulateOptions {
    /// Allocator settings to run under.
    pub config: AllocatorConfig,
    /// Total memory of the GPU (`--device-memory`); `None`: unlimited.
    pub device_memory: Option<u64>,
    /// Memory used outside the allocator (CUDA context, other processes);
    /// `None`: estimated from an `oom` event's `device_free` when the trace
    /// has one, else 0.
    pub overhead: Option<u64>,
    /// A memory-fraction limit in bytes set outside the config
    /// (`torch.cuda.set_per_process_memory_fraction`).
    pub allowed_memory_maximum: Option<u64>,
}

/// The first allocation that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SimulatedOom {
    /// Index of the `alloc` event in the trace.
    pub event_index: usize,
    /// The request in bytes.
    pub requested_bytes: u64,
    /// The segment it needed ("Tried to allocate").
    pub alloc_size: u64,
    /// Allocated bytes then.
    pub allocated_bytes: u64,
    /// Reserved bytes then.
    pub reserved_bytes: u64,
    /// Stack of the allocation.
    pub stack: StackId,
}

/// The outcome of a what-if run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimulationResult {
    /// The settings, in `PYTORCH_CUDA_ALLOC_CONF` syntax (empty: defaults).
    pub config: String,
    /// Device ordinal.
    pub device: u32,
    /// Trace events walked.
    pub events: usize,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved_bytes: u64,
    /// The event at which reserved bytes peaked.
    pub peak_reserved_index: Option<usize>,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated_bytes: u64,
    /// The event at which allocated bytes peaked.
    pub peak_allocated_index: Option<usize>,
    /// cudaMalloc calls and expandable mappings.
    pub num_device_alloc: u64,
    /// cudaFree calls and expandable unmappings.
    pub num_device_free: u64,
    /// cudaMalloc retries after a cache flush.
    pub num_alloc_retries: u64,
    /// Failed allocations the program needed: the run's OOMs. PyTorch's
    /// `num_ooms` (in `stats`) counts the workspaces given up too.
    pub num_ooms: u64,
    /// cuDNN convolution workspaces that could not be had and were done
    /// without (PyTorch catches those failures and runs the convolution with
    /// another algorithm: [`Op::Optional`]).
    pub workspaces_given_up: u64,
    /// Sizes of segment allocations (and expandable mappings), in order.
    pub segment_sizes: Vec<u64>,
    /// The first failed allocation.
    pub first_oom: Option<SimulatedOom>,
    /// Share of reserved bytes not allocated at the reserved peak.
    pub fragmentation_at_peak: f64,
    /// `inactive_split_bytes` at the reserved peak.
    pub inactive_split_bytes_at_peak: u64,
    /// The allocator's capacity: device memory less overhead (`None`: unlimited).
    pub capacity_bytes: Option<u64>,
    /// The overhead used.
    pub overhead_bytes: Option<u64>,
    /// `empty_cache()` calls replayed.
    pub empty_cache_calls: u64,
    /// All statistics at the end.
    pub stats: MemoryStats,
    /// Caveats (a trace that starts late, ...).
    pub warnings: Vec<String>,
}

/// What a what-if run needs from the recorded trace, computed once for any
/// number of settings: the state before the first event, where the program
/// called `empty_cache()`, which allocations it could do without, and the
/// overhead an `oom` event implies.
#[derive(Clone, Debug)]
pub struct Prepared {
    device: u32,
    initial: InitialState,
    empty_cache_at: Vec<usize>,
    workspaces: StackSet,
    reserved_at_oom: Option<(u64, u64)>,
}

impl Prepared {
    /// Studies `device`'s trace (one replay when it has segment frees).
    pub fn new(snap: &Snapshot, device: u32) -> Prepared {
        let initial = initial::before_trace(snap, device);
        let empty_cache_at =
            super::release_runs_from(snap, device, &ReplayOptions::default(), initial.clone())
                .into_iter()
                .filter(|r| r.cause == ReleaseCause::EmptyCache)
                .map(|r| r.start)
                .collect();
        Prepared::with_empty_cache_at(snap, device, initial, empty_cache_at)
    }

    /// [`Prepared::new`] from a replay of the run already made
    /// ([`super::observe::recorded_run`]): no replay of its own.
    pub fn from_run(snap: &Snapshot, run: &super::observe::RecordedRun) -> Prepared {
        let initial = match &run.initial {
            Some(i) => InitialState::clone(i),
            None => initial::before_trace(snap, run.device),
        };
        Prepared::with_empty_cache_at(snap, run.device, initial, run.empty_cache_at.clone())
    }

    fn with_empty_cache_at(
        snap: &Snapshot,
        device: u32,
        initial: InitialState,
        empty_cache_at: Vec<usize>,
    ) -> Prepared {
        let events = snap.device_trace(device);
        let mut reserved: u64 = initial.segments.iter().map(|s| s.size).sum();
        let mut reserved_at_oom = None;
        for e in events {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => reserved += e.size,
                Action::SegmentFree | Action::SegmentUnmap => {
                    reserved = reserved.saturating_sub(e.size)
                }
                Action::Oom => {
                    reserved_at_oom = Some((reserved, e.addr));
                    break;
                }
                _ => {}
            }
        }
        Prepared {
            device,
            initial,
            empty_cache_at,
            workspaces: snap.cudnn_workspace_stacks(),
            reserved_at_oom,
        }
    }

    /// Memory used outside the allocator, from the first `oom` event: device
    /// total less the free bytes CUDA reported less what the allocator held.
    pub fn overhead(&self, device_memory: u64) -> Option<u64> {
        self.reserved_at_oom
            .map(|(reserved, free)| device_memory.saturating_sub(free).saturating_sub(reserved))
    }

    /// Indices of the trace events where `empty_cache()` was called.
    pub fn empty_cache_points(&self) -> &[usize] {
        &self.empty_cache_at
    }
}

/// Estimates memory used outside the allocator from the first `oom` event:
/// device total less free device bytes less what the allocator held then.
pub fn estimate_overhead(snap: &Snapshot, device: u32, device_memory: u64) -> Option<u64> {
    Prepared::new(snap, device).overhead(device_memory)
}

/// Runs `device`'s trace through the model under `opts`.
pub fn simulate(
    snap: &Snapshot,
    device: u32,
    opts: &SimulateOptions,
) -> crate::Result<SimulationResult> {
    simulate_prepared(snap, &Prepared::new(snap, device), opts)
}

/// [`simulate`] with the trace already studied (for many settings at once).
pub fn simulate_prepared(
    snap: &Snapshot,
    prep: &Prepared,
    opts: &SimulateOptions,
) -> crate::Result<SimulationResult> {
    let device = prep.device;
    let events = snap.device_trace(device);
    let mut warnings = Vec::new();
    let overhead = match (opts.device_memory, opts.overhead) {
        (Some(_), Some(o)) => Some(o),
        (Some(total), None) => Some(prep.overhead(total).unwrap_or(0)),
        (None, o) => o,
    };
    let (mut run, capacity) = start_run(opts, overhead)?;
    let init = &prep.initial;
    if !init.is_empty() {
        warnings.push(initial::late_start(
            "the simulation starts from the recorded state before its first event",
        ));
        load_initial(snap, &mut run, init);
    }
    run.started();
    // Where the program called empty_cache(), judged on the recorded run.
    let mut empty_cache_at = prep.empty_cache_at.iter().copied().peekable();
    for (i, e) in events.iter().enumerate() {
        let stream = || snap.stream(e.stream) as u64;
        let tag = u64::from(e.stack);
        let optional = prep.workspaces.contains(e.stack);
        let op = match e.action {
            Action::Alloc => Op::allocation(e.addr, e.size, stream(), tag, optional),
            // A workspace PyTorch gave up in the recorded run: tried again,
            // and where it now fits, held for its convolution only.
            Action::Oom if optional => {
                let [retry, free] = Op::workspace_tried_again(i, e.size, stream(), tag, true);
                run.apply(i, retry);
                free
            }
            // The request that failed in the recorded run (its size is
            // already rounded): under other settings it may fit.
            Action::Oom => Op::FailedRequest {
                size: e.size,
                stream: stream(),
                tag,
            },
            Action::FreeRequested => Op::FreeRequested { id: e.addr },
            Action::FreeCompleted => Op::FreeCompleted { id: e.addr },
            Action::SegmentFree | Action::SegmentUnmap if empty_cache_at.peek() == Some(&i) => {
                empty_cache_at.next();
                Op::EmptyCache
            }
            _ => continue,
        };
        run.apply(i, op);
    }
    Ok(result(
        run.finish(),
        opts,
        device,
        events.len(),
        capacity,
        overhead,
        warnings,
    ))
}

/// The model's run under `opts`, with `overhead` bytes of the device out of
/// PyTorch's reach, and the capacity that leaves (both simulations start so).
fn start_run(opts: &SimulateOptions, overhead: Option<u64>) -> crate::Result<(Run, Option<u64>)> {
    if opts.config.per_process_memory_fraction.is_some() && opts.device_memory.is_none() {
        return Err(crate::Error::usage(
            "per_process_memory_fraction needs the device's memory (--device-memory)",
        ));
    }
    let capacity = opts
        .device_memory
        .map(|t| t.saturating_sub(overhead.unwrap_or(0)));
    let run = Run::new(
        opts.config.clone(),
        opts.device_memory,
        capacity,
        opts.allowed_memory_maximum,
    );
    Ok((run, capacity))
}

/// Runs a what-if program (typed operations, see [`crate::sim::program`])
/// through the model under `opts`, starting from an empty allocator. The
/// overhead is `opts.overhead` (0 when only the device's memory is given:
/// a program has no `oom` event to estimate it from). `first_oom`'s
/// `event_index` is the failing operation's position in `ops`, its `stack`
/// the operation's tag.
pub fn simulate_ops(
    ops: &[Op],
    device: u32,
    opts: &SimulateOptions,
) -> crate::Result<SimulationResult> {
    simulate_ops_in(ops, device, opts, AddressOrder::default())
}

/// [`simulate_ops`] on a device that hands out new segments' addresses in
/// `order` (the allocator's tie-breaks follow them: [`AddressOrder`]).
pub fn simulate_ops_in(
    ops: &[Op],
    device: u32,
    opts: &SimulateOptions,
    order: AddressOrder,
) -> crate::Result<SimulationResult> {
    let overhead = match (opts.device_memory, opts.overhead) {
        (Some(_), o) => Some(o.unwrap_or(0)),
        (None, o) => o,
    };
    let (mut run, capacity) = start_run(opts, overhead)?;
    run.device.set_order(order);
    run.started();
    for (i, &op) in ops.iter().enumerate() {
        run.apply(i, op);
    }
    Ok(result(
        run.finish(),
        opts,
        device,
        ops.len(),
        capacity,
        overhead,
        Vec::new(),
    ))
}

/// The simulation's figures from a finished program.
fn result(
    out: Outcome,
    opts: &SimulateOptions,
    device: u32,
    events: usize,
    capacity: Option<u64>,
    overhead: Option<u64>,
    warnings: Vec<String>,
) -> SimulationResult {
    let st = out.stats;
    SimulationResult {
        config: opts.config.to_conf_string(),
        device,
        events,
        peak_reserved_bytes: st.reserved_bytes.all.peak,
        peak_reserved_index: out.peak_reserved_at,
        peak_allocated_bytes: st.allocated_bytes.all.peak,
        peak_allocated_index: out.peak_allocated_at,
        num_device_alloc: st.num_device_alloc,
        num_device_free: st.num_device_free,
        num_alloc_retries: st.num_alloc_retries,
        num_ooms: out.failures,
        workspaces_given_up: out.given_up,
        segment_sizes: out.segment_sizes,
        first_oom: out.first_failure.map(|f| SimulatedOom {
            event_index: f.at,
            requested_bytes: f.requested_bytes,
            alloc_size: f.alloc_size,
            allocated_bytes: f.allocated_bytes,
            reserved_bytes: f.reserved_bytes,
            // Tags are stack ids (u32) in every program memlens builds.
            stack: StackId::try_from(f.tag).unwrap_or(0),
        }),
        fragmentation_at_peak: out.fragmentation_at_peak,
        inactive_split_bytes_at_peak: out.inactive_split_bytes_at_peak,
        capacity_bytes: capacity,
        overhead_bytes: overhead,
        empty_cache_calls: out.empty_cache_calls,
        stats: st,
        warnings,
    }
}

/// Puts the recorded state before the first event into a what-if model, at
/// the recorded addresses (their sizes under the new settings are unknown).
fn load_initial(snap: &Snapshot, run: &mut Run, init: &InitialState) {
    let (model, dev, live) = (&mut run.model, &mut run.device, &mut run.live);
    for s in &init.segments {
        let stream = snap.stream(s.stream) as u64;
        let pool = model.mempool(s.pool_id);
        if s.expandable {
            model.map_at(s.addr, s.size, stream, pool, s.small, dev);
        } else {
            if model.insert_segment(
                s.addr,
                s.size,
                stream,
                pool,
                s.small || s.size == SMALL_BUFFER,
            ) {
                dev.used += s.size;
            }
        }
    }
    for b in init.blocks.iter().rev() {
        let h = match b.size {
            Some(size) => model.alloc_at(b.addr, size, b.requested, u64::MAX),
            None => model.alloc_at_request_within(
                b.addr,
                b.requested,
                b.end_bound.unwrap_or(u64::MAX),
                u64::MAX,
            ),
        };
        if let Some(h) = h {
            if b.pending {
                model.free_requested(h);
            }
        }
        live.insert(b.addr, h);
    }
    model.reset_accumulated_stats();
    model.reset_peak_stats();
}
