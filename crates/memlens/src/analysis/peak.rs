//! `memlens peak`: replays the trace through the allocator model and answers
//! the first question every user asks: what was using the memory at the peak?
//!
//! The replay gives exact block sizes (rounding, unsplit remainders), so the
//! peaks equal `max_memory_allocated()` / `max_memory_reserved()` to the byte.
//! What was live at the allocated peak is grouped by allocation site and
//! category ([`super::categories`]); the trace is also cut into steps
//! ([`super::steps`]) with each step's peak and what it left behind.

use super::categories::Category;
use super::sites::{stack_lines, Site};
use super::steps::StepMethod;
use crate::replay::during_read::{PeakPass, PendingPass, RecordedPasses};
use crate::replay::initial;
use crate::replay::{LiveBlock, Peaks, ReplayOptions};
use crate::snapshot::Snapshot;
use crate::trace::Analysed;
pub use crate::trace::BlockClassifier;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Live memory of one site and category at the peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveSite {
    /// `file:line` of the innermost user frame.
    pub site: String,
    /// The function of that line.
    pub function: String,
    /// The user frames from the entry script down to `site`.
    pub path: Vec<String>,
    /// torch.compile's generated code ran inside the site.
    pub compiled: bool,
    /// The stack of the largest block, innermost first (native frames left
    /// out: [`super::sites::stack_lines`]).
    pub stack: Vec<String>,
    /// The PyTorch operators its native frames name, innermost first
    /// ([`super::sites::native_ops`]; empty without C++ frames).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
    /// That stack's id: the `stack_id` of `memlens export`'s tables (join
    /// `frames` on it).
    pub stack_id: u32,
    /// The `alloc` event of that block (`null`: allocated before the trace
    /// began): `memlens state SNAP --event N` shows the allocator there.
    pub alloc_event: Option<u32>,
    /// Bytes (rounded block sizes).
    pub bytes: u64,
    /// Number of blocks.
    pub count: u64,
    /// What the memory is.
    pub category: Category,
}

/// Bytes of one category at the peak, with the rule that decided it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CategoryShare {
    /// The category.
    pub category: Category,
    /// Bytes at the peak.
    pub bytes: u64,
    /// Blocks at the peak.
    pub count: u64,
    /// How blocks were put in this category.
    pub rule: &'static str,
}

impl CategoryShare {
    /// The category's JSON name.
    pub fn category_name(&self) -> &'static str {
        self.category.as_str()
    }
}

/// One step of the trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPeak {
    /// Step number, from 1.
    pub step: usize,
    /// First event of the step.
    pub start_event: usize,
    /// Highest allocated bytes during the step.
    pub peak_allocated_bytes: u64,
    /// Highest reserved bytes during the step.
    pub peak_reserved_bytes: u64,
    /// Allocated bytes when the step ended (what it left behind).
    pub retained_bytes: u64,
}

/// Peaks of one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DevicePeak {
    /// Device ordinal.
    pub device: u32,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
}

/// The peak report (of the device with the highest allocated peak).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakReport {
    /// The device reported on.
    pub device: u32,
    /// Peak of allocated bytes (`allocated_bytes.all.peak`).
    pub peak_allocated_bytes: u64,
    /// Peak of reserved bytes (`reserved_bytes.all.peak`).
    pub peak_reserved_bytes: u64,
    /// Event index of the allocated peak (`null` when the peak is the initial state).
    pub peak_event_index: Option<usize>,
    /// Time of the allocated peak, epoch microseconds.
    pub peak_time_us: Option<i64>,
    /// Event index of the reserved peak.
    pub peak_reserved_event_index: Option<usize>,
    /// Time of the reserved peak.
    pub peak_reserved_time_us: Option<i64>,
    /// What was live at the allocated peak, by site and category, largest first.
    pub live_at_peak: Vec<LiveSite>,
    /// Sites not listed in `live_at_peak` (beyond `--top`).
    pub other_sites: usize,
    /// Bytes by category at the peak.
    pub categories: BTreeMap<String, u64>,
    /// Categories with counts and the rule behind each.
    pub category_detail: Vec<CategoryShare>,
    /// Steps found in the trace.
    pub steps: Vec<StepPeak>,
    /// How steps were found.
    pub step_method: StepMethod,
    /// Number of steps found (1: one step recorded, no growth verdicts).
    pub step_count: usize,
    /// Every device's peaks.
    pub devices: Vec<DevicePeak>,
    /// Caveats (ring buffer, replay mismatches).
    pub warnings: Vec<String>,
}

/// The peak's caveat on a trace that began late, before its cause; `check`
/// puts its own words there.
pub(crate) const LATE_PEAKS: &str = "peaks are over the recorded window: ";

/// Replays every device and reports the peak of the one with the highest.
pub fn peak(snap: &Snapshot, top: usize) -> PeakReport {
    peak_analysed(&Analysed::new(snap), top)
}

/// [`peak`] of an analysed snapshot.
pub fn peak_analysed(an: &Analysed, top: usize) -> PeakReport {
    peak_and_live(an, top).0
}

/// The blocks live at a trace's allocated peak, as the peak's replay found
/// them: what a later analysis of the peak (doctor's module tree) borrows
/// instead of replaying the trace again.
#[derive(Clone, Debug, Default)]
pub struct LiveAtPeak {
    /// The trace (index into [`Snapshot::traces`]).
    pub trace: usize,
    /// The live blocks right after the peak event, pending frees included.
    pub blocks: Vec<crate::replay::LiveBlock>,
    /// Bytes allocated right after the peak event.
    pub allocated: u64,
}

/// [`peak_analysed`], with the blocks live at the reported peak (`None` for a
/// snapshot without a trace).
pub fn peak_and_live(an: &Analysed, top: usize) -> (PeakReport, Option<LiveAtPeak>) {
    peak_and_live_later(an.snap, &an, top)
}

/// Where the peak finds the analysed trace (at hand, or still being built
/// on another thread) and the one replay of each trace. The replay needs
/// the analysed trace only for the step starts and for naming what is live
/// at the peak, so it runs without waiting for it.
pub trait AnalysedSource<'s>: Sync {
    /// The analysed trace, waiting for it.
    fn wait(&self) -> &Analysed<'s>;
    /// The one replay of each trace under its recorded settings (it does
    /// not wait for the analysed trace).
    fn recorded(&self) -> &RecordedPasses;
}

impl<'s> AnalysedSource<'s> for &Analysed<'s> {
    fn wait(&self) -> &Analysed<'s> {
        self
    }
    fn recorded(&self) -> &RecordedPasses {
        Analysed::recorded(self)
    }
}

/// The analysed traces of the snapshots of one command, each built at most
/// once, by whoever needs it first (`doctor`, then the report it writes).
pub struct AnalysedSet<'s> {
    snaps: Vec<&'s Snapshot>,
    cells: Vec<AnalysedLater<'s>>,
}

impl<'s> AnalysedSet<'s> {
    /// A set for `snaps`, none analysed yet.
    pub fn new(snaps: &[(String, &'s Snapshot)]) -> AnalysedSet<'s> {
        AnalysedSet::with_passes(snaps, Vec::new())
    }

    /// A set for `snaps` read with their traces replayed beside the reader:
    /// `passes[i]` is the replay of `snaps[i]` (missing ones: none).
    pub fn with_passes(
        snaps: &[(String, &'s Snapshot)],
        passes: Vec<Option<Arc<PendingPass>>>,
    ) -> AnalysedSet<'s> {
        let mut passes = passes.into_iter();
        AnalysedSet {
            snaps: snaps.iter().map(|(_, s)| *s).collect(),
            cells: snaps
                .iter()
                .map(|_| AnalysedLater::with_pass(passes.next().flatten()))
                .collect(),
        }
    }

    /// The replay beside the reader of `snap`, running or done.
    pub fn pending(&self, snap: &'s Snapshot) -> Option<&PendingPass> {
        self.later(snap)?.pending()
    }

    /// The replay beside the reader of `snap`, once done (`None`: not one
    /// of the set's, or not read that way).
    pub fn fed_pass(&self, snap: &'s Snapshot) -> Option<&PeakPass> {
        self.later(snap)?.recorded.fed()
    }

    /// The lazily built analysed trace of `snap` (one of the set's, else a
    /// fresh one of its own).
    pub fn later(&self, snap: &'s Snapshot) -> Option<&AnalysedLater<'s>> {
        let i = self.snaps.iter().position(|s| std::ptr::eq(*s, snap))?;
        self.cells.get(i)
    }

    /// The analysed trace of `snap`, built now if nobody has yet; `None` for
    /// a snapshot not of the set.
    pub fn get(&self, snap: &'s Snapshot) -> Option<&Analysed<'s>> {
        Some(self.later(snap)?.build(snap))
    }
}

/// An analysed trace that one thread builds while another (the peak's
/// replay) may wait for it. If building it panics, the waiter panics too
/// instead of waiting forever.
#[derive(Default)]
pub struct AnalysedLater<'s> {
    cell: std::sync::OnceLock<Analysed<'s>>,
    /// `None` while it is being built, then whether it was.
    outcome: std::sync::Mutex<Option<bool>>,
    /// Wakes the waiters once `outcome` is set.
    settled: std::sync::Condvar,
    /// The one replay of each trace of the snapshot (beside the reader, if
    /// it was read so).
    recorded: Arc<RecordedPasses>,
}

impl<'s> AnalysedLater<'s> {
    /// An analysed trace yet to be built.
    pub fn new() -> AnalysedLater<'s> {
        AnalysedLater::default()
    }

    /// An analysed trace yet to be built, of a snapshot whose trace was
    /// replayed beside the reader (`fed`).
    pub fn with_pass(fed: Option<Arc<PendingPass>>) -> AnalysedLater<'s> {
        AnalysedLater {
            recorded: Arc::new(RecordedPasses::new(fed)),
            ..AnalysedLater::default()
        }
    }

    /// The replay beside the reader of the snapshot, running or done.
    pub fn pending(&self) -> Option<&PendingPass> {
        self.recorded.pending()
    }

    /// Builds the analysed trace of `snap` (once) and hands it to waiters.
    pub fn build(&self, snap: &'s Snapshot) -> &Analysed<'s> {
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.cell
                .get_or_init(|| Analysed::with_recorded(snap, Arc::clone(&self.recorded)))
        }));
        self.settle(built.is_ok());
        built.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    fn settle(&self, built: bool) {
        // The lock is never held across a panic; a poisoned one still holds
        // a valid `Option<bool>`.
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        *outcome = Some(built);
        self.settled.notify_all();
    }
}

impl<'s> AnalysedSource<'s> for AnalysedLater<'s> {
    fn recorded(&self) -> &RecordedPasses {
        &self.recorded
    }
    fn wait(&self) -> &Analysed<'s> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        while outcome.is_none() {
            outcome = self
                .settled
                .wait(outcome)
                .unwrap_or_else(|p| p.into_inner());
        }
        match self.cell.get() {
            Some(an) => an,
            None => panic!("the analysed trace this replay waits for was not built"),
        }
    }
}

/// [`peak_and_live`] of `snap`, whose analysed trace `an` may still be in the
/// making on another thread (doctor builds it beside this replay).
pub fn peak_and_live_later<'s>(
    snap: &'s Snapshot,
    an: &impl AnalysedSource<'s>,
    top: usize,
) -> (PeakReport, Option<LiveAtPeak>) {
    let mut reports: Vec<(PeakReport, LiveAtPeak)> = snap
        .traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.events.is_empty())
        .map(|(i, _)| peak_of_trace(snap, an, i, top))
        .collect();
    let devices: Vec<DevicePeak> = reports
        .iter()
        .map(|(r, _)| DevicePeak {
            device: r.device,
            peak_allocated_bytes: r.peak_allocated_bytes,
            peak_reserved_bytes: r.peak_reserved_bytes,
        })
        .collect();
    reports.sort_by_key(|(r, _)| std::cmp::Reverse(r.peak_allocated_bytes));
    match reports.into_iter().next() {
        Some((mut best, live)) => {
            best.devices = devices;
            (best, Some(live))
        }
        None => {
            let mut best = empty(an.wait(), top);
            best.devices = devices;
            (best, None)
        }
    }
}

/// The report of a snapshot without a trace (legacy formats, or history not
/// recorded): the figures at dump time, and what its blocks hold by site.
fn empty(an: &Analysed, top: usize) -> PeakReport {
    let snap = an.snap;
    let s = super::summary::summarize(snap);
    let blocks = snap
        .segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| b.state == crate::snapshot::BlockState::ActiveAllocated)
        .map(|b| {
            let cat = an
                .phases
                .classify_block(b.stack, an.phases.of(b.stack), None, true);
            (an.sites.describe(b.stack), cat, b.stack, None, b.size)
        });
    let groups = group(snap, blocks, top);
    PeakReport {
        device: s.devices.first().copied().unwrap_or(0),
        peak_allocated_bytes: s.allocated_bytes,
        peak_reserved_bytes: s.reserved_bytes,
        peak_event_index: None,
        peak_time_us: None,
        peak_reserved_event_index: None,
        peak_reserved_time_us: None,
        // Read before the sites move out of `groups`.
        categories: groups.category_bytes(),
        category_detail: groups.category_detail(),
        live_at_peak: groups.sites,
        other_sites: groups.other_sites,
        steps: Vec::new(),
        step_method: StepMethod::None,
        step_count: 1,
        devices: Vec::new(),
        warnings: vec![
            "the snapshot has no trace: these are the figures at dump time, not peaks".into(),
        ],
    }
}

/// Live memory grouped by site and category.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveGroups {
    /// The largest groups, largest first.
    pub sites: Vec<LiveSite>,
    /// Groups left out (beyond `top`).
    pub other_sites: usize,
    /// Bytes and blocks by category.
    pub categories: BTreeMap<Category, (u64, u64)>,
}

impl LiveGroups {
    /// Categories with their bytes, counts and the rule behind each.
    pub fn category_detail(&self) -> Vec<CategoryShare> {
        self.categories
            .iter()
            .map(|(c, v)| CategoryShare {
                category: *c,
                bytes: v.0,
                count: v.1,
                rule: c.rule(),
            })
            .collect()
    }

    /// Bytes by category, keyed by the categories' JSON names.
    pub fn category_bytes(&self) -> BTreeMap<String, u64> {
        self.categories
            .iter()
            .map(|(c, v)| (c.as_str().to_string(), v.0))
            .collect()
    }
}

/// Groups the blocks `live` (pending frees left out) of trace `classifier`
/// by allocation site and category, keeping the `top` largest groups.
pub fn group_live(
    an: &Analysed,
    classifier: &BlockClassifier,
    live: &[LiveBlock],
    top: usize,
) -> LiveGroups {
    let trace = classifier.facts().trace;
    let blocks = live.iter().filter(|b| !b.pending_free).map(|b| {
        let (cat, _) = classifier.classify(b.alloc_index, b.stack);
        let site = an.block_site(trace, b.alloc_index, b.stack);
        (site, cat, b.stack, b.alloc_index, b.size)
    });
    group(an.snap, blocks, top)
}

/// A block to group: its site, category, stack, `alloc` event and bytes.
type Grouped = (Site, Category, crate::snapshot::StackId, Option<u32>, u64);

/// Groups blocks by site and category, keeping the `top` largest groups;
/// each group shows the stack and `alloc` event of its largest block.
fn group(snap: &Snapshot, blocks: impl Iterator<Item = Grouped>, top: usize) -> LiveGroups {
    // Each group with the size of its largest block so far.
    let mut groups: HashMap<(Site, Category), (LiveSite, u64)> = HashMap::new();
    let mut cats: BTreeMap<Category, (u64, u64)> = BTreeMap::new();
    for (site, cat, stack, alloc_event, size) in blocks {
        let (e, largest) = groups.entry((site.clone(), cat)).or_insert_with(|| {
            let live = LiveSite {
                site: site.site,
                function: site.function,
                path: site.path,
                compiled: site.compiled,
                stack: Vec::new(),
                ops: Vec::new(),
                stack_id: stack,
                alloc_event,
                bytes: 0,
                count: 0,
                category: cat,
            };
            (live, 0)
        });
        if size > *largest {
            *largest = size;
            e.stack_id = stack;
            e.alloc_event = alloc_event;
        }
        e.bytes += size;
        e.count += 1;
        let c = cats.entry(cat).or_default();
        c.0 += size;
        c.1 += 1;
    }
    let mut sites: Vec<LiveSite> = groups
        .into_values()
        .map(|(mut live, _)| {
            live.stack = stack_lines(snap, live.stack_id);
            live.ops = super::sites::native_ops(snap, live.stack_id);
            live
        })
        .collect();
    // The category breaks the last ties: a site's rows of one size in two
    // categories came out of the map in any order.
    sites.sort_by(|a, b| {
        (b.bytes, &a.site, &a.path, a.category).cmp(&(a.bytes, &b.site, &b.path, b.category))
    });
    let other_sites = sites.len().saturating_sub(top);
    sites.truncate(top);
    LiveGroups {
        sites,
        other_sites,
        categories: cats,
    }
}

/// Each step's peaks and what it left, from the totals after each event.
struct StepTracker {
    peaks: Vec<StepPeak>,
    current: StepPeak,
    last_allocated: u64,
}

impl StepTracker {
    fn new(start_allocated: u64, start_reserved: u64) -> StepTracker {
        StepTracker {
            peaks: Vec::new(),
            current: StepPeak {
                step: 1,
                start_event: 0,
                peak_allocated_bytes: start_allocated,
                peak_reserved_bytes: start_reserved,
                retained_bytes: start_allocated,
            },
            last_allocated: start_allocated,
        }
    }

    /// The totals after event `index`; `starts` are the steps' first events.
    fn observe(&mut self, starts: &[usize], index: usize, allocated: u64, reserved: u64) {
        let next = self.peaks.len() + 1;
        if next < starts.len() && index == starts[next] {
            self.current.retained_bytes = self.last_allocated;
            self.peaks.push(self.current.clone());
            self.current = StepPeak {
                step: next + 1,
                start_event: index,
                peak_allocated_bytes: self.last_allocated,
                peak_reserved_bytes: 0,
                retained_bytes: 0,
            };
        }
        let c = &mut self.current;
        c.peak_allocated_bytes = c.peak_allocated_bytes.max(allocated);
        c.peak_reserved_bytes = c.peak_reserved_bytes.max(reserved);
        self.last_allocated = allocated;
    }

    fn finish(mut self) -> Vec<StepPeak> {
        self.current.retained_bytes = self.last_allocated;
        self.peaks.push(self.current);
        self.peaks
    }
}

/// What [`StepTracker`] gives from a trace that starts empty, step by step
/// over whole ranges instead of event by event: the maximum of a slice of
/// allocated bytes, the reserved bytes' changes within the step. `None` when
/// `starts` are not strictly increasing from 0 and within the trace (then
/// the tracker's event-by-event rules apply).
fn step_peaks_of_ranges(
    allocated: &[u64],
    reserved: &[(usize, u64)],
    starts: &[usize],
) -> Option<Vec<StepPeak>> {
    let n = allocated.len();
    let ordered = starts.first() == Some(&0)
        && starts.windows(2).all(|w| w[0] < w[1])
        && starts.last().is_some_and(|&s| s < n);
    if !ordered {
        return None;
    }
    let mut peaks = Vec::with_capacity(starts.len());
    for (k, &a) in starts.iter().enumerate() {
        let b = starts.get(k + 1).copied().unwrap_or(n);
        // Allocated before the step's first event (0 before the trace).
        let before = a.checked_sub(1).map_or(0, |i| allocated[i]);
        let peak_allocated = allocated[a..b].iter().copied().fold(before, u64::max);
        // Reserved at the first event (the last change at or before it),
        // then every change inside the step.
        let first = reserved.partition_point(|&(at, _)| at <= a);
        let at_start = first.checked_sub(1).map_or(0, |i| reserved[i].1);
        let peak_reserved = reserved[first..]
            .iter()
            .take_while(|&&(at, _)| at < b)
            .map(|&(_, r)| r)
            .fold(at_start, u64::max);
        peaks.push(StepPeak {
            step: k + 1,
            start_event: a,
            peak_allocated_bytes: peak_allocated,
            peak_reserved_bytes: peak_reserved,
            retained_bytes: allocated[b - 1],
        });
    }
    Some(peaks)
}

/// The step table without the teardown after the loop: when the trace does
/// not end with a whole step and what follows the last one never allocated
/// above what the last step left (it only freed: the model and the data
/// dropped), it is not a step (issue 31: `gpt2_train` showed a "step 7" of
/// 1.40 GiB after its six steps). A partial step cut by an OOM or by the
/// dump allocates, and stays.
fn without_teardown(mut peaks: Vec<StepPeak>, last_complete: bool) -> Vec<StepPeak> {
    let n = peaks.len();
    if !last_complete && n > 1 && peaks[n - 1].peak_allocated_bytes <= peaks[n - 2].retained_bytes {
        peaks.pop();
    }
    peaks
}

/// What pass 1 of the peak's replay found.
struct FirstPass {
    peaks: Peaks,
    warnings: Vec<String>,
}

/// The peaks (allocated, reserved bytes) of the device with the highest
/// allocated peak, without the sites: from the replay beside the reader when
/// it covered the snapshot's one trace (no replay, no analysed trace), else
/// from [`peak`].
pub fn peak_totals(snap: &Snapshot, fed: Option<&PeakPass>) -> (u64, u64) {
    let mut traced = snap.traces.iter().filter(|t| !t.events.is_empty());
    if let (Some(t), None, Some(p)) = (traced.next(), traced.next(), fed) {
        let initial = initial::before_trace_with(snap, t.device, Some(p));
        if p.fits(snap, t.device, &initial, &ReplayOptions::default()) {
            return (p.peaks.allocated.0, p.peaks.reserved.0);
        }
    }
    let r = peak(snap, 0);
    (r.peak_allocated_bytes, r.peak_reserved_bytes)
}

fn peak_of_trace<'s>(
    snap: &'s Snapshot,
    source: &impl AnalysedSource<'s>,
    trace: usize,
    top: usize,
) -> (PeakReport, LiveAtPeak) {
    let t = &snap.traces[trace];
    // The one replay of the trace under its recorded settings: made while
    // the file was read, if it was read that way and its guesses held,
    // else now (beside the analysed trace's building). It kept the blocks
    // live at the peak as it went past it: no second replay to the peak.
    let p = source.recorded().of(snap, trace);
    let first = FirstPass {
        peaks: p.peaks,
        warnings: p.warnings(snap),
    };
    let live = (p.live_at_peak().to_vec(), p.peaks.allocated.0);
    let an = source.wait();
    let starts = &an.traces[trace].steps.starts;
    let start = p.watched.start;
    let from_empty = start.allocated == 0 && start.reserved == 0;
    let step_peaks = from_empty
        .then(|| step_peaks_of_ranges(p.allocated(), p.reserved_changes(), starts))
        .flatten()
        .unwrap_or_else(|| {
            let mut tracker = StepTracker::new(start.allocated, start.reserved);
            for (index, (allocated, reserved)) in p.totals().enumerate() {
                tracker.observe(starts, index, allocated, reserved);
            }
            tracker.finish()
        });
    let mut first = first;
    // A trace with no allocations (only the dump's `snapshot` or an `oom`
    // entry) is no window at all: the reader already says the figures are
    // the dump's.
    if !p.watched.from_empty && snap.has_allocation_trace() {
        first.warnings.push(initial::late_start(&format!(
            "peaks are over the recorded window: {}",
            initial::late_start_cause(snap.recording.as_ref())
        )));
    }
    let (live, allocated_at_peak) = live;
    let st = &an.traces[trace].steps;
    let (pa, pa_i) = first.peaks.allocated;
    let (pr, pr_i) = first.peaks.reserved;
    let warnings = first.warnings;
    let groups = an
        .classifier(trace)
        .map(|c| group_live(an, &c, &live, top))
        .unwrap_or_default();
    let time = |i: Option<usize>| i.and_then(|i| t.events.get(i)).map(|e| e.time_us);
    let steps = if st.len() > 1 {
        without_teardown(step_peaks, st.last_complete)
    } else {
        Vec::new()
    };
    let report = PeakReport {
        device: t.device,
        peak_allocated_bytes: pa,
        peak_reserved_bytes: pr,
        peak_event_index: pa_i,
        peak_time_us: time(pa_i),
        peak_reserved_event_index: pr_i,
        peak_reserved_time_us: time(pr_i),
        // Read before the sites move out of `groups`.
        categories: groups.category_bytes(),
        category_detail: groups.category_detail(),
        live_at_peak: groups.sites,
        other_sites: groups.other_sites,
        // The teardown after the loop is not a step.
        step_count: if steps.is_empty() {
            st.len()
        } else {
            steps.len()
        },
        steps,
        step_method: st.method,
        devices: Vec::new(),
        warnings,
    };
    let live = LiveAtPeak {
        trace,
        blocks: live,
        allocated: allocated_at_peak,
    };
    (report, live)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Step peaks over ranges equal the tracker's, event by event, on
    /// random totals and random step starts.
    #[test]
    fn step_peaks_of_ranges_equal_the_trackers() {
        let mut raw = crate::test_support::xorshift(0x2545_F491_4F6C_DD1D);
        let mut next = move |m: u64| raw() % m;
        for round in 0..300 {
            let n = 1 + next(200) as usize;
            let allocated: Vec<u64> = (0..n).map(|_| next(1000)).collect();
            let mut reserved = Vec::new();
            let mut last = None;
            for i in 0..n {
                let r = if next(4) == 0 || last.is_none() {
                    next(2000)
                } else {
                    last.unwrap_or(0)
                };
                if last != Some(r) {
                    reserved.push((i, r));
                    last = Some(r);
                }
            }
            let mut starts = vec![0];
            for i in 1..n {
                if next(1 + round % 20) == 0 {
                    starts.push(i);
                }
            }
            let mut tracker = StepTracker::new(0, 0);
            let mut r = 0;
            let mut changes = reserved.iter().peekable();
            for (i, &a) in allocated.iter().enumerate() {
                while let Some(&&(at, v)) = changes.peek() {
                    if at > i {
                        break;
                    }
                    r = v;
                    changes.next();
                }
                tracker.observe(&starts, i, a, r);
            }
            let ranges = step_peaks_of_ranges(&allocated, &reserved, &starts);
            assert_eq!(ranges, Some(tracker.finish()), "round {round}");
        }
        // Starts the ranges cannot take are left to the tracker.
        assert_eq!(step_peaks_of_ranges(&[1, 2], &[(0, 5)], &[0, 2]), None);
        assert_eq!(step_peaks_of_ranges(&[1, 2], &[(0, 5)], &[0, 1, 1]), None);
        assert_eq!(step_peaks_of_ranges(&[], &[], &[0]), None);
    }
}
