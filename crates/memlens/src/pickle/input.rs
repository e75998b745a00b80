//! The reader's byte sources ([`Source`]): [`Input`], a window over any
//! `Read`, refilled as the reader moves on, so a snapshot of any size is read
//! in bounded memory (the window grows only for a single string larger than
//! it); and [`Mapped`], bytes already in memory (a memory-mapped file), read
//! in place with no copy, the part behind the reader handed back as it goes.

use std::io::Read;

/// Size of the read window. Large enough that refills are rare, small enough
/// to stay in cache-friendly territory.
const WINDOW: usize = 1 << 20;

/// A refillable window over a byte stream.
pub struct Input<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Bytes dropped from the front of the window so far.
    consumed: u64,
    eof: bool,
}

/// Why the input could not give the bytes asked for.
#[derive(Debug)]
pub enum InputError {
    /// The stream ended early.
    Truncated,
    /// The underlying reader failed.
    Io(std::io::Error),
}

/// What the reader needs of its bytes. The methods are those of [`Input`];
/// both sources give the same bytes, offsets and errors for the same stream.
pub trait Source {
    /// Offset of the next unread byte from the start of the stream.
    fn offset(&self) -> u64;
    /// True when every byte has been read.
    fn at_end(&mut self) -> Result<bool, InputError>;
    /// The next byte.
    fn byte(&mut self) -> Result<u8, InputError>;
    /// The next `n` bytes (the caller checks `n` against its own limits first).
    fn take(&mut self, n: usize) -> Result<&[u8], InputError>;
    /// The next `N` bytes as an array.
    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], InputError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    /// The unread bytes at hand, at least `want` of them unless the stream
    /// ends first. Nothing is consumed: see [`Source::skip`].
    fn window(&mut self, want: usize) -> Result<&[u8], InputError>;
    /// Consumes `n` bytes of those [`Source::window`] returned.
    fn skip(&mut self, n: usize);
    /// Bytes left in the stream, read to the end (used to check for trailing data).
    fn skip_rest(&mut self) -> Result<u64, InputError>;
}

impl<R: Read> Source for Input<R> {
    #[inline(always)]
    fn offset(&self) -> u64 {
        Input::offset(self)
    }
    #[inline(always)]
    fn at_end(&mut self) -> Result<bool, InputError> {
        Input::at_end(self)
    }
    #[inline(always)]
    fn byte(&mut self) -> Result<u8, InputError> {
        Input::byte(self)
    }
    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<&[u8], InputError> {
        Input::take(self, n)
    }
    #[inline(always)]
    fn window(&mut self, want: usize) -> Result<&[u8], InputError> {
        Input::window(self, want)
    }
    #[inline(always)]
    fn skip(&mut self, n: usize) {
        Input::skip(self, n)
    }
    fn skip_rest(&mut self) -> Result<u64, InputError> {
        Input::skip_rest(self)
    }
}

/// Bytes in memory that can give back the part already read (a memory map
/// drops those pages from the process, so its resident size stays bounded).
pub trait Region {
    /// All the bytes.
    fn bytes(&self) -> &[u8];
    /// The reader is done with `bytes()[..end]`: it will not look at them
    /// again (a region may ignore this).
    fn release(&mut self, end: usize) {
        let _ = end;
    }
}

impl Region for Vec<u8> {
    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Region for &[u8] {
    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Bytes between two releases of a [`Mapped`] source.
const RELEASE_EVERY: usize = 8 << 20;

/// A [`Source`] over bytes already in memory: read in place, no window.
pub struct Mapped<M> {
    region: M,
    pos: usize,
    /// Where the reader passed when the region was last told (see [`Region::release`]).
    released: usize,
}

impl<M: Region> Mapped<M> {
    /// Reads `region` from its start.
    pub fn new(region: M) -> Self {
        Mapped {
            region,
            pos: 0,
            released: 0,
        }
    }

    /// Tells the region what the reader has passed, every few MB.
    #[inline(always)]
    fn moved(&mut self) {
        if self.pos - self.released >= RELEASE_EVERY {
            self.release();
        }
    }

    #[cold]
    fn release(&mut self) {
        self.released = self.pos;
        self.region.release(self.pos);
    }
}

impl<M: Region> Source for Mapped<M> {
    #[inline(always)]
    fn offset(&self) -> u64 {
        self.pos as u64
    }
    #[inline(always)]
    fn at_end(&mut self) -> Result<bool, InputError> {
        Ok(self.pos >= self.region.bytes().len())
    }
    #[inline(always)]
    fn byte(&mut self) -> Result<u8, InputError> {
        let b = *self
            .region
            .bytes()
            .get(self.pos)
            .ok_or(InputError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }
    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<&[u8], InputError> {
        let start = self.pos;
        let end = start.checked_add(n).ok_or(InputError::Truncated)?;
        if end > self.region.bytes().len() {
            return Err(InputError::Truncated);
        }
        self.pos = end;
        self.moved();
        Ok(&self.region.bytes()[start..end])
    }
    #[inline(always)]
    fn window(&mut self, _want: usize) -> Result<&[u8], InputError> {
        let b = self.region.bytes();
        Ok(b.get(self.pos..).unwrap_or(&[]))
    }
    #[inline(always)]
    fn skip(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.region.bytes().len());
        self.moved();
    }
    fn skip_rest(&mut self) -> Result<u64, InputError> {
        let len = self.region.bytes().len();
        let n = len.saturating_sub(self.pos);
        self.pos = len;
        Ok(n as u64)
    }
}

impl<R: Read> Input<R> {
    /// Wraps a reader.
    pub fn new(reader: R) -> Self {
        Input {
            reader,
            buf: vec![0; WINDOW],
            pos: 0,
            end: 0,
            consumed: 0,
            eof: false,
        }
    }

    /// Offset of the next unread byte from the start of the stream.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.consumed + self.pos as u64
    }

    /// True when every byte has been read.
    pub fn at_end(&mut self) -> Result<bool, InputError> {
        if self.pos < self.end {
            return Ok(false);
        }
        self.refill(1)?;
        Ok(self.pos >= self.end)
    }

    /// Makes at least `n` bytes available (or all that are left, at the end).
    fn refill(&mut self, n: usize) -> Result<(), InputError> {
        // Move what is left to the front, then read until `n` bytes are there.
        let left = self.end - self.pos;
        self.buf.copy_within(self.pos..self.end, 0);
        self.consumed += self.pos as u64;
        self.pos = 0;
        self.end = left;
        while self.end < n && !self.eof {
            // Grow toward `n` only as bytes arrive: a length read from the
            // file is never trusted before its bytes are there (a 10-byte
            // file claiming a 1 GB string costs nothing).
            if self.end == self.buf.len() {
                let grown = (self.buf.len() * 2).min(n).max(self.end + 1);
                self.buf.resize(grown, 0);
            }
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(InputError::Io(e)),
            }
        }
        Ok(())
    }

    /// The next byte.
    #[inline]
    pub fn byte(&mut self) -> Result<u8, InputError> {
        if self.pos < self.end {
            let b = self.buf[self.pos];
            self.pos += 1;
            return Ok(b);
        }
        self.refill(1)?;
        if self.pos < self.end {
            let b = self.buf[self.pos];
            self.pos += 1;
            Ok(b)
        } else {
            Err(InputError::Truncated)
        }
    }

    /// The next `n` bytes. The caller checks `n` against its own limits first:
    /// the window grows to `n` when a single item is that large.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&[u8], InputError> {
        if self.end - self.pos < n {
            self.refill(n)?;
            if self.end - self.pos < n {
                return Err(InputError::Truncated);
            }
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], InputError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// The unread bytes of the window, refilled first when fewer than `want`
    /// are there (so a small item never straddles the window's end unless the
    /// stream does). Nothing is consumed: see [`Input::skip`].
    #[inline]
    pub fn window(&mut self, want: usize) -> Result<&[u8], InputError> {
        if self.end - self.pos < want && !self.eof {
            self.refill(want)?;
        }
        Ok(&self.buf[self.pos..self.end])
    }

    /// Consumes `n` bytes of those [`Input::window`] returned.
    #[inline]
    pub fn skip(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }

    /// Bytes left in the stream, read to the end (used to check for trailing data).
    pub fn skip_rest(&mut self) -> Result<u64, InputError> {
        let mut n = (self.end - self.pos) as u64;
        self.pos = self.end;
        loop {
            self.refill(1)?;
            if self.end == 0 {
                return Ok(n);
            }
            n += self.end as u64;
            self.pos = self.end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_refills() {
        let data: Vec<u8> = (0..(3 * WINDOW + 17)).map(|i| (i % 251) as u8).collect();
        let mut inp = Input::new(&data[..]);
        let mut got = Vec::new();
        while !inp.at_end().unwrap() {
            got.extend_from_slice(inp.take(1000.min(data.len() - got.len())).unwrap());
        }
        assert_eq!(got, data);
        assert_eq!(inp.offset(), data.len() as u64);
    }

    /// Every call of the reader, on both sources: the same bytes, offsets and errors.
    #[test]
    fn mapped_reads_as_the_window_does() {
        let data: Vec<u8> = (0..(2 * WINDOW + 333)).map(|i| (i % 253) as u8).collect();
        let mut a = Input::new(&data[..]);
        let mut b = Mapped::new(data.clone());
        let mut step = 0usize;
        loop {
            assert_eq!(Source::offset(&a), Source::offset(&b));
            assert_eq!(
                Source::at_end(&mut a).unwrap(),
                Source::at_end(&mut b).unwrap()
            );
            if Source::at_end(&mut a).unwrap() {
                break;
            }
            step += 1;
            match step % 4 {
                0 => assert_eq!(Source::byte(&mut a).unwrap(), Source::byte(&mut b).unwrap()),
                1 => {
                    let n = step % 5000;
                    let (x, y) = (Source::take(&mut a, n), Source::take(&mut b, n));
                    match (x, y) {
                        (Ok(x), Ok(y)) => assert_eq!(x, y),
                        (Err(_), Err(_)) => break,
                        _ => panic!("take({n}) differs"),
                    }
                }
                2 => assert_eq!(
                    Source::array::<4>(&mut a).ok(),
                    Source::array::<4>(&mut b).ok()
                ),
                _ => {
                    let wa = Source::window(&mut a, 4096).unwrap().to_vec();
                    let wb = Source::window(&mut b, 4096).unwrap();
                    let k = wa.len().min(wb.len());
                    assert!(k >= 4096 || wa.len() == wb.len());
                    assert_eq!(&wa[..k], &wb[..k]);
                    Source::skip(&mut a, step % 300);
                    Source::skip(&mut b, step % 300);
                }
            }
        }
        assert_eq!(
            Source::skip_rest(&mut a).unwrap(),
            Source::skip_rest(&mut b).unwrap()
        );
        assert_eq!(Source::offset(&a), data.len() as u64);
        assert_eq!(Source::offset(&b), data.len() as u64);
        assert!(matches!(Source::byte(&mut b), Err(InputError::Truncated)));
    }

    #[test]
    fn large_item_grows_window() {
        let data = vec![7u8; WINDOW * 2 + 5];
        let mut inp = Input::new(&data[..]);
        assert_eq!(inp.byte().unwrap(), 7);
        assert_eq!(inp.take(WINDOW * 2).unwrap().len(), WINDOW * 2);
        assert!(matches!(inp.take(10), Err(InputError::Truncated)));
    }
}
