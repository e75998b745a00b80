//! The table of analyses Python can call. Each entry runs one library analysis
//! and returns the JSON document the CLI prints for it with `--json`
//! (`"schema": "memlens/1"` plus the serde form of the library's result).
//!
//! To bind a new analysis, add one line to [`ANALYSES`]; the Python method of
//! the same name (`memlens.Snapshot.<name>`) starts working.

use crate::options::Options;
use memlens::{analysis, Error, Result, Snapshot};
use serde::Serialize;

/// One analysis: its name (as in `memlens NAME`) and how to run it on the
/// snapshots given (the receiver first, then any others).
pub struct Analysis {
    /// The subcommand name, also the Python method name.
    pub name: &'static str,
    /// Runs the analysis and returns the JSON document.
    pub run: fn(&[&Snapshot], &Options) -> Result<String>,
}

/// Every analysis this build binds.
pub static ANALYSES: &[Analysis] = &[
    // name        run: snapshots and options -> the --json document
    Analysis {
        name: "summary",
        run: |s, _| doc(&analysis::summary::summarize(one(s)?)),
    },
];

/// The analysis called `name`, if this build has it.
pub fn find(name: &str) -> Option<&'static Analysis> {
    ANALYSES.iter().find(|a| a.name == name)
}

/// The document layout the CLI's `print_json` writes: the schema tag, then the
/// result's own keys.
#[derive(Serialize)]
struct Doc<'a, T: Serialize> {
    schema: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// Serialises a result as a memlens JSON document.
fn doc<T: Serialize>(body: &T) -> Result<String> {
    serde_json::to_string(&Doc {
        schema: memlens::JSON_SCHEMA,
        body,
    })
    .map_err(|e| Error::usage(format!("cannot serialise the result: {e}")))
}

/// The one snapshot an analysis of a single snapshot works on.
fn one<'a>(snaps: &[&'a Snapshot]) -> Result<&'a Snapshot> {
    match snaps {
        [s] => Ok(s),
        _ => Err(Error::usage(format!(
            "this analysis takes one snapshot, got {}",
            snaps.len()
        ))),
    }
}
