//! Source lines in findings, through the binary: with the fixture workloads'
//! source readable under `--source-root` (or `MEMLENS_SOURCE_ROOT`), `leaks`
//! and `doctor` quote the allocating line and the line that keeps the leaked
//! tensors alive: the bug planted in the workload, as its `.stats.json` names
//! it (`leak`).

use std::process::{Command, Output};

mod run;
use run::{fixture, fixtures};

fn source_root() -> String {
    fixture("gen")
}

fn memlens(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memlens"));
    c.args(args).env_remove("MEMLENS_SOURCE_ROOT");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("memlens runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The planted bug's statement, from the fixture's ground truth:
/// `"val_losses.append(out.loss) without torch.no_grad()"` -> the statement.
fn planted(name: &str) -> String {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.stats.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let leak = v["leak"].as_str().expect("the stats name the planted leak");
    leak.split(" without ")
        .next()
        .and_then(|s| s.split(" in ").next())
        .unwrap()
        .to_string()
}

/// The 1-based line of `needle` in the workload source.
fn line_of(needle: &str) -> u64 {
    let src = std::fs::read_to_string(fixtures().join("gen/workloads.py")).unwrap();
    let i = src
        .lines()
        .position(|l| l.contains(needle))
        .expect("in workloads.py");
    i as u64 + 1
}

/// The 1-based line of the last `needle` before line `before`.
fn last_before(needle: &str, before: u64) -> u64 {
    let src = std::fs::read_to_string(fixtures().join("gen/workloads.py")).unwrap();
    let i = src
        .lines()
        .take(before as usize - 1)
        .collect::<Vec<_>>()
        .iter()
        .rposition(|l| l.contains(needle))
        .expect("in workloads.py");
    i as u64 + 1
}

/// Issue 31 item 8: what is printed does not depend on where the files sit.
/// The source tree under a 200-character path (a long checkout) is named by
/// the path under the root, so the keeper's line is not wrapped.
#[test]
fn a_long_source_root_is_not_printed_whole() {
    let bug = planted("gpt2_eval_leak");
    let keep = line_of(&bug);
    let dir = tempfile::tempdir().unwrap();
    let mut root = dir.path().to_path_buf();
    for i in 0..8 {
        root.push(format!("a-very-long-folder-name-number-{i}"));
    }
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(
        fixtures().join("gen/workloads.py"),
        root.join("workloads.py"),
    )
    .unwrap();
    let root = root.to_string_lossy().into_owned();
    assert!(root.len() > 200, "{root}");
    let snap = fixture("gpt2_eval_leak.pickle.zst");
    let out = memlens(&["leaks", &snap, "--source-root", &root], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "kept alive by workloads.py:{keep} (the line to change):"
        )),
        "{text}"
    );
    assert!(!text.contains("a-very-long-folder-name"), "{text}");
}

#[test]
fn leaks_quotes_the_line_that_keeps_the_loss() {
    let bug = planted("gpt2_eval_leak");
    assert_eq!(bug, "val_losses.append(out.loss)");
    let root = source_root();
    let snap = fixture("gpt2_eval_leak.pickle.zst");
    let out = memlens(&["leaks", &snap, "--source-root", &root], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let keep = line_of(&bug);
    // The allocating statement: the last `out = model(` before the keeper
    // (train_steps has one too, earlier in the file).
    let alloc = last_before("out = model(input_ids=x, labels=x)", keep);
    assert!(
        text.contains(&format!(
            "{alloc:>5} |         out = model(input_ids=x, labels=x)"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("workloads.py:{keep} (the line to change)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("{keep:>5} |         {bug}")),
        "{text}"
    );
    assert!(
        text.contains("`val_losses.append(out.loss.item())`"),
        "{text}"
    );
    assert!(text.contains("with torch.no_grad():"), "{text}");

    let out = memlens(&["leaks", &snap, "--source-root", &root, "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let leak = &v["leaks"][0];
    assert_eq!(
        leak["site"],
        format!("/home/user/train/workloads.py:{alloc}")
    );
    assert_eq!(leak["source"]["line"], alloc);
    assert_eq!(leak["keeper"]["line"]["line"], keep);
    assert!(leak["keeper"]["line"]["text"]
        .as_str()
        .unwrap()
        .trim()
        .starts_with(&bug));
    assert_eq!(leak["keeper"]["pattern"], "append");
    assert_eq!(leak["keeper"]["kept"], "out.loss");
    assert_eq!(
        leak["keeper"]["replacement"],
        "val_losses.append(out.loss.item())"
    );
}

#[test]
fn the_module_cache_leak_is_kept_by_the_append_in_forward() {
    let bug = planted("cache_leak");
    assert_eq!(bug, "self.features.append(x)");
    let snap = fixture("cache_leak.pickle.zst");
    let out = memlens(
        &["leaks", &snap, "--json"],
        &[("MEMLENS_SOURCE_ROOT", &source_root())],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keeper = &v["leaks"][0]["keeper"];
    assert_eq!(keeper["line"]["line"], line_of(&bug));
    assert_eq!(keeper["replacement"], "self.features.append(x.detach())");
    let fix = keeper["fix"].as_str().unwrap();
    assert!(!fix.contains("no_grad"), "forward runs in training: {fix}");
}

#[test]
fn doctor_findings_carry_the_source_and_without_a_root_nothing() {
    let snap = fixture("gpt2_eval_leak.pickle.zst");
    let root = source_root();
    let out = memlens(
        &["doctor", &snap, "--no-report", "--json"],
        &[("MEMLENS_SOURCE_ROOT", &root)],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &v["findings"][0];
    assert_eq!(f["kind"], "leak");
    assert_eq!(
        f["keeper"]["line"]["line"],
        line_of("val_losses.append(out.loss)")
    );
    let text = String::from_utf8_lossy(
        &memlens(
            &["doctor", &snap, "--no-report", "--source-root", &root],
            &[],
        )
        .stdout,
    )
    .into_owned();
    assert!(text.contains("val_losses.append(out.loss)"), "{text}");

    // The frames' /home/user/train/workloads.py is not on this machine.
    let out = memlens(&["leaks", &snap, "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["leaks"][0].get("source").is_none());
    assert!(v["leaks"][0].get("keeper").is_none());
}
