//! `memlens._native`: the Python bindings of the memlens library.
//!
//! A thin layer. Every analysis is computed by the `memlens` library and comes
//! back to Python as the same JSON document the CLI prints with `--json`; the
//! Python package (`python/memlens/`) wraps it in a small result object. Adding
//! an analysis to Python is one line in `analyses::ANALYSES`.
//!
//! The GIL is released while a snapshot is parsed and while an analysis runs,
//! so other Python threads (a training loop, a data loader) keep going. A file
//! is parsed on a worker thread while the calling thread watches for Ctrl-C,
//! so a long read of a large snapshot can be interrupted.

mod analyses;
mod options;

use memlens::Snapshot;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

pyo3::create_exception!(
    memlens,
    MemlensError,
    PyException,
    "A snapshot that cannot be read, or a bad argument; the message is one line naming the file."
);

/// Runs `work` on a worker thread while this thread, without the GIL, waits
/// for it and checks for Python signals every 50 ms. On Ctrl-C it sets the
/// flag handed to `work` (which must honour it to stop early) and raises
/// `KeyboardInterrupt` at once.
fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    work: impl FnOnce(Arc<AtomicBool>) -> T + Send + 'static,
) -> PyResult<T> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // The receiver is gone only after an interrupt: nothing to deliver.
        let _ = tx.send(work(flag));
    });
    let mut rx = rx;
    loop {
        // The receiver moves into the GIL-free closure and back (it may be
        // sent to another thread, not shared with one).
        let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(50)), rx));
        rx = back;
        match got {
            Ok(done) => return Ok(done),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    cancel.store(true, Ordering::Relaxed);
                    return Err(interrupt);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(MemlensError::new_err(
                    "internal error: the reading thread stopped without a result",
                ))
            }
        }
    }
}

/// Turns a library error into `memlens.MemlensError` with the CLI's one-line message.
fn to_py_err(e: memlens::Error) -> PyErr {
    MemlensError::new_err(e.to_string().replace('\n', " "))
}

/// A parsed snapshot, kept in Rust memory. Analyses run on it without copying.
#[pyclass(frozen, name = "Snapshot", module = "memlens._native")]
struct PySnapshot {
    inner: Arc<Snapshot>,
    path: String,
}

#[pymethods]
impl PySnapshot {
    /// Reads a snapshot file (.pickle, .pickle.gz, .pickle.zst or JSON).
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let file = path.clone();
        let snap = interruptible(py, move |cancel| Snapshot::load_cancellable(&file, cancel))?
            .map_err(to_py_err)?;
        snap.refuse_fake_trace(&path.display().to_string())
            .map_err(to_py_err)?;
        Ok(PySnapshot {
            inner: Arc::new(snap),
            path: path.display().to_string(),
        })
    }

    /// Reads a snapshot from bytes (for example `pickle.dumps(torch.cuda.memory._snapshot())`);
    /// `name` stands for the file in error messages.
    #[staticmethod]
    #[pyo3(signature = (data, name = "<memory>"))]
    fn from_bytes(py: Python<'_>, data: &[u8], name: &str) -> PyResult<Self> {
        let snap = py
            .detach(|| Snapshot::from_bytes(data, Path::new(name)))
            .map_err(to_py_err)?;
        snap.refuse_fake_trace(name).map_err(to_py_err)?;
        Ok(PySnapshot {
            inner: Arc::new(snap),
            path: name.to_string(),
        })
    }

    /// The file this snapshot was read from (or the name given to `from_bytes`).
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Total number of trace events over all devices.
    #[getter]
    fn event_count(&self) -> usize {
        self.inner.event_count()
    }

    /// Device ordinals present in the snapshot.
    #[getter]
    fn devices(&self) -> Vec<u32> {
        self.inner.devices()
    }

    /// Problems found while reading that did not stop the analysis.
    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.inner.warnings.clone()
    }

    /// Runs the analysis `name` on this snapshot (and `others`, for analyses
    /// over several snapshots) with options given as a JSON object; returns the
    /// JSON document `memlens NAME --json` prints.
    #[pyo3(signature = (name, others = Vec::new(), options = "{}"))]
    fn analyze(
        &self,
        py: Python<'_>,
        name: &str,
        others: Vec<PyRef<'_, PySnapshot>>,
        options: &str,
    ) -> PyResult<String> {
        let analysis = analyses::find(name).ok_or_else(|| {
            pyo3::exceptions::PyNotImplementedError::new_err(format!(
                "memlens {name} is not available in this build"
            ))
        })?;
        let opts = options::Options::parse(options).map_err(to_py_err)?;
        let mut snaps: Vec<(String, Arc<Snapshot>)> =
            vec![(self.path.clone(), Arc::clone(&self.inner))];
        snaps.extend(
            others
                .iter()
                .map(|o| (o.path.clone(), Arc::clone(&o.inner))),
        );
        py.detach(|| {
            let inputs: Vec<analyses::Input<'_>> = snaps
                .iter()
                .map(|(name, snap)| analyses::Input { name, snap })
                .collect();
            (analysis.run)(&inputs, &opts)
        })
        .map_err(to_py_err)
    }

    /// The text of the `lines` analysis (the per-line table `@memlens.profile`
    /// prints); options as for `analyze("lines", ...)`.
    #[pyo3(signature = (options = "{}"))]
    fn lines_text(&self, py: Python<'_>, options: &str) -> PyResult<String> {
        let opts = options::Options::parse(options).map_err(to_py_err)?;
        let line_opts = analyses::line_options(&opts).map_err(to_py_err)?;
        let snap = Arc::clone(&self.inner);
        Ok(py.detach(move || {
            let finder = memlens::source::SourceFinder::with_env(Vec::new());
            memlens::render::lines::text(&memlens::analysis::lines::lines(
                &snap, &line_opts, &finder,
            ))
        }))
    }

    /// The tables of `memlens export` (events, blocks, segments, frames) as
    /// Arrow IPC streams: a list of (table name, bytes), read in Python with
    /// `pyarrow.ipc.open_stream`. The `file` column is this snapshot's path.
    #[pyo3(signature = (rank = None))]
    fn arrow_ipc(
        &self,
        py: Python<'_>,
        rank: Option<u32>,
    ) -> PyResult<Vec<(&'static str, Py<pyo3::types::PyBytes>)>> {
        let snap = Arc::clone(&self.inner);
        let file = self.path.clone();
        let tables = py
            .detach(move || {
                memlens::export::to_ipc(&memlens::export::ExportInput {
                    file,
                    rank,
                    snap: &snap,
                })
            })
            .map_err(to_py_err)?;
        Ok(tables
            .into_iter()
            .map(|(name, bytes)| (name, pyo3::types::PyBytes::new(py, &bytes).unbind()))
            .collect())
    }

    fn __repr__(&self) -> String {
        format!(
            "<memlens Snapshot {:?}: {} events, devices {:?}>",
            self.path,
            self.inner.event_count(),
            self.inner.devices()
        )
    }
}

/// Names of the analyses this build provides (the methods of `memlens.Snapshot`
/// that work; the others raise `NotImplementedError`).
#[pyfunction(name = "analyses")]
fn analysis_names() -> Vec<&'static str> {
    analyses::ANALYSES.iter().map(|a| a.name).collect()
}

/// The text `memlens summary PATH` prints (used when no OOM explainer is
/// built in: the state at the OOM is the next best thing to show).
#[pyfunction]
fn summary_text(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.detach(|| {
        let snap = Snapshot::load(&path)?;
        snap.refuse_fake_trace(&path.display().to_string())?;
        let summary = memlens::analysis::summary::summarize(&snap);
        Ok(memlens::render::summary::text(
            &summary,
            &path.display().to_string(),
        ))
    })
    .map_err(to_py_err)
}

/// The explanation of the OOM in the snapshot at `path`: the cause and the
/// fixes, exactly what `memlens oom PATH` prints (the same library call), for
/// the OOM hook of `memlens.record`.
#[pyfunction]
fn explain_oom_file(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.detach(|| {
        let snap = Snapshot::load(&path)?;
        snap.refuse_fake_trace(&path.display().to_string())?;
        let opts = memlens::oom::OomOptions::default();
        let name = path.display().to_string();
        let report = memlens::render::documents::oom_doc(&snap, &name, &opts)?;
        Ok(memlens::render::oom::text(&report))
    })
    .map_err(to_py_err)
}

/// `memlens fit` on the recordings at `paths`: the probes (snapshots of
/// one run at the batch sizes `batches`, in order), or with `checkpoint`
/// one recording with that module checkpointed. The JSON document the
/// CLI's `--json` prints (the same library call); `least_limit` adds each
/// run's least limit under `limit` (`FitOptions::least_limit`: the model's
/// edge, for `memlens.predict`'s search).
#[pyfunction]
#[pyo3(signature = (paths, batches, batch = None, limit = None, config = None, checkpoint = None, least_limit = false))]
#[allow(clippy::too_many_arguments)]
fn fit_json(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    batches: Vec<u32>,
    batch: Option<u32>,
    limit: Option<u64>,
    config: Option<String>,
    checkpoint: Option<String>,
    least_limit: bool,
) -> PyResult<String> {
    py.detach(|| {
        let snaps = paths
            .iter()
            .map(|p| Ok((p.display().to_string(), Snapshot::load(p)?)))
            .collect::<memlens::Result<Vec<_>>>()?;
        let recordings: Vec<(&str, &Snapshot)> =
            snaps.iter().map(|(n, s)| (n.as_str(), s)).collect();
        let opts = memlens::fit::FitOptions {
            batch,
            limit,
            config: config
                .as_deref()
                .map(memlens::sim::AllocatorConfig::parse)
                .transpose()
                .map_err(|e| memlens::Error::usage(format!("config: {e}")))?,
            least_limit,
        };
        let report = memlens::fit::answer(&recordings, &batches, checkpoint.as_deref(), &opts)?;
        serde_json::to_string(&report).map_err(|e| memlens::Error::usage(e.to_string()))
    })
    .map_err(to_py_err)
}

/// Parses a size such as `8GiB`, `512MiB`, `80GB` or a number of bytes.
#[pyfunction]
fn parse_size(text: &str) -> PyResult<u64> {
    memlens::units::parse_size(text).map_err(to_py_err)
}

/// Runs the `memlens` command line in this process with `argv` (the program
/// name first) and returns its exit code: what the package's `memlens`
/// command falls back to when no binary came with it (`pip install .`).
/// The GIL is released while it runs.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(move || memlens_cli::run(argv))
}

/// Formats bytes for people: `1.50 GiB`, `20.00 MiB`, `512 B`.
#[pyfunction]
fn format_bytes(bytes: u64) -> String {
    memlens::units::format_bytes(bytes)
}

/// What a frame is, by the one rulebook (`memlens::frames`): `user`,
/// `torch`, `library`, `memlens`, `compiled` or `native`.
#[pyfunction]
#[pyo3(signature = (filename, function = ""))]
fn frame_kind(filename: &str, function: &str) -> &'static str {
    use memlens::frames::FrameKind;
    match memlens::frames::classify(filename, function) {
        FrameKind::User => "user",
        FrameKind::Torch => "torch",
        FrameKind::Library => "library",
        FrameKind::Memlens => "memlens",
        FrameKind::Compiled => "compiled",
        FrameKind::Native => "native",
    }
}

/// An allocation site as every command shows it (`caller -> file:line in
/// function`, [`memlens::analysis::sites::Site::display`]): `site` is
/// `file:line`, `path` the user frames from the entry script down to it.
#[pyfunction]
#[pyo3(signature = (site, function = "", path = Vec::new()))]
fn site_display(site: &str, function: &str, path: Vec<String>) -> String {
    memlens::analysis::sites::Site {
        site: site.to_string(),
        function: function.to_string(),
        user_code: true,
        path,
        compiled: false,
        via: None,
    }
    .display()
}

/// `(staging buffer bytes, semaphore bytes)` PyTorch's CUDA `sum`/`mean`
/// kernel allocates for a tensor of `shape` and `strides` (elements)
/// reduced over `reduced`, by the one model (`memlens::fit::reduce_scratch`,
/// which `fit` from probes uses too); `(0, 0)` when it reduces within each
/// block. The GPU's shape defaults to an H100's or H200's. The fake tracer
/// calls it for every reduction it traces.
#[pyfunction]
#[pyo3(signature = (shape, strides, reduced, elem_size, acc_size, sms = None, threads_per_sm = None))]
fn reduction_scratch(
    shape: Vec<u64>,
    strides: Vec<u64>,
    reduced: Vec<usize>,
    elem_size: u64,
    acc_size: u64,
    sms: Option<u64>,
    threads_per_sm: Option<u64>,
) -> (u64, u64) {
    use memlens::fit::reduce_scratch::{Gpu, Reduction};
    let hopper = Gpu::default();
    Reduction {
        shape,
        strides,
        reduced,
        elem_size,
        acc_size,
    }
    .scratch(Gpu {
        sms: sms.unwrap_or(hopper.sms),
        threads_per_sm: threads_per_sm.unwrap_or(hopper.threads_per_sm),
    })
}

/// The extension module `memlens._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("JSON_SCHEMA", memlens::JSON_SCHEMA)?;
    m.add("MemlensError", m.py().get_type::<MemlensError>())?;
    m.add_class::<PySnapshot>()?;
    m.add_function(wrap_pyfunction!(analysis_names, m)?)?;
    m.add_function(wrap_pyfunction!(summary_text, m)?)?;
    m.add_function(wrap_pyfunction!(explain_oom_file, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(fit_json, m)?)?;
    m.add_function(wrap_pyfunction!(format_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(frame_kind, m)?)?;
    m.add_function(wrap_pyfunction!(reduction_scratch, m)?)?;
    m.add_function(wrap_pyfunction!(site_display, m)?)?;
    Ok(())
}
