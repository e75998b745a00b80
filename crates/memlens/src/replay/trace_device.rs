//! A [`Device`] that answers the model from the recorded trace: a new segment
//! gets the address the trace's `segment_alloc` (or `segment_map`) gave it, so
//! block addresses, and with them every tie-break between equal-size blocks,
//! come out as they were. Anything the trace does not show is noted as a
//! mismatch for the driver to repair.

use crate::sim::{Device, DeviceOp};
use std::collections::VecDeque;

/// A recorded `segment_alloc` or `segment_map` waiting for its allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingOp {
    /// `segment_map` rather than `segment_alloc`.
    pub map: bool,
    pub addr: u64,
    pub size: u64,
}

/// Addresses for segments the trace does not know: far above any real one.
pub(crate) const FAKE_VA_BASE: u64 = 1 << 56;

pub(crate) struct TraceDevice<'a> {
    pending: &'a mut VecDeque<PendingOp>,
    fake: &'a mut u64,
    /// What the model did, and whether the trace agreed.
    pub done: Vec<(DeviceOp, bool)>,
    /// Recorded operations taken off the queue that the model did otherwise.
    pub leftover: Vec<PendingOp>,
}

impl<'a> TraceDevice<'a> {
    pub fn new(pending: &'a mut VecDeque<PendingOp>, fake: &'a mut u64) -> Self {
        TraceDevice {
            pending,
            fake,
            done: Vec::new(),
            leftover: Vec::new(),
        }
    }

    /// The model did exactly what the trace shows (so far).
    pub fn clean(&self) -> bool {
        self.pending.is_empty() && self.leftover.is_empty() && self.done.iter().all(|(_, ok)| *ok)
    }

    /// Recorded operations the model did not reproduce.
    pub fn unmatched_trace_ops(&mut self) -> Vec<PendingOp> {
        let mut v = std::mem::take(&mut self.leftover);
        v.extend(self.pending.drain(..));
        v
    }

    fn fake_addr(&mut self, size: u64) -> u64 {
        let a = *self.fake;
        *self.fake = self
            .fake
            .saturating_add(size.div_ceil(2 << 20).max(1) * (2 << 20));
        a
    }
}

impl Device for TraceDevice<'_> {
    fn malloc(&mut self, size: u64) -> Option<u64> {
        match self.pending.front().copied() {
            Some(p) if !p.map => {
                self.pending.pop_front();
                if p.size == size {
                    self.done
                        .push((DeviceOp::SegmentAlloc { addr: p.addr, size }, true));
                    return Some(p.addr);
                }
                self.leftover.push(p);
            }
            _ => {}
        }
        let addr = self.fake_addr(size);
        self.done
            .push((DeviceOp::SegmentAlloc { addr, size }, false));
        Some(addr)
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.done
            .push((DeviceOp::SegmentFree { addr, size }, false));
    }

    fn reserve(&mut self, size: u64) -> u64 {
        // A new expandable segment is mapped from its start: the address of
        // the next recorded mapping is the base of its address space.
        match self.pending.front() {
            Some(p) if p.map => p.addr,
            _ => self.fake_addr(size),
        }
    }

    fn map(&mut self, addr: u64, size: u64) -> bool {
        match self.pending.front().copied() {
            Some(p) if p.map && p.addr == addr && p.size == size => {
                self.pending.pop_front();
                self.done.push((DeviceOp::SegmentMap { addr, size }, true));
            }
            _ => self.done.push((DeviceOp::SegmentMap { addr, size }, false)),
        }
        true
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        self.done
            .push((DeviceOp::SegmentUnmap { addr, size }, false));
    }
}

/// A device that never fails and records nothing: for operations the trace
/// dictates (`segment_free`, `segment_unmap`, the initial state).
pub(crate) struct NullDevice;

impl Device for NullDevice {
    fn malloc(&mut self, _size: u64) -> Option<u64> {
        None
    }
    fn free(&mut self, _addr: u64, _size: u64) {}
    fn reserve(&mut self, _size: u64) -> u64 {
        FAKE_VA_BASE
    }
    fn map(&mut self, _addr: u64, _size: u64) -> bool {
        true
    }
    fn unmap(&mut self, _addr: u64, _size: u64) {}
}
