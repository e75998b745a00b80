//! The rest of a step that failed in its forward pass, when no earlier step
//! ran its code to the end: the backward pass, modelled from the forward's
//! saved tensors.
//!
//! A step that fails in its forward stops before the part that usually
//! needs the most: the backward pass starts with every activation the
//! forward saved still live and makes gradients on top of them. Without a
//! recorded backward the model walks the forward's saved tensors in reverse,
//! as autograd does: each one's gradient (its size, scaling with the batch as
//! it does) is made in turn, and a saved tensor and its gradient are let go
//! once the gradients of the next two in the walk are made, so that three
//! gradients are live at the top of each node (measured, not derived). The
//! parameters' gradients are made as the walk goes, last parameter first, in
//! step with the saved bytes released. On the eight snapshots of
//! tests/corpus/oom/first_step whose first step ran whole at a batch near the
//! largest (seven workloads), this predicts that step's backward peak
//! allocated within 0.4% on five and 2.6-5.3% under on the ResNet and the
//! small ViT (tests/gpu/RESULTS.md, twentieth session, with the reruns of
//! the whole steps it completed).
//!
//! What comes after the failure in the forward is known only when the failure
//! was in the loss ([`crate::frames::is_loss`]): the loss is the forward's last work, so the step modelled is
//! whole. A failure before it leaves the rest of the forward out, and the
//! model stays a lower bound.

use super::whatif::{ModelOp, STEP_IDS};
use crate::analysis::categories::Phase;
use crate::sim::program::Op;
use hashbrown::{HashMap, HashSet};
use serde::Serialize;

/// The modelled backward's tensors are named from here up.
const BACKWARD_IDS: u64 = STEP_IDS | (1 << 59);
/// The next step's tensors are named as the first's with this bit set.
const NEXT_STEP_IDS: u64 = 1 << 61;

/// How many of the walked tensors' gradients stay live after the next one
/// is made (the parameters' aside): two, which matched the recorded
/// backward's peak best on tests/corpus/oom/first_step (one: 6% under on
/// HF GPT-2, whose head leaves two logits-sized gradients live; three:
/// 1.7% over on ViT-B).
const GRADIENTS_IN_FLIGHT: usize = 2;

/// How a step that failed in its forward was completed, for the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepCompletion {
    /// The forward was whole: it failed in the loss, its last work.
    pub forward_whole: bool,
    /// Bytes of the forward's saved tensors (live at the failure, scaling
    /// with the batch, the failed request included) whose gradients the
    /// modelled backward makes, at the failing batch.
    pub saved_bytes: u64,
    /// Bytes of the parameters' gradients the modelled backward makes.
    pub gradient_bytes: u64,
    /// Whether the step was modelled twice, as the run's first step (whose
    /// optimizer makes its state after the backward) and then as the next,
    /// which holds that state and starts from the cache the first left.
    pub next_step_modelled: bool,
    /// The names of the parameters' gradients in the modelled backward.
    #[serde(skip)]
    pub(super) gradient_ids: Vec<u64>,
}

/// Appends to `ops` (a step modelled up to and including its failed request,
/// in its forward) a model of its backward: `params` are the parameters live
/// at the failure, as (size, stream key), in the order they were made.
/// `forward_whole` says whether the forward ended at the failure.
pub(super) fn add_backward(
    ops: &mut Vec<ModelOp>,
    params: &[(u64, u64)],
    forward_whole: bool,
) -> StepCompletion {
    let saved = saved_tensors(ops);
    let saved_bytes: f64 = saved.iter().map(|m| m.base).sum();
    let param_bytes: f64 = params.iter().map(|&(s, _)| s as f64).sum();
    let next_id = std::cell::Cell::new(BACKWARD_IDS);
    let fresh = || {
        next_id.set(next_id.get() + 1);
        next_id.get()
    };
    let mut gradient_ids = Vec::with_capacity(params.len());
    // A parameter's gradient, kept until `zero_grad()`.
    let mut make_gradient = |ops: &mut Vec<ModelOp>, size: u64, stream: u64| {
        let id = fresh();
        gradient_ids.push(id);
        ops.push(ModelOp::fixed(Op::Alloc {
            id,
            size,
            stream,
            tag: 0,
        }));
    };
    // Gradients in flight: (gradient id, saved tensor id).
    let mut in_flight: std::collections::VecDeque<(u64, u64)> = Default::default();
    let mut released = 0.0;
    let mut grads_made = 0.0;
    let mut params_left = params.iter().rev().peekable();
    for t in saved.iter().rev() {
        let Op::Alloc {
            id, stream, tag, ..
        } = t.op
        else {
            continue;
        };
        let grad = fresh();
        ops.push(ModelOp {
            op: Op::Alloc {
                id: grad,
                size: t.base.round() as u64,
                stream,
                tag,
            },
            base: t.base,
            slope: t.slope,
        });
        in_flight.push_back((grad, id));
        while in_flight.len() > GRADIENTS_IN_FLIGHT {
            if let Some((g, s)) = in_flight.pop_front() {
                ops.push(ModelOp::fixed(Op::Free { id: g }));
                ops.push(ModelOp::fixed(Op::Free { id: s }));
            }
        }
        released += t.base;
        // The parameters' gradients keep pace with the saved bytes walked.
        let due = if saved_bytes > 0.0 {
            param_bytes * released / saved_bytes
        } else {
            param_bytes
        };
        while let Some(&&(size, stream)) = params_left.peek() {
            if grads_made + size as f64 > due + 1.0 {
                break;
            }
            grads_made += size as f64;
            make_gradient(ops, size, stream);
            params_left.next();
        }
    }
    for &(size, stream) in params_left {
        make_gradient(ops, size, stream);
    }
    for (g, s) in in_flight {
        ops.push(ModelOp::fixed(Op::Free { id: g }));
        ops.push(ModelOp::fixed(Op::Free { id: s }));
    }
    StepCompletion {
        forward_whole,
        saved_bytes: saved_bytes.round() as u64,
        gradient_bytes: param_bytes.round() as u64,
        next_step_modelled: false,
        gradient_ids,
    }
}

/// A first step completed by [`add_backward`] (`first`) followed by the
/// optimizer's first `step()`, which makes its `state`, `zero_grad()`
/// (the gradients let go: `set_to_none=True`, PyTorch's default), and the
/// next step: the same operations but for what the run makes once
/// (`made_once`: parameters, cuBLAS workspaces), which it finds made. The
/// next step holds the state through its forward and backward and starts
/// from the cache the first step and the state shaped.
pub(super) fn with_next_step(
    first: Vec<ModelOp>,
    state: Vec<ModelOp>,
    completion: &mut StepCompletion,
    made_once: &HashSet<u64>,
) -> Vec<ModelOp> {
    let next = next_step(&first, made_once);
    let mut out = first;
    out.reserve(state.len() + completion.gradient_ids.len() + next.len());
    out.extend(state);
    out.extend(
        completion
            .gradient_ids
            .iter()
            .map(|&id| ModelOp::fixed(Op::Free { id })),
    );
    out.extend(next);
    completion.next_step_modelled = true;
    out
}

/// The operations of `step` run again as the next step: its own tensors
/// renamed, what is made once for the run left out, and frees of tensors
/// from before it (gone after the first run) dropped.
fn next_step(step: &[ModelOp], made_once: &HashSet<u64>) -> Vec<ModelOp> {
    let mut own: HashSet<u64> = HashSet::new();
    let mut out = Vec::with_capacity(step.len());
    for m in step {
        let op = match (m.op, m.op.id()) {
            (_, None) => m.op,
            (Op::Alloc { .. } | Op::Optional { .. }, Some(id)) => {
                if made_once.contains(&id) {
                    continue;
                }
                own.insert(id);
                m.op.renamed(|id| id | NEXT_STEP_IDS)
            }
            (_, Some(id)) if own.contains(&id) => m.op.renamed(|id| id | NEXT_STEP_IDS),
            // A free of a tensor from before the step: gone after the first.
            _ => continue,
        };
        out.push(ModelOp { op, ..*m });
    }
    out
}

/// The allocations of `ops` still live at its end that scale with the
/// batch (the forward's activations and inputs), in the order they were made.
fn saved_tensors(ops: &[ModelOp]) -> Vec<ModelOp> {
    let mut live: HashMap<u64, usize> = HashMap::new();
    for (k, m) in ops.iter().enumerate() {
        match m.op {
            Op::Alloc { id, .. } => {
                live.insert(id, k);
            }
            Op::Free { id } | Op::FreeRequested { id } | Op::FreeCompleted { id } => {
                live.remove(&id);
            }
            _ => {}
        }
    }
    let mut at: Vec<usize> = live
        .into_values()
        .filter(|&k| ops[k].slope != 0.0)
        .collect();
    at.sort_unstable();
    at.into_iter().map(|k| ops[k]).collect()
}

/// Whether a failure at `phase` came before the backward, so that a model
/// of the backward completes the step: in a module's forward, or in a loss
/// function (`in_loss`) the user's code calls on the model's output.
pub(super) fn before_backward(phase: Phase, in_loss: bool) -> bool {
    phase == Phase::Forward || (phase == Phase::User && in_loss)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64, size: u64, scales: bool) -> ModelOp {
        ModelOp {
            op: Op::Alloc {
                id,
                size,
                stream: 0,
                tag: 0,
            },
            base: size as f64,
            slope: if scales { size as f64 } else { 0.0 },
        }
    }

    fn live_peak(ops: &[ModelOp]) -> (u64, u64) {
        let mut sizes = HashMap::new();
        let (mut live, mut peak) = (0u64, 0u64);
        for m in ops {
            match m.op {
                Op::Alloc { id, size, .. } => {
                    sizes.insert(id, size);
                    live += size;
                    peak = peak.max(live);
                }
                Op::Free { id } => live -= sizes.remove(&id).unwrap_or(0),
                _ => {}
            }
        }
        (live, peak)
    }

    #[test]
    fn the_backward_holds_three_gradients_over_the_saved_tensors_and_makes_every_parameters() {
        // A parameter of 10, three saved activations of 100, 200, 300 (the
        // last made last), a fixed buffer of 5 that is not walked.
        let mut ops = vec![
            alloc(1, 10, false),
            alloc(2, 100, true),
            alloc(3, 200, true),
            alloc(4, 5, false),
            alloc(5, 300, true),
        ];
        let c = add_backward(&mut ops, &[(10, 0)], true);
        assert_eq!(c.saved_bytes, 600);
        assert_eq!(c.gradient_bytes, 10);
        let (end, peak) = live_peak(&ops);
        // 615 after the forward; at the third gradient, all three on top.
        assert_eq!(peak, 615 + 300 + 200 + 100);
        // At the end: the parameter, the buffer, the parameter's gradient.
        assert_eq!(end, 10 + 5 + 10);
    }

    #[test]
    fn the_next_step_renames_its_own_tensors_and_leaves_out_what_is_made_once() {
        // A parameter (made once), a batch, a temporary freed in the step,
        // and a free of a tensor from before the step.
        let step = vec![
            alloc(1, 10, false),
            alloc(2, 100, true),
            alloc(3, 50, true),
            ModelOp::fixed(Op::Free { id: 3 }),
            ModelOp::fixed(Op::Free { id: 7 }),
        ];
        let made_once: HashSet<u64> = [1].into_iter().collect();
        let next: Vec<Op> = next_step(&step, &made_once)
            .into_iter()
            .map(|m| m.op)
            .collect();
        let ids: Vec<Option<u64>> = next.iter().map(|op| op.id()).collect();
        assert_eq!(
            ids,
            [
                Some(2 | NEXT_STEP_IDS),
                Some(3 | NEXT_STEP_IDS),
                Some(3 | NEXT_STEP_IDS)
            ]
        );
        assert!(matches!(next[2], Op::Free { .. }));
    }
}
