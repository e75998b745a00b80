//! `memlens peak --by module`: live memory at the peak grouped by the modules
//! whose `forward` was running when each block was allocated, as a tree
//! (model -> block -> attention), with bytes, blocks and categories.
//!
//! Snapshot frames carry only function names (`forward`), so a module is named,
//! best first, by:
//!
//! 1. **Instances**: `memlens.record(..., model=model)` opens a
//!    `memlens.module QUALNAME:CLASS` record_function scope around each
//!    module's forward (python/memlens/_modules.py); the snapshot keeps the
//!    scopes with their times in `external_annotations`, and a block belongs
//!    to the scopes open when its `alloc` event happened
//!    (`transformer.h.3.attn`).
//! 2. **Classes**: otherwise each `forward` frame of the block's stack is named
//!    by the `class` that encloses its line, when the source file is readable
//!    ([`crate::source::SourceFinder`]): `GPT2Attention`.
//! 3. **Files**: otherwise `modeling_gpt2.py:forward`.
//!
//! Blocks allocated outside any forward (parameters loaded before recording,
//! gradients, optimizer state) go under one top-level group, split by category,
//! so the top-level groups sum to the peak exactly.

use super::categories::Category;
use crate::replay::LiveBlock;
use crate::snapshot::{Snapshot, StackId, StrId};
use crate::source::{class_of_line, SourceFinder};
use crate::trace::Analysed;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Prefix of the scopes `memlens.record(model=...)` opens (python/memlens/_modules.py).
pub const MODULE_MARKER: &str = "memlens.module ";

/// The name of the top-level group of blocks allocated outside any forward.
pub const OUTSIDE: &str = "(outside any module's forward)";

/// The group, under [`OUTSIDE`], of blocks allocated before the trace began
/// (no stack, no time: parameters and optimizer state of a model built before
/// recording started).
pub const BEFORE_RECORDING: &str = "(allocated before the recording)";

/// How modules were named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Naming {
    /// Module instances, from `memlens.record(model=...)`'s scopes.
    Instances,
    /// The `forward` frames of each stack: classes where the source was
    /// readable, else `file.py:forward`.
    Frames,
}

/// One module (or the outside group) and what it holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleGroup {
    /// The instance (`transformer.h.0.attn`), class (`GPT2Attention`) or
    /// `file.py:forward`; the root instance is named by its class.
    pub name: String,
    /// The class, when known.
    pub class: Option<String>,
    /// Bytes live at the peak allocated in this module's forward (its children included).
    pub bytes: u64,
    /// Blocks.
    pub count: u64,
    /// Bytes by category.
    pub categories: BTreeMap<String, u64>,
    /// The modules called by this one, largest first.
    pub children: Vec<ModuleGroup>,
}

/// Live memory at the allocated peak, by module.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleReport {
    /// The device reported on (the one with the highest allocated peak).
    pub device: u32,
    /// Peak allocated bytes; the top-level groups sum to it.
    pub peak_allocated_bytes: u64,
    /// Event index of the peak (`null`: the state before the trace).
    pub peak_event_index: Option<usize>,
    /// How modules were named.
    pub naming: Naming,
    /// Top-level groups, largest first.
    pub groups: Vec<ModuleGroup>,
    /// Caveats.
    pub warnings: Vec<String>,
}

/// Live memory at the allocated peak of the device with the highest peak,
/// by module.
pub fn modules_at_peak(an: &Analysed, finder: &SourceFinder) -> ModuleReport {
    let snap = an.snap;
    // The trace with the highest allocated peak, from each trace's one
    // replay (which kept the blocks live at its peak).
    let mut best: Option<(usize, std::sync::Arc<crate::replay::during_read::PeakPass>)> = None;
    for (i, t) in snap.traces.iter().enumerate() {
        if t.events.is_empty() {
            continue;
        }
        let pass = an.recorded().of(snap, i);
        if best
            .as_ref()
            .is_none_or(|(_, b)| pass.peaks.allocated.0 > b.peaks.allocated.0)
        {
            best = Some((i, pass));
        }
    }
    let Some((trace, pass)) = best else {
        return ModuleReport {
            device: snap.first_traced_device(),
            peak_allocated_bytes: 0,
            peak_event_index: None,
            naming: Naming::Frames,
            groups: Vec::new(),
            warnings: vec!["the snapshot has no trace: no peak to group by module".into()],
        };
    };
    let (allocated, event) = pass.peaks.allocated;
    modules_of_live(an, trace, event, pass.live_at_peak(), allocated, finder)
}

/// The module tree of the blocks `live` (pending frees left out) of trace
/// `trace`, live right after event `event` with `allocated` bytes allocated:
/// for a caller that replayed to that event already (doctor's peak).
pub fn modules_of_live(
    an: &Analysed,
    trace: usize,
    event: Option<usize>,
    live: &[LiveBlock],
    allocated: u64,
    finder: &SourceFinder,
) -> ModuleReport {
    let snap = an.snap;
    let t = &snap.traces[trace];
    let mut live: Vec<&LiveBlock> = live.iter().filter(|b| !b.pending_free).collect();
    let scopes = ScopeTimeline::new(snap, t.device);
    let naming = if scopes.is_empty() {
        Naming::Frames
    } else {
        Naming::Instances
    };
    let mut names = FrameNames::new(snap, finder);
    let classifier = an.classifier(trace);
    let mut root = Node::default();
    // Blocks in allocation order, so the scope timeline is swept once.
    live.sort_by_key(|b| b.alloc_index.map_or(-1, i64::from));
    let mut sweep = scopes.sweep();
    for &b in &live {
        let cat = classifier
            .as_ref()
            .map_or(Category::Other, |c| c.classify(b.alloc_index, b.stack).0);
        let time = b
            .alloc_index
            .and_then(|i| t.events.get(i as usize))
            .map(|e| e.time_us);
        let path: Vec<(String, Option<String>)> = match naming {
            Naming::Instances => time.map_or_else(Vec::new, |tm| sweep.open_at(tm)),
            Naming::Frames => names.path(b.stack),
        };
        let path = if path.is_empty() {
            let what = if b.alloc_index.is_none() {
                BEFORE_RECORDING.to_string()
            } else {
                format!("({})", cat.as_str())
            };
            vec![(OUTSIDE.to_string(), None), (what, None)]
        } else {
            path
        };
        root.add(&path, b.size, cat);
    }
    let mut warnings = Vec::new();
    let total: u64 = live.iter().map(|b| b.size).sum();
    if total != allocated {
        warnings.push(format!(
            "the live blocks hold {total} bytes but the replay counts {allocated} allocated"
        ));
    }
    ModuleReport {
        device: t.device,
        peak_allocated_bytes: allocated,
        peak_event_index: event,
        naming,
        groups: root.into_groups(),
        warnings,
    }
}

/// The innermost module scope (`memlens.record(model=...)`) open at each of
/// `times` on `device`, by qualified name; `None` where none was open or the
/// snapshot has no module scopes.
pub fn innermost_module_at(snap: &Snapshot, device: u32, times: &[i64]) -> Vec<Option<String>> {
    let scopes = ScopeTimeline::new(snap, device);
    let mut order: Vec<usize> = (0..times.len()).collect();
    order.sort_by_key(|&i| times[i]);
    let mut out = vec![None; times.len()];
    let mut sweep = scopes.sweep();
    for i in order {
        out[i] = sweep.open_at(times[i]).pop().map(|(name, _)| name);
    }
    out
}

/// One call of a module's `forward`, from the scope `memlens.record(model=...)`
/// opened around it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleCall {
    /// The instance's qualified name (`transformer.h.3`; the root's is empty).
    pub qualname: String,
    /// Its class, when the scope named one.
    pub class: Option<String>,
    /// When the scope opened and closed, epoch microseconds.
    pub start_us: i64,
    /// When it closed (`i64::MAX`: never, the trace stopped inside it).
    pub end_us: i64,
    /// Module calls open around it (0: called from outside any module).
    pub depth: usize,
}

/// Every module call on `device`, in the order they began; empty when the
/// snapshot has no module scopes. A scope closed out of order closes the
/// ones opened inside it, as the sweep of [`innermost_module_at`] does.
pub fn module_calls(snap: &Snapshot, device: u32) -> Vec<ModuleCall> {
    let scopes = ScopeTimeline::new(snap, device);
    let mut calls: Vec<ModuleCall> = Vec::new();
    // Open calls: (index into calls, scope name as the timeline keys it).
    let mut open: Vec<(usize, &str)> = Vec::new();
    for (t, start, name, class) in &scopes.marks {
        if *start {
            let qualname = if class.as_deref() == Some(name.as_str()) && !name.contains('.') {
                // The timeline names the root by its class; a root scope's
                // qualified name is empty (a child named like its class is
                // told apart by its parent being open).
                if open.is_empty() {
                    String::new()
                } else {
                    name.clone()
                }
            } else {
                name.clone()
            };
            open.push((calls.len(), name.as_str()));
            calls.push(ModuleCall {
                qualname,
                class: class.clone(),
                start_us: *t,
                end_us: i64::MAX,
                depth: open.len() - 1,
            });
        } else if let Some(k) = open.iter().rposition(|(_, n)| *n == name.as_str()) {
            for (i, _) in open.drain(k..) {
                calls[i].end_us = *t;
            }
        }
    }
    calls
}

/// A tree under construction.
#[derive(Default)]
struct Node {
    class: Option<String>,
    bytes: u64,
    count: u64,
    categories: BTreeMap<Category, u64>,
    children: HashMap<String, Node>,
}

impl Node {
    fn add(&mut self, path: &[(String, Option<String>)], size: u64, cat: Category) {
        let mut node = self;
        for (name, class) in path {
            node = node.children.entry(name.clone()).or_default();
            if node.class.is_none() {
                node.class.clone_from(class);
            }
            node.bytes += size;
            node.count += 1;
            *node.categories.entry(cat).or_default() += size;
        }
    }

    fn into_groups(self) -> Vec<ModuleGroup> {
        let mut groups: Vec<ModuleGroup> = self
            .children
            .into_iter()
            .map(|(name, n)| ModuleGroup {
                name,
                class: n.class.clone(),
                bytes: n.bytes,
                count: n.count,
                categories: n
                    .categories
                    .iter()
                    .map(|(c, b)| (c.as_str().to_string(), *b))
                    .collect(),
                children: n.into_groups(),
            })
            .collect();
        groups.sort_by(|a, b| (b.bytes, &a.name).cmp(&(a.bytes, &b.name)));
        groups
    }
}

/// The module scopes of one device, in time order.
struct ScopeTimeline {
    /// (time, start, name, class).
    marks: Vec<(i64, bool, String, Option<String>)>,
}

impl ScopeTimeline {
    fn new(snap: &Snapshot, device: u32) -> ScopeTimeline {
        let mut marks: Vec<(i64, bool, String, Option<String>)> = snap
            .annotations
            .iter()
            .filter(|a| a.device == device)
            .filter_map(|a| {
                let rest = snap.str(a.name).strip_prefix(MODULE_MARKER)?;
                let (qual, class) = match rest.rsplit_once(':') {
                    Some((q, c)) => (q, Some(c.to_string())),
                    None => (rest, None),
                };
                // The root module has no qualified name: it is named by its class.
                let name = if qual.is_empty() {
                    class.clone().unwrap_or_else(|| "<model>".into())
                } else {
                    qual.to_string()
                };
                Some((a.time_us, a.start, name, class))
            })
            .collect();
        // Stable: annotations at the same microsecond keep their recorded order.
        marks.sort_by_key(|m| m.0);
        ScopeTimeline { marks }
    }

    fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }

    fn sweep(&self) -> Sweep<'_> {
        Sweep {
            marks: &self.marks,
            next: 0,
            open: Vec::new(),
        }
    }
}

/// Walks the scopes forward in time, keeping the ones open.
struct Sweep<'a> {
    marks: &'a [(i64, bool, String, Option<String>)],
    next: usize,
    open: Vec<(String, Option<String>)>,
}

impl Sweep<'_> {
    /// The scopes open at `time`, outermost first. Times are in microseconds,
    /// so an allocation can share one with a scope's start or end: a scope
    /// that starts then is open (the allocation came after the hook ran) and
    /// one that ends then is still open (it came before the hook closed it).
    /// Calls must come in non-decreasing time.
    fn open_at(&mut self, time: i64) -> Vec<(String, Option<String>)> {
        let marks = self.marks;
        while let Some((t, start, name, class)) = marks.get(self.next) {
            if *t > time || (*t == time && !*start) {
                break;
            }
            self.apply(*start, name, class);
            self.next += 1;
        }
        let open = self.open.clone();
        // Ends at this very microsecond apply before the next, later, block.
        while let Some((t, false, name, class)) = marks.get(self.next) {
            if *t != time {
                break;
            }
            self.apply(false, name, class);
            self.next += 1;
        }
        open
    }

    fn apply(&mut self, start: bool, name: &str, class: &Option<String>) {
        if start {
            self.open.push((name.to_string(), class.clone()));
        } else if let Some(k) = self.open.iter().rposition(|(n, _)| n == name) {
            // Scopes nest, but one closed out of order must not leave the rest open.
            self.open.truncate(k);
        }
    }
}

/// Names of the `forward` frames of stacks, cached per frame.
struct FrameNames<'a> {
    snap: &'a Snapshot,
    finder: &'a SourceFinder,
    files: HashMap<StrId, Option<Vec<String>>>,
    stacks: HashMap<StackId, Vec<(String, Option<String>)>>,
}

impl<'a> FrameNames<'a> {
    fn new(snap: &'a Snapshot, finder: &'a SourceFinder) -> FrameNames<'a> {
        FrameNames {
            snap,
            finder,
            files: HashMap::new(),
            stacks: HashMap::new(),
        }
    }

    /// The modules of a stack, outermost first.
    fn path(&mut self, stack: StackId) -> Vec<(String, Option<String>)> {
        if let Some(p) = self.stacks.get(&stack) {
            return p.clone();
        }
        let snap = self.snap;
        let mut path = Vec::new();
        for &f in snap.stack(stack).iter().rev() {
            let frame = snap.frame(f);
            if snap.str(frame.name) != "forward" {
                continue;
            }
            let file = snap.str(frame.filename);
            if !file.ends_with(".py") {
                continue;
            }
            let finder = self.finder;
            let lines = self
                .files
                .entry(frame.filename)
                .or_insert_with(|| finder.lines(file));
            let class = lines.as_deref().and_then(|l| class_of_line(l, frame.line));
            let name = match &class {
                Some(c) => c.clone(),
                None => format!("{}:forward", file.rsplit('/').next().unwrap_or(file)),
            };
            path.push((name, class));
        }
        self.stacks.insert(stack, path.clone());
        path
    }
}
