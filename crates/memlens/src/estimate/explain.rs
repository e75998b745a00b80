//! Why the peak is what it is: the bytes each parameter costs, the moment of
//! the step that makes the peak and its largest parts, and the same model and
//! batch under the other common precision settings, each with the parts that
//! make the difference. This answers "why is bf16 bigger than fp32?" (bf16
//! weights with fp32 master weights keep as many bytes per parameter as fp32
//! weights with autocast, but their optimizer step needs fp32 gradients on
//! top, with every gradient alive).

use super::model::ModelSpec;
use super::{estimate, Dtype, Estimate, Optimizer, OptimizerImpl, Options, Phase};
use crate::error::Result;
use crate::units::format_bytes;
use serde::Serialize;
use std::collections::BTreeMap;

/// Bytes one parameter costs in one part.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerParameter {
    /// The part (`weights`, `gradients`, ...).
    pub what: String,
    /// Bytes per parameter (the part divided by the parameter count).
    pub bytes: f64,
    /// Whether it lives for the whole run (else only during part of a step).
    pub persistent: bool,
}

/// The same model and batch under another setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alternative {
    /// The setting, as command-line flags.
    pub flags: String,
    /// Its peak of allocated memory.
    pub total_bytes: u64,
    /// The moment of its peak.
    pub peak_phase: &'static str,
    /// The parts that differ most between its peak and this one.
    pub why: String,
}

/// The explanation of an estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// Bytes per parameter, part by part.
    pub per_parameter: Vec<PerParameter>,
    /// Sentences: the peak's moment and its largest parts; what each phase holds.
    pub lines: Vec<String>,
    /// Other precision settings and optimizer implementations (training only).
    pub alternatives: Vec<Alternative>,
}

fn phase_label(name: &str) -> &'static str {
    match name {
        "backward_start" => "the start of backward",
        "optimizer_step" => "the optimizer step",
        _ => "the forward pass",
    }
}

/// Explains `est`, the estimate of `spec` under `opts`.
pub fn explain(spec: &ModelSpec, opts: &Options, est: &Estimate) -> Result<Explanation> {
    let n = est.parameters.max(1) as f64;
    let per = |key: &str| est.part(key).map_or(0.0, |p| p.bytes as f64 / n);
    let mut per_parameter = vec![PerParameter {
        what: format!("weights ({})", est.settings.dtype.name()),
        bytes: per("parameters"),
        persistent: true,
    }];
    if !opts.inference {
        per_parameter.push(PerParameter {
            what: "gradients".into(),
            bytes: per("gradients"),
            persistent: true,
        });
        per_parameter.push(PerParameter {
            what: est
                .part("optimizer_state")
                .map_or_else(String::new, |p| p.name.clone()),
            bytes: per("optimizer_state"),
            persistent: true,
        });
        per_parameter.push(PerParameter {
            what: format!(
                "optimizer step temporaries ({} implementation)",
                opts.optimizer_impl.name()
            ),
            bytes: per("optimizer_step_temporaries"),
            persistent: false,
        });
    }
    if est.part("amp_weight_copies").is_some() {
        per_parameter.push(PerParameter {
            what: "autocast bf16 weight copies (forward to backward)".into(),
            bytes: per("amp_weight_copies"),
            persistent: false,
        });
    }
    let kept: f64 = per_parameter
        .iter()
        .filter(|p| p.persistent)
        .map(|p| p.bytes)
        .sum();

    let mut lines = Vec::new();
    if let Some(peak) = est.peak() {
        lines.push(format!(
            "the peak, {}, is at {}; its largest parts: {}",
            format_bytes(peak.bytes),
            phase_label(peak.name),
            largest_parts(est, peak, 3)
        ));
    }
    if !opts.inference {
        lines.push(format!(
            "every parameter costs {kept:.1} B for the whole run ({}); the optimizer step adds {:.1} B{}",
            per_parameter
                .iter()
                .filter(|p| p.persistent)
                .map(|p| format!("{} {:.1}", p.what, p.bytes))
                .collect::<Vec<_>>()
                .join(" + "),
            per("optimizer_step_temporaries"),
            if est.part("amp_weight_copies").is_some() {
                format!(
                    ", and autocast's weight copies {:.1} B from forward to backward",
                    per("amp_weight_copies")
                )
            } else {
                String::new()
            }
        ));
        if let Some(t) = est
            .part("optimizer_step_temporaries")
            .filter(|t| !t.terms.is_empty())
        {
            lines.push(format!(
                "the optimizer step's temporaries: {}",
                t.terms
                    .iter()
                    .map(|t| format!("{} {} ({})", t.name, format_bytes(t.bytes), t.formula))
                    .collect::<Vec<_>>()
                    .join(" + ")
            ));
        }
        lines.push(
            "at the start of backward the activations are alive but no gradient yet; at the optimizer step every gradient and the step's temporaries are alive but no activation: the peak is the larger".into(),
        );
    }

    let mut alternatives = Vec::new();
    if !opts.inference {
        for (flags, o) in alternative_options(opts) {
            let alt = estimate(spec, None, &o)?;
            alternatives.push(Alternative {
                why: difference(est, &alt),
                flags,
                total_bytes: alt.total_bytes,
                peak_phase: alt.peak_phase,
            });
        }
    }
    Ok(Explanation {
        per_parameter,
        lines,
        alternatives,
    })
}

/// The `k` largest parts alive in `phase`, with their sizes.
fn largest_parts(est: &Estimate, phase: &Phase, k: usize) -> String {
    let mut parts: Vec<(&String, &u64)> = phase.parts.iter().collect();
    parts.sort_by(|a, b| b.1.cmp(a.1));
    parts
        .iter()
        .take(k)
        .map(|(key, bytes)| {
            let name = est.part(key).map_or(key.as_str(), |p| p.name.as_str());
            format!("{name} {}", format_bytes(**bytes))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The common precision settings other than the one estimated, and the
/// fused optimizer when the foreach one is assumed.
fn alternative_options(opts: &Options) -> Vec<(String, Options)> {
    let with = |dtype: Dtype, amp: bool| Options {
        dtype,
        amp,
        ..opts.clone()
    };
    let mut out = Vec::new();
    let current = (opts.dtype, opts.amp);
    for (flags, dtype, amp) in [
        (
            "--dtype fp32 --amp (fp32 weights, bf16 autocast)",
            Dtype::Fp32,
            true,
        ),
        (
            "--dtype bf16 --amp (bf16 weights, fp32 master weights)",
            Dtype::Bf16,
            true,
        ),
        ("--dtype bf16 (pure bf16)", Dtype::Bf16, false),
    ] {
        if (dtype, amp) != current && !(current.0 == Dtype::Fp16 && dtype == Dtype::Bf16) {
            out.push((flags.to_string(), with(dtype, amp)));
        }
    }
    if matches!(opts.optimizer, Optimizer::Adam | Optimizer::Adamw)
        && opts.optimizer_impl == OptimizerImpl::Foreach
    {
        out.push((
            "--optimizer-impl fused (this setting, fused AdamW)".into(),
            Options {
                optimizer_impl: OptimizerImpl::Fused,
                ..opts.clone()
            },
        ));
    }
    out
}

/// Where `alt` peaks, and what differs most between the two at the moment
/// `est` peaks, part by part.
fn difference(est: &Estimate, alt: &Estimate) -> String {
    let empty = BTreeMap::new();
    fn phase<'a>(e: &'a Estimate, name: &str) -> Option<&'a Phase> {
        e.phases.iter().find(|p| p.name == name)
    }
    let at = est.peak_phase;
    let here = phase(est, at).map_or(&empty, |p| &p.parts);
    let there = phase(alt, at).map_or(&empty, |p| &p.parts);
    let mut keys: Vec<&String> = here.keys().chain(there.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut diffs: Vec<(&String, u64, u64)> = keys
        .into_iter()
        .map(|k| {
            (
                k,
                there.get(k).copied().unwrap_or(0),
                here.get(k).copied().unwrap_or(0),
            )
        })
        .filter(|(_, a, b)| a != b)
        .collect();
    diffs.sort_by_key(|(_, a, b)| std::cmp::Reverse(a.abs_diff(*b)));
    let name = |k: &str| {
        alt.part(k)
            .or_else(|| est.part(k))
            .map_or(k.to_string(), |p| p.name.clone())
    };
    let bytes_at = |e: &Estimate| phase(e, at).map_or(0, |p| p.bytes);
    let mut why = format!("peak at {}", phase_label(alt.peak_phase));
    why.push_str(&format!(
        "; at {}: {} (here {})",
        phase_label(est.peak_phase),
        format_bytes(bytes_at(alt)),
        format_bytes(bytes_at(est))
    ));
    for (i, (k, a, b)) in diffs.iter().take(3).enumerate() {
        why.push_str(&format!(
            "{} {} {} (here {})",
            if i == 0 { ":" } else { "," },
            name(k),
            format_bytes(*a),
            format_bytes(*b)
        ));
    }
    why
}
