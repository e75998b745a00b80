//! Two recordings of the same training run at two batch sizes, aligned
//! allocation by allocation into one run whose every tensor has a size as a
//! function of the batch.
//!
//! A training step allocates nearly the same tensors in the same order
//! whatever the batch (the code is the same); mostly only their sizes
//! change. So two probes, each recorded from the start of the process for
//! the same number of steps, pair up: their operations are aligned by a
//! diff (Myers) on what they are (an allocation from a stack, the free of
//! one), and each allocation in both gets `size(n) = size_a + slope * (n -
//! batch_a)`, with `slope = (size_b - size_a) / (batch_b - batch_a)`:
//! parameters, gradients, optimizer state and workspaces come out flat,
//! activations and inputs linear. Some kernels allocate only past a size:
//! the staging buffers of a bias gradient's sum, which the probes' C++
//! frames name, are left out of both probes and computed at every batch
//! from the sum's rows ([`reduce_scratch`](super::reduce_scratch)); any
//! other operation only the larger probe ran is kept, at its size, from
//! that batch on, and one only the smaller ran, below it. Where the probes hardly pair (different code, a
//! trace that began late), there is no honest model and the caller gets an
//! error saying which.

use super::reduce_scratch::{Gpu, Reduction};
use crate::replay::during_read::RecordedPasses;
use crate::replay::initial;
use crate::sim::program::Op;
use crate::snapshot::{Action, Snapshot, StackId};
use hashbrown::HashMap;

/// One recording of the run at a known batch size.
#[derive(Clone, Copy, Debug)]
pub struct Probe<'s> {
    /// The file it was read from (for messages).
    pub name: &'s str,
    /// The snapshot.
    pub snap: &'s Snapshot,
    /// The batch size it ran at.
    pub batch: u32,
}

/// At which batch sizes an operation of the run happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Presence {
    /// Both probes ran it.
    Always,
    /// Only the smaller probe ran it: below the larger probe's batch.
    Below(u32),
    /// Only the larger probe ran it: from its batch on.
    From(u32),
}

impl Presence {
    fn at(self, batch: u32) -> bool {
        match self {
            Presence::Always => true,
            Presence::Below(b) => batch < b,
            Presence::From(b) => batch >= b,
        }
    }
}

/// The probes of `snaps` (each named) at `batches`, in the same order: one
/// batch size per probe, else a usage error (every front, CLI, Python and
/// MCP, takes its probes from here).
pub fn probes<'s>(
    snaps: &[(&'s str, &'s Snapshot)],
    batches: &[u32],
) -> crate::Result<Vec<Probe<'s>>> {
    if batches.len() != snaps.len() {
        return Err(crate::Error::usage(format!(
            "{} batch sizes for {} probes: give one per probe, e.g. --recorded-batch 2,4",
            batches.len(),
            snaps.len()
        )));
    }
    Ok(snaps
        .iter()
        .zip(batches)
        .map(|(&(name, snap), &batch)| Probe { name, snap, batch })
        .collect())
}

/// At which batch sizes an operation of the run happens.
#[derive(Clone, Copy, Debug)]
enum RunOp {
    /// A tensor made: its size at the first probe's batch and bytes per unit
    /// of batch.
    Alloc {
        id: u64,
        base: u64,
        slope: f64,
        stream: u64,
        tag: u64,
        /// A cuDNN convolution's workspace, which the run can do without
        /// ([`Op::Optional`]).
        optional: bool,
    },
    /// The staging buffer and semaphores of the reduction kernel of the sum
    /// just allocated (a bias's gradient over `rows_per_batch` x batch rows
    /// of `width`), allocated and freed at once; their sizes follow the
    /// rows at each batch ([`reduce_scratch`](super::reduce_scratch)).
    Scratch {
        ids: [u64; 2],
        rows_per_batch: u64,
        width: u64,
        elem_size: u64,
        stream: u64,
        tag: u64,
    },
    /// Any other operation, the same at every batch.
    Fixed(Op),
}

/// The run of two aligned probes, at any batch size ([`ScaledRun::ops_at`]).
#[derive(Clone, Debug)]
pub struct ScaledRun {
    ops: Vec<(RunOp, Presence)>,
    /// The first probe's batch.
    base_batch: u32,
    /// Allocations in the run.
    pub allocations: usize,
    /// Of them, those whose size changes with the batch.
    pub scaling_allocations: usize,
    /// Bytes per unit of batch over all allocations that scale (how much
    /// more the run allocates, in all, per extra sample).
    pub bytes_per_sample: f64,
    /// Operations only one probe ran (kept on its side of the batch axis).
    pub unpaired_operations: usize,
    /// Sums of a bias's gradient whose reduction kernel's staging buffers
    /// are computed at each batch (their recorded ones dropped): the probes'
    /// C++ frames name the sum and the matrix products beside it.
    pub modelled_reductions: usize,
    /// The GPU the reductions' staging buffers are computed for.
    pub gpu: Gpu,
    /// Allocations of cuDNN convolutions' workspaces, which the run can do
    /// without ([`Op::Optional`]).
    pub conv_workspaces: usize,
}

/// The event of an operation that stands for a block live before the trace.
pub(crate) const BEFORE_TRACE: usize = usize::MAX;

/// The events of a probe as operations: what was allocated (with its stack,
/// to pair), freed, and where `empty_cache()` was called.
pub(crate) struct Recorded {
    /// (operation, stack of the allocation it makes or frees)
    pub(crate) ops: Vec<(Op, Option<StackId>)>,
    /// The trace event each operation came from, in the same order.
    pub(crate) events: Vec<usize>,
}

impl Recorded {
    /// The operations of `p`'s trace; an error when it cannot stand for its
    /// run (no trace, a trace that began late, an OOM in it).
    pub(crate) fn of(p: &Probe<'_>) -> crate::Result<Recorded> {
        Recorded::read(p, false, &RecordedPasses::default())
    }

    /// [`Recorded::of`] for a trace that may begin after the allocator did
    /// (`memlens.record(model=...)` starts once the model is built): the
    /// blocks live before its first event, rebuilt from the dump, come first
    /// as allocations (their event is [`BEFORE_TRACE`]), so that what the
    /// trace frees of them is freed and the peaks count them. The trace's
    /// one replay is taken from `passes` (doctor's, when doctor asks).
    pub(crate) fn of_late_start(p: &Probe<'_>, passes: &RecordedPasses) -> crate::Result<Recorded> {
        Recorded::read(p, true, passes)
    }

    fn read(p: &Probe<'_>, late_start: bool, passes: &RecordedPasses) -> crate::Result<Recorded> {
        let snap = p.snap;
        let device = snap.first_traced_device();
        let events = snap.device_trace(device);
        if events.is_empty() {
            return Err(probe_error(p, "it holds no trace of allocations (record with memlens.record or torch.cuda.memory._record_memory_history)"));
        }
        // The trace's one replay under its recorded settings: the state
        // before it (empty for a run recorded from its start) and where the
        // program called empty_cache().
        let trace = snap
            .traces
            .iter()
            .position(|t| t.device == device && !t.events.is_empty())
            .unwrap_or(0);
        let pass = passes.of(snap, trace);
        if !late_start && !pass.initial().is_empty() {
            return Err(probe_error(p, &initial::late_start("fit needs each probe recorded from the start of the process, before the model is built")));
        }
        let mut empty_cache_at = pass.watched.empty_cache_at.iter().copied().peekable();
        let mut ops = Vec::with_capacity(events.len());
        let mut at = Vec::with_capacity(events.len());
        for b in &pass.initial().blocks {
            let id = b.addr;
            let stream = snap.stream(b.stream) as u64;
            ops.push((
                Op::Alloc {
                    id,
                    size: b.requested,
                    stream,
                    tag: 0,
                },
                None,
            ));
            at.push(BEFORE_TRACE);
            if b.pending {
                ops.push((Op::FreeRequested { id }, None));
                at.push(BEFORE_TRACE);
            }
        }
        // The stack of the allocation live at each address, for its frees.
        let mut stack_at: HashMap<u64, StackId> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            let stream = snap.stream(e.stream) as u64;
            let op = match e.action {
                Action::Alloc => {
                    stack_at.insert(e.addr, e.stack);
                    (
                        Op::Alloc {
                            id: e.addr,
                            size: e.size,
                            stream,
                            tag: u64::from(e.stack),
                        },
                        Some(e.stack),
                    )
                }
                Action::FreeRequested => (
                    Op::FreeRequested { id: e.addr },
                    stack_at.get(&e.addr).copied(),
                ),
                Action::FreeCompleted => (
                    Op::FreeCompleted { id: e.addr },
                    stack_at.get(&e.addr).copied(),
                ),
                Action::SegmentFree | Action::SegmentUnmap if empty_cache_at.peek() == Some(&i) => {
                    empty_cache_at.next();
                    (Op::EmptyCache, None)
                }
                // A cuDNN workspace PyTorch gave up (the run went on, with
                // another algorithm): tried again, as `simulate` does, and
                // held for its convolution only. Its role makes it one the
                // program can do without.
                Action::Oom if snap.oom_caught_by_pytorch(e) => {
                    let [retry, free] =
                        Op::workspace_tried_again(i, e.size, stream, u64::from(e.stack), false);
                    ops.push((retry, Some(e.stack)));
                    at.push(i);
                    (free, Some(e.stack))
                }
                Action::Oom => {
                    return Err(probe_error(
                        p,
                        "it ran out of memory: a probe must be a run that completed its steps",
                    ))
                }
                _ => continue,
            };
            ops.push(op);
            at.push(i);
        }
        Ok(Recorded { ops, events: at })
    }
}

/// The staging buffer and semaphores (bytes) of a sum of `rows` x `width`
/// over its rows on `gpu`.
fn scratch(rows: u64, width: u64, elem_size: u64, gpu: Gpu) -> (u64, u64) {
    Reduction::over_rows(rows, width, elem_size).scratch(gpu)
}

/// What an allocation of a probe is, for the model of reductions' staging
/// buffers: told by its C++ frames (`stacks="all"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Anything else (or a stack without C++ frames).
    Other,
    /// The output of a `sum` or `mean` (`structured_sum_out`).
    SumOutput,
    /// The reduction kernel's staging buffer or semaphores.
    Staging,
    /// cuBLAS's workspace, made at a handle's first use (in the first
    /// step's backward, between a linear layer's two gradient products).
    Workspace,
    /// A cuDNN convolution's workspace (made by `run_conv_plan`): its size
    /// is the algorithm's, which cuDNN's heuristics pick anew for each
    /// shape, and a convolution runs without it when memory is short.
    ConvWorkspace,
    /// A matrix product of a linear layer's backward (`AddmmBackward0`).
    AddmmGrad,
    /// A gradient reshaped in the backward (`ReshapeAliasBackward0`,
    /// `UnsafeViewBackward0`, `ViewBackward0`).
    ViewGrad,
}

fn role_of(snap: &Snapshot, stack: StackId, memo: &mut HashMap<StackId, Role>) -> Role {
    *memo.entry(stack).or_insert_with(|| {
        let names = || {
            snap.stack(stack)
                .iter()
                .map(|&f| snap.str(snap.frame(f).name))
        };
        if names().any(|n| n.contains("gpu_reduce_kernel")) {
            Role::Staging
        } else if names().any(crate::frames::is_cudnn_workspace) {
            Role::ConvWorkspace
        } else if names().any(|n| n.starts_with("at::cuda::") && n.contains("Workspace")) {
            Role::Workspace
        } else if names().any(|n| {
            n.contains("structured_sum_out_functional")
                || n.contains("structured_mean_out_functional")
        }) {
            Role::SumOutput
        } else if names().any(|n| n.contains("AddmmBackward0")) {
            Role::AddmmGrad
        } else if names().any(|n| {
            n.contains("ReshapeAliasBackward0")
                || n.contains("UnsafeViewBackward0")
                || n.contains("ViewBackward0")
        }) {
            Role::ViewGrad
        } else {
            Role::Other
        }
    })
}

/// A bias gradient's sum, as one probe ran it: `rows` x `width` elements of
/// `elem_size` bytes summed over the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SumGeometry {
    rows: u64,
    width: u64,
    elem_size: u64,
}

/// The sum whose output is `sum` bytes, from the two allocations before it
/// (`prev1` the nearer): in a linear layer's backward the input's gradient
/// (`rows x in`) and the weight's (`out x in`), so `rows = gin * sum /
/// (gw * elem)`; after a reshaped gradient, that gradient (`rows x width`).
fn sum_geometry(
    sum: u64,
    prev1: (u64, Role),
    prev2: (u64, Role),
    elem: u64,
) -> Option<SumGeometry> {
    if sum == 0 || !sum.is_multiple_of(elem) {
        return None;
    }
    let width = sum / elem;
    let rows = match (prev1, prev2) {
        ((gw, Role::AddmmGrad), (gin, Role::AddmmGrad)) => {
            let (num, den) = (
                u128::from(gin) * u128::from(sum),
                u128::from(gw) * u128::from(elem),
            );
            (den > 0 && num % den == 0).then(|| (num / den) as u64)?
        }
        ((grad, Role::ViewGrad), _) => (grad % sum == 0).then_some(grad / sum)?,
        _ => return None,
    };
    (rows > 0).then_some(SumGeometry {
        rows,
        width,
        elem_size: elem,
    })
}

/// What [`without_modelled_staging`] keeps of a probe's operations: each
/// one's sum geometry where it allocates a modelled sum's output, and
/// whether it allocates a cuDNN convolution's workspace.
struct Kept {
    ops: Recorded,
    geometry: Vec<Option<SumGeometry>>,
    conv_workspace: Vec<bool>,
}

/// A probe's operations with the staging buffers of the sums it can model
/// left out (the model gives them at every batch).
fn without_modelled_staging(p: &Probe<'_>, r: Recorded) -> Kept {
    let snap = p.snap;
    let mut memo = HashMap::new();
    let roles: Vec<Role> = r
        .ops
        .iter()
        .map(|&(op, stack)| match (op, stack) {
            (Op::Alloc { .. }, Some(s)) => role_of(snap, s, &mut memo),
            _ => Role::Other,
        })
        .collect();
    // Under autocast a linear layer's gradients are half precision. Each
    // distinct stack is read once (a long recording repeats a few hundred).
    let stacks: hashbrown::HashSet<StackId> = r
        .ops
        .iter()
        .filter_map(|&(op, stack)| matches!(op, Op::Alloc { .. }).then_some(stack).flatten())
        .collect();
    let autocast = stacks.iter().any(|&s| {
        snap.stack(s)
            .iter()
            .any(|&f| snap.str(snap.frame(f).name).contains("at::autocast::"))
    });
    let elem = if autocast { 2 } else { 4 };
    let mut keep = vec![true; r.ops.len()];
    let mut geometry = vec![None; r.ops.len()];
    let mut dropped: hashbrown::HashSet<u64> = hashbrown::HashSet::new();
    let (mut prev1, mut prev2) = ((0u64, Role::Other), (0u64, Role::Other));
    let mut i = 0;
    while i < r.ops.len() {
        match r.ops[i].0 {
            Op::Alloc { size, .. } if roles[i] == Role::SumOutput => {
                geometry[i] = sum_geometry(size, prev1, prev2, elem);
                if geometry[i].is_some() {
                    // Its kernel's buffers come right after it.
                    while let Some((Op::Alloc { id, .. }, _)) = r.ops.get(i + 1) {
                        if roles[i + 1] != Role::Staging {
                            break;
                        }
                        dropped.insert(*id);
                        keep[i + 1] = false;
                        i += 1;
                    }
                }
                (prev2, prev1) = (prev1, (size, Role::SumOutput));
            }
            Op::Alloc { size, .. } if !matches!(roles[i], Role::Staging | Role::Workspace) => {
                (prev2, prev1) = (prev1, (size, roles[i]));
            }
            Op::FreeRequested { id } if dropped.contains(&id) => keep[i] = false,
            Op::FreeCompleted { id } | Op::Free { id } if dropped.contains(&id) => {
                keep[i] = false;
                dropped.remove(&id);
            }
            _ => {}
        }
        i += 1;
    }
    let mut out = Recorded {
        ops: Vec::with_capacity(r.ops.len()),
        events: Vec::with_capacity(r.ops.len()),
    };
    let mut geo = Vec::with_capacity(r.ops.len());
    let mut conv_workspace = Vec::with_capacity(r.ops.len());
    for (k, ((op, ev), g)) in r.ops.into_iter().zip(r.events).zip(geometry).enumerate() {
        if keep[k] {
            out.ops.push(op);
            out.events.push(ev);
            geo.push(g);
            conv_workspace.push(roles[k] == Role::ConvWorkspace);
        }
    }
    Kept {
        ops: out,
        geometry: geo,
        conv_workspace,
    }
}

fn probe_error(p: &Probe<'_>, what: &str) -> crate::Error {
    crate::Error::Usage(format!("{}: cannot be a probe for fit: {what}", p.name))
}

/// The frames of a stack as text, to tell whether two snapshots' stacks are
/// the same code.
fn stack_key(snap: &Snapshot, stack: StackId, memo: &mut HashMap<StackId, u64>) -> u64 {
    *memo.entry(stack).or_insert_with(|| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for &f in snap.stack(stack) {
            let fr = snap.frame(f);
            snap.strings.get(fr.filename).hash(&mut h);
            fr.line.hash(&mut h);
            snap.strings.get(fr.name).hash(&mut h);
        }
        h.finish()
    })
}

/// What an operation is, to pair it with the other probe's: its kind and
/// the code of the allocation it makes or frees.
fn op_keys(p: &Probe<'_>, r: &Recorded) -> Vec<(u8, u64)> {
    let mut memo = HashMap::new();
    r.ops
        .iter()
        .map(|(op, stack)| {
            let kind = match op {
                Op::Alloc { .. } => 0,
                Op::FreeRequested { .. } => 1,
                Op::FreeCompleted { .. } => 2,
                Op::Free { .. } => 3,
                Op::EmptyCache => 4,
                Op::FailedRequest { .. } => 5,
                Op::Optional { .. } => 6,
            };
            (kind, stack.map_or(0, |s| stack_key(p.snap, s, &mut memo)))
        })
        .collect()
}

/// Gives each tensor of the merged run a name of its own: the two probes'
/// addresses overlap.
struct Names {
    next: u64,
    a: HashMap<u64, u64>,
    b: HashMap<u64, u64>,
}

impl Names {
    fn rename(&mut self, op: Op, side_a: bool, also_b: Option<Op>) -> Op {
        let id_of = |op: &Op| match *op {
            Op::Alloc { id, .. }
            | Op::FreeRequested { id }
            | Op::FreeCompleted { id }
            | Op::Free { id } => Some(id),
            _ => None,
        };
        let with = |op: Op, id: u64| match op {
            Op::Alloc {
                size, stream, tag, ..
            } => Op::Alloc {
                id,
                size,
                stream,
                tag,
            },
            Op::FreeRequested { .. } => Op::FreeRequested { id },
            Op::FreeCompleted { .. } => Op::FreeCompleted { id },
            Op::Free { .. } => Op::Free { id },
            other => other,
        };
        let Some(addr) = id_of(&op) else { return op };
        if let Op::Alloc { .. } = op {
            let id = self.next;
            self.next += 1;
            let (mine, other) = if side_a {
                (&mut self.a, &mut self.b)
            } else {
                (&mut self.b, &mut self.a)
            };
            mine.insert(addr, id);
            if let Some(addr_b) = also_b.as_ref().and_then(id_of) {
                other.insert(addr_b, id);
            }
            return with(op, id);
        }
        let map = if side_a { &self.a } else { &self.b };
        // A free of a tensor from before the trace (none in a probe): a name
        // no allocation has.
        with(op, map.get(&addr).copied().unwrap_or(u64::MAX - addr))
    }
}

impl ScaledRun {
    /// Aligns probes `a` and `b` (at different batch sizes) into one run.
    pub fn from_probes(a: &Probe<'_>, b: &Probe<'_>) -> crate::Result<ScaledRun> {
        use similar::{capture_diff_slices, Algorithm, DiffOp};
        if a.batch == b.batch || a.batch == 0 || b.batch == 0 {
            return Err(crate::Error::usage(format!(
                "fit needs two probes at two different batch sizes above 0 (got {} and {})",
                a.batch, b.batch
            )));
        }
        let Kept {
            ops: ra,
            geometry: ga,
            conv_workspace: wa,
        } = without_modelled_staging(a, Recorded::of(a)?);
        let Kept {
            ops: rb,
            geometry: gb,
            conv_workspace: wb,
        } = without_modelled_staging(b, Recorded::of(b)?);
        let (ka, kb) = (op_keys(a, &ra), op_keys(b, &rb));
        let per_batch = f64::from(b.batch) - f64::from(a.batch);
        let mut run = ScaledRun {
            ops: Vec::with_capacity(ra.ops.len().max(rb.ops.len())),
            base_batch: a.batch,
            allocations: 0,
            scaling_allocations: 0,
            bytes_per_sample: 0.0,
            unpaired_operations: 0,
            modelled_reductions: 0,
            gpu: Gpu::default(),
            conv_workspaces: 0,
        };
        let mut names = Names {
            next: 1,
            a: HashMap::new(),
            b: HashMap::new(),
        };
        let mut paired = 0usize;
        for d in capture_diff_slices(Algorithm::Myers, &ka, &kb) {
            let (old, new) = (d.old_range(), d.new_range());
            if let DiffOp::Equal { .. } = d {
                for (i, j) in old.zip(new) {
                    paired += 1;
                    let (oa, ob) = (ra.ops[i].0, rb.ops[j].0);
                    let op = names.rename(oa, true, Some(ob));
                    run.push_paired(op, ob, per_batch, wa[i] && wb[j]);
                    run.push_scratch(op, [(ga[i], a.batch), (gb[j], b.batch)], &mut names);
                }
                continue;
            }
            for i in old {
                let op = names.rename(ra.ops[i].0, true, None);
                run.push_unpaired(op, Presence::Below(b.batch), wa[i]);
                run.push_scratch(op, [(ga[i], a.batch)], &mut names);
            }
            for j in new {
                let op = names.rename(rb.ops[j].0, false, None);
                run.push_unpaired(op, Presence::From(b.batch), wb[j]);
                run.push_scratch(op, [(gb[j], b.batch)], &mut names);
            }
        }
        // Probes of different code pair little: no model then.
        let longest = ka.len().max(kb.len()).max(1);
        if (paired as f64) < 0.9 * longest as f64 {
            return Err(crate::Error::usage(format!(
                "{} and {}: the probes did not run the same code ({paired} of {longest} \
                 operations pair up): record the same code for the same number of steps at \
                 two batch sizes",
                a.name, b.name
            )));
        }
        Ok(run)
    }

    /// A pair of the probes' operations; `optional`: both allocate a cuDNN
    /// convolution's workspace.
    fn push_paired(&mut self, op: Op, other: Op, per_batch: f64, optional: bool) {
        let run_op = match (op, other) {
            (
                Op::Alloc {
                    id,
                    size,
                    stream,
                    tag,
                },
                Op::Alloc { size: size_b, .. },
            ) => {
                self.allocations += 1;
                let slope = (size_b as f64 - size as f64) / per_batch;
                if size_b != size {
                    self.scaling_allocations += 1;
                    self.bytes_per_sample += slope;
                }
                self.conv_workspaces += usize::from(optional);
                RunOp::Alloc {
                    id,
                    base: size,
                    slope,
                    stream,
                    tag,
                    optional,
                }
            }
            (op, _) => RunOp::Fixed(op),
        };
        self.ops.push((run_op, Presence::Always));
    }

    /// After the allocation `op` of a sum's output: its kernel's staging
    /// buffers at any batch, from the sum's rows per sample as the probes
    /// that ran it saw it (`seen`: each probe's geometry, if it found one,
    /// and batch), the larger probe's first. Every probe that found one
    /// left its recorded buffers out, so one is always pushed then; the
    /// probes disagree only where one took a wrong neighbour for the sum's
    /// input (the nearer batch is trusted).
    fn push_scratch(
        &mut self,
        op: Op,
        seen: impl AsRef<[(Option<SumGeometry>, u32)]>,
        names: &mut Names,
    ) {
        let Op::Alloc { stream, tag, .. } = op else {
            return;
        };
        let per_sample = seen
            .as_ref()
            .iter()
            .rev()
            .filter_map(|&(g, batch)| Some((g?, u64::from(batch))))
            .find(|(g, batch)| g.rows.is_multiple_of(*batch));
        let Some((g, batch)) = per_sample else {
            return;
        };
        let ids = [names.next, names.next + 1];
        names.next += 2;
        self.modelled_reductions += 1;
        // The presence of the sum itself (the op just pushed).
        let presence = self.ops.last().map_or(Presence::Always, |&(_, p)| p);
        self.ops.push((
            RunOp::Scratch {
                ids,
                rows_per_batch: g.rows / batch,
                width: g.width,
                elem_size: g.elem_size,
                stream,
                tag,
            },
            presence,
        ));
    }

    /// An operation of one probe only; `optional`: it allocates a cuDNN
    /// convolution's workspace.
    fn push_unpaired(&mut self, op: Op, presence: Presence, optional: bool) {
        self.unpaired_operations += 1;
        let op = match op {
            Op::Alloc {
                id,
                size,
                stream,
                tag,
            } => {
                self.allocations += 1;
                self.conv_workspaces += usize::from(optional);
                Op::allocation(id, size, stream, tag, optional)
            }
            op => op,
        };
        self.ops.push((RunOp::Fixed(op), presence));
    }

    /// The staging buffers and semaphores (bytes) the modelled reductions
    /// allocate at `batch`, in the run's order (none below the sizes where
    /// the kernel splits its sums across blocks).
    pub fn staging_at(&self, batch: u32) -> Vec<(u64, u64)> {
        self.ops
            .iter()
            .filter_map(|(op, _)| match *op {
                RunOp::Scratch {
                    rows_per_batch,
                    width,
                    elem_size,
                    ..
                } => Some(scratch(
                    rows_per_batch * u64::from(batch),
                    width,
                    elem_size,
                    self.gpu,
                )),
                _ => None,
            })
            .filter(|&(staging, _)| staging > 0)
            .collect()
    }

    /// The run's operations at batch size `batch`.
    pub fn ops_at(&self, batch: u32) -> Vec<Op> {
        let dx = f64::from(batch) - f64::from(self.base_batch);
        let mut ops = Vec::with_capacity(self.ops.len());
        for (op, _) in self.ops.iter().filter(|(_, presence)| presence.at(batch)) {
            match *op {
                RunOp::Alloc {
                    id,
                    base,
                    slope,
                    stream,
                    tag,
                    optional,
                } => {
                    let size = (base as f64 + slope * dx).round().max(1.0) as u64;
                    ops.push(Op::allocation(id, size, stream, tag, optional));
                }
                RunOp::Scratch {
                    ids,
                    rows_per_batch,
                    width,
                    elem_size,
                    stream,
                    tag,
                    ..
                } => {
                    let rows = rows_per_batch * u64::from(batch);
                    let (staging, semaphores) = scratch(rows, width, elem_size, self.gpu);
                    if staging == 0 {
                        continue;
                    }
                    // Allocated for the kernel's launch and freed after it,
                    // the semaphores first (as C++ destroys them).
                    for (id, size) in ids.into_iter().zip([staging, semaphores]) {
                        ops.push(Op::Alloc {
                            id,
                            size,
                            stream,
                            tag,
                        });
                    }
                    ops.extend(ids.into_iter().rev().map(|id| Op::Free { id }));
                }
                RunOp::Fixed(op) => ops.push(op),
            }
        }
        ops
    }
}
