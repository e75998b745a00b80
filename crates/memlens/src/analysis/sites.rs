//! Allocation sites: the innermost frame of *user* code in a stack, which is
//! the line a user can act on. PyTorch, the standard library, installed
//! packages (site-packages, dist-packages) and memlens itself are not user
//! code.

use crate::snapshot::{FrameId, Snapshot, StackId};
use serde::Serialize;

/// True when a frame's file is the user's own code.
pub fn is_user_file(path: &str) -> bool {
    if path.is_empty() || path.starts_with('<') || path == "??" {
        return false;
    }
    let p = path.replace('\\', "/");
    let library = [
        "/site-packages/",
        "/dist-packages/",
        "/torch/",
        "/pytorch/",
        "/c10/",
        "/aten/",
        "/lib/python2",
    ];
    if library.iter().any(|l| p.contains(l)) {
        return false;
    }
    // The standard library: .../lib/python3.X/<module>.py (not in site-packages).
    if let Some(i) = p.find("/lib/python3") {
        let rest = &p[i + "/lib/python3".len()..];
        if rest.split('/').count() >= 2 {
            return false;
        }
    }
    // C++ frames (stacks="all") have no Python file.
    !(p.ends_with(".cpp") || p.ends_with(".h") || p.ends_with(".cu") || p.ends_with(".so"))
}

/// The site of every stack, computed once per snapshot.
#[derive(Clone, Debug)]
pub struct SiteIndex {
    /// For each stack id: the innermost user frame, or the innermost frame
    /// when no frame is user code, or `None` for an empty stack.
    site_of: Vec<Option<FrameId>>,
    /// For each stack id: whether its site is user code.
    user: Vec<bool>,
}

impl SiteIndex {
    /// Computes the site of every stack of `snap`.
    pub fn new(snap: &Snapshot) -> Self {
        let user_frame: Vec<bool> = snap
            .frames
            .iter()
            .map(|f| is_user_file(snap.str(f.filename)))
            .collect();
        let n = snap.stack_ranges.len();
        let mut site_of = Vec::with_capacity(n);
        let mut user = Vec::with_capacity(n);
        for id in 0..n as StackId {
            let frames = snap.stack(id);
            match frames.iter().find(|&&f| user_frame[f as usize]) {
                Some(&f) => {
                    site_of.push(Some(f));
                    user.push(true);
                }
                None => {
                    site_of.push(frames.first().copied());
                    user.push(false);
                }
            }
        }
        SiteIndex { site_of, user }
    }

    /// The site frame of a stack.
    pub fn site(&self, stack: StackId) -> Option<FrameId> {
        self.site_of.get(stack as usize).copied().flatten()
    }

    /// Whether the site of a stack is user code.
    pub fn is_user(&self, stack: StackId) -> bool {
        self.user.get(stack as usize).copied().unwrap_or(false)
    }
}

/// A site as users see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Site {
    /// `file:line`, or `<no stack>` when nothing was recorded.
    pub site: String,
    /// The function the line is in.
    pub function: String,
    /// Whether the site is the user's code (else the innermost library frame).
    pub user_code: bool,
}

impl Site {
    /// The site of a stack.
    pub fn of(snap: &Snapshot, index: &SiteIndex, stack: StackId) -> Site {
        match index.site(stack) {
            Some(f) => Site {
                site: snap.frame_location(f),
                function: snap.str(snap.frame(f).name).to_string(),
                user_code: index.is_user(stack),
            },
            None => Site {
                site: "<no stack>".into(),
                function: String::new(),
                user_code: false,
            },
        }
    }
}

/// A whole stack as lines `file:line in function`, innermost first.
pub fn stack_lines(snap: &Snapshot, stack: StackId) -> Vec<String> {
    snap.stack(stack)
        .iter()
        .map(|&f| {
            let fr = snap.frame(f);
            format!(
                "{}:{} in {}",
                snap.str(fr.filename),
                fr.line,
                snap.str(fr.name)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_code_is_told_from_libraries() {
        assert!(is_user_file("/home/user/train/workloads.py"));
        assert!(is_user_file("train.py"));
        assert!(!is_user_file(
            "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py"
        ));
        assert!(!is_user_file("/usr/lib/python3.12/contextlib.py"));
        assert!(!is_user_file(
            "/usr/lib/python3/dist-packages/numpy/core.py"
        ));
        assert!(!is_user_file("<frozen runpy>"));
        assert!(!is_user_file(
            "/src/pytorch/c10/cuda/CUDACachingAllocator.cpp"
        ));
        assert!(!is_user_file("??"));
    }
}
