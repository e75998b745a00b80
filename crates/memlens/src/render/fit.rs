//! The terminal text of `memlens fit`.

use crate::fit::{CheckpointReport, FitAnswer, FitReport, Prediction, RunPeaks, RunReport};
use crate::units::format_bytes;

/// The text `memlens fit` prints.
pub fn text(r: &FitReport) -> String {
    let b = &r.basis;
    let probes: Vec<String> = b
        .probes
        .iter()
        .map(|p| {
            format!(
                "batch {} ({}: peak reserved {})",
                p.batch,
                p.file,
                format_bytes(p.peak_reserved_bytes)
            )
        })
        .collect();
    let mut out = format!(
        "fit: from two probes, {}\n  {} of {} allocations scale with the batch (+{} per sample, all \
         allocations together); the rest (parameters, gradients, optimizer state, workspaces) stay\n",
        probes.join(" and "),
        b.scaling_allocations,
        b.allocations,
        format_bytes(b.bytes_per_sample)
    );
    if b.modelled_reductions > 0 {
        let gpu = if b.multiprocessors_recorded {
            format!("the probes' GPU, {} multiprocessors", b.multiprocessors)
        } else {
            format!(
                "{} multiprocessors, an H100's or H200's: the probes do not say which GPU ran them",
                b.multiprocessors
            )
        };
        out.push_str(&format!(
            "  {} sums of bias gradients get their reduction kernel's staging buffers computed at \
             each batch (PyTorch's Reduce.cuh, for {gpu})\n",
            b.modelled_reductions
        ));
    }
    if b.conv_workspaces > 0 && r.limit_bytes.is_some() {
        out.push_str(&format!(
            "  {} cuDNN convolution workspaces are done without where the limit leaves no room \
             (PyTorch then runs the convolution with another algorithm)\n",
            b.conv_workspaces
        ));
    }
    let limit = r.limit_bytes.map(format_bytes);
    if let Some(p) = &r.predicted {
        out.push_str(&line(p, limit.as_deref()));
    }
    match (&limit, r.largest_batch, &r.at_largest_batch) {
        (Some(l), Some(n), Some(p)) => out.push_str(&format!(
            "  largest batch under {l}: {n} (peak reserved {} without the limit)\n",
            format_bytes(p.peak_reserved_bytes)
        )),
        (Some(l), None, _) => out.push_str(&format!("  not even batch 1 fits under {l}\n")),
        _ => {}
    }
    push_notes(&mut out, &r.warnings, &b.config);
    out
}

fn line(p: &Prediction, limit: Option<&str>) -> String {
    let verdict = verdict(p.fits, limit);
    format!(
        "  batch {}: peak allocated {}, peak reserved {}{verdict}\n",
        p.batch,
        format_bytes(p.peak_allocated_bytes),
        format_bytes(p.peak_reserved_bytes)
    )
}

/// The text of either answer of `memlens fit`.
pub fn answer_text(a: &FitAnswer) -> String {
    match a {
        FitAnswer::Batch(r) => text(r),
        FitAnswer::Checkpoint(r) => checkpoint_text(r),
        FitAnswer::Run(r) => run_text(r),
    }
}

/// The text `memlens fit` prints for one run replayed as it is.
pub fn run_text(r: &RunReport) -> String {
    let b = &r.basis;
    let what = match (&b.steps, &b.precision) {
        (Some(steps), Some(precision)) => format!(
            "a step traced with fake tensors ({steps} steps, {precision}, {} allocations)",
            b.allocations
        ),
        _ => format!("the recorded run ({} allocations)", b.allocations),
    };
    let limit = r.limit_bytes.map(format_bytes);
    let mut out = format!(
        "fit: {}, {what}, replayed through the allocator model\n",
        b.file
    );
    out.push_str(&peaks_line("predicted", &r.predicted, limit.as_deref()));
    push_notes(&mut out, &r.warnings, &r.config);
    out
}

/// The text `memlens fit --checkpoint` prints.
pub fn checkpoint_text(r: &CheckpointReport) -> String {
    let b = &r.basis;
    let limit = r.limit_bytes.map(format_bytes);
    let mut out = format!(
        "fit: {} under activation checkpointing, from the recorded run\n  {} calls checkpointed: \
         {} tensors ({} over all calls) no longer kept for the backward, released when \
         the module holding them returns; {} allocations added by recomputing each call's \
         forward in the backward\n",
        b.module,
        b.calls,
        b.saved_tensors,
        format_bytes(b.saved_bytes),
        b.recomputed_allocations
    );
    if b.calls_without_saved > 0 {
        out.push_str(&format!(
            "  {} calls left as they ran (nothing kept for a backward: eval or no_grad)\n",
            b.calls_without_saved
        ));
    }
    out.push_str(&peaks_line("as recorded", &r.recorded, limit.as_deref()));
    out.push_str(&peaks_line("checkpointed", &r.predicted, limit.as_deref()));
    out.push_str(&format!(
        "  saves {} allocated, {} reserved at the peak\n",
        format_bytes(
            r.recorded
                .peak_allocated_bytes
                .saturating_sub(r.predicted.peak_allocated_bytes)
        ),
        format_bytes(
            r.recorded
                .peak_reserved_bytes
                .saturating_sub(r.predicted.peak_reserved_bytes)
        )
    ));
    push_notes(&mut out, &r.warnings, &r.config);
    out
}

fn peaks_line(what: &str, p: &RunPeaks, limit: Option<&str>) -> String {
    let verdict = verdict(p.fits, limit);
    format!(
        "  {what}: peak allocated {}, peak reserved {}{verdict}\n",
        format_bytes(p.peak_allocated_bytes),
        format_bytes(p.peak_reserved_bytes)
    )
}

/// ": fits under 24.00 GiB", ": does not fit under ...", or nothing without a limit.
fn verdict(fits: Option<bool>, limit: Option<&str>) -> String {
    match (fits, limit) {
        (Some(true), Some(l)) => format!(": fits under {l}"),
        (Some(false), Some(l)) => format!(": does not fit under {l}"),
        _ => String::new(),
    }
}

/// The caveats and the allocator settings, the last lines of either answer.
fn push_notes(out: &mut String, warnings: &[String], config: &str) {
    for w in warnings {
        out.push_str(&format!("  note: {w}\n"));
    }
    if config.is_empty() {
        out.push_str("  allocator settings: PyTorch's defaults, as recorded\n");
    } else {
        out.push_str(&format!("  allocator settings: {config}\n"));
    }
}
