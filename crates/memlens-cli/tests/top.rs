//! End-to-end tests of `memlens top` through the binary, with no GPU: the
//! hidden `--fake-source FILE` replaces NVML, a child `sleep` stands in for
//! the training process, and a publication file in a private
//! `MEMLENS_RUNTIME_DIR` gives its allocator figures.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

struct World {
    dir: PathBuf,
    child: Child,
}

impl World {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("memlens-top-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rt")).unwrap();
        let child = common::spawn_sleep();
        let pid = child.id();
        // 40 frames: the child grows 40 MiB a frame; PID 4000000000 is foreign.
        let frames: Vec<String> = (0..40u64)
            .map(|t| {
                let used = 3 * GIB + t * 40 * MIB;
                format!(
                    r#"[{{"index":0,"name":"Fake GPU","total_bytes":{},"used_bytes":{},"utilization_pct":50,
                    "processes":[{{"pid":{pid},"used_bytes":{used}}},{{"pid":4000000000,"used_bytes":{GIB}}}]}}]"#,
                    80 * GIB,
                    used + GIB
                )
            })
            .collect();
        std::fs::write(dir.join("frames.json"), format!("[{}]", frames.join(","))).unwrap();
        World { dir, child }
    }

    /// Runs `top` with `args`, the training process's publication written
    /// afresh first (see [`common::publish`]).
    fn top(&self, args: &[&str]) -> Output {
        let fields = format!(
            r#""device":0,"rank":null,"step":9,"allocated_bytes":{},"reserved_bytes":{},
            "active_bytes":{},"peak_allocated_bytes":{},"leak_alarm":null,"cmdline":"python train.py""#,
            GIB,
            2 * GIB,
            GIB,
            GIB
        );
        common::publish(&self.dir.join("rt"), self.child.id(), &fields);
        Command::new(env!("CARGO_BIN_EXE_memlens"))
            .arg("top")
            .arg("--fake-source")
            .arg(self.dir.join("frames.json"))
            .args(args)
            .env("MEMLENS_RUNTIME_DIR", self.dir.join("rt"))
            .output()
            .unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn once_json_shows_nvml_and_allocator_figures() {
    let w = World::new("once");
    let o = w.top(&["--once", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], "memlens/1");
    assert_eq!(v["source"], "fake");
    let g = &v["gpus"][0];
    assert_eq!(g["used_bytes"], 4 * GIB);
    let p = &g["processes"][0];
    assert_eq!(p["pid"], w.child.id());
    assert_eq!(p["visibility"], "local");
    assert_eq!(
        p["cmdline"],
        common::proc_cmdline(w.child.id()).map_or(serde_json::Value::Null, serde_json::Value::from)
    );
    assert_eq!(p["used_bytes"], 3 * GIB);
    assert_eq!(p["torch"]["reserved_bytes"], 2 * GIB);
    assert_eq!(p["torch"]["allocated_bytes"], GIB);
    assert_eq!(p["torch"]["gap_bytes"], GIB);
    assert_eq!(p["torch"]["step"], 9);
    let foreign = &g["processes"][1];
    assert_eq!(foreign["visibility"], "not_in_namespace");
    assert_eq!(foreign["cmdline"], serde_json::Value::Null);

    let text = stdout(&w.top(&["--once"]));
    assert!(
        text.contains("GPU 0  Fake GPU  4.00 GiB / 80.00 GiB (5%)  util 50%"),
        "{text}"
    );
    assert!(
        text.contains("pid 4000000000 (not in this PID namespace)"),
        "{text}"
    );
    assert!(text.contains("+1.00 GiB"), "{text}");
}

#[test]
fn headless_records_and_runs_the_alert_command_once() {
    let w = World::new("loop");
    let alerts = w.path("alerts.txt");
    let on_alert = format!(
        "echo \"$MEMLENS_ALERT_KIND $MEMLENS_PID $MEMLENS_GPU\" >> '{}'",
        alerts.display()
    );
    let jsonl = w.path("h.jsonl");
    let o = w.top(&[
        "--no-ui",
        "--count",
        "30",
        "--interval",
        "0.05",
        "--alert-growth",
        "1GiB/min",
        "--growth-window",
        "1",
        "--alert-above",
        "4GiB",
        "--on-alert",
        &on_alert,
        "--record",
        jsonl.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = stdout(&o);
    assert_eq!(
        text.lines().filter(|l| l.contains("GPU0 ")).count(),
        30,
        "{text}"
    );
    assert!(text.contains("ALERT growth: pid"), "{text}");

    let fired = std::fs::read_to_string(&alerts).unwrap();
    let mut lines: Vec<&str> = fired.lines().collect();
    lines.sort();
    let want_growth = format!("growth {} 0", w.child.id());
    assert_eq!(lines, ["gpu_full  0", want_growth.as_str()], "{fired}");

    let records = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(records.lines().count(), 30);
    let last: serde_json::Value = serde_json::from_str(records.lines().last().unwrap()).unwrap();
    assert_eq!(last["schema"], "memlens/1");
    let kinds: Vec<&str> = last["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"growth") && kinds.contains(&"gpu_full"),
        "{kinds:?}"
    );
}

#[test]
fn csv_record_and_json_lines() {
    let w = World::new("csv");
    let csv = w.path("h.csv");
    let o = w.top(&[
        "--json",
        "--count",
        "3",
        "--interval",
        "0.05",
        "--record",
        csv.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 3);
    for l in out.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["schema"], "memlens/1");
    }
    let rows = std::fs::read_to_string(&csv).unwrap();
    // Header, then per sample one GPU row and two process rows.
    assert_eq!(rows.lines().count(), 1 + 3 * 3);
    assert!(rows.starts_with("time,gpu,"));
}

#[test]
fn bad_options_are_one_line_errors() {
    let w = World::new("bad");
    for args in [
        &["--alert-above", "150%"][..],
        &["--alert-growth", "1MiB/fortnight"],
        &["--record", "history.txt"],
        &["--interval", "0"],
    ] {
        let o = w.top(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("memlens: error:") || err.contains("error:"),
            "{err}"
        );
    }
    let o = w.top(&["--once"]);
    assert_eq!(o.status.code(), Some(0));
    let missing = Path::new("/nonexistent/frames.json");
    let o = Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args(["top", "--once", "--fake-source"])
        .arg(missing)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// With no NVIDIA driver (CI, this machine) `top` says so in one line and
/// exits 2; on a GPU machine it prints a sample.
#[test]
fn no_driver_is_a_clear_one_line_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args(["top", "--once", "--json"])
        .output()
        .unwrap();
    match o.status.code() {
        Some(0) => assert!(stdout(&o).contains("\"gpus\"")),
        code => {
            assert_eq!(code, Some(2));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(err.lines().count(), 1, "{err}");
            // No driver here; on a machine whose driver refuses us, NVML's reason.
            assert!(
                err.starts_with("memlens: error: no NVIDIA driver found")
                    || err.starts_with("memlens: error: NVML: "),
                "{err}"
            );
        }
    }
}
