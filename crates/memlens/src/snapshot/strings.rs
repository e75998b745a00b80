//! A string interner: each distinct string is stored once and named by a
//! [`StrId`]. File names, function names and action names repeat millions of
//! times in a trace; interning keeps them to one copy each.

use hashbrown::HashTable;

/// Index of an interned string.
pub type StrId = u32;

/// Interned strings, all in one buffer.
#[derive(Clone, Debug, Default)]
pub struct Strings {
    /// All string bytes, concatenated.
    buf: String,
    /// `(start, end)` of each string in `buf`.
    spans: Vec<(u32, u32)>,
    /// Hash table of ids, keyed by the string they name.
    table: HashTable<StrId>,
    hasher: foldhash::fast::FixedState,
}

impl Strings {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    fn hash(&self, s: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(s)
    }

    /// Interns `s` and returns its id (the same id for the same string).
    pub fn intern(&mut self, s: &str) -> StrId {
        let h = self.hash(s);
        let (buf, spans) = (&self.buf, &self.spans);
        if let Some(&id) = self.table.find(h, |&id| {
            let (a, b) = spans[id as usize];
            &buf[a as usize..b as usize] == s
        }) {
            return id;
        }
        let id = self.spans.len() as StrId;
        let start = self.buf.len() as u32;
        self.buf.push_str(s);
        self.spans.push((start, self.buf.len() as u32));
        let (buf, spans, hasher) = (&self.buf, &self.spans, &self.hasher);
        self.table.insert_unique(h, id, |&id| {
            use std::hash::BuildHasher;
            let (a, b) = spans[id as usize];
            hasher.hash_one(&buf[a as usize..b as usize])
        });
        id
    }

    /// Looks a string up without interning it.
    pub fn find(&self, s: &str) -> Option<StrId> {
        let h = self.hash(s);
        self.table.find(h, |&id| self.get(id) == s).copied()
    }

    /// The string of an id; `""` for an unknown id.
    pub fn get(&self, id: StrId) -> &str {
        match self.spans.get(id as usize) {
            Some(&(a, b)) => &self.buf[a as usize..b as usize],
            None => "",
        }
    }

    /// Number of distinct strings.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when nothing was interned.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Bytes held by the interner (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        self.buf.capacity() + self.spans.capacity() * 8 + self.table.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interns_once() {
        let mut s = Strings::new();
        let a = s.intern("alloc");
        let b = s.intern("free_completed");
        assert_eq!(s.intern("alloc"), a);
        assert_ne!(a, b);
        assert_eq!(s.get(b), "free_completed");
        assert_eq!(s.find("alloc"), Some(a));
        assert_eq!(s.find("nope"), None);
        assert_eq!(s.len(), 2);
    }
}
