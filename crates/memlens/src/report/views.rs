//! Two sections built from public analysis results: the OOM drawn (from
//! [`crate::oom::OomReport`]) and the per-snapshot overview of a run given as
//! several periodic snapshots.

use super::model::Category;
use crate::doctor::Diagnosis;
use crate::snapshot::Snapshot;
use serde::{Deserialize, Serialize};

/// The failed allocation, what was free where, and every fix with its figure.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OomView {
    /// Index of the `oom` event in the trace.
    pub event_index: u64,
    /// The device whose trace holds it.
    pub device: u32,
    /// Why it failed (`capacity`, `fragmentation`, ...).
    pub cause: String,
    /// The paragraph `memlens oom` prints.
    pub explanation: String,
    /// The rounded request.
    pub requested_bytes: u64,
    /// The segment the allocator tried to get.
    pub tried_to_allocate_bytes: u64,
    /// The pool of the request (`small` or `large`) and its stream.
    pub pool: String,
    /// The stream of the request.
    pub stream: i64,
    /// `file:line` of the failed allocation.
    pub site: String,
    /// Allocated right before the failure.
    pub allocated_bytes: u64,
    /// Reserved right before the failure.
    pub reserved_bytes: u64,
    /// Free on the device, as `cudaMemGetInfo` said.
    pub device_free_bytes: u64,
    /// The device's memory, when known.
    pub device_total_bytes: Option<u64>,
    /// Used outside PyTorch's allocator, when known.
    pub outside_pytorch_bytes: Option<u64>,
    /// The memory cap that applied, when one did.
    pub cap_bytes: Option<u64>,
    /// How the cap was set.
    pub cap_how: Option<String>,
    /// Every pool and stream with its largest free piece.
    pub pools: Vec<OomPool>,
    /// What was live right before the failure, largest first.
    pub live: Vec<OomLive>,
    /// Live sites not listed.
    pub other_sites: u64,
    /// Every fix the CLI prints, best first, then those predicted not to help.
    pub fixes: Vec<OomFixView>,
}

/// One pool and stream at the failure.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OomPool {
    /// `small`, `large`, with `(private a,b)` for private pools.
    pub pool: String,
    /// The stream.
    pub stream: i64,
    /// Reserved.
    pub reserved_bytes: u64,
    /// Allocated.
    pub allocated_bytes: u64,
    /// Free.
    pub free_bytes: u64,
    /// The largest free piece.
    pub largest_free_bytes: u64,
    /// The request came from this pool and stream.
    pub requested_here: bool,
}

/// One live site at the failure.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OomLive {
    /// `file:line`.
    pub site: String,
    /// Its function.
    pub function: String,
    /// What the memory is.
    pub category: Category,
    /// Live bytes.
    pub bytes: u64,
}

/// One fix with its predicted figure.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OomFixView {
    /// What to do.
    pub action: String,
    /// Predicted peak reserved with the fix, when simulated.
    pub predicted_peak_reserved_bytes: Option<u64>,
    /// Whether the simulation says the run then fits.
    pub fits: Option<bool>,
    /// False for the fixes the simulation says would not help.
    pub helps: bool,
    /// What the fix is known to do, as the terminal tags it
    /// ([`crate::oom::OomFix::verdict`]; `would not help` when it would not).
    pub verdict: String,
}

/// The OOM section, from the diagnosis' OOM report.
pub fn oom_view(d: &Diagnosis) -> Option<OomView> {
    let r = d.oom.as_ref()?;
    let fix = |f: &crate::oom::OomFix, helps: bool| OomFixView {
        action: f.action.clone(),
        predicted_peak_reserved_bytes: f.predicted_peak_reserved_bytes,
        fits: f.fits,
        helps,
        verdict: if helps { f.verdict() } else { "would not help" }.to_string(),
    };
    Some(OomView {
        event_index: r.event_index as u64,
        device: r.device,
        cause: r.cause.to_string(),
        explanation: r.explanation.clone(),
        requested_bytes: r.requested_bytes,
        tried_to_allocate_bytes: r.tried_to_allocate_bytes,
        pool: r.pool.to_string(),
        stream: r.stream,
        site: r.site.clone(),
        allocated_bytes: r.allocated_bytes,
        reserved_bytes: r.reserved_bytes,
        device_free_bytes: r.device_memory.free_bytes,
        device_total_bytes: r.device_memory.total_bytes,
        outside_pytorch_bytes: r.device_memory.outside_pytorch_bytes,
        cap_bytes: r.memory_cap.as_ref().map(|c| c.bytes),
        cap_how: r.memory_cap.as_ref().map(|c| c.how.clone()),
        pools: r
            .pools
            .iter()
            .map(|p| OomPool {
                pool: match p.private_pool {
                    Some((a, b)) => format!("{} (private {a},{b})", p.pool),
                    None => p.pool.to_string(),
                },
                stream: p.stream,
                reserved_bytes: p.reserved_bytes,
                allocated_bytes: p.allocated_bytes,
                free_bytes: p.free_bytes,
                largest_free_bytes: p.largest_free_block_bytes,
                requested_here: p.requested_here,
            })
            .collect(),
        live: r
            .live_at_oom
            .iter()
            .map(|l| OomLive {
                site: l.site.clone(),
                function: l.function.clone(),
                category: l.category,
                bytes: l.bytes,
            })
            .collect(),
        other_sites: r.other_sites as u64,
        fixes: r.advice().map(|(f, helps)| fix(f, helps)).collect(),
    })
}

/// Each snapshot of a run given as several (periodic) snapshots.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Overview {
    /// One row per snapshot, in the order given (oldest first).
    pub rows: Vec<OverviewRow>,
    /// The device's memory, when a snapshot says (for headroom).
    pub device_total_bytes: Option<u64>,
}

/// One snapshot of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OverviewRow {
    /// The file as the user named it.
    pub file: String,
    /// Events in its trace.
    pub trace_events: u64,
    /// Peak allocated over its trace.
    pub peak_allocated_bytes: u64,
    /// Peak reserved over its trace.
    pub peak_reserved_bytes: u64,
    /// Allocated when it was dumped.
    pub allocated_bytes: u64,
    /// Reserved when it was dumped.
    pub reserved_bytes: u64,
    /// Allocated at dump minus that of the previous snapshot (0 for the first).
    pub growth_bytes: i64,
    /// Device memory minus the peak reserved, when the device's memory is known.
    pub headroom_bytes: Option<i64>,
}

/// The overview of several snapshots; `None` for one snapshot (the header
/// says it all then).
pub fn overview<'s>(
    set: &crate::analysis::peak::AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    d: &Diagnosis,
) -> Option<Overview> {
    if snaps.len() < 2 {
        return None;
    }
    let total = d.oom.as_ref().and_then(|o| o.device_memory.total_bytes);
    let mut rows: Vec<OverviewRow> = Vec::with_capacity(snaps.len());
    for (i, (name, snap)) in snaps.iter().enumerate() {
        let s = crate::analysis::summary::summarize_with(snap, set.pending(snap));
        // The diagnosis' peaks of each snapshot (the last one's is its peak);
        // inputs it did not take as one run (ranks) read theirs from the
        // replay beside the reader.
        let (pa, pr) = match d.snapshot_peaks.get(i) {
            Some(&p) if d.snapshot_peaks.len() == snaps.len() => p,
            _ if i + 1 == snaps.len() => (d.peak.peak_allocated_bytes, d.peak.peak_reserved_bytes),
            _ => crate::analysis::peak::peak_totals(snap, set.fed_pass(snap)),
        };
        let growth = rows.last().map_or(0, |prev| {
            i64::try_from(s.allocated_bytes).unwrap_or(i64::MAX)
                - i64::try_from(prev.allocated_bytes).unwrap_or(i64::MAX)
        });
        rows.push(OverviewRow {
            file: name.clone(),
            trace_events: snap.traces.iter().map(|t| t.events.len() as u64).sum(),
            peak_allocated_bytes: pa,
            peak_reserved_bytes: pr,
            allocated_bytes: s.allocated_bytes,
            reserved_bytes: s.reserved_bytes,
            growth_bytes: growth,
            headroom_bytes: total.map(|t| {
                i64::try_from(t).unwrap_or(i64::MAX) - i64::try_from(pr).unwrap_or(i64::MAX)
            }),
        });
    }
    Some(Overview {
        rows,
        device_total_bytes: total,
    })
}
