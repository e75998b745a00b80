//! `memlens top --once --format openmetrics` and `memlens top --serve ADDR`,
//! through the binary with no GPU: the hidden `--fake-source FILE` replaces
//! NVML, a child `sleep` stands in for the training process and a publication
//! file (as `memlens.record` writes it) gives its allocator figures. The
//! endpoint is scraped on loopback and every figure must equal the one
//! `top --once --json` prints.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

struct World {
    dir: PathBuf,
    child: Child,
}

impl World {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("memlens-om-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rt")).unwrap();
        let child = common::spawn_sleep();
        let pid = child.id();
        // One frame (repeated forever): every sample sees the same figures.
        let frame = format!(
            r#"[[{{"index":0,"name":"Fake GPU","uuid":"GPU-fake-0","total_bytes":{},"used_bytes":{},
            "processes":[{{"pid":{pid},"used_bytes":{}}}]}}]]"#,
            80 * GIB,
            6 * GIB,
            4 * GIB + 512 * MIB
        );
        std::fs::write(dir.join("frames.json"), frame).unwrap();
        World { dir, child }
    }

    /// Writes the training process's publication, stamped now (before each
    /// run of `top`: see [`common::publish`]).
    fn publish(&self) {
        let fields = format!(
            r#""device":0,"rank":2,"step":41,"allocated_bytes":{},"reserved_bytes":{},
            "active_bytes":{},"peak_allocated_bytes":{},
            "leak_alarm":"+8.00 MiB/step over 5 steps","cmdline":"python train.py""#,
            3 * GIB,
            4 * GIB,
            3 * GIB,
            5 * GIB
        );
        common::publish(&self.dir.join("rt"), self.child.id(), &fields);
    }

    fn top(&self) -> Command {
        self.publish();
        let mut c = Command::new(env!("CARGO_BIN_EXE_memlens"));
        c.arg("top")
            .arg("--fake-source")
            .arg(self.dir.join("frames.json"))
            .env("MEMLENS_RUNTIME_DIR", self.dir.join("rt"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        let o = self.top().args(args).output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `name{labels}` -> value, from OpenMetrics text (checks the framing too).
fn parse(text: &str) -> HashMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse::<f64>().unwrap())
        })
        .collect()
}

/// Checks every OpenMetrics figure against the JSON of `top --once --json`.
fn assert_matches_json(metrics: &HashMap<String, f64>, json: &serde_json::Value) {
    let g = &json["gpus"][0];
    let p = &g["processes"][0];
    let t = &p["torch"];
    let num = |v: &serde_json::Value| v.as_f64().unwrap();
    let gpu = r#"{gpu="0",name="Fake GPU",uuid="GPU-fake-0"}"#;
    let proc_labels = format!(
        r#"{{pid="{}",gpu="0",rank="{}",command="{}"}}"#,
        p["pid"],
        t["rank"],
        p["cmdline"].as_str().unwrap_or_default()
    );
    let mut want = vec![
        (
            format!("memlens_gpu_memory_used_bytes{gpu}"),
            num(&g["used_bytes"]),
        ),
        (
            format!("memlens_gpu_memory_total_bytes{gpu}"),
            num(&g["total_bytes"]),
        ),
        (
            format!("memlens_process_gpu_memory_used_bytes{proc_labels}"),
            num(&p["used_bytes"]),
        ),
        (
            format!("memlens_process_allocated_bytes{proc_labels}"),
            num(&t["allocated_bytes"]),
        ),
        (
            format!("memlens_process_reserved_bytes{proc_labels}"),
            num(&t["reserved_bytes"]),
        ),
        (
            format!("memlens_process_fragmentation_ratio{proc_labels}"),
            (num(&t["reserved_bytes"]) - num(&t["allocated_bytes"])) / num(&t["reserved_bytes"]),
        ),
        (
            format!("memlens_process_outside_allocator_bytes{proc_labels}"),
            num(&t["gap_bytes"]),
        ),
        (
            format!("memlens_process_step{proc_labels}"),
            num(&t["step"]),
        ),
        (
            format!("memlens_process_leak_alarm{proc_labels}"),
            if t["leak_alarm"].is_string() {
                1.0
            } else {
                0.0
            },
        ),
    ];
    // Alerts holding now: the publication's leak alarm is one.
    let alerts = json["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    for a in alerts {
        let pid = a["pid"].as_u64().map(|p| p.to_string()).unwrap_or_default();
        want.push((
            format!(
                r#"memlens_alert{{kind="{}",gpu="{}",pid="{pid}"}}"#,
                a["kind"].as_str().unwrap(),
                a["gpu"]
            ),
            1.0,
        ));
    }
    for (series, value) in &want {
        assert_eq!(metrics.get(series), Some(value), "{series} in {metrics:#?}");
    }
    assert_eq!(metrics.len(), want.len(), "{metrics:#?}");
}

fn json_once(w: &World) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_slice(&w.run(&["--once", "--json"]).stdout).unwrap();
    // The fixed figures of this world, so the comparison is not vacuous.
    assert_eq!(v["gpus"][0]["used_bytes"], 6 * GIB);
    assert_eq!(
        v["gpus"][0]["processes"][0]["torch"]["reserved_bytes"],
        4 * GIB
    );
    assert_eq!(
        v["gpus"][0]["processes"][0]["torch"]["gap_bytes"],
        512 * MIB
    );
    assert_eq!(v["gpus"][0]["processes"][0]["torch"]["step"], 41);
    v
}

#[test]
fn once_openmetrics_equals_once_json() {
    let w = World::new("once");
    let json = json_once(&w);
    let out = w.run(&["--once", "--format", "openmetrics"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("# TYPE memlens_gpu_memory_used_bytes gauge\n"),
        "{text}"
    );
    assert!(
        text.contains("memlens_process_fragmentation_ratio{"),
        "{text}"
    );
    assert_matches_json(&parse(&text), &json);
}

#[test]
fn serve_is_scraped_on_loopback_and_equals_once_json() {
    let w = World::new("serve");
    let json = json_once(&w);
    let mut server = w
        .top()
        .args(["--serve", "127.0.0.1:0", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("memlens top: serving OpenMetrics at http://")
        .unwrap_or_else(|| panic!("first line: {first:?}"));
    let addr = url.strip_suffix("/metrics").unwrap();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(
            head.contains(
                "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"
            ),
            "{head}"
        );
        assert_matches_json(&parse(body), &json);
    }
    // --count 2: it stops by itself after the second scrape.
    let status = server.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn serve_refuses_an_address_it_cannot_bind() {
    let w = World::new("bad");
    let o = w
        .top()
        .args(["--serve", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--serve not-an-address: cannot listen"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
