//! Hostile sizes (issue 15 item 2): every command, run as the `memlens`
//! binary of a test build (overflow checks on), gives exit 2 with one line
//! naming the file, or a correct answer. Never a panic.

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};

const GIB: u64 = 1 << 30;
const BASE: u64 = 0x7f00_0000_0000;

fn memlens(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args(args)
        .output()
        .expect("memlens runs")
}

fn block(address: u64, size: Value, requested: Value, state: &str) -> Value {
    json!({"address": address, "size": size, "requested_size": requested, "state": state,
           "frames": [{"filename": "train.py", "line": 7, "name": "step"}]})
}

fn segment(address: u64, total: Value, blocks: Vec<Value>) -> Value {
    json!({"device": 0, "address": address, "total_size": total, "allocated_size": 0,
           "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
           "segment_pool_id": [0, 0], "is_expandable": false, "frames": [], "blocks": blocks})
}

fn event(action: &str, addr: Value, size: Value) -> Value {
    json!({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1,
           "frames": [{"filename": "train.py", "line": 9, "name": "step"}]})
}

fn snapshot(segments: Vec<Value>, trace: Vec<Value>) -> Value {
    json!({"segments": segments, "device_traces": [trace],
           "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}})
}

/// Every command that reads a snapshot, with the arguments that make it run.
fn commands(file: &str, dir: &Path) -> Vec<Vec<String>> {
    let report = dir.join("r.html").to_string_lossy().into_owned();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        s(&["summary", file, "--json"]),
        s(&["peak", file, "--json"]),
        s(&["diff", file, file, "--json"]),
        s(&["leaks", file, "--json"]),
        s(&["oom", file, "--json"]),
        s(&["simulate", file, "--json"]),
        s(&[
            "simulate",
            file,
            "--json",
            "--config",
            "expandable_segments:True",
        ]),
        s(&["tune", file, "--json"]),
        s(&["check", file, "--max-peak", "1GiB", "--json"]),
        s(&["doctor", file, "--no-report", "--json"]),
        s(&["report", file, "-o", &report]),
    ]
}

/// Runs every command on `doc`; returns the exit codes. Exit 2 must come with
/// one line naming the file; nothing may panic.
fn run_all(name: &str, doc: &Value) -> Vec<(String, i32, String)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{name}.json"));
    std::fs::write(&path, doc.to_string()).expect("write");
    let file = path.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for args in commands(&file, dir.path()) {
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = memlens(&argv);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let code = o.status.code().unwrap_or(-1);
        assert!(!err.contains("panicked"), "{name} {argv:?}: {err}");
        assert!(matches!(code, 0..=2), "{name} {argv:?}: exit {code} {err}");
        if code == 2 {
            assert_eq!(err.lines().count(), 1, "{name} {argv:?}: {err}");
            assert!(err.contains(&file), "{name} {argv:?}: {err}");
        }
        out.push((argv[0].to_string(), code, err));
    }
    out
}

/// Every command rejects the file with exit 2 and a line containing `needle`.
fn assert_rejected(name: &str, doc: &Value, needle: &str) {
    for (cmd, code, err) in run_all(name, doc) {
        assert_eq!(code, 2, "{name} {cmd}: {err}");
        assert!(
            err.contains(needle),
            "{name} {cmd}: {err} should say {needle}"
        );
    }
}

#[test]
fn u64_max_sizes_are_rejected() {
    let doc = snapshot(
        vec![segment(
            BASE,
            json!(u64::MAX),
            vec![block(BASE, json!(u64::MAX), json!(1), "active_allocated")],
        )],
        vec![],
    );
    assert_rejected("segmax", &doc, "impossible size");
    let doc = snapshot(vec![], vec![event("alloc", json!(BASE), json!(u64::MAX))]);
    assert_rejected("evmax", &doc, "impossible size");
    let doc = snapshot(
        vec![],
        vec![event("alloc", json!(u64::MAX - 10), json!(512))],
    );
    assert_rejected("addrmax", &doc, "past any GPU address");
}

#[test]
fn negative_values_are_rejected_not_dropped() {
    let doc = snapshot(
        vec![],
        vec![
            event("alloc", json!(BASE), json!(1024)),
            event("alloc", json!(BASE + 1024), json!(-5)),
        ],
    );
    assert_rejected("negsize", &doc, "size = -5");
    let doc = snapshot(vec![], vec![event("alloc", json!(-4096), json!(512))]);
    assert_rejected("negaddr", &doc, "addr = -4096");
    let doc = snapshot(
        vec![segment(
            BASE,
            json!(2 * GIB),
            vec![block(BASE, json!(2 * GIB), json!(-1), "active_allocated")],
        )],
        vec![],
    );
    assert_rejected("negreq", &doc, "requested_size");
    // The value is named, not only its type (issue 31 item 9).
    let doc = snapshot(vec![segment(BASE, json!(-2_097_152), vec![])], vec![]);
    assert_rejected("negseg", &doc, "total_size = -2097152,");
}

#[test]
fn impossible_layouts_are_rejected() {
    let overlap = snapshot(
        vec![segment(
            BASE,
            json!(2 * GIB),
            vec![
                block(BASE, json!(GIB + 4096), json!(GIB), "active_allocated"),
                block(BASE + GIB, json!(GIB), json!(GIB), "inactive"),
            ],
        )],
        vec![],
    );
    assert_rejected("overlap", &overlap, "overlaps the block before it");
    let past_end = snapshot(
        vec![segment(
            BASE,
            json!(GIB),
            vec![block(BASE, json!(2 * GIB), json!(GIB), "active_allocated")],
        )],
        vec![],
    );
    assert_rejected("pastend", &past_end, "past the end of its segment");
    let segs = snapshot(
        vec![
            segment(
                BASE,
                json!(2 * GIB),
                vec![block(BASE, json!(2 * GIB), json!(GIB), "inactive")],
            ),
            segment(
                BASE + GIB,
                json!(2 * GIB),
                vec![block(BASE + GIB, json!(2 * GIB), json!(GIB), "inactive")],
            ),
        ],
        vec![],
    );
    assert_rejected("segoverlap", &segs, "overlap on device 0");
    let greedy = snapshot(
        vec![segment(
            BASE,
            json!(GIB),
            vec![block(BASE, json!(GIB), json!(GIB + 1), "active_allocated")],
        )],
        vec![],
    );
    assert_rejected("greedy", &greedy, "larger than its size");
}

#[test]
fn sums_past_2_pow_64_are_rejected() {
    // Alloc, free_requested, free_completed of 2^48 bytes at one address,
    // 21,846 times over: each size is possible, their sum is past 2^64.
    let n = (1u128 << 64 >> 48) as u64 / 3 + 1;
    let trace: Vec<Value> = (0..n)
        .flat_map(|_| {
            ["alloc", "free_requested", "free_completed"]
                .map(|a| event(a, json!(BASE), json!(1u64 << 48)))
        })
        .collect();
    let doc = snapshot(vec![], trace);
    assert_rejected("sum64", &doc, "sum to");
}

/// Large but possible figures (a thousand allocations of 2^47 bytes, never
/// freed: 2^57 live, then an OOM) give the right answer, computed without
/// overflow, from every command.
#[test]
fn huge_but_possible_sizes_give_correct_answers() {
    let n = 1000u64;
    let size = 1u64 << 47;
    let mut trace: Vec<Value> = (0..n)
        .map(|i| event("alloc", json!(BASE + i * size), json!(size)))
        .collect();
    // And then an OOM asking for one more.
    trace.push(
        json!({"action": "oom", "device_free": 1u64 << 40, "size": size,
                      "stream": 0, "time_us": 2}),
    );
    let doc = snapshot(vec![], trace);
    let results = run_all("huge", &doc);
    for (cmd, code, err) in &results {
        assert!(*code == 0 || *code == 1, "{cmd}: exit {code} {err}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huge.json");
    std::fs::write(&path, doc.to_string()).expect("write");
    let out = memlens(&["peak", &path.to_string_lossy(), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("peak json");
    assert_eq!(v["peak_allocated_bytes"].as_u64(), Some(n * size));
    let out = memlens(&["summary", &path.to_string_lossy(), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("summary json");
    assert_eq!(v["trace_events"].as_u64(), Some(n + 1));
}

/// Frees of addresses never allocated, and frees larger than their
/// allocation, are answered without an underflow.
#[test]
fn frees_that_do_not_match_are_answered() {
    let doc = snapshot(
        vec![],
        vec![
            event("free_requested", json!(BASE), json!(GIB)),
            event("free_completed", json!(BASE), json!(GIB)),
            event("alloc", json!(BASE + 4 * GIB), json!(512)),
            event("free_requested", json!(BASE + 4 * GIB), json!(GIB)),
            event("free_completed", json!(BASE + 4 * GIB), json!(GIB)),
            event("segment_free", json!(BASE + 8 * GIB), json!(GIB)),
        ],
    );
    for (cmd, code, err) in run_all("frees", &doc) {
        assert!(code <= 2, "{cmd}: {err}");
    }
}

#[test]
fn an_empty_list_is_not_a_snapshot() {
    assert_rejected("emptylist", &json!([]), "empty list");
}

/// The bombs of `crates/memlens/tests/bombs.rs` through the binary: a 10-byte
/// file claiming a 1 GB string (refused at its length, past the 64 MiB limit
/// on one string), and 20 million zeros under an unused key of a
/// JSON snapshot. Every command exits 2 with one line.
#[test]
fn bombs_exit_2_from_every_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tiny = dir.path().join("tiny.pickle");
    std::fs::write(
        &tiny,
        [0x80, 4, b'X', 0xff, 0xff, 0xff, 0x3f, b'a', b'b', b'c'],
    )
    .expect("write");
    let mut text = b"{\"segments\": [], \"junk\": [0".to_vec();
    text.extend_from_slice(&b",0".repeat(20 << 20));
    text.extend_from_slice(b"]}");
    let json = dir.path().join("bomb.json");
    std::fs::write(&json, text).expect("write");
    for (path, needle) in [(&tiny, "64 MiB limit"), (&json, "decompression bomb")] {
        let file = path.to_string_lossy().into_owned();
        for args in commands(&file, dir.path()) {
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = memlens(&argv);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{argv:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{argv:?}: {err}");
            assert!(
                err.contains(&file) && err.contains(needle),
                "{argv:?}: {err}"
            );
        }
    }
}

/// One block of a zstd frame written by hand ([`zstd_frame`]).
enum Part<'a> {
    /// Bytes stored as they are.
    Raw(&'a [u8]),
    /// One byte repeated: 4 bytes of frame per 128 KiB.
    Rle(u8, u64),
}

/// A zstd frame of raw and RLE blocks (RFC 8878): a few hundred KB that
/// decompress to gigabytes, written in no time (a compressor would take
/// seconds a gigabyte).
fn zstd_frame(parts: &[Part]) -> Vec<u8> {
    const MAX_BLOCK: u64 = 128 << 10;
    // Magic; no content size, checksum or dictionary; a 128 KiB window.
    let mut out = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 7 << 3];
    let mut blocks: Vec<(u32, u32, Vec<u8>)> = Vec::new(); // (type, size, content)
    for p in parts {
        match p {
            Part::Raw(b) => {
                for c in b.chunks(MAX_BLOCK as usize) {
                    blocks.push((0, c.len() as u32, c.to_vec()));
                }
            }
            Part::Rle(byte, mut n) => {
                while n > 0 {
                    let k = n.min(MAX_BLOCK);
                    blocks.push((1, k as u32, vec![*byte]));
                    n -= k;
                }
            }
        }
    }
    let last = blocks.len() - 1;
    for (i, (kind, size, content)) in blocks.into_iter().enumerate() {
        let header = (size << 3) | (kind << 1) | (i == last) as u32;
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.extend_from_slice(&content);
    }
    out
}

/// Runs memlens with its address space limited to `kib` KiB (`ulimit -v`).
fn memlens_limited(kib: u64, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_memlens"))
        .args(args)
        .output()
        .expect("sh runs")
}

/// Issue 31 item 7: a 650 KB zstd holding twenty strings of nearly 1 GiB
/// each. Under a 2 GiB address-space limit the process aborted (allocation
/// failure, exit 134); now the first string is refused at its length.
#[test]
fn twenty_gigabyte_strings_exit_2_under_a_2_gib_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("strings.pickle.zst");
    let len: u32 = (1 << 30) - 4096;
    let head = [0x80, 4];
    let op: Vec<u8> = [b'X'].into_iter().chain(len.to_le_bytes()).collect();
    let mut parts = vec![Part::Raw(&head)];
    for _ in 0..20 {
        parts.push(Part::Raw(&op));
        parts.push(Part::Rle(b'a', len as u64));
    }
    parts.push(Part::Raw(b"."));
    let frame = zstd_frame(&parts);
    assert!(frame.len() < 700 << 10, "{} bytes", frame.len());
    std::fs::write(&path, &frame).expect("write");
    let file = path.to_string_lossy().into_owned();
    for cmd in ["summary", "peak"] {
        let o = memlens_limited(2 << 20, &[cmd, &file]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert_eq!(err.lines().count(), 1, "{cmd}: {err}");
        assert!(
            err.contains(&file) && err.contains("64 MiB limit"),
            "{cmd}: {err}"
        );
    }
}

/// Issue 31 item 7: half a billion pushes and pops (`NONE POP`, 1 GiB) in
/// 50 KB of zstd used to be read to the end (seconds of work) before being
/// refused; the reader now stops once the stream passes 1000 times the size
/// of the file (at 256 MiB here).
#[test]
fn a_billion_pushes_and_pops_are_refused_early() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pushpop.pickle.zst");
    let f = std::fs::File::create(&path).expect("create");
    let mut enc = zstd::stream::write::Encoder::new(f, 1).expect("encoder");
    enc.write_all(&[0x80, 4]).expect("write");
    let chunk = b"N0".repeat(1 << 19);
    for _ in 0..(1 << 10) {
        enc.write_all(&chunk).expect("write");
    }
    enc.write_all(b"N.").expect("write");
    enc.finish().expect("finish");
    let size = std::fs::metadata(&path).expect("meta").len();
    assert!(size < 256 << 10, "{size} bytes");
    let file = path.to_string_lossy().into_owned();
    let t = std::time::Instant::now();
    let o = memlens(&["summary", &file]);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("refused in {:?}: {err}", t.elapsed());
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&file) && err.contains("more than 1000 times its size"),
        "{err}"
    );
}

/// Issue 31 item 7: strings under the 64 MiB limit, forty of them (2.4 GB)
/// in a plain pickle (sparse on disk: they are zeros). Each one was held
/// until the next container, and the process aborted under a 2 GiB
/// address-space limit; now a long string is checked against the memory
/// budget at once, and the second one is refused.
#[test]
fn forty_long_strings_in_a_plain_file_are_refused_at_the_budget() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("strings.pickle");
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(&[0x80, 4]).expect("write");
    for i in 0..40u32 {
        let len = (60 << 20) + i; // distinct strings: none is interned twice
        f.write_all(b"X").expect("write");
        f.write_all(&len.to_le_bytes()).expect("write");
        f.seek(SeekFrom::Current(len as i64)).expect("seek");
    }
    f.write_all(b".").expect("write");
    drop(f);
    let file = path.to_string_lossy().into_owned();
    let o = memlens_limited(2 << 20, &["summary", &file]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&file) && err.contains("decompression bomb"),
        "{err}"
    );
}
