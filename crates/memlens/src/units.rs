//! Byte sizes: parsing what users type (`8GiB`, `512MiB`, `80GB`, `1234`) and
//! formatting sizes for people.

use crate::error::{Error, Result};

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Parses a size such as `8GiB`, `512MiB`, `80GB`, `1.5 GiB` or plain bytes.
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB,
/// GB, TB) powers of 1000, as `nvidia-smi` and GPU names use them.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|c| *c != '_').collect();
    let value: f64 = num.parse().map_err(|_| {
        Error::usage(format!(
            "invalid size {text:?}: expected e.g. 8GiB, 512MiB, 80GB or a number of bytes"
        ))
    })?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => GIB * KIB,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(Error::usage(format!(
                "invalid size {text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            )))
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(Error::usage(format!("invalid size {text:?}: out of range")));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes for people, in binary units with two decimals: `1.50 GiB`,
/// `20.00 MiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else if b >= MIB {
        format!("{:.2} MiB", b / MIB)
    } else if b >= KIB {
        format!("{:.2} KiB", b / KIB)
    } else {
        format!("{bytes} B")
    }
}

/// Formats a signed byte difference with its sign: `+39.00 MiB`, `-2.00 MiB`.
pub fn format_delta(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", format_bytes(delta.unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("1234").unwrap(), 1234);
        assert_eq!(parse_size("1.5 GiB").unwrap(), 3 << 29);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(20 << 20), "20.00 MiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(format_delta(-(2 << 20)), "-2.00 MiB");
    }
}
