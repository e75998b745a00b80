//! Every result document memlens writes, and its text.
//!
//! The CLI and the Python binding both come here: [`json`] wraps a result in
//! the `memlens/1` envelope (written once, here), [`documents`] builds the
//! documents that are more than one analysis's result (simulate, tune, doctor,
//! report, oom), and one module per command renders the text a person reads.
//! [`layout`] holds the width rules all of them follow: no line over
//! [`layout::MAX_WIDTH`] columns, prose wrapped, series shown short.

pub mod check;
pub mod diff;
pub mod doctor;
pub mod documents;
pub mod estimate;
pub mod fit;
pub mod layout;
pub mod leaks;
pub mod lines;
pub mod modules;
pub mod oom;
pub mod peak;
pub mod profiler;
pub mod simulate;
pub mod state;
pub mod summary;
pub mod tune;

use crate::{Error, Result};
use serde::Serialize;

/// The envelope of every JSON document: the schema tag, then the result's own keys.
#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    schema: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// `body` as a JSON document tagged `"schema": "memlens/1"`, indented when
/// `pretty` (the CLI) or on one line (the Python binding); the same keys and
/// values either way.
pub fn json<T: Serialize>(body: &T, pretty: bool) -> Result<String> {
    let doc = Envelope {
        schema: crate::JSON_SCHEMA,
        body,
    };
    let text = if pretty {
        serde_json::to_string_pretty(&doc)
    } else {
        serde_json::to_string(&doc)
    };
    text.map_err(|e| Error::usage(format!("cannot serialise the result: {e}")))
}

/// [`json`]'s document as a value (for a server that pages it before
/// writing it out): the same keys and values.
pub fn json_value<T: Serialize>(body: &T) -> Result<serde_json::Value> {
    let doc = Envelope {
        schema: crate::JSON_SCHEMA,
        body,
    };
    serde_json::to_value(&doc)
        .map_err(|e| Error::usage(format!("cannot serialise the result: {e}")))
}

/// The limits a what-if run used (`simulate`, `tune`), one line each, for people.
pub(crate) fn limits_text(o: &mut String, l: &crate::replay::limits::RunLimits) {
    use crate::units::format_bytes;
    use std::fmt::Write as _;
    let rows = [
        ("memory cap", &l.memory_cap),
        ("device room", &l.device_room),
        ("device total", &l.device_total),
        ("other processes", &l.other_processes),
    ];
    if l.is_empty() {
        let _ = writeln!(
            o,
            "  limits: none known (no OOM in the trace, no flags): unlimited"
        );
        return;
    }
    for (name, v) in rows {
        if let Some(v) = v {
            let _ = writeln!(
                o,
                "  limit: {name} {} ({})",
                format_bytes(v.bytes),
                v.source
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn envelope_tags_and_flattens() {
        let body = serde_json::json!({"peak_allocated_bytes": 10});
        let one = super::json(&body, false).unwrap();
        assert_eq!(one, r#"{"schema":"memlens/1","peak_allocated_bytes":10}"#);
        let pretty: serde_json::Value =
            serde_json::from_str(&super::json(&body, true).unwrap()).unwrap();
        assert_eq!(
            pretty,
            serde_json::from_str::<serde_json::Value>(&one).unwrap()
        );
    }
}
