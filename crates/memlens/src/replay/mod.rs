//! Replay of a snapshot's trace through the allocator model.
//!
//! [`Replay`] walks one device's trace event by event under the settings it
//! was recorded with. The model decides block placement and segment sizes;
//! the trace supplies segment addresses (so tie-breaks between equal-size
//! blocks are exact) and decides when segments are freed or unmapped. Every
//! step reports what changed ([`Delta`]) and the running totals ([`Totals`]),
//! so analyses can walk a trace once; [`state_at`] gives the whole state
//! (live blocks with their real rounded sizes and stacks, segments) at any
//! event.
//!
//! A trace that does not start at the allocator's birth (the ring buffer
//! wrapped, or recording began late) starts from the state implied by the
//! dumped segments, undoing the trace backwards ([`initial`]).
//!
//! [`simulate`] runs the same trace free of the recorded addresses under any
//! settings (what-if), and [`tune`] ranks the usual settings.

pub mod config;
pub mod during_read;
mod events;
pub mod initial;
pub mod limits;
pub mod observe;
pub mod simulate;
mod trace_device;
pub mod tune;
pub mod watch;

use crate::sim::rounding::{is_small, round_size};
use crate::sim::{
    Allocator, AllocatorConfig, DeviceLimits, Handle, MemoryStats, SegmentView, DEFAULT_POOL,
};
use crate::snapshot::{Action, Snapshot, StackId, TraceEvent};
use events::Events;
use hashbrown::HashMap;
use initial::InitialState;
use serde::Serialize;
use std::collections::VecDeque;
use trace_device::{NullDevice, PendingOp, TraceDevice, FAKE_VA_BASE};

/// How to replay.
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// Settings to replay under; `None`: those recorded in the snapshot.
    pub config: Option<AllocatorConfig>,
    /// The device's limits (only the memory fraction and expandable address
    /// space use them).
    pub limits: DeviceLimits,
}

/// Bytes in one pool (or all) at a moment of the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolTotals {
    /// Allocated bytes (rounded block sizes), as `allocated_bytes.current`.
    pub allocated: u64,
    /// Allocated plus pending-free bytes, as `active_bytes.current`.
    pub active: u64,
    /// Requested (unrounded) bytes of active blocks, as `requested_bytes.current`.
    pub requested: u64,
    /// Reserved bytes, as `reserved_bytes.current`.
    pub reserved: u64,
}

/// Running totals after an event: all pools, the small pool and the large pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Both pools.
    pub all: PoolTotals,
    /// Blocks of at most 1 MiB.
    pub small: PoolTotals,
    /// Everything else.
    pub large: PoolTotals,
}

impl Totals {
    fn pool(&mut self, small: bool) -> &mut PoolTotals {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn add(&mut self, small: bool, f: impl Fn(&mut PoolTotals)) {
        f(&mut self.all);
        f(self.pool(small));
    }
}

/// What one event changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Delta {
    /// Nothing (a `snapshot` event, or an event the replay could not place).
    None,
    /// A block was allocated.
    Alloc {
        /// Address.
        addr: u64,
        /// Rounded block size (what `allocated_bytes` counts).
        size: u64,
        /// The request.
        requested: u64,
        /// Small pool.
        small: bool,
    },
    /// The user freed a block: it no longer counts as allocated.
    FreeRequested {
        /// Address.
        addr: u64,
        /// Rounded block size.
        size: u64,
        /// Small pool.
        small: bool,
    },
    /// The block returned to the pool: it no longer counts as active.
    FreeCompleted {
        /// Address.
        addr: u64,
        /// Rounded block size.
        size: u64,
        /// The request.
        requested: u64,
        /// Small pool.
        small: bool,
        /// The `free_requested` was not seen, so allocated bytes fell here too.
        also_requested: bool,
    },
    /// Reserved memory grew (`segment_alloc` or `segment_map`).
    Reserve {
        /// Address.
        addr: u64,
        /// Bytes.
        size: u64,
        /// Small pool.
        small: bool,
    },
    /// Reserved memory shrank (`segment_free` or `segment_unmap`).
    Release {
        /// Address.
        addr: u64,
        /// Bytes.
        size: u64,
        /// Small pool.
        small: bool,
    },
    /// An allocation failed.
    Oom {
        /// The rounded request.
        size: u64,
        /// Free device bytes `cudaMemGetInfo` reported.
        device_free: u64,
    },
}

/// One replayed event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Index of the event in the device's trace.
    pub index: usize,
    /// The event.
    pub event: TraceEvent,
    /// What it changed.
    pub delta: Delta,
    /// Totals after it.
    pub totals: Totals,
}

/// A block live at some point of the replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LiveBlock {
    /// Address.
    pub addr: u64,
    /// Rounded size, including any unsplit remainder.
    pub size: u64,
    /// The request.
    pub requested: u64,
    /// Stream index (into `Snapshot::streams`).
    pub stream: u16,
    /// Stack recorded at the allocation (or the best one known for blocks
    /// allocated before the trace).
    pub stack: StackId,
    /// Index of the `alloc` event; `None` for blocks from before the trace.
    pub alloc_index: Option<u32>,
    /// Freed by the user, not yet returned to the pool.
    pub pending_free: bool,
    /// Small pool.
    pub small: bool,
}

#[derive(Clone, Copy, Debug)]
struct LiveEntry {
    handle: Option<Handle>,
    size: u64,
    requested: u64,
    stream: u16,
    stack: StackId,
    alloc_index: u32,
    pending: bool,
    small: bool,
}

const NO_INDEX: u32 = u32::MAX;

/// The live blocks of a moment the replay has gone past (the running peak):
/// each block that was live then is kept here as it was, the first time the
/// replay changes or drops it; the others are still in the live map.
#[derive(Default)]
struct KeptMoment {
    /// The event after which the moment is.
    index: u32,
    before: HashMap<u64, LiveEntry>,
}

impl KeptMoment {
    /// Whether `entry` was allocated by the moment (or before the trace).
    #[inline]
    fn was_live(&self, entry: &LiveEntry) -> bool {
        entry.alloc_index <= self.index || entry.alloc_index == NO_INDEX
    }

    /// Keeps `entry` (at `addr`, about to change) if it was live at the moment.
    #[inline]
    fn keep(&mut self, addr: u64, entry: &LiveEntry) {
        if self.was_live(entry) {
            self.before.entry(addr).or_insert(*entry);
        }
    }
}

/// A live-map entry as a [`LiveBlock`].
fn live_block((&addr, e): (&u64, &LiveEntry)) -> LiveBlock {
    LiveBlock {
        addr,
        size: e.size,
        requested: e.requested,
        stream: e.stream,
        stack: e.stack,
        alloc_index: (e.alloc_index != NO_INDEX).then_some(e.alloc_index),
        pending_free: e.pending,
        small: e.small,
    }
}

/// The highest allocated and reserved bytes over a replay so far, each with
/// the event after which it was reached (`None`: never above the start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peaks {
    /// Highest allocated bytes and where.
    pub allocated: (u64, Option<usize>),
    /// Highest reserved bytes and where.
    pub reserved: (u64, Option<usize>),
}

impl Peaks {
    /// The peaks before the first event: the totals at the start.
    pub fn new(start: PoolTotals) -> Peaks {
        Peaks {
            allocated: (start.allocated, None),
            reserved: (start.reserved, None),
        }
    }

    /// Takes the totals after event `index`; whether they are a new
    /// allocated peak.
    #[inline]
    pub fn observe(&mut self, index: usize, t: &PoolTotals) -> bool {
        if t.reserved > self.reserved.0 {
            self.reserved = (t.reserved, Some(index));
        }
        let higher = t.allocated > self.allocated.0;
        if higher {
            self.allocated = (t.allocated, Some(index));
        }
        higher
    }
}

/// What every replay of `snap` says before its first event.
pub(crate) fn start_warnings(snap: &Snapshot) -> Vec<String> {
    if snap.settings.trace_alloc_overflowed == Some(true) {
        vec!["the trace ring buffer overflowed: events before the first one were lost".into()]
    } else {
        Vec::new()
    }
}

/// A segment's address and size, and its blocks' (address, size, in use).
type SegmentShape = (u64, u64, Vec<(u64, u64, bool)>);
/// Warnings a replay keeps.
pub(crate) const MAX_WARNINGS: usize = 20;

/// A replay of one device's trace, advanced one event at a time.
pub struct Replay<'s> {
    snap: &'s Snapshot,
    device: u32,
    events: Events<'s>,
    /// The raw stream of each stream index (the snapshot's, or those of a
    /// trace still being read).
    streams: Vec<i64>,
    model: Allocator,
    pos: usize,
    live: HashMap<u64, LiveEntry>,
    pending: VecDeque<PendingOp>,
    fake_va: u64,
    totals: Totals,
    run_frees: u32,
    run_frees_oversize: u32,
    run_empty_cache: bool,
    private_ranges: Vec<(u64, u64, u16)>,
    mismatches: u64,
    warnings: Vec<String>,
    initial: InitialState,
    segment_sizes: Vec<u64>,
    /// The moment whose live blocks are kept, if any ([`Replay::keep_live_here`]).
    moment: Option<KeptMoment>,
    /// The block size the model gave the last `alloc` replayed.
    last_alloc_size: u64,
    /// What a fed replay notes beside the totals (see [`FedFacts`]).
    fed: Option<FedFacts>,
}

/// What a fed replay (the peak's replay beside the reader) notes as it goes,
/// so that the analyses after the read need not walk the trace again.
#[derive(Debug, Default)]
pub(crate) struct FedFacts {
    /// For each event replayed, when it is an `alloc`, the index of its
    /// first free (`free_requested`, or `free_completed` without one);
    /// [`NO_INDEX`] otherwise.
    pub free_of: Vec<u32>,
    /// The address of every `segment_alloc` (sorted once the replay is
    /// done).
    pub segments_made: Vec<u64>,
    /// Whether any segment was mapped or unmapped (expandable segments).
    pub mapped: bool,
    /// The addresses of the blocks live after the last event, sorted.
    pub live_at_end: Vec<u64>,
}

impl<'s> Replay<'s> {
    /// Prepares the replay of `device`'s trace (an empty replay when the
    /// snapshot has no trace for it).
    pub fn new(snap: &'s Snapshot, device: u32, opts: &ReplayOptions) -> Replay<'s> {
        let initial = initial::before_trace(snap, device);
        Replay::from_initial(snap, device, opts, initial)
    }

    /// [`Replay::new`] from a state before the first event already
    /// reconstructed (by [`initial::reconstruct`]), to undo the trace once.
    pub fn from_initial(
        snap: &'s Snapshot,
        device: u32,
        opts: &ReplayOptions,
        initial: InitialState,
    ) -> Replay<'s> {
        let recorded = opts
            .config
            .as_ref()
            .is_none_or(|c| *c == config::recorded_config(&snap.settings));
        crate::work::note_replay(recorded && opts.limits == DeviceLimits::default());
        Replay::unnoted(snap, device, opts, initial)
    }

    /// [`Replay::from_initial`] without counting it ([`crate::work`]): the
    /// fed replay counts itself.
    fn unnoted(
        snap: &'s Snapshot,
        device: u32,
        opts: &ReplayOptions,
        initial: InitialState,
    ) -> Replay<'s> {
        let events = snap.device_trace(device);
        let config = opts
            .config
            .clone()
            .unwrap_or_else(|| crate::replay::config::recorded_config(&snap.settings));
        let mut model = Allocator::new(config, opts.limits);
        let mut private_ranges = Vec::new();
        for s in snap
            .segments
            .iter()
            .filter(|s| s.device == device && s.pool_id != (0, 0))
        {
            let pool = model.mempool(s.pool_id);
            private_ranges.push((s.address, s.address + s.total_size, pool));
        }
        private_ranges.sort_unstable();
        let mut r = Replay {
            snap,
            device,
            events: Events::Whole(events),
            streams: snap.streams.clone(),
            model,
            pos: 0,
            live: HashMap::new(),
            pending: VecDeque::new(),
            fake_va: FAKE_VA_BASE,
            totals: Totals::default(),
            run_frees: 0,
            run_frees_oversize: 0,
            run_empty_cache: false,
            private_ranges,
            mismatches: 0,
            warnings: Vec::new(),
            initial: InitialState::default(),
            segment_sizes: Vec::new(),
            moment: None,
            fed: None,
            last_alloc_size: 0,
        };
        for w in start_warnings(snap) {
            r.warn(w);
        }
        if !initial.is_empty() {
            r.load_initial(&initial);
        }
        r.initial = initial;
        r
    }

    /// A replay of a trace still being read, from an empty allocator under
    /// `config`: its events arrive through [`Replay::feed`], and
    /// [`Replay::step_totals_ready`] replays those it can.
    pub(crate) fn fed(config: AllocatorConfig) -> Replay<'static> {
        static NO_SNAPSHOT: std::sync::LazyLock<Snapshot> =
            std::sync::LazyLock::new(Snapshot::default);
        let opts = ReplayOptions {
            config: Some(config),
            limits: DeviceLimits::default(),
        };
        // Counted once it went through the trace (`during_read`): one that
        // gave up at the first warning replayed a few events, not the trace.
        let mut r = Replay::unnoted(&NO_SNAPSHOT, 0, &opts, InitialState::default());
        r.events = Events::Window {
            buf: Vec::new(),
            base: 0,
            last_plain: None,
            closed: false,
        };
        r.fed = Some(FedFacts::default());
        r
    }

    /// What a fed replay noted (empty for other replays), with the blocks
    /// live now.
    pub(crate) fn take_fed_facts(&mut self) -> FedFacts {
        let mut facts = self.fed.take().unwrap_or_default();
        facts.live_at_end = self.live.keys().copied().collect();
        facts.live_at_end.sort_unstable();
        facts.segments_made.sort_unstable();
        facts
    }

    /// Notes that the block allocated by event `alloc_index` is freed by
    /// the event being replayed.
    #[inline]
    fn freed_by_this_event(&mut self, alloc_index: u32) {
        let index = self.pos.wrapping_sub(1) as u32;
        if let Some(slot) = self
            .fed
            .as_mut()
            .and_then(|f| f.free_of.get_mut(alloc_index as usize))
        {
            *slot = index;
        }
    }

    /// Adds events that arrived to a fed replay.
    pub(crate) fn feed(&mut self, events: Vec<TraceEvent>) {
        self.events.push(events);
    }

    /// The raw streams the stream indices of a fed replay's events name
    /// (the reader's table so far).
    pub(crate) fn set_streams(&mut self, streams: Vec<i64>) {
        self.streams = streams;
    }

    /// No more events will arrive at a fed replay.
    pub(crate) fn close(&mut self) {
        self.events.close();
    }

    /// Whether the next event can be replayed now: there is one, and what a
    /// segment event looks ahead to has arrived (a fed replay).
    #[inline]
    pub(crate) fn can_step(&self) -> bool {
        self.events.ready(self.pos)
    }

    /// Event `index`, if it is at hand (a fed replay keeps those not yet
    /// replayed).
    #[inline]
    pub(crate) fn event(&self, index: usize) -> Option<&TraceEvent> {
        self.events.get(index)
    }

    /// The block size the model gave the last `alloc` replayed (its
    /// rounded size, or more where the rest of a block was too small to
    /// split off).
    #[inline]
    pub(crate) fn last_alloc_size(&self) -> u64 {
        self.last_alloc_size
    }

    /// Lets a fed replay drop the events it has replayed.
    pub(crate) fn drop_replayed(&mut self) {
        self.events.drop_before(self.pos);
    }

    fn warn(&mut self, msg: impl Into<String>) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(msg.into());
        }
    }

    /// Builds the state before the first event in the model.
    fn load_initial(&mut self, init: &InitialState) {
        if init.orphan_frees > 0 {
            self.warn(initial::late_start(&format!(
                "{} blocks freed in it were allocated before it; the replay starts from the state the \
                 dumped segments imply, and a peak before the first event is not seen",
                init.orphan_frees
            )));
        }
        let mut dev = NullDevice;
        for s in &init.segments {
            let stream = self.stream_key(s.stream);
            let pool = self.model.mempool(s.pool_id);
            let ok = if s.expandable {
                self.model
                    .map_at(s.addr, s.size, stream, pool, s.small, &mut dev)
            } else {
                self.model
                    .insert_segment(s.addr, s.size, stream, pool, s.small)
            };
            if !ok {
                self.warn(format!(
                    "could not rebuild segment {:#x} before the trace",
                    s.addr
                ));
            }
        }
        // Highest address first: a block sized from its request then sees the
        // free space up to the next live block, as its allocation did.
        for b in init.blocks.iter().rev() {
            let h = match b.size {
                Some(size) => self
                    .model
                    .alloc_at(b.addr, size, b.requested, NO_INDEX as u64),
                None => self.model.alloc_at_request_within(
                    b.addr,
                    b.requested,
                    b.end_bound.unwrap_or(u64::MAX),
                    NO_INDEX as u64,
                ),
            };
            let Some(h) = h else {
                self.warn(format!(
                    "could not rebuild block {:#x} before the trace",
                    b.addr
                ));
                continue;
            };
            let (_, size, _) = self.model.block_info(h).unwrap_or((0, 0, 0));
            let small = self.model.pool_at(b.addr).is_some_and(|p| p.0);
            if b.pending {
                self.model.free_requested(h);
            }
            self.live.insert(
                b.addr,
                LiveEntry {
                    handle: Some(h),
                    size,
                    requested: b.requested,
                    stream: b.stream,
                    stack: b.stack,
                    alloc_index: NO_INDEX,
                    pending: b.pending,
                    small,
                },
            );
        }
        self.model.reset_accumulated_stats();
        self.model.reset_peak_stats();
        let st = self.model.stats();
        for (t, small) in [
            (&mut self.totals.small, true),
            (&mut self.totals.large, false),
        ] {
            let pick = |a: &crate::sim::StatArray| {
                if small {
                    a.small_pool.current
                } else {
                    a.large_pool.current
                }
            };
            t.allocated = pick(&st.allocated_bytes);
            t.active = pick(&st.active_bytes);
            t.requested = pick(&st.requested_bytes);
            t.reserved = pick(&st.reserved_bytes);
        }
        let (s, l) = (self.totals.small, self.totals.large);
        self.totals.all = PoolTotals {
            allocated: s.allocated + l.allocated,
            active: s.active + l.active,
            requested: s.requested + l.requested,
            reserved: s.reserved + l.reserved,
        };
    }

    /// The device replayed.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// The trace replayed (empty for a trace fed while it is read).
    pub fn events(&self) -> &'s [TraceEvent] {
        match self.events {
            Events::Whole(e) => e,
            Events::Window { .. } => &[],
        }
    }

    /// Index of the next event to replay.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Totals after the last event replayed.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The allocator model (segments, stats) after the last event replayed.
    pub fn allocator(&self) -> &Allocator {
        &self.model
    }

    /// The state before the first event (empty when the trace starts at the
    /// allocator's birth).
    pub fn initial_state(&self) -> &InitialState {
        &self.initial
    }

    /// Events the model placed differently from the trace (then the trace
    /// wins): 0 when the model reproduced the run exactly.
    pub fn mismatches(&self) -> u64 {
        self.mismatches
    }

    /// Sizes of the segments (and expandable mappings) the model made, in
    /// order: equal to the trace's `segment_alloc`/`segment_map` sizes when
    /// it reproduces the run.
    pub fn segment_sizes(&self) -> &[u64] {
        &self.segment_sizes
    }

    /// Problems met so far (at most 20).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Blocks live now, by address.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let mut v: Vec<LiveBlock> = self.live.iter().map(live_block).collect();
        v.sort_unstable_by_key(|b| b.addr);
        v
    }

    /// From now on, keeps the blocks live right after the last event
    /// replayed, so that [`Replay::kept_live_blocks`] can give them later
    /// without replaying to here again (the peak's, as the replay finds it).
    pub(crate) fn keep_live_here(&mut self) {
        let index = self.pos.saturating_sub(1) as u32;
        match self.moment.as_mut() {
            Some(m) => {
                m.index = index;
                // Clearing costs the map's capacity even when it is empty.
                if !m.before.is_empty() {
                    m.before.clear();
                }
            }
            None => {
                self.moment = Some(KeptMoment {
                    index,
                    before: HashMap::new(),
                })
            }
        }
    }

    /// The blocks live at the moment [`Replay::keep_live_here`] last marked,
    /// by address (`None` when none was marked).
    pub(crate) fn kept_live_blocks(&self) -> Option<Vec<LiveBlock>> {
        let m = self.moment.as_ref()?;
        let still = self
            .live
            .iter()
            .filter(|(addr, e)| m.was_live(e) && !m.before.contains_key(*addr));
        let mut v: Vec<LiveBlock> = m.before.iter().chain(still).map(live_block).collect();
        v.sort_unstable_by_key(|b| b.addr);
        Some(v)
    }

    /// Segments now, with their blocks (tags are `alloc` event indices).
    pub fn segments(&self) -> Vec<SegmentView> {
        self.model.segments()
    }

    /// Replays the next event; `None` at the end of the trace.
    pub fn step(&mut self) -> Option<Step> {
        let index = self.pos;
        let (event, delta) = self.advance()?;
        Some(Step {
            index,
            event,
            delta,
            totals: self.totals,
        })
    }

    /// Replays the next event; its index and the totals of both pools after
    /// it (`None` at the end of the trace): for loops that read only those
    /// (a peak's search), without copying a whole [`Step`] out per event.
    pub fn step_totals(&mut self) -> Option<(usize, PoolTotals)> {
        let index = self.pos;
        self.advance()?;
        Some((index, self.totals.all))
    }

    /// [`Replay::step`] without building the [`Step`]: loops that only read
    /// the totals skip copying them out for every event.
    #[inline]
    fn advance(&mut self) -> Option<(TraceEvent, Delta)> {
        let index = self.pos;
        let event = *self.events.get(index)?;
        self.pos += 1;
        if let Some(f) = self.fed.as_mut() {
            f.free_of.push(NO_INDEX);
        }
        let delta = match event.action {
            Action::Alloc => self.on_alloc(index, &event),
            Action::FreeRequested => self.on_free_requested(&event),
            Action::FreeCompleted => self.on_free_completed(&event),
            Action::SegmentAlloc | Action::SegmentMap => self.on_reserve(index, &event),
            Action::SegmentFree | Action::SegmentUnmap => self.on_release(index, &event),
            Action::Oom => self.on_oom(&event),
            Action::Snapshot => Delta::None,
        };
        if !is_segment_event(event.action) {
            self.run_frees = 0;
            self.run_frees_oversize = 0;
            if !self.pending.is_empty() {
                // Recorded segments no allocation claimed (a pre-allocated
                // pool, or a model mismatch): keep them as free segments.
                self.flush_pending(&event);
            }
        }
        Some((event, delta))
    }

    /// Replays every remaining event and summarises.
    pub fn run(mut self) -> ReplaySummary {
        let mut peaks = Peaks::new(self.totals.all);
        let mut peak_active = self.totals.all.active;
        let mut peak_req = self.totals.all.requested;
        while self.advance().is_some() {
            let (index, t) = (self.pos - 1, self.totals.all);
            peaks.observe(index, &t);
            peak_active = peak_active.max(t.active);
            peak_req = peak_req.max(t.requested);
        }
        self.check_final_state();
        ReplaySummary {
            device: self.device,
            events: self.events.len(),
            peak_allocated_bytes: peaks.allocated.0,
            peak_allocated_index: peaks.allocated.1,
            peak_reserved_bytes: peaks.reserved.0,
            peak_reserved_index: peaks.reserved.1,
            peak_active_bytes: peak_active,
            peak_requested_bytes: peak_req,
            final_totals: self.totals,
            stats: self.model.stats().clone(),
            starts_at_birth: self.initial.is_empty(),
            mismatches: self.mismatches,
            segment_sizes: self.segment_sizes,
            warnings: self.warnings,
        }
    }

    /// The whole state after the events replayed so far.
    pub fn state_here(&self) -> ReplayState {
        ReplayState {
            index: self.pos.saturating_sub(1),
            totals: self.totals(),
            live: self.live_blocks(),
            segments: self.segments(),
        }
    }

    /// Replays up to and including event `index` (or to the end).
    pub fn run_to(&mut self, index: usize) {
        while self.pos <= index {
            if self.advance().is_none() {
                break;
            }
        }
    }

    fn stream_key(&self, stream: u16) -> u64 {
        // Index 0 is stream 0; an index past the table (cannot come from the
        // reader) reads as stream 0 too, as `Snapshot::stream` does.
        self.streams.get(stream as usize).copied().unwrap_or(0) as u64
    }

    fn pool_for(&self, addr: u64) -> u16 {
        if self.private_ranges.is_empty() {
            return DEFAULT_POOL;
        }
        let i = self.private_ranges.partition_point(|r| r.0 <= addr);
        match i.checked_sub(1).and_then(|i| self.private_ranges.get(i)) {
            Some(&(a, b, pool)) if addr >= a && addr < b => pool,
            _ => DEFAULT_POOL,
        }
    }

    /// The allocation a run of segment events belongs to: the next event
    /// that is not a segment event, if it is an `alloc` or `oom`.
    fn run_target(&self, from: usize) -> Option<&TraceEvent> {
        self.events
            .from(from)
            .iter()
            .find(|e| !is_segment_event(e.action))
            .filter(|e| matches!(e.action, Action::Alloc | Action::Oom))
    }

    fn on_reserve(&mut self, index: usize, e: &TraceEvent) -> Delta {
        let small = match self.run_target(index) {
            Some(t) if t.action == Action::Alloc => {
                is_small(round_size(self.model.config(), t.size))
            }
            Some(t) => is_small(t.size),
            None => e.size == crate::sim::rounding::SMALL_BUFFER,
        };
        if let Some(f) = self.fed.as_mut() {
            match e.action {
                Action::SegmentAlloc => f.segments_made.push(e.addr),
                _ => f.mapped = true,
            }
        }
        self.pending.push_back(PendingOp {
            map: e.action == Action::SegmentMap,
            addr: e.addr,
            size: e.size,
        });
        self.totals.add(small, |t| t.reserved += e.size);
        Delta::Reserve {
            addr: e.addr,
            size: e.size,
            small,
        }
    }

    /// At the first free of a run: would the cache have served the
    /// allocation the run belongs to? Then the run is an `empty_cache()`.
    fn run_is_empty_cache(&self, index: usize) -> bool {
        let ahead = self.events.from(index);
        let run = ahead
            .iter()
            .position(|x| !is_segment_event(x.action))
            .unwrap_or(ahead.len());
        let end = index + run;
        let makes = ahead[..run]
            .iter()
            .any(|x| matches!(x.action, Action::SegmentAlloc | Action::SegmentMap));
        match self.events.get(end) {
            Some(t) if t.action == Action::Oom => false,
            Some(t) if t.action == Action::Alloc && makes => {
                let stream = self.stream_key(t.stream);
                self.model
                    .would_reuse(t.size, stream, self.pool_for(t.addr))
            }
            _ => true,
        }
    }

    fn on_release(&mut self, index: usize, e: &TraceEvent) -> Delta {
        if self.run_frees == 0 {
            self.run_empty_cache = self.run_is_empty_cache(index);
        }
        let small = self
            .model
            .pool_at(e.addr)
            .map_or(e.size == crate::sim::rounding::SMALL_BUFFER, |p| p.0);
        if let Some(f) = self.fed.as_mut() {
            f.mapped |= e.action == Action::SegmentUnmap;
        }
        let mut dev = NullDevice;
        let ok = if e.action == Action::SegmentFree {
            self.model.release_segment_at(e.addr, &mut dev)
        } else {
            self.model.unmap_at(e.addr, e.size, &mut dev)
        };
        if !ok {
            self.mismatches += 1;
            self.warn(format!(
                "{} of {:#x} ({} bytes) does not match the model's free segments",
                e.action.as_str(),
                e.addr,
                e.size
            ));
        }
        self.run_frees += 1;
        if e.size >= self.model.config().max_split() {
            self.run_frees_oversize += 1;
        }
        self.totals
            .add(small, |t| t.reserved = t.reserved.saturating_sub(e.size));
        Delta::Release {
            addr: e.addr,
            size: e.size,
            small,
        }
    }

    fn on_oom(&mut self, e: &TraceEvent) -> Delta {
        // Every OOM comes after `release_cached_blocks` and a retried cudaMalloc.
        self.model.count_retry();
        self.model.count_oom();
        Delta::Oom {
            size: e.size,
            device_free: e.addr,
        }
    }

    fn on_alloc(&mut self, index: usize, e: &TraceEvent) -> Delta {
        if self.run_frees > 0 && !self.pending.is_empty() && !self.run_empty_cache {
            // Segments freed and one made for this allocation: a failed
            // cudaMalloc, a cache flush and a retry. (Freeing only oversize
            // segments is `release_available_cached_blocks`, no retry.)
            let oversize_only = self.model.config().max_split_size.is_some()
                && self.run_frees_oversize == self.run_frees;
            if !oversize_only {
                self.model.count_retry();
            }
        }
        if let Some(old) = self.live.remove(&e.addr) {
            if let Some(m) = self.moment.as_mut() {
                m.keep(e.addr, &old);
            }
            self.warn(format!(
                "alloc at {:#x} while a block there is live; dropping it",
                e.addr
            ));
            self.drop_entry(old);
        }
        let stream = self.stream_key(e.stream);
        let pool = self.pool_for(e.addr);
        let mut pending = std::mem::take(&mut self.pending);
        let mut fake = self.fake_va;
        let mut dev = TraceDevice::new(&mut pending, &mut fake);
        let res = self
            .model
            .malloc(e.size, stream, pool, index as u64, &mut dev);
        let clean = dev.clean();
        let done = std::mem::take(&mut dev.done);
        for (op, _) in &done {
            if let crate::sim::DeviceOp::SegmentAlloc { size, .. }
            | crate::sim::DeviceOp::SegmentMap { size, .. } = op
            {
                self.segment_sizes.push(*size);
            }
        }
        let leftover = dev.unmatched_trace_ops();
        self.fake_va = fake;
        let placed = match res {
            Ok(h) if clean && self.model.block_info(h).is_some_and(|b| b.0 == e.addr) => Some(h),
            _ => {
                self.mismatches += 1;
                self.resync(res.ok(), &done, &leftover, e, index)
            }
        };
        let (size, small) = match placed.and_then(|h| self.model.block_info(h)) {
            // The pool follows the rounded request (1 MiB or less: small).
            Some((_, size, _)) => (size, is_small(round_size(self.model.config(), e.size))),
            None => {
                let size = round_size(self.model.config(), e.size);
                (size, is_small(size))
            }
        };
        self.live.insert(
            e.addr,
            LiveEntry {
                handle: placed,
                size,
                requested: e.size,
                stream: e.stream,
                stack: e.stack,
                alloc_index: index as u32,
                pending: false,
                small,
            },
        );
        self.totals.add(small, |t| {
            t.allocated += size;
            t.active += size;
            t.requested += e.size;
        });
        self.last_alloc_size = size;
        Delta::Alloc {
            addr: e.addr,
            size,
            requested: e.size,
            small,
        }
    }

    /// Makes the model agree with the trace after it placed an allocation
    /// differently: undo what it did, apply what the trace shows, and put the
    /// block where the trace says.
    fn resync(
        &mut self,
        placed: Option<Handle>,
        done: &[(crate::sim::DeviceOp, bool)],
        leftover: &[PendingOp],
        e: &TraceEvent,
        index: usize,
    ) -> Option<Handle> {
        use crate::sim::DeviceOp;
        if let Some(h) = placed {
            self.model.free(h);
        }
        let mut dev = NullDevice;
        let stream = self.stream_key(e.stream);
        let pool = self.pool_for(e.addr);
        let small = is_small(round_size(self.model.config(), e.size));
        for (op, matched) in done.iter().rev() {
            if *matched {
                continue;
            }
            match *op {
                DeviceOp::SegmentAlloc { addr, .. } => {
                    self.model.release_segment_at(addr, &mut dev);
                }
                DeviceOp::SegmentMap { addr, size } => {
                    self.model.unmap_at(addr, size, &mut dev);
                }
                DeviceOp::SegmentFree { addr, size } => {
                    self.model.insert_segment(addr, size, stream, pool, small);
                }
                DeviceOp::SegmentUnmap { addr, size } => {
                    self.model.map_at(addr, size, stream, pool, small, &mut dev);
                }
            }
        }
        for p in leftover {
            if p.map {
                self.model
                    .map_at(p.addr, p.size, stream, pool, small, &mut dev);
            } else {
                self.model
                    .insert_segment(p.addr, p.size, stream, pool, small);
            }
        }
        let h = self.model.alloc_at_request(e.addr, e.size, index as u64);
        if h.is_none() {
            self.warn(format!(
                "alloc #{index} at {:#x}: no free block there in the model; counted, not placed",
                e.addr
            ));
        } else if self.warnings.len() < MAX_WARNINGS {
            self.warn(format!(
                "alloc #{index} at {:#x}: the model placed it elsewhere; following the trace",
                e.addr
            ));
        }
        h
    }

    /// Recorded segments left unclaimed before event `e`: add them as free.
    fn flush_pending(&mut self, e: &TraceEvent) {
        let stream = self.stream_key(e.stream);
        let mut dev = NullDevice;
        for p in std::mem::take(&mut self.pending) {
            let small = p.size == crate::sim::rounding::SMALL_BUFFER;
            if p.map {
                self.model
                    .map_at(p.addr, p.size, stream, DEFAULT_POOL, small, &mut dev);
            } else {
                self.model
                    .insert_segment(p.addr, p.size, stream, DEFAULT_POOL, small);
            }
        }
    }

    fn drop_entry(&mut self, old: LiveEntry) {
        if let Some(h) = old.handle {
            self.model.free(h);
        }
        let (size, req) = (old.size, old.requested);
        let pending = old.pending;
        self.totals.add(old.small, |t| {
            if !pending {
                t.allocated = t.allocated.saturating_sub(size);
            }
            t.active = t.active.saturating_sub(size);
            t.requested = t.requested.saturating_sub(req);
        });
    }

    fn on_free_requested(&mut self, e: &TraceEvent) -> Delta {
        let Some(entry) = self.live.get_mut(&e.addr) else {
            self.warn(format!(
                "free_requested of {:#x}, which is not live",
                e.addr
            ));
            return Delta::None;
        };
        if entry.pending {
            return Delta::None;
        }
        if let Some(m) = self.moment.as_mut() {
            m.keep(e.addr, entry);
        }
        entry.pending = true;
        let (size, small, h, alloc) = (entry.size, entry.small, entry.handle, entry.alloc_index);
        if let Some(h) = h {
            self.model.free_requested(h);
        }
        self.freed_by_this_event(alloc);
        self.totals
            .add(small, |t| t.allocated = t.allocated.saturating_sub(size));
        Delta::FreeRequested {
            addr: e.addr,
            size,
            small,
        }
    }

    fn on_free_completed(&mut self, e: &TraceEvent) -> Delta {
        let Some(entry) = self.live.remove(&e.addr) else {
            self.warn(format!(
                "free_completed of {:#x}, which is not live",
                e.addr
            ));
            return Delta::None;
        };
        if let Some(m) = self.moment.as_mut() {
            m.keep(e.addr, &entry);
        }
        if let Some(h) = entry.handle {
            self.model.free_completed(h);
        }
        let (size, req, small, also) = (entry.size, entry.requested, entry.small, !entry.pending);
        if also {
            self.freed_by_this_event(entry.alloc_index);
        }
        self.totals.add(small, |t| {
            if also {
                t.allocated = t.allocated.saturating_sub(size);
            }
            t.active = t.active.saturating_sub(size);
            t.requested = t.requested.saturating_sub(req);
        });
        Delta::FreeCompleted {
            addr: e.addr,
            size,
            requested: req,
            small,
            also_requested: also,
        }
    }

    /// Compares the end state with the dumped segments.
    fn check_final_state(&mut self) {
        let mut dumped: Vec<SegmentShape> = self
            .snap
            .segments
            .iter()
            .filter(|s| s.device == self.device)
            .map(|s| {
                let blocks = s
                    .blocks
                    .iter()
                    .map(|b| {
                        (
                            b.address,
                            b.size,
                            b.state != crate::snapshot::BlockState::Inactive,
                        )
                    })
                    .collect();
                (s.address, s.total_size, blocks)
            })
            .collect();
        dumped.sort_unstable_by_key(|s| s.0);
        let model: Vec<SegmentShape> = self
            .model
            .segments()
            .into_iter()
            .map(|s| {
                let blocks = s
                    .blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.status != crate::sim::BlockStatus::Free))
                    .collect();
                (s.address, s.total_size, blocks)
            })
            .collect();
        if dumped != model {
            let first = dumped
                .iter()
                .zip(&model)
                .find(|(a, b)| a != b)
                .map_or(dumped.len().min(model.len()) as u64, |(a, _)| a.0);
            self.warn(format!(
                "the replayed end state differs from the dumped segments ({} dumped, {} replayed; first difference near {:#x})",
                dumped.len(),
                model.len(),
                first
            ));
        }
    }
}

/// The outcome of replaying one device's whole trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplaySummary {
    /// Device ordinal.
    pub device: u32,
    /// Events replayed.
    pub events: usize,
    /// The highest allocated bytes (`allocated_bytes.all.peak` over the trace).
    pub peak_allocated_bytes: u64,
    /// The event that reached it (`None`: it was there before the trace).
    pub peak_allocated_index: Option<usize>,
    /// The highest reserved bytes (`reserved_bytes.all.peak` over the trace).
    pub peak_reserved_bytes: u64,
    /// The event that reached it.
    pub peak_reserved_index: Option<usize>,
    /// The highest active bytes.
    pub peak_active_bytes: u64,
    /// The highest requested bytes.
    pub peak_requested_bytes: u64,
    /// Totals after the last event.
    pub final_totals: Totals,
    /// The model's statistics after the last event (counters cover the trace).
    pub stats: MemoryStats,
    /// The trace starts at the allocator's birth, so the peaks are the run's.
    pub starts_at_birth: bool,
    /// Allocations the model placed differently from the trace.
    pub mismatches: u64,
    /// Sizes of the segments (and mappings) the model made, in order.
    pub segment_sizes: Vec<u64>,
    /// Problems met (at most 20).
    pub warnings: Vec<String>,
}

/// Replays one device's whole trace.
pub fn replay_device(snap: &Snapshot, device: u32, opts: &ReplayOptions) -> ReplaySummary {
    Replay::new(snap, device, opts).run()
}

/// Why the allocator gave memory back at some point of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseCause {
    /// The program called `torch.cuda.empty_cache()`.
    EmptyCache,
    /// The allocator freed cached segments itself to make room: a failed
    /// cudaMalloc and retry (or GC, or `release_available_cached_blocks`).
    MakeRoom,
}

/// A run of recorded `segment_free`/`segment_unmap` events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReleaseRun {
    /// Index of the first event of the run.
    pub start: usize,
    /// Index just past the last one.
    pub end: usize,
    /// What caused it.
    pub cause: ReleaseCause,
}

fn is_segment_event(a: Action) -> bool {
    matches!(
        a,
        Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap
    )
}

/// Classifies every run of segment frees in `device`'s trace. The allocator
/// frees segments itself only inside an allocation that the cache could not
/// serve and that then makes a new segment (or fails); anything else is an
/// `empty_cache()` call. Whether the cache could serve the allocation is
/// answered by the replay, in the state just before the frees.
pub fn release_runs(snap: &Snapshot, device: u32, opts: &ReplayOptions) -> Vec<ReleaseRun> {
    let initial = initial::before_trace(snap, device);
    release_runs_from(snap, device, opts, initial)
}

/// [`release_runs`] from a state before the first event already reconstructed.
pub fn release_runs_from(
    snap: &Snapshot,
    device: u32,
    opts: &ReplayOptions,
    initial: InitialState,
) -> Vec<ReleaseRun> {
    let mut runs = observe::ReleaseRuns::new(snap.device_trace(device));
    if runs.any() {
        let r = Replay::from_initial(snap, device, opts, initial);
        observe::observe_replay(r, &mut [&mut runs]);
    }
    runs.into_runs()
}

/// The whole state right after event `index` of a device's trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayState {
    /// The event index (clamped to the last event).
    pub index: usize,
    /// Totals after it.
    pub totals: Totals,
    /// Live blocks by address.
    pub live: Vec<LiveBlock>,
    /// Segments with their blocks.
    pub segments: Vec<SegmentView>,
}

/// Replays `device`'s trace up to and including event `index` and returns the
/// state there.
pub fn state_at(snap: &Snapshot, device: u32, index: usize, opts: &ReplayOptions) -> ReplayState {
    let mut r = Replay::new(snap, device, opts);
    r.run_to(index);
    r.state_here()
}
