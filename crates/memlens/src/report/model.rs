//! The data model of the HTML report: what the page shows, as aggregates only.
//!
//! Every section is optional: the analyses fill what they can and the page
//! hides the rest. The raw snapshot is never embedded; big series are stored
//! as column arrays (one JSON array per series) to keep the page small, and the
//! level-of-detail helpers in [`super::lod`] bound their sizes.
//!
//! Conventions shared by all sections:
//! * sizes are bytes (`u64`), as everywhere in memlens;
//! * a *site* is `file:line` of the innermost user frame (see `docs/cli.md`);
//! * a *frame label* is `file:line in function`; a *stack* is a list of frame
//!   labels, innermost first, as `memlens peak --json` prints it.

pub use crate::analysis::categories::Category;
pub use crate::doctor::{Finding, Severity};
use serde::{Deserialize, Serialize};

/// Everything the HTML report shows. Serialized as JSON into the page.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReportData {
    /// Files, versions, settings and headline figures.
    pub meta: Meta,
    /// The verdict: findings, most severe first (as the terminal prints them).
    pub findings: Vec<Finding>,
    /// Memory over time, stacked by the top allocation sites.
    pub timeline: Option<Timeline>,
    /// What was live at the peak, by stack.
    pub flame: Option<Flame>,
    /// The segments and their blocks at the peak or at the OOM.
    pub segments: Option<SegmentMap>,
    /// Live bytes per leaking site across steps or snapshots.
    pub leaks: Option<Leaks>,
    /// The `memlens tune` table.
    pub tune: Option<Tune>,
    /// Any moment of the trace: the largest allocations' lifetimes and saved
    /// segment maps, for the page to draw the event the user clicks.
    pub moments: Option<super::moments::Moments>,
    /// Every cached segment of the shown trace over time (the timeline's
    /// "segments" fill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_timeline: Option<super::segment_timeline::SegmentTimeline>,
    /// The OOM drawn: request against free pieces, live memory, every fix.
    pub oom: Option<super::views::OomView>,
    /// One row per snapshot when several periodic snapshots were given.
    pub overview: Option<super::views::Overview>,
    /// The ranks of one job side by side, when the inputs were ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<RanksView>,
    /// Which file each section shows (the timeline, flame graph and segment
    /// map show one snapshot: with several inputs, this one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shown_file: Option<String>,
    /// The path the page asks for the exact state at a clicked event, when
    /// `memlens report --serve` serves it ([`super::Explorer`]); absent in a
    /// report written to a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_url: Option<String>,
    /// The path the page asks for the exact totals over a zoomed-in stretch
    /// of events, when served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stretch_url: Option<String>,
}

/// The ranks of one job, for the side-by-side section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RanksView {
    /// Why the inputs were taken as ranks.
    pub reason: String,
    /// `s` (seconds from the job's first event) or `event`.
    pub x_unit: String,
    /// One line per rank.
    pub ranks: Vec<RankLine>,
    /// The rank holding more than the median rank, when one does.
    pub imbalance_rank: Option<u32>,
    /// Its excess at its peak.
    pub imbalance_bytes: Option<u64>,
    /// The site holding most of the excess, drawn on every rank.
    pub imbalance_site: Option<String>,
    /// The fix.
    pub suggestion: Option<String>,
    /// Each rank's memory over time.
    pub series: Vec<RankSeries>,
}

/// One rank's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RankLine {
    /// The rank.
    pub rank: u32,
    /// Its (latest) snapshot file.
    pub file: String,
    /// Exact peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Exact peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Device memory minus the reserved peak, when known.
    pub headroom_bytes: Option<u64>,
    /// The rank ran out of memory.
    pub oom: bool,
    /// The rank that ran out of memory or is closest to it.
    pub closest_to_oom: bool,
}

/// One rank's memory over time (bucket maxima).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RankSeries {
    /// The rank.
    pub rank: u32,
    /// The shared x axis (see [`RanksView::x_unit`]).
    pub x: Vec<f64>,
    /// Event index of each point.
    pub event: Vec<u64>,
    /// Event times (µs), used to build `x`; empty in the page.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub time_us: Vec<i64>,
    /// Allocated bytes.
    pub allocated: Vec<u64>,
    /// Reserved bytes.
    pub reserved: Vec<u64>,
    /// Bytes live at the imbalance site.
    pub site_bytes: Vec<u64>,
    /// The point holding the rank's peak.
    pub peak_point: usize,
}

/// Where the report comes from and the figures for its header.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Meta {
    /// Page title; empty means "memlens report".
    pub title: String,
    /// The snapshot files read, as the user named them.
    pub files: Vec<String>,
    /// memlens version that wrote the report.
    pub memlens_version: String,
    /// When the report was written (RFC 3339, UTC).
    pub generated: String,
    /// The device, e.g. `cuda:0` or `cuda:0 (NVIDIA H100 80GB)`, when known.
    pub device: Option<String>,
    /// Allocator settings recorded in the snapshot, as `(key, value)` pairs
    /// (`PYTORCH_CUDA_ALLOC_CONF`, `expandable_segments`, ...).
    pub settings: Vec<(String, String)>,
    /// Headline figures shown under the title (peak allocated, reserved, ...).
    pub stats: Vec<Stat>,
    /// The verdict in one sentence, as `doctor` prints it.
    pub verdict: String,
    /// Remarks on how the data was reduced or what could not be computed,
    /// e.g. "timeline downsampled from 11,000,000 events to 3,998 points".
    pub notes: Vec<String>,
}

impl Meta {
    /// A `Meta` for `files` stamped with this memlens version and the current
    /// time; the caller adds the rest.
    pub fn now(files: Vec<String>) -> Meta {
        Meta {
            files,
            memlens_version: env!("CARGO_PKG_VERSION").to_string(),
            generated: utc_rfc3339(std::time::SystemTime::now()),
            ..Meta::default()
        }
    }
}

/// Formats a time as RFC 3339 in UTC to the second (`2026-03-21T10:04:05Z`).
/// Times before 1970 print as the epoch.
pub fn utc_rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// One headline figure: a label with a size in bytes or a text value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stat {
    /// What the figure is ("peak allocated").
    pub label: String,
    /// The figure in bytes, when it is a size.
    pub bytes: Option<u64>,
    /// The figure as text, when it is not a size (or to override the format).
    pub text: Option<String>,
}

/// What the timeline's x axis counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XUnit {
    /// Index of the event in the device trace.
    #[default]
    Event,
    /// Epoch microseconds (`time_us`); the page shows seconds from the start.
    TimeUs,
}

/// Memory over time as column arrays: `x[i]`, `allocated[i]`, ... are point `i`.
///
/// `bands[k][i]` is what site `sites[k]` held at point `i`, and `other[i]` the
/// rest, so that the bands and `other` stack up to `allocated[i]`. Build one
/// with [`super::TimelineBuilder`], which also bounds its size.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Timeline {
    /// What `x` counts.
    pub x_unit: XUnit,
    /// The x value of each point (event index or epoch microseconds).
    pub x: Vec<i64>,
    /// Event index of each point in the device trace (equal to `x` when
    /// `x_unit` is `event`; may be empty then).
    pub event: Vec<u64>,
    /// Bytes allocated (held by tensors, rounded sizes).
    pub allocated: Vec<u64>,
    /// Bytes reserved from the driver (segments).
    pub reserved: Vec<u64>,
    /// Bytes active (allocated plus pending free); empty when not computed.
    pub active: Vec<u64>,
    /// The top sites, one per band.
    pub sites: Vec<TimelineSite>,
    /// `bands[k]` is the bytes of `sites[k]` at each point.
    pub bands: Vec<Vec<u64>>,
    /// Bytes of all other sites at each point; empty when there are no bands.
    pub other: Vec<u64>,
    /// Index (into the columns) of the peak of `allocated`.
    pub peak: Option<usize>,
    /// Indices (into the columns) of OOM events.
    pub ooms: Vec<usize>,
    /// Number of events the series were computed from (before downsampling).
    pub source_points: u64,
}

/// A site shown as a band of the timeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimelineSite {
    /// `file:line`.
    pub site: String,
    /// The function of the site's frame.
    pub function: String,
    /// Frame labels, innermost first.
    pub stack: Vec<String>,
    /// What the memory is (the most common category of the site's blocks).
    pub category: Category,
    /// The most the site held at one time.
    pub peak_bytes: u64,
}

/// A flame graph (icicle) of live bytes by stack, as a flat node array in
/// struct-of-arrays form: node `i` has parent `parent[i]`, label
/// `names[name[i]]` and inclusive size `value[i]`.
///
/// Node 0 is the root (all live bytes; `parent[0]` is 0 and ignored); every
/// other node comes after its parent. Children go from the outermost frame to
/// the innermost. Build one with [`super::FlameBuilder`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Flame {
    /// What the graph shows, e.g. "live at event 1,234 (the peak)".
    pub title: String,
    /// String table of frame labels (`file:line in function`).
    pub names: Vec<String>,
    /// Parent node of each node.
    pub parent: Vec<u32>,
    /// Index into `names` of each node.
    pub name: Vec<u32>,
    /// Inclusive bytes of each node.
    pub value: Vec<u64>,
    /// Indices into `names` of library frames (PyTorch's, other packages',
    /// the standard library's: [`super::convert::is_library_label`]), which
    /// the page folds into one frame per run until asked to show them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub library: Vec<u32>,
}

/// State of a block in the segment map (the page's colour scheme).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum BlockState {
    /// Held by a tensor.
    #[default]
    Allocated = 0,
    /// Freed by the user, waiting on stream events.
    PendingFree = 1,
    /// Free in the pool.
    Free = 2,
}

impl BlockState {
    /// The state of a code; unknown codes are [`BlockState::Free`].
    pub fn from_code(code: u8) -> BlockState {
        match code {
            0 => BlockState::Allocated,
            1 => BlockState::PendingFree,
            _ => BlockState::Free,
        }
    }
}

/// The segments and their blocks at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SegmentMap {
    /// When, e.g. "at the peak (event 1234)" or "at the OOM".
    pub when: String,
    /// Segments, in address order.
    pub segments: Vec<SegmentRow>,
    /// Sites of blocks (`SegmentBlock::site` indexes here).
    pub sites: Vec<BlockSite>,
    /// What [`super::cap_segments`] left out, when it left anything out.
    pub omitted: Option<OmittedSegments>,
}

/// One segment: one `cudaMalloc` or one mapped range of an expandable segment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SegmentRow {
    /// Address of the segment.
    pub address: u64,
    /// Bytes reserved by the segment.
    pub size: u64,
    /// The raw `cudaStream_t` (0 is the default stream).
    pub stream: i64,
    /// The pool: `large`, `small`, `large (private 1,2)`, `expandable`, ...
    pub pool: String,
    /// Blocks in address order; together they cover the segment.
    pub blocks: Vec<SegmentBlock>,
}

/// One block of a segment. Serialized as a compact array
/// `[offset, size, requested, state, category, site, count]`, with `site` -1
/// when unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "BlockTuple", into = "BlockTuple")]
pub struct SegmentBlock {
    /// Offset from the segment's address.
    pub offset: u64,
    /// Size in bytes (rounded).
    pub size: u64,
    /// The size the user asked for (0 when unknown or free).
    pub requested: u64,
    /// Allocated, pending free or free.
    pub state: BlockState,
    /// What the memory is used for.
    pub category: Category,
    /// Index into [`SegmentMap::sites`], when known.
    pub site: Option<u32>,
    /// Number of blocks merged into this one by [`super::cap_segments`] (1 for
    /// a real block).
    pub count: u32,
}

/// The wire form of [`SegmentBlock`].
#[derive(Serialize, Deserialize)]
struct BlockTuple(u64, u64, u64, u8, u8, i64, u32);

impl From<BlockTuple> for SegmentBlock {
    fn from(t: BlockTuple) -> Self {
        SegmentBlock {
            offset: t.0,
            size: t.1,
            requested: t.2,
            state: BlockState::from_code(t.3),
            category: Category::from_code(t.4),
            site: u32::try_from(t.5).ok(),
            count: t.6.max(1),
        }
    }
}

impl From<SegmentBlock> for BlockTuple {
    fn from(b: SegmentBlock) -> Self {
        BlockTuple(
            b.offset,
            b.size,
            b.requested,
            b.state as u8,
            b.category.code(),
            b.site.map_or(-1, i64::from),
            b.count,
        )
    }
}

/// Where a block was allocated.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BlockSite {
    /// `file:line`.
    pub site: String,
    /// Frame labels, innermost first (possibly cut short).
    pub stack: Vec<String>,
}

/// The segments [`super::cap_segments`] left out of the map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OmittedSegments {
    /// How many segments.
    pub count: u64,
    /// Their reserved bytes.
    pub bytes: u64,
    /// Bytes allocated in them.
    pub allocated_bytes: u64,
    /// Bytes freed by the user but waiting on stream events in them.
    pub pending_free_bytes: u64,
    /// Bytes free in them.
    pub free_bytes: u64,
}

/// Live bytes of the leaking sites at each step or snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Leaks {
    /// What the points are: `step` or `snapshot`.
    pub x_label: String,
    /// One label per point (a step number or a snapshot file name).
    pub points: Vec<String>,
    /// The leaking sites, most likely first.
    pub sites: Vec<LeakSite>,
}

/// One leaking site.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LeakSite {
    /// `file:line`.
    pub site: String,
    /// The function of the site's frame.
    pub function: String,
    /// Frame labels, innermost first.
    pub stack: Vec<String>,
    /// Live bytes at each point of [`Leaks::points`].
    pub bytes: Vec<u64>,
    /// Growth per step.
    pub bytes_per_step: i64,
    /// How sure the detector is: `high`, `medium` or `low`.
    pub confidence: String,
    /// What to do about it.
    pub suggestion: Option<String>,
    /// What the process found holding the site's tensors, one line each
    /// (`model.cache [module]: 1,024 tensors, 2.00 GiB`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<String>,
    /// The line that keeps them alive, as `file:line: statement`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_by: Option<String>,
}

/// The `memlens tune` table: allocator settings simulated and ranked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tune {
    /// The device memory the simulation assumed, when one was given.
    pub device_memory: Option<u64>,
    /// The candidates, best first.
    pub rows: Vec<TuneRow>,
}

/// One simulated configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TuneRow {
    /// `PYTORCH_CUDA_ALLOC_CONF` string (empty for the defaults).
    pub config: String,
    /// Predicted peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Predicted OOMs.
    pub num_ooms: u64,
    /// Predicted `cudaMalloc` calls, when the simulation counted them.
    pub num_device_alloc: Option<u64>,
    /// Predicted allocation retries (each a full cache flush), when counted.
    pub num_alloc_retries: Option<u64>,
    /// Peak reserved minus that of the current settings.
    pub delta_bytes: i64,
    /// This row is the configuration the snapshot was recorded with.
    pub current: bool,
}
