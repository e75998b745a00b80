//! `memlens export`: snapshots as Parquet tables that DuckDB, Spark, Polars
//! or pandas query directly, many snapshots at once.
//!
//! Four files in the output folder, one row per:
//! * `events.parquet`: trace event (`file`, `rank`, `device`, `index`,
//!   `time_us`, `action`, `addr`, `size`, `stream`, `stack_id`, `step`);
//! * `blocks.parquet`: block at dump time (`file`, `rank`, `device`,
//!   `segment_address`, `address`, `size`, `requested_size`, `state`, `stack_id`);
//! * `segments.parquet`: segment at dump time (`file`, `rank`, `device`,
//!   `address`, `total_size`, `allocated_size`, `active_size`,
//!   `requested_size`, `stream`, `pool`, `pool_id`, `is_expandable`, `stack_id`);
//! * `frames.parquet`: frame of a stack (`file`, `stack_id`, `depth` (0 is the
//!   innermost), `filename`, `line`, `name`).
//!
//! `stack_id` is per file: join frames on (`file`, `stack_id`). Rows are
//! written in batches of [`BATCH_ROWS`], so memory stays bounded by the
//! snapshot being exported plus one batch, whatever the number of files.

use crate::error::{Error, Result};
use crate::snapshot::{Action, BlockState, PoolKind, Snapshot};
use crate::trace::Analysed;
use arrow_array::builder::{
    BooleanBuilder, Int32Builder, Int64Builder, StringBuilder, StringDictionaryBuilder,
    UInt32Builder, UInt64Builder,
};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, Int32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per record batch (and per Parquet row group at most).
pub const BATCH_ROWS: usize = 1 << 20;

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

/// A Parquet file being written, with the path for errors.
struct Table {
    path: PathBuf,
    writer: ArrowWriter<File>,
    schema: SchemaRef,
    rows: u64,
}

impl Table {
    fn create(dir: &Path, name: &str, schema: SchemaRef) -> Result<Table> {
        let path = dir.join(name);
        let file = File::create(&path).map_err(|error| Error::Io {
            path: path.clone(),
            error,
        })?;
        // zstd level 1: a third of the size of uncompressed columns at little
        // cost to the export's speed.
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(BATCH_ROWS))
            .build();
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))
            .map_err(|e| parquet_err(&path, e))?;
        Ok(Table {
            path,
            writer,
            schema,
            rows: 0,
        })
    }

    fn write(&mut self, columns: Vec<ArrayRef>) -> Result<()> {
        let batch = RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| parquet_err(&self.path, e))?;
        self.rows += batch.num_rows() as u64;
        self.writer
            .write(&batch)
            .map_err(|e| parquet_err(&self.path, e))
    }

    fn close(self) -> Result<u64> {
        let path = self.path;
        self.writer.close().map_err(|e| parquet_err(&path, e))?;
        Ok(self.rows)
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
    coded(vec![0; n], &[value])
}

/// A dictionary column from its codes and values (no hashing per row).
fn coded(keys: Vec<i32>, values: &[&str]) -> ArrayRef {
    let keys = Int32Array::from(keys);
    let values: ArrayRef = Arc::new(StringArray::from(values.to_vec()));
    // The codes are in range by construction; an error here is a defect.
    Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values).expect("codes index the values"))
}

fn ranks(rank: Option<u32>, n: usize) -> ArrayRef {
    let mut b = Int32Builder::with_capacity(n);
    for _ in 0..n {
        b.append_option(rank.map(|r| r as i32));
    }
    Arc::new(b.finish())
}

/// The four tables being written; add snapshots one at a time (each may be
/// dropped once added), then [`Exporter::finish`].
pub struct Exporter {
    events: Table,
    blocks: Table,
    segments: Table,
    frames: Table,
}

impl Exporter {
    /// Creates `dir` if missing and the four files in it.
    pub fn create(dir: &Path) -> Result<Exporter> {
        std::fs::create_dir_all(dir).map_err(|error| Error::Io {
            path: dir.into(),
            error,
        })?;
        Ok(Exporter {
            events: Table::create(dir, "events.parquet", events_schema())?,
            blocks: Table::create(dir, "blocks.parquet", blocks_schema())?,
            segments: Table::create(dir, "segments.parquet", segments_schema())?,
            frames: Table::create(dir, "frames.parquet", frames_schema())?,
        })
    }

    /// Writes the rows of one snapshot.
    pub fn add(&mut self, input: &ExportInput<'_>) -> Result<()> {
        write_events(&mut self.events, input)?;
        write_segments(&mut self.segments, &mut self.blocks, input)?;
        write_frames(&mut self.frames, input)
    }

    /// Closes the files (writing their footers) and returns the rows written.
    pub fn finish(self) -> Result<ExportCounts> {
        Ok(ExportCounts {
            events: self.events.close()?,
            blocks: self.blocks.close()?,
            segments: self.segments.close()?,
            frames: self.frames.close()?,
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

fn write_events(table: &mut Table, input: &ExportInput<'_>) -> Result<()> {
    let snap = input.snap;
    let an = Analysed::new(snap);
    for (t, trace) in snap.traces.iter().enumerate() {
        let starts = &an.traces[t].steps.starts;
        let mut step = 0usize;
        for (c, chunk) in trace.events.chunks(BATCH_ROWS).enumerate() {
            let n = chunk.len();
            let base = c * BATCH_ROWS;
            let mut index = UInt32Builder::with_capacity(n);
            let mut time = Int64Builder::with_capacity(n);
            let mut action: Vec<i32> = Vec::with_capacity(n);
            let mut addr = UInt64Builder::with_capacity(n);
            let mut size = UInt64Builder::with_capacity(n);
            let mut stream = Int64Builder::with_capacity(n);
            let mut stack = UInt32Builder::with_capacity(n);
            let mut steps = UInt32Builder::with_capacity(n);
            for (k, e) in chunk.iter().enumerate() {
                let i = base + k;
                while step + 1 < starts.len() && starts[step + 1] <= i {
                    step += 1;
                }
                index.append_value(i as u32);
                time.append_value(e.time_us);
                action.push(e.action as i32);
                addr.append_value(e.addr);
                size.append_value(e.size);
                stream.append_value(snap.stream(e.stream));
                stack.append_value(e.stack);
                steps.append_value(step as u32);
            }
            let mut device = Int32Builder::with_capacity(n);
            device.append_value_n(trace.device as i32, n);
            table.write(vec![
                repeated(&input.file, n),
                ranks(input.rank, n),
                Arc::new(device.finish()),
                Arc::new(index.finish()),
                Arc::new(time.finish()),
                coded(action, &Action::ALL.map(Action::as_str)),
                Arc::new(addr.finish()),
                Arc::new(size.finish()),
                Arc::new(stream.finish()),
                Arc::new(stack.finish()),
                Arc::new(steps.finish()),
            ])?;
        }
    }
    Ok(())
}

fn state_name(s: BlockState) -> &'static str {
    match s {
        BlockState::ActiveAllocated => "active_allocated",
        BlockState::ActivePendingFree => "active_pending_free",
        BlockState::Inactive => "inactive",
    }
}

fn write_segments(segs: &mut Table, blocks: &mut Table, input: &ExportInput<'_>) -> Result<()> {
    let snap = input.snap;
    for chunk in snap.segments.chunks(BATCH_ROWS) {
        let n = chunk.len();
        let mut device = Int32Builder::with_capacity(n);
        let mut address = UInt64Builder::with_capacity(n);
        let mut total = UInt64Builder::with_capacity(n);
        let mut allocated = UInt64Builder::with_capacity(n);
        let mut active = UInt64Builder::with_capacity(n);
        let mut requested = UInt64Builder::with_capacity(n);
        let mut stream = Int64Builder::with_capacity(n);
        let mut pool = StringDictionaryBuilder::<Int32Type>::new();
        let mut pool_id = StringBuilder::new();
        let mut expandable = BooleanBuilder::with_capacity(n);
        let mut stack = UInt32Builder::with_capacity(n);
        for s in chunk {
            device.append_value(s.device as i32);
            address.append_value(s.address);
            total.append_value(s.total_size);
            allocated.append_value(s.allocated_size);
            active.append_value(s.active_size);
            requested.append_value(s.requested_size);
            stream.append_value(snap.stream(s.stream));
            pool.append_value(match s.pool {
                PoolKind::Small => "small",
                PoolKind::Large => "large",
            });
            pool_id.append_value(format!("{},{}", s.pool_id.0, s.pool_id.1));
            expandable.append_value(s.is_expandable);
            stack.append_value(s.stack);
        }
        segs.write(vec![
            repeated(&input.file, n),
            ranks(input.rank, n),
            Arc::new(device.finish()),
            Arc::new(address.finish()),
            Arc::new(total.finish()),
            Arc::new(allocated.finish()),
            Arc::new(active.finish()),
            Arc::new(requested.finish()),
            Arc::new(stream.finish()),
            Arc::new(pool.finish()),
            Arc::new(pool_id.finish()),
            Arc::new(expandable.finish()),
            Arc::new(stack.finish()),
        ])?;
    }
    let all: Vec<(&crate::snapshot::Segment, &crate::snapshot::Block)> = snap
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(move |b| (s, b)))
        .collect();
    for chunk in all.chunks(BATCH_ROWS) {
        let n = chunk.len();
        let mut device = Int32Builder::with_capacity(n);
        let mut seg = UInt64Builder::with_capacity(n);
        let mut address = UInt64Builder::with_capacity(n);
        let mut size = UInt64Builder::with_capacity(n);
        let mut requested = UInt64Builder::with_capacity(n);
        let mut state = StringDictionaryBuilder::<Int32Type>::new();
        let mut stack = UInt32Builder::with_capacity(n);
        for (s, b) in chunk {
            device.append_value(s.device as i32);
            seg.append_value(s.address);
            address.append_value(b.address);
            size.append_value(b.size);
            requested.append_value(b.requested_size);
            state.append_value(state_name(b.state));
            stack.append_value(b.stack);
        }
        blocks.write(vec![
            repeated(&input.file, n),
            ranks(input.rank, n),
            Arc::new(device.finish()),
            Arc::new(seg.finish()),
            Arc::new(address.finish()),
            Arc::new(size.finish()),
            Arc::new(requested.finish()),
            Arc::new(state.finish()),
            Arc::new(stack.finish()),
        ])?;
    }
    Ok(())
}

fn write_frames(table: &mut Table, input: &ExportInput<'_>) -> Result<()> {
    let snap = input.snap;
    let rows: Vec<(u32, u32, u32)> = (0..snap.stack_ranges.len() as u32)
        .flat_map(|id| {
            snap.stack(id)
                .iter()
                .enumerate()
                .map(move |(d, &f)| (id, d as u32, f))
        })
        .collect();
    for chunk in rows.chunks(BATCH_ROWS) {
        let n = chunk.len();
        let mut stack = UInt32Builder::with_capacity(n);
        let mut depth = UInt32Builder::with_capacity(n);
        let mut filename = StringDictionaryBuilder::<Int32Type>::new();
        let mut line = UInt32Builder::with_capacity(n);
        let mut name = StringDictionaryBuilder::<Int32Type>::new();
        for &(id, d, f) in chunk {
            let fr = snap.frame(f);
            stack.append_value(id);
            depth.append_value(d);
            filename.append_value(snap.str(fr.filename));
            line.append_value(fr.line);
            name.append_value(snap.str(fr.name));
        }
        table.write(vec![
            repeated(&input.file, n),
            Arc::new(stack.finish()),
            Arc::new(depth.finish()),
            Arc::new(filename.finish()),
            Arc::new(line.finish()),
            Arc::new(name.finish()),
        ])?;
    }
    Ok(())
}
