//! `memlens estimate`: memory a training step will need, before running it.

use crate::output;
use memlens::analysis::peak::peak;
use memlens::estimate::{
    compare, estimate, fit, load_model, Checkpointing, Comparison, Dtype, Estimate, Fit,
    MeasuredMemory, Optimizer, Options, Part, Term,
};
use memlens::units::{format_bytes, format_delta, parse_device_memory};
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Weight dtypes on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum DtypeArg {
    /// 32-bit float.
    #[value(alias = "float32")]
    Fp32,
    /// bfloat16.
    #[value(alias = "bfloat16")]
    Bf16,
    /// IEEE half.
    #[value(alias = "float16", alias = "half")]
    Fp16,
}

/// Optimizers on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum OptimizerArg {
    /// AdamW: two states per parameter.
    Adamw,
    /// Adam: two states per parameter.
    Adam,
    /// SGD without momentum: no state.
    Sgd,
    /// SGD with momentum: one state per parameter.
    SgdMomentum,
    /// Adafactor: factored second moment.
    Adafactor,
}

/// Checkpointing on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CheckpointingArg {
    /// Keep every activation.
    None,
    /// Keep each layer's input, recompute the layer in backward.
    Full,
    /// Recompute only the attention core (scores, softmax, dropout).
    Selective,
}

/// Arguments of `memlens estimate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A Hugging Face config.json, a .safetensors file (its config.json beside
    /// it is used for the architecture), a model.safetensors.index.json, or a
    /// directory holding them.
    pub model: PathBuf,
    /// Micro-batch size per GPU.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Sequence length [default: the model's position limit, at most 2048].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seq: Option<u64>,
    /// Dtype the weights are kept in.
    #[arg(long, value_enum, default_value = "fp32")]
    pub dtype: DtypeArg,
    /// Mixed precision, bf16 compute: with fp32 weights torch.autocast (fp32
    /// weights and gradients, bf16 activations); with --dtype bf16/fp16 the
    /// DeepSpeed scheme (fp32 master weights in the optimizer).
    #[arg(long)]
    pub amp: bool,
    /// The optimizer.
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: OptimizerArg,
    /// Activation checkpointing.
    #[arg(long, value_enum, default_value = "none")]
    pub checkpointing: CheckpointingArg,
    /// Fused attention (FlashAttention, SDPA): no seq² attention tensors.
    #[arg(long)]
    pub flash_attention: bool,
    /// Count no dropout masks even where the config has dropout.
    #[arg(long)]
    pub no_dropout: bool,
    /// ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also weights.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: u8,
    /// Data-parallel GPUs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub gpus: u64,
    /// Memory of one GPU, a size (80GB, 24GiB) or a GPU name (H100, A100-40GB,
    /// RTX4090): whether it fits, and the largest batch that does.
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// Estimate inference (weights, KV cache, one layer's working set) instead of training.
    #[arg(long)]
    pub inference: bool,
    /// Put the estimate beside a measurement of the same model and settings: a
    /// snapshot (peak and categories), the JSON of `memlens peak --json`, or a
    /// saved `torch.cuda.memory_stats()` (peak only).
    #[arg(long, value_name = "FILE")]
    pub compare: Option<PathBuf>,
    /// Print the JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    fn options(&self) -> Options {
        Options {
            batch: self.batch,
            seq: self.seq,
            dtype: match self.dtype {
                DtypeArg::Fp32 => Dtype::Fp32,
                DtypeArg::Bf16 => Dtype::Bf16,
                DtypeArg::Fp16 => Dtype::Fp16,
            },
            amp: self.amp,
            optimizer: match self.optimizer {
                OptimizerArg::Adamw => Optimizer::Adamw,
                OptimizerArg::Adam => Optimizer::Adam,
                OptimizerArg::Sgd => Optimizer::Sgd,
                OptimizerArg::SgdMomentum => Optimizer::SgdMomentum,
                OptimizerArg::Adafactor => Optimizer::Adafactor,
            },
            checkpointing: match self.checkpointing {
                CheckpointingArg::None => Checkpointing::None,
                CheckpointingArg::Full => Checkpointing::Full,
                CheckpointingArg::Selective => Checkpointing::Selective,
            },
            flash_attention: self.flash_attention,
            no_dropout: self.no_dropout,
            zero: self.zero,
            gpus: self.gpus,
            inference: self.inference,
        }
    }
}

/// The JSON document: the estimate, then the fit and the comparison when asked.
#[derive(Serialize)]
struct Doc<'a> {
    #[serde(flatten)]
    estimate: &'a Estimate,
    #[serde(flatten)]
    fit: Option<&'a Fit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compare: Option<&'a Comparison>,
}

/// Runs `memlens estimate`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let opts = args.options();
    // Parse everything the user typed before the work.
    let device = args
        .device_memory
        .as_deref()
        .map(parse_device_memory)
        .transpose()?;
    let measured = args.compare.as_deref().map(read_measured).transpose()?;
    let (spec, checkpoint) = load_model(&args.model)?;
    let est = estimate(&spec, checkpoint.as_ref(), &opts)?;
    let fit = device.map(|d| fit(&spec, &opts, &est, d)).transpose()?;
    let comparison = measured.as_ref().map(|m| compare(&est, m));
    if args.json {
        output::print_json(&Doc {
            estimate: &est,
            fit: fit.as_ref(),
            compare: comparison.as_ref(),
        })?;
    } else {
        let mut text = render(&est);
        if let Some(f) = &fit {
            text.push_str(&render_fit(f, &est));
        }
        if let Some(c) = &comparison {
            text.push_str(&render_comparison(c));
        }
        text.push_str(&render_notes(&est));
        output::print_text(&text)?;
    }
    Ok(output::OK)
}

/// A `--compare` file this small may be a JSON measurement rather than a snapshot.
const MAX_MEASURED_JSON: u64 = 64 << 20;

/// Reads what `--compare` names: a snapshot (its peak and categories, by the
/// same analysis as `memlens peak`), the JSON of `memlens peak --json`, or a
/// saved `torch.cuda.memory_stats()` (peak only; top level or under
/// `memory_stats`).
fn read_measured(path: &Path) -> anyhow::Result<MeasuredMemory> {
    if let Some(m) = read_measured_json(path)? {
        return Ok(m);
    }
    let snap = super::load(path)?;
    let r = peak(&snap, 0);
    Ok(MeasuredMemory {
        peak_allocated_bytes: r.peak_allocated_bytes,
        categories: r.categories,
    })
}

/// The measurement in a small JSON document, or `None` when the file is
/// something else (a snapshot).
fn read_measured_json(path: &Path) -> anyhow::Result<Option<MeasuredMemory>> {
    let meta = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if meta.len() > MAX_MEASURED_JSON {
        return Ok(None);
    }
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Ok(None);
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(None);
    };
    if v.get("peak_allocated_bytes").is_some() {
        let m = serde_json::from_value(v).map_err(|e| {
            anyhow::anyhow!("{}: not a `memlens peak` document: {e}", path.display())
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

fn inputs_line(p: &Part) -> String {
    p.inputs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn term_lines(o: &mut String, terms: &[Term], indent: usize) {
    for t in terms {
        let _ = writeln!(
            o,
            "{:indent$}{:>11}  {:<52} {}",
            "",
            format_bytes(t.bytes),
            t.name,
            t.formula,
        );
    }
}

/// The terminal table: the model, the settings, each part with its formula and
/// inputs, the per-layer terms, the phases and the peak.
pub fn render(est: &Estimate) -> String {
    let mut o = String::new();
    let m = &est.model;
    let s = &est.settings;
    let class = m
        .class
        .as_deref()
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "{}: {}{class}, {} parameters (from the {})",
        m.source,
        m.model_type,
        group(est.parameters),
        m.parameters_from
    );
    if let Some(a) = &m.architecture {
        let mut line = format!(
            "  {} layers, hidden {}, {} heads x {}",
            a.layers + a.decoder_layers,
            a.hidden,
            a.heads,
            a.head_dim
        );
        if a.kv_heads != a.heads {
            let _ = write!(line, " ({} KV heads)", a.kv_heads);
        }
        let _ = write!(
            line,
            ", MLP {} ({}{})",
            a.ffn,
            if a.gated_mlp { "gated " } else { "" },
            a.activation_name
        );
        if a.vocab > 0 {
            let _ = write!(line, ", vocabulary {}", a.vocab);
        }
        let _ = writeln!(o, "{line}");
    }
    if let Some(ck) = &m.checkpoint {
        let dtypes: Vec<String> = ck
            .dtypes
            .iter()
            .map(|(d, n)| format!("{} {d}", group(*n)))
            .collect();
        let _ = writeln!(
            o,
            "  checkpoint: {} parameters ({}) in {} file(s){}",
            group(ck.parameters),
            dtypes.join(", "),
            ck.files.len(),
            if ck.buffers.is_empty() {
                String::new()
            } else {
                format!(", {} buffers left out", ck.buffers.len())
            }
        );
    }
    let precision = match (s.amp, s.weight_bytes) {
        (true, 4) => format!("{} weights + bf16 autocast", s.dtype.name()),
        (true, _) => format!("{} weights, fp32 master weights", s.dtype.name()),
        (false, _) => format!("{} weights", s.dtype.name()),
    };
    let mut setting = format!(
        "  {}: batch {}, seq {} ({}), {precision}",
        if s.inference { "inference" } else { "training" },
        s.batch,
        s.seq,
        s.seq_from
    );
    if !s.inference {
        let _ = write!(
            setting,
            ", {}, checkpointing {}",
            s.optimizer.name(),
            match s.checkpointing {
                Checkpointing::None => "none",
                Checkpointing::Full => "full",
                Checkpointing::Selective => "selective",
            }
        );
    }
    let _ = write!(
        setting,
        ", {} attention{}",
        if s.flash_attention { "fused" } else { "eager" },
        if s.dropout { ", dropout" } else { "" }
    );
    if s.gpus > 1 || s.zero > 0 {
        let _ = write!(setting, ", {} GPUs, ZeRO {}", s.gpus, s.zero);
    }
    let _ = writeln!(o, "{setting}");
    let _ = writeln!(
        o,
        "  element sizes: weights p={} B, activations e={} B, residual stream r={} B",
        s.weight_bytes, s.activation_bytes, s.residual_bytes
    );

    let at_peak = |key: &str| est.peak().is_some_and(|ph| ph.parts.contains_key(key));
    let _ = writeln!(
        o,
        "\n  {:<34} {:>11}  formula   (* alive at the peak)",
        "part", "size"
    );
    for p in &est.parts {
        let mark = if at_peak(p.key) { '*' } else { ' ' };
        let _ = writeln!(
            o,
            "{mark} {:<34} {:>11}  {}",
            p.name,
            format_bytes(p.bytes),
            p.formula
        );
        if !p.inputs.is_empty() {
            let _ = writeln!(o, "  {:<34} {:>11}  where {}", "", "", inputs_line(p));
        }
        if p.terms.len() > 1 || p.key == "activations" {
            term_lines(&mut o, &p.terms, 4);
        }
    }
    for l in &est.layers {
        let _ = writeln!(
            o,
            "\n  one {} layer (x{}, seq {}): {}",
            l.kind,
            l.count,
            l.seq,
            format_bytes(l.bytes_per_layer)
        );
        term_lines(&mut o, &l.terms, 4);
    }
    let _ = writeln!(o);
    for ph in &est.phases {
        let label = match ph.name {
            "backward_start" => "at the start of backward",
            "optimizer_step" => "at the optimizer step",
            _ => "during the forward pass",
        };
        let _ = writeln!(o, "  {label:<26} {:>11}", format_bytes(ph.bytes));
    }
    let _ = writeln!(
        o,
        "  {:<26} {:>11}  (torch.cuda.max_memory_allocated)",
        "peak allocated",
        format_bytes(est.peak_allocated_bytes)
    );
    let _ = writeln!(
        o,
        "  {:<26} {:>11}  (with the CUDA context)",
        "on the device",
        format_bytes(est.device_bytes)
    );
    o
}

fn render_fit(f: &Fit, est: &Estimate) -> String {
    let mut o = String::new();
    let dev = format_bytes(f.device_memory_bytes);
    if f.fits {
        let spare = u64::try_from(f.headroom_bytes).unwrap_or(0);
        let _ = write!(o, "  fits on {dev}: yes, {} to spare", format_bytes(spare));
        if spare * 10 < f.device_memory_bytes {
            let _ = write!(o, " (tight: allocator overhead may not fit)");
        }
    } else {
        let _ = write!(
            o,
            "  fits on {dev}: no, {} short",
            format_bytes(f.headroom_bytes.unsigned_abs())
        );
    }
    let _ = writeln!(o);
    match f.max_batch {
        Some(b) => {
            let _ = writeln!(
                o,
                "  largest batch that fits: {b} (at seq {})",
                est.settings.seq
            );
        }
        None => {
            let _ = writeln!(o, "  largest batch that fits: none, not even batch 1");
        }
    }
    o
}

fn render_comparison(c: &Comparison) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\n  compared with the measurement: {:>11} estimated, {:>11} measured, {}{}",
        format_bytes(c.estimated_peak_bytes),
        format_bytes(c.measured_peak_bytes),
        format_delta(c.delta_bytes),
        c.relative_error
            .map(|r| format!(" ({:+.1}%)", r * 100.0))
            .unwrap_or_default()
    );
    if c.categories.iter().any(|r| r.measured_bytes.is_some()) {
        let _ = writeln!(
            o,
            "  {:<18} {:>11} {:>11} {:>12}",
            "category", "estimated", "measured", "difference"
        );
        for r in &c.categories {
            let _ = writeln!(
                o,
                "  {:<18} {:>11} {:>11} {:>12}",
                r.category,
                format_bytes(r.estimated_bytes),
                r.measured_bytes.map(format_bytes).unwrap_or_default(),
                r.delta_bytes.map(format_delta).unwrap_or_default()
            );
        }
    }
    o
}

fn render_notes(est: &Estimate) -> String {
    let mut o = String::new();
    if !est.notes.is_empty() {
        let _ = writeln!(o, "\n  notes:");
        for n in &est.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    o
}

/// `67891200` -> `67,891,200`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> String {
        format!(
            "{}/../memlens/tests/data/{name}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    #[test]
    fn groups_digits() {
        assert_eq!(group(67_891_200), "67,891,200");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
    }

    #[test]
    fn exit_codes() {
        let cfg = data("gpt2_train.config.json");
        let run = |extra: &[&str]| {
            let mut argv = vec!["memlens", "estimate", cfg.as_str()];
            argv.extend_from_slice(extra);
            crate::run(argv)
        };
        assert_eq!(run(&["--batch", "8", "--seq", "512", "--amp", "--json"]), 0);
        assert_eq!(run(&["--inference", "--device-memory", "24GiB"]), 0);
        assert_eq!(run(&["--device-memory", "lots"]), 2);
        assert_eq!(run(&["--seq", "4096"]), 2);
        assert_eq!(run(&["--zero", "5"]), 2);
        assert_eq!(
            crate::run(["memlens", "estimate", "/no/such/config.json"]),
            2
        );
    }

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
