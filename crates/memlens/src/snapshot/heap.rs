//! The containers of a snapshot while it is read, and their conversion into the
//! compact model as soon as they are complete.
//!
//! A frame dict (`{filename, line, name}`) becomes an interned [`Frame`]; a list
//! of frames becomes an interned stack; a trace-entry dict becomes a 32-byte
//! [`TraceEvent`]. Each happens the moment the container is filled, and its
//! working storage is recycled at once. Container ids are never reused: a
//! converted container keeps an 8-byte slot that says what it became, so a
//! later memo reference to it still resolves.

use super::{Action, EventSink, Frame, FrameId, StackId, StrId, Strings, TraceEvent, EMPTY_STACK};
use crate::pickle::{Builder, EntryFields, EntryFrames, EntryKeys, FastKeys, Value};
use hashbrown::{HashMap, HashTable};
use std::hash::BuildHasher;

/// What a dict id stands for.
#[derive(Clone, Copy, Debug)]
enum DictSlot {
    /// Created, nothing set yet.
    Empty,
    /// A generic dict; its items are `dict_bodies[i]`.
    Open(u32),
    /// Converted into an interned frame.
    Frame(FrameId),
    /// Converted into a trace event.
    Event(u32),
}

/// What a list id stands for.
#[derive(Clone, Copy, Debug)]
enum ListSlot {
    /// A list; its items are `list_bodies[i]`.
    Open(u32),
    /// Converted into an interned stack.
    Stack(StackId),
}

/// The items of an open list. A run of consecutive events (a device trace) is
/// kept as a range rather than one value per event.
#[derive(Default, Debug)]
pub(crate) struct ListBody {
    pub items: Vec<Value>,
    pub ev_start: u32,
    pub ev_len: u32,
}

/// Keys and values interned up front so that recognising a dict is a matter
/// of comparing integers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keys {
    pub action: StrId,
    pub addr: StrId,
    pub size: StrId,
    pub stream: StrId,
    pub time_us: StrId,
    pub frames: StrId,
    pub device_free: StrId,
    pub compile_context: StrId,
    pub user_metadata: StrId,
    pub filename: StrId,
    pub line: StrId,
    pub name: StrId,
    pub na: StrId,
    pub empty: StrId,
}

// Offsets of a trace entry's keys from `Keys::action` (interned in this order).
const ACTION: u32 = 0;
const ADDR: u32 = 1;
const SIZE: u32 = 2;
const STREAM: u32 = 3;
const TIME_US: u32 = 4;
const FRAMES: u32 = 5;
const DEVICE_FREE: u32 = 6;
const COMPILE_CONTEXT: u32 = 7;
const USER_METADATA: u32 = 8;

/// The keys of a trace entry in the order PyTorch writes them (as offsets
/// from `action`).
const CANONICAL: [u32; 8] = [
    ACTION,
    ADDR,
    SIZE,
    STREAM,
    TIME_US,
    COMPILE_CONTEXT,
    USER_METADATA,
    FRAMES,
];

/// What [`Heap::as_event`] gathered of a trace entry so far.
struct EventParts {
    action: Option<StrId>,
    ev: TraceEvent,
    cc: Option<StrId>,
    um: Option<StrId>,
    /// The first size or address that is not a non-negative integer.
    bad: Option<(StrId, Value)>,
}

/// The heap of containers and the tables they are converted into.
pub(crate) struct Heap {
    pub strings: Strings,
    pub keys: Keys,
    dicts: Vec<DictSlot>,
    dict_bodies: Vec<Vec<(Value, Value)>>,
    lists: Vec<ListSlot>,
    pub list_bodies: Vec<ListBody>,
    /// Bodies of lists converted into stacks, ready for reuse.
    free_list_bodies: Vec<u32>,
    pub tuples: Vec<Vec<Value>>,
    pub frames: Vec<Frame>,
    frame_index: HashMap<Frame, FrameId>,
    pub stack_ranges: Vec<(u32, u32)>,
    pub stack_frames: Vec<FrameId>,
    stack_table: HashTable<StackId>,
    hasher: foldhash::fast::FixedState,
    pub events: Vec<TraceEvent>,
    /// `(event index, compile_context, user_metadata)` for non-default values.
    pub extras: Vec<(u32, Option<StrId>, Option<StrId>)>,
    pub streams: Vec<i64>,
    stream_index: HashMap<i64, u16>,
    /// The stream last looked up and its index.
    last_stream: (i64, u16),
    scratch: Vec<FrameId>,
    /// Trace entries whose `action` was not one memlens knows.
    pub unknown_actions: u64,
    /// Frames lists that held something other than frames.
    pub odd_frames: u64,
    /// Bytes held for things that are not (yet) part of the model: generic
    /// containers and their items, memo slots, strings. See [`WASTE_BUDGET`].
    waste: u64,
    /// The budget last worked out: the model only grows, so it stays a lower
    /// bound and is recomputed only when `waste` passes it.
    allowed: u64,
    /// Who is handed the events as they are read, if anyone.
    pub sink: Option<Box<dyn EventSink>>,
    /// Events handed to the sink so far.
    sunk: usize,
    /// `events.len()` at which the next batch goes to the sink (`usize::MAX`
    /// without one: one comparison an event either way).
    sink_at: usize,
}

/// Events handed to an [`EventSink`] at a time.
const SINK_BATCH: usize = 4096;

/// Bytes of generic storage allowed beyond twice the model built so far. A
/// real snapshot keeps a few MB of segment and block dicts and about 30 bytes
/// per trace event in container slots and memo, below twice the event's own
/// 32 bytes; a decompression bomb (millions of small items in a few KB, under
/// any key) builds nothing useful and is stopped here, before it costs memory.
pub(crate) const WASTE_BUDGET: u64 = 64 << 20;

/// At most this many containers of each kind (a hostile file could otherwise
/// make millions of empty ones cheaply).
const MAX_CONTAINERS: usize = 1 << 28;

impl Heap {
    pub fn new() -> Self {
        let mut strings = Strings::new();
        // Action names first, so that an action's StrId is its discriminant.
        for a in Action::ALL {
            strings.intern(a.as_str());
        }
        let mut k = |s: &str| strings.intern(s);
        let keys = Keys {
            action: k("action"),
            addr: k("addr"),
            size: k("size"),
            stream: k("stream"),
            time_us: k("time_us"),
            frames: k("frames"),
            device_free: k("device_free"),
            compile_context: k("compile_context"),
            user_metadata: k("user_metadata"),
            filename: k("filename"),
            line: k("line"),
            name: k("name"),
            na: k("N/A"),
            empty: k(""),
        };
        // `as_event` finds a key by its offset from `action`.
        let offsets = [
            (keys.addr, ADDR),
            (keys.size, SIZE),
            (keys.stream, STREAM),
            (keys.time_us, TIME_US),
            (keys.frames, FRAMES),
            (keys.device_free, DEVICE_FREE),
            (keys.compile_context, COMPILE_CONTEXT),
            (keys.user_metadata, USER_METADATA),
        ];
        debug_assert!(offsets.iter().all(|&(id, off)| id == keys.action + off));
        let mut heap = Heap {
            strings,
            keys,
            dicts: Vec::new(),
            dict_bodies: Vec::new(),
            lists: Vec::new(),
            list_bodies: Vec::new(),
            free_list_bodies: Vec::new(),
            tuples: Vec::new(),
            frames: Vec::new(),
            frame_index: HashMap::default(),
            stack_ranges: vec![(0, 0)],
            stack_frames: Vec::new(),
            stack_table: HashTable::new(),
            hasher: foldhash::fast::FixedState::default(),
            events: Vec::new(),
            extras: Vec::new(),
            streams: vec![0],
            stream_index: HashMap::default(),
            last_stream: (0, 0),
            scratch: Vec::new(),
            unknown_actions: 0,
            odd_frames: 0,
            waste: 0,
            allowed: WASTE_BUDGET,
            sink: None,
            sunk: 0,
            sink_at: usize::MAX,
        };
        heap.stream_index.insert(0, 0);
        // The empty stack is stack 0.
        let h = heap.hasher.hash_one::<&[FrameId]>(&[]);
        heap.stack_table.insert_unique(h, EMPTY_STACK, |_| h);
        heap
    }

    /// Resolves a container value to what it was converted into, if anything.
    #[inline]
    pub fn resolve(&self, v: Value) -> Value {
        match v {
            Value::Dict(id) => match self.dicts.get(id as usize) {
                Some(DictSlot::Frame(f)) => Value::Frame(*f),
                Some(DictSlot::Event(e)) => Value::Event(*e),
                _ => v,
            },
            Value::List(id) => match self.lists.get(id as usize) {
                Some(ListSlot::Stack(s)) => Value::Stack(*s),
                _ => v,
            },
            _ => v,
        }
    }

    /// The items of a generic dict (empty for anything else).
    pub fn dict_items(&self, v: Value) -> &[(Value, Value)] {
        match v {
            Value::Dict(id) => match self.dicts.get(id as usize) {
                Some(DictSlot::Open(b)) => &self.dict_bodies[*b as usize],
                _ => &[],
            },
            _ => &[],
        }
    }

    /// Looks a key up in a generic dict.
    pub fn get(&self, dict: Value, key: StrId) -> Option<Value> {
        self.dict_items(dict)
            .iter()
            .find(|(k, _)| *k == Value::Str(key))
            .map(|(_, v)| self.resolve(*v))
    }

    /// Looks a key up by its text.
    pub fn get_str(&self, dict: Value, key: &str) -> Option<Value> {
        self.get(dict, self.strings.find(key)?)
    }

    /// The body of an open list.
    pub fn list_body(&self, v: Value) -> Option<&ListBody> {
        match v {
            Value::List(id) => match self.lists.get(id as usize) {
                Some(ListSlot::Open(b)) => self.list_bodies.get(*b as usize),
                _ => None,
            },
            _ => None,
        }
    }

    /// Takes the body of an open list out of the heap (leaving it empty).
    pub fn take_list_body(&mut self, v: Value) -> Option<ListBody> {
        match v {
            Value::List(id) => match self.lists.get(id as usize) {
                Some(ListSlot::Open(b)) => {
                    self.list_bodies.get_mut(*b as usize).map(std::mem::take)
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// The items of a list or tuple, resolved; `None` for anything else.
    pub fn sequence(&self, v: Value) -> Option<Vec<Value>> {
        match v {
            Value::List(_) => {
                let b = self.list_body(v)?;
                let mut out: Vec<Value> = b.items.iter().map(|x| self.resolve(*x)).collect();
                out.extend((b.ev_start..b.ev_start + b.ev_len).map(Value::Event));
                Some(out)
            }
            Value::Tuple(id) => Some(self.tuples.get(id as usize)?.clone()),
            Value::Stack(_) => Some(Vec::new()),
            _ => None,
        }
    }

    /// Number of items of a list (0 for anything else).
    pub fn list_len(&self, v: Value) -> usize {
        self.list_body(v)
            .map_or(0, |b| b.items.len() + b.ev_len as usize)
    }

    fn intern_stream(&mut self, raw: i64) -> u16 {
        // Nearly every event is on the stream of the one before.
        if self.last_stream.0 == raw {
            return self.last_stream.1;
        }
        if let Some(&i) = self.stream_index.get(&raw) {
            self.last_stream = (raw, i);
            return i;
        }
        // More than 65535 distinct streams cannot happen in a real process;
        // fold the excess into the last index rather than fail.
        let i = self.streams.len().min(u16::MAX as usize) as u16;
        if (i as usize) == self.streams.len() {
            self.streams.push(raw);
        }
        self.stream_index.insert(raw, i);
        i
    }

    /// Interns a stream value read from a segment (exposed for the builder).
    pub fn stream_id(&mut self, raw: i64) -> u16 {
        self.intern_stream(raw)
    }

    fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        let h = self.hasher.hash_one(frames);
        let (ranges, all) = (&self.stack_ranges, &self.stack_frames);
        if let Some(&id) = self.stack_table.find(h, |&id| {
            let (a, b) = ranges[id as usize];
            &all[a as usize..b as usize] == frames
        }) {
            return id;
        }
        let id = self.stack_ranges.len() as StackId;
        let a = self.stack_frames.len() as u32;
        self.stack_frames.extend_from_slice(frames);
        self.stack_ranges.push((a, self.stack_frames.len() as u32));
        let (ranges, all, hasher) = (&self.stack_ranges, &self.stack_frames, &self.hasher);
        self.stack_table.insert_unique(h, id, |&id| {
            let (a, b) = ranges[id as usize];
            hasher.hash_one(&all[a as usize..b as usize])
        });
        id
    }

    /// Converts a list of frames into a stack, if every item is a frame.
    fn list_to_stack(&mut self, v: Value) -> Option<StackId> {
        let Value::List(id) = v else {
            return match v {
                Value::Stack(s) => Some(s),
                _ => None,
            };
        };
        let body_idx = match self.lists.get(id as usize) {
            Some(ListSlot::Stack(s)) => return Some(*s),
            Some(ListSlot::Open(b)) => *b as usize,
            None => return None,
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let body = &self.list_bodies[body_idx];
        let mut ok = body.ev_len == 0;
        for item in &body.items {
            match self.resolve(*item) {
                Value::Frame(f) => scratch.push(f),
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        let result = if ok {
            let s = self.intern_stack(&scratch);
            self.lists[id as usize] = ListSlot::Stack(s);
            // The body is no longer needed: recycle its buffer, and give
            // back what its items were charged.
            let n = self.list_bodies[body_idx].items.len() as u64;
            self.waste = self.waste.saturating_sub(16 * n);
            self.list_bodies[body_idx].items.clear();
            self.free_list_bodies.push(body_idx as u32);
            Some(s)
        } else {
            None
        };
        self.scratch = scratch;
        result
    }

    /// Tries to read `items` as a frame dict.
    fn as_frame(&mut self, items: &[Value]) -> Option<FrameId> {
        let k = self.keys;
        let (mut filename, mut line, mut name) = (None, None, None);
        for pair in items.chunks_exact(2) {
            let Value::Str(key) = pair[0] else {
                return None;
            };
            if key == k.filename {
                filename = match pair[1] {
                    Value::Str(s) => Some(s),
                    _ => return None,
                };
            } else if key == k.line {
                line = Some(pair[1].as_i64().unwrap_or(0).clamp(0, u32::MAX as i64) as u32);
            } else if key == k.name {
                name = match pair[1] {
                    Value::Str(s) => Some(s),
                    _ => return None,
                };
            }
        }
        let frame = Frame {
            filename: filename?,
            line: line?,
            name: name?,
        };
        let next = self.frames.len() as FrameId;
        let id = *self.frame_index.entry(frame).or_insert(next);
        if id == next {
            self.frames.push(frame);
        }
        Some(id)
    }

    /// One key/value pair of a trace entry, the key `off` after `action`;
    /// `false` when it shows the dict is not a trace entry.
    #[inline(always)]
    fn event_field(&mut self, p: &mut EventParts, off: u32, key: Value, v: Value) -> bool {
        let k = self.keys;
        let Value::Str(key) = key else {
            return false;
        };
        match off {
            ACTION => {
                let Value::Str(a) = v else { return false };
                p.action = Some(a);
            }
            ADDR | SIZE | DEVICE_FREE => {
                let x = match v.as_u64() {
                    Some(x) => x,
                    None => {
                        p.bad.get_or_insert((key, v));
                        0
                    }
                };
                if off == SIZE {
                    p.ev.size = x;
                } else {
                    p.ev.addr = x;
                }
            }
            STREAM => p.ev.stream = self.intern_stream(v.as_i64().unwrap_or(0)),
            TIME_US => p.ev.time_us = v.as_i64().unwrap_or(0),
            FRAMES => {
                p.ev.flags |= TraceEvent::HAS_FRAMES;
                match self.list_to_stack(self.resolve(v)) {
                    Some(s) => p.ev.stack = s,
                    None => self.odd_frames += 1,
                }
            }
            COMPILE_CONTEXT => {
                if let Value::Str(s) = v {
                    if s != k.na {
                        p.cc = Some(s);
                    }
                }
            }
            USER_METADATA => {
                if let Value::Str(s) = v {
                    if s != k.empty {
                        p.um = Some(s);
                    }
                }
            }
            _ => {}
        }
        true
    }

    /// Tries to read `items` as a trace entry; returns the event index, or
    /// `None` when it is not one. A trace entry with a negative or non-integer
    /// size or address is an error: dropping it would move every figure.
    fn as_event(&mut self, items: &[Value]) -> Result<Option<u32>, String> {
        let k = self.keys;
        let mut parts = EventParts {
            action: None,
            ev: TraceEvent {
                addr: 0,
                size: 0,
                time_us: 0,
                stack: EMPTY_STACK,
                stream: 0,
                action: Action::Alloc,
                flags: 0,
            },
            cc: None,
            um: None,
            bad: None,
        };
        let canonical = items.len() == 2 * CANONICAL.len()
            && CANONICAL
                .iter()
                .zip(items.chunks_exact(2))
                .all(|(&off, pair)| pair[0] == Value::Str(k.action.wrapping_add(off)));
        if canonical {
            // The order PyTorch writes: each key's handling is known here,
            // with no dispatch on the key (the loop below, a jump table).
            for (&off, pair) in CANONICAL.iter().zip(items.chunks_exact(2)) {
                if !self.event_field(&mut parts, off, pair[0], pair[1]) {
                    return Ok(None);
                }
            }
        } else {
            for pair in items.chunks_exact(2) {
                let Value::Str(key) = pair[0] else {
                    return Ok(None);
                };
                // The keys of a trace entry were interned in a row
                // (`Heap::new`): one subtraction finds which one this is.
                if !self.event_field(&mut parts, key.wrapping_sub(k.action), pair[0], pair[1]) {
                    return Ok(None);
                }
            }
        }
        let EventParts {
            action,
            mut ev,
            cc,
            um,
            bad,
        } = parts;
        let Some(a) = action else { return Ok(None) };
        // Action names were interned first: their ids are the discriminants.
        match Action::ALL.get(a as usize) {
            Some(&act) => ev.action = act,
            None => {
                self.unknown_actions += 1;
                return Ok(None);
            }
        }
        let idx = self.events.len() as u32;
        if let Some((key, v)) = bad {
            let shown = match v {
                Value::Int(i) => i.to_string(),
                Value::Float(f) => f.to_string(),
                other => format!("a {}", other.type_name()),
            };
            return Err(format!(
                "trace entry {idx} ({}) has {} = {shown}, not a non-negative integer",
                ev.action.as_str(),
                self.strings.get(key)
            ));
        }
        Ok(Some(self.push_event(ev, cc, um)))
    }

    /// Adds a trace event, with its compile context and user metadata when
    /// either is not the default (`None`), and hands a full batch to the
    /// sink; its index.
    #[inline]
    fn push_event(&mut self, mut ev: TraceEvent, cc: Option<StrId>, um: Option<StrId>) -> u32 {
        let idx = self.events.len() as u32;
        if cc.is_some() || um.is_some() {
            ev.flags |= TraceEvent::HAS_EXTRAS;
            self.extras.push((idx, cc, um));
        }
        self.events.push(ev);
        if self.events.len() >= self.sink_at {
            self.feed_sink();
        }
        idx
    }

    /// Hands `sink` every trace event from now on, in batches, as it is read.
    pub fn set_sink(&mut self, sink: Box<dyn EventSink>) {
        self.sink = Some(sink);
        self.sink_at = self.events.len() + SINK_BATCH;
    }

    /// Hands the sink the events read since its last batch.
    pub fn feed_sink(&mut self) {
        if let Some(sink) = self.sink.as_mut() {
            if let Some(batch) = self.events.get(self.sunk..).filter(|b| !b.is_empty()) {
                sink.events(self.sunk, batch, &self.streams);
            }
            self.sunk = self.events.len();
            self.sink_at = self.sunk + SINK_BATCH;
        }
    }

    /// Bytes of the model built so far (events, frames, stacks).
    fn useful(&self) -> u64 {
        (self.events.len() as u64) * 32
            + (self.frames.len() as u64) * 12
            + (self.stack_frames.len() as u64) * 4
            + (self.stack_ranges.len() as u64) * 8
    }

    /// Accounts `bytes` of generic storage; fails once it passes the budget.
    #[inline]
    fn spend(&mut self, bytes: u64) -> Result<(), String> {
        self.waste = self.waste.saturating_add(bytes);
        if self.waste <= self.allowed {
            return Ok(());
        }
        self.allowed = WASTE_BUDGET.saturating_add(self.useful().saturating_mul(2));
        if self.waste > self.allowed {
            return Err(format!(
                "the file holds far more data than a snapshot uses ({} MB of containers, strings and memo beyond the {} MB the snapshot needs): a decompression bomb, or not a memory snapshot",
                self.waste >> 20,
                self.useful() >> 20
            ));
        }
        Ok(())
    }

    /// Returns `bytes` charged for storage that is gone.
    pub fn give_back(&mut self, bytes: u64) {
        self.waste = self.waste.saturating_sub(bytes);
    }

    fn new_dict_body(&mut self) -> u32 {
        self.dict_bodies.push(Vec::new());
        (self.dict_bodies.len() - 1) as u32
    }
}

impl Builder for Heap {
    fn room_for_entries(&mut self, entries: usize) -> Option<std::ops::Range<usize>> {
        // Each entry is one event; the events are most of what is written.
        Some(crate::prefault::room_for(&mut self.events, entries))
    }

    fn string(&mut self, s: &str) -> Value {
        let n = self.strings.len();
        let id = self.strings.intern(s);
        if self.strings.len() > n {
            // Checked at the next container operation: a string alone is
            // bounded by the reader's item limit.
            self.waste = self.waste.saturating_add(s.len() as u64 + 24);
        }
        Value::Str(id)
    }

    fn charge(&mut self, bytes: usize) -> Result<(), String> {
        self.spend(bytes as u64)
    }

    fn empty_dict(&mut self) -> Result<Value, String> {
        self.spend(8)?;
        if self.dicts.len() >= MAX_CONTAINERS {
            return Err("too many dicts in one pickle".into());
        }
        self.dicts.push(DictSlot::Empty);
        Ok(Value::Dict((self.dicts.len() - 1) as u32))
    }

    fn empty_list(&mut self) -> Result<Value, String> {
        self.spend(8)?;
        if self.lists.len() >= MAX_CONTAINERS {
            return Err("too many lists in one pickle".into());
        }
        let body = match self.free_list_bodies.pop() {
            Some(b) => b,
            None => {
                self.spend(std::mem::size_of::<ListBody>() as u64)?;
                self.list_bodies.push(ListBody::default());
                (self.list_bodies.len() - 1) as u32
            }
        };
        self.lists.push(ListSlot::Open(body));
        Ok(Value::List((self.lists.len() - 1) as u32))
    }

    fn tuple(&mut self, items: &[Value]) -> Result<Value, String> {
        self.spend(24 + 16 * items.len() as u64)?;
        if self.tuples.len() >= MAX_CONTAINERS {
            return Err("too many tuples in one pickle".into());
        }
        self.tuples
            .push(items.iter().map(|v| self.resolve(*v)).collect());
        Ok(Value::Tuple((self.tuples.len() - 1) as u32))
    }

    fn set_items(&mut self, dict: Value, items: &[Value]) -> Result<Value, String> {
        let Value::Dict(id) = dict else {
            return Err(format!("SETITEM(S) on a {}, not a dict", dict.type_name()));
        };
        let slot = self.dicts[id as usize];
        match slot {
            DictSlot::Empty => {
                // A fresh dict filled in one go: recognise events (PyTorch
                // writes `action` first) and frames.
                if items.first() == Some(&Value::Str(self.keys.action)) {
                    if let Some(e) = self.as_event(items)? {
                        self.dicts[id as usize] = DictSlot::Event(e);
                        return Ok(Value::Event(e));
                    }
                } else if let Some(f) = self.as_frame(items) {
                    self.dicts[id as usize] = DictSlot::Frame(f);
                    return Ok(Value::Frame(f));
                } else if let Some(e) = self.as_event(items)? {
                    self.dicts[id as usize] = DictSlot::Event(e);
                    return Ok(Value::Event(e));
                }
                self.store_generic(id, items)?;
                Ok(dict)
            }
            DictSlot::Open(b) => {
                self.spend(16 * items.len() as u64)?;
                self.extend_generic(b, items);
                Ok(dict)
            }
            DictSlot::Frame(_) | DictSlot::Event(_) => Err(
                "a dict was modified after it was complete (not a PyTorch snapshot layout)".into(),
            ),
        }
    }

    fn fast_keys(&self) -> Option<FastKeys> {
        Some(FastKeys {
            first: self.keys.action,
            list: self.keys.frames,
        })
    }

    fn entry_keys(&self) -> Option<EntryKeys> {
        let k = self.keys;
        Some(EntryKeys {
            action: k.action,
            addr: k.addr,
            device_free: k.device_free,
            size: k.size,
            stream: k.stream,
            time_us: k.time_us,
            compile_context: k.compile_context,
            user_metadata: k.user_metadata,
            frames: k.frames,
        })
    }

    fn takes_entry(&self, action: u32, highest_frame: Option<u32>) -> bool {
        // A known action (their ids are the discriminants), and frames that
        // were read; anything else takes the longer way, which reports it.
        (action as usize) < Action::ALL.len()
            && highest_frame.is_none_or(|f| (f as usize) < self.frames.len())
    }

    fn entry(&mut self, e: &EntryFields, frames: &[u32]) -> Result<(Value, Value), String> {
        // What `frames_list` then `as_event` do with the same fields.
        let (stack, flags) = match e.frames {
            EntryFrames::Absent => (EMPTY_STACK, 0),
            EntryFrames::List => {
                self.spend(8)?;
                // The empty stack is stack 0 (`Heap::new`): no hashing.
                let stack = match frames {
                    [] => EMPTY_STACK,
                    _ => self.intern_stack(frames),
                };
                (stack, TraceEvent::HAS_FRAMES)
            }
            EntryFrames::Stack(s) => (s, TraceEvent::HAS_FRAMES),
        };
        let action = *Action::ALL
            .get(e.action as usize)
            .ok_or("a trace entry with an unknown action")?;
        let stream = match e.stream {
            Some(raw) => self.intern_stream(raw),
            None => 0,
        };
        let cc = e.compile_context.filter(|&s| s != self.keys.na);
        let um = e.user_metadata.filter(|&s| s != self.keys.empty);
        let ev = TraceEvent {
            addr: e.addr,
            size: e.size,
            time_us: e.time_us,
            stack,
            stream,
            action,
            flags,
        };
        let idx = self.push_event(ev, cc, um);
        Ok((Value::Event(idx), Value::Stack(stack)))
    }

    fn filled_dict(&mut self, items: &[Value]) -> Result<Value, String> {
        // `set_items` on a fresh dict, without making the dict first when it
        // turns out to be a trace entry (most of a snapshot).
        if items.first() == Some(&Value::Str(self.keys.action)) {
            if let Some(e) = self.as_event(items)? {
                return Ok(Value::Event(e));
            }
            let d = self.empty_dict()?;
            if let Value::Dict(id) = d {
                self.store_generic(id, items)?;
            }
            return Ok(d);
        }
        let d = self.empty_dict()?;
        self.set_items(d, items)
    }

    fn frames_list(&mut self, frames: &[u32]) -> Result<Value, String> {
        // What `empty_list`, `append` and the conversion by `as_event` give,
        // without the list: its frames are already known to be frames.
        self.spend(8)?;
        if frames.iter().any(|&f| f as usize >= self.frames.len()) {
            return Err("a list of frames names a frame that was never read".into());
        }
        Ok(Value::Stack(self.intern_stack(frames)))
    }

    fn append(&mut self, list: Value, items: &[Value]) -> Result<Value, String> {
        let Value::List(id) = list else {
            return Err(format!("APPEND(S) on a {}, not a list", list.type_name()));
        };
        let ListSlot::Open(b) = self.lists[id as usize] else {
            return Err(
                "a list was modified after it was complete (not a PyTorch snapshot layout)".into(),
            );
        };
        // A batch of a device trace: the events that follow the list's run.
        let body = &mut self.list_bodies[b as usize];
        if body.items.is_empty() {
            let first = match (body.ev_len, items.first()) {
                (0, Some(&Value::Event(e))) => Some(e),
                (0, _) => None,
                (n, _) => Some(body.ev_start.wrapping_add(n)),
            };
            let follows = |first: u32| {
                (items.iter().enumerate())
                    .all(|(i, v)| *v == Value::Event(first.wrapping_add(i as u32)))
            };
            if let Some(first) = first.filter(|&f| follows(f)) {
                if body.ev_len == 0 {
                    body.ev_start = first;
                }
                body.ev_len += items.len() as u32;
                // The budget check every append makes (strings are charged
                // without one).
                self.spend(0)?;
                return Ok(list);
            }
        }
        // Runs of events cost nothing (they are kept as a range); other items
        // are 16 bytes each until the list becomes a stack. Charged after the
        // batch, which the reader's stack limit bounds.
        let mut generic = 0u64;
        for &item in items {
            let item = self.resolve(item);
            let body = &mut self.list_bodies[b as usize];
            if let Value::Event(e) = item {
                // Keep a run of consecutive events as a range.
                if body.items.is_empty() && (body.ev_len == 0 || body.ev_start + body.ev_len == e) {
                    if body.ev_len == 0 {
                        body.ev_start = e;
                    }
                    body.ev_len += 1;
                    continue;
                }
            }
            if body.ev_len > 0 {
                let (s, n) = (body.ev_start, body.ev_len);
                body.items.extend((s..s + n).map(Value::Event));
                generic += n as u64;
                body.ev_len = 0;
            }
            body.items.push(item);
            generic += 1;
        }
        self.spend(16 * generic)?;
        Ok(list)
    }
}

impl Heap {
    /// Makes dict `id` a generic dict holding `items`.
    fn store_generic(&mut self, id: u32, items: &[Value]) -> Result<(), String> {
        self.spend(24 + 16 * items.len() as u64)?;
        let b = self.new_dict_body();
        self.dicts[id as usize] = DictSlot::Open(b);
        self.extend_generic(b, items);
        Ok(())
    }

    fn extend_generic(&mut self, body: u32, items: &[Value]) {
        let frames_key = Value::Str(self.keys.frames);
        for pair in items.chunks_exact(2) {
            let mut v = self.resolve(pair[1]);
            if pair[0] == frames_key {
                if let Some(s) = self.list_to_stack(v) {
                    v = Value::Stack(s);
                }
            }
            self.dict_bodies[body as usize].push((pair[0], v));
        }
    }
}
