//! Iterations (training or inference steps) in a trace.
//!
//! The main method reads the loop from the stacks: every allocation made inside
//! a Python loop carries the frame of the function that runs the loop, and its
//! line number goes *back* each time the loop starts a new iteration. memlens
//! takes the outermost user frame whose line jumps back at least twice, and
//! cuts the trace at each jump. When stacks are missing it falls back on the
//! `Optimizer.step` annotations PyTorch records.

use super::sites::is_user_file;
use crate::snapshot::{Action, Snapshot};
use serde::Serialize;

/// How the steps were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepMethod {
    /// From the line of the loop's frame going back at each iteration.
    LoopFrame,
    /// From `Optimizer.step` annotations.
    OptimizerAnnotations,
    /// No repeating pattern: the whole trace is one step.
    None,
}

/// Steps of one device trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Steps {
    /// Event index where each step starts; the first is always 0.
    pub starts: Vec<usize>,
    /// Total number of events (the end of the last step).
    pub end: usize,
    /// How they were found.
    pub method: StepMethod,
    /// The loop, as `file:function` (for `LoopFrame`).
    pub loop_function: Option<String>,
}

impl Steps {
    /// Number of steps.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when there is no event.
    pub fn is_empty(&self) -> bool {
        self.end == 0
    }

    /// The event range of step `i`.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let a = self.starts[i];
        let b = self.starts.get(i + 1).copied().unwrap_or(self.end);
        a..b
    }
}

/// Finds the steps of the trace of device index `trace` in `snap`.
pub fn detect(snap: &Snapshot, trace: usize) -> Steps {
    let Some(t) = snap.traces.get(trace) else {
        return Steps {
            starts: vec![0],
            end: 0,
            method: StepMethod::None,
            loop_function: None,
        };
    };
    let end = t.events.len();
    if let Some(s) = by_loop_frame(snap, trace) {
        return s;
    }
    if let Some(s) = by_annotations(snap, trace) {
        return s;
    }
    Steps {
        starts: vec![0],
        end,
        method: StepMethod::None,
        loop_function: None,
    }
}

/// For each stack: its user frames, outermost first.
fn user_chains(snap: &Snapshot) -> Vec<Vec<u32>> {
    let user: Vec<bool> = snap
        .frames
        .iter()
        .map(|f| is_user_file(snap.str(f.filename)))
        .collect();
    (0..snap.stack_ranges.len() as u32)
        .map(|s| {
            snap.stack(s)
                .iter()
                .rev()
                .copied()
                .filter(|&f| user[f as usize])
                .collect()
        })
        .collect()
}

const MAX_DEPTH: usize = 16;

fn by_loop_frame(snap: &Snapshot, trace: usize) -> Option<Steps> {
    let events = &snap.traces[trace].events;
    let chains = user_chains(snap);
    // For each depth: the previous (function key, line), and jumps per function.
    let key = |f: u32| {
        let fr = snap.frame(f);
        (fr.filename, fr.name)
    };
    let mut prev: Vec<Option<((u32, u32), u32)>> = vec![None; MAX_DEPTH];
    let mut jumps: Vec<std::collections::HashMap<(u32, u32), Vec<usize>>> =
        vec![Default::default(); MAX_DEPTH];
    for (i, e) in events.iter().enumerate() {
        if e.action != Action::Alloc {
            continue;
        }
        let Some(chain) = chains.get(e.stack as usize) else {
            continue;
        };
        for (d, &f) in chain.iter().enumerate().take(MAX_DEPTH) {
            let k = key(f);
            let line = snap.frame(f).line;
            if let Some((pk, pl)) = prev[d] {
                if pk == k && line < pl {
                    jumps[d].entry(k).or_default().push(i);
                }
            }
            prev[d] = Some((k, line));
        }
    }
    // The outermost depth with a loop that iterated at least three times.
    for level in jumps.iter() {
        if let Some((k, starts)) = level
            .iter()
            .filter(|(_, v)| v.len() >= 2)
            .max_by_key(|(_, v)| v.len())
        {
            let mut all = vec![0];
            all.extend(starts.iter().copied().filter(|&s| s > 0));
            return Some(Steps {
                starts: all,
                end: events.len(),
                method: StepMethod::LoopFrame,
                loop_function: Some(format!("{}:{}", snap.str(k.0), snap.str(k.1))),
            });
        }
    }
    None
}

fn by_annotations(snap: &Snapshot, trace: usize) -> Option<Steps> {
    let t = &snap.traces[trace];
    let ends: Vec<i64> = snap
        .annotations
        .iter()
        .filter(|a| {
            a.device == t.device && !a.start && snap.str(a.name).starts_with("Optimizer.step")
        })
        .map(|a| a.time_us)
        .collect();
    if ends.len() < 2 || t.events.iter().all(|e| e.time_us == 0) {
        return None;
    }
    let mut starts = vec![0];
    for end_time in ends {
        let i = t.events.partition_point(|e| e.time_us <= end_time);
        if i > *starts.last().unwrap_or(&0) && i < t.events.len() {
            starts.push(i);
        }
    }
    (starts.len() >= 2).then_some(Steps {
        starts,
        end: t.events.len(),
        method: StepMethod::OptimizerAnnotations,
        loop_function: None,
    })
}
