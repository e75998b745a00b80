//! The table of analyses Python can call. Each entry runs one library analysis
//! and returns the JSON document the CLI prints for it with `--json`: both are
//! built by the library (`memlens::render`), so they are the same document.
//!
//! To bind a new analysis, add one line to [`ANALYSES`]; the Python method of
//! the same name (`memlens.Snapshot.<name>`) starts working.

use crate::options::Options;
use memlens::{analysis, render, Error, Result, Snapshot};
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
            let mut report = analysis::leaks::find_per_process(&named);
            // The same quotes as `memlens leaks` (roots from MEMLENS_SOURCE_ROOT).
            report.annotate(
                &memlens::source::SourceFinder::with_env(Vec::new()),
                &memlens::source::RunEvidence::of(&named),
            );
            doc(&report)
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
            if let Some(name) = o.string("optimizer")? {
                opts.optimizer = Some(memlens::oom::FirstStepOptimizer::named(&name)?);
            }
            // No OOM in the trace: the CLI's error (exit 2), here a MemlensError.
            doc(&render::documents::oom_doc(snap, s[0].name, &opts)?)
        },
    },
    Analysis {
        name: "simulate",
        run: |s, o| {
            let (input, snap) = (first(s)?, one(s)?);
            let opts = what_if(snap, o)?;
            let device = render::documents::pick_device(snap, None)?;
            doc(&render::documents::simulate_doc(
                snap, input.name, device, &opts,
            )?)
        },
    },
    Analysis {
        name: "tune",
        run: |s, o| {
            let (input, snap) = (first(s)?, one(s)?);
            let opts = what_if(snap, o)?;
            let device = render::documents::pick_device(snap, None)?;
            doc(&render::documents::tune_doc(
                snap, input.name, device, &opts,
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
                ..Default::default()
            };
            let path = o.string("path")?.map(std::path::PathBuf::from);
            doc(&render::documents::doctor_doc(
                &named,
                &opts,
                path.as_deref(),
            )?)
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
            doc(&render::documents::report_doc(
                &named,
                std::path::Path::new(&path),
            )?)
        },
    },
    Analysis {
        name: "lines",
        run: |s, o| {
            doc(&analysis::lines::lines(
                one(s)?,
                &line_options(o)?,
                &memlens::source::SourceFinder::with_env(Vec::new()),
            ))
        },
    },
    Analysis {
        name: "modules",
        run: |s, _| {
            let an = memlens::trace::Analysed::new(one(s)?);
            let finder = memlens::source::SourceFinder::with_env(Vec::new());
            doc(&analysis::modules::modules_at_peak(&an, &finder))
        },
    },
];

/// The options of `lines`: `file` (required), `function`, `scope`,
/// `first_line`, `last_line`.
pub fn line_options(o: &Options) -> Result<analysis::lines::LineOptions> {
    let file = o
        .string("file")?
        .ok_or_else(|| Error::usage("lines needs a file"))?;
    let line = |k: &str| -> Result<Option<u32>> {
        Ok(o.count(k)?.map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
    };
    Ok(analysis::lines::LineOptions {
        file,
        function: o.string("function")?,
        scope: o.string("scope")?,
        first_line: line("first_line")?,
        last_line: line("last_line")?,
    })
}

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

/// The analysis called `name`, if this build has it.
pub fn find(name: &str) -> Option<&'static Analysis> {
    ANALYSES.iter().find(|a| a.name == name)
}

/// Serialises a result as the memlens JSON document the CLI prints.
fn doc<T: Serialize>(body: &T) -> Result<String> {
    render::json(body, false)
}

/// The first snapshot given (the receiver), with its name.
fn first<'a, 'b>(snaps: &'b [Input<'a>]) -> Result<&'b Input<'a>> {
    snaps
        .first()
        .ok_or_else(|| Error::usage("this analysis takes one snapshot, got 0"))
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
