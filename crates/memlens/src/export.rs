//! `memlens export`: snapshots as Parquet tables that DuckDB, Spark, Polars
//! or pandas query directly, many snapshots at once.
//!
//! Four files in the output folder, one row per:
//! * `events.parquet`: trace event (`file`, `rank`, `device`, `index`,
//!   `time_us`, `action`, `addr`, `size`, `stream`, `stack_id`, `step`,
//!   `allocated_size`);
//! * `blocks.parquet`: block at dump time (`file`, `rank`, `device`,
//!   `segment_address`, `address`, `size`, `requested_size`, `state`, `stack_id`);
//! * `segments.parquet`: segment at dump time (`file`, `rank`, `device`,
//!   `address`, `total_size`, `allocated_size`, `active_size`,
//!   `requested_size`, `stream`, `pool`, `pool_id`, `is_expandable`, `stack_id`);
//! * `frames.parquet`: frame of a stack (`file`, `stack_id`, `depth` (0 is the
//!   innermost), `filename`, `line`, `name`).
//!
//! `size` is what the trace recorded: the request for `alloc` and the frees.
//! `allocated_size` is the block the allocator handed out for it (rounded,
//! with any remainder too small to split), as the replay of the trace
//! through the allocator model finds it, on `alloc`, `free_requested` and
//! `free_completed` rows (null on the others, and where the replay could not
//! place the event). The allocated bytes of `max_memory_allocated()` are
//! rebuilt from it: a running sum of `allocated_size` over `alloc` (+) and
//! `free_requested` (-) rows (`free_completed` rows in a trace recorded
//! without requests, as `memlens.record` records: see
//! [`crate::snapshot::records_free_requests`]), in `index` order, plus what
//! was allocated before the trace began (nothing when the trace starts with
//! the process). `examples/fleet/peak_per_run.sql` does it.
//!
//! The files are written under temporary names in the output folder and
//! renamed only once every input has been read and every file closed: an
//! export that fails (a bad input, a full disk) leaves the tables already
//! there as they were.
//!
//! `stack_id` is per file: join frames on (`file`, `stack_id`). Rows are
//! written in batches of [`BATCH_ROWS`], one at a time, so memory stays
//! bounded by the snapshot being exported plus one batch, whatever the
//! number of files (issue 34: at most half the file's size; on the 1 GB
//! benchmark the export needs what reading it does, BENCHMARKS.md). The
//! allocated sizes are kept as exceptions to a rule, not one per event.
//!
//! Speed (issue 17: 1 GB of snapshot at >= 200 MB/s): each batch is one
//! Parquet row group whose columns are built from the events and encoded
//! (zstd) on rayon's threads, one task per column, so the export costs about
//! its slowest column rather than the sum of them. Columns with few distinct
//! values (file, action, device, stream, stack, step) are dictionary-encoded;
//! the others are not, since a dictionary that overflows is built and then
//! thrown away for every row group. The same batches serve [`to_ipc`]
//! (Arrow IPC streams for Python's `snap.to_arrow()`).

use crate::analysis::categories::{event_phases, Phases};
use crate::analysis::steps;
use crate::error::{Error, Result};
use crate::replay::{Delta, Replay, ReplayOptions};
use crate::sim::rounding::round_size;
use crate::snapshot::{Action, Block, BlockState, PoolKind, Segment, Snapshot, TraceEvent};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BooleanArray, DictionaryArray, Int32Array, Int64Array, RecordBatch, StringArray,
    UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnChunk, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per record batch and Parquet row group: small enough that a batch's
/// columns, built side by side, add little to the snapshot's own memory
/// (1 M rows added ~115 MB on 8 threads, ~280 MB with two batches at once).
pub const BATCH_ROWS: usize = 1 << 18;

/// Rows written to each table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportCounts {
    /// Rows of `events.parquet`.
    pub events: u64,
    /// Rows of `blocks.parquet`.
    pub blocks: u64,
    /// Rows of `segments.parquet`.
    pub segments: u64,
    /// Rows of `frames.parquet`.
    pub frames: u64,
}

/// One input: its name (the `file` column), its rank when it is one, and the
/// snapshot.
pub struct ExportInput<'a> {
    /// The `file` column.
    pub file: String,
    /// The `rank` column (null when the input is no rank of a job).
    pub rank: Option<u32>,
    /// The snapshot.
    pub snap: &'a Snapshot,
}

fn dict() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

fn events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file", dict(), false),
        Field::new("rank", DataType::Int32, true),
        Field::new("device", DataType::Int32, false),
        Field::new("index", DataType::UInt32, false),
        Field::new("time_us", DataType::Int64, false),
        Field::new("action", dict(), false),
        Field::new("addr", DataType::UInt64, false),
        Field::new("size", DataType::UInt64, false),
        Field::new("stream", DataType::Int64, false),
        Field::new("stack_id", DataType::UInt32, false),
        Field::new("step", DataType::UInt32, false),
        Field::new("allocated_size", DataType::UInt64, true),
    ]))
}

fn blocks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file", dict(), false),
        Field::new("rank", DataType::Int32, true),
        Field::new("device", DataType::Int32, false),
        Field::new("segment_address", DataType::UInt64, false),
        Field::new("address", DataType::UInt64, false),
        Field::new("size", DataType::UInt64, false),
        Field::new("requested_size", DataType::UInt64, false),
        Field::new("state", dict(), false),
        Field::new("stack_id", DataType::UInt32, false),
    ]))
}

fn segments_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file", dict(), false),
        Field::new("rank", DataType::Int32, true),
        Field::new("device", DataType::Int32, false),
        Field::new("address", DataType::UInt64, false),
        Field::new("total_size", DataType::UInt64, false),
        Field::new("allocated_size", DataType::UInt64, false),
        Field::new("active_size", DataType::UInt64, false),
        Field::new("requested_size", DataType::UInt64, false),
        Field::new("stream", DataType::Int64, false),
        Field::new("pool", dict(), false),
        Field::new("pool_id", DataType::Utf8, false),
        Field::new("is_expandable", DataType::Boolean, false),
        Field::new("stack_id", DataType::UInt32, false),
    ]))
}

fn frames_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file", dict(), false),
        Field::new("stack_id", DataType::UInt32, false),
        Field::new("depth", DataType::UInt32, false),
        Field::new("filename", dict(), false),
        Field::new("line", DataType::UInt32, false),
        Field::new("name", dict(), false),
    ]))
}

/// One column of a batch, built when called: on a rayon thread for Parquet,
/// so that building and encoding the columns of a batch run side by side.
type Column<'a> = Box<dyn Fn() -> ArrayRef + Send + Sync + 'a>;

/// Where the batches of one table go (a Parquet file, or an Arrow IPC stream).
trait Sink {
    /// Takes one batch of `rows` rows, its columns in the schema's order.
    fn put(&mut self, rows: usize, columns: Vec<Column<'_>>) -> Result<()>;
}

/// The columns of each table that are not dictionary-encoded in Parquet:
/// (nearly) all distinct, so a dictionary would overflow in every row group.
const PLAIN: [&str; 9] = [
    "index",
    "time_us",
    "addr",
    "size",
    "address",
    "segment_address",
    "total_size",
    "allocated_size",
    "active_size",
];

/// Writer settings, chosen on the 357 MB benchmark (BENCHMARKS.md).
fn properties(schema: &Schema) -> WriterProperties {
    // zstd level 1 (the default level): a third of the size of the
    // uncompressed columns at little cost to the export's speed.
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(BATCH_ROWS));
    for f in schema.fields() {
        let col = ColumnPath::from(f.name().as_str());
        if PLAIN.contains(&f.name().as_str()) {
            b = b.set_column_dictionary_enabled(col.clone(), false);
            // Event indexes and times only grow: delta encoding stores them
            // in a few bits each, cheaper to compress than 8 plain bytes.
            if matches!(f.name().as_str(), "index" | "time_us") {
                b = b.set_column_encoding(col, Encoding::DELTA_BINARY_PACKED);
            }
        }
    }
    b.build()
}

/// A Parquet file being written, one row group per batch, under a
/// temporary name (`path`) until [`Exporter::finish`] renames it to `name`.
struct Table {
    path: PathBuf,
    name: PathBuf,
    writer: SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    rows: u64,
    groups: usize,
}

impl Table {
    fn create(dir: &Path, name: &str, schema: SchemaRef, temps: &mut Temps) -> Result<Table> {
        let path = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        temps.0.push(path.clone());
        let file = File::create(&path).map_err(|error| Error::Io {
            path: path.clone(),
            error,
        })?;
        // ArrowWriter stores the Arrow schema in the file (dictionary types
        // come back as such); its lower half then writes column by column.
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(properties(&schema)))
            .map_err(|e| parquet_err(&path, e))?;
        let (writer, factory) = writer
            .into_serialized_writer()
            .map_err(|e| parquet_err(&path, e))?;
        Ok(Table {
            path,
            name: dir.join(name),
            writer,
            factory,
            schema,
            rows: 0,
            groups: 0,
        })
    }

    /// Writes the footer; the rows written and the (temporary, final) paths.
    fn close(self) -> Result<(u64, PathBuf, PathBuf)> {
        let path = self.path;
        self.writer.close().map_err(|e| parquet_err(&path, e))?;
        Ok((self.rows, path, self.name))
    }
}

impl Table {
    /// Encodes one batch of `rows` rows as a row group, every column on its
    /// own rayon task, and appends it to the file.
    fn put_group(&mut self, rows: usize, columns: Vec<Column<'_>>) -> Result<()> {
        let path = &self.path;
        let writers = self
            .factory
            .create_column_writers(self.groups)
            .map_err(|e| parquet_err(path, e))?;
        // Every field is a primitive or a dictionary: one leaf, one writer each.
        let fields = self.schema.fields().iter().cloned();
        let tasks: Vec<_> = columns.into_iter().zip(writers).zip(fields).collect();
        let chunks: Vec<parquet::errors::Result<ArrowColumnChunk>> = on_encoders(|| {
            tasks
                .into_par_iter()
                .map(|((build, mut w), field)| {
                    let array = build();
                    for leaf in compute_leaves(&field, &array)? {
                        w.write(&leaf)?;
                    }
                    w.close()
                })
                .collect()
        });
        let mut group = self
            .writer
            .next_row_group()
            .map_err(|e| parquet_err(path, e))?;
        for c in chunks {
            c.and_then(|c| c.append_to_row_group(&mut group))
                .map_err(|e| parquet_err(path, e))?;
        }
        group.close().map_err(|e| parquet_err(path, e))?;
        self.groups += 1;
        self.rows += rows as u64;
        Ok(())
    }
}

impl Sink for Table {
    fn put(&mut self, rows: usize, columns: Vec<Column<'_>>) -> Result<()> {
        self.put_group(rows, columns)
    }
}

/// Threads that build and encode a batch's columns at most.
///
/// Eight keep most of a batch's twelve columns going (the slowest, the
/// replay's, sets the pace), and each thread past them keeps a malloc arena
/// of freed column buffers: on the GPU host sixteen threads held ~40 MB more
/// exporting the 1 GB benchmark (0.51x the file against 0.47x) for ~15% more
/// speed; both stay over 200 MB/s (BENCHMARKS.md).
const ENCODING_THREADS: usize = 8;

/// Runs `f` on a pool of at most [`ENCODING_THREADS`] threads (rayon's own
/// pool when it is no larger, or when no pool can be made).
fn on_encoders<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| {
        let threads = rayon::current_num_threads();
        (threads > ENCODING_THREADS)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(ENCODING_THREADS)
                    .build()
                    .ok()
            })
            .flatten()
    });
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

fn parquet_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.into(),
        error: std::io::Error::other(e.to_string()),
    }
}

/// A dictionary column of one repeated value.
fn repeated(value: &str, n: usize) -> ArrayRef {
    coded(Int32Array::from_value(0, n), &[value])
}

/// A dictionary column from its codes and values (no hashing per row).
fn coded(keys: Int32Array, values: &[&str]) -> ArrayRef {
    let values: ArrayRef = Arc::new(StringArray::from(values.to_vec()));
    // The codes are in range by construction; an error here is a defect.
    Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values).expect("codes index the values"))
}

fn ranks(rank: Option<u32>, n: usize) -> ArrayRef {
    match rank {
        Some(r) => Arc::new(Int32Array::from_value(r as i32, n)),
        None => Arc::new(Int32Array::new_null(n)),
    }
}

/// The temporary files of an export, removed when it is dropped unfinished.
#[derive(Default)]
struct Temps(Vec<PathBuf>);

impl Drop for Temps {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The four tables being written; add snapshots one at a time (each may be
/// dropped once added), then [`Exporter::finish`]. Until then the files are
/// temporary ones beside the tables: an exporter dropped unfinished (an
/// error) removes them and leaves the folder's tables as they were.
pub struct Exporter {
    events: Table,
    blocks: Table,
    segments: Table,
    frames: Table,
    temps: Temps,
}

impl Exporter {
    /// Creates `dir` if missing and the four (temporary) files in it.
    pub fn create(dir: &Path) -> Result<Exporter> {
        std::fs::create_dir_all(dir).map_err(|error| Error::Io {
            path: dir.into(),
            error,
        })?;
        let mut temps = Temps::default();
        Ok(Exporter {
            events: Table::create(dir, "events.parquet", events_schema(), &mut temps)?,
            blocks: Table::create(dir, "blocks.parquet", blocks_schema(), &mut temps)?,
            segments: Table::create(dir, "segments.parquet", segments_schema(), &mut temps)?,
            frames: Table::create(dir, "frames.parquet", frames_schema(), &mut temps)?,
            temps,
        })
    }

    /// Writes the rows of one snapshot.
    pub fn add(&mut self, input: &ExportInput<'_>) -> Result<()> {
        write_events(&mut self.events, input)?;
        write_segments(&mut self.segments, input)?;
        write_blocks(&mut self.blocks, input)?;
        write_frames(&mut self.frames, input)
    }

    /// Closes the files (writing their footers), renames them to the
    /// tables' names (replacing those there) and returns the rows written.
    pub fn finish(self) -> Result<ExportCounts> {
        let Exporter {
            events,
            blocks,
            segments,
            frames,
            mut temps,
        } = self;
        let closed = [
            events.close()?,
            blocks.close()?,
            segments.close()?,
            frames.close()?,
        ];
        for (_, temp, name) in &closed {
            std::fs::rename(temp, name).map_err(|error| Error::Io {
                path: name.clone(),
                error,
            })?;
        }
        temps.0.clear();
        Ok(ExportCounts {
            events: closed[0].0,
            blocks: closed[1].0,
            segments: closed[2].0,
            frames: closed[3].0,
        })
    }
}

/// Writes the four tables of `inputs` into `dir` (created if missing).
pub fn export(inputs: &[ExportInput<'_>], dir: &Path) -> Result<ExportCounts> {
    let mut ex = Exporter::create(dir)?;
    for input in inputs {
        ex.add(input)?;
    }
    ex.finish()
}

/// The step starts (event indexes) of trace `t`, as doctor finds steps; only
/// the phases are computed for it, not the rest of [`crate::trace::Analysed`].
fn step_starts(snap: &Snapshot, phases: &Phases, t: usize) -> Vec<usize> {
    steps::detect(snap, t, &event_phases(snap, t, phases)).starts
}

/// The allocated size of each event of the trace of `device` (see the
/// module's documentation), kept as the exceptions to a rule rather than one
/// value an event: on a 1 GB trace a value per event was 208 MB, a fifth of
/// the export's memory, and nearly every value is the rule's.
///
/// The rule: an `alloc`, `free_requested` or `free_completed` gets its
/// request rounded as PyTorch's default settings round it, every other event
/// nothing. The replay's block size differs from it where a remainder too
/// small to split stays with the block, under other settings, and where the
/// replay could not place the event (no size at all): those are kept.
struct AllocatedSizes {
    /// The settings the rule rounds by (PyTorch's defaults).
    rounding: crate::sim::AllocatorConfig,
    /// `(event index, replayed size)` where the replay differs from the
    /// rule, in index order; `u64::MAX` for no size.
    exceptions: Vec<(u32, u64)>,
}

impl AllocatedSizes {
    const NONE: u64 = u64::MAX;

    /// The rule's size for `e`.
    fn rule(rounding: &crate::sim::AllocatorConfig, e: &TraceEvent) -> Option<u64> {
        match e.action {
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted => {
                Some(round_size(rounding, e.size))
            }
            _ => None,
        }
    }

    /// The sizes of the trace of `device` in `snap`, from one replay.
    fn replay(snap: &Snapshot, device: u32) -> AllocatedSizes {
        let events = snap.device_trace(device);
        let rounding = crate::sim::AllocatorConfig::default();
        let mut exceptions = Vec::new();
        let mut keep = |index: usize, size: Option<u64>| {
            let rule = events.get(index).and_then(|e| Self::rule(&rounding, e));
            if size != rule {
                exceptions.push((index as u32, size.unwrap_or(Self::NONE)));
            }
        };
        // Events the replay steps over without a size, or never reaches,
        // have none.
        let mut next = 0;
        let mut replay = Replay::new(snap, device, &ReplayOptions::default());
        while let Some(step) = replay.step() {
            for skipped in next..step.index {
                keep(skipped, None);
            }
            let size = match step.delta {
                Delta::Alloc { size, .. }
                | Delta::FreeRequested { size, .. }
                | Delta::FreeCompleted { size, .. } => Some(size),
                _ => None,
            };
            keep(step.index, size);
            next = next.max(step.index + 1);
        }
        for skipped in next..events.len() {
            keep(skipped, None);
        }
        AllocatedSizes {
            rounding,
            exceptions,
        }
    }

    /// The column of the events `ev`, the first at index `base`.
    fn column(&self, base: usize, ev: &[TraceEvent]) -> UInt64Array {
        let mut exceptions = self.exceptions[self
            .exceptions
            .partition_point(|&(i, _)| (i as usize) < base)..]
            .iter()
            .peekable();
        UInt64Array::from_iter(ev.iter().enumerate().map(|(k, e)| {
            match exceptions.next_if(|&&(i, _)| i as usize == base + k) {
                Some(&(_, Self::NONE)) => None,
                Some(&(_, size)) => Some(size),
                None => Self::rule(&self.rounding, e),
            }
        }))
    }
}

/// The step of each event of `range` (`starts`: where each step begins).
fn steps_of(starts: &[usize], range: std::ops::Range<usize>) -> UInt32Array {
    // The step holding the first event: the last start at or before it.
    let mut step = starts
        .partition_point(|&s| s <= range.start)
        .saturating_sub(1);
    UInt32Array::from_iter_values(range.map(|i| {
        while step + 1 < starts.len() && starts[step + 1] <= i {
            step += 1;
        }
        step as u32
    }))
}

fn write_events(sink: &mut dyn Sink, input: &ExportInput<'_>) -> Result<()> {
    let snap = input.snap;
    let actions = Action::ALL.map(Action::as_str);
    // Steps need a pass over the trace: it runs as the first batch's `step`
    // column, beside the other columns, instead of before them all.
    let phases = std::sync::OnceLock::new();
    for (t, trace) in snap.traces.iter().enumerate() {
        let starts = std::sync::OnceLock::new();
        // The replay runs as the first batch's `allocated_size` column.
        let sizes = std::sync::OnceLock::new();
        let device = trace.device;
        for (c, ev) in trace.events.chunks(BATCH_ROWS).enumerate() {
            let base = c * BATCH_ROWS;
            let allocated: Column<'_> = Box::new({
                let sizes = &sizes;
                move || {
                    let sizes = sizes.get_or_init(|| AllocatedSizes::replay(snap, device));
                    Arc::new(sizes.column(base, ev))
                }
            });
            let mut cols = event_columns(
                input,
                &actions,
                trace.device as i32,
                base,
                ev,
                &phases,
                &starts,
                t,
            );
            cols.push(allocated);
            sink.put(ev.len(), cols)?;
        }
    }
    Ok(())
}

/// The columns of the events `ev` of trace `t`, the first at index `base`.
#[allow(clippy::too_many_arguments)]
fn event_columns<'a>(
    input: &'a ExportInput<'a>,
    actions: &'a [&'static str],
    device: i32,
    base: usize,
    ev: &'a [TraceEvent],
    phases: &'a std::sync::OnceLock<Phases>,
    starts: &'a std::sync::OnceLock<Vec<usize>>,
    t: usize,
) -> Vec<Column<'a>> {
    let snap = input.snap;
    let n = ev.len();
    let (file, rank) = (input.file.as_str(), input.rank);
    vec![
        Box::new(move || repeated(file, n)),
        Box::new(move || ranks(rank, n)),
        Box::new(move || Arc::new(Int32Array::from_value(device, n))),
        Box::new(move || {
            Arc::new(UInt32Array::from_iter_values(
                (base..base + n).map(|i| i as u32),
            ))
        }),
        Box::new(move || Arc::new(Int64Array::from_iter_values(ev.iter().map(|e| e.time_us)))),
        Box::new(move || {
            coded(
                Int32Array::from_iter_values(ev.iter().map(|e| e.action as i32)),
                actions,
            )
        }),
        Box::new(move || Arc::new(UInt64Array::from_iter_values(ev.iter().map(|e| e.addr)))),
        Box::new(move || Arc::new(UInt64Array::from_iter_values(ev.iter().map(|e| e.size)))),
        Box::new(move || {
            Arc::new(Int64Array::from_iter_values(
                ev.iter().map(|e| snap.stream(e.stream)),
            ))
        }),
        Box::new(move || Arc::new(UInt32Array::from_iter_values(ev.iter().map(|e| e.stack)))),
        Box::new(move || {
            let starts = starts
                .get_or_init(|| step_starts(snap, phases.get_or_init(|| Phases::new(snap)), t));
            Arc::new(steps_of(starts, base..base + n))
        }),
    ]
}

fn state_name(s: BlockState) -> &'static str {
    match s {
        BlockState::ActiveAllocated => "active_allocated",
        BlockState::ActivePendingFree => "active_pending_free",
        BlockState::Inactive => "inactive",
    }
}

fn pool_name(p: PoolKind) -> &'static str {
    match p {
        PoolKind::Small => "small",
        PoolKind::Large => "large",
    }
}

/// Strings as a dictionary column, coded in one pass (few distinct values).
fn dictionary<'s>(values: impl Iterator<Item = &'s str>) -> ArrayRef {
    let mut names: Vec<&str> = Vec::new();
    let mut index: hashbrown::HashMap<&str, i32> = hashbrown::HashMap::new();
    let keys = Int32Array::from_iter_values(values.map(|v| {
        *index.entry(v).or_insert_with(|| {
            names.push(v);
            names.len() as i32 - 1
        })
    }));
    coded(keys, &names)
}

fn write_segments(sink: &mut dyn Sink, input: &ExportInput<'_>) -> Result<()> {
    let snap = input.snap;
    for s in snap.segments.chunks(BATCH_ROWS) {
        let n = s.len();
        let (file, rank) = (input.file.as_str(), input.rank);
        let u64s = |f: fn(&Segment) -> u64| -> Column<'_> {
            Box::new(move || Arc::new(UInt64Array::from_iter_values(s.iter().map(f))))
        };
        let columns: Vec<Column<'_>> = vec![
            Box::new(move || repeated(file, n)),
            Box::new(move || ranks(rank, n)),
            Box::new(move || {
                Arc::new(Int32Array::from_iter_values(
                    s.iter().map(|s| s.device as i32),
                ))
            }),
            u64s(|s| s.address),
            u64s(|s| s.total_size),
            u64s(|s| s.allocated_size),
            u64s(|s| s.active_size),
            u64s(|s| s.requested_size),
            Box::new(move || {
                Arc::new(Int64Array::from_iter_values(
                    s.iter().map(|s| snap.stream(s.stream)),
                ))
            }),
            Box::new(move || dictionary(s.iter().map(|s| pool_name(s.pool)))),
            Box::new(move || {
                Arc::new(StringArray::from_iter_values(
                    s.iter().map(|s| format!("{},{}", s.pool_id.0, s.pool_id.1)),
                ))
            }),
            Box::new(move || {
                Arc::new(BooleanArray::from_iter(
                    s.iter().map(|s| Some(s.is_expandable)),
                ))
            }),
            Box::new(move || Arc::new(UInt32Array::from_iter_values(s.iter().map(|s| s.stack)))),
        ];
        sink.put(n, columns)?;
    }
    Ok(())
}

fn write_blocks(sink: &mut dyn Sink, input: &ExportInput<'_>) -> Result<()> {
    let snap = input.snap;
    let all: Vec<(&Segment, &Block)> = snap
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(move |b| (s, b)))
        .collect();
    for rows in all.chunks(BATCH_ROWS) {
        let n = rows.len();
        let (file, rank) = (input.file.as_str(), input.rank);
        let u64s = |f: fn(&(&Segment, &Block)) -> u64| -> Column<'_> {
            Box::new(move || Arc::new(UInt64Array::from_iter_values(rows.iter().map(f))))
        };
        let columns: Vec<Column<'_>> = vec![
            Box::new(move || repeated(file, n)),
            Box::new(move || ranks(rank, n)),
            Box::new(move || {
                Arc::new(Int32Array::from_iter_values(
                    rows.iter().map(|(s, _)| s.device as i32),
                ))
            }),
            u64s(|(s, _)| s.address),
            u64s(|(_, b)| b.address),
            u64s(|(_, b)| b.size),
            u64s(|(_, b)| b.requested_size),
            Box::new(move || dictionary(rows.iter().map(|(_, b)| state_name(b.state)))),
            Box::new(move || {
                Arc::new(UInt32Array::from_iter_values(
                    rows.iter().map(|(_, b)| b.stack),
                ))
            }),
        ];
        sink.put(n, columns)?;
    }
    Ok(())
}

fn write_frames(sink: &mut dyn Sink, input: &ExportInput<'_>) -> Result<()> {
    let snap = input.snap;
    let all: Vec<(u32, u32, u32)> = (0..snap.stack_ranges.len() as u32)
        .flat_map(|id| {
            snap.stack(id)
                .iter()
                .enumerate()
                .map(move |(d, &f)| (id, d as u32, f))
        })
        .collect();
    for rows in all.chunks(BATCH_ROWS) {
        let n = rows.len();
        let file = input.file.as_str();
        let columns: Vec<Column<'_>> = vec![
            Box::new(move || repeated(file, n)),
            Box::new(move || Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.0)))),
            Box::new(move || Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.1)))),
            Box::new(move || dictionary(rows.iter().map(|r| snap.str(snap.frame(r.2).filename)))),
            Box::new(move || {
                Arc::new(UInt32Array::from_iter_values(
                    rows.iter().map(|r| snap.frame(r.2).line),
                ))
            }),
            Box::new(move || dictionary(rows.iter().map(|r| snap.str(snap.frame(r.2).name)))),
        ];
        sink.put(n, columns)?;
    }
    Ok(())
}

/// An Arrow IPC stream being written to memory (one table of [`to_ipc`]).
struct Ipc {
    schema: SchemaRef,
    writer: arrow_ipc::writer::StreamWriter<Vec<u8>>,
}

impl Ipc {
    fn new(schema: SchemaRef) -> Result<Ipc> {
        let writer =
            arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &schema).map_err(ipc_err)?;
        Ok(Ipc { schema, writer })
    }

    fn finish(self) -> Result<Vec<u8>> {
        self.writer.into_inner().map_err(ipc_err)
    }
}

impl Sink for Ipc {
    fn put(&mut self, _rows: usize, columns: Vec<Column<'_>>) -> Result<()> {
        let columns: Vec<ArrayRef> = columns.into_par_iter().map(|build| build()).collect();
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(ipc_err)?;
        self.writer.write(&batch).map_err(ipc_err)
    }
}

fn ipc_err(e: impl std::fmt::Display) -> Error {
    Error::Usage(format!("Arrow IPC: {e}"))
}

/// The four tables of one snapshot (`events`, `blocks`, `segments`,
/// `frames`, in that order, with the columns of the Parquet files) as Arrow
/// IPC streams in memory: what Python's `snap.to_arrow()` reads with
/// `pyarrow.ipc.open_stream`.
pub fn to_ipc(input: &ExportInput<'_>) -> Result<[(&'static str, Vec<u8>); 4]> {
    let mut events = Ipc::new(events_schema())?;
    write_events(&mut events, input)?;
    let mut blocks = Ipc::new(blocks_schema())?;
    write_blocks(&mut blocks, input)?;
    let mut segments = Ipc::new(segments_schema())?;
    write_segments(&mut segments, input)?;
    let mut frames = Ipc::new(frames_schema())?;
    write_frames(&mut frames, input)?;
    Ok([
        ("events", events.finish()?),
        ("blocks", blocks.finish()?),
        ("segments", segments.finish()?),
        ("frames", frames.finish()?),
    ])
}

#[cfg(test)]
mod tests {
    use super::steps_of;

    /// A batch that starts inside a step continues its numbering.
    #[test]
    fn steps_of_a_batch_start_inside_a_step() {
        let starts = [0, 5, 9];
        let got = steps_of(&starts, 6..11);
        assert_eq!(got.values().to_vec(), [1, 1, 1, 2, 2]);
        assert_eq!(steps_of(&starts, 0..2).values().to_vec(), [0, 0]);
    }
}
