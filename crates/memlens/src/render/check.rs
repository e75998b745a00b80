//! The text of `memlens check`: one line, `ok` or `FAILED` with the limits broken.

use super::layout::push_wrapped;
use crate::analysis::check::CheckResult;
use crate::units::format_bytes;

/// `ok: ...` or `FAILED: ...`.
pub fn text(r: &CheckResult) -> String {
    let mut o = String::new();
    if r.ok {
        o.push_str(&format!(
            "ok: peak allocated {}, peak reserved {}\n",
            format_bytes(r.peak_allocated_bytes),
            format_bytes(r.peak_reserved_bytes)
        ));
    } else {
        push_wrapped(&mut o, "FAILED: ", "        ", &r.failures.join("; "));
    }
    if let Some(p) = &r.partial {
        push_wrapped(&mut o, "note: ", "      ", p);
    }
    super::layout::fit(o)
}
