//! What FSDP holds at the peak, by role and by module.
//!
//! FSDP keeps each unit's parameters sharded and gathers them whole around
//! its forward and backward. What it allocates is told by the frames of the
//! allocation, in `torch/distributed/fsdp/` ([`role_of`]):
//!
//! - **gathered parameters**: a unit's parameters made whole by its
//!   all-gather (FSDP2: `FSDPParam.init_all_gather_outputs` in the first
//!   iteration, `alloc_all_gather_outputs` after; FSDP1: the padded
//!   unsharded flat parameter). They should live while the unit
//!   computes: with `reshard_after_forward=True` (FSDP2's default, FSDP1's
//!   `FULL_SHARD`) they are freed after the unit's forward and gathered again
//!   in its backward, so at any moment one unit holds them and, prefetching,
//!   the next one.
//! - **all-gather buffers**: the collective's own input and output
//!   (`foreach_all_gather`) and the copy-out's temporaries, freed once
//!   copied out.
//! - **reduce-scatter buffers**: gradients on their way to their shards
//!   (`foreach_reduce`, FSDP1's `_reduce_grad`).
//!
//! A unit's gathered parameters are allocated together (one copy-out), so a
//! run of consecutive such allocations is one unit; the module it belongs to
//! is the innermost module scope open at its first allocation when
//! `memlens.record(model=model)` named them (whose pre-forward hook runs
//! before FSDP's, so the all-gather falls inside the module's scope), else
//! the unit's place in the trace. More than two units holding gathered
//! parameters at the peak means resharding after forward is off (or a unit
//! is never resharded).

use super::modules::innermost_module_at;
use crate::replay::LiveBlock;
use crate::snapshot::{Action, Snapshot, StackId};
use crate::trace::Analysed;
use serde::Serialize;
use std::collections::HashMap;

/// What FSDP allocated a block for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FsdpRole {
    /// A unit's parameters gathered whole.
    GatheredParameters,
    /// The all-gather collective's input or output.
    AllGatherBuffer,
    /// Gradients being reduce-scattered to their shards.
    ReduceScatterBuffer,
}

/// The role of an allocation from its stack, innermost frame first: the
/// first frame in FSDP's own files that names one.
pub fn role_of(snap: &Snapshot, stack: StackId) -> Option<FsdpRole> {
    for &f in snap.stack(stack) {
        let frame = snap.frame(f);
        let file = snap.str(frame.filename);
        if !file.contains("distributed/fsdp/") {
            continue;
        }
        let role = match snap.str(frame.name) {
            // FSDP2 allocates a unit's gathered parameters in its first
            // iteration (`init_*`), then again after each reshard (`alloc_*`).
            "alloc_all_gather_outputs"
            | "init_all_gather_outputs"
            | "init_unsharded_param"
            | "_alloc_padded_unsharded_flat_param" => FsdpRole::GatheredParameters,
            "foreach_all_gather" | "foreach_all_gather_copy_out" | "_all_gather_flat_param" => {
                FsdpRole::AllGatherBuffer
            }
            "foreach_reduce" | "foreach_reduce_scatter_copy_in" | "_reduce_grad" => {
                FsdpRole::ReduceScatterBuffer
            }
            _ => continue,
        };
        return Some(role);
    }
    None
}

/// One FSDP unit's parameters, gathered and live at the peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GatheredUnit {
    /// The module (its qualified name from `memlens.record(model=...)`),
    /// else where it was gathered (in backward, or without module names).
    pub module: String,
    /// Bytes of its gathered parameters live at the peak.
    pub bytes: u64,
    /// Their blocks.
    pub blocks: u64,
    /// The event of its first gathered parameter.
    pub gathered_at_event: Option<u32>,
    /// Whether it was gathered in a module's forward (else in backward or
    /// outside any named module).
    pub in_forward: bool,
}

/// What FSDP holds at the peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FsdpReport {
    /// The device.
    pub device: u32,
    /// Bytes of gathered parameters live at the peak.
    pub gathered_bytes: u64,
    /// The units holding them, by event.
    pub gathered_units: Vec<GatheredUnit>,
    /// Bytes of all-gather buffers live at the peak.
    pub all_gather_buffer_bytes: u64,
    /// Bytes of reduce-scatter buffers live at the peak.
    pub reduce_scatter_bytes: u64,
    /// More units hold gathered parameters than computing and prefetching
    /// need (two): resharding after forward is off.
    pub reshard_after_forward_off: bool,
}

/// Units beyond which gathered parameters at the peak are a misconfiguration:
/// the one computing and the one prefetched.
pub const UNITS_NEEDED: usize = 2;

/// What FSDP holds among `live` (the blocks live at the peak of trace
/// `trace`); `None` when nothing live there is FSDP's.
pub fn fsdp_of_live(an: &Analysed, trace: usize, live: &[LiveBlock]) -> Option<FsdpReport> {
    let snap = an.snap;
    let t = snap.traces.get(trace)?;
    let mut roles: HashMap<StackId, Option<FsdpRole>> = HashMap::new();
    let mut role = |stack: StackId| *roles.entry(stack).or_insert_with(|| role_of(snap, stack));
    let mut sum = HashMap::<FsdpRole, u64>::new();
    let mut gathered: Vec<&LiveBlock> = Vec::new();
    for b in live.iter().filter(|b| !b.pending_free) {
        if let Some(r) = role(b.stack) {
            *sum.entry(r).or_default() += b.size;
            if r == FsdpRole::GatheredParameters {
                gathered.push(b);
            }
        }
    }
    if sum.is_empty() {
        return None;
    }
    // Units: runs of gathered-parameter allocations with no other allocation
    // between them (one copy-out each).
    let unit_start = unit_starts(&t.events, &mut role);
    let mut units: Vec<(u32, u64, u64)> = Vec::new(); // start event, bytes, blocks
    let mut by_start: HashMap<u32, usize> = HashMap::new();
    gathered.sort_by_key(|b| b.alloc_index);
    for b in gathered {
        let start = b
            .alloc_index
            .and_then(|i| unit_start.get(&i).copied())
            .unwrap_or(u32::MAX);
        let k = *by_start.entry(start).or_insert_with(|| {
            units.push((start, 0, 0));
            units.len() - 1
        });
        units[k].1 += b.size;
        units[k].2 += 1;
    }
    let names = unit_names(snap, t, &unit_start);
    let gathered_units: Vec<GatheredUnit> = units
        .iter()
        .map(|&(start, bytes, blocks)| {
            let (module, in_forward) = names
                .get(&start)
                .cloned()
                .unwrap_or_else(|| ("a unit gathered before the recording".into(), false));
            GatheredUnit {
                in_forward,
                module,
                bytes,
                blocks,
                gathered_at_event: (start != u32::MAX).then_some(start),
            }
        })
        .collect();
    Some(FsdpReport {
        device: t.device,
        gathered_bytes: sum.get(&FsdpRole::GatheredParameters).copied().unwrap_or(0),
        reshard_after_forward_off: gathered_units.len() > UNITS_NEEDED,
        gathered_units,
        all_gather_buffer_bytes: sum.get(&FsdpRole::AllGatherBuffer).copied().unwrap_or(0),
        reduce_scatter_bytes: sum
            .get(&FsdpRole::ReduceScatterBuffer)
            .copied()
            .unwrap_or(0),
    })
}

/// Every unit of gathered parameters in trace `trace`, in order: its first
/// event and its name (a module, or the forward unit it was gathered again
/// for, as the step's backward runs the forward's units in reverse).
pub fn units_in_trace(snap: &Snapshot, trace: usize) -> Vec<(u32, String)> {
    let Some(t) = snap.traces.get(trace) else {
        return Vec::new();
    };
    let mut roles: HashMap<StackId, Option<FsdpRole>> = HashMap::new();
    let mut role = |stack: StackId| *roles.entry(stack).or_insert_with(|| role_of(snap, stack));
    let starts = unit_starts(&t.events, &mut role);
    let mut units: Vec<(u32, String)> = unit_names(snap, t, &starts)
        .into_iter()
        .map(|(start, (name, _))| (start, name))
        .collect();
    units.sort_unstable();
    units
}

/// Each unit's name, by its first event, and whether it was gathered in a
/// module's forward. A unit gathered in its module's forward is named by
/// the module's scope. One gathered outside any scope is, in a step, a unit
/// gathered again for its backward, which runs the forward's units in
/// reverse: it takes the name of the latest unit of the step's forward with
/// the same parameter sizes not yet matched (`blocks.7 (gathered again in
/// backward)`); without one, its event.
fn unit_names(
    snap: &Snapshot,
    t: &crate::snapshot::DeviceTrace,
    unit_start: &HashMap<u32, u32>,
) -> HashMap<u32, (String, bool)> {
    let mut sizes: std::collections::BTreeMap<u32, Vec<u64>> = std::collections::BTreeMap::new();
    for (&alloc, &start) in unit_start {
        let size = t.events.get(alloc as usize).map_or(0, |e| e.size);
        sizes.entry(start).or_default().push(size);
    }
    // The map gave the allocations in no order: a unit's sizes, sorted.
    for v in sizes.values_mut() {
        v.sort_unstable();
    }
    let starts: Vec<u32> = sizes.keys().copied().collect();
    let times: Vec<i64> = starts
        .iter()
        .map(|&s| t.events.get(s as usize).map_or(0, |e| e.time_us))
        .collect();
    let modules = innermost_module_at(snap, t.device, &times);
    let mut names = HashMap::new();
    // The step's forward units not yet gathered again: (sizes, name).
    let mut forward: Vec<(&Vec<u64>, String)> = Vec::new();
    let mut in_backward = false;
    for (start, module) in starts.iter().zip(modules) {
        let Some(signature) = sizes.get(start) else {
            continue;
        };
        match module {
            Some(m) => {
                if in_backward {
                    // A forward after a backward: the next step.
                    forward.clear();
                    in_backward = false;
                }
                forward.push((signature, m.clone()));
                names.insert(*start, (m, true));
            }
            None => {
                in_backward = true;
                let name = match forward.iter().rposition(|(sig, _)| *sig == signature) {
                    Some(k) => format!("{} (gathered again in backward)", forward.remove(k).1),
                    None => format!("a unit gathered outside any module's forward (event {start})"),
                };
                names.insert(*start, (name, false));
            }
        }
    }
    names
}

/// For each gathered-parameter `alloc` event, the event starting its unit:
/// the first of its run of such allocations with no other `alloc` between.
fn unit_starts(
    events: &[crate::snapshot::TraceEvent],
    role: &mut impl FnMut(StackId) -> Option<FsdpRole>,
) -> HashMap<u32, u32> {
    let mut out = HashMap::new();
    let mut run: Option<u32> = None;
    for (i, e) in events.iter().enumerate() {
        if e.action != Action::Alloc {
            continue;
        }
        if role(e.stack) == Some(FsdpRole::GatheredParameters) {
            let start = *run.get_or_insert(i as u32);
            out.insert(i as u32, start);
        } else {
            run = None;
        }
    }
    out
}

/// The units' modules for one line: numbered siblings run together
/// (`blocks.0-7`), in the units' order otherwise.
pub fn module_list(units: &[GatheredUnit]) -> String {
    let mut out: Vec<(String, Option<(u64, u64)>)> = Vec::new();
    for u in units {
        let numbered = u
            .module
            .rsplit_once('.')
            .and_then(|(stem, n)| Some((stem, n.parse::<u64>().ok()?)));
        match (numbered, out.last_mut()) {
            (Some((stem, n)), Some((last, Some((_, hi))))) if last == stem && *hi + 1 == n => {
                *hi = n;
            }
            (Some((stem, n)), _) => out.push((stem.to_string(), Some((n, n)))),
            (None, _) => out.push((u.module.clone(), None)),
        }
    }
    out.into_iter()
        .map(|(stem, range)| match range {
            Some((lo, hi)) if lo == hi => format!("{stem}.{lo}"),
            Some((lo, hi)) => format!("{stem}.{lo}-{hi}"),
            None => stem,
        })
        .collect::<Vec<_>>()
        .join(", ")
}
