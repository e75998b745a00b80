//! `memlens estimate`: memory a training step (or an inference pass) will
//! need, before running it.
//!
//! The model comes from a Hugging Face `config.json` or the header of a
//! `.safetensors` checkpoint ([`load_model`]). [`estimate`] then adds up the
//! parts, each with its formula and inputs:
//!
//! * weights, gradients and optimizer state from the parameter tensors, the
//!   dtype and the optimizer, divided across GPUs as ZeRO stages do
//!   ([`states`]);
//! * activations saved for backward, layer by layer ([`activations`]:
//!   Korthikanti et al. 2022 with corrections);
//! * the logits and the cross-entropy loss (fp32 upcast and its gradients),
//!   autocast's 16-bit weight copies, library workspaces, and for inference
//!   the KV cache ([`compute`]).
//!
//! The parts are not all alive at once. The peak is the larger of two moments
//! of a training step: the start of backward (weights, optimizer state, every
//! saved activation, the loss gradients) and the optimizer step (weights,
//! gradients, optimizer state, the step's temporaries). `total_bytes` is that
//! peak as `torch.cuda.max_memory_allocated()` would report it; the CUDA
//! context comes on top on the device.

pub mod activations;
pub mod compare;
pub mod compute;
pub mod explain;
pub mod hf_config;
pub mod load;
pub mod measured;
pub mod model;
pub mod safetensors;
pub mod states;

pub use compare::{compare, Comparison, MeasuredMemory};
pub use compute::{estimate, fit, Fit};
pub use explain::{explain, Explanation};
pub use load::{load_model, Checkpoint};
pub use model::{Architecture, Family, ModelSpec, ParamTensor};

use serde::Serialize;
use std::collections::BTreeMap;

/// What the CUDA context costs on the device, outside PyTorch's allocator:
/// CUDA 12 with lazy module loading on recent GPUs typically shows 300-600 MiB
/// in `nvidia-smi` before the first tensor; 512 MiB is the round figure used.
/// It varies with the CUDA version, the GPU and `CUDA_MODULE_LOADING`.
pub const CUDA_CONTEXT_BYTES: u64 = 512 << 20;

/// cuBLAS workspace PyTorch allocates per handle and stream through the caching
/// allocator: 32 MiB on Hopper (`CUBLAS_WORKSPACE_CONFIG` default there);
/// older GPUs use less. Training uses two (the forward thread's and the
/// autograd engine's), as the `gpt2_train` fixture shows.
pub const CUBLAS_WORKSPACE_BYTES: u64 = 32 << 20;

/// DeepSpeed's default `reduce_bucket_size` (elements).
pub const ZERO_REDUCE_BUCKET: u64 = 500_000_000;

/// DeepSpeed's default `stage3_prefetch_bucket_size` (elements).
pub const ZERO3_PREFETCH_BUCKET: u64 = 50_000_000;

/// Floating-point types weights can be kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    Fp32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    Fp16,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => 4,
            Dtype::Bf16 | Dtype::Fp16 => 2,
        }
    }
    /// Its name (`fp32`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
        }
    }
}

/// Optimizers, by the state they keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    /// `torch.optim.AdamW`: `exp_avg` and `exp_avg_sq` per parameter.
    Adamw,
    /// `torch.optim.Adam`: the same two states.
    Adam,
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one `momentum_buffer` per parameter.
    SgdMomentum,
    /// `torch.optim.Adafactor`: factored second moment (rows + columns per
    /// matrix), no first moment.
    Adafactor,
}

impl Optimizer {
    /// Its name (`adamw`).
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Adamw => "adamw",
            Optimizer::Adam => "adam",
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adafactor => "adafactor",
        }
    }
}

/// How `optimizer.step()` walks the parameters, which decides its temporaries
/// (PyTorch's `foreach=` and `fused=` arguments of Adam, AdamW, SGD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerImpl {
    /// The default on CUDA: one multi-tensor kernel per operation over all
    /// parameters, so each intermediate (Adam's `sqrt(exp_avg_sq)`) exists for
    /// every parameter at once.
    Foreach,
    /// `fused=True`: one kernel per parameter group updates in place; no
    /// temporaries.
    Fused,
    /// `foreach=False`: a Python loop over the tensors; temporaries of one
    /// tensor at a time.
    ForLoop,
}

impl OptimizerImpl {
    /// Its name (`foreach`).
    pub fn name(self) -> &'static str {
        match self {
            OptimizerImpl::Foreach => "foreach",
            OptimizerImpl::Fused => "fused",
            OptimizerImpl::ForLoop => "for-loop",
        }
    }
}

/// Activation checkpointing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    /// Every activation is kept.
    None,
    /// Each layer keeps only its input and is recomputed in backward
    /// (`gradient_checkpointing_enable()`).
    Full,
    /// Korthikanti et al.'s selective recomputation: the attention core
    /// (scores, softmax, dropout) is recomputed, the rest kept.
    Selective,
}

/// What to estimate for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Options {
    /// Micro-batch size per GPU.
    pub batch: u64,
    /// Sequence length; `None` takes the model's (its position limit, capped
    /// at 2048; the patch count for ViT; 512 for T5).
    pub seq: Option<u64>,
    /// Dtype the weights are kept in.
    pub dtype: Dtype,
    /// Mixed precision with bf16 compute. With fp32 weights this is
    /// `torch.autocast`: fp32 weights and gradients, bf16 activations, bf16
    /// weight copies. With 16-bit weights it is the DeepSpeed/Megatron scheme:
    /// 16-bit weights and gradients, fp32 master weights in the optimizer.
    pub amp: bool,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// How its step is implemented.
    pub optimizer_impl: OptimizerImpl,
    /// Activation checkpointing.
    pub checkpointing: Checkpointing,
    /// Fused attention (FlashAttention, or SDPA's flash/memory-efficient
    /// kernels): no `s²` tensors.
    pub flash_attention: bool,
    /// Force dropout off (it is otherwise taken from the config).
    pub no_dropout: bool,
    /// The training loop holds the model's output (and so the logits) through
    /// backward (`out = model(**batch); out.loss.backward()`). The Trainer
    /// and `loss = model(**batch).loss` drop it, freeing the logits after
    /// the forward.
    pub keep_outputs: bool,
    /// ZeRO stage (0-3).
    pub zero: u8,
    /// Data-parallel GPUs.
    pub gpus: u64,
    /// Estimate an inference pass (no gradients, no optimizer, a KV cache).
    pub inference: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            batch: 1,
            seq: None,
            dtype: Dtype::Fp32,
            amp: false,
            optimizer: Optimizer::Adamw,
            optimizer_impl: OptimizerImpl::Foreach,
            checkpointing: Checkpointing::None,
            flash_attention: false,
            no_dropout: false,
            keep_outputs: false,
            zero: 0,
            gpus: 1,
            inference: false,
        }
    }
}

/// One term of a part: what it is, its formula, its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Term {
    /// What the tensor is.
    pub name: String,
    /// Its size in the symbols of the part's `inputs`.
    pub formula: String,
    /// Its size.
    pub bytes: u64,
}

/// One part of the estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Part {
    /// Stable key (`parameters`, `gradients`, `optimizer_state`,
    /// `activations`, `logits_and_loss`, `loss_gradients`, ...).
    pub key: &'static str,
    /// Label for people.
    pub name: String,
    /// The snapshot category it corresponds to (`parameter`, `gradient`,
    /// `optimizer_state`, `activation`, `temporary`, `input`, `other`), or
    /// `cuda_context` for memory outside the allocator.
    pub category: &'static str,
    /// Its size.
    pub bytes: u64,
    /// Its formula.
    pub formula: String,
    /// The values of the formula's symbols.
    pub inputs: BTreeMap<String, u64>,
    /// Its terms, when it has several.
    pub terms: Vec<Term>,
}

/// A moment of the step and what is alive then.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// `backward_start`, `optimizer_step` or `inference`.
    pub name: &'static str,
    /// What happens then.
    pub description: String,
    /// Allocated bytes alive then.
    pub bytes: u64,
    /// Bytes of each part alive then, by part key.
    pub parts: BTreeMap<String, u64>,
}

/// The activations of one kind of layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerActivations {
    /// `decoder`, `encoder`, or `decoder (with cross-attention)`.
    pub kind: String,
    /// How many such layers.
    pub count: u64,
    /// Sequence length they run at.
    pub seq: u64,
    /// Bytes one layer keeps.
    pub bytes_per_layer: u64,
    /// The terms of one layer.
    pub terms: Vec<Term>,
}

/// The model as the estimate describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSummary {
    /// Family.
    pub family: Family,
    /// `model_type`.
    pub model_type: String,
    /// `architectures[0]`.
    pub class: Option<String>,
    /// Where it was read from.
    pub source: String,
    /// Where the parameter list came from (`config` or `safetensors`).
    pub parameters_from: &'static str,
    /// The architecture, when known.
    pub architecture: Option<Architecture>,
    /// The checkpoint's own count and dtypes, when a `.safetensors` was read.
    pub checkpoint: Option<Checkpoint>,
}

/// The settings the estimate was made for, resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    /// Micro-batch per GPU.
    pub batch: u64,
    /// Sequence length used.
    pub seq: u64,
    /// Where `seq` came from (`given`, or the model default it took).
    pub seq_from: String,
    /// Weight dtype.
    pub dtype: Dtype,
    /// Mixed precision.
    pub amp: bool,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Its step's implementation.
    pub optimizer_impl: OptimizerImpl,
    /// Checkpointing.
    pub checkpointing: Checkpointing,
    /// Fused attention.
    pub flash_attention: bool,
    /// Whether dropout is modelled.
    pub dropout: bool,
    /// Whether the caller keeps the model's output (the logits) through backward.
    pub keep_outputs: bool,
    /// ZeRO stage.
    pub zero: u8,
    /// GPUs.
    pub gpus: u64,
    /// Inference rather than training.
    pub inference: bool,
    /// Bytes of a weight element (`p`).
    pub weight_bytes: u64,
    /// Bytes of an activation element (`e`).
    pub activation_bytes: u64,
    /// Bytes of a residual-stream element (`r`).
    pub residual_bytes: u64,
}

/// The estimate: parts, phases, and the peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// The model.
    pub model: ModelSummary,
    /// The settings.
    pub settings: Settings,
    /// Parameter count (tied tensors once).
    pub parameters: u64,
    /// Weights on one GPU.
    pub parameters_bytes: u64,
    /// Gradients on one GPU.
    pub gradients_bytes: u64,
    /// Optimizer state on one GPU (including fp32 master weights).
    pub optimizer_bytes: u64,
    /// Activations saved for backward, logits and loss included (for
    /// inference: the working set and logits).
    pub activations_bytes: u64,
    /// KV cache (inference).
    pub kv_cache_bytes: u64,
    /// Temporary buffers at their largest: loss gradients, workspaces,
    /// optimizer-step temporaries, communication buckets.
    pub temporary_bytes: u64,
    /// The estimated peak of allocated memory (what
    /// `torch.cuda.max_memory_allocated()` would report).
    pub total_bytes: u64,
    /// Same as `total_bytes`, under the name `memlens peak` uses.
    pub peak_allocated_bytes: u64,
    /// The CUDA context, outside the allocator.
    pub cuda_context_bytes: u64,
    /// Peak plus CUDA context: what the device must hold.
    pub device_bytes: u64,
    /// Whether activations were estimated (false without an architecture).
    pub activations_estimated: bool,
    /// The phase that makes the peak.
    pub peak_phase: &'static str,
    /// The phases considered.
    pub phases: Vec<Phase>,
    /// Every part with its formula.
    pub parts: Vec<Part>,
    /// Activations per kind of layer.
    pub layers: Vec<LayerActivations>,
    /// Assumptions and caveats.
    pub notes: Vec<String>,
}

impl Estimate {
    /// The part with key `key`.
    pub fn part(&self, key: &str) -> Option<&Part> {
        self.parts.iter().find(|p| p.key == key)
    }

    /// The phase that makes the peak.
    pub fn peak(&self) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == self.peak_phase)
    }
}

/// Saturating product: sizes from configs and flags cannot overflow into
/// nonsense; an absurd size saturates and simply does not fit.
pub(crate) fn sat_prod(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}

/// Saturating sum.
pub(crate) fn sat_sum(xs: impl IntoIterator<Item = u64>) -> u64 {
    xs.into_iter().fold(0u64, |a, x| a.saturating_add(x))
}
