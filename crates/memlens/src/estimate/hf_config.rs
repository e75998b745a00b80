//! Hugging Face `config.json` files: the fields each supported family uses,
//! turned into an [`Architecture`] and the list of parameter tensors the
//! `transformers` classes create (each tied tensor once, as
//! `model.parameters()` counts it).

use super::model::{
    Activation, Architecture, Dropouts, Family, Head, Image, Loss, ModelSpec, Norm, ParamTensor,
    Stack,
};
use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// Largest size accepted for a dimension that enters parameter shapes: larger
/// values are certainly a corrupt config, and capping keeps products far from
/// overflowing.
const MAX_DIM: u64 = 1 << 26;
/// Largest layer count accepted.
const MAX_LAYERS: u64 = 1 << 14;

/// The `model_type`s understood, for error messages.
pub const SUPPORTED: &str = "gpt2, llama, mistral, qwen2, qwen3, bert, roberta, t5, mt5, vit";

/// Parses the text of a `config.json` read from `path`.
pub fn parse_config(text: &str, path: &Path) -> Result<ModelSpec> {
    let value: Value = serde_json::from_str(text).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        what: e.to_string(),
    })?;
    let Value::Object(map) = value else {
        return Err(model_err(
            path,
            "not a Hugging Face config.json (not a JSON object)",
        ));
    };
    let cfg = Cfg { map: &map, path };
    let class = map
        .get("architectures")
        .and_then(|a| a.as_array())
        .and_then(|a| a.first())
        .and_then(|c| c.as_str())
        .map(str::to_string);
    let model_type = match map.get("model_type").and_then(|m| m.as_str()) {
        Some(t) => t.to_ascii_lowercase(),
        None => type_from_class(class.as_deref()).ok_or_else(|| {
            model_err(
                path,
                "no \"model_type\" field: not a Hugging Face config.json, or too old a one",
            )
        })?,
    };
    let class_str = class.clone().unwrap_or_default();
    let (family, arch, tensors) = match model_type.as_str() {
        "gpt2" => {
            let (a, t) = gpt2(&cfg, &class_str)?;
            (Family::Gpt2, a, t)
        }
        "llama" | "mistral" | "qwen2" | "qwen3" => {
            let (a, t) = llama(&cfg, &class_str, &model_type)?;
            (Family::Llama, a, t)
        }
        "bert" | "roberta" => {
            let (a, t) = bert(&cfg, &class_str, &model_type)?;
            (Family::Bert, a, t)
        }
        "t5" | "mt5" => {
            let (a, t) = t5(&cfg, &class_str)?;
            (Family::T5, a, t)
        }
        "vit" => {
            let (a, t) = vit(&cfg, &class_str)?;
            (Family::Vit, a, t)
        }
        other => {
            return Err(model_err(
                path,
                format!(
                    "model_type {other:?} is not supported (supported: {SUPPORTED}); any \
                     transformers config: memlens.predict_config(\"config.json\", batch=8, seq=512) \
                     in Python traces the step with fake tensors (a GPU visible, none of the step's memory on it)"
                ),
            ))
        }
    };
    let mut notes = Vec::new();
    if arch.activation == Activation::Fused && !known_fused(&arch.activation_name) {
        notes.push(format!(
            "activation {:?} is not one memlens knows; assumed a fused kernel",
            arch.activation_name
        ));
    }
    Ok(ModelSpec {
        family,
        model_type,
        architecture_class: class,
        source: path.to_path_buf(),
        arch: Some(arch),
        tensors,
        tensors_from: "config",
        notes,
    })
}

fn model_err(path: &Path, what: impl Into<String>) -> Error {
    Error::Model {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// `model_type` from a class name, for configs that lack the field.
fn type_from_class(class: Option<&str>) -> Option<String> {
    let c = class?;
    let t = [
        ("GPT2", "gpt2"),
        ("Llama", "llama"),
        ("Mistral", "mistral"),
        ("Qwen2", "qwen2"),
        ("Qwen3", "qwen3"),
        ("Bert", "bert"),
        ("Roberta", "roberta"),
        ("MT5", "mt5"),
        ("T5", "t5"),
        ("ViT", "vit"),
    ]
    .iter()
    .find(|(prefix, _)| c.starts_with(prefix))?;
    Some(t.1.to_string())
}

/// Typed access to the fields of a config.
struct Cfg<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
}

impl Cfg<'_> {
    fn err(&self, what: String) -> Error {
        model_err(self.path, what)
    }

    /// A required positive integer no larger than `max`.
    fn dim_max(&self, key: &str, max: u64) -> Result<u64> {
        match self.map.get(key) {
            None | Some(Value::Null) => Err(self.err(format!("missing field {key:?}"))),
            Some(v) => self.check(key, v, max),
        }
    }

    fn dim(&self, key: &str) -> Result<u64> {
        self.dim_max(key, MAX_DIM)
    }

    /// An optional positive integer (absent or null gives `None`).
    fn opt_dim(&self, key: &str) -> Result<Option<u64>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => self.check(key, v, MAX_DIM).map(Some),
        }
    }

    fn check(&self, key: &str, v: &Value, max: u64) -> Result<u64> {
        match v.as_u64() {
            Some(n) if n >= 1 && n <= max => Ok(n),
            Some(n) if n > max => {
                Err(self.err(format!("field {key:?} = {n} is implausibly large")))
            }
            _ => Err(self.err(format!(
                "field {key:?} must be a positive integer, found {v}"
            ))),
        }
    }

    fn prob(&self, key: &str, default: f64) -> Result<f64> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_f64() {
                Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
                _ => Err(self.err(format!("field {key:?} must be a probability, found {v}"))),
            },
        }
    }

    fn flag(&self, key: &str, default: bool) -> bool {
        self.map
            .get(key)
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    fn string(&self, key: &str, default: &str) -> String {
        self.map
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    }

    /// Classes of a classification head: `num_labels`, else the size of
    /// `id2label`, else 2 (`PretrainedConfig`'s default).
    fn num_labels(&self) -> Result<u64> {
        if let Some(n) = self.opt_dim("num_labels")? {
            return Ok(n);
        }
        Ok(self
            .map
            .get("id2label")
            .and_then(Value::as_object)
            .map(|m| m.len() as u64)
            .filter(|&n| n > 0)
            .unwrap_or(2))
    }

    /// `hidden / heads`, which must divide evenly.
    fn head_dim(&self, hidden: u64, heads: u64, hidden_key: &str, heads_key: &str) -> Result<u64> {
        if !hidden.is_multiple_of(heads) {
            return Err(self.err(format!(
                "{hidden_key} = {hidden} is not a multiple of {heads_key} = {heads}"
            )));
        }
        Ok(hidden / heads)
    }
}

fn activation(name: &str) -> Activation {
    match name {
        "relu" => Activation::Relu,
        "gelu_new" | "gelu_fast" | "gelu_python" | "quick_gelu" => Activation::PythonTanhGelu,
        _ => Activation::Fused,
    }
}

fn known_fused(name: &str) -> bool {
    matches!(
        name,
        "gelu" | "gelu_pytorch_tanh" | "silu" | "swish" | "gelu_accurate" | "mish" | "tanh"
    )
}

/// Pushes a Linear layer's weight `[out, inp]` and optional bias.
fn linear(
    t: &mut Vec<ParamTensor>,
    name: &str,
    out: u64,
    inp: u64,
    bias: bool,
    layer: Option<u64>,
) {
    t.push(ParamTensor::new(
        format!("{name}.weight"),
        &[out, inp],
        true,
        layer,
    ));
    if bias {
        t.push(ParamTensor::new(
            format!("{name}.bias"),
            &[out],
            true,
            layer,
        ));
    }
}

/// Pushes a norm's weight and optional bias.
fn norm(t: &mut Vec<ParamTensor>, name: &str, h: u64, bias: bool, layer: Option<u64>) {
    t.push(ParamTensor::new(
        format!("{name}.weight"),
        &[h],
        false,
        layer,
    ));
    if bias {
        t.push(ParamTensor::new(format!("{name}.bias"), &[h], false, layer));
    }
}

/// The head of a decoder-only class: `...ForSequenceClassification` has a
/// classifier, a bare `...Model` none, the rest (`...ForCausalLM`,
/// `GPT2LMHeadModel`, `GPT2DoubleHeadsModel`) a language-model head.
fn decoder_head(c: &Cfg, class: &str) -> Result<Head> {
    Ok(if class.ends_with("ForSequenceClassification") {
        Head::Classifier {
            labels: c.num_labels()?,
        }
    } else if class.ends_with("Model") && !class.contains("Head") {
        Head::None
    } else {
        Head::Lm
    })
}

/// The head's own weights after a decoder stack: `lm_head` unless it is tied
/// to the embedding, `score` for a classifier.
fn push_decoder_head(t: &mut Vec<ParamTensor>, head: Head, tied: bool, vocab: u64, hidden: u64) {
    match head {
        Head::Lm if !tied => linear(t, "lm_head", vocab, hidden, false, None),
        Head::Classifier { labels } => linear(t, "score", labels, hidden, false, None),
        _ => {}
    }
}

fn gpt2(c: &Cfg, class: &str) -> Result<(Architecture, Vec<ParamTensor>)> {
    let h = c.dim("n_embd")?;
    let layers = c.dim_max("n_layer", MAX_LAYERS)?;
    let heads = c.dim("n_head")?;
    let v = c.dim("vocab_size")?;
    let pos = c.opt_dim("n_positions")?.unwrap_or(1024);
    let f = c.opt_dim("n_inner")?.unwrap_or(4 * h);
    let d = c.head_dim(h, heads, "n_embd", "n_head")?;
    let act = c.string("activation_function", "gelu_new");
    let tied = c.flag("tie_word_embeddings", true);
    let head = decoder_head(c, class)?;
    let mut t = Vec::new();
    // `wte` is the LM head's matrix too when tied: autocast copies it then.
    t.push(ParamTensor::new(
        "transformer.wte.weight",
        &[v, h],
        head == Head::Lm && tied,
        None,
    ));
    t.push(ParamTensor::new(
        "transformer.wpe.weight",
        &[pos, h],
        false,
        None,
    ));
    for l in 0..layers {
        let p = format!("transformer.h.{l}");
        let ly = Some(l);
        norm(&mut t, &format!("{p}.ln_1"), h, true, ly);
        // Conv1D stores weights [in, out]; the count is the same.
        linear(&mut t, &format!("{p}.attn.c_attn"), 3 * h, h, true, ly);
        linear(&mut t, &format!("{p}.attn.c_proj"), h, h, true, ly);
        norm(&mut t, &format!("{p}.ln_2"), h, true, ly);
        linear(&mut t, &format!("{p}.mlp.c_fc"), f, h, true, ly);
        linear(&mut t, &format!("{p}.mlp.c_proj"), h, f, true, ly);
    }
    norm(&mut t, "transformer.ln_f", h, true, None);
    push_decoder_head(&mut t, head, tied, v, h);
    let arch = Architecture {
        stack: Stack::DecoderOnly,
        layers,
        decoder_layers: 0,
        hidden: h,
        heads,
        kv_heads: heads,
        head_dim: d,
        ffn: f,
        vocab: v,
        max_positions: Some(pos),
        learned_positions: true,
        rope: false,
        activation: activation(&act),
        activation_name: act,
        gated_mlp: false,
        norm: Norm::LayerNorm,
        fused_qkv: true,
        dropout: Dropouts {
            embedding: c.prob("embd_pdrop", 0.1)?,
            attention: c.prob("attn_pdrop", 0.1)?,
            hidden: c.prob("resid_pdrop", 0.1)?,
            mlp_inner: 0.0,
        },
        use_cache: c.flag("use_cache", true),
        softmax_fp32: false,
        qk_norm: false,
        loss: Loss::Upcast,
        tied_embeddings: tied,
        head,
        image: None,
    };
    Ok((arch, t))
}

fn llama(c: &Cfg, class: &str, model_type: &str) -> Result<(Architecture, Vec<ParamTensor>)> {
    let h = c.dim("hidden_size")?;
    let layers = c.dim_max("num_hidden_layers", MAX_LAYERS)?;
    let heads = c.dim("num_attention_heads")?;
    let kv = c.opt_dim("num_key_value_heads")?.unwrap_or(heads);
    if heads % kv != 0 {
        return Err(c.err(format!(
            "num_attention_heads = {heads} is not a multiple of num_key_value_heads = {kv}"
        )));
    }
    let d = match c.opt_dim("head_dim")? {
        Some(d) => d,
        None => c.head_dim(h, heads, "hidden_size", "num_attention_heads")?,
    };
    let f = c.dim("intermediate_size")?;
    let v = c.dim("vocab_size")?;
    let act = c.string("hidden_act", "silu");
    let tied = c.flag("tie_word_embeddings", false);
    // Qwen2 always has biases on q, k, v (not on o); Llama, Mistral and Qwen3
    // follow `attention_bias`.
    let qkv_bias = model_type == "qwen2" || c.flag("attention_bias", false);
    let o_bias = model_type != "qwen2" && c.flag("attention_bias", false);
    let mlp_bias = c.flag("mlp_bias", false);
    let head = decoder_head(c, class)?;
    let (q, kvd) = (heads * d, kv * d);
    let mut t = Vec::new();
    t.push(ParamTensor::new(
        "model.embed_tokens.weight",
        &[v, h],
        head == Head::Lm && tied,
        None,
    ));
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let ly = Some(l);
        norm(&mut t, &format!("{p}.input_layernorm"), h, false, ly);
        linear(&mut t, &format!("{p}.self_attn.q_proj"), q, h, qkv_bias, ly);
        linear(
            &mut t,
            &format!("{p}.self_attn.k_proj"),
            kvd,
            h,
            qkv_bias,
            ly,
        );
        linear(
            &mut t,
            &format!("{p}.self_attn.v_proj"),
            kvd,
            h,
            qkv_bias,
            ly,
        );
        linear(&mut t, &format!("{p}.self_attn.o_proj"), h, q, o_bias, ly);
        if model_type == "qwen3" {
            norm(&mut t, &format!("{p}.self_attn.q_norm"), d, false, ly);
            norm(&mut t, &format!("{p}.self_attn.k_norm"), d, false, ly);
        }
        norm(
            &mut t,
            &format!("{p}.post_attention_layernorm"),
            h,
            false,
            ly,
        );
        linear(&mut t, &format!("{p}.mlp.gate_proj"), f, h, mlp_bias, ly);
        linear(&mut t, &format!("{p}.mlp.up_proj"), f, h, mlp_bias, ly);
        linear(&mut t, &format!("{p}.mlp.down_proj"), h, f, mlp_bias, ly);
    }
    norm(&mut t, "model.norm", h, false, None);
    push_decoder_head(&mut t, head, tied, v, h);
    let arch = Architecture {
        stack: Stack::DecoderOnly,
        layers,
        decoder_layers: 0,
        hidden: h,
        heads,
        kv_heads: kv,
        head_dim: d,
        ffn: f,
        vocab: v,
        max_positions: c.opt_dim("max_position_embeddings").ok().flatten(),
        learned_positions: false,
        rope: true,
        activation: activation(&act),
        activation_name: act,
        gated_mlp: true,
        norm: Norm::RmsNorm,
        fused_qkv: false,
        dropout: Dropouts {
            embedding: 0.0,
            attention: c.prob("attention_dropout", 0.0)?,
            hidden: 0.0,
            mlp_inner: 0.0,
        },
        use_cache: c.flag("use_cache", true),
        softmax_fp32: true,
        qk_norm: model_type == "qwen3",
        loss: Loss::Upcast,
        tied_embeddings: tied,
        head,
        image: None,
    };
    Ok((arch, t))
}

fn bert(c: &Cfg, class: &str, model_type: &str) -> Result<(Architecture, Vec<ParamTensor>)> {
    let h = c.dim("hidden_size")?;
    let layers = c.dim_max("num_hidden_layers", MAX_LAYERS)?;
    let heads = c.dim("num_attention_heads")?;
    let d = c.head_dim(h, heads, "hidden_size", "num_attention_heads")?;
    let f = c.dim("intermediate_size")?;
    let v = c.dim("vocab_size")?;
    let pos = c.opt_dim("max_position_embeddings")?.unwrap_or(512);
    let types = c.opt_dim("type_vocab_size")?.unwrap_or(2);
    let act = c.string("hidden_act", "gelu");
    let hidden_p = c.prob("hidden_dropout_prob", 0.1)?;
    let roberta = model_type == "roberta";
    let base = if roberta { "roberta" } else { "bert" };
    // What the class adds on top of the encoder.
    let (head, pooler, nsp) = if class.ends_with("ForMaskedLM") {
        (Head::MaskedLm, false, false)
    } else if class.ends_with("ForPreTraining") {
        (Head::MaskedLm, true, true)
    } else if class.ends_with("ForSequenceClassification") {
        // BERT classifies the pooled output; RoBERTa has its own dense head.
        (
            Head::Classifier {
                labels: c.num_labels()?,
            },
            !roberta,
            false,
        )
    } else {
        (Head::None, true, false)
    };
    let mut t = Vec::new();
    bert_embeddings(&mut t, base, [v, pos, types, h], head == Head::MaskedLm);
    for l in 0..layers {
        bert_layer(&mut t, base, l, h, f);
    }
    if pooler {
        linear(&mut t, &format!("{base}.pooler.dense"), h, h, true, None);
    }
    bert_head(&mut t, head, roberta, nsp, h, v);
    let arch = Architecture {
        stack: Stack::EncoderOnly,
        layers,
        decoder_layers: 0,
        hidden: h,
        heads,
        kv_heads: heads,
        head_dim: d,
        ffn: f,
        vocab: v,
        max_positions: Some(pos),
        learned_positions: true,
        rope: false,
        activation: activation(&act),
        activation_name: act,
        gated_mlp: false,
        norm: Norm::LayerNorm,
        fused_qkv: false,
        dropout: Dropouts {
            embedding: hidden_p,
            attention: c.prob("attention_probs_dropout_prob", 0.1)?,
            hidden: hidden_p,
            mlp_inner: 0.0,
        },
        use_cache: false,
        softmax_fp32: false,
        qk_norm: false,
        loss: Loss::AsIs,
        tied_embeddings: true,
        head,
        image: None,
    };
    Ok((arch, t))
}

/// BERT's embeddings (`[vocabulary, positions, token types, hidden]`) and
/// their LayerNorm; the word embeddings are tied to the decoder when
/// `tied_word`.
fn bert_embeddings(t: &mut Vec<ParamTensor>, base: &str, dims: [u64; 4], tied_word: bool) {
    let [v, pos, types, h] = dims;
    let e = format!("{base}.embeddings");
    t.push(ParamTensor::new(
        format!("{e}.word_embeddings.weight"),
        &[v, h],
        tied_word,
        None,
    ));
    t.push(ParamTensor::new(
        format!("{e}.position_embeddings.weight"),
        &[pos, h],
        false,
        None,
    ));
    t.push(ParamTensor::new(
        format!("{e}.token_type_embeddings.weight"),
        &[types, h],
        false,
        None,
    ));
    norm(t, &format!("{e}.LayerNorm"), h, true, None);
}

/// One BERT encoder layer `l`: attention, its output, the MLP, two LayerNorms.
fn bert_layer(t: &mut Vec<ParamTensor>, base: &str, l: u64, h: u64, f: u64) {
    let p = format!("{base}.encoder.layer.{l}");
    let ly = Some(l);
    linear(t, &format!("{p}.attention.self.query"), h, h, true, ly);
    linear(t, &format!("{p}.attention.self.key"), h, h, true, ly);
    linear(t, &format!("{p}.attention.self.value"), h, h, true, ly);
    linear(t, &format!("{p}.attention.output.dense"), h, h, true, ly);
    norm(t, &format!("{p}.attention.output.LayerNorm"), h, true, ly);
    linear(t, &format!("{p}.intermediate.dense"), f, h, true, ly);
    linear(t, &format!("{p}.output.dense"), h, f, true, ly);
    norm(t, &format!("{p}.output.LayerNorm"), h, true, ly);
}

/// What BERT's class puts on top of the encoder: the masked-LM transform and
/// decoder bias (with next-sentence prediction when `nsp`), or a classifier.
fn bert_head(t: &mut Vec<ParamTensor>, head: Head, roberta: bool, nsp: bool, h: u64, v: u64) {
    match head {
        Head::MaskedLm => {
            // Transform, then the tied decoder with its own bias (BERT's
            // `cls.predictions`, RoBERTa's `lm_head`).
            let (dense, ln, bias) = if roberta {
                ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
            } else {
                (
                    "cls.predictions.transform.dense",
                    "cls.predictions.transform.LayerNorm",
                    "cls.predictions.bias",
                )
            };
            linear(t, dense, h, h, true, None);
            norm(t, ln, h, true, None);
            t.push(ParamTensor::new(bias, &[v], true, None));
            if nsp {
                linear(t, "cls.seq_relationship", 2, h, true, None);
            }
        }
        Head::Classifier { labels } => {
            if roberta {
                linear(t, "classifier.dense", h, h, true, None);
                linear(t, "classifier.out_proj", labels, h, true, None);
            } else {
                linear(t, "classifier", labels, h, true, None);
            }
        }
        _ => {}
    }
}

fn t5(c: &Cfg, class: &str) -> Result<(Architecture, Vec<ParamTensor>)> {
    let dm = c.dim("d_model")?;
    let f = c.dim("d_ff")?;
    let dkv = c.dim("d_kv")?;
    let heads = c.dim("num_heads")?;
    let enc = c.dim_max("num_layers", MAX_LAYERS)?;
    let encoder_only = class == "T5EncoderModel" || class == "MT5EncoderModel";
    let dec = if encoder_only {
        0
    } else {
        match c.map.get("num_decoder_layers") {
            None | Some(Value::Null) => enc,
            Some(_) => c.dim_max("num_decoder_layers", MAX_LAYERS)?,
        }
    };
    let v = c.dim("vocab_size")?;
    let buckets = c.opt_dim("relative_attention_num_buckets")?.unwrap_or(32);
    let (gated, act) = t5_activation(c)?;
    let tied = c.flag("tie_word_embeddings", true);
    let head = if class == "T5Model" || class == "MT5Model" || encoder_only {
        Head::None
    } else {
        Head::Lm
    };
    let inner = heads * dkv;
    let mut t = Vec::new();
    t.push(ParamTensor::new(
        "shared.weight",
        &[v, dm],
        head == Head::Lm && tied,
        None,
    ));
    let dims = T5Dims {
        dm,
        f,
        inner,
        heads,
        buckets,
        gated,
    };
    for l in 0..enc {
        dims.encoder_block(&mut t, l);
    }
    norm(&mut t, "encoder.final_layer_norm", dm, false, None);
    for l in 0..dec {
        dims.decoder_block(&mut t, l, enc + l);
    }
    if dec > 0 {
        norm(&mut t, "decoder.final_layer_norm", dm, false, None);
    }
    if head == Head::Lm && !tied {
        linear(&mut t, "lm_head", v, dm, false, None);
    }
    let p = c.prob("dropout_rate", 0.1)?;
    let arch = Architecture {
        stack: if dec == 0 {
            Stack::EncoderOnly
        } else {
            Stack::EncoderDecoder
        },
        layers: enc,
        decoder_layers: dec,
        hidden: dm,
        heads,
        kv_heads: heads,
        head_dim: dkv,
        ffn: f,
        vocab: v,
        max_positions: None,
        learned_positions: false,
        rope: false,
        activation: activation(&act),
        activation_name: act,
        gated_mlp: gated,
        norm: Norm::RmsNorm,
        fused_qkv: false,
        dropout: Dropouts {
            embedding: p,
            attention: p,
            hidden: p,
            mlp_inner: p,
        },
        use_cache: false,
        softmax_fp32: true,
        qk_norm: false,
        loss: Loss::AsIs,
        tied_embeddings: tied,
        head,
        image: None,
    };
    Ok((arch, t))
}

/// T5's `feed_forward_proj`: whether the MLP is gated, and its activation.
fn t5_activation(c: &Cfg) -> Result<(bool, String)> {
    let ffp = c.string("feed_forward_proj", "relu");
    let (gated, act) = match ffp.split_once('-') {
        Some(("gated", a)) => (true, a.to_string()),
        Some(_) => {
            return Err(c.err(format!(
                "feed_forward_proj {ffp:?} is not `ACT` or `gated-ACT`"
            )))
        }
        None => (false, ffp.clone()),
    };
    // T5Config maps `gated-gelu` to the Python tanh GELU.
    let act = if gated && act == "gelu" {
        "gelu_new".to_string()
    } else {
        act
    };
    Ok((gated, act))
}

/// The sizes T5's blocks are made of.
#[derive(Clone, Copy)]
struct T5Dims {
    /// `d_model`.
    dm: u64,
    /// `d_ff`.
    f: u64,
    /// Heads times `d_kv`.
    inner: u64,
    /// Attention heads.
    heads: u64,
    /// Buckets of the relative attention bias.
    buckets: u64,
    /// The MLP is gated (two input projections).
    gated: bool,
}

impl T5Dims {
    /// The query, key, value and output projections of attention `p`.
    fn attention(self, t: &mut Vec<ParamTensor>, p: &str, ly: Option<u64>) {
        for m in ["q", "k", "v"] {
            linear(t, &format!("{p}.{m}"), self.inner, self.dm, false, ly);
        }
        linear(t, &format!("{p}.o"), self.dm, self.inner, false, ly);
    }

    /// The MLP `p`.
    fn feed_forward(self, t: &mut Vec<ParamTensor>, p: &str, ly: Option<u64>) {
        let (f, dm) = (self.f, self.dm);
        if self.gated {
            linear(t, &format!("{p}.wi_0"), f, dm, false, ly);
            linear(t, &format!("{p}.wi_1"), f, dm, false, ly);
        } else {
            linear(t, &format!("{p}.wi"), f, dm, false, ly);
        }
        linear(t, &format!("{p}.wo"), dm, f, false, ly);
    }

    /// The self-attention of block `p` (with the relative attention bias in
    /// the first block, `first`) and its norm.
    fn self_attention(self, t: &mut Vec<ParamTensor>, p: &str, first: bool, ly: Option<u64>) {
        self.attention(t, &format!("{p}.0.SelfAttention"), ly);
        if first {
            t.push(ParamTensor::new(
                format!("{p}.0.SelfAttention.relative_attention_bias.weight"),
                &[self.buckets, self.heads],
                false,
                ly,
            ));
        }
        norm(t, &format!("{p}.0.layer_norm"), self.dm, false, ly);
    }

    /// Encoder block `l`: self-attention, then the MLP.
    fn encoder_block(self, t: &mut Vec<ParamTensor>, l: u64) {
        let p = format!("encoder.block.{l}.layer");
        let ly = Some(l);
        self.self_attention(t, &p, l == 0, ly);
        self.feed_forward(t, &format!("{p}.1.DenseReluDense"), ly);
        norm(t, &format!("{p}.1.layer_norm"), self.dm, false, ly);
    }

    /// Decoder block `l` (layer `layer` of the whole model): self-attention,
    /// attention over the encoder's output, then the MLP.
    fn decoder_block(self, t: &mut Vec<ParamTensor>, l: u64, layer: u64) {
        let p = format!("decoder.block.{l}.layer");
        let ly = Some(layer);
        self.self_attention(t, &p, l == 0, ly);
        self.attention(t, &format!("{p}.1.EncDecAttention"), ly);
        norm(t, &format!("{p}.1.layer_norm"), self.dm, false, ly);
        self.feed_forward(t, &format!("{p}.2.DenseReluDense"), ly);
        norm(t, &format!("{p}.2.layer_norm"), self.dm, false, ly);
    }
}

fn vit(c: &Cfg, class: &str) -> Result<(Architecture, Vec<ParamTensor>)> {
    let h = c.dim("hidden_size")?;
    let layers = c.dim_max("num_hidden_layers", MAX_LAYERS)?;
    let heads = c.dim("num_attention_heads")?;
    let d = c.head_dim(h, heads, "hidden_size", "num_attention_heads")?;
    let f = c.dim("intermediate_size")?;
    let image = Image {
        size: c.opt_dim("image_size")?.unwrap_or(224),
        patch: c.opt_dim("patch_size")?.unwrap_or(16),
        channels: c.opt_dim("num_channels")?.unwrap_or(3),
    };
    if image.patch > image.size {
        return Err(c.err(format!(
            "patch_size = {} is larger than image_size = {}",
            image.patch, image.size
        )));
    }
    let qkv_bias = c.flag("qkv_bias", true);
    let act = c.string("hidden_act", "gelu");
    let (head, pooler) = if class.ends_with("ForImageClassification") {
        (
            Head::Classifier {
                labels: c.num_labels()?,
            },
            false,
        )
    } else {
        (Head::None, true)
    };
    let mut t = vec![
        ParamTensor::new("vit.embeddings.cls_token", &[1, 1, h], false, None),
        ParamTensor::new(
            "vit.embeddings.position_embeddings",
            &[1, image.tokens(), h],
            false,
            None,
        ),
        ParamTensor::new(
            "vit.embeddings.patch_embeddings.projection.weight",
            &[h, image.channels, image.patch, image.patch],
            true,
            None,
        ),
        ParamTensor::new(
            "vit.embeddings.patch_embeddings.projection.bias",
            &[h],
            true,
            None,
        ),
    ];
    for l in 0..layers {
        let p = format!("vit.encoder.layer.{l}");
        let ly = Some(l);
        norm(&mut t, &format!("{p}.layernorm_before"), h, true, ly);
        for m in ["query", "key", "value"] {
            linear(
                &mut t,
                &format!("{p}.attention.attention.{m}"),
                h,
                h,
                qkv_bias,
                ly,
            );
        }
        linear(
            &mut t,
            &format!("{p}.attention.output.dense"),
            h,
            h,
            true,
            ly,
        );
        norm(&mut t, &format!("{p}.layernorm_after"), h, true, ly);
        linear(&mut t, &format!("{p}.intermediate.dense"), f, h, true, ly);
        linear(&mut t, &format!("{p}.output.dense"), h, f, true, ly);
    }
    norm(&mut t, "vit.layernorm", h, true, None);
    if pooler {
        linear(&mut t, "vit.pooler.dense", h, h, true, None);
    }
    if let Head::Classifier { labels } = head {
        linear(&mut t, "classifier", labels, h, true, None);
    }
    let arch = Architecture {
        stack: Stack::EncoderOnly,
        layers,
        decoder_layers: 0,
        hidden: h,
        heads,
        kv_heads: heads,
        head_dim: d,
        ffn: f,
        vocab: 0,
        max_positions: Some(image.tokens()),
        learned_positions: true,
        rope: false,
        activation: activation(&act),
        activation_name: act,
        gated_mlp: false,
        norm: Norm::LayerNorm,
        fused_qkv: false,
        dropout: Dropouts {
            embedding: c.prob("hidden_dropout_prob", 0.0)?,
            attention: c.prob("attention_probs_dropout_prob", 0.0)?,
            hidden: c.prob("hidden_dropout_prob", 0.0)?,
            mlp_inner: 0.0,
        },
        use_cache: false,
        softmax_fp32: false,
        qk_norm: false,
        loss: Loss::AsIs,
        tied_embeddings: false,
        head,
        image: Some(image),
    };
    Ok((arch, t))
}
