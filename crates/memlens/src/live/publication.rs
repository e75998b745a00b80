//! The publication files `memlens.record` writes: the allocator's own figures
//! of a running PyTorch process, which NVML cannot see.
//!
//! The format (shared with the Python side; keep it exactly):
//! * directory `$MEMLENS_RUNTIME_DIR`, or else `/tmp/memlens-<uid>`;
//! * one file `<pid>-<device>.json` per process and device, replaced
//!   atomically (tmp file + rename) at most once a second;
//! * keys `schema` ("memlens/1"), `pid`, `device`, `rank` (int or null),
//!   `step` (int or null), `allocated_bytes`, `reserved_bytes`, `active_bytes`,
//!   `peak_allocated_bytes`, `time` (Unix seconds), `leak_alarm` (str or null),
//!   `cmdline`, and (optional, for the device's account) `cuda_total_bytes`:
//!   the device's total as CUDA counts it.
//!
//! Readers ignore files older than [`MAX_AGE_S`], files whose process is gone,
//! and anything that does not parse: the directory is shared and may hold
//! half-written temporaries or files of other versions.

use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Publications older than this (by their `time`) are stale and ignored.
pub const MAX_AGE_S: f64 = 10.0;

/// Files larger than this are not publications; they are skipped unread.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// The environment variable that overrides the publication directory.
pub const RUNTIME_DIR_ENV: &str = "MEMLENS_RUNTIME_DIR";

/// One process's allocator figures on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Publication {
    /// The publishing process's PID (in its own PID namespace).
    pub pid: u32,
    /// The CUDA device index as the process numbers it (after
    /// `CUDA_VISIBLE_DEVICES`).
    pub device: u32,
    /// The distributed rank, when there is one.
    #[serde(default)]
    pub rank: Option<i64>,
    /// The training step, when the process reports steps.
    #[serde(default)]
    pub step: Option<u64>,
    /// Bytes in live tensors (`torch.cuda.memory_allocated`).
    pub allocated_bytes: u64,
    /// Bytes the caching allocator holds from CUDA (`memory_reserved`).
    pub reserved_bytes: u64,
    /// Bytes in active blocks (allocated plus blocks awaiting stream sync).
    pub active_bytes: u64,
    /// Peak of `allocated_bytes` since the process started or reset it.
    pub peak_allocated_bytes: u64,
    /// When the figures were taken, Unix seconds.
    pub time: f64,
    /// The process's own leak detector's message, when it fired.
    #[serde(default)]
    pub leak_alarm: Option<String>,
    /// The process's command line.
    #[serde(default)]
    pub cmdline: String,
    /// The device's total memory as CUDA counts it
    /// (`get_device_properties().total_memory`): NVML's total less what the
    /// driver keeps.
    #[serde(default)]
    pub cuda_total_bytes: Option<u64>,
}

#[derive(Deserialize)]
struct Tagged {
    schema: String,
    #[serde(flatten)]
    body: Publication,
}

/// The publication directory: `$MEMLENS_RUNTIME_DIR`, or `/tmp/memlens-<uid>`.
pub fn default_dir(uid: Option<u32>) -> Option<PathBuf> {
    match std::env::var_os(RUNTIME_DIR_ENV) {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => uid.map(|u| PathBuf::from(format!("/tmp/memlens-{u}"))),
    }
}

/// The (pid, device) a file name `<pid>-<device>.json` announces.
fn parse_name(name: &str) -> Option<(u32, u32)> {
    let stem = name.strip_suffix(".json")?;
    let (pid, device) = stem.split_once('-')?;
    Some((pid.parse().ok()?, device.parse().ok()?))
}

/// Parses one publication; None for anything that is not a current
/// `memlens/1` publication (wrong schema, missing keys, wrong types, stale).
pub fn parse(bytes: &[u8], now: f64) -> Option<Publication> {
    let tagged: Tagged = serde_json::from_slice(bytes).ok()?;
    if tagged.schema != crate::JSON_SCHEMA {
        return None;
    }
    let p = tagged.body;
    let age = now - p.time;
    // A time far in the future is as wrong as a stale one.
    (-MAX_AGE_S..=MAX_AGE_S).contains(&age).then_some(p)
}

/// Reads every current publication in `dir` whose process `alive` says is
/// still running. A missing or unreadable directory is simply empty.
pub fn read_dir(dir: &Path, now: f64, alive: &dyn Fn(u32) -> bool) -> Vec<Publication> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, device)) = name.to_str().and_then(parse_name) else {
            continue;
        };
        if !alive(pid) {
            continue;
        }
        let Some(p) = read_file(&entry.path()).and_then(|b| parse(&b, now)) else {
            continue;
        };
        // The name and the content must agree, or the file is not trusted.
        if p.pid == pid && p.device == device {
            out.push(p);
        }
    }
    out.sort_by_key(|p| (p.pid, p.device));
    out
}

fn read_file(path: &Path) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= MAX_FILE_BYTES).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::super::procfs::testing::scratch;
    use super::*;

    const NOW: f64 = 1_800_000_000.0;

    fn doc(pid: u32, device: u32, time: f64) -> String {
        format!(
            r#"{{"schema":"memlens/1","pid":{pid},"device":{device},"rank":null,"step":17,
            "allocated_bytes":1000,"reserved_bytes":2000,"active_bytes":1100,
            "peak_allocated_bytes":1500,"time":{time},"leak_alarm":null,"cmdline":"python train.py"}}"#
        )
    }

    #[test]
    fn parses_the_format() {
        let p = parse(doc(42, 1, NOW - 1.5).as_bytes(), NOW).unwrap();
        assert_eq!((p.pid, p.device, p.step, p.rank), (42, 1, Some(17), None));
        assert_eq!((p.allocated_bytes, p.reserved_bytes), (1000, 2000));
        assert_eq!((p.active_bytes, p.peak_allocated_bytes), (1100, 1500));
        assert_eq!(p.cmdline, "python train.py");
        assert_eq!(p.leak_alarm, None);
        let alarm =
            doc(42, 1, NOW).replace(r#""leak_alarm":null"#, r#""leak_alarm":"+2 MiB/step""#);
        assert_eq!(
            parse(alarm.as_bytes(), NOW).unwrap().leak_alarm.as_deref(),
            Some("+2 MiB/step")
        );
    }

    #[test]
    fn rejects_stale_wrong_schema_and_garbage() {
        assert!(parse(doc(42, 0, NOW - 11.0).as_bytes(), NOW).is_none());
        assert!(parse(doc(42, 0, NOW + 60.0).as_bytes(), NOW).is_none());
        assert!(parse(
            doc(42, 0, NOW).replace("memlens/1", "memlens/2").as_bytes(),
            NOW
        )
        .is_none());
        assert!(parse(doc(42, 0, NOW).replace("1000", "-1").as_bytes(), NOW).is_none());
        assert!(parse(doc(42, 0, NOW).replace("2000", "\"2000\"").as_bytes(), NOW).is_none());
        assert!(parse(b"{\"schema\":\"memlens/1\"}", NOW).is_none());
        assert!(parse(b"\x00\xff garbage", NOW).is_none());
        assert!(parse(b"", NOW).is_none());
    }

    #[test]
    fn reads_a_directory_tolerating_garbage() {
        let dir = scratch("pubs");
        std::fs::write(dir.join("42-0.json"), doc(42, 0, NOW)).unwrap();
        std::fs::write(dir.join("42-1.json"), doc(42, 1, NOW - 2.0)).unwrap();
        std::fs::write(dir.join("43-0.json"), doc(43, 0, NOW - 30.0)).unwrap(); // stale
        std::fs::write(dir.join("44-0.json"), doc(44, 0, NOW)).unwrap(); // dead pid
        std::fs::write(dir.join("45-0.json"), doc(46, 0, NOW)).unwrap(); // name disagrees
        std::fs::write(dir.join("47-0.json"), "{not json").unwrap();
        std::fs::write(dir.join("48-0.json.tmp"), doc(48, 0, NOW)).unwrap();
        std::fs::write(dir.join("README"), "hello").unwrap();
        std::fs::create_dir(dir.join("49-0.json")).unwrap();
        std::fs::write(dir.join("50-0.json"), vec![b' '; 100_000]).unwrap();
        let alive = |pid: u32| pid != 44;
        let got: Vec<(u32, u32)> = read_dir(&dir, NOW, &alive)
            .iter()
            .map(|p| (p.pid, p.device))
            .collect();
        assert_eq!(got, [(42, 0), (42, 1)]);
        assert!(read_dir(&dir.join("missing"), NOW, &alive).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn names() {
        assert_eq!(parse_name("123-0.json"), Some((123, 0)));
        assert_eq!(parse_name("123-x.json"), None);
        assert_eq!(parse_name("123.json"), None);
        assert_eq!(parse_name("123-0.json.tmp"), None);
        assert!(default_dir(Some(1000)).is_some());
    }
}
