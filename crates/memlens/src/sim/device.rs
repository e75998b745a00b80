//! What the allocator asks of the GPU: `cudaMalloc`/`cudaFree` of segments, and
//! address reservation plus page mapping for expandable segments.
//!
//! The model decides *when* to call these; a [`Device`] decides whether they
//! succeed and at which address. Replay uses a device that answers from the
//! recorded trace (real addresses, so tie-breaking between equal-size blocks is
//! exact); what-if runs use [`SyntheticDevice`], with a capacity and made-up
//! addresses.

use serde::Serialize;

/// The GPU as the allocator sees it.
pub trait Device {
    /// `cudaMalloc(size)`: the segment's address, or `None` when out of memory.
    fn malloc(&mut self, size: u64) -> Option<u64>;
    /// `cudaFree` of a whole segment.
    fn free(&mut self, addr: u64, size: u64);
    /// `cuMemAddressReserve` for a new expandable segment: address space only.
    fn reserve(&mut self, size: u64) -> u64;
    /// `cuMemAddressFree` of an expandable segment's address space.
    fn release_reservation(&mut self, _addr: u64, _size: u64) {}
    /// Maps `size` bytes of physical pages at `addr` (whole pages); `false`
    /// when out of memory (nothing is mapped then).
    fn map(&mut self, addr: u64, size: u64) -> bool;
    /// Unmaps and releases pages.
    fn unmap(&mut self, addr: u64, size: u64);
}

/// A device operation, as a trace would record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum DeviceOp {
    /// `segment_alloc`.
    SegmentAlloc {
        /// Address.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// `segment_free`.
    SegmentFree {
        /// Address.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// `segment_map`.
    SegmentMap {
        /// Address.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// `segment_unmap`.
    SegmentUnmap {
        /// Address.
        addr: u64,
        /// Bytes.
        size: u64,
    },
}

/// 2 MiB: the granularity of CUDA's virtual address allocations.
const VA_ALIGN: u64 = 2 << 20;
/// Where synthetic addresses start (below the 0x7f.. range real CUDA
/// addresses use); they grow downwards, as CUDA's tend to.
const VA_TOP: u64 = 0x6000_0000_0000;

/// Where to put the lowest address first, with no real addresses to follow.
///
/// The allocator breaks ties between free blocks of one size by address, so
/// which of two equal segments it fills depends on where `cudaMalloc` put
/// them. CUDA's choice is not predictable from the program: in one recorded
/// ViT step, new 20 MiB segments came at rising addresses for a while, then
/// at falling ones (`tests/corpus/fit`). Neither order alone reproduces every
/// recorded run; the higher of the two peaks did on every run recorded from
/// its start in the fixtures and corpus (`crates/memlens/tests/fit.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressOrder {
    /// Newer segments at lower addresses (what a growing process mostly sees).
    #[default]
    Downward,
    /// Newer segments at higher addresses.
    Upward,
}

/// Where upward addresses start.
const VA_BOTTOM: u64 = 0x1000_0000_0000;

/// A GPU with a capacity (or none) that hands out made-up addresses.
///
/// Addresses are given in 2 MiB steps and never reused, top-down by default,
/// which is close to what CUDA does for a growing process: newer segments sit
/// at lower addresses, so the allocator's lowest-address tie-break prefers
/// them ([`AddressOrder`]).
#[derive(Clone, Debug)]
pub struct SyntheticDevice {
    /// Bytes the allocator may hold at once (`None`: unlimited).
    pub capacity: Option<u64>,
    /// Bytes held now.
    pub used: u64,
    /// The highest `used` seen.
    pub peak_used: u64,
    next: u64,
    /// The next upward address.
    up: u64,
    /// Which way new addresses go.
    order: AddressOrder,
    /// Every operation, in order, when recording.
    pub log: Option<Vec<DeviceOp>>,
}

impl SyntheticDevice {
    /// A device with the given capacity for the allocator's segments.
    pub fn new(capacity: Option<u64>) -> SyntheticDevice {
        SyntheticDevice {
            capacity,
            used: 0,
            peak_used: 0,
            next: VA_TOP,
            up: VA_BOTTOM,
            order: AddressOrder::Downward,
            log: None,
        }
    }

    /// The same, recording every operation in [`SyntheticDevice::log`].
    pub fn recording(capacity: Option<u64>) -> SyntheticDevice {
        SyntheticDevice {
            log: Some(Vec::new()),
            ..SyntheticDevice::new(capacity)
        }
    }

    /// The same device, handing out addresses in `order`.
    pub fn with_order(mut self, order: AddressOrder) -> SyntheticDevice {
        self.set_order(order);
        self
    }

    /// Hands out the next addresses in `order`.
    pub fn set_order(&mut self, order: AddressOrder) {
        self.order = order;
    }

    fn take(&mut self, size: u64) -> bool {
        if let Some(cap) = self.capacity {
            if self.used.saturating_add(size) > cap {
                return false;
            }
        }
        self.used += size;
        self.peak_used = self.peak_used.max(self.used);
        true
    }

    fn carve(&mut self, size: u64) -> u64 {
        let span = size.div_ceil(VA_ALIGN).max(1) * VA_ALIGN;
        if self.order == AddressOrder::Upward {
            let addr = self.up;
            self.up = self.up.saturating_add(span).min(VA_TOP);
            return addr;
        }
        // Wrapping cannot happen in practice (2^46 bytes of room); saturate
        // to stay panic-free regardless.
        self.next = self.next.saturating_sub(span).max(VA_ALIGN);
        self.next
    }

    fn record(&mut self, op: DeviceOp) {
        if let Some(log) = &mut self.log {
            log.push(op);
        }
    }
}

impl Device for SyntheticDevice {
    fn malloc(&mut self, size: u64) -> Option<u64> {
        if !self.take(size) {
            return None;
        }
        let addr = self.carve(size);
        self.record(DeviceOp::SegmentAlloc { addr, size });
        Some(addr)
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.used = self.used.saturating_sub(size);
        self.record(DeviceOp::SegmentFree { addr, size });
    }

    fn reserve(&mut self, size: u64) -> u64 {
        self.carve(size)
    }

    fn map(&mut self, addr: u64, size: u64) -> bool {
        if !self.take(size) {
            return false;
        }
        self.record(DeviceOp::SegmentMap { addr, size });
        true
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        self.used = self.used.saturating_sub(size);
        self.record(DeviceOp::SegmentUnmap { addr, size });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_and_addresses() {
        let mut d = SyntheticDevice::recording(Some(30 << 20));
        let a = d.malloc(20 << 20).unwrap();
        let b = d.malloc(1 << 20);
        assert!(b.is_some());
        assert!(b.unwrap() < a);
        assert!(d.malloc(20 << 20).is_none());
        d.free(a, 20 << 20);
        assert!(d.malloc(20 << 20).is_some());
        assert_eq!(d.log.as_ref().map(Vec::len), Some(4));
    }

    #[test]
    fn upward_addresses_rise() {
        let mut d = SyntheticDevice::new(None).with_order(AddressOrder::Upward);
        let a = d.malloc(20 << 20).unwrap();
        let b = d.malloc(1).unwrap();
        assert_eq!(b, a + (20 << 20));
        assert!(d.malloc(1).unwrap() > b);
    }
}
