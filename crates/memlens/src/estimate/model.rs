//! The model as `estimate` sees it: its architecture (what the activations
//! depend on) and its parameter tensors (what weights, gradients and optimizer
//! state depend on).

use serde::Serialize;
use std::path::PathBuf;

/// Model families memlens knows the Hugging Face implementation of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// GPT-2 (`model_type: gpt2`).
    Gpt2,
    /// Llama and its relatives with the same layout: Llama, Mistral, Qwen2, Qwen3.
    Llama,
    /// BERT and RoBERTa encoders.
    Bert,
    /// T5 encoder-decoders.
    T5,
    /// Vision Transformer.
    Vit,
    /// Only a `.safetensors` header is known: parameters, no architecture.
    Tensors,
}

/// Activation function of the MLP, as the Hugging Face code implements it:
/// what matters is which intermediate tensors autograd keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `relu`: keeps only its output.
    Relu,
    /// A fused kernel (`F.gelu`, `F.silu`): keeps its input.
    Fused,
    /// The tanh GELU written out in Python (`gelu_new`, `gelu_fast`:
    /// `NewGELUActivation`): keeps several full-size intermediates, some in fp32
    /// under autocast because `pow` is an fp32 autocast op.
    PythonTanhGelu,
}

/// Normalisation layers, by what they save for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    /// `nn.LayerNorm`: keeps its input (plus per-row mean and rstd).
    LayerNorm,
    /// Hugging Face's Python RMSNorm (Llama, T5): upcasts to fp32, keeps the
    /// fp32 input and the normalised output.
    RmsNorm,
}

/// Stack layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stack {
    /// Causal decoder (GPT-2, Llama).
    DecoderOnly,
    /// Bidirectional encoder (BERT, ViT).
    EncoderOnly,
    /// Encoder and decoder with cross-attention (T5).
    EncoderDecoder,
}

/// The output head, which decides the logits and loss terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Head {
    /// Language-model head over the vocabulary, all positions (causal LM, seq2seq).
    Lm,
    /// Masked-LM head (BERT/RoBERTa): dense + GELU + LayerNorm, then the vocabulary.
    MaskedLm,
    /// A classifier over `labels` classes on one token (ViT, sequence classification).
    Classifier {
        /// Number of classes.
        labels: u64,
    },
    /// No head: the bare model (`BertModel`, `ViTModel`); the loss is the user's.
    None,
}

/// How the Hugging Face class computes the loss, which decides what the
/// cross entropy keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// `self.loss_function` with `logits.float()` first (causal LMs): an fp32
    /// log-softmax whatever the weights' dtype.
    Upcast,
    /// `nn.CrossEntropyLoss()` on the logits as they are (BERT, RoBERTa):
    /// the log-softmax in the logits' dtype; under autocast `nll_loss` (an
    /// fp32 autocast op) keeps an fp32 copy of it.
    AsIs,
}

/// Dropout probabilities that apply in training.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Dropouts {
    /// On the embeddings (GPT-2 `embd_pdrop`, BERT `hidden_dropout_prob`).
    pub embedding: f64,
    /// On the attention probabilities (`attn_pdrop`, `attention_dropout`).
    pub attention: f64,
    /// On each residual branch (`resid_pdrop`, `hidden_dropout_prob`).
    pub hidden: f64,
    /// Inside the MLP, between activation and down projection (T5).
    pub mlp_inner: f64,
}

/// An image input (ViT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Image {
    /// Side of the square image in pixels.
    pub size: u64,
    /// Side of a patch in pixels.
    pub patch: u64,
    /// Channels (3).
    pub channels: u64,
}

impl Image {
    /// Tokens the encoder sees: one per patch, plus the class token.
    pub fn tokens(&self) -> u64 {
        let per_side = self.size / self.patch.max(1);
        per_side * per_side + 1
    }
}

/// What the activation formulas need to know about a transformer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Architecture {
    /// Encoder, decoder or both.
    pub stack: Stack,
    /// Layers of the (first) stack: the decoder for decoder-only models, the
    /// encoder otherwise.
    pub layers: u64,
    /// Decoder layers of an encoder-decoder; 0 otherwise.
    pub decoder_layers: u64,
    /// Width of the residual stream (`h`).
    pub hidden: u64,
    /// Attention heads (`a`).
    pub heads: u64,
    /// Key/value heads (grouped-query attention); equal to `heads` without GQA.
    pub kv_heads: u64,
    /// Size of one head (`d`); `heads * head_dim` need not equal `hidden`.
    pub head_dim: u64,
    /// Width of the MLP (`f`).
    pub ffn: u64,
    /// Vocabulary size (`v`); 0 for image models.
    pub vocab: u64,
    /// Longest sequence with learned positions, when positions are learned.
    pub max_positions: Option<u64>,
    /// Whether positions are learned embeddings (then longer inputs cannot run).
    pub learned_positions: bool,
    /// Rotary position embeddings (Llama family).
    pub rope: bool,
    /// The MLP activation (name in the config, and how it is implemented).
    pub activation: Activation,
    /// The activation's name as the config spells it.
    pub activation_name: String,
    /// Gated MLP (SwiGLU, GeGLU): `down(act(gate(x)) * up(x))`.
    pub gated_mlp: bool,
    /// Normalisation.
    pub norm: Norm,
    /// One fused QKV projection (GPT-2 `c_attn`) rather than three.
    pub fused_qkv: bool,
    /// Dropout probabilities from the config.
    pub dropout: Dropouts,
    /// `use_cache` from the config: recent `transformers` build a `DynamicCache`
    /// even in a training forward, which can hold copies of K and V.
    pub use_cache: bool,
    /// Whether the eager attention upcasts the scores to fp32 for the softmax
    /// (`softmax(..., dtype=torch.float32)` in the Llama family, T5's
    /// `scores.float()`): the fp32 probabilities are kept for backward
    /// beside the copy cast back for the matmul.
    pub softmax_fp32: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3's `q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// How the loss is computed over the logits.
    pub loss: Loss,
    /// Whether the LM head shares the input embedding matrix.
    pub tied_embeddings: bool,
    /// The output head.
    pub head: Head,
    /// Image input, for ViT.
    pub image: Option<Image>,
}

impl Architecture {
    /// Query width `a * d`.
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }
    /// Key (and value) width `kv_heads * d`.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }
}

/// One parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamTensor {
    /// Name in the state dict.
    pub name: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Element count.
    pub numel: u64,
    /// Whether it enters a matrix multiply (a Linear weight or bias, or the
    /// embedding matrix the LM head reuses): autocast keeps a 16-bit copy of it.
    pub matmul: bool,
    /// The layer it belongs to, when it belongs to one.
    pub layer: Option<u64>,
    /// Its dtype in the checkpoint, when read from a `.safetensors` header.
    pub checkpoint_dtype: Option<String>,
}

impl ParamTensor {
    /// A tensor of the given shape.
    pub fn new(name: impl Into<String>, shape: &[u64], matmul: bool, layer: Option<u64>) -> Self {
        ParamTensor {
            name: name.into(),
            shape: shape.to_vec(),
            numel: shape.iter().fold(1u64, |a, &d| a.saturating_mul(d)),
            matmul,
            layer,
            checkpoint_dtype: None,
        }
    }
}

/// A model: where it came from, its architecture when known, its parameters.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSpec {
    /// The family.
    pub family: Family,
    /// `model_type` from the config (`gpt2`, `llama`, ...), or `safetensors`.
    pub model_type: String,
    /// The class the config names (`architectures[0]`), if any.
    pub architecture_class: Option<String>,
    /// The file(s) it was read from.
    pub source: PathBuf,
    /// The architecture; `None` when only a `.safetensors` header was given.
    pub arch: Option<Architecture>,
    /// Parameter tensors, each counted once (tied weights once), as
    /// `model.parameters()` yields them.
    pub tensors: Vec<ParamTensor>,
    /// Where the tensor list came from: `config` (derived from the config's
    /// sizes) or `safetensors` (read from the checkpoint's header).
    pub tensors_from: &'static str,
    /// Remarks made while reading (dropped buffers, assumptions).
    pub notes: Vec<String>,
}

impl ModelSpec {
    /// Total parameter count.
    pub fn parameters(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.numel))
    }

    /// Parameters that enter a matmul (autocast copies them to 16 bits).
    pub fn matmul_parameters(&self) -> u64 {
        self.tensors
            .iter()
            .filter(|t| t.matmul)
            .fold(0u64, |a, t| a.saturating_add(t.numel))
    }

    /// The largest number of parameters in one layer.
    pub fn largest_layer_parameters(&self) -> u64 {
        let mut per_layer: std::collections::BTreeMap<u64, u64> = Default::default();
        for t in &self.tensors {
            if let Some(l) = t.layer {
                let e = per_layer.entry(l).or_default();
                *e = e.saturating_add(t.numel);
            }
        }
        per_layer.values().copied().max().unwrap_or(0)
    }

    /// The largest single tensor.
    pub fn largest_tensor(&self) -> u64 {
        self.tensors.iter().map(|t| t.numel).max().unwrap_or(0)
    }
}
