//! A safe, streaming reader of the pickle opcodes PyTorch snapshots use.
//!
//! It never runs code: `GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`,
//! `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `PERSID`, `BINPERSID` and the extension-registry
//! opcodes are refused with an error that says so. Python's `pickle.load` on an
//! untrusted snapshot runs whatever the file asks for; this reader cannot.
//!
//! The reader is a small virtual machine ([`vm`]) over a byte source
//! ([`input::Source`]: a window refilled from any reader, or bytes read in
//! place, such as a memory-mapped file). It does not build a generic object tree: containers are handed
//! to a [`Builder`], which may turn a finished dict into something compact (a
//! trace event, an interned frame) and free its storage at once. That is what
//! keeps memory proportional to the distinct content of a snapshot rather than
//! to the size of its pickle.
//!
//! Trace entries, nearly all of a snapshot's bytes, take a fast path
//! (`fast.rs`) when the builder asks for it ([`Builder::fast_keys`]): a whole
//! entry is read from the window at once and handed to the builder as one
//! dict; anything it does not expect goes through the general loop, with the
//! same result. Trace entries in PyTorch's own key order go one step further
//! (`entry.rs`, when the builder asks for it with [`Builder::entry_keys`]):
//! their fields are decoded straight into an [`EntryFields`], with no dict of
//! generic values in between. On a machine of eight cores or more, a long run
//! of such entries in memory is decoded ahead on the other cores
//! (`ahead.rs`, [`ReadAhead`]) and the reader only commits the results, in
//! order.

mod ahead;
mod entry;
mod fast;
pub mod input;
pub mod vm;

pub use ahead::ReadAhead;
pub use input::{Input, Mapped, Region, Source};
pub use vm::{parse, Limits};

/// An error in a pickle stream, with the byte offset where it was found.
#[derive(Debug, thiserror::Error)]
#[error("{message} (at byte {offset})")]
pub struct PickleError {
    /// Byte offset of the opcode at fault.
    pub offset: u64,
    /// What is wrong.
    pub message: String,
}

/// A value on the reader's stack or in its memo. Containers are ids owned by
/// the [`Builder`]; the last three variants are handles of things the builder
/// converted containers into.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer that fits in `i64`.
    Int(i64),
    /// An integer in `i64::MAX+1 ..= u64::MAX`.
    UInt(u64),
    /// An integer too large for 64 bits (its value is not kept).
    BigInt,
    /// A float.
    Float(f64),
    /// An interned string.
    Str(u32),
    /// A byte string (its content is not kept).
    Bytes,
    /// A dict owned by the builder.
    Dict(u32),
    /// A list owned by the builder.
    List(u32),
    /// A tuple owned by the builder.
    Tuple(u32),
    /// A set or frozenset (its content is not kept).
    Set,
    /// A frame dict the builder interned.
    Frame(u32),
    /// A list of frames the builder interned as a stack.
    Stack(u32),
    /// A trace-entry dict the builder turned into an event.
    Event(u32),
}

impl Value {
    /// The value as an `i64`, when it is an integer that fits (or a bool).
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// The value as a `u64`, when it is a non-negative integer.
    pub fn as_u64(self) -> Option<u64> {
        match self {
            Value::Int(i) if i >= 0 => Some(i as u64),
            Value::UInt(u) => Some(u),
            Value::Bool(b) => Some(b as u64),
            _ => None,
        }
    }

    /// The value as a float (integers convert).
    pub fn as_f64(self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(f),
            Value::Int(i) => Some(i as f64),
            Value::UInt(u) => Some(u as f64),
            _ => None,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::UInt(_) | Value::BigInt => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes => "bytes",
            Value::Dict(_) => "dict",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Set => "set",
            Value::Frame(_) => "frame dict",
            Value::Stack(_) => "list of frames",
            Value::Event(_) => "trace entry",
        }
    }
}

/// What the reader hands containers to. The builder owns every container;
/// the reader only moves [`Value`]s around. Container ids are never reused, so
/// a value on the stack or in the memo can always be resolved.
pub trait Builder {
    /// A string was read.
    fn string(&mut self, s: &str) -> Value;
    /// `EMPTY_DICT`: a new, empty dict.
    fn empty_dict(&mut self) -> Result<Value, String>;
    /// `EMPTY_LIST`: a new, empty list.
    fn empty_list(&mut self) -> Result<Value, String>;
    /// A tuple of the given items.
    fn tuple(&mut self, items: &[Value]) -> Result<Value, String>;
    /// `dict.update(items)` with `items` alternating keys and values. Returns
    /// the value that now stands for the dict: the builder may have converted
    /// it into a frame or an event.
    fn set_items(&mut self, dict: Value, items: &[Value]) -> Result<Value, String>;
    /// `list.extend(items)`. Returns the value that now stands for the list.
    fn append(&mut self, list: Value, items: &[Value]) -> Result<Value, String>;
    /// The reader is about to hold `bytes` more of its own (memo slots); the
    /// builder may refuse when the total passes its memory budget.
    fn charge(&mut self, bytes: usize) -> Result<(), String> {
        let _ = bytes;
        Ok(())
    }
    /// About `entries` more trace entries are coming (decoded ahead on other
    /// threads, module `ahead`): the builder may make room for what it will
    /// store for them and return the addresses of that room, not yet written,
    /// which the reader's idle threads then fault in (`prefault::populate`)
    /// so that the reading thread does not. `None` (the default): nothing to
    /// fault in.
    fn room_for_entries(&mut self, entries: usize) -> Option<std::ops::Range<usize>> {
        let _ = entries;
        None
    }
    /// The keys that make a dict worth the reader's fast path: `Some` turns it
    /// on for dicts whose first key is `first` (a trace entry's `action`), with
    /// an inline list of frames accepted as the value of `list` (`frames`).
    /// The fast path relies on [`Builder::string`] giving the same value for
    /// the same text every time (it remembers a few).
    fn fast_keys(&self) -> Option<FastKeys> {
        None
    }
    /// A dict the fast path read whole (`EMPTY_DICT`, items, `SETITEMS`):
    /// the same as [`Builder::empty_dict`] then [`Builder::set_items`].
    fn filled_dict(&mut self, items: &[Value]) -> Result<Value, String> {
        let d = self.empty_dict()?;
        self.set_items(d, items)
    }
    /// A list of interned frames the fast path read whole: the same as
    /// [`Builder::empty_list`] then [`Builder::append`] of the frames.
    fn frames_list(&mut self, frames: &[u32]) -> Result<Value, String> {
        let l = self.empty_list()?;
        let items: Vec<Value> = frames.iter().map(|&f| Value::Frame(f)).collect();
        self.append(l, &items)
    }
    /// The keys of a trace entry, when the builder takes entries decoded
    /// field by field ([`Builder::entry`]); `None` (the default) leaves every
    /// dict to the fast path or the general loop.
    fn entry_keys(&self) -> Option<EntryKeys> {
        None
    }
    /// Whether [`Builder::entry`] takes an entry whose `action` is the string
    /// `action` and whose new frames list holds frames up to `highest_frame`
    /// (an interned frame id; `None` for no frames). Changes nothing: the
    /// reader asks before it commits anything, and reads the dict the other
    /// way when the answer is no.
    fn takes_entry(&self, action: u32, highest_frame: Option<u32>) -> bool {
        let _ = (action, highest_frame);
        false
    }
    /// A trace entry the reader decoded field by field (only called after
    /// [`Builder::takes_entry`] said yes): the same as
    /// [`Builder::frames_list`] of `frames` (when the entry has a new list
    /// of frames, [`EntryFrames::List`]) then [`Builder::filled_dict`] of its
    /// items. Returns the entry's value and the new frames list's.
    fn entry(&mut self, fields: &EntryFields, frames: &[u32]) -> Result<(Value, Value), String> {
        let _ = (fields, frames);
        Err("this builder does not take decoded trace entries".into())
    }
}

/// Interned keys of a trace entry (see [`Builder::entry_keys`]). The reader
/// takes a dict field by field when its keys are a subset of these, `action`
/// first, in this order (PyTorch's), `addr` or `device_free` but not both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryKeys {
    /// `action`: the name of what happened.
    pub action: u32,
    /// `addr`: a block or segment address.
    pub addr: u32,
    /// `device_free`: free device memory, in place of `addr` in an `oom` entry.
    pub device_free: u32,
    /// `size`: bytes.
    pub size: u32,
    /// `stream`: the CUDA stream.
    pub stream: u32,
    /// `time_us`: when, in epoch microseconds.
    pub time_us: u32,
    /// `compile_context`: a string (`"N/A"` when none).
    pub compile_context: u32,
    /// `user_metadata`: a string (empty when none).
    pub user_metadata: u32,
    /// `frames`: the list of frame dicts.
    pub frames: u32,
}

/// A trace entry's fields as the reader decoded them (see [`Builder::entry`]).
/// Only what the general loop would also accept reaches the builder this
/// way: sizes and addresses are non-negative, strings are interned, frames
/// are frames the builder made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryFields {
    /// String id of the action's name.
    pub action: u32,
    /// `addr` or `device_free`, 0 when neither is there.
    pub addr: u64,
    /// `size`, 0 when absent.
    pub size: u64,
    /// The raw `stream`, `None` when absent.
    pub stream: Option<i64>,
    /// `time_us`, 0 when absent.
    pub time_us: i64,
    /// String id of `compile_context`, when present.
    pub compile_context: Option<u32>,
    /// String id of `user_metadata`, when present.
    pub user_metadata: Option<u32>,
    /// What the entry's `frames` key holds.
    pub frames: EntryFrames,
}

/// The `frames` of a trace entry read field by field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EntryFrames {
    /// No `frames` key.
    #[default]
    Absent,
    /// A new list of frames (the frames are passed beside).
    List,
    /// A memo reference to a list of frames the builder already made into
    /// this stack (PyTorch hands identical stacks over as one list).
    Stack(u32),
}

/// Interned keys the fast path looks for (see [`Builder::fast_keys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastKeys {
    /// The string id the first key of a fast dict must have.
    pub first: u32,
    /// The string id of the key whose value may be an inline list of frames.
    pub list: u32,
}
