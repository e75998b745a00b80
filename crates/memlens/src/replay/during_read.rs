//! The one replay of a trace under its recorded settings, run while the
//! snapshot is still being read when it can be.
//!
//! Every analysis that needs the allocator's state over time (the peak, the
//! state an OOM met, where `empty_cache()` was called, the report's timeline,
//! moments and segment maps) reads one replay of the trace
//! ([`RecordedPasses`], held by the analysed trace) through what a
//! [`super::watch::Watch`] kept in it. Replaying costs ~60-100 ns an event,
//! yet a snapshot's trace comes before the end of the file, and a trace
//! recorded from the start of the process begins from an empty allocator:
//! then nothing about the replay needs the rest of the file. So the reader
//! hands each batch of events, as it decodes them, to a thread that replays
//! them at once (the reader on one core, the model on another).
//!
//! Whether that guess held is known only at the end: the replay assumed an
//! empty allocator before the trace, PyTorch's default settings and no
//! private pools. [`PeakPass::fits`] checks each against the snapshot as read;
//! when one fails (a ring buffer that wrapped, settings of its own), the
//! trace is replayed once after the read ([`PeakPass::after_read`]). The
//! result is the same either way (`tests/peak.rs` and `tests/watch.rs`
//! compare both on every snapshot). The snapshot itself stays plain data:
//! [`load`] gives the replay beside it ([`ReadWithPass`]).

use super::config::recorded_config;
use super::initial::InitialState;
use super::observe::StateThen;
use super::watch::{Watch, Watched};
use super::{start_warnings, FedFacts, LiveBlock, Peaks, Replay, ReplayOptions, ReplayState};
use crate::sim::{AllocatorConfig, DeviceLimits};
use crate::snapshot::{
    AllocatorSettings, BlockState, DeviceTrace, EventSink, Snapshot, TraceEvent,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

/// The one replay of a trace under its recorded settings and what it kept
/// ([`Watched`]): made beside the reader ([`load`]) when the trace could be
/// replayed so, else after the read ([`PeakPass::after_read`]).
pub struct PeakPass {
    /// The device whose trace it is.
    pub device: u32,
    /// Events replayed (the whole trace).
    pub events: usize,
    /// The settings it was replayed under.
    pub config: AllocatorConfig,
    /// The peaks and the events after which they were reached.
    pub peaks: Peaks,
    /// What the replay kept for the analyses.
    pub watched: Watched,
    /// The blocks live at the allocated peak, by address (kept as the replay
    /// went past it: no second replay to the peak).
    live_at_peak: Vec<LiveBlock>,
    /// Each alloc's free (shared with the analysed trace); only a replay
    /// beside the reader pairs them.
    free_of: Arc<Vec<u32>>,
    /// The address of every `segment_alloc`, sorted (beside the reader).
    segments_made: Vec<u64>,
    /// Whether any segment was mapped or unmapped.
    mapped: bool,
    /// The addresses of the blocks live after the last event, sorted.
    live_at_end: Vec<u64>,
    /// Replayed beside the reader, from an empty allocator.
    fed: bool,
    /// The state before the first event it replayed from.
    initial: Arc<InitialState>,
    /// The replay's warnings (after the read; one beside the reader has none).
    warnings: Vec<String>,
}

impl std::fmt::Debug for PeakPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeakPass")
            .field("device", &self.device)
            .field("events", &self.events)
            .field("peaks", &self.peaks)
            .finish_non_exhaustive()
    }
}

impl PeakPass {
    /// Whether this pass is the first pass of replaying `device`'s trace in
    /// `snap` from `initial` under `opts`: same trace, an empty state before
    /// it, the settings it assumed, no private pools.
    pub fn fits(
        &self,
        snap: &Snapshot,
        device: u32,
        initial: &InitialState,
        opts: &ReplayOptions,
    ) -> bool {
        self.fed
            && self.device == device
            && self.events == snap.device_trace(device).len()
            && initial.is_empty()
            && opts.config.is_none()
            && opts.limits == DeviceLimits::default()
            && recorded_config(&snap.settings) == self.config
            && !snap
                .segments
                .iter()
                .any(|s| s.device == device && s.pool_id != (0, 0))
    }

    /// Whether this pass went through the whole of `trace`. A pass is kept
    /// only when its replay gave no warning, so then every `free_requested`
    /// of the trace found its block live: none lacks its allocation.
    pub fn replayed(&self, trace: &DeviceTrace) -> bool {
        self.fed && self.device == trace.device && self.events == trace.events.len()
    }

    /// The blocks live at the allocated peak, by address.
    pub fn live_at_peak(&self) -> &[LiveBlock] {
        &self.live_at_peak
    }

    /// Allocated and reserved bytes after each event, in order.
    pub fn totals(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.watched.totals()
    }

    /// For each `alloc` event of the trace, the index of its first free
    /// (`u32::MAX`: never); the same as
    /// [`crate::analysis::categories::free_index_of_allocs`] of the trace
    /// this pass [`replayed`](PeakPass::replayed): both pair a free with the
    /// last `alloc` at its address, and a warning-free replay met no free
    /// without one and no `alloc` over a live block.
    pub fn free_of(&self) -> &Arc<Vec<u32>> {
        &self.free_of
    }

    /// Whether this pass shows that `device`'s allocator held nothing when
    /// its trace began, so that [`super::initial::reconstruct`] would give
    /// the empty state without undoing the trace. Undone from the dumped
    /// state, an address ends up live before the trace unless its first
    /// event is its `alloc` (a segment's: its `segment_alloc`), and a
    /// dumped block or segment with no event stays. A pass replayed from
    /// an empty allocator without a warning met no free of a block or
    /// segment that was not there, so every address's first event made it;
    /// what is left is that every dumped block is one the replay left live
    /// and every dumped segment one the trace made. Mapped ranges
    /// (expandable segments) are not judged: `false`, and the state is
    /// reconstructed.
    pub fn starts_empty(&self, snap: &Snapshot, device: u32) -> bool {
        self.fed
            && self.device == device
            && self.events == snap.device_trace(device).len()
            && !self.mapped
            && snap
                .segments
                .iter()
                .filter(|s| s.device == device)
                .all(|s| {
                    !s.is_expandable
                        && self.segments_made.binary_search(&s.address).is_ok()
                        && s.blocks
                            .iter()
                            .filter(|b| b.state != BlockState::Inactive)
                            .all(|b| self.live_at_end.binary_search(&b.address).is_ok())
                })
    }

    /// The addresses of the blocks live after the last event, sorted.
    pub fn live_at_end(&self) -> &[u64] {
        &self.live_at_end
    }

    /// Allocated bytes after each event, in order.
    pub fn allocated(&self) -> &[u64] {
        &self.watched.allocated
    }

    /// Reserved bytes as (event, bytes from that event on), one entry per
    /// change, in order.
    pub fn reserved_changes(&self) -> &[(usize, u64)] {
        &self.watched.reserved
    }

    /// The replay's warnings as a replay of `snap` gives them (a pass beside
    /// the reader is kept only when the trace itself gave none).
    pub fn warnings(&self, snap: &Snapshot) -> Vec<String> {
        if self.fed {
            start_warnings(snap)
        } else {
            self.warnings.clone()
        }
    }

    /// The state before the first event the replay began from (empty for
    /// one beside the reader).
    pub fn initial(&self) -> &Arc<InitialState> {
        &self.initial
    }

    /// The state right before OOM event `index` as a replay of `snap` met
    /// it, if the replay kept it.
    pub fn before_oom(&self, snap: &Snapshot, index: usize) -> Option<StateThen> {
        let mut st = self.watched.before_oom(index)?.state.clone();
        if self.fed {
            st.warnings = start_warnings(snap);
        }
        Some(st)
    }

    /// The state right after the allocated peak's event (`None`: the peak
    /// is before the first event, or its segments were not kept).
    pub fn at_peak(&self) -> Option<ReplayState> {
        let index = self.peaks.allocated.1?;
        let (segments, totals) = self.watched.at_peak.clone()?;
        Some(ReplayState {
            index,
            totals,
            live: self.live_at_peak.clone(),
            segments,
        })
    }

    /// Replays `device`'s trace in `snap` once under its recorded settings
    /// from `initial` (the state before it), keeping what the analyses need.
    pub fn after_read(snap: &Snapshot, device: u32, initial: InitialState) -> PeakPass {
        let opts = ReplayOptions::default();
        let kept = Arc::new(initial.clone());
        let mut r = Replay::from_initial(snap, device, &opts, initial);
        let mut watch = Watch::new(&r);
        watch.replay_ready(&mut r);
        let watched = watch.finish(&r);
        let live_at_peak = r
            .kept_live_blocks()
            .unwrap_or_else(|| watched.start_live.clone());
        let live_at_end = r.live_blocks().iter().map(|b| b.addr).collect();
        PeakPass {
            device,
            events: r.position(),
            config: recorded_config(&snap.settings),
            peaks: watched.peaks,
            watched,
            live_at_peak,
            free_of: Arc::new(Vec::new()),
            segments_made: Vec::new(),
            mapped: false,
            live_at_end,
            fed: false,
            initial: kept,
            warnings: r.warnings().to_vec(),
        }
    }
}

/// The peak's first pass of a snapshot read with [`load`]: still running
/// beside the analyses when the file has been read, or done. Whoever needs it
/// first waits for it ([`PendingPass::get`]); the analyses that do not (the
/// analysed trace, the leak search) start at once, on the core the reader
/// leaves free.
pub struct PendingPass {
    /// The replaying thread, until someone has waited for it.
    worker: Mutex<Option<JoinHandle<Option<PeakPass>>>>,
    /// Its pass, once waited for (`None`: the trace could not be replayed
    /// that way).
    done: OnceLock<Option<Arc<PeakPass>>>,
}

impl PendingPass {
    fn running(worker: JoinHandle<Option<PeakPass>>) -> PendingPass {
        PendingPass {
            worker: Mutex::new(Some(worker)),
            done: OnceLock::new(),
        }
    }

    /// The pass, once the replaying thread has finished (it waits for it).
    pub fn get(&self) -> Option<&PeakPass> {
        self.get_shared().map(|p| &**p)
    }

    /// [`PendingPass::get`], shared.
    pub fn get_shared(&self) -> Option<&Arc<PeakPass>> {
        self.done
            .get_or_init(|| {
                let worker = self.worker.lock().ok().and_then(|mut w| w.take());
                // A replay that panicked only costs the shortcut.
                worker.and_then(|w| w.join().ok().flatten().map(Arc::new))
            })
            .as_ref()
    }
}

impl std::fmt::Debug for PendingPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.done.get() {
            Some(pass) => f.debug_tuple("PendingPass").field(pass).finish(),
            None => f.write_str("PendingPass(running)"),
        }
    }
}

/// The one replay of each trace of a snapshot under its recorded settings:
/// the replay beside the reader where it went through the trace, else one
/// after the read, made once by whoever asks first and shared by every
/// analysis after (the peak, the OOM's state, `empty_cache()` points, the
/// report's views).
#[derive(Debug, Default)]
pub struct RecordedPasses {
    fed: Option<Arc<PendingPass>>,
    done: Mutex<HashMap<usize, Arc<PeakPass>>>,
}

impl RecordedPasses {
    /// The passes of a snapshot whose trace was replayed beside the reader
    /// (`fed`; `None`: read without).
    pub fn new(fed: Option<Arc<PendingPass>>) -> RecordedPasses {
        RecordedPasses {
            fed,
            done: Mutex::default(),
        }
    }

    /// The replay beside the reader, running or done.
    pub fn pending(&self) -> Option<&PendingPass> {
        self.fed.as_deref()
    }

    /// The replay beside the reader, once done (this waits for it).
    pub fn fed(&self) -> Option<&PeakPass> {
        self.pending().and_then(PendingPass::get)
    }

    /// The one replay of trace `trace` of `snap` (the snapshot these passes
    /// are of) under its recorded settings.
    pub fn of(&self, snap: &Snapshot, trace: usize) -> Arc<PeakPass> {
        // Held while the replay runs: a second asker waits for the first.
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = done.get(&trace) {
            return Arc::clone(p);
        }
        let device = snap.traces.get(trace).map_or(0, |t| t.device);
        let fed = self.pending().and_then(PendingPass::get_shared);
        let initial = super::initial::before_trace_with(snap, device, fed.map(|p| &**p));
        let pass = match fed.filter(|p| p.fits(snap, device, &initial, &ReplayOptions::default())) {
            Some(p) => Arc::clone(p),
            None => Arc::new(PeakPass::after_read(snap, device, initial)),
        };
        done.insert(trace, Arc::clone(&pass));
        pass
    }

    /// [`RecordedPasses::of`] the trace of `device` (`None`: it has none).
    pub fn of_device(&self, snap: &Snapshot, device: u32) -> Option<Arc<PeakPass>> {
        let trace = snap
            .traces
            .iter()
            .position(|t| t.device == device && !t.events.is_empty())?;
        Some(self.of(snap, trace))
    }
}

/// A snapshot read with its trace replayed beside the reader ([`load`]).
/// The snapshot is plain data; the pass goes to whoever analyses it
/// ([`crate::analysis::peak::AnalysedSet::with_passes`]).
#[derive(Debug)]
pub struct ReadWithPass {
    /// The snapshot as read.
    pub snap: Snapshot,
    /// The replay beside the reader, still running or done (`None`: the
    /// file was read without it: a single core, or no thread to spare).
    pub pass: Option<Arc<PendingPass>>,
}

/// Reads the snapshot at `path` while a second thread replays its trace as
/// it arrives; the pass beside the snapshot is that replay's first pass when
/// the trace could be replayed that way. The replay may still be running
/// when this returns: the model costs more an event than the reader, and
/// what it has left overlaps the analyses that do not need it.
pub fn load(path: &Path) -> crate::Result<ReadWithPass> {
    // Batches in flight: the reader runs ahead of the model by at most this
    // many (4,096 events each, 64 MB in all). The model is about a third
    // slower than the reader, so this lets the reader finish a snapshot of a
    // few hundred MB without waiting, and bounds the copies on larger ones.
    const QUEUE: usize = 512;
    let plain = |path: &Path| Snapshot::load(path).map(|snap| ReadWithPass { snap, pass: None });
    // With one core the replay would only slow the reader down.
    if std::thread::available_parallelism().map_or(true, |n| n.get() < 2) {
        return plain(path);
    }
    let config = recorded_config(&AllocatorSettings::default());
    let (tx, rx) = sync_channel(QUEUE);
    let gave_up = Arc::new(AtomicBool::new(false));
    let told = Arc::clone(&gave_up);
    let spawned = std::thread::Builder::new()
        .name("memlens-peak".into())
        .spawn(move || replay_arriving(rx, config, &told));
    let Ok(worker) = spawned else {
        return plain(path);
    };
    let sink = Channel {
        tx,
        streams: 0,
        gave_up,
    };
    // The reader drops its end of the channel when it is done: the worker
    // then finishes what it has and ends.
    let snap = crate::snapshot::build::load_path_into(path, Box::new(sink))?;
    Ok(ReadWithPass {
        snap,
        pass: Some(Arc::new(PendingPass::running(worker))),
    })
}

/// [`load`] for several files in parallel (one rayon task a file), in the
/// order given, calling `done` as each is read (a progress bar). Every file
/// of a run is replayed beside its reading: the report's overview and the
/// ranks need each one's peak.
pub fn load_many<P: AsRef<Path> + Sync>(
    paths: &[P],
    done: impl Fn() + Sync,
) -> Vec<crate::Result<ReadWithPass>> {
    use rayon::prelude::*;
    paths
        .par_iter()
        .map(|p| {
            let r = load(p.as_ref());
            done();
            r
        })
        .collect()
}

/// What the reader hands the replaying thread.
enum Arrived {
    /// The raw streams named so far.
    Streams(Vec<i64>),
    /// Events `first..` of the trace.
    Events {
        first: usize,
        events: Vec<TraceEvent>,
    },
    /// Every event read became `device`'s trace, `events` of them.
    Whole { device: u32, events: usize },
}

/// The reader's end of the channel.
struct Channel {
    tx: SyncSender<Arrived>,
    streams: usize,
    /// Set by the replaying thread when it gives up: the reader stops
    /// copying batches for it.
    gave_up: Arc<AtomicBool>,
}

impl EventSink for Channel {
    fn events(&mut self, first: usize, events: &[TraceEvent], streams: &[i64]) {
        if self.gave_up.load(Ordering::Relaxed) {
            return;
        }
        // A send fails only when the worker is gone; the peak then replays
        // as before, so there is nothing to report here.
        if streams.len() > self.streams {
            self.streams = streams.len();
            let _ = self.tx.send(Arrived::Streams(streams.to_vec()));
        }
        let _ = self.tx.send(Arrived::Events {
            first,
            events: events.to_vec(),
        });
    }

    fn whole_trace(&mut self, device: u32, events: usize) {
        let _ = self.tx.send(Arrived::Whole { device, events });
    }
}

/// Replays events as they arrive; the first pass, if the events arrived in
/// one piece and formed one device's whole trace. It gives up at the first
/// warning: a block freed that was never allocated, a segment that is not
/// where the model put it, mean the allocator was not empty when the trace
/// began (or the model disagrees with it), and the peak will replay the
/// trace from the state it reconstructs.
fn replay_arriving(
    rx: Receiver<Arrived>,
    config: AllocatorConfig,
    gave_up: &AtomicBool,
) -> Option<PeakPass> {
    let mut r = Replay::fed(config.clone());
    let mut received = 0;
    let mut in_order = true;
    let mut whole = None;
    let mut watch = Watch::new(&r);
    for arrived in rx {
        match arrived {
            Arrived::Streams(s) => r.set_streams(s),
            // Taken (the reader must not block on what was on the way) and dropped.
            Arrived::Events { .. } if gave_up.load(Ordering::Relaxed) => {}
            Arrived::Events { first, events } => {
                in_order &= first == received;
                received += events.len();
                r.feed(events);
                watch.replay_ready(&mut r);
                r.drop_replayed();
                if !r.warnings().is_empty() {
                    // Tell the reader to stop sending, and drop the figures.
                    gave_up.store(true, Ordering::Relaxed);
                    watch.clear();
                }
            }
            Arrived::Whole { device, events } => whole = Some((device, events)),
        }
    }
    if gave_up.load(Ordering::Relaxed) {
        return None;
    }
    r.close();
    watch.replay_ready(&mut r);
    let (device, events) = whole?;
    let complete = in_order && events == received && r.position() == received;
    if !complete || !r.warnings().is_empty() {
        return None;
    }
    crate::work::note_replay(true);
    let watched = watch.finish(&r);
    let FedFacts {
        free_of,
        segments_made,
        mapped,
        live_at_end,
    } = r.take_fed_facts();
    Some(PeakPass {
        device,
        events,
        config,
        peaks: watched.peaks,
        // No event above the start: what was live before the first (nothing).
        live_at_peak: r.kept_live_blocks().unwrap_or_default(),
        watched,
        free_of: Arc::new(free_of),
        segments_made,
        mapped,
        live_at_end,
        fed: true,
        initial: Arc::default(),
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The real snapshots of `../shared/fixtures` and `tests/corpus`.
    fn snapshots() -> Vec<PathBuf> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let fixtures = std::env::var("MEMLENS_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("../../../shared/fixtures"));
        let mut files = Vec::new();
        for dir in [fixtures, root.join("../../tests/corpus")] {
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
            for e in entries.flatten() {
                let p = e.path();
                if p.to_string_lossy().ends_with(".pickle.zst") {
                    files.push(p);
                }
            }
        }
        files.sort();
        files
    }

    /// Feeds `events` in batches of 1 to 37 events (a segment event often
    /// ends a batch, so its look-ahead waits for the next one).
    fn fed_in_pieces(events: &[TraceEvent], streams: &[i64], device: u32) -> Option<PeakPass> {
        let (tx, rx) = sync_channel(events.len() + 2);
        let mut sink = Channel {
            tx,
            streams: 0,
            gave_up: Arc::new(AtomicBool::new(false)),
        };
        let (mut at, mut k) = (0, 0usize);
        while at < events.len() {
            k = (k * 7 + 3) % 37;
            let end = (at + k + 1).min(events.len());
            sink.events(at, &events[at..end], streams);
            at = end;
        }
        sink.whole_trace(device, events.len());
        drop(sink);
        replay_arriving(
            rx,
            recorded_config(&AllocatorSettings::default()),
            &AtomicBool::new(false),
        )
    }

    #[test]
    fn a_trace_fed_in_pieces_replays_as_the_whole_trace() {
        let mut compared = 0;
        for path in snapshots() {
            let snap = Snapshot::load(&path).unwrap_or_else(|e| panic!("{e}"));
            let Some(ti) = snap.traces.iter().position(|t| !t.events.is_empty()) else {
                continue;
            };
            let t = &snap.traces[ti];
            let pass = fed_in_pieces(&t.events, &snap.streams, t.device);
            let opts = ReplayOptions {
                config: Some(recorded_config(&AllocatorSettings::default())),
                limits: DeviceLimits::default(),
            };
            let mut whole = Replay::from_initial(&snap, t.device, &opts, InitialState::default());
            let mut totals = Vec::new();
            while let Some((_, a)) = whole.step_totals() {
                totals.push((a.allocated, a.reserved));
            }
            // Given up exactly when the replay from an empty allocator warns.
            let Some(pass) = pass else {
                assert!(!whole.warnings().is_empty(), "{}", path.display());
                continue;
            };
            assert!(whole.warnings().is_empty(), "{}", path.display());
            let fed: Vec<(u64, u64)> = pass.totals().collect();
            assert_eq!(fed, totals, "{}", path.display());
            // Each alloc's free, as the analysed trace would pair them.
            assert!(pass.replayed(t));
            assert_eq!(
                **pass.free_of(),
                crate::analysis::categories::free_index_of_allocs(&snap, ti),
                "{}",
                path.display()
            );
            let mut to_peak = Replay::from_initial(&snap, t.device, &opts, InitialState::default());
            if let Some(i) = pass.peaks.allocated.1 {
                to_peak.run_to(i);
            }
            assert_eq!(
                pass.live_at_peak(),
                to_peak.live_blocks(),
                "{}",
                path.display()
            );
            compared += 1;
        }
        assert!(compared >= 20, "only {compared} traces compared");
    }

    #[test]
    fn a_pass_fits_only_the_trace_it_replayed() {
        let path = snapshots()
            .into_iter()
            .find(|p| p.ends_with("gpt2_train.pickle.zst"))
            .expect("gpt2_train fixture");
        let read = load(&path).expect("loads");
        let snap = read.snap;
        let pass = read.pass.as_deref().and_then(PendingPass::get);
        let pass = pass.expect("replayed while read");
        let t = &snap.traces[0];
        let initial = super::super::initial::reconstruct(&snap, t.device, &t.events);
        let opts = ReplayOptions::default();
        assert!(pass.fits(&snap, t.device, &initial, &opts));
        assert!(!pass.fits(&snap, t.device + 1, &initial, &opts));
        let other = ReplayOptions {
            config: Some(AllocatorConfig::default()),
            ..ReplayOptions::default()
        };
        assert!(!pass.fits(&snap, t.device, &initial, &other));
        let mut cut = snap.clone();
        cut.traces[0].events.pop();
        assert!(!pass.fits(&cut, t.device, &initial, &opts));
    }
}
