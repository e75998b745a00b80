//! Read-only views of the allocator's state, shaped like a snapshot's
//! `segments`: one entry per cudaMalloc segment, and one per contiguous mapped
//! range of an expandable segment.

use super::allocator::{Allocator, BlockStatus, NIL};
use serde::Serialize;

/// A block as the model holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BlockView {
    /// Address.
    pub address: u64,
    /// Size in bytes (rounded, with any unsplit remainder).
    pub size: u64,
    /// The request that made it (stale for free blocks).
    pub requested_size: u64,
    /// Allocated, pending free, or free.
    pub status: BlockStatus,
    /// The caller's tag given to `malloc` (0 for free blocks).
    pub tag: u64,
    /// Stream key.
    pub stream: u64,
}

/// A segment as the model holds it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SegmentView {
    /// Address of the first block.
    pub address: u64,
    /// Bytes reserved.
    pub total_size: u64,
    /// Stream key.
    pub stream: u64,
    /// `MempoolId_t` of the owning pool; `(0, 0)` is the default pool.
    pub pool_id: (i64, i64),
    /// Small pool (2 MiB segments) or large.
    pub is_small: bool,
    /// A mapped range of an expandable segment.
    pub is_expandable: bool,
    /// Blocks in address order.
    pub blocks: Vec<BlockView>,
}

impl Allocator {
    fn view(&self, id: u32) -> BlockView {
        let b = self.b(id);
        BlockView {
            address: b.addr,
            size: b.size,
            requested_size: b.requested,
            status: b.status,
            tag: if b.status == BlockStatus::Free {
                0
            } else {
                b.tag
            },
            stream: b.stream,
        }
    }

    /// Every segment in address order, with its blocks.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for &seg in self.seg_index.values() {
            let s = &self.segs[seg as usize];
            let pool = &self.pools[s.pool as usize];
            let base = SegmentView {
                address: 0,
                total_size: 0,
                stream: s.stream,
                pool_id: self.mempool_id(s.pool / 2),
                is_small: pool.is_small,
                is_expandable: s.is_expandable(),
                blocks: Vec::new(),
            };
            let mut cur: Option<SegmentView> = None;
            let mut id = s.head;
            while id != NIL {
                let b = self.b(id);
                if b.mapped {
                    let v = cur.get_or_insert_with(|| SegmentView {
                        address: b.addr,
                        ..base.clone()
                    });
                    v.total_size += b.size;
                    v.blocks.push(self.view(id));
                } else if let Some(v) = cur.take() {
                    out.push(v);
                }
                id = b.next;
            }
            if let Some(v) = cur.take() {
                out.push(v);
            }
        }
        out
    }

    /// Allocated and pending-free blocks, in no particular order.
    pub fn live_blocks(&self) -> impl Iterator<Item = BlockView> + '_ {
        self.blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.is_live() && b.status != BlockStatus::Free)
            .map(|(i, _)| self.view(i as u32))
    }

    /// The largest free block in any pool (what the OOM message's
    /// "reserved but unallocated" can serve at most in one piece).
    pub fn largest_free_block(&self) -> u64 {
        self.pools
            .iter()
            .flat_map(|p| p.blocks.iter().map(|e| e.size))
            .max()
            .unwrap_or(0)
    }
}
