//! `memlens export` (feature `export`): the Parquet tables of the 2-rank
//! corpus job read back with the Parquet reader, rows and sums equal to the
//! snapshots. (CI also queries two fixtures' tables with DuckDB:
//! tests/export/ci.sh.)
#![cfg(feature = "export")]

use memlens::export::{export, ExportInput};
use memlens::snapshot::{Action, BlockState};
use memlens::Snapshot;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::path::{Path, PathBuf};

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/ranks")
        .join(name)
}

/// Every batch of a table, as (rows, the named u64 column summed where `keep`
/// holds on the row's action/state string column).
fn read(path: &Path) -> Vec<arrow_array::RecordBatch> {
    let f = std::fs::File::open(path).expect("table written");
    ParquetRecordBatchReaderBuilder::try_new(f)
        .expect("parquet")
        .build()
        .expect("reader")
        .map(|b| b.expect("batch"))
        .collect()
}

#[test]
fn tables_hold_every_event_block_segment_and_frame() {
    let snaps: Vec<(String, Snapshot)> = (0..2)
        .map(|r| {
            let p = corpus(&format!("ddp_ema.rank{r}.pickle.zst"));
            (p.display().to_string(), Snapshot::load(&p).expect("loads"))
        })
        .collect();
    let inputs: Vec<ExportInput> = snaps
        .iter()
        .enumerate()
        .map(|(r, (n, s))| ExportInput {
            file: n.clone(),
            rank: Some(r as u32),
            snap: s,
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let counts = export(&inputs, dir.path()).expect("export");
    let events: usize = snaps.iter().map(|(_, s)| s.event_count()).sum();
    let blocks: usize = snaps
        .iter()
        .map(|(_, s)| s.segments.iter().map(|g| g.blocks.len()).sum::<usize>())
        .sum();
    let segments: usize = snaps.iter().map(|(_, s)| s.segments.len()).sum();
    let frames: usize = snaps.iter().map(|(_, s)| s.stack_frames.len()).sum();
    assert_eq!(counts.events as usize, events);
    assert_eq!(counts.blocks as usize, blocks);
    assert_eq!(counts.segments as usize, segments);
    assert_eq!(counts.frames as usize, frames);

    // Read back: rows, the alloc bytes and the allocated block bytes.
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, UInt64Type};
    let ev = read(&dir.path().join("events.parquet"));
    let rows: usize = ev.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, events);
    let mut alloc_bytes = 0u64;
    let mut ranks = std::collections::BTreeSet::new();
    for b in &ev {
        let action = b.column_by_name("action").expect("action");
        let action = arrow_cast_dict(action);
        let size = b
            .column_by_name("size")
            .expect("size")
            .as_primitive::<UInt64Type>();
        let rank = b
            .column_by_name("rank")
            .expect("rank")
            .as_primitive::<Int32Type>();
        for (i, a) in action.iter().enumerate().take(b.num_rows()) {
            if a == "alloc" {
                alloc_bytes += size.value(i);
            }
            ranks.insert(rank.value(i));
        }
    }
    let want: u64 = snaps
        .iter()
        .flat_map(|(_, s)| s.traces.iter().flat_map(|t| &t.events))
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.size)
        .sum();
    assert_eq!(alloc_bytes, want);
    assert_eq!(ranks.into_iter().collect::<Vec<_>>(), [0, 1]);

    let bl = read(&dir.path().join("blocks.parquet"));
    let mut allocated = 0u64;
    for b in &bl {
        let state = arrow_cast_dict(b.column_by_name("state").expect("state"));
        let size = b
            .column_by_name("size")
            .expect("size")
            .as_primitive::<UInt64Type>();
        for (i, st) in state.iter().enumerate().take(b.num_rows()) {
            if st == "active_allocated" {
                allocated += size.value(i);
            }
        }
    }
    let want: u64 = snaps
        .iter()
        .flat_map(|(_, s)| s.segments.iter().flat_map(|g| &g.blocks))
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| b.size)
        .sum();
    assert_eq!(allocated, want);
}

/// The strings of a dictionary column, row by row.
fn arrow_cast_dict(a: &arrow_array::ArrayRef) -> Vec<String> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    let d = a.as_dictionary::<Int32Type>();
    let values = d.values().as_string::<i32>();
    d.keys()
        .iter()
        .map(|k| values.value(k.expect("no nulls") as usize).to_string())
        .collect()
}

/// `to_ipc` (Python's `snap.to_arrow()`): the four tables as Arrow IPC
/// streams, their rows and byte sums equal to the snapshot.
#[test]
fn ipc_streams_hold_the_same_tables() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    let p = corpus("ddp_ema.rank0.pickle.zst");
    let snap = Snapshot::load(&p).expect("loads");
    let tables = memlens::export::to_ipc(&ExportInput {
        file: "rank0".into(),
        rank: Some(0),
        snap: &snap,
    })
    .expect("ipc");
    let names: Vec<&str> = tables.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["events", "blocks", "segments", "frames"]);
    let batches = |i: usize| -> Vec<arrow_array::RecordBatch> {
        arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(&tables[i].1), None)
            .expect("stream")
            .map(|b| b.expect("batch"))
            .collect()
    };
    let rows = |i: usize| batches(i).iter().map(|b| b.num_rows()).sum::<usize>();
    let blocks: Vec<_> = snap.segments.iter().flat_map(|g| &g.blocks).collect();
    assert_eq!(rows(0), snap.event_count());
    assert_eq!(rows(1), blocks.len());
    assert_eq!(rows(2), snap.segments.len());
    assert_eq!(rows(3), snap.stack_frames.len());
    let mut alloc_bytes = 0u64;
    for b in batches(0) {
        let action = arrow_cast_dict(b.column_by_name("action").expect("action"));
        let size = b
            .column_by_name("size")
            .expect("size")
            .as_primitive::<UInt64Type>();
        for (i, a) in action.iter().enumerate() {
            if a == "alloc" {
                alloc_bytes += size.value(i);
            }
        }
    }
    let want: u64 = snap
        .traces
        .iter()
        .flat_map(|t| &t.events)
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.size)
        .sum();
    assert_eq!(alloc_bytes, want);
    let total: u64 = batches(2)
        .iter()
        .map(|b| {
            let c = b.column_by_name("total_size").expect("total_size");
            c.as_primitive::<UInt64Type>().values().iter().sum::<u64>()
        })
        .sum();
    assert_eq!(
        total,
        snap.segments.iter().map(|s| s.total_size).sum::<u64>()
    );
}

mod common;

/// Issue 31 item 4: the allocated peak rebuilt from the events table (a
/// running sum of `allocated_size`, `alloc` +, `free_requested` -) is the
/// peak `memlens peak` reports, to the byte; the recorded sizes (requests)
/// fall short.
#[test]
fn the_allocated_peak_is_rebuilt_from_the_events_table() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::Array;
    let p = common::fixture("varlen.pickle.zst");
    let snap = Snapshot::load(&p).expect("loads");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = ExportInput {
        file: p.display().to_string(),
        rank: None,
        snap: &snap,
    };
    export(std::slice::from_ref(&input), dir.path()).expect("export");
    let (mut allocated, mut requested) = (0i128, 0i128);
    let (mut peak_allocated, mut peak_requested) = (0i128, 0i128);
    let mut nulls = 0;
    for b in read(&dir.path().join("events.parquet")) {
        let action = arrow_cast_dict(b.column_by_name("action").expect("action"));
        let size = b
            .column_by_name("size")
            .expect("size")
            .as_primitive::<UInt64Type>();
        let rounded = b
            .column_by_name("allocated_size")
            .expect("allocated_size")
            .as_primitive::<UInt64Type>();
        for (i, a) in action.iter().enumerate() {
            let sign = match a.as_str() {
                "alloc" => 1,
                "free_requested" => -1,
                _ => continue,
            };
            if rounded.is_null(i) {
                nulls += 1;
                continue;
            }
            allocated += sign * rounded.value(i) as i128;
            requested += sign * size.value(i) as i128;
            peak_allocated = peak_allocated.max(allocated);
            peak_requested = peak_requested.max(requested);
        }
    }
    assert_eq!(nulls, 0);
    let report = memlens::analysis::peak::peak(&snap, 5);
    assert_eq!(peak_allocated, report.peak_allocated_bytes as i128);
    // The same sum over the recorded sizes falls short (17.3 MiB here).
    assert!(peak_requested < peak_allocated - (16 << 20));
}

/// Event rows carry `allocated_size` in the IPC streams too: on the rows of
/// blocks (at least the request), null on the others (segment events,
/// `snapshot`, `oom`).
#[test]
fn ipc_events_carry_the_allocated_size() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::Array;
    let p = corpus("ddp_ema.rank0.pickle.zst");
    let snap = Snapshot::load(&p).expect("loads");
    let tables = memlens::export::to_ipc(&ExportInput {
        file: "rank0".into(),
        rank: Some(0),
        snap: &snap,
    })
    .expect("ipc");
    let (mut sized, mut blocks) = (0, 0);
    for b in arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(&tables[0].1), None)
        .expect("stream")
    {
        let b = b.expect("batch");
        let action = arrow_cast_dict(b.column_by_name("action").expect("action"));
        let size = b
            .column_by_name("size")
            .expect("size")
            .as_primitive::<UInt64Type>();
        let rounded = b
            .column_by_name("allocated_size")
            .expect("allocated_size")
            .as_primitive::<UInt64Type>();
        for (i, a) in action.iter().enumerate() {
            let block = matches!(a.as_str(), "alloc" | "free_requested" | "free_completed");
            if rounded.is_valid(i) {
                assert!(block, "row {i} {a}");
                assert!(rounded.value(i) >= size.value(i), "row {i} {a}");
                sized += 1;
            }
            blocks += block as usize;
        }
    }
    assert_eq!(sized, blocks);
}

/// `allocated_size` is kept as the exceptions to a rule (the request rounded
/// as by default): on fixtures where the rule often fails (unsplit
/// remainders, `max_split_size_mb`, expandable segments, a trace that begins
/// late, an OOM) every row still equals the replay's own block size, event
/// by event, and is null exactly where the replay gives none.
#[test]
fn allocated_sizes_equal_the_replay_s_on_every_event() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::Array;
    use memlens::replay::{Delta, Replay, ReplayOptions};
    use memlens::sim::rounding::round_size;
    let mut off_rule = 0;
    for name in [
        "varlen@maxsplit64.pickle.zst",
        "varlen@expandable.pickle.zst",
        "long.pickle.zst",
        "oom.pickle.zst",
        "resnet.pickle.zst",
    ] {
        let p = common::fixture(name);
        let snap = Snapshot::load(&p).expect("loads");
        let device = snap.traces[0].device;
        let mut want = vec![None; snap.traces[0].events.len()];
        let mut replay = Replay::new(&snap, device, &ReplayOptions::default());
        while let Some(step) = replay.step() {
            if let Delta::Alloc { size, .. }
            | Delta::FreeRequested { size, .. }
            | Delta::FreeCompleted { size, .. } = step.delta
            {
                want[step.index] = Some(size);
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let input = ExportInput {
            file: name.to_string(),
            rank: None,
            snap: &snap,
        };
        export(std::slice::from_ref(&input), dir.path()).expect("export");
        let mut got = Vec::new();
        for b in read(&dir.path().join("events.parquet")) {
            let sizes = b
                .column_by_name("allocated_size")
                .expect("allocated_size")
                .as_primitive::<UInt64Type>();
            got.extend((0..b.num_rows()).map(|i| (!sizes.is_null(i)).then(|| sizes.value(i))));
        }
        assert_eq!(got.len(), want.len(), "{name}");
        let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(differ, 0, "{name}: {differ} rows differ from the replay");
        let config = memlens::sim::AllocatorConfig::default();
        off_rule += snap.traces[0]
            .events
            .iter()
            .zip(&got)
            .filter(|(e, g)| {
                e.action == memlens::snapshot::Action::Alloc
                    && **g != Some(round_size(&config, e.size))
            })
            .count();
    }
    // The exceptions are exercised: blocks larger than their rounded request.
    assert!(off_rule > 100, "only {off_rule} allocations off the rule");
}
