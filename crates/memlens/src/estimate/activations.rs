//! Activation memory: the tensors autograd saves for backward, layer by layer.
//!
//! The skeleton is Korthikanti et al. 2022, "Reducing Activation Recomputation
//! in Large Transformer Models", section 4.1: per transformer layer with 16-bit
//! activations and dropout, `s·b·h·(34 + 5·a·s/h)` bytes: attention 11·sbh +
//! 5·as²b, MLP 19·sbh, two LayerNorms 4·sbh. Each of its terms is kept as a
//! separate [`Term`] and generalised:
//!
//! * element sizes: `e` bytes for activations (2 under autocast or 16-bit
//!   weights, 4 in fp32), `r` bytes for the residual stream, which stays in
//!   the weights' dtype (fp32 under autocast, since the embeddings are fp32);
//! * grouped-query attention (`K`, `V` are `kv = kv_heads·d` wide, not `h`);
//! * fused attention (FlashAttention, SDPA): no `s²` scores, probabilities or
//!   dropout mask; it keeps its output and a per-row logsumexp;
//! * no dropout: no masks; gated MLPs (SwiGLU): gate, up, activation and
//!   product, each `f` wide;
//! * what the Hugging Face implementations add: autocast casting the fp32 norm
//!   output once per projection, Python RMSNorm keeping fp32 copies, the tanh
//!   GELU written in Python keeping four intermediates (three in fp32 under
//!   autocast, as `pow` is an fp32 autocast op), and the training-time
//!   `DynamicCache` copies of K and V.
//!
//! Checked on the `gpt2_train` fixture, whose live tensors at the peak match
//! these terms one for one.

use super::model::{Activation, Architecture, Norm};
use super::{sat_prod, Term};

/// What the formulas are evaluated at.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ctx {
    /// Micro-batch.
    pub b: u64,
    /// Sequence length of this stack.
    pub s: u64,
    /// Sequence length the attention looks at (the encoder's, for cross-attention).
    pub s_kv: u64,
    /// Bytes of an activation element.
    pub e: u64,
    /// Bytes of a residual-stream element.
    pub r: u64,
    /// Autocast is on.
    pub amp: bool,
    /// Fused attention.
    pub flash: bool,
    /// Dropout applies (training, and not switched off).
    pub dropout: bool,
    /// Selective recomputation of the attention core (Korthikanti §5).
    pub selective: bool,
    /// A decoder-only model building its training-time KV cache.
    pub training_cache: bool,
}

impl Ctx {
    /// Autocast casts the (fp32) norm output separately for each projection
    /// that reads it, and each copy is saved.
    fn casts_per_projection(&self) -> bool {
        self.amp && self.r == 4
    }
}

fn term(name: impl Into<String>, formula: impl Into<String>, bytes: u64) -> Term {
    Term {
        name: name.into(),
        formula: formula.into(),
        bytes,
    }
}

/// Bytes per `h` a norm keeps, and how to say it.
fn norm_saved(n: Norm, r: u64) -> (u64, &'static str) {
    match n {
        Norm::LayerNorm => (r, "b·s·h·r"),
        Norm::RmsNorm => (4 + r, "b·s·h·(4 + r)"),
    }
}

/// A norm's saved input: LayerNorm keeps its input; HF's Python RMSNorm keeps
/// the input upcast to fp32 and the normalised output (fp32, or cast back).
pub(super) fn norm_term(a: &Architecture, c: &Ctx, what: &str) -> Term {
    let (per_h, formula) = norm_saved(a.norm, c.r);
    let label = match a.norm {
        Norm::LayerNorm => format!("{what} LayerNorm input"),
        Norm::RmsNorm => format!("{what} RMSNorm fp32 input and normalised output"),
    };
    term(label, formula, sat_prod(&[c.b, c.s, a.hidden, per_h]))
}

/// The self-attention block of one layer.
pub(super) fn self_attention(a: &Architecture, c: &Ctx) -> Vec<Term> {
    let (b, s, h, e) = (c.b, c.s, a.hidden, c.e);
    let (q, kv) = (a.q_dim(), a.kv_dim());
    let mut t = vec![norm_term(a, c, "attention")];
    if c.casts_per_projection() && !a.fused_qkv {
        t.push(term(
            "Q, K, V projection inputs (an autocast cast each)",
            "3·b·s·h·e",
            sat_prod(&[3, b, s, h, e]),
        ));
    } else {
        t.push(term(
            "QKV projection input",
            "b·s·h·e",
            sat_prod(&[b, s, h, e]),
        ));
    }
    t.push(term(
        "Q, K, V",
        "b·s·(q + 2·kv)·e",
        sat_prod(&[b, s, q + 2 * kv, e]),
    ));
    if a.qk_norm {
        // HF's RMSNorm over each head of Q and K: the fp32 input and the
        // normalised output cast back, as for the layer norms.
        t.push(term(
            "Q, K per-head RMSNorm: fp32 input and normalised output",
            "b·s·(q + kv)·(4 + e)",
            sat_prod(&[b, s, q + kv, 4 + e]),
        ));
    }
    if c.training_cache {
        if a.fused_qkv {
            t.push(term(
                "K, V copies in the training DynamicCache (use_cache)",
                "2·b·s·kv·e",
                sat_prod(&[2, b, s, kv, e]),
            ));
        } else if a.rope && c.casts_per_projection() {
            t.push(term(
                "fp32 K in the training DynamicCache (use_cache)",
                "b·s·kv·4",
                sat_prod(&[b, s, kv, 4]),
            ));
        }
    }
    t.extend(attention_core(a, c));
    if c.dropout && a.dropout.hidden > 0.0 {
        t.push(term("residual dropout mask", "b·s·h", sat_prod(&[b, s, h])));
    }
    t
}

/// Scores, probabilities and output of the attention; `s_kv` keys.
fn attention_core(a: &Architecture, c: &Ctx) -> Vec<Term> {
    let (b, s, sk, e, heads) = (c.b, c.s, c.s_kv, c.e, a.heads);
    let q = a.q_dim();
    let mut t = Vec::new();
    if c.flash {
        t.push(term(
            "attention output (= output projection input)",
            "b·s·q·e",
            sat_prod(&[b, s, q, e]),
        ));
        t.push(term(
            "softmax logsumexp (fp32, per row)",
            "b·a·s·4",
            sat_prod(&[b, heads, s, 4]),
        ));
        return t;
    }
    if !c.selective {
        // Softmax keeps its output for backward. It is fp32 when autocast
        // runs it (softmax is an fp32 autocast op) or the model upcasts the
        // scores itself; the matmul with V then reads (and keeps) a copy
        // cast back to `e`, or the dropout output when there is dropout
        // (whose backward needs only its mask).
        let sm = if c.amp || a.softmax_fp32 { 4 } else { e };
        let (sm_name, sm_formula) = if sm == e {
            ("attention probabilities (softmax output)", "b·a·s·s_kv·e")
        } else {
            (
                "attention probabilities, fp32 (softmax output)",
                "b·a·s·s_kv·4",
            )
        };
        t.push(term(sm_name, sm_formula, sat_prod(&[b, heads, s, sk, sm])));
        if c.dropout && a.dropout.attention > 0.0 {
            t.push(term(
                "attention dropout mask",
                "b·a·s·s_kv",
                sat_prod(&[b, heads, s, sk]),
            ));
            t.push(term(
                "attention dropout output",
                "b·a·s·s_kv·e",
                sat_prod(&[b, heads, s, sk, e]),
            ));
        } else if sm != e {
            t.push(term(
                "attention probabilities cast back (P·V matmul input)",
                "b·a·s·s_kv·e",
                sat_prod(&[b, heads, s, sk, e]),
            ));
        }
    }
    t.push(term(
        "attention output (= output projection input)",
        "b·s·q·e",
        sat_prod(&[b, s, q, e]),
    ));
    t
}

/// The cross-attention block of a decoder layer (T5): queries from the
/// decoder, keys and values from the encoder's `s_kv` tokens.
pub(super) fn cross_attention(a: &Architecture, c: &Ctx) -> Vec<Term> {
    let (b, s, sk, h, e) = (c.b, c.s, c.s_kv, a.hidden, c.e);
    let (q, kv) = (a.q_dim(), a.kv_dim());
    let mut t = vec![norm_term(a, c, "cross-attention")];
    t.push(term(
        "query projection input",
        "b·s·h·e",
        sat_prod(&[b, s, h, e]),
    ));
    t.push(term("Q", "b·s·q·e", sat_prod(&[b, s, q, e])));
    if c.casts_per_projection() {
        t.push(term(
            "encoder output cast for the K and V projections",
            "2·b·s_kv·h·e",
            sat_prod(&[2, b, sk, h, e]),
        ));
    }
    t.push(term(
        "K, V of the encoder output",
        "2·b·s_kv·kv·e",
        sat_prod(&[2, b, sk, kv, e]),
    ));
    t.extend(attention_core(a, c));
    if c.dropout && a.dropout.hidden > 0.0 {
        t.push(term("residual dropout mask", "b·s·h", sat_prod(&[b, s, h])));
    }
    t
}

/// The MLP block of one layer.
pub(super) fn mlp(a: &Architecture, c: &Ctx) -> Vec<Term> {
    let (b, s, h, f, e) = (c.b, c.s, a.hidden, a.ffn, c.e);
    let bsf = |k: u64| sat_prod(&[b, s, f, k]);
    let mut t = vec![norm_term(a, c, "MLP")];
    if c.casts_per_projection() && a.gated_mlp {
        t.push(term(
            "gate, up projection inputs (an autocast cast each)",
            "2·b·s·h·e",
            sat_prod(&[2, b, s, h, e]),
        ));
    } else {
        t.push(term("MLP input", "b·s·h·e", sat_prod(&[b, s, h, e])));
    }
    let inner = if a.gated_mlp { "gate" } else { "up" };
    match a.activation {
        Activation::Relu => t.push(term("ReLU output", "b·s·f·e", bsf(e))),
        Activation::Fused => {
            t.push(term(
                format!("activation input ({inner} projection output)"),
                "b·s·f·e",
                bsf(e),
            ));
            t.push(term(
                format!("activation output ({})", a.activation_name),
                "b·s·f·e",
                bsf(e),
            ));
        }
        Activation::PythonTanhGelu if c.amp => {
            t.push(term(
                format!(
                    "{} intermediates: fp32 x (pow), tanh, 1+tanh; x/2",
                    a.activation_name
                ),
                "b·s·f·(3·4 + e)",
                bsf(12 + e),
            ));
            t.push(term(
                "activation output, cast for the down projection",
                "b·s·f·e",
                bsf(e),
            ));
        }
        Activation::PythonTanhGelu => {
            t.push(term(
                format!("{} intermediates: x, tanh, 1+tanh, x/2", a.activation_name),
                "4·b·s·f·e",
                bsf(4 * e),
            ));
            t.push(term("activation output", "b·s·f·e", bsf(e)));
        }
    }
    if a.gated_mlp {
        t.push(term("up projection output", "b·s·f·e", bsf(e)));
        t.push(term(
            "activation · up (down projection input)",
            "b·s·f·e",
            bsf(e),
        ));
    }
    if c.dropout && a.dropout.mlp_inner > 0.0 {
        t.push(term("MLP inner dropout mask", "b·s·f", bsf(1)));
        t.push(term(
            "MLP inner dropout output (down projection input)",
            "b·s·f·e",
            bsf(e),
        ));
    }
    if c.dropout && a.dropout.hidden > 0.0 {
        t.push(term("residual dropout mask", "b·s·h", sat_prod(&[b, s, h])));
    }
    t
}

/// What one inference layer holds while it runs (nothing is saved between
/// layers): the residual, and the larger of the attention's and the MLP's
/// working tensors.
pub(super) fn inference_working_set(a: &Architecture, c: &Ctx) -> Vec<Term> {
    let (b, s, h, f, e, r) = (c.b, c.s, a.hidden, a.ffn, c.e, c.r);
    let (q, kv) = (a.q_dim(), a.kv_dim());
    let scores = if c.flash {
        0
    } else {
        sat_prod(&[2, b, a.heads, s, c.s_kv, e])
    };
    let attn = sat_prod(&[b, s, h, r])
        .saturating_add(sat_prod(&[b, s, q + 2 * kv + q, e]))
        .saturating_add(scores);
    let mlp_width = if a.gated_mlp { 3 } else { 2 };
    let mlp = sat_prod(&[b, s, h, r]).saturating_add(sat_prod(&[b, s, f, mlp_width, e]));
    let mut t = vec![term("residual stream", "b·s·h·r", sat_prod(&[b, s, h, r]))];
    if attn >= mlp {
        let formula = if c.flash {
            "b·s·h·r + b·s·(2·q + 2·kv)·e"
        } else {
            "b·s·h·r + b·s·(2·q + 2·kv)·e + 2·b·a·s·s_kv·e"
        };
        t.push(term(
            "attention working set (norm output, Q, K, V, output, scores)",
            formula,
            attn,
        ));
    } else {
        let formula = if a.gated_mlp {
            "b·s·h·r + 3·b·s·f·e"
        } else {
            "b·s·h·r + 2·b·s·f·e"
        };
        t.push(term(
            "MLP working set (norm output, intermediates)",
            formula,
            mlp,
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::super::model::{Dropouts, Head, Stack};
    use super::*;

    /// The architecture of Korthikanti et al.'s analysis: LayerNorm, GELU,
    /// separate Q/K/V, dropout everywhere, f = 4h.
    fn megatron(h: u64, heads: u64) -> Architecture {
        Architecture {
            stack: Stack::DecoderOnly,
            layers: 1,
            decoder_layers: 0,
            hidden: h,
            heads,
            kv_heads: heads,
            head_dim: h / heads,
            ffn: 4 * h,
            vocab: 0,
            max_positions: None,
            learned_positions: false,
            rope: false,
            activation: Activation::Fused,
            activation_name: "gelu".into(),
            gated_mlp: false,
            norm: Norm::LayerNorm,
            fused_qkv: true,
            dropout: Dropouts {
                embedding: 0.1,
                attention: 0.1,
                hidden: 0.1,
                mlp_inner: 0.0,
            },
            use_cache: false,
            softmax_fp32: false,
            qk_norm: false,
            loss: crate::estimate::model::Loss::Upcast,
            tied_embeddings: true,
            head: Head::Lm,
            image: None,
        }
    }

    fn total(t: &[Term]) -> u64 {
        t.iter().map(|t| t.bytes).sum()
    }

    #[test]
    fn reduces_to_korthikanti() {
        // 16-bit everything (r = e = 2), dropout, materialised attention:
        // s·b·h·(34 + 5·a·s/h).
        let (b, s, h, heads) = (4u64, 2048u64, 4096u64, 32u64);
        let a = megatron(h, heads);
        let c = Ctx {
            b,
            s,
            s_kv: s,
            e: 2,
            r: 2,
            amp: false,
            flash: false,
            dropout: true,
            selective: false,
            training_cache: false,
        };
        let layer = total(&self_attention(&a, &c)) + total(&mlp(&a, &c));
        assert_eq!(layer, s * b * h * 34 + 5 * heads * s * s * b);
        // Selective recomputation drops exactly the 5·a·s²·b term.
        let sel = Ctx {
            selective: true,
            ..c
        };
        let layer = total(&self_attention(&a, &sel)) + total(&mlp(&a, &sel));
        assert_eq!(layer, s * b * h * 34);
        // Flash drops it too, keeping a small logsumexp.
        let fl = Ctx { flash: true, ..c };
        let layer = total(&self_attention(&a, &fl)) + total(&mlp(&a, &fl));
        assert_eq!(layer, s * b * h * 34 + b * heads * s * 4);
    }
}
