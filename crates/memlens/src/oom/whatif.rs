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
//! bound, since what came after the failure is unknown. A run's first step
//! that failed in its forward or its loss is completed: its backward modelled
//! from the forward's saved tensors, then the next step, which holds the
//! optimizer's state ([`super::completion`]); a whole step when it failed in
//! the loss.

use super::batch_model::made_once;
use super::completion::{self, StepCompletion};
use crate::analysis::categories::{Category, Phase};
use crate::analysis::peak::BlockClassifier;
use crate::analysis::steps::Steps;
use crate::replay::initial;
use crate::replay::simulate::{simulate_ops, SimulateOptions, SimulationResult};
use crate::sim::program::Op;
use crate::sim::AllocatorConfig;
use crate::snapshot::{Action, Snapshot, StackSet, TraceEvent};
use crate::trace::Analysed;
use hashbrown::{HashMap, HashSet};
use serde::Serialize;

/// The modelled step's tensors are named by their recorded address with this
/// bit set, so that they cannot be taken for tensors the recorded run still
/// holds (real addresses are below 2^57).
pub(super) const STEP_IDS: u64 = 1 << 62;
/// The name of the failed request's tensor in a step modelled up to the failure.
const FAILED_REQUEST_ID: u64 = STEP_IDS | (1 << 58);
/// The gradient `LogSoftmaxBackward0` makes after a failure in NLL loss's
/// backward ([`next_of_cross_entropy_backward`]).
const CROSS_ENTROPY_NEXT_ID: u64 = FAILED_REQUEST_ID + 1;
/// Optimizer state the model adds is named from here up.
const ADDED_STATE_IDS: u64 = STEP_IDS | (1 << 57);

/// Where the model of the failing step comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateKind {
    /// The step before the failing one, which ran the same code to the end.
    PreviousStep,
    /// Only the failing step's recorded part and the failed request: what came
    /// after the failure is unknown, so predictions are lower bounds.
    FailingStepOnly,
    /// The failing step's recorded forward up to the failed request, then a
    /// backward modelled from its saved tensors ([`StepCompletion`]): a whole
    /// step when the forward failed in its loss, else still a lower bound.
    FailingStepCompleted,
}

/// The optimizer whose state a first step's model counts: a run that fails
/// in its first step fails before `optimizer.step()` made any, so the
/// snapshot cannot show it (`oom --optimizer`; Adam(W) when not given, the
/// most common, which errs toward a smaller batch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FirstStepOptimizer {
    /// Adam or AdamW: two tensors the size of each parameter.
    #[default]
    #[serde(rename = "adamw")]
    AdamW,
    /// SGD with momentum: one (its momentum buffer).
    SgdMomentum,
    /// Plain SGD (no momentum): none.
    Sgd,
}

impl FirstStepOptimizer {
    /// Every name `--optimizer` takes, as the user writes it.
    pub const NAMES: &'static [&'static str] = &["adamw", "adam", "sgd-momentum", "sgd"];

    /// The optimizer named `name` (one of [`Self::NAMES`], any case).
    pub fn parse(name: &str) -> Option<FirstStepOptimizer> {
        match name.to_ascii_lowercase().as_str() {
            "adamw" | "adam" => Some(FirstStepOptimizer::AdamW),
            "sgd-momentum" | "sgd_momentum" => Some(FirstStepOptimizer::SgdMomentum),
            "sgd" => Some(FirstStepOptimizer::Sgd),
            _ => None,
        }
    }

    /// [`Self::parse`], or the usage error every surface gives for a name
    /// it does not know (exit 2 on the command line).
    pub fn named(name: &str) -> crate::Result<FirstStepOptimizer> {
        Self::parse(name).ok_or_else(|| {
            crate::Error::usage(format!(
                "unknown optimizer {name:?}: one of {}",
                Self::NAMES.join(", ")
            ))
        })
    }

    /// The state tensors it holds per parameter, each the parameter's size.
    pub fn tensors_per_parameter(self) -> usize {
        match self {
            FirstStepOptimizer::AdamW => 2,
            FirstStepOptimizer::SgdMomentum => 1,
            FirstStepOptimizer::Sgd => 0,
        }
    }

    /// Its state in words ("Adam(W)'s, two tensors the size of each parameter").
    pub fn state_words(self) -> &'static str {
        match self {
            FirstStepOptimizer::AdamW => "Adam(W)'s, two tensors the size of each parameter",
            FirstStepOptimizer::SgdMomentum => {
                "SGD with momentum's, one tensor the size of each parameter"
            }
            FirstStepOptimizer::Sgd => "plain SGD's, none",
        }
    }
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
    /// Optimizer state the model adds before a first step's failure: the
    /// state Adam(W) makes at the first `optimizer.step()` (two tensors the
    /// size of each parameter) and every later step holds. 0 when the run
    /// already held optimizer state, or held no parameters.
    pub optimizer_state_added_bytes: u64,
    /// The optimizer whose state that is, for a first step whose run held
    /// none yet (`None` otherwise), and whether the user named it.
    pub first_step_optimizer: Option<FirstStepOptimizer>,
    /// Whether `first_step_optimizer` was given (`oom --optimizer`), not assumed.
    pub optimizer_given: bool,
    /// How a step that failed in its forward was completed (its backward
    /// modelled), when it was.
    pub completion: Option<StepCompletion>,
}

impl StepModel {
    /// Whether the model lacks part of the failing step, so that what it
    /// predicts is a lower bound (a batch said to fit may not).
    pub fn is_lower_bound(&self) -> bool {
        match self.template {
            TemplateKind::PreviousStep => false,
            TemplateKind::FailingStepOnly => true,
            TemplateKind::FailingStepCompleted => {
                !self.completion.as_ref().is_some_and(|c| c.forward_whole)
            }
        }
    }

    /// The margin of this model's "fits" verdicts (the step must still fit
    /// with this much more of its batch): [`super::fixes::FIT_MARGIN_WHOLE_STEP`]
    /// for a step that ran whole before the failing one, else
    /// [`super::fixes::FIT_MARGIN`].
    pub fn fit_margin(&self) -> f64 {
        match self.template {
            TemplateKind::PreviousStep => super::fixes::FIT_MARGIN_WHOLE_STEP,
            TemplateKind::FailingStepOnly | TemplateKind::FailingStepCompleted => {
                super::fixes::FIT_MARGIN
            }
        }
    }
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

/// One modelled operation of the failing step.
#[derive(Clone, Copy, Debug)]
pub(super) struct ModelOp {
    /// The operation at the template's batch.
    pub(super) op: Op,
    /// Size at the template's batch (allocations).
    pub(super) base: f64,
    /// Bytes per unit of batch (relative to the template's).
    pub(super) slope: f64,
}

impl ModelOp {
    /// An operation that does not change with the batch.
    pub(super) fn fixed(op: Op) -> ModelOp {
        ModelOp {
            op,
            base: 0.0,
            slope: 0.0,
        }
    }

    fn is_alloc(&self) -> bool {
        matches!(self.op, Op::Alloc { .. } | Op::Optional { .. })
    }

    /// The operation at batch `x` (relative to the template's): an
    /// allocation with a slope takes its size there.
    fn at(&self, x: f64) -> Op {
        match self.op {
            Op::Alloc {
                id, stream, tag, ..
            } if self.slope != 0.0 => {
                let size = self.base + self.slope * (x - 1.0);
                Op::Alloc {
                    id,
                    size: size.round().max(1.0) as u64,
                    stream,
                    tag,
                }
            }
            op => op,
        }
    }
}

/// The what-if builder of one OOM.
#[derive(Clone, Debug)]
pub struct WhatIf {
    device: u32,
    /// The recorded run before the failing step as operations: allocations
    /// for the blocks from before the trace, then its allocations, frees and
    /// `empty_cache()` calls. The template step, when it ran at the failing
    /// step's batch, scales with it (the run made at another batch from the
    /// start).
    prefix: Vec<ModelOp>,
    /// The modelled failing step.
    step: Vec<ModelOp>,
    /// Growth of the failing step's batch over the template's.
    growth: f64,
    /// The recorded settings (their PyTorch version and segment size carry
    /// over to every what-if config).
    recorded: AllocatorConfig,
    /// How it was built.
    pub model: StepModel,
}

impl WhatIf {
    /// Builds the model of the step in which the `oom` event `oom_index` of
    /// trace `trace` happened.
    /// `optimizer`: the one a first step's model counts the state of (Adam(W)
    /// when `None`).
    pub fn new(
        an: &Analysed,
        trace: usize,
        oom_index: usize,
        optimizer: Option<FirstStepOptimizer>,
    ) -> Option<WhatIf> {
        an.snap.traces.get(trace)?;
        // Where the program called empty_cache(), judged on the trace's one
        // replay under its recorded settings.
        let empty_cache_at: HashSet<usize> = an
            .recorded()
            .of(an.snap, trace)
            .watched
            .empty_cache_at
            .iter()
            .copied()
            .collect();
        WhatIf::with_empty_cache_at(an, trace, oom_index, &empty_cache_at, optimizer)
    }

    /// [`WhatIf::new`] given the events at which the program called
    /// `empty_cache()` (the starts of [`crate::replay::ReleaseCause::EmptyCache`] runs),
    /// found by a replay the caller already made.
    pub fn with_empty_cache_at(
        an: &Analysed,
        trace: usize,
        oom_index: usize,
        empty_cache_at: &HashSet<usize>,
        optimizer: Option<FirstStepOptimizer>,
    ) -> Option<WhatIf> {
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
        let rec = Recorded {
            snap,
            events: &t.events,
            empty_cache_at,
            workspaces: snap.cudnn_workspace_stacks(),
            losses: snap.loss_stacks(),
        };
        // The state before the trace, as that one replay began from it.
        let pass = an.recorded().of(snap, trace);
        let mut built = from_previous_step(&rec, steps, f, oom_index, &classifier)
            .unwrap_or_else(|| failing_step_only(&rec, start, oom_index, oom, &classifier));
        let live = live_parameters(snap, pass.initial(), t, oom_index, &classifier);
        // Only a first step: after training steps, a step that ran other
        // code (no template) may be an evaluation under `no_grad`, which has
        // no backward (tests/corpus/oom/eval_spike).
        let mut completion = (f == 0)
            .then(|| {
                complete_forward_failure(&mut built, &live, &rec, &classifier, (oom_index, &oom))
            })
            .flatten();
        let first_step_optimizer =
            (f == 0 && !live.optimizer_state).then(|| optimizer.unwrap_or_default());
        let state = first_step_optimizer
            .map(|o| next_steps_optimizer_state(&live, o))
            .unwrap_or_default();
        let optimizer_state_added_bytes = state.iter().map(|m| m.base as u64).sum();
        match completion.as_mut() {
            // A whole first step: run it, then the next with the state.
            Some(c) if !state.is_empty() => {
                let first = std::mem::take(&mut built.ops);
                built.ops = completion::with_next_step(first, state, c, &built.made_once_ids);
            }
            // The state, right after the last parameter the step made (a
            // first step's range also builds the model), else at its start.
            _ => {
                let at = live
                    .last_made
                    .and_then(|a| {
                        built
                            .ops
                            .iter()
                            .position(|m| matches!(m.op, Op::Alloc { id, .. } if id == a))
                    })
                    .map_or(0, |k| k + 1);
                built.ops.splice(at..at, state);
            }
        }
        let mut prefix: Vec<ModelOp> = initial_allocs(snap, pass.initial())
            .into_iter()
            .map(ModelOp::fixed)
            .collect();
        prefix.extend(rec.ops(0..start).into_iter().map(|(i, op)| {
            match (op, built.prefix_slopes.get(&i)) {
                (Op::Alloc { size, .. }, Some(&slope)) => ModelOp {
                    op,
                    base: size as f64,
                    slope,
                },
                _ => ModelOp::fixed(op),
            }
        }));
        let scaling = built
            .ops
            .iter()
            .filter(|m| m.is_alloc() && m.slope != 0.0)
            .count();
        let allocations = built.ops.iter().filter(|m| m.is_alloc()).count();
        Some(WhatIf {
            device: t.device,
            prefix,
            growth: built.growth,
            recorded: crate::replay::config::recorded_config(&snap.settings),
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
                optimizer_state_added_bytes,
                first_step_optimizer,
                optimizer_given: first_step_optimizer.is_some() && optimizer.is_some(),
                completion,
            },
            step: built.ops,
        })
    }

    /// The what-if program under `spec`: the recorded run before the
    /// failing step, the frees and `empty_cache()` the spec asks for at the
    /// step's start, then the modelled step at the spec's batch.
    pub fn ops(&self, spec: &WhatIfSpec) -> Vec<Op> {
        let mut out = Vec::with_capacity(self.prefix.len() + self.step.len() + 8);
        let x = spec.batch_fraction * self.growth;
        out.extend(self.prefix.iter().map(|m| m.at(x)));
        out.extend(spec.free_blocks.iter().map(|&id| Op::Free { id }));
        if spec.empty_cache_at_step_start {
            out.push(Op::EmptyCache);
        }
        out.extend(self.step.iter().map(|m| m.at(x)));
        out
    }

    /// Runs the allocator model on the what-if program under `spec`.
    pub fn simulate(&self, spec: &WhatIfSpec) -> crate::Result<SimulationResult> {
        let mut config = AllocatorConfig {
            version: self.recorded.version,
            large_segment_size: self.recorded.large_segment_size,
            ..AllocatorConfig::default()
        };
        config
            .apply(&spec.config)
            .map_err(|e| crate::Error::usage(format!("{}: {e}", spec.config)))?;
        simulate_ops(
            &self.ops(spec),
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

/// The parameters live at a failure, as the optimizer and the backward see
/// them.
struct LiveParameters {
    /// (size, stream key) of each, in the order they were made (those from
    /// before the trace first).
    params: Vec<(u64, u64)>,
    /// The address of the last one the trace made.
    last_made: Option<u64>,
    /// Whether optimizer state was live too (a step of the optimizer ran).
    optimizer_state: bool,
}

/// The parameters live at the `oom` event `oom_index` of `trace`.
fn live_parameters(
    snap: &Snapshot,
    init: &initial::InitialState,
    trace: &crate::snapshot::DeviceTrace,
    oom_index: usize,
    classifier: &BlockClassifier,
) -> LiveParameters {
    let before_trace = init.blocks.iter().filter(|b| !b.pending).map(|b| {
        (
            None,
            b.stack,
            b.size.unwrap_or(b.requested),
            b.stream,
            b.addr,
        )
    });
    // Live at the failure: not freed before it (the frees paired with their
    // allocations once, for the whole trace).
    let in_trace = trace.events[..oom_index.min(trace.events.len())]
        .iter()
        .enumerate()
        .filter(|&(i, e)| e.action == Action::Alloc && classifier.live_at(i, oom_index))
        .map(|(i, e)| (Some(i as u32), e.stack, e.size, e.stream, e.addr));
    let mut live = LiveParameters {
        params: Vec::new(),
        last_made: None,
        optimizer_state: false,
    };
    for (index, stack, size, stream, addr) in before_trace.chain(in_trace) {
        match classifier.classify(index, stack).0 {
            Category::OptimizerState => live.optimizer_state = true,
            Category::Parameter => {
                live.params.push((size, snap.stream(stream) as u64));
                if index.is_some() {
                    live.last_made = Some(addr);
                }
            }
            _ => {}
        }
    }
    live
}

/// When the failing step is the run's first (parameters live, no optimizer
/// state yet), the state `optimizer` makes at its first step and every later
/// step holds through its forward and backward: its tensors the size of each
/// parameter (a first step's failure cannot show which optimizer the run
/// uses: [`FirstStepOptimizer`]). Empty otherwise.
fn next_steps_optimizer_state(
    live: &LiveParameters,
    optimizer: FirstStepOptimizer,
) -> Vec<ModelOp> {
    if live.optimizer_state {
        return Vec::new();
    }
    let per_parameter = optimizer.tensors_per_parameter();
    let mut id = ADDED_STATE_IDS;
    let mut out = Vec::with_capacity(live.params.len() * per_parameter);
    for &(size, stream) in &live.params {
        for _ in 0..per_parameter {
            id += 1;
            out.push(ModelOp {
                op: Op::Alloc {
                    id,
                    size,
                    stream,
                    tag: 0,
                },
                base: size as f64,
                slope: 0.0,
            });
        }
    }
    out
}

/// Allocations that recreate the blocks live before a trace that does not
/// start at the allocator's birth (the model places them itself).
fn initial_allocs(snap: &Snapshot, init: &initial::InitialState) -> Vec<Op> {
    init.blocks
        .iter()
        .filter(|b| !b.pending)
        .map(|b| Op::Alloc {
            id: b.addr,
            size: b.size.unwrap_or(b.requested).max(b.requested),
            stream: snap.stream(b.stream) as u64,
            tag: u64::from(b.stack),
        })
        .collect()
}

/// The recorded trace, read as operations.
struct Recorded<'a> {
    snap: &'a Snapshot,
    events: &'a [TraceEvent],
    /// Where the program called `empty_cache()` (the first segment free of
    /// each such release), judged on the recorded run.
    empty_cache_at: &'a HashSet<usize>,
    /// Stacks of the allocations the program can do without.
    workspaces: StackSet,
    /// Stacks that run a loss function.
    losses: StackSet,
}

impl Recorded<'_> {
    /// The operations of the events in `range`, each with its event index:
    /// allocations and frees (tensors named by their address), and each
    /// `empty_cache()` call. Segment events go (the model decides them), and
    /// so do `oom` events.
    fn ops(&self, range: std::ops::Range<usize>) -> Vec<(usize, Op)> {
        let mut out = Vec::with_capacity(range.len());
        for i in range {
            let Some(e) = self.events.get(i) else { break };
            let op = match e.action {
                Action::Alloc => self.alloc(e),
                Action::FreeRequested => Op::FreeRequested { id: e.addr },
                Action::FreeCompleted => Op::FreeCompleted { id: e.addr },
                a if is_segment(a) && self.empty_cache_at.contains(&i) => Op::EmptyCache,
                _ => continue,
            };
            out.push((i, op));
        }
        out
    }

    /// The allocation event `e` as an operation: [`Op::Optional`] for a
    /// cuDNN convolution's workspace, which PyTorch gives up when it cannot
    /// have it.
    fn alloc(&self, e: &TraceEvent) -> Op {
        Op::allocation(
            e.addr,
            e.size,
            self.snap.stream(e.stream) as u64,
            u64::from(e.stack),
            self.workspaces.contains(e.stack),
        )
    }
}

fn is_segment(a: Action) -> bool {
    matches!(
        a,
        Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
    )
}

struct Built {
    /// Slopes of the recorded run's allocations before the failing step
    /// (by event index) that scale with it: the template step's, when it ran
    /// at the failing step's batch.
    prefix_slopes: HashMap<usize, f64>,
    kind: TemplateKind,
    template_step: Option<usize>,
    growth: f64,
    slopes: SlopeSource,
    agreement: f64,
    ops: Vec<ModelOp>,
    /// The ids of `ops`' allocations that are made once for the run
    /// (parameters, cuBLAS workspaces), for a model of the failing step
    /// alone: a next step would find them made.
    made_once_ids: HashSet<u64>,
}

/// Indices of the `alloc` events in `range`.
pub(super) fn allocs_in(events: &[TraceEvent], range: std::ops::Range<usize>) -> Vec<usize> {
    range
        .filter(|&i| events.get(i).is_some_and(|e| e.action == Action::Alloc))
        .collect()
}

/// The template's allocations `p` aligned with the failing step's `f` (the
/// n-th of `f` with the n-th of the result, the same allocation by `same`,
/// the failed request, `oom_index`, next) and those passed over: an
/// allocation of `p` that is not the one wanted may be passed over when
/// `passable`. `None` when `f` does not align so.
fn align_passing_over(
    f: &[usize],
    p: &[usize],
    oom_index: usize,
    same: &dyn Fn(usize, usize) -> bool,
    passable: &dyn Fn(usize) -> bool,
) -> Option<(Vec<usize>, Vec<usize>)> {
    let mut kept = Vec::with_capacity(p.len());
    let mut passed = Vec::new();
    let mut want = f.iter().copied().chain([oom_index]);
    let mut next = want.next();
    for &j in p {
        match next {
            Some(i) if same(i, j) => {
                kept.push(j);
                next = want.next();
            }
            Some(_) if passable(j) => passed.push(j),
            Some(_) => return None,
            None => kept.push(j),
        }
    }
    next.is_none().then_some((kept, passed))
}

/// How many allocations from the start come from the same stacks in both lists.
fn aligned(events: &[TraceEvent], a: &[usize], b: &[usize]) -> usize {
    a.iter()
        .zip(b)
        .take_while(|(&i, &j)| events[i].stack == events[j].stack)
        .count()
}

pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
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

/// The failing step's allocations aligned with the template's.
struct Alignment {
    /// The failing step's allocations up to the failure (made every step).
    allocs_f: Vec<usize>,
    /// The template's, the first `allocs_f.len()` paired with them.
    allocs_p: Vec<usize>,
    /// The template's allocations passed over (one-offs the failing step
    /// found live) or made once for the run.
    made_once: HashSet<usize>,
    /// The template's events, from its first aligned allocation.
    range_p: std::ops::Range<usize>,
}

/// Aligns the failing step `f` (up to `oom_index`) with the step before it.
///
/// What a step makes once for the run (the first step's optimizer state and
/// cuBLAS workspaces) is not part of the steps' common code: the failing step
/// finds it made, so the template neither aligns on it nor makes it again.
/// The template must have run at least as far as the failing step and from
/// the same stacks, including the failed request's. It starts where the
/// failing step's code does (the first step's range also holds what ran
/// before the loop: building the model, a first batch), and what it made that
/// the failing step found still live and did not make again (a library's
/// one-off buffer) is passed over.
fn align_with_previous_step(
    rec: &Recorded<'_>,
    steps: &Steps,
    f: usize,
    oom_index: usize,
    classifier: &BlockClassifier,
) -> Option<Alignment> {
    let events = rec.events;
    let p = f.checked_sub(1)?;
    let start_f = *steps.starts.get(f)?;
    let allocs_f = made_every_step(events, start_f..oom_index, classifier);
    let whole_p = steps.range(p);
    let allocs_whole_p = made_every_step(events, whole_p.clone(), classifier);
    let persists = |j: usize| classifier.live_at(j, start_f);
    // cuDNN's workspaces come from other C++ frames in the first step
    // (`try_configs` searches the plans the next steps take from its cache).
    let same = |i: usize, j: usize| {
        let (a, b) = (events[i].stack, events[j].stack);
        a == b || (rec.workspaces.contains(a) && rec.workspaces.contains(b))
    };
    // A workspace the failing step gave up (its caught `oom` entry) is not
    // among its allocations: the template's is passed over, and kept.
    let workspace = |j: usize| rec.workspaces.contains(events[j].stack);
    let passable = |j: usize| persists(j) || workspace(j);
    let first = *allocs_f.first()?;
    let (allocs_p, passed) = (0..allocs_whole_p.len())
        .filter(|&k| same(first, allocs_whole_p[k]))
        .find_map(|k| {
            align_passing_over(&allocs_f, &allocs_whole_p[k..], oom_index, &same, &passable)
        })?;
    let skipped = passed.into_iter().filter(|&j| !workspace(j));
    let range_p = allocs_p[0]..whole_p.end;
    let made_once = allocs_in(events, range_p.clone())
        .into_iter()
        .filter(|&j| made_once(classifier, &events[j], j))
        .chain(skipped)
        .collect();
    Some(Alignment {
        allocs_f,
        allocs_p,
        made_once,
        range_p,
    })
}

/// The `alloc` events in `range` but those made once for the run.
fn made_every_step(
    events: &[TraceEvent],
    range: std::ops::Range<usize>,
    classifier: &BlockClassifier,
) -> Vec<usize> {
    allocs_in(events, range)
        .into_iter()
        .filter(|&j| !made_once(classifier, &events[j], j))
        .collect()
}

/// Two complete steps at different batches (`pp`, then the template's
/// `allocs_p`): `pp`'s allocations, how many align, and their size ratio.
fn two_steps(
    events: &[TraceEvent],
    steps: &Steps,
    pp: usize,
    allocs_p: &[usize],
    classifier: &BlockClassifier,
) -> Option<(Vec<usize>, usize, f64)> {
    let allocs_pp = made_every_step(events, steps.range(pp), classifier);
    let n = aligned(events, &allocs_pp, allocs_p);
    if allocs_pp.len() != allocs_p.len() || n * 20 < allocs_p.len() * 19 {
        return None;
    }
    let ratios: Vec<f64> = allocs_pp
        .iter()
        .zip(allocs_p)
        .take(n)
        .map(|(&i, &j)| (events[i].size as f64, events[j].size as f64))
        .filter(|(a, b)| *b > 0.0 && (a - b).abs() > 0.5)
        .map(|(a, b)| a / b)
        .collect();
    let r = median(ratios)?;
    ((r - 1.0).abs() > 0.05).then_some((allocs_pp, n, r))
}

/// The model from the step before the failing one, when it ran the same code.
fn from_previous_step(
    rec: &Recorded,
    steps: &Steps,
    f: usize,
    oom_index: usize,
    classifier: &BlockClassifier,
) -> Option<Built> {
    let events = rec.events;
    let p = f.checked_sub(1)?;
    let start_f = *steps.starts.get(f)?;
    let Alignment {
        allocs_f,
        allocs_p,
        made_once: made_once_here,
        range_p,
    } = align_with_previous_step(rec, steps, f, oom_index, classifier)?;
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
    let two = p
        .checked_sub(1)
        .and_then(|pp| two_steps(events, steps, pp, &allocs_p, classifier));

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
    let agreement = agreement(&pairs, &allocs_p, &slope_of, growth);

    // Frees of blocks from before the template: those its previous step made
    // become the ones the template itself left live; older ones stay if live.
    let live_at_start = live_before(events, start_f);
    let left_over: HashMap<u64, u64> = match p.checked_sub(1) {
        Some(pp) => made_every_step(events, steps.range(pp), classifier)
            .iter()
            .zip(&allocs_p)
            .filter(|(_, &j)| live_at_start.contains(&events[j].addr))
            .map(|(&i, &j)| (events[i].addr, events[j].addr))
            .collect(),
        None => HashMap::new(),
    };
    let mut out = template_ops(
        rec,
        range_p,
        &slope_of,
        &left_over,
        &live_at_start,
        &made_once_here,
    );
    frees_of_older_blocks(rec, start_f..oom_index, &allocs_f, &live_at_start, &mut out);
    // A template at the failing batch is the run's first step at that
    // batch: a smaller batch would have run it smaller too, and the cache
    // the failing step starts from is shaped by it.
    let prefix_slopes = if (growth - 1.0).abs() <= 0.05 {
        allocs_p
            .iter()
            .filter_map(|j| slope_of.get(j).map(|&s| (*j, s)))
            .filter(|(_, s)| *s != 0.0)
            .collect()
    } else {
        HashMap::new()
    };
    Some(Built {
        prefix_slopes,
        kind: TemplateKind::PreviousStep,
        template_step: Some(p),
        growth,
        slopes,
        agreement,
        ops: out,
        made_once_ids: HashSet::new(),
    })
}

/// The share of the failing step's allocations (`pairs`: actual and
/// template sizes, aligned with the template's `allocs_p`) that the model
/// predicts within 1%.
fn agreement(
    pairs: &[(f64, f64)],
    allocs_p: &[usize],
    slope_of: &HashMap<usize, f64>,
    growth: f64,
) -> f64 {
    let agree = pairs
        .iter()
        .zip(allocs_p)
        .filter(|((actual, base), &j)| {
            let predicted = base + slope_of.get(&j).copied().unwrap_or(0.0) * (growth - 1.0);
            (predicted - actual).abs() <= 0.01 * actual.max(1.0)
        })
        .count();
    if pairs.is_empty() {
        1.0
    } else {
        agree as f64 / pairs.len() as f64
    }
}

/// The template step's operations as the model's: its own blocks under ids
/// of their own with their slopes, frees of blocks from before it mapped to
/// the ones the template left live (`left_over`) or kept when still live.
/// The allocations at `made_once` (and their frees) are left out.
fn template_ops(
    rec: &Recorded<'_>,
    range_p: std::ops::Range<usize>,
    slope_of: &HashMap<usize, f64>,
    left_over: &HashMap<u64, u64>,
    live_at_start: &HashSet<u64>,
    made_once: &HashSet<usize>,
) -> Vec<ModelOp> {
    let mut own: HashSet<u64> = HashSet::new();
    let mut skipped: HashSet<u64> = HashSet::new();
    let mut out = Vec::with_capacity(range_p.len());
    for (j, op) in rec.ops(range_p.clone()) {
        if made_once.contains(&j) {
            if let Op::Alloc { id, .. } | Op::Optional { id, .. } = op {
                skipped.insert(id);
            }
            continue;
        }
        let m = match op {
            Op::Alloc {
                id,
                size,
                stream,
                tag,
            } => {
                own.insert(id);
                ModelOp {
                    op: Op::Alloc {
                        id: id | STEP_IDS,
                        size,
                        stream,
                        tag,
                    },
                    base: size as f64,
                    slope: slope_of.get(&j).copied().unwrap_or(0.0),
                }
            }
            // A workspace keeps its size: cuDNN sizes it for the algorithm
            // it picks, which does not follow the batch.
            Op::Optional {
                id,
                size,
                stream,
                tag,
            } => {
                own.insert(id);
                ModelOp::fixed(Op::allocation(id | STEP_IDS, size, stream, tag, true))
            }
            Op::FreeRequested { id } | Op::FreeCompleted { id } if skipped.contains(&id) => {
                if matches!(op, Op::FreeCompleted { .. }) {
                    skipped.remove(&id);
                }
                continue;
            }
            Op::FreeRequested { id } | Op::FreeCompleted { id } => {
                let id = if own.contains(&id) {
                    id | STEP_IDS
                } else if let Some(&a) = left_over.get(&id) {
                    a
                } else if live_at_start.contains(&id) {
                    id
                } else {
                    continue;
                };
                ModelOp::fixed(match op {
                    Op::FreeRequested { .. } => Op::FreeRequested { id },
                    _ => Op::FreeCompleted { id },
                })
            }
            op => ModelOp::fixed(op),
        };
        out.push(m);
    }
    out
}

/// Adds to the modelled step `out` the frees the failing step (`range`, its
/// allocations `allocs_f`) made of blocks from before it (`live_at_start`)
/// that the template does not free: the previous step's outputs a loop lets
/// go only when the next step rebinds them, which a first step, having no
/// step before it, never shows. Each goes where the failing step made it:
/// after its n-th allocation, before the template's (n+1)-th.
fn frees_of_older_blocks(
    rec: &Recorded<'_>,
    range: std::ops::Range<usize>,
    allocs_f: &[usize],
    live_at_start: &HashSet<u64>,
    out: &mut Vec<ModelOp>,
) {
    let freed_by_template: HashSet<u64> = out
        .iter()
        .filter_map(|m| match m.op {
            Op::FreeRequested { id } | Op::FreeCompleted { id } => Some(id),
            _ => None,
        })
        .collect();
    let mut made: HashSet<u64> = HashSet::new();
    let mut frees: Vec<(usize, Op)> = Vec::new();
    for i in range {
        let Some(e) = rec.events.get(i) else { break };
        match e.action {
            Action::Alloc => {
                made.insert(e.addr);
            }
            Action::FreeRequested | Action::FreeCompleted
                if live_at_start.contains(&e.addr)
                    && !made.contains(&e.addr)
                    && !freed_by_template.contains(&e.addr) =>
            {
                let n = allocs_f.partition_point(|&a| a < i);
                let op = if e.action == Action::FreeRequested {
                    Op::FreeRequested { id: e.addr }
                } else {
                    Op::FreeCompleted { id: e.addr }
                };
                frees.push((n, op));
            }
            _ => {}
        }
    }
    if frees.is_empty() {
        return;
    }
    let mut merged = Vec::with_capacity(out.len() + frees.len());
    let mut pending = frees.into_iter().peekable();
    let mut allocs_seen = 0;
    for m in out.drain(..) {
        if m.is_alloc() {
            while let Some((_, op)) = pending.next_if(|(n, _)| *n <= allocs_seen) {
                merged.push(ModelOp::fixed(op));
            }
            allocs_seen += 1;
        }
        merged.push(m);
    }
    merged.extend(pending.map(|(_, op)| ModelOp::fixed(op)));
    *out = merged;
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

/// A first step modelled from itself alone that failed in its forward gets
/// its backward modelled ([`completion`]): a first step that fails is taken
/// for a training step, as its optimizer state is. The failing step's model
/// becomes [`TemplateKind::FailingStepCompleted`].
fn complete_forward_failure(
    built: &mut Built,
    live: &LiveParameters,
    rec: &Recorded,
    classifier: &BlockClassifier,
    (oom_index, oom): (usize, &TraceEvent),
) -> Option<StepCompletion> {
    let phase = classifier
        .facts()
        .ev_phase
        .get(oom_index)
        .copied()
        .unwrap_or(Phase::Unknown);
    let in_loss = rec.losses.contains(oom.stack);
    if built.kind != TemplateKind::FailingStepOnly || !completion::before_backward(phase, in_loss) {
        return None;
    }
    built.kind = TemplateKind::FailingStepCompleted;
    Some(completion::add_backward(
        &mut built.ops,
        &live.params,
        in_loss,
    ))
}

/// A failure in NLL loss's backward, the first node of `cross_entropy`'s
/// backward, has a known next node: `LogSoftmaxBackward0` makes the
/// gradient of the log-probabilities' input, the same size, while the failed
/// gradient and the saved log-probabilities are still live, then lets the
/// failed one go. Only when the step holds those log-probabilities (a live
/// `log_softmax` output of the failed request's size; native frames tell
/// both). On the 20 real first-step OOMs, hf_gpt2 at 24 failed there and its
/// model said a batch one over the truth; bert at 32 failed there too.
fn next_of_cross_entropy_backward(
    rec: &Recorded,
    classifier: &BlockClassifier,
    (start, oom_index): (usize, usize),
    oom: &TraceEvent,
    failed: &ModelOp,
) -> Vec<ModelOp> {
    let Op::Alloc {
        size, stream, tag, ..
    } = failed.op
    else {
        return Vec::new();
    };
    if !rec.snap.is_nll_loss_backward_stack(oom.stack) {
        return Vec::new();
    }
    let log_softmax = rec.snap.log_softmax_stacks();
    let saved = (start..oom_index.min(rec.events.len())).any(|i| {
        let e = &rec.events[i];
        e.action == Action::Alloc
            && e.size == oom.size
            && log_softmax.contains(e.stack)
            && classifier.live_at(i, oom_index)
    });
    if !saved {
        return Vec::new();
    }
    vec![
        ModelOp {
            op: Op::Alloc {
                id: CROSS_ENTROPY_NEXT_ID,
                size,
                stream,
                tag,
            },
            ..*failed
        },
        ModelOp::fixed(Op::Free {
            id: FAILED_REQUEST_ID,
        }),
    ]
}

/// The model from the failing step alone: its recorded operations up to the
/// failure and the failed request, scaled by category.
fn failing_step_only(
    rec: &Recorded,
    start: usize,
    oom_index: usize,
    oom: TraceEvent,
    classifier: &BlockClassifier,
) -> Built {
    let events = rec.events;
    // What a loss function makes on the model's output scales with the
    // batch too, although it runs in the user's code.
    let scales = |e: &TraceEvent, i: usize| {
        scales_by_category(classifier, e, i) || rec.losses.contains(e.stack)
    };
    let recorded = rec.ops(start..oom_index.min(events.len()));
    let made_once_ids = recorded
        .iter()
        .filter(|&&(i, _)| events[i].action == Action::Alloc)
        .filter(|&&(i, _)| made_once(classifier, &events[i], i))
        .map(|&(i, _)| events[i].addr)
        .collect();
    let mut out: Vec<ModelOp> = recorded
        .into_iter()
        .map(|(i, op)| match op {
            Op::Alloc { size, .. } => ModelOp {
                op,
                base: size as f64,
                slope: if scales(&events[i], i) {
                    size as f64
                } else {
                    0.0
                },
            },
            op => ModelOp::fixed(op),
        })
        .collect();
    // The failed request, classified by the phase it was made in; it stays
    // live (the step needed it until its end, as far as anyone knows), but
    // for NLL loss's backward, whose next node is known.
    let failed = match rec.alloc(&oom) {
        Op::Alloc {
            size, stream, tag, ..
        } => Op::Alloc {
            id: FAILED_REQUEST_ID,
            size,
            stream,
            tag,
        },
        op => op,
    };
    let failed = ModelOp {
        op: failed,
        base: oom.size as f64,
        slope: if scales(&oom, oom_index) {
            oom.size as f64
        } else {
            0.0
        },
    };
    let next = next_of_cross_entropy_backward(rec, classifier, (start, oom_index), &oom, &failed);
    out.push(failed);
    out.extend(next);
    Built {
        prefix_slopes: HashMap::new(),
        kind: TemplateKind::FailingStepOnly,
        template_step: None,
        growth: 1.0,
        slopes: SlopeSource::Categories,
        agreement: 1.0,
        ops: out,
        made_once_ids,
    }
}
