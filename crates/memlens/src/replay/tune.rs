//! `tune`: simulates the usual `PYTORCH_CUDA_ALLOC_CONF` settings on a trace
//! (in parallel) and ranks them by OOMs, then by peak reserved memory.

use super::simulate::{simulate_prepared, Prepared, SimulateOptions, SimulationResult};
use crate::sim::AllocatorConfig;
use crate::snapshot::Snapshot;
use crate::units::format_bytes;
use rayon::prelude::*;
use serde::Serialize;

/// One setting tried.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// The settings in `PYTORCH_CUDA_ALLOC_CONF` syntax (empty: PyTorch's defaults).
    pub config: String,
    /// Predicted `reserved_bytes.all.peak`.
    pub peak_reserved_bytes: u64,
    /// Predicted failed allocations the program needed (its OOMs).
    pub num_ooms: u64,
    /// Predicted cuDNN convolution workspaces given up (not OOMs: PyTorch
    /// runs the convolution with another algorithm).
    pub workspaces_given_up: u64,
    /// Predicted `allocated_bytes.all.peak`.
    pub peak_allocated_bytes: u64,
    /// Predicted cudaMalloc retries (each one a full cache flush).
    pub num_alloc_retries: u64,
    /// The settings the snapshot was recorded with.
    pub recorded: bool,
}

/// The ranking.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneResult {
    /// Candidates, best first.
    pub candidates: Vec<Candidate>,
    /// The recorded settings.
    pub recorded_config: String,
    /// One line of advice.
    pub advice: String,
}

/// The settings `tune` tries, starting from `recorded` (whose PyTorch version
/// and segment size they keep). The GC candidate needs a memory fraction, so
/// it appears only when the device's memory is known.
pub fn candidate_configs(
    recorded: &AllocatorConfig,
    device_memory: Option<u64>,
    capacity: Option<u64>,
) -> Vec<AllocatorConfig> {
    let base = AllocatorConfig {
        version: recorded.version,
        large_segment_size: recorded.large_segment_size,
        ..AllocatorConfig::default()
    };
    let with = |text: &str| {
        let mut c = base.clone();
        // The candidate strings are fixed and valid.
        let _ = c.apply(text);
        c
    };
    let mut out = vec![
        recorded.clone(),
        base.clone(),
        with("expandable_segments:True"),
    ];
    for mb in [64, 128, 256, 512] {
        out.push(with(&format!("max_split_size_mb:{mb}")));
    }
    out.push(with("roundup_power2_divisions:4"));
    out.push(with("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"));
    out.push(with(
        "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    ));
    if let (Some(total), Some(cap)) = (device_memory, capacity) {
        // The fraction that gives the allocator what the device can hold.
        let fraction = ((cap as f64 / total as f64) * 100.0).floor() / 100.0;
        if fraction > 0.0 && fraction < 1.0 {
            out.push(with(&format!(
                "garbage_collection_threshold:0.6,per_process_memory_fraction:{fraction}"
            )));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|c| seen.insert(c.to_conf_string()));
    out
}

/// Simulates every candidate on `device`'s trace and ranks them.
pub fn tune(snap: &Snapshot, device: u32, opts: &SimulateOptions) -> crate::Result<TuneResult> {
    tune_prepared(snap, opts, &Prepared::new(snap, device))
}

/// [`tune`] on a trace already studied ([`Prepared`]; `doctor` makes it from
/// its one replay of the run).
pub fn tune_prepared(
    snap: &Snapshot,
    opts: &SimulateOptions,
    prep: &Prepared,
) -> crate::Result<TuneResult> {
    let recorded = crate::replay::config::recorded_config(&snap.settings);
    let overhead = match (opts.device_memory, opts.overhead) {
        (Some(total), None) => Some(prep.overhead(total).unwrap_or(0)),
        (_, o) => o,
    };
    let capacity = opts
        .device_memory
        .map(|t| t.saturating_sub(overhead.unwrap_or(0)));
    let configs = candidate_configs(&recorded, opts.device_memory, capacity);
    let results: Vec<crate::Result<SimulationResult>> = configs
        .par_iter()
        .map(|c| {
            simulate_prepared(
                snap,
                prep,
                &SimulateOptions {
                    config: c.clone(),
                    overhead,
                    ..opts.clone()
                },
            )
        })
        .collect();
    let recorded_str = recorded.to_conf_string();
    let mut candidates = Vec::with_capacity(results.len());
    for r in results {
        let r = r?;
        candidates.push(Candidate {
            recorded: r.config == recorded_str,
            config: r.config,
            peak_reserved_bytes: r.peak_reserved_bytes,
            num_ooms: r.num_ooms,
            workspaces_given_up: r.workspaces_given_up,
            peak_allocated_bytes: r.peak_allocated_bytes,
            num_alloc_retries: r.num_alloc_retries,
        });
    }
    candidates.sort_by(|a, b| {
        (
            a.num_ooms,
            a.peak_reserved_bytes,
            a.num_alloc_retries,
            !a.recorded,
        )
            .cmp(&(
                b.num_ooms,
                b.peak_reserved_bytes,
                b.num_alloc_retries,
                !b.recorded,
            ))
    });
    let advice = advise(&candidates);
    Ok(TuneResult {
        candidates,
        recorded_config: recorded_str,
        advice,
    })
}

fn show(config: &str) -> &str {
    if config.is_empty() {
        "the defaults"
    } else {
        config
    }
}

fn advise(c: &[Candidate]) -> String {
    let (Some(best), Some(rec)) = (c.first(), c.iter().find(|c| c.recorded)) else {
        return "no trace to tune".to_string();
    };
    if best.recorded
        || (best.num_ooms == rec.num_ooms && best.peak_reserved_bytes == rec.peak_reserved_bytes)
    {
        return format!(
            "the recorded settings ({}) are already the best tried: peak reserved {}",
            show(&rec.config),
            format_bytes(rec.peak_reserved_bytes)
        );
    }
    if best.num_ooms > 0 {
        // A lower peak means nothing if the run still fails: say so rather
        // than recommend a setting whose rerun would OOM too.
        return format!(
            "no setting tried avoids the OOM under the run's limits (the recorded settings ({}) \
             fail {} time(s), the best {}); make the step smaller or raise the limit",
            show(&rec.config),
            rec.num_ooms,
            best.num_ooms
        );
    }
    let saved = rec
        .peak_reserved_bytes
        .saturating_sub(best.peak_reserved_bytes);
    let pct = if rec.peak_reserved_bytes > 0 {
        100.0 * saved as f64 / rec.peak_reserved_bytes as f64
    } else {
        0.0
    };
    let oom = if rec.num_ooms > 0 && best.num_ooms == 0 {
        " and avoids the OOM"
    } else {
        ""
    };
    // cuDNN workspaces had rather than given up: the convolutions keep the
    // algorithms cuDNN chose for them.
    let workspaces = if best.workspaces_given_up < rec.workspaces_given_up {
        format!(
            "; cuDNN gives up {} convolution workspace(s) instead of {}",
            best.workspaces_given_up, rec.workspaces_given_up
        )
    } else {
        String::new()
    };
    format!(
        "set PYTORCH_CUDA_ALLOC_CONF={}: peak reserved {} instead of {} (-{pct:.1}%){oom}{workspaces}",
        if best.config.is_empty() {
            "\"\""
        } else {
            &best.config
        },
        format_bytes(best.peak_reserved_bytes),
        format_bytes(rec.peak_reserved_bytes)
    )
}
