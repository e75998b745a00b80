//! `memlens lines SNAP FILE[:FUNCTION]` and `@memlens.profile`: memory by
//! source line of one function, like pytorch_memlab's LineProfiler but exact.
//!
//! Every allocator event whose stack passes through the function is charged to
//! the function's line on that stack (the outermost call of the function, so
//! a line is charged for what it called, too): `alloc` events to
//! *allocated*, `free_completed` events (when the bytes go back to the pool,
//! as `memory_allocated()` counts them) to *freed*. The *peak* of a line is
//! the highest allocated total just before or after one of its events (the
//! replay's totals, exact to the byte). A line that runs many times (a loop
//! body) sums over its runs. No synchronisation per line is needed: the
//! allocator records events as they happen on the host.
//!
//! `@memlens.profile` marks its call with a `memlens.profile N`
//! record_function scope; with `scope` set, only the events inside it count.

use crate::replay::{Replay, ReplayOptions};
use crate::snapshot::{Action, Snapshot, StackId, TraceEvent};
use crate::source::SourceFinder;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// What to profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineOptions {
    /// The file: a path as in the frames, or its trailing part (`train.py`).
    pub file: String,
    /// The function (`None`: every line of the file).
    #[serde(default)]
    pub function: Option<String>,
    /// Count only events inside this record_function scope (`memlens.profile 1`).
    #[serde(default)]
    pub scope: Option<String>,
    /// Lines before this one are left out (a `with memlens.profile()` block).
    #[serde(default)]
    pub first_line: Option<u32>,
    /// Lines after this one are left out.
    #[serde(default)]
    pub last_line: Option<u32>,
}

impl LineOptions {
    /// Parses `FILE[:FUNCTION]`; a `:` followed by digits only is not a
    /// function (nor a Windows drive letter, the one-letter `C:`).
    pub fn parse(target: &str) -> LineOptions {
        let (file, function) = match target.rsplit_once(':') {
            Some((f, func))
                if !f.is_empty()
                    && f.len() > 1
                    && !func.is_empty()
                    && !func.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (f.to_string(), Some(func.to_string()))
            }
            _ => (target.to_string(), None),
        };
        LineOptions {
            file,
            function,
            ..LineOptions::default()
        }
    }
}

/// One line's figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LineRow {
    /// Line number, from 1.
    pub line: u32,
    /// The function the line is in.
    pub function: String,
    /// The line's text, when the file is readable.
    pub text: Option<String>,
    /// Bytes allocated by the line (and what it called).
    pub allocated_bytes: u64,
    /// Number of allocations.
    pub allocations: u64,
    /// Bytes freed by the line.
    pub freed_bytes: u64,
    /// Number of frees.
    pub frees: u64,
    /// Allocated minus freed.
    pub net_bytes: i64,
    /// The highest allocated total while the line ran.
    pub peak_allocated_bytes: u64,
}

/// The per-line table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinesReport {
    /// The file as the frames name it (the first match).
    pub file: String,
    /// The function asked for.
    pub function: Option<String>,
    /// The device.
    pub device: u32,
    /// Allocator events (alloc, free requested, free completed) that passed
    /// through the function (and the scope).
    pub events: u64,
    /// Allocated total when the first of them ran (before it).
    pub allocated_before_bytes: u64,
    /// The highest allocated total over them.
    pub peak_allocated_bytes: u64,
    /// One row per line with events, in line order.
    pub rows: Vec<LineRow>,
    /// Caveats.
    pub warnings: Vec<String>,
}

/// The per-line table of `opts.file` (and function) on the trace with the
/// most matching events.
pub fn lines(snap: &Snapshot, opts: &LineOptions, finder: &SourceFinder) -> LinesReport {
    let mut best: Option<LinesReport> = None;
    for t in snap.traces.iter().filter(|t| !t.events.is_empty()) {
        let r = lines_of_device(snap, t.device, opts, finder);
        if best.as_ref().is_none_or(|b| r.events > b.events) {
            best = Some(r);
        }
    }
    let mut r = best.unwrap_or_else(|| LinesReport {
        file: opts.file.clone(),
        function: opts.function.clone(),
        device: snap.first_traced_device(),
        events: 0,
        allocated_before_bytes: 0,
        peak_allocated_bytes: 0,
        rows: Vec::new(),
        warnings: vec!["the snapshot has no trace: nothing to attribute to lines".into()],
    });
    if r.events == 0 && r.warnings.is_empty() {
        r.warnings.push(format!(
            "no allocator event passed through {}{}{}",
            opts.file,
            opts.function.as_deref().map_or("", |_| ":"),
            opts.function.as_deref().unwrap_or("")
        ));
    }
    r
}

/// The per-line table of `opts.file` on the trace of `device`.
fn lines_of_device(
    snap: &Snapshot,
    device: u32,
    opts: &LineOptions,
    finder: &SourceFinder,
) -> LinesReport {
    let events = snap.device_trace(device);
    let window = opts
        .scope
        .as_deref()
        .and_then(|s| scope_window(snap, device, s));
    let mut warnings = Vec::new();
    if opts.scope.is_some() && window.is_none() {
        warnings.push("the profiled scope is not in the snapshot: every event counts".into());
    }
    let mut matcher = Matcher {
        snap,
        opts,
        cache: HashMap::new(),
    };
    let mut rows: BTreeMap<(u32, String), LineRow> = BTreeMap::new();
    let mut file_seen: Option<String> = None;
    let mut r = Replay::new(snap, device, &ReplayOptions::default());
    let mut before = r.totals().all.allocated;
    let (mut count, mut first_before, mut peak) = (0u64, None, 0u64);
    // The stack each live address was allocated with, to tell whether frees
    // carry their own stack (context="all") or their allocation's ("alloc").
    let mut alloc_stack: HashMap<u64, StackId> = HashMap::new();
    let (mut frees_seen, mut frees_alloc_stack) = (0u64, 0u64);
    while let Some(s) = r.step() {
        let after = s.totals.all.allocated;
        let e = &events[s.index];
        match e.action {
            Action::Alloc => {
                alloc_stack.insert(e.addr, e.stack);
            }
            Action::FreeCompleted => {
                if let Some(st) = alloc_stack.remove(&e.addr) {
                    frees_seen += 1;
                    frees_alloc_stack += u64::from(st == e.stack);
                }
            }
            _ => {}
        }
        let in_window = window.is_none_or(|(a, b)| e.time_us >= a && e.time_us <= b);
        // The free request counts for the peak (the bytes are still
        // allocated just before it), the completion for the bytes freed.
        let counted = matches!(
            e.action,
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted
        );
        let hit = if in_window && counted {
            matcher.line_of(e.stack)
        } else {
            None
        };
        if let Some((line, function, file)) = hit {
            count += 1;
            first_before.get_or_insert(before);
            peak = peak.max(before).max(after);
            file_seen.get_or_insert(file);
            charge(&mut rows, (line, function), e, before.max(after));
        }
        before = after;
    }
    if frees_seen > 0 && frees_alloc_stack == frees_seen {
        warnings.push(
            "every free carries the stack of its allocation (recorded with context=\"alloc\"): \
             \"freed\" is charged to the line that allocated; record with context=\"all\" \
             to charge the line that freed"
                .into(),
        );
    }
    let file = file_seen.unwrap_or_else(|| opts.file.clone());
    let source = finder.lines(&file);
    let rows = finish_rows(rows, opts, source.as_deref());
    LinesReport {
        file,
        function: opts.function.clone(),
        device,
        events: count,
        allocated_before_bytes: first_before.unwrap_or(0),
        peak_allocated_bytes: peak,
        rows,
        warnings,
    }
}

/// Charges event `e` to the row of `key` (line, function), made empty if new:
/// the bytes allocated or freed, and the highest allocated total around it
/// (`allocated`).
fn charge(
    rows: &mut BTreeMap<(u32, String), LineRow>,
    key: (u32, String),
    e: &TraceEvent,
    allocated: u64,
) {
    let (line, function) = key;
    let row = rows
        .entry((line, function.clone()))
        .or_insert_with(|| LineRow {
            line,
            function,
            text: None,
            allocated_bytes: 0,
            allocations: 0,
            freed_bytes: 0,
            frees: 0,
            net_bytes: 0,
            peak_allocated_bytes: 0,
        });
    match e.action {
        Action::Alloc => {
            row.allocated_bytes += e.size;
            row.allocations += 1;
        }
        Action::FreeCompleted => {
            row.freed_bytes += e.size;
            row.frees += 1;
        }
        _ => {}
    }
    row.peak_allocated_bytes = row.peak_allocated_bytes.max(allocated);
}

/// The rows in line order within the lines asked for, with their net bytes
/// and their source text (from `source`, the file's lines, when readable).
fn finish_rows(
    rows: BTreeMap<(u32, String), LineRow>,
    opts: &LineOptions,
    source: Option<&[String]>,
) -> Vec<LineRow> {
    rows.into_values()
        .filter(|row| opts.first_line.is_none_or(|f| row.line >= f))
        .filter(|row| opts.last_line.is_none_or(|l| row.line <= l))
        .map(|mut row| {
            row.net_bytes = row.allocated_bytes as i64 - row.freed_bytes as i64;
            row.text = source
                .and_then(|s| s.get(row.line as usize - 1))
                .map(|t| t.trim_end().to_string());
            row
        })
        .collect()
}

/// The time span of the record_function scope `name` on `device`: its first
/// START to the END after it.
fn scope_window(snap: &Snapshot, device: u32, name: &str) -> Option<(i64, i64)> {
    let mut start = None;
    for a in snap.annotations.iter().filter(|a| a.device == device) {
        if snap.str(a.name) != name {
            continue;
        }
        match (a.start, start) {
            (true, None) => start = Some(a.time_us),
            (false, Some(s)) => return Some((s, a.time_us)),
            _ => {}
        }
    }
    start.map(|s| (s, i64::MAX))
}

/// Finds the function's line on a stack, cached per stack.
struct Matcher<'a> {
    snap: &'a Snapshot,
    opts: &'a LineOptions,
    cache: HashMap<StackId, Option<(u32, String, String)>>,
}

impl Matcher<'_> {
    /// (line, function, file) of the outermost frame of the file (and function).
    fn line_of(&mut self, stack: StackId) -> Option<(u32, String, String)> {
        if let Some(hit) = self.cache.get(&stack) {
            return hit.clone();
        }
        let snap = self.snap;
        let hit = snap.stack(stack).iter().rev().find_map(|&f| {
            let frame = snap.frame(f);
            let file = snap.str(frame.filename);
            let function = snap.str(frame.name);
            let file_ok = file == self.opts.file || path_ends_with(file, &self.opts.file);
            let fn_ok = self.opts.function.as_deref().is_none_or(|f| f == function);
            (file_ok && fn_ok && frame.line > 0)
                .then(|| (frame.line, function.to_string(), file.to_string()))
        });
        self.cache.insert(stack, hit.clone());
        hit
    }
}

/// True when `path` ends with the components of `tail` (`a/b/train.py` ends
/// with `train.py` and `b/train.py`, not with `ain.py`).
fn path_ends_with(path: &str, tail: &str) -> bool {
    let tail = tail.trim_start_matches("./");
    !tail.is_empty()
        && path.ends_with(tail)
        && (path.len() == tail.len() || path[..path.len() - tail.len()].ends_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        let o = LineOptions::parse("train.py:step");
        assert_eq!(
            (o.file.as_str(), o.function.as_deref()),
            ("train.py", Some("step"))
        );
        assert_eq!(LineOptions::parse("train.py").function, None);
        assert_eq!(LineOptions::parse("train.py:12").function, None);
        assert!(path_ends_with("/home/u/train.py", "train.py"));
        assert!(!path_ends_with("/home/u/ptrain.py", "train.py"));
    }
}
