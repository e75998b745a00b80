//! Weights, gradients and optimizer state, and how ZeRO divides them.
//!
//! Per parameter, with `p` bytes per weight: weights `p`, gradients `p`
//! (PyTorch keeps gradients in the parameter's dtype), optimizer state in the
//! state dtype `s` (the parameter's dtype; fp32 when fp32 master weights are
//! kept). ZeRO (Rajbhandari et al. 2020; DeepSpeed's documentation) divides
//! across `gpus`: stage 1 the optimizer state, stage 2 also the gradients,
//! stage 3 also the weights.

use super::model::ModelSpec;
use super::{sat_prod, sat_sum, Optimizer, OptimizerImpl, Part, Term, CUBLAS_WORKSPACE_BYTES};
use super::{ZERO3_PREFETCH_BUCKET, ZERO_REDUCE_BUCKET};
use std::collections::BTreeMap;

/// Element sizes and sharding the state parts depend on.
#[derive(Debug, Clone, Copy)]
pub(super) struct StateCtx {
    /// Parameter count.
    pub n: u64,
    /// Bytes per weight.
    pub p: u64,
    /// fp32 master weights kept by the optimizer (16-bit weights with `--amp`).
    pub master: bool,
    /// ZeRO stage.
    pub zero: u8,
    /// GPUs.
    pub gpus: u64,
}

impl StateCtx {
    /// Bytes per optimizer-state element.
    fn s(&self) -> u64 {
        if self.master {
            4
        } else {
            self.p
        }
    }
    fn shard(&self, bytes: u64, from_stage: u8) -> u64 {
        if self.zero >= from_stage {
            bytes.div_ceil(self.gpus.max(1))
        } else {
            bytes
        }
    }
    fn shard_formula(&self, f: &str, from_stage: u8) -> String {
        if self.zero >= from_stage && self.gpus > 1 {
            format!("({f}) / gpus")
        } else {
            f.to_string()
        }
    }
    /// Each term's share on one GPU, from ZeRO stage `from_stage` on.
    fn shard_terms(&self, terms: Vec<Term>, from_stage: u8) -> Vec<Term> {
        terms
            .into_iter()
            .map(|t| Term {
                bytes: self.shard(t.bytes, from_stage),
                formula: self.shard_formula(&t.formula, from_stage),
                ..t
            })
            .collect()
    }
    fn inputs(&self, extra: &[(&str, u64)]) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = [("N", self.n), ("p", self.p)]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        if self.zero > 0 {
            m.insert("gpus".into(), self.gpus);
        }
        m
    }
}

fn part(
    key: &'static str,
    name: &str,
    category: &'static str,
    bytes: u64,
    formula: String,
    inputs: BTreeMap<String, u64>,
    terms: Vec<Term>,
) -> Part {
    Part {
        key,
        name: name.to_string(),
        category,
        bytes,
        formula,
        inputs,
        terms,
    }
}

/// The weights.
pub(super) fn parameters(c: &StateCtx) -> Part {
    part(
        "parameters",
        "parameters",
        "parameter",
        c.shard(sat_prod(&[c.n, c.p]), 3),
        c.shard_formula("N·p", 3),
        c.inputs(&[]),
        vec![],
    )
}

/// The gradients, one per weight, in the weight's dtype.
pub(super) fn gradients(c: &StateCtx) -> Part {
    part(
        "gradients",
        "gradients",
        "gradient",
        c.shard(sat_prod(&[c.n, c.p]), 2),
        c.shard_formula("N·p", 2),
        c.inputs(&[]),
        vec![],
    )
}

/// Adafactor's factored second moment: rows + columns of the last two
/// dimensions of each matrix (times its leading dimensions), the full size of
/// each vector.
fn adafactor_elements(spec: &ModelSpec) -> u64 {
    sat_sum(spec.tensors.iter().map(|t| match t.shape.as_slice() {
        [] => 1,
        [n] => *n,
        [lead @ .., r, c] => sat_prod(lead).saturating_mul(r.saturating_add(*c)),
    }))
}

/// The optimizer's state, with the fp32 master weights when kept.
pub(super) fn optimizer(c: &StateCtx, opt: Optimizer, spec: &ModelSpec) -> Part {
    let s = c.s();
    let mut terms = Vec::new();
    let mut extra = vec![("s", s)];
    match opt {
        Optimizer::Adam | Optimizer::Adamw => terms.push(Term {
            name: "exp_avg and exp_avg_sq".into(),
            formula: "2·N·s".into(),
            bytes: sat_prod(&[2, c.n, s]),
        }),
        Optimizer::SgdMomentum => terms.push(Term {
            name: "momentum_buffer".into(),
            formula: "N·s".into(),
            bytes: sat_prod(&[c.n, s]),
        }),
        Optimizer::Adafactor => {
            let f = adafactor_elements(spec);
            extra.push(("F", f));
            terms.push(Term {
                name: "factored second moment (rows + columns of each matrix)".into(),
                formula: "F·s".into(),
                bytes: sat_prod(&[f, s]),
            });
        }
        Optimizer::Sgd => {}
    }
    if c.master {
        terms.push(Term {
            name: "fp32 master weights".into(),
            formula: "N·4".into(),
            bytes: sat_prod(&[c.n, 4]),
        });
    }
    optimizer_part(
        c,
        (
            "optimizer_state",
            &format!("optimizer state ({})", opt.name()),
            "optimizer_state",
        ),
        terms,
        "0 (plain SGD keeps no state)",
        &extra,
    )
}

/// A part made of optimizer terms, sharded from ZeRO stage 1 on: the sum of
/// the terms, their formulas joined, or `if_none` when there are none.
/// `what` is the part's (key, name, category).
fn optimizer_part(
    c: &StateCtx,
    what: (&'static str, &str, &'static str),
    terms: Vec<Term>,
    if_none: &str,
    extra: &[(&str, u64)],
) -> Part {
    let formula = if terms.is_empty() {
        if_none.to_string()
    } else {
        let joined: Vec<&str> = terms.iter().map(|t| t.formula.as_str()).collect();
        c.shard_formula(&joined.join(" + "), 1)
    };
    let terms = c.shard_terms(terms, 1);
    let (key, name, category) = what;
    part(
        key,
        name,
        category,
        sat_sum(terms.iter().map(|t| t.bytes)),
        formula,
        c.inputs(extra),
        terms,
    )
}

/// What `optimizer.step()` allocates on top. Adam/AdamW: the foreach
/// implementation (PyTorch's default on CUDA) builds `sqrt(exp_avg_sq)` for
/// every parameter at once; the for-loop one builds `exp_avg_sq.sqrt()` and
/// its quotient for one tensor at a time (the largest sets the peak); the
/// fused one updates in place. Adafactor: its per-tensor variance estimate.
/// With master weights, the fp32 copy of the gradients the step reads.
pub(super) fn step_temporaries(
    c: &StateCtx,
    opt: Optimizer,
    imp: OptimizerImpl,
    spec: &ModelSpec,
) -> Part {
    let s = c.s();
    let mut terms = Vec::new();
    let mut extra = vec![("s", s)];
    match (opt, imp) {
        (Optimizer::Adam | Optimizer::Adamw, OptimizerImpl::Foreach) => terms.push(Term {
            name: "sqrt(exp_avg_sq) of every parameter (foreach implementation)".into(),
            formula: "N·s".into(),
            bytes: sat_prod(&[c.n, s]),
        }),
        (Optimizer::Adam | Optimizer::Adamw, OptimizerImpl::ForLoop) => {
            let t = spec.largest_tensor();
            extra.push(("T", t));
            terms.push(Term {
                name: "sqrt(exp_avg_sq) and its quotient of the largest tensor (for-loop)".into(),
                formula: "2·T·s".into(),
                bytes: sat_prod(&[2, t, s]),
            });
        }
        (Optimizer::Adafactor, _) => {
            let t = spec.largest_tensor();
            extra.push(("T", t));
            terms.push(Term {
                name: "variance estimate and update of the largest tensor".into(),
                formula: "2·T·s".into(),
                bytes: sat_prod(&[2, t, s]),
            });
        }
        _ => {}
    }
    if c.master {
        terms.push(Term {
            name: "fp32 gradients for the master weights".into(),
            formula: "N·4".into(),
            bytes: sat_prod(&[c.n, 4]),
        });
    }
    optimizer_part(
        c,
        (
            "optimizer_step_temporaries",
            "optimizer step temporaries",
            "temporary",
        ),
        terms,
        "0 (updates in place)",
        &extra,
    )
}

/// Autocast's cache of 16-bit copies of the weights that enter matmuls, kept
/// from their first use in forward until backward has used them.
pub(super) fn amp_weight_copies(spec: &ModelSpec) -> Part {
    let m = spec.matmul_parameters();
    part(
        "amp_weight_copies",
        "autocast bf16 weight copies",
        "activation",
        sat_prod(&[m, 2]),
        "M·2".into(),
        [("M".to_string(), m)].into_iter().collect(),
        vec![],
    )
}

/// cuBLAS workspaces.
pub(super) fn workspaces(count: u64) -> Part {
    part(
        "workspaces",
        "cuBLAS workspaces",
        "temporary",
        sat_prod(&[count, CUBLAS_WORKSPACE_BYTES]),
        "k·32 MiB".into(),
        [("k".to_string(), count)].into_iter().collect(),
        vec![],
    )
}

/// Communication buffers of data parallelism, alive for the whole run.
pub(super) fn comm_buffers(c: &StateCtx, spec: &ModelSpec) -> Option<Part> {
    if c.gpus <= 1 && c.zero == 0 {
        return None;
    }
    let mut terms = Vec::new();
    if c.zero == 0 {
        terms.push(Term {
            name: "DDP gradient buckets (gradient_as_bucket_view=False, the default, keeps a second copy)".into(),
            formula: "N·p".into(),
            bytes: sat_prod(&[c.n, c.p]),
        });
    } else {
        terms.push(Term {
            name: "ZeRO reduce bucket (reduce_bucket_size, default 5e8 elements)".into(),
            formula: "min(N, 5e8)·p".into(),
            bytes: sat_prod(&[c.n.min(ZERO_REDUCE_BUCKET), c.p]),
        });
    }
    if c.zero == 3 {
        let g = c.n.min(
            spec.largest_layer_parameters()
                .saturating_add(ZERO3_PREFETCH_BUCKET),
        );
        terms.push(Term {
            name: "ZeRO-3 gathered weights (largest layer + stage3_prefetch_bucket_size 5e7)"
                .into(),
            formula: "min(N, Lmax + 5e7)·p".into(),
            bytes: sat_prod(&[g, c.p]),
        });
    }
    let formula = terms
        .iter()
        .map(|t| t.formula.as_str())
        .collect::<Vec<_>>()
        .join(" + ");
    Some(part(
        "communication_buffers",
        "data-parallel communication buffers",
        "temporary",
        sat_sum(terms.iter().map(|t| t.bytes)),
        formula,
        c.inputs(&[("Lmax", spec.largest_layer_parameters())]),
        terms,
    ))
}
