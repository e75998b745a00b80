//! Trace entries decoded ahead of the reader, on the other cores.
//!
//! A large snapshot is millions of trace entries back to back, and reading
//! one is two phases (`entry.rs`): the first decodes its bytes and changes
//! nothing; the second hands the result to the builder, in order. The first
//! phase depends only on the entry's bytes, the memo slots its references
//! name and the strings the reader remembers. So while the reader is in a
//! long run of entries of a file held in memory (a mapped file), the bytes in
//! front of it are cut into pieces, each piece's entries are decoded on a
//! thread of its own against the memo as it stands, and the results are kept
//! by their offset. When the reader reaches an `EMPTY_DICT` at an offset kept
//! here, it runs only the second phase on what was kept.
//!
//! A thread does not know where its piece's first entry starts: it looks for
//! the bytes an entry starts with. It may guess wrong, and it gives up on an
//! entry it cannot decode ahead (one naming a frame first seen after the
//! pieces were cut, one with a `FRAME` opcode inside, a memo put by index):
//! then it steps over that dict opcode by opcode, or stops. (A stack first
//! seen after the cut, as when a block's free names the list its allocation
//! made, is looked up when the reader commits the entry.)
//!
//! It runs where it pays (measured: BENCHMARKS.md, "Reading ahead on the
//! other cores"): rayon's pool has 8 threads or more, and 16 MB or more of
//! the input is in memory in front of the reader when it starts (it then
//! goes on to the input's end). A streamed (compressed)
//! file is read by the reader alone. None of that can
//! change what is read: a result is used only where the reader itself stands
//! at that offset about to decode an entry, and it is then what the reader
//! would have decoded there, since the memo slots it read cannot have changed
//! ([`Ahead::forget`] drops everything kept when a memo put overwrites a slot;
//! the last few slots, which the reader may still re-point, are not read
//! ahead). What is not kept, the reader decodes itself, as before.

use super::entry::{decode_ahead, Decoded, KeyTable};
use super::fast::Scratch;
use super::vm;
use rayon::prelude::*;

/// How the reader decodes ahead (see the module's doc). Part of the
/// reader's [`Limits`](super::Limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadAhead {
    /// Pieces decoded at once, each on a thread of its own: 0 for two per
    /// thread of rayon's pool, or none below 8 threads. Below 2, nothing is
    /// read ahead.
    pub pieces: usize,
    /// Bytes of a piece.
    pub piece_bytes: usize,
    /// Bytes that must be at hand in front of the reader (in memory) for it
    /// to start reading ahead: a small file is read faster alone. Once it
    /// has started, it reads ahead to the end of the input (else the last
    /// `min_bytes` would be the reader's alone: 6% of a 268 MB recording).
    pub min_bytes: usize,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead {
            pieces: 0,
            // ~5,500 entries: a thread's share is worth its start, and a
            // round of 32 pieces (16 threads) keeps ~35 MB of results.
            piece_bytes: 512 << 10,
            min_bytes: 16 << 20,
        }
    }
}

impl ReadAhead {
    /// Reading ahead off: tests read this way to compare.
    pub const OFF: ReadAhead = ReadAhead {
        pieces: 1,
        piece_bytes: 1 << 20,
        min_bytes: usize::MAX,
    };

    /// Pieces in a round.
    fn pieces(&self) -> usize {
        match self.pieces {
            // On fewer than eight cores the reader alone is as fast
            // (measured on two and four: the results cross between cores'
            // caches, which costs about what the decoding saves).
            0 if rayon::current_num_threads() < MIN_THREADS => 1,
            0 => 2 * rayon::current_num_threads(),
            n => n,
        }
    }
}

/// Threads in rayon's pool from which the default reads ahead.
const MIN_THREADS: usize = 8;

/// The memo slots at the end of the memo that are not read ahead: the
/// reader re-points a dict's slot among the last eight when the builder
/// converts the dict (`Memo::converted`).
const UNSETTLED_SLOTS: usize = 8;

/// Most bytes stepped over in one dict that could not be decoded ahead
/// before the thread gives up on its piece.
const MAX_STEP_OVER: usize = 64 << 10;

/// Entries ahead of the one taken whose results are fetched into the
/// reader's cache as it takes one: they were written on another core.
const PREFETCH: usize = 6;

/// Asks the CPU to bring `kept` into this core's cache (a hint; it reads
/// nothing and cannot fault).
#[inline(always)]
fn prefetch(kept: &Kept) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = (kept as *const Kept).cast::<i8>();
        for line in (0..std::mem::size_of::<Kept>()).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults or reads into
            // the program; the address lies within `kept`.
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line))
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kept;
}

/// One entry decoded ahead.
#[derive(Clone, Copy, Debug)]
struct Kept {
    /// Offset of its `EMPTY_DICT` in the stream.
    offset: u64,
    decoded: Decoded,
    /// Its frames: `frames[start..end]` of its piece.
    frames: (u32, u32),
}

/// What one piece's thread decoded, in order of offset, and how far the
/// reader has taken from it. Kept from round to round, so that a round
/// reuses the memory of the last (fresh pages cost more than the decoding).
#[derive(Default)]
struct Piece {
    kept: Vec<Kept>,
    frames: Vec<u32>,
    next: usize,
}

/// The entries decoded ahead of the reader, by offset.
pub(super) struct Ahead {
    settings: ReadAhead,
    pieces: Vec<Piece>,
    /// The piece the reader takes from now.
    at: usize,
    /// No new round is cut before the reader passes this offset.
    until: u64,
    /// The bytes an entry starts with, once found (see [`entry_start`]).
    marker: Option<Vec<u8>>,
}

impl Ahead {
    /// Nothing kept yet; `None` when `settings` read nothing ahead.
    pub(super) fn new(settings: ReadAhead) -> Option<Box<Self>> {
        if settings.pieces() < 2 || settings.min_bytes == usize::MAX {
            return None;
        }
        Some(Box::new(Ahead {
            settings,
            pieces: Vec::new(),
            at: 0,
            until: 0,
            marker: None,
        }))
    }

    /// Whether a round should be decoded ahead now, the reader being at
    /// `offset` with `at_hand` bytes in memory in front of it.
    #[inline(always)]
    pub(super) fn due(&self, offset: u64, at_hand: usize) -> bool {
        offset >= self.until && (self.started() || at_hand >= self.settings.min_bytes)
    }

    /// Whether a round was decoded (it set `until` past a byte): from then
    /// on, rounds need no `min_bytes` at hand.
    #[inline(always)]
    fn started(&self) -> bool {
        self.until > 0
    }

    /// Drops everything kept: a memo slot the results may have read changed.
    pub(super) fn forget(&mut self) {
        self.at = self.pieces.len();
    }

    /// The entry kept for `offset`, if any, with its frames (those before
    /// `offset` are dropped: the reader has passed them).
    #[inline]
    pub(super) fn take(&mut self, offset: u64) -> Option<(&mut Decoded, &[u32])> {
        loop {
            let piece = self.pieces.get_mut(self.at)?;
            while piece
                .kept
                .get(piece.next)
                .is_some_and(|k| k.offset < offset)
            {
                piece.next += 1;
            }
            match piece.kept.get(piece.next) {
                // Pieces overlap where a guess was wrong or an entry ran
                // into the next piece: the reader moves on past this one.
                None => self.at += 1,
                Some(k) if k.offset == offset => break,
                Some(_) => return None,
            }
        }
        let piece = self.pieces.get_mut(self.at)?;
        if let Some(later) = piece.kept.get(piece.next + PREFETCH) {
            prefetch(later);
        }
        let k = piece.kept.get_mut(piece.next)?;
        piece.next += 1;
        #[cfg(test)]
        tests::TAKEN.with(|n| n.set(n.get() + 1));
        let frames = piece.frames.get(k.frames.0 as usize..k.frames.1 as usize)?;
        Some((&mut k.decoded, frames))
    }

    /// Decodes a round ahead: `bytes` are those from the reader's offset
    /// `offset` (where an `EMPTY_DICT` stands) to the end of the input;
    /// `memo` the memo's slots, `scratch` the reader's working storage (for
    /// the strings it remembers). Returns how many entries were kept.
    pub(super) fn decode_round(
        &mut self,
        bytes: &[u8],
        offset: u64,
        memo: &[u32],
        scratch: &Scratch,
        keys: &KeyTable,
    ) -> usize {
        let pieces = self.settings.pieces().max(1);
        let piece = self.settings.piece_bytes.max(1);
        let end = bytes.len().min(pieces.saturating_mul(piece));
        self.until = offset + end as u64;
        self.at = 0;
        let count = end.div_ceil(piece);
        self.pieces.resize_with(count, Piece::default);
        for p in &mut self.pieces {
            p.kept.clear();
            p.frames.clear();
            p.next = 0;
        }
        let settled = &memo[..memo.len().saturating_sub(UNSETTLED_SLOTS)];
        if self.marker.is_none() {
            self.marker = entry_start(memo, keys);
        }
        let Some(marker) = &self.marker else {
            return 0;
        };
        let finder = memchr::memmem::Finder::new(marker);
        self.pieces.par_iter_mut().enumerate().for_each(|(i, out)| {
            let (from, to) = (i * piece, ((i + 1) * piece).min(end));
            // The first piece starts at the reader's entry; the others
            // at the first bytes that look like an entry's start.
            let start = if from == 0 {
                Some(0)
            } else {
                finder.find(&bytes[from..to]).map(|i| from + i)
            };
            if let Some(start) = start {
                let mut s = scratch.for_ahead();
                decode_piece(bytes, start, to, offset, settled, &mut s, keys, out);
            }
        });
        self.pieces.iter().map(|p| p.kept.len()).sum()
    }
}

/// The bytes a trace entry starts with, as the pickler writes it:
/// `EMPTY_DICT MEMOIZE MARK` and a reference to the `action` key; `None`
/// when the memo holds no such key.
fn entry_start(memo: &[u32], keys: &KeyTable) -> Option<Vec<u8>> {
    // The key is memoized once, with the first entry.
    let slot = memo.iter().position(|&s| s == keys.action())?;
    let mut marker = vec![vm::EMPTY_DICT, vm::MEMOIZE, vm::MARK];
    match u8::try_from(slot) {
        Ok(i) => marker.extend_from_slice(&[vm::BINGET, i]),
        Err(_) => {
            marker.push(vm::LONG_BINGET);
            marker.extend_from_slice(&(slot as u32).to_le_bytes());
        }
    }
    Some(marker)
}

/// Decodes the entries of `bytes` from `start`, one after another, until
/// one starts at or past `to` or the bytes are not entries; appends what it
/// decoded to `out` (offsets from `offset`, the stream's offset of
/// `bytes[0]`).
#[allow(clippy::too_many_arguments)]
fn decode_piece(
    bytes: &[u8],
    start: usize,
    to: usize,
    offset: u64,
    memo: &[u32],
    s: &mut Scratch,
    keys: &KeyTable,
    out: &mut Piece,
) {
    let mut p = start;
    while p < to {
        match bytes[p] {
            vm::EMPTY_DICT => {
                if let Some(d) = decode_ahead(memo, s, &bytes[p + 1..], keys) {
                    let first = out.frames.len() as u32;
                    out.frames.extend_from_slice(&s.frames);
                    out.kept.push(Kept {
                        offset: offset + p as u64,
                        decoded: d,
                        frames: (first, out.frames.len() as u32),
                    });
                    p += 1 + d.len;
                } else {
                    match step_over_dict(bytes, p) {
                        Some(n) => p += n,
                        None => return,
                    }
                }
            }
            // Between batches of a thousand entries: APPENDS, then MARK.
            vm::APPENDS | vm::MARK => p += 1,
            vm::FRAME => p += 9,
            _ => return,
        }
    }
}

/// The length of the dict that starts at `bytes[p]` (its `EMPTY_DICT`),
/// found by following the stack depth opcode by opcode until the dict stands
/// alone again with another entry, an `APPENDS` or a `FRAME` next; `None` at
/// anything else (an opcode memlens refuses, the end of the bytes, a dict
/// longer than [`MAX_STEP_OVER`]).
fn step_over_dict(bytes: &[u8], p: usize) -> Option<usize> {
    let mut i = p;
    // Values above the dict's place on the stack, the dict included.
    let mut depth: usize = 0;
    let mut marks: Vec<usize> = Vec::new();
    let limit = bytes.len().min(p.saturating_add(MAX_STEP_OVER));
    while i < limit {
        let op = bytes[i];
        let arg = |n: usize| -> Option<u64> {
            let b = bytes.get(i + 1..i + 1 + n)?;
            let mut w = [0u8; 8];
            w[..n].copy_from_slice(b);
            Some(u64::from_le_bytes(w))
        };
        // (argument bytes, values pushed, values popped)
        let (len, push, pop): (usize, usize, usize) = match op {
            vm::MEMOIZE | vm::FRAME | vm::PROTO | vm::TUPLE1 => {
                let len = match op {
                    vm::FRAME => 8,
                    vm::PROTO => 1,
                    _ => 0,
                };
                (len, 0, 0)
            }
            vm::BINPUT => (1, 0, 0),
            vm::LONG_BINPUT => (4, 0, 0),
            vm::BINGET | vm::BININT1 => (1, 1, 0),
            vm::BININT2 => (2, 1, 0),
            vm::BININT | vm::LONG_BINGET => (4, 1, 0),
            vm::BINFLOAT => (8, 1, 0),
            vm::LONG1 | vm::SHORT_BINUNICODE | vm::SHORT_BINBYTES | vm::SHORT_BINSTRING => {
                (1 + arg(1)? as usize, 1, 0)
            }
            vm::LONG4 | vm::BINUNICODE | vm::BINBYTES | vm::BINSTRING => {
                (4 + usize::try_from(arg(4)?).ok()?, 1, 0)
            }
            vm::BINUNICODE8 | vm::BINBYTES8 | vm::BYTEARRAY8 => {
                (8usize.checked_add(usize::try_from(arg(8)?).ok()?)?, 1, 0)
            }
            vm::NONE
            | vm::NEWTRUE
            | vm::NEWFALSE
            | vm::EMPTY_DICT
            | vm::EMPTY_LIST
            | vm::EMPTY_TUPLE
            | vm::EMPTY_SET
            | vm::DUP => (0, 1, 0),
            vm::POP | vm::APPEND | vm::TUPLE2 => (0, 0, 1),
            vm::SETITEM | vm::TUPLE3 => (0, 0, 2),
            vm::MARK => {
                marks.push(depth);
                (0, 0, 0)
            }
            vm::SETITEMS | vm::APPENDS | vm::ADDITEMS | vm::POP_MARK => {
                depth = marks.pop()?;
                (0, 0, 0)
            }
            vm::TUPLE | vm::FROZENSET | vm::DICT | vm::LIST => {
                depth = marks.pop()?;
                (0, 1, 0)
            }
            _ => return None,
        };
        if pop > 0 {
            // What is popped lies above the innermost mark, and the dict stays.
            let floor = marks.last().copied().unwrap_or(0);
            depth = depth.checked_sub(pop).filter(|&d| d >= floor.max(1))?;
        }
        depth += push;
        i = i.checked_add(len)?.checked_add(1)?;
        if depth == 1
            && marks.is_empty()
            && matches!(
                bytes.get(i),
                Some(&(vm::EMPTY_DICT | vm::APPENDS | vm::FRAME))
            )
        {
            return Some(i - p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::Limits;
    use crate::snapshot::build::load_bytes_with;
    use std::cell::Cell;
    use std::path::Path;

    thread_local! {
        /// Entries the reader took from what was decoded ahead, on this thread.
        pub(super) static TAKEN: Cell<usize> = const { Cell::new(0) };
    }

    #[test]
    fn a_real_recording_is_read_ahead_and_reads_the_same() {
        // A real recording (tests/corpus, from an H100): 15 periodic steps.
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/clean_every.pickle.zst");
        let raw = zstd::decode_all(std::fs::File::open(&path).unwrap()).unwrap();
        let read = |read_ahead| {
            let limits = Limits {
                read_ahead,
                ..Limits::default()
            };
            TAKEN.with(|n| n.set(0));
            let snap = load_bytes_with(&raw, &path, limits).unwrap();
            (snap, TAKEN.with(|n| n.get()))
        };
        let (alone, none_taken) = read(ReadAhead::OFF);
        assert_eq!(none_taken, 0);
        let events = alone.event_count();
        assert!(events > 100_000, "{events} events");
        // Half the file at hand is enough to start: the reader then reads
        // ahead to the end, not only while half the file is in front of it.
        for min_bytes in [0, raw.len() / 2] {
            let ahead = ReadAhead {
                pieces: 4,
                piece_bytes: 64 << 10,
                min_bytes,
            };
            let (with_ahead, taken) = read(ahead);
            assert_eq!(alone.traces[0].events, with_ahead.traces[0].events);
            assert_eq!(alone.stack_frames, with_ahead.stack_frames);
            assert_eq!(alone.strings.len(), with_ahead.strings.len());
            // Most entries were decoded ahead: all but those naming a stack
            // or frame first seen within their own round.
            assert!(
                taken * 10 >= events * 9,
                "{taken} of {events} taken (min_bytes {min_bytes})"
            );
        }
    }

    #[test]
    fn steps_over_a_dict_with_nested_containers() {
        // {} MEMOIZE ( h0 K5 h1 ] MEMOIZE ( } MEMOIZE e u, then the next entry.
        let b = [
            vm::EMPTY_DICT,
            vm::MEMOIZE,
            vm::MARK,
            vm::BINGET,
            0,
            vm::BININT1,
            5,
            vm::BINGET,
            1,
            vm::EMPTY_LIST,
            vm::MEMOIZE,
            vm::MARK,
            vm::EMPTY_DICT,
            vm::MEMOIZE,
            vm::APPENDS,
            vm::SETITEMS,
            vm::EMPTY_DICT,
        ];
        assert_eq!(step_over_dict(&b, 0), Some(16));
        // Cut before its end: no length.
        assert_eq!(step_over_dict(&b[..15], 0), None);
        // An opcode that calls code: no length.
        let mut bad = b;
        bad[5] = b'c';
        assert_eq!(step_over_dict(&bad, 0), None);
        // A string claiming to be longer than memory: no length, no overflow.
        let mut huge = vec![vm::EMPTY_DICT, vm::MEMOIZE, vm::MARK, vm::BINUNICODE8];
        huge.extend_from_slice(&(u64::MAX - 8).to_le_bytes());
        huge.extend_from_slice(&[vm::SETITEMS, vm::EMPTY_DICT]);
        assert_eq!(step_over_dict(&huge, 0), None);
    }

    #[test]
    fn an_entry_starts_with_a_reference_to_the_action_key() {
        let keys = KeyTable::for_tests(7);
        let mut memo = vec![0; 300];
        memo[3] = keys.action();
        assert_eq!(
            entry_start(&memo, &keys),
            Some(vec![vm::EMPTY_DICT, vm::MEMOIZE, vm::MARK, vm::BINGET, 3])
        );
        memo[3] = 0;
        memo[280] = keys.action();
        assert_eq!(
            entry_start(&memo, &keys),
            Some(vec![
                vm::EMPTY_DICT,
                vm::MEMOIZE,
                vm::MARK,
                vm::LONG_BINGET,
                24,
                1,
                0,
                0
            ])
        );
        assert_eq!(entry_start(&[1, 2], &keys), None);
    }
}
