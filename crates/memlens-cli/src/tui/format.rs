//! Small text pieces shared by the terminal UI and the plain-text output of
//! `memlens top`: sizes, sparklines, process labels, clock times.

use memlens::live::procfs::Visibility;
use memlens::live::ProcessSample;
use memlens::units::{format_bytes, format_delta};

/// The eight heights of a text sparkline.
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A text sparkline of `values`, scaled between their minimum and maximum
/// (memory moves little relative to its level; scaling from zero would draw
/// a flat line for every leak). A flat series is drawn at mid height.
pub fn sparkline(values: &[u64]) -> String {
    let (Some(lo), Some(hi)) = (values.iter().min(), values.iter().max()) else {
        return String::new();
    };
    let span = hi - lo;
    values
        .iter()
        .map(|v| {
            if span == 0 {
                BARS[3]
            } else {
                let level = ((v - lo) as u128 * 7 / span as u128) as usize;
                BARS[level.min(7)]
            }
        })
        .collect()
}

/// Bytes for people, or a dash when unknown.
pub fn bytes_or_dash(b: Option<u64>) -> String {
    b.map(format_bytes).unwrap_or_else(|| "—".to_string())
}

/// A signed difference for people, or a dash when unknown.
pub fn delta_or_dash(d: Option<i64>) -> String {
    d.map(format_delta).unwrap_or_else(|| "—".to_string())
}

/// Percentage of `part` in `total`, 0 when total is 0.
pub fn percent(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}

/// The command column: the command line, or why it is withheld.
pub fn command_label(p: &ProcessSample) -> String {
    match p.visibility {
        Visibility::Local => {
            let cmd = p
                .cmdline
                .clone()
                .unwrap_or_else(|| format!("pid {}", p.pid));
            if p.seen_by_nvml {
                cmd
            } else {
                format!("{cmd}  [not listed by NVML: other PID namespace?]")
            }
        }
        Visibility::NotInNamespace => format!("pid {} (not in this PID namespace)", p.pid),
        Visibility::OtherProcess => format!(
            "pid {} (not in this PID namespace; here that PID is another process)",
            p.pid
        ),
    }
}

/// The user column.
pub fn user_label(p: &ProcessSample) -> String {
    p.user.clone().unwrap_or_else(|| "?".to_string())
}

/// `HH:MM:SS` (UTC) of a Unix time.
pub fn clock(t: f64) -> String {
    let s = if t.is_finite() && t > 0.0 {
        t as u64
    } else {
        0
    };
    format!("{:02}:{:02}:{:02}Z", s / 3600 % 24, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparklines() {
        assert_eq!(sparkline(&[]), "");
        assert_eq!(sparkline(&[5, 5]), "▄▄");
        assert_eq!(sparkline(&[0, 7, 14]), "▁▄█");
        assert_eq!(sparkline(&[u64::MAX, 0]), "█▁");
    }

    #[test]
    fn labels() {
        assert_eq!(clock(3661.5), "01:01:01Z");
        assert_eq!(clock(f64::NAN), "00:00:00Z");
        assert_eq!(bytes_or_dash(None), "—");
        assert_eq!(delta_or_dash(Some(-(1 << 20))), "-1.00 MiB");
        assert_eq!(percent(1, 0), 0.0);
    }
}
