//! The table of analyses Python can call. Each entry runs one library analysis
//! and returns the JSON document the CLI prints for it with `--json`
//! (`"schema": "memlens/1"` plus the serde form of the library's result).
//!
//! To bind a new analysis, add one line to [`ANALYSES`]; the Python method of
//! the same name (`memlens.Snapshot.<name>`) starts working.

use crate::options::Options;
use memlens::{analysis, Error, Result, Snapshot};
use serde::Serialize;

/// A snapshot handed to an analysis, with the name it was loaded under (its
/// path: `leaks` reads the step number from names like `snapshot.step40.pickle`).
#[derive(Clone, Copy)]
pub struct Input<'a> {
    /// The file it came from, or `<memory>`.
    pub name: &'a str,
    /// The snapshot.
    pub snap: &'a Snapshot,
}

/// One analysis: its name (as in `memlens NAME`) and how to run it on the
/// snapshots given (the receiver first, then any others).
pub struct Analysis {
    /// The subcommand name, also the Python method name.
    pub name: &'static str,
    /// Runs the analysis and returns the JSON document.
    pub run: fn(&[Input<'_>], &Options) -> Result<String>,
}

/// The CLI's default for `peak --top` (and `check`, which lists 5).
const PEAK_TOP: usize = 15;

/// Every analysis this build binds: one line each. The options read here are
/// the keyword arguments of the Python method; defaults are the CLI's.
pub static ANALYSES: &[Analysis] = &[
    Analysis {
        name: "summary",
        run: |s, _| doc(&analysis::summary::summarize(one(s)?)),
    },
    Analysis {
        name: "peak",
        run: |s, o| {
            doc(&analysis::peak::peak(
                one(s)?,
                o.count("top")?.unwrap_or(PEAK_TOP),
            ))
        },
    },
    Analysis {
        name: "diff",
        run: |s, _| match s {
            [a, b] => doc(&analysis::diff::diff(a.snap, b.snap)),
            _ => Err(Error::usage("diff takes two snapshots")),
        },
    },
    Analysis {
        name: "leaks",
        run: |s, _| {
            let named: Vec<(String, &Snapshot)> =
                s.iter().map(|i| (i.name.to_string(), i.snap)).collect();
            doc(&analysis::leaks::find(&named))
        },
    },
    Analysis {
        name: "check",
        run: |s, o| {
            let (max_peak, max_reserved) = (o.size("max_peak")?, o.size("max_reserved")?);
            if max_peak.is_none() && max_reserved.is_none() {
                return Err(Error::usage("give max_peak and/or max_reserved"));
            }
            let peak = analysis::peak::peak(one(s)?, 5);
            doc(&analysis::check::check(&peak, max_peak, max_reserved))
        },
    },
    Analysis {
        name: "oom",
        run: |s, o| {
            let snap = one(s)?;
            let mut opts = memlens::oom::OomOptions {
                device_memory: device_memory(o)?,
                ..Default::default()
            };
            if let Some(m) = o.string("message")? {
                opts.message = Some(memlens::oom::message::find(&m)?);
            }
            match memlens::oom::analyze_snapshot(snap, &opts)? {
                Some(r) => doc(&r),
                // Not an error: a snapshot without an OOM has nothing to explain.
                None => doc(&serde_json::json!({
                    "cause": null,
                    "fixes": [],
                    "explanation": "the snapshot holds no OOM (no `oom` event in its trace)"
                })),
            }
        },
    },
    Analysis {
        name: "simulate",
        run: |s, o| {
            let snap = one(s)?;
            let opts = what_if(snap, o)?;
            doc(&memlens::replay::simulate::simulate(
                snap,
                snap.first_traced_device(),
                &opts,
            )?)
        },
    },
    Analysis {
        name: "tune",
        run: |s, o| {
            let snap = one(s)?;
            let opts = what_if(snap, o)?;
            doc(&memlens::replay::tune::tune(
                snap,
                snap.first_traced_device(),
                &opts,
            )?)
        },
    },
    Analysis {
        name: "doctor",
        run: |s, o| {
            let named: Vec<(String, &Snapshot)> =
                s.iter().map(|i| (i.name.to_string(), i.snap)).collect();
            let opts = memlens::doctor::DoctorOptions {
                device_memory: device_memory(o)?,
            };
            let d = memlens::doctor::diagnose(&named, &opts);
            let report = match o.string("path")? {
                Some(p) => Some(write_report(&named, &d, &p)?),
                None => None,
            };
            doc(&serde_json::json!({ "findings": d.findings, "report": report, "diagnosis": d }))
        },
    },
    Analysis {
        name: "report",
        run: |s, o| {
            let named: Vec<(String, &Snapshot)> =
                s.iter().map(|i| (i.name.to_string(), i.snap)).collect();
            let path = o
                .string("path")?
                .ok_or_else(|| Error::usage("report needs a path"))?;
            let d = memlens::doctor::diagnose(&named, &Default::default());
            doc(&serde_json::json!({ "report": write_report(&named, &d, &path)? }))
        },
    },
];

/// `device_memory` given as bytes, a size (`"80GiB"`) or a GPU name (`"H100-80GB"`).
fn device_memory(o: &Options) -> Result<Option<u64>> {
    match o.string("device_memory") {
        Ok(Some(text)) => memlens::units::parse_device_memory(&text).map(Some),
        _ => o.size("device_memory"),
    }
}

/// Options of a what-if run: `config` (default: the recorded settings) and the device.
fn what_if(snap: &Snapshot, o: &Options) -> Result<memlens::replay::simulate::SimulateOptions> {
    let config = match o.string("config")? {
        Some(c) => memlens::sim::AllocatorConfig::parse(&c)?,
        None => memlens::replay::config::recorded_config(&snap.settings),
    };
    Ok(memlens::replay::simulate::SimulateOptions {
        config,
        device_memory: device_memory(o)?,
        overhead: None,
        allowed_memory_maximum: None,
    })
}

/// Writes the HTML report of a diagnosis to `path` and returns the path.
fn write_report(
    named: &[(String, &Snapshot)],
    d: &memlens::doctor::Diagnosis,
    path: &str,
) -> Result<String> {
    memlens::report::write_report(named, d, std::path::Path::new(path))?;
    Ok(path.to_string())
}

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
fn one<'a>(snaps: &[Input<'a>]) -> Result<&'a Snapshot> {
    match snaps {
        [s] => Ok(s.snap),
        _ => Err(Error::usage(format!(
            "this analysis takes one snapshot, got {}",
            snaps.len()
        ))),
    }
}
