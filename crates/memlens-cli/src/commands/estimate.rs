//! `memlens estimate`: memory a training step will need, before running it.

use crate::output;
use memlens::estimate::{load_model, Checkpointing, Dtype, Optimizer, OptimizerImpl, Options};
use memlens::render::{self, documents::estimate_doc};
use memlens::units::parse_device_memory;
use std::path::PathBuf;

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

/// Optimizer-step implementations on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum OptimizerImplArg {
    /// PyTorch's default on CUDA: multi-tensor kernels, temporaries for all parameters at once.
    Foreach,
    /// fused=True: in place, no temporaries.
    Fused,
    /// foreach=False: one tensor at a time.
    ForLoop,
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
#[command(
    after_help = "Example:\n  memlens estimate config.json --batch 8 --seq 1024 --amp --device-memory 80GB"
)]
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
    /// How the optimizer step is implemented (PyTorch's foreach=/fused=
    /// arguments): it decides the step's temporaries.
    #[arg(long, value_enum, default_value = "foreach")]
    pub optimizer_impl: OptimizerImplArg,
    /// Activation checkpointing.
    #[arg(long, value_enum, default_value = "none")]
    pub checkpointing: CheckpointingArg,
    /// Fused attention (FlashAttention, SDPA): no seq² attention tensors.
    #[arg(long)]
    pub flash_attention: bool,
    /// Count no dropout masks even where the config has dropout.
    #[arg(long)]
    pub no_dropout: bool,
    /// The training loop keeps the model's output through backward (`out =
    /// model(**batch); out.loss.backward()`): the logits stay alive. The HF
    /// Trainer and `loss = model(**batch).loss` free them after the forward.
    #[arg(long)]
    pub keep_outputs: bool,
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
            optimizer_impl: match self.optimizer_impl {
                OptimizerImplArg::Foreach => OptimizerImpl::Foreach,
                OptimizerImplArg::Fused => OptimizerImpl::Fused,
                OptimizerImplArg::ForLoop => OptimizerImpl::ForLoop,
            },
            checkpointing: match self.checkpointing {
                CheckpointingArg::None => Checkpointing::None,
                CheckpointingArg::Full => Checkpointing::Full,
                CheckpointingArg::Selective => Checkpointing::Selective,
            },
            flash_attention: self.flash_attention,
            no_dropout: self.no_dropout,
            keep_outputs: self.keep_outputs,
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
    let measured = args
        .compare
        .as_deref()
        .map(memlens::estimate::measured::read_measured)
        .transpose()?;
    let (spec, checkpoint) = load_model(&args.model)?;
    let doc = estimate_doc(&spec, checkpoint.as_ref(), &opts, device, measured.as_ref())?;
    output::print(&doc, args.json, render::estimate::text)?;
    Ok(output::OK)
}

#[cfg(test)]
mod tests {
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
}
