//! The OOM explainer on a snapshot: the allocator's state right before the
//! failed allocation, why it failed, and what would fix it.
//!
//! The `oom` trace event carries the rounded request (`size`) and the device's
//! free memory (`device_free`). The state it is judged against is the replayed
//! state right before that event: the allocator records `oom` after its last
//! retry (every wholly free segment already returned to the device), so that
//! state is exactly what the `OutOfMemoryError` message describes. A snapshot
//! dumped in the `except` handler shows a later state: the failing frame's
//! tensors are gone by then.

use super::batch_model::{self, BatchModel};
use super::cause::Cause;
use super::fixes::{self, BatchFit, OomFix};
use super::message::OomMessage;
use super::whatif::{StepModel, WhatIf, WhatIfSpec};
use crate::analysis::categories::Category;
use crate::analysis::peak::{group_live, LiveSite};
use crate::analysis::sites::{stack_lines, Site};
use crate::replay::config::recorded_config;
use crate::replay::observe::{recorded_run_in, RecordedRun};
use crate::sim::allocator::BlockStatus;
use crate::sim::rounding::{allocation_size, is_small};
use crate::sim::SegmentView;
use crate::snapshot::{Action, Snapshot};
use crate::trace::Analysed;
use crate::units::format_bytes;
use serde::Serialize;
use std::collections::BTreeMap;

/// What the analysis can be told beyond the snapshot.
#[derive(Clone, Debug)]
pub struct OomOptions {
    /// The `OutOfMemoryError` text of the same failure, when the user has it:
    /// it tells the device's total memory, the cap ("allowed") and the memory
    /// of other processes.
    pub message: Option<OomMessage>,
    /// Total memory of the GPU (`--device-memory`); wins over the message's.
    pub device_memory: Option<u64>,
    /// The batch size of the failing step, to say the fitting batch in samples.
    pub batch: Option<u64>,
    /// Allocation sites listed in `live_at_oom`.
    pub top: usize,
    /// The devices as `memlens.record` wrote them beside the snapshot
    /// ([`crate::device_file`]): the total and the cap the run had, where
    /// neither the message nor an option gives them.
    pub recorded: Vec<crate::device_file::RecordedDevice>,
    /// The run's optimizer (`--optimizer`), whose state a first step's model
    /// counts; `None`: Adam(W)'s, assumed and said.
    pub optimizer: Option<super::whatif::FirstStepOptimizer>,
}

impl Default for OomOptions {
    fn default() -> Self {
        OomOptions {
            message: None,
            device_memory: None,
            batch: None,
            top: 10,
            recorded: Vec::new(),
            optimizer: None,
        }
    }
}

impl OomOptions {
    /// What `memlens.record` wrote about `device`, if anything.
    fn recorded_device(&self, device: u32) -> Option<&crate::device_file::RecordedDevice> {
        crate::device_file::of_device(&self.recorded, device)
    }
}

/// Free memory in one pool of one stream, as the allocator's best fit sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolState {
    /// `small` (blocks up to 1 MiB, 2 MiB segments) or `large`.
    pub pool: &'static str,
    /// The CUDA stream (raw `cudaStream_t`; 0 is the default stream).
    pub stream: i64,
    /// The private pool (`MempoolId_t`: CUDA graphs, `torch.cuda.MemPool`);
    /// `None` for the default pool.
    pub private_pool: Option<(i64, i64)>,
    /// Segments (mapped ranges for expandable segments).
    pub segments: usize,
    /// Reserved bytes.
    pub reserved_bytes: u64,
    /// Bytes in allocated blocks.
    pub allocated_bytes: u64,
    /// Bytes freed by the user but waiting for other streams.
    pub pending_free_bytes: u64,
    /// Bytes in free blocks.
    pub free_bytes: u64,
    /// Number of free blocks.
    pub free_blocks: usize,
    /// The largest free block.
    pub largest_free_block_bytes: u64,
    /// Whether the request went to this pool.
    pub requested_here: bool,
}

/// The free space the request could have used, in pieces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreePieces {
    /// Free blocks in the request's pool and stream.
    pub count: usize,
    /// Their total.
    pub total_bytes: u64,
    /// The largest ones, largest first (at most 10).
    pub largest: Vec<u64>,
    /// Segments holding them (each also holds live tensors, or it would have
    /// been returned to the device before the OOM was raised).
    pub segments: usize,
}

/// Where the memory cap figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapSource {
    /// The message's "allowed" figure.
    Message,
    /// Inferred from the trace: the device had room, yet the allocation failed.
    Inferred,
    /// Written beside the snapshot by `memlens.record` (the fraction in
    /// force times the device's total).
    Recorded,
}

/// The per-process memory cap (`set_per_process_memory_fraction`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryCap {
    /// The cap in bytes (for an inferred cap without a fraction: the lowest
    /// value consistent with the trace).
    pub bytes: u64,
    /// The memory fraction, when the device's total is known.
    pub fraction: Option<f64>,
    /// Where the figure comes from.
    pub source: CapSource,
    /// For an inferred cap: it is at least the first figure (PyTorch held that
    /// much before) and below the second (held + the failed segment).
    pub range_bytes: Option<(u64, u64)>,
    /// How it was found, in a sentence.
    pub how: String,
}

/// The device's memory around the failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Total memory (`--device-memory`, or the message's "total capacity").
    pub total_bytes: Option<u64>,
    /// `option` or `message`.
    pub total_source: Option<&'static str>,
    /// Free memory by `cudaMemGetInfo` when the allocation failed (the `oom`
    /// event's `device_free`).
    pub free_bytes: u64,
    /// Memory not reserved by this process's PyTorch allocator: total - free -
    /// reserved (other processes, this process's CUDA context and libraries).
    pub outside_pytorch_bytes: Option<u64>,
    /// Of it, other processes (from the message).
    pub other_processes_bytes: Option<u64>,
    /// Of it, this process outside PyTorch's allocator (from the message).
    pub this_process_non_pytorch_bytes: Option<u64>,
}

/// One figure of the message compared with the replayed state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MessageCheck {
    /// Which figure.
    pub figure: &'static str,
    /// As printed.
    pub printed: String,
    /// The snapshot's value right before the `oom` event.
    pub snapshot_bytes: u64,
    /// Whether the printed figure (two decimals) admits the snapshot's value.
    pub agrees: bool,
}

/// Bytes of one category live at the OOM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CategoryBytes {
    /// The category.
    pub category: Category,
    /// Bytes.
    pub bytes: u64,
    /// Blocks.
    pub count: u64,
}

/// The OOM analysis of a snapshot. The first keys are those of the
/// `memlens oom --json` contract.
#[derive(Clone, Debug, Serialize)]
pub struct OomReport {
    /// Always `"snapshot"` (`"message"` for the message-only diagnosis).
    pub source: &'static str,
    /// Why the allocation failed.
    pub cause: Cause,
    /// The rounded request (the `oom` event's `size`).
    pub requested_bytes: u64,
    /// The largest free block in the pool and stream the request came from.
    pub largest_free_block_bytes: u64,
    /// Reserved but not allocated (reserved - allocated, as the message prints).
    pub reserved_unallocated_bytes: u64,
    /// What to do, best first; every one is predicted to help.
    pub fixes: Vec<OomFix>,
    /// A short paragraph with the numbers, for people.
    pub explanation: String,
    /// The segment the allocator tried to get ("Tried to allocate").
    pub tried_to_allocate_bytes: u64,
    /// Device ordinal.
    pub device: u32,
    /// Index of the `oom` event in the device's trace.
    pub event_index: usize,
    /// Its time, epoch microseconds.
    pub time_us: i64,
    /// `small` or `large`: the pool the request would come from.
    pub pool: &'static str,
    /// The stream it was made on.
    pub stream: i64,
    /// `file:line` of the innermost user frame of the failed allocation.
    pub site: String,
    /// The function of that line.
    pub function: String,
    /// The whole stack, innermost first.
    pub stack: Vec<String>,
    /// Allocated bytes right before the failure.
    pub allocated_bytes: u64,
    /// Reserved bytes right before the failure.
    pub reserved_bytes: u64,
    /// The most PyTorch had reserved at any point before the failure.
    pub peak_reserved_before_bytes: u64,
    /// The free space of the request's pool and stream, in pieces.
    pub free_pieces: FreePieces,
    /// Every pool and stream.
    pub pools: Vec<PoolState>,
    /// Reserved in other streams' segments (unusable by this request).
    pub other_streams_reserved_bytes: u64,
    /// Of it, free.
    pub other_streams_free_bytes: u64,
    /// Reserved in private pools (CUDA graphs, `MemPool`).
    pub private_pools_reserved_bytes: u64,
    /// Of it, free.
    pub private_pools_free_bytes: u64,
    /// The device's memory.
    pub device_memory: DeviceMemory,
    /// The cap, when one applied.
    pub memory_cap: Option<MemoryCap>,
    /// What was live right before the failure, by site and category.
    pub live_at_oom: Vec<LiveSite>,
    /// Sites not listed.
    pub other_sites: usize,
    /// Live bytes by category.
    pub categories: BTreeMap<String, u64>,
    /// Live bytes and blocks by category, largest first.
    pub category_detail: Vec<CategoryBytes>,
    /// How the failing step was modelled for the predictions.
    pub step_model: Option<StepModel>,
    /// The largest batch that fits, by simulation.
    pub batch: Option<BatchFit>,
    /// The failing step's memory split into what scales with the batch
    /// (slope, fitted on steps at several batch sizes or estimated) and what
    /// does not.
    pub batch_model: Option<BatchModel>,
    /// Fixes the simulation says would not help, with its figures.
    pub not_helpful: Vec<OomFix>,
    /// The message's figures against the snapshot's (when a message was given).
    pub message_check: Vec<MessageCheck>,
    /// `oom` events in the trace (the last one is analysed).
    pub ooms_in_trace: usize,
    /// Caveats.
    pub warnings: Vec<String>,
}

impl OomReport {
    /// The fix every surface leads with: the first of [`OomReport::fixes`]
    /// that the simulation says fits, else the first whose simulated figure
    /// may fit (a grounded fix before advice), else the first. `doctor`'s OOM
    /// finding, its fragmentation finding beside an OOM and the report's
    /// first card all name this one.
    pub fn lead_fix(&self) -> Option<&OomFix> {
        self.fixes
            .iter()
            .find(|f| f.fits == Some(true))
            .or_else(|| {
                self.fixes.iter().find(|f| {
                    f.basis == fixes::Basis::Simulated
                        && f.predicted_peak_reserved_bytes.is_some()
                        && f.fits.is_none()
                })
            })
            .or(self.fixes.first())
    }

    /// The whole advice list in the order every surface shows it: the
    /// fixes, then those the simulation says would not help.
    pub fn advice(&self) -> impl Iterator<Item = (&OomFix, bool)> {
        self.fixes
            .iter()
            .map(|f| (f, true))
            .chain(self.not_helpful.iter().map(|f| (f, false)))
    }
}

/// The replayed state right before the failure, and where the program
/// called `empty_cache()` before it: one replay, two observers.
struct State {
    allocated: u64,
    reserved: u64,
    peak_reserved: u64,
    segments: Vec<SegmentView>,
    live: Vec<crate::replay::LiveBlock>,
    warnings: Vec<String>,
    empty_cache_at: hashbrown::HashSet<usize>,
}

/// The state before the OOM at `index` on `device`, from `run` when it
/// watched that event, else from the one replay of the trace the analysed
/// trace holds.
fn state_before(an: &Analysed<'_>, device: u32, index: usize, run: Option<&RecordedRun>) -> State {
    let snap = an.snap;
    let own;
    let run = match run
        .filter(|r| r.device == device && r.before_oom.as_ref().is_some_and(|b| b.0 == index))
    {
        Some(r) => r,
        None => {
            own = recorded_run_in(an.recorded(), snap, device, Some(index));
            &own
        }
    };
    let empty_cache_at = run.empty_cache_at.iter().copied().collect();
    let Some((_, st)) = &run.before_oom else {
        return State {
            allocated: 0,
            reserved: 0,
            peak_reserved: 0,
            segments: Vec::new(),
            live: Vec::new(),
            warnings: Vec::new(),
            empty_cache_at,
        };
    };
    let mut warnings = st.warnings.clone();
    if st.mismatches > 0 {
        warnings.push(format!(
            "the allocator model placed {} events differently from the trace before the OOM \
             (the trace's placement was kept)",
            st.mismatches
        ));
    }
    State {
        allocated: st.allocated,
        reserved: st.reserved,
        peak_reserved: st.peak_reserved,
        segments: st.segments.clone(),
        live: st.live.clone(),
        warnings,
        empty_cache_at,
    }
}

/// Analyses the last OOM of the snapshot's trace; `None` when the trace holds
/// no `oom` event (the snapshot was not taken at or after an OOM, or the
/// trace was not recorded).
pub fn analyze_snapshot(snap: &Snapshot, opts: &OomOptions) -> crate::Result<Option<OomReport>> {
    analyze_analysed(&Analysed::new(snap), opts)
}

/// [`analyze_snapshot`] of a snapshot already analysed (the one analysed
/// trace `doctor` builds).
pub fn analyze_analysed(an: &Analysed<'_>, opts: &OomOptions) -> crate::Result<Option<OomReport>> {
    analyze_observed(an, None, opts)
}

/// [`analyze_analysed`] with the replay of the run under its recorded
/// settings already made (`run`, when it watched the chosen OOM): no replay
/// of its own.
pub fn analyze_observed(
    an: &Analysed<'_>,
    run: Option<&RecordedRun>,
    opts: &OomOptions,
) -> crate::Result<Option<OomReport>> {
    let snap = an.snap;
    let found = super::chosen_oom(snap);
    let Some((trace, k)) = found else {
        return Ok(None);
    };
    let t = &snap.traces[trace];
    let oom = t.events[k];
    let ooms_in_trace = t.events.iter().filter(|e| snap.is_oom_failure(e)).count();
    let config = recorded_config(&snap.settings);
    let request = oom.size;
    let tried = allocation_size(&config, request);
    let small = is_small(request);
    let stream_key = snap.stream(oom.stream);
    let st = state_before(an, t.device, k, run);
    let mut warnings = st.warnings.clone();
    if ooms_in_trace > 1 {
        warnings.push(format!(
            "the trace holds {ooms_in_trace} OOMs; this is the last one"
        ));
    }

    let mem = CacheMemory::of(&st.segments, small, stream_key as u64);
    let (free_pieces, largest_free) = (mem.free_pieces.clone(), mem.largest_free);

    // The device, the cap, the figures the cause is read from.
    let msg = opts.message.as_ref();
    let recorded = opts.recorded_device(t.device);
    let (facts, device_memory, memory_cap) = facts_of(opts, recorded, &oom, &st, &mem, tried);
    // What was live.
    let Some(classifier) = an.classifier(trace) else {
        return Ok(None);
    };
    let classifier = classifier.until(k);
    let groups = group_live(an, &classifier, &st.live, opts.top);
    let category_detail = category_detail(&groups);
    let site = an.sites.describe(oom.stack);

    let cause = decide(&facts);

    let message_check = msg.map_or_else(Vec::new, |m| check_message(m, &facts));
    if message_check.iter().any(|c| !c.agrees) {
        warnings.push(
            "some figures of the message do not match the snapshot: it may come from another OOM"
                .into(),
        );
    }

    // Predictions.
    let (whatif, outcome, batch_model) = predict_fixes(&Predicting {
        an,
        trace,
        oom_index: k,
        st: &st,
        classifier: &classifier,
        groups: &groups,
        facts: &facts,
        cause,
        memory_cap: memory_cap.as_ref(),
        opts,
    });
    warnings.extend(outcome.warnings.iter().cloned());

    let explanation = explain(
        &facts,
        cause,
        &site,
        memory_cap.as_ref(),
        &category_detail,
        &free_pieces,
    );
    Ok(Some(OomReport {
        source: "snapshot",
        cause,
        requested_bytes: request,
        largest_free_block_bytes: largest_free,
        reserved_unallocated_bytes: facts.unallocated,
        fixes: outcome.fixes,
        explanation,
        tried_to_allocate_bytes: tried,
        device: t.device,
        event_index: k,
        time_us: oom.time_us,
        pool: if small { "small" } else { "large" },
        stream: stream_key,
        site: site.site,
        function: site.function,
        stack: stack_lines(snap, oom.stack),
        allocated_bytes: st.allocated,
        reserved_bytes: st.reserved,
        peak_reserved_before_bytes: st.peak_reserved,
        free_pieces,
        pools: mem.pools,
        other_streams_reserved_bytes: mem.other_streams_reserved,
        other_streams_free_bytes: facts.other_streams_free,
        private_pools_reserved_bytes: mem.private_reserved,
        private_pools_free_bytes: facts.private_free,
        device_memory,
        memory_cap,
        live_at_oom: groups.sites.clone(),
        other_sites: groups.other_sites,
        categories: groups.category_bytes(),
        category_detail,
        step_model: whatif.map(|w| w.model),
        batch: outcome.batch,
        batch_model,
        not_helpful: outcome.not_helpful,
        message_check,
        ooms_in_trace,
        warnings,
    }))
}

/// The figures of the OOM `oom` met in state `st`, with the device's memory
/// and the cap (given, printed or inferred).
fn facts_of(
    opts: &OomOptions,
    recorded: Option<&crate::device_file::RecordedDevice>,
    oom: &crate::snapshot::TraceEvent,
    st: &State,
    mem: &CacheMemory,
    tried: u64,
) -> (Facts, DeviceMemory, Option<MemoryCap>) {
    let device_memory = device_memory(opts, recorded, oom.addr, st.reserved);
    let (total, device_free) = (device_memory.total_bytes, device_memory.free_bytes);
    let cap = recorded_cap(opts.message.as_ref(), recorded).or_else(|| {
        memory_cap(
            opts.message.as_ref(),
            total,
            device_free,
            tried,
            st.reserved,
            st.peak_reserved,
        )
    });
    let facts = Facts {
        request: oom.size,
        tried,
        reserved: st.reserved,
        allocated: st.allocated,
        free_here: mem.free_pieces.total_bytes,
        largest_free: mem.largest_free,
        unallocated: st.reserved.saturating_sub(st.allocated),
        other_streams_free: mem.other_streams_free,
        private_free: mem.private_free,
        device_free,
        total,
        outside: device_memory.outside_pytorch_bytes,
        others: device_memory.other_processes_bytes,
        cap: cap.as_ref().map(|c| c.bytes),
    };
    (facts, device_memory, cap)
}

/// What the fixes are predicted from.
struct Predicting<'a, 'an> {
    an: &'a Analysed<'an>,
    trace: usize,
    oom_index: usize,
    st: &'a State,
    classifier: &'a crate::trace::BlockClassifier<'a>,
    groups: &'a crate::analysis::peak::LiveGroups,
    facts: &'a Facts,
    cause: Cause,
    memory_cap: Option<&'a MemoryCap>,
    opts: &'a OomOptions,
}

/// The model of the failing step, the fixes it checks (or advice alone
/// without one) and the batch model.
fn predict_fixes(p: &Predicting<'_, '_>) -> (Option<WhatIf>, fixes::Outcome, Option<BatchModel>) {
    let (an, st, facts) = (p.an, p.st, p.facts);
    let snap = an.snap;
    let whatif = WhatIf::with_empty_cache_at(
        an,
        p.trace,
        p.oom_index,
        &st.empty_cache_at,
        p.opts.optimizer,
    );
    let leftovers = fixes::leftovers(snap, p.classifier, &st.live, whatif.as_ref());
    let ctx = fixes::Context {
        cause: p.cause,
        recorded: recorded_config(&snap.settings),
        cap: p.memory_cap.map(|c| c.bytes),
        cap_fraction: p.memory_cap.and_then(|c| c.fraction),
        total: facts.total,
        overhead: facts.outside,
        device_free: facts.device_free,
        others: facts.others,
        batch: p.opts.batch,
        batch_axis: p.opts.batch.is_some() || p.classifier.facts().model_ran_before(p.oom_index),
        autocast: uses_autocast(snap),
        shapes_vary: shapes_vary(
            snap,
            &snap.traces[p.trace].events,
            an.trace(p.trace).map(|t| &t.steps),
            p.oom_index,
        ),
        reserved: st.reserved,
        activation_bytes: activation_bytes(p.groups),
        leftovers,
        unallocated: facts.unallocated,
        request: facts.tried,
    };
    let outcome = match &whatif {
        Some(w) => fixes::predict(w, &ctx),
        None => fixes::advice_only(&ctx),
    };
    let batch_model = match (&whatif, an.trace(p.trace)) {
        (Some(w), Some(t)) if ctx.batch_axis => batch_model::fit(&batch_model::Inputs {
            events: &snap.traces[p.trace].events,
            steps: &t.steps,
            classifier: p.classifier,
            oom_index: p.oom_index,
            step_model: &w.model,
            batch: p.opts.batch,
            live: &st.live,
            cache: facts.unallocated,
        }),
        _ => None,
    };
    (whatif, outcome, batch_model)
}

/// The cache's memory right before the OOM: the pools, the free pieces the
/// request could use (its pool and stream), and what sat elsewhere.
struct CacheMemory {
    pools: Vec<PoolState>,
    free_pieces: FreePieces,
    largest_free: u64,
    other_streams_reserved: u64,
    other_streams_free: u64,
    private_reserved: u64,
    private_free: u64,
}

impl CacheMemory {
    /// The memory of `segments` for a request of the `small` pool on stream
    /// `stream`.
    fn of(segments: &[SegmentView], small: bool, stream: u64) -> CacheMemory {
        let here: Vec<&SegmentView> = segments
            .iter()
            .filter(|s| s.pool_id == (0, 0) && s.is_small == small && s.stream == stream)
            .collect();
        let mut free_sizes: Vec<u64> = here
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.status == BlockStatus::Free)
            .map(|b| b.size)
            .collect();
        free_sizes.sort_unstable_by(|a, b| b.cmp(a));
        let free_pieces = FreePieces {
            count: free_sizes.len(),
            total_bytes: free_sizes.iter().sum(),
            largest: free_sizes.iter().take(10).copied().collect(),
            segments: here
                .iter()
                .filter(|s| s.blocks.iter().any(|b| b.status == BlockStatus::Free))
                .count(),
        };
        let other_streams: Vec<&SegmentView> = segments
            .iter()
            .filter(|s| s.pool_id == (0, 0) && s.stream != stream)
            .collect();
        let private: Vec<&SegmentView> = segments.iter().filter(|s| s.pool_id != (0, 0)).collect();
        let free_of = |v: &[&SegmentView]| -> u64 {
            v.iter()
                .flat_map(|s| s.blocks.iter())
                .filter(|b| b.status == BlockStatus::Free)
                .map(|b| b.size)
                .sum()
        };
        CacheMemory {
            pools: pool_states(segments, small, stream),
            largest_free: free_sizes.first().copied().unwrap_or(0),
            free_pieces,
            other_streams_reserved: other_streams.iter().map(|s| s.total_size).sum(),
            other_streams_free: free_of(&other_streams),
            private_reserved: private.iter().map(|s| s.total_size).sum(),
            private_free: free_of(&private),
        }
    }
}

/// The cap as the explanation names it, with where it comes from.
fn cap_in_words(cap: Option<&MemoryCap>) -> String {
    match cap {
        Some(c) if c.source == CapSource::Message => match c.fraction {
            Some(fr) => format!("{} (a memory fraction of {fr})", format_bytes(c.bytes)),
            None => format_bytes(c.bytes),
        },
        Some(c) if c.source == CapSource::Recorded => format!(
            "{} (set_per_process_memory_fraction({}), as memlens.record saw it)",
            format_bytes(c.bytes),
            c.fraction.unwrap_or(0.0)
        ),
        Some(c) => match c.fraction {
            Some(fr) => format!(
                "about {} (inferred: most likely set_per_process_memory_fraction({fr}))",
                format_bytes(c.bytes)
            ),
            // The lowest cap the trace allows: what it held when it failed.
            None => format!("{} or a little more (inferred)", format_bytes(c.bytes)),
        },
        None => "a cap".into(),
    }
}

/// The cap `memlens.record` wrote beside the snapshot, unless the message
/// prints one (the message's "allowed" is what PyTorch itself enforced).
fn recorded_cap(
    msg: Option<&OomMessage>,
    recorded: Option<&crate::device_file::RecordedDevice>,
) -> Option<MemoryCap> {
    if msg.and_then(|m| m.memory_cap()).is_some() {
        return None;
    }
    let r = recorded?;
    let bytes = r.memory_cap()?;
    let fraction = r.memory_fraction?;
    Some(MemoryCap {
        bytes,
        fraction: Some(round_to(fraction, 0.001)),
        source: CapSource::Recorded,
        range_bytes: None,
        how: format!(
            "memlens.record wrote the per-process memory fraction in force ({fraction:.4}) and \
             the device's total ({}) beside the snapshot",
            format_bytes(r.total_memory)
        ),
    })
}

/// The device's memory at the OOM: `device_free` as the event recorded it,
/// its total from `--device-memory`, the message or what `memlens.record`
/// wrote beside the snapshot, and what lay outside PyTorch's `reserved`.
fn device_memory(
    opts: &OomOptions,
    recorded: Option<&crate::device_file::RecordedDevice>,
    device_free: u64,
    reserved: u64,
) -> DeviceMemory {
    let msg = opts.message.as_ref();
    let (total, total_source) = match (
        opts.device_memory,
        msg.and_then(|m| m.total_capacity.as_ref()),
        recorded,
    ) {
        (Some(d), _, _) => (Some(d), Some("option")),
        (None, Some(f), _) => (Some(f.bytes), Some("message")),
        (None, None, Some(r)) => (Some(r.total_memory), Some("memlens.record")),
        (None, None, None) => (None, None),
    };
    DeviceMemory {
        total_bytes: total,
        total_source,
        free_bytes: device_free,
        outside_pytorch_bytes: total
            .map(|t| t.saturating_sub(device_free).saturating_sub(reserved)),
        other_processes_bytes: msg
            .filter(|m| !m.other_processes.is_empty())
            .map(|m| m.other_processes_bytes()),
        this_process_non_pytorch_bytes: msg
            .and_then(|m| m.this_process.as_ref())
            .map(|p| p.bytes.saturating_sub(reserved)),
    }
}

/// Bytes of each category live at the OOM, largest first.
fn category_detail(groups: &crate::analysis::peak::LiveGroups) -> Vec<CategoryBytes> {
    let mut detail: Vec<CategoryBytes> = groups
        .categories
        .iter()
        .map(|(c, v)| CategoryBytes {
            category: *c,
            bytes: v.0,
            count: v.1,
        })
        .collect();
    detail.sort_by_key(|b| std::cmp::Reverse(b.bytes));
    detail
}

/// Bytes of activations and temporaries live at the OOM (what autocast or
/// checkpointing would shrink).
fn activation_bytes(groups: &crate::analysis::peak::LiveGroups) -> u64 {
    groups
        .categories
        .iter()
        .filter(|(c, _)| matches!(c, Category::Activation | Category::Temporary))
        .map(|(_, v)| v.0)
        .sum()
}

/// Whether shapes varied between steps: a line of the program (a stack with
/// Python frames) allocated other sizes, in order, in one step than in the
/// step before (allocations of 1 MiB or more, up to event `until`, the
/// failure). Such shapes leave freed blocks that do not fit the next
/// requests. A model's layers allocate many sizes from one line in every
/// step alike (a ResNet's blocks share their lines), so sizes within a step
/// say nothing; with fewer than two steps recorded it cannot be told, and
/// "keep shapes steady" is not offered.
fn shapes_vary(
    snap: &Snapshot,
    events: &[crate::snapshot::TraceEvent],
    steps: Option<&crate::trace::steps::Steps>,
    until: usize,
) -> bool {
    const MIN: u64 = 1 << 20;
    let Some(steps) = steps else { return false };
    // Stacks whose sizes are the program's shapes: Python frames, and not a
    // cuDNN workspace (sized for the algorithm cuDNN picks, which changes
    // under a cap when one is given up).
    let mut program_shape: hashbrown::HashMap<crate::snapshot::StackId, bool> =
        hashbrown::HashMap::new();
    // Sizes by stack, in order, in one step.
    let mut sizes_in = |range: std::ops::Range<usize>| {
        let mut by_stack: hashbrown::HashMap<crate::snapshot::StackId, Vec<u64>> =
            hashbrown::HashMap::new();
        for e in events.get(range.start..range.end.min(until)).unwrap_or(&[]) {
            if e.action != Action::Alloc || e.size < MIN {
                continue;
            }
            let counts = *program_shape.entry(e.stack).or_insert_with(|| {
                snap.stack(e.stack)
                    .iter()
                    .any(|&f| snap.str(snap.frame(f).filename).ends_with(".py"))
                    && !snap.is_cudnn_workspace_stack(e.stack)
            });
            if counts {
                by_stack.entry(e.stack).or_default().push(e.size);
            }
        }
        by_stack
    };
    let last = steps.step_of(until.saturating_sub(1));
    let mut before: Option<hashbrown::HashMap<crate::snapshot::StackId, Vec<u64>>> = None;
    for k in 0..=last.min(steps.len().saturating_sub(1)) {
        let now = sizes_in(steps.range(k));
        if let Some(prev) = &before {
            let differ = now.iter().any(|(stack, seq)| {
                prev.get(stack)
                    .is_some_and(|p| seq.iter().zip(p).any(|(a, b)| a != b))
            });
            if differ {
                return true;
            }
        }
        before = Some(now);
    }
    false
}

/// Whether the run used autocast (mixed precision is then already on).
fn uses_autocast(snap: &Snapshot) -> bool {
    snap.frames.iter().any(|f| {
        let file = snap.str(f.filename);
        file.ends_with("autocast_mode.py") || file.contains("/torch/amp/")
    })
}

fn pool_states(segments: &[SegmentView], small: bool, stream: u64) -> Vec<PoolState> {
    let mut map: BTreeMap<((i64, i64), bool, u64), PoolState> = BTreeMap::new();
    for s in segments {
        let key = (s.pool_id, s.is_small, s.stream);
        let p = map.entry(key).or_insert_with(|| PoolState {
            pool: if s.is_small { "small" } else { "large" },
            stream: s.stream as i64,
            private_pool: (s.pool_id != (0, 0)).then_some(s.pool_id),
            segments: 0,
            reserved_bytes: 0,
            allocated_bytes: 0,
            pending_free_bytes: 0,
            free_bytes: 0,
            free_blocks: 0,
            largest_free_block_bytes: 0,
            requested_here: s.pool_id == (0, 0) && s.is_small == small && s.stream == stream,
        });
        p.segments += 1;
        p.reserved_bytes += s.total_size;
        for b in &s.blocks {
            match b.status {
                BlockStatus::Allocated => p.allocated_bytes += b.size,
                BlockStatus::PendingFree => p.pending_free_bytes += b.size,
                BlockStatus::Free => {
                    p.free_bytes += b.size;
                    p.free_blocks += 1;
                    p.largest_free_block_bytes = p.largest_free_block_bytes.max(b.size);
                }
            }
        }
    }
    let mut v: Vec<PoolState> = map.into_values().collect();
    v.sort_by(|a, b| {
        (b.requested_here, b.reserved_bytes).cmp(&(a.requested_here, a.reserved_bytes))
    });
    v
}

/// Fractions a user would write, coarsest first.
const FRACTION_STEPS: [f64; 4] = [0.05, 0.01, 0.005, 0.001];

/// The cap: printed by the message, or inferred when the device had room for
/// the segment but the allocation failed anyway.
fn memory_cap(
    msg: Option<&OomMessage>,
    total: Option<u64>,
    device_free: u64,
    tried: u64,
    reserved: u64,
    peak_reserved: u64,
) -> Option<MemoryCap> {
    if let Some(cap) = msg.and_then(|m| m.memory_cap()) {
        let text = msg
            .and_then(|m| m.allowed.as_ref())
            .map_or_else(|| format_bytes(cap), |a| a.text.clone());
        return Some(MemoryCap {
            bytes: cap,
            fraction: total.map(|t| round_to(cap as f64 / t as f64, 0.001)),
            source: CapSource::Message,
            range_bytes: None,
            how: format!("the message prints \"{text} allowed\""),
        });
    }
    // The device had room: cudaMalloc was not what failed. Demand a clear
    // margin, since free device memory can itself be in pieces.
    let room = device_free >= tried.saturating_mul(2).max(tried + (512 << 20));
    if !room {
        return None;
    }
    // Every segment made before fitted under the cap; the failed one did not.
    let lo = peak_reserved.max(reserved);
    let hi = reserved + tried;
    let fraction = total.and_then(|t| {
        FRACTION_STEPS.iter().find_map(|&step| {
            let f = round_to((lo as f64 / t as f64 / step).ceil() * step, step);
            let cap = (f * t as f64) as u64;
            (f > 0.0 && f < 1.0 && cap >= lo && cap < hi).then_some((f, cap))
        })
    });
    let range = format!(
        "the device still had {} free when a {} segment failed, so a per-process cap refused \
         it (torch.cuda.set_per_process_memory_fraction); the cap is at least {} (PyTorch held \
         that much before) and below {} (that plus the segment)",
        format_bytes(device_free),
        format_bytes(tried),
        format_bytes(lo),
        format_bytes(hi)
    );
    Some(match (fraction, total) {
        (Some((f, cap)), Some(t)) => MemoryCap {
            bytes: cap,
            fraction: Some(f),
            source: CapSource::Inferred,
            range_bytes: Some((lo, hi)),
            how: format!(
                "{range}; of a {} device, the round fraction in that range is {f} ({})",
                format_bytes(t),
                format_bytes(cap)
            ),
        },
        _ => MemoryCap {
            bytes: lo,
            fraction: None,
            source: CapSource::Inferred,
            range_bytes: Some((lo, hi)),
            how: format!(
                "{range}; predictions use the lower end (pass --device-memory to find the fraction)"
            ),
        },
    })
}

fn round_to(x: f64, step: f64) -> f64 {
    let d = (1.0 / step).round();
    (x * d).round() / d
}

/// The figures the cause is decided from, in bytes.
pub(super) struct Facts {
    pub request: u64,
    pub tried: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub free_here: u64,
    pub largest_free: u64,
    pub unallocated: u64,
    pub other_streams_free: u64,
    pub private_free: u64,
    pub device_free: u64,
    pub total: Option<u64>,
    pub outside: Option<u64>,
    pub others: Option<u64>,
    pub cap: Option<u64>,
}

/// The cause: the one rulebook ([`super::cause::classify`]) on the
/// snapshot's figures.
fn decide(f: &Facts) -> Cause {
    super::cause::classify(&super::cause::Evidence {
        request: Some(f.request),
        tried: Some(f.tried),
        reserved: Some(f.reserved),
        cache_free: Some(f.free_here + f.other_streams_free),
        largest_free: Some(f.largest_free),
        private_free: f.private_free,
        device_free: Some(f.device_free),
        total: f.total,
        outside: f.others.or(f.outside).unwrap_or(0),
        cap: f.cap,
        cap_may_be_unprinted: false,
    })
    .cause
}

fn check_message(m: &OomMessage, f: &Facts) -> Vec<MessageCheck> {
    let mut out = Vec::new();
    let mut add = |figure: &'static str, fig: &Option<super::message::Figure>, bytes: u64| {
        if let Some(x) = fig {
            out.push(MessageCheck {
                figure,
                printed: x.text.clone(),
                snapshot_bytes: bytes,
                agrees: x.admits(bytes),
            });
        }
    };
    add("tried_to_allocate", &m.requested, f.tried);
    add("device_free", &m.device_free, f.device_free);
    add("allocated", &m.allocated, f.allocated);
    add(
        "reserved_unallocated",
        &m.reserved_unallocated,
        f.unallocated,
    );
    add("reserved_total", &m.reserved_total, f.reserved);
    out
}

fn explain(
    f: &Facts,
    cause: Cause,
    site: &Site,
    cap: Option<&MemoryCap>,
    cats: &[CategoryBytes],
    pieces: &FreePieces,
) -> String {
    let mut s = format!(
        "A {} allocation failed at {}{}: the allocator needed a new {} segment. ",
        format_bytes(f.request),
        site.site,
        if site.function.is_empty() {
            String::new()
        } else {
            format!(" (in {})", site.function)
        },
        format_bytes(f.tried)
    );
    let held = format!(
        "{} ({} in live tensors, {} cached but free)",
        format_bytes(f.reserved),
        format_bytes(f.allocated),
        format_bytes(f.unallocated)
    );
    match cause {
        Cause::MemoryCap => {
            let c = cap.map_or(0, |c| c.bytes);
            let what = cap_in_words(cap);
            s.push_str(&format!(
                "The limit was not the device but the process's own cap: it may hold at most \
                 {what}. PyTorch already held {held}, and that plus the {} segment is {}, over \
                 the cap, while the device still had {} free. ",
                format_bytes(f.tried),
                format_bytes(f.reserved + f.tried),
                format_bytes(f.device_free)
            ));
            let _ = c;
            if f.free_here >= f.request {
                s.push_str(&format!(
                    "The {} cached and free in this pool would have covered the request had it \
                     been in one piece (the largest was {}). ",
                    format_bytes(f.free_here),
                    format_bytes(f.largest_free)
                ));
            }
        }
        Cause::PrivatePools => s.push_str(&format!(
            "{} sits free in private pools (CUDA graphs, torch.compile's reduce-overhead mode, \
             torch.cuda.MemPool), which this allocation cannot use; the device had {} free. \
             PyTorch held {held}. ",
            format_bytes(f.private_free),
            format_bytes(f.device_free)
        )),
        Cause::Fragmentation => {
            // Under a cap with the device roomy, the cap is what refused
            // the new segment: the device's free memory says nothing.
            let no_room = match cap {
                Some(_) if f.device_free >= f.tried => format!(
                    "the process's cap of {} left no room for a new {} segment",
                    cap_in_words(cap),
                    format_bytes(f.tried)
                ),
                _ => format!(
                    "the device had only {} free for a new segment",
                    format_bytes(f.device_free)
                ),
            };
            s.push_str(&format!(
            "Enough memory was cached and free ({} in {} pieces in this pool and stream{}), but \
             the largest piece was {}: the cache is fragmented, and the segments holding the \
             pieces also hold live tensors, so they could not be returned to the device; \
             {no_room}. ",
            format_bytes(f.free_here),
            pieces.count,
            if f.other_streams_free > 0 {
                format!(", {} more on other streams", format_bytes(f.other_streams_free))
            } else {
                String::new()
            },
            format_bytes(f.largest_free),
        ))
        }
        Cause::OtherProcesses => s.push_str(&format!(
            "Memory outside this process's PyTorch allocator takes {} of the device{}; without \
             it the segment would have fitted. PyTorch held {held} and the device had {} free. ",
            format_bytes(f.others.or(f.outside).unwrap_or(0)),
            if f.others.is_some() {
                " (other processes, by the message)"
            } else {
                " (other processes, or this process's CUDA context and libraries)"
            },
            format_bytes(f.device_free)
        )),
        Cause::Capacity => s.push_str(&format!(
            "The memory is taken by this process's own tensors: PyTorch held {held}, the \
             largest free piece was {}, and the device had only {} free. ",
            format_bytes(f.largest_free),
            format_bytes(f.device_free)
        )),
    }
    let top: Vec<String> = cats
        .iter()
        .filter(|c| c.bytes > 0)
        .take(4)
        .map(|c| {
            format!(
                "{} {}",
                c.category.as_str().replace('_', " "),
                format_bytes(c.bytes)
            )
        })
        .collect();
    if !top.is_empty() {
        s.push_str(&format!("Live at the failure: {}.", top.join(", ")));
    }
    s.trim_end().to_string()
}

/// Replays the what-if run `spec` (a fix's `what_if`) of the OOM `report`
/// describes: the recorded run up to the failing step, then the modelled
/// step, through the allocator simulator. `num_ooms` is the verdict the fix
/// was given: it counts a failed margin check too (the step with a little
/// more of its batch, [`super::whatif::StepModel::fit_margin`]); [`simulate_what_if_exact`]
/// replays `spec` alone.
pub fn simulate_what_if(
    snap: &Snapshot,
    report: &OomReport,
    spec: &WhatIfSpec,
) -> crate::Result<crate::replay::simulate::SimulationResult> {
    what_if_of(snap, report).and_then(|w| super::fixes::simulate_fits(&w, spec))
}

/// [`simulate_what_if`] without the margin check: `spec` exactly.
pub fn simulate_what_if_exact(
    snap: &Snapshot,
    report: &OomReport,
    spec: &WhatIfSpec,
) -> crate::Result<crate::replay::simulate::SimulationResult> {
    what_if_of(snap, report).and_then(|w| w.simulate(spec))
}

fn what_if_of(snap: &Snapshot, report: &OomReport) -> crate::Result<WhatIf> {
    let trace = snap
        .traces
        .iter()
        .position(|t| t.device == report.device)
        .ok_or_else(|| crate::Error::usage(format!("no trace for device {}", report.device)))?;
    // The optimizer the user gave the report's model (none: assumed again,
    // so the model rebuilt here is the report's, `optimizer_given` too).
    let optimizer = report
        .step_model
        .as_ref()
        .filter(|m| m.optimizer_given)
        .and_then(|m| m.first_step_optimizer);
    let w = WhatIf::new(&Analysed::new(snap), trace, report.event_index, optimizer).ok_or_else(
        || {
            crate::Error::usage(format!(
                "event {} of device {} is not an OOM this snapshot can model",
                report.event_index, report.device
            ))
        },
    )?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn cap_is_inferred_when_the_device_had_room() {
        let total = 80 * GIB;
        // 20 GiB free, a 1 GiB segment refused while 7.5 GiB were held.
        let cap = memory_cap(
            None,
            Some(total),
            20 * GIB,
            GIB,
            7 * GIB + 512 * MIB,
            7 * GIB + 600 * MIB,
        )
        .expect("a cap");
        assert_eq!(cap.source, CapSource::Inferred);
        assert_eq!(cap.fraction, Some(0.1));
        assert_eq!(cap.bytes, (0.1 * total as f64) as u64);
        // Not a round 5%: the nearest hundredth that fits the range.
        let cap = memory_cap(None, Some(total), 20 * GIB, GIB, 9 * GIB, 9 * GIB).expect("a cap");
        assert_eq!(cap.fraction, Some(0.12));
        // Unknown total: the lower end, no fraction.
        let cap = memory_cap(None, None, 20 * GIB, GIB, 9 * GIB, 9 * GIB).expect("a cap");
        assert_eq!((cap.bytes, cap.fraction), (9 * GIB, None));
        // The device was nearly full: no cap.
        assert!(memory_cap(None, Some(total), GIB + 100 * MIB, GIB, 70 * GIB, 70 * GIB).is_none());
    }

    fn facts() -> Facts {
        Facts {
            request: GIB,
            tried: GIB,
            reserved: 10 * GIB,
            allocated: 9 * GIB,
            free_here: 512 * MIB,
            largest_free: 100 * MIB,
            unallocated: GIB,
            other_streams_free: 0,
            private_free: 0,
            device_free: 256 * MIB,
            total: Some(80 * GIB),
            outside: Some(2 * GIB),
            others: None,
            cap: None,
        }
    }

    #[test]
    fn causes_in_order() {
        assert_eq!(decide(&facts()), Cause::Capacity);
        let f = Facts {
            free_here: GIB + MIB,
            ..facts()
        };
        assert_eq!(decide(&f), Cause::Fragmentation);
        // Free memory on another stream counts as fragmentation too.
        let f = Facts {
            other_streams_free: GIB,
            ..facts()
        };
        assert_eq!(decide(&f), Cause::Fragmentation);
        let f = Facts {
            outside: Some(60 * GIB),
            ..facts()
        };
        assert_eq!(decide(&f), Cause::OtherProcesses);
        let f = Facts {
            private_free: 2 * GIB,
            device_free: GIB - 100 * MIB,
            ..facts()
        };
        assert_eq!(decide(&f), Cause::PrivatePools);
        let f = Facts {
            cap: Some(10 * GIB + 100 * MIB),
            device_free: 40 * GIB,
            ..facts()
        };
        assert_eq!(decide(&f), Cause::MemoryCap);
        // Under a cap, with the cached free memory enough but in pieces:
        // fragmentation (issue 16).
        let f = Facts {
            cap: Some(10 * GIB + 100 * MIB),
            device_free: 40 * GIB,
            free_here: GIB + MIB,
            ..facts()
        };
        assert_eq!(decide(&f), Cause::Fragmentation);
    }
}
