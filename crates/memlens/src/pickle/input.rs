//! A buffered byte source for the reader: a window over any `Read`, refilled
//! as the reader moves on, so a snapshot of any size is read in bounded memory
//! (the window grows only for a single string larger than it).

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

    #[test]
    fn large_item_grows_window() {
        let data = vec![7u8; WINDOW * 2 + 5];
        let mut inp = Input::new(&data[..]);
        assert_eq!(inp.byte().unwrap(), 7);
        assert_eq!(inp.take(WINDOW * 2).unwrap().len(), WINDOW * 2);
        assert!(matches!(inp.take(10), Err(InputError::Truncated)));
    }
}
