//! What `memlens estimate --compare` reads: a measurement of the same model and
//! settings, as a snapshot, a `memlens peak --json` document or a saved
//! `torch.cuda.memory_stats()`.

use super::MeasuredMemory;
use crate::analysis::peak::peak;
use crate::{Error, Result, Snapshot};
use std::path::Path;

fn io(path: &Path, error: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// A `--compare` file this small may be a JSON measurement rather than a snapshot.
const MAX_MEASURED_JSON: u64 = 64 << 20;

/// Reads what `--compare` names: a snapshot (its peak and categories, by the
/// same analysis as `memlens peak`), the JSON of `memlens peak --json`, or a
/// saved `torch.cuda.memory_stats()` (peak only; top level or under
/// `memory_stats`).
pub fn read_measured(path: &Path) -> Result<MeasuredMemory> {
    if let Some(m) = read_measured_json(path)? {
        return Ok(m);
    }
    let snap = Snapshot::load(path)?;
    let r = peak(&snap, 0);
    Ok(MeasuredMemory {
        peak_allocated_bytes: r.peak_allocated_bytes,
        categories: r.categories,
    })
}

/// The measurement in a small JSON document, or `None` when the file is
/// something else (a snapshot).
fn read_measured_json(path: &Path) -> Result<Option<MeasuredMemory>> {
    let meta = std::fs::metadata(path).map_err(|error| io(path, error))?;
    if meta.len() > MAX_MEASURED_JSON {
        return Ok(None);
    }
    let bytes = std::fs::read(path).map_err(|error| io(path, error))?;
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Ok(None);
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(None);
    };
    if v.get("peak_allocated_bytes").is_some() {
        let m = serde_json::from_value(v).map_err(|e| {
            Error::usage(format!(
                "{}: not a `memlens peak` document: {e}",
                path.display()
            ))
        })?;
        return Ok(Some(m));
    }
    let stats = v.get("memory_stats").unwrap_or(&v);
    Ok(stats
        .get("allocated_bytes.all.peak")
        .and_then(|p| p.as_u64())
        .map(|peak| MeasuredMemory {
            peak_allocated_bytes: peak,
            categories: Default::default(),
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memory_stats_for_compare() {
        let stats = format!(
            "{}/../../../shared/fixtures/gpt2_train.stats.json",
            env!("CARGO_MANIFEST_DIR")
        );
        if Path::new(&stats).exists() {
            let m = read_measured(Path::new(&stats)).unwrap();
            assert_eq!(m.peak_allocated_bytes, 4_583_255_040);
        }
        let dir = std::env::temp_dir().join(format!("memlens-est-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let peak = dir.join("peak.json");
        std::fs::write(
            &peak,
            r#"{"schema":"memlens/1","peak_allocated_bytes":100,"categories":{"parameter":40,"activation":60}}"#,
        )
        .unwrap();
        let m = read_measured(&peak).unwrap();
        assert_eq!(m.categories["activation"], 60);
        let snap = dir.join("snap.pickle");
        std::fs::write(&snap, [0x80u8, 4, 0x95]).unwrap();
        assert!(read_measured(&snap).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
