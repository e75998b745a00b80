//! `memlens fit` on the command line: two probes, the answer, bad input.

mod run;

use std::path::PathBuf;

fn probe(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/fit")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn fit_predicts_a_batch_and_the_largest_under_a_limit() {
    let (a, b) = (probe("gpt.b2.pickle.zst"), probe("gpt.b4.pickle.zst"));
    let out = run::memlens(&[
        "fit",
        &a,
        &b,
        "--recorded-batch",
        "2,4",
        "--batch",
        "16",
        "--limit",
        "2GiB",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("batch 16: peak allocated"), "{text}");
    assert!(text.contains("largest batch under 2.00 GiB"), "{text}");
    let out = run::memlens(&[
        "fit",
        &a,
        &b,
        "--recorded-batch",
        "2,4",
        "--batch",
        "16",
        "--json",
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(doc["predicted"]["peak_reserved_bytes"]
        .as_u64()
        .is_some_and(|b| b > 0));
    assert!(doc["predicted"]["fits"].is_null());
    assert!(doc["basis"]["scaling_allocations"]
        .as_u64()
        .is_some_and(|n| n > 0));
}

#[test]
fn fit_with_one_batch_size_per_probe_missing_is_a_usage_error() {
    let (a, b) = (probe("gpt.b2.pickle.zst"), probe("gpt.b4.pickle.zst"));
    let out = run::memlens(&["fit", &a, &b, "--recorded-batch", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("one per probe"), "{err}");
}

#[test]
fn fit_checkpoint_predicts_the_recorded_run_with_a_module_checkpointed() {
    let rec = probe("checkpoint/hf_gpt2.pickle.zst");
    let out = run::memlens(&["fit", &rec, "--checkpoint", "GPT2Block", "--limit", "1GiB"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("GPT2Block under activation checkpointing"),
        "{text}"
    );
    assert!(text.contains("as recorded: peak allocated"), "{text}");
    assert!(text.contains("does not fit under 1.00 GiB"), "{text}");
    assert!(text.contains("checkpointed: peak allocated"), "{text}");
    assert!(text.contains("fits under 1.00 GiB"), "{text}");
    let out = run::memlens(&["fit", &rec, "--checkpoint", "GPT2Block", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let peak = |k: &str| doc[k]["peak_allocated_bytes"].as_u64().unwrap_or(0);
    assert!(
        peak("predicted") > 0 && peak("predicted") < peak("recorded"),
        "{doc}"
    );
    assert_eq!(doc["basis"]["calls"], 18, "6 blocks, 3 steps");
    assert!(doc["limit_bytes"].is_null());
}

#[test]
fn fit_checkpoint_refuses_what_it_cannot_ground() {
    let rec = probe("checkpoint/vit.pickle.zst");
    // A module that never ran: the classes that did are listed.
    let out = run::memlens(&["fit", &rec, "--checkpoint", "GPT2Block"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no module `GPT2Block`") && err.contains("EncoderBlock"),
        "{err}"
    );
    // No module scopes: how to record them.
    let out = run::memlens(&["fit", &probe("gpt.b2.pickle.zst"), "--checkpoint", "Block"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model=model"), "{err}");
    // Two changes at once are not built.
    let out = run::memlens(&["fit", &rec, "--checkpoint", "EncoderBlock", "--batch", "32"]);
    assert_eq!(out.status.code(), Some(2));
    // --checkpoint and --recorded-batch conflict.
    let out = run::memlens(&[
        "fit",
        &rec,
        &rec,
        "--checkpoint",
        "EncoderBlock",
        "--recorded-batch",
        "2,4",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn fit_replays_a_step_traced_with_fake_tensors_and_other_commands_refuse_it() {
    let trace = probe("fake/gpt.fp32.pickle.zst");
    let out = run::memlens(&["fit", &trace, "--limit", "2GiB", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let predicted = &doc["predicted"];
    assert!(predicted["peak_allocated_bytes"].as_u64().unwrap_or(0) > 0);
    assert!(predicted["peak_reserved_bytes"].as_u64().unwrap_or(0) > 0);
    // 1.78 GiB reserved on the GPU: fits under 2 GiB, not under 1.5 GiB.
    assert_eq!(predicted["fits"], serde_json::json!(true));
    assert_eq!(doc["basis"]["source"], "fake tensors");
    assert_eq!(doc["limit_bytes"], serde_json::json!(2u64 << 30));
    // The model's least limit is for memlens.predict's search, not shown.
    assert!(predicted.get("least_limit_bytes").is_none(), "{doc}");
    let out = run::memlens(&["fit", &trace, "--limit", "1.5GiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("does not fit under 1.50 GiB"), "{text}");
    assert!(
        text.contains("a step traced with fake tensors (3 steps, fp32"),
        "{text}"
    );
    // A recording alone is replayed as it ran, too.
    let out = run::memlens(&["fit", &probe("gpt.b2.pickle.zst")]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("the recorded run"));
    // --batch needs two probes.
    let out = run::memlens(&["fit", &trace, "--batch", "32"]);
    assert_eq!(out.status.code(), Some(2));
    for command in ["doctor", "summary", "peak"] {
        let out = run::memlens(&[command, &trace]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("a step traced with fake tensors") && err.contains("memlens fit"),
            "{command}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{command}: one line: {err}");
    }
}

/// The contract's changes fit cannot make to a recording yet are refused in
/// one line (exit 2) that names what predicts them, never guessed.
#[test]
fn changes_not_made_to_a_recording_are_refused_with_the_way_that_predicts_them() {
    let (a, b) = (probe("gpt.b2.pickle.zst"), probe("gpt.b4.pickle.zst"));
    for (flag, value, names) in [
        ("--precision", "bf16", "precision=\"bf16\""),
        ("--optimizer", "sgd", "optimizer=\"sgd\""),
        ("--grad-accum", "4", "accumulates over 4 micro-batches"),
        ("--seq", "1024", "seq=1024"),
    ] {
        let out = run::memlens(&[
            "fit",
            &a,
            &b,
            "--recorded-batch",
            "2,4",
            "--batch",
            "16",
            flag,
            value,
        ]);
        assert_eq!(out.status.code(), Some(2), "{flag}");
        assert!(out.stdout.is_empty(), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{flag}: {err}");
        assert!(
            err.contains(flag) && err.contains("memlens.predict("),
            "{err}"
        );
        assert!(err.contains(names), "{flag}: {err}");
    }
}
