//! The fast path for the dicts that make up nearly all of a snapshot: trace
//! entries. PyTorch writes each one the same way:
//!
//! ```text
//! EMPTY_DICT MEMOIZE MARK
//!   key value  key value ...        keys are memo references to strings;
//!                                   values are ints, memo references, new
//!                                   short strings (then MEMOIZE), or the
//!                                   `frames` list:
//!   EMPTY_LIST MEMOIZE [MARK BINGET x N APPENDS]
//! SETITEMS
//! ```
//!
//! [`entry`] reads such a dict straight from the input's window, without the
//! general loop's stack, dispatch and container bookkeeping. It reads in two
//! phases: the first only looks (it decodes the bytes, resolves memo
//! references, and collects what the dict holds) and gives up, having changed
//! nothing, on anything it does not expect; the general loop then reads the
//! same bytes. The second phase makes the calls the general loop would have
//! made, in the same order: strings, the list of frames, the dict, then the
//! memo slots. The result is the same snapshot either way; the tests
//! `fast_path_equals_general_loop*` in `tests/fast_path.rs` check it on every
//! fixture and on generated pickles.

use super::entry::KeyTable;
use super::input::Source;
use super::vm::{self, decode_long, Fault, Vm};
use super::{Builder, Value};

/// Bytes of window the fast path wants in front of it: a trace entry takes
/// about 100, one with a long stack a few hundred; the entry path reads a
/// span of 4 KiB and a word past it (`entry::SPAN`).
pub(super) const WANT: usize = 4096 + 8;
/// Most key/value pairs in a fast dict (a trace entry has 8 or 9).
const MAX_ITEMS: usize = 64;
/// Most frames in an inline list (longer lists take the general loop).
pub(super) const MAX_FRAMES: usize = 2048;
/// Strings remembered from one dict to the next (`"N/A"`, action names).
const CACHE: usize = 8;
/// Longest string the cache keeps (packed in a u64).
const CACHE_LEN: usize = 8;

/// Something that goes into the memo once the dict is committed.
#[derive(Clone, Copy, Debug)]
enum Pending {
    /// The dict itself.
    Dict,
    /// The new string of `strs[i]`.
    Str(usize),
    /// The inline list of frames.
    List,
}

/// A string read by the first phase: where its bytes are in the window, and
/// the item it stands for.
#[derive(Clone, Copy, Debug)]
struct NewStr {
    start: usize,
    len: usize,
    item: usize,
}

/// Working storage, reused from dict to dict.
#[derive(Default)]
pub(super) struct Scratch {
    items: Vec<Value>,
    strs: Vec<NewStr>,
    /// The builder's values of `strs`, once committed.
    str_values: Vec<Value>,
    memo: Vec<Pending>,
    pub(super) frames: Vec<u32>,
    /// Recently read strings and the values the builder gave them.
    pub(super) cache: Cache,
    /// Memo bytes the builder is charged (as the general loop charges them).
    charge: usize,
    /// What the first phase found.
    found: Found,
    /// The builder's trace-entry keys for the entry path (`entry.rs`), once
    /// asked: `Some(None)` when it takes no entries that way.
    entry_keys: Option<Option<KeyTable>>,
}

impl Scratch {
    /// Fresh working storage for a thread reading ahead (module `ahead`),
    /// remembering the strings this one does.
    pub(super) fn for_ahead(&self) -> Scratch {
        Scratch {
            cache: self.cache,
            ..Scratch::default()
        }
    }

    /// The value the string cache holds for `b[start..start + len]`, if any.
    #[inline(always)]
    pub(super) fn cached_at(&self, b: &[u8], start: usize, len: usize) -> Option<Value> {
        cache_held(&self.cache, cache_key_at(b, start, len)?, len)
    }
}

/// What the first phase found (kept in the scratch: returned by value, the
/// struct was stored field by field and read back whole, a stalled load).
#[derive(Default, Clone, Copy)]
struct Found {
    /// Bytes the dict takes after its `EMPTY_DICT`.
    len: usize,
    /// Offset of its `SETITEMS` from the `EMPTY_DICT`.
    setitems: usize,
    /// Index in `items` of the inline list, when there is one.
    list_item: Option<usize>,
}

/// Reads the dict whose `EMPTY_DICT` was just read, when it has the shape of
/// a trace entry, and pushes its value on the stack; `false` (with nothing
/// read or changed) otherwise.
pub(super) fn entry<S: Source, B: Builder>(
    vm: &mut Vm,
    input: &mut S,
    builder: &mut B,
) -> Result<bool, Fault> {
    let Some(keys) = builder.fast_keys() else {
        return Ok(false);
    };
    let window = input.window(WANT)?;
    if vm.limits.entry_path {
        let table = *vm
            .fast
            .entry_keys
            .get_or_insert_with(|| builder.entry_keys().as_ref().and_then(KeyTable::new));
        if let Some(table) = table {
            if let Some(n) = super::entry::read(vm, window, builder, &table)? {
                input.skip(n);
                entries_after(vm, input, builder, &table, n)?;
                return Ok(true);
            }
        }
    }
    if look(vm, window, keys.first, keys.list).is_none() {
        return Ok(false);
    }
    let found = vm.fast.found;
    commit(vm, window, builder, &found)?;
    input.skip(found.len);
    Ok(true)
}

/// The entries that follow one the entry path read (a device trace is
/// batches of a thousand of them, back to back), read here rather than
/// going back through the general loop's dispatch for each `EMPTY_DICT`.
/// Stops, leaving the byte for the loop, at anything else and at an entry
/// the entry path does not take. `done`: bytes read since the step began
/// (errors are placed from the step's opcode).
#[inline]
fn entries_after<S: Source, B: Builder>(
    vm: &mut Vm,
    input: &mut S,
    builder: &mut B,
    table: &KeyTable,
    mut done: usize,
) -> Result<(), Fault> {
    loop {
        let offset = input.offset();
        let window = input.window(WANT + 1)?;
        let mut read = Ok(None);
        // Out of the reader while it is used: nothing here puts into the
        // memo by index (which would make it forget).
        if let Some(mut ahead) = vm.ahead.take() {
            // A long run of entries in memory: decode the next ones ahead on
            // the other cores (module `ahead`), then take what was kept here.
            if ahead.due(offset, window.len()) && window.first() == Some(&vm::EMPTY_DICT) {
                let entries = ahead.decode_round(window, offset, &vm.memo.slots, &vm.fast, table);
                // The idle threads fault in the room for those entries'
                // events and memo slots (an entry fills one to three: its
                // dict, a new frames list, new strings), so that this thread
                // does not (module `prefault`).
                let events = builder.room_for_entries(entries).unwrap_or_default();
                let slots = crate::prefault::room_for(&mut vm.memo.slots, 3 * entries);
                crate::prefault::populate([events, slots]);
            }
            // Kept for this offset: an EMPTY_DICT stands there (the thread
            // that decoded it looked), so its bytes are not read again here.
            if let Some((decoded, frames)) = ahead.take(offset) {
                vm.fast.frames.clear();
                vm.fast.frames.extend_from_slice(frames);
                let rest = window.get(1..).unwrap_or_default();
                read = super::entry::commit_ahead(vm, rest, builder, decoded);
            }
            vm.ahead = Some(ahead);
        }
        if matches!(read, Ok(None)) {
            let Some((&vm::EMPTY_DICT, rest)) = window.split_first() else {
                return Ok(());
            };
            read = super::entry::read(vm, rest, builder, table);
        }
        // This entry's offsets are from its own EMPTY_DICT, `done + 1` bytes
        // past the step's opcode.
        let n = match read {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(()),
            Err(Fault::At(at, m)) => return Err(Fault::At(at + done as u64 + 1, m)),
            Err(e) => return Err(e),
        };
        input.skip(1 + n);
        done += 1 + n;
    }
}

/// A `MEMOIZE`/`BINPUT`/`LONG_BINPUT` at `b[p..]` that stores into the next
/// free slot (`next`): its length and what it charges, or `None` when there
/// is no memo opcode there. `Err` for a put elsewhere (the general loop's).
#[inline(always)]
pub(super) fn memo_put(b: &[u8], p: usize, next: usize) -> Result<Option<(usize, usize)>, ()> {
    match b.get(p) {
        Some(&vm::MEMOIZE) => Ok(Some((1, 4))),
        Some(&vm::BINPUT) => match b.get(p + 1) {
            Some(&i) if i as usize == next => Ok(Some((2, 8))),
            _ => Err(()),
        },
        Some(&vm::LONG_BINPUT) => {
            let i = b
                .get(p + 1..p + 5)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or(())?;
            if i as usize == next {
                Ok(Some((5, 8)))
            } else {
                Err(())
            }
        }
        _ => Ok(None),
    }
}

/// The first phase: reads `b` (the window after `EMPTY_DICT`) into the
/// scratch (what it found in `found`), changing nothing else.
fn look(vm: &mut Vm, b: &[u8], first: u32, list_key: u32) -> Option<()> {
    let memo_len = vm.memo.slots.len();
    let memo = &vm.memo;
    let s = &mut vm.fast;
    s.items.clear();
    s.strs.clear();
    s.memo.clear();
    s.frames.clear();
    s.charge = 0;
    let mut list_item = None;
    let mut p = 0;
    // The dict's own memo slot, then its MARK.
    let (n, c) = memo_put(b, p, memo_len).ok()??;
    s.memo.push(Pending::Dict);
    s.charge += c;
    p += n;
    if *b.get(p)? != vm::MARK {
        return None;
    }
    p += 1;
    loop {
        if *b.get(p)? == vm::SETITEMS {
            if s.items.is_empty() {
                return None;
            }
            s.found = Found {
                len: p + 1,
                setitems: p + 1,
                list_item,
            };
            return Some(());
        }
        if s.items.len() >= MAX_ITEMS {
            return None;
        }
        // The key: a memoized string; the first one is the builder's.
        let (key, n) = memo_id(memo, b, p, vm::KIND_STR)?;
        if s.items.is_empty() && key != first {
            return None;
        }
        p += n;
        // The value.
        let op = *b.get(p)?;
        // Each value is pushed where it is made: a value built on the stack
        // and then copied was the loop's largest cost (a stalled 16-byte load).
        s.items.push(Value::Str(key));
        p = match op {
            vm::SHORT_BINUNICODE | vm::BINUNICODE => look_string(s, b, p, op, memo_len)?,
            vm::EMPTY_LIST if key == list_key && list_item.is_none() => {
                let p = look_frames(memo, s, b, p + 1, memo_len)?;
                list_item = Some(s.items.len());
                s.items.push(Value::None); // the list's value, once committed
                p
            }
            _ => look_scalar(memo, s, b, p, op)?,
        };
    }
}

/// A value that is a memo reference, a number, `None` or a boolean, at
/// `b[p..]` (its opcode `op`): pushed on the items; where the next key starts.
#[inline(always)]
fn look_scalar(memo: &vm::Memo, s: &mut Scratch, b: &[u8], p: usize, op: u8) -> Option<usize> {
    match op {
        vm::BINGET | vm::LONG_BINGET => {
            let (v, n) = memo_ref(memo, b, p)?;
            s.items.push(v);
            Some(p + n)
        }
        vm::BININT1 => {
            let v = *b.get(p + 1)?;
            s.items.push(Value::Int(v as i64));
            Some(p + 2)
        }
        vm::BININT2 => {
            let v = u16::from_le_bytes(b.get(p + 1..p + 3)?.try_into().ok()?);
            s.items.push(Value::Int(v as i64));
            Some(p + 3)
        }
        vm::BININT => {
            let v = i32::from_le_bytes(b.get(p + 1..p + 5)?.try_into().ok()?);
            s.items.push(Value::Int(v as i64));
            Some(p + 5)
        }
        vm::LONG1 => {
            let n = *b.get(p + 1)? as usize;
            // Addresses and times: at most 8 bytes, read as one word
            // when the window holds 8 bytes there (a copy of `n` bytes
            // into a buffer then read whole stalled the load behind it).
            if let (true, Some(word)) = (n <= 8, b.get(p + 2..p + 10)) {
                let x = u64::from_le_bytes(word.try_into().ok()?);
                // Each arm pushes its own value: one `Value` built for
                // both and then copied stalled on the copy.
                s.items.push(Value::Int(sign_extend(x, n)));
            } else {
                let bytes = b.get(p + 2..p + 2 + n)?;
                match small_long(bytes) {
                    Some(i) => s.items.push(Value::Int(i)),
                    None => s.items.push(decode_long(bytes)),
                }
            }
            Some(p + 2 + n)
        }
        vm::BINFLOAT => {
            let v = f64::from_be_bytes(b.get(p + 1..p + 9)?.try_into().ok()?);
            s.items.push(Value::Float(v));
            Some(p + 9)
        }
        vm::NONE => {
            s.items.push(Value::None);
            Some(p + 1)
        }
        vm::NEWTRUE | vm::NEWFALSE => {
            s.items.push(Value::Bool(op == vm::NEWTRUE));
            Some(p + 1)
        }
        _ => None,
    }
}

/// A new string at `b[p..]` (`SHORT_BINUNICODE` or `BINUNICODE`, `op`), and
/// the memo opcode after it if any: noted in the scratch (the builder sees
/// it at the commit); where the next key starts.
#[inline(always)]
fn look_string(s: &mut Scratch, b: &[u8], p: usize, op: u8, memo_len: usize) -> Option<usize> {
    let (n, h) = if op == vm::SHORT_BINUNICODE {
        (*b.get(p + 1)? as usize, 2)
    } else {
        let n = u32::from_le_bytes(b.get(p + 1..p + 5)?.try_into().ok()?);
        (n as usize, 5)
    };
    let start = p + h;
    // Invalid UTF-8 is the general loop's (it repairs it).
    let bytes = b.get(start..start + n)?;
    if cache_slot(&s.cache, bytes).is_none() {
        std::str::from_utf8(bytes).ok()?;
    }
    s.strs.push(NewStr {
        start,
        len: n,
        item: s.items.len(),
    });
    let mut p = start + n;
    if let Some((n, c)) = memo_put(b, p, memo_len + s.memo.len()).ok()? {
        s.memo.push(Pending::Str(s.strs.len() - 1));
        s.charge += c;
        p += n;
    }
    s.items.push(Value::None); // the string's value, once committed
    Some(p)
}

/// The `frames` list, from just after its `EMPTY_LIST` at `b[p..]`: its memo
/// opcode, then batches of `MARK refs APPENDS` or single `ref APPEND`s, the
/// frames noted in the scratch; where the next key starts.
#[inline(always)]
fn look_frames(
    memo: &vm::Memo,
    s: &mut Scratch,
    b: &[u8],
    mut p: usize,
    memo_len: usize,
) -> Option<usize> {
    if let Some((n, c)) = memo_put(b, p, memo_len + s.memo.len()).ok()? {
        s.memo.push(Pending::List);
        s.charge += c;
        p += n;
    }
    loop {
        match *b.get(p)? {
            vm::MARK => {
                p += 1;
                // The hot loop of a snapshot: one memo reference a frame.
                loop {
                    match *b.get(p)? {
                        vm::BINGET => {
                            let i = *b.get(p + 1)? as usize;
                            s.frames.push(memo.id_of_kind(i, vm::KIND_FRAME)?);
                            p += 2;
                        }
                        vm::LONG_BINGET => {
                            let (f, n) = memo_id(memo, b, p, vm::KIND_FRAME)?;
                            s.frames.push(f);
                            p += n;
                        }
                        vm::APPENDS => break,
                        _ => return None,
                    }
                }
                p += 1;
                if s.frames.len() > MAX_FRAMES {
                    return None;
                }
            }
            vm::BINGET | vm::LONG_BINGET => {
                let (v, n) = memo_ref(memo, b, p)?;
                if *b.get(p + n)? != vm::APPEND {
                    return Some(p); // the next key: the list is complete
                }
                let Value::Frame(f) = v else { return None };
                s.frames.push(f);
                p += n + 1;
            }
            _ => return Some(p),
        }
    }
}

/// A `LONG1` of at most 8 bytes (addresses, times), sign-extended.
#[inline(always)]
fn small_long(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > 8 {
        return None;
    }
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    let shift = 64 - 8 * bytes.len() as u32;
    // Shifting up then back (arithmetic) extends the sign of the last byte.
    Some(
        i64::from_le_bytes(buf)
            .checked_shl(shift)
            .map_or(0, |x| x >> shift),
    )
}

/// The low `n` bytes (`n` <= 8) of `x`, sign-extended from the last of them:
/// what `LONG1` of those bytes stands for.
#[inline(always)]
pub(super) fn sign_extend(x: u64, n: usize) -> i64 {
    if n == 0 {
        return 0;
    }
    let shift = 64 - 8 * n as u32;
    ((x << shift) as i64) >> shift
}

/// A memo reference at `b[p..]` to a slot of `kind`: its id and its length.
#[inline(always)]
pub(super) fn memo_id(memo: &vm::Memo, b: &[u8], p: usize, kind: u32) -> Option<(u32, usize)> {
    match *b.get(p)? {
        vm::BINGET => Some((memo.id_of_kind(*b.get(p + 1)? as usize, kind)?, 2)),
        vm::LONG_BINGET => {
            let i = u32::from_le_bytes(b.get(p + 1..p + 5)?.try_into().ok()?);
            Some((memo.id_of_kind(i as usize, kind)?, 5))
        }
        _ => None,
    }
}

/// A memo reference at `b[p..]`: its value and its length, when it is one and
/// the slot is filled (a slot the dict itself fills makes the fast path give up).
#[inline(always)]
fn memo_ref(memo: &vm::Memo, b: &[u8], p: usize) -> Option<(Value, usize)> {
    match *b.get(p)? {
        vm::BINGET => Some((memo.get(*b.get(p + 1)? as usize)?, 2)),
        vm::LONG_BINGET => {
            let i = u32::from_le_bytes(b.get(p + 1..p + 5)?.try_into().ok()?);
            Some((memo.get(i as usize)?, 5))
        }
        _ => None,
    }
}

/// The second phase: the builder's calls, in the general loop's order; the
/// dict's value ends on the stack.
fn commit<B: Builder>(vm: &mut Vm, b: &[u8], builder: &mut B, found: &Found) -> Result<(), Fault> {
    // Errors are the SETITEMS's (where the general loop would find them);
    // the offset is from the EMPTY_DICT, one byte before the window.
    let at = |m: String| Fault::At(found.setitems as u64, m);
    let limits = vm.limits;
    // What the general loop would hold on its stack at the SETITEMS.
    vm.stack_room(vm.fast.items.len() + vm.fast.frames.len() + 3)
        .map_err(at)?;
    let s = &mut vm.fast;
    s.str_values.clear();
    for ns in &s.strs {
        let bytes = &b[ns.start..ns.start + ns.len];
        let v = cached_string(&mut s.cache, bytes, builder);
        s.items[ns.item] = v;
        s.str_values.push(v);
    }
    let list = match found.list_item {
        Some(i) => {
            let v = builder.frames_list(&s.frames).map_err(at)?;
            s.items[i] = v;
            Some(v)
        }
        None => None,
    };
    let dict = builder.filled_dict(&s.items).map_err(at)?;
    // The value as its kind and id: the builder wrote it field by field, and
    // copying it whole (to the memo, to the stack) stalled each time.
    let handle = vm::Memo::handle(dict);
    builder.charge(s.charge).map_err(at)?;
    for pending in &s.memo {
        let index = vm.memo.slots.len();
        let v = match *pending {
            Pending::Dict => match handle {
                Some(h) => {
                    vm.memo.slots.push(h);
                    continue;
                }
                None => dict,
            },
            Pending::Str(i) => s.str_values.get(i).copied().unwrap_or(Value::None),
            Pending::List => list.unwrap_or(Value::None),
        };
        vm.memo.put(index, v, &limits).map_err(at)?;
    }
    // Within the stack limit: checked above.
    vm.stack.push(match handle {
        Some(h) => vm::Memo::unhandle(h),
        None => dict,
    });
    Ok(())
}

/// Recent short strings: `(length, bytes packed in a u64, value)`.
pub(super) type Cache = [(u8, u64, Option<Value>); CACHE];

/// `bytes` (at most [`CACHE_LEN`]) packed in a u64, and its cache slot.
#[inline(always)]
fn cache_key(bytes: &[u8]) -> Option<(u64, usize)> {
    if bytes.len() > CACHE_LEN {
        return None;
    }
    let mut x = 0u64;
    for (i, &c) in bytes.iter().enumerate() {
        x |= (c as u64) << (8 * i);
    }
    Some((x, (bytes.len() + x as usize) % CACHE))
}

/// [`cache_key`] of `b[start..start + len]`, read as one word when the
/// window holds 8 bytes there (the loop was a fifth of a string's cost).
#[inline(always)]
fn cache_key_at(b: &[u8], start: usize, len: usize) -> Option<(u64, usize)> {
    if len > CACHE_LEN {
        return None;
    }
    match b.get(start..start + 8) {
        Some(word) => {
            let mask = u64::MAX.checked_shr(64 - 8 * len as u32).unwrap_or(0);
            let x = u64::from_le_bytes(word.try_into().ok()?) & mask;
            Some((x, (len + x as usize) % CACHE))
        }
        None => cache_key(b.get(start..start + len)?),
    }
}

/// The value the cache holds for `bytes`, if any.
#[inline(always)]
fn cache_slot(cache: &Cache, bytes: &[u8]) -> Option<Value> {
    cache_held(cache, cache_key(bytes)?, bytes.len())
}

/// The value the cache holds under `(packed bytes, slot)` for a string of
/// `len` bytes, if any.
#[inline(always)]
fn cache_held(cache: &Cache, (x, slot): (u64, usize), len: usize) -> Option<Value> {
    let (held_len, held, value) = cache[slot];
    (held_len as usize == len && held == x).then_some(value?)
}

/// The builder's value for a string, remembered for the next dicts.
#[inline]
pub(super) fn cached_string<B: Builder>(cache: &mut Cache, bytes: &[u8], builder: &mut B) -> Value {
    if let Some(v) = cache_slot(cache, bytes) {
        return v;
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        // Checked in the first phase; the general loop's repair otherwise.
        return builder.string(&String::from_utf8_lossy(bytes));
    };
    let v = builder.string(text);
    if let Some((x, slot)) = cache_key(bytes) {
        cache[slot] = (bytes.len() as u8, x, Some(v));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_longs_decode_as_the_general_loop_does() {
        let cases: [&[u8]; 7] = [
            &[],
            &[0xff],
            &[0x7f],
            &[0x00, 0x80],
            &[0x00, 0x80, 0x2e, 0x7f, 0x80, 0x7f],
            &[1, 2, 3, 4, 5, 6, 7, 0x80],
            &[0xd4, 0x2a, 0x3b, 0x11, 0x6c, 0x61, 0x06],
        ];
        for bytes in cases {
            assert_eq!(
                small_long(bytes).map(Value::Int),
                Some(decode_long(bytes)),
                "{bytes:?}"
            );
            // The one-word read: the bytes, then whatever follows in the window.
            let mut word = [0xa5u8; 8];
            word[..bytes.len()].copy_from_slice(bytes);
            assert_eq!(
                Value::Int(sign_extend(u64::from_le_bytes(word), bytes.len())),
                decode_long(bytes),
                "{bytes:?}"
            );
        }
        assert_eq!(small_long(&[0; 9]), None);
    }
}
