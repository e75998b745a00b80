//! The analysed trace: each snapshot is read once into the facts every
//! analysis needs, and every analysis (peak, leaks, diff, categories, oom,
//! the report, doctor) borrows them instead of walking the trace again.
//!
//! For each device trace: the phase of every event, each `alloc`'s free, the
//! cuBLAS workspaces, the steps and how they were found, which steps ran a
//! backward pass. For the snapshot: the site of every stack (one frame
//! rulebook, [`crate::frames`]) and the phase of every stack.

pub mod categories;
pub mod sites;
pub mod steps;

use crate::replay::during_read::{PeakPass, PendingPass, RecordedPasses};
use crate::snapshot::{Action, Snapshot, StackId};
use categories::{
    event_phases, free_index_of_allocs, Category, Phase, Phases, WorkspaceCandidates,
};
use sites::{Site, SiteIndex, BACKWARD_PASS, BEFORE_RECORDING, NO_STACK};
use std::sync::Arc;
use steps::Steps;

/// The facts of one device trace.
#[derive(Clone, Debug)]
pub struct TraceFacts {
    /// Index of the trace in [`Snapshot::traces`].
    pub trace: usize,
    /// Its device.
    pub device: u32,
    /// The phase of every event.
    pub ev_phase: Vec<Phase>,
    /// For every `alloc` event, the index of its free (`u32::MAX`: never).
    /// Shared with the replay beside the reader when it paired them.
    pub free_of: Arc<Vec<u32>>,
    /// The index of every `alloc` event, in order (a walk over allocations
    /// need not read the whole trace).
    pub allocs: Vec<u32>,
    /// `alloc` events that made cuBLAS workspaces, sorted.
    pub workspaces: Vec<u32>,
    /// The steps, and how they were found.
    pub steps: Steps,
    /// For each step: whether a backward pass ran in it.
    pub backward_in_step: Vec<bool>,
    /// The events where a run of model work (a forward or backward pass)
    /// begins, in order.
    pub model_runs: Vec<u32>,
    /// Stacks of blocks made in a forward pass and freed by the optimizer
    /// (`zero_grad`), sorted: gradients a compiled forward makes, so the
    /// same stack's block still alive is one too.
    pub forward_made_gradients: Vec<StackId>,
}

/// A snapshot with its analysis done once.
pub struct Analysed<'s> {
    /// The snapshot.
    pub snap: &'s Snapshot,
    /// The site of every stack.
    pub sites: SiteIndex,
    /// The phase of every stack.
    pub phases: Phases,
    /// One entry per device trace, in [`Snapshot::traces`] order.
    pub traces: Vec<TraceFacts>,
    /// The one replay of each trace under its recorded settings (beside the
    /// reader, if the snapshot was read that way).
    recorded: Arc<RecordedPasses>,
}

impl<'s> Analysed<'s> {
    /// Analyses `snap`: one pass over each trace for phases, frees and steps.
    pub fn new(snap: &'s Snapshot) -> Analysed<'s> {
        Analysed::with_pass(snap, None)
    }

    /// [`Analysed::new`] of a snapshot read with its trace replayed beside
    /// the reader: `fed` is that replay, which pairs the frees and gives the
    /// peaks without a replay of their own where it went through the trace.
    pub fn with_pass(snap: &'s Snapshot, fed: Option<Arc<PendingPass>>) -> Analysed<'s> {
        Analysed::with_recorded(snap, Arc::new(RecordedPasses::new(fed)))
    }

    /// [`Analysed::new`] sharing `recorded`, the one replay of each trace.
    pub fn with_recorded(snap: &'s Snapshot, recorded: Arc<RecordedPasses>) -> Analysed<'s> {
        crate::work::note_analysed();
        let sites = SiteIndex::new(snap);
        let phases = Phases::new(snap);
        let pass = recorded.pending();
        let traces = (0..snap.traces.len())
            .map(|t| TraceFacts::new(snap, t, &phases, pass))
            .collect();
        Analysed {
            snap,
            sites,
            phases,
            traces,
            recorded,
        }
    }

    /// The replay made beside the reader, once it is done (this waits for
    /// it); `None` when the snapshot was not read that way or the trace
    /// could not be replayed so.
    pub fn fed_pass(&self) -> Option<&PeakPass> {
        self.recorded.fed()
    }

    /// The one replay of each trace under its recorded settings.
    pub fn recorded(&self) -> &RecordedPasses {
        &self.recorded
    }

    /// The facts of trace `trace`.
    pub fn trace(&self, trace: usize) -> Option<&TraceFacts> {
        self.traces.get(trace)
    }

    /// A classifier of the blocks of trace `trace` (`None` past the traces).
    pub fn classifier(&self, trace: usize) -> Option<BlockClassifier<'_>> {
        Some(BlockClassifier {
            facts: self.traces.get(trace)?,
            phases: &self.phases,
            until: usize::MAX,
        })
    }

    /// The site of a block as users see it: its stack's site, or the
    /// pseudo-site its history gives when the stack names none (a cuBLAS
    /// workspace, the autograd thread, a block from before recording).
    pub fn block_site(&self, trace: usize, alloc_index: Option<u32>, stack: StackId) -> Site {
        self.site_of(self.block_site_key(trace, alloc_index, stack))
    }

    /// What [`Analysed::block_site`] depends on, without building the
    /// [`Site`] (strings): for loops over every allocation, which build each
    /// distinct site once. Equal keys give equal sites; different keys
    /// usually give different sites, but not always (two call paths ending
    /// at one line are two sites, yet the same cuBLAS workspace pseudo-site).
    pub fn block_site_key(
        &self,
        trace: usize,
        alloc_index: Option<u32>,
        stack: StackId,
    ) -> BlockSiteKey {
        let key = self.sites.key(stack);
        let facts = self.traces.get(trace);
        if facts.is_some_and(|f| f.is_cublas_workspace(alloc_index)) {
            return BlockSiteKey::Workspace(key);
        }
        if self
            .sites
            .site_of_key(key)
            .is_some_and(|s| s.site != NO_STACK)
        {
            return BlockSiteKey::Stack(key);
        }
        let birth = match (alloc_index, facts) {
            (Some(i), Some(f)) => f.ev_phase.get(i as usize).copied(),
            _ => None,
        };
        if alloc_index.is_none() {
            BlockSiteKey::BeforeRecording
        } else if birth == Some(Phase::Backward) {
            BlockSiteKey::BackwardPass
        } else {
            BlockSiteKey::Stack(key)
        }
    }

    /// The site a [`BlockSiteKey`] stands for.
    pub fn site_of(&self, key: BlockSiteKey) -> Site {
        let of_key = |k: u32| {
            self.sites
                .site_of_key(k)
                .cloned()
                .unwrap_or_else(|| Site::pseudo(NO_STACK))
        };
        match key {
            BlockSiteKey::Stack(k) => of_key(k),
            BlockSiteKey::Workspace(k) => {
                let site = of_key(k);
                Site::pseudo(&if site.user_code {
                    format!("<cuBLAS workspace: first matmul at {}>", site.site)
                } else {
                    "<cuBLAS workspace: autograd thread>".to_string()
                })
            }
            BlockSiteKey::BeforeRecording => Site::pseudo(BEFORE_RECORDING),
            BlockSiteKey::BackwardPass => Site::pseudo(BACKWARD_PASS),
        }
    }
}

/// A block's site as a small value ([`Analysed::block_site_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockSiteKey {
    /// The site of the stack (key of [`SiteIndex::key`]).
    Stack(u32),
    /// A cuBLAS workspace first made under the stack of that key.
    Workspace(u32),
    /// A block live when recording began, with no stack.
    BeforeRecording,
    /// A block made in a backward pass, with no stack.
    BackwardPass,
}

/// The events where a forward or backward pass begins: an event in one whose
/// predecessor was in neither (events of no phase, such as frees with no
/// stack, do not end a run).
fn model_run_starts(ev_phase: &[Phase]) -> Vec<u32> {
    let mut in_model = false;
    let mut starts = Vec::new();
    for (i, p) in ev_phase.iter().enumerate() {
        match p {
            Phase::Forward | Phase::Backward => {
                if !in_model {
                    starts.push(i as u32);
                }
                in_model = true;
            }
            Phase::Unknown => {}
            _ => in_model = false,
        }
    }
    starts
}

/// The stacks (sorted, once each) of `alloc` events in a forward pass whose
/// block the optimizer freed.
fn forward_stacks_freed_by_optimizer(
    snap: &Snapshot,
    trace: usize,
    ev_phase: &[Phase],
    allocs: &[u32],
    free_of: &[u32],
) -> Vec<StackId> {
    let events = &snap.traces[trace].events;
    let phase = |i: usize| ev_phase.get(i).copied().unwrap_or(Phase::Unknown);
    let mut stacks: Vec<StackId> = allocs
        .iter()
        .map(|&a| a as usize)
        .filter(|&a| phase(a) == Phase::Forward)
        .filter(|&a| {
            free_of
                .get(a)
                .is_some_and(|&f| f != u32::MAX && phase(f as usize) == Phase::Optimizer)
        })
        .map(|a| events[a].stack)
        .collect();
    stacks.sort_unstable();
    stacks.dedup();
    stacks
}

/// For each step: whether a backward pass allocated in it. Step by step: the
/// phases (a byte an event) are read first, and a step's events only until
/// its first backward `alloc`.
fn backward_in_each_step(
    snap: &Snapshot,
    trace: usize,
    ev_phase: &[Phase],
    steps: &Steps,
) -> Vec<bool> {
    let events = &snap.traces[trace].events;
    (0..steps.len())
        .map(|s| {
            let range = steps.range(s);
            match (events.get(range.clone()), ev_phase.get(range)) {
                (Some(ev), Some(ph)) => ph
                    .iter()
                    .zip(ev)
                    .any(|(p, e)| *p == Phase::Backward && e.action == Action::Alloc),
                _ => false,
            }
        })
        .collect()
}

impl TraceFacts {
    fn new(
        snap: &Snapshot,
        trace: usize,
        phases: &Phases,
        fed: Option<&PendingPass>,
    ) -> TraceFacts {
        // Each alloc's free does not depend on the phases and steps: what
        // needs no frees runs beside the pairing (which may wait for the
        // replay beside the reader to finish), so that little is left after.
        let (free_of, (ev_phase, steps, candidates, backward_in_step, allocs)) = rayon::join(
            || {
                // The replay beside the reader paired them already, if it
                // went through this trace.
                let t = &snap.traces[trace];
                match fed.and_then(PendingPass::get).filter(|p| p.replayed(t)) {
                    Some(p) => Arc::clone(p.free_of()),
                    None => Arc::new(free_index_of_allocs(snap, trace)),
                }
            },
            || {
                let ev_phase = event_phases(snap, trace, phases);
                let steps = steps::detect(snap, trace, &ev_phase);
                let candidates = WorkspaceCandidates::new(snap, trace, &ev_phase);
                let backward_in_step = backward_in_each_step(snap, trace, &ev_phase, &steps);
                let allocs: Vec<u32> = (snap.traces[trace].events.iter().enumerate())
                    .filter(|(_, e)| e.action == Action::Alloc)
                    .map(|(i, _)| i as u32)
                    .collect();
                (ev_phase, steps, candidates, backward_in_step, allocs)
            },
        );
        let workspaces = candidates.settle(snap, trace, &free_of);
        let model_runs = model_run_starts(&ev_phase);
        let forward_made_gradients =
            forward_stacks_freed_by_optimizer(snap, trace, &ev_phase, &allocs, &free_of);
        TraceFacts {
            trace,
            device: snap.traces[trace].device,
            ev_phase,
            free_of,
            allocs,
            workspaces,
            steps,
            backward_in_step,
            model_runs,
            forward_made_gradients,
        }
    }

    /// Whether a forward or backward pass began after event `birth` and
    /// before event `death`: a block alive then was there while the model ran.
    pub fn model_ran_between(&self, birth: usize, death: usize) -> bool {
        let k = self.model_runs.partition_point(|&s| s as usize <= birth);
        self.model_runs
            .get(k)
            .is_some_and(|&s| (s as usize) < death)
    }

    /// Whether a model ran before event `end`: some event of the trace was
    /// in a module's forward call or in the backward pass. Only then does
    /// the trace show a batch axis (advice about the batch size is grounded).
    pub fn model_ran_before(&self, end: usize) -> bool {
        let end = end.min(self.ev_phase.len());
        self.ev_phase[..end]
            .iter()
            .any(|p| matches!(p, Phase::Forward | Phase::Backward))
    }

    /// Whether the `alloc` event `alloc_index` made a cuBLAS workspace.
    pub fn is_cublas_workspace(&self, alloc_index: Option<u32>) -> bool {
        alloc_index.is_some_and(|i| self.workspaces.binary_search(&i).is_ok())
    }

    /// Whether a backward pass ran after event `index` before the next
    /// forward pass began: the forward that made a block there was trained
    /// on (`false` for evaluation, or a forward whose outputs were kept and
    /// never back-propagated).
    pub fn backward_follows(&self, index: usize) -> bool {
        let mut left_forward = false;
        for p in self.ev_phase.iter().skip(index + 1) {
            match p {
                Phase::Backward => return true,
                Phase::Forward if left_forward => return false,
                Phase::Forward | Phase::Unknown => {}
                _ => left_forward = true,
            }
        }
        false
    }

    /// Whether any backward pass ran in the trace.
    pub fn backward_seen(&self) -> bool {
        self.backward_in_step.iter().any(|b| *b)
    }
}

/// Tells what a block is from its birth and death in one trace: the phase of
/// its `alloc` event, the phase of its free (or none), and whether it outlived
/// the step that made it ([`Phases::classify_block`]).
#[derive(Clone, Copy)]
pub struct BlockClassifier<'a> {
    facts: &'a TraceFacts,
    phases: &'a Phases,
    /// Frees at or after this event are forgotten.
    until: usize,
}

impl<'a> BlockClassifier<'a> {
    /// Forgets frees at or after event `end`: blocks are classified as they
    /// stood then (for an OOM, the frees of the exception's unwinding do not
    /// make the failing step's activations temporaries).
    pub fn until(mut self, end: usize) -> Self {
        self.until = end;
        self
    }

    /// The trace's facts.
    pub fn facts(&self) -> &'a TraceFacts {
        self.facts
    }

    /// Whether the `alloc` event `alloc_index` made a cuBLAS workspace.
    pub fn is_cublas_workspace(&self, alloc_index: Option<u32>) -> bool {
        self.facts.is_cublas_workspace(alloc_index)
    }

    /// The event index that frees the block made by `alloc_index`, if it is
    /// freed (before the `until` bound).
    pub fn free_of(&self, alloc_index: usize) -> Option<usize> {
        self.facts
            .free_of
            .get(alloc_index)
            .map(|&f| f as usize)
            .filter(|&f| f != u32::MAX as usize && f < self.until)
    }

    /// Whether the block made by `alloc_index` is still live at event `at`
    /// (not freed before it).
    pub fn live_at(&self, alloc_index: usize, at: usize) -> bool {
        self.free_of(alloc_index).is_none_or(|f| f >= at)
    }

    /// The category and birth phase of the block made by the `alloc` event
    /// `alloc_index` (`None`: a block from before the trace, known by `stack`).
    pub fn classify(&self, alloc_index: Option<u32>, stack: StackId) -> (Category, Phase) {
        let phase_at = |i: usize| {
            self.facts
                .ev_phase
                .get(i)
                .copied()
                .unwrap_or(Phase::Unknown)
        };
        if self.is_cublas_workspace(alloc_index) {
            let birth = alloc_index.map_or(Phase::Unknown, |i| phase_at(i as usize));
            return (Category::Other, birth);
        }
        let starts = &self.facts.steps.starts;
        let step_end = |i: usize| -> usize {
            let k = starts.partition_point(|&s| s <= i);
            starts.get(k).copied().unwrap_or(usize::MAX)
        };
        let (birth, death, outlived) = match alloc_index {
            Some(ai) => {
                let ai = ai as usize;
                let birth = phase_at(ai);
                match self.free_of(ai) {
                    // Weights moved to the GPU and freed at the end of an
                    // inference run (no steps to outlive) lived while the
                    // model ran: that is outliving the step that made them.
                    Some(fi) => {
                        let outlived = fi >= step_end(ai)
                            || (birth == Phase::ModelBuild && self.facts.model_ran_between(ai, fi));
                        (birth, Some(phase_at(fi)), outlived)
                    }
                    None if birth == Phase::Forward
                        && self
                            .facts
                            .forward_made_gradients
                            .binary_search(&stack)
                            .is_ok() =>
                    {
                        return (Category::Gradient, birth)
                    }
                    None => (birth, None, true),
                }
            }
            None => (self.phases.of(stack), None, true),
        };
        (
            self.phases.classify_block(stack, birth, death, outlived),
            birth,
        )
    }
}
