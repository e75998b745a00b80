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

/// [`format_bytes`] of a signed count (a residual, a change): `-20.00 MiB`.
pub fn format_signed_bytes(bytes: i64) -> String {
    if bytes < 0 {
        format!("-{}", format_bytes(bytes.unsigned_abs()))
    } else {
        format_bytes(bytes.unsigned_abs())
    }
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

/// `1234567` as `1,234,567`: the one digit grouping of every text memlens prints.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Formats a signed byte difference with its sign: `+39.00 MiB`, `-2.00 MiB`.
pub fn format_delta(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", format_bytes(delta.unsigned_abs()))
}

/// Where a [`KnownDevice`] figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceMemorySource {
    /// The usable total as PyTorch reports it (`cudaMemGetInfo`'s total,
    /// `get_device_properties().total_memory` in MiB, or the "total capacity"
    /// of real OOM messages). It moves by a few MiB between drivers.
    Measured,
    /// The marketed capacity, in GiB; the usable total is some hundreds of MiB
    /// lower.
    Nominal,
}

/// A GPU whose memory [`parse_device_memory`] knows by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownDevice {
    /// The name shown to users, e.g. `H100-80GB`.
    pub name: &'static str,
    /// Normalised keys that name it (see [`parse_device_memory`]).
    keys: &'static [&'static str],
    /// Its total memory in MiB.
    pub mib: u64,
    /// Whether `mib` was measured or is nominal.
    pub source: DeviceMemorySource,
}

impl KnownDevice {
    /// Total memory in bytes.
    pub fn bytes(&self) -> u64 {
        self.mib << 20
    }
}

use DeviceMemorySource::{Measured, Nominal};

/// The GPUs [`parse_device_memory`] knows. Measured totals come from real
/// `torch.cuda.get_device_properties` output and OOM messages; where drivers
/// differ, the one this project's fixtures ran under wins (H100 80GB HBM3:
/// 81082 MiB, printed "79.18 GiB" as in `oom.stats.json`; other drivers report
/// up to 81090 MiB, "79.19 GiB"). AMD MI250X counts one GCD, which is what
/// PyTorch sees as a device.
pub const KNOWN_DEVICES: &[KnownDevice] = &[
    KnownDevice {
        name: "A100-40GB",
        keys: &["a10040"],
        mib: 40536,
        source: Measured,
    },
    KnownDevice {
        name: "A100-80GB",
        keys: &["a10080"],
        mib: 81251,
        source: Measured,
    },
    KnownDevice {
        name: "A100-80GB-PCIe",
        keys: &["a10080pcie"],
        mib: 81050,
        source: Measured,
    },
    KnownDevice {
        name: "H100-80GB",
        keys: &["h100", "h10080"],
        mib: 81082,
        source: Measured,
    },
    KnownDevice {
        name: "H100-NVL",
        keys: &["h100nvl", "h100nvl94", "h100nvl96"],
        mib: 95252,
        source: Measured,
    },
    KnownDevice {
        name: "H200",
        keys: &["h200", "h200141"],
        mib: 143156,
        source: Measured,
    },
    KnownDevice {
        name: "H20",
        keys: &["h20", "h2096"],
        mib: 97285,
        source: Measured,
    },
    KnownDevice {
        name: "B200",
        keys: &["b200", "b200180", "b200192"],
        mib: 182642,
        source: Measured,
    },
    KnownDevice {
        name: "L4",
        keys: &["l4", "l424"],
        mib: 24 * 1024,
        source: Nominal,
    },
    KnownDevice {
        name: "L40",
        keys: &["l40", "l4048"],
        mib: 45466,
        source: Measured,
    },
    KnownDevice {
        name: "L40S",
        keys: &["l40s", "l40s48"],
        mib: 45589,
        source: Measured,
    },
    KnownDevice {
        name: "A10",
        keys: &["a10", "a1024"],
        mib: 22518,
        source: Measured,
    },
    KnownDevice {
        name: "A10G",
        keys: &["a10g", "a10g24"],
        mib: 22587,
        source: Measured,
    },
    KnownDevice {
        name: "T4",
        keys: &["t4", "t416"],
        mib: 15095,
        source: Measured,
    },
    KnownDevice {
        name: "V100-16GB",
        keys: &["v10016"],
        mib: 16160,
        source: Measured,
    },
    KnownDevice {
        name: "V100-32GB",
        keys: &["v10032"],
        mib: 32510,
        source: Measured,
    },
    KnownDevice {
        name: "RTX3090",
        keys: &["rtx3090", "rtx309024"],
        mib: 24259,
        source: Measured,
    },
    KnownDevice {
        name: "RTX4090",
        keys: &["rtx4090", "rtx409024"],
        mib: 24563,
        source: Measured,
    },
    KnownDevice {
        name: "RTX5090",
        keys: &["rtx5090", "rtx509032"],
        mib: 32113,
        source: Measured,
    },
    KnownDevice {
        name: "A6000",
        keys: &["a6000", "rtxa6000", "a600048", "rtxa600048"],
        mib: 48676,
        source: Measured,
    },
    KnownDevice {
        name: "MI250X",
        keys: &["mi250x", "mi250x64", "mi250x128", "mi250", "mi25064"],
        mib: 65516,
        source: Measured,
    },
    KnownDevice {
        name: "MI300X",
        keys: &["mi300x", "mi300x192"],
        mib: 196588,
        source: Measured,
    },
];

/// Names that need their memory size to be told apart.
const AMBIGUOUS_DEVICES: &[(&str, &str)] = &[
    ("a100", "A100-40GB or A100-80GB"),
    ("v100", "V100-16GB or V100-32GB"),
];

/// Reads a device memory size: a size as [`parse_size`] reads it (`80GB`,
/// `79.18GiB`, `85020639232`), or a GPU name from [`KNOWN_DEVICES`] such as
/// `H100`, `H100-80GB`, `H100 (80GB)`, `NVIDIA H100 80GB HBM3`, `A100-80GB`,
/// `h200`, `RTX 4090`, `MI300X`. Names are case-insensitive; spaces, dashes,
/// underscores, parentheses, vendor words (NVIDIA, GeForce, Tesla, AMD,
/// Instinct), form factors (SXM, HBM3) and a trailing `GB` do not matter.
pub fn parse_device_memory(text: &str) -> Result<u64> {
    if let Ok(bytes) = parse_size(text) {
        return Ok(bytes);
    }
    lookup_device(text).map(|d| d.bytes())
}

/// The [`KnownDevice`] a GPU name refers to (see [`parse_device_memory`]).
pub fn lookup_device(name: &str) -> Result<&'static KnownDevice> {
    let (key, pcie) = device_key(name);
    let find = |k: &str| KNOWN_DEVICES.iter().find(|d| d.keys.contains(&k));
    let found = if pcie {
        find(&format!("{key}pcie"))
    } else {
        None
    };
    if let Some(d) = found.or_else(|| find(&key)) {
        return Ok(d);
    }
    if let Some((_, which)) = AMBIGUOUS_DEVICES.iter().find(|(k, _)| *k == key) {
        return Err(Error::usage(format!(
            "ambiguous GPU {name:?}: say {which}, or give a size such as 80GB"
        )));
    }
    let names: Vec<&str> = KNOWN_DEVICES.iter().map(|d| d.name).collect();
    Err(Error::usage(format!(
        "unknown GPU or size {name:?}: give a size (80GB, 79.18GiB, a number of bytes) or one of {}",
        names.join(", ")
    )))
}

/// The normalised key of a GPU name, and whether it said PCIe.
fn device_key(name: &str) -> (String, bool) {
    let mut key: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    for word in ["nvidia", "geforce", "tesla", "instinct", "amd"] {
        key = key.replace(word, "");
    }
    let pcie = key.contains("pcie");
    for word in [
        "pcie", "hbm3e", "hbm3", "hbm2e", "hbm2", "gddr6x", "gddr6", "sxm5", "sxm4", "sxm2", "sxm",
    ] {
        key = key.replace(word, "");
    }
    if let Some(k) = key.strip_suffix("gb") {
        key = k.to_string();
    }
    (key, pcie)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits() {
        assert_eq!(group_digits(67_891_200), "67,891,200");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(0), "0");
    }

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
    fn device_memory_by_name() {
        let h100 = 81082u64 << 20;
        for name in [
            "H100",
            "h100",
            "H100-80GB",
            "H100 (80GB)",
            "NVIDIA H100 80GB HBM3",
            "h100_80gb",
            "H100 SXM5 80GB",
        ] {
            assert_eq!(parse_device_memory(name).unwrap(), h100, "{name}");
        }
        // Prints as the oom fixture's "total capacity of 79.18 GiB".
        assert_eq!(format!("{:.2}", h100 as f64 / GIB), "79.18");
        assert_eq!(parse_device_memory("A100-40GB").unwrap(), 40536 << 20);
        assert_eq!(parse_device_memory("A100-SXM4-80GB").unwrap(), 81251 << 20);
        assert_eq!(parse_device_memory("A100 80GB PCIe").unwrap(), 81050 << 20);
        assert_eq!(parse_device_memory("H200").unwrap(), 143156 << 20);
        assert_eq!(parse_device_memory("H200 (141GB)").unwrap(), 143156 << 20);
        assert_eq!(parse_device_memory("h20").unwrap(), 97285 << 20);
        assert_eq!(parse_device_memory("L4").unwrap(), 24 << 30);
        assert_eq!(parse_device_memory("l40s").unwrap(), 45589 << 20);
        assert_eq!(parse_device_memory("A10").unwrap(), 22518 << 20);
        assert_eq!(parse_device_memory("A10G").unwrap(), 22587 << 20);
        assert_eq!(parse_device_memory("Tesla T4").unwrap(), 15095 << 20);
        assert_eq!(parse_device_memory("V100-16GB").unwrap(), 16160 << 20);
        assert_eq!(parse_device_memory("v100 32gb").unwrap(), 32510 << 20);
        assert_eq!(parse_device_memory("RTX3090").unwrap(), 24259 << 20);
        assert_eq!(
            parse_device_memory("GeForce RTX 4090").unwrap(),
            24563 << 20
        );
        assert_eq!(parse_device_memory("rtx-5090").unwrap(), 32113 << 20);
        assert_eq!(parse_device_memory("RTX A6000").unwrap(), 48676 << 20);
        assert_eq!(parse_device_memory("MI250X").unwrap(), 65516 << 20);
        assert_eq!(
            parse_device_memory("AMD Instinct MI300X").unwrap(),
            196588 << 20
        );
        assert_eq!(parse_device_memory("B200").unwrap(), 182642 << 20);
    }

    #[test]
    fn device_memory_sizes_and_errors() {
        assert_eq!(parse_device_memory("80GB").unwrap(), 80_000_000_000);
        assert_eq!(
            parse_device_memory("79.18GiB").unwrap(),
            (79.18 * GIB).round() as u64
        );
        assert_eq!(parse_device_memory("1234").unwrap(), 1234);
        let e = parse_device_memory("A100").unwrap_err().to_string();
        assert!(e.contains("A100-40GB or A100-80GB"), "{e}");
        let e = parse_device_memory("Voodoo5").unwrap_err().to_string();
        assert!(
            e.contains("unknown GPU") && e.contains("H100-80GB") && e.contains("MI300X"),
            "{e}"
        );
        assert!(parse_device_memory("").is_err());
        // Every key is what device_key makes of it, so each entry is reachable.
        for d in KNOWN_DEVICES {
            for k in d.keys {
                let (key, pcie) = device_key(k);
                let key = if pcie { key + "pcie" } else { key };
                assert_eq!(key, *k, "{}", d.name);
            }
            assert_eq!(lookup_device(d.name).unwrap().name, d.name);
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(20 << 20), "20.00 MiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(format_delta(-(2 << 20)), "-2.00 MiB");
    }
}
