//! The text of `memlens estimate`: each part with its formula and inputs, the
//! phases and the peak, then the fit on a device and the comparison.

use super::documents::EstimateDoc;
use super::layout::push_wrapped;
use crate::estimate::{
    Checkpointing, Comparison, Estimate, Explanation, Fit, Part, Settings, Term,
};
use crate::units::{format_bytes, format_delta, group_digits as group};
use std::fmt::Write;

/// The whole text: the estimate, then the fit and the comparison when asked, then the notes.
pub fn text(d: &EstimateDoc) -> String {
    let mut text = render(&d.estimate);
    text.push_str(&render_explanation(&d.explanation));
    if let Some(f) = &d.fit {
        text.push_str(&render_fit(f, &d.estimate));
    }
    if let Some(c) = &d.compare {
        text.push_str(&render_comparison(c));
    }
    text.push_str(&render_notes(&d.estimate));
    super::layout::fit(text)
}

fn inputs_line(p: &Part) -> String {
    p.inputs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn term_lines(o: &mut String, terms: &[Term], indent: usize) {
    for t in terms {
        let _ = writeln!(
            o,
            "{:indent$}{:>11}  {:<52} {}",
            "",
            format_bytes(t.bytes),
            t.name,
            t.formula,
        );
    }
}

/// The terminal table: the model, the settings, each part with its formula and
/// inputs, the per-layer terms, the phases and the peak.
fn render(est: &Estimate) -> String {
    let mut o = String::new();
    render_model(&mut o, est);
    render_settings(&mut o, &est.settings);
    render_parts(&mut o, est);
    render_phases(&mut o, est);
    o
}

/// The model: its source, type, parameters, architecture and checkpoint.
fn render_model(o: &mut String, est: &Estimate) {
    let m = &est.model;
    let class = m
        .class
        .as_deref()
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "{}: {}{class}, {} parameters (from the {})",
        m.source,
        m.model_type,
        group(est.parameters),
        m.parameters_from
    );
    if let Some(a) = &m.architecture {
        let mut line = format!(
            "  {} layers, hidden {}, {} heads x {}",
            a.layers + a.decoder_layers,
            a.hidden,
            a.heads,
            a.head_dim
        );
        if a.kv_heads != a.heads {
            let _ = write!(line, " ({} KV heads)", a.kv_heads);
        }
        let _ = write!(
            line,
            ", MLP {} ({}{})",
            a.ffn,
            if a.gated_mlp { "gated " } else { "" },
            a.activation_name
        );
        if a.vocab > 0 {
            let _ = write!(line, ", vocabulary {}", a.vocab);
        }
        let _ = writeln!(o, "{line}");
    }
    if let Some(ck) = &m.checkpoint {
        let dtypes: Vec<String> = ck
            .dtypes
            .iter()
            .map(|(d, n)| format!("{} {d}", group(*n)))
            .collect();
        let _ = writeln!(
            o,
            "  checkpoint: {} parameters ({}) in {} file(s){}",
            group(ck.parameters),
            dtypes.join(", "),
            ck.files.len(),
            if ck.buffers.is_empty() {
                String::new()
            } else {
                format!(", {} buffers left out", ck.buffers.len())
            }
        );
    }
}

/// The settings of the step estimated and the element sizes.
fn render_settings(o: &mut String, s: &Settings) {
    let precision = match (s.amp, s.weight_bytes) {
        (true, 4) => format!("{} weights + bf16 autocast", s.dtype.name()),
        (true, _) => format!("{} weights, fp32 master weights", s.dtype.name()),
        (false, _) => format!("{} weights", s.dtype.name()),
    };
    let mut setting = format!(
        "  {}: batch {}, seq {} ({}), {precision}",
        if s.inference { "inference" } else { "training" },
        s.batch,
        s.seq,
        s.seq_from
    );
    if !s.inference {
        let _ = write!(
            setting,
            ", {} ({}), checkpointing {}",
            s.optimizer.name(),
            s.optimizer_impl.name(),
            match s.checkpointing {
                Checkpointing::None => "none",
                Checkpointing::Full => "full",
                Checkpointing::Selective => "selective",
            }
        );
    }
    let _ = write!(
        setting,
        ", {} attention{}",
        if s.flash_attention { "fused" } else { "eager" },
        if s.dropout { ", dropout" } else { "" }
    );
    if s.gpus > 1 || s.zero > 0 {
        let _ = write!(setting, ", {} GPUs, ZeRO {}", s.gpus, s.zero);
    }
    let _ = writeln!(o, "{setting}");
    let _ = writeln!(
        o,
        "  element sizes: weights p={} B, activations e={} B, residual stream r={} B",
        s.weight_bytes, s.activation_bytes, s.residual_bytes
    );
}

/// Each part with its formula and inputs (marked when alive at the peak), then
/// the terms of one layer of each kind.
fn render_parts(o: &mut String, est: &Estimate) {
    let at_peak = |key: &str| est.peak().is_some_and(|ph| ph.parts.contains_key(key));
    let _ = writeln!(
        o,
        "\n  {:<34} {:>11}  formula   (* alive at the peak)",
        "part", "size"
    );
    for p in &est.parts {
        let mark = if at_peak(p.key) { '*' } else { ' ' };
        let _ = writeln!(
            o,
            "{mark} {:<34} {:>11}  {}",
            p.name,
            format_bytes(p.bytes),
            p.formula
        );
        if !p.inputs.is_empty() {
            let _ = writeln!(o, "  {:<34} {:>11}  where {}", "", "", inputs_line(p));
        }
        if p.terms.len() > 1 || p.key == "activations" {
            term_lines(o, &p.terms, 4);
        }
    }
    for l in &est.layers {
        let _ = writeln!(
            o,
            "\n  one {} layer (x{}, seq {}): {}",
            l.kind,
            l.count,
            l.seq,
            format_bytes(l.bytes_per_layer)
        );
        term_lines(o, &l.terms, 4);
    }
}

/// The bytes at each phase, the peak, and the bytes on the device.
fn render_phases(o: &mut String, est: &Estimate) {
    let _ = writeln!(o);
    for ph in &est.phases {
        let label = match ph.name {
            "backward_start" => "at the start of backward",
            "optimizer_step" => "at the optimizer step",
            _ => "during the forward pass",
        };
        let _ = writeln!(o, "  {label:<26} {:>11}", format_bytes(ph.bytes));
    }
    let _ = writeln!(
        o,
        "  {:<26} {:>11}  (torch.cuda.max_memory_allocated)",
        "peak allocated",
        format_bytes(est.peak_allocated_bytes)
    );
    let _ = writeln!(
        o,
        "  {:<26} {:>11}  (with the CUDA context)",
        "on the device",
        format_bytes(est.device_bytes)
    );
}

/// Why the peak is what it is, then the other settings with what differs.
fn render_explanation(x: &Explanation) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\n  why:");
    for l in &x.lines {
        push_wrapped(&mut o, "  - ", "    ", l);
    }
    if !x.alternatives.is_empty() {
        let _ = writeln!(o, "\n  the same model and batch with:");
        for a in &x.alternatives {
            push_wrapped(
                &mut o,
                "  - ",
                "    ",
                &format!("{}: {}, {}", a.flags, format_bytes(a.total_bytes), a.why),
            );
        }
    }
    o
}

fn render_fit(f: &Fit, est: &Estimate) -> String {
    let mut o = String::new();
    let dev = format_bytes(f.device_memory_bytes);
    if f.fits {
        let spare = u64::try_from(f.headroom_bytes).unwrap_or(0);
        let _ = write!(o, "  fits on {dev}: yes, {} to spare", format_bytes(spare));
        if spare * 10 < f.device_memory_bytes {
            let _ = write!(o, " (tight: allocator overhead may not fit)");
        }
    } else {
        let _ = write!(
            o,
            "  fits on {dev}: no, {} short",
            format_bytes(f.headroom_bytes.unsigned_abs())
        );
    }
    let _ = writeln!(o);
    match f.max_batch {
        Some(b) => {
            let _ = writeln!(
                o,
                "  largest batch that fits: {b} (at seq {})",
                est.settings.seq
            );
        }
        None => {
            let _ = writeln!(o, "  largest batch that fits: none, not even batch 1");
        }
    }
    o
}

fn render_comparison(c: &Comparison) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\n  compared with the measurement: {:>11} estimated, {:>11} measured, {}{}",
        format_bytes(c.estimated_peak_bytes),
        format_bytes(c.measured_peak_bytes),
        format_delta(c.delta_bytes),
        c.relative_error
            .map(|r| format!(" ({:+.1}%)", r * 100.0))
            .unwrap_or_default()
    );
    if c.categories.iter().any(|r| r.measured_bytes.is_some()) {
        let _ = writeln!(
            o,
            "  {:<18} {:>11} {:>11} {:>12}",
            "category", "estimated", "measured", "difference"
        );
        for r in &c.categories {
            let _ = writeln!(
                o,
                "  {:<18} {:>11} {:>11} {:>12}",
                r.category,
                format_bytes(r.estimated_bytes),
                r.measured_bytes.map(format_bytes).unwrap_or_default(),
                r.delta_bytes.map(format_delta).unwrap_or_default()
            );
        }
    }
    o
}

fn render_notes(est: &Estimate) -> String {
    let mut o = String::new();
    if !est.notes.is_empty() {
        let _ = writeln!(o, "\n  notes:");
        for n in &est.notes {
            push_wrapped(&mut o, "  - ", "    ", n);
        }
    }
    o
}
