//! What activation checkpointing of one module would do to a recorded run:
//! the run's operations rewritten as `torch.utils.checkpoint` (non-reentrant,
//! as `gradient_checkpointing_enable()` uses) would run them, then replayed
//! through the allocator model.
//!
//! The module's calls come from the scopes `memlens.record(model=...)` opens
//! around each module's forward ([`module_calls`]). For each call of the
//! module in a training forward:
//!
//! - **Saved** are the tensors it allocated that outlive the whole forward
//!   pass and are freed before the next one begins: what autograd kept for
//!   the backward. Under checkpointing autograd keeps none of them, so each
//!   dies with the code that holds it: at the end of the innermost module
//!   call around it that does not return it (a module's temporaries die with
//!   it, its output lives on in its caller), at the latest when the
//!   checkpointed call returns. Freeing them all at the call's end instead
//!   over-predicted the reserved peak by up to 13% (HF GPT-2) on the GPU runs.
//! - **Its output** is kept: the one of them freed first in the backward
//!   (autograd frees a call's output when the layers that read it are done,
//!   before the call's own nodes run, or at the first of them when that node
//!   saved its own result, as an in-place ReLU does).
//! - **The recomputation**: when the backward reaches the call (just before
//!   the first of its saved tensors is freed), its forward runs again, every
//!   allocation and free in the recorded order; the saved tensors then live
//!   until their recorded frees, the rest of what it makes is freed at its
//!   end.
//!
//! A trace may begin after the allocator did (`memlens.record(model=...)`
//! starts once the model is built): the blocks live before it, rebuilt from
//! the dump, open the rewritten run.
//!
//! A call whose tensors nothing outlives (eval, `no_grad`) is left as it ran.
//! Tensors the call makes that outlive the forward but are freed only in a
//! later step (a cache) are not activations and stay.

use super::probes::{Probe, Recorded};
use crate::analysis::modules::{module_calls, ModuleCall};
use crate::replay::during_read::RecordedPasses;
use crate::sim::program::Op;
use crate::snapshot::Snapshot;
use hashbrown::HashMap;
use serde::Serialize;

/// The recorded run rewritten for checkpointing, with what the rewrite did.
#[derive(Clone, Debug)]
pub struct CheckpointedRun {
    /// The run as recorded, as operations.
    pub recorded: Vec<Op>,
    /// The run with the module checkpointed.
    pub checkpointed: Vec<Op>,
    /// What was changed.
    pub basis: CheckpointBasis,
}

/// What a checkpointing prediction rests on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckpointBasis {
    /// The module asked for (a class or an instance's qualified name).
    pub module: String,
    /// Its calls found in training forwards (with tensors kept for backward).
    pub calls: usize,
    /// Its calls left as they ran (nothing kept for backward: eval, no_grad).
    pub calls_without_saved: usize,
    /// Tensors freed when a call returns instead of in the backward.
    pub saved_tensors: usize,
    /// Bytes of them, summed over every call (as requested).
    pub saved_bytes: u64,
    /// Allocations the recomputations add.
    pub recomputed_allocations: usize,
}

/// Rewrites the run recorded in `snap` (`name`, for messages) for
/// checkpointing every call of `module` (a class name such as `GPT2Block`,
/// or a qualified name such as `transformer.h.3`), reading the trace's one
/// replay from `passes` (made there if no one made it yet).
pub fn checkpointed_run(
    name: &str,
    snap: &Snapshot,
    module: &str,
    passes: &RecordedPasses,
) -> crate::Result<CheckpointedRun> {
    let probe = Probe {
        name,
        snap,
        batch: 1,
    };
    let rec = Recorded::of_late_start(&probe, passes)?;
    let device = snap.first_traced_device();
    let calls = module_calls(snap, device);
    if calls.is_empty() {
        return Err(crate::Error::Usage(format!(
            "{name}: no module scopes in this snapshot: record it with memlens.record(..., \
             model=model) so that fit knows where each module's forward ran"
        )));
    }
    let events = snap.device_trace(device);
    let matches = |c: &ModuleCall| c.class.as_deref() == Some(module) || c.qualname == module;
    let targets: Vec<&ModuleCall> = outermost(calls.iter().filter(|c| matches(c)));
    if targets.is_empty() {
        let mut classes: Vec<&str> = calls.iter().filter_map(|c| c.class.as_deref()).collect();
        classes.sort_unstable();
        classes.dedup();
        return Err(crate::Error::Usage(format!(
            "{name}: no module `{module}` ran in this recording (its module classes: {})",
            classes.join(", ")
        )));
    }
    let ops: Vec<Op> = rec.ops.iter().map(|&(op, _)| op).collect();
    let run = Recording {
        times: rec
            .events
            .iter()
            .map(|&i| events.get(i).map_or(i64::MIN, |e| e.time_us))
            .collect(),
        life: Lifetimes::of(&ops),
        ops: &ops,
        calls: &calls,
    };
    let mut rewrite = Rewrite {
        plan: Plan::default(),
        basis: CheckpointBasis {
            module: module.to_string(),
            calls: 0,
            calls_without_saved: 0,
            saved_tensors: 0,
            saved_bytes: 0,
            recomputed_allocations: 0,
        },
        fresh: FRESH_IDS,
    };
    for call in targets {
        rewrite.checkpoint(&run, call);
    }
    let basis = rewrite.basis;
    if basis.calls == 0 {
        return Err(crate::Error::Usage(format!(
            "{name}: `{module}` ran {} times, but never in a training forward (nothing it made \
             was kept for the backward): checkpointing it changes nothing",
            basis.calls_without_saved
        )));
    }
    let checkpointed = rewrite.plan.apply(&ops);
    Ok(CheckpointedRun {
        recorded: ops,
        checkpointed,
        basis,
    })
}

/// The recorded run as the rewrite reads it.
struct Recording<'a> {
    ops: &'a [Op],
    /// Each operation's time (its event's), in order.
    times: Vec<i64>,
    life: Lifetimes,
    calls: &'a [ModuleCall],
}

/// The rewrite being planned, call by call.
struct Rewrite {
    plan: Plan,
    basis: CheckpointBasis,
    /// The last name made up for a recomputed tensor.
    fresh: u64,
}

impl Rewrite {
    /// Plans `call` under checkpointing (see the module doc).
    fn checkpoint(&mut self, run: &Recording<'_>, call: &ModuleCall) {
        let (ops, times, life) = (run.ops, &run.times, &run.life);
        let Some((s, e)) = op_range(times, call.start_us, call.end_us) else {
            return;
        };
        // The forward this call ran in: the outermost call around it.
        let roots = || run.calls.iter().filter(|c| c.depth == 0);
        let root = roots().find(|r| r.start_us <= call.start_us && call.end_us <= r.end_us);
        let Some((_, forward_end)) = root.and_then(|r| op_range(times, r.start_us, r.end_us))
        else {
            return;
        };
        let next_forward = roots()
            .find(|r| r.start_us > root.map_or(i64::MAX, |r| r.end_us))
            .map_or(ops.len(), |r| times.partition_point(|&t| t < r.start_us));
        // Kept by autograd: freed after this forward, before the next.
        let kept = |i: usize| {
            life.free_of(i)
                .is_some_and(|f| f > forward_end && f < next_forward)
        };
        let mut saved: Vec<usize> = (s..=e)
            .filter(|&i| matches!(ops[i], Op::Alloc { .. }) && kept(i))
            .collect();
        if saved.is_empty() {
            self.basis.calls_without_saved += 1;
            return;
        }
        self.basis.calls += 1;
        saved.sort_by_key(|&i| life.free_of(i));
        // The output stays (see the module doc).
        saved.remove(0);
        let Some(anchor) = saved.first().and_then(|&i| life.free_of(i)) else {
            return;
        };
        // The module calls inside this one, as operation ranges.
        let inner: Vec<(usize, usize)> = run
            .calls
            .iter()
            .filter(|c| {
                c.depth > call.depth && c.start_us >= call.start_us && c.end_us <= call.end_us
            })
            .filter_map(|c| op_range(times, c.start_us, c.end_us))
            .collect();
        for &i in &saved {
            if let Op::Alloc { id, size, .. } = ops[i] {
                let at = released_at(i, &inner, e, |a, b| output_of(a, b, ops, life, &kept));
                self.plan.after.entry(at).or_default().push(Op::Free { id });
                self.basis.saved_tensors += 1;
                self.basis.saved_bytes += size;
            }
        }
        let recompute = recomputation(ops, s, e, &saved, &mut self.fresh);
        self.basis.recomputed_allocations += recompute
            .iter()
            .filter(|op| matches!(op, Op::Alloc { .. }))
            .count();
        self.plan
            .before
            .entry(anchor)
            .or_default()
            .extend(recompute);
    }
}

/// Where a tensor kept for the backward (made at operation `alloc`) is
/// released when no autograd keeps it: at the end of the innermost module
/// call around it that does not return it (a module's temporaries die with
/// it; its output lives on in its caller), else at `end`, the checkpointed
/// call's last operation. `inner` are the module calls inside the
/// checkpointed one as operation ranges; `output(s, e)` names the output of
/// the call over `s..=e`.
fn released_at(
    alloc: usize,
    inner: &[(usize, usize)],
    end: usize,
    output: impl Fn(usize, usize) -> Option<usize>,
) -> usize {
    let mut around: Vec<(usize, usize)> = inner
        .iter()
        .copied()
        .filter(|&(s, e)| s <= alloc && alloc <= e)
        .collect();
    // Innermost first: the shortest range.
    around.sort_by_key(|&(s, e)| e - s);
    around
        .into_iter()
        .find(|&(s, e)| output(s, e) != Some(alloc))
        .map_or(end, |(_, e)| e)
}

/// The output of the module call over operations `s..=e`: of what it made
/// that autograd kept (`kept`), the one the backward freed first (see the
/// module doc).
fn output_of(
    s: usize,
    e: usize,
    ops: &[Op],
    life: &Lifetimes,
    kept: &impl Fn(usize) -> bool,
) -> Option<usize> {
    (s..=e)
        .filter(|&i| matches!(ops[i], Op::Alloc { .. }) && kept(i))
        .min_by_key(|&i| life.free_of(i))
}

/// The module a user would checkpoint in the run recorded in `snap`, with
/// its number of instances: of the classes with several instances whose
/// names end in an index (`blocks.3`, `transformer.h.3`, `layer1.0`,
/// `encoder_layer_3`), containers (`Sequential`, `ModuleList`) aside, the
/// outermost, then the one with the most instances. `None` without module
/// scopes or repeated layers.
pub fn repeated_block(snap: &Snapshot) -> Option<(String, usize)> {
    const CONTAINERS: [&str; 3] = ["Sequential", "ModuleList", "ModuleDict"];
    let calls = module_calls(snap, snap.first_traced_device());
    // class -> (depth, instances)
    let mut classes: HashMap<&str, (usize, std::collections::BTreeSet<&str>)> = HashMap::new();
    for c in &calls {
        let Some(class) = c.class.as_deref().filter(|c| !CONTAINERS.contains(c)) else {
            continue;
        };
        if !ends_in_an_index(&c.qualname) {
            continue;
        }
        let depth = c.qualname.split('.').count();
        let entry = classes.entry(class).or_insert((depth, Default::default()));
        entry.0 = entry.0.min(depth);
        entry.1.insert(c.qualname.as_str());
    }
    classes
        .into_iter()
        .filter(|(_, (_, instances))| instances.len() >= 2)
        .min_by_key(|&(class, (depth, ref instances))| {
            (depth, std::cmp::Reverse(instances.len()), class)
        })
        .map(|(class, (_, instances))| (class.to_string(), instances.len()))
}

/// Whether a module's qualified name ends in a container's index: `h.3`,
/// `encoder_layer_3` (not `conv1`, an attribute that happens to end in a
/// digit).
fn ends_in_an_index(qualname: &str) -> bool {
    let last = qualname.rsplit('.').next().unwrap_or(qualname);
    let digits = last.trim_end_matches(|c: char| c.is_ascii_digit());
    digits.len() < last.len() && (digits.is_empty() || digits.ends_with('_'))
}

/// Tensor names the rewrite makes up for recomputed tensors (recorded ones
/// are addresses, far below).
const FRESH_IDS: u64 = 1 << 63;

/// The calls of `calls` not inside another of them.
fn outermost<'a>(calls: impl Iterator<Item = &'a ModuleCall>) -> Vec<&'a ModuleCall> {
    let mut out: Vec<&ModuleCall> = Vec::new();
    for c in calls {
        if out
            .last()
            .is_some_and(|o| o.start_us <= c.start_us && c.end_us <= o.end_us)
        {
            continue;
        }
        out.push(c);
    }
    out
}

/// The operations (first, last) between times `start` and `end`, both
/// included (an operation at the scope's very microsecond is inside, as
/// [`crate::analysis::modules::innermost_module_at`] counts it).
fn op_range(times: &[i64], start: i64, end: i64) -> Option<(usize, usize)> {
    let s = times.partition_point(|&t| t < start);
    let e = times.partition_point(|&t| t <= end);
    (e > s).then(|| (s, e - 1))
}

/// Where each allocation of a program is freed (its free requested).
struct Lifetimes {
    free: HashMap<usize, usize>,
}

impl Lifetimes {
    fn of(ops: &[Op]) -> Lifetimes {
        let mut live: HashMap<u64, usize> = HashMap::new();
        let mut free = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { id, .. } => {
                    live.insert(id, i);
                }
                // A free's first op: its request, or its completion where
                // none was recorded (skip_actions) or it is one `Free`.
                Op::FreeRequested { id } | Op::FreeCompleted { id } | Op::Free { id } => {
                    if let Some(a) = live.remove(&id) {
                        free.insert(a, i);
                    }
                }
                _ => {}
            }
        }
        Lifetimes { free }
    }

    /// The operation that frees the allocation at `alloc`, if any does.
    fn free_of(&self, alloc: usize) -> Option<usize> {
        self.free.get(&alloc).copied()
    }
}

/// The forward of the call at operations `s..=e` run again: the saved
/// tensors made under their recorded names (their recorded frees in the
/// backward then free them), every other tensor under a name of its own,
/// freed where the recorded forward freed it or at the end.
fn recomputation(ops: &[Op], s: usize, e: usize, saved: &[usize], fresh: &mut u64) -> Vec<Op> {
    let mut out = Vec::new();
    let mut renamed: HashMap<u64, u64> = HashMap::new();
    for (i, op) in ops.iter().enumerate().take(e + 1).skip(s) {
        match *op {
            Op::Alloc {
                id,
                size,
                stream,
                tag,
            } => {
                let new_id = if saved.contains(&i) {
                    id
                } else {
                    *fresh += 1;
                    renamed.insert(id, *fresh);
                    *fresh
                };
                out.push(Op::Alloc {
                    id: new_id,
                    size,
                    stream,
                    tag,
                });
            }
            Op::FreeRequested { id } => {
                if let Some(&n) = renamed.get(&id) {
                    out.push(Op::FreeRequested { id: n });
                }
            }
            Op::FreeCompleted { id } => {
                if let Some(n) = renamed.remove(&id) {
                    out.push(Op::FreeCompleted { id: n });
                }
            }
            Op::Free { id } => {
                if let Some(n) = renamed.remove(&id) {
                    out.push(Op::Free { id: n });
                }
            }
            _ => {}
        }
    }
    // What the recomputation made and did not free: its output and the
    // tensors the recorded forward kept past the call (not needed again).
    let mut left: Vec<u64> = renamed.into_values().collect();
    left.sort_unstable();
    out.extend(left.into_iter().map(|id| Op::Free { id }));
    out
}

/// Operations to insert around recorded ones.
#[derive(Default)]
struct Plan {
    /// Inserted right after operation `k`.
    after: HashMap<usize, Vec<Op>>,
    /// Inserted right before operation `k`.
    before: HashMap<usize, Vec<Op>>,
}

impl Plan {
    fn apply(&self, ops: &[Op]) -> Vec<Op> {
        let mut out = Vec::with_capacity(ops.len() * 2);
        for (i, &op) in ops.iter().enumerate() {
            if let Some(v) = self.before.get(&i) {
                out.extend_from_slice(v);
            }
            out.push(op);
            if let Some(v) = self.after.get(&i) {
                out.extend_from_slice(v);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64, size: u64) -> Op {
        Op::Alloc {
            id,
            size,
            stream: 0,
            tag: 0,
        }
    }

    #[test]
    fn a_tensor_dies_with_the_innermost_module_that_does_not_return_it() {
        // Calls: the block over 0..=9, a child over 2..=5 whose output is
        // the tensor made at 5 (freed first in the backward).
        let inner = [(2, 5)];
        let output = |s: usize, e: usize| ((s, e) == (2, 5)).then_some(5);
        // A temporary of the child: dies when the child returns.
        assert_eq!(released_at(3, &inner, 9, output), 5);
        // The child's output: lives on in the block until it returns.
        assert_eq!(released_at(5, &inner, 9, output), 9);
        // Made by the block itself: at the block's end.
        assert_eq!(released_at(7, &inner, 9, output), 9);
    }

    #[test]
    fn the_recomputation_runs_the_forward_again_keeping_only_what_was_saved() {
        let ops = [
            alloc(10, 100), // 0: saved
            alloc(20, 200), // 1: a temporary, freed inside
            Op::Free { id: 20 },
            alloc(30, 300), // 3: the output
        ];
        let mut fresh = FRESH_IDS;
        let re = recomputation(&ops, 0, 3, &[0], &mut fresh);
        // The saved tensor comes back under its recorded name, to be freed
        // by its recorded free in the backward; the rest under new names,
        // the temporary freed where it was, the output at the end.
        assert_eq!(re[0], alloc(10, 100));
        assert!(matches!(re[1], Op::Alloc { id, size: 200, .. } if id > FRESH_IDS));
        assert!(matches!(re[2], Op::Free { id } if id > FRESH_IDS));
        assert!(matches!(re[3], Op::Alloc { id, size: 300, .. } if id > FRESH_IDS));
        assert!(matches!(re[4], Op::Free { id } if id > FRESH_IDS));
        assert_eq!(re.len(), 5);
    }

    #[test]
    fn a_container_index_ends_the_names_of_repeated_layers() {
        for name in [
            "blocks.3",
            "transformer.h.11",
            "layer1.0",
            "encoder.layers.encoder_layer_3",
            "7",
        ] {
            assert!(ends_in_an_index(name), "{name}");
        }
        for name in ["conv1", "layer1", "bn2", "blocks", "", "mlp.fc1"] {
            assert!(!ends_in_an_index(name), "{name}");
        }
    }

    #[test]
    fn nested_calls_of_the_module_are_checkpointed_once_by_the_outer() {
        let call = |start_us, end_us, depth| ModuleCall {
            qualname: String::new(),
            class: None,
            start_us,
            end_us,
            depth,
        };
        let calls = [call(0, 10, 0), call(2, 5, 1), call(11, 20, 0)];
        let outer = outermost(calls.iter());
        assert_eq!(outer.len(), 2);
        assert_eq!((outer[0].start_us, outer[1].start_us), (0, 11));
    }
}
