//! A session of questions about snapshots, for a long-lived server such as
//! `memlens mcp`: each snapshot is read once and kept analysed, each answer
//! is computed once, every path must lie under the directories the session
//! was opened with, and answers come a page at a time with their stacks cut
//! short, so that a coding agent's small context holds them.
//!
//! Every answer is the `memlens/1` document the command line prints for the
//! same question (`memlens peak --json`, `memlens leaks --json`, ...), with
//! its main list paged and one more key, `answer`, that says how it was cut
//! and how to ask for the rest.

pub mod page;

use crate::analysis::peak::AnalysedSet;
use crate::doctor::DoctorOptions;
use crate::oom::OomOptions;
use crate::render::documents;
use crate::snapshot::Snapshot;
use crate::source::{RunEvidence, SourceFinder};
use crate::{Error, Result};
pub use page::Window;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Snapshots kept open at once; the least recently asked about is dropped
/// (and read again if asked about later) past this.
const MAX_OPEN: usize = 8;

/// A question, as the commands of the same names take it. Paths are as the
/// asker wrote them (relative ones are under the session's first root).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum Question {
    /// `memlens summary SNAP`.
    Summary {
        /// The snapshot.
        snapshot: String,
    },
    /// `memlens peak SNAP [--by module]`.
    Peak {
        /// The snapshot.
        snapshot: String,
        /// Group by module instead of by site.
        by_module: bool,
    },
    /// `memlens leaks SNAP...`.
    Leaks {
        /// One snapshot, or several of one run (or of several processes).
        snapshots: Vec<String>,
    },
    /// `memlens oom SNAP`.
    Oom {
        /// A snapshot whose trace holds the OOM.
        snapshot: String,
        /// The GPU's total memory.
        device_memory: Option<u64>,
        /// The failing step's batch size.
        batch: Option<u64>,
        /// The run's optimizer, as `--optimizer`.
        optimizer: Option<crate::oom::FirstStepOptimizer>,
        /// The `OutOfMemoryError` text of the same failure (the device's
        /// total and the cap), as `--message`.
        message: Option<String>,
    },
    /// `memlens fit PROBE PROBE --recorded-batch A,B` or `memlens fit REC
    /// --checkpoint MODULE`.
    Fit {
        /// The probes: snapshots of the run at two batch sizes (one
        /// recording with `checkpoint`).
        probes: Vec<String>,
        /// Their batch sizes, in order.
        recorded_batch: Vec<u32>,
        /// The module to checkpoint.
        checkpoint: Option<String>,
        /// The batch size to predict.
        batch: Option<u32>,
        /// Bytes the allocator may reserve.
        limit: Option<u64>,
        /// Allocator settings (`PYTORCH_CUDA_ALLOC_CONF` syntax).
        config: Option<String>,
    },
    /// `memlens diff A B`.
    Diff {
        /// The earlier snapshot.
        a: String,
        /// The later one.
        b: String,
    },
    /// The ranks of `memlens doctor RANK...`: each rank's peak and the
    /// imbalance findings.
    Ranks {
        /// The ranks' snapshots.
        snapshots: Vec<String>,
    },
    /// `memlens state SNAP --event N`.
    State {
        /// The snapshot.
        snapshot: String,
        /// The event index.
        event: usize,
        /// The device (default: the first with a trace).
        device: Option<u32>,
    },
    /// `memlens doctor SNAP... --no-report`.
    Doctor {
        /// The snapshots.
        snapshots: Vec<String>,
        /// The GPU's total memory.
        device_memory: Option<u64>,
    },
}

impl Question {
    /// The snapshot paths the question reads, in order.
    pub fn paths(&self) -> Vec<&str> {
        match self {
            Question::Summary { snapshot }
            | Question::Peak { snapshot, .. }
            | Question::Oom { snapshot, .. }
            | Question::State { snapshot, .. } => vec![snapshot],
            Question::Leaks { snapshots }
            | Question::Ranks { snapshots }
            | Question::Doctor { snapshots, .. } => snapshots.iter().map(String::as_str).collect(),
            Question::Fit { probes, .. } => probes.iter().map(String::as_str).collect(),
            Question::Diff { a, b } => vec![a, b],
        }
    }

    /// The tool's name (the command's).
    pub fn tool(&self) -> &'static str {
        match self {
            Question::Summary { .. } => "summary",
            Question::Peak { .. } => "peak",
            Question::Leaks { .. } => "leaks",
            Question::Oom { .. } => "oom",
            Question::Fit { .. } => "fit",
            Question::Diff { .. } => "diff",
            Question::Ranks { .. } => "ranks",
            Question::State { .. } => "state",
            Question::Doctor { .. } => "doctor",
        }
    }

    /// The lists an answer pages through, in the document's keys.
    fn paged_lists(&self) -> &'static [&'static str] {
        match self {
            Question::Summary { .. } => &[],
            Question::Peak {
                by_module: false, ..
            } => &["live_at_peak"],
            Question::Peak {
                by_module: true, ..
            } => &["groups"],
            Question::Leaks { .. } => &["leaks"],
            Question::Oom { .. } => &["live_at_oom"],
            Question::Fit { .. } => &["changes"],
            Question::Diff { .. } => &["grown", "shrunk"],
            Question::Ranks { .. } => &["ranks"],
            Question::State { .. } => &["live"],
            Question::Doctor { .. } => &["findings"],
        }
    }
}

self_cell::self_cell!(
    /// A snapshot with its analysis, built the first time a question needs it.
    struct Analysed {
        owner: Snapshot,
        #[not_covariant]
        dependent: AnalysedSet,
    }
);

/// What identifies a version of a file: a changed file is read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
struct FileVersion {
    len: u64,
    #[serde(skip)]
    modified: Option<SystemTime>,
}

/// One snapshot read, kept for the session.
struct Opened {
    version: FileVersion,
    last_asked: u64,
    analysed: Arc<Analysed>,
}

/// The session: the roots, the snapshots opened and the answers given.
pub struct Session {
    roots: Vec<PathBuf>,
    opened: Mutex<HashMap<PathBuf, Opened>>,
    answers: Mutex<HashMap<String, Arc<Value>>>,
    reads: AtomicU64,
    asked: AtomicU64,
}

impl Session {
    /// A session that reads only files under `roots` (each must be a
    /// readable folder).
    pub fn new(roots: &[PathBuf]) -> Result<Session> {
        let roots = roots
            .iter()
            .map(|r| {
                let c = r.canonicalize().map_err(|error| Error::Io {
                    path: r.clone(),
                    error,
                })?;
                if c.is_dir() {
                    Ok(c)
                } else {
                    Err(Error::usage(format!("{}: not a folder", r.display())))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        if roots.is_empty() {
            return Err(Error::usage("a session needs at least one root folder"));
        }
        Ok(Session {
            roots,
            opened: Mutex::new(HashMap::new()),
            answers: Mutex::new(HashMap::new()),
            reads: AtomicU64::new(0),
            asked: AtomicU64::new(0),
        })
    }

    /// The folders the session reads from.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Snapshot files read so far (a file read again after it changed, or
    /// after it was dropped to make room, counts again).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Answers `q`: the document of the matching command, the window `w` of
    /// its main list, and the `answer` key that says what was cut.
    pub fn answer(&self, q: &Question, w: &Window) -> Result<Value> {
        let snaps = q
            .paths()
            .into_iter()
            .map(|p| self.open(p).map(|(a, v)| (p.to_string(), a, v)))
            .collect::<Result<Vec<_>>>()?;
        let versions: Vec<FileVersion> = snaps.iter().map(|(_, _, v)| *v).collect();
        let key = format!(
            "{}|{:?}",
            serde_json::to_string(q).unwrap_or_default(),
            versions
        );
        let cached = lock(&self.answers).get(&key).cloned();
        let doc = match cached {
            Some(doc) => doc,
            None => {
                let named: Vec<(String, Arc<Analysed>)> =
                    snaps.into_iter().map(|(n, a, _)| (n, a)).collect();
                let doc = Arc::new(document(q, &named)?);
                lock(&self.answers).insert(key, Arc::clone(&doc));
                doc
            }
        };
        let mut out = page::window(&doc, q.paged_lists(), w)?;
        if q.tool() == "doctor" && !w.full {
            page::omit(&mut out, "diagnosis");
        }
        page::note(&mut out, "tool", q.tool().into());
        page::note(&mut out, "snapshot_reads", self.reads().into());
        Ok(out)
    }

    /// The snapshot at `given` (read now unless already open and unchanged).
    fn open(&self, given: &str) -> Result<(Arc<Analysed>, FileVersion)> {
        let path = self.confine(given)?;
        let meta = std::fs::metadata(&path).map_err(|error| Error::Io {
            path: path.clone(),
            error,
        })?;
        let version = FileVersion {
            len: meta.len(),
            modified: meta.modified().ok(),
        };
        let asked = self.asked.fetch_add(1, Ordering::Relaxed);
        // Held while reading: two questions about one new file read it once.
        let mut opened = lock(&self.opened);
        if let Some(o) = opened.get_mut(&path).filter(|o| o.version == version) {
            o.last_asked = asked;
            return Ok((Arc::clone(&o.analysed), version));
        }
        let read = crate::replay::during_read::load(&path)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let name = given.to_string();
        let analysed = Arc::new(Analysed::new(read.snap, |snap| {
            AnalysedSet::with_passes(&[(name, snap)], vec![read.pass])
        }));
        if opened.len() >= MAX_OPEN && !opened.contains_key(&path) {
            let oldest = opened
                .iter()
                .min_by_key(|(_, o)| o.last_asked)
                .map(|(p, _)| p.clone());
            if let Some(p) = oldest {
                opened.remove(&p);
            }
        }
        opened.insert(
            path,
            Opened {
                version,
                last_asked: asked,
                analysed: Arc::clone(&analysed),
            },
        );
        Ok((analysed, version))
    }

    /// `given` made absolute (relative to the first root) with its links
    /// resolved, if it lies under a root; else an error saying where the
    /// session may read.
    fn confine(&self, given: &str) -> Result<PathBuf> {
        let p = Path::new(given);
        let joined = if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.roots[0].join(p)
        };
        let real = joined.canonicalize().map_err(|error| Error::Io {
            path: joined.clone(),
            error,
        })?;
        if self.roots.iter().any(|r| real.starts_with(r)) {
            Ok(real)
        } else {
            let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
            Err(Error::usage(format!(
                "{given}: outside the folders this server may read ({})",
                roots.join(", ")
            )))
        }
    }
}

/// The mutex's value; a panic in another question does not poison the session.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `memlens/1` document of `q` over the snapshots `named` (in the
/// question's order), as the command line builds it.
fn document(q: &Question, named: &[(String, Arc<Analysed>)]) -> Result<Value> {
    if !matches!(q, Question::Fit { .. }) {
        for (name, a) in named {
            a.borrow_owner().refuse_fake_trace(name)?;
        }
    }
    match (q, named) {
        (Question::Summary { .. }, [(_, one)]) => {
            to_doc(&crate::analysis::summary::summarize(one.borrow_owner()))
        }
        (Question::Peak { by_module, .. }, [(_, one)]) => one.with_dependent(|snap, set| {
            let an = set.get(snap).ok_or_else(not_in_set)?;
            if *by_module {
                let finder = SourceFinder::with_env(Vec::new());
                to_doc(&crate::analysis::modules::modules_at_peak(an, &finder))
            } else {
                to_doc(&crate::analysis::peak::peak_analysed(an, usize::MAX))
            }
        }),
        (Question::State { event, device, .. }, [(name, one)]) => {
            one.with_dependent(|snap, set| {
                let an = set.get(snap).ok_or_else(not_in_set)?;
                let s = crate::analysis::state::state_at_event(an, *device, *event, usize::MAX)
                    .map_err(|e| Error::usage(format!("{name}: {e}")))?;
                to_doc(&s)
            })
        }
        (
            Question::Oom {
                device_memory,
                batch,
                optimizer,
                message,
                ..
            },
            [(name, one)],
        ) => one.with_dependent(|snap, set| {
            let an = set.get(snap).ok_or_else(not_in_set)?;
            let message = message
                .as_deref()
                .map(crate::oom::message::find)
                .transpose()
                .map_err(|e| Error::usage(format!("message: {e}")))?;
            let opts = OomOptions {
                message,
                device_memory: *device_memory,
                batch: *batch,
                top: usize::MAX,
                recorded: Vec::new(),
                optimizer: *optimizer,
            };
            to_doc(&documents::oom_doc_analysed(an, name, &opts)?)
        }),
        (Question::Doctor { device_memory, .. }, [(name, one)]) => {
            one.with_dependent(|snap, set| {
                let snaps = [(name.clone(), snap)];
                to_doc(&documents::doctor_doc_in(
                    set,
                    &snaps,
                    &doctor_options(*device_memory),
                    None,
                )?)
            })
        }
        (Question::Leaks { .. }, [(name, one)]) => one.with_dependent(|snap, set| {
            let an = set.get(snap).ok_or_else(not_in_set)?;
            let snaps = [(name.clone(), snap)];
            let mut report = crate::analysis::leaks::find_analysed(&snaps, an);
            report.annotate(
                &SourceFinder::with_env(Vec::new()),
                &RunEvidence::of(&snaps),
            );
            to_doc(&report)
        }),
        _ => many_document(q, named),
    }
}

/// [`document`] of the questions over several snapshots: their analyses are
/// built afresh over the snapshots kept open (the answer is kept).
fn many_document(q: &Question, named: &[(String, Arc<Analysed>)]) -> Result<Value> {
    let snaps: Vec<(String, &Snapshot)> = named
        .iter()
        .map(|(n, a)| (n.clone(), a.borrow_owner()))
        .collect();
    match q {
        Question::Leaks { .. } => {
            let mut report = crate::analysis::leaks::find_per_process(&snaps);
            report.annotate(
                &SourceFinder::with_env(Vec::new()),
                &RunEvidence::of(&snaps),
            );
            to_doc(&report)
        }
        Question::Diff { .. } => match snaps.as_slice() {
            [(_, a), (_, b)] => to_doc(&crate::analysis::diff::diff(a, b)),
            _ => Err(Error::usage("diff compares two snapshots")),
        },
        Question::Fit {
            recorded_batch,
            checkpoint,
            batch,
            limit,
            config,
            ..
        } => fit_document(
            &snaps,
            recorded_batch,
            checkpoint.as_deref(),
            *batch,
            *limit,
            config.as_deref(),
        ),
        Question::Ranks { .. } => {
            let doc = documents::doctor_doc(&snaps, &doctor_options(None), None)?;
            let imbalance: Vec<&crate::doctor::Finding> = doc
                .findings
                .iter()
                .filter(|f| f.kind == "imbalance")
                .collect();
            to_doc(&serde_json::json!({ "ranks": doc.ranks, "findings": imbalance }))
        }
        Question::Doctor { device_memory, .. } => to_doc(&documents::doctor_doc(
            &snaps,
            &doctor_options(*device_memory),
            None,
        )?),
        _ => Err(Error::usage(format!(
            "{} takes one snapshot ({} given)",
            q.tool(),
            snaps.len()
        ))),
    }
}

/// `memlens fit`'s document over the recordings `snaps`.
fn fit_document(
    snaps: &[(String, &Snapshot)],
    recorded_batch: &[u32],
    checkpoint: Option<&str>,
    batch: Option<u32>,
    limit: Option<u64>,
    config: Option<&str>,
) -> Result<Value> {
    let config = config
        .map(crate::sim::AllocatorConfig::parse)
        .transpose()
        .map_err(|e| Error::usage(format!("config: {e}")))?;
    let opts = crate::fit::FitOptions {
        batch,
        limit,
        config,
        least_limit: false,
    };
    let recordings: Vec<(&str, &Snapshot)> = snaps.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    to_doc(&crate::fit::answer(
        &recordings,
        recorded_batch,
        checkpoint,
        &opts,
    )?)
}

fn doctor_options(device_memory: Option<u64>) -> DoctorOptions {
    DoctorOptions {
        device_memory,
        ..DoctorOptions::default()
    }
}

fn not_in_set() -> Error {
    Error::usage("internal: the snapshot is not in its own analysed set")
}

/// `body` as its `memlens/1` document.
fn to_doc<T: Serialize>(body: &T) -> Result<Value> {
    crate::render::json_value(body)
}
