//! Turns bytes into a [`Snapshot`]: detects the container, runs the pickle
//! reader (or the JSON parser) into the `Heap`, then assembles the typed model
//! from the top-level dict.

use super::heap::Heap;
use super::{
    AllocatorSettings, Annotation, Block, BlockState, Container, DeviceTrace, EventExtras,
    EventSink, PoolKind, Segment, Snapshot, EMPTY_STACK,
};
use crate::error::{Error, Result};
use crate::pickle::{self, Builder, Input, Limits, Source, Value};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Reads a snapshot file of any supported format.
pub fn load_path(path: &Path) -> Result<Snapshot> {
    read_path(path, None)
}

/// [`load_path`] that hands `sink` the trace events of a pickle as they are
/// read (JSON is read as by [`load_path`], without it).
pub fn load_path_into(path: &Path, sink: Box<dyn EventSink>) -> Result<Snapshot> {
    read_path(path, Some(sink))
}

fn read_path(path: &Path, sink: Option<Box<dyn EventSink>>) -> Result<Snapshot> {
    let (container, reader) = crate::input::open(path)?;
    let container = inner_container(container, path)?;
    if container == Container::Json {
        return load_reader(container, reader, path);
    }
    let limits = Limits::default();
    if container == Container::Pickle {
        // A plain pickle is read in place (no copy into a window).
        if let Some(map) = crate::input::map(path) {
            drop(reader);
            return read_pickle_into(&mut pickle::Mapped::new(map), path, limits, sink);
        }
    }
    read_pickle_into(&mut Input::new(reader), path, limits, sink)
}

/// [`load_path`] that stops early, with [`Error::Cancelled`], once `cancel`
/// is set (checked each time the reader asks for more bytes, about every MiB).
pub fn load_path_cancellable(path: &Path, cancel: Arc<AtomicBool>) -> Result<Snapshot> {
    let (container, reader) = crate::input::open(path)?;
    let container = inner_container(container, path)?;
    let reader = crate::input::cancellable(reader, cancel.clone());
    match load_reader(container, reader, path) {
        Err(_) if cancel.load(Ordering::Relaxed) => Err(Error::Cancelled { path: path.into() }),
        done => done,
    }
}

/// What the (decompressed) bytes of `path`, in `container`, hold: a JSON
/// snapshot gzipped or zstd-compressed reads as JSON; a torch.profiler trace
/// (Chrome JSON, in any container) is refused with what reads it instead,
/// not with the pickle reader's complaint about its first byte. A plain
/// pickle is not looked into (it cannot be either).
fn inner_container(container: Container, path: &Path) -> Result<Container> {
    if container == Container::Pickle {
        return Ok(container);
    }
    let head = crate::input::head(path)?;
    if crate::input::kind_of(&head) == crate::input::InputKind::ProfilerTrace {
        return Err(Error::UnknownFormat {
            path: path.into(),
            what:
                "a torch.profiler trace (Chrome JSON), not a memory snapshot: `memlens summary`, \
                   `peak` and `report` read it; this command needs a snapshot \
                   (torch.cuda.memory._dump_snapshot(), or memlens.record)"
                    .into(),
        });
    }
    if container != Container::Json && crate::input::detect(&head) == Some(Container::Json) {
        return Ok(Container::Json);
    }
    Ok(container)
}

/// Reads a snapshot from bytes in memory; `path` names it in errors.
pub fn load_bytes(bytes: &[u8], path: &Path) -> Result<Snapshot> {
    load_bytes_with(bytes, path, Limits::default())
}

/// [`load_bytes`] under the reader's given limits and options (tests read
/// with the fast path off to compare it with the general loop).
pub fn load_bytes_with(bytes: &[u8], path: &Path, limits: Limits) -> Result<Snapshot> {
    if bytes.is_empty() {
        return Err(Error::UnknownFormat {
            path: path.into(),
            what: "the file is empty".into(),
        });
    }
    let head = &bytes[..bytes.len().min(8)];
    let container = crate::input::detect(head).ok_or_else(|| Error::UnknownFormat {
        path: path.into(),
        what: crate::input::describe_unknown(head),
    })?;
    if container == Container::Pickle {
        // Read in place, as a mapped file is.
        return read_pickle(&mut pickle::Mapped::new(bytes), path, limits);
    }
    let reader = crate::input::decoder(container, std::io::Cursor::new(bytes.to_vec()));
    load_reader_with(container, reader, path, limits)
}

/// Reads a snapshot from a reader of decompressed bytes.
pub fn load_reader(
    container: Container,
    reader: Box<dyn Read + Send>,
    path: &Path,
) -> Result<Snapshot> {
    load_reader_with(container, reader, path, Limits::default())
}

fn load_reader_with(
    container: Container,
    reader: Box<dyn Read + Send>,
    path: &Path,
    limits: Limits,
) -> Result<Snapshot> {
    if container == Container::Json {
        let mut heap = Heap::new();
        let root = from_json(&mut heap, reader, path)?;
        return assemble(heap, root, path);
    }
    read_pickle(&mut Input::new(reader), path, limits)
}

/// Reads a pickle from `input` into a snapshot.
fn read_pickle<S: Source>(input: &mut S, path: &Path, limits: Limits) -> Result<Snapshot> {
    read_pickle_into(input, path, limits, None)
}

/// [`read_pickle`] that hands `sink` the trace events as they are read.
fn read_pickle_into<S: Source>(
    input: &mut S,
    path: &Path,
    limits: Limits,
    sink: Option<Box<dyn EventSink>>,
) -> Result<Snapshot> {
    let mut heap = Heap::new();
    if let Some(sink) = sink {
        heap.set_sink(sink);
    }
    let root = pickle::parse(input, &mut heap, limits).map_err(|error| Error::Pickle {
        path: path.into(),
        error,
    })?;
    heap.feed_sink();
    let root = heap.resolve(root);
    assemble(heap, root, path)
}

fn from_json(heap: &mut Heap, reader: Box<dyn Read + Send>, path: &Path) -> Result<Value> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(reader));
    let value = JsonSeed(heap).deserialize(&mut de).and_then(|v| {
        de.end()?;
        Ok(v)
    });
    value.map_err(|e| {
        let what = e.to_string();
        if e.is_data() {
            // Raised by the heap (its memory budget, a malformed layout).
            Error::NotASnapshot {
                path: path.into(),
                what,
            }
        } else {
            Error::Json {
                path: path.into(),
                what,
            }
        }
    })
}

/// Feeds a JSON document straight into the same builder the pickle reader
/// uses, container by container, so both formats give the same model and a
/// JSON file is held to the same memory budget (no intermediate tree).
/// serde_json caps nesting at 128 levels, which bounds the recursion.
struct JsonSeed<'a>(&'a mut Heap);

/// Items handed to the builder at once, as CPython's pickler batches them.
const JSON_BATCH: usize = 1000;

impl<'de> serde::de::DeserializeSeed<'de> for JsonSeed<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_bool<E>(self, b: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> std::result::Result<Value, E> {
        Ok(Value::Int(i))
    }

    fn visit_u64<E>(self, u: u64) -> std::result::Result<Value, E> {
        Ok(i64::try_from(u).map_or(Value::UInt(u), Value::Int))
    }

    fn visit_f64<E>(self, f: f64) -> std::result::Result<Value, E> {
        Ok(Value::Float(f))
    }

    fn visit_str<E>(self, s: &str) -> std::result::Result<Value, E> {
        Ok(self.0.string(s))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Value, A::Error> {
        use serde::de::Error as _;
        let heap = self.0;
        let mut list = heap.empty_list().map_err(A::Error::custom)?;
        let mut batch = Vec::new();
        while let Some(v) = seq.next_element_seed(JsonSeed(heap))? {
            batch.push(v);
            if batch.len() == JSON_BATCH {
                list = heap.append(list, &batch).map_err(A::Error::custom)?;
                batch.clear();
            }
        }
        if !batch.is_empty() {
            list = heap.append(list, &batch).map_err(A::Error::custom)?;
        }
        Ok(list)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Value, A::Error> {
        use serde::de::Error as _;
        let heap = self.0;
        let dict = heap.empty_dict().map_err(A::Error::custom)?;
        // A dict is handed over whole (so trace entries and frames are
        // recognised in one go), its items charged as they are read.
        let mut items = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            heap.charge(32).map_err(A::Error::custom)?;
            items.push(heap.string(&k));
            items.push(map.next_value_seed(JsonSeed(heap))?);
        }
        heap.give_back(32 * items.len() as u64 / 2);
        if items.is_empty() {
            return Ok(dict);
        }
        heap.set_items(dict, &items).map_err(A::Error::custom)
    }
}

/// Reads fields of one dict with clear errors.
struct Fields<'a> {
    heap: &'a Heap,
    dict: Value,
    what: String,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<Value> {
        self.heap.get_str(self.dict, key)
    }

    fn u64_req(&self, key: &str) -> std::result::Result<u64, String> {
        match self.get(key) {
            Some(v) => v.as_u64().ok_or_else(|| {
                format!(
                    "{} has {key} = {}, not a non-negative integer",
                    self.what,
                    shown(self.heap, v)
                )
            }),
            None => Err(format!("{} has no {key}", self.what)),
        }
    }

    /// An optional size or address: absent gives `default`; present, it must
    /// be a non-negative integer (a negative size is never silently dropped).
    fn u64_or(&self, key: &str, default: u64) -> std::result::Result<u64, String> {
        match self.get(key) {
            None | Some(Value::None) => Ok(default),
            Some(_) => self.u64_req(key),
        }
    }

    /// A field memlens only displays: anything but a non-negative integer gives `default`.
    fn u64_lenient(&self, key: &str, default: u64) -> u64 {
        self.get(key).and_then(Value::as_u64).unwrap_or(default)
    }

    fn i64_or(&self, key: &str, default: i64) -> i64 {
        self.get(key).and_then(Value::as_i64).unwrap_or(default)
    }

    fn str(&self, key: &str) -> Option<&'a str> {
        match self.get(key) {
            Some(Value::Str(s)) => Some(self.heap.strings.get(s)),
            _ => None,
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> bool {
        match self.get(key) {
            Some(Value::Bool(b)) => b,
            Some(Value::Int(i)) => i != 0,
            _ => default,
        }
    }

    fn stack(&self, key: &str) -> u32 {
        match self.get(key) {
            Some(Value::Stack(s)) => s,
            _ => EMPTY_STACK,
        }
    }
}

/// A value as an error message names it: a number or a short string
/// itself, anything else by its type (`-5`, `"big"`, `a list`).
fn shown(heap: &Heap, v: Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Bool(b) => if b { "True" } else { "False" }.into(),
        Value::None => "None".into(),
        Value::BigInt => "an integer beyond 64 bits".into(),
        Value::Str(s) => {
            let text = heap.strings.get(s);
            match text.char_indices().nth(40) {
                Some((cut, _)) => format!("{:?}...", &text[..cut]),
                None => format!("{text:?}"),
            }
        }
        other => format!("a {}", other.type_name()),
    }
}

/// Describes a value for "found X instead" messages.
fn describe(heap: &Heap, v: Value) -> String {
    match v {
        Value::Dict(_) => {
            let keys: Vec<String> = heap
                .dict_items(v)
                .iter()
                .take(8)
                .map(|(k, _)| match k {
                    Value::Str(s) => format!("{:?}", heap.strings.get(*s)),
                    other => other.type_name().to_string(),
                })
                .collect();
            if keys.is_empty() {
                "found an empty dict".into()
            } else {
                format!("found a dict with keys {}", keys.join(", "))
            }
        }
        Value::List(_) => format!("found a list of {} items", heap.list_len(v)),
        other => format!("found a {}", other.type_name()),
    }
}

/// Builds the snapshot from the unpickled `root` (its values in `heap`):
/// segments, traces, settings and annotations, the warnings about what the
/// file holds, then checks it (see `validate`).
fn assemble(mut heap: Heap, root: Value, path: &Path) -> Result<Snapshot> {
    let not_snapshot = not_a_snapshot(path);
    let mut snap = Snapshot::default();
    let top = top_level(&heap, root, path, &mut snap.legacy)?;
    read_segments(&mut heap, top.segments, &mut snap, path)?;
    read_traces(&mut heap, top.traces, &mut snap, path)?;
    if let Some(v) = top.settings {
        snap.settings = settings(&heap, v);
    }
    if let Some(v) = top.annotations {
        snap.annotations = annotations(&heap, v);
    }
    snap.fake_trace = top.recording.and_then(|v| fake_trace(&heap, v));
    snap.recording = top.recording.and_then(|v| recording(&heap, v));

    add_warnings(&mut snap, &heap);
    super::validate::check(&snap).map_err(not_snapshot)?;

    snap.frames = std::mem::take(&mut heap.frames);
    snap.stack_ranges = std::mem::take(&mut heap.stack_ranges);
    snap.stack_frames = std::mem::take(&mut heap.stack_frames);
    snap.streams = std::mem::take(&mut heap.streams);
    snap.strings = std::mem::take(&mut heap.strings);
    Ok(snap)
}

/// Makes the error for a file that is not a snapshot, saying what it is.
fn not_a_snapshot(path: &Path) -> impl Fn(String) -> Error + Copy + '_ {
    move |what| Error::NotASnapshot {
        path: path.into(),
        what,
    }
}

/// The parts of a snapshot's top level, where it has them.
struct TopLevel {
    /// The list of segments.
    segments: Option<Value>,
    /// The list of device traces.
    traces: Option<Value>,
    /// The allocator settings dict.
    settings: Option<Value>,
    /// The `record_function` annotations.
    annotations: Option<Value>,
    /// What `memlens.record` says about how it recorded.
    recording: Option<Value>,
}

/// The top level: a dict, or the legacy bare list of segments (then `legacy`
/// is set); anything else is not a snapshot.
fn top_level(heap: &Heap, root: Value, path: &Path, legacy: &mut bool) -> Result<TopLevel> {
    let not_snapshot = not_a_snapshot(path);
    let parts = match root {
        Value::Dict(_) => {
            let seg = heap.get_str(root, "segments");
            let tr = heap
                .get_str(root, "device_traces")
                .or_else(|| heap.get_str(root, "traces"));
            if seg.is_none() && tr.is_none() {
                return Err(not_snapshot(format!(
                    "{} (a snapshot has \"segments\" and \"device_traces\")",
                    describe(heap, root)
                )));
            }
            TopLevel {
                segments: seg,
                traces: tr,
                settings: heap.get_str(root, "allocator_settings"),
                annotations: heap.get_str(root, "external_annotations"),
                recording: heap.get_str(root, "memlens"),
            }
        }
        Value::List(_) if heap.list_len(root) == 0 => {
            return Err(not_snapshot(
                "found an empty list (a legacy snapshot is a list of segments)".into(),
            ))
        }
        Value::List(_) => {
            *legacy = true;
            TopLevel {
                segments: Some(root),
                traces: None,
                settings: None,
                annotations: None,
                recording: None,
            }
        }
        other => {
            return Err(not_snapshot(format!(
                "{} (a snapshot is a dict with \"segments\" and \"device_traces\")",
                describe(heap, other)
            )))
        }
    };
    Ok(parts)
}

/// Reads the segments list `v`, if any, into `snap`.
fn read_segments(
    heap: &mut Heap,
    v: Option<Value>,
    snap: &mut Snapshot,
    path: &Path,
) -> Result<()> {
    let not_snapshot = not_a_snapshot(path);
    if let Some(v) = v {
        let items = heap.sequence(v).ok_or_else(|| {
            not_snapshot(format!("\"segments\" is a {}, not a list", v.type_name()))
        })?;
        for (i, s) in items.into_iter().enumerate() {
            let seg = segment(heap, s, i).map_err(not_snapshot)?;
            snap.legacy |= seg.1;
            snap.segments.push(seg.0);
        }
    }
    Ok(())
}

/// Reads the device traces list `v`, if any, into `snap` (with a warning for
/// the entries skipped).
fn read_traces(heap: &mut Heap, v: Option<Value>, snap: &mut Snapshot, path: &Path) -> Result<()> {
    let not_snapshot = not_a_snapshot(path);
    if let Some(v) = v {
        let devices = heap.sequence(v).ok_or_else(|| {
            not_snapshot(format!(
                "\"device_traces\" is a {}, not a list",
                v.type_name()
            ))
        })?;
        let mut skipped = 0u64;
        for (d, list) in devices.into_iter().enumerate() {
            let trace = device_trace(heap, list, d as u32, &mut skipped).ok_or_else(|| {
                not_snapshot(format!(
                    "device_traces[{d}] is a {}, not a list",
                    list.type_name()
                ))
            })?;
            snap.traces.push(trace);
        }
        if skipped > 0 {
            snap.warnings.push(format!(
                "{skipped} trace entries were skipped: not trace entries, or an action memlens does not know"
            ));
        }
    }
    Ok(())
}

/// The warnings about what the file holds: frames that were not frames, the
/// legacy form, a trace without allocations, no stacks, a ring buffer that
/// overflowed.
fn add_warnings(snap: &mut Snapshot, heap: &Heap) {
    if heap.odd_frames > 0 {
        snap.warnings.push(format!(
            "{} trace entries had frames that were not frame dicts; their stacks are empty",
            heap.odd_frames
        ));
    }
    let allocation_trace = snap.has_allocation_trace();
    if snap.legacy {
        snap.warnings.push(
            "legacy snapshot format (PyTorch 2.0 or older): stacks and requested sizes from each block's history"
                .into(),
        );
    }
    if snap.event_count() > 0 && !allocation_trace {
        snap.warnings.push(
            "the trace holds only `snapshot` or `oom` entries: no allocation history, figures are those at dump time".into(),
        );
    }
    // Stacks may sit in the blocks alone (legacy history, or a trace with
    // only `snapshot` entries): those still say where memory was allocated.
    let with_frames = snap
        .traces
        .iter()
        .flat_map(|t| &t.events)
        .any(|e| e.stack != EMPTY_STACK)
        || snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .any(|b| b.stack != EMPTY_STACK);
    if allocation_trace && !with_frames {
        snap.warnings.push(
            "no stacks were recorded: use _record_memory_history(enabled=\"all\", context=\"all\", stacks=\"python\") to see where memory was allocated".into(),
        );
    }
    if snap.settings.trace_alloc_overflowed == Some(true) {
        snap.warnings.push(
            "the trace ring buffer overflowed: the oldest events were lost (raise max_entries)"
                .into(),
        );
    }
}

/// Reads one segment dict; the bool says the segment is in the legacy form.
fn segment(
    heap: &mut Heap,
    v: Value,
    index: usize,
) -> std::result::Result<(Segment, bool), String> {
    if !matches!(v, Value::Dict(_)) {
        return Err(format!(
            "segments[{index}] is a {}, not a dict",
            v.type_name()
        ));
    }
    let f = Fields {
        heap,
        dict: v,
        what: format!("segments[{index}]"),
    };
    let address = f.u64_req("address")?;
    let total_size = f.u64_req("total_size")?;
    let pool = match f.str("segment_type") {
        Some("small") => PoolKind::Small,
        Some(_) => PoolKind::Large,
        None if total_size <= 2 << 20 => PoolKind::Small,
        None => PoolKind::Large,
    };
    let pool_id = match f.get("segment_pool_id").and_then(|p| heap.sequence(p)) {
        Some(p) if p.len() == 2 => (p[0].as_i64().unwrap_or(0), p[1].as_i64().unwrap_or(0)),
        _ => (0, 0),
    };
    let legacy = f.get("requested_size").is_none() && f.get("frames").is_none();
    let raw_stream = f.i64_or("stream", 0);
    let mut seg = Segment {
        device: f.u64_or("device", 0)?.min(u32::MAX as u64) as u32,
        address,
        total_size,
        allocated_size: f.u64_or("allocated_size", 0)?,
        active_size: f.u64_or("active_size", 0)?,
        requested_size: f.u64_or("requested_size", 0)?,
        stream: 0,
        pool,
        pool_id,
        is_expandable: f.bool_or("is_expandable", false),
        stack: f.stack("frames"),
        blocks: Vec::new(),
    };
    let blocks_v = f.get("blocks");
    let what = f.what.clone();
    seg.stream = heap.stream_id(raw_stream);
    let blocks = match blocks_v {
        Some(b) => heap
            .sequence(b)
            .ok_or_else(|| format!("{what}.blocks is not a list"))?,
        None => Vec::new(),
    };
    let mut next_addr = address;
    for (j, b) in blocks.into_iter().enumerate() {
        let block = block(heap, b, &format!("{what}.blocks[{j}]"), next_addr)?;
        next_addr = block.address.saturating_add(block.size);
        seg.blocks.push(block);
    }
    Ok((seg, legacy))
}

fn block(
    heap: &Heap,
    v: Value,
    what: &str,
    running_addr: u64,
) -> std::result::Result<Block, String> {
    if !matches!(v, Value::Dict(_)) {
        return Err(format!("{what} is a {}, not a dict", v.type_name()));
    }
    let f = Fields {
        heap,
        dict: v,
        what: what.to_string(),
    };
    let size = f.u64_req("size")?;
    let state = match f.str("state") {
        Some("active_allocated") => BlockState::ActiveAllocated,
        Some("active_pending_free") | Some("active_awaiting_free") => BlockState::ActivePendingFree,
        Some("inactive") => BlockState::Inactive,
        Some(other) => return Err(format!("{what} has an unknown state {other:?}")),
        None => return Err(format!("{what} has no state")),
    };
    // Legacy blocks keep their size and stack in `history[0]`.
    let history = f
        .get("history")
        .and_then(|h| heap.sequence(h))
        .and_then(|h| h.first().copied())
        .filter(|h| matches!(h, Value::Dict(_)));
    let (requested, stack) = match (f.get("requested_size"), history) {
        (Some(_), _) => (f.u64_or("requested_size", size)?, f.stack("frames")),
        (None, Some(h)) => {
            let hf = Fields {
                heap,
                dict: h,
                what: what.to_string(),
            };
            (hf.u64_or("real_size", size)?, hf.stack("frames"))
        }
        (None, None) => (size, f.stack("frames")),
    };
    Ok(Block {
        address: f.u64_or("address", running_addr)?,
        size,
        requested_size: requested,
        state,
        stack,
    })
}

fn device_trace(
    heap: &mut Heap,
    list: Value,
    device: u32,
    skipped: &mut u64,
) -> Option<DeviceTrace> {
    if !matches!(list, Value::List(_)) {
        return None;
    }
    let body = heap.take_list_body(list)?;
    let mut trace = DeviceTrace {
        device,
        events: Vec::new(),
        extras: Vec::new(),
    };
    let mut globals: Vec<u32> = Vec::new();
    if body.items.is_empty() {
        // The usual case: one contiguous run of events.
        let (s, n) = (body.ev_start as usize, body.ev_len as usize);
        if s == 0 && n == heap.events.len() {
            if let Some(sink) = heap.sink.as_mut() {
                sink.whole_trace(device, n);
            }
            trace.events = std::mem::take(&mut heap.events);
        } else {
            trace.events = heap
                .events
                .get(s..s + n)
                .map(<[_]>::to_vec)
                .unwrap_or_default();
        }
        let end = (s + n) as u32;
        for &(g, cc, um) in heap.extras.iter().filter(|x| x.0 >= s as u32 && x.0 < end) {
            trace.extras.push(EventExtras {
                index: g - s as u32,
                compile_context: cc,
                user_metadata: um,
            });
        }
        return Some(trace);
    }
    for item in body.items.iter().map(|v| heap.resolve(*v)) {
        match item {
            Value::Event(e) => {
                if let Some(ev) = heap.events.get(e as usize) {
                    globals.push(e);
                    trace.events.push(*ev);
                }
            }
            _ => *skipped += 1,
        }
    }
    for &(g, cc, um) in &heap.extras {
        if let Some(pos) = globals.iter().position(|&x| x == g) {
            trace.extras.push(EventExtras {
                index: pos as u32,
                compile_context: cc,
                user_metadata: um,
            });
        }
    }
    Some(trace)
}

/// Converts a value to JSON for display (depth-limited).
fn to_json(heap: &Heap, v: Value, depth: usize) -> serde_json::Value {
    use serde_json::Value as J;
    if depth > 16 {
        return J::String("…".into());
    }
    match heap.resolve(v) {
        Value::None => J::Null,
        Value::Bool(b) => J::Bool(b),
        Value::Int(i) => J::from(i),
        Value::UInt(u) => J::from(u),
        Value::Float(f) => J::from(f),
        Value::Str(s) => J::String(heap.strings.get(s).to_string()),
        d @ Value::Dict(_) => J::Object(
            heap.dict_items(d)
                .iter()
                .map(|(k, x)| {
                    let key = match k {
                        Value::Str(s) => heap.strings.get(*s).to_string(),
                        other => other.type_name().to_string(),
                    };
                    (key, to_json(heap, *x, depth + 1))
                })
                .collect(),
        ),
        l @ (Value::List(_) | Value::Tuple(_)) => J::Array(
            heap.sequence(l)
                .unwrap_or_default()
                .into_iter()
                .take(1000)
                .map(|x| to_json(heap, x, depth + 1))
                .collect(),
        ),
        other => J::String(format!("<{}>", other.type_name())),
    }
}

fn settings(heap: &Heap, v: Value) -> AllocatorSettings {
    let f = Fields {
        heap,
        dict: v,
        what: "allocator_settings".into(),
    };
    let mut s = AllocatorSettings {
        present: true,
        ..Default::default()
    };
    s.alloc_conf = f.str("PYTORCH_CUDA_ALLOC_CONF").unwrap_or("").to_string();
    s.max_split_size = match f.get("max_split_size") {
        Some(Value::Int(i)) if i >= 0 => Some(i as u64),
        Some(Value::UInt(u)) if u != u64::MAX => Some(u),
        _ => None,
    };
    s.garbage_collection_threshold = f
        .get("garbage_collection_threshold")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    s.expandable_segments = f.bool_or("expandable_segments", false);
    s.roundup_power2_divisions = match f.get("roundup_power2_divisions") {
        Some(d @ Value::Dict(_)) => {
            let mut pairs: Vec<(u64, u32)> = heap
                .dict_items(d)
                .iter()
                .filter_map(|(k, x)| {
                    let Value::Str(k) = k else { return None };
                    let key: u64 = heap.strings.get(*k).parse().ok()?;
                    Some((key, heap.resolve(*x).as_u64().unwrap_or(0) as u32))
                })
                .collect();
            pairs.sort_unstable();
            pairs.into_iter().map(|(_, x)| x).collect()
        }
        Some(l @ Value::List(_)) => heap
            .sequence(l)
            .unwrap_or_default()
            .into_iter()
            .map(|x| x.as_u64().unwrap_or(0) as u32)
            .collect(),
        Some(Value::Int(n)) if n > 0 => vec![n as u32; 16],
        _ => Vec::new(),
    };
    s.trace_alloc_overflowed = match f.get("trace_alloc_overflowed") {
        Some(Value::Bool(b)) => Some(b),
        _ => None,
    };
    s.trace_alloc_max_entries = f.get("trace_alloc_max_entries").and_then(Value::as_u64);
    if let serde_json::Value::Object(map) = to_json(heap, v, 0) {
        s.other = map;
    }
    s
}

/// The `"memlens"` dict's fields when its schema begins with `schema`
/// (memlens wrote it, in that form); `None` for anything else.
fn memlens_dict<'a>(heap: &'a Heap, v: Value, schema: &str) -> Option<Fields<'a>> {
    if !matches!(v, Value::Dict(_)) {
        return None;
    }
    let f = Fields {
        heap,
        dict: v,
        what: "memlens".into(),
    };
    f.str("schema")?.starts_with(schema).then_some(f)
}

/// The `"memlens"` dict `memlens.record` adds (schema `memlens-recording/1`);
/// anything else under that key is not ours and is ignored.
fn recording(heap: &Heap, v: Value) -> Option<super::Recording> {
    let f = memlens_dict(heap, v, "memlens-recording/")?;
    Some(super::Recording {
        kind: f.str("kind").unwrap_or("").to_string(),
        step: f.u64_lenient("step", 0),
        trace_from_step: f.u64_lenient("trace_from_step", 0),
        every: f.get("every").and_then(Value::as_u64),
        steps_kept: f.u64_lenient("steps_kept", 0),
        max_entries: f.u64_lenient("max_entries", 0),
        sized_by_user: f.str("sized_by") == Some("user"),
        ring_wrapped: f.bool_or("ring_wrapped", false),
        alloc_conf_env: f.str("alloc_conf_env").map(str::to_string),
    })
}

/// The `"memlens"` dict `memlens.trace_step` writes (schema
/// `memlens-fake-trace/1`).
fn fake_trace(heap: &Heap, v: Value) -> Option<super::FakeTrace> {
    let f = memlens_dict(heap, v, "memlens-fake-trace/")?;
    Some(super::FakeTrace {
        steps: f.u64_lenient("steps", 0),
        precision: f.str("precision").unwrap_or("fp32").to_string(),
        workspace_bytes: f.u64_lenient("workspace_bytes", 0),
        unknown_values: f.u64_lenient("unknown_values", 0),
        world_size: f.u64_lenient("world_size", 1).max(1),
        comm_hooks_ignored: f.u64_lenient("comm_hooks_ignored", 0),
        ddp_bucket_bytes: f.u64_lenient("ddp_bucket_bytes", 0),
        scratch_measuring: f.bool_or("scratch_measuring", false),
        foreach_as_gpu: f.bool_or("foreach_as_gpu", false),
        scratch_measured: f.u64_lenient("scratch_measured", 0),
        scratch_unmeasured: f.u64_lenient("scratch_unmeasured", 0),
    })
}

fn annotations(heap: &Heap, v: Value) -> Vec<Annotation> {
    let mut out = Vec::new();
    for a in heap.sequence(v).unwrap_or_default() {
        if !matches!(a, Value::Dict(_)) {
            continue;
        }
        let f = Fields {
            heap,
            dict: a,
            what: "annotation".into(),
        };
        let Some(Value::Str(name)) = f.get("name") else {
            continue;
        };
        out.push(Annotation {
            device: f.u64_lenient("device", 0).min(u32::MAX as u64) as u32,
            time_us: f.i64_or("time_us", 0),
            name,
            start: f.str("stage") != Some("END"),
        });
    }
    out
}
