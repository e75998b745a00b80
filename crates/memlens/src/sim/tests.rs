//! Unit tests of the allocator model on small synthetic sequences.

use super::*;

const MIB: u64 = 1 << 20;

fn alloc(config: &str) -> (Allocator, SyntheticDevice) {
    let c = AllocatorConfig::parse(config).unwrap();
    (
        Allocator::new(c, DeviceLimits::default()),
        SyntheticDevice::recording(None),
    )
}

fn m(a: &mut Allocator, d: &mut SyntheticDevice, size: u64) -> Handle {
    a.malloc(size, 0, DEFAULT_POOL, 0, d).unwrap()
}

fn addr(a: &Allocator, h: Handle) -> u64 {
    a.block_info(h).unwrap().0
}

fn size(a: &Allocator, h: Handle) -> u64 {
    a.block_info(h).unwrap().1
}

#[test]
fn small_requests_share_a_2mib_segment() {
    let (mut a, mut d) = alloc("");
    let x = m(&mut a, &mut d, 100);
    let y = m(&mut a, &mut d, 1000);
    assert_eq!(size(&a, x), 512);
    assert_eq!(size(&a, y), 1024);
    assert_eq!(addr(&a, y), addr(&a, x) + 512);
    let s = a.stats();
    assert_eq!(s.reserved_bytes.all.current, 2 * MIB);
    assert_eq!(s.reserved_bytes.small_pool.current, 2 * MIB);
    assert_eq!(s.allocated_bytes.all.current, 1536);
    assert_eq!(s.requested_bytes.all.current, 1100);
    assert_eq!(s.inactive_split_bytes.all.current, 2 * MIB - 1536);
    assert_eq!(s.inactive_split.all.current, 1);
    assert!(a.free(x));
    assert!(!a.free(x), "a stale handle is refused");
    assert!(a.free(y));
    let s = a.stats();
    assert_eq!(s.inactive_split_bytes.all.current, 0);
    assert_eq!(s.inactive_split.all.current, 0);
    assert_eq!(s.active_bytes.all.current, 0);
    assert_eq!(a.segments().len(), 1);
    assert_eq!(a.segments()[0].blocks.len(), 1);
}

#[test]
fn large_pool_splits_only_big_remainders() {
    let (mut a, mut d) = alloc("");
    // 5 MiB gets a 20 MiB segment and splits it.
    let x = m(&mut a, &mut d, 5 * MIB);
    assert_eq!(size(&a, x), 5 * MIB);
    assert_eq!(a.stats().reserved_bytes.all.current, 20 * MIB);
    // 14.5 MiB fits the 15 MiB remainder; the 0.5 MiB left stays attached.
    let y = m(&mut a, &mut d, 29 * MIB / 2);
    assert_eq!(size(&a, y), 15 * MIB);
    assert_eq!(a.stats().allocated_bytes.all.current, 20 * MIB);
    assert_eq!(a.stats().num_device_alloc, 1);
    // 12 MiB + 1 gets its own 14 MiB segment.
    let z = m(&mut a, &mut d, 12 * MIB + 1);
    assert_eq!(size(&a, z), 12 * MIB + 512);
    assert_eq!(a.stats().reserved_bytes.all.current, 34 * MIB);
    let sizes: Vec<u64> = d
        .log
        .unwrap()
        .iter()
        .map(|op| match op {
            DeviceOp::SegmentAlloc { size, .. } => *size,
            _ => 0,
        })
        .collect();
    assert_eq!(sizes, vec![20 * MIB, 14 * MIB]);
}

#[test]
fn best_fit_breaks_ties_by_lowest_address() {
    let (mut a, mut d) = alloc("");
    let big: Vec<Handle> = (0..3).map(|_| m(&mut a, &mut d, 40 * MIB)).collect();
    let addrs: Vec<u64> = big.iter().map(|h| addr(&a, *h)).collect();
    for h in &big {
        a.free(*h);
    }
    let lowest = *addrs.iter().min().unwrap();
    let x = m(&mut a, &mut d, 30 * MIB);
    assert_eq!(addr(&a, x), lowest);
    assert_eq!(a.stats().num_device_alloc, 3);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let (mut a, mut d) = alloc("max_split_size_mb:64");
    let x = m(&mut a, &mut d, 100 * MIB);
    a.free(x);
    // A small request may not take the 100 MiB oversize block.
    let y = m(&mut a, &mut d, 30 * MIB);
    assert_eq!(a.stats().num_device_alloc, 2);
    // A large one may, within 20 MiB of slack, and does not split it.
    let z = m(&mut a, &mut d, 90 * MIB);
    assert_eq!(size(&a, z), 100 * MIB);
    assert_eq!(a.stats().oversize_allocations.current, 1);
    a.free(z);
    let w = m(&mut a, &mut d, 70 * MIB);
    assert_ne!(size(&a, w), 100 * MIB, "more than 20 MiB of slack");
    a.free(y);
}

#[test]
fn out_of_memory_frees_the_cache_and_retries() {
    let c = AllocatorConfig::default();
    let mut a = Allocator::new(c, DeviceLimits::default());
    let mut d = SyntheticDevice::new(Some(64 * MIB));
    let x = m(&mut a, &mut d, 40 * MIB);
    a.free(x);
    // 50 MiB does not fit beside the cached 40 MiB segment: it is freed.
    let y = m(&mut a, &mut d, 50 * MIB);
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert_eq!(a.stats().num_device_free, 1);
    assert_eq!(a.stats().reserved_bytes.all.current, 50 * MIB);
    let err = a.malloc(20 * MIB, 0, DEFAULT_POOL, 0, &mut d).unwrap_err();
    assert_eq!(err.size, 20 * MIB);
    assert_eq!(err.alloc_size, 20 * MIB);
    assert_eq!(a.stats().num_ooms, 1);
    assert_eq!(a.stats().num_alloc_retries, 2);
    a.free(y);
}

#[test]
fn release_available_frees_one_oversize_segment() {
    let c = AllocatorConfig::parse("max_split_size_mb:32").unwrap();
    let mut a = Allocator::new(c, DeviceLimits::default());
    let mut d = SyntheticDevice::new(Some(100 * MIB));
    let x = m(&mut a, &mut d, 60 * MIB);
    let keep = m(&mut a, &mut d, 20 * MIB);
    a.free(x);
    // 40 MiB cannot use the 60 MiB oversize block (slack 20), and does not
    // fit on the device; the oversize block alone is released, no retry.
    let y = m(&mut a, &mut d, 40 * MIB);
    assert_eq!(a.stats().num_alloc_retries, 0);
    assert_eq!(a.stats().num_device_free, 1);
    assert_eq!(size(&a, y), 40 * MIB);
    a.free(keep);
}

#[test]
fn pending_frees_are_not_reused() {
    let (mut a, mut d) = alloc("");
    let x = m(&mut a, &mut d, 30 * MIB);
    let xa = addr(&a, x);
    assert!(a.free_requested(x));
    assert_eq!(a.stats().allocated_bytes.all.current, 0);
    assert_eq!(a.stats().active_bytes.all.current, 30 * MIB);
    let y = m(&mut a, &mut d, 30 * MIB);
    assert_ne!(addr(&a, y), xa);
    assert!(a.free_completed(x));
    let z = m(&mut a, &mut d, 30 * MIB);
    assert_eq!(addr(&a, z), xa);
    // empty_cache completes pending frees first.
    a.free_requested(y);
    a.free(z);
    a.empty_cache(&mut d);
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
    assert!(!a.free_completed(y));
}

#[test]
fn expandable_segments_map_pages_and_unmap_on_empty_cache() {
    let (mut a, mut d) = alloc("expandable_segments:True");
    let x = m(&mut a, &mut d, 5 * MIB);
    let y = m(&mut a, &mut d, 5 * MIB);
    assert_eq!(addr(&a, y), addr(&a, x) + 5 * MIB);
    assert_eq!(a.stats().reserved_bytes.all.current, 20 * MIB);
    assert_eq!(a.stats().num_device_alloc, 1);
    assert_eq!(a.stats().segment.all.current, 0);
    // 25 MiB: the 10 MiB free tail plus one more... two pages.
    let z = m(&mut a, &mut d, 25 * MIB);
    assert_eq!(addr(&a, z), addr(&a, y) + 5 * MIB);
    assert_eq!(a.stats().reserved_bytes.all.current, 40 * MIB);
    assert_eq!(a.stats().num_device_alloc, 2);
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].is_expandable);
    assert_eq!(segs[0].total_size, 40 * MIB);
    // Free the middle: only whole free pages can be unmapped.
    a.free(y);
    a.empty_cache(&mut d);
    assert_eq!(a.stats().reserved_bytes.all.current, 40 * MIB);
    a.free(x);
    a.free(z);
    a.empty_cache(&mut d);
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
    assert!(a.segments().is_empty());
    // Expandable segments split any remainder of 512 bytes or more.
    let w = m(&mut a, &mut d, 3 * MIB);
    assert_eq!(size(&a, w), 3 * MIB);
}

#[test]
fn garbage_collection_needs_a_memory_fraction() {
    let c =
        AllocatorConfig::parse("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5")
            .unwrap();
    let limits = DeviceLimits {
        total_memory: Some(400 * MIB),
    };
    let mut a = Allocator::new(c, limits);
    assert_eq!(a.allowed_memory_maximum(), Some(200 * MIB));
    let mut d = SyntheticDevice::new(None);
    let x = m(&mut a, &mut d, 60 * MIB);
    let y = m(&mut a, &mut d, 60 * MIB);
    a.free(x);
    a.free(y);
    // Reserved 120 MiB > 100 MiB threshold: GC frees aged whole segments
    // before making a new one.
    let _z = m(&mut a, &mut d, 70 * MIB);
    assert!(a.stats().num_device_free >= 1);
    assert_eq!(a.stats().num_alloc_retries, 0);
    // Without the fraction nothing is collected.
    let c = AllocatorConfig::parse("garbage_collection_threshold:0.5").unwrap();
    let mut a = Allocator::new(c, limits);
    let x = m(&mut a, &mut d, 60 * MIB);
    let y = m(&mut a, &mut d, 60 * MIB);
    a.free(x);
    a.free(y);
    let _z = m(&mut a, &mut d, 70 * MIB);
    assert_eq!(a.stats().num_device_free, 0);
}

#[test]
fn forced_placement() {
    let (mut a, mut d) = alloc("");
    assert!(a.insert_segment(0x1000_0000, 20 * MIB, 0, DEFAULT_POOL, false));
    assert!(!a.insert_segment(0x1000_0000 + MIB, 2 * MIB, 0, DEFAULT_POOL, false));
    let h = a
        .alloc_at(0x1000_0000 + 4 * MIB, 2 * MIB, 2 * MIB - 7, 9)
        .unwrap();
    let segs = a.segments();
    assert_eq!(segs[0].blocks.len(), 3);
    assert_eq!(a.stats().inactive_split.all.current, 2);
    assert_eq!(a.stats().inactive_split_bytes.all.current, 18 * MIB);
    assert!(!a.release_segment_at(0x1000_0000, &mut d));
    a.free(h);
    assert_eq!(a.stats().inactive_split.all.current, 0);
    assert!(a.release_segment_at(0x1000_0000, &mut d));
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
    // Expandable mapping at a recorded address.
    let c = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let mut a = Allocator::new(c, DeviceLimits::default());
    assert!(a.map_at(0x2000_0000, 40 * MIB, 0, DEFAULT_POOL, false, &mut d));
    assert!(a.map_at(
        0x2000_0000 + 60 * MIB,
        20 * MIB,
        0,
        DEFAULT_POOL,
        false,
        &mut d
    ));
    assert_eq!(a.segments().len(), 2);
    assert_eq!(a.stats().reserved_bytes.all.current, 60 * MIB);
    assert!(a.unmap_at(0x2000_0000 + 60 * MIB, 20 * MIB, &mut d));
    assert_eq!(a.segments().len(), 1);
}
