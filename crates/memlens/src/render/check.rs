//! The text of `memlens check`: one line, `ok` or `FAILED` with the limits broken.

use super::layout::push_wrapped;
use crate::analysis::check::CheckResult;
use crate::units::format_bytes;

/// `ok: ...` or `FAILED: ...`.
pub fn text(r: &CheckResult) -> String {
    if r.ok {
        format!(
            "ok: peak allocated {}, peak reserved {}\n",
            format_bytes(r.peak_allocated_bytes),
            format_bytes(r.peak_reserved_bytes)
        )
    } else {
        let mut o = String::new();
        push_wrapped(&mut o, "FAILED: ", "        ", &r.failures.join("; "));
        super::layout::fit(o)
    }
}
