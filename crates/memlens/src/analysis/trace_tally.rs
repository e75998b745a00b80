//! What the summary counts over a trace: the events of each action, and the
//! frees whose block has no `alloc` in the trace (the ring buffer dropped the
//! oldest events), on every core. A free is counted at its
//! `free_requested`, or at its `free_completed` in a trace recorded without
//! requests ([`crate::snapshot::records_free_requests`]).
//!
//! Counting a free without its allocation means following, address by
//! address, which blocks are live: a walk from the first event to the last.
//! It splits all the same. Each piece of the trace is walked on its own from
//! a live set it does not know: a `free_requested` of an address the piece
//! has not touched yet is left open (it has its allocation exactly when the
//! address was live as the piece began), and the piece notes which addresses
//! it leaves live or freed. The pieces are then joined in order, which
//! settles the open frees against the live set carried from piece to piece.
//! The result is the one walk's (`tests` compare them on random traces).

use crate::snapshot::{Action, TraceEvent};
use hashbrown::{HashMap, HashSet};
use rayon::prelude::*;

/// Events a piece holds at least: below this, one walk costs less than
/// joining pieces.
const MIN_PIECE: usize = 1 << 18;

/// What the summary needs of a trace's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceTally {
    /// Events of each action, by [`Action`] discriminant.
    pub counts: [u64; Action::ALL.len()],
    /// Frees (their `free_requested`, or their `free_completed` where no
    /// request is recorded) of an address not live then: no `alloc` since
    /// its last `free_completed` (or since the trace began).
    pub frees_without_alloc: u64,
}

/// Tallies `events`, in pieces on every core when there are enough.
pub fn tally(events: &[TraceEvent]) -> TraceTally {
    let threads = rayon::current_num_threads().max(1);
    tally_in_pieces(events, (events.len() / threads).max(MIN_PIECE))
}

/// [`tally`] with pieces of `piece` events (the last may be shorter).
fn tally_in_pieces(events: &[TraceEvent], piece: usize) -> TraceTally {
    let requests = crate::snapshot::records_free_requests(events);
    let pieces: Vec<Piece> = events
        .par_chunks(piece.max(1))
        .map(|p| Piece::walk(p, requests))
        .collect();
    let mut total = TraceTally::default();
    let mut live: HashSet<u64> = HashSet::new();
    for p in pieces {
        for (t, n) in total.counts.iter_mut().zip(p.counts) {
            *t += n;
        }
        total.frees_without_alloc += p.unmatched;
        total.frees_without_alloc += p.open.iter().filter(|a| !live.contains(*a)).count() as u64;
        for (addr, left_live) in p.touched {
            if left_live {
                live.insert(addr);
            } else {
                live.remove(&addr);
            }
        }
    }
    total
}

/// One piece of a trace, walked without knowing what was live before it.
struct Piece {
    counts: [u64; Action::ALL.len()],
    /// Frees found without their allocation within the piece (the address
    /// was freed in it, and not allocated again before).
    unmatched: u64,
    /// Frees of an address the piece had not allocated or freed before
    /// them: settled by what was live as the piece began.
    open: Vec<u64>,
    /// Every address the piece allocated or freed, and whether it left it
    /// live (`alloc` last) or not (`free_completed` last).
    touched: HashMap<u64, bool>,
}

impl Piece {
    /// Walks one piece; `requests`: whether the trace records
    /// `free_requested` (else a free is counted at its `free_completed`).
    fn walk(events: &[TraceEvent], requests: bool) -> Piece {
        let mut p = Piece {
            counts: [0; Action::ALL.len()],
            unmatched: 0,
            open: Vec::new(),
            touched: HashMap::new(),
        };
        let free_begins = if requests {
            Action::FreeRequested
        } else {
            Action::FreeCompleted
        };
        for e in events {
            p.counts[e.action as usize] += 1;
            if e.action == free_begins {
                match p.touched.get(&e.addr) {
                    Some(true) => {}
                    Some(false) => p.unmatched += 1,
                    None => p.open.push(e.addr),
                }
            }
            match e.action {
                Action::Alloc => {
                    p.touched.insert(e.addr, true);
                }
                Action::FreeCompleted => {
                    p.touched.insert(e.addr, false);
                }
                _ => {}
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::EMPTY_STACK;

    /// The one walk from the first event to the last, as the summary did it.
    fn walked(events: &[TraceEvent]) -> TraceTally {
        let mut t = TraceTally::default();
        let mut live: HashSet<u64> = HashSet::new();
        let begins = if crate::snapshot::records_free_requests(events) {
            Action::FreeRequested
        } else {
            Action::FreeCompleted
        };
        for e in events {
            t.counts[e.action as usize] += 1;
            if e.action == begins && !live.contains(&e.addr) {
                t.frees_without_alloc += 1;
            }
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr);
                }
                Action::FreeCompleted => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        t
    }

    /// Random traces over a few addresses (so that frees without their
    /// allocation, doubled frees and reuse are common), a fifth of them
    /// without `free_requested` (as `memlens.record` records), cut into
    /// pieces of every size from one event to the whole: the same tally as
    /// one walk.
    #[test]
    fn pieces_tally_as_one_walk() {
        let mut raw = crate::test_support::xorshift(0x9E37_79B9_7F4A_7C15);
        let mut next = move |m: u64| raw() % m;
        let (mut unmatched_seen, mut unrequested_seen) = (0, 0);
        for round in 0..400 {
            let n = 1 + next(300) as usize;
            let addresses = 1 + next(12);
            let events: Vec<TraceEvent> = (0..n)
                .map(|_| TraceEvent {
                    addr: 512 * next(addresses),
                    size: 512,
                    time_us: 0,
                    stack: EMPTY_STACK,
                    stream: 0,
                    action: Action::ALL[next(if round % 3 == 0 { 9 } else { 3 }) as usize],
                    flags: 0,
                })
                .filter(|e| round % 5 != 1 || e.action != Action::FreeRequested)
                .collect();
            let one = walked(&events);
            unmatched_seen += one.frees_without_alloc;
            if !crate::snapshot::records_free_requests(&events) {
                unrequested_seen += one.frees_without_alloc;
            }
            for piece in [1, 2, 3, 7, 16, 64, n] {
                assert_eq!(
                    tally_in_pieces(&events, piece),
                    one,
                    "round {round}, piece {piece}"
                );
            }
            assert_eq!(tally(&events), one);
        }
        assert!(
            unmatched_seen > 1000 && unrequested_seen > 100,
            "the traces hardly test unmatched frees ({unmatched_seen}, {unrequested_seen} unrequested)"
        );
        assert_eq!(tally(&[]), TraceTally::default());
    }
}
