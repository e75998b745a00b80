//! Size rules of the caching allocator: the constants, `round_size` and
//! `get_allocation_size`.

use super::config::AllocatorConfig;

/// "small" allocations are packed in 2 MiB segments (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// All sizes are rounded to at least 512 bytes (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// The largest "small" allocation is 1 MiB (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Requests between 1 and 10 MiB get a large segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger segments are rounded up to 2 MiB (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;

/// `round_size`: the block size for a request of `size` bytes.
pub fn round_size(config: &AllocatorConfig, size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.divisions_for(size) as u64;
    let applies = if config.version.divisions_need_two() {
        divisions > 1
    } else {
        divisions > 0
    };
    if applies && size > MIN_BLOCK_SIZE * divisions {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// Rounds up to the next of `divisions` equal steps between two powers of two
/// (1200 with 4 divisions gives 1280).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.max(1).leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down + step
    }
}

/// `get_allocation_size`: the size of the segment made for a rounded request.
pub fn allocation_size(config: &AllocatorConfig, size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// Whether a rounded size goes to the small pool.
pub fn is_small(size: u64) -> bool {
    size <= SMALL_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::TorchVersion;

    #[test]
    fn default_rounding() {
        let c = AllocatorConfig::default();
        assert_eq!(round_size(&c, 1), 512);
        assert_eq!(round_size(&c, 512), 512);
        assert_eq!(round_size(&c, 513), 1024);
        assert_eq!(round_size(&c, 1200), 1536);
        assert_eq!(allocation_size(&c, 1 << 20), 2 << 20);
        assert_eq!(allocation_size(&c, (1 << 20) + 512), 20 << 20);
        assert_eq!(allocation_size(&c, 10 << 20), 10 << 20);
        assert_eq!(allocation_size(&c, (10 << 20) + 1), 12 << 20);
    }

    #[test]
    fn power2_divisions() {
        let mut c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        // Only above 512 * divisions: the code's own example (1200 -> 1280)
        // is below that and gets 512-byte rounding.
        assert_eq!(round_size(&c, 1200), 1536);
        assert_eq!(round_size(&c, 9000), 10240);
        assert_eq!(round_size(&c, 1024), 1024);
        assert_eq!(round_size(&c, (300 << 20) + 1), 320 << 20);
        // One division: only 512-byte rounding in new builds, next power of
        // two in old ones.
        c = AllocatorConfig::parse("roundup_power2_divisions:1").unwrap();
        assert_eq!(round_size(&c, 1200), 1536);
        c.version = TorchVersion { major: 2, minor: 2 };
        assert_eq!(round_size(&c, 1200), 2048);
    }
}
