//! The opcode loop. Supports every plain-data opcode of pickle protocols 2 to 5
//! (and the binary opcodes of protocol 1); refuses every opcode that would
//! import or call something, and the protocol-0 text opcodes.

use super::input::{InputError, Source};
use super::{Builder, PickleError, Value};

/// Bounds that keep a hostile file from taking unbounded memory.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most values on the stack at once.
    pub max_stack: usize,
    /// Most open `MARK`s at once.
    pub max_marks: usize,
    /// Largest single string or bytes object (or `LONG4`): [`MAX_ITEM_BYTES`]
    /// by default.
    pub max_item_bytes: usize,
    /// Largest memo index accepted beyond the current memo size.
    pub max_memo_gap: usize,
    /// Read trace-entry dicts through the fast path (module `pickle::fast`) when
    /// the builder asks for it. On by default; tests turn it off to prove
    /// both paths give the same snapshot.
    pub fast_path: bool,
    /// Within the fast path, read trace entries in PyTorch's key order field
    /// by field (module `pickle::entry`) when the builder takes them. On by
    /// default; tests turn it off to prove it gives what the fast path gives.
    pub entry_path: bool,
    /// Decoding trace entries ahead of the reader on other threads (module
    /// `pickle::ahead`), when the input is in memory. Tests turn it off, or
    /// on at any size, to prove it reads what the reader alone reads.
    pub read_ahead: super::ReadAhead,
}

/// The default largest string or bytes object: 64 MiB. The longest string in
/// the real snapshots of the test fixtures is 89 bytes (a source path or a
/// function name; a few KiB at most anywhere), so this is far above any real
/// one, and low enough that a file of many such strings is refused before it
/// costs gigabytes (each string is held twice while it is read: in the
/// input's window, then interned).
pub const MAX_ITEM_BYTES: usize = 64 << 20;

/// Strings longer than this make the builder check its memory budget at
/// once (rather than at its next container), so that a run of long strings
/// is refused at the first one past the budget.
const LONG_STRING: usize = 64 << 10;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // CPython batches 1000 items a MARK; a million is far beyond any real nesting.
            max_stack: 1 << 20,
            max_marks: 1 << 20,
            max_item_bytes: MAX_ITEM_BYTES,
            max_memo_gap: 1 << 20,
            fast_path: true,
            entry_path: true,
            read_ahead: super::ReadAhead::default(),
        }
    }
}

// Opcodes, named as in CPython's `pickle.py`.
pub(super) const MARK: u8 = b'(';
pub(super) const STOP: u8 = b'.';
pub(super) const POP: u8 = b'0';
pub(super) const POP_MARK: u8 = b'1';
pub(super) const DUP: u8 = b'2';
pub(super) const FLOAT: u8 = b'F';
pub(super) const INT: u8 = b'I';
pub(super) const BININT: u8 = b'J';
pub(super) const BININT1: u8 = b'K';
pub(super) const LONG: u8 = b'L';
pub(super) const BININT2: u8 = b'M';
pub(super) const NONE: u8 = b'N';
pub(super) const PERSID: u8 = b'P';
pub(super) const BINPERSID: u8 = b'Q';
pub(super) const REDUCE: u8 = b'R';
pub(super) const STRING: u8 = b'S';
pub(super) const BINSTRING: u8 = b'T';
pub(super) const SHORT_BINSTRING: u8 = b'U';
pub(super) const UNICODE: u8 = b'V';
pub(super) const BINUNICODE: u8 = b'X';
pub(super) const APPEND: u8 = b'a';
pub(super) const BUILD: u8 = b'b';
pub(super) const GLOBAL: u8 = b'c';
pub(super) const DICT: u8 = b'd';
pub(super) const EMPTY_DICT: u8 = b'}';
pub(super) const APPENDS: u8 = b'e';
pub(super) const GET: u8 = b'g';
pub(super) const BINGET: u8 = b'h';
pub(super) const INST: u8 = b'i';
pub(super) const LONG_BINGET: u8 = b'j';
pub(super) const LIST: u8 = b'l';
pub(super) const EMPTY_LIST: u8 = b']';
pub(super) const OBJ: u8 = b'o';
pub(super) const PUT: u8 = b'p';
pub(super) const BINPUT: u8 = b'q';
pub(super) const LONG_BINPUT: u8 = b'r';
pub(super) const SETITEM: u8 = b's';
pub(super) const TUPLE: u8 = b't';
pub(super) const EMPTY_TUPLE: u8 = b')';
pub(super) const SETITEMS: u8 = b'u';
pub(super) const BINFLOAT: u8 = b'G';
pub(super) const PROTO: u8 = 0x80;
pub(super) const NEWOBJ: u8 = 0x81;
pub(super) const EXT1: u8 = 0x82;
pub(super) const EXT2: u8 = 0x83;
pub(super) const EXT4: u8 = 0x84;
pub(super) const TUPLE1: u8 = 0x85;
pub(super) const TUPLE2: u8 = 0x86;
pub(super) const TUPLE3: u8 = 0x87;
pub(super) const NEWTRUE: u8 = 0x88;
pub(super) const NEWFALSE: u8 = 0x89;
pub(super) const LONG1: u8 = 0x8a;
pub(super) const LONG4: u8 = 0x8b;
pub(super) const SHORT_BINUNICODE: u8 = 0x8c;
pub(super) const BINUNICODE8: u8 = 0x8d;
pub(super) const BINBYTES8: u8 = 0x8e;
pub(super) const EMPTY_SET: u8 = 0x8f;
pub(super) const ADDITEMS: u8 = 0x90;
pub(super) const FROZENSET: u8 = 0x91;
pub(super) const NEWOBJ_EX: u8 = 0x92;
pub(super) const STACK_GLOBAL: u8 = 0x93;
pub(super) const MEMOIZE: u8 = 0x94;
pub(super) const FRAME: u8 = 0x95;
pub(super) const BYTEARRAY8: u8 = 0x96;
pub(super) const NEXT_BUFFER: u8 = 0x97;
pub(super) const READONLY_BUFFER: u8 = 0x98;
pub(super) const SHORT_BINBYTES: u8 = b'C';
pub(super) const BINBYTES: u8 = b'B';

/// The memo holds values packed in 32 bits: a 4-bit kind and a 28-bit id.
/// Scalars (rarely memoized) live in a side table. A snapshot memoizes about
/// three objects per trace event, so this keeps the memo to ~12 bytes an event.
pub(super) struct Memo {
    pub(super) slots: Vec<u32>,
    scalars: Vec<Value>,
}

pub(super) const MEMO_EMPTY: u32 = u32::MAX;
/// Kind of a string in a packed memo slot.
pub(super) const KIND_STR: u32 = 0;
/// Kind of an interned frame in a packed memo slot.
pub(super) const KIND_FRAME: u32 = 4;
/// Kind of an interned stack (a list of frames) in a packed memo slot.
pub(super) const KIND_STACK: u32 = 5;
const ID_BITS: u32 = 28;
const ID_MASK: u32 = (1 << ID_BITS) - 1;

impl Memo {
    #[inline]
    fn pack(&mut self, v: Value) -> Result<u32, String> {
        let (kind, id) = match v {
            Value::Str(i) => (0, i),
            Value::Dict(i) => (1, i),
            Value::List(i) => (2, i),
            Value::Tuple(i) => (3, i),
            Value::Frame(i) => (4, i),
            Value::Stack(i) => (5, i),
            Value::Event(i) => (6, i),
            scalar => {
                self.scalars.push(scalar);
                (7, (self.scalars.len() - 1) as u32)
            }
        };
        if id > ID_MASK {
            return Err("too many objects in one pickle (more than 268 million)".into());
        }
        Ok((kind << ID_BITS) | id)
    }

    #[inline(always)]
    fn unpack(&self, p: u32) -> Option<Value> {
        let id = p & ID_MASK;
        Some(match p >> ID_BITS {
            0 => Value::Str(id),
            1 => Value::Dict(id),
            2 => Value::List(id),
            3 => Value::Tuple(id),
            4 => Value::Frame(id),
            5 => Value::Stack(id),
            6 => Value::Event(id),
            7 => *self.scalars.get(id as usize)?,
            _ => return None,
        })
    }

    #[inline]
    pub(super) fn put(&mut self, index: usize, v: Value, limits: &Limits) -> Result<(), String> {
        let packed = self.pack(v)?;
        if index >= self.slots.len() {
            if index - self.slots.len() > limits.max_memo_gap {
                return Err(format!("memo index {index} is far beyond the memo's size"));
            }
            self.slots.resize(index + 1, MEMO_EMPTY);
        }
        self.slots[index] = packed;
        Ok(())
    }

    /// Fills the next slot with `v` (as [`Memo::put`] at the memo's length).
    #[inline(always)]
    pub(super) fn push(&mut self, v: Value, limits: &Limits) -> Result<(), String> {
        match Self::handle(v) {
            Some(h) => {
                self.slots.push(h);
                Ok(())
            }
            None => self.put(self.slots.len(), v, limits),
        }
    }

    /// After the builder converted `old` into `new`, points the memo slot that
    /// holds `old` at `new`, so later references skip the builder's lookup.
    /// A dict's memo slot is among the last few: only the memoized strings of
    /// its own items come after it.
    fn converted(&mut self, old: Value, new: Value) {
        let (Ok(old_p), Ok(new_p)) = (self.pack_ref(old), self.pack_ref(new)) else {
            return;
        };
        let n = self.slots.len();
        for slot in self.slots[n.saturating_sub(8)..].iter_mut().rev() {
            if *slot == old_p {
                *slot = new_p;
                return;
            }
        }
    }

    /// A container or handle (not a scalar) packed as in a memo slot, or
    /// `None` for anything else (see [`Memo::unhandle`]).
    #[inline(always)]
    pub(super) fn handle(v: Value) -> Option<u32> {
        let (kind, id) = match v {
            Value::Str(i) => (KIND_STR, i),
            Value::Dict(i) => (1, i),
            Value::List(i) => (2, i),
            Value::Tuple(i) => (3, i),
            Value::Frame(i) => (KIND_FRAME, i),
            Value::Stack(i) => (KIND_STACK, i),
            Value::Event(i) => (6, i),
            _ => return None,
        };
        (id <= ID_MASK).then_some((kind << ID_BITS) | id)
    }

    /// The value [`Memo::handle`] packed.
    #[inline(always)]
    pub(super) fn unhandle(p: u32) -> Value {
        let id = p & ID_MASK;
        match p >> ID_BITS {
            KIND_STR => Value::Str(id),
            1 => Value::Dict(id),
            2 => Value::List(id),
            3 => Value::Tuple(id),
            KIND_FRAME => Value::Frame(id),
            5 => Value::Stack(id),
            _ => Value::Event(id),
        }
    }

    /// Packs a container or handle (never a scalar) without touching the side table.
    fn pack_ref(&self, v: Value) -> Result<u32, ()> {
        let (kind, id) = match v {
            Value::Dict(i) => (1, i),
            Value::Frame(i) => (4, i),
            Value::Event(i) => (6, i),
            _ => return Err(()),
        };
        if id > ID_MASK {
            return Err(());
        }
        Ok((kind << ID_BITS) | id)
    }

    /// The value in memo slot `index`. An `Option` rather than a `Result`
    /// with a message: this runs for most opcodes of a snapshot, and a
    /// `Result<Value, String>` makes every hit go through memory.
    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> Option<Value> {
        match self.slots.get(index) {
            Some(&p) if p != MEMO_EMPTY => self.unpack(p),
            _ => None,
        }
    }

    /// The packed content of slot `index` when it holds a container or
    /// handle of kind `kind` (0 string, 4 frame: see `pack`): its id.
    #[inline(always)]
    pub(super) fn id_of_kind(&self, index: usize, kind: u32) -> Option<u32> {
        Memo::kind_id(*self.slots.get(index)?, kind)
    }

    /// The id in packed slot content `p` when it is of kind `kind`. An empty
    /// slot (all ones) has kind 15, which no caller asks for.
    #[inline(always)]
    pub(super) fn kind_id(p: u32, kind: u32) -> Option<u32> {
        (p >> ID_BITS == kind).then_some(p & ID_MASK)
    }

    /// Why `get(index)` found nothing.
    #[cold]
    fn missing(&self, index: usize) -> Fault {
        match self.slots.get(index) {
            Some(&p) if p != MEMO_EMPTY => Fault::Msg(format!("memo slot {index} is corrupt")),
            _ => Fault::Msg(format!("memo index {index} was never stored")),
        }
    }
}

fn opcode_name(op: u8) -> &'static str {
    match op {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        BININT => "BININT",
        BININT1 => "BININT1",
        BININT2 => "BININT2",
        NONE => "NONE",
        BINUNICODE => "BINUNICODE",
        APPEND => "APPEND",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        APPENDS => "APPENDS",
        BINGET => "BINGET",
        LONG_BINGET => "LONG_BINGET",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        SETITEM => "SETITEM",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        SETITEMS => "SETITEMS",
        BINFLOAT => "BINFLOAT",
        PROTO => "PROTO",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES8 => "BINBYTES8",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        MEMOIZE => "MEMOIZE",
        FRAME => "FRAME",
        BYTEARRAY8 => "BYTEARRAY8",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        BINBYTES => "BINBYTES",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        _ => "opcode",
    }
}

/// Bytes a memo entry for `v` costs: a 4-byte slot, plus 16 in the side
/// table for a scalar.
pub(super) fn memo_cost(v: Value) -> usize {
    match v {
        Value::Str(_)
        | Value::Dict(_)
        | Value::List(_)
        | Value::Tuple(_)
        | Value::Frame(_)
        | Value::Stack(_)
        | Value::Event(_) => 4,
        _ => 20,
    }
}

/// Decodes a little-endian two's-complement integer (`LONG1`/`LONG4`).
pub(super) fn decode_long(bytes: &[u8]) -> Value {
    let n = bytes.len();
    if n == 0 {
        return Value::Int(0);
    }
    let negative = bytes[n - 1] & 0x80 != 0;
    if n <= 8 {
        let mut buf = if negative { [0xffu8; 8] } else { [0u8; 8] };
        buf[..n].copy_from_slice(bytes);
        return Value::Int(i64::from_le_bytes(buf));
    }
    // Wider encodings: a u64 >= 2^63 takes 9 bytes with a zero sign byte.
    if !negative && bytes[8..].iter().all(|&b| b == 0) {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(&bytes[..8]);
        let u = u64::from_le_bytes(buf);
        return if u <= i64::MAX as u64 {
            Value::Int(u as i64)
        } else {
            Value::UInt(u)
        };
    }
    if negative && bytes[8..].iter().all(|&b| b == 0xff) && bytes[7] & 0x80 != 0 {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(&bytes[..8]);
        return Value::Int(i64::from_le_bytes(buf));
    }
    Value::BigInt
}

/// Reads one pickle from `input`, handing containers to `builder`, and returns
/// the top-level value.
pub fn parse<S: Source, B: Builder>(
    input: &mut S,
    builder: &mut B,
    limits: Limits,
) -> Result<Value, PickleError> {
    let mut vm = Vm {
        stack: Vec::with_capacity(4096),
        marks: Vec::with_capacity(64),
        memo: Memo {
            slots: Vec::new(),
            scalars: Vec::new(),
        },
        limits,
        fast: super::fast::Scratch::default(),
        ahead: super::ahead::Ahead::new(limits.read_ahead),
    };
    vm.run(input, builder)
}

pub(super) struct Vm {
    pub(super) stack: Vec<Value>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: Memo,
    pub(super) limits: Limits,
    /// Working storage of the fast path, reused from dict to dict.
    pub(super) fast: super::fast::Scratch,
    /// Trace entries decoded ahead of the reader (module `pickle::ahead`),
    /// when it reads ahead. Boxed, so that taking it out while its result
    /// is committed moves a pointer.
    pub(super) ahead: Option<Box<super::ahead::Ahead>>,
}

/// An error before it is given its byte offset.
pub(super) enum Fault {
    Input(InputError),
    Msg(String),
    /// An error found past the opcode that started the step (the fast path
    /// reads a whole dict in one step): its own offset, from that opcode's.
    At(u64, String),
}

impl From<InputError> for Fault {
    fn from(e: InputError) -> Self {
        Fault::Input(e)
    }
}

impl From<String> for Fault {
    fn from(e: String) -> Self {
        Fault::Msg(e)
    }
}

impl Vm {
    /// Room on the stack for what the general loop would hold at a fast
    /// dict's `SETITEMS`: `depth` values and two marks (the fast paths check
    /// once, before they commit, what the loop checks value by value).
    #[inline(always)]
    pub(super) fn stack_room(&self, depth: usize) -> Result<(), String> {
        if self.stack.len() + depth > self.limits.max_stack
            || self.marks.len() + 2 > self.limits.max_marks
        {
            return Err(format!(
                "the pickle stack grew past {} values",
                self.limits.max_stack
            ));
        }
        Ok(())
    }

    fn run<S: Source, B: Builder>(
        &mut self,
        input: &mut S,
        builder: &mut B,
    ) -> Result<Value, PickleError> {
        loop {
            let offset = input.offset();
            let op = match input.byte() {
                Ok(op) => op,
                Err(InputError::Truncated) => {
                    return Err(PickleError {
                        offset,
                        message: if offset == 0 {
                            "the file is empty".into()
                        } else {
                            "the file is truncated: it ends before the pickle's STOP opcode".into()
                        },
                    })
                }
                Err(InputError::Io(e)) => {
                    return Err(PickleError {
                        offset,
                        message: format!("read error: {e}"),
                    })
                }
            };
            match self.step(op, input, builder) {
                Ok(true) => {}
                Ok(false) => {
                    return self.stack.pop().ok_or_else(|| PickleError {
                        offset,
                        message: "STOP with an empty stack".into(),
                    })
                }
                Err(Fault::Input(InputError::Truncated)) => {
                    return Err(PickleError {
                        offset,
                        message: format!(
                            "the file is truncated in the middle of a {} opcode",
                            opcode_name(op)
                        ),
                    })
                }
                Err(Fault::Input(InputError::Io(e))) => {
                    return Err(PickleError {
                        offset,
                        message: format!("read error: {e}"),
                    })
                }
                Err(Fault::Msg(message)) => return Err(PickleError { offset, message }),
                Err(Fault::At(delta, message)) => {
                    return Err(PickleError {
                        offset: offset + delta,
                        message,
                    })
                }
            }
        }
    }

    #[inline]
    pub(super) fn push(&mut self, v: Value) -> Result<(), Fault> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(Fault::Msg(format!(
                "the pickle stack grew past {} values",
                self.limits.max_stack
            )));
        }
        self.stack.push(v);
        Ok(())
    }

    #[inline]
    fn pop(&mut self, op: u8) -> Result<Value, Fault> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(Fault::Msg(format!(
                "{} with nothing to take from the stack",
                opcode_name(op)
            )));
        }
        Ok(self.stack.pop().unwrap_or(Value::None))
    }

    fn pop_mark(&mut self, op: u8) -> Result<usize, Fault> {
        self.marks
            .pop()
            .ok_or_else(|| Fault::Msg(format!("{} without a MARK", opcode_name(op))))
    }

    fn len_checked(&self, n: u64) -> Result<usize, Fault> {
        if n > self.limits.max_item_bytes as u64 {
            return Err(Fault::Msg(format!(
                "a string or bytes item of {n} bytes is larger than the {} MiB limit (a snapshot's strings are a few KiB at most): a decompression bomb, or not a memory snapshot",
                self.limits.max_item_bytes >> 20
            )));
        }
        Ok(n as usize)
    }

    fn string<S: Source, B: Builder>(
        &mut self,
        input: &mut S,
        builder: &mut B,
        n: usize,
    ) -> Result<(), Fault> {
        let bytes = input.take(n)?;
        let v = match std::str::from_utf8(bytes) {
            Ok(s) => builder.string(s),
            // CPython writes lone surrogates with 'surrogatepass'; keep the rest.
            Err(_) => builder.string(&String::from_utf8_lossy(bytes)),
        };
        if n > LONG_STRING {
            // Strings are charged when interned and checked at the next
            // container; a long one is checked now.
            builder.charge(0)?;
        }
        self.push(v)
    }

    /// The container just below the items of a MARK-delimited group.
    fn target_below(&self, mark: usize, op: u8) -> Result<Value, Fault> {
        if mark == 0 {
            return Err(Fault::Msg(format!(
                "{} with no container under its MARK",
                opcode_name(op)
            )));
        }
        Ok(self.stack[mark - 1])
    }

    /// Executes one opcode; returns false at STOP. Each family of opcodes
    /// has its own helper (inlined: this is the reader's hot loop).
    #[inline]
    fn step<S: Source, B: Builder>(
        &mut self,
        op: u8,
        input: &mut S,
        builder: &mut B,
    ) -> Result<bool, Fault> {
        match op {
            BINGET | LONG_BINGET | MEMOIZE | BINPUT | LONG_BINPUT => {
                self.memo_op(op, input, builder)?
            }
            MARK | POP | POP_MARK | DUP => self.stack_op(op)?,
            BININT | BININT1 | BININT2 | LONG1 | LONG4 | BINFLOAT | NONE | NEWTRUE | NEWFALSE => {
                self.scalar(op, input)?
            }
            SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 | SHORT_BINSTRING | BINSTRING
            | SHORT_BINBYTES | BINBYTES | BINBYTES8 | BYTEARRAY8 => {
                self.text(op, input, builder)?
            }
            EMPTY_DICT => {
                if self.limits.fast_path && super::fast::entry(self, input, builder)? {
                    return Ok(true);
                }
                let d = builder.empty_dict()?;
                self.push(d)?;
            }
            EMPTY_LIST | EMPTY_TUPLE | EMPTY_SET | DICT | LIST | TUPLE | TUPLE1 | TUPLE2
            | TUPLE3 | FROZENSET => self.make(op, builder)?,
            SETITEMS | SETITEM | APPENDS | APPEND | ADDITEMS => self.fill(op, builder)?,
            PROTO => {
                let v = input.byte()?;
                if v > 5 {
                    return Err(Fault::Msg(format!(
                        "pickle protocol {v} is newer than any memlens knows (2 to 5)"
                    )));
                }
            }
            FRAME => {
                // A buffering hint: the frame's length is not needed to read it.
                input.array::<8>()?;
            }
            STOP => return Ok(false),
            other => return Err(refused(other, input)),
        }
        Ok(true)
    }

    /// `BINGET`, `LONG_BINGET`, `MEMOIZE`, `BINPUT` and `LONG_BINPUT`.
    #[inline(always)]
    fn memo_op<S: Source, B: Builder>(
        &mut self,
        op: u8,
        input: &mut S,
        builder: &mut B,
    ) -> Result<(), Fault> {
        match op {
            BINGET => {
                let i = input.byte()? as usize;
                match self.memo.get(i) {
                    Some(v) => self.push(v)?,
                    None => return Err(self.memo.missing(i)),
                }
            }
            LONG_BINGET => {
                let i = u32::from_le_bytes(input.array()?) as usize;
                match self.memo.get(i) {
                    Some(v) => self.push(v)?,
                    None => return Err(self.memo.missing(i)),
                }
            }
            MEMOIZE => {
                let v = *self
                    .stack
                    .last()
                    .ok_or_else(|| "MEMOIZE with an empty stack".to_string())?;
                let i = self.memo.slots.len();
                builder.charge(memo_cost(v))?;
                self.memo.put(i, v, &self.limits)?;
            }
            _ => {
                let i = if op == BINPUT {
                    input.byte()? as usize
                } else {
                    u32::from_le_bytes(input.array()?) as usize
                };
                let v = *self
                    .stack
                    .last()
                    .ok_or_else(|| "PUT with an empty stack".to_string())?;
                if i < self.memo.slots.len() {
                    // A slot overwritten: what was decoded ahead may have read it.
                    if let Some(ahead) = &mut self.ahead {
                        ahead.forget();
                    }
                }
                let grow = (i + 1).saturating_sub(self.memo.slots.len());
                builder.charge(grow * 4 + memo_cost(v))?;
                self.memo.put(i, v, &self.limits)?;
            }
        }
        Ok(())
    }

    /// `MARK`, `POP`, `POP_MARK` and `DUP`.
    #[inline(always)]
    fn stack_op(&mut self, op: u8) -> Result<(), Fault> {
        match op {
            MARK => {
                if self.marks.len() >= self.limits.max_marks {
                    return Err(Fault::Msg("too many nested MARKs".into()));
                }
                self.marks.push(self.stack.len());
            }
            POP => {
                // POP may also drop a MARK with nothing above it (as CPython does).
                if self.marks.last() == Some(&self.stack.len()) {
                    self.marks.pop();
                } else {
                    self.pop(op)?;
                }
            }
            POP_MARK => {
                let mark = self.pop_mark(op)?;
                self.stack.truncate(mark);
            }
            _ => {
                let v = self.pop(op)?;
                self.push(v)?;
                self.push(v)?;
            }
        }
        Ok(())
    }

    /// Integers, floats, `None` and booleans.
    #[inline(always)]
    fn scalar<S: Source>(&mut self, op: u8, input: &mut S) -> Result<(), Fault> {
        let v = match op {
            BININT => Value::Int(i32::from_le_bytes(input.array()?) as i64),
            BININT1 => Value::Int(input.byte()? as i64),
            BININT2 => Value::Int(u16::from_le_bytes(input.array()?) as i64),
            LONG1 => {
                let n = input.byte()? as usize;
                decode_long(input.take(n)?)
            }
            LONG4 => {
                let n = i32::from_le_bytes(input.array()?);
                if n < 0 {
                    return Err(Fault::Msg("LONG4 with a negative length".into()));
                }
                let n = self.len_checked(n as u64)?;
                decode_long(input.take(n)?)
            }
            BINFLOAT => Value::Float(f64::from_be_bytes(input.array()?)),
            NEWTRUE => Value::Bool(true),
            NEWFALSE => Value::Bool(false),
            _ => Value::None,
        };
        self.push(v)
    }

    /// Strings and bytes (every length prefix checked against the limit
    /// before anything is read).
    #[inline(always)]
    fn text<S: Source, B: Builder>(
        &mut self,
        op: u8,
        input: &mut S,
        builder: &mut B,
    ) -> Result<(), Fault> {
        match op {
            SHORT_BINUNICODE | SHORT_BINSTRING => {
                let n = input.byte()? as usize;
                self.string(input, builder, n)
            }
            BINUNICODE => {
                let n = self.len_checked(u32::from_le_bytes(input.array()?) as u64)?;
                self.string(input, builder, n)
            }
            BINUNICODE8 => {
                let n = self.len_checked(u64::from_le_bytes(input.array()?))?;
                self.string(input, builder, n)
            }
            BINSTRING => {
                let n = i32::from_le_bytes(input.array()?);
                if n < 0 {
                    return Err(Fault::Msg("BINSTRING with a negative length".into()));
                }
                let n = self.len_checked(n as u64)?;
                self.string(input, builder, n)
            }
            _ => {
                let n = match op {
                    SHORT_BINBYTES => input.byte()? as usize,
                    BINBYTES => self.len_checked(u32::from_le_bytes(input.array()?) as u64)?,
                    _ => self.len_checked(u64::from_le_bytes(input.array()?))?,
                };
                input.take(n)?;
                self.push(Value::Bytes)
            }
        }
    }

    /// Opcodes that make a container: empty ones, and those built from the
    /// items above a `MARK` (or the top one to three values).
    #[inline(always)]
    fn make<B: Builder>(&mut self, op: u8, builder: &mut B) -> Result<(), Fault> {
        let made = match op {
            EMPTY_LIST => builder.empty_list()?,
            EMPTY_TUPLE => builder.tuple(&[])?,
            EMPTY_SET => Value::Set,
            DICT => {
                let mark = self.pop_mark(op)?;
                if !(self.stack.len() - mark).is_multiple_of(2) {
                    return Err(Fault::Msg("DICT with a key that has no value".into()));
                }
                let d = builder.empty_dict()?;
                let up = builder.set_items(d, &self.stack[mark..])?;
                self.stack.truncate(mark);
                up
            }
            LIST => {
                let mark = self.pop_mark(op)?;
                let l = builder.empty_list()?;
                let up = builder.append(l, &self.stack[mark..])?;
                self.stack.truncate(mark);
                up
            }
            TUPLE => {
                let mark = self.pop_mark(op)?;
                let t = builder.tuple(&self.stack[mark..])?;
                self.stack.truncate(mark);
                t
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let k = (op - TUPLE1 + 1) as usize;
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + k {
                    return Err(Fault::Msg(format!(
                        "{} with too few values",
                        opcode_name(op)
                    )));
                }
                let n = self.stack.len();
                let t = builder.tuple(&self.stack[n - k..])?;
                self.stack.truncate(n - k);
                t
            }
            _ => {
                let mark = self.pop_mark(op)?;
                self.stack.truncate(mark);
                Value::Set
            }
        };
        self.push(made)
    }

    /// Opcodes that add items to the container below them: `SETITEMS`,
    /// `SETITEM`, `APPENDS`, `APPEND` and `ADDITEMS`.
    #[inline(always)]
    fn fill<B: Builder>(&mut self, op: u8, builder: &mut B) -> Result<(), Fault> {
        match op {
            SETITEMS => {
                let mark = self.pop_mark(op)?;
                let target = self.target_below(mark, op)?;
                if !(self.stack.len() - mark).is_multiple_of(2) {
                    return Err(Fault::Msg("SETITEMS with a key that has no value".into()));
                }
                let up = builder.set_items(target, &self.stack[mark..])?;
                self.stack.truncate(mark);
                self.stack[mark - 1] = up;
                if up != target {
                    self.memo.converted(target, up);
                }
            }
            SETITEM => {
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + 3 {
                    return Err(Fault::Msg("SETITEM needs a dict, a key and a value".into()));
                }
                let n = self.stack.len();
                let target = self.stack[n - 3];
                let up = builder.set_items(target, &self.stack[n - 2..])?;
                self.stack.truncate(n - 2);
                self.stack[n - 3] = up;
                if up != target {
                    self.memo.converted(target, up);
                }
            }
            APPENDS => {
                let mark = self.pop_mark(op)?;
                let target = self.target_below(mark, op)?;
                let up = builder.append(target, &self.stack[mark..])?;
                self.stack.truncate(mark);
                self.stack[mark - 1] = up;
            }
            APPEND => {
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + 2 {
                    return Err(Fault::Msg("APPEND needs a list and a value".into()));
                }
                let n = self.stack.len();
                let up = builder.append(self.stack[n - 2], &self.stack[n - 1..])?;
                self.stack.truncate(n - 1);
                self.stack[n - 2] = up;
            }
            _ => {
                let mark = self.pop_mark(op)?;
                let target = self.target_below(mark, op)?;
                if target != Value::Set {
                    return Err(Fault::Msg(format!("ADDITEMS on a {}", target.type_name())));
                }
                self.stack.truncate(mark);
            }
        }
        Ok(())
    }
}

/// The error for an opcode memlens does not run: those that import or call
/// code, out-of-band buffers, protocol-0 text opcodes and bytes that are no
/// opcode at all.
#[cold]
fn refused<S: Source>(op: u8, input: &mut S) -> Fault {
    let message = match op {
        GLOBAL => {
            let module = match read_line(input) {
                Ok(m) => m,
                Err(e) => return e,
            };
            let name = match read_line(input) {
                Ok(n) => n,
                Err(e) => return e,
            };
            format!(
                "this pickle asks to run code (GLOBAL {module}.{name}); memlens never runs code from a snapshot"
            )
        }
        STACK_GLOBAL | REDUCE | BUILD | INST | OBJ | NEWOBJ | NEWOBJ_EX | PERSID | BINPERSID
        | EXT1 | EXT2 | EXT4 => {
            let name = match op {
                STACK_GLOBAL => "STACK_GLOBAL",
                REDUCE => "REDUCE",
                BUILD => "BUILD",
                INST => "INST",
                OBJ => "OBJ",
                NEWOBJ => "NEWOBJ",
                NEWOBJ_EX => "NEWOBJ_EX",
                PERSID | BINPERSID => "PERSID",
                _ => "EXT",
            };
            format!(
                "this pickle asks to run code ({name}); memlens never runs code from a snapshot"
            )
        }
        NEXT_BUFFER | READONLY_BUFFER => {
            "this pickle uses out-of-band buffers, which snapshots never do".into()
        }
        INT | LONG | FLOAT | STRING | UNICODE | GET | PUT => {
            "this is a protocol-0 text pickle; PyTorch snapshots use binary protocols 2 to 5".into()
        }
        other => format!(
            "byte 0x{other:02x} is not a pickle opcode (the file is corrupt or not a pickle)"
        ),
    };
    Fault::Msg(message)
}

/// Reads a newline-terminated ASCII line (the argument of GLOBAL), at most 256 bytes.
fn read_line<S: Source>(input: &mut S) -> Result<String, Fault> {
    let mut s = Vec::new();
    loop {
        let b = input.byte()?;
        if b == b'\n' || s.len() >= 256 {
            break;
        }
        s.push(b);
    }
    Ok(String::from_utf8_lossy(&s).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs() {
        assert_eq!(decode_long(&[]), Value::Int(0));
        assert_eq!(decode_long(&[0xff]), Value::Int(-1));
        assert_eq!(
            decode_long(&[0x00, 0x80, 0x2e, 0x7f, 0x80, 0x7f]),
            Value::Int(0x7f80_7f2e_8000)
        );
        assert_eq!(
            decode_long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            Value::UInt(0x8000_0000_0000_0000)
        );
        assert_eq!(decode_long(&[1; 12]), Value::BigInt);
    }
}
