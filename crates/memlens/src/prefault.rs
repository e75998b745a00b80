//! Memory faulted in on idle cores, before the thread that fills it gets there.
//!
//! A real recording's event table is large (three million trace events are
//! 96 MB) and is filled front to back by the one thread that reads the file.
//! Each fresh 4 KiB page it first writes costs a trip into the kernel, which
//! zeroes the page: on the 2-core VM this project is built on, faulting in a
//! 94 MB table took 35 ms, an eighth of reading the file, and page faults
//! cost more still in the GPU host's VM. When the reader has other cores
//! waiting (it reads ahead on them, `pickle::ahead`), they fault in the
//! table's next stretch while the reader waits for their round anyway.
//!
//! `MADV_POPULATE_WRITE` (Linux 5.14) faults pages in as a write would, but
//! writes nothing, so it cannot change a byte of the table, and it may run
//! on memory another thread is about to write. Elsewhere, or refused (an
//! older kernel), nothing happens and the reader faults the pages itself.
//!
//! (Tried and dropped: asking for transparent huge pages on the table. Each
//! time the vector grows and is moved, the kernel splits them: reading was
//! 10-20% slower on the 2-core VM.)

use rayon::prelude::*;
use std::ops::Range;

/// The base page size assumed for alignment. A larger page (arm64 with 64 KiB
/// pages) only makes the kernel refuse an unaligned span: no harm.
const PAGE: usize = 4096;

/// Bytes one thread faults in at a time.
const CHUNK: usize = 256 << 10;

/// Makes room in `v` for `items` more (growing it as `Vec` does) and returns
/// the addresses where those items will lie, to be faulted in by
/// [`populate`]. Only addresses: nothing is read or written through them.
pub(crate) fn room_for<T>(v: &mut Vec<T>, items: usize) -> Range<usize> {
    v.reserve(items);
    let size = std::mem::size_of::<T>();
    let start = v.as_ptr() as usize + v.len() * size;
    start..start + items * size
}

/// Faults in the whole pages of each span on rayon's threads, all in one
/// parallel pass, as a write would, without writing. The caller waits until
/// they are in.
pub(crate) fn populate<const N: usize>(spans: [Range<usize>; N]) {
    spans.into_par_iter().for_each(|span| {
        let first = span.start.next_multiple_of(PAGE);
        let end = span.end / PAGE * PAGE;
        (first..end.max(first))
            .into_par_iter()
            .step_by(CHUNK)
            .for_each(|at| populate_span(at, (end - at).min(CHUNK)));
    });
}

#[cfg(target_os = "linux")]
fn populate_span(addr: usize, len: usize) {
    // SAFETY: MADV_POPULATE_WRITE reads and writes no byte of the span: it
    // only has the kernel map its pages (zeroed, for pages not yet there) as
    // a first write would. The span lies inside an allocation this process
    // owns (the caller's vector, see `room_for`). A refusal is ignored.
    #[allow(unsafe_code)]
    let _ = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn populate_span(_addr: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_where_the_next_items_go_and_populating_changes_nothing() {
        let mut v: Vec<u64> = (0..1000).collect();
        let room = room_for(&mut v, 1_000_000);
        assert_eq!(room.start, v.as_ptr() as usize + 1000 * 8);
        assert_eq!(room.end - room.start, 1_000_000 * 8);
        populate([room.clone()]);
        let base = v.as_ptr() as usize;
        v.extend(1000..1_001_000);
        // No move: the room was made before.
        assert_eq!(v.as_ptr() as usize, base);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
        // Populating what is already written leaves it as it is.
        let written = base..base + v.len() * 8;
        populate([written]);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }

    #[test]
    fn an_empty_or_sub_page_span_is_nothing_to_do() {
        let mut v: Vec<u8> = Vec::new();
        let room = room_for(&mut v, 0);
        assert!(room.is_empty());
        populate([room]);
        let room = room_for(&mut v, 10);
        populate([room, 3..5]);
        assert!(v.capacity() >= 10);
    }
}
