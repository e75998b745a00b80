//! The text of `memlens doctor`: the verdict first, the detail with `-v`.

use super::layout::{clip, push_wrapped, MAX_WIDTH};
use crate::doctor::{Diagnosis, Severity};
use std::fmt::Write;

/// The verdict, then (with `verbose`) the detail.
pub fn text(d: &Diagnosis, names: &[&str], verbose: bool) -> String {
    let mut o = String::new();
    push_wrapped(&mut o, "memlens doctor: ", "  ", &names.join(", "));
    let serious: Vec<_> = d
        .findings
        .iter()
        .filter(|f| f.severity > Severity::Info)
        .collect();
    let _ = writeln!(
        o,
        "\n{}",
        match serious.len() {
            0 => "Verdict: no leak, no OOM, no fragmentation worth fixing.".to_string(),
            1 => "Verdict: 1 problem.".to_string(),
            n => format!("Verdict: {n} problems."),
        }
    );
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
        o.push_str(&super::summary::text(
            &d.summary,
            names.last().copied().unwrap_or(""),
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
