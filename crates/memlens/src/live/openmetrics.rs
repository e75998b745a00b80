//! A [`Sample`] as OpenMetrics text (what Prometheus scrapes), for
//! `memlens top --once --format openmetrics` and `memlens top --serve ADDR`.
//!
//! Fleets watch GPUs through NVML exporters, which see each process's "used"
//! memory only; memlens adds the allocator's own view from the processes that
//! publish it (`memlens.record`): allocated, reserved, fragmentation, step and
//! the leak alarm. Families (all gauges):
//!
//! | family | labels | value |
//! |---|---|---|
//! | `memlens_gpu_memory_used_bytes` | gpu, name, uuid | NVML used |
//! | `memlens_gpu_memory_total_bytes` | gpu, name, uuid | NVML total |
//! | `memlens_process_gpu_memory_used_bytes` | pid, gpu, rank, command | NVML used by the process |
//! | `memlens_process_allocated_bytes` | pid, gpu, rank, command | bytes in live tensors |
//! | `memlens_process_reserved_bytes` | pid, gpu, rank, command | bytes the caching allocator holds |
//! | `memlens_process_fragmentation_ratio` | pid, gpu, rank, command | (reserved − allocated) / reserved |
//! | `memlens_process_outside_allocator_bytes` | pid, gpu, rank, command | NVML used − reserved |
//! | `memlens_process_step` | pid, gpu, rank, command | the training step |
//! | `memlens_process_leak_alarm` | pid, gpu, rank, command | 1 once the process's leak alarm fired, else 0 |
//!
//! `gpu` is NVML's index; `rank` is empty when the process is not distributed
//! (or publishes nothing); `command` is the command line (empty when the PID is
//! not of this PID namespace, as in `top`).

use super::sample::{ProcessSample, Sample};
use super::Alert;
use std::fmt::Write;

/// The HTTP `Content-Type` of the text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Longest `command` label kept (a label is stored with every sample).
const MAX_COMMAND: usize = 256;

/// The families, in the order written: (name, unit, help).
const GPU_FAMILIES: [(&str, &str, &str); 2] = [
    (
        "memlens_gpu_memory_used_bytes",
        "bytes",
        "Device memory in use (NVML, as nvidia-smi counts it).",
    ),
    (
        "memlens_gpu_memory_total_bytes",
        "bytes",
        "Total device memory (NVML).",
    ),
];

/// One per-process family: name, unit, help, and the value when the process has one.
type ProcessFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ProcessSample) -> Option<f64>,
);

const PROCESS_FAMILIES: [ProcessFamily; 7] = [
    (
        "memlens_process_gpu_memory_used_bytes",
        "bytes",
        "Device memory the process holds (NVML).",
        |p| p.used_bytes.map(|b| b as f64),
    ),
    (
        "memlens_process_allocated_bytes",
        "bytes",
        "Bytes in live tensors (PyTorch's allocator, published by memlens.record).",
        |p| p.torch.as_ref().map(|t| t.allocated_bytes as f64),
    ),
    (
        "memlens_process_reserved_bytes",
        "bytes",
        "Bytes PyTorch's caching allocator holds (published by memlens.record).",
        |p| p.torch.as_ref().map(|t| t.reserved_bytes as f64),
    ),
    (
        "memlens_process_fragmentation_ratio",
        "ratio",
        "Share of reserved memory not in live tensors: (reserved - allocated) / reserved.",
        |p| p.torch.as_ref().map(|t| fragmentation(t.allocated_bytes, t.reserved_bytes)),
    ),
    (
        "memlens_process_outside_allocator_bytes",
        "bytes",
        "NVML used minus PyTorch reserved: the CUDA context, library workspaces, other allocators.",
        |p| p.torch.as_ref().and_then(|t| t.gap_bytes).map(|b| b as f64),
    ),
    (
        "memlens_process_step",
        "",
        "The training step the process last marked with memlens.step().",
        |p| p.torch.as_ref().and_then(|t| t.step).map(|s| s as f64),
    ),
    (
        "memlens_process_leak_alarm",
        "",
        "1 once the process's own leak alarm fired (memory kept between steps grows steadily), else 0.",
        |p| p.torch.as_ref().map(|t| if t.leak_alarm.is_some() { 1.0 } else { 0.0 }),
    ),
];

/// `(reserved − allocated) / reserved`; 0 when nothing is reserved.
pub fn fragmentation(allocated: u64, reserved: u64) -> f64 {
    if reserved == 0 {
        0.0
    } else {
        reserved.saturating_sub(allocated) as f64 / reserved as f64
    }
}

/// The whole exposition of one sample, ending in `# EOF`.
pub fn render(sample: &Sample) -> String {
    let mut o = String::new();
    for (k, (name, unit, help)) in GPU_FAMILIES.iter().enumerate() {
        header(&mut o, name, unit, help);
        for g in &sample.gpus {
            let value = if k == 0 { g.used_bytes } else { g.total_bytes };
            let labels = [
                ("gpu", g.index.to_string()),
                ("name", g.name.clone()),
                ("uuid", g.uuid.clone().unwrap_or_default()),
            ];
            line(&mut o, name, &labels, value as f64);
        }
    }
    for (name, unit, help, value) in PROCESS_FAMILIES {
        header(&mut o, name, unit, help);
        for g in &sample.gpus {
            for p in &g.processes {
                if let Some(v) = value(p) {
                    line(&mut o, name, &process_labels(g.index, p), v);
                }
            }
        }
    }
    alerts(&mut o, &sample.alerts);
    o.push_str("# EOF\n");
    o
}

fn process_labels(gpu: u32, p: &ProcessSample) -> [(&'static str, String); 4] {
    let rank = p
        .torch
        .as_ref()
        .and_then(|t| t.rank)
        .map(|r| r.to_string())
        .unwrap_or_default();
    let command: String = match p.visibility {
        super::procfs::Visibility::Local => p.cmdline.clone().unwrap_or_default(),
        _ => String::new(),
    };
    [
        ("pid", p.pid.to_string()),
        ("gpu", gpu.to_string()),
        ("rank", rank),
        ("command", command.chars().take(MAX_COMMAND).collect()),
    ]
}

/// The alerts `top` holds now (growth, near-full GPU, leak alarm), one series each.
fn alerts(o: &mut String, alerts: &[Alert]) {
    let name = "memlens_alert";
    header(
        o,
        name,
        "",
        "Alert conditions holding now in memlens top (1 per alert).",
    );
    for a in alerts {
        let labels = [
            ("kind", a.kind.as_str().to_string()),
            ("gpu", a.gpu.to_string()),
            ("pid", a.pid.map(|p| p.to_string()).unwrap_or_default()),
        ];
        line(o, name, &labels, 1.0);
    }
}

fn header(o: &mut String, name: &str, unit: &str, help: &str) {
    let _ = writeln!(o, "# TYPE {name} gauge");
    if !unit.is_empty() {
        let _ = writeln!(o, "# UNIT {name} {unit}");
    }
    let _ = writeln!(o, "# HELP {name} {}", escape(help));
}

fn line(o: &mut String, name: &str, labels: &[(&str, String)], value: f64) {
    o.push_str(name);
    o.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "{k}=\"{}\"", escape(v));
    }
    let _ = writeln!(o, "}} {}", number(value));
}

/// A value as OpenMetrics writes it: integers without a fraction.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e17 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Escapes a label value or help text: `\`, `"` and line feeds.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::procfs::Visibility;
    use super::super::sample::{GpuSample, TorchView};
    use super::*;

    const GIB: u64 = 1 << 30;

    fn sample() -> Sample {
        let torch = TorchView {
            device: 0,
            rank: Some(3),
            step: Some(120),
            allocated_bytes: 3 * GIB,
            reserved_bytes: 4 * GIB,
            active_bytes: 3 * GIB,
            peak_allocated_bytes: 5 * GIB,
            gap_bytes: Some(GIB as i64 / 2),
            leak_alarm: Some("+8.00 MiB/step over 5 steps".into()),
            age_s: 0.5,
            cuda_total_bytes: None,
        };
        let p = ProcessSample {
            pid: 4242,
            visibility: Visibility::Local,
            user: Some("me".into()),
            cmdline: Some("python \"train.py\" --lr 1e-4".into()),
            seen_by_nvml: true,
            used_bytes: Some(4 * GIB + GIB / 2),
            torch: Some(torch),
        };
        let foreign = ProcessSample {
            pid: 77,
            visibility: Visibility::NotInNamespace,
            user: None,
            cmdline: Some("hidden".into()),
            seen_by_nvml: true,
            used_bytes: Some(GIB),
            torch: None,
        };
        Sample {
            time: 1.0,
            source: "fake".into(),
            gpus: vec![GpuSample {
                index: 1,
                name: "NVIDIA H100".into(),
                uuid: Some("GPU-1".into()),
                total_bytes: 80 * GIB,
                used_bytes: 6 * GIB,
                driver_reserved_bytes: None,
                utilization_pct: Some(50),
                processes: vec![p, foreign],
                account: None,
            }],
            alerts: Vec::new(),
        }
    }

    #[test]
    fn renders_every_family_with_labels_and_eof() {
        let text = render(&sample());
        let labels = r#"pid="4242",gpu="1",rank="3",command="python \"train.py\" --lr 1e-4""#;
        for want in [
            "# TYPE memlens_gpu_memory_used_bytes gauge\n# UNIT memlens_gpu_memory_used_bytes bytes\n",
            &format!(
                "memlens_gpu_memory_used_bytes{{gpu=\"1\",name=\"NVIDIA H100\",uuid=\"GPU-1\"}} {}\n",
                6 * GIB
            ),
            &format!(
                "memlens_gpu_memory_total_bytes{{gpu=\"1\",name=\"NVIDIA H100\",uuid=\"GPU-1\"}} {}\n",
                80 * GIB
            ),
            &format!("memlens_process_allocated_bytes{{{labels}}} {}\n", 3 * GIB),
            &format!("memlens_process_reserved_bytes{{{labels}}} {}\n", 4 * GIB),
            &format!("memlens_process_fragmentation_ratio{{{labels}}} 0.25\n"),
            &format!("memlens_process_outside_allocator_bytes{{{labels}}} {}\n", GIB / 2),
            &format!("memlens_process_step{{{labels}}} 120\n"),
            &format!("memlens_process_leak_alarm{{{labels}}} 1\n"),
            &format!(
                "memlens_process_gpu_memory_used_bytes{{pid=\"77\",gpu=\"1\",rank=\"\",command=\"\"}} {GIB}\n"
            ),
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        // The foreign PID has no allocator figures.
        assert!(!text.contains("memlens_process_allocated_bytes{pid=\"77\""));
    }

    #[test]
    fn fragmentation_and_numbers() {
        assert_eq!(fragmentation(3, 4), 0.25);
        assert_eq!(fragmentation(0, 0), 0.0);
        assert_eq!(fragmentation(5, 4), 0.0);
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }
}
