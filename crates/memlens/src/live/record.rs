//! `--record FILE`: appends every sample to a history file, JSON Lines when
//! the name ends in `.jsonl`, CSV when it ends in `.csv`.
//!
//! JSONL: one sample document per line (the same document as `--once --json`).
//! CSV: one row per GPU per sample (`pid` empty) and one per process, with a
//! header when the file is new; appending to an existing file adds no header.

use super::sample::Sample;
use super::LiveError;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The CSV columns, in order.
pub const CSV_HEADER: &str =
    "time,gpu,gpu_name,gpu_used_bytes,gpu_total_bytes,gpu_utilization_pct,\
pid,user,used_bytes,reserved_bytes,allocated_bytes,gap_bytes,step,alerts,cmdline";

/// The format of a record file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON document per line.
    Jsonl,
    /// Comma-separated values.
    Csv,
}

impl Format {
    /// The format a file name asks for.
    pub fn from_path(path: &Path) -> Result<Self, LiveError> {
        let name = path.to_string_lossy().to_ascii_lowercase();
        if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
            Ok(Format::Jsonl)
        } else if name.ends_with(".csv") {
            Ok(Format::Csv)
        } else {
            Err(LiveError::Usage(format!(
                "{}: the record file must end in .jsonl or .csv",
                path.display()
            )))
        }
    }
}

/// An open record file.
pub struct Recorder {
    path: PathBuf,
    format: Format,
    out: BufWriter<File>,
}

#[derive(Serialize)]
struct Tagged<'a> {
    schema: &'static str,
    #[serde(flatten)]
    sample: &'a Sample,
}

impl Recorder {
    /// Opens `path` for appending (creating it), in the format its name asks.
    pub fn open(path: &Path) -> Result<Self, LiveError> {
        let format = Format::from_path(path)?;
        let io = |error| LiveError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        let empty = file.metadata().map_err(io)?.len() == 0;
        let mut rec = Recorder {
            path: path.to_path_buf(),
            format,
            out: BufWriter::new(file),
        };
        if format == Format::Csv && empty {
            rec.line(CSV_HEADER)?;
        }
        Ok(rec)
    }

    /// The format being written.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Appends one sample and flushes, so a killed `top` loses nothing.
    pub fn write(&mut self, sample: &Sample) -> Result<(), LiveError> {
        match self.format {
            Format::Jsonl => {
                let doc = Tagged {
                    schema: crate::JSON_SCHEMA,
                    sample,
                };
                let line = serde_json::to_string(&doc)
                    .map_err(|e| LiveError::Usage(format!("cannot encode a sample: {e}")))?;
                self.line(&line)?;
            }
            Format::Csv => {
                for row in csv_rows(sample) {
                    self.line(&row)?;
                }
            }
        }
        self.out.flush().map_err(|e| self.io(e))
    }

    fn line(&mut self, text: &str) -> Result<(), LiveError> {
        let r = self
            .out
            .write_all(text.as_bytes())
            .and_then(|_| self.out.write_all(b"\n"));
        r.map_err(|e| self.io(e))
    }

    fn io(&self, error: std::io::Error) -> LiveError {
        LiveError::Io {
            path: self.path.clone(),
            error,
        }
    }
}

/// The CSV rows of one sample (no header).
pub fn csv_rows(s: &Sample) -> Vec<String> {
    let mut rows = Vec::new();
    let opt = |v: Option<String>| v.unwrap_or_default();
    for g in &s.gpus {
        let alerts_of = |pid: Option<u32>| {
            s.alerts
                .iter()
                .filter(|a| a.gpu == g.index && a.pid == pid)
                .map(|a| a.kind.as_str())
                .collect::<Vec<_>>()
                .join(";")
        };
        let gpu_cols = [
            format!("{:.3}", s.time),
            g.index.to_string(),
            csv_field(&g.name),
            g.used_bytes.to_string(),
            g.total_bytes.to_string(),
            opt(g.utilization_pct.map(|u| u.to_string())),
        ];
        let mut row = gpu_cols.to_vec();
        row.extend(["", "", "", "", "", "", ""].map(String::from));
        row.push(csv_field(&alerts_of(None)));
        row.push(String::new());
        rows.push(row.join(","));
        for p in &g.processes {
            let t = p.torch.as_ref();
            let mut row = gpu_cols.to_vec();
            row.extend([
                p.pid.to_string(),
                csv_field(p.user.as_deref().unwrap_or("")),
                opt(p.used_bytes.map(|v| v.to_string())),
                opt(t.map(|t| t.reserved_bytes.to_string())),
                opt(t.map(|t| t.allocated_bytes.to_string())),
                opt(t.and_then(|t| t.gap_bytes).map(|v| v.to_string())),
                opt(t.and_then(|t| t.step).map(|v| v.to_string())),
                csv_field(&alerts_of(Some(p.pid))),
                csv_field(p.cmdline.as_deref().unwrap_or("")),
            ]);
            rows.push(row.join(","));
        }
    }
    rows
}

/// Quotes a CSV field when it holds a comma, a quote or a line break.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::procfs::testing::scratch;
    use super::super::sample::testing::*;
    use super::super::{Model, ModelConfig};
    use super::*;

    const NOW: f64 = 1_800_000_000.0;

    fn sample() -> (Sample, PathBuf) {
        let (mut sampler, root) = world(vec![vec![gpu(0, 10 * GIB, &[(4242, 7 * GIB)])]], NOW);
        let mut model = Model::new(ModelConfig::default());
        model.observe(sampler.sample(NOW).unwrap());
        (model.latest().unwrap().clone(), root)
    }

    #[test]
    fn jsonl_appends_one_document_per_sample() {
        let (s, root) = sample();
        let dir = scratch("rec");
        let path = dir.join("h.jsonl");
        for _ in 0..2 {
            let mut r = Recorder::open(&path).unwrap();
            r.write(&s).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["schema"], "memlens/1");
        assert_eq!(v["gpus"][0]["processes"][0]["pid"], 4242);
        assert_eq!(v["gpus"][0]["processes"][0]["torch"]["gap_bytes"], GIB);
        std::fs::remove_dir_all(root).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn csv_has_one_header_and_rows_per_gpu_and_process() {
        let (s, root) = sample();
        let dir = scratch("rec");
        let path = dir.join("h.CSV");
        for _ in 0..2 {
            let mut r = Recorder::open(&path).unwrap();
            assert_eq!(r.format(), Format::Csv);
            r.write(&s).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0], CSV_HEADER);
        let cols = CSV_HEADER.split(',').count();
        assert_eq!(lines[1].split(',').count(), cols);
        let proc_row: Vec<&str> = lines[2].split(',').collect();
        assert_eq!(proc_row.len(), cols);
        assert_eq!(proc_row[6], "4242");
        assert_eq!(proc_row[9], (6 * GIB).to_string());
        assert_eq!(proc_row[11], GIB.to_string());
        assert_eq!(proc_row[14], "python train.py --epochs 3");
        std::fs::remove_dir_all(root).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_names_and_fields() {
        assert!(Recorder::open(Path::new("/tmp/history.txt")).is_err());
        assert!(Recorder::open(Path::new("/nonexistent-dir/h.csv")).is_err());
        assert_eq!(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }
}
