//! The estimate beside a measurement: the peak and the bytes by category that
//! `memlens peak` finds in a snapshot of the same model and settings.

use super::Estimate;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The categories, in the order they are shown.
pub const CATEGORIES: &[&str] = &[
    "parameter",
    "gradient",
    "optimizer_state",
    "activation",
    "temporary",
    "input",
    "other",
];

/// What a snapshot measured: its peak of allocated memory and what was live
/// at that peak, by category (`memlens peak --json` reports both).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasuredMemory {
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Bytes live at the peak by category (`parameter`, `gradient`,
    /// `optimizer_state`, `activation`, `temporary`, `input`, `other`).
    #[serde(default)]
    pub categories: BTreeMap<String, u64>,
}

/// One category compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CategoryRow {
    /// The category.
    pub category: String,
    /// Estimated bytes of it at the estimated peak.
    pub estimated_bytes: u64,
    /// Measured bytes of it at the measured peak; `None` when the
    /// measurement has no categories (a `memory_stats()` dump).
    pub measured_bytes: Option<u64>,
    /// `estimated - measured`, when measured.
    pub delta_bytes: Option<i64>,
}

/// The estimate against the measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Estimated peak allocated bytes.
    pub estimated_peak_bytes: u64,
    /// Measured peak allocated bytes.
    pub measured_peak_bytes: u64,
    /// `estimated - measured`.
    pub delta_bytes: i64,
    /// `estimated / measured - 1` (0.05 means the estimate is 5% high);
    /// `None` when nothing was measured.
    pub relative_error: Option<f64>,
    /// Category by category.
    pub categories: Vec<CategoryRow>,
}

fn delta(a: u64, b: u64) -> i64 {
    (i128::from(a) - i128::from(b)).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// The estimate's bytes by category at its peak phase.
pub fn estimated_categories(est: &Estimate) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    if let Some(phase) = est.peak() {
        for (key, bytes) in &phase.parts {
            let cat = est.part(key).map_or("other", |p| p.category);
            let e = out.entry(cat.to_string()).or_default();
            *e = e.saturating_add(*bytes);
        }
    }
    out
}

/// Puts `est` beside `measured`.
pub fn compare(est: &Estimate, measured: &MeasuredMemory) -> Comparison {
    let estimated = estimated_categories(est);
    let mut names: Vec<String> = CATEGORIES.iter().map(|c| c.to_string()).collect();
    for k in estimated.keys().chain(measured.categories.keys()) {
        if !names.contains(k) {
            names.push(k.clone());
        }
    }
    let categories = names
        .into_iter()
        .filter_map(|c| {
            let e = estimated.get(&c).copied().unwrap_or(0);
            let has = !measured.categories.is_empty();
            let m = measured.categories.get(&c).copied().unwrap_or(0);
            (e > 0 || m > 0).then(|| CategoryRow {
                delta_bytes: has.then(|| delta(e, m)),
                category: c,
                estimated_bytes: e,
                measured_bytes: has.then_some(m),
            })
        })
        .collect();
    let (e, m) = (est.peak_allocated_bytes, measured.peak_allocated_bytes);
    Comparison {
        estimated_peak_bytes: e,
        measured_peak_bytes: m,
        delta_bytes: delta(e, m),
        relative_error: (m > 0).then(|| e as f64 / m as f64 - 1.0),
        categories,
    }
}
