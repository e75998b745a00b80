//! The text of `memlens tune`: the usual settings, ranked.

use super::documents::TuneDoc;
use super::layout::{clip_end, push_wrapped};
use crate::units::format_bytes;
use std::fmt::Write;

/// The ranking as a table, then the advice.
pub fn text(d: &TuneDoc) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{}", clip_end(&d.snapshot, 120));
    super::limits_text(&mut o, &d.limits);
    let _ = writeln!(
        o,
        "  {:<72} {:>12} {:>6} {:>8}",
        "PYTORCH_CUDA_ALLOC_CONF", "peak reserved", "OOMs", "retries"
    );
    for c in &d.result.candidates {
        let name = if c.config.is_empty() {
            "(defaults)".to_string()
        } else {
            c.config.clone()
        };
        let mark = if c.recorded { " <- recorded" } else { "" };
        let _ = writeln!(
            o,
            "  {:<72} {:>12} {:>6} {:>8}{mark}",
            clip_end(&name, 72),
            format_bytes(c.peak_reserved_bytes),
            c.num_ooms,
            c.num_alloc_retries
        );
    }
    let _ = writeln!(o);
    if let Some(rec) = d.result.candidates.iter().find(|c| c.recorded) {
        if d.result
            .candidates
            .iter()
            .any(|c| c.workspaces_given_up > 0)
        {
            push_wrapped(
                &mut o,
                "  ",
                "  ",
                &format!(
                    "not counted as OOMs: cuDNN convolution workspaces that could not be had, \
                     which PyTorch gives up for a slower algorithm: {} under the recorded \
                     settings{}",
                    rec.workspaces_given_up,
                    match d.result.candidates.first() {
                        Some(best) if !best.recorded => format!(
                            ", {} under {}",
                            best.workspaces_given_up,
                            if best.config.is_empty() {
                                "the defaults"
                            } else {
                                &best.config
                            }
                        ),
                        _ => String::new(),
                    }
                ),
            );
        }
    }
    push_wrapped(&mut o, "  ", "  ", &d.result.advice);
    super::layout::fit(o)
}
