//! Source lines in findings: when the user's file is readable, a finding
//! quotes its line like a compiler diagnostic (`  55 |     out = model(x)`),
//! and a leak also names the line that KEEPS the allocated tensor alive
//! (`val_losses.append(out.loss)`), which is the line to change, with a fix
//! tailored to how it keeps it.
//!
//! Frames name files as they were on the training machine
//! (`/home/user/train/workloads.py`). [`SourceFinder`] tries that path, then
//! each search root (`--source-root DIR`, `MEMLENS_SOURCE_ROOT`) with the
//! path's trailing components: `DIR/home/user/train/workloads.py`, ...,
//! `DIR/train/workloads.py`, `DIR/workloads.py` (the longest match first, so
//! a same-named file elsewhere in the tree is not preferred).
//!
//! The keeper search reads Python text line by line, not a parse tree: it
//! bounds the allocating line's function by indentation, follows the names the
//! line assigns (and names assigned from them, `loss = out.loss`), and looks
//! for a statement that stores one where it outlives the step: `.append(x)`,
//! `d[k] = x`, `self.x = x`, a `global`, `total += x`. Only a line that ran is
//! named ([`RanLines`]): one of the recorded stacks' lines, or one in a
//! straight run of statements with such a line. A store in a branch that
//! never ran is not quoted, however well it matches.
//!
//! What the text cannot say, the process can: when `memlens.record`'s leak
//! alarm found what holds a site (a module attribute, a global, a hook...),
//! the quote carries those holders too ([`crate::holders`]).

mod python;

use crate::holders::{Holder, HoldersBySite};
use crate::snapshot::Snapshot;
use python::{enclosing_class, find_keeper, surely_ran, KeptAt};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// The environment variable with more search roots (separated like `PATH`).
pub const SOURCE_ROOT_ENV: &str = "MEMLENS_SOURCE_ROOT";

/// Files larger than this are not read (a frame never names a data file on
/// purpose, but a path could point anywhere).
const MAX_SOURCE_BYTES: u64 = 16 << 20;

/// One line of the user's source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceLine {
    /// The file that was read (the frame's path, or its match under a
    /// root), named as briefly as it can be: relative to the working
    /// directory, or to the search root it was found under, when either is
    /// shorter than the full path (so what is printed does not depend on
    /// where the files sit).
    pub path: String,
    /// The line number, from 1.
    pub line: u32,
    /// The line's text, without its line ending.
    pub text: String,
}

impl SourceLine {
    /// The line as a compiler diagnostic shows it: `  55 |     out = model(x)`.
    pub fn quote(&self) -> String {
        format!("{:>5} | {}", self.line, self.text.trim_end())
    }
}

/// How a statement keeps a tensor alive past its step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepPattern {
    /// Put into a container: `xs.append(x)`, `.extend`, `.insert`, `.add`.
    Append,
    /// Stored under a key or index: `d[k] = x`.
    ItemAssign,
    /// Stored on an object: `self.x = x`.
    Attribute,
    /// Assigned to a global of the module.
    Global,
    /// Accumulated: `total += x` (keeps every step's graph).
    AugmentedAssign,
}

/// The line that keeps a leaking tensor alive, and what to write instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keeper {
    /// The keeping line.
    pub line: SourceLine,
    /// How it keeps the tensor.
    pub pattern: KeepPattern,
    /// The expression kept, e.g. `out.loss`.
    pub kept: String,
    /// What to change, in one sentence.
    pub fix: String,
    /// The keeping statement rewritten with the fix, e.g.
    /// `val_losses.append(out.loss.item())`.
    pub replacement: String,
}

/// The source of a finding: its line and, for a leak, the keeper. Empty when
/// the file is not readable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceQuote {
    /// The finding's own line (for a leak: where the tensor was allocated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceLine>,
    /// For a leak: the line that keeps the tensor alive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeper: Option<Keeper>,
    /// For a leak: what the process found holding its tensors, largest
    /// first (from the holders file beside the snapshot).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
}

impl SourceQuote {
    /// True when nothing was found.
    pub fn is_empty(&self) -> bool {
        self.source.is_none() && self.keeper.is_none() && self.holders.is_empty()
    }

    /// Lines for the terminal, each indented by `indent`: the allocating line,
    /// then the keeping line and its fix.
    pub fn render(&self, indent: &str) -> String {
        let mut o = String::new();
        if let Some(s) = &self.source {
            o.push_str(&format!("{indent}{}:{}\n", s.path, s.line));
            o.push_str(&format!("{indent}{}\n", s.quote()));
        }
        for h in &self.holders {
            o.push_str(&format!("{indent}held by {}\n", h.describe()));
        }
        if let Some(k) = &self.keeper {
            o.push_str(&format!(
                "{indent}kept alive by {}:{} (the line to change):\n",
                k.line.path, k.line.line
            ));
            o.push_str(&format!("{indent}{}\n", k.line.quote()));
            o.push_str(&format!("{indent}      = help: {}\n", k.fix));
        }
        o
    }
}

/// The lines of each file that are known to have run: every frame of the
/// recorded stacks.
#[derive(Clone, Debug, Default)]
pub struct RanLines {
    /// Line numbers (from 1), sorted, by the file as the frames name it.
    by_file: HashMap<String, Vec<u32>>,
}

impl RanLines {
    /// The lines of every frame of `snaps`.
    pub fn of<'a>(snaps: impl IntoIterator<Item = &'a Snapshot>) -> Self {
        let mut by_file: HashMap<String, Vec<u32>> = HashMap::new();
        for snap in snaps {
            for f in snap.frames.iter().filter(|f| f.line > 0) {
                let file = snap.str(f.filename);
                match by_file.get_mut(file) {
                    Some(lines) => lines.push(f.line),
                    None => {
                        by_file.insert(file.to_string(), vec![f.line]);
                    }
                }
            }
        }
        for lines in by_file.values_mut() {
            lines.sort_unstable();
            lines.dedup();
        }
        RanLines { by_file }
    }

    /// The recorded lines of `file` (from 1, sorted).
    pub fn lines_of(&self, file: &str) -> &[u32] {
        self.by_file.get(file).map_or(&[], Vec::as_slice)
    }
}

/// What is known about a run beyond its source text, for quoting leaks: the
/// lines that ran and the holders the process found.
#[derive(Clone, Debug, Default)]
pub struct RunEvidence {
    /// The lines of the recorded stacks.
    pub ran: RanLines,
    /// The holders files beside the snapshots.
    pub holders: HoldersBySite,
}

impl RunEvidence {
    /// The evidence of the snapshots `snaps`, each named by its path (its
    /// holders file is looked for beside it).
    pub fn of(snaps: &[(String, &Snapshot)]) -> Self {
        RunEvidence {
            ran: RanLines::of(snaps.iter().map(|(_, s)| *s)),
            holders: HoldersBySite::beside(snaps.iter().map(|(name, _)| name.as_str())),
        }
    }
}

/// Splits a `file:line` site.
pub fn split_site(site: &str) -> Option<(&str, u32)> {
    let (file, line) = site.rsplit_once(':')?;
    let n = line.parse::<u32>().ok().filter(|n| *n > 0)?;
    (!file.is_empty()).then_some((file, n))
}

/// The class whose method holds line `line` (from 1) of a Python file's
/// `lines` (`GPT2Attention` for a line of its `forward`); `None` outside a
/// class, or in a function nested in a method.
pub fn class_of_line(lines: &[String], line: u32) -> Option<String> {
    let at = (line as usize).checked_sub(1)?;
    if at >= lines.len() {
        return None;
    }
    enclosing_class(lines, at)
}

/// Finds and reads the user's source files.
#[derive(Clone, Debug, Default)]
pub struct SourceFinder {
    roots: Vec<PathBuf>,
}

impl SourceFinder {
    /// A finder over `roots` only (and each frame's own path).
    pub fn new(roots: Vec<PathBuf>) -> Self {
        SourceFinder { roots }
    }

    /// A finder over `roots` and then those of `MEMLENS_SOURCE_ROOT`.
    pub fn with_env(mut roots: Vec<PathBuf>) -> Self {
        if let Some(v) = std::env::var_os(SOURCE_ROOT_ENV) {
            roots.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
        }
        Self::new(roots)
    }

    /// The search roots, in order.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The readable file a frame's path names: the path itself, else the
    /// longest trailing part of it found under a root.
    pub fn resolve(&self, frame_path: &str) -> Option<PathBuf> {
        self.locate(frame_path).map(|(path, _)| path)
    }

    /// [`SourceFinder::resolve`], with the part of the path under the root it
    /// was found in (`None` when the frame's own path was readable).
    fn locate(&self, frame_path: &str) -> Option<(PathBuf, Option<PathBuf>)> {
        let path = Path::new(frame_path);
        if is_source_file(path) {
            return Some((path.to_path_buf(), None));
        }
        let parts: Vec<&std::ffi::OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(p) => Some(p),
                _ => None,
            })
            .collect();
        for skip in 0..parts.len() {
            let tail: PathBuf = parts[skip..].iter().collect();
            for root in &self.roots {
                let candidate = root.join(&tail);
                if is_source_file(&candidate) {
                    return Some((candidate, Some(tail)));
                }
            }
        }
        None
    }

    /// The lines of the file a frame's path names, and where it was found
    /// (named as [`short_name`] names it).
    fn read(&self, frame_path: &str) -> Option<(PathBuf, Vec<String>)> {
        let (path, tail) = self.locate(frame_path)?;
        let bytes = std::fs::read(&path).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let cwd = std::env::current_dir().ok();
        let name = short_name(&path, tail.as_deref(), cwd.as_deref());
        Some((name, text.lines().map(str::to_string).collect()))
    }

    /// The lines of the file a frame's path names, when it is readable.
    pub fn lines(&self, frame_path: &str) -> Option<Vec<String>> {
        self.read(frame_path).map(|(_, lines)| lines)
    }

    /// The line a `file:line` site names, when the file is readable.
    pub fn quote(&self, site: &str) -> Option<SourceLine> {
        let (file, n) = split_site(site)?;
        let (path, lines) = self.read(file)?;
        line_at(&path, &lines, n)
    }

    /// The allocating line of a leak, what holds its tensors (as the
    /// process found it) and the line that keeps them alive (one that ran).
    ///
    /// `callers` are the user frames that led to `site` (`file:line`, the
    /// entry script first; a leak's `path`). The keeper is searched at the
    /// site, then at each caller outward: a leak allocated inside a model's
    /// `forward` is usually kept by the loop that called the model
    /// (`outputs.append(model(x))`), since keeping the output keeps the
    /// activations its graph saved.
    pub fn quote_leak(&self, site: &str, callers: &[String], run: &RunEvidence) -> SourceQuote {
        let holders = run.holders.of(site).to_vec();
        let source = self.quote(site);
        let outward = std::iter::once(site).chain(
            callers
                .iter()
                .rev()
                .map(String::as_str)
                .filter(|c| *c != site),
        );
        let keeper = outward
            .filter_map(split_site)
            .find_map(|(file, n)| self.keeper_of(file, n, run));
        SourceQuote {
            source,
            keeper,
            holders,
        }
    }

    /// The line that keeps the value made at line `n` of `file` alive, when
    /// the file is readable and such a line surely ran.
    fn keeper_of(&self, file: &str, n: u32, run: &RunEvidence) -> Option<Keeper> {
        let (path, lines) = self.read(file)?;
        let at = (n as usize).checked_sub(1)?;
        // Line `n` ran; so did every recorded line of its file.
        let recorded: Vec<usize> = run
            .ran
            .lines_of(file)
            .iter()
            .filter_map(|l| (*l as usize).checked_sub(1))
            .chain([at])
            .collect();
        let kept = find_keeper(&lines, at, |j| surely_ran(&lines, &recorded, j))?;
        keeper_at(&path, &lines, kept)
    }
}

/// The shortest of the names of a file found at `path`: the path itself,
/// the path relative to the working directory `cwd` (when it lies under it),
/// and `tail`, its path under the search root it was found in.
fn short_name(path: &Path, tail: Option<&Path>, cwd: Option<&Path>) -> PathBuf {
    let absolute = cwd.map_or_else(|| path.to_path_buf(), |c| c.join(path));
    let under_cwd = cwd.and_then(|c| absolute.strip_prefix(c).ok());
    [Some(path), under_cwd, tail]
        .into_iter()
        .flatten()
        .filter(|p| !p.as_os_str().is_empty())
        .min_by_key(|p| p.as_os_str().len())
        .unwrap_or(path)
        .to_path_buf()
}

fn is_source_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() <= MAX_SOURCE_BYTES)
}

fn line_at(path: &Path, lines: &[String], n: u32) -> Option<SourceLine> {
    let text = lines.get((n as usize).checked_sub(1)?)?;
    Some(SourceLine {
        path: path.display().to_string(),
        line: n,
        text: text.clone(),
    })
}

fn keeper_at(path: &Path, lines: &[String], k: KeptAt) -> Option<Keeper> {
    let line = line_at(path, lines, u32::try_from(k.index + 1).ok()?)?;
    Some(Keeper {
        line,
        pattern: k.pattern,
        kept: k.kept,
        fix: k.fix,
        replacement: k.replacement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_split_at_the_last_colon() {
        assert_eq!(split_site("/a/b.py:55"), Some(("/a/b.py", 55)));
        assert_eq!(split_site("C:/x.py:7"), Some(("C:/x.py", 7)));
        assert_eq!(split_site("/a/b.py:0"), None);
        assert_eq!(split_site("/a/b.py"), None);
        assert_eq!(split_site(":3"), None);
    }

    #[test]
    fn quotes_like_a_compiler() {
        let l = SourceLine {
            path: "w.py".into(),
            line: 55,
            text: "        out = model(x)  ".into(),
        };
        assert_eq!(l.quote(), "   55 |         out = model(x)");
    }

    #[test]
    fn resolves_trailing_components_under_a_root_longest_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("train")).unwrap();
        std::fs::write(root.join("workloads.py"), "a = 1\n").unwrap();
        let f = SourceFinder::new(vec![root.to_path_buf()]);
        assert_eq!(
            f.resolve("/home/user/train/workloads.py"),
            Some(root.join("workloads.py"))
        );
        std::fs::write(root.join("train/workloads.py"), "b = 2\n").unwrap();
        assert_eq!(
            f.resolve("/home/user/train/workloads.py"),
            Some(root.join("train/workloads.py"))
        );
        assert_eq!(f.resolve("/home/user/train/other.py"), None);
        let q = f.quote("/home/user/train/workloads.py:1").unwrap();
        assert_eq!(q.text, "b = 2");
        assert_eq!(f.quote("/home/user/train/workloads.py:2"), None);
        // Named by its path under the root, not the root's own path.
        assert_eq!(q.path, "train/workloads.py");
    }

    #[test]
    fn files_are_named_as_briefly_as_they_can_be() {
        let long = Path::new("/a/very/long/checkout/path/src/train/workloads.py");
        let tail = Path::new("train/workloads.py");
        assert_eq!(short_name(long, Some(tail), None), tail);
        let cwd = Path::new("/a/very/long/checkout/path/src");
        assert_eq!(short_name(long, None, Some(cwd)), tail);
        assert_eq!(
            short_name(long, Some(Path::new("workloads.py")), Some(cwd)),
            Path::new("workloads.py")
        );
        assert_eq!(short_name(long, None, Some(Path::new("/b"))), long);
        let rel = Path::new("w.py");
        assert_eq!(short_name(rel, None, Some(cwd)), rel);
    }
}
