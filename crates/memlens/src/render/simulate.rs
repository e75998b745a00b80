//! The text of `memlens simulate`: a what-if run beside the recorded one.

use super::documents::SimulateDoc;
use super::layout::{clip, push_wrapped};
use crate::units::format_bytes;
use std::fmt::Write;

fn show(config: &str) -> &str {
    if config.is_empty() {
        "the default settings"
    } else {
        config
    }
}

fn change(new: u64, old: u64) -> String {
    if old == 0 {
        return String::new();
    }
    let pct = 100.0 * (new as f64 - old as f64) / old as f64;
    format!(" (recorded {}, {pct:+.1}%)", format_bytes(old))
}

/// The simulated figures beside the recorded ones, then the first OOM.
pub fn text(d: &SimulateDoc) -> String {
    let r = &d.result;
    let mut o = String::new();
    let _ = writeln!(o, "{}", d.snapshot);
    let _ = writeln!(
        o,
        "  simulated under {} (recorded under {}), {} events",
        show(&r.config),
        show(&d.recorded.config),
        r.events
    );
    super::limits_text(&mut o, &d.limits);
    if let Some(cap) = r.capacity_bytes {
        let _ = writeln!(
            o,
            "  device capacity for PyTorch: {} ({} overhead)",
            format_bytes(cap),
            format_bytes(r.overhead_bytes.unwrap_or(0))
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "  peak reserved   {:>12}{}",
        format_bytes(r.peak_reserved_bytes),
        change(r.peak_reserved_bytes, d.recorded.peak_reserved_bytes)
    );
    let _ = writeln!(
        o,
        "  peak allocated  {:>12}{}",
        format_bytes(r.peak_allocated_bytes),
        change(r.peak_allocated_bytes, d.recorded.peak_allocated_bytes)
    );
    let _ = writeln!(
        o,
        "  at the peak: {:.1}% of reserved memory not allocated, {} in free pieces of split segments",
        100.0 * r.fragmentation_at_peak,
        format_bytes(r.inactive_split_bytes_at_peak)
    );
    let _ = writeln!(
        o,
        "  segments made {} (cudaMalloc or mapping), freed {}, cache flushes and retries {}, OOMs {}",
        r.num_device_alloc, r.num_device_free, r.num_alloc_retries, r.num_ooms
    );
    if r.workspaces_given_up > 0 {
        let _ = writeln!(
            o,
            "  cuDNN convolution workspaces given up {} (not OOMs: PyTorch ran those convolutions with \
             another algorithm)",
            r.workspaces_given_up
        );
    }
    if r.empty_cache_calls > 0 {
        let _ = writeln!(o, "  empty_cache() calls replayed: {}", r.empty_cache_calls);
    }
    match (&r.first_oom, &d.first_oom_site) {
        (Some(oom), site) => {
            let _ = writeln!(
                o,
                "\n  first OOM at event #{}: {} requested{}, {} reserved and {} allocated then",
                oom.event_index,
                format_bytes(oom.requested_bytes),
                site.as_ref()
                    .map(|s| format!(" at {}", clip(&s.site, 40)))
                    .unwrap_or_default(),
                format_bytes(oom.reserved_bytes),
                format_bytes(oom.allocated_bytes)
            );
        }
        (None, _) if r.capacity_bytes.is_some() => {
            let _ = writeln!(o, "\n  no OOM: the run fits");
        }
        _ => {}
    }
    for w in &r.warnings {
        push_wrapped(&mut o, "  note: ", "        ", w);
    }
    super::layout::fit(o)
}
