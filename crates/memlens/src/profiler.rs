//! Chrome traces exported by `torch.profiler` (`profile_memory=True`,
//! `prof.export_chrome_trace(path)`) as input to `summary` and `peak`.
//!
//! Such a trace holds, for every allocation and free while the profiler ran,
//! a `[memory]` instant event: address, bytes (negative for a free), the
//! allocator's `Total Allocated` and `Total Reserved` after it, and the device;
//! and the `cpu_op` events (operators, with start and duration, per thread).
//! From those memlens says what it can: the peaks (the largest `Total
//! Allocated`, which equals `torch.cuda.max_memory_allocated()` when the peak
//! was reached while profiling), the timeline, and what was live at the peak by
//! the operator that allocated it. What it cannot say (no stacks, no
//! segments, nothing from before the profiler started) is listed in
//! [`SNAPSHOT_WOULD_ADD`].

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

/// `Device Type` of CUDA in the `[memory]` events (`c10::DeviceType::CUDA`).
const CUDA: i64 = 1;

/// Points kept in the timeline.
const TIMELINE_POINTS: usize = 200;

/// What a memory snapshot would add to a profiler trace.
pub const SNAPSHOT_WOULD_ADD: &[&str] = &[
    "the Python stack of every allocation (file:line of your code), not only the operator",
    "the blocks allocated before the profiler started (parameters, optimizer state), by site",
    "segments and free memory inside them (fragmentation, what an OOM could not use)",
    "categories (parameter, gradient, optimizer state, activation, temporary) and leak verdicts across steps",
    "the allocator's settings, and replays under other PYTORCH_CUDA_ALLOC_CONF settings",
];

/// One `[memory]` event.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryEvent {
    /// Microseconds (the trace's clock).
    pub ts: f64,
    /// Thread.
    pub tid: String,
    /// Block address.
    pub addr: u64,
    /// Bytes: positive for an allocation, negative for a free.
    pub bytes: i64,
    /// Allocated bytes on the device after the event.
    pub total_allocated: u64,
    /// Reserved bytes on the device after the event.
    pub total_reserved: u64,
    /// Device index.
    pub device: i64,
}

/// One operator (`cpu_op` event).
#[derive(Clone, Debug, PartialEq)]
pub struct Operator {
    /// Name (`aten::linear`).
    pub name: String,
    /// Thread.
    pub tid: String,
    /// Start, microseconds.
    pub ts: f64,
    /// Duration, microseconds.
    pub dur: f64,
}

/// The parts of a Chrome trace memlens reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfilerTrace {
    /// The file.
    pub path: PathBuf,
    /// CUDA `[memory]` events, in time order.
    pub memory: Vec<MemoryEvent>,
    /// Operators, by start time.
    pub operators: Vec<Operator>,
    /// GPU names from `deviceProperties`.
    pub gpus: Vec<String>,
}

#[derive(Deserialize)]
struct RawTrace {
    #[serde(rename = "traceEvents", default)]
    events: Vec<RawEvent>,
    #[serde(rename = "deviceProperties", default)]
    devices: Vec<RawDevice>,
}

#[derive(Deserialize)]
struct RawDevice {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    tid: serde_json::Value,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    args: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ProfilerTrace {
    /// Reads a Chrome trace (plain, gzip or zstd).
    pub fn load(path: &Path) -> Result<ProfilerTrace> {
        let (_, mut reader) = crate::input::open(path)?;
        let mut text = Vec::new();
        reader.read_to_end(&mut text).map_err(|error| Error::Io {
            path: path.into(),
            error,
        })?;
        Self::from_json(&text, path)
    }

    /// Parses the JSON text of a Chrome trace.
    pub fn from_json(text: &[u8], path: &Path) -> Result<ProfilerTrace> {
        let raw: RawTrace = serde_json::from_slice(text).map_err(|e| Error::UnknownFormat {
            path: path.into(),
            what: format!("not a readable Chrome trace: {e}"),
        })?;
        let mut t = ProfilerTrace {
            path: path.into(),
            gpus: raw.devices.into_iter().map(|d| d.name).collect(),
            ..ProfilerTrace::default()
        };
        for e in raw.events {
            let tid = match &e.tid {
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let Some(ts) = e.ts else { continue };
            if e.name == "[memory]" {
                let Some(args) = &e.args else { continue };
                let int = |k: &str| args.get(k).and_then(|v| v.as_i64());
                if int("Device Type") != Some(CUDA) {
                    continue;
                }
                let num = |k: &str| int(k).map(|v| v.max(0) as u64).unwrap_or(0);
                t.memory.push(MemoryEvent {
                    ts,
                    tid,
                    addr: args.get("Addr").and_then(|v| v.as_u64()).unwrap_or(0),
                    bytes: int("Bytes").unwrap_or(0),
                    total_allocated: num("Total Allocated"),
                    total_reserved: num("Total Reserved"),
                    device: int("Device Id").unwrap_or(0),
                });
            } else if e.ph == "X" && e.cat == "cpu_op" {
                t.operators.push(Operator {
                    name: e.name,
                    tid,
                    ts,
                    dur: e.dur.unwrap_or(0.0),
                });
            }
        }
        // Stable sorts: events at the same microsecond keep the file's order.
        t.memory.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        t.operators.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        Ok(t)
    }

    /// CUDA devices with memory events.
    pub fn devices(&self) -> Vec<i64> {
        let mut d: Vec<i64> = self.memory.iter().map(|e| e.device).collect();
        d.sort_unstable();
        d.dedup();
        d
    }
}

/// One device's figures from a trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceDevice {
    /// Device index.
    pub device: i64,
    /// Highest `Total Allocated` (`max_memory_allocated()` when the peak was
    /// reached while profiling).
    pub peak_allocated_bytes: u64,
    /// Highest `Total Reserved`.
    pub peak_reserved_bytes: u64,
    /// Allocated when the profiler started (before its first event).
    pub allocated_at_start_bytes: u64,
    /// Allocated after the last event.
    pub allocated_at_end_bytes: u64,
    /// Reserved after the last event.
    pub reserved_at_end_bytes: u64,
    /// Allocations recorded.
    pub allocations: u64,
    /// Frees recorded.
    pub frees: u64,
    /// Bytes allocated over the trace.
    pub allocated_total_bytes: u64,
    /// Microseconds from the first memory event to the peak.
    pub peak_at_us: f64,
}

/// `memlens summary` of a profiler trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceSummary {
    /// What the input is.
    pub input: &'static str,
    /// GPU names.
    pub gpus: Vec<String>,
    /// Per device.
    pub devices: Vec<TraceDevice>,
    /// Operators recorded.
    pub operators: u64,
    /// (microseconds since the first memory event, allocated bytes) of the
    /// device with the highest peak: at most 200 points, each the highest in its span.
    pub timeline: Vec<(f64, u64)>,
    /// What a memory snapshot would add.
    pub snapshot_would_add: Vec<String>,
}

/// Live memory at the peak of one operator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperatorShare {
    /// The outermost operator running when the blocks were allocated
    /// (`aten::linear`), or `(allocated before the profiler started)`, or
    /// `(no operator)`.
    pub operator: String,
    /// The innermost one, for the largest block (`aten::empty_strided`).
    pub innermost: Option<String>,
    /// Bytes.
    pub bytes: u64,
    /// Blocks (0 for the memory from before the trace: its blocks are unknown).
    pub count: u64,
}

/// `memlens peak` of a profiler trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TracePeak {
    /// What the input is.
    pub input: &'static str,
    /// The device with the highest peak.
    pub device: i64,
    /// Its allocated peak.
    pub peak_allocated_bytes: u64,
    /// Its reserved peak.
    pub peak_reserved_bytes: u64,
    /// Microseconds from the first memory event to the peak.
    pub peak_at_us: f64,
    /// What was live at the peak by operator, largest first; sums to the peak.
    pub live_at_peak: Vec<OperatorShare>,
    /// Operators beyond `top`.
    pub other_operators: usize,
    /// What a memory snapshot would add.
    pub snapshot_would_add: Vec<String>,
}

/// Label of the memory live when the profiler started.
pub const BEFORE_TRACE: &str = "(allocated before the profiler started)";

fn device_figures(t: &ProfilerTrace, device: i64) -> TraceDevice {
    let ev: Vec<&MemoryEvent> = t.memory.iter().filter(|e| e.device == device).collect();
    let start = ev
        .first()
        .map_or(0, |e| (e.total_allocated as i64 - e.bytes).max(0) as u64);
    let t0 = ev.first().map_or(0.0, |e| e.ts);
    let mut d = TraceDevice {
        device,
        peak_allocated_bytes: start,
        peak_reserved_bytes: 0,
        allocated_at_start_bytes: start,
        allocated_at_end_bytes: ev.last().map_or(start, |e| e.total_allocated),
        reserved_at_end_bytes: ev.last().map_or(0, |e| e.total_reserved),
        allocations: 0,
        frees: 0,
        allocated_total_bytes: 0,
        peak_at_us: 0.0,
    };
    for e in &ev {
        if e.total_allocated > d.peak_allocated_bytes {
            d.peak_allocated_bytes = e.total_allocated;
            d.peak_at_us = e.ts - t0;
        }
        d.peak_reserved_bytes = d.peak_reserved_bytes.max(e.total_reserved);
        if e.bytes > 0 {
            d.allocations += 1;
            d.allocated_total_bytes += e.bytes as u64;
        } else if e.bytes < 0 {
            d.frees += 1;
        }
    }
    d
}

fn would_add() -> Vec<String> {
    SNAPSHOT_WOULD_ADD.iter().map(|s| s.to_string()).collect()
}

/// The summary of a trace.
pub fn summary(t: &ProfilerTrace) -> TraceSummary {
    let devices: Vec<TraceDevice> = t
        .devices()
        .into_iter()
        .map(|d| device_figures(t, d))
        .collect();
    let best = devices
        .iter()
        .max_by_key(|d| d.peak_allocated_bytes)
        .map(|d| d.device);
    let ev: Vec<&MemoryEvent> = t.memory.iter().filter(|e| Some(e.device) == best).collect();
    let mut timeline: Vec<(f64, u64)> = Vec::new();
    if let (Some(first), Some(last)) = (ev.first(), ev.last()) {
        let span = (last.ts - first.ts).max(1.0);
        let mut buckets: BTreeMap<usize, (f64, u64)> = BTreeMap::new();
        for e in &ev {
            let k = (((e.ts - first.ts) / span) * (TIMELINE_POINTS - 1) as f64) as usize;
            let b = buckets
                .entry(k)
                .or_insert((e.ts - first.ts, e.total_allocated));
            if e.total_allocated > b.1 {
                *b = (e.ts - first.ts, e.total_allocated);
            }
        }
        timeline = buckets.into_values().collect();
    }
    TraceSummary {
        input: "torch.profiler Chrome trace",
        gpus: t.gpus.clone(),
        devices,
        operators: t.operators.len() as u64,
        timeline,
        snapshot_would_add: would_add(),
    }
}

/// The peak of the device with the highest one, and what was live at it by operator.
pub fn peak(t: &ProfilerTrace, top: usize) -> TracePeak {
    let figures: Vec<TraceDevice> = t
        .devices()
        .into_iter()
        .map(|d| device_figures(t, d))
        .collect();
    let Some(dev) = figures
        .iter()
        .max_by_key(|d| d.peak_allocated_bytes)
        .cloned()
    else {
        return TracePeak {
            input: "torch.profiler Chrome trace",
            device: 0,
            peak_allocated_bytes: 0,
            peak_reserved_bytes: 0,
            peak_at_us: 0.0,
            live_at_peak: Vec::new(),
            other_operators: 0,
            snapshot_would_add: would_add(),
        };
    };
    // Replay by address up to the (first) event that reached the peak.
    let mut live: HashMap<u64, &MemoryEvent> = HashMap::new();
    for e in t.memory.iter().filter(|e| e.device == dev.device) {
        if e.bytes > 0 {
            live.insert(e.addr, e);
        } else if e.bytes < 0 {
            live.remove(&e.addr);
        }
        if e.total_allocated == dev.peak_allocated_bytes {
            break;
        }
    }
    let ops = OperatorIndex::new(&t.operators);
    let mut groups: HashMap<String, OperatorShare> = HashMap::new();
    let mut known = 0u64;
    let mut largest: HashMap<String, u64> = HashMap::new();
    for e in live.values() {
        let (outer, inner) = ops.at(&e.tid, e.ts);
        let name = outer.unwrap_or("(no operator)").to_string();
        let g = groups.entry(name.clone()).or_insert_with(|| OperatorShare {
            operator: name.clone(),
            innermost: None,
            bytes: 0,
            count: 0,
        });
        g.bytes += e.bytes as u64;
        g.count += 1;
        known += e.bytes as u64;
        let l = largest.entry(name).or_default();
        if e.bytes as u64 > *l {
            *l = e.bytes as u64;
            g.innermost = inner.map(str::to_string);
        }
    }
    // What the trace cannot name: the blocks from before the profiler
    // started that were still live (the difference, so the rows sum to the peak).
    let before = dev.peak_allocated_bytes.saturating_sub(known);
    if before > 0 {
        groups.insert(
            BEFORE_TRACE.into(),
            OperatorShare {
                operator: BEFORE_TRACE.into(),
                innermost: None,
                bytes: before,
                count: 0,
            },
        );
    }
    let mut rows: Vec<OperatorShare> = groups.into_values().collect();
    rows.sort_by(|a, b| (b.bytes, &a.operator).cmp(&(a.bytes, &b.operator)));
    let other = rows.len().saturating_sub(top);
    rows.truncate(top);
    TracePeak {
        input: "torch.profiler Chrome trace",
        device: dev.device,
        peak_allocated_bytes: dev.peak_allocated_bytes,
        peak_reserved_bytes: dev.peak_reserved_bytes,
        peak_at_us: dev.peak_at_us,
        live_at_peak: rows,
        other_operators: other,
        snapshot_would_add: would_add(),
    }
}

/// Operators by thread, for "which operator was running at time t".
struct OperatorIndex<'a> {
    by_tid: HashMap<&'a str, Vec<&'a Operator>>,
}

impl<'a> OperatorIndex<'a> {
    fn new(ops: &'a [Operator]) -> OperatorIndex<'a> {
        let mut by_tid: HashMap<&str, Vec<&Operator>> = HashMap::new();
        for o in ops {
            by_tid.entry(o.tid.as_str()).or_default().push(o);
        }
        OperatorIndex { by_tid }
    }

    /// The outermost and innermost operators on `tid` running at `ts`.
    fn at(&self, tid: &str, ts: f64) -> (Option<&'a str>, Option<&'a str>) {
        let Some(ops) = self.by_tid.get(tid) else {
            return (None, None);
        };
        // Operators start in order; those running at ts started before it.
        let n = ops.partition_point(|o| o.ts <= ts);
        let mut outer = None;
        let mut inner = None;
        for o in &ops[..n] {
            if o.ts + o.dur >= ts {
                outer.get_or_insert(o.name.as_str());
                inner = Some(o.name.as_str());
            }
        }
        (outer, inner)
    }
}
