//! `memlens estimate` against the ground truth of tests/gpu/estimate_truth.py:
//! real training steps of Hugging Face models (Llama, Mistral, Qwen2, Qwen3,
//! GPT-2, BERT, RoBERTa) built from the configs in tests/estimate/configs, on
//! an H100, in two settings (fp32 weights + bf16 autocast + eager attention;
//! bf16 weights + SDPA), batch and sequence varied, with AdamW in its three
//! implementations. tests/estimate/truth.json holds the measured numbers.

use memlens::estimate::{
    estimate, load_model, Dtype, ModelSpec, Optimizer, OptimizerImpl, Options,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/estimate")
}

fn truth() -> Value {
    let text = std::fs::read_to_string(dir().join("truth.json")).expect("truth.json");
    serde_json::from_str(&text).expect("truth.json parses")
}

fn spec(name: &str) -> ModelSpec {
    load_model(&dir().join(format!("configs/{name}.config.json")))
        .expect("config loads")
        .0
}

/// The options of a truth row.
fn options(row: &Value) -> Options {
    let bf16 = match row["setting"].as_str() {
        Some("amp_eager") => false,
        Some("bf16_sdpa") => true,
        other => panic!("unknown setting {other:?}"),
    };
    Options {
        batch: row["batch"].as_u64().unwrap(),
        seq: row["seq"].as_u64(),
        dtype: if bf16 { Dtype::Bf16 } else { Dtype::Fp32 },
        amp: !bf16,
        optimizer: Optimizer::Adamw,
        optimizer_impl: match row["optimizer_impl"].as_str() {
            Some("fused") => OptimizerImpl::Fused,
            Some("for-loop") => OptimizerImpl::ForLoop,
            _ => OptimizerImpl::Foreach,
        },
        flash_attention: bf16,
        keep_outputs: row["keep_outputs"].as_bool().unwrap_or(false),
        ..Options::default()
    }
}

/// Every parameter tensor memlens derives from the config has the name and
/// size `model.named_parameters()` gives, and the total is `sum(p.numel())`.
#[test]
fn parameter_counts_are_exact_for_every_family() {
    let t = truth();
    let models = t["models"].as_object().unwrap();
    assert!(models.len() >= 10);
    for (name, m) in models {
        let s = spec(name);
        assert_eq!(
            s.parameters(),
            m["parameters"].as_u64().unwrap(),
            "{name}: parameter count"
        );
        let real: BTreeMap<String, u64> = m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let shape = t[1].as_array().unwrap();
                let n = shape.iter().map(|d| d.as_u64().unwrap()).product();
                (t[0].as_str().unwrap().to_string(), n)
            })
            .collect();
        let ours: BTreeMap<String, u64> = s
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.numel))
            .collect();
        let differ: Vec<String> = ours
            .keys()
            .chain(real.keys())
            .filter(|k| ours.get(*k) != real.get(*k))
            .map(|k| format!("{k}: memlens {:?}, torch {:?}", ours.get(k), real.get(k)))
            .collect();
        assert!(differ.is_empty(), "{name}: {}", differ.join("; "));
    }
}

/// One row of the comparison.
struct Row {
    label: String,
    estimated: u64,
    measured: u64,
}

impl Row {
    fn error(&self) -> f64 {
        self.estimated as f64 / self.measured as f64 - 1.0
    }
}

fn rows() -> Vec<Row> {
    let t = truth();
    t["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("error").is_none())
        .map(|r| {
            let name = r["model"].as_str().unwrap();
            let est = estimate(&spec(name), None, &options(r)).expect("estimate");
            Row {
                label: format!(
                    "| {name} | {} | {} | {} | {}{} |",
                    r["setting"].as_str().unwrap(),
                    r["batch"],
                    r["seq"],
                    r["optimizer_impl"].as_str().unwrap(),
                    if r["keep_outputs"].as_bool() == Some(true) {
                        ", outputs kept"
                    } else {
                        ""
                    }
                ),
                estimated: est.peak_allocated_bytes,
                measured: r["peak"].as_u64().unwrap(),
            }
        })
        .collect()
}

/// Every measured step-2 peak is met within +10% / -5% (an estimate that is
/// low says "fits" when the run will OOM, so the lower bound is tighter).
#[test]
fn every_peak_within_10_percent_over_5_under() {
    let rows = rows();
    assert!(rows.len() >= 90, "{} rows", rows.len());
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("| model | setting | batch | seq | AdamW | measured MiB | estimated MiB | error |");
    println!("|---|---|---|---|---|---:|---:|---:|");
    for r in &rows {
        println!(
            "{} {:.0} | {:.0} | {:+.1}% |",
            r.label,
            mib(r.measured),
            mib(r.estimated),
            100.0 * r.error()
        );
    }
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| !(-0.05..=0.10).contains(&r.error()))
        .map(|r| format!("{} {:+.1}%", r.label, 100.0 * r.error()))
        .collect();
    let worst_under = rows.iter().map(Row::error).fold(f64::MAX, f64::min);
    let worst_over = rows.iter().map(Row::error).fold(f64::MIN, f64::max);
    println!(
        "{} rows, from {:+.1}% to {:+.1}%",
        rows.len(),
        100.0 * worst_under,
        100.0 * worst_over
    );
    assert!(bad.is_empty(), "outside +10%/-5%:\n{}", bad.join("\n"));
}
