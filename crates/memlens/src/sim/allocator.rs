//! The caching allocator proper: `DeviceCachingAllocator` of
//! `c10/cuda/CUDACachingAllocator.cpp`, one per device.
//!
//! Blocks live in a slab and link to their neighbours in the segment by index.
//! Each `BlockPool` (small and large, for the default pool and every private
//! pool) keeps its free mapped blocks in a `FreeSet` ordered like
//! `BlockComparatorSize` — (stream, size, address) — so best fit is one
//! range lookup, and its unmapped expandable address space ordered like
//! `BlockComparatorAddress`.

use super::config::AllocatorConfig;
use super::device::Device;
use super::free_set::FreeSet;
use super::rounding::{
    allocation_size, is_small, round_size, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE,
};
use super::stats::MemoryStats;
use std::collections::BTreeMap;

/// "No block" in the slab links.
pub(crate) const NIL: u32 = u32::MAX;

/// The default memory pool's index; private pools get 1, 2, ...
pub const DEFAULT_POOL: u16 = 0;

/// A block handed out by [`Allocator::malloc`]. It stays valid until the block
/// is freed (`free_completed`); a stale handle is refused, never misread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    index: u32,
    gen: u32,
}

/// State of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockStatus {
    /// In the pool (or unmapped address space).
    Free,
    /// Held by the user.
    Allocated,
    /// Freed by the user, waiting for other streams (`record_stream`).
    PendingFree,
}

#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) requested: u64,
    pub(crate) stream: u64,
    pub(crate) tag: u64,
    gc_count_base: i64,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    pub(crate) seg: u32,
    gen: u32,
    pending_pos: u32,
    pub(crate) pool: u16,
    pub(crate) status: BlockStatus,
    pub(crate) mapped: bool,
    live: bool,
}

impl Block {
    pub(crate) fn is_live(&self) -> bool {
        self.live
    }
}

/// A cudaMalloc'ed segment, or the address space of one expandable segment.
#[derive(Clone, Debug)]
pub(crate) struct SegmentRec {
    pub(crate) addr: u64,
    /// Bytes (the whole reserved address space for expandable segments).
    pub(crate) size: u64,
    pub(crate) head: u32,
    pub(crate) stream: u64,
    pub(crate) pool: u16,
    /// Page size for expandable segments; 0 for cudaMalloc segments.
    pub(crate) page: u64,
    live: bool,
}

impl SegmentRec {
    pub(crate) fn is_expandable(&self) -> bool {
        self.page != 0
    }
}

type AddrKey = (u64, u64);

#[derive(Clone, Debug, Default)]
pub(crate) struct BlockPool {
    pub(crate) is_small: bool,
    pub(crate) blocks: FreeSet,
    pub(crate) unmapped: BTreeMap<AddrKey, u32>,
    get_free_blocks_call_count: i64,
}

/// Limits of the device the model runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceLimits {
    /// Total memory of the GPU (`totalGlobalMem`), when known. It sizes the
    /// memory-fraction limit and the address space of expandable segments.
    pub total_memory: Option<u64>,
}

/// Why an allocation failed: what PyTorch puts in the `oom` trace entry and
/// the `OutOfMemoryError` text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OomInfo {
    /// The rounded request (the trace's `oom.size`).
    pub size: u64,
    /// The segment that could not be made ("Tried to allocate").
    pub alloc_size: u64,
    /// Stream of the request.
    pub stream: u64,
    /// Allocated bytes when it failed.
    pub allocated_bytes: u64,
    /// Reserved bytes when it failed.
    pub reserved_bytes: u64,
    /// The largest free block on the request's stream and pool.
    pub largest_free_block: u64,
}

/// One device's caching allocator.
#[derive(Clone, Debug)]
pub struct Allocator {
    pub(crate) config: AllocatorConfig,
    allowed_memory_maximum: Option<u64>,
    va_per_expandable: u64,
    pub(crate) blocks: Vec<Block>,
    free_slots: Vec<u32>,
    pub(crate) segs: Vec<SegmentRec>,
    free_segs: Vec<u32>,
    /// Non-expandable segments and expandable address spaces by address.
    pub(crate) seg_index: BTreeMap<u64, u32>,
    pub(crate) pools: Vec<BlockPool>,
    mempool_ids: Vec<(i64, i64)>,
    pending: Vec<u32>,
    total_allocated_memory: u64,
    pub(crate) stats: MemoryStats,
}

/// Parameters of one `malloc`, as `AllocParams`.
#[derive(Clone, Copy)]
struct Params {
    size: u64,
    stream: u64,
    pool: u16,
    alloc_size: u64,
    expandable: bool,
}

impl Allocator {
    /// A fresh allocator (no segments) with these settings.
    pub fn new(config: AllocatorConfig, limits: DeviceLimits) -> Allocator {
        let allowed_memory_maximum = match (config.per_process_memory_fraction, limits.total_memory)
        {
            (Some(f), Some(total)) if f < 1.0 => Some((f * total as f64) as u64),
            _ => None,
        };
        // 1 1/8 of the GPU, as `ExpandableSegment` reserves; 1 TiB when the
        // GPU is unknown (only the relative size matters then).
        let total = limits.total_memory.unwrap_or(1 << 40);
        let va_per_expandable = total + total / 8;
        let stats = MemoryStats {
            max_split_size: config.max_split_size.map_or(-1, |v| v as i64),
            ..Default::default()
        };
        Allocator {
            config,
            allowed_memory_maximum,
            va_per_expandable,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            segs: Vec::new(),
            free_segs: Vec::new(),
            seg_index: BTreeMap::new(),
            pools: vec![
                BlockPool {
                    is_small: true,
                    ..Default::default()
                },
                BlockPool::default(),
            ],
            mempool_ids: vec![(0, 0)],
            pending: Vec::new(),
            total_allocated_memory: 0,
            stats,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The statistics, as `torch.cuda.memory_stats()`.
    pub fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    /// The memory-fraction limit in bytes (`allowed_memory_maximum`), if any.
    pub fn allowed_memory_maximum(&self) -> Option<u64> {
        self.allowed_memory_maximum
    }

    /// Sets the memory-fraction limit directly (`set_per_process_memory_fraction`
    /// times the GPU's memory); `None` removes it.
    pub fn set_allowed_memory_maximum(&mut self, bytes: Option<u64>) {
        self.allowed_memory_maximum = bytes;
    }

    /// Resets the peaks to the current values (`reset_peak_memory_stats`).
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    /// Zeroes the accumulated figures and counters
    /// (`reset_accumulated_memory_stats`).
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// The index of a memory pool by its `MempoolId_t`; `(0, 0)` is the
    /// default pool. Private pools are created on first use.
    pub fn mempool(&mut self, id: (i64, i64)) -> u16 {
        if let Some(i) = self.mempool_ids.iter().position(|p| *p == id) {
            return i as u16;
        }
        self.mempool_ids.push(id);
        self.pools.push(BlockPool {
            is_small: true,
            ..Default::default()
        });
        self.pools.push(BlockPool::default());
        (self.mempool_ids.len() - 1) as u16
    }

    /// The `MempoolId_t` of a pool index.
    pub fn mempool_id(&self, pool: u16) -> (i64, i64) {
        self.mempool_ids
            .get(pool as usize)
            .copied()
            .unwrap_or((0, 0))
    }

    // ----- slab -----

    fn new_block(&mut self, addr: u64, size: u64, stream: u64, pool: u16, seg: u32) -> u32 {
        let b = Block {
            addr,
            size,
            requested: 0,
            stream,
            tag: 0,
            gc_count_base: 0,
            prev: NIL,
            next: NIL,
            seg,
            gen: 0,
            pending_pos: NIL,
            pool,
            status: BlockStatus::Free,
            mapped: true,
            live: true,
        };
        if let Some(i) = self.free_slots.pop() {
            let gen = self.blocks[i as usize].gen.wrapping_add(1);
            self.blocks[i as usize] = Block { gen, ..b };
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    fn delete_block(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.live = false;
        self.free_slots.push(id);
    }

    fn new_seg(&mut self, rec: SegmentRec) -> u32 {
        let addr = rec.addr;
        let id = if let Some(i) = self.free_segs.pop() {
            self.segs[i as usize] = rec;
            i
        } else {
            self.segs.push(rec);
            (self.segs.len() - 1) as u32
        };
        self.seg_index.insert(addr, id);
        id
    }

    fn delete_seg(&mut self, id: u32) {
        let s = &mut self.segs[id as usize];
        s.live = false;
        let addr = s.addr;
        self.seg_index.remove(&addr);
        self.free_segs.push(id);
    }

    #[inline]
    pub(crate) fn b(&self, id: u32) -> &Block {
        &self.blocks[id as usize]
    }

    #[inline]
    fn bm(&mut self, id: u32) -> &mut Block {
        &mut self.blocks[id as usize]
    }

    #[inline]
    fn is_split(&self, id: u32) -> bool {
        let b = self.b(id);
        b.prev != NIL || b.next != NIL
    }

    #[inline]
    fn is_expandable_block(&self, id: u32) -> bool {
        self.segs[self.b(id).seg as usize].page != 0
    }

    /// The `BlockPool` index of memory pool `pool` (default when unknown).
    fn pool_index(&self, pool: u16, small: bool) -> u16 {
        let i = pool as usize * 2 + usize::from(!small);
        if i < self.pools.len() {
            i as u16
        } else {
            u16::from(!small)
        }
    }

    fn pool_small(&self, pool: u16) -> bool {
        self.pools[pool as usize].is_small
    }

    /// The block behind a handle, if the handle is still valid.
    fn resolve(&self, h: Handle) -> Option<u32> {
        let b = self.blocks.get(h.index as usize)?;
        (b.live && b.gen == h.gen).then_some(h.index)
    }

    fn handle(&self, id: u32) -> Handle {
        Handle {
            index: id,
            gen: self.b(id).gen,
        }
    }

    /// Address, rounded size and requested size of a live handle.
    pub fn block_info(&self, h: Handle) -> Option<(u64, u64, u64)> {
        self.resolve(h).map(|id| {
            let b = self.b(id);
            (b.addr, b.size, b.requested)
        })
    }

    /// The status of a handle's block, `None` once it is free.
    pub fn status(&self, h: Handle) -> Option<BlockStatus> {
        self.resolve(h)
            .map(|id| self.b(id).status)
            .filter(|s| *s != BlockStatus::Free)
    }

    // ----- pool sets -----

    /// `insert_into_blocks`: into the free set, stamping the GC age base.
    fn insert_free(&mut self, id: u32) {
        let pool = self.b(id).pool as usize;
        let count = self.pools[pool].get_free_blocks_call_count;
        let b = self.bm(id);
        b.gc_count_base = count;
        let (stream, size, addr) = (b.stream, b.size, b.addr);
        self.pools[pool].blocks.insert(stream, size, addr, id);
    }

    fn remove_free(&mut self, id: u32) {
        let b = self.b(id);
        let (stream, size, addr, pool) = (b.stream, b.size, b.addr, b.pool as usize);
        self.pools[pool].blocks.remove(stream, size, addr);
    }

    fn insert_unmapped(&mut self, id: u32) {
        let b = self.b(id);
        let key = (b.stream, b.addr);
        let pool = b.pool as usize;
        self.pools[pool].unmapped.insert(key, id);
    }

    fn remove_unmapped(&mut self, id: u32) {
        let b = self.b(id);
        let key = (b.stream, b.addr);
        let pool = b.pool as usize;
        self.pools[pool].unmapped.remove(&key);
    }

    // ----- malloc -----

    /// `malloc(orig_size, stream)`: finds or makes a block for a request of
    /// `orig_size` bytes on `stream` in memory pool `pool` ([`DEFAULT_POOL`]
    /// or one from [`Allocator::mempool`]). `tag` is kept with the block for
    /// the caller (replay stores the event index and stack there).
    pub fn malloc(
        &mut self,
        orig_size: u64,
        stream: u64,
        pool: u16,
        tag: u64,
        dev: &mut dyn Device,
    ) -> Result<Handle, OomInfo> {
        let p = self.params(orig_size, stream, pool);
        let (size, pool_index, expandable) = (p.size, p.pool, p.expandable);
        let mut found = self.get_free_block(&p);
        if found.is_none() {
            if self.allowed_memory_maximum.is_some()
                && self.config.garbage_collection_threshold > 0.0
            {
                self.garbage_collect_cached_blocks(dev);
            }
            found = self.alloc_block(&p, false, dev);
            if found.is_none() && self.release_available_cached_blocks(&p, dev) {
                found = self.alloc_block(&p, false, dev);
            }
            if found.is_none() {
                self.release_cached_blocks(dev);
                found = self.alloc_block(&p, true, dev);
            }
        }
        let Some(block) = found else {
            self.stats.num_ooms += 1;
            return Err(OomInfo {
                size,
                alloc_size: p.alloc_size,
                stream,
                allocated_bytes: self.stats.allocated_bytes.all.current,
                reserved_bytes: self.stats.reserved_bytes.all.current,
                largest_free_block: self.largest_free_on(stream, pool_index),
            });
        };
        let split = self.should_split(block, size, expandable);
        let id = self.alloc_found_block(block, &p, orig_size, split, tag);
        Ok(self.handle(id))
    }

    /// Records an OOM seen in a trace without modelling it (`num_ooms`).
    pub fn count_oom(&mut self) {
        self.stats.num_ooms += 1;
    }

    /// Records a cache flush and cudaMalloc retry seen in a trace
    /// (`num_alloc_retries`, and the stream sync the flush does).
    pub fn count_retry(&mut self) {
        self.stats.num_alloc_retries += 1;
        self.stats.num_sync_all_streams += 1;
    }

    fn largest_free_on(&self, stream: u64, pool: u16) -> u64 {
        self.pools[pool as usize]
            .blocks
            .largest_on(stream)
            .map_or(0, |e| e.size)
    }

    /// `get_free_block`: best fit by (stream, size, address), with the
    /// expandable and oversize rules.
    fn get_free_block(&mut self, p: &Params) -> Option<u32> {
        let gc =
            self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0;
        if gc {
            self.pools[p.pool as usize].get_free_blocks_call_count += 1;
        }
        let chosen = self.find_free_block(p)?;
        self.remove_free(chosen);
        Some(chosen)
    }

    /// The search of `get_free_block`, without taking the block.
    fn find_free_block(&self, p: &Params) -> Option<u32> {
        let max_split = self.config.max_split();
        let pool = &self.pools[p.pool as usize];
        let mut it = pool.blocks.at_least(p.stream, p.size).map(|e| e.id);
        let first = it.next()?;
        let mut chosen = first;
        if self.is_expandable_block(first) {
            if p.expandable {
                // Best fit counts the unmapped space after a block as part of
                // it, so a block that can grow is taken only after smaller ones.
                for next in it {
                    if !self.is_expandable_block(chosen)
                        || self.expandable_size(next) >= self.expandable_size(chosen)
                    {
                        break;
                    }
                    chosen = next;
                }
            } else {
                // Expandable segments were turned off: only plain blocks.
                chosen = it.find(|&next| !self.is_expandable_block(next))?;
            }
        }
        let bsize = self.b(chosen).size;
        if p.size < max_split && bsize >= max_split {
            return None;
        }
        if p.size >= max_split && bsize >= p.size.saturating_add(self.config.max_non_split_rounding)
        {
            return None;
        }
        Some(chosen)
    }

    /// Whether a request of `orig_size` bytes on `stream` would be served
    /// from the cache now, without a new segment (changes nothing).
    pub fn would_reuse(&self, orig_size: u64, stream: u64, pool: u16) -> bool {
        let p = self.params(orig_size, stream, pool);
        self.find_free_block(&p).is_some()
    }

    fn params(&self, orig_size: u64, stream: u64, pool: u16) -> Params {
        let size = round_size(&self.config, orig_size);
        let expandable = self.config.expandable_segments
            && (pool == DEFAULT_POOL || self.config.version.expandable_private_pools());
        Params {
            size,
            stream,
            pool: self.pool_index(pool, is_small(size)),
            alloc_size: allocation_size(&self.config, size),
            expandable,
        }
    }

    fn expandable_size(&self, id: u32) -> u64 {
        let b = self.b(id);
        let extra = if b.next != NIL && !self.b(b.next).mapped {
            self.b(b.next).size
        } else {
            0
        };
        b.size + extra
    }

    fn should_split(&self, id: u32, size: u64, expandable: bool) -> bool {
        let b = self.b(id);
        let remaining = b.size - size;
        if self.pool_small(b.pool) || expandable {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split() && remaining > SMALL_SIZE
        }
    }

    fn alloc_found_block(
        &mut self,
        id: u32,
        p: &Params,
        orig_size: u64,
        split: bool,
        tag: u64,
    ) -> u32 {
        let small = self.pool_small(p.pool);
        let already_split = self.is_split(id);
        let expandable = self.is_expandable_block(id);
        let mut block = id;
        if split {
            let remaining = id;
            let (addr, prev, seg, stream) = {
                let r = self.b(remaining);
                (r.addr, r.prev, r.seg, r.stream)
            };
            block = self.new_block(addr, p.size, stream, p.pool, seg);
            {
                let n = self.bm(block);
                n.prev = prev;
                n.next = remaining;
            }
            if prev != NIL {
                self.bm(prev).next = block;
            } else {
                self.segs[seg as usize].head = block;
            }
            {
                let r = self.bm(remaining);
                r.prev = block;
                r.addr += p.size;
                r.size -= p.size;
            }
            self.insert_free(remaining);
            if !expandable {
                if already_split {
                    self.stats.inactive_split_bytes.decrease(small, p.size);
                } else {
                    let rsize = self.b(remaining).size;
                    self.stats.inactive_split_bytes.increase(small, rsize);
                    self.stats.inactive_split.increase(small, 1);
                }
            }
        } else if already_split && !expandable {
            let size = self.b(block).size;
            self.stats.inactive_split_bytes.decrease(small, size);
            self.stats.inactive_split.decrease(small, 1);
        }
        let size = {
            let b = self.bm(block);
            b.status = BlockStatus::Allocated;
            b.requested = orig_size;
            b.tag = tag;
            b.size
        };
        let st = &mut self.stats;
        st.allocation.increase(small, 1);
        st.allocated_bytes.increase(small, size);
        st.active.increase(small, 1);
        st.active_bytes.increase(small, size);
        st.requested_bytes.increase(small, orig_size);
        if size >= self.config.max_split() {
            st.oversize_allocations.increase(1);
        }
        block
    }

    /// `alloc_block`: a new segment (or mapped pages) for the request.
    fn alloc_block(&mut self, p: &Params, is_retry: bool, dev: &mut dyn Device) -> Option<u32> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(max) = self.allowed_memory_maximum {
            if self.total_allocated_memory.saturating_add(p.alloc_size) > max {
                return None;
            }
        }
        if p.expandable {
            return self.try_allocate_expandable_block(p, dev);
        }
        let size = p.alloc_size;
        let addr = dev.malloc(size)?;
        Some(self.add_segment(addr, size, p.stream, p.pool))
    }

    /// Makes a whole free segment block (not in the pool) and counts it.
    fn add_segment(&mut self, addr: u64, size: u64, stream: u64, pool: u16) -> u32 {
        let seg = self.new_seg(SegmentRec {
            addr,
            size,
            head: NIL,
            stream,
            pool,
            page: 0,
            live: true,
        });
        let id = self.new_block(addr, size, stream, pool, seg);
        self.segs[seg as usize].head = id;
        self.total_allocated_memory += size;
        let small = self.pool_small(pool);
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, size);
        if size >= self.config.max_split() {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        id
    }

    /// `release_block`: cudaFree of a whole free segment.
    fn release_block(&mut self, id: u32, dev: &mut dyn Device) {
        let (addr, size, pool, seg) = {
            let b = self.b(id);
            (b.addr, b.size, b.pool, b.seg)
        };
        self.stats.num_device_free += 1;
        dev.free(addr, size);
        self.total_allocated_memory = self.total_allocated_memory.saturating_sub(size);
        let small = self.pool_small(pool);
        self.stats.segment.decrease(small, 1);
        self.stats.reserved_bytes.decrease(small, size);
        if size >= self.config.max_split() {
            self.stats.oversize_segments.decrease(1);
        }
        self.remove_free(id);
        self.delete_block(id);
        self.delete_seg(seg);
    }

    /// `release_available_cached_blocks`: frees one big enough oversize
    /// segment, or several oversize ones largest first.
    fn release_available_cached_blocks(&mut self, p: &Params, dev: &mut dyn Device) -> bool {
        let max_split = self.config.max_split();
        if max_split == u64::MAX {
            return false;
        }
        let key_size = p.size.max(max_split);
        let pool = &self.pools[p.pool as usize];
        let hit = pool.blocks.at_least(p.stream, key_size).next();
        match hit {
            // Expandable blocks are never released here (newer builds skip
            // them; older ones had no expandable blocks in this path).
            Some(e) if !self.is_expandable_block(e.id) => {
                self.release_block(e.id, dev);
                true
            }
            _ => {
                let mut total = 0u64;
                let mut to_release = Vec::new();
                for e in pool.blocks.below(p.stream, key_size) {
                    if total >= key_size || e.size < max_split {
                        break;
                    }
                    if !self.is_expandable_block(e.id) {
                        total += e.size;
                        to_release.push(e.id);
                    }
                }
                for id in to_release {
                    self.release_block(id, dev);
                }
                total >= key_size
            }
        }
    }

    /// `release_cached_blocks` for the default pool: completes pending frees,
    /// then frees every whole free segment and unmaps free expandable pages.
    fn release_cached_blocks(&mut self, dev: &mut dyn Device) {
        self.synchronize_and_free_events();
        self.release_blocks(1, dev);
        self.release_blocks(0, dev);
    }

    /// `emptyCache()`: returns every whole free segment (and free expandable
    /// page) of the default pool to the device.
    pub fn empty_cache(&mut self, dev: &mut dyn Device) {
        self.release_cached_blocks(dev);
    }

    fn release_blocks(&mut self, pool: u16, dev: &mut dyn Device) {
        let ids = self.pools[pool as usize].blocks.ids();
        let mut to_unmap = Vec::new();
        for id in ids {
            if self.is_expandable_block(id) {
                to_unmap.push(id);
            } else if !self.is_split(id) {
                self.release_block(id, dev);
            }
        }
        for id in to_unmap {
            // Earlier unmaps only merge unmapped neighbours, never a block
            // still waiting here, so `id` is live.
            self.unmap_block(id, dev);
            if !self.is_split(id) {
                self.release_expandable_segment(id, dev);
            }
        }
    }

    fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        while let Some(&id) = self.pending.last() {
            self.free_block(id);
        }
    }

    /// `garbage_collect_cached_blocks`: frees whole large segments that have
    /// waited longest, only with a memory fraction and a threshold set.
    fn garbage_collect_cached_blocks(&mut self, dev: &mut dyn Device) {
        let Some(max) = self.allowed_memory_maximum else {
            return;
        };
        let threshold = (self.config.garbage_collection_threshold * max as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return;
        }
        let target = self.total_allocated_memory - threshold;
        let large = 1usize;
        let count = self.pools[large].get_free_blocks_call_count;
        let mut total_age: i64 = 0;
        let mut freeable: i64 = 0;
        for id in self.pools[large].blocks.iter().map(|e| e.id) {
            if !self.is_split(id) {
                total_age += count - self.b(id).gc_count_base;
                freeable += 1;
            }
        }
        if freeable == 0 {
            return;
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            freed = false;
            let ids = self.pools[large].blocks.ids();
            for id in ids {
                let age = count - self.b(id).gc_count_base;
                // `release_block` cannot free expandable blocks; newer builds
                // skip them explicitly, older ones never had them here.
                if !self.is_split(id)
                    && !self.is_expandable_block(id)
                    && age as f64 >= age_threshold
                {
                    freed = true;
                    reclaimed += self.b(id).size;
                    total_age -= age;
                    freeable -= 1;
                    self.release_block(id, dev);
                }
            }
        }
    }

    // ----- free -----

    /// `free()` up to `free_requested`: the block stops counting as allocated
    /// but stays active until [`Allocator::free_completed`].
    /// Returns `false` for a stale handle or a block not allocated.
    pub fn free_requested(&mut self, h: Handle) -> bool {
        let Some(id) = self.resolve(h) else {
            return false;
        };
        if self.b(id).status != BlockStatus::Allocated {
            return false;
        }
        let small = self.pool_small(self.b(id).pool);
        let size = self.b(id).size;
        self.bm(id).status = BlockStatus::PendingFree;
        let pos = self.pending.len() as u32;
        self.bm(id).pending_pos = pos;
        self.pending.push(id);
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size);
        if size >= self.config.max_split() {
            self.stats.oversize_allocations.decrease(1);
        }
        true
    }

    /// `free_block` (`free_completed`): the block returns to its pool and
    /// merges with free neighbours. Requests the free first if needed.
    /// Returns `false` for a stale handle (already completed).
    pub fn free_completed(&mut self, h: Handle) -> bool {
        let Some(id) = self.resolve(h) else {
            return false;
        };
        match self.b(id).status {
            BlockStatus::Free => return false,
            BlockStatus::Allocated => {
                self.free_requested(h);
            }
            BlockStatus::PendingFree => {}
        }
        self.free_block(id);
        true
    }

    /// Both halves of `free()` for a block with no other streams.
    pub fn free(&mut self, h: Handle) -> bool {
        self.free_completed(h)
    }

    fn unpend(&mut self, id: u32) {
        let pos = self.b(id).pending_pos;
        if pos == NIL {
            return;
        }
        let pos = pos as usize;
        self.pending.swap_remove(pos);
        if let Some(&moved) = self.pending.get(pos) {
            self.bm(moved).pending_pos = pos as u32;
        }
        self.bm(id).pending_pos = NIL;
    }

    fn free_block(&mut self, id: u32) {
        self.unpend(id);
        let (orig_size, requested, pool, prev, next) = {
            let b = self.b(id);
            (b.size, b.requested, b.pool, b.prev, b.next)
        };
        self.bm(id).status = BlockStatus::Free;
        let small = self.pool_small(pool);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for cand in [prev, next] {
            let sub = self.try_merge_blocks(id, cand);
            if sub > 0 {
                net_blocks -= 1;
                net_bytes -= sub as i64;
            }
        }
        self.insert_free(id);
        if self.is_split(id) {
            net_blocks += 1;
            net_bytes += self.b(id).size as i64;
        }
        let st = &mut self.stats;
        if !self.segs[self.blocks[id as usize].seg as usize].is_expandable() {
            if net_blocks > 0 {
                st.inactive_split.increase(small, net_blocks as u64);
            } else if net_blocks < 0 {
                st.inactive_split.decrease(small, (-net_blocks) as u64);
            }
            if net_bytes > 0 {
                st.inactive_split_bytes.increase(small, net_bytes as u64);
            } else if net_bytes < 0 {
                st.inactive_split_bytes.decrease(small, (-net_bytes) as u64);
            }
        }
        st.active.decrease(small, 1);
        st.active_bytes.decrease(small, orig_size);
        st.requested_bytes.decrease(small, requested);
    }

    /// `try_merge_blocks`: `dst` absorbs `src` when `src` is free and mapped
    /// alike; returns the bytes absorbed.
    fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let (s_status, s_mapped, s_size, s_addr, s_prev, s_next) = {
            let s = self.b(src);
            (s.status, s.mapped, s.size, s.addr, s.prev, s.next)
        };
        if s_status != BlockStatus::Free || s_mapped != self.b(dst).mapped {
            return 0;
        }
        if s_mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        if self.b(dst).prev == src {
            let seg = self.b(dst).seg;
            let d = self.bm(dst);
            d.addr = s_addr;
            d.prev = s_prev;
            if s_prev != NIL {
                self.bm(s_prev).next = dst;
            } else {
                self.segs[seg as usize].head = dst;
            }
        } else {
            self.bm(dst).next = s_next;
            if s_next != NIL {
                self.bm(s_next).prev = dst;
            }
        }
        self.bm(dst).size += s_size;
        self.delete_block(src);
        s_size
    }

    // ----- expandable segments -----

    /// `find_expandable_block`: the lowest address on this stream where free
    /// and unmapped space adds up to `size`, or a new expandable segment.
    fn find_expandable_block(&mut self, p: &Params, dev: &mut dyn Device) -> u32 {
        let allocatable = |a: &Allocator, id: u32| id != NIL && a.b(id).status == BlockStatus::Free;
        let pool = &self.pools[p.pool as usize];
        for (&(s, _), &c) in pool.unmapped.range((p.stream, 0)..) {
            if s != p.stream {
                break;
            }
            let mut c = c;
            let prev = self.b(c).prev;
            if allocatable(self, prev) {
                c = prev;
            }
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < p.size && allocatable(self, b) {
                bytes += self.b(b).size;
                b = self.b(b).next;
            }
            if bytes >= p.size {
                return c;
            }
        }
        let page = if self.pool_small(p.pool) {
            SMALL_BUFFER
        } else {
            self.config.large_segment_size
        };
        let size = self.va_per_expandable.div_ceil(page) * page;
        let base = dev.reserve(size);
        self.new_expandable(base, size, page, p.stream, p.pool)
    }

    /// A new expandable segment: one unmapped block over its address space.
    fn new_expandable(&mut self, base: u64, size: u64, page: u64, stream: u64, pool: u16) -> u32 {
        // With recorded addresses the real reservation size is unknown: keep
        // address spaces from overlapping, which would misattribute addresses.
        let mut size = size;
        if let Some((&next, _)) = self.seg_index.range(base.saturating_add(1)..).next() {
            size = size.min(next - base);
        }
        self.clip_expandable_before(base);
        let seg = self.new_seg(SegmentRec {
            addr: base,
            size,
            head: NIL,
            stream,
            pool,
            page,
            live: true,
        });
        let id = self.new_block(base, size, stream, pool, seg);
        self.segs[seg as usize].head = id;
        self.bm(id).mapped = false;
        self.insert_unmapped(id);
        id
    }

    /// Ends the expandable address space that contains `base` just before
    /// it, when only its unmapped tail lies beyond.
    fn clip_expandable_before(&mut self, base: u64) {
        let Some(seg) = self.seg_containing(base) else {
            return;
        };
        if !self.segs[seg as usize].is_expandable() {
            return;
        }
        let Some(id) = self.block_containing(base) else {
            return;
        };
        let (addr, next, prev, mapped) = {
            let b = self.b(id);
            (b.addr, b.next, b.prev, b.mapped)
        };
        if mapped || next != NIL || self.b(id).status != BlockStatus::Free {
            return;
        }
        if addr < base {
            self.bm(id).size = base - addr;
        } else {
            if prev == NIL {
                return;
            }
            self.remove_unmapped(id);
            self.bm(prev).next = NIL;
            self.delete_block(id);
        }
        let s = &mut self.segs[seg as usize];
        s.size = base - s.addr;
    }

    /// `map_block`: maps whole pages covering `[addr, addr + size)` at the
    /// start of unmapped block `id`, merges with free neighbours.
    fn map_block(&mut self, id: u32, size: u64, dev: &mut dyn Device) -> bool {
        let (addr, bsize, seg) = {
            let b = self.b(id);
            (b.addr, b.size, b.seg)
        };
        let (base, page) = {
            let s = &self.segs[seg as usize];
            (s.addr, s.page)
        };
        let begin = (addr - base) / page;
        let end = (addr + size - base).div_ceil(page);
        if end <= begin {
            return false;
        }
        let mapped = (end - begin) * page;
        if !dev.map(addr, mapped) {
            return false;
        }
        self.remove_unmapped(id);
        self.bm(id).mapped = true;
        if mapped < bsize {
            let (stream, pool, next) = {
                let b = self.b(id);
                (b.stream, b.pool, b.next)
            };
            let rem = self.new_block(addr + mapped, bsize - mapped, stream, pool, seg);
            self.bm(rem).mapped = false;
            self.bm(rem).prev = id;
            self.bm(rem).next = next;
            if next != NIL {
                self.bm(next).prev = rem;
            }
            self.bm(id).next = rem;
            self.bm(id).size = mapped;
            self.insert_unmapped(rem);
        }
        let prev = self.b(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.b(id).next;
        self.try_merge_blocks(id, next);
        self.insert_free(id);
        self.total_allocated_memory += mapped;
        let small = self.pool_small(self.b(id).pool);
        self.stats.reserved_bytes.increase(small, mapped);
        self.stats.num_device_alloc += 1;
        true
    }

    /// `try_allocate_expandable_block`.
    fn try_allocate_expandable_block(&mut self, p: &Params, dev: &mut dyn Device) -> Option<u32> {
        let mut c = self.find_expandable_block(p, dev);
        if !self.b(c).mapped {
            let size = self.b(c).size.min(p.size);
            if !self.map_block(c, size, dev) {
                return None;
            }
        }
        while self.b(c).size < p.size {
            let remaining = p.size - self.b(c).size;
            let nc = self.b(c).next;
            if nc == NIL {
                return None;
            }
            let size = remaining.min(self.b(nc).size);
            if !self.map_block(nc, size, dev) {
                return None;
            }
            c = nc;
        }
        self.remove_free(c);
        Some(c)
    }

    /// `unmap_block`: unmaps the whole pages inside free block `id`.
    fn unmap_block(&mut self, id: u32, dev: &mut dyn Device) {
        let (addr, size, seg) = {
            let b = self.b(id);
            (b.addr, b.size, b.seg)
        };
        let (base, page) = {
            let s = &self.segs[seg as usize];
            (s.addr, s.page)
        };
        let begin = (addr - base).div_ceil(page);
        let end = (addr + size - base) / page;
        if begin >= end {
            return;
        }
        self.unmap_range_of(id, base + begin * page, (end - begin) * page, dev);
    }

    /// Unmaps `[ptr, ptr + len)` (whole pages) out of free mapped block `id`.
    fn unmap_range_of(&mut self, id: u32, ptr: u64, len: u64, dev: &mut dyn Device) {
        self.remove_free(id);
        let (addr, size, stream, pool, seg, prev, next) = {
            let b = self.b(id);
            (b.addr, b.size, b.stream, b.pool, b.seg, b.prev, b.next)
        };
        let before = ptr - addr;
        if before > 0 {
            let bf = self.new_block(addr, before, stream, pool, seg);
            self.bm(bf).prev = prev;
            self.bm(bf).next = id;
            if prev != NIL {
                self.bm(prev).next = bf;
            } else {
                self.segs[seg as usize].head = bf;
            }
            self.bm(id).prev = bf;
            self.insert_free(bf);
        }
        let after = size - before - len;
        if after > 0 {
            let af = self.new_block(ptr + len, after, stream, pool, seg);
            self.bm(af).prev = id;
            self.bm(af).next = next;
            if next != NIL {
                self.bm(next).prev = af;
            }
            self.bm(id).next = af;
            self.insert_free(af);
        }
        {
            let b = self.bm(id);
            b.addr = ptr;
            b.size = len;
            b.mapped = false;
        }
        let prev = self.b(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.b(id).next;
        self.try_merge_blocks(id, next);
        self.insert_unmapped(id);
        dev.unmap(ptr, len);
        self.total_allocated_memory = self.total_allocated_memory.saturating_sub(len);
        let small = self.pool_small(pool);
        self.stats.reserved_bytes.decrease(small, len);
        self.stats.num_device_free += 1;
    }

    fn release_expandable_segment(&mut self, id: u32, dev: &mut dyn Device) {
        let (seg, addr, size) = {
            let b = self.b(id);
            (b.seg, b.addr, b.size)
        };
        self.remove_unmapped(id);
        self.delete_block(id);
        self.delete_seg(seg);
        dev.release_reservation(addr, size);
    }

    // ----- forced operations (replay) -----

    /// The segment (or expandable address space) containing `addr`.
    pub(crate) fn seg_containing(&self, addr: u64) -> Option<u32> {
        let (_, &seg) = self.seg_index.range(..=addr).next_back()?;
        let s = &self.segs[seg as usize];
        (addr < s.addr + s.size).then_some(seg)
    }

    /// The block containing `addr`, walking its segment.
    pub(crate) fn block_containing(&self, addr: u64) -> Option<u32> {
        let seg = self.seg_containing(addr)?;
        let mut id = self.segs[seg as usize].head;
        while id != NIL {
            let b = self.b(id);
            if addr >= b.addr && addr < b.addr + b.size {
                return Some(id);
            }
            id = b.next;
        }
        None
    }

    /// Adds a whole free cudaMalloc segment at a known address, as the trace
    /// recorded it (`segment_alloc` with no allocation to explain it).
    pub fn insert_segment(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        pool: u16,
        small: bool,
    ) -> bool {
        if size == 0
            || self.seg_containing(addr).is_some()
            || self.seg_containing(addr + size - 1).is_some()
        {
            return false;
        }
        let pool_index = self.pool_index(pool, small);
        let id = self.add_segment(addr, size, stream, pool_index);
        self.insert_free(id);
        true
    }

    /// Frees the whole free segment at `addr` (a recorded `segment_free`).
    /// Returns `false` when there is no such segment or it is in use.
    pub fn release_segment_at(&mut self, addr: u64, dev: &mut dyn Device) -> bool {
        let Some(&seg) = self.seg_index.get(&addr) else {
            return false;
        };
        let s = &self.segs[seg as usize];
        if s.is_expandable() {
            return false;
        }
        let head = s.head;
        let b = self.b(head);
        if b.prev != NIL || b.next != NIL || b.status != BlockStatus::Free {
            return false;
        }
        self.release_block(head, dev);
        true
    }

    /// Unmaps `[addr, addr + size)` of an expandable segment (a recorded
    /// `segment_unmap`); the range must lie in one free mapped block.
    pub fn unmap_at(&mut self, addr: u64, size: u64, dev: &mut dyn Device) -> bool {
        let Some(id) = self.block_containing(addr) else {
            return false;
        };
        let b = self.b(id);
        if !self.is_expandable_block(id)
            || !b.mapped
            || b.status != BlockStatus::Free
            || addr + size > b.addr + b.size
        {
            return false;
        }
        self.unmap_range_of(id, addr, size, dev);
        let head_alone = !self.is_split(id);
        if head_alone {
            self.release_expandable_segment(id, dev);
        }
        true
    }

    /// Maps `[addr, addr + size)` of an expandable segment (a recorded
    /// `segment_map`), creating the segment at `addr` if none holds it. The
    /// range must lie in unmapped space.
    pub fn map_at(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        pool: u16,
        small: bool,
        dev: &mut dyn Device,
    ) -> bool {
        let pool_index = self.pool_index(pool, small);
        // An address space of another pool or stream that merely covers
        // `addr` (its real size being unknown) is not the one.
        let own = self.block_containing(addr).filter(|&id| {
            let seg = &self.segs[self.b(id).seg as usize];
            seg.is_expandable() && seg.pool == pool_index && seg.stream == stream
        });
        let id = match own {
            Some(id) => id,
            None => {
                let page = if small {
                    SMALL_BUFFER
                } else {
                    self.config.large_segment_size
                };
                let va = self.va_per_expandable.div_ceil(page) * page;
                self.new_expandable(addr, va, page, stream, pool_index)
            }
        };
        let b = self.b(id);
        if b.mapped || b.status != BlockStatus::Free || addr + size > b.addr + b.size {
            return false;
        }
        let mut id = id;
        if addr > b.addr {
            // Split the unmapped block so that the mapping starts a block.
            let (baddr, bsize, bstream, bpool, seg, next) =
                (b.addr, b.size, b.stream, b.pool, b.seg, b.next);
            self.remove_unmapped(id);
            self.bm(id).size = addr - baddr;
            self.insert_unmapped(id);
            let rest = self.new_block(addr, bsize - (addr - baddr), bstream, bpool, seg);
            self.bm(rest).mapped = false;
            self.bm(rest).prev = id;
            self.bm(rest).next = next;
            if next != NIL {
                self.bm(next).prev = rest;
            }
            self.bm(id).next = rest;
            self.insert_unmapped(rest);
            id = rest;
        }
        self.map_block(id, size, dev)
    }

    /// Allocates exactly `[addr, addr + size)` out of the free block that
    /// holds it, whatever best fit would say (replay's resynchronisation and
    /// the initial state of a truncated trace).
    pub fn alloc_at(&mut self, addr: u64, size: u64, requested: u64, tag: u64) -> Option<Handle> {
        let id = self.block_containing(addr)?;
        let b = self.b(id);
        if b.status != BlockStatus::Free || !b.mapped || addr + size > b.addr + b.size || size == 0
        {
            return None;
        }
        let seg = b.seg;
        let small = self.pool_small(b.pool);
        let (baddr, bsize, stream, pool, next) = (b.addr, b.size, b.stream, b.pool, b.next);
        let (before_n, before_b) = self.seg_inactive_split(seg);
        self.remove_free(id);
        let mut id = id;
        if addr > baddr {
            // Keep `id` as the free front part; the rest becomes a new block.
            self.bm(id).size = addr - baddr;
            self.insert_free(id);
            let rest = self.new_block(addr, bsize - (addr - baddr), stream, pool, seg);
            self.bm(rest).prev = id;
            self.bm(rest).next = next;
            if next != NIL {
                self.bm(next).prev = rest;
            }
            self.bm(id).next = rest;
            id = rest;
        }
        let cur_size = self.b(id).size;
        if cur_size > size {
            let next = self.b(id).next;
            let tail = self.new_block(addr + size, cur_size - size, stream, pool, seg);
            self.bm(tail).prev = id;
            self.bm(tail).next = next;
            if next != NIL {
                self.bm(next).prev = tail;
            }
            self.bm(id).next = tail;
            self.bm(id).size = size;
            self.insert_free(tail);
        }
        {
            let b = self.bm(id);
            b.status = BlockStatus::Allocated;
            b.requested = requested;
            b.tag = tag;
        }
        if !self.segs[seg as usize].is_expandable() {
            let (after_n, after_b) = self.seg_inactive_split(seg);
            apply_delta(&mut self.stats.inactive_split, small, before_n, after_n);
            apply_delta(
                &mut self.stats.inactive_split_bytes,
                small,
                before_b,
                after_b,
            );
        }
        let st = &mut self.stats;
        st.allocation.increase(small, 1);
        st.allocated_bytes.increase(small, size);
        st.active.increase(small, 1);
        st.active_bytes.increase(small, size);
        st.requested_bytes.increase(small, requested);
        if size >= self.config.max_split() {
            st.oversize_allocations.increase(1);
        }
        Some(self.handle(id))
    }

    /// Allocates a block for a request of `requested` bytes at `addr`, sized
    /// as the model would size it there: the rounded request, plus the rest of
    /// the free block when that rest would not have been split off.
    pub fn alloc_at_request(&mut self, addr: u64, requested: u64, tag: u64) -> Option<Handle> {
        self.alloc_at_request_within(addr, requested, u64::MAX, tag)
    }

    /// [`Allocator::alloc_at_request`], with the block known to end at or
    /// before `end_bound` (the next block seen beside it).
    pub fn alloc_at_request_within(
        &mut self,
        addr: u64,
        requested: u64,
        end_bound: u64,
        tag: u64,
    ) -> Option<Handle> {
        let size = round_size(&self.config, requested);
        let id = self.block_containing(addr)?;
        let b = self.b(id);
        let end = (b.addr + b.size).min(end_bound);
        if b.status != BlockStatus::Free || addr + size > end {
            return None;
        }
        let remaining = end - addr - size;
        let keep = if self.pool_small(b.pool) || self.is_expandable_block(id) {
            remaining < MIN_BLOCK_SIZE
        } else if size >= self.config.max_split() {
            remaining < self.config.max_non_split_rounding
        } else {
            remaining <= SMALL_SIZE
        };
        let size = if keep { end - addr } else { size };
        self.alloc_at(addr, size, requested, tag)
    }

    /// Whether the segment holding `addr` is in a small pool, and its memory
    /// pool index.
    pub fn pool_at(&self, addr: u64) -> Option<(bool, u16)> {
        let seg = self.seg_containing(addr)?;
        let pool = self.segs[seg as usize].pool;
        Some((self.pool_small(pool), pool / 2))
    }

    /// Free blocks of a split segment: their count and bytes.
    fn seg_inactive_split(&self, seg: u32) -> (u64, u64) {
        let mut id = self.segs[seg as usize].head;
        let mut n = 0;
        let mut bytes = 0;
        let mut blocks = 0;
        while id != NIL {
            let b = self.b(id);
            blocks += 1;
            if b.status == BlockStatus::Free {
                n += 1;
                bytes += b.size;
            }
            id = b.next;
        }
        if blocks > 1 {
            (n, bytes)
        } else {
            (0, 0)
        }
    }
}

fn apply_delta(s: &mut super::stats::StatArray, small: bool, before: u64, after: u64) {
    if after > before {
        s.increase(small, after - before);
    } else if before > after {
        s.decrease(small, before - after);
    }
}
