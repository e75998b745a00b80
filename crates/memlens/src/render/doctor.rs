//! The text of `memlens doctor`: the verdict first, the detail with `-v`.

use super::layout::{clip, push_wrapped, MAX_WIDTH};
use crate::analysis::ranks::RanksReport;
use crate::doctor::{Diagnosis, Severity};
use crate::units::{format_bytes, group_digits};
use std::fmt::Write;

/// The verdict, then (with `verbose`) the detail.
pub fn text(d: &Diagnosis, names: &[&str], verbose: bool) -> String {
    let mut o = String::new();
    push_wrapped(&mut o, "memlens doctor: ", "  ", &names.join(", "));
    if let Some(inputs) = &d.inputs {
        push_wrapped(&mut o, "Inputs: ", "  ", &inputs.reason);
    }
    if d.inputs.as_ref().is_some_and(|i| i.kind == "runs") {
        // Unrelated runs: each its own verdict.
        let _ = writeln!(o, "\n{}", d.verdict());
        for p in &d.parts {
            let _ = writeln!(o, "\n=== {} ===", p.label);
            let files: Vec<&str> = p.files.iter().map(String::as_str).collect();
            o.push_str(&text(&p.diagnosis, &files, verbose));
        }
        return super::layout::fit(o);
    }
    if let Some(r) = &d.ranks {
        o.push_str(&ranks_table(r));
    }
    let _ = writeln!(o, "\n{}", d.verdict());
    for (i, f) in d.findings.iter().enumerate() {
        if i >= 4 && !verbose {
            break;
        }
        let mark = match f.severity {
            Severity::Critical => "!!",
            Severity::Warning => "! ",
            Severity::Info => "  ",
        };
        let _ = writeln!(o);
        push_wrapped(&mut o, &format!("{mark} "), "   ", &f.title);
        if let Some(fix) = &f.suggestion {
            push_wrapped(&mut o, "   fix: ", "        ", fix);
        }
        o.push_str(&f.quote.render("   "));
        if verbose {
            for e in &f.evidence {
                push_wrapped(&mut o, "   ", "     ", e);
            }
            for line in f.stack.iter().take(8) {
                let _ = writeln!(o, "     at {}", clip(line, MAX_WIDTH - 8));
            }
        }
    }
    if verbose {
        let _ = writeln!(o, "\n--- summary ---");
        // The file the summary describes: of several ranks or runs, the
        // one the fields above were taken from (not the last one named).
        let described = d.files.last().map(String::as_str);
        o.push_str(&super::summary::text(
            &d.summary,
            described.or(names.last().copied()).unwrap_or(""),
        ));
        let _ = writeln!(o, "\n--- peak ---");
        o.push_str(&super::peak::text(&d.peak));
        let _ = writeln!(o, "\n--- leaks ---");
        o.push_str(&super::leaks::text(&d.leaks));
        if let Some(oom) = &d.oom {
            let _ = writeln!(o, "\n--- oom ---");
            o.push_str(&super::oom::text(oom));
        }
    } else {
        let _ = writeln!(
            o,
            "\n(-v for the evidence, the stacks and the full summary)"
        );
    }
    super::layout::fit(o)
}

/// The ranks side by side: exact peaks (bytes), headroom, the rank closest
/// to an OOM.
fn ranks_table(r: &RanksReport) -> String {
    let mut o = String::from("\nRanks (peak allocated and reserved, exact bytes):\n");
    for row in &r.ranks {
        let headroom = match row.headroom_bytes {
            Some(h) => format!("  headroom {}", format_bytes(h)),
            None => String::new(),
        };
        let mark = if row.oom {
            "  <- ran out of memory"
        } else if r.closest_to_oom == Some(row.rank) && r.ranks.len() > 1 {
            "  <- closest to OOM"
        } else {
            ""
        };
        let file = row.file.rsplit(['/', '\\']).next().unwrap_or(&row.file);
        let _ = writeln!(
            o,
            "  rank {:<3} {} ({} B), reserved {} ({} B){headroom}  {}{mark}",
            row.rank,
            format_bytes(row.peak_allocated_bytes),
            group_digits(row.peak_allocated_bytes),
            format_bytes(row.peak_reserved_bytes),
            group_digits(row.peak_reserved_bytes),
            clip(file, 40),
        );
    }
    if r.device_memory.is_none() {
        o.push_str("  (headroom: pass --device-memory, e.g. H100-80GB)\n");
    }
    o
}
