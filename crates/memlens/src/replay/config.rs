//! The allocator settings a snapshot was recorded with, as the allocator
//! model's own [`AllocatorConfig`]. The conversion lives here, above both the
//! snapshot model and the allocator model, so that `sim` knows no snapshot type.

use crate::sim::config::ROUNDUP_INTERVALS;
use crate::sim::AllocatorConfig;
use crate::snapshot::AllocatorSettings;

/// The settings a snapshot was recorded with. The recorded dict lacks
/// `max_non_split_rounding_mb`, `large_segment_size_mb` and
/// `per_process_memory_fraction`; they are taken from the recorded
/// `PYTORCH_CUDA_ALLOC_CONF` string when it names them.
pub fn recorded_config(s: &AllocatorSettings) -> AllocatorConfig {
    let mut c = AllocatorConfig::default();
    if !s.alloc_conf.is_empty() {
        // Best effort: a conf that does not parse still leaves the
        // explicit fields below, which are authoritative.
        let mut parsed = AllocatorConfig::default();
        if parsed.apply(&s.alloc_conf).is_ok() {
            c = parsed;
        }
    }
    if !s.present {
        return c;
    }
    c.max_split_size = s.max_split_size;
    c.garbage_collection_threshold = s.garbage_collection_threshold;
    c.expandable_segments = s.expandable_segments;
    if s.roundup_power2_divisions.len() == ROUNDUP_INTERVALS {
        for (d, v) in c
            .roundup_power2_divisions
            .iter_mut()
            .zip(&s.roundup_power2_divisions)
        {
            *d = *v;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_recorded_settings() {
        let s = AllocatorSettings {
            present: true,
            alloc_conf: "max_non_split_rounding_mb:40,max_split_size_mb:64".into(),
            max_split_size: Some(64 << 20),
            expandable_segments: false,
            roundup_power2_divisions: vec![0; 16],
            ..Default::default()
        };
        let c = recorded_config(&s);
        assert_eq!(c.max_split_size, Some(64 << 20));
        assert_eq!(c.max_non_split_rounding, 40 << 20);
    }
}
