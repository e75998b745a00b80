//! The reader's fast paths for trace entries (`pickle/fast.rs`, and
//! `pickle/entry.rs` within it) give the same snapshot as the general opcode
//! loop: on every real snapshot we have (the fixtures and the test corpus)
//! and on generated pickles that mix the shapes the fast paths read with
//! those they leave to the loop (first frames, odd values, unknown actions,
//! keys out of order, memo puts out of order, cut files). Reading ahead
//! (`pickle/ahead.rs`: entries decoded on other threads before the reader
//! reaches them) is a fourth way, forced on here at any size and in tiny
//! pieces, so that its guesses of where entries start are often wrong.

mod common;

use memlens::pickle::{Limits, ReadAhead};
use memlens::snapshot::build::load_bytes_with;
use memlens::Snapshot;
use std::path::{Path, PathBuf};

/// The ways to read: the general loop alone, the fast path without the
/// entry path, both, and both with entries read ahead.
const WAYS: [(&str, bool, bool, bool); 4] = [
    ("general loop", false, false, false),
    ("fast path", true, false, false),
    ("entry path", true, true, false),
    ("read ahead", true, true, true),
];

/// Reading ahead at any size, in pieces of 1.5 KiB, three at a time.
const AHEAD_ALWAYS: ReadAhead = ReadAhead {
    pieces: 3,
    piece_bytes: 1536,
    min_bytes: 0,
};

fn limits(fast: bool, entry: bool, ahead: bool) -> Limits {
    Limits {
        fast_path: fast,
        entry_path: entry,
        read_ahead: if ahead { AHEAD_ALWAYS } else { ReadAhead::OFF },
        ..Limits::default()
    }
}
/// Every field of two snapshots, compared (strings by their text and id).
fn assert_same(a: &Snapshot, b: &Snapshot, what: &str) {
    assert_eq!(a.segments, b.segments, "{what}: segments");
    assert_eq!(a.traces.len(), b.traces.len(), "{what}: traces");
    for (x, y) in a.traces.iter().zip(&b.traces) {
        assert_eq!(x.device, y.device, "{what}: device");
        assert_eq!(x.events, y.events, "{what}: events");
        assert_eq!(x.extras, y.extras, "{what}: extras");
    }
    assert_eq!(a.settings, b.settings, "{what}: settings");
    assert_eq!(a.annotations, b.annotations, "{what}: annotations");
    assert_eq!(a.frames, b.frames, "{what}: frames");
    assert_eq!(a.stack_ranges, b.stack_ranges, "{what}: stack ranges");
    assert_eq!(a.stack_frames, b.stack_frames, "{what}: stack frames");
    assert_eq!(a.streams, b.streams, "{what}: streams");
    assert_eq!(a.strings.len(), b.strings.len(), "{what}: strings");
    for i in 0..a.strings.len() as u32 {
        assert_eq!(a.strings.get(i), b.strings.get(i), "{what}: string {i}");
    }
    assert_eq!(a.legacy, b.legacy, "{what}: legacy");
    assert_eq!(a.warnings, b.warnings, "{what}: warnings");
}

/// Reads `bytes` every way; all must succeed alike or fail alike.
fn compare(bytes: &[u8], what: &str) -> Option<Snapshot> {
    let name = Path::new(what);
    let [slow, rest @ ..] = WAYS
        .map(|(_, fast, entry, ahead)| load_bytes_with(bytes, name, limits(fast, entry, ahead)));
    for ((way, _, _, _), other) in WAYS[1..].iter().zip(&rest) {
        match (other, &slow) {
            (Ok(f), Ok(s)) => assert_same(f, s, &format!("{what} ({way})")),
            (Err(f), Err(s)) => {
                assert_eq!(
                    f.to_string(),
                    s.to_string(),
                    "{what}: errors differ ({way})"
                )
            }
            (f, s) => panic!(
                "{what}: {way} {:?}, general loop {:?}",
                f.as_ref().map(|_| "ok"),
                s.as_ref().map(|_| "ok")
            ),
        }
    }
    let [_, _, ahead] = rest;
    ahead.ok()
}

fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pickle") || n.ends_with(".pickle.zst") || n.ends_with(".pickle.gz")
        })
        .collect();
    out.sort();
    out
}

/// The pickle inside a compressed snapshot file, `None` for a plain one.
fn decompressed(path: &Path, bytes: &[u8]) -> Option<Vec<u8>> {
    let name = path.to_string_lossy();
    if name.ends_with(".zst") {
        Some(zstd::decode_all(bytes).unwrap_or_else(|e| panic!("{name}: {e}")))
    } else if name.ends_with(".gz") {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(bytes), &mut out)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        Some(out)
    } else {
        None
    }
}

#[test]
fn fast_path_equals_general_loop_on_every_fixture_and_corpus_file() {
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus");
    let mut files = snapshot_files(&common::fixtures_dir());
    files.extend(snapshot_files(&corpus));
    assert!(
        files.len() >= 20,
        "found only {} snapshot files",
        files.len()
    );
    let mut events = 0;
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let snap = compare(&bytes, &f.display().to_string())
            .unwrap_or_else(|| panic!("{} does not read", f.display()));
        events += snap.event_count();
        // A compressed file is streamed: read its pickle in place too, where
        // entries are read ahead.
        if let Some(raw) = decompressed(f, &bytes) {
            compare(&raw, &format!("{} (decompressed)", f.display()))
                .unwrap_or_else(|| panic!("{} does not read decompressed", f.display()));
        }
    }
    // `long` alone holds 449,619 trace entries (BENCHMARKS.md): the fast
    // path had real work to do.
    assert!(events >= 449_619, "{events} events");
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Writes pickles the way CPython's pickler does, with random choices where
/// it has them (MEMOIZE or BINPUT, batch sizes) and some it never makes.
struct Pickler {
    out: Vec<u8>,
    memo: usize,
    strings: Vec<(String, usize)>,
    frames: Vec<usize>,
    lists: Vec<usize>,
    /// Whether to write values that make the snapshot an error.
    errors: bool,
}

impl Pickler {
    fn put(&mut self, rng: &mut Rng) -> usize {
        let i = self.memo;
        self.memo += 1;
        match rng.below(10) {
            0 if i < 256 => self.out.extend([b'q', i as u8]),
            1 => {
                self.out.push(b'r');
                self.out.extend((i as u32).to_le_bytes());
            }
            _ => self.out.push(0x94),
        }
        i
    }
    fn get(&mut self, i: usize, rng: &mut Rng) {
        if i < 256 && rng.chance(90) {
            self.out.extend([b'h', i as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend((i as u32).to_le_bytes());
        }
    }
    fn new_str(&mut self, s: &str, rng: &mut Rng, memoize: bool) {
        if s.len() < 256 && rng.chance(90) {
            self.out.extend([0x8c, s.len() as u8]);
        } else {
            self.out.push(b'X');
            self.out.extend((s.len() as u32).to_le_bytes());
        }
        self.out.extend(s.as_bytes());
        if memoize {
            let i = self.put(rng);
            self.strings.push((s.to_string(), i));
        }
    }
    /// A string: a memo reference when it was written before (as CPython
    /// does for the same object), else written and memoized.
    fn str(&mut self, s: &str, rng: &mut Rng) {
        match self.strings.iter().find(|(t, _)| t == s).map(|x| x.1) {
            Some(i) => self.get(i, rng),
            None => self.new_str(s, rng, true),
        }
    }
    fn int(&mut self, v: i64) {
        if (0..256).contains(&v) {
            self.out.extend([b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend((v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(b'J');
            self.out.extend((v as i32).to_le_bytes());
        } else {
            self.long(&v.to_le_bytes());
        }
    }
    fn long(&mut self, bytes: &[u8]) {
        self.out.extend([0x8a, bytes.len() as u8]);
        self.out.extend(bytes);
    }
    /// A frame dict, written whole the first time.
    fn frame(&mut self, rng: &mut Rng) {
        if !self.frames.is_empty() && rng.chance(90) {
            let i = self.frames[rng.below(self.frames.len() as u64) as usize];
            self.get(i, rng);
            return;
        }
        self.out.push(b'}');
        let i = self.put(rng);
        self.out.push(b'(');
        let n = self.frames.len();
        self.str("filename", rng);
        self.str(&format!("/src/file{}.py", n % 7), rng);
        self.str("line", rng);
        self.int(rng.below(3000) as i64);
        self.str("name", rng);
        self.str(&format!("fn{}", n % 5), rng);
        self.out.push(b'u');
        self.frames.push(i);
    }
    fn frames_value(&mut self, rng: &mut Rng) {
        match rng.below(20) {
            0 if !self.lists.is_empty() => {
                let i = self.lists[rng.below(self.lists.len() as u64) as usize];
                self.get(i, rng);
            }
            1 => self.int(3), // not a list: counted as odd frames
            2 => {
                // A list holding something other than frames.
                self.out.push(b']');
                self.put(rng);
                self.out.push(b'(');
                self.frame(rng);
                self.int(7);
                self.out.push(b'e');
            }
            _ => {
                self.out.push(b']');
                if rng.chance(95) {
                    let i = self.put(rng);
                    self.lists.push(i);
                }
                let n = match rng.below(10) {
                    0 => 0,
                    1 => 1,
                    // Now and then a stack longer than the entry path's
                    // 4 KiB span, or than the fast path's 2,048 frames.
                    2 if rng.chance(3) => 1000 + rng.below(2000) as usize,
                    _ => rng.below(40) as usize,
                };
                if n == 1 && rng.chance(70) {
                    self.frame(rng);
                    self.out.push(b'a');
                } else if n > 0 {
                    // CPython batches appends by 1000; smaller batches here.
                    let batch = 1 + rng.below(16) as usize;
                    let mut left = n;
                    while left > 0 {
                        let k = left.min(batch);
                        self.out.push(b'(');
                        for _ in 0..k {
                            // A long stack of frames read before (a new
                            // frame inline makes the entry the loop's early).
                            match self.frames.len() {
                                f if n >= 1000 && f > 0 => {
                                    let i = self.frames[rng.below(f as u64) as usize];
                                    self.get(i, rng);
                                }
                                _ => self.frame(rng),
                            }
                        }
                        self.out.push(b'e');
                        left -= k;
                    }
                }
            }
        }
    }
    fn event(&mut self, rng: &mut Rng, t: &mut i64) {
        const ACTIONS: [&str; 9] = [
            "alloc",
            "free_requested",
            "free_completed",
            "segment_alloc",
            "segment_free",
            "segment_map",
            "segment_unmap",
            "snapshot",
            "oom",
        ];
        self.out.push(b'}');
        if rng.chance(97) {
            self.put(rng);
        }
        self.out.push(b'(');
        let action = match rng.below(100) {
            0 => "resize", // unknown: skipped with a warning
            _ => ACTIONS[rng.below(9) as usize],
        };
        // `action` first, as PyTorch writes it; sometimes not.
        let mut keys = vec![
            "addr",
            "size",
            "stream",
            "time_us",
            "compile_context",
            "user_metadata",
            "frames",
        ];
        if rng.chance(5) {
            keys.swap(0, rng.below(7) as usize);
        }
        if rng.chance(5) {
            keys.remove(rng.below(keys.len() as u64) as usize);
        }
        // Older PyTorch writes neither compile_context nor user_metadata.
        if rng.chance(5) {
            keys.retain(|k| !matches!(*k, "compile_context" | "user_metadata"));
        }
        // An `oom` entry says `device_free` where others say `addr`; now
        // and then both, or a key twice.
        if action == "oom" && rng.chance(80) {
            for k in keys.iter_mut().filter(|k| **k == "addr") {
                *k = "device_free";
            }
        }
        if rng.chance(2) {
            let k = keys[rng.below(keys.len() as u64) as usize];
            keys.insert(rng.below(keys.len() as u64 + 1) as usize, k);
        }
        if rng.chance(1) {
            keys.push("device_free");
        }
        let action_at = if rng.chance(97) {
            0
        } else {
            rng.below(keys.len() as u64 + 1) as usize
        };
        keys.insert(action_at, "action");
        for key in keys {
            self.str(key, rng);
            match key {
                "action" => self.str(action, rng),
                "addr" | "size" | "device_free" => match rng
                    .below(if self.errors { 200 } else { 2 } + 2)
                {
                    0 if self.errors => self.long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
                    0 => self.long(&(0x7f00_0000_0000 + rng.below(1 << 30) as i64).to_le_bytes()),
                    // Errors, both ways (in a tenth of the snapshots).
                    1 if self.errors => self.int(-5),
                    2 if self.errors => self.out.push(b'N'),
                    3 if self.errors => {
                        self.out.push(b'G');
                        self.out.extend(1.5f64.to_be_bytes());
                    }
                    _ => self.int(rng.below(1 << 30) as i64 * 512),
                },
                "stream" => self.int(if rng.chance(90) {
                    0
                } else {
                    7 + rng.below(3) as i64
                }),
                "time_us" => {
                    *t += rng.below(50) as i64;
                    self.int(*t);
                }
                "compile_context" => match rng.below(20) {
                    0 => self.str("torch_compile", rng),
                    1 => self.out.push(0x88),
                    // PyTorch writes a new "N/A" object each time.
                    _ => {
                        let memoize = rng.chance(80);
                        self.new_str("N/A", rng, memoize)
                    }
                },
                "user_metadata" => match rng.below(20) {
                    0 => self.new_str("step=\u{e9}", rng, true),
                    _ => self.str("", rng),
                },
                _ => self.frames_value(rng),
            }
        }
        self.out.push(b'u');
    }
}

/// A whole snapshot pickle with `n` random trace entries.
fn generate(seed: u64, n: usize) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut p = Pickler {
        out: vec![0x80, 4],
        memo: 0,
        strings: Vec::new(),
        frames: Vec::new(),
        lists: Vec::new(),
        errors: seed.is_multiple_of(10),
    };
    p.out.push(b'}');
    p.put(&mut rng);
    p.out.push(b'(');
    p.str("segments", &mut rng);
    p.out.push(b']');
    p.put(&mut rng);
    p.str("device_traces", &mut rng);
    p.out.push(b']');
    p.put(&mut rng);
    p.out.push(b'(');
    p.out.push(b']');
    p.put(&mut rng);
    let mut t = 1_700_000_000_000_000;
    let mut left = n;
    while left > 0 {
        let k = left.min(1 + rng.below(50) as usize);
        p.out.push(b'(');
        for _ in 0..k {
            p.event(&mut rng, &mut t);
        }
        p.out.push(b'e');
        left -= k;
    }
    p.out.push(b'e');
    p.out.push(b'u');
    p.out.push(b'.');
    p.out
}

#[test]
fn fast_path_equals_general_loop_on_generated_pickles() {
    let (mut read, mut failed, mut events) = (0, 0, 0);
    for seed in 0..300 {
        let bytes = generate(seed, 1 + (seed as usize * 7) % 400);
        match compare(&bytes, &format!("generated-{seed}")) {
            Some(s) => {
                read += 1;
                events += s.event_count();
            }
            None => failed += 1,
        }
    }
    // A tenth of the generated snapshots may hold a negative or missing size
    // (an error both ways); together the rest hold tens of thousands of events.
    assert!(read >= 270, "{read} read, {failed} failed");
    assert!(
        failed >= 10,
        "{read} read, {failed} failed: the error cases ran"
    );
    assert!(events >= 20_000, "{events} events");
}

#[test]
fn fast_path_equals_general_loop_on_cut_pickles() {
    let mut rng = Rng(42);
    for seed in 0..40 {
        let bytes = generate(1000 + seed, 60);
        for _ in 0..25 {
            let cut = 1 + rng.below(bytes.len() as u64 - 1) as usize;
            let got = compare(&bytes[..cut], &format!("generated-{seed}, cut at {cut}"));
            assert!(got.is_none(), "a pickle cut at byte {cut} read as complete");
        }
    }
}

/// A plain file of at least 1 MiB is read through a memory map
/// (`input::map`): the snapshot is the one the streaming reader gives from the
/// same bytes compressed, its figures `memory_stats()`'s, and the same file
/// cut short fails with the streaming reader's message.
#[test]
fn a_mapped_file_reads_as_the_stream_does() {
    use memlens::analysis::summary::summarize;
    let zst = common::fixture("gpt2_train.pickle.zst");
    let raw = zstd::decode_all(std::fs::File::open(&zst).unwrap()).unwrap();
    assert!(raw.len() >= 1 << 20, "large enough to be mapped");
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("gpt2_train.pickle");
    std::fs::write(&plain, &raw).unwrap();
    let mapped = Snapshot::load(&plain).unwrap();
    let streamed = Snapshot::load(&zst).unwrap();
    assert_same(&mapped, &streamed, "gpt2_train mapped");
    let ms = &common::stats("gpt2_train")["memory_stats"];
    let s = summarize(&mapped);
    assert_eq!(
        Some(s.reserved_bytes),
        ms["reserved_bytes.all.current"].as_u64()
    );
    assert_eq!(
        Some(s.allocated_bytes),
        ms["allocated_bytes.all.current"].as_u64()
    );

    // Cut: the map ends where the file does, as the stream does.
    let cut = &raw[..raw.len() - 4099];
    assert!(cut.len() >= 1 << 20, "the cut file is mapped too");
    let cut_plain = dir.path().join("cut.pickle");
    std::fs::write(&cut_plain, cut).unwrap();
    let cut_zst = dir.path().join("cut.pickle.zst");
    std::fs::write(&cut_zst, zstd::encode_all(cut, 3).unwrap()).unwrap();
    let e_map = Snapshot::load(&cut_plain).unwrap_err().to_string();
    let e_stream = Snapshot::load(&cut_zst).unwrap_err().to_string();
    assert!(e_map.contains("truncated"), "{e_map}");
    assert_eq!(
        e_map.replace("cut.pickle", "F"),
        e_stream.replace("cut.pickle.zst", "F")
    );
}
