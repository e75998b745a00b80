//! `memlens summary`: the allocator state at dump time.

use crate::output;
use memlens::analysis::summary::{summarize, Summary};
use memlens::units::format_bytes;
use std::fmt::Write;
use std::path::PathBuf;

/// Arguments of `memlens summary`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The snapshot (.pickle, .pickle.gz, .pickle.zst or JSON).
    pub snapshot: PathBuf,
    /// Print the JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens summary`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    let s = summarize(&snap);
    if args.json {
        output::print_json(&s)?;
    } else {
        output::print_text(&render(&s, &args.snapshot.display().to_string()))?;
    }
    Ok(output::OK)
}

/// The terminal table.
pub fn render(s: &Summary, name: &str) -> String {
    let mut o = String::new();
    let pct = |a: u64| {
        if s.reserved_bytes == 0 {
            0.0
        } else {
            100.0 * a as f64 / s.reserved_bytes as f64
        }
    };
    let _ = writeln!(o, "{name}");
    let _ = writeln!(
        o,
        "  devices {:?}, {} segments{}, {} blocks ({} allocated, {} free, {} pending free)",
        s.devices,
        s.segments,
        if s.expandable_ranges > 0 {
            format!(" + {} expandable ranges", s.expandable_ranges)
        } else {
            String::new()
        },
        s.blocks,
        s.allocated_blocks,
        s.inactive_blocks,
        s.pending_free_blocks
    );
    let _ = writeln!(o);
    let rows = [
        ("reserved", s.reserved_bytes),
        ("allocated", s.allocated_bytes),
        ("active", s.active_bytes),
        ("requested", s.requested_bytes),
        ("free in segments", s.external_fragmentation_bytes),
        ("non-releasable (inactive split)", s.inactive_split_bytes),
        ("rounding waste", s.internal_fragmentation_bytes),
        ("largest free block", s.largest_free_block_bytes),
    ];
    for (label, v) in rows {
        let _ = writeln!(o, "  {label:<32} {:>12}  {:>5.1}%", format_bytes(v), pct(v));
    }
    if !s.pools.is_empty() {
        let _ = writeln!(
            o,
            "\n  free memory by pool (the biggest request each can serve now):"
        );
        for p in s.pools.iter().take(8) {
            let pool = format!("{:?}", p.pool).to_lowercase();
            let _ = writeln!(
                o,
                "    device {} {pool:<5} stream {:<14} reserved {:>11}  free {:>11} in {:>4} blocks  largest {:>11}",
                p.device,
                p.stream,
                format_bytes(p.reserved_bytes),
                format_bytes(p.free_bytes),
                p.free_blocks,
                format_bytes(p.largest_free_block_bytes)
            );
        }
        if s.pools.len() > 8 {
            let _ = writeln!(o, "    … {} more pools (see --json)", s.pools.len() - 8);
        }
    }
    let _ = writeln!(o);
    let actions: Vec<String> = s
        .trace_events_by_action
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(
        o,
        "  trace: {} events{}",
        s.trace_events,
        if actions.is_empty() {
            String::new()
        } else {
            format!(" ({})", actions.join(", "))
        }
    );
    let st = &s.allocator_settings;
    if st.present {
        let conf = if st.alloc_conf.is_empty() {
            "(default)"
        } else {
            st.alloc_conf.as_str()
        };
        let _ = writeln!(
            o,
            "  allocator: PYTORCH_CUDA_ALLOC_CONF={conf}; expandable_segments {}, max_split_size {}",
            st.expandable_segments,
            st.max_split_size.map_or("unlimited".to_string(), format_bytes)
        );
    }
    for w in &s.warnings {
        let _ = writeln!(o, "  warning: {w}");
    }
    o
}
