//! A bounded history of one figure (a process's memory, a GPU's used memory):
//! what the sparklines draw and the growth detector fits.

use std::collections::VecDeque;

/// One point: (Unix seconds, bytes).
pub type Point = (f64, u64);

/// The last `capacity` points of one figure, oldest first.
#[derive(Debug, Clone)]
pub struct Series {
    points: VecDeque<Point>,
    capacity: usize,
}

impl Series {
    /// An empty series keeping at most `capacity` points (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Series {
            points: VecDeque::with_capacity(capacity.min(1024)),
            capacity,
        }
    }

    /// Appends a point, dropping the oldest beyond the capacity.
    pub fn push(&mut self, time: f64, bytes: u64) {
        if self.points.len() == self.capacity {
            self.points.pop_front();
        }
        self.points.push_back((time, bytes));
    }

    /// Number of points held.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when no point is held.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The newest point.
    pub fn last(&self) -> Option<Point> {
        self.points.back().copied()
    }

    /// The points at or after `since`, oldest first.
    pub fn since(&self, since: f64) -> Vec<Point> {
        self.points
            .iter()
            .filter(|(t, _)| *t >= since)
            .copied()
            .collect()
    }

    /// All points, oldest first.
    pub fn points(&self) -> impl Iterator<Item = &Point> {
        self.points.iter()
    }

    /// The values squeezed into at most `width` buckets of consecutive points
    /// (the maximum of each, so a short spike stays visible), oldest first.
    /// With fewer points than `width`, every value, one per bucket.
    pub fn buckets(&self, width: usize) -> Vec<u64> {
        let n = self.points.len();
        if width == 0 || n == 0 {
            return Vec::new();
        }
        if n <= width {
            return self.points.iter().map(|p| p.1).collect();
        }
        (0..width)
            .map(|b| {
                let lo = b * n / width;
                let hi = ((b + 1) * n / width).max(lo + 1);
                self.points
                    .range(lo..hi.min(n))
                    .map(|p| p.1)
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_bucketed() {
        let mut s = Series::new(4);
        for i in 0..6u64 {
            s.push(i as f64, i * 10);
        }
        assert_eq!(s.len(), 4);
        assert_eq!(s.last(), Some((5.0, 50)));
        assert_eq!(s.buckets(10), [20, 30, 40, 50]);
        assert_eq!(s.buckets(2), [30, 50]);
        assert_eq!(s.since(4.0), [(4.0, 40), (5.0, 50)]);
        assert!(Series::new(0).buckets(3).is_empty());
        assert!(s.buckets(0).is_empty());
    }
}
