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
