//! Filling a [`ReportData`] from the snapshots of a run and their
//! [`Diagnosis`] (what `memlens doctor` and `memlens report` write).
//!
//! The diagnosis gives the findings, the peak, the leaks and the tune table;
//! this module adds what only a page needs, all from the one replay of the
//! trace the analysed trace holds (no replay of its own): the timeline
//! (a walk tracking the bytes of the top sites), the flame graph of the
//! blocks live at the peak, the moments and the segment map at the OOM or
//! the peak (states that replay kept). The result is not bounded yet: call
//! [`ReportData::bounded`].

use super::convert::{python_stack_labels, segment_map, settings_pairs};
use super::flame::FlameBuilder;
use super::model::{
    BlockSite, BlockState, Category, LeakSite, Leaks, Meta, RanksView, ReportData, SegmentBlock,
    SegmentMap, SegmentRow, Stat, Timeline, TimelineSite, Tune, TuneRow, XUnit,
};
use super::timeline::{TimelineBuilder, TimelinePoint, DEFAULT_MAX_POINTS};
use crate::analysis::leaks::Confidence;
use crate::analysis::peak::AnalysedSet;
use crate::analysis::sites::{Site, SiteIndex};
use crate::doctor::Diagnosis;
use crate::replay::during_read::PeakPass;
use crate::replay::{ReplayOptions, ReplayState};
use crate::sim::BlockStatus;
use crate::snapshot::{Snapshot, StackId};
use crate::trace::Analysed;
use hashbrown::HashMap;

/// Sites drawn as their own band in the timeline; the rest are "other".
pub const TIMELINE_TOP_SITES: usize = 8;

/// Builds the report of a run: `snaps` oldest first, as given to
/// [`crate::doctor::diagnose`], and their diagnosis. The last snapshot is the one
/// whose timeline, peak and segments are shown.
pub fn from_diagnosis(snaps: &[(String, &Snapshot)], d: &Diagnosis) -> ReportData {
    from_diagnosis_in(&AnalysedSet::new(snaps), snaps, d)
}

/// [`from_diagnosis`] with the analysed traces `doctor` built in `set`.
pub fn from_diagnosis_in<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    d: &Diagnosis,
) -> ReportData {
    let ranks = super::ranks::ranks_view(set, snaps, d);
    from_diagnosis_with_ranks(set, snaps, d, ranks)
}

/// [`from_diagnosis_in`] with the ranks section made beforehand: a job read
/// rank by rank ([`crate::job`]) holds only its main rank's snapshots in
/// `snaps`.
pub fn from_diagnosis_with_ranks<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    d: &Diagnosis,
    ranks: Option<RanksView>,
) -> ReportData {
    let mut meta = meta(snaps, d);
    let has_ranks = ranks.is_some();
    if let Some(r) = &ranks {
        meta.title = ranks_title(r);
    }
    let mut data = ReportData {
        meta,
        findings: d.findings.clone(),
        leaks: leaks(d),
        tune: tune(d),
        oom: super::views::oom_view(d),
        // Ranks run side by side, not one after another: the ranks section
        // compares them, and a table of growth "since the previous" rank
        // would read as time.
        overview: ranks
            .is_none()
            .then(|| super::views::overview(set, snaps, d))
            .flatten(),
        ranks,
        shown_file: (snaps.len() > 1 || has_ranks)
            .then(|| d.files.last().cloned())
            .flatten(),
        ..ReportData::default()
    };
    let Some(snap) = shown_snapshot(snaps, d) else {
        return data;
    };
    let own;
    let an = match set.get(snap) {
        Some(an) => an,
        None => {
            own = Analysed::new(snap);
            &own
        }
    };
    let index = &an.sites;
    let site_category = SiteCategories::of_peak(d);
    let category_of = |site: &str| site_category.of(site);

    let device = d.peak.device;
    let trace = shown_trace(snap, device);
    let events = trace.map(|t| snap.traces[t].events.as_slice());
    let (Some(events), Some(trace)) = (events, trace) else {
        // No trace of allocations (none, or only a `snapshot` or `oom`
        // entry, as PyTorch 2.0 kept): what the dump holds.
        data.flame = Some(flame_of_dump(snap));
        data.segments = Some(segment_map(
            snap,
            &snap.segments,
            "at dump time",
            |s| Some(Site::of(snap, index, s).site),
            |s| category_of(&Site::of(snap, index, s).site),
        ));
        return data;
    };
    let views = observe_views(
        snap,
        d,
        &ViewInput {
            an,
            trace,
            device,
            events,
            category_of: &category_of,
        },
    );
    data.timeline = Some(views.timeline);
    data.flame = views
        .peak_state
        .as_ref()
        .map(|st| peak_flame(snap, an, trace, st));
    data.moments = Some(views.moments);
    data.segment_timeline = Some(views.segment_timeline);
    let (state, when, state_events) = match (views.oom_state, views.peak_state) {
        (Some((i, st, ev)), _) => (Some(st), format!("at the OOM (event {i})"), ev),
        (None, Some(st)) => {
            let w = format!("at the peak (event {})", st.index);
            (Some(st), w, events)
        }
        (None, None) => (None, String::new(), events),
    };
    if let Some(st) = state {
        data.segments = Some(segments_of_state(
            snap,
            state_events,
            &st,
            &when,
            index,
            &category_of,
        ));
    }
    data
}

/// The snapshot the diagnosis's peak describes, whose timeline, flame graph
/// and segments the page shows: with several ranks or runs, not necessarily
/// the last given.
pub(super) fn shown_snapshot<'s>(
    snaps: &[(String, &'s Snapshot)],
    d: &Diagnosis,
) -> Option<&'s Snapshot> {
    d.files
        .last()
        .and_then(|f| snaps.iter().find(|(n, _)| n == f))
        .or(snaps.last())
        .map(|(_, s)| *s)
}

/// The trace of `device` in `snap` the page draws (one with allocations).
pub(super) fn shown_trace(snap: &Snapshot, device: u32) -> Option<usize> {
    snap.traces
        .iter()
        .position(|t| t.device == device && t.has_allocations())
}

/// The category of each site, from what was live at the peak (the largest
/// group of the site wins); blocks of other sites are "other".
pub(super) struct SiteCategories(HashMap<String, (u64, Category)>);

impl SiteCategories {
    /// The categories of the sites live at `d`'s peak.
    pub(super) fn of_peak(d: &Diagnosis) -> SiteCategories {
        let mut site_category: HashMap<String, (u64, Category)> = HashMap::default();
        for l in &d.peak.live_at_peak {
            let e = site_category
                .entry(l.site.clone())
                .or_insert((0, l.category));
            if l.bytes > e.0 {
                *e = (l.bytes, l.category);
            }
        }
        SiteCategories(site_category)
    }

    /// The category of `site`.
    pub(super) fn of(&self, site: &str) -> Category {
        self.0.get(site).map_or(Category::Other, |e| e.1)
    }
}

/// What the report draws from the trace of the shown device.
struct ViewInput<'a> {
    an: &'a Analysed<'a>,
    trace: usize,
    device: u32,
    events: &'a [crate::snapshot::TraceEvent],
    category_of: &'a (dyn Fn(&str) -> Category + Sync),
}

/// What the one replay of the shown trace gives the report.
struct Views<'s> {
    timeline: Timeline,
    peak_state: Option<ReplayState>,
    moments: super::moments::Moments,
    segment_timeline: super::segment_timeline::SegmentTimeline,
    /// The OOM the diagnosis explains: its event, the state right after it
    /// and the events of its trace (its device's, which may not be the
    /// shown one).
    oom_state: Option<(usize, ReplayState, &'s [crate::snapshot::TraceEvent])>,
}

/// The page's views of the shown trace, from the one replay of it under its
/// recorded settings that the analysed trace holds: the timeline and the
/// moments are walks over the events with the totals and block sizes it
/// kept, the segment maps its states at the peak, the OOM and spaced events.
/// A state it did not keep (an OOM past the first ones, a peak reached in
/// too many small steps) is replayed to, and so is an OOM on another device.
fn observe_views<'s>(snap: &'s Snapshot, d: &Diagnosis, inp: &ViewInput<'s>) -> Views<'s> {
    let pass = inp.an.recorded().of(snap, inp.trace);
    let peak_index = d.peak.peak_event_index;
    // The OOM `memlens oom` and doctor explain, as the diagnosis chose it.
    let oom = d.oom.as_ref().map(|o| (o.device, o.event_index));
    let oom_here = oom.filter(|&(dev, _)| dev == inp.device).map(|(_, i)| i);
    let kept_peak = peak_index.and_then(|i| pass.at_peak().filter(|s| s.index == i));
    let kept_oom = oom_here.and_then(|i| {
        pass.watched.before_oom(i).map(|m| ReplayState {
            index: i,
            totals: m.totals,
            live: m.state.live.clone(),
            segments: m.state.segments.clone(),
        })
    });
    let (peak_state, oom_state_here) = states_not_kept(
        snap,
        inp.device,
        (peak_index, kept_peak),
        (oom_here, kept_oom),
    );
    let moment_input = super::moments::MomentInput {
        an: inp.an,
        trace: inp.trace,
        events: inp.events,
        must: peak_state.iter().chain(oom_state_here.iter()).collect(),
        category_of: inp.category_of,
        index: &inp.an.sites,
    };
    // Three walks over the same events, each on its own: the moments on one
    // core, the timeline and the segments' lifetimes on the other.
    let (moments, (timeline, segment_timeline)) = rayon::join(
        || super::moments::moments_of_pass(snap, &moment_input, &pass),
        || {
            let mut timeline =
                TimelineWalk::new(snap, d, (inp.an, inp.trace), inp.category_of, inp.events);
            timeline.walk(inp.events, &pass);
            let segments = super::segment_timeline::segment_timeline(pass.initial(), inp.events);
            (timeline.finish(), segments)
        },
    );
    let oom_state = match (oom, oom_state_here) {
        (Some((_, i)), Some(st)) => Some((i, st, inp.events)),
        (Some((dev, i)), None) if dev != inp.device => {
            let st = crate::replay::state_at(snap, dev, i, &ReplayOptions::default());
            Some((i, st, snap.device_trace(dev)))
        }
        _ => None,
    };
    Views {
        timeline,
        peak_state,
        moments,
        segment_timeline,
        oom_state,
    }
}

/// The states at the peak and the OOM (each an event, and the state if the
/// one replay kept it), replaying once to those it did not keep.
fn states_not_kept(
    snap: &Snapshot,
    device: u32,
    (peak, kept_peak): (Option<usize>, Option<ReplayState>),
    (oom, kept_oom): (Option<usize>, Option<ReplayState>),
) -> (Option<ReplayState>, Option<ReplayState>) {
    use crate::replay::observe::{observe, Observer, StateAfter};
    let mut at_peak = peak.filter(|_| kept_peak.is_none()).map(StateAfter::new);
    let mut at_oom = oom.filter(|_| kept_oom.is_none()).map(StateAfter::new);
    if at_peak.is_some() || at_oom.is_some() {
        let mut observers: Vec<&mut dyn Observer> = Vec::new();
        observers.extend(at_peak.as_mut().map(|o| o as &mut dyn Observer));
        observers.extend(at_oom.as_mut().map(|o| o as &mut dyn Observer));
        observe(snap, device, &ReplayOptions::default(), &mut observers);
    }
    (
        kept_peak.or_else(|| at_peak.and_then(StateAfter::into_state)),
        kept_oom.or_else(|| at_oom.and_then(StateAfter::into_state)),
    )
}

/// The file name of a path as the user gave it (either separator).
fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// The title of a job's ranks: the file name with its rank written as `*`
/// (`ddp_ema.rank*.pickle.zst`), and how many ranks; no one rank's name.
fn ranks_title(r: &RanksView) -> String {
    let first = r
        .ranks
        .first()
        .map(|l| file_name(&l.file))
        .unwrap_or_default();
    // The part that differs between the ranks' names is the rank.
    let job = match r.ranks.get(1).map(|l| file_name(&l.file)) {
        Some(second) => {
            let (a, b): (Vec<char>, Vec<char>) =
                (first.chars().collect(), second.chars().collect());
            let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let tail = a
                .iter()
                .rev()
                .zip(b.iter().rev())
                .take_while(|(x, y)| x == y)
                .count()
                .min(a.len() - head);
            let (start, end): (String, String) = (
                a[..head].iter().collect(),
                a[a.len() - tail..].iter().collect(),
            );
            format!("{start}*{end}")
        }
        None => first.to_string(),
    };
    format!("memlens report: {job}, {} ranks", r.ranks.len())
}

fn meta(snaps: &[(String, &Snapshot)], d: &Diagnosis) -> Meta {
    let files: Vec<String> = snaps.iter().map(|(n, _)| n.clone()).collect();
    let last = files.last().map_or("", |f| file_name(f));
    let mut m = Meta::now(files.clone());
    m.title = if last.is_empty() {
        "memlens report".into()
    } else {
        format!("memlens report: {last}")
    };
    m.device = Some(format!("cuda:{}", d.peak.device));
    m.verdict = d.verdict();
    if let Some((_, s)) = snaps.last() {
        m.settings = settings_pairs(&s.settings);
    }
    let bytes = |label: &str, b: u64| Stat {
        label: label.into(),
        bytes: Some(b),
        text: None,
    };
    m.stats = vec![
        bytes("peak allocated", d.peak.peak_allocated_bytes),
        bytes("peak reserved", d.peak.peak_reserved_bytes),
        bytes("reserved at dump", d.summary.reserved_bytes),
        Stat {
            label: "trace events".into(),
            bytes: None,
            text: Some(crate::units::group_digits(d.summary.trace_events)),
        },
    ];
    if d.peak.steps.len() > 1 {
        m.stats.push(Stat {
            label: "steps".into(),
            bytes: None,
            text: Some(d.peak.steps.len().to_string()),
        });
    }
    m.notes = d.peak.warnings.clone();
    m.notes.extend(d.summary.warnings.iter().cloned());
    m
}

/// The leak candidates `doctor` would report (medium confidence or more):
/// charts of weak candidates would alarm more than they inform.
fn leaks(d: &Diagnosis) -> Option<Leaks> {
    let first = d
        .leaks
        .leaks
        .iter()
        .find(|l| l.confidence >= Confidence::Medium)?;
    let points = first.evidence_labels.clone();
    let sites: Vec<LeakSite> = d
        .leaks
        .leaks
        .iter()
        .filter(|l| l.confidence >= Confidence::Medium)
        .filter(|l| l.evidence.len() == points.len() && l.evidence.len() > 1)
        .take(12)
        .map(|l| LeakSite {
            site: l.site.clone(),
            function: l.function.clone(),
            stack: l.stack.clone(),
            bytes: l.evidence.clone(),
            bytes_per_step: i64::try_from(l.bytes_per_step).unwrap_or(i64::MAX),
            confidence: match l.confidence {
                Confidence::High => "high",
                Confidence::Medium => "medium",
                Confidence::Low => "low",
            }
            .into(),
            suggestion: Some(l.suggestion.clone()),
            held_by: l.quote.holders.iter().map(|h| h.describe()).collect(),
            kept_by: l
                .quote
                .keeper
                .as_ref()
                .map(|k| format!("{}:{}: {}", k.line.path, k.line.line, k.line.text.trim())),
        })
        .collect();
    if sites.is_empty() {
        return None;
    }
    let x_label = if d.leaks.method == "across_snapshots" {
        "snapshot"
    } else {
        "step"
    };
    Some(Leaks {
        x_label: x_label.into(),
        points,
        sites,
    })
}

fn tune(d: &Diagnosis) -> Option<Tune> {
    let t = d.tune.as_ref()?;
    let current = t
        .candidates
        .iter()
        .find(|c| c.recorded)
        .map(|c| c.peak_reserved_bytes);
    let rows: Vec<TuneRow> = t
        .candidates
        .iter()
        .map(|c| TuneRow {
            config: c.config.clone(),
            peak_reserved_bytes: c.peak_reserved_bytes,
            num_ooms: c.num_ooms,
            num_device_alloc: None,
            num_alloc_retries: Some(c.num_alloc_retries),
            delta_bytes: current.map_or(0, |cur| {
                i64::try_from(c.peak_reserved_bytes).unwrap_or(i64::MAX)
                    - i64::try_from(cur).unwrap_or(i64::MAX)
            }),
            current: c.recorded,
        })
        .collect();
    (!rows.is_empty()).then_some(Tune {
        device_memory: None,
        rows,
    })
}

/// The timeline: the totals after each event and the bytes of the top sites
/// of the peak, each in its band.
struct TimelineWalk<'a> {
    snap: &'a Snapshot,
    an: &'a Analysed<'a>,
    trace: usize,
    sites: Vec<TimelineSite>,
    /// The band of a stack, and whether its blocks may belong to a
    /// pseudo-site (no stack: the backward pass or before recording) that the
    /// peak lists under its own name: those are placed block by block, as the
    /// peak does, so that their band holds their bytes rather than "other
    /// sites".
    band_of_stack: HashMap<StackId, (Option<usize>, bool)>,
    time: bool,
    bands: Vec<u64>,
    peaks: Vec<u64>,
    /// Live blocks by address: size, band, whether their free was requested.
    live: HashMap<u64, (u64, Option<usize>, bool)>,
    keep: Option<usize>,
    builder: TimelineBuilder,
}

impl<'a> TimelineWalk<'a> {
    fn new(
        snap: &'a Snapshot,
        d: &Diagnosis,
        (an, trace): (&'a Analysed<'a>, usize),
        category_of: &dyn Fn(&str) -> Category,
        events: &[crate::snapshot::TraceEvent],
    ) -> TimelineWalk<'a> {
        let mut sites: Vec<TimelineSite> = Vec::new();
        for l in &d.peak.live_at_peak {
            if sites.len() == TIMELINE_TOP_SITES {
                break;
            }
            if !sites.iter().any(|s| s.site == l.site) {
                sites.push(TimelineSite {
                    site: l.site.clone(),
                    function: l.function.clone(),
                    // The peak's stack lines, as the report draws stacks.
                    stack: l.stack.clone(),
                    category: category_of(&l.site),
                    peak_bytes: 0,
                });
            }
        }
        let time = events.last().is_some_and(|e| e.time_us != 0);
        let builder = TimelineBuilder::new(
            if time { XUnit::TimeUs } else { XUnit::Event },
            sites.clone(),
            events.len() as u64,
            DEFAULT_MAX_POINTS,
        );
        TimelineWalk {
            snap,
            an,
            trace,
            bands: vec![0; sites.len()],
            peaks: vec![0; sites.len()],
            sites,
            band_of_stack: HashMap::default(),
            time,
            live: HashMap::default(),
            keep: d.peak.peak_event_index,
            builder,
        }
    }

    /// The band of an allocation with `stack` at event `alloc`.
    fn band_of(&mut self, stack: StackId, alloc: usize) -> Option<usize> {
        let (snap, an, sites) = (self.snap, self.an, &self.sites);
        let (band, no_stack) = *self.band_of_stack.entry(stack).or_insert_with(|| {
            let site = Site::of(snap, &an.sites, stack).site;
            (
                sites.iter().position(|s| s.site == site),
                site == crate::analysis::sites::NO_STACK,
            )
        });
        let alloc = u32::try_from(alloc).ok();
        let facts = an.trace(self.trace);
        if no_stack || facts.is_some_and(|f| f.is_cublas_workspace(alloc)) {
            let site = an.block_site(self.trace, alloc, stack).site;
            return sites.iter().position(|s| s.site == site);
        }
        band
    }

    fn finish(self) -> Timeline {
        let mut t = self.builder.finish();
        for (s, p) in t.sites.iter_mut().zip(self.peaks) {
            s.peak_bytes = p;
        }
        // The analysis' peak event wins over the first highest point kept.
        if let Some(k) = self.keep {
            if let Some(j) = t.event.iter().position(|&e| e == k as u64) {
                t.peak = Some(j);
            }
        }
        t
    }
}

impl TimelineWalk<'_> {
    /// Walks `events` with the totals and block sizes `pass` kept: each
    /// allocation joins its band, and leaves it at the first free of its
    /// address. The live blocks are followed as the replay followed them,
    /// so that a block whose free was requested but not completed counts
    /// as active (`active_bytes`) until it is.
    fn walk(&mut self, events: &[crate::snapshot::TraceEvent], pass: &PeakPass) {
        use crate::snapshot::Action;
        let mut pending: u64 = 0;
        // The blocks live before the trace join the band of the site the
        // peak names them by (their stack's, or `<allocated before recording
        // started>`), not "other sites".
        for b in &pass.watched.start_live {
            let site = self.an.block_site(self.trace, b.alloc_index, b.stack).site;
            let k = self.sites.iter().position(|s| s.site == site);
            if b.pending_free {
                pending += b.size;
            } else if let Some(k) = k {
                self.bands[k] = self.bands[k].saturating_add(b.size);
                self.peaks[k] = self.peaks[k].max(self.bands[k]);
            }
            self.live.insert(b.addr, (b.size, k, b.pending_free));
        }
        let mut sizes = pass.watched.block_sizes(&pass.config);
        for ((index, e), (allocated, reserved)) in events.iter().enumerate().zip(pass.totals()) {
            match e.action {
                Action::Alloc => {
                    let size = sizes.at(index, e);
                    let k = self.band_of(e.stack, index);
                    if let Some(k) = k {
                        self.bands[k] = self.bands[k].saturating_add(size);
                        self.peaks[k] = self.peaks[k].max(self.bands[k]);
                    }
                    self.live.insert(e.addr, (size, k, false));
                }
                Action::FreeRequested => {
                    if let Some((size, k, was_pending)) = self.live.get_mut(&e.addr) {
                        if !*was_pending {
                            *was_pending = true;
                            pending += *size;
                            if let Some(k) = *k {
                                self.bands[k] = self.bands[k].saturating_sub(*size);
                            }
                        }
                    }
                }
                Action::FreeCompleted => {
                    if let Some((size, k, was_pending)) = self.live.remove(&e.addr) {
                        if was_pending {
                            pending = pending.saturating_sub(size);
                        } else if let Some(k) = k {
                            self.bands[k] = self.bands[k].saturating_sub(size);
                        }
                    }
                }
                _ => {}
            }
            self.builder.push(TimelinePoint {
                x: if self.time { e.time_us } else { index as i64 },
                event: index as u64,
                allocated,
                reserved,
                active: Some(allocated + pending),
                bands: &self.bands,
                // Marked where the program met an OOM, not where PyTorch
                // caught one itself (a cuDNN workspace given up).
                oom: self.snap.is_oom_failure(e),
                keep: self.keep == Some(index),
            });
        }
    }
}

/// The flame graph of every block live at the peak (the replay's exact
/// state), titled as the page titles a clicked moment.
fn peak_flame(
    snap: &Snapshot,
    an: &Analysed<'_>,
    trace: usize,
    st: &ReplayState,
) -> crate::report::Flame {
    state_flame(snap, an, trace, st, " (the peak)")
}

/// The flame graph of every block live in a replayed state, titled as the
/// page titles a clicked moment (`why` follows the event: " (the peak)").
pub(super) fn state_flame(
    snap: &Snapshot,
    an: &Analysed<'_>,
    trace: usize,
    st: &ReplayState,
    why: &str,
) -> crate::report::Flame {
    let mut fb = FlameBuilder::new(format!(
        "live at event {}{why}",
        crate::units::group_digits(st.index as u64)
    ));
    for b in st.live.iter().filter(|b| !b.pending_free) {
        fb.add_innermost_first(&block_labels(snap, an, trace, b), b.size);
    }
    fb.finish()
}

/// The frames a live block is drawn under: its Python frames or, with none,
/// the pseudo-site the peak names it by (`<allocated before recording
/// started>`, `<backward pass>`), so that the flame graph and the peak's
/// list call the same bytes by one name.
fn block_labels(
    snap: &Snapshot,
    an: &Analysed<'_>,
    trace: usize,
    b: &crate::replay::LiveBlock,
) -> Vec<String> {
    let labels = python_stack_labels(snap, b.stack);
    if !labels.is_empty() {
        return labels;
    }
    vec![an.block_site(trace, b.alloc_index, b.stack).site]
}

/// The flame graph of the blocks allocated at dump time.
fn flame_of_dump(snap: &Snapshot) -> crate::report::Flame {
    let mut fb = FlameBuilder::new("live at dump time");
    for seg in &snap.segments {
        for b in seg
            .blocks
            .iter()
            .filter(|b| b.state == crate::snapshot::BlockState::ActiveAllocated)
        {
            fb.add_innermost_first(&python_stack_labels(snap, b.stack), b.size);
        }
    }
    fb.finish()
}

/// The segment map of a replayed state. Block tags are `alloc` event indices,
/// which give the stack.
pub(super) fn segments_of_state(
    snap: &Snapshot,
    events: &[crate::snapshot::TraceEvent],
    st: &ReplayState,
    when: &str,
    index: &SiteIndex,
    category_of: &dyn Fn(&str) -> Category,
) -> SegmentMap {
    // Blocks from before the trace have no event; their stack comes from the
    // live blocks the replay knows.
    let stack_by_addr: HashMap<u64, StackId> = st.live.iter().map(|b| (b.addr, b.stack)).collect();
    let mut sites: Vec<BlockSite> = Vec::new();
    let mut site_ids: HashMap<StackId, (u32, Category)> = HashMap::default();
    let mut rows = Vec::with_capacity(st.segments.len());
    for seg in &st.segments {
        let blocks = seg
            .blocks
            .iter()
            .map(|b| {
                let state = match b.status {
                    BlockStatus::Allocated => BlockState::Allocated,
                    BlockStatus::PendingFree => BlockState::PendingFree,
                    BlockStatus::Free => BlockState::Free,
                };
                let stack = (state != BlockState::Free)
                    .then(|| {
                        usize::try_from(b.tag)
                            .ok()
                            .and_then(|i| events.get(i))
                            .map(|e| e.stack)
                            .or_else(|| stack_by_addr.get(&b.address).copied())
                    })
                    .flatten();
                let (site, category) = match stack {
                    Some(s) => {
                        let (id, cat) = *site_ids.entry(s).or_insert_with(|| {
                            let site = Site::of(snap, index, s).site;
                            let cat = category_of(&site);
                            sites.push(BlockSite {
                                site,
                                stack: python_stack_labels(snap, s),
                            });
                            ((sites.len() - 1) as u32, cat)
                        });
                        (Some(id), cat)
                    }
                    None => (None, Category::Other),
                };
                SegmentBlock {
                    offset: b.address.saturating_sub(seg.address),
                    size: b.size,
                    requested: if state == BlockState::Free {
                        0
                    } else {
                        b.requested_size
                    },
                    state,
                    category,
                    site,
                    count: 1,
                }
            })
            .collect();
        let mut pool = if seg.is_small { "small" } else { "large" }.to_string();
        if seg.pool_id != (0, 0) {
            pool.push_str(&format!(" (private {},{})", seg.pool_id.0, seg.pool_id.1));
        }
        if seg.is_expandable {
            pool.push_str(", expandable");
        }
        rows.push(SegmentRow {
            address: seg.address,
            size: seg.total_size,
            stream: seg.stream as i64,
            pool,
            blocks,
        });
    }
    rows.sort_by_key(|r| r.address);
    SegmentMap {
        when: when.to_string(),
        segments: rows,
        sites,
        omitted: None,
    }
}
