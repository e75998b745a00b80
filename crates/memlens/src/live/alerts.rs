//! Alerts of `memlens top`: steady memory growth of a process, a GPU near
//! full, and the leak alarm a process publishes itself; and the tracker that
//! fires each alert once per condition rather than on every tick.
//!
//! # Growth, defined
//!
//! A process "grows steadily" when, over the samples of the last
//! `window_s` seconds (its memory: NVML's figure, else PyTorch's reserved),
//! all of these hold:
//!
//! 1. there are at least [`MIN_SAMPLES`] samples spanning at least half the
//!    window (no verdict on a process seen for two seconds);
//! 2. the least-squares slope is at least the rule's rate (bytes per second);
//! 3. the line explains the data: R² ≥ [`MIN_R2`]. A warm-up that rises
//!    fast and then stays flat fits a line badly, a leak fits it well;
//! 4. the growth is spread out: at least [`MIN_RISES`] separate increases.
//!    One jump (the allocator taking one more segment) is not a trend;
//! 5. it is monotone-ish: the bytes of all decreases add up to at most
//!    [`MAX_DROP_RATIO`] of the bytes of all increases. A cache that fills and
//!    is emptied again saws up and down; a leak only climbs.
//!
//! A plateau fails 2–4 (no slope, R² of a flat line is 0, no rises).

use super::history::Point;
use super::LiveError;
use crate::units::{format_bytes, parse_size};
use serde::Serialize;
use std::collections::HashMap;

/// Fewest samples in the window before growth is judged.
pub const MIN_SAMPLES: usize = 6;
/// Smallest fraction of variance the fitted line must explain.
pub const MIN_R2: f64 = 0.8;
/// Fewest separate increases in the window.
pub const MIN_RISES: usize = 3;
/// Largest ratio of bytes lost in decreases to bytes gained in increases.
pub const MAX_DROP_RATIO: f64 = 0.1;

/// The growth rule: a slope threshold over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrowthRule {
    /// Smallest slope that counts, in bytes per second.
    pub min_rate: f64,
    /// The window the slope is fitted over, in seconds.
    pub window_s: f64,
}

impl GrowthRule {
    /// Parses a rate such as `100MiB/min`, `1MiB/s`, `2GiB/h`; a bare size
    /// (`100MiB`) is per minute.
    pub fn parse_rate(text: &str) -> Result<f64, LiveError> {
        let (size, per) = match text.rsplit_once('/') {
            Some((s, p)) => (s, p.trim().to_ascii_lowercase()),
            None => (text, "min".to_string()),
        };
        let seconds = match per.as_str() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            other => {
                return Err(LiveError::Usage(format!(
                    "invalid growth rate {text:?}: unknown period {other:?} (use /s, /min or /h)"
                )))
            }
        };
        let bytes = parse_size(size)
            .map_err(|e| LiveError::Usage(format!("invalid growth rate {text:?}: {e}")))?;
        if bytes == 0 {
            return Err(LiveError::Usage(format!(
                "invalid growth rate {text:?}: must be above zero"
            )));
        }
        Ok(bytes as f64 / seconds)
    }
}

/// What a growth check found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Growth {
    /// The fitted slope, bytes per second.
    pub rate: f64,
    /// How well the line fits (0..1).
    pub r2: f64,
    /// Last minus first value in the window, bytes.
    pub grown: i64,
}

/// Checks `points` (oldest first, already cut to the window) against `rule`;
/// Some when the process grows steadily as the module defines it.
pub fn detect_growth(points: &[Point], rule: &GrowthRule) -> Option<Growth> {
    let (first, last) = (points.first()?, points.last()?);
    if points.len() < MIN_SAMPLES || last.0 - first.0 < rule.window_s / 2.0 {
        return None;
    }
    let (rate, r2) = fit(points)?;
    let (mut rises, mut up, mut down) = (0usize, 0f64, 0f64);
    for w in points.windows(2) {
        if let [a, b] = w {
            if b.1 > a.1 {
                rises += 1;
                up += (b.1 - a.1) as f64;
            } else {
                down += (a.1 - b.1) as f64;
            }
        }
    }
    let steady =
        rate >= rule.min_rate && r2 >= MIN_R2 && rises >= MIN_RISES && down <= MAX_DROP_RATIO * up;
    steady.then(|| Growth {
        rate,
        r2,
        grown: last.1 as i64 - first.1 as i64,
    })
}

/// Least-squares slope (bytes per second) and R² of `points`; None when the
/// times do not vary. A flat series has R² 0 (nothing to explain, no trend).
fn fit(points: &[Point]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let t0 = points.first()?.0;
    let mean_t = points.iter().map(|p| p.0 - t0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let (mut stt, mut sty, mut syy) = (0.0, 0.0, 0.0);
    for p in points {
        let (dt, dy) = (p.0 - t0 - mean_t, p.1 as f64 - mean_y);
        stt += dt * dt;
        sty += dt * dy;
        syy += dy * dy;
    }
    if stt <= 0.0 {
        return None;
    }
    let slope = sty / stt;
    let r2 = if syy > 0.0 {
        (sty * sty) / (stt * syy)
    } else {
        0.0
    };
    Some((slope, r2))
}

/// The near-full rule: a GPU whose used memory reaches this.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AboveRule {
    /// A percentage of total memory (0–100).
    Percent(f64),
    /// An absolute size in bytes.
    Bytes(u64),
}

impl AboveRule {
    /// Parses `90%`, `90` (a percentage) or a size such as `75GiB`.
    pub fn parse(text: &str) -> Result<Self, LiveError> {
        let t = text.trim();
        let pct = t.strip_suffix('%').unwrap_or(t).trim();
        if let Ok(p) = pct.parse::<f64>() {
            if (0.0..=100.0).contains(&p) {
                return Ok(AboveRule::Percent(p));
            }
            return Err(LiveError::Usage(format!(
                "invalid threshold {text:?}: a percentage is between 0 and 100"
            )));
        }
        parse_size(t).map(AboveRule::Bytes).map_err(|_| {
            LiveError::Usage(format!(
                "invalid threshold {text:?}: expected a percentage (90%) or a size (75GiB)"
            ))
        })
    }

    /// True when `used` of `total` reaches the threshold.
    pub fn reached(&self, used: u64, total: u64) -> bool {
        match *self {
            AboveRule::Percent(p) => total > 0 && used as f64 >= p / 100.0 * total as f64,
            AboveRule::Bytes(b) => used >= b,
        }
    }
}

/// The kinds of alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A process's memory grows steadily (`--alert-growth`).
    Growth,
    /// A GPU is near full (`--alert-above`).
    GpuFull,
    /// A process's own leak detector fired (from its publication file).
    LeakAlarm,
}

impl AlertKind {
    /// The name used in JSON and in `MEMLENS_ALERT_KIND`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::Growth => "growth",
            AlertKind::GpuFull => "gpu_full",
            AlertKind::LeakAlarm => "leak_alarm",
        }
    }
}

/// One alert condition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    /// What kind of condition.
    pub kind: AlertKind,
    /// The GPU index.
    pub gpu: u32,
    /// The process, for per-process alerts.
    pub pid: Option<u32>,
    /// One line for people.
    pub message: String,
    /// When the condition was first seen (Unix seconds).
    pub since: f64,
}

impl Alert {
    /// A growth alert's message.
    pub fn growth_message(pid: u32, gpu: u32, g: &Growth, window_s: f64) -> String {
        format!(
            "pid {pid} on GPU {gpu} grows steadily: {}/min over the last {window_s:.0} s (R² {:.2})",
            format_bytes(g.rate.max(0.0) as u64 * 60),
            g.r2
        )
    }

    /// A near-full alert's message.
    pub fn full_message(gpu: u32, used: u64, total: u64) -> String {
        let pct = if total > 0 {
            used as f64 * 100.0 / total as f64
        } else {
            0.0
        };
        format!(
            "GPU {gpu} is {pct:.0}% full: {} of {}",
            format_bytes(used),
            format_bytes(total)
        )
    }
}

type Key = (AlertKind, u32, Option<u32>);

/// Fires each alert condition once: when it starts to hold. A condition is
/// forgotten (and may fire again) only after it has not held for
/// `clear_after_s`, so a GPU hovering at the threshold does not fire every
/// other tick.
#[derive(Debug, Clone)]
pub struct AlertTracker {
    clear_after_s: f64,
    // key -> (first seen, last seen)
    known: HashMap<Key, (f64, f64)>,
}

impl AlertTracker {
    /// A tracker that re-arms a condition after `clear_after_s` without it.
    pub fn new(clear_after_s: f64) -> Self {
        AlertTracker {
            clear_after_s,
            known: HashMap::new(),
        }
    }

    /// Takes the conditions holding at `now`; sets each one's `since` and
    /// returns the ones that just started (to announce, to run `--on-alert`).
    pub fn update(&mut self, now: f64, holding: &mut [Alert]) -> Vec<Alert> {
        let mut fired = Vec::new();
        for a in holding.iter_mut() {
            let key = (a.kind, a.gpu, a.pid);
            match self.known.get_mut(&key) {
                Some(seen) => {
                    seen.1 = now;
                    a.since = seen.0;
                }
                None => {
                    self.known.insert(key, (now, now));
                    a.since = now;
                    fired.push(a.clone());
                }
            }
        }
        let clear = self.clear_after_s;
        self.known.retain(|_, seen| now - seen.1 < clear);
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn rule() -> GrowthRule {
        GrowthRule {
            min_rate: 1.0 * MIB as f64, // 1 MiB/s
            window_s: 30.0,
        }
    }

    #[test]
    fn steady_staircase_growth_is_detected() {
        // A leak as NVML shows it: +20 MiB segments every 3 s, flat between.
        let pts: Vec<Point> = (0..31)
            .map(|t| (t as f64, 1000 * MIB + (t / 3) * 20 * MIB))
            .collect();
        let g = detect_growth(&pts, &rule()).expect("growth");
        assert!((g.rate / MIB as f64 - 6.67).abs() < 0.5, "{}", g.rate);
        assert!(g.r2 > 0.95);
        assert_eq!(g.grown, 200 * MIB as i64);
    }

    #[test]
    fn warmup_then_plateau_is_not_growth() {
        // The caching allocator fills up in the first seconds, then holds.
        let pts: Vec<Point> = (0..31)
            .map(|t| (t as f64, 1000 * MIB + (t.min(4) * 500 * MIB)))
            .collect();
        assert_eq!(detect_growth(&pts, &rule()), None);
        // A flat plateau: no slope at all.
        let flat: Vec<Point> = (0..31).map(|t| (t as f64, 5000 * MIB)).collect();
        assert_eq!(detect_growth(&flat, &rule()), None);
        assert_eq!(fit(&flat).map(|f| f.1), Some(0.0));
    }

    #[test]
    fn single_jump_and_sawtooth_are_not_growth() {
        let jump: Vec<Point> = (0..31)
            .map(|t| (t as f64, if t < 15 { 1000 * MIB } else { 2000 * MIB }))
            .collect();
        assert_eq!(detect_growth(&jump, &rule()), None);
        // A cache filled and emptied: rises and drops.
        let saw: Vec<Point> = (0..31)
            .map(|t| (t as f64, 1000 * MIB + (t % 5) * 100 * MIB + t * 2 * MIB))
            .collect();
        assert_eq!(detect_growth(&saw, &rule()), None);
    }

    #[test]
    fn slow_growth_and_short_history_are_not_flagged() {
        let slow: Vec<Point> = (0..31).map(|t| (t as f64, t * MIB / 4)).collect();
        assert_eq!(detect_growth(&slow, &rule()), None);
        let short: Vec<Point> = (0..5).map(|t| (t as f64, t * 100 * MIB)).collect();
        assert_eq!(detect_growth(&short, &rule()), None);
        assert_eq!(detect_growth(&[], &rule()), None);
    }

    #[test]
    fn parses_rates_and_thresholds() {
        let mib = MIB as f64;
        assert_eq!(GrowthRule::parse_rate("60MiB/min").unwrap(), mib);
        assert_eq!(GrowthRule::parse_rate("60MiB").unwrap(), mib);
        assert_eq!(GrowthRule::parse_rate("2MiB/s").unwrap(), 2.0 * mib);
        assert_eq!(GrowthRule::parse_rate("3600MiB/h").unwrap(), mib);
        assert!(GrowthRule::parse_rate("1MiB/fortnight").is_err());
        assert!(GrowthRule::parse_rate("0/s").is_err());
        assert!(GrowthRule::parse_rate("lots").is_err());
        assert_eq!(AboveRule::parse("90%").unwrap(), AboveRule::Percent(90.0));
        assert_eq!(AboveRule::parse("85").unwrap(), AboveRule::Percent(85.0));
        assert_eq!(
            AboveRule::parse("75GiB").unwrap(),
            AboveRule::Bytes(75 << 30)
        );
        assert!(AboveRule::parse("150%").is_err());
        assert!(AboveRule::parse("full").is_err());
        assert!(AboveRule::Percent(90.0).reached(91, 100));
        assert!(!AboveRule::Percent(90.0).reached(89, 100));
        assert!(!AboveRule::Percent(90.0).reached(0, 0));
        assert!(AboveRule::Bytes(10).reached(10, 100));
    }

    fn alert(gpu: u32) -> Alert {
        Alert {
            kind: AlertKind::GpuFull,
            gpu,
            pid: None,
            message: String::new(),
            since: 0.0,
        }
    }

    #[test]
    fn tracker_fires_once_per_condition() {
        let mut t = AlertTracker::new(10.0);
        assert_eq!(t.update(0.0, &mut [alert(0)]).len(), 1);
        let mut again = [alert(0), alert(1)];
        let fired = t.update(1.0, &mut again);
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].gpu, 1);
        assert_eq!(again[0].since, 0.0);
        // Gone briefly (below the threshold for 5 s): not fired again.
        assert!(t.update(5.0, &mut []).is_empty());
        assert!(t.update(6.0, &mut [alert(0)]).is_empty());
        // Gone for longer than clear_after_s: fires again when it returns.
        assert!(t.update(20.0, &mut []).is_empty());
        assert_eq!(t.update(21.0, &mut [alert(0)]).len(), 1);
    }
}
