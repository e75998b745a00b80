//! Putting the parts together: activations per stack, logits and loss, the
//! phases of a step, the peak, and whether (and at which batch) it fits.

use super::activations::{self as act, Ctx};
use super::load::Checkpoint;
use super::model::{Architecture, Head, Loss, ModelSpec, Stack};
use super::states::{self, StateCtx};
use super::{
    sat_prod, sat_sum, Checkpointing, Estimate, LayerActivations, ModelSummary, Options, Part,
    Phase, Settings, Term, CUDA_CONTEXT_BYTES,
};
use crate::error::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;

/// Sequence length taken when none is given and the model has no better
/// default: the position limit is capped at this.
const DEFAULT_SEQ_CAP: u64 = 2048;

/// Estimates the memory of one step of `spec` under `opts`. `checkpoint` is the
/// `.safetensors` summary [`super::load_model`] returned, if any, reported
/// alongside.
pub fn estimate(
    spec: &ModelSpec,
    checkpoint: Option<&Checkpoint>,
    opts: &Options,
) -> Result<Estimate> {
    validate(opts)?;
    let mut notes: Vec<String> = spec.notes.clone();
    let (seq, seq_from) = resolve_seq(spec, opts, &mut notes)?;
    let p = opts.dtype.bytes();
    let e = if opts.amp { 2 } else { p };
    let training = !opts.inference;
    let sc = StateCtx {
        n: spec.parameters(),
        p,
        master: opts.amp && p == 2 && training,
        zero: if training { opts.zero } else { 0 },
        gpus: opts.gpus,
    };
    let dropout = has_dropout(spec, opts);
    let settings = Settings {
        batch: opts.batch,
        seq,
        seq_from,
        dtype: opts.dtype,
        amp: opts.amp,
        optimizer: opts.optimizer,
        optimizer_impl: opts.optimizer_impl,
        checkpointing: opts.checkpointing,
        flash_attention: opts.flash_attention,
        dropout,
        keep_outputs: opts.keep_outputs,
        zero: sc.zero,
        gpus: opts.gpus,
        inference: opts.inference,
        weight_bytes: p,
        activation_bytes: e,
        residual_bytes: p,
    };
    let ctx = Ctx {
        b: opts.batch,
        s: seq,
        s_kv: seq,
        e,
        r: p,
        amp: opts.amp,
        flash: opts.flash_attention,
        dropout,
        selective: opts.checkpointing == Checkpointing::Selective,
        training_cache: false,
    };
    let (parts, layers) = step_parts(spec, opts, &sc, &ctx, &mut notes);
    let phases = phases(&parts, training);
    let peak = phases
        .iter()
        .max_by_key(|p| p.bytes)
        .map(|p| (p.name, p.bytes))
        .unwrap_or(("none", 0));
    add_notes(&mut notes, spec, opts, dropout, &settings);
    let bytes_of = |key: &str| parts.iter().find(|p| p.key == key).map_or(0, |p| p.bytes);
    let activations_bytes = sat_sum(
        [
            "activations",
            "logits_and_loss",
            "amp_weight_copies",
            "working_set",
            "logits",
        ]
        .iter()
        .map(|k| bytes_of(k)),
    );
    let temporary_bytes = sat_sum(
        parts
            .iter()
            .filter(|p| p.category == "temporary")
            .map(|p| p.bytes),
    );
    Ok(Estimate {
        model: model_summary(spec, checkpoint),
        settings,
        parameters: sc.n,
        parameters_bytes: bytes_of("parameters"),
        gradients_bytes: bytes_of("gradients"),
        optimizer_bytes: bytes_of("optimizer_state"),
        activations_bytes,
        kv_cache_bytes: bytes_of("kv_cache"),
        temporary_bytes,
        total_bytes: peak.1,
        peak_allocated_bytes: peak.1,
        cuda_context_bytes: CUDA_CONTEXT_BYTES,
        device_bytes: peak.1.saturating_add(CUDA_CONTEXT_BYTES),
        activations_estimated: spec.arch.is_some(),
        peak_phase: peak.0,
        phases,
        parts,
        layers,
        notes,
    })
}

/// Whether dropout masks are kept: training, not turned off, and some
/// dropout probability of the architecture above zero.
fn has_dropout(spec: &ModelSpec, opts: &Options) -> bool {
    !opts.inference
        && !opts.no_dropout
        && spec.arch.as_ref().is_some_and(|a| {
            let d = a.dropout;
            d.embedding > 0.0 || d.attention > 0.0 || d.hidden > 0.0 || d.mlp_inner > 0.0
        })
}

/// Every part of one step, in the order the estimate lists them (states,
/// activations or the inference working set, inputs, workspaces, step
/// temporaries, communication buffers, the CUDA context), and the
/// activations layer by layer (training only).
fn step_parts(
    spec: &ModelSpec,
    opts: &Options,
    sc: &StateCtx,
    ctx: &Ctx,
    notes: &mut Vec<String>,
) -> (Vec<Part>, Vec<LayerActivations>) {
    let training = !opts.inference;
    let mut parts: Vec<Part> = vec![states::parameters(sc)];
    let mut layers = Vec::new();
    if training {
        parts.push(states::gradients(sc));
        parts.push(states::optimizer(sc, opts.optimizer, spec));
    }
    if opts.amp && sc.p == 4 {
        parts.push(states::amp_weight_copies(spec));
    }
    if let Some(arch) = &spec.arch {
        if training {
            let (a, l) = training_activations(arch, ctx, opts);
            parts.push(a);
            layers = l;
            parts.extend(loss_parts(arch, ctx, opts.keep_outputs));
        } else {
            parts.extend(inference_parts(arch, ctx, notes));
        }
        parts.push(inputs_part(arch, ctx));
    } else {
        notes.push(
            "activations, logits and KV cache are not estimated: the architecture is unknown"
                .into(),
        );
    }
    parts.push(states::workspaces(if training { 2 } else { 1 }));
    if training {
        parts.push(states::step_temporaries(
            sc,
            opts.optimizer,
            opts.optimizer_impl,
            spec,
        ));
        if let Some(c) = states::comm_buffers(sc, spec) {
            parts.push(c);
        }
    }
    parts.push(cuda_context_part());
    (parts, layers)
}

/// The CUDA context: outside PyTorch's allocator, a fixed allowance.
fn cuda_context_part() -> Part {
    Part {
        key: "cuda_context",
        name: "CUDA context".into(),
        category: "cuda_context",
        bytes: CUDA_CONTEXT_BYTES,
        formula: "512 MiB, outside PyTorch's allocator (300-600 MiB typical; CUDA version, GPU)"
            .into(),
        inputs: BTreeMap::new(),
        terms: vec![],
    }
}

/// What the estimate says of the model it was given.
fn model_summary(spec: &ModelSpec, checkpoint: Option<&Checkpoint>) -> ModelSummary {
    ModelSummary {
        family: spec.family,
        model_type: spec.model_type.clone(),
        class: spec.architecture_class.clone(),
        source: spec.source.display().to_string(),
        parameters_from: spec.tensors_from,
        architecture: spec.arch.clone(),
        checkpoint: checkpoint.cloned(),
    }
}

fn validate(o: &Options) -> Result<()> {
    let bad = |m: &str| Err(Error::usage(m.to_string()));
    if o.batch == 0 {
        return bad("--batch must be at least 1");
    }
    if o.seq == Some(0) {
        return bad("--seq must be at least 1");
    }
    if o.gpus == 0 {
        return bad("--gpus must be at least 1");
    }
    if o.zero > 3 {
        return bad("--zero must be 0, 1, 2 or 3");
    }
    Ok(())
}

fn resolve_seq(spec: &ModelSpec, o: &Options, notes: &mut Vec<String>) -> Result<(u64, String)> {
    let Some(arch) = &spec.arch else {
        return Ok((o.seq.unwrap_or(0), "given".into()));
    };
    if let Some(img) = arch.image {
        let tokens = img.tokens();
        if o.seq.is_some_and(|s| s != tokens) {
            notes.push(format!(
                "--seq ignored: a {0}x{0} image in {1}x{1} patches is {tokens} tokens",
                img.size, img.patch
            ));
        }
        return Ok((tokens, "image patches + class token".into()));
    }
    if let Some(s) = o.seq {
        if let (true, Some(max)) = (arch.learned_positions, arch.max_positions) {
            if s > max {
                return Err(Error::usage(format!(
                    "--seq {s} is longer than the {max} positions {} learned: it cannot run",
                    spec.model_type
                )));
            }
        }
        return Ok((s, "given".into()));
    }
    Ok(match arch.max_positions {
        Some(m) if m <= DEFAULT_SEQ_CAP => (m, "the model's position limit".into()),
        Some(_) => (
            DEFAULT_SEQ_CAP,
            format!("default (the model's position limit, capped at {DEFAULT_SEQ_CAP})"),
        ),
        None => (512, "default".into()),
    })
}

fn inputs_map(arch: &Architecture, c: &Ctx) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = [
        ("b", c.b),
        ("s", c.s),
        ("h", arch.hidden),
        ("a", arch.heads),
        ("q", arch.q_dim()),
        ("kv", arch.kv_dim()),
        ("f", arch.ffn),
        ("e", c.e),
        ("r", c.r),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect();
    if arch.vocab > 0 {
        m.insert("v".into(), arch.vocab);
    }
    m
}

/// The stacks of layers: (kind, count, has cross-attention).
fn stacks(arch: &Architecture) -> Vec<(&'static str, u64, bool)> {
    match arch.stack {
        Stack::DecoderOnly => vec![("decoder", arch.layers, false)],
        Stack::EncoderOnly => vec![("encoder", arch.layers, false)],
        Stack::EncoderDecoder => vec![
            ("encoder", arch.layers, false),
            ("decoder (with cross-attention)", arch.decoder_layers, true),
        ],
    }
}

fn training_activations(
    arch: &Architecture,
    c: &Ctx,
    opts: &Options,
) -> (Part, Vec<LayerActivations>) {
    let (b, s, h, r) = (c.b, c.s, arch.hidden, c.r);
    let full = opts.checkpointing == Checkpointing::Full;
    // HF turns use_cache off under gradient checkpointing.
    let cache = arch.stack == Stack::DecoderOnly && arch.use_cache && !full;
    let lc = Ctx {
        training_cache: cache,
        ..*c
    };
    let mut layers = Vec::new();
    let mut terms = Vec::new();
    let mut largest_layer = 0u64;
    let mut total_layers = 0u64;
    for (kind, count, cross) in stacks(arch) {
        let mut t = act::self_attention(arch, &lc);
        if cross {
            t.extend(act::cross_attention(arch, &lc));
        }
        t.extend(act::mlp(arch, &lc));
        let per = sat_sum(t.iter().map(|t| t.bytes));
        largest_layer = largest_layer.max(per);
        total_layers = total_layers.saturating_add(count);
        if !full {
            terms.push(Term {
                name: format!("{count} {kind} layers (below)"),
                formula: format!("L·(one layer), L = {count}"),
                bytes: sat_prod(&[count, per]),
            });
        }
        layers.push(LayerActivations {
            kind: kind.to_string(),
            count,
            seq: s,
            bytes_per_layer: per,
            terms: t,
        });
    }
    if full {
        terms.push(Term {
            name: format!("{total_layers} layer inputs kept at the checkpoints"),
            formula: "L·b·s·h·r".into(),
            bytes: sat_prod(&[total_layers, b, s, h, r]),
        });
        terms.push(Term {
            name: "one layer recomputed in backward (the largest)".into(),
            formula: "max per-layer terms".into(),
            bytes: largest_layer,
        });
    }
    terms.extend(model_level_terms(arch, c));
    let bytes = sat_sum(terms.iter().map(|t| t.bytes));
    let mut inputs = inputs_map(arch, c);
    inputs.insert("L".into(), total_layers);
    let formula = if full {
        "L·b·s·h·r + one layer + embedding/head terms".to_string()
    } else {
        "Σ layers L·(per-layer terms) + embedding/head terms".to_string()
    };
    (
        Part {
            key: "activations",
            name: "activations saved for backward".into(),
            category: "activation",
            bytes,
            formula,
            inputs,
            terms,
        },
        layers,
    )
}

/// Saved tensors outside the layers: embeddings, final norms, the head's input.
fn model_level_terms(arch: &Architecture, c: &Ctx) -> Vec<Term> {
    let (b, s, h, e, r) = (c.b, c.s, arch.hidden, c.e, c.r);
    let t = |name: &str, formula: &str, bytes: u64| Term {
        name: name.into(),
        formula: formula.into(),
        bytes,
    };
    let mut out = Vec::new();
    let stacks_with_embeddings = if arch.stack == Stack::EncoderDecoder {
        2
    } else {
        1
    };
    if c.dropout && arch.dropout.embedding > 0.0 {
        out.push(t(
            "embedding dropout mask",
            "b·s·h per embedded stack",
            sat_prod(&[stacks_with_embeddings, b, s, h]),
        ));
    }
    match arch.stack {
        Stack::EncoderOnly if arch.image.is_none() => {
            // BERT: post-LN, the embedding sum goes through a LayerNorm.
            out.push(t(
                "embedding LayerNorm input",
                "b·s·h·r",
                sat_prod(&[b, s, h, r]),
            ));
        }
        _ => {
            let mut n = act::norm_term(arch, c, "final");
            n.bytes = n.bytes.saturating_mul(stacks_with_embeddings);
            out.push(n);
        }
    }
    if let Some(img) = arch.image {
        if c.amp {
            out.push(t(
                "pixel values cast for the patch convolution",
                "b·c·H·W·e",
                sat_prod(&[b, img.channels, img.size, img.size, e]),
            ));
        }
    }
    if arch.stack == Stack::EncoderDecoder {
        // Under autocast each cross-attention casts it, counted in the layers.
        if !(c.amp && c.r == 4) {
            out.push(t(
                "encoder output (read by every cross-attention)",
                "b·s·h·r",
                sat_prod(&[b, s, h, r]),
            ));
        }
        out.push(t(
            "relative position bias + mask, fp32 (encoder self, decoder self, cross)",
            "3·b·a·s·s·4",
            sat_prod(&[3, b, arch.heads, s, s, 4]),
        ));
    }
    match arch.head {
        Head::Lm => out.push(t("LM head input", "b·s·h·e", sat_prod(&[b, s, h, e]))),
        Head::MaskedLm => {
            let ln = if c.amp { 4 } else { e };
            out.push(t(
                "MLM head: dense input, GELU input, LayerNorm input, decoder input",
                "b·s·h·(3·e + e_ln)",
                sat_prod(&[b, s, h, 3 * e + ln]),
            ));
        }
        Head::Classifier { .. } => out.push(t(
            "classifier input (one token)",
            "b·h·e",
            sat_prod(&[b, h, e]),
        )),
        Head::None => {}
    }
    out
}

/// Logits and cross entropy. The logits themselves are not kept: the head's
/// matmul keeps its input, and they are freed once the model's output is
/// dropped (as the Trainer and `loss = model(**batch).loss` do). What the
/// loss keeps depends on how the class computes it ([`Loss`]):
///
/// * `logits.float()` then cross entropy (causal LMs): the fp32 log-softmax
///   output is kept; backward makes the fp32 gradients of `nll_loss` and
///   `log_softmax`, alive together with it: the usual peak of a step;
/// * `CrossEntropyLoss` on the logits as they are (masked LMs): the
///   log-softmax runs in the logits' dtype (`cross_entropy` passes it
///   explicitly, which autocast respects) and is kept; under autocast
///   `nll_loss`, an fp32 autocast op, keeps an fp32 copy of it too, and its
///   fp32 gradient is the largest tensor of backward.
fn loss_parts(arch: &Architecture, c: &Ctx, keep_outputs: bool) -> Vec<Part> {
    let (rows, width, what) = match arch.head {
        Head::Lm | Head::MaskedLm => (sat_prod(&[c.b, c.s]), arch.vocab, "b·s·v"),
        Head::Classifier { labels } => (c.b, labels, "b·n_labels"),
        Head::None => return vec![],
    };
    let n = sat_prod(&[rows, width]);
    let mut inputs: BTreeMap<String, u64> = [("b", c.b), ("e", c.e)]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    match arch.head {
        Head::Classifier { labels } => {
            inputs.insert("n_labels".into(), labels);
        }
        _ => {
            inputs.insert("s".into(), c.s);
            inputs.insert("v".into(), arch.vocab);
        }
    }
    let term = |name: &str, k: &str, bytes: u64| Term {
        name: name.into(),
        formula: format!("{what}·{k}"),
        bytes: sat_prod(&[n, bytes]),
    };
    let (mut saved, grads) = match arch.loss {
        Loss::Upcast => (
            vec![term(
                "log-softmax output, fp32 (logits.float() first)",
                "4",
                4,
            )],
            vec![
                term("nll_loss gradient, fp32", "4", 4),
                term("log_softmax gradient, fp32", "4", 4),
            ],
        ),
        Loss::AsIs if c.amp => (
            vec![
                term("log-softmax output, in the logits' dtype", "e", c.e),
                term("its fp32 copy kept by nll_loss (autocast)", "4", 4),
            ],
            vec![term("nll_loss gradient, fp32", "4", 4)],
        ),
        Loss::AsIs => (
            vec![term("log-softmax output, in the logits' dtype", "e", c.e)],
            vec![
                term("nll_loss gradient", "e", c.e),
                term("log_softmax gradient", "e", c.e),
            ],
        ),
    };
    if keep_outputs {
        saved.insert(
            0,
            term("logits (the model output, held by the caller)", "e", c.e),
        );
    }
    let formula = |t: &[Term]| {
        t.iter()
            .map(|t| t.formula.clone())
            .collect::<Vec<_>>()
            .join(" + ")
    };
    vec![
        Part {
            key: "logits_and_loss",
            name: "loss (what cross entropy keeps)".into(),
            category: "activation",
            bytes: sat_sum(saved.iter().map(|t| t.bytes)),
            formula: formula(&saved),
            inputs: inputs.clone(),
            terms: saved,
        },
        Part {
            key: "loss_gradients",
            name: "loss gradients (start of backward)".into(),
            category: "temporary",
            bytes: sat_sum(grads.iter().map(|t| t.bytes)),
            formula: formula(&grads),
            inputs,
            terms: grads,
        },
    ]
}

fn inference_parts(arch: &Architecture, c: &Ctx, notes: &mut Vec<String>) -> Vec<Part> {
    let (b, s, e) = (c.b, c.s, c.e);
    let mut parts = Vec::new();
    let kv = arch.kv_dim();
    let (cache_layers, cache_tokens, formula) = match arch.stack {
        Stack::DecoderOnly => (arch.layers, s, "2·L·b·s·kv·e"),
        Stack::EncoderDecoder => (arch.decoder_layers, 2 * s, "2·L·b·(s + s_enc)·kv·e"),
        Stack::EncoderOnly => (0, 0, ""),
    };
    let mut inputs = inputs_map(arch, c);
    inputs.insert("L".into(), cache_layers);
    if cache_layers > 0 {
        parts.push(Part {
            key: "kv_cache",
            name: "KV cache".into(),
            category: "activation",
            bytes: sat_prod(&[2, cache_layers, b, cache_tokens, kv, e]),
            formula: formula.into(),
            inputs: inputs.clone(),
            terms: vec![],
        });
        notes.push(
            "KV cache for s tokens in all (prompt + generated); growing a DynamicCache by torch.cat briefly holds one layer's cache twice".into(),
        );
    } else {
        notes.push("encoder-only model: no KV cache".into());
    }
    // Every stack runs at the same length here, so one layer stands for all.
    let largest = act::inference_working_set(arch, c);
    parts.push(Part {
        key: "working_set",
        name: "activations (one layer at a time)".into(),
        category: "activation",
        bytes: sat_sum(largest.iter().map(|t| t.bytes)),
        formula: "residual + max(attention, MLP) working set".into(),
        inputs: inputs_map(arch, c),
        terms: largest,
    });
    let logits = match arch.head {
        Head::Lm => Some((
            sat_prod(&[b, arch.vocab, e + 4]),
            "b·v·(e + 4)",
            "logits of the last position and their fp32 copy (generate)",
        )),
        Head::MaskedLm => Some((
            sat_prod(&[b, s, arch.vocab, e]),
            "b·s·v·e",
            "logits at every position",
        )),
        Head::Classifier { labels } => Some((sat_prod(&[b, labels, e]), "b·n_labels·e", "logits")),
        Head::None => None,
    };
    if let Some((bytes, formula, name)) = logits {
        parts.push(Part {
            key: "logits",
            name: name.into(),
            category: "activation",
            bytes,
            formula: formula.into(),
            inputs: inputs_map(arch, c),
            terms: vec![],
        });
    }
    parts
}

fn inputs_part(arch: &Architecture, c: &Ctx) -> Part {
    let (bytes, formula, k) = if let Some(img) = arch.image {
        (
            sat_prod(&[c.b, img.channels, img.size, img.size, 4])
                .saturating_add(c.b.saturating_mul(8)),
            "b·c·H·W·4 + b·8 (pixel values, labels)".to_string(),
            0,
        )
    } else {
        // input_ids, labels (+ decoder inputs for T5, token types and mask for BERT).
        let k = match arch.stack {
            Stack::DecoderOnly => 2,
            Stack::EncoderDecoder => 3,
            Stack::EncoderOnly => 4,
        };
        (
            sat_prod(&[k, c.b, c.s, 8]),
            "k·b·s·8 (int64 token tensors)".to_string(),
            k,
        )
    };
    let mut inputs: BTreeMap<String, u64> = [("b", c.b), ("s", c.s)]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    if k > 0 {
        inputs.insert("k".into(), k);
    }
    Part {
        key: "inputs",
        name: "input batch".into(),
        category: "input",
        bytes,
        formula,
        inputs,
        terms: vec![],
    }
}

/// Which parts are alive at each moment.
fn phases(parts: &[Part], training: bool) -> Vec<Phase> {
    let make = |name: &'static str, description: &str, keys: &[&str]| {
        let alive: BTreeMap<String, u64> = parts
            .iter()
            .filter(|p| keys.contains(&p.key))
            .map(|p| (p.key.to_string(), p.bytes))
            .collect();
        Phase {
            name,
            description: description.into(),
            bytes: sat_sum(alive.values().copied()),
            parts: alive,
        }
    };
    if !training {
        return vec![make(
            "inference",
            "a forward pass: weights, KV cache, one layer's working set, logits",
            &[
                "parameters",
                "amp_weight_copies",
                "kv_cache",
                "working_set",
                "logits",
                "inputs",
                "workspaces",
            ],
        )];
    }
    vec![
        make(
            "backward_start",
            "loss.backward() begins (step 2 on): weights, optimizer state, every saved activation, the loss gradients; no parameter gradients yet (zero_grad(set_to_none=True))",
            &[
                "parameters",
                "optimizer_state",
                "amp_weight_copies",
                "activations",
                "logits_and_loss",
                "loss_gradients",
                "inputs",
                "workspaces",
                "communication_buffers",
            ],
        ),
        make(
            "optimizer_step",
            "optimizer.step(): weights, all gradients, optimizer state and the step's temporaries; activations freed",
            &[
                "parameters",
                "gradients",
                "optimizer_state",
                "optimizer_step_temporaries",
                "inputs",
                "workspaces",
                "communication_buffers",
            ],
        ),
    ]
}

fn add_notes(notes: &mut Vec<String>, spec: &ModelSpec, o: &Options, dropout: bool, s: &Settings) {
    let Some(arch) = &spec.arch else { return };
    if !o.flash_attention && (o.checkpointing != Checkpointing::Selective || o.inference) {
        notes.push("attention scores counted as materialised (eager attention); HF's default SDPA usually runs fused kernels: pass --flash-attention to model that".into());
    }
    if !o.inference && !dropout && !o.no_dropout {
        notes.push("the config sets no dropout: no dropout masks counted".into());
    }
    if matches!(spec.family, super::Family::T5) {
        notes.push("T5's eager attention keeps some fp32 intermediates not modelled term by term: treat its activations as approximate".into());
    }
    if !o.inference && matches!(arch.head, Head::Lm | Head::MaskedLm) {
        let logits = sat_prod(&[s.batch, s.seq, arch.vocab, s.activation_bytes]);
        notes.push(if o.keep_outputs {
            format!("the model output is held through backward (--keep-outputs): the logits ({}) stay alive", crate::units::format_bytes(logits))
        } else {
            format!("the logits ({}) are freed with the model output after the forward, as the Trainer and `loss = model(**batch).loss` do; a loop that holds `out = model(...)` through backward keeps them: pass --keep-outputs", crate::units::format_bytes(logits))
        });
    }
    if !o.inference && arch.head == Head::None {
        notes.push("bare model without a head: the loss and what it keeps are not counted".into());
    }
    if !o.inference {
        notes.push(
            "the first step peaks lower: optimizer state does not exist during its backward".into(),
        );
    }
    if s.amp && s.weight_bytes == 2 && !o.inference {
        notes.push("--amp with 16-bit weights: the DeepSpeed/Megatron scheme, fp32 master weights in the optimizer".into());
    }
    notes.push("the caching allocator reserves more than it allocates (often 5-15% more): see `memlens simulate` on a snapshot".into());
}

/// Whether an estimate fits a device, and the largest batch that does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fit {
    /// Memory of one GPU.
    pub device_memory_bytes: u64,
    /// Whether the peak plus the CUDA context fits at the batch given.
    pub fits: bool,
    /// Device memory left over at the batch given (negative when it does not fit).
    pub headroom_bytes: i64,
    /// Largest micro-batch that fits; `None` when not even batch 1 does.
    pub max_batch: Option<u64>,
}

/// Largest batch searched.
const MAX_BATCH_SEARCH: u64 = 1 << 24;

/// Checks `opts` against `device_memory` bytes and searches the largest batch
/// whose peak plus CUDA context fits.
pub fn fit(spec: &ModelSpec, opts: &Options, est: &Estimate, device_memory: u64) -> Result<Fit> {
    let need = |batch: u64| -> Result<u64> {
        let o = Options {
            batch,
            ..opts.clone()
        };
        Ok(estimate(spec, None, &o)?.device_bytes)
    };
    let fits_at = |b: u64| -> Result<bool> { Ok(need(b)? <= device_memory) };
    let max_batch = if !fits_at(1)? {
        None
    } else {
        // Invariant: lo fits; hi does not (or is past the search range).
        let mut lo = 1u64;
        let mut hi = 2u64;
        while hi <= MAX_BATCH_SEARCH && fits_at(hi)? {
            lo = hi;
            hi *= 2;
        }
        if hi > MAX_BATCH_SEARCH {
            Some(lo)
        } else {
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if fits_at(mid)? {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            Some(lo)
        }
    };
    let headroom = i128::from(device_memory) - i128::from(est.device_bytes);
    Ok(Fit {
        device_memory_bytes: device_memory,
        fits: est.device_bytes <= device_memory,
        headroom_bytes: headroom.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
        max_batch,
    })
}
