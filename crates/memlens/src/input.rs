//! Input formats, detected from the bytes (never from the file name): raw
//! pickle, gzip, zstd and JSON. Compressed inputs are decompressed on a second
//! thread while the reader parses, so both cores work.

use crate::error::{Error, Result};
use serde::Serialize;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

/// Which container and format the snapshot came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Container {
    /// An uncompressed pickle.
    Pickle,
    /// A gzip-compressed pickle.
    Gzip,
    /// A zstd-compressed pickle.
    Zstd,
    /// A JSON document.
    Json,
}

/// What kind of input a file is, whatever its container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// A `torch.cuda.memory` snapshot (pickle or JSON).
    Snapshot,
    /// A Chrome trace exported by `torch.profiler` ([`crate::profiler`]).
    ProfilerTrace,
}

/// How far into the decompressed bytes [`kind`] looks for `"traceEvents"`
/// (torch.profiler writes it after a short header of device properties).
const SNIFF_BYTES: usize = 64 << 10;

/// Whether `path` is a snapshot or a profiler trace: a JSON object (in any
/// container) with a `"traceEvents"` key near its start is a trace.
/// A file that cannot be opened is an error (the same one loading it gives);
/// one whose start cannot be decompressed reads as a snapshot, so the
/// snapshot reader reports what is wrong with it, as it always did.
pub fn kind(path: &Path) -> Result<InputKind> {
    Ok(kind_of(&head(path)?))
}

/// The first decompressed bytes of `path` (up to 64 KiB; none when its
/// start cannot be decompressed).
pub fn head(path: &Path) -> Result<Vec<u8>> {
    let (_, mut reader) = open(path)?;
    let mut head = vec![0u8; SNIFF_BYTES];
    let n = read_up_to(&mut reader, &mut head).unwrap_or(0);
    head.truncate(n);
    Ok(head)
}

/// [`kind`] of the first decompressed bytes.
pub fn kind_of(head: &[u8]) -> InputKind {
    let json = head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let needle = b"\"traceEvents\"";
    if json && head.windows(needle.len()).any(|w| w == needle) {
        InputKind::ProfilerTrace
    } else {
        InputKind::Snapshot
    }
}

/// Size of the chunks the decompression thread hands over.
const CHUNK: usize = 1 << 20;

/// Detects the container from the first bytes of a file.
pub fn detect(head: &[u8]) -> Option<Container> {
    match head {
        [0x1f, 0x8b, ..] => Some(Container::Gzip),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Some(Container::Zstd),
        // PROTO (protocol >= 2), or the first opcode of a protocol-1 pickle.
        [0x80, 2..=5, ..] | [b'}' | b']' | b'(', ..] => Some(Container::Pickle),
        _ => {
            let first = head.iter().find(|b| !b.is_ascii_whitespace())?;
            matches!(first, b'{' | b'[').then_some(Container::Json)
        }
    }
}

/// Says what a file that is not a snapshot looks like, for the error message.
pub fn describe_unknown(head: &[u8]) -> String {
    let hex: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let guess = match head {
        [b'P', b'K', 3, 4, ..] => {
            " (a zip archive: a torch.save() checkpoint? memlens reads the memory snapshots written by torch.cuda.memory._dump_snapshot())"
        }
        [0x80, v, ..] if *v > 5 => " (a pickle of an unknown protocol)",
        [0x7f, b'E', b'L', b'F', ..] => " (an executable)",
        [b'%', b'P', b'D', b'F', ..] => " (a PDF document)",
        [b'<', ..] => " (HTML or XML)",
        _ if head.iter().all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) => " (text)",
        _ => "",
    };
    format!(
        "not a memory snapshot: expected a pickle, gzip, zstd or JSON file, found bytes {}{guess}",
        hex.join(" ")
    )
}

/// Opens a snapshot file: checks it is a file, detects its container, and
/// returns a reader of the decompressed bytes.
pub fn open(path: &Path) -> Result<(Container, Box<dyn Read + Send>)> {
    let io_err = |error| Error::Io {
        path: path.into(),
        error,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound && looks_like_glob(path) => {
            return Err(Error::NotAFile {
                path: path.into(),
                what: "no such file; this looks like a glob pattern: pass the snapshot files themselves (your shell expands patterns)".into(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::NotAFile { path: path.into(), what: "no such file".into() })
        }
        Err(e) => return Err(io_err(e)),
    };
    if meta.is_dir() {
        return Err(Error::NotAFile {
            path: path.into(),
            what: "is a directory: pass one or more snapshot files".into(),
        });
    }
    let mut file = File::open(path).map_err(io_err)?;
    let mut head = [0u8; 8];
    let n = read_up_to(&mut file, &mut head).map_err(io_err)?;
    if n == 0 {
        return Err(Error::UnknownFormat {
            path: path.into(),
            what: "the file is empty".into(),
        });
    }
    let container = detect(&head[..n]).ok_or_else(|| Error::UnknownFormat {
        path: path.into(),
        what: describe_unknown(&head[..n]),
    })?;
    let file = File::open(path).map_err(io_err)?;
    Ok((container, decoder(container, file)))
}

/// Files smaller than this are read through a window rather than mapped:
/// mapping costs more than it saves on them.
const MAP_AT_LEAST: u64 = 1 << 20;

/// A plain file read in place through a memory map: no copy from the page
/// cache into a buffer (the largest cost after the opcode loop). Pages the
/// reader has passed are handed back as it goes ([`crate::pickle::Region`]),
/// so they do not stay in the process's resident memory.
pub struct MappedFile {
    /// Shared with the pool threads that hand pages back.
    map: std::sync::Arc<memmap2::Mmap>,
    /// Bytes already handed back (or being).
    released: usize,
}

/// Maps `path` for reading, when it is a regular file of at least
/// 1 MiB and the system maps it; `None` otherwise (the
/// caller then streams it as before).
pub fn map(path: &Path) -> Option<MappedFile> {
    let file = File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() < MAP_AT_LEAST {
        return None;
    }
    // SAFETY: `Mmap::map` is unsafe because the file may change while it is
    // mapped. memlens only reads the bytes and checks every one of them as it
    // would a file's (they are untrusted input anyway): bytes rewritten under
    // it read as a corrupt snapshot and give an error, never unsafety in this
    // program. A file truncated under it while it reads makes the kernel
    // raise SIGBUS at the first page past the new end (the process stops
    // with that signal rather than an error message); PyTorch writes a
    // snapshot once, so this takes a file rewritten while it is being read.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    // The reader goes front to back once: read ahead, and let pages go early.
    let _ = map.advise(memmap2::Advice::Sequential);
    Some(MappedFile {
        map: std::sync::Arc::new(map),
        released: 0,
    })
}

impl crate::pickle::Region for MappedFile {
    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        &self.map
    }

    fn release(&mut self, end: usize) {
        // The pages before `end` leave the process (the page cache keeps
        // them); resident memory stays a few MB of the file, not all of it.
        let end = end.min(self.map.len());
        let Some(len) = end.checked_sub(self.released).filter(|&n| n > 0) else {
            return;
        };
        let (map, from) = (self.map.clone(), self.released);
        self.released = end;
        let give_back = move || {
            // SAFETY: MADV_DONTNEED on a read-only file mapping only unmaps
            // the pages: the mapping was never written, so nothing is lost,
            // and a later access (the reader never goes back) would read the
            // file's page again. The range lies within the map, which this
            // closure holds.
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, len)
            };
        };
        // A reader outside rayon's pool (one file) hands this to the pool:
        // unmapping took 3% of its time (8 ms of 270 on a 16-core host). A
        // reader on a pool thread (files read in parallel) does it itself:
        // its pool may have no idle thread to run it soon, and the pages
        // would stay resident meanwhile.
        if rayon::current_thread_index().is_none() {
            rayon::spawn(give_back);
        } else {
            give_back();
        }
    }
}

/// A reader of the decompressed bytes of `source`.
///
/// The decompressed stream is bounded relative to the compressed one (see
/// [`MAX_RATIO`]): a few hundred KB that expand into gigabytes of opcodes
/// would otherwise cost seconds of work (and memory) before being refused.
pub fn decoder<R: Read + Send + 'static>(container: Container, source: R) -> Box<dyn Read + Send> {
    let read = Arc::new(AtomicU64::new(0));
    let source = Counted {
        inner: source,
        read: read.clone(),
    };
    match container {
        Container::Pickle | Container::Json => Box::new(source.inner),
        Container::Gzip => background(flate2::read::MultiGzDecoder::new(source), read),
        Container::Zstd => match zstd::stream::read::Decoder::new(source) {
            Ok(d) => background(d, read),
            Err(e) => Box::new(FailingReader(Some(e))),
        },
    }
}

/// Most decompressed bytes per compressed byte. Real snapshots compress 6 to
/// 20 times (the fixtures, zstd and gzip); a stream that expands more than
/// this is a decompression bomb, refused once it passes the bound instead of
/// read to its end.
pub const MAX_RATIO: u64 = 1000;

/// Decompressed bytes always allowed, whatever the compressed size (a small
/// file may compress better than a large one).
pub const RATIO_FLOOR: u64 = 256 << 20;

/// Whether `out` decompressed bytes from `read` compressed bytes pass the
/// bound of [`MAX_RATIO`] and [`RATIO_FLOOR`].
fn past_ratio(out: u64, read: u64) -> bool {
    out > RATIO_FLOOR.max(read.saturating_mul(MAX_RATIO))
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A reader that fails (an error the reader reports, not a panic) once
/// `cancel` is set, so a long read can be stopped from another thread.
pub fn cancellable(inner: Box<dyn Read + Send>, cancel: Arc<AtomicBool>) -> Box<dyn Read + Send> {
    Box::new(Cancellable { inner, cancel })
}

struct Cancellable {
    inner: Box<dyn Read + Send>,
    cancel: Arc<AtomicBool>,
}

impl Read for Cancellable {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(io::Error::other("cancelled"));
        }
        self.inner.read(buf)
    }
}

/// Expands the inputs a user named: a folder stands for the snapshot files
/// in it (names holding `.pickle` or `.pkl`, or ending `.zst` or `.gz`; JSON
/// snapshots must be named one by one, as folders of runs hold other JSON),
/// and a pattern with `*` or `?` in its file name (quoted, so the shell did
/// not expand it) for the files it matches. Files are returned as given;
/// those found in a folder or by a pattern sorted by name.
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    Ok(expand_found(paths)?.into_iter().map(|(p, _)| p).collect())
}

/// Whether a file in a folder is taken for a snapshot by its name: it holds
/// `.pickle` or `.pkl`, or ends `.zst` or `.gz`; never the files memlens and
/// its recorder write beside snapshots (`snapshot.pickle.holders.json`, a
/// half-written `snapshot.pickle.123.tmp`).
fn snapshot_name(name: &str) -> bool {
    let beside = name.ends_with(".json") || name.ends_with(".tmp") || name.ends_with(".html");
    !beside
        && (name.contains(".pickle")
            || name.contains(".pkl")
            || name.ends_with(".zst")
            || name.ends_with(".gz"))
}

/// [`expand`], each file with whether it was found (in a folder or by a
/// pattern) rather than named: a found file that is not a snapshot can be
/// skipped with a warning, a named one is an error.
pub fn expand_found(paths: &[PathBuf]) -> Result<Vec<(PathBuf, bool)>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let found = list(p, snapshot_name)?;
            if found.is_empty() {
                return Err(Error::NotAFile {
                    path: p.clone(),
                    what: "a folder with no snapshot files (*.pickle, *.pkl, *.zst, *.gz)".into(),
                });
            }
            out.extend(found.into_iter().map(|f| (f, true)));
        } else if !p.exists() && p.file_name().is_some_and(|n| looks_like_glob(Path::new(n))) {
            let pattern = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let found = if dir.is_dir() {
                list(&dir, |name| wildcard(pattern.as_bytes(), name.as_bytes()))?
            } else {
                Vec::new()
            };
            if found.is_empty() {
                return Err(Error::NotAFile {
                    path: p.clone(),
                    what: "the pattern matches no file".into(),
                });
            }
            out.extend(found.into_iter().map(|f| (f, true)));
        } else {
            out.push((p.clone(), false));
        }
    }
    Ok(out)
}

/// The files of `dir` whose names pass `keep`, sorted by name.
fn list(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let io_err = |error| Error::Io {
        path: dir.into(),
        error,
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.path().is_file() && keep(&name) {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

/// Matches `name` against `pattern`, where `*` is any run of characters and
/// `?` any one character.
fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                back = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match back {
                Some((bp, bn)) => {
                    p = bp + 1;
                    n = bn + 1;
                    back = Some((bp, bn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

fn looks_like_glob(path: &Path) -> bool {
    path.to_string_lossy().contains(['*', '?', '['])
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Runs a decompressor on its own thread and reads its output through a
/// bounded channel of chunks.
/// `read` counts the compressed bytes the decompressor has taken: the output
/// stops with an error once it passes [`MAX_RATIO`] times that.
fn background<R: Read + Send + 'static>(
    mut inner: R,
    read: Arc<AtomicU64>,
) -> Box<dyn Read + Send> {
    let (tx, rx) = sync_channel::<io::Result<Vec<u8>>>(4);
    let mut out = 0u64;
    std::thread::spawn(move || loop {
        let mut chunk = vec![0u8; CHUNK];
        match read_up_to(&mut inner, &mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                out += n as u64;
                let compressed = read.load(Ordering::Relaxed);
                if past_ratio(out, compressed) {
                    let _ = tx.send(Err(io::Error::other(format!(
                        "the file decompresses to more than {MAX_RATIO} times its size (over {} MB from its first {} KB; real snapshots expand about 20 times): a decompression bomb, or not a memory snapshot",
                        out >> 20,
                        compressed.div_ceil(1024)
                    ))));
                    break;
                }
                chunk.truncate(n);
                if tx.send(Ok(chunk)).is_err() {
                    break; // the reader stopped early (an error); nothing to do
                }
            }
            Err(e) => {
                let _ = tx.send(Err(io::Error::new(
                    e.kind(),
                    format!("decompression failed: {e}"),
                )));
                break;
            }
        }
    });
    Box::new(ChannelReader {
        rx,
        chunk: Vec::new(),
        pos: 0,
    })
}

struct ChannelReader {
    rx: Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.chunk.len() {
            match self.rx.recv() {
                Ok(Ok(c)) => {
                    self.chunk = c;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0), // the thread finished: end of stream
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

struct FailingReader(Option<io::Error>);

impl Read for FailingReader {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        match self.0.take() {
            Some(e) => Err(e),
            None => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident KiB of this process's mapping that starts at `addr`, read
    /// from /proc/self/smaps.
    #[cfg(target_os = "linux")]
    fn resident_kib(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut ours = false;
        for line in smaps.lines() {
            let first = line.split(' ').next().unwrap_or_default();
            if let Some((start, _)) = first.split_once('-') {
                if let Ok(start) = usize::from_str_radix(start, 16) {
                    ours = start == addr;
                    continue;
                }
            }
            if let (true, Some(kib)) = (ours, line.strip_prefix("Rss:")) {
                return kib.trim().trim_end_matches("kB").trim().parse().ok();
            }
        }
        None
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pages_the_reader_passed_leave_the_process_on_the_pool_or_at_once() {
        use crate::pickle::Region;
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, &vec![7u8; 16 << 20]).unwrap();
        let mut mapped = map(file.path()).unwrap();
        let addr = mapped.bytes().as_ptr() as usize;
        let sum: u64 = mapped.bytes().iter().step_by(4096).map(|&b| b as u64).sum();
        assert_eq!(sum, 7 * 4096);
        assert!(resident_kib(addr).unwrap() >= 15 << 10);
        // From outside rayon's pool: handed to the pool, done soon after.
        mapped.release(8 << 20);
        let mut left = u64::MAX;
        for _ in 0..500 {
            left = resident_kib(addr).unwrap();
            if left <= 8 << 10 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(left <= 8 << 10, "{left} KiB still resident");
        // On a pool thread: done before release returns.
        rayon::scope(|_| mapped.release(16 << 20));
        assert_eq!(resident_kib(addr), Some(0));
        // The bytes still read the same (a page read again comes back).
        assert_eq!(mapped.bytes()[(16 << 20) - 1], 7);
    }

    #[test]
    fn detects_containers() {
        assert_eq!(detect(&[0x80, 4, 0x95]), Some(Container::Pickle));
        assert_eq!(detect(&[0x1f, 0x8b, 8]), Some(Container::Gzip));
        assert_eq!(detect(&[0x28, 0xb5, 0x2f, 0xfd]), Some(Container::Zstd));
        assert_eq!(detect(b"  {\"segments\""), Some(Container::Json));
        assert_eq!(detect(b"PK\x03\x04"), None);
        assert!(describe_unknown(b"PK\x03\x04").contains("torch.save"));
        assert_eq!(
            kind_of(b"{\n \"schemaVersion\": 1, \"traceEvents\": []}"),
            InputKind::ProfilerTrace
        );
        assert_eq!(kind_of(b"{\"segments\": []}"), InputKind::Snapshot);
        assert_eq!(kind_of(&[0x80, 4, 0x95]), InputKind::Snapshot);
    }

    #[test]
    fn matches_wildcards() {
        assert!(wildcard(b"rank*.pickle.zst", b"rank0.pickle.zst"));
        assert!(wildcard(b"*.rank?.*", b"ddp.rank1.pickle"));
        assert!(!wildcard(b"rank*.pickle", b"rank0.pickle.zst"));
        assert!(wildcard(b"*", b""));
    }

    #[test]
    fn expands_folders_and_patterns() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in [
            "b.rank1.pickle.zst",
            "a.rank0.pickle",
            "notes.txt",
            "x.truth.json",
        ] {
            std::fs::write(dir.path().join(n), b"x").expect("write");
        }
        let got = expand(&[dir.path().to_path_buf()]).expect("folder");
        let names: Vec<_> = got.iter().filter_map(|p| p.file_name()).collect();
        assert_eq!(names, ["a.rank0.pickle", "b.rank1.pickle.zst"]);
        let got = expand(&[dir.path().join("*.rank1.*")]).expect("pattern");
        assert_eq!(got, [dir.path().join("b.rank1.pickle.zst")]);
        assert!(expand(&[dir.path().join("*.nothing")]).is_err());
    }
}
