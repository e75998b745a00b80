//! What a piece of live memory is: parameter, gradient, optimizer state,
//! activation, temporary, input or other.
//!
//! Decided from *lifetime and phase*: where the block was born (in a forward
//! pass, in backward, in an optimizer step, while a model was built) and where
//! it died (the stack of its `free_requested` event, or never). Frames serve
//! only to tell the phase, which PyTorch's own frames name reliably
//! (`torch/autograd` backward, `torch/optim`, `nn.Module.__call__`).

use crate::frames::{self, FrameKind};
use crate::snapshot::{Action, Snapshot, StackId, EMPTY_STACK};
use serde::{Deserialize, Serialize};

/// A category of live memory. The discriminant is the small integer the HTML
/// report uses for it ([`Category::code`]).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Category {
    /// Model weights: made while the model was built, alive to the end.
    Parameter = 0,
    /// Made in backward, alive until the optimizer's `zero_grad` (or later).
    Gradient = 1,
    /// Made in an optimizer step, alive across steps (Adam moments, momentum).
    OptimizerState = 2,
    /// Made in a forward pass (or by user code: a loss) and freed in backward
    /// (saved for the gradient), or made in a forward pass and kept alive
    /// past its step.
    Activation = 3,
    /// Freed in the phase that made it.
    Temporary = 4,
    /// Made by user code outside any model call (a batch), alive for a step or more.
    Input = 5,
    /// Anything else, or unknown.
    #[default]
    Other = 6,
}

impl Category {
    /// All categories, in display order.
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Input,
        Category::Other,
    ];

    /// The small integer the report page uses for this category.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The category of a code; unknown codes are [`Category::Other`].
    pub fn from_code(code: u8) -> Category {
        Category::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(Category::Other)
    }

    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::Other => "other",
        }
    }

    /// How a block lands in this category, in a sentence.
    pub fn rule(self) -> &'static str {
        match self {
            Category::Parameter => "made while building or moving the model (nn.Module code, not in a forward call) and alive past that step",
            Category::Gradient => "made in backward (autograd frames, a compiled backward's too) and outliving it, until zero_grad or later; or freed by zero_grad",
            Category::OptimizerState => "made in an optimizer step (torch/optim frames, or a hand-written optimizer's own `step`) and outliving that step",
            Category::Activation => "made in a forward pass (or by user code) and freed in backward, or made in a forward pass and still alive after its step",
            Category::Temporary => "freed in the same phase that made it",
            Category::Input => "made by user code outside any model call and alive to the next step or later",
            Category::Other => "none of the above, or a cuBLAS workspace (a block of a cuBLAS workspace size made at the first matrix multiply of a stream and thread, never freed)",
        }
    }
}

/// Bytes by category for people, largest first (ties keep their order):
/// `activation 5.49 GiB, temporary 625.03 MiB`.
pub fn category_mix<'a>(parts: impl IntoIterator<Item = (&'a str, u64)>) -> String {
    let mut parts: Vec<(&str, u64)> = parts.into_iter().collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    parts
        .iter()
        .map(|(c, b)| format!("{c} {}", crate::units::format_bytes(*b)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The phase a stack shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// In `loss.backward()` / the autograd engine.
    Backward,
    /// In an optimizer's `step` or `zero_grad`.
    Optimizer,
    /// In a module's forward call.
    Forward,
    /// In nn.Module code outside a forward call (construction, `.cuda()`).
    ModelBuild,
    /// In user code, in no model call.
    User,
    /// No stack recorded.
    Unknown,
}

/// The phase of every stack of a snapshot.
pub struct Phases {
    of: Vec<Phase>,
    /// Stacks in user code that ran a `torch.nn.functional` op, sorted.
    functional: Vec<StackId>,
}

impl Phases {
    /// Classifies every stack of `snap`.
    pub fn new(snap: &Snapshot) -> Self {
        let of: Vec<Phase> = (0..snap.stack_ranges.len() as StackId)
            .map(|s| phase_of(snap, s))
            .collect();
        let functional = (0..of.len() as StackId)
            .filter(|&s| of[s as usize] == Phase::User)
            .filter(|&s| {
                snap.stack(s).iter().any(|&f| {
                    snap.str(snap.frame(f).filename)
                        .ends_with("torch/nn/functional.py")
                })
            })
            .collect();
        Phases { of, functional }
    }

    /// Whether `stack` is user code running a `torch.nn.functional` op
    /// outside any module (a loss on the logits): what it makes belongs to
    /// the forward computation's graph, not to the data.
    pub fn is_functional_op(&self, stack: StackId) -> bool {
        self.functional.binary_search(&stack).is_ok()
    }

    /// [`classify`] for a block made under `stack`, with what the stack
    /// itself tells: a loss (any functional op on the graph) kept past its
    /// step keeps the graph, so it is an activation, not a batch of data.
    /// Every classification by birth and death goes through here, with a
    /// trace or without (a legacy snapshot's blocks).
    pub fn classify_block(
        &self,
        stack: StackId,
        birth: Phase,
        death: Option<Phase>,
        outlived_step: bool,
    ) -> Category {
        let kept = death.is_none() || outlived_step;
        if birth == Phase::User && kept && self.is_functional_op(stack) {
            return Category::Activation;
        }
        classify(birth, death, outlived_step)
    }

    /// The phase of a stack.
    pub fn of(&self, stack: StackId) -> Phase {
        self.of
            .get(stack as usize)
            .copied()
            .unwrap_or(Phase::Unknown)
    }
}

fn phase_of(snap: &Snapshot, stack: StackId) -> Phase {
    if stack == EMPTY_STACK {
        return Phase::Unknown;
    }
    if engine_runs_python_backward(snap, stack) {
        return Phase::Backward;
    }
    let mut forward = false;
    let mut module = false;
    let mut python = false;
    let mut user_inside = false;
    for &f in snap.stack(stack) {
        let fr = snap.frame(f);
        let file = snap.str(fr.filename);
        let name = snap.str(fr.name);
        // The same rule whatever the recording mode: the autograd engine's
        // C++ frames (stacks="all") say backward as surely as Python's.
        if frames::is_backward_frame(file, name) {
            return Phase::Backward;
        }
        let kind = frames::classify(file, name);
        if kind == FrameKind::Native {
            continue;
        }
        python = true;
        if file.contains("/torch/optim/") {
            return Phase::Optimizer;
        }
        // A hand-written optimizer: the user's own `step` method, reached
        // without a model call inside it, making the tensor itself (torch's
        // frames aside). A training loop's own `step()` that calls the
        // user's `make_batch()` or `loss()` is not one: what those make is
        // the batch and the loss, not optimizer state.
        if kind == FrameKind::User
            && (name == "step" || name == "zero_grad")
            && !forward
            && !user_inside
        {
            return Phase::Optimizer;
        }
        user_inside |= kind == FrameKind::User;
        if (name == "_call_impl" || name == "_wrapped_call_impl")
            && file.ends_with("torch/nn/modules/module.py")
        {
            forward = true;
        }
        // Library code that builds, moves or loads a model; not the ops
        // (`torch.nn.functional`) or a generation loop it calls.
        let ops =
            file.ends_with("torch/nn/functional.py") || file.contains("/transformers/generation/");
        if !ops
            && (file.contains("/torch/nn/")
                || file.contains("/transformers/")
                || file.contains("/timm/")
                || file.contains("/torchvision/")
                || file.ends_with("torch/serialization.py")
                || file.contains("/safetensors/")
                || file.contains("/accelerate/")
                || (kind == FrameKind::Torch && is_move(name)))
        {
            module = true;
        }
    }
    if !python {
        // Only native frames (a C++ thread, stacks="all"): like no stack.
        return Phase::Unknown;
    }
    if forward {
        Phase::Forward
    } else if module {
        Phase::ModelBuild
    } else {
        Phase::User
    }
}

/// Whether the outermost Python frame of a stack is the autograd engine
/// calling a Python `backward` (`BackwardCFunction.apply`, the engine's
/// thread has no other Python frame): a custom `autograd.Function`'s or a
/// compiled graph's backward. The same `Function.apply` in a forward pass
/// has its callers' frames below it.
fn engine_runs_python_backward(snap: &Snapshot, stack: StackId) -> bool {
    let outermost = snap.stack(stack).iter().rev().find_map(|&f| {
        let fr = snap.frame(f);
        let (file, name) = (snap.str(fr.filename), snap.str(fr.name));
        (frames::classify(file, name) != FrameKind::Native).then_some((file, name))
    });
    outermost
        .is_some_and(|(file, name)| name == "apply" && file.ends_with("torch/autograd/function.py"))
}

/// Functions that move or load weights (`Module._apply`, `.to`, `.cuda`,
/// `load_state_dict`): what they make outside a forward call is the model.
fn is_move(name: &str) -> bool {
    matches!(
        name,
        "_apply" | "to" | "cuda" | "load_state_dict" | "_load_from_state_dict" | "load"
    )
}

/// For every `alloc` event of a trace, the index of its `free_requested`
/// (or `free_completed` when the request was not recorded); `u32::MAX` when
/// the block is never freed in the trace.
pub fn free_index_of_allocs(snap: &Snapshot, trace: usize) -> Vec<u32> {
    let events = &snap.traces[trace].events;
    let mut free_of = vec![u32::MAX; events.len()];
    let mut live: hashbrown::HashMap<u64, u32> = hashbrown::HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, i as u32);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(a) = live.remove(&e.addr) {
                    free_of[a as usize] = i as u32;
                }
            }
            _ => {}
        }
    }
    free_of
}

/// The phase of every event of a trace.
///
/// CUDA backward runs on the autograd engine's device thread, which has no
/// Python stack: its events come with empty stacks between the main thread's
/// `loss.backward()` frames (with `stacks="all"`, C++ frames only). An event
/// with no Python frame therefore takes the Backward phase when the last event
/// with one was in backward.
pub fn event_phases(snap: &Snapshot, trace: usize, phases: &Phases) -> Vec<Phase> {
    let mut last = Phase::Unknown;
    snap.traces[trace]
        .events
        .iter()
        .map(|e| match phases.of(e.stack) {
            Phase::Unknown if last == Phase::Backward => Phase::Backward,
            Phase::Unknown => Phase::Unknown,
            p => {
                last = p;
                p
            }
        })
        .collect()
}

/// Sizes PyTorch gives the workspace it attaches to each cuBLAS handle and
/// stream (`getChosenWorkspaceSize`, CUDABlas): 32 MiB on Hopper and newer;
/// `4096 KiB × 2 + 16 KiB × 8` on older GPUs (4 MiB in some builds).
pub const CUBLAS_WORKSPACE_SIZES: [u64; 3] = [32 << 20, 4096 * 1024 * 2 + 16 * 1024 * 8, 4 << 20];

/// The `alloc` events of a trace that are cuBLAS workspaces, sorted.
///
/// The workspace is allocated on the first matrix multiply of each thread's
/// handle and stream and never freed: once from the main thread (with the
/// Python stack of that first forward matmul) and once from the autograd
/// engine's device thread (no Python stack) in training. Judged on lifetime,
/// one would be a kept activation and the other a gradient. So: a block of a
/// workspace size never freed in the trace, the first such block on its
/// stream from the user's thread or the first from the engine's, born in a forward pass,
/// in backward, with no stack, or in user code right after the output of its
/// op (a product on a side stream), and of a size that no block made while
/// building the model has (a gradient of a parameter of that size would).
pub fn cublas_workspaces(
    snap: &Snapshot,
    trace: usize,
    ev_phase: &[Phase],
    free_of: &[u32],
) -> Vec<u32> {
    WorkspaceCandidates::new(snap, trace, ev_phase).settle(snap, trace, free_of)
}

/// The `alloc` events that may be cuBLAS workspaces, found from the phases
/// alone; which of them are is settled once each allocation's free is known
/// ([`WorkspaceCandidates::settle`]). The split lets the walk over the whole
/// trace run before the frees are paired.
#[derive(Clone, Debug, Default)]
pub struct WorkspaceCandidates {
    /// Workspace sizes some block made while building the model also has.
    param_sized: Vec<u64>,
    /// Allocations of a workspace size born in a forward pass, in backward,
    /// with no stack, or in user code after its op's output, in trace order,
    /// each with whether it was made on the autograd engine's thread.
    candidates: Vec<(u32, bool)>,
}

impl WorkspaceCandidates {
    /// One walk over trace `trace` (millions of events, 32 bytes each).
    pub fn new(snap: &Snapshot, trace: usize, ev_phase: &[Phase]) -> WorkspaceCandidates {
        let events = &snap.traces[trace].events;
        let phase = |i: usize| ev_phase.get(i).copied().unwrap_or(Phase::Unknown);
        let mut c = WorkspaceCandidates::default();
        for (i, e) in events.iter().enumerate() {
            if e.action != Action::Alloc || !CUBLAS_WORKSPACE_SIZES.contains(&e.size) {
                continue;
            }
            match phase(i) {
                Phase::ModelBuild if !c.param_sized.contains(&e.size) => c.param_sized.push(e.size),
                // The engine's thread has its own handle, so its own
                // workspace: in backward, or with no stack at all (a
                // compiled backward has Python frames there).
                Phase::Backward | Phase::Unknown => c.candidates.push((i as u32, true)),
                Phase::Forward => c.candidates.push((i as u32, false)),
                // A matrix product in user code (on a side stream, say): the
                // op's output is allocated just before the workspace, under
                // the same stack. A tensor the user makes is not.
                Phase::User if follows_an_output_of_its_op(events, i) => {
                    c.candidates.push((i as u32, false))
                }
                _ => {}
            }
        }
        c
    }

    /// The workspaces among the candidates: never freed, the first of each
    /// (stream, thread: the engine's or the user's) pair, of a size no
    /// model-building block has; sorted.
    pub fn settle(&self, snap: &Snapshot, trace: usize, free_of: &[u32]) -> Vec<u32> {
        let events = &snap.traces[trace].events;
        // (stream, on the engine's thread) pairs that already have their workspace.
        let mut seen: Vec<(u16, bool)> = Vec::new();
        let mut out = Vec::new();
        for &(i, engine) in &self.candidates {
            let e = &events[i as usize];
            if free_of.get(i as usize) != Some(&u32::MAX) {
                continue;
            }
            let slot = (e.stream, engine);
            if seen.contains(&slot) || self.param_sized.contains(&e.size) {
                continue;
            }
            seen.push(slot);
            out.push(i);
        }
        out
    }
}

/// Whether the `alloc` event `i` directly follows (segment events aside)
/// another `alloc` on its stream under the same stack: the output of the op
/// whose first cuBLAS call then allocated a workspace.
fn follows_an_output_of_its_op(events: &[crate::snapshot::TraceEvent], i: usize) -> bool {
    let e = &events[i];
    let before = events[..i].iter().rev().find(|p| {
        !matches!(
            p.action,
            Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap
        )
    });
    before.is_some_and(|p| {
        p.action == Action::Alloc
            && p.stack == e.stack
            && p.stream == e.stream
            && p.stack != EMPTY_STACK
    })
}

/// Classifies one block from the phase of its birth and of its death (`None`
/// when never freed); `outlived_step` says whether it was still alive when the
/// step that made it ended.
pub fn classify(birth: Phase, death: Option<Phase>, outlived_step: bool) -> Category {
    let kept = outlived_step || death.is_none();
    match birth {
        Phase::ModelBuild if kept => Category::Parameter,
        Phase::Backward => match death {
            Some(Phase::Backward) if !outlived_step => Category::Temporary,
            _ => Category::Gradient,
        },
        Phase::Optimizer if kept => Category::OptimizerState,
        Phase::Forward => match death {
            Some(Phase::Backward) => Category::Activation,
            // Freed by `zero_grad`: a gradient a compiled forward allocated
            // (AOT autograd may make one there, the embedding's).
            Some(Phase::Optimizer) => Category::Gradient,
            _ if kept => Category::Activation,
            _ => Category::Temporary,
        },
        // Freed by backward: the graph saved it (a loss computed in user
        // code, `F.cross_entropy` on the logits), like a forward's output.
        Phase::User if death == Some(Phase::Backward) => Category::Activation,
        Phase::User if kept => Category::Input,
        Phase::Unknown if death.is_none() => Category::Other,
        _ => Category::Temporary,
    }
}
