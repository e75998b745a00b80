//! The free blocks of one `BlockPool`, ordered like PyTorch's
//! `BlockComparatorSize`: by stream, then size, then address.
//!
//! Replay and simulation spend much of their time here: every allocation
//! takes a block out, every split and free puts one back. So the set is
//! shaped for that. Each stream (a pool rarely sees more than a few) has its
//! own entries keyed by `(size, address)` packed into one `u128`, which
//! orders exactly like the tuple with one comparison. A pool usually holds a
//! few dozen free blocks (at most 54 at any point of the `long` fixture), and
//! at that size a sorted vector beats a B-tree: a binary search over a cache
//! line or two and a short shift. A fragmented pool can hold thousands,
//! where shifting would dominate, so past [`FLAT_MAX`] entries a stream's
//! entries move into a `BTreeMap` (and back below [`FLAT_MIN`]).

use either::Either;
use std::collections::BTreeMap;

/// Entries a stream keeps in a sorted vector before moving to a tree.
const FLAT_MAX: usize = 512;
/// Entries below which a tree moves back to a sorted vector (well under
/// [`FLAT_MAX`], so a set hovering near the limit does not flip each time).
const FLAT_MIN: usize = 128;

/// A free block's place in the order: (size, address) packed high to low.
#[inline]
fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

/// A free block as the set yields it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FreeEntry {
    /// Block size.
    pub(crate) size: u64,
    /// Block address.
    pub(crate) addr: u64,
    /// Block id in the allocator's slab.
    pub(crate) id: u32,
}

impl FreeEntry {
    #[inline]
    fn new(k: u128, id: u32) -> FreeEntry {
        FreeEntry {
            size: (k >> 64) as u64,
            addr: k as u64,
            id,
        }
    }
}

/// One stream's free blocks in (size, address) order.
#[derive(Clone, Debug)]
enum Entries {
    /// Sorted by key; small sets.
    Flat(Vec<(u128, u32)>),
    /// Large sets.
    Tree(BTreeMap<u128, u32>),
}

impl Default for Entries {
    fn default() -> Self {
        Entries::Flat(Vec::new())
    }
}

impl Entries {
    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Entries::Flat(v) => v.len(),
            Entries::Tree(t) => t.len(),
        }
    }

    fn insert(&mut self, k: u128, id: u32) {
        match self {
            Entries::Flat(v) => {
                match v.binary_search_by_key(&k, |e| e.0) {
                    Ok(i) => v[i].1 = id,
                    Err(i) => v.insert(i, (k, id)),
                }
                if v.len() > FLAT_MAX {
                    *self = Entries::Tree(v.drain(..).collect());
                }
            }
            Entries::Tree(t) => {
                t.insert(k, id);
            }
        }
    }

    fn remove(&mut self, k: u128) -> bool {
        match self {
            Entries::Flat(v) => match v.binary_search_by_key(&k, |e| e.0) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            Entries::Tree(t) => {
                let found = t.remove(&k).is_some();
                if t.len() < FLAT_MIN {
                    *self = Entries::Flat(std::mem::take(t).into_iter().collect());
                }
                found
            }
        }
    }

    /// Entries with keys of at least `k`, ascending.
    fn from(&self, k: u128) -> impl DoubleEndedIterator<Item = FreeEntry> + '_ {
        match self {
            Entries::Flat(v) => {
                let i = v.partition_point(|e| e.0 < k);
                Either::Left(v[i..].iter().map(|&(k, id)| FreeEntry::new(k, id)))
            }
            Entries::Tree(t) => Either::Right(t.range(k..).map(|(&k, &id)| FreeEntry::new(k, id))),
        }
    }

    /// Entries with keys below `k`, ascending.
    fn before(&self, k: u128) -> impl DoubleEndedIterator<Item = FreeEntry> + '_ {
        match self {
            Entries::Flat(v) => {
                let i = v.partition_point(|e| e.0 < k);
                Either::Left(v[..i].iter().map(|&(k, id)| FreeEntry::new(k, id)))
            }
            Entries::Tree(t) => Either::Right(t.range(..k).map(|(&k, &id)| FreeEntry::new(k, id))),
        }
    }
}

/// Free blocks ordered by (stream, size, address).
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeSet {
    /// One set of entries per stream, sorted by stream.
    streams: Vec<(u64, Entries)>,
}

impl FreeSet {
    fn stream(&self, stream: u64) -> Option<&Entries> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, e)| e)
    }

    /// Adds a block.
    pub(crate) fn insert(&mut self, stream: u64, size: u64, addr: u64, id: u32) {
        let i = match self.streams.binary_search_by_key(&stream, |(s, _)| *s) {
            Ok(i) => i,
            Err(i) => {
                self.streams.insert(i, (stream, Entries::default()));
                i
            }
        };
        self.streams[i].1.insert(key(size, addr), id);
    }

    /// Removes a block; `false` when it was not in the set.
    pub(crate) fn remove(&mut self, stream: u64, size: u64, addr: u64) -> bool {
        self.streams
            .iter_mut()
            .find(|(s, _)| *s == stream)
            .is_some_and(|(_, e)| e.remove(key(size, addr)))
    }

    /// Blocks on `stream` of at least `size` bytes, smallest (then lowest
    /// address) first: best fit is the first.
    pub(crate) fn at_least(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        self.stream(stream)
            .into_iter()
            .flat_map(move |e| e.from(key(size, 0)))
    }

    /// Blocks on `stream` of fewer than `size` bytes, largest first.
    pub(crate) fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        self.stream(stream)
            .into_iter()
            .flat_map(move |e| e.before(key(size, 0)).rev())
    }

    /// The largest block on `stream`.
    pub(crate) fn largest_on(&self, stream: u64) -> Option<FreeEntry> {
        self.stream(stream).and_then(|e| e.from(0).next_back())
    }

    /// Every block, in (stream, size, address) order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        self.streams.iter().flat_map(|(_, e)| e.from(0))
    }

    /// The ids of every block, in order (to act on them while changing the set).
    pub(crate) fn ids(&self) -> Vec<u32> {
        self.iter().map(|e| e.id).collect()
    }

    /// Number of blocks.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.streams.iter().map(|(_, e)| e.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_stream_then_size_then_address() {
        let mut s = FreeSet::default();
        s.insert(7, 512, 0x3000, 1);
        s.insert(3, 4096, 0x1000, 2);
        s.insert(7, 512, 0x2000, 3);
        s.insert(7, 1 << 40, 0x10, 4);
        s.insert(3, 512, 0x9000, 5);
        let ids: Vec<u32> = s.iter().map(|e| e.id).collect();
        assert_eq!(ids, [5, 2, 3, 1, 4]);
        let fit: Vec<u32> = s.at_least(7, 513).map(|e| e.id).collect();
        assert_eq!(fit, [4]);
        let fit: Vec<u32> = s.at_least(7, 512).map(|e| e.id).collect();
        assert_eq!(fit, [3, 1, 4]);
        let down: Vec<u32> = s.below(7, 1 << 40).map(|e| e.id).collect();
        assert_eq!(down, [1, 3]);
        assert_eq!(s.largest_on(3).map(|e| e.size), Some(4096));
        assert_eq!(s.largest_on(9), None);
        assert_eq!(s.at_least(9, 0).count(), 0);
        assert!(s.remove(7, 512, 0x2000));
        assert!(!s.remove(7, 512, 0x2000));
        assert!(!s.remove(9, 512, 0x2000));
        assert_eq!(s.ids(), [5, 2, 1, 4]);
    }

    /// Growing past the vector's limit and shrinking back keeps the order
    /// and every query the same as a plain ordered map's.
    #[test]
    fn flat_and_tree_forms_agree_with_an_ordered_map() {
        let mut s = FreeSet::default();
        let mut reference: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
        // A deterministic mix of sizes and addresses on two streams.
        let mut next = crate::test_support::xorshift(0x9E37_79B9_7F4A_7C15);
        let check = |s: &FreeSet, r: &BTreeMap<(u64, u64, u64), u32>, probe: u64| {
            assert_eq!(s.len(), r.len());
            let all: Vec<u32> = r.values().copied().collect();
            assert_eq!(s.ids(), all);
            for stream in [1, 2] {
                let fit: Vec<u32> = r
                    .range((stream, probe, 0)..(stream + 1, 0, 0))
                    .map(|(_, &v)| v)
                    .collect();
                assert_eq!(
                    s.at_least(stream, probe).map(|e| e.id).collect::<Vec<_>>(),
                    fit
                );
                let down: Vec<u32> = r
                    .range((stream, 0, 0)..(stream, probe, 0))
                    .rev()
                    .map(|(_, &v)| v)
                    .collect();
                assert_eq!(
                    s.below(stream, probe).map(|e| e.id).collect::<Vec<_>>(),
                    down
                );
                let largest = r.range((stream, 0, 0)..(stream + 1, 0, 0)).next_back();
                assert_eq!(s.largest_on(stream).map(|e| e.id), largest.map(|(_, &v)| v));
            }
        };
        let mut keys = Vec::new();
        for id in 0..1500u32 {
            let stream = 1 + next() % 2;
            let size = (next() % 64 + 1) * 512;
            let addr = next() % (1 << 40);
            s.insert(stream, size, addr, id);
            reference.insert((stream, size, addr), id);
            keys.push((stream, size, addr));
            if id % 250 == 0 {
                check(&s, &reference, (next() % 64) * 512);
            }
        }
        check(&s, &reference, 8192);
        for (i, &(stream, size, addr)) in keys.iter().enumerate() {
            assert!(s.remove(stream, size, addr));
            reference.remove(&(stream, size, addr));
            if i % 250 == 0 || reference.len() < 140 {
                check(&s, &reference, (next() % 64) * 512);
            }
        }
        assert_eq!(s.len(), 0);
    }
}
