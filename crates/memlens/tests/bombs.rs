//! Bounded memory on hostile files (issue 15 item 5). Each bomb is read by a
//! child process (this test binary run again, see `child`), which reports its
//! peak RSS (`VmHWM`); the bomb must fail with one clear line, or load, under
//! max(2x the snapshot's useful size, 256 MB). No timing is asserted.

mod common;

use memlens::snapshot::Snapshot;
use std::io::Write;
use std::path::Path;
use std::process::Command;

const CHILD_ENV: &str = "MEMLENS_BOMB_CHILD";
const LIMIT_KB: u64 = 256 * 1024;

/// Run by the parent in a fresh process: loads the file named in the
/// environment and prints the outcome and the peak RSS.
#[test]
fn child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let outcome = match Snapshot::load(Path::new(&path)) {
        Ok(s) => format!(
            "OK events={} segments={}",
            s.event_count(),
            s.segments.len()
        ),
        Err(e) => format!("ERR {e}"),
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    println!("BOMB-OUTCOME {outcome}");
    println!("BOMB-HWM-KB {hwm}");
}

/// Loads `path` in a child process; returns (outcome line, peak RSS in kB).
fn load_in_child(path: &Path) -> (String, u64) {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, path)
        .output()
        .expect("child runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let outcome = text
        .lines()
        .find_map(|l| l.split_once("BOMB-OUTCOME ").map(|x| x.1))
        .unwrap_or_else(|| {
            panic!(
                "child said nothing: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string();
    let hwm = text
        .lines()
        .find_map(|l| l.split_once("BOMB-HWM-KB ").map(|x| x.1))
        .and_then(|v| v.parse().ok())
        .expect("child reports VmHWM");
    eprintln!("{}: {outcome} (peak RSS {hwm} kB)", path.display());
    (outcome, hwm)
}

/// Writes `parts` (yielded lazily) zstd-compressed into `path`; returns the
/// decoded and the compressed sizes.
fn write_zstd(path: &Path, parts: impl Iterator<Item = Vec<u8>>) -> (u64, u64) {
    let file = std::fs::File::create(path).expect("create");
    let mut enc = zstd::stream::write::Encoder::new(file, 3).expect("encoder");
    let mut raw = 0u64;
    for p in parts {
        raw += p.len() as u64;
        enc.write_all(&p).expect("write");
    }
    enc.finish().expect("finish");
    (raw, std::fs::metadata(path).expect("meta").len())
}

/// `MARK`, 1000 x `BININT1 1`, `APPENDS`: 1000 small items, 2002 bytes.
fn thousand_ints() -> Vec<u8> {
    let mut v = vec![b'('];
    for _ in 0..1000 {
        v.extend_from_slice(&[b'K', 1]);
    }
    v.push(b'e');
    v
}

const BATCHES: usize = 200_000; // 200 million items

#[test]
fn list_of_200_million_ints_in_a_few_kb_of_zstd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bomb.pickle.zst");
    let head = vec![0x80, 4, b']'];
    let parts = std::iter::once(head)
        .chain(std::iter::repeat_with(thousand_ints).take(BATCHES))
        .chain(std::iter::once(vec![b'.']));
    let (raw, zst) = write_zstd(&path, parts);
    assert!(raw > 400_000_000 && zst < 64 * 1024, "{raw} bytes in {zst}");
    let (outcome, hwm) = load_in_child(&path);
    assert!(outcome.starts_with("ERR "), "{outcome}");
    assert!(outcome.contains("decompression bomb"), "{outcome}");
    assert!(outcome.contains("bomb.pickle.zst"), "{outcome}");
    assert!(hwm < LIMIT_KB, "peak RSS {hwm} kB");
}

/// The same list under a key memlens does not read, inside a real snapshot.
#[test]
fn the_same_under_an_unused_key_of_a_real_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let zst = std::fs::read(common::fixture("gpt2_train.pickle.zst")).expect("fixture");
    let raw = zstd::decode_all(&zst[..]).expect("zstd");
    // PROTO 4, FRAME n, EMPTY_DICT, MEMOIZE, MARK: the top-level dict's items
    // start right after that MARK.
    assert_eq!(&raw[..2], &[0x80, 4]);
    assert_eq!(&raw[11..14], b"}\x94(");
    let mut junk = vec![0x8c, 4];
    junk.extend_from_slice(b"junk");
    junk.push(b']');
    let path = dir.path().join("bomb-in-snapshot.pickle.zst");
    let parts = std::iter::once(raw[..14].to_vec())
        .chain(std::iter::once(junk))
        .chain(std::iter::repeat_with(thousand_ints).take(BATCHES))
        .chain(std::iter::once(raw[14..].to_vec()));
    write_zstd(&path, parts);
    let (outcome, hwm) = load_in_child(&path);
    // Failing is allowed; loading is too, but only with the real content.
    if let Some(ok) = outcome.strip_prefix("OK ") {
        let real = Snapshot::load(&common::fixture("gpt2_train.pickle.zst")).expect("fixture");
        assert_eq!(
            ok,
            format!(
                "events={} segments={}",
                real.event_count(),
                real.segments.len()
            )
        );
    } else {
        assert!(outcome.contains("decompression bomb"), "{outcome}");
    }
    assert!(hwm < LIMIT_KB, "peak RSS {hwm} kB");
}

#[test]
fn memo_bomb_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("memo.pickle.zst");
    // One int, memoized 300 million times.
    let parts = std::iter::once(vec![0x80, 4, b'K', 1])
        .chain(std::iter::repeat_with(|| vec![0x94; 1 << 20]).take(300))
        .chain(std::iter::once(vec![b'.']));
    write_zstd(&path, parts);
    let (outcome, hwm) = load_in_child(&path);
    assert!(outcome.contains("decompression bomb"), "{outcome}");
    assert!(hwm < LIMIT_KB, "peak RSS {hwm} kB");
}

/// JSON is read straight into the builder, under the same budget: 20 million
/// zeros (a 40 MB file) would be 640 MB as a JSON tree.
#[test]
fn json_bomb_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bomb.json");
    let mut text = b"{\"segments\": [], \"junk\": [0".to_vec();
    text.extend_from_slice(&b",0".repeat(20 << 20));
    text.extend_from_slice(b"]}");
    std::fs::write(&path, text).expect("write");
    let (outcome, hwm) = load_in_child(&path);
    assert!(outcome.contains("decompression bomb"), "{outcome}");
    assert!(hwm < LIMIT_KB, "peak RSS {hwm} kB");
}

#[test]
fn ten_byte_file_claiming_a_gigabyte_string() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tiny.pickle");
    // PROTO 4, BINUNICODE of 0x3fffffff bytes, and 3 of them.
    let bytes = [0x80, 4, b'X', 0xff, 0xff, 0xff, 0x3f, b'a', b'b', b'c'];
    std::fs::write(&path, bytes).expect("write");
    let (outcome, hwm) = load_in_child(&path);
    // Refused at its length (past the 64 MiB limit on one string), before
    // anything is read.
    assert!(outcome.contains("64 MiB limit"), "{outcome}");
    assert!(hwm < 64 * 1024, "peak RSS {hwm} kB");
}
