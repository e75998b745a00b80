//! `memlens check`: a memory gate for CI. Fails when the replayed peak
//! exceeds the limits given.

use super::peak::PeakReport;
use serde::Serialize;

/// The verdict of a memory gate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckResult {
    /// True when every limit holds.
    pub ok: bool,
    /// The peak of allocated bytes.
    pub peak_allocated_bytes: u64,
    /// The peak of reserved bytes.
    pub peak_reserved_bytes: u64,
    /// The allocated limit, when given.
    pub max_peak_bytes: Option<u64>,
    /// The reserved limit, when given.
    pub max_reserved_bytes: Option<u64>,
    /// One line per broken limit.
    pub failures: Vec<String>,
    /// When the trace began after the allocator did (the ring buffer wrapped
    /// or recording began late): what the verdict covers, the recorded
    /// window only. Absent when the trace holds the whole run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
}

/// Checks a peak against limits on allocated and reserved bytes.
pub fn check(peak: &PeakReport, max_peak: Option<u64>, max_reserved: Option<u64>) -> CheckResult {
    use crate::units::format_bytes;
    let mut failures = Vec::new();
    if let Some(m) = max_peak {
        if peak.peak_allocated_bytes > m {
            failures.push(format!(
                "peak allocated {} exceeds the limit {} by {}",
                format_bytes(peak.peak_allocated_bytes),
                format_bytes(m),
                format_bytes(peak.peak_allocated_bytes - m)
            ));
        }
    }
    if let Some(m) = max_reserved {
        if peak.peak_reserved_bytes > m {
            failures.push(format!(
                "peak reserved {} exceeds the limit {} by {}",
                format_bytes(peak.peak_reserved_bytes),
                format_bytes(m),
                format_bytes(peak.peak_reserved_bytes - m)
            ));
        }
    }
    // The peak's own caveat names the cause and the remedy (see
    // replay::initial::late_start_cause); the verdict adds what it means here.
    let partial = peak
        .warnings
        .iter()
        .find(|w| w.starts_with(crate::replay::initial::LATE_START))
        .map(|w| {
            let cause = w
                .split_once(super::peak::LATE_PEAKS)
                .map_or(w.as_str(), |(_, cause)| cause);
            format!(
                "{}: this verdict covers the recorded window only, and a higher peak before it is \
                 not seen; {cause}",
                crate::replay::initial::LATE_START
            )
        });
    CheckResult {
        partial,
        ok: failures.is_empty(),
        peak_allocated_bytes: peak.peak_allocated_bytes,
        peak_reserved_bytes: peak.peak_reserved_bytes,
        max_peak_bytes: max_peak,
        max_reserved_bytes: max_reserved,
        failures,
    }
}
