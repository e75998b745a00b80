//! Trace entries in PyTorch's key order, decoded field by field.
//!
//! Nearly every dict of a snapshot is a trace entry written the same way:
//!
//! ```text
//! EMPTY_DICT MEMOIZE MARK
//!   action <str>  addr <int>  size <int>  stream <int>  time_us <int>
//!   compile_context <str>  user_metadata <str>
//!   frames EMPTY_LIST MEMOIZE [MARK BINGET x N APPENDS]
//! SETITEMS
//! ```
//!
//! (keys are memo references; older PyTorch leaves some keys out, an `oom`
//! entry has `device_free` for `addr`; `frames` is a memo reference when the
//! stack is one an earlier entry had, PyTorch handing both the same list).
//! The fast path (`fast.rs`) reads such a dict into a list of generic
//! [`Value`]s that the builder then walks key by key; here each value goes
//! straight into its field of an [`EntryFields`], the one thing handed to
//! the builder, and the bytes are read from a fixed span at masked positions
//! (see [`Span`]), with no bounds check per byte. It reads in the same two
//! phases as the fast path: the first decodes and changes nothing, giving up
//! on anything it does not expect (a key out of order or twice, a negative
//! size, a new action name, a string that is neither memoized nor new, a
//! frames list the builder has not made a stack of, an entry longer than
//! the span), and the fast path then reads the same bytes; the second makes
//! the calls the fast path makes, in its order. The tests in
//! `tests/fast_path.rs` read every fixture and thousands of generated and cut
//! pickles all three ways (general loop, fast path, entry path).

use super::fast::{cached_string, sign_extend, Cache, Scratch, MAX_FRAMES};
use super::vm::{self, Fault, Memo, Vm};
use super::{Builder, EntryFields, EntryFrames, EntryKeys, Value};

/// The builder's trace-entry keys as the memo holds them (a packed string
/// handle, see [`Memo::handle`]): a key reference is recognised by comparing
/// the slot it names with these, one load and one comparison.
#[derive(Clone, Copy, Debug)]
pub(super) struct KeyTable {
    action: u32,
    addr: u32,
    device_free: u32,
    size: u32,
    stream: u32,
    time_us: u32,
    compile_context: u32,
    user_metadata: u32,
    frames: u32,
}

impl KeyTable {
    /// A table whose keys are the strings `first..first + 9` (tests).
    #[cfg(test)]
    pub(super) fn for_tests(first: u32) -> KeyTable {
        let packed = |i: u32| Memo::handle(Value::Str(first + i)).unwrap_or(0);
        KeyTable {
            action: packed(0),
            addr: packed(1),
            device_free: packed(2),
            size: packed(3),
            stream: packed(4),
            time_us: packed(5),
            compile_context: packed(6),
            user_metadata: packed(7),
            frames: packed(8),
        }
    }

    /// The `action` key as a memo slot holds it.
    pub(super) fn action(&self) -> u32 {
        self.action
    }

    /// The table for `keys`, or `None` when a key cannot be packed.
    pub(super) fn new(keys: &EntryKeys) -> Option<KeyTable> {
        let packed = |id| Memo::handle(Value::Str(id));
        Some(KeyTable {
            action: packed(keys.action)?,
            addr: packed(keys.addr)?,
            device_free: packed(keys.device_free)?,
            size: packed(keys.size)?,
            stream: packed(keys.stream)?,
            time_us: packed(keys.time_us)?,
            compile_context: packed(keys.compile_context)?,
            user_metadata: packed(keys.user_metadata)?,
            frames: packed(keys.frames)?,
        })
    }
}

/// Bytes of the window an entry may take on this path (a power of two:
/// positions are masked into it). Longer entries, with stacks of hundreds
/// of frames, take the fast path.
const SPAN: usize = 4096;
// The fast path asks its source for the span and a word past it.
const _: () = assert!(SPAN.is_power_of_two() && SPAN + 8 <= super::fast::WANT);

/// The first [`SPAN`] bytes of the window (and 8 more, so that a word read
/// at any position in the span is in bounds), read at positions masked into
/// the span: no bounds check on any read. A position past the span wraps to
/// its start and reads bytes that are not the entry's; [`decode`] gives up on
/// an entry whose end is past the span, so nothing read that way is ever
/// used.
#[derive(Clone, Copy)]
struct Span<'a>(&'a [u8; SPAN + 8]);

impl<'a> Span<'a> {
    /// The span of `b`, when `b` holds it.
    #[inline(always)]
    fn of(b: &'a [u8]) -> Option<Self> {
        Some(Span(b.get(..SPAN + 8)?.try_into().ok()?))
    }

    /// The byte at `p`.
    #[inline(always)]
    fn byte(self, p: usize) -> u8 {
        self.0[p & (SPAN - 1)]
    }

    /// The 8 bytes from `p` as one little-endian word: an opcode and its
    /// argument (a memo reference, a short integer) read at once.
    #[inline(always)]
    fn word(self, p: usize) -> u64 {
        let i = p & (SPAN - 1);
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.0[i..i + 8]);
        u64::from_le_bytes(w)
    }
}

/// The memo slot that the reference at the start of `w` names, as packed
/// there, and the reference's length; `(MEMO_EMPTY, 0)` when `w` does not
/// start with a reference (a `SETITEMS`, say) or the slot does not exist:
/// that equals no key.
#[inline(always)]
fn slot_in(slots: &[u32], w: u64) -> (u32, usize) {
    let Some((i, n)) = reference(w) else {
        return (vm::MEMO_EMPTY, 0);
    };
    (slots.get(i).copied().unwrap_or(vm::MEMO_EMPTY), n)
}

/// The memo index that the reference at the start of `w` (a `BINGET` or
/// `LONG_BINGET`) names, and the reference's length; `None` for any other
/// opcode.
#[inline(always)]
fn reference(w: u64) -> Option<(usize, usize)> {
    match w as u8 {
        vm::BINGET => Some(((w >> 8) as u8 as usize, 2)),
        vm::LONG_BINGET => Some(((w >> 8) as u32 as usize, 5)),
        _ => None,
    }
}

/// The id of the string that the reference at the start of `w` names, and
/// the reference's length.
#[inline(always)]
fn str_in(slots: &[u32], w: u64) -> Option<(u32, usize)> {
    let (slot, n) = slot_in(slots, w);
    Some((Memo::kind_id(slot, vm::KIND_STR)?, n))
}

/// The integer at `p` (`BININT1`, `BININT2`, `BININT`, or a `LONG1` of at
/// most 8 bytes) and its length.
#[inline(always)]
fn int_at(b: Span, p: usize) -> Option<(i64, usize)> {
    let w = b.word(p);
    match w as u8 {
        vm::BININT1 => Some(((w >> 8) as u8 as i64, 2)),
        vm::BININT2 => Some(((w >> 8) as u16 as i64, 3)),
        vm::BININT => Some(((w >> 8) as u32 as i32 as i64, 5)),
        vm::LONG1 => {
            let n = (w >> 8) as u8 as usize;
            match n {
                // An address: 6 bytes, in the word already.
                0..=6 => Some((sign_extend(w >> 16, n), 2 + n)),
                // A time: 7 bytes, one more word.
                7 | 8 => Some((sign_extend(b.word(p + 2), n), 2 + n)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A memo put at `p` that fills slot `next`: its length and what it
/// charges; `Ok(None)` when there is no put there, `Err` for a put that
/// fills another slot (the general loop's). As `fast::memo_put`.
#[inline(always)]
fn put_at(b: Span, p: usize, next: usize) -> Result<Option<(usize, usize)>, ()> {
    let w = b.word(p);
    let (i, n) = match w as u8 {
        vm::MEMOIZE => return Ok(Some((1, 4))),
        vm::BINPUT => ((w >> 8) as u8 as usize, 2),
        vm::LONG_BINPUT => ((w >> 8) as u32 as usize, 5),
        _ => return Ok(None),
    };
    if i == next {
        Ok(Some((n, 8)))
    } else {
        Err(())
    }
}

/// A string value: a memo reference (its id), a new string the cache knows
/// (its value), or new bytes in the window.
#[derive(Clone, Copy, Debug)]
enum Text {
    Id(u32),
    /// A new string seen before; `memoized`: a memo put follows.
    Cached {
        value: Value,
        memoized: bool,
    },
    /// `start..start + len` of the window; `memoized`: a memo put follows.
    New {
        start: usize,
        len: usize,
        memoized: bool,
    },
}

impl Text {
    /// Whether a memo put followed the string.
    #[inline(always)]
    fn memoized(self) -> bool {
        match self {
            Text::Id(_) => false,
            Text::Cached { memoized, .. } | Text::New { memoized, .. } => memoized,
        }
    }

    /// The string's id when it is known before the commit (all but new
    /// strings the cache does not hold).
    #[inline(always)]
    fn known_id(self) -> Option<u32> {
        match self {
            Text::Id(id)
            | Text::Cached {
                value: Value::Str(id),
                ..
            } => Some(id),
            _ => None,
        }
    }
}

/// What the first phase found.
#[derive(Clone, Copy, Debug)]
pub(super) struct Decoded {
    fields: EntryFields,
    compile_context: Option<Text>,
    user_metadata: Option<Text>,
    /// Whether the frames list is memoized.
    list_memoized: bool,
    /// Ahead of the reader: the memo slot that holds the entry's stack
    /// (`frames` a reference past the memo as it was), read at the commit.
    stack_slot: Option<usize>,
    /// Key/value pairs read.
    pairs: usize,
    /// Memo bytes the builder is charged.
    charge: usize,
    /// Bytes the dict takes after its `EMPTY_DICT`.
    pub(super) len: usize,
}

/// Reads the dict whose `EMPTY_DICT` is just before `b` when it is a trace
/// entry the builder takes field by field, and pushes its value; `Ok(None)`,
/// with nothing changed, otherwise. `Some(n)`: the dict took `n` bytes of `b`.
#[inline]
pub(super) fn read<B: Builder>(
    vm: &mut Vm,
    b: &[u8],
    builder: &mut B,
    keys: &KeyTable,
) -> Result<Option<usize>, Fault> {
    let Some(d) =
        Span::of(b).and_then(|span| decode::<false>(&vm.memo.slots, &mut vm.fast, span, keys))
    else {
        return Ok(None);
    };
    offer(vm, b, builder, &mut { d })
}

/// The second phase when the builder takes the entry `d` (its frames in
/// the reader's scratch); `Ok(None)`, with nothing changed, when it does not.
#[inline(always)]
fn offer<B: Builder>(
    vm: &mut Vm,
    b: &[u8],
    builder: &mut B,
    d: &mut Decoded,
) -> Result<Option<usize>, Fault> {
    let highest_frame = vm.fast.frames.iter().copied().max();
    if !builder.takes_entry(d.fields.action, highest_frame) {
        return Ok(None);
    }
    commit(vm, b, builder, d).map(Some)
}

/// The first phase on another thread, ahead of the reader (module
/// `ahead`): decodes the dict whose `EMPTY_DICT` is just before `b` with the
/// memo slots `slots` (a prefix of the memo that does not change while the
/// result waits) into a [`Decoded`] and `s`'s frames. Gives what [`read`]'s
/// first phase gives at the same bytes, but that a memo put other than
/// `MEMOIZE` is never taken: its slot's index depends on where the reader
/// is, unknown here. `None` where [`read`] would not take the dict, or
/// might not.
pub(super) fn decode_ahead(
    slots: &[u32],
    s: &mut Scratch,
    b: &[u8],
    keys: &KeyTable,
) -> Option<Decoded> {
    decode::<true>(slots, s, Span::of(b)?, keys)
}

/// The second phase for an entry [`decode_ahead`] decoded at the bytes
/// just after the `EMPTY_DICT` before `b`, its frames already in the
/// reader's scratch: what [`read`] does after its first phase, the
/// builder's say included.
pub(super) fn commit_ahead<B: Builder>(
    vm: &mut Vm,
    b: &[u8],
    builder: &mut B,
    d: &mut Decoded,
) -> Result<Option<usize>, Fault> {
    if let Some(i) = d.stack_slot {
        let slot = vm.memo.slots.get(i).copied().unwrap_or(vm::MEMO_EMPTY);
        match Memo::kind_id(slot, vm::KIND_STACK) {
            Some(id) => d.fields.frames = EntryFrames::Stack(id),
            None => return Ok(None),
        }
    }
    offer(vm, b, builder, d)
}

/// The first phase: decodes `b` into a [`Decoded`] and the scratch's frames,
/// or `None` when the dict is not a trace entry in the expected form.
///
/// Straight-line code, one step a key in PyTorch's order: each step looks
/// whether the key at hand is its own and, when it is, reads the value and
/// the next key; a key left out costs one comparison. Whatever is left when
/// the steps are done must be the `SETITEMS`: a key out of order, twice, or
/// unknown makes the dict the fast path's.
#[inline(always)]
fn decode<const AHEAD: bool>(
    memo: &[u32],
    s: &mut Scratch,
    b: Span,
    keys: &KeyTable,
) -> Option<Decoded> {
    // The slot the next memo put fills. Ahead of the reader it is unknown:
    // no BINPUT or LONG_BINPUT index reaches this one, only MEMOIZE fills it.
    let memo_len = if AHEAD { 1 << 40 } else { memo.len() };
    s.frames.clear();
    let mut d = Decoded {
        fields: EntryFields::default(),
        compile_context: None,
        user_metadata: None,
        list_memoized: false,
        stack_slot: None,
        pairs: 0,
        charge: 0,
        len: 0,
    };
    // Memo slots this dict fills, the dict's own first, then its MARK.
    let mut puts = 1;
    let (n, c) = put_at(b, 0, memo_len).ok()??;
    d.charge += c;
    if b.byte(n) != vm::MARK {
        return None;
    }
    let mut p = n + 1;

    // The pair at `p`: its key (as the memo packs it), and the key's
    // length. `next!` moves on to the pair after a value of `m` bytes.
    let (mut key, mut n) = slot_in(memo, b.word(p));
    macro_rules! next {
        ($m:expr) => {{
            p += n + $m;
            d.pairs += 1;
            (key, n) = slot_in(memo, b.word(p));
        }};
    }

    // `action` first, its value a memo reference: the first entry of each
    // action brings a new string, left to the fast path.
    if key != keys.action {
        return None;
    }
    let (action, m) = str_in(memo, b.word(p + n))?;
    d.fields.action = action;
    next!(m);
    // Sizes and addresses: a negative one is an error the fast path reports.
    if key == keys.addr || key == keys.device_free {
        let (x, m) = int_at(b, p + n)?;
        d.fields.addr = u64::try_from(x).ok()?;
        next!(m);
    }
    if key == keys.size {
        let (x, m) = int_at(b, p + n)?;
        d.fields.size = u64::try_from(x).ok()?;
        next!(m);
    }
    if key == keys.stream {
        let (x, m) = int_at(b, p + n)?;
        d.fields.stream = Some(x);
        next!(m);
    }
    if key == keys.time_us {
        let (x, m) = int_at(b, p + n)?;
        d.fields.time_us = x;
        next!(m);
    }
    // The two string fields: the id now when it is known, the text for the
    // commit (a new string is interned there; a memoized one fills a slot).
    macro_rules! text {
        ($field:ident) => {
            if key == keys.$field {
                let (text, m, c) = read_text(memo, s, b, p + n, memo_len + puts)?;
                puts += text.memoized() as usize;
                d.charge += c;
                d.fields.$field = text.known_id();
                d.$field = Some(text);
                next!(m);
            }
        };
    }
    text!(compile_context);
    text!(user_metadata);
    if key == keys.frames {
        p = frames_value::<AHEAD>(memo, s, b, p + n, memo_len + puts, &mut d)?;
        d.pairs += 1;
    }
    // Past the span, positions wrapped: what was read is not this entry.
    if p >= SPAN - 8 || b.byte(p) != vm::SETITEMS {
        return None;
    }
    d.len = p + 1;
    Some(d)
}

/// The `frames` value at `p` into `d` (a new list, read into the scratch,
/// whose memo put must fill slot `next`; or a reference to an earlier
/// entry's stack), and the position after it.
#[inline(always)]
fn frames_value<const AHEAD: bool>(
    memo: &[u32],
    s: &mut Scratch,
    b: Span,
    mut p: usize,
    next: usize,
    d: &mut Decoded,
) -> Option<usize> {
    let v = b.word(p);
    if v as u8 == vm::EMPTY_LIST {
        p += 1;
        if let Some((n, c)) = put_at(b, p, next).ok()? {
            d.list_memoized = true;
            d.charge += c;
            p += n;
        }
        p = read_frames(memo, s, b, p)?;
        d.fields.frames = EntryFrames::List;
    } else {
        // The same stack as an earlier entry's: one list object.
        let (slot, m) = slot_in(memo, v);
        d.fields.frames = match Memo::kind_id(slot, vm::KIND_STACK) {
            Some(id) => EntryFrames::Stack(id),
            // Ahead of the reader, a slot filled since the memo was
            // taken (a block's free names the list its allocation made,
            // often a few entries before): looked up at the commit.
            None if AHEAD && slot == vm::MEMO_EMPTY && m > 0 => {
                d.stack_slot = reference(v).map(|(i, _)| i);
                EntryFrames::Stack(0)
            }
            None => return None,
        };
        p += m;
    }
    Some(p)
}

/// A string value at `p`: a memo reference to a string, or a new short
/// string (valid UTF-8) and the memo put after it when there is one, which
/// must fill slot `next`. Its length in bytes and the memo charge.
#[inline(always)]
fn read_text(
    memo: &[u32],
    s: &Scratch,
    b: Span,
    p: usize,
    next: usize,
) -> Option<(Text, usize, usize)> {
    let w = b.word(p);
    if w as u8 != vm::SHORT_BINUNICODE {
        let (id, n) = str_in(memo, w)?;
        return Some((Text::Id(id), n, 0));
    }
    let len = (w >> 8) as u8 as usize;
    let start = p + 2;
    let (memoized, m, charge) = match put_at(b, start + len, next).ok()? {
        Some((m, c)) => (true, m, c),
        None => (false, 0, 0),
    };
    // Bounds-checked reads here: a string at the span's end is not wrapped.
    let text = match s.cached_at(b.0, start, len) {
        Some(value) => Text::Cached { value, memoized },
        None => {
            // Invalid UTF-8 is the general loop's (it repairs it).
            std::str::from_utf8(b.0.get(start..start + len)?).ok()?;
            Text::New {
                start,
                len,
                memoized,
            }
        }
    };
    Some((text, 2 + len + m, charge))
}

/// The items of a fresh frames list from `p` (batches of
/// `MARK refs APPENDS`, or `ref APPEND`) into the scratch's frames; the
/// position just past them.
#[inline(always)]
fn read_frames(memo: &[u32], s: &mut Scratch, b: Span, mut p: usize) -> Option<usize> {
    let frame = |slot: u32| Memo::kind_id(slot, vm::KIND_FRAME);
    loop {
        let w = b.word(p);
        match w as u8 {
            vm::MARK => {
                p += 1;
                // The hot loop of a snapshot: one memo reference a frame.
                loop {
                    let w = b.word(p);
                    if w as u8 == vm::APPENDS {
                        break;
                    }
                    // Past the span, reads wrap: an entry this long is the
                    // fast path's (and the loop ends).
                    if p >= SPAN {
                        return None;
                    }
                    let (slot, n) = slot_in(memo, w);
                    s.frames.push(frame(slot)?);
                    p += n;
                }
                p += 1;
                if s.frames.len() > MAX_FRAMES {
                    return None;
                }
            }
            vm::BINGET | vm::LONG_BINGET if p < SPAN => {
                let (slot, n) = slot_in(memo, w);
                // Not a frame, or no APPEND after it: the next key.
                match frame(slot) {
                    Some(f) if (w >> (8 * n)) as u8 == vm::APPEND => {
                        s.frames.push(f);
                        p += n + 1;
                    }
                    _ => return Some(p),
                }
            }
            _ => return Some(p),
        }
    }
}

/// The second phase: the builder's calls in the fast path's order (strings,
/// then the entry with its frames, the memo charge, the memo slots); the
/// entry's value ends on the stack. The bytes the dict took.
fn commit<B: Builder>(
    vm: &mut Vm,
    b: &[u8],
    builder: &mut B,
    d: &mut Decoded,
) -> Result<usize, Fault> {
    // Errors are the SETITEMS's, as on the fast path.
    let at = |m: String| Fault::At(d.len as u64, m);
    let limits = vm.limits;
    // What the general loop would hold on its stack at the SETITEMS.
    vm.stack_room(2 * d.pairs + vm.fast.frames.len() + 3)
        .map_err(at)?;
    // New strings are interned now, in the order they were read.
    let cache = &mut vm.fast.cache;
    let cc = settle(
        d.compile_context,
        &mut d.fields.compile_context,
        cache,
        b,
        builder,
    );
    let um = settle(
        d.user_metadata,
        &mut d.fields.user_metadata,
        cache,
        b,
        builder,
    );
    let (entry, list) = builder.entry(&d.fields, &vm.fast.frames).map_err(at)?;
    builder.charge(d.charge).map_err(at)?;
    let memo = &mut vm.memo;
    memo.push(entry, &limits).map_err(at)?;
    if let Some(v) = cc {
        memo.push(v, &limits).map_err(at)?;
    }
    if let Some(v) = um {
        memo.push(v, &limits).map_err(at)?;
    }
    if d.list_memoized {
        memo.push(list, &limits).map_err(at)?;
    }
    // Within the stack limit: checked above.
    vm.stack.push(entry);
    Ok(d.len)
}

/// A string value at commit: interns a new one (setting `field`, which the
/// first phase set for the others), and gives the value for the memo when a
/// memo put followed it.
#[inline(always)]
fn settle<B: Builder>(
    text: Option<Text>,
    field: &mut Option<u32>,
    cache: &mut Cache,
    b: &[u8],
    builder: &mut B,
) -> Option<Value> {
    let (value, memoized) = match text? {
        Text::Id(_) => return None,
        Text::Cached { value, memoized } => (value, memoized),
        Text::New {
            start,
            len,
            memoized,
        } => {
            let value = cached_string(cache, &b[start..start + len], builder);
            if let Value::Str(id) = value {
                *field = Some(id);
            }
            (value, memoized)
        }
    };
    memoized.then_some(value)
}
