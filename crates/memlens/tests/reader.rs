//! The snapshot reader and `summary` on the real fixtures (issue 2's acceptance).

mod common;

use common::{fixture, stats, FIXTURES};
use memlens::analysis::summary::summarize;
use memlens::snapshot::Snapshot;
use memlens::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

fn load(name: &str) -> Snapshot {
    let p = fixture(name);
    Snapshot::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn stat(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("stats has no {key}"))
}

/// The final snapshot's state reproduces `torch.cuda.memory_stats()` `.current`.
#[test]
fn summary_matches_memory_stats_of_every_fixture() {
    let mut checked = 0;
    for name in FIXTURES {
        let st = stats(name);
        let ms = &st["memory_stats"];
        if !ms.is_object() {
            continue;
        }
        let s = summarize(&load(&format!("{name}.pickle.zst")));
        assert_eq!(
            s.reserved_bytes,
            stat(ms, "reserved_bytes.all.current"),
            "{name} reserved"
        );
        assert_eq!(
            s.allocated_bytes,
            stat(ms, "allocated_bytes.all.current"),
            "{name} allocated"
        );
        assert_eq!(
            s.active_bytes,
            stat(ms, "active_bytes.all.current"),
            "{name} active"
        );
        assert_eq!(
            s.requested_bytes,
            stat(ms, "requested_bytes.all.current"),
            "{name} requested"
        );
        assert_eq!(
            s.inactive_split_bytes,
            stat(ms, "inactive_split_bytes.all.current"),
            "{name} inactive split"
        );
        assert_eq!(
            s.segments,
            stat(ms, "segment.all.current"),
            "{name} segments"
        );
        checked += 1;
    }
    assert_eq!(checked, FIXTURES.len(), "every fixture has memory_stats");
}

/// The snapshot dumped in the OOM handler matches `stats_at_oom`.
#[test]
fn oom_snapshot_matches_stats_at_oom() {
    let st = stats("oom");
    let ms = &st["stats_at_oom"];
    let s = summarize(&load("oom.at_oom.pickle.zst"));
    assert_eq!(s.reserved_bytes, stat(ms, "reserved_bytes.all.current"));
    assert_eq!(s.allocated_bytes, stat(ms, "allocated_bytes.all.current"));
    assert_eq!(
        s.inactive_split_bytes,
        stat(ms, "inactive_split_bytes.all.current")
    );
    assert_eq!(s.segments, stat(ms, "segment.all.current"));
    assert_eq!(s.trace_events_by_action.get("oom"), Some(&1));
}

#[test]
fn summary_counts_trace_and_settings() {
    let snap = load("varlen@maxsplit64.pickle.zst");
    let s = summarize(&snap);
    assert_eq!(s.allocator_settings.alloc_conf, "max_split_size_mb:64");
    assert_eq!(s.allocator_settings.max_split_size, Some(64 << 20));
    assert_eq!(s.trace_events, snap.event_count() as u64);
    assert_eq!(
        s.trace_events_by_action.values().sum::<u64>(),
        s.trace_events
    );
    assert_eq!(s.frees_without_alloc, 0);
    let exp = summarize(&load("varlen@expandable.pickle.zst"));
    assert!(exp.allocator_settings.expandable_segments);
    assert_eq!(
        exp.segments, 0,
        "expandable ranges are not cudaMalloc segments"
    );
    assert!(exp.expandable_ranges > 0);
}

#[test]
fn frames_and_stacks_are_interned() {
    let snap = load("gpt2_train.pickle.zst");
    let alloc = snap.traces[0]
        .events
        .iter()
        .find(|e| e.action == memlens::snapshot::Action::Alloc)
        .expect("an alloc");
    let frames = snap.stack(alloc.stack);
    assert!(!frames.is_empty());
    assert!(frames
        .iter()
        .any(|&f| snap.str(snap.frame(f).filename) == "/home/user/train/workloads.py"));
    // Far fewer distinct stacks than events: sharing was kept.
    assert!(snap.stack_ranges.len() * 4 < snap.event_count());
    assert!(snap
        .annotations
        .iter()
        .any(|a| snap.str(a.name).contains("AdamW")));
}

#[test]
fn embedded_example_loads() {
    let snap = Snapshot::example();
    assert!(snap.event_count() > 1000);
}

// ---- the same snapshot in every container and protocol ----

/// A canonical text form of everything the model holds, with stacks spelled
/// out, so two reads can be compared whatever their interning order.
fn canon(s: &Snapshot) -> Vec<String> {
    let stack = |id: u32| -> String {
        s.stack(id)
            .iter()
            .map(|&f| {
                let fr = s.frame(f);
                format!("{}:{}:{}", s.str(fr.filename), fr.line, s.str(fr.name))
            })
            .collect::<Vec<_>>()
            .join("|")
    };
    let mut out = Vec::new();
    for seg in &s.segments {
        out.push(format!(
            "seg {} {} {} {} {} {} {} {:?} {:?} {} {}",
            seg.device,
            seg.address,
            seg.total_size,
            seg.allocated_size,
            seg.active_size,
            seg.requested_size,
            s.stream(seg.stream),
            seg.pool,
            seg.pool_id,
            seg.is_expandable,
            stack(seg.stack)
        ));
        for b in &seg.blocks {
            out.push(format!(
                " blk {} {} {} {:?} {}",
                b.address,
                b.size,
                b.requested_size,
                b.state,
                stack(b.stack)
            ));
        }
    }
    for t in &s.traces {
        out.push(format!("device {}", t.device));
        for e in &t.events {
            out.push(format!(
                " ev {:?} {} {} {} {} {} {}",
                e.action,
                e.addr,
                e.size,
                e.time_us,
                s.stream(e.stream),
                e.flags,
                stack(e.stack)
            ));
        }
    }
    for a in &s.annotations {
        out.push(format!(
            "ann {} {} {} {}",
            a.device,
            a.time_us,
            s.str(a.name),
            a.start
        ));
    }
    out.push(format!("{:?}", s.settings));
    out
}

/// Writes the raw pickle of a fixture and its Python-made variants into `dir`.
fn variants(name: &str, dir: &Path) -> Vec<PathBuf> {
    let zst = std::fs::read(fixture(&format!("{name}.pickle.zst"))).expect("fixture");
    let raw = zstd::decode_all(&zst[..]).expect("zstd");
    let raw_path = dir.join(format!("{name}.pickle"));
    std::fs::write(&raw_path, raw).expect("write");
    let script = r#"
import gzip, json, pickle, sys
src = sys.argv[1]
data = pickle.load(open(src, "rb"))
with gzip.open(src + ".gz", "wb") as f:
    f.write(open(src, "rb").read())
for proto in (2, 5):
    with open(src + f".p{proto}", "wb") as f:
        pickle.dump(data, f, protocol=proto)
with open(src + ".json", "w") as f:
    json.dump(data, f)
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&raw_path)
        .status()
        .expect("python3 runs (the tests need it to make variants)");
    assert!(status.success());
    let base = raw_path.to_string_lossy().to_string();
    [".gz", ".p2", ".p5", ".json"]
        .iter()
        .map(|ext| PathBuf::from(format!("{base}{ext}")))
        .chain(std::iter::once(raw_path))
        .collect()
}

#[test]
fn every_container_and_protocol_reads_identically() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in [
        "gpt2_train",
        "oom.at_oom",
        "varlen@expandable",
        "cache_leak.step1",
    ] {
        let reference = canon(&load(&format!("{name}.pickle.zst")));
        for path in variants(name, dir.path()) {
            let snap = Snapshot::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let got = canon(&snap);
            assert_eq!(got.len(), reference.len(), "{}", path.display());
            for (a, b) in got.iter().zip(&reference) {
                assert_eq!(a, b, "{}", path.display());
            }
        }
    }
}

#[test]
fn legacy_bare_list_of_segments_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("legacy.pickle");
    // The PyTorch <= 2.0 form: a bare list of segments whose blocks carry history.
    let script = r#"
import pickle, sys
frames = [{"filename": "train.py", "line": 12, "name": "step"}]
seg = {"device": 0, "address": 1 << 40, "total_size": 2097152, "allocated_size": 1024,
       "active_size": 1024, "stream": 0, "segment_type": "small",
       "blocks": [{"size": 1024, "state": "active_allocated",
                   "history": [{"addr": 1 << 40, "real_size": 1000, "frames": frames}]},
                  {"size": 2096128, "state": "inactive"}]}
pickle.dump([seg], open(sys.argv[1], "wb"), protocol=2)
"#;
    assert!(Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&path)
        .status()
        .unwrap()
        .success());
    let snap = Snapshot::load(&path).expect("legacy reads");
    assert!(snap.legacy);
    let s = summarize(&snap);
    assert_eq!(s.reserved_bytes, 2097152);
    assert_eq!(s.allocated_bytes, 1024);
    assert_eq!(s.requested_bytes, 1000);
    assert_eq!(s.inactive_split_bytes, 2096128);
    let b = snap.segments[0].blocks[0];
    assert_eq!(snap.frame_location(snap.stack(b.stack)[0]), "train.py:12");
    assert_eq!(snap.segments[0].blocks[1].address, (1 << 40) + 1024);
    assert!(s.warnings.iter().any(|w| w.contains("legacy")));
}

/// Rewrites a fixture's final state in the legacy (torch ~1.13-2.0) form of
/// the internals doc: blocks `{size, state, history}` with
/// `history = [{addr, real_size, frames}]`, segments without `requested_size`
/// or `frames`. `form` is `list` (the bare list of segments) or `dict` (a
/// dict whose trace holds only a `snapshot` entry). A second, older history
/// entry is appended to show that `history[0]` is the one read.
fn legacy_variant(name: &str, form: &str, dir: &Path) -> PathBuf {
    let zst = std::fs::read(fixture(&format!("{name}.pickle.zst"))).expect("fixture");
    let raw = zstd::decode_all(&zst[..]).expect("zstd");
    let src = dir.join(format!("{name}.pickle"));
    std::fs::write(&src, raw).expect("write");
    let dst = dir.join(format!("{name}.legacy-{form}.pickle"));
    let script = r#"
import pickle, sys
src, dst, form = sys.argv[1], sys.argv[2], sys.argv[3]
data = pickle.load(open(src, "rb"))
old = [{"filename": "old.py", "line": 1, "name": "stale"}]
segs = []
for s in data["segments"]:
    seg = {k: s[k] for k in ("device", "address", "total_size", "allocated_size",
                             "active_size", "stream", "segment_type")}
    seg["blocks"] = []
    for b in s["blocks"]:
        nb = {"size": b["size"], "state": b["state"]}
        if b["state"] != "inactive":
            nb["history"] = [{"addr": b["address"], "real_size": b["requested_size"],
                              "frames": b.get("frames", [])},
                             {"addr": b["address"], "real_size": 1, "frames": old}]
        seg["blocks"].append(nb)
    segs.append(seg)
total_active = sum(s["active_size"] for s in segs)
out = segs if form == "list" else {
    "segments": segs,
    "device_traces": [[{"action": "snapshot", "addr": 0, "size": total_active, "stream": 0}]],
}
pickle.dump(out, open(dst, "wb"), protocol=2)
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&src)
        .arg(&dst)
        .arg(form)
        .status()
        .expect("python3 runs (the tests need it to make legacy variants)");
    assert!(status.success());
    dst
}

/// Each block as `address size state requested stack`, stacks spelled out;
/// requested sizes and stacks of free blocks are stale and left out.
fn blocks_canon(s: &Snapshot) -> Vec<String> {
    s.segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .map(|b| {
            let live = b.state != memlens::snapshot::BlockState::Inactive;
            let stack: Vec<String> = s
                .stack(b.stack)
                .iter()
                .map(|&f| {
                    let fr = s.frame(f);
                    format!("{}:{}:{}", s.str(fr.filename), fr.line, s.str(fr.name))
                })
                .collect();
            format!(
                "{} {} {:?} {} {}",
                b.address,
                b.size,
                b.state,
                if live { b.requested_size } else { 0 },
                if live { stack.join("|") } else { String::new() }
            )
        })
        .collect()
}

/// Issue 14 item 5: a legacy snapshot's blocks keep their stacks
/// (`history[0].frames`) and requested sizes (`history[0].real_size`), and
/// their sums still match `torch.cuda.memory_stats()` of the run.
#[test]
fn legacy_history_keeps_stacks_and_sizes_of_every_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["gpt2_train", "cache_leak", "oom.at_oom", "varlen"] {
        let modern = load(&format!("{name}.pickle.zst"));
        let want = blocks_canon(&modern);
        let with_stack = modern
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state != memlens::snapshot::BlockState::Inactive)
            .filter(|b| !modern.stack(b.stack).is_empty())
            .count();
        assert!(
            with_stack > 0,
            "{name}: the fixture has live blocks with stacks"
        );
        let stats_name = name.split('.').next().unwrap_or(name);
        let st = stats(stats_name);
        let ms = if name.ends_with("at_oom") {
            &st["stats_at_oom"]
        } else {
            &st["memory_stats"]
        };
        for form in ["list", "dict"] {
            let path = legacy_variant(name, form, dir.path());
            let snap = Snapshot::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(snap.legacy, "{name} {form}");
            assert_eq!(blocks_canon(&snap), want, "{name} {form}");
            let s = summarize(&snap);
            assert_eq!(s.reserved_bytes, stat(ms, "reserved_bytes.all.current"));
            assert_eq!(s.allocated_bytes, stat(ms, "allocated_bytes.all.current"));
            assert_eq!(s.requested_bytes, stat(ms, "requested_bytes.all.current"));
            assert_eq!(
                s.inactive_split_bytes,
                stat(ms, "inactive_split_bytes.all.current")
            );
            assert!(s.warnings.iter().any(|w| w.contains("legacy")));
            assert!(
                !s.warnings
                    .iter()
                    .any(|w| w.contains("no stacks were recorded")),
                "{name} {form}: the stacks are in the blocks"
            );
            assert!(!snap.has_allocation_trace(), "{name} {form}");
            if form == "dict" {
                assert_eq!(snap.event_count(), 1);
                assert!(s.warnings.iter().any(|w| w.contains("only `snapshot`")));
            }
        }
    }
}

/// `load_many` reads files in parallel and gives each file's own result, in
/// order: the same model as one `load` each, and a bad file's error in place.
#[test]
fn load_many_equals_one_load_each() {
    let names = [
        "cache_leak.step1.pickle.zst",
        "cache_leak.step5.pickle.zst",
        "cache_leak.step9.pickle.zst",
        "no-such-file.pickle",
        "cache_leak.pickle.zst",
    ];
    let paths: Vec<PathBuf> = names.iter().map(|n| fixture(n)).collect();
    let many = Snapshot::load_many(&paths);
    assert_eq!(many.len(), names.len());
    for (name, got) in names.iter().zip(many) {
        if name.starts_with("no-such") {
            let e = got.expect_err("missing file");
            assert!(e.to_string().contains("no such file"), "{e}");
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(canon(&got), canon(&load(name)), "{name}");
    }
}

// ---- bad input ----

fn err_of(bytes: &[u8]) -> Error {
    Snapshot::from_bytes(bytes, Path::new("bad.pickle")).expect_err("must fail")
}

#[test]
fn empty_and_garbage_are_clear_errors() {
    assert!(err_of(b"").to_string().contains("empty"));
    let e = err_of(b"PK\x03\x04rest of a zip").to_string();
    assert!(e.starts_with("bad.pickle: not a memory snapshot"), "{e}");
    assert!(e.contains("torch.save"), "{e}");
    let e = err_of(b"hello world").to_string();
    assert!(e.contains("(text)"), "{e}");
    // Valid zstd magic, broken frame.
    let e = err_of(&[0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3]).to_string();
    assert!(e.starts_with("bad.pickle:"), "{e}");
    let e = err_of(b"{\"segments\": [1, 2").to_string();
    assert!(e.contains("invalid JSON"), "{e}");
}

#[test]
fn code_running_pickles_are_refused() {
    // pickle.dumps of a class whose __reduce__ calls os.system.
    let evil = b"\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x02id\x94\x85\x94R\x94.";
    let e = err_of(evil).to_string();
    assert!(e.contains("asks to run code"), "{e}");
    assert!(e.contains("memlens never runs code"), "{e}");
    let global = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.";
    let e = err_of(global).to_string();
    assert!(e.contains("GLOBAL os.system"), "{e}");
}

#[test]
fn pickles_that_are_not_snapshots_say_what_they_are() {
    // pickle.dumps([1, 2, 3], protocol=4)
    let e =
        err_of(b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00]\x94(K\x01K\x02K\x03e.").to_string();
    assert!(e.contains("not a PyTorch memory snapshot"), "{e}");
    assert!(e.contains("segments[0] is a int"), "{e}");
    // pickle.dumps({"model": 1}, protocol=4)
    let e = err_of(b"\x80\x04\x95\r\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x05model\x94K\x01s.")
        .to_string();
    assert!(e.contains("found a dict with keys \"model\""), "{e}");
    // pickle.dumps(42)
    let e = err_of(b"\x80\x04K*.").to_string();
    assert!(e.contains("found a int"), "{e}");
}

#[test]
fn truncation_at_any_byte_is_an_error_not_a_panic() {
    let zst = std::fs::read(fixture("cache_leak.step1.pickle.zst")).unwrap();
    let raw = zstd::decode_all(&zst[..]).unwrap();
    // Every byte of the first 4 KiB, then a stride through the rest.
    let cuts = (0..4096.min(raw.len())).chain((4096..raw.len()).step_by(97));
    for cut in cuts {
        match Snapshot::from_bytes(&raw[..cut], Path::new("t.pickle")) {
            Err(e) => {
                let m = e.to_string();
                assert!(m.starts_with("t.pickle: "), "{m}");
                assert!(!m.contains('\n'), "{m}");
            }
            Ok(_) => panic!("a pickle cut at byte {cut} read as complete"),
        }
    }
    // Truncated compressed files too.
    for cut in [10, zst.len() / 2, zst.len() - 1] {
        assert!(Snapshot::from_bytes(&zst[..cut], Path::new("t.zst")).is_err());
    }
}

#[test]
fn missing_files_directories_and_globs() {
    let e = Snapshot::load(Path::new("/nonexistent/snap.pickle"))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "/nonexistent/snap.pickle: no such file");
    let dir = tempfile::tempdir().unwrap();
    let e = Snapshot::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
    let e = Snapshot::load(&dir.path().join("*.pickle"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("glob pattern"), "{e}");
}

/// A read asked to stop gives up with `Cancelled`, naming the file; left
/// alone, the cancellable read gives the same snapshot as a plain one.
#[test]
fn cancelled_load_stops_with_its_own_error() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let path = fixture("long.pickle.zst");
    let stop = Arc::new(AtomicBool::new(true));
    match Snapshot::load_cancellable(&path, stop) {
        Err(e @ Error::Cancelled { .. }) => {
            assert!(e.to_string().contains("long.pickle.zst"), "{e}");
            assert!(e.to_string().ends_with("reading was cancelled"), "{e}");
        }
        other => panic!(
            "expected Cancelled, got {:?}",
            other.map(|s| s.event_count())
        ),
    }
    let go = Arc::new(AtomicBool::new(false));
    let snap = Snapshot::load_cancellable(&path, go).expect("loads");
    assert_eq!(canon(&snap), canon(&load("long.pickle.zst")));
}

/// Issue 31 item 1: a snapshot pickled with protocol 5 (which PyTorch's web
/// viewer shows as empty) reads like any other. The file is the
/// `checkpointed` fixture loaded with Python's `pickle` and dumped again
/// with `protocol=5` (tests/corpus/proto5).
#[test]
fn a_protocol_5_pickle_reads_like_the_same_snapshot_in_protocol_4() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/proto5/checkpointed.proto5.pickle.zst");
    let five = Snapshot::load(&path).expect("protocol 5 reads");
    let four = load("checkpointed.pickle.zst");
    assert_eq!(
        serde_json::to_value(summarize(&five)).unwrap(),
        serde_json::to_value(summarize(&four)).unwrap()
    );
    let (p5, p4) = (
        memlens::analysis::peak::peak(&five, 20),
        memlens::analysis::peak::peak(&four, 20),
    );
    assert_eq!(
        serde_json::to_value(&p5).unwrap(),
        serde_json::to_value(&p4).unwrap()
    );
    assert!(five.traces.iter().map(|t| t.events.len()).sum::<usize>() > 0);
}
