//! `memlens estimate` against the real `gpt2_train` run and against published
//! parameter counts; the `.safetensors` header reader on good and hostile files.

mod common;

use memlens::estimate::hf_config::parse_config;
use memlens::estimate::safetensors::read_header;
use memlens::estimate::{
    compare, estimate, fit, load_model, Checkpointing, Dtype, MeasuredMemory, ModelSpec, Optimizer,
    Options,
};
use memlens::Error;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn model(name: &str) -> ModelSpec {
    load_model(&data(name)).expect("config loads").0
}

/// A config from the test data with some fields replaced.
fn model_with(name: &str, edits: &[(&str, serde_json::Value)]) -> ModelSpec {
    let text = std::fs::read_to_string(data(name)).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (k, val) in edits {
        v[*k] = val.clone();
    }
    parse_config(&v.to_string(), Path::new(name)).expect("edited config parses")
}

/// The settings of the `gpt2_train` fixture: batch 8, sequence 512, fp32
/// weights under bf16 autocast, AdamW, SDPA (fused attention), dropout on.
fn gpt2_train_options() -> Options {
    Options {
        batch: 8,
        seq: Some(512),
        dtype: Dtype::Fp32,
        amp: true,
        optimizer: Optimizer::Adamw,
        flash_attention: true,
        // workloads.py keeps the output (`out = model(...)`) through backward.
        keep_outputs: true,
        ..Options::default()
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memlens-estimate-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn gpt2_train_parameter_count_is_exact() {
    let stats = common::stats("gpt2_train");
    let params = stats["params"].as_u64().unwrap();
    assert_eq!(params, 67_891_200);
    assert_eq!(model("gpt2_train.config.json").parameters(), params);
}

#[test]
fn gpt2_train_peak_within_15_percent_of_measured() {
    let stats = common::stats("gpt2_train");
    let params = stats["params"].as_u64().unwrap();
    let measured = stats["memory_stats"]["allocated_bytes.all.peak"]
        .as_u64()
        .unwrap();
    assert_eq!(measured, 4_583_255_040);
    let spec = model("gpt2_train.config.json");
    let est = estimate(&spec, None, &gpt2_train_options()).unwrap();

    // fp32 weights and gradients (autocast leaves parameters in fp32), AdamW's
    // two fp32 moments.
    assert_eq!(est.parameters_bytes, params * 4);
    assert_eq!(est.gradients_bytes, params * 4);
    assert_eq!(est.optimizer_bytes, params * 8);
    // The peak of that run is at the start of backward: log_softmax's
    // backward allocating its fp32 gradient while the bf16 logits, the kept
    // fp32 log-softmax output and nll_loss's fp32 gradient are alive
    // (262 144 000 + 3 x 524 288 000 bytes in the trace).
    assert_eq!(est.peak_phase, "backward_start");
    let loss =
        est.part("logits_and_loss").unwrap().bytes + est.part("loss_gradients").unwrap().bytes;
    assert_eq!(loss, 262_144_000 + 3 * 524_288_000);
    // Autocast's bf16 copies of the Conv1D weights and of the tied wte.
    assert_eq!(est.part("amp_weight_copies").unwrap().bytes, 134_169_600);

    let err = est.total_bytes as f64 / measured as f64 - 1.0;
    eprintln!(
        "gpt2_train: estimated {} vs measured {measured}: {:+.2}%",
        est.total_bytes,
        err * 100.0
    );
    assert!(err.abs() < 0.15, "estimate off by {:.1}%", err * 100.0);
    assert_eq!(est.total_bytes, est.peak_allocated_bytes);
    assert!(est.device_bytes > est.total_bytes);

    // The same through --compare's data structure.
    let cmp = compare(
        &est,
        &MeasuredMemory {
            peak_allocated_bytes: measured,
            categories: Default::default(),
        },
    );
    assert!(cmp.relative_error.unwrap().abs() < 0.15);
    assert_eq!(cmp.measured_peak_bytes, measured);
}

/// The estimate beside `memlens peak`'s analysis of the real snapshot: the
/// peak, and what was live at it by category.
#[test]
fn gpt2_train_compared_with_the_snapshot() {
    let snap = memlens::Snapshot::load(&common::fixture("gpt2_train.pickle.zst")).unwrap();
    let r = memlens::analysis::peak::peak(&snap, 0);
    let measured = MeasuredMemory {
        peak_allocated_bytes: r.peak_allocated_bytes,
        categories: r.categories,
    };
    let est = estimate(
        &model("gpt2_train.config.json"),
        None,
        &gpt2_train_options(),
    )
    .unwrap();
    let c = compare(&est, &measured);
    assert!(c.relative_error.unwrap().abs() < 0.15);
    let row = |name: &str| {
        c.categories
            .iter()
            .find(|r| r.category == name)
            .unwrap()
            .clone()
    };
    for (name, tolerance) in [
        ("parameter", 0.01),
        ("optimizer_state", 0.01),
        ("activation", 0.05),
    ] {
        let r = row(name);
        let m = r.measured_bytes.unwrap() as f64;
        let err = r.estimated_bytes as f64 / m - 1.0;
        assert!(err.abs() < tolerance, "{name}: {:+.2}%", err * 100.0);
    }
}

/// Two more real runs of the same code: `long` (4 layers, hidden 512, batch 4
/// x 256) and `varlen`, whose largest step was batch 8 x 2000 (its shapes come
/// from `random.Random(0)` in workloads.py).
#[test]
fn other_gpt2_fixtures_within_5_percent() {
    for (name, batch, seq) in [("long", 4, 256), ("varlen", 8, 2000)] {
        let measured = common::stats(name)["memory_stats"]["allocated_bytes.all.peak"]
            .as_u64()
            .unwrap();
        let spec = model(&format!("{name}.config.json"));
        let o = Options {
            batch,
            seq: Some(seq),
            ..gpt2_train_options()
        };
        let est = estimate(&spec, None, &o).unwrap();
        let err = est.total_bytes as f64 / measured as f64 - 1.0;
        eprintln!(
            "{name}: estimated {} vs measured {measured}: {:+.2}%",
            est.total_bytes,
            err * 100.0
        );
        assert!(err.abs() < 0.05, "{name}: off by {:.1}%", err * 100.0);
    }
}

#[test]
fn gpt2_train_activations_per_layer() {
    // What one layer of that run keeps, term by term as the trace shows it:
    // LN inputs 2 x 12 582 912 (fp32), c_attn input cast 6 291 456, QKV
    // 18 874 368, DynamicCache K/V copies 2 x 6 291 456, SDPA output 6 291 456
    // + logsumexp 196 608, two dropout masks 2 x 3 145 728, c_fc input cast
    // 6 291 456, gelu_new 3 x 50 331 648 (fp32) + 25 165 824, c_proj input
    // cast 25 165 824: 283 312 128 bytes (the trace adds 16 bytes of RNG state).
    let spec = model("gpt2_train.config.json");
    let est = estimate(&spec, None, &gpt2_train_options()).unwrap();
    assert_eq!(est.layers.len(), 1);
    assert_eq!(est.layers[0].count, 6);
    assert_eq!(est.layers[0].bytes_per_layer, 283_312_128);
}

#[test]
fn published_parameter_counts() {
    assert_eq!(model("gpt2.config.json").parameters(), 124_439_808);
    assert_eq!(model("llama-2-7b.config.json").parameters(), 6_738_415_616);
    assert_eq!(
        model("mistral-7b-v0.1.config.json").parameters(),
        7_241_732_096
    );
    assert_eq!(model("qwen2-0.5b.config.json").parameters(), 494_032_768);
    assert_eq!(model("t5-small.config.json").parameters(), 60_506_624);
    // bert-base-uncased as BertForMaskedLM (its config's class), and as the
    // bare BertModel with its pooler.
    assert_eq!(
        model("bert-base-uncased.config.json").parameters(),
        109_514_298
    );
    let bare = model_with(
        "bert-base-uncased.config.json",
        &[("architectures", serde_json::json!(["BertModel"]))],
    );
    assert_eq!(bare.parameters(), 109_482_240);
    // ViT-B/16: the bare model with pooler, and the ImageNet classifier.
    assert_eq!(
        model("vit-base-patch16-224-in21k.config.json").parameters(),
        86_389_248
    );
    let cls = model_with(
        "vit-base-patch16-224-in21k.config.json",
        &[
            (
                "architectures",
                serde_json::json!(["ViTForImageClassification"]),
            ),
            ("num_labels", serde_json::json!(1000)),
        ],
    );
    assert_eq!(cls.parameters(), 86_567_656);
}

#[test]
fn llama_kv_cache_is_half_a_mebibyte_per_token() {
    // Llama-2-7B in fp16: 2 (K, V) x 32 layers x 4096 x 2 bytes = 512 KiB a token.
    let spec = model("llama-2-7b.config.json");
    let est = estimate(
        &spec,
        None,
        &Options {
            batch: 1,
            seq: Some(4096),
            dtype: Dtype::Fp16,
            inference: true,
            flash_attention: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(est.kv_cache_bytes, 4096 * 512 * 1024);
    assert_eq!(est.parameters_bytes, 6_738_415_616 * 2);
    assert_eq!(est.gradients_bytes, 0);
    assert_eq!(est.optimizer_bytes, 0);
    assert_eq!(est.peak_phase, "inference");
}

#[test]
fn mixed_precision_and_zero_divide_states() {
    let spec = model("llama-2-7b.config.json");
    let n = spec.parameters();
    let base = Options {
        batch: 1,
        seq: Some(2048),
        dtype: Dtype::Bf16,
        amp: true,
        flash_attention: true,
        ..Options::default()
    };
    // 16-bit weights and gradients, Adam's 12 bytes (fp32 master + 2 moments).
    let est = estimate(&spec, None, &base).unwrap();
    assert_eq!(est.parameters_bytes, 2 * n);
    assert_eq!(est.gradients_bytes, 2 * n);
    assert_eq!(est.optimizer_bytes, 12 * n);
    // ZeRO on 8 GPUs: stage 1 the optimizer, 2 the gradients too, 3 the weights too.
    let z = |stage| {
        estimate(
            &spec,
            None,
            &Options {
                zero: stage,
                gpus: 8,
                ..base.clone()
            },
        )
        .unwrap()
    };
    let (z1, z2, z3) = (z(1), z(2), z(3));
    assert_eq!(z1.optimizer_bytes, (12 * n).div_ceil(8));
    assert_eq!(z1.gradients_bytes, 2 * n);
    assert_eq!(z2.gradients_bytes, (2 * n).div_ceil(8));
    assert_eq!(z2.parameters_bytes, 2 * n);
    assert_eq!(z3.parameters_bytes, (2 * n).div_ceil(8));
    assert!(z3.total_bytes < z2.total_bytes && z2.total_bytes < z1.total_bytes);
    // Optimizers by state size.
    let with = |optimizer| {
        estimate(
            &spec,
            None,
            &Options {
                optimizer,
                dtype: Dtype::Fp32,
                amp: false,
                ..base.clone()
            },
        )
        .unwrap()
        .optimizer_bytes
    };
    assert_eq!(with(Optimizer::Sgd), 0);
    assert_eq!(with(Optimizer::SgdMomentum), 4 * n);
    assert_eq!(with(Optimizer::Adam), 8 * n);
    let adafactor = with(Optimizer::Adafactor);
    assert!(
        adafactor > 0 && adafactor < n / 100,
        "factored: {adafactor}"
    );
}

#[test]
fn checkpointing_and_flash_shrink_activations() {
    let spec = model("gpt2.config.json");
    let o = |checkpointing, flash_attention| Options {
        batch: 4,
        seq: Some(1024),
        amp: true,
        checkpointing,
        flash_attention,
        ..Options::default()
    };
    let act = |o: Options| {
        estimate(&spec, None, &o)
            .unwrap()
            .part("activations")
            .unwrap()
            .bytes
    };
    let eager = act(o(Checkpointing::None, false));
    let flash = act(o(Checkpointing::None, true));
    let selective = act(o(Checkpointing::Selective, false));
    let full = act(o(Checkpointing::Full, true));
    assert!(flash < eager);
    assert!(selective < eager);
    assert!(full < flash / 4, "full {full} flash {flash}");
}

#[test]
fn fit_finds_the_largest_batch() {
    let spec = model("gpt2_train.config.json");
    let opts = gpt2_train_options();
    let est = estimate(&spec, None, &opts).unwrap();
    let device = 80_000_000_000u64;
    let f = fit(&spec, &opts, &est, device).unwrap();
    assert!(f.fits);
    let max = f.max_batch.unwrap();
    assert!(max > 8);
    let at = |b| {
        estimate(
            &spec,
            None,
            &Options {
                batch: b,
                ..opts.clone()
            },
        )
        .unwrap()
        .device_bytes
    };
    assert!(at(max) <= device);
    assert!(at(max + 1) > device);
    // Too small a device: nothing fits.
    let f = fit(&spec, &opts, &est, 1 << 30).unwrap();
    assert!(!f.fits);
    assert_eq!(f.max_batch, None);
}

#[test]
fn bad_configs_are_typed_errors() {
    let p = Path::new("config.json");
    let e = parse_config(r#"{"model_type": "falcon"}"#, p).unwrap_err();
    assert!(matches!(e, Error::Model { .. }));
    assert!(e.to_string().contains("not supported"), "{e}");
    let e = parse_config(r#"{"model_type": "gpt2", "n_layer": 2}"#, p).unwrap_err();
    assert!(e.to_string().contains("missing field \"n_embd\""), "{e}");
    let e = parse_config("{not json", p).unwrap_err();
    assert!(matches!(e, Error::Json { .. }));
    let e = parse_config(
        r#"{"model_type":"gpt2","n_layer":2,"n_embd":100,"n_head":12,"vocab_size":10}"#,
        p,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a multiple"), "{e}");
    let e = parse_config(
        r#"{"model_type":"gpt2","n_layer":-2,"n_embd":768,"n_head":12,"vocab_size":10}"#,
        p,
    )
    .unwrap_err();
    assert!(e.to_string().contains("positive integer"), "{e}");
    let e = parse_config(r#"{"hidden_size": 10}"#, p).unwrap_err();
    assert!(e.to_string().contains("model_type"), "{e}");
    assert!(parse_config("[]", p).is_err());
    // A sequence longer than learned positions cannot run.
    let spec = model("gpt2.config.json");
    let e = estimate(
        &spec,
        None,
        &Options {
            seq: Some(4096),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::Usage(_)));
}

/// A safetensors file built by hand: length prefix, JSON header, data.
fn write_safetensors(path: &Path, header: &str, data_len: usize) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data_len, 0);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn safetensors_header_is_read_without_the_weights() {
    let dir = tmp("st-good");
    let path = dir.join("model.safetensors");
    // A two-layer toy with a buffer (int64 position_ids) that must not count.
    let header = r#"{"__metadata__":{"format":"pt"},
        "embed.weight":{"dtype":"BF16","shape":[100,16],"data_offsets":[0,3200]},
        "layers.0.w":{"dtype":"F32","shape":[16,16],"data_offsets":[3200,4224]},
        "layers.1.w":{"dtype":"F32","shape":[16,16],"data_offsets":[4224,5248]},
        "position_ids":{"dtype":"I64","shape":[1,8],"data_offsets":[5248,5312]}}"#;
    write_safetensors(&path, header, 5312);
    let h = read_header(&path).unwrap();
    assert_eq!(h.tensors.len(), 4);
    assert_eq!(h.tensors[0].name, "embed.weight");
    assert_eq!(h.tensors[0].numel, 1600);
    assert_eq!(h.data_bytes, 5312);
    assert_eq!(h.metadata["format"], "pt");

    let (spec, ck) = load_model(&path).unwrap();
    let ck = ck.unwrap();
    assert_eq!(spec.parameters(), 1600 + 2 * 256);
    assert_eq!(ck.parameters, 1600 + 512);
    assert_eq!(ck.dtypes["BF16"], 1600);
    assert_eq!(ck.dtypes["F32"], 512);
    assert_eq!(ck.buffers, vec!["position_ids".to_string()]);
    assert_eq!(spec.largest_layer_parameters(), 256);
    // Without a config: weights, gradients, optimizer state; no activations.
    let est = estimate(&spec, Some(&ck), &Options::default()).unwrap();
    assert!(!est.activations_estimated);
    assert_eq!(est.parameters_bytes, 2112 * 4);
    assert_eq!(est.optimizer_bytes, 2112 * 8);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn safetensors_beside_a_config_uses_both() {
    let dir = tmp("st-config");
    std::fs::copy(data("gpt2_train.config.json"), dir.join("config.json")).unwrap();
    // Header of the fixture model's real tensor list (tied lm_head not stored),
    // plus GPT-2's attention-mask buffers that old checkpoints carry.
    let spec = model("gpt2_train.config.json");
    let mut header = serde_json::Map::new();
    let mut off = 0u64;
    for t in &spec.tensors {
        let name = t.name.trim_start_matches("transformer.");
        let end = off + t.numel * 4;
        header.insert(
            name.into(),
            serde_json::json!({"dtype":"F32","shape":t.shape,"data_offsets":[off,end]}),
        );
        off = end;
    }
    header.insert(
        "h.0.attn.bias".into(),
        serde_json::json!({"dtype":"F32","shape":[1,1,4,4],"data_offsets":[off,off+64]}),
    );
    off += 64;
    let header = serde_json::Value::Object(header).to_string();
    write_safetensors(&dir.join("model.safetensors"), &header, off as usize);
    for target in [dir.clone(), dir.join("model.safetensors")] {
        let (spec, ck) = load_model(&target).unwrap();
        assert!(
            spec.arch.is_some(),
            "architecture from the config beside it"
        );
        let ck = ck.unwrap();
        assert_eq!(ck.parameters, 67_891_200);
        assert_eq!(ck.buffers, vec!["h.0.attn.bias".to_string()]);
        assert!(spec.notes.is_empty(), "{:?}", spec.notes);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hostile_safetensors_are_errors_not_panics() {
    let dir = tmp("st-bad");
    let p = dir.join("bad.safetensors");
    // Length claims 2^63 bytes: refused before any allocation.
    let mut bytes = (1u64 << 63).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&p, &bytes).unwrap();
    let e = read_header(&p).unwrap_err();
    assert!(matches!(e, Error::Model { .. }));
    assert!(e.to_string().contains("exceeds"), "{e}");
    // Length within the cap but past the end of the file: truncated.
    let mut bytes = 50_000_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{\"a\":");
    std::fs::write(&p, &bytes).unwrap();
    assert!(read_header(&p)
        .unwrap_err()
        .to_string()
        .contains("truncated"));
    // Shorter than the length prefix itself.
    std::fs::write(&p, [7u8, 0, 0]).unwrap();
    assert!(read_header(&p)
        .unwrap_err()
        .to_string()
        .contains("truncated"));
    // Header cut short: the JSON ends early.
    let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header.as_bytes()[..20]);
    std::fs::write(&p, &bytes).unwrap();
    assert!(read_header(&p)
        .unwrap_err()
        .to_string()
        .contains("truncated"));
    // Offsets past the data, shape overflowing, wrong sizes.
    for header in [
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}}"#,
        r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
        r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#,
        r#"{"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}}"#,
        r#"{"w":{"shape":[2],"data_offsets":[0,8]}}"#,
        r#"not json at all"#,
    ] {
        write_safetensors(&p, header, 8);
        let e = read_header(&p).unwrap_err();
        assert!(matches!(e, Error::Model { .. }), "{header}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_family_estimates_in_every_mode() {
    for name in [
        "gpt2.config.json",
        "llama-2-7b.config.json",
        "mistral-7b-v0.1.config.json",
        "qwen2-0.5b.config.json",
        "bert-base-uncased.config.json",
        "t5-small.config.json",
        "vit-base-patch16-224-in21k.config.json",
    ] {
        let spec = model(name);
        for inference in [false, true] {
            for amp in [false, true] {
                let o = Options {
                    batch: 2,
                    seq: Some(128),
                    amp,
                    inference,
                    ..Options::default()
                };
                let est = estimate(&spec, None, &o).unwrap();
                assert!(est.total_bytes > est.parameters_bytes, "{name}");
                assert!(est.activations_bytes > 0, "{name}");
                let sum: u64 = est.peak().unwrap().parts.values().sum();
                assert_eq!(sum, est.total_bytes, "{name}");
                assert!(est.parts.iter().all(|p| !p.formula.is_empty()), "{name}");
            }
        }
    }
}

/// The headline of a 7B Llama: bf16 weights with fp32 master weights peak
/// above fp32 weights with autocast though both keep 16 bytes a parameter,
/// and the explanation names the optimizer step's fp32 gradients as the
/// difference.
#[test]
fn explanation_accounts_for_the_7b_headline() {
    let spec = model("llama-2-7b.config.json");
    let n = spec.parameters();
    assert_eq!(n, 6_738_415_616);
    let opts = |dtype| Options {
        dtype,
        amp: true,
        ..Options::default()
    };
    let bf16 = opts(Dtype::Bf16);
    let est = estimate(&spec, None, &bf16).unwrap();
    let x = memlens::estimate::explain(&spec, &bf16, &est).unwrap();
    let kept: f64 = x
        .per_parameter
        .iter()
        .filter(|p| p.persistent)
        .map(|p| p.bytes)
        .sum();
    assert_eq!(kept, 16.0);
    assert_eq!(est.peak_phase, "optimizer_step");
    // sqrt(exp_avg_sq) in fp32 and the fp32 gradients: 8 bytes a parameter.
    let temps = est.part("optimizer_step_temporaries").unwrap();
    assert_eq!(temps.bytes, n * 8);
    assert!(temps
        .terms
        .iter()
        .any(|t| t.name.contains("fp32 gradients") && t.bytes == n * 4));
    let fp32 = x
        .alternatives
        .iter()
        .find(|a| a.flags.starts_with("--dtype fp32 --amp"))
        .unwrap();
    let fp32_est = estimate(&spec, None, &opts(Dtype::Fp32)).unwrap();
    assert_eq!(fp32.total_bytes, fp32_est.total_bytes);
    assert!(fp32.total_bytes < est.total_bytes);
    // At the optimizer step: weights 2 + gradients 2 + state 12 +
    // temporaries 8 = 24 B a parameter, against 4 + 4 + 8 + 4 = 20 with fp32
    // weights: 4 B a parameter more, 25.1 GiB for 7B.
    let step = |e: &memlens::estimate::Estimate| {
        e.phases
            .iter()
            .find(|p| p.name == "optimizer_step")
            .unwrap()
            .bytes
    };
    assert_eq!(step(&est) - step(&fp32_est), 4 * n);
    assert!(fp32.why.contains("optimizer step temporaries"));
    // A fused AdamW drops sqrt(exp_avg_sq): 4 B a parameter less.
    let fused = x
        .alternatives
        .iter()
        .find(|a| a.flags.starts_with("--optimizer-impl fused"))
        .unwrap();
    assert_eq!(est.total_bytes - fused.total_bytes, 4 * n);
}
