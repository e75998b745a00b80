//! The failing step's memory split into what scales with the batch and what
//! does not, from the trace's real steps (markers, optimizer steps, backward
//! passes; never a model's layers).
//!
//! What scales: what a step makes itself (activations, temporaries of the
//! forward and backward passes, inputs, the gradients backward makes); its
//! peak within the step is the step's *own peak*. What does not: parameters,
//! optimizer state and cuBLAS's workspaces (the first step makes them once),
//! workspaces, what earlier steps left, and the allocator's cache.
//!
//! When complete steps before the failing one ran the same code at other
//! batch sizes (their allocations from the same stacks have sizes in one
//! ratio), the own peak is fitted against the batch by least squares:
//! `peak(x) = intercept + slope * x`, with `x` the batch as a fraction of the
//! failing one; the intercept is what a step makes that does not scale (the
//! parameters' gradients when they are live at the peak). Otherwise the
//! model is an estimate: the own peak of one step (a complete step at the
//! failing batch, or the failing step up to the failure) taken as
//! proportional to the batch.

use super::whatif::{allocs_in, median, StepModel, TemplateKind};
use crate::analysis::categories::Category;
use crate::analysis::peak::BlockClassifier;
use crate::analysis::steps::Steps;
use crate::replay::LiveBlock;
use crate::snapshot::{Action, TraceEvent};
use crate::units::format_bytes;
use hashbrown::HashMap;
use serde::Serialize;

/// Where the slope comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchSlopeSource {
    /// Fitted on complete steps at two or more batch sizes.
    FittedSteps,
    /// One complete step at the failing batch, scaled in proportion (an estimate).
    CompleteStep,
    /// The failing step up to the failure, scaled in proportion: an estimate
    /// and a lower bound (what the step needed after the failure is unknown).
    FailingStep,
}

impl BatchSlopeSource {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchSlopeSource::FittedSteps => "fitted_steps",
            BatchSlopeSource::CompleteStep => "complete_step",
            BatchSlopeSource::FailingStep => "failing_step",
        }
    }
}

/// One step the model was made from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPoint {
    /// The step (from 1).
    pub step: usize,
    /// Its batch as a fraction of the failing step's (from the sizes of the
    /// allocations both made).
    pub relative_batch: f64,
    /// Its batch in samples, when the failing batch is given.
    pub batch: Option<f64>,
    /// The peak of what it made itself (all but parameters, optimizer state
    /// and workspaces, which the first step makes once for the run).
    pub own_peak_bytes: u64,
    /// Whether the step ran to its end (the failing step did not).
    pub complete: bool,
}

/// The part of the failing step's memory that does not scale with the
/// batch, held at the failure, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FixedParts {
    /// Parameters.
    pub parameters_bytes: u64,
    /// Gradients.
    pub gradients_bytes: u64,
    /// Optimizer state.
    pub optimizer_state_bytes: u64,
    /// Workspaces and blocks made inside PyTorch (cuBLAS's, ...).
    pub workspaces_bytes: u64,
    /// Tensors left over from earlier steps (outputs, losses, batches).
    pub left_over_bytes: u64,
    /// Reserved but unallocated at the failure (the allocator's cache).
    pub cache_bytes: u64,
}

impl FixedParts {
    /// The sum.
    pub fn total(&self) -> u64 {
        self.parameters_bytes
            + self.gradients_bytes
            + self.optimizer_state_bytes
            + self.workspaces_bytes
            + self.left_over_bytes
            + self.cache_bytes
    }
}

/// The failing step's memory against its batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BatchModel {
    /// Where the slope comes from.
    pub source: BatchSlopeSource,
    /// True unless fitted on steps at several batch sizes.
    pub estimate: bool,
    /// True when the failing step is known only up to the failure and no
    /// complete step of the same code gives its whole shape: the step needs
    /// at least this much, maybe more.
    pub lower_bound: bool,
    /// The failing batch, when given (`--batch`).
    pub failing_batch: Option<u64>,
    /// Bytes per sample of what scales, when the failing batch is given.
    pub slope_bytes_per_sample: Option<f64>,
    /// Bytes of what scales per whole failing batch (the slope against the
    /// batch as a fraction of the failing one).
    pub slope_bytes_per_batch: f64,
    /// The fitted line's value at batch 0 (0 for an estimate).
    pub intercept_bytes: f64,
    /// The step's own peak the model gives at the failing batch.
    pub own_peak_at_failing_batch_bytes: u64,
    /// What does not scale, by kind.
    pub fixed: FixedParts,
    /// The sum of `fixed`.
    pub fixed_bytes: u64,
    /// The steps used.
    pub points: Vec<StepPoint>,
    /// The model in a sentence.
    pub text: String,
}

/// Inputs of [`fit`].
pub struct Inputs<'a> {
    /// The trace's events.
    pub events: &'a [TraceEvent],
    /// Its steps.
    pub steps: &'a Steps,
    /// Categories of its blocks.
    pub classifier: &'a BlockClassifier<'a>,
    /// The `oom` event.
    pub oom_index: usize,
    /// How the what-if model of the failing step was built.
    pub step_model: &'a StepModel,
    /// The failing batch, when given.
    pub batch: Option<u64>,
    /// Blocks live right before the failure.
    pub live: &'a [LiveBlock],
    /// Reserved but unallocated right before the failure.
    pub cache: u64,
}

/// Whether the block made at alloc event `i` is made once for the run
/// (parameters, optimizer state, cuBLAS's workspaces: the first step makes
/// them) rather than by every step.
pub(super) fn made_once(c: &BlockClassifier, e: &TraceEvent, i: usize) -> bool {
    let (cat, _) = c.classify(Some(i as u32), e.stack);
    matches!(cat, Category::Parameter | Category::OptimizerState)
        || c.is_cublas_workspace(Some(i as u32))
}

/// The peak of what the events in `range` made and had not yet freed (the
/// failed request, when `failed` is given, counts as made at the end),
/// leaving out what is made once for the run.
fn own_peak(
    inp: &Inputs,
    range: std::ops::Range<usize>,
    failed: Option<(usize, &TraceEvent)>,
) -> u64 {
    let mut own: HashMap<u64, u64> = HashMap::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for i in range {
        let Some(e) = inp.events.get(i) else { break };
        match e.action {
            Action::Alloc if !made_once(inp.classifier, e, i) => {
                own.insert(e.addr, e.size);
                now += e.size;
                peak = peak.max(now);
            }
            // The first of a free's entries (a trace may lack the request).
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(s) = own.remove(&e.addr) {
                    now = now.saturating_sub(s);
                }
            }
            _ => {}
        }
    }
    if let Some((i, e)) = failed {
        if !made_once(inp.classifier, e, i) {
            peak = peak.max(now + e.size);
        }
    }
    peak
}

/// Allocations of two steps paired by stack: the n-th allocation from a
/// stack in one step with the n-th from that stack in the other. Allocations
/// one step makes and the other does not (the first step also builds the
/// model, the optimizer state and cuBLAS's workspaces) find no partner and
/// do not shift the others.
fn paired(events: &[TraceEvent], a: &[usize], b: &[usize]) -> Vec<(usize, usize)> {
    let mut by_stack: HashMap<u32, (Vec<usize>, usize)> = HashMap::new();
    for &j in b {
        by_stack.entry(events[j].stack).or_default().0.push(j);
    }
    let mut out = Vec::new();
    for &i in a {
        if let Some((js, next)) = by_stack.get_mut(&events[i].stack) {
            if let Some(&j) = js.get(*next) {
                out.push((i, j));
                *next += 1;
            }
        }
    }
    out
}

/// Step `k`'s batch relative to step `p`'s: the median ratio of the sizes
/// that differ among the allocations both made from the same stacks, in
/// order; `None` when they did not run the same code.
fn relative_batch(events: &[TraceEvent], steps: &Steps, k: usize, p: usize) -> Option<f64> {
    if k == p {
        return Some(1.0);
    }
    let a = allocs_in(events, steps.range(k));
    let b = allocs_in(events, steps.range(p));
    let pairs = paired(events, &a, &b);
    // Most of the shorter step's allocations paired: the same code.
    if pairs.is_empty() || pairs.len() * 10 < a.len().min(b.len()) * 9 {
        return None;
    }
    let ratios: Vec<f64> = pairs
        .iter()
        .map(|&(i, j)| (events[i].size as f64, events[j].size as f64))
        .filter(|(x, y)| *y > 0.0 && (x - y).abs() > 0.5)
        .map(|(x, y)| x / y)
        .collect();
    Some(median(ratios).unwrap_or(1.0))
}

/// Least squares of `y = a + s * x`; `None` with fewer than two distinct `x`.
fn line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if points.len() < 2 || sxx < 1e-6 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let s = sxy / sxx;
    Some((my - s * mx, s))
}

/// What does not scale, held at the failure, by kind: parameters,
/// optimizer state and workspaces whenever they were made (the first step
/// also builds the model), gradients and tensors of other kinds when an
/// earlier step left them, and the cache.
fn fixed_parts(inp: &Inputs) -> FixedParts {
    let start = inp.step_model.failing_step_start;
    let mut f = FixedParts {
        cache_bytes: inp.cache,
        ..FixedParts::default()
    };
    for b in inp.live.iter().filter(|b| !b.pending_free) {
        let (cat, _) = inp.classifier.classify(b.alloc_index, b.stack);
        let in_step = b.alloc_index.is_some_and(|a| a as usize >= start);
        let slot = match cat {
            Category::Parameter => &mut f.parameters_bytes,
            Category::OptimizerState => &mut f.optimizer_state_bytes,
            Category::Other => &mut f.workspaces_bytes,
            // A gradient made in the failing step may be an activation's
            // (backward's own temporaries): only earlier steps' count.
            Category::Gradient if !in_step => &mut f.gradients_bytes,
            _ if in_step => continue,
            _ => &mut f.left_over_bytes,
        };
        *slot += b.size;
    }
    f
}

/// The model of the failing step against its batch.
pub fn fit(inp: &Inputs) -> Option<BatchModel> {
    let m = inp.step_model;
    let f = m.failing_step.checked_sub(1)?;
    let events = inp.events;
    let oom = events.get(inp.oom_index)?;
    // Complete steps of the same code, each with its batch relative to the
    // failing step's: relative to the template (the step before the failing
    // one), then through the template's growth.
    let mut points = Vec::new();
    if let (TemplateKind::PreviousStep, Some(t)) = (m.template, m.template_step) {
        let p = t.checked_sub(1)?;
        for k in 0..f {
            let Some(r) = relative_batch(events, inp.steps, k, p) else {
                continue;
            };
            let x = r / m.growth.max(1e-9);
            points.push(StepPoint {
                step: k + 1,
                relative_batch: x,
                batch: inp.batch.map(|b| x * b as f64),
                own_peak_bytes: own_peak(inp, inp.steps.range(k), None),
                complete: true,
            });
        }
    }
    let xy: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.relative_batch, p.own_peak_bytes as f64))
        .collect();
    let fitted = line(&xy).filter(|&(_, s)| s > 0.0);
    let (source, intercept, slope) = match fitted {
        Some((a, s)) => (BatchSlopeSource::FittedSteps, a, s),
        None => {
            // One step, in proportion: the template at the failing batch,
            // else the failing step up to the failure.
            let same = points
                .iter()
                .find(|p| (p.relative_batch - 1.0).abs() < 0.01)
                .cloned();
            match same {
                Some(p) => {
                    let peak = p.own_peak_bytes as f64;
                    points = vec![p];
                    (BatchSlopeSource::CompleteStep, 0.0, peak)
                }
                None => {
                    let peak = own_peak(
                        inp,
                        m.failing_step_start..inp.oom_index,
                        Some((inp.oom_index, oom)),
                    );
                    points = vec![StepPoint {
                        step: m.failing_step,
                        relative_batch: 1.0,
                        batch: inp.batch.map(|b| b as f64),
                        own_peak_bytes: peak,
                        complete: false,
                    }];
                    (BatchSlopeSource::FailingStep, 0.0, peak as f64)
                }
            }
        }
    };
    let fixed = fixed_parts(inp);
    let per_sample = inp.batch.filter(|&b| b > 0).map(|b| slope / b as f64);
    let at_failing = (intercept + slope).max(0.0).round() as u64;
    let lower_bound = source == BatchSlopeSource::FailingStep;
    let mut model = BatchModel {
        source,
        estimate: source != BatchSlopeSource::FittedSteps,
        lower_bound,
        failing_batch: inp.batch,
        slope_bytes_per_sample: per_sample,
        slope_bytes_per_batch: slope,
        intercept_bytes: intercept,
        own_peak_at_failing_batch_bytes: at_failing,
        fixed_bytes: fixed.total(),
        fixed,
        points,
        text: String::new(),
    };
    model.text = describe(&model, m.completion.is_some());
    Some(model)
}

/// The model in a sentence ("fitted on steps 1, 2, 3 (batch 4, 6, 8): 61.31
/// MiB per sample scales ..."); `completed`: the what-if model completed the
/// failing step past its failure (its backward modelled).
fn describe(m: &BatchModel, completed: bool) -> String {
    let steps = m
        .points
        .iter()
        .map(|p| p.step.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let batches = m
        .points
        .iter()
        .map(|p| match p.batch {
            Some(b) => format!("{}", (b * 10.0).round() / 10.0),
            None => format!("{:.2}x", p.relative_batch),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let rate = match m.slope_bytes_per_sample {
        Some(s) => format!("{} per sample", format_bytes(s.max(0.0).round() as u64)),
        None => format!(
            "{} per failing batch",
            format_bytes(m.slope_bytes_per_batch.max(0.0).round() as u64)
        ),
    };
    let how = match m.source {
        BatchSlopeSource::FittedSteps => format!(
            "fitted on steps {steps} (batch {batches}): what a step makes itself grows by \
             {rate} ({} at the failing batch)",
            format_bytes(m.own_peak_at_failing_batch_bytes)
        ),
        BatchSlopeSource::CompleteStep => format!(
            "estimate from step {steps}, a complete step at the failing batch, what it makes \
             itself taken as proportional to the batch: {rate}"
        ),
        BatchSlopeSource::FailingStep if completed => format!(
            "estimate from step {steps} up to the failure, what it made itself taken as \
             proportional to the batch: {rate}; the rest of the step, not recorded, is modelled \
             for the fixes below and not counted here"
        ),
        BatchSlopeSource::FailingStep => format!(
            "estimate from step {steps} up to the failure, what it made itself taken as \
             proportional to the batch: {rate}, a lower bound (what the step needed after the \
             failure is unknown)"
        ),
    };
    let f = &m.fixed;
    let parts: Vec<String> = [
        ("parameters", f.parameters_bytes),
        ("gradients", f.gradients_bytes),
        ("optimizer state", f.optimizer_state_bytes),
        ("workspaces", f.workspaces_bytes),
        ("left over from earlier steps", f.left_over_bytes),
        ("cache", f.cache_bytes),
    ]
    .iter()
    .filter(|(_, b)| *b > 0)
    .map(|(n, b)| format!("{n} {}", format_bytes(*b)))
    .collect();
    format!(
        "{how}; does not scale: {} ({})",
        format_bytes(m.fixed_bytes),
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::line;

    #[test]
    fn least_squares_recovers_a_line() {
        let pts = [(0.25, 110.0), (0.375, 160.0), (0.5, 210.0)];
        let (a, s) = line(&pts).expect("a line");
        assert!(
            (s - 400.0).abs() < 1e-9 && (a - 10.0).abs() < 1e-9,
            "{a} {s}"
        );
        assert_eq!(line(&[(1.0, 3.0), (1.0, 4.0)]), None);
    }
}
