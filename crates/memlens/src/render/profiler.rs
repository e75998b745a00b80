//! The text of `memlens summary` and `memlens peak` for a torch.profiler trace.

use super::layout::{clip_end, push_wrapped, MAX_WIDTH};
use crate::profiler::{TracePeak, TraceSummary};
use crate::units::format_bytes;
use std::fmt::Write;

fn would_add(o: &mut String, items: &[String]) {
    let _ = writeln!(o, "\nA memory snapshot of the same run would add:");
    for s in items {
        push_wrapped(o, "  - ", "    ", s);
    }
    push_wrapped(
        o,
        "",
        "",
        "(record one with memlens.record(...) or torch.cuda.memory._record_memory_history())",
    );
}

/// `memlens summary TRACE`.
pub fn summary_text(s: &TraceSummary, name: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{name}\n  {} ({} operators)", s.input, s.operators);
    if !s.gpus.is_empty() {
        let _ = writeln!(o, "  GPUs: {}", s.gpus.join(", "));
    }
    if s.devices.is_empty() {
        let _ = writeln!(
            o,
            "\n  no CUDA [memory] events: export the trace from torch.profiler.profile(profile_memory=True)"
        );
    }
    for d in &s.devices {
        let _ = writeln!(o, "\n  device {}", d.device);
        let rows = [
            ("peak allocated", format_bytes(d.peak_allocated_bytes)),
            ("peak reserved", format_bytes(d.peak_reserved_bytes)),
            (
                "allocated at start",
                format_bytes(d.allocated_at_start_bytes),
            ),
            ("allocated at end", format_bytes(d.allocated_at_end_bytes)),
            ("reserved at end", format_bytes(d.reserved_at_end_bytes)),
            (
                "allocations / frees",
                format!("{} / {}", d.allocations, d.frees),
            ),
            ("allocated in total", format_bytes(d.allocated_total_bytes)),
            (
                "peak reached after",
                format!("{:.1} ms", d.peak_at_us / 1000.0),
            ),
        ];
        for (k, v) in rows {
            let _ = writeln!(o, "    {k:<22} {v:>14}");
        }
    }
    if !s.timeline.is_empty() {
        let _ = writeln!(
            o,
            "\n  timeline: {} points of allocated memory in --json",
            s.timeline.len()
        );
    }
    would_add(&mut o, &s.snapshot_would_add);
    super::layout::fit(o)
}

/// `memlens peak TRACE`.
pub fn peak_text(r: &TracePeak) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Peak allocated {}, peak reserved {}, device {} ({}; peak {:.1} ms after its first memory event)",
        format_bytes(r.peak_allocated_bytes),
        format_bytes(r.peak_reserved_bytes),
        r.device,
        r.input,
        r.peak_at_us / 1000.0
    );
    if !r.live_at_peak.is_empty() {
        let _ = writeln!(o, "\nLive at the peak, by the operator that allocated it:");
    }
    for s in &r.live_at_peak {
        let share = 100.0 * s.bytes as f64 / r.peak_allocated_bytes.max(1) as f64;
        let head = format!(
            "  {:>11} {:>5.1}% {:>6} blocks  ",
            format_bytes(s.bytes),
            share,
            s.count
        );
        let mut name = s.operator.clone();
        if let Some(i) = s.innermost.as_deref().filter(|i| *i != s.operator) {
            name += &format!(" > {i}");
        }
        let room = MAX_WIDTH.saturating_sub(head.chars().count());
        let _ = writeln!(o, "{head}{}", clip_end(&name, room));
    }
    if r.other_operators > 0 {
        let _ = writeln!(o, "  … {} more (use --top or --json)", r.other_operators);
    }
    would_add(&mut o, &r.snapshot_would_add);
    super::layout::fit(o)
}

/// `memlens report TRACE`: a self-contained HTML page with the timeline of
/// allocated memory (an inline SVG), the peak by operator and what a snapshot
/// would add. Smaller than the snapshot report: a trace has no stacks,
/// segments or categories to show.
pub fn html(s: &TraceSummary, p: &TracePeak, name: &str) -> String {
    let mut o = String::new();
    let title = format!("memlens: {}", escape(name));
    let _ = write!(
        o,
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <meta name=\"generator\" content=\"memlens\"><title>{title}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:60em}}\
         pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}svg{{background:#fbfbfb}}</style>\
         </head><body><h1>{title}</h1>"
    );
    let peak = p.peak_allocated_bytes.max(1) as f64;
    let end = s.timeline.last().map_or(1.0, |t| t.0.max(1.0));
    let (w, h) = (900.0, 240.0);
    let points: Vec<String> = s
        .timeline
        .iter()
        .map(|(t, b)| {
            format!(
                "{:.1},{:.1}",
                t / end * w,
                h - (*b as f64 / peak) * (h - 10.0)
            )
        })
        .collect();
    let _ = write!(
        o,
        "<h2>Allocated memory over the trace (peak {})</h2>\
         <svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\
         <polyline fill=\"none\" stroke=\"#36c\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        format_bytes(p.peak_allocated_bytes),
        points.join(" ")
    );
    let _ = writeln!(
        o,
        "<h2>Summary</h2><pre>{}</pre><h2>Peak</h2><pre>{}</pre></body></html>",
        escape(&summary_text(s, name)),
        escape(&peak_text(p))
    );
    o
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
