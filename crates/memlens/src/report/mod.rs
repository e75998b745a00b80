//! The self-contained HTML report.
//!
//! The analyses fill a [`ReportData`] (every section optional, aggregates
//! only; [`from_diagnosis`] fills it from `doctor`'s diagnosis and the
//! trace's one replay); [`render_html`] turns it into one HTML file that
//! works offline: the page's JavaScript and CSS, the vendored uPlot chart
//! library and the data (as JSON) are all inlined.
//!
//! Big inputs are bounded before rendering by the level-of-detail helpers, so
//! that the page stays under about 10 MB and opens quickly even for a 1 GB
//! snapshot:
//! * [`TimelineBuilder`] / [`downsample_timeline`]: at most about
//!   [`DEFAULT_MAX_POINTS`] points, peaks and OOMs kept exactly;
//! * [`FlameBuilder`] / [`prune_flame`]: nodes under 0.1 % of the root merged;
//! * [`cap_segments`]: the largest segments, the rest summed.
//!
//! ```
//! use memlens::report::{render_html, FlameBuilder, ReportData, Meta};
//! let mut flame = FlameBuilder::new("live at the peak");
//! flame.add(["train.py:10 in main", "model.py:42 in forward"], 1 << 30);
//! let data = ReportData {
//!     meta: Meta::now(vec!["snapshot.pickle".into()]),
//!     flame: Some(flame.finish()),
//!     ..ReportData::default()
//! };
//! let html = render_html(&data);
//! assert!(html.contains("id=\"memlens-data\""));
//! ```

mod build;
mod convert;
mod explore;
mod flame;
mod html;
mod model;
mod moments;
mod ranks;
mod segment_timeline;
mod segments;
mod shapes;
mod timeline;
mod views;

pub use build::{from_diagnosis, TIMELINE_TOP_SITES};
pub use convert::{
    frame_label, is_library_label, library_labels, pool_label, python_stack_labels, segment_map,
    settings_pairs, stack_labels, FLAME_NATIVE_ONLY,
};
pub use explore::{Explorer, ServedState, ServedStretch, STATE_PATH, STRETCH_PATH, STRETCH_POINTS};
pub use flame::{
    prune_flame, FlameBuilder, DEFAULT_FLAME_MIN_FRACTION, FLAME_NO_STACK, FLAME_OTHER, FLAME_ROOT,
};
pub use html::{render_html, render_html_from_json, script_json};
pub use model::{
    utc_rfc3339, BlockSite, BlockState, Category, Finding, Flame, LeakSite, Leaks, Meta,
    OmittedSegments, RankLine, RankSeries, RanksView, ReportData, SegmentBlock, SegmentMap,
    SegmentRow, Severity, Stat, Timeline, TimelineSite, Tune, TuneRow, XUnit,
};
pub use moments::{Moments, MAX_KEPT_ALLOCS, MAX_STACK_FRAMES, MOMENT_SEGMENT_MAPS};
pub use ranks::{job_rank_series, ranks_view_of};
pub use segment_timeline::{SegmentTimeline, MAX_SEGMENT_PIECES};
pub use segments::{
    cap_segments, DEFAULT_MAX_BLOCKS_PER_SEGMENT, DEFAULT_MAX_SEGMENTS, MAX_BLOCK_STACK_FRAMES,
};
pub use shapes::{StretchAllocations, SHAPES_MAX_ALLOCS, SHAPES_MAX_EVENTS};
pub use timeline::{downsample_timeline, TimelineBuilder, TimelinePoint, DEFAULT_MAX_POINTS};
pub use views::{oom_view, overview, OomFixView, OomLive, OomPool, OomView, Overview, OverviewRow};

impl ReportData {
    /// Applies every level-of-detail bound with its default: downsamples the
    /// timeline, prunes the flame graph, caps the segment map. The analyses may
    /// call the helpers themselves with other bounds instead.
    pub fn bounded(mut self) -> ReportData {
        if let Some(t) = &self.timeline {
            self.timeline = Some(downsample_timeline(t, DEFAULT_MAX_POINTS));
        }
        if let Some(f) = &self.flame {
            self.flame = Some(bounded_flame(f));
        }
        if let Some(m) = &mut self.moments {
            m.library = convert::library_labels(&m.frames);
        }
        if let Some(s) = &self.segments {
            self.segments = Some(cap_segments(
                s,
                DEFAULT_MAX_SEGMENTS,
                DEFAULT_MAX_BLOCKS_PER_SEGMENT,
            ));
        }
        self
    }
}

/// A flame graph pruned as a page draws it (nodes under
/// [`DEFAULT_FLAME_MIN_FRACTION`] merged), its library frames marked.
fn bounded_flame(f: &Flame) -> Flame {
    let mut f = prune_flame(f, DEFAULT_FLAME_MIN_FRACTION);
    f.library = convert::library_labels(&f.names);
    f
}

/// Whether the file at `path` is a report memlens wrote (its head names
/// memlens as the generator): such a file may be replaced without asking;
/// any other file may not.
pub fn written_by_memlens(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2048];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    String::from_utf8_lossy(&head[..n]).contains(r#"<meta name="generator" content="memlens""#)
}

/// Where `doctor` writes its report when not told: beside the last snapshot,
/// named after it (`run.pickle.zst` -> `run.memlens.html`); for the example
/// built into memlens, `example.memlens.html` in the current directory.
pub fn default_report_path(snapshot: Option<&std::path::Path>) -> std::path::PathBuf {
    let Some(p) = snapshot else {
        return std::path::PathBuf::from("example.memlens.html");
    };
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".into());
    let mut stem = name.as_str();
    for ext in [".zst", ".gz", ".pickle", ".pkl", ".json"] {
        stem = stem.strip_suffix(ext).unwrap_or(stem);
    }
    p.with_file_name(format!("{stem}.memlens.html"))
}

/// Renders the report of a diagnosis and writes it to `path`. The page goes to
/// a temporary file beside the target first and is renamed into place, so a
/// failure never leaves a half-written report over an earlier one.
pub fn write_report(
    snaps: &[(String, &crate::Snapshot)],
    diagnosis: &crate::doctor::Diagnosis,
    path: &std::path::Path,
) -> crate::Result<()> {
    let set = crate::analysis::peak::AnalysedSet::new(snaps);
    write_report_in(&set, snaps, diagnosis, path)
}

/// [`write_report`] with the analysed traces `doctor` built in `set`.
pub fn write_report_in<'s>(
    set: &crate::analysis::peak::AnalysedSet<'s>,
    snaps: &[(String, &'s crate::Snapshot)],
    diagnosis: &crate::doctor::Diagnosis,
    path: &std::path::Path,
) -> crate::Result<()> {
    let html = render_html(&build::from_diagnosis_in(set, snaps, diagnosis).bounded());
    write_html(&html, path)
}

/// Writes the report of a job read rank by rank ([`crate::job`]): `snaps`
/// are its main rank's snapshots (its timeline, peak and segments are
/// shown), `ranks` the side-by-side section made from every rank.
pub fn write_job_report<'s>(
    set: &crate::analysis::peak::AnalysedSet<'s>,
    snaps: &[(String, &'s crate::Snapshot)],
    diagnosis: &crate::doctor::Diagnosis,
    ranks: model::RanksView,
    path: &std::path::Path,
) -> crate::Result<()> {
    let mut data = build::from_diagnosis_with_ranks(set, snaps, diagnosis, Some(ranks));
    // Every rank's files, not only those read again for the main rank.
    data.meta.files = diagnosis
        .parts
        .iter()
        .flat_map(|p| p.files.iter().cloned())
        .collect();
    write_html(&render_html(&data.bounded()), path)
}

/// Writes `html` to `path` through a temporary file beside it, so that a
/// failed write leaves what was there.
fn write_html(html: &str, path: &std::path::Path) -> crate::Result<()> {
    use std::path::Path;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let io = |error| crate::Error::Io {
        path: path.into(),
        error,
    };
    std::fs::write(&tmp, html.as_bytes()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}
