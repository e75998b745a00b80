//! `memlens estimate`: memory a training step will need, before running it.

use crate::output;
use memlens::analysis::peak::peak;
use memlens::estimate::{load_model, Checkpointing, Dtype, MeasuredMemory, Optimizer, Options};
use memlens::render::{self, documents::estimate_doc};
use memlens::units::parse_device_memory;
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
    let doc = estimate_doc(&spec, checkpoint.as_ref(), &opts, device, measured.as_ref())?;
    output::print(&doc, args.json, render::estimate::text)?;
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
