//! Allocation sites: the line of the user's own code that a piece of memory
//! comes from, which is the line a user can act on.
//!
//! What counts as user code is [`crate::frames`]'s decision (the one
//! rulebook). A site is keyed by the user's *call path* (the user frames from
//! the entry script down to the innermost one), so the same line reached from
//! two callers (a model's `Linear` wrapper called by attention and by the
//! head) are two sites. Stacks with no user frame get a named pseudo-site in
//! angle brackets, never a C/C++ frame.

use crate::frames::{self, FrameKind};
use crate::snapshot::{FrameId, Snapshot, StackId};
use serde::Serialize;
use std::collections::HashMap;

pub use crate::frames::is_user_file;

/// Pseudo-site of memory allocated with no stack recorded.
pub const NO_STACK: &str = "<no stack>";
/// Pseudo-site of memory made by the autograd engine when no backward node
/// could be read from the stack.
pub const BACKWARD_PASS: &str = "<backward pass>";
/// Pseudo-site of blocks alive when recording started (no trace event).
pub const BEFORE_RECORDING: &str = "<allocated before recording started>";
/// Pseudo-site of stacks that hold only native (C/C++) or library frames.
pub const NO_USER_FRAME: &str = "<no user frame>";

/// How the site of one stack was found.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StackSite {
    /// Interned key: one per distinct call path or pseudo-site.
    key: u32,
    /// The innermost user frame, if any.
    frame: Option<FrameId>,
    /// A compiled frame (torch.compile) lies inside the user frame.
    compiled: bool,
}

/// The site of every stack, computed once per snapshot.
#[derive(Clone, Debug)]
pub struct SiteIndex {
    of: Vec<StackSite>,
    /// For each key: the site as users see it.
    sites: Vec<Site>,
}

impl SiteIndex {
    /// Computes the site of every stack of `snap`.
    pub fn new(snap: &Snapshot) -> Self {
        let kinds: Vec<FrameKind> = snap
            .frames
            .iter()
            .map(|f| frames::classify(snap.str(f.filename), snap.str(f.name)))
            .collect();
        let kind = |f: FrameId| kinds.get(f as usize).copied().unwrap_or(FrameKind::Native);
        let mut keys: HashMap<Site, u32> = HashMap::new();
        let mut sites: Vec<Site> = Vec::new();
        let mut of = Vec::with_capacity(snap.stack_ranges.len());
        for id in 0..snap.stack_ranges.len() as StackId {
            let stack = snap.stack(id);
            // Innermost first: the first user frame is the site.
            let inner = stack.iter().position(|&f| kind(f).is_user());
            let site = match inner {
                Some(i) => {
                    let frame = stack[i];
                    let compiled = stack[..i].iter().any(|&f| kind(f) == FrameKind::Compiled);
                    // The innermost Python library frame below the user's
                    // (e.g. the transformers line a Trainer call reached).
                    let via = stack[..i]
                        .iter()
                        .find(|&&f| kind(f) == FrameKind::Library)
                        .map(|&f| snap.frame_location(f));
                    let path: Vec<String> = stack[i..]
                        .iter()
                        .rev()
                        .filter(|&&f| kind(f).is_user())
                        .map(|&f| snap.frame_location(f))
                        .collect();
                    (
                        Site {
                            site: snap.frame_location(frame),
                            function: snap.str(snap.frame(frame).name).to_string(),
                            user_code: true,
                            path,
                            compiled,
                            via,
                        },
                        Some(frame),
                        compiled,
                    )
                }
                None => (Site::pseudo(&pseudo_site(snap, stack, &kind)), None, false),
            };
            let next = sites.len() as u32;
            let key = *keys.entry(site.0.clone()).or_insert_with(|| {
                sites.push(site.0);
                next
            });
            of.push(StackSite {
                key,
                frame: site.1,
                compiled: site.2,
            });
        }
        SiteIndex { of, sites }
    }

    /// The site key of a stack: equal keys are the same site (call path or
    /// pseudo-site). Unknown stacks share the key of the empty stack.
    pub fn key(&self, stack: StackId) -> u32 {
        self.of.get(stack as usize).map_or(0, |s| s.key)
    }

    /// The innermost user frame of a stack, if it has one.
    pub fn site(&self, stack: StackId) -> Option<FrameId> {
        self.of.get(stack as usize).and_then(|s| s.frame)
    }

    /// Whether the site of a stack is user code.
    pub fn is_user(&self, stack: StackId) -> bool {
        self.site(stack).is_some()
    }

    /// Whether torch.compile's generated code lies inside the site.
    pub fn is_compiled(&self, stack: StackId) -> bool {
        self.of.get(stack as usize).is_some_and(|s| s.compiled)
    }

    /// The site of a key (from [`SiteIndex::key`]).
    pub fn site_of_key(&self, key: u32) -> Option<&Site> {
        self.sites.get(key as usize)
    }

    /// The site of a stack, as users see it.
    pub fn describe(&self, stack: StackId) -> Site {
        self.site_of_key(self.key(stack))
            .cloned()
            .unwrap_or_else(|| Site::pseudo(NO_STACK))
    }
}

/// The pseudo-site of a stack with no user frame.
fn pseudo_site(snap: &Snapshot, stack: &[FrameId], kind: &dyn Fn(FrameId) -> FrameKind) -> String {
    if stack.is_empty() {
        return NO_STACK.into();
    }
    // Innermost first: the nearest backward node names the gradient's op.
    for &f in stack {
        if kind(f) == FrameKind::Native {
            if let Some(node) = frames::backward_node(snap.str(snap.frame(f).name)) {
                return format!("<backward: {node}>");
            }
        }
    }
    let backward = stack.iter().any(|&f| {
        let fr = snap.frame(f);
        frames::is_backward_frame(snap.str(fr.filename), snap.str(fr.name))
    });
    if backward {
        return BACKWARD_PASS.into();
    }
    // A Python frame of a library (not C++, not generated code): name its file.
    if let Some(&f) = stack
        .iter()
        .find(|&&f| matches!(kind(f), FrameKind::Torch | FrameKind::Library))
    {
        let fr = snap.frame(f);
        let file = snap.str(fr.filename);
        let short = file.rsplit('/').next().unwrap_or(file);
        return format!("<library: {short}:{} in {}>", fr.line, snap.str(fr.name));
    }
    NO_USER_FRAME.into()
}

/// A site as users see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Site {
    /// `file:line` of the innermost user frame, or a pseudo-site in angle
    /// brackets (`<backward: BmmBackward0>`, `<no stack>`...).
    pub site: String,
    /// The function the line is in (empty for pseudo-sites).
    pub function: String,
    /// Whether the site is the user's code.
    pub user_code: bool,
    /// The user frames from the entry script down to `site`, as `file:line`.
    pub path: Vec<String>,
    /// torch.compile's generated code ran inside the site.
    pub compiled: bool,
    /// The innermost library line the site reached, when there is one (e.g.
    /// the transformers line under a `trainer.train()` call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

impl Site {
    /// A pseudo-site with no frame.
    pub fn pseudo(name: &str) -> Site {
        Site {
            site: name.to_string(),
            function: String::new(),
            user_code: false,
            path: Vec::new(),
            compiled: false,
            via: None,
        }
    }

    /// The site of a stack.
    pub fn of(_snap: &Snapshot, index: &SiteIndex, stack: StackId) -> Site {
        index.describe(stack)
    }

    /// The user line that called into the site's file: the innermost frame of
    /// the call path in another file (`train.py:350` for a leak made at
    /// `model.py:77` by `logits = model(x)` on that line), if there is one.
    pub fn caller(&self) -> Option<&str> {
        let file = |loc: &str| loc.rsplit_once(':').map_or(loc, |(f, _)| f).to_string();
        let site_file = file(&self.site);
        self.path
            .iter()
            .rev()
            .find(|p| file(p) != site_file)
            .map(String::as_str)
    }

    /// `caller -> site in function` when the user's call reached the site
    /// from another file (so two callers of one line read apart), else
    /// `site in function`; no ` in ` for nameless functions.
    pub fn display(&self) -> String {
        let mut s = match self.caller() {
            Some(caller) => format!("{caller} -> {}", self.site),
            None => self.site.clone(),
        };
        if !self.function.is_empty() && !self.function.starts_with('<') {
            s.push_str(" in ");
            s.push_str(&self.function);
        }
        s
    }
}

/// The PyTorch operators a stack's native frames name (`at::_ops::clone::call`
/// -> `clone`), innermost first, each once: what allocated, where the Python
/// frames say only where from (`stacks="all"` recordings; empty otherwise).
pub fn native_ops(snap: &Snapshot, stack: StackId) -> Vec<String> {
    let mut ops: Vec<String> = Vec::new();
    for &f in snap.stack(stack) {
        let fr = snap.frame(f);
        let name = snap.str(fr.name);
        let Some(rest) = name.split_once("at::_ops::").map(|(_, r)| r) else {
            continue;
        };
        let op = rest.split("::").next().unwrap_or_default();
        if !op.is_empty()
            && crate::frames::is_native(snap.str(fr.filename), name)
            && !ops.iter().any(|o| o == op)
        {
            ops.push(op.to_string());
        }
    }
    ops
}

/// The one line of a stack that holds native frames only (the autograd
/// engine's threads record no Python frame).
pub const NATIVE_FRAMES_ONLY: &str = "<native frames only>";

/// A whole stack as lines `file:line in function`, innermost first, by the
/// frame rulebook: native frames (C, C++, CPython's own, which
/// `stacks="all"`, PyTorch's default, interleaves:
/// [`crate::frames::FrameKind::Native`]) are left out, as sites leave them
/// out and memory_viz filters them; a stack of native frames only is the one
/// line [`NATIVE_FRAMES_ONLY`]. Every stack memlens shows (the terminal's,
/// the JSON's, the report's) is this one.
pub fn stack_lines(snap: &Snapshot, stack: StackId) -> Vec<String> {
    let frames = snap.stack(stack);
    let native = |f: FrameId| {
        let fr = snap.frame(f);
        crate::frames::is_native(snap.str(fr.filename), snap.str(fr.name))
    };
    if !frames.is_empty() && frames.iter().all(|&f| native(f)) {
        return vec![NATIVE_FRAMES_ONLY.to_string()];
    }
    frames
        .iter()
        .filter(|&&f| !native(f))
        .map(|&f| {
            let fr = snap.frame(f);
            let name = snap.str(fr.name);
            if name.is_empty() {
                format!("{}:{}", snap.str(fr.filename), fr.line)
            } else {
                format!("{}:{} in {}", snap.str(fr.filename), fr.line, name)
            }
        })
        .collect()
}
