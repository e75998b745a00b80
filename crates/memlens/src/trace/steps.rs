//! Iterations (training or inference steps) in a trace, from evidence.
//!
//! Steps are never guessed from inner loops (a model's layers, an optimizer's
//! per-parameter loop): cutting one training step into a hundred "steps" makes
//! everything it creates look like growth. The evidence, in order of trust:
//!
//! 1. **Markers**: the `memlens.step N` annotations that `memlens.step()`
//!    leaves in `external_annotations` at the end of each step.
//! 2. **Optimizer steps**: PyTorch's own `Optimizer.step#...` annotations
//!    (every `torch.optim` optimizer records one).
//! 3. **The training loop**: the outermost user frame whose line goes back
//!    at each iteration, outside any module's forward and any optimizer;
//!    rejected when it iterates more often than backward passes run (an inner
//!    loop of one step).
//! 4. **Backward passes**: one step per backward pass.
//!
//! Otherwise the trace is one step, and no growth verdict is drawn from it.

use crate::frames::{self, FrameKind};
use crate::snapshot::{Action, Snapshot, TraceEvent};
use crate::trace::categories::Phase;
use serde::Serialize;

/// Name of the annotation `memlens.step()` leaves (`memlens.step N`).
pub const STEP_MARKER: &str = "memlens.step";

/// How the steps were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepMethod {
    /// From `memlens.step()` markers.
    Markers,
    /// From `Optimizer.step` annotations.
    Optimizer,
    /// From the line of the training loop's frame going back at each iteration.
    Loop,
    /// One step per backward pass.
    Backward,
    /// One step recorded (or no evidence of more): no growth verdicts.
    None,
}

impl StepMethod {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            StepMethod::Markers => "markers",
            StepMethod::Optimizer => "optimizer",
            StepMethod::Loop => "loop",
            StepMethod::Backward => "backward",
            StepMethod::None => "none",
        }
    }
}

/// Steps of one device trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Steps {
    /// Event index where each step starts; the first is always 0.
    pub starts: Vec<usize>,
    /// Total number of events (the end of the last step).
    pub end: usize,
    /// How they were found.
    pub method: StepMethod,
    /// The loop, as `file:function` (for [`StepMethod::Loop`]).
    pub loop_function: Option<String>,
    /// Whether the last step is complete (ended by a marker or an optimizer
    /// step); a trace dumped in the middle of a step ends with a partial one.
    pub last_complete: bool,
}

impl Steps {
    /// Number of steps.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when there is no event.
    pub fn is_empty(&self) -> bool {
        self.end == 0
    }

    /// The event range of step `i`.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let a = self.starts[i];
        let b = self.starts.get(i + 1).copied().unwrap_or(self.end);
        a..b
    }

    /// The step (from 0) that event `index` belongs to.
    pub fn step_of(&self, index: usize) -> usize {
        self.starts
            .partition_point(|&s| s <= index)
            .saturating_sub(1)
    }

    /// The whole trace as one step.
    pub fn one(end: usize) -> Steps {
        Steps {
            starts: vec![0],
            end,
            method: StepMethod::None,
            loop_function: None,
            last_complete: true,
        }
    }
}

/// Finds the steps of trace `trace` of `snap`; `phases` is the phase of each
/// of its events ([`crate::trace::categories::event_phases`]).
pub fn detect(snap: &Snapshot, trace: usize, phases: &[Phase]) -> Steps {
    let Some(t) = snap.traces.get(trace) else {
        return Steps::one(0);
    };
    let events = &t.events;
    let backward_runs = backward_runs(phases);
    let markers = by_annotations(snap, t.device, events, STEP_MARKER, StepMethod::Markers);
    if let Some(m) = markers.filter(|m| covers(m, events)) {
        return m;
    }
    let optimizer = by_annotations(
        snap,
        t.device,
        events,
        "Optimizer.step",
        StepMethod::Optimizer,
    );
    let looped = by_loop_frame(snap, events, phases);
    // Optimizer steps are the better evidence where they cover the trace; an
    // evaluation loop after training has none, and its loop does.
    match (optimizer, looped) {
        (Some(o), Some(l)) if !covers(&o, events) && l.len() > o.len() => l,
        (Some(o), _) => o,
        (None, Some(l)) => l,
        (None, None) => by_backward(events.len(), phases, &backward_runs)
            .unwrap_or_else(|| Steps::one(events.len())),
    }
}

/// Whether steps cover the trace: what follows the last cut holds no more
/// allocations than twice the largest step before it (a teardown or a
/// partial step, not a stretch of different work with no evidence).
fn covers(st: &Steps, events: &[TraceEvent]) -> bool {
    let allocs = |r: std::ops::Range<usize>| {
        events[r]
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .count()
    };
    let n = st.len();
    if n < 2 {
        return false;
    }
    let largest = (0..n - 1).map(|i| allocs(st.range(i))).max().unwrap_or(0);
    allocs(st.range(n - 1)) <= 2 * largest.max(1)
}

/// Steps cut after each annotation scope named `prefix...` ends (its END, or
/// its START when no END was recorded).
fn by_annotations(
    snap: &Snapshot,
    device: u32,
    events: &[TraceEvent],
    prefix: &str,
    method: StepMethod,
) -> Option<Steps> {
    let named: Vec<_> = snap
        .annotations
        .iter()
        .filter(|a| a.device == device && snap.str(a.name).starts_with(prefix))
        .collect();
    let has_end = named.iter().any(|a| !a.start);
    let mut times: Vec<i64> = named
        .iter()
        .filter(|a| a.start != has_end)
        .map(|a| a.time_us)
        .collect();
    if times.is_empty() || events.is_empty() || events.iter().all(|e| e.time_us == 0) {
        return None;
    }
    times.sort_unstable();
    let mut starts = vec![0];
    for t in &times {
        let i = events.partition_point(|e| e.time_us <= *t);
        if i > *starts.last().unwrap_or(&0) && i < events.len() {
            starts.push(i);
        }
    }
    // Nothing after the last marker: the trace ends with a whole step (else
    // what follows is a partial step or the teardown after the loop).
    let last_complete = times
        .last()
        .is_some_and(|t| events.partition_point(|e| e.time_us <= *t) == events.len());
    // Annotations of steps before the recorded window cut nothing.
    let first_time = events.first().map_or(0, |e| e.time_us);
    if times.iter().all(|t| *t < first_time) {
        return None;
    }
    Some(Steps {
        starts,
        end: events.len(),
        method,
        loop_function: None,
        last_complete,
    })
}

/// Maximal runs of backward-phase events, as (first, last) indices.
fn backward_runs(phases: &[Phase]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut cur: Option<(usize, usize)> = None;
    for (i, p) in phases.iter().enumerate() {
        match (*p == Phase::Backward, cur) {
            (true, None) => cur = Some((i, i)),
            (true, Some((a, _))) => cur = Some((a, i)),
            // Unknown (no stack) events inside backward do not end it.
            (false, Some(_)) if *p == Phase::Unknown => {}
            (false, Some(r)) => {
                runs.push(r);
                cur = None;
            }
            (false, None) => {}
        }
    }
    runs.extend(cur);
    // Two runs separated only by an optimizer step or nothing are one pass
    // only if nothing forward happened in between; keep them apart otherwise.
    runs
}

/// One step per backward pass: a step ends where the next forward begins
/// after a backward pass (so the optimizer step stays with its backward).
fn by_backward(end: usize, phases: &[Phase], runs: &[(usize, usize)]) -> Option<Steps> {
    if runs.len() < 2 {
        return None;
    }
    let mut starts = vec![0];
    for &(_, last) in &runs[..runs.len() - 1] {
        let next = phases[last + 1..]
            .iter()
            .position(|p| matches!(p, Phase::Forward | Phase::User))
            .map(|k| last + 1 + k);
        if let Some(n) = next {
            if n > *starts.last().unwrap_or(&0) {
                starts.push(n);
            }
        }
    }
    (starts.len() >= 2).then_some(Steps {
        starts,
        end,
        method: StepMethod::Backward,
        loop_function: None,
        last_complete: false,
    })
}

/// For each stack: the user frames that can run a training loop, outermost
/// first. The chain stops at the first module call (`nn.Module.__call__`) or
/// optimizer code below it: loops there are a model's layers or an
/// optimizer's parameters, not steps.
fn loop_chains(snap: &Snapshot) -> Vec<Vec<u32>> {
    let kinds: Vec<FrameKind> = snap
        .frames
        .iter()
        .map(|f| frames::classify(snap.str(f.filename), snap.str(f.name)))
        .collect();
    (0..snap.stack_ranges.len() as u32)
        .map(|s| {
            let mut chain = Vec::new();
            for &f in snap.stack(s).iter().rev() {
                let fr = snap.frame(f);
                let file = snap.str(fr.filename);
                let name = snap.str(fr.name);
                let module_call = (name == "_call_impl" || name == "_wrapped_call_impl")
                    && file.ends_with("nn/modules/module.py");
                if module_call || file.contains("/torch/optim/") || name == "step" {
                    // A method named `step` is an optimizer or a scheduler;
                    // its own loops are over parameters.
                    if name == "step" && kinds[f as usize].is_user() {
                        chain.push(f);
                    }
                    break;
                }
                if kinds[f as usize].is_user() {
                    chain.push(f);
                }
            }
            chain
        })
        .collect()
}

const MAX_DEPTH: usize = 16;

fn by_loop_frame(snap: &Snapshot, events: &[TraceEvent], phases: &[Phase]) -> Option<Steps> {
    // Each stack's chain as the walk below reads it, worked out once per
    // stack rather than once per allocation: (function key, line) per
    // depth, at most MAX_DEPTH deep, ending before a frame named `step` (a
    // loop inside an optimizer's `step` is over parameters).
    let chains: Vec<Vec<((u32, u32), u32)>> = loop_chains(snap)
        .into_iter()
        .map(|chain| {
            chain
                .into_iter()
                .take(MAX_DEPTH)
                .map(|f| snap.frame(f))
                .take_while(|fr| snap.str(fr.name) != "step")
                .map(|fr| ((fr.filename, fr.name), fr.line))
                .collect()
        })
        .collect();
    // For each depth: the previous (function key, line), and jumps per function.
    let mut prev: Vec<Option<((u32, u32), u32)>> = vec![None; MAX_DEPTH];
    let mut jumps: Vec<std::collections::HashMap<(u32, u32), Vec<usize>>> =
        vec![Default::default(); MAX_DEPTH];
    // An allocation under the stack of the one before it changes nothing:
    // each depth already holds its own (key, line), and a line is not
    // below itself.
    let mut last_stack = None;
    for (i, e) in events.iter().enumerate() {
        if e.action != Action::Alloc || last_stack == Some(e.stack) {
            continue;
        }
        last_stack = Some(e.stack);
        let Some(chain) = chains.get(e.stack as usize) else {
            continue;
        };
        for (d, &(k, line)) in chain.iter().enumerate() {
            if let Some((pk, pl)) = prev[d] {
                if pk == k && line < pl {
                    jumps[d].entry(k).or_default().push(i);
                }
            }
            prev[d] = Some((k, line));
        }
    }
    // The outermost depth with a loop that went round at least twice.
    for level in jumps.iter() {
        let Some((k, starts)) = level
            .iter()
            .filter(|(_, v)| v.len() >= 2)
            .max_by_key(|(_, v)| v.len())
        else {
            continue;
        };
        // A training or evaluation loop calls the model in every iteration;
        // a loop whose iterations do not (over parameters, over data) is
        // inside a step.
        if !each_iteration_has_forward(starts, phases) {
            return None;
        }
        let mut all = vec![0];
        all.extend(starts.iter().copied().filter(|&s| s > 0));
        return Some(Steps {
            starts: all,
            end: events.len(),
            method: StepMethod::Loop,
            loop_function: Some(format!("{}:{}", snap.str(k.0), snap.str(k.1))),
            last_complete: false,
        });
    }
    None
}

/// Whether every whole iteration between consecutive `starts` holds a
/// forward-pass event (true when the trace has none at all: no model).
fn each_iteration_has_forward(starts: &[usize], phases: &[Phase]) -> bool {
    if !phases.contains(&Phase::Forward) {
        return true;
    }
    starts.windows(2).all(|w| {
        phases
            .get(w[0]..w[1])
            .is_some_and(|p| p.contains(&Phase::Forward))
    })
}
