//! The allocator's statistics, with the semantics of `torch.cuda.memory_stats()`.

use serde::Serialize;
use std::collections::BTreeMap;

/// One statistic: `{current, peak, allocated, freed}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value seen.
    pub peak: u64,
    /// Sum of all increases.
    pub allocated: u64,
    /// Sum of all decreases.
    pub freed: u64,
}

impl Stat {
    /// Adds `amount` and updates the peak.
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    /// Subtracts `amount`.
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        self.current = self.current.saturating_sub(amount);
        self.freed += amount;
    }
}

/// A statistic kept for all pools together and for each of the two pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatArray {
    /// Both pools (`all`).
    pub all: Stat,
    /// The small pool (`small_pool`).
    pub small_pool: Stat,
    /// The large pool (`large_pool`).
    pub large_pool: Stat,
}

impl StatArray {
    /// Increases `all` and the pool's stat.
    #[inline]
    pub fn increase(&mut self, small: bool, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(small).increase(amount);
    }

    /// Decreases `all` and the pool's stat.
    #[inline]
    pub fn decrease(&mut self, small: bool, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(small).decrease(amount);
    }

    #[inline]
    fn pool_mut(&mut self, small: bool) -> &mut Stat {
        if small {
            &mut self.small_pool
        } else {
            &mut self.large_pool
        }
    }
}

/// Everything `torch.cuda.memory_stats()` reports that the model tracks.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemoryStats {
    /// Live user allocations (`allocation`).
    pub allocation: StatArray,
    /// cudaMalloc segments (`segment`); expandable mappings do not count.
    pub segment: StatArray,
    /// Allocated plus pending-free blocks (`active`).
    pub active: StatArray,
    /// Free blocks in split segments (`inactive_split`).
    pub inactive_split: StatArray,
    /// Bytes in allocated blocks, rounded (`allocated_bytes`).
    pub allocated_bytes: StatArray,
    /// Bytes reserved from CUDA (`reserved_bytes`).
    pub reserved_bytes: StatArray,
    /// Bytes in active blocks (`active_bytes`).
    pub active_bytes: StatArray,
    /// Bytes in free blocks of split segments (`inactive_split_bytes`).
    pub inactive_split_bytes: StatArray,
    /// Requested (unrounded) bytes of active blocks (`requested_bytes`).
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size` (`oversize_allocations`).
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` (`oversize_segments`).
    pub oversize_segments: Stat,
    /// cudaMalloc calls that failed and led to a cache flush and retry.
    pub num_alloc_retries: u64,
    /// Allocations that raised OutOfMemoryError.
    pub num_ooms: u64,
    /// Synchronisations of all streams (`synchronize_and_free_events`).
    pub num_sync_all_streams: u64,
    /// cudaMalloc calls and expandable mappings.
    pub num_device_alloc: u64,
    /// cudaFree calls and expandable unmappings.
    pub num_device_free: u64,
    /// `max_split_size`, -1 when unlimited.
    pub max_split_size: i64,
}

impl MemoryStats {
    /// Every `{current, peak, allocated, freed}` statistic, to act on all alike.
    fn each_stat_mut(&mut self) -> impl Iterator<Item = &mut Stat> {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
        .into_iter()
        .flat_map(|a| [&mut a.all, &mut a.small_pool, &mut a.large_pool])
        .chain([&mut self.oversize_allocations, &mut self.oversize_segments])
    }

    /// `reset_peak_memory_stats`: every peak becomes the current value.
    pub fn reset_peaks(&mut self) {
        for st in self.each_stat_mut() {
            st.peak = st.current;
        }
    }

    /// `reset_accumulated_memory_stats`: zeroes the sums of increases and
    /// decreases and the event counters.
    pub fn reset_accumulated(&mut self) {
        for st in self.each_stat_mut() {
            st.allocated = 0;
            st.freed = 0;
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The stats flattened to the dotted keys of `torch.cuda.memory_stats()`
    /// (`allocated_bytes.all.peak`, `num_ooms`, ...).
    pub fn to_flat_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        let arrays: [(&str, &StatArray); 9] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        let mut put = |prefix: &str, s: &Stat| {
            m.insert(format!("{prefix}.current"), s.current as i64);
            m.insert(format!("{prefix}.peak"), s.peak as i64);
            m.insert(format!("{prefix}.allocated"), s.allocated as i64);
            m.insert(format!("{prefix}.freed"), s.freed as i64);
        };
        for (name, a) in arrays {
            put(&format!("{name}.all"), &a.all);
            put(&format!("{name}.small_pool"), &a.small_pool);
            put(&format!("{name}.large_pool"), &a.large_pool);
        }
        put("oversize_allocations", &self.oversize_allocations);
        put("oversize_segments", &self.oversize_segments);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries as i64);
        m.insert("num_ooms".into(), self.num_ooms as i64);
        m.insert(
            "num_sync_all_streams".into(),
            self.num_sync_all_streams as i64,
        );
        m.insert("num_device_alloc".into(), self.num_device_alloc as i64);
        m.insert("num_device_free".into(), self.num_device_free as i64);
        m.insert("max_split_size".into(), self.max_split_size);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_semantics() {
        let mut s = StatArray::default();
        s.increase(true, 10);
        s.increase(false, 5);
        s.decrease(true, 10);
        assert_eq!(s.all.current, 5);
        assert_eq!(s.all.peak, 15);
        assert_eq!(s.all.allocated, 15);
        assert_eq!(s.all.freed, 10);
        assert_eq!(s.small_pool.peak, 10);
        let m = MemoryStats {
            allocated_bytes: s,
            ..Default::default()
        };
        assert_eq!(m.to_flat_map()["allocated_bytes.all.peak"], 15);
    }

    #[test]
    fn resets_touch_every_stat() {
        let mut m = MemoryStats::default();
        m.segment.increase(false, 3);
        m.segment.decrease(false, 1);
        m.oversize_segments.increase(4);
        m.oversize_segments.decrease(4);
        m.num_ooms = 2;
        m.reset_peaks();
        assert_eq!((m.segment.large_pool.peak, m.segment.all.peak), (2, 2));
        assert_eq!(m.oversize_segments.peak, 0);
        m.reset_accumulated();
        assert_eq!((m.segment.all.allocated, m.segment.all.freed), (0, 0));
        assert_eq!(m.oversize_segments.freed, 0);
        assert_eq!((m.num_ooms, m.segment.all.current), (0, 2));
    }
}
