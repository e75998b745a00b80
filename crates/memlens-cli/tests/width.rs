//! Readable output: every command's text on every fixture keeps each line
//! within 120 columns (issue 14, item 8), with no trailing ` in ` for a
//! nameless function and no series longer than a sparkline.

use std::path::PathBuf;
use std::process::Command;

const MAX_WIDTH: usize = 120;

fn fixtures() -> PathBuf {
    std::env::var("MEMLENS_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
        })
}

fn snapshots() -> Vec<String> {
    let mut all: Vec<String> = std::fs::read_dir(fixtures())
        .expect("fixtures folder (../shared/fixtures or MEMLENS_FIXTURES)")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pickle.zst"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    all.sort();
    all
}

/// Runs memlens, returns its stdout; any exit code but 0 or 1 fails the test
/// unless `may_refuse` (oom on a snapshot without an OOM exits 2 by design).
fn text(args: &[&str], may_refuse: bool) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args(args)
        .output()
        .expect("memlens runs");
    let code = out.status.code();
    assert!(
        matches!(code, Some(0) | Some(1)) || (may_refuse && code == Some(2)),
        "{args:?} exited {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn assert_readable(args: &[&str], out: &str) {
    for line in out.lines() {
        let cols = line.chars().count();
        assert!(
            cols <= MAX_WIDTH,
            "{args:?}: a line of {cols} columns:\n{line}"
        );
        assert!(!line.ends_with(" in "), "{args:?}: trailing ` in `: {line}");
        assert!(
            line.matches(" -> ").count() <= 2,
            "{args:?}: a series written out in full: {line}"
        );
    }
}

#[test]
fn every_command_on_every_fixture_fits_in_120_columns() {
    let snaps = snapshots();
    assert!(snaps.len() >= 19, "found {} fixtures", snaps.len());
    let mut runs = 0;
    for snap in &snaps {
        let s = snap.as_str();
        let commands: Vec<(Vec<&str>, bool)> = vec![
            (vec!["summary", s], false),
            (vec!["peak", s], false),
            (vec!["leaks", s], false),
            (vec!["check", s, "--max-peak", "1GiB"], false),
            (vec!["doctor", s, "-v", "--no-report"], false),
            (vec!["oom", s, "--device-memory", "80GB"], true),
            (
                vec![
                    "simulate",
                    s,
                    "--config",
                    "expandable_segments:True",
                    "--device-memory",
                    "80GB",
                ],
                false,
            ),
            (vec!["tune", s, "--device-memory", "80GB"], false),
            (vec!["diff", &snaps[0], s], false),
        ];
        for (args, may_refuse) in commands {
            let out = text(&args, may_refuse);
            assert_readable(&args, &out);
            runs += 1;
        }
    }
    // A run of several snapshots, and the explainer of a message alone.
    let steps: Vec<&str> = snaps
        .iter()
        .filter(|p| p.contains("gpt2_eval_leak.step"))
        .map(String::as_str)
        .collect();
    let mut leaks = vec!["leaks"];
    leaks.extend(&steps);
    assert_readable(&leaks, &text(&leaks, false));
    let message = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of \
        8.00 GiB of which 0 bytes is free. Of the allocated memory 7.51 GiB is allocated by \
        PyTorch, and 15.90 MiB is reserved by PyTorch but unallocated.";
    let args = ["oom", "--message", message];
    assert_readable(&args, &text(&args, false));
    assert_eq!(runs, snaps.len() * 9);
}

#[test]
fn estimate_fits_in_120_columns() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../memlens/tests/data");
    for model in ["gpt2_train", "llama-2-7b", "t5-small", "bert-base-uncased"] {
        let config = data.join(format!("{model}.config.json"));
        let config = config.to_string_lossy();
        let args = [
            "estimate",
            config.as_ref(),
            "--batch",
            "4",
            "--seq",
            "512",
            "--device-memory",
            "24GiB",
        ];
        assert_readable(&args, &text(&args, false));
    }
}
