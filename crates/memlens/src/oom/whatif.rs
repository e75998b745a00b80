//! What-if traces for an OOM: the recorded run up to the step that failed,
//! followed by a model of that whole step, which can be replayed by the
//! simulator under other settings, at another batch size, with an
//! `empty_cache()` or some tensors freed at the step's start.
//!
//! The failing step stopped at the failed allocation, so what the rest of it
//! would have needed is not in the trace. When the step before it ran the
//! same code (its allocations come in the same order from the same stacks),
//! that step is the *template*: each of its allocations gets a size as a
//! function of the batch, `size(x) = base + slope * (x - 1)` with `x` the
//! batch relative to the template step's. The slope comes, best first, from
//! the step before the template (two complete steps at different batches), from
//! the failing step's own allocations (the part it ran), or from the
//! allocation's category: activations, temporaries of the forward and
//! backward passes and inputs scale with the batch; parameters, gradients and
//! optimizer state do not. Without a usable template the model is the failing
//! step's recorded part plus the failed request, scaled by category: a lower
//! bound, since what came after the failure is unknown.

use crate::analysis::categories::{Category, Phase};
use crate::analysis::peak::BlockClassifier;
use crate::analysis::steps::Steps;
use crate::replay::simulate::{simulate, SimulateOptions, SimulationResult};
use crate::replay::{initial, release_runs, ReleaseCause, ReplayOptions};
use crate::sim::AllocatorConfig;
use crate::snapshot::{Action, DeviceTrace, Snapshot, TraceEvent};
use crate::trace::Analysed;
use hashbrown::{HashMap, HashSet};
use serde::Serialize;

/// Addresses of the modelled step's blocks are moved here so they cannot
/// collide with blocks the recorded run still holds.
const REMAP: u64 = 1 << 62;
/// Addresses of synthetic segments that mark an `empty_cache()` call.
const MARKER: u64 = 3 << 61;

/// Where the model of the failing step comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateKind {
    /// The step before the failing one, which ran the same code to the end.
    PreviousStep,
    /// Only the failing step's recorded part and the failed request: what came
    /// after the failure is unknown, so predictions are lower bounds.
    FailingStepOnly,
}

/// Where the slopes (bytes per unit of batch) come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlopeSource {
    /// Two complete steps at different batch sizes before the failing one.
    TwoSteps,
    /// The failing step's recorded allocations against the template's.
    FailingStep,
    /// The allocations' categories (activation, temporary, input scale).
    Categories,
}

/// How the failing step was modelled, for the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepModel {
    /// The failing step (from 1) and the event where it starts.
    pub failing_step: usize,
    /// First event of the failing step.
    pub failing_step_start: usize,
    /// Steps found in the trace.
    pub steps: usize,
    /// Where the model comes from.
    pub template: TemplateKind,
    /// The template step (from 1), when it is a recorded step.
    pub template_step: Option<usize>,
    /// The failing step's batch relative to the template's (2.0: twice the
    /// batch), measured from the allocations both made; 1.0 when unknown.
    pub growth: f64,
    /// Where most slopes come from.
    pub slopes: SlopeSource,
    /// Allocations in the modelled step.
    pub allocations: usize,
    /// Of them, how many scale with the batch.
    pub scaling_allocations: usize,
    /// Share of the failing step's recorded allocations whose size the model
    /// predicts within 1% (1.0 when there is nothing to compare).
    pub agreement: f64,
}

/// One what-if run: the settings and the changes to the failing step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIfSpec {
    /// `PYTORCH_CUDA_ALLOC_CONF` of the run (empty: PyTorch's defaults).
    pub config: String,
    /// The failing step's batch as a fraction of the one that failed.
    pub batch_fraction: f64,
    /// The per-process cap in bytes (`set_per_process_memory_fraction`).
    pub memory_cap_bytes: Option<u64>,
    /// Total device memory (`None`: unlimited).
    pub device_memory_bytes: Option<u64>,
    /// Device memory used outside PyTorch's allocator.
    pub overhead_bytes: Option<u64>,
    /// Call `torch.cuda.empty_cache()` when the failing step starts.
    pub empty_cache_at_step_start: bool,
    /// Free these live blocks (addresses) when the failing step starts.
    pub free_blocks: Vec<u64>,
}

/// One modelled allocation or free of the failing step.
#[derive(Clone, Copy, Debug)]
struct ModelEvent {
    event: TraceEvent,
    /// Size at the template's batch.
    base: f64,
    /// Bytes per unit of batch (relative to the template's).
    slope: f64,
}

/// The what-if builder of one OOM.
#[derive(Clone, Debug)]
pub struct WhatIf {
    device: u32,
    /// Recorded events before the failing step, segment events reduced to
    /// `empty_cache()` markers, after allocations for blocks from before the trace.
    prefix: Vec<TraceEvent>,
    /// The modelled failing step.
    step: Vec<ModelEvent>,
    /// Growth of the failing step's batch over the template's.
    growth: f64,
    streams: Vec<i64>,
    /// The recorded settings (their PyTorch version and segment size carry
    /// over to every what-if config).
    recorded: AllocatorConfig,
    /// How it was built.
    pub model: StepModel,
}

impl WhatIf {
    /// Builds the model of the step in which the `oom` event `oom_index` of
    /// trace `trace` happened.
    pub fn new(an: &Analysed, trace: usize, oom_index: usize) -> Option<WhatIf> {
        let snap = an.snap;
        let t = snap.traces.get(trace)?;
        let oom = *t.events.get(oom_index)?;
        let steps = &an.trace(trace)?.steps;
        let f = steps
            .starts
            .partition_point(|&s| s <= oom_index)
            .checked_sub(1)?;
        let start = steps.starts.get(f).copied()?;
        let classifier = an.classifier(trace)?;
        // Where the program called empty_cache(), judged on the recorded run.
        let empty_cache_at: HashSet<usize> =
            release_runs(snap, t.device, &ReplayOptions::default())
                .into_iter()
                .filter(|r| r.cause == ReleaseCause::EmptyCache)
                .map(|r| r.start)
                .collect();
        let mut prefix = initial_allocs(snap, t);
        prefix.extend(
            reduce_segments(t.events.get(..start)?, 0, &empty_cache_at)
                .into_iter()
                .map(|(_, e)| e),
        );
        let built = from_previous_step(t, steps, f, oom_index, &classifier, &empty_cache_at)
            .unwrap_or_else(|| {
                failing_step_only(t, start, oom_index, oom, &classifier, &empty_cache_at)
            });
        let scaling = built
            .events
            .iter()
            .filter(|e| e.event.action == Action::Alloc && e.slope != 0.0)
            .count();
        let allocations = built
            .events
            .iter()
            .filter(|e| e.event.action == Action::Alloc)
            .count();
        Some(WhatIf {
            device: t.device,
            prefix,
            growth: built.growth,
            streams: snap.streams.clone(),
            recorded: AllocatorConfig::from_settings(&snap.settings),
            model: StepModel {
                failing_step: f + 1,
                failing_step_start: start,
                steps: steps.len(),
                template: built.kind,
                template_step: built.template_step.map(|s| s + 1),
                growth: built.growth,
                slopes: built.slopes,
                allocations,
                scaling_allocations: scaling,
                agreement: built.agreement,
            },
            step: built.events,
        })
    }

    /// The what-if trace under `spec`.
    pub fn events(&self, spec: &WhatIfSpec) -> Vec<TraceEvent> {
        let mut out = Vec::with_capacity(self.prefix.len() + self.step.len() + 8);
        out.extend_from_slice(&self.prefix);
        let first = self.step.first().map_or_else(blank, |e| e.event);
        for &addr in &spec.free_blocks {
            for action in [Action::FreeRequested, Action::FreeCompleted] {
                out.push(TraceEvent {
                    action,
                    addr,
                    ..first
                });
            }
        }
        if spec.empty_cache_at_step_start {
            out.extend(empty_cache_marker(first, MARKER));
        }
        let x = spec.batch_fraction * self.growth;
        for m in &self.step {
            let mut e = m.event;
            match e.action {
                Action::Alloc => {
                    let size = m.base + m.slope * (x - 1.0);
                    e.size = size.round().max(1.0) as u64;
                    out.push(e);
                }
                _ => out.push(e),
            }
        }
        out
    }

    /// Runs the simulator on the what-if trace under `spec`.
    pub fn simulate(&self, spec: &WhatIfSpec) -> crate::Result<SimulationResult> {
        let mut config = AllocatorConfig {
            version: self.recorded.version,
            large_segment_size: self.recorded.large_segment_size,
            ..AllocatorConfig::default()
        };
        config
            .apply(&spec.config)
            .map_err(|e| crate::Error::usage(format!("{}: {e}", spec.config)))?;
        let snap = Snapshot {
            traces: vec![DeviceTrace {
                device: self.device,
                events: self.events(spec),
                extras: Vec::new(),
            }],
            streams: self.streams.clone(),
            ..Snapshot::default()
        };
        simulate(
            &snap,
            self.device,
            &SimulateOptions {
                config,
                device_memory: spec.device_memory_bytes,
                overhead: spec.overhead_bytes.or(spec.device_memory_bytes.map(|_| 0)),
                allowed_memory_maximum: spec.memory_cap_bytes,
            },
        )
    }
}

fn blank() -> TraceEvent {
    TraceEvent {
        addr: 0,
        size: 0,
        time_us: 0,
        stack: 0,
        stream: 0,
        action: Action::Snapshot,
        flags: 0,
    }
}

/// Allocations that recreate the blocks live before a trace that does not
/// start at the allocator's birth (the model places them itself).
fn initial_allocs(snap: &Snapshot, t: &DeviceTrace) -> Vec<TraceEvent> {
    let init = initial::reconstruct(snap, t.device, &t.events);
    init.blocks
        .iter()
        .filter(|b| !b.pending)
        .map(|b| TraceEvent {
            addr: b.addr,
            size: b.size.unwrap_or(b.requested).max(b.requested),
            time_us: 0,
            stack: b.stack,
            stream: b.stream,
            action: Action::Alloc,
            flags: 0,
        })
        .collect()
}

/// Events the simulator reads as an `empty_cache()` call: a segment made
/// and, after an event that is not a segment event, freed (a run of segment
/// frees with nothing made in it and no `oom` after it).
fn empty_cache_marker(like: TraceEvent, addr: u64) -> [TraceEvent; 3] {
    let seg = |action| TraceEvent {
        action,
        addr,
        size: crate::sim::rounding::SMALL_BUFFER,
        ..like
    };
    [
        seg(Action::SegmentAlloc),
        TraceEvent {
            action: Action::Snapshot,
            addr: 0,
            size: 0,
            ..like
        },
        seg(Action::SegmentFree),
    ]
}

/// Drops segment events (the model decides them), keeping each
/// `empty_cache()` call (a run of segment frees starting at an index in
/// `empty_cache_at`) as a marker the simulator reads as the call. `oom`
/// events go too. Each event comes with its index in `events` plus `offset`.
fn reduce_segments(
    events: &[TraceEvent],
    offset: usize,
    empty_cache_at: &HashSet<usize>,
) -> Vec<(usize, TraceEvent)> {
    let mut out = Vec::with_capacity(events.len());
    let mut marker = 0u64;
    for (i, e) in events.iter().enumerate() {
        if is_segment(e.action) {
            if empty_cache_at.contains(&(offset + i)) {
                marker += 1;
                let addr = MARKER + (1 << 60) + (((offset + i) as u64) << 21) + marker;
                out.extend(empty_cache_marker(*e, addr).map(|m| (offset + i, m)));
            }
        } else if e.action != Action::Oom {
            out.push((offset + i, *e));
        }
    }
    out
}

fn is_segment(a: Action) -> bool {
    matches!(
        a,
        Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
    )
}

struct Built {
    kind: TemplateKind,
    template_step: Option<usize>,
    growth: f64,
    slopes: SlopeSource,
    agreement: f64,
    events: Vec<ModelEvent>,
}

/// Indices of the `alloc` events in `range`.
fn allocs_in(events: &[TraceEvent], range: std::ops::Range<usize>) -> Vec<usize> {
    range
        .filter(|&i| events.get(i).is_some_and(|e| e.action == Action::Alloc))
        .collect()
}

/// How many allocations from the start come from the same stacks in both lists.
fn aligned(events: &[TraceEvent], a: &[usize], b: &[usize]) -> usize {
    a.iter()
        .zip(b)
        .take_while(|(&i, &j)| events[i].stack == events[j].stack)
        .count()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

/// Whether a block made at alloc event `i` scales with the batch, by category.
fn scales_by_category(c: &BlockClassifier, e: &TraceEvent, i: usize) -> bool {
    let (cat, birth) = c.classify(Some(i as u32), e.stack);
    match cat {
        Category::Activation | Category::Temporary => {
            matches!(birth, Phase::Forward | Phase::Backward)
        }
        Category::Input => true,
        _ => false,
    }
}

/// The model from the step before the failing one, when it ran the same code.
fn from_previous_step(
    t: &DeviceTrace,
    steps: &Steps,
    f: usize,
    oom_index: usize,
    classifier: &BlockClassifier,
    empty_cache_at: &HashSet<usize>,
) -> Option<Built> {
    let events = &t.events;
    let p = f.checked_sub(1)?;
    let start_f = *steps.starts.get(f)?;
    let range_p = steps.range(p);
    let allocs_f = allocs_in(events, start_f..oom_index);
    let allocs_p = allocs_in(events, range_p.clone());
    // The template must have run at least as far as the failing step and
    // from the same stacks, including the failed request's.
    let m = aligned(events, &allocs_f, &allocs_p);
    let oom_stack_ok = allocs_p
        .get(allocs_f.len())
        .is_some_and(|&j| events[j].stack == events[oom_index].stack);
    if allocs_f.is_empty() || m < allocs_f.len() || !oom_stack_ok {
        return None;
    }
    // Growth of the failing batch over the template's: the median ratio of
    // the sizes that changed, the failed request included.
    let mut pairs: Vec<(f64, f64)> = allocs_f
        .iter()
        .zip(&allocs_p)
        .map(|(&i, &j)| (events[i].size as f64, events[j].size as f64))
        .collect();
    if let Some(&j) = allocs_p.get(allocs_f.len()) {
        pairs.push((events[oom_index].size as f64, events[j].size as f64));
    }
    let changed: Vec<(f64, f64)> = pairs
        .iter()
        .copied()
        .filter(|(a, b)| *b > 0.0 && (a - b).abs() > 0.5)
        .collect();
    let growth = median(changed.iter().map(|(a, b)| a / b).collect()).unwrap_or(1.0);

    // Two complete steps at different batches give every allocation's slope.
    let two = p.checked_sub(1).and_then(|pp| {
        let allocs_pp = allocs_in(events, steps.range(pp));
        let n = aligned(events, &allocs_pp, &allocs_p);
        if allocs_pp.len() != allocs_p.len() || n * 20 < allocs_p.len() * 19 {
            return None;
        }
        let ratios: Vec<f64> = allocs_pp
            .iter()
            .zip(&allocs_p)
            .take(n)
            .map(|(&i, &j)| (events[i].size as f64, events[j].size as f64))
            .filter(|(a, b)| *b > 0.0 && (a - b).abs() > 0.5)
            .map(|(a, b)| a / b)
            .collect();
        let r = median(ratios)?;
        ((r - 1.0).abs() > 0.05).then_some((allocs_pp, n, r))
    });

    let slope_of: HashMap<usize, f64> = {
        let mut s = HashMap::new();
        for (k, &j) in allocs_p.iter().enumerate() {
            let base = events[j].size as f64;
            let slope = match &two {
                Some((pp, n, r)) if k < *n => {
                    let prev = events[pp[k]].size as f64;
                    (base - prev) / (1.0 - r)
                }
                _ if k < pairs.len() && (growth - 1.0).abs() > 0.05 => {
                    (pairs[k].0 - base) / (growth - 1.0)
                }
                _ if scales_by_category(classifier, &events[j], j) => base,
                _ => 0.0,
            };
            s.insert(j, slope);
        }
        s
    };
    let slopes = if two.is_some() {
        SlopeSource::TwoSteps
    } else if (growth - 1.0).abs() > 0.05 {
        SlopeSource::FailingStep
    } else {
        SlopeSource::Categories
    };
    // How well the model predicts what the failing step did allocate.
    let agree = pairs
        .iter()
        .zip(&allocs_p)
        .filter(|((actual, base), &j)| {
            let predicted = base + slope_of.get(&j).copied().unwrap_or(0.0) * (growth - 1.0);
            (predicted - actual).abs() <= 0.01 * actual.max(1.0)
        })
        .count();
    let agreement = if pairs.is_empty() {
        1.0
    } else {
        agree as f64 / pairs.len() as f64
    };

    // Frees of blocks from before the template: those its previous step made
    // become the ones the template itself left live; older ones stay if live.
    let live_at_start = live_before(events, start_f);
    let left_over: HashMap<u64, u64> = match p.checked_sub(1) {
        Some(pp) => allocs_in(events, steps.range(pp))
            .iter()
            .zip(&allocs_p)
            .filter(|(_, &j)| live_at_start.contains(&events[j].addr))
            .map(|(&i, &j)| (events[i].addr, events[j].addr))
            .collect(),
        None => HashMap::new(),
    };
    let mut own: HashSet<u64> = HashSet::new();
    let mut out = Vec::with_capacity(range_p.len());
    for (j, e) in reduce_segments(events.get(range_p.clone())?, range_p.start, empty_cache_at) {
        let (event, base, slope) = match e.action {
            Action::Alloc => {
                own.insert(e.addr);
                let slope = slope_of.get(&j).copied().unwrap_or(0.0);
                let moved = TraceEvent {
                    addr: e.addr | REMAP,
                    ..e
                };
                (moved, e.size as f64, slope)
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let addr = if own.contains(&e.addr) {
                    Some(e.addr | REMAP)
                } else if let Some(&a) = left_over.get(&e.addr) {
                    Some(a)
                } else {
                    live_at_start.contains(&e.addr).then_some(e.addr)
                };
                let Some(addr) = addr else { continue };
                (TraceEvent { addr, ..e }, 0.0, 0.0)
            }
            _ => (e, 0.0, 0.0),
        };
        out.push(ModelEvent { event, base, slope });
    }
    Some(Built {
        kind: TemplateKind::PreviousStep,
        template_step: Some(p),
        growth,
        slopes,
        agreement,
        events: out,
    })
}

/// Addresses of blocks live right before event `index` (allocated and not
/// yet freed by the user).
fn live_before(events: &[TraceEvent], index: usize) -> HashSet<u64> {
    let mut live = HashSet::new();
    for e in events.iter().take(index) {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    live
}

/// The model from the failing step alone: its recorded events up to the
/// failure and the failed request, scaled by category.
fn failing_step_only(
    t: &DeviceTrace,
    start: usize,
    oom_index: usize,
    oom: TraceEvent,
    classifier: &BlockClassifier,
    empty_cache_at: &HashSet<usize>,
) -> Built {
    let events = &t.events;
    let mut out = Vec::new();
    let recorded = events.get(start..oom_index).unwrap_or(&[]);
    for (i, e) in reduce_segments(recorded, start, empty_cache_at) {
        let scales = e.action == Action::Alloc && scales_by_category(classifier, &e, i);
        out.push(ModelEvent {
            event: e,
            base: e.size as f64,
            slope: if scales { e.size as f64 } else { 0.0 },
        });
    }
    // The failed request, classified by the phase it was made in.
    out.push(ModelEvent {
        event: TraceEvent {
            action: Action::Alloc,
            addr: REMAP | (1 << 58),
            ..oom
        },
        base: oom.size as f64,
        slope: if scales_by_category(classifier, &oom, oom_index) {
            oom.size as f64
        } else {
            0.0
        },
    });
    Built {
        kind: TemplateKind::FailingStepOnly,
        template_step: None,
        growth: 1.0,
        slopes: SlopeSource::Categories,
        agreement: 1.0,
        events: out,
    }
}
