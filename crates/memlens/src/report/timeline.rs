//! Building a [`Timeline`] point by point, with a bounded number of points.
//!
//! A 1 GB snapshot holds about 11 million events; a page cannot carry (or a
//! canvas draw) that many. The builder splits the events into buckets and keeps,
//! per bucket, the points where `allocated` is lowest and highest and where
//! `reserved` is highest. The global peak is the highest point of its bucket, so
//! it survives exactly; OOM points and points marked `keep` are always kept. All
//! columns are sampled at the same points, so the stacked bands still add up.

use super::model::{Timeline, TimelineSite, XUnit};

/// The default bound on timeline points: about one per horizontal pixel of a
/// wide screen, twice over.
pub const DEFAULT_MAX_POINTS: usize = 4000;

/// One point pushed into a [`TimelineBuilder`].
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelinePoint<'a> {
    /// Event index or epoch microseconds, as the builder's [`XUnit`] says.
    pub x: i64,
    /// Index of the event in the device trace.
    pub event: u64,
    /// Bytes allocated after the event.
    pub allocated: u64,
    /// Bytes reserved after the event.
    pub reserved: u64,
    /// Bytes active after the event, when computed.
    pub active: Option<u64>,
    /// Bytes of each top site (same order as the builder's sites); the rest of
    /// `allocated` goes to the "other" band.
    pub bands: &'a [u64],
    /// The event is an OOM (always kept, listed in [`Timeline::ooms`]).
    pub oom: bool,
    /// Keep this point whatever the bucketing says.
    pub keep: bool,
}

/// A point held while its bucket is open.
#[derive(Clone, Debug, Default)]
struct Held {
    seq: u64,
    x: i64,
    event: u64,
    allocated: u64,
    reserved: u64,
    active: u64,
    bands: Vec<u64>,
    oom: bool,
}

impl Held {
    fn set(&mut self, seq: u64, p: &TimelinePoint<'_>) {
        self.seq = seq;
        self.x = p.x;
        self.event = p.event;
        self.allocated = p.allocated;
        self.reserved = p.reserved;
        self.active = p.active.unwrap_or(0);
        self.bands.clear();
        self.bands.extend_from_slice(p.bands);
        self.oom = p.oom;
    }
}

/// Builds a [`Timeline`] from a stream of points, keeping at most about
/// `max_points` of them (plus OOM and `keep` points).
#[derive(Debug)]
pub struct TimelineBuilder {
    out: Timeline,
    max_points: usize,
    bucket_len: u64,
    seq: u64,
    has_active: Option<bool>,
    /// Lowest allocated, highest allocated, highest reserved of the open bucket.
    slots: [Option<Held>; 3],
    /// Spare buffers, so that a new low or high does not allocate.
    spare: Vec<Held>,
    forced: Vec<Held>,
    last: Option<Held>,
    kept_seq: Vec<u64>,
}

impl TimelineBuilder {
    /// A builder for about `expected_points` pushes, to be reduced to at most
    /// about `max_points` (at least 16). `sites` are the bands, top site first.
    pub fn new(
        x_unit: XUnit,
        sites: Vec<TimelineSite>,
        expected_points: u64,
        max_points: usize,
    ) -> TimelineBuilder {
        let max_points = max_points.max(16);
        // Three points per bucket, plus the first and the last point.
        let buckets = ((max_points - 2) / 3).max(1) as u64;
        let bucket_len = expected_points.div_ceil(buckets).max(1);
        let n = sites.len();
        TimelineBuilder {
            out: Timeline {
                x_unit,
                sites,
                bands: vec![Vec::new(); n],
                ..Timeline::default()
            },
            max_points,
            bucket_len,
            seq: 0,
            has_active: None,
            slots: [None, None, None],
            spare: Vec::new(),
            forced: Vec::new(),
            last: None,
            kept_seq: Vec::new(),
        }
    }

    fn held(&mut self, seq: u64, p: &TimelinePoint<'_>) -> Held {
        let mut h = self.spare.pop().unwrap_or_default();
        h.set(seq, p);
        h
    }

    fn replace_slot(&mut self, k: usize, seq: u64, p: &TimelinePoint<'_>) {
        match &mut self.slots[k] {
            Some(h) => h.set(seq, p),
            None => self.slots[k] = Some(self.held(seq, p)),
        }
    }

    /// Adds the next point.
    pub fn push(&mut self, p: TimelinePoint<'_>) {
        let seq = self.seq;
        self.seq += 1;
        if self.has_active.is_none() {
            self.has_active = Some(p.active.is_some());
        }
        if seq > 0 && seq.is_multiple_of(self.bucket_len) {
            self.close_bucket();
        }
        if seq == 0 || p.oom || p.keep {
            let h = self.held(seq, &p);
            self.forced.push(h);
        }
        // Strict comparisons keep the first of equal values, so the peak's
        // index is that of its first occurrence, as `memlens peak` reports it.
        if self.slots[0]
            .as_ref()
            .is_none_or(|h| p.allocated < h.allocated)
        {
            self.replace_slot(0, seq, &p);
        }
        if self.slots[1]
            .as_ref()
            .is_none_or(|h| p.allocated > h.allocated)
        {
            self.replace_slot(1, seq, &p);
        }
        if self.slots[2]
            .as_ref()
            .is_none_or(|h| p.reserved > h.reserved)
        {
            self.replace_slot(2, seq, &p);
        }
        match &mut self.last {
            Some(h) => h.set(seq, &p),
            None => self.last = Some(self.held(seq, &p)),
        }
    }

    /// Moves the open bucket's points into the output, in order.
    fn close_bucket(&mut self) {
        let mut pts: Vec<Held> = self.forced.drain(..).collect();
        pts.extend(self.slots.iter_mut().filter_map(Option::take));
        pts.sort_by_key(|h| h.seq);
        pts.dedup_by_key(|h| h.seq);
        for h in pts {
            self.emit(&h);
            self.spare.push(h);
        }
    }

    fn emit(&mut self, h: &Held) {
        if self.kept_seq.last() == Some(&h.seq) {
            return;
        }
        let t = &mut self.out;
        t.x.push(h.x);
        t.event.push(h.event);
        t.allocated.push(h.allocated);
        t.reserved.push(h.reserved);
        if self.has_active == Some(true) {
            t.active.push(h.active);
        }
        let mut sum = 0u64;
        for (k, col) in t.bands.iter_mut().enumerate() {
            let v = h.bands.get(k).copied().unwrap_or(0);
            sum = sum.saturating_add(v);
            col.push(v);
        }
        if !t.bands.is_empty() {
            t.other.push(h.allocated.saturating_sub(sum));
        }
        if h.oom {
            t.ooms.push(t.x.len() - 1);
        }
        self.kept_seq.push(h.seq);
    }

    /// Finishes the timeline: keeps the last point, sets the peak (the first
    /// highest `allocated`) and, if more points came than expected, reduces again.
    pub fn finish(self) -> Timeline {
        self.finish_with_sources().0
    }

    /// Like [`finish`](Self::finish), also returning for each kept point the
    /// position of its push (0-based).
    fn finish_with_sources(mut self) -> (Timeline, Vec<u64>) {
        self.close_bucket();
        if let Some(last) = self.last.take() {
            if self.kept_seq.last() != Some(&last.seq) {
                self.emit(&last);
            }
        }
        let mut t = self.out;
        t.source_points = self.seq;
        t.peak = first_max(&t.allocated);
        let mut sources = self.kept_seq;
        // More pushes than announced make more buckets; bound the result anyway.
        if t.x.len() > self.max_points + t.ooms.len() {
            let (t2, idx) = reduce(&t, self.max_points, &[]);
            sources = idx.iter().map(|&i| sources[i]).collect();
            t = t2;
        }
        (t, sources)
    }
}

/// Index of the first highest value.
fn first_max(v: &[u64]) -> Option<usize> {
    let mut best: Option<(usize, u64)> = None;
    for (i, &x) in v.iter().enumerate() {
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i)
}

/// Reduces `t` to about `max_points` points, keeping the points at `keep`
/// (indices into `t`). Returns the new timeline and, for each of its points,
/// its index in `t`.
fn reduce(t: &Timeline, max_points: usize, keep: &[usize]) -> (Timeline, Vec<usize>) {
    let n = t.x.len();
    let mut b = TimelineBuilder::new(t.x_unit, t.sites.clone(), n as u64, max_points);
    let mut bands = vec![0u64; t.bands.len()];
    let mut keep_sorted: Vec<usize> = keep.to_vec();
    keep_sorted.sort_unstable();
    let mut oom_sorted = t.ooms.clone();
    oom_sorted.sort_unstable();
    for i in 0..n {
        for (k, col) in t.bands.iter().enumerate() {
            bands[k] = col.get(i).copied().unwrap_or(0);
        }
        b.push(TimelinePoint {
            x: t.x[i],
            event: t.event.get(i).copied().unwrap_or(i as u64),
            allocated: t.allocated.get(i).copied().unwrap_or(0),
            reserved: t.reserved.get(i).copied().unwrap_or(0),
            active: if t.active.is_empty() {
                None
            } else {
                Some(t.active.get(i).copied().unwrap_or(0))
            },
            bands: &bands,
            oom: oom_sorted.binary_search(&i).is_ok(),
            keep: keep_sorted.binary_search(&i).is_ok(),
        });
    }
    let (mut out, src) = b.finish_with_sources();
    out.source_points = t.source_points.max(n as u64);
    let src: Vec<usize> = src.into_iter().map(|s| s as usize).collect();
    (out, src)
}

/// Reduces a timeline already in memory to at most about `max_points` points
/// (see the module doc), keeping its peak and OOM points exactly. A timeline
/// that is small enough comes back unchanged.
pub fn downsample_timeline(t: &Timeline, max_points: usize) -> Timeline {
    if t.x.len() <= max_points.max(16) {
        return t.clone();
    }
    let keep: Vec<usize> = t.peak.into_iter().collect();
    let (mut out, src) = reduce(t, max_points, &keep);
    // The caller's peak wins over the recomputed one (it may be a tie broken
    // differently, or the peak of another series).
    if let Some(p) = t.peak {
        if let Ok(j) = src.binary_search(&p) {
            out.peak = Some(j);
        }
    }
    out
}
