//! Finding and reading PyTorch's out-of-memory messages in arbitrary text.
//!
//! Users paste the error however they got it: the bare message, a whole Python
//! traceback, a training log with other lines around it, a message wrapped over
//! several lines (each perhaps behind a log prefix such as `[rank0]: `), or a
//! JSON-escaped string with literal `\n`. [`parse`] finds the first message in
//! any of these and reads every figure it prints; [`parse_all`] finds them all.
//!
//! Every message form PyTorch has printed is recognised (section 4 of
//! `docs/pytorch-memory-internals.md`): the current one (link to
//! docs.pytorch.org), 2.2 to 2.9, 2.1 (with its "capacty" typo), the
//! parenthesised form of 1.10 to 2.0 and before, both `cudaMallocAsync` forms,
//! the "more than 1EB" form, and the same texts from other backends (`HIP`,
//! `XPU`, `NPU`, `MUSA`, ...).
//!
//! # Precision
//!
//! PyTorch prints sizes with `format_size`: `"N bytes"` up to 1 KiB, else two
//! decimals of KiB, MiB or GiB. A [`Figure`] keeps both the text as printed and
//! its value in bytes (the printed number times the unit, rounded to the
//! nearest byte). Only the `bytes` form is exact; every other figure is exact
//! only to the printed precision, i.e. within half a hundredth of its unit
//! ([`Figure::bounds`] gives the interval).

use serde::Serialize;

/// A size as the message printed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Figure {
    /// The printed number times its unit, rounded to the nearest byte. Exact
    /// for `"N bytes"`; otherwise exact only to the printed two decimals.
    pub bytes: u64,
    /// The size exactly as printed, e.g. `"449.83 MiB"` or `"0 bytes"`.
    pub text: String,
}

impl Figure {
    /// The smallest and largest byte counts that PyTorch would print as this
    /// figure (two decimals round to within half a hundredth of the unit).
    pub fn bounds(&self) -> (u64, u64) {
        if self.text == MORE_THAN_1EB {
            return (EXABYTE, u64::MAX);
        }
        match parse_size_text(&self.text) {
            Some((_, 1)) | None => (self.bytes, self.bytes),
            Some((value, unit)) => {
                let half = 0.005 * unit as f64;
                let lo = ((value * unit as f64) - half).max(0.0).ceil();
                let hi = ((value * unit as f64) + half).floor();
                (to_u64(lo), to_u64(hi))
            }
        }
    }

    /// Whether `bytes` would be printed as this figure.
    pub fn admits(&self, bytes: u64) -> bool {
        let (lo, hi) = self.bounds();
        (lo..=hi).contains(&bytes)
    }
}

/// Another process using the same GPU, as NVML reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OtherProcess {
    /// Its process id (in NVML's, i.e. the host's, pid namespace).
    pub pid: u64,
    /// Device memory it holds.
    pub used: Figure,
    /// True when this entry is most likely the failing process itself: inside
    /// a container NVML's pids do not match the process's own pid, so PyTorch
    /// prints itself as "Process N has ..." and omits the "this process" line.
    /// Set when the message has no "this process" figure and this entry holds
    /// at least what PyTorch had reserved.
    pub likely_this_process: bool,
}

/// Which text PyTorch used; tells the version range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum MessageForm {
    /// "GPU d has a total capacity of ..." ending with the docs.pytorch.org link.
    #[serde(rename = "current")]
    Current,
    /// The same, ending with the pytorch.org `#environment-variables` link.
    #[serde(rename = "v2_2_to_2_9")]
    V2_2To2_9,
    /// "GPU d has a total capacty of ..." (sic), advising `max_split_size_mb`.
    #[serde(rename = "v2_1")]
    V2_1,
    /// "GPU d has a total capacity of ..." whose version-specific tail is cut
    /// off or unfamiliar (XPU's, for one).
    #[serde(rename = "modern")]
    Modern,
    /// "(GPU d; T total capacity; A already allocated; F free; [M allowed; ]R
    /// reserved in total by PyTorch) If reserved memory is >> allocated ...".
    #[serde(rename = "v1_10_to_2_0")]
    V1_10To2_0,
    /// The parenthesised form ending at "reserved in total by PyTorch)" (or,
    /// before 1.4, "X cached)" where X is the cached-but-unallocated part); a
    /// 1.10-2.0 message cut after the parenthesis reads the same.
    #[serde(rename = "before_1_10")]
    Before1_10,
    /// `backend:cudaMallocAsync`: "Allocation on device d would exceed allowed
    /// memory. (out of memory)" followed by the figures, one per line.
    #[serde(rename = "cuda_malloc_async")]
    CudaMallocAsync,
    /// `backend:cudaMallocAsync`, the first line only (older builds, or a log
    /// that kept one line).
    #[serde(rename = "cuda_malloc_async_short")]
    CudaMallocAsyncShort,
    /// "Tried to allocate more than 1EB memory." (a request of 2^60 bytes or more).
    #[serde(rename = "more_than_1eb")]
    MoreThan1Eb,
}

impl MessageForm {
    /// The PyTorch versions that print this form (approximate, from the
    /// source history).
    pub fn versions(self) -> &'static str {
        match self {
            MessageForm::Current => "2.10 or later",
            MessageForm::V2_2To2_9 => "2.2 to 2.9",
            MessageForm::V2_1 => "2.1",
            MessageForm::Modern => "2.2 or later",
            MessageForm::V1_10To2_0 => "1.10 to 2.0",
            MessageForm::Before1_10 => "before 1.10, or a cut 1.10-2.0 message",
            MessageForm::CudaMallocAsync => "2.0 or later, cudaMallocAsync backend",
            MessageForm::CudaMallocAsyncShort => "2.0 or later, cudaMallocAsync backend",
            MessageForm::MoreThan1Eb => "any version",
        }
    }
}

/// Which PyTorch allocator raised the error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Allocator {
    /// The native caching allocator (the default).
    Native,
    /// `PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`.
    CudaMallocAsync,
}

/// One out-of-memory message and every figure it printed. Fields a form does
/// not print are `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomMessage {
    /// Which text PyTorch used.
    pub form: MessageForm,
    /// The PyTorch versions that print this form (approximate).
    pub pytorch_versions: &'static str,
    /// The backend word before "out of memory": `CUDA`, `HIP` (ROCm), `XPU`,
    /// `NPU`, `MUSA`, ...
    pub device_kind: Option<String>,
    /// Which allocator raised it.
    pub allocator: Allocator,
    /// The device index ("GPU 0", "device 0").
    pub device_index: Option<u32>,
    /// "Tried to allocate X": for the native allocator this is `alloc_size`,
    /// the size of the segment it tried to `cudaMalloc` (the request rounded
    /// up: a 2 MiB tensor prints as 20.00 MiB, a 1 KiB one as 2.00 MiB), not
    /// the tensor's size. For `cudaMallocAsync`, "Requested": the request.
    pub requested: Option<Figure>,
    /// The device's total memory as `cudaMemGetInfo` reports it ("total
    /// capacity", or "Device limit" for `cudaMallocAsync`).
    pub total_capacity: Option<Figure>,
    /// Device memory free at the failure, by `cudaMemGetInfo`.
    pub device_free: Option<Figure>,
    /// "Including non-PyTorch memory, this process has X memory in use" (NVML).
    pub this_process: Option<Figure>,
    /// "Process N has X memory in use", in the printed order.
    pub other_processes: Vec<OtherProcess>,
    /// "X allowed": the cap from `set_per_process_memory_fraction` (for
    /// `cudaMallocAsync`, "PyTorch limit"; when no fraction is set it prints
    /// a huge number, so compare it with the capacity before treating it as
    /// a cap: [`OomMessage::memory_cap`]).
    pub allowed: Option<Figure>,
    /// Memory allocated by PyTorch ("is allocated by PyTorch", "already
    /// allocated", or "Currently allocated"). In the current form it includes
    /// the private-pool figure below.
    pub allocated: Option<Figure>,
    /// "with X allocated in private pools (e.g., CUDA Graphs)": despite the
    /// wording, the free cached blocks of private pools.
    pub private_pools: Option<Figure>,
    /// "X is reserved by PyTorch but unallocated": cached, free, but kept
    /// ("X cached" before 1.4).
    pub reserved_unallocated: Option<Figure>,
    /// "X reserved in total by PyTorch" of the parenthesised forms.
    pub reserved_total: Option<Figure>,
    /// The message as found, with whitespace collapsed and any log prefixes of
    /// continuation lines removed.
    pub text: String,
}

impl OomMessage {
    /// Memory PyTorch had reserved from the device: printed by the older forms,
    /// else allocated + reserved-but-unallocated (for `cudaMallocAsync`, the
    /// allocated figure: it keeps no cache of its own).
    pub fn reserved_bytes(&self) -> Option<u64> {
        if let Some(r) = &self.reserved_total {
            return Some(r.bytes);
        }
        if self.allocator == Allocator::CudaMallocAsync {
            return self.allocated.as_ref().map(|a| a.bytes);
        }
        match (&self.allocated, &self.reserved_unallocated) {
            (Some(a), Some(u)) => Some(a.bytes.saturating_add(u.bytes)),
            _ => None,
        }
    }

    /// Reserved but unallocated memory: printed, or reserved minus allocated
    /// for the older forms.
    pub fn reserved_unallocated_bytes(&self) -> Option<u64> {
        if let Some(u) = &self.reserved_unallocated {
            return Some(u.bytes);
        }
        match (&self.reserved_total, &self.allocated) {
            (Some(r), Some(a)) => Some(r.bytes.saturating_sub(a.bytes)),
            _ => None,
        }
    }

    /// Device memory held by other processes (entries that are likely this
    /// process seen from a container are left out).
    pub fn other_processes_bytes(&self) -> u64 {
        self.other_processes
            .iter()
            .filter(|p| !p.likely_this_process)
            .map(|p| p.used.bytes)
            .sum()
    }

    /// The limits the message printed, as the replay's limit inference takes
    /// them.
    pub fn limits(&self) -> crate::replay::limits::PrintedLimits {
        crate::replay::limits::PrintedLimits {
            memory_cap: self.memory_cap(),
            device_total: self.total_capacity.as_ref().map(|t| t.bytes),
            other_processes: self.other_processes_bytes(),
            origin: crate::replay::limits::LimitsOrigin::Message,
        }
    }

    /// The per-process cap, when one was really set: the "allowed" figure if it
    /// is below the device's capacity (or the capacity is unknown and the
    /// figure is not the "no limit" maximum).
    pub fn memory_cap(&self) -> Option<u64> {
        let allowed = self.allowed.as_ref()?.bytes;
        match &self.total_capacity {
            Some(t) if allowed >= t.bytes => None,
            None if allowed >= EXABYTE => None,
            _ => Some(allowed),
        }
    }
}

/// Finds the first out-of-memory message in `text` and reads it. `None` when
/// the text holds no PyTorch out-of-memory message.
pub fn parse(text: &str) -> Option<OomMessage> {
    parse_all(text).into_iter().next()
}

/// Finds every out-of-memory message in `text`, in order.
pub fn parse_all(text: &str) -> Vec<OomMessage> {
    let norm = normalize(text);
    let lower = norm.to_ascii_lowercase();
    let anchors = find_anchors(&lower);
    let mut out = Vec::new();
    for (i, anchor) in anchors.iter().enumerate() {
        let next = anchors.get(i + 1).map_or(norm.len(), |a| a.start);
        let end = floor_boundary(&norm, next.min(anchor.start + MAX_WINDOW));
        if let Some(m) = read_message(&norm[anchor.start..end], anchor.kind) {
            out.push(m);
        }
    }
    out
}

/// Like [`parse`], with an error that says why nothing was found.
pub fn find(text: &str) -> crate::Result<OomMessage> {
    if let Some(m) = parse(text) {
        return Ok(m);
    }
    let lower = text.to_ascii_lowercase();
    let why = if text.trim().is_empty() {
        "the input is empty".to_string()
    } else if lower.contains("cuda error: out of memory") {
        "this is a CUDA runtime error (\"CUDA error: out of memory\"), raised outside \
         PyTorch's caching allocator (cuBLAS/cuDNN workspaces, NCCL, a CUDA context); \
         it prints no figures to analyse"
            .to_string()
    } else if lower.contains("out of memory") {
        "it mentions \"out of memory\" but holds none of the messages PyTorch's allocators \
         print (\"... out of memory. Tried to allocate ...\", \"Allocation on device N would \
         exceed allowed memory\")"
            .to_string()
    } else {
        "expected text such as \"CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 \
         has a total capacity of ...\""
            .to_string()
    };
    Err(crate::Error::usage(format!(
        "no PyTorch out-of-memory message found: {why}"
    )))
}

// ---------------------------------------------------------------------------
// Normalisation

/// How far past its start a message may reach when nothing ends it sooner.
/// The longest real messages list many processes; 16 KiB is far more.
const MAX_WINDOW: usize = 16 * 1024;

/// The longest log prefix removed from continuation lines.
const MAX_PREFIX: usize = 48;

/// Joins lines into one, collapsing whitespace, after removing from each line
/// the log prefix it shares with the line before (`[rank0]: `, `E   `, `> `,
/// `(VllmWorker rank=1 pid=254) `), and turning literal `\n` escapes into
/// line breaks first.
fn normalize(text: &str) -> String {
    let unescaped = text
        .replace("\\r\\n", "\n")
        .replace("\\n", "\n")
        .replace("\\t", " ");
    let mut out = String::with_capacity(unescaped.len());
    let mut prev: Option<&str> = None;
    for line in unescaped.lines() {
        let body = match prev {
            Some(p) => strip_shared_prefix(p, line),
            None => line,
        };
        prev = Some(line);
        for c in body.chars().chain(std::iter::once(' ')) {
            if c.is_whitespace() {
                if !out.is_empty() && !out.ends_with(' ') {
                    out.push(' ');
                }
            } else {
                out.push(c);
            }
        }
    }
    while out.ends_with(' ') {
        out.pop();
    }
    out
}

/// `line` without the prefix it shares with `prev`, when that prefix looks like
/// a log prefix: it ends in one of `: ] | > # )` and a space within the first
/// [`MAX_PREFIX`] bytes, or is one marker character and spaces (pytest's `E`).
fn strip_shared_prefix<'a>(prev: &str, line: &'a str) -> &'a str {
    let common: usize = prev
        .char_indices()
        .zip(line.chars())
        .take_while(|((_, a), b)| a == b)
        .last()
        .map_or(0, |((i, c), _)| i + c.len_utf8());
    let shared = &line[..floor_boundary(line, common.min(MAX_PREFIX))];
    let mut cut = 0;
    let bytes = shared.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(b, b':' | b']' | b'|' | b'>' | b'#' | b')') && bytes.get(i + 1) == Some(&b' ') {
            cut = i + 2;
        }
    }
    if cut == 0 {
        let mut chars = shared.chars();
        if let (Some(first), Some(second)) = (chars.next(), chars.next()) {
            if (first == 'E' || first.is_ascii_punctuation()) && second.is_whitespace() {
                cut = shared.len() - shared[first.len_utf8()..].trim_start().len();
            }
        }
    }
    &line[cut..]
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

// ---------------------------------------------------------------------------
// Anchors: where messages start

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AnchorKind {
    /// "... out of memory. Tried to allocate".
    Native,
    /// "Allocation on device N would exceed allowed memory".
    Async,
    /// "GPU N has a total capacity of" with the head cut off.
    Headless,
}

#[derive(Clone, Copy, Debug)]
struct Anchor {
    start: usize,
    kind: AnchorKind,
}

/// The start of every message in the (lowercased, normalised) text, in order.
fn find_anchors(lower: &str) -> Vec<Anchor> {
    let mut anchors = Vec::new();
    for pos in match_indices(lower, "out of memory. tried to allocate") {
        anchors.push(Anchor {
            start: backend_word_start(lower, pos),
            kind: AnchorKind::Native,
        });
    }
    for pos in match_indices(lower, " would exceed allowed memory") {
        let head = lower[..pos].trim_end();
        let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let before_digits = head[..head.len() - digits].trim_end();
        if digits > 0 && before_digits.ends_with("allocation on device") {
            anchors.push(Anchor {
                start: before_digits.len() - "allocation on device".len(),
                kind: AnchorKind::Async,
            });
        }
    }
    let mut native: Vec<usize> = anchors
        .iter()
        .filter(|a| a.kind == AnchorKind::Native)
        .map(|a| a.start)
        .collect();
    native.sort_unstable();
    for needle in ["has a total capacity of", "has a total capacty of"] {
        for pos in match_indices(lower, needle) {
            // Part of a whole message when one starts shortly before it.
            let i = native.partition_point(|&s| s < pos);
            let owned = i > 0 && pos - native[i - 1] < 400;
            if let (false, Some(start)) = (owned, device_word_start(lower, pos)) {
                anchors.push(Anchor {
                    start,
                    kind: AnchorKind::Headless,
                });
            }
        }
    }
    anchors.sort_by_key(|a| a.start);
    anchors.dedup_by_key(|a| a.start);
    anchors
}

fn match_indices(hay: &str, needle: &str) -> Vec<usize> {
    hay.match_indices(needle).map(|(i, _)| i).collect()
}

/// Start of the backend word ("cuda", "hip") right before `pos`, or `pos`.
fn backend_word_start(lower: &str, pos: usize) -> usize {
    let head = lower[..pos].trim_end();
    let word = head.len()
        - head
            .trim_end_matches(|c: char| c.is_ascii_alphanumeric())
            .len();
    if word > 0 && word <= 12 && head.len() < pos {
        head.len() - word
    } else {
        pos
    }
}

/// Start of "GPU 0 " (or "GPU ", "XPU 1 ") before "has a total capacity";
/// `None` when no device word precedes it (some other capacity).
fn device_word_start(lower: &str, pos: usize) -> Option<usize> {
    let head = lower[..pos].trim_end();
    let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let rest = head[..head.len() - digits].trim_end();
    let word = rest.len()
        - rest
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .len();
    let name = &rest[rest.len() - word..];
    let plausible = (digits > 0 && (1..=6).contains(&word)) || name == "gpu";
    plausible.then_some(rest.len() - word)
}

// ---------------------------------------------------------------------------
// Reading one message

/// The text printed for requests of 2^60 bytes or more.
const MORE_THAN_1EB: &str = "more than 1EB";
const EXABYTE: u64 = 1 << 60;

/// A size found in the text, with its place.
struct SizeToken {
    start: usize,
    end: usize,
    figure: Figure,
}

/// The end markers of each form, most specific first: the message stops after
/// the first one found (a 1.10-2.0 message holds both its closing parenthesis
/// and, later, its own tail).
const TAILS: &[(&str, &str)] = &[
    // Current and 2.2-2.9: the link, up to its closing parenthesis.
    ("notes/cuda.html#", ")"),
    // 2.1 and 1.10-2.0 ("... and PYTORCH_CUDA_ALLOC_CONF", or another backend's).
    (
        "see documentation for memory management and pytorch_",
        "alloc_conf",
    ),
    // XPU.
    ("to release all unoccupied cached memory.", ""),
];

/// The parenthesised forms close here; 1.10-2.0 adds a hint after it.
const PAREN_TAILS: &[&str] = &["reserved in total by pytorch)", "cached)"];
const PAREN_HINT: &str = "if reserved memory is >> allocated memory";
const PAREN_HINT_END: &str = "to avoid fragmentation.";

/// Reads the message that starts `window` (found by an anchor of `kind`):
/// every figure it prints, the form it has and the PyTorch versions that
/// print that form; `None` for a headless fragment with no capacity.
fn read_message(window: &str, kind: AnchorKind) -> Option<OomMessage> {
    let lower_full = window.to_ascii_lowercase();
    let end = message_end(&lower_full, kind);
    let w = &window[..end];
    let lower = &lower_full[..end];

    let mut m = new_message(w, kind);
    if kind == AnchorKind::Native {
        if let Some(pos) = lower.find(" out of memory") {
            let word = &w[..pos];
            if !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric()) {
                m.device_kind = Some(word.to_string());
            }
        }
    }

    let clues = read_sizes(&mut m, w, lower);

    let over_1eb = lower.contains("tried to allocate more than 1eb");
    if over_1eb {
        m.requested = Some(Figure {
            bytes: EXABYTE,
            text: MORE_THAN_1EB.to_string(),
        });
    }

    m.device_index = device_index(lower, kind, clues.parenthesised);
    m.form = message_form(&m, lower, kind, over_1eb, clues);
    m.pytorch_versions = match m.form {
        // allowed_info and the private-pool text arrived in 2.4.
        MessageForm::V2_2To2_9 if m.allowed.is_some() || m.private_pools.is_some() => "2.4 to 2.9",
        MessageForm::Modern if m.allowed.is_some() || m.private_pools.is_some() => "2.4 or later",
        form => form.versions(),
    };

    // A headless fragment is a message only if it printed the capacity.
    if kind == AnchorKind::Headless && m.total_capacity.is_none() {
        return None;
    }
    mark_self_in_container(&mut m);
    Some(m)
}

/// A message of `text` with no figure read yet (the allocator from the
/// anchor's kind).
fn new_message(text: &str, kind: AnchorKind) -> OomMessage {
    OomMessage {
        form: MessageForm::Modern,
        pytorch_versions: "",
        device_kind: None,
        allocator: if kind == AnchorKind::Async {
            Allocator::CudaMallocAsync
        } else {
            Allocator::Native
        },
        device_index: None,
        requested: None,
        total_capacity: None,
        device_free: None,
        this_process: None,
        other_processes: Vec::new(),
        allowed: None,
        allocated: None,
        private_pools: None,
        reserved_unallocated: None,
        reserved_total: None,
        text: text.to_string(),
    }
}

/// What the sizes of a message tell beside their figures: which older
/// form printed them.
#[derive(Clone, Copy)]
struct SizeClues {
    /// "total capacty of" (sic): the 2.1 form.
    capacty: bool,
    /// "(... total capacity; ...)": the parenthesised forms before 2.1.
    parenthesised: bool,
}

/// Puts each size of `w` (`lower`: the same text in lower case) in its slot
/// of `m` by the words around it (the first size of a slot wins).
fn read_sizes(m: &mut OomMessage, w: &str, lower: &str) -> SizeClues {
    let mut clues = SizeClues {
        capacty: false,
        parenthesised: false,
    };
    for tok in scan_sizes(w) {
        let before = lower[..tok.start].trim_end();
        let after = lower[tok.end..].trim_start();
        let label = before.trim_end_matches(':').trim_end();
        let fig = tok.figure;
        let slot = if before.ends_with("tried to allocate") || label.ends_with("requested") {
            &mut m.requested
        } else if before.ends_with("total capacity of") {
            &mut m.total_capacity
        } else if before.ends_with("total capacty of") {
            clues.capacty = true;
            &mut m.total_capacity
        } else if before.ends_with("of which") && after.starts_with("is free") {
            &mut m.device_free
        } else if before.ends_with("this process has") && after.starts_with("memory in use") {
            &mut m.this_process
        } else if after.starts_with("memory in use") {
            if let Some(pid) = process_pid(before) {
                m.other_processes.push(OtherProcess {
                    pid,
                    used: fig,
                    likely_this_process: false,
                });
            }
            continue;
        } else if after.starts_with("allowed") || label.ends_with("memory fraction)") {
            &mut m.allowed
        } else if before.ends_with("of the allocated memory")
            || after.starts_with("already allocated")
            || label.ends_with("currently allocated")
        {
            &mut m.allocated
        } else if after.starts_with("allocated in private pools") {
            &mut m.private_pools
        } else if after.starts_with("is reserved by pytorch but unallocated") {
            &mut m.reserved_unallocated
        } else if after.starts_with("total capacity") {
            clues.parenthesised = true;
            &mut m.total_capacity
        } else if after.starts_with("free;")
            || after.starts_with("free)")
            || label.ends_with("free (according to cuda)")
        {
            &mut m.device_free
        } else if after.starts_with("reserved in total by pytorch") {
            &mut m.reserved_total
        } else if after.starts_with("cached") {
            // Before 1.4 "cached" was the cached-but-unallocated part.
            &mut m.reserved_unallocated
        } else if label.ends_with("device limit") {
            &mut m.total_capacity
        } else {
            continue;
        };
        if slot.is_none() {
            *slot = Some(fig);
        }
    }

    clues
}

/// The form of message `m` (read from `lower` by an anchor of `kind`).
fn message_form(
    m: &OomMessage,
    lower: &str,
    kind: AnchorKind,
    over_1eb: bool,
    clues: SizeClues,
) -> MessageForm {
    if kind == AnchorKind::Async {
        if m.allocated.is_some() || m.requested.is_some() {
            MessageForm::CudaMallocAsync
        } else {
            MessageForm::CudaMallocAsyncShort
        }
    } else if over_1eb {
        MessageForm::MoreThan1Eb
    } else if clues.capacty {
        MessageForm::V2_1
    } else if clues.parenthesised {
        if lower.contains(PAREN_HINT) {
            MessageForm::V1_10To2_0
        } else {
            MessageForm::Before1_10
        }
    } else if lower.contains("docs.pytorch.org/") {
        MessageForm::Current
    } else if lower.contains("pytorch.org/docs/") {
        MessageForm::V2_2To2_9
    } else {
        MessageForm::Modern
    }
}

/// Where the message ends in `lower` (a window that starts at the message).
fn message_end(lower: &str, kind: AnchorKind) -> usize {
    if kind == AnchorKind::Async {
        // The last line is the PyTorch limit; else the first line alone.
        let marker = "(set by user-supplied memory fraction)";
        if let Some(p) = lower.find(marker) {
            let after = p + marker.len();
            if let Some(tok) = scan_sizes(&lower[after..]).into_iter().next() {
                if lower[after..after + tok.start]
                    .trim()
                    .trim_start_matches(':')
                    .trim()
                    .is_empty()
                {
                    return after + tok.end;
                }
            }
            return after;
        }
        let first = "(out of memory)";
        let head = lower.find(first).map_or(lower.len(), |p| p + first.len());
        // Figures may follow on the next "lines" (now spaces) without the limit.
        let figures = [
            "currently allocated",
            "requested",
            "device limit",
            "free (according to cuda)",
        ];
        let mut end = head;
        for label in figures {
            if let Some(p) = lower[head..].find(label) {
                let from = head + p + label.len();
                if let Some(tok) = scan_sizes(&lower[from..]).into_iter().next() {
                    if tok.start < 8 {
                        end = end.max(from + tok.end);
                    }
                }
            }
        }
        return end;
    }
    for (marker, closing) in TAILS {
        if let Some(p) = lower.find(marker) {
            let e = p + marker.len();
            if closing.is_empty() {
                return e;
            }
            return lower[e..]
                .find(closing)
                .map_or(lower.len(), |q| e + q + closing.len());
        }
    }
    for marker in PAREN_TAILS {
        if let Some(p) = lower.find(marker) {
            let e = p + marker.len();
            let rest = &lower[e..];
            let hint = rest.trim_start();
            if hint.starts_with(PAREN_HINT) {
                let from = e + (rest.len() - hint.len());
                if let Some(q) = hint.find(PAREN_HINT_END) {
                    return from + q + PAREN_HINT_END.len();
                }
            }
            return e;
        }
    }
    // No tail. The modern forms' last sentence before the hint:
    let last = "is reserved by pytorch but unallocated.";
    if let Some(p) = lower.find(last) {
        return p + last.len();
    }
    // Cut earlier: end after the last labelled figure of an unbroken run (the
    // templates put at most some 60 bytes of text between two figures, so a
    // larger gap means the text has moved on to something else).
    const MAX_GAP: usize = 120;
    let mut end = 0;
    for tok in scan_sizes(lower) {
        if end > 0 && tok.start > end + MAX_GAP {
            break;
        }
        let rest = &lower[tok.end..];
        let stop = rest
            .find(['.', ';', ')'])
            .map_or(rest.len(), |q| q + 1)
            .min(rest.len());
        let label_known = [
            "is free",
            "memory in use",
            "allowed",
            "is allocated by pytorch",
            "allocated in private pools",
            "is reserved by pytorch but unallocated",
        ]
        .iter()
        .any(|l| rest.trim_start().starts_with(l));
        let before = lower[..tok.start].trim_end();
        if label_known
            || before.ends_with("tried to allocate")
            || before.ends_with("total capacity of")
            || before.ends_with("total capacty of")
            || before.ends_with("of the allocated memory")
        {
            end = end.max(tok.end + stop);
        }
    }
    if let Some(p) = lower.find("tried to allocate more than 1eb memory.") {
        end = end.max(p + "tried to allocate more than 1eb memory.".len());
    }
    if end == 0 {
        end = lower
            .find("tried to allocate")
            .map_or(lower.len().min(80), |p| p + "tried to allocate".len());
    }
    floor_boundary(lower, end)
}

/// The pid in a text ending with "process N has".
fn process_pid(before: &str) -> Option<u64> {
    let head = before.strip_suffix("has")?.trim_end();
    let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let (rest, num) = head.split_at(head.len() - digits);
    if !rest.trim_end().ends_with("process") {
        return None;
    }
    num.parse().ok()
}

/// The device index: "GPU 0 has a total", "(GPU 0;", "Allocation on device 0".
fn device_index(lower: &str, kind: AnchorKind, parenthesised: bool) -> Option<u32> {
    let leading_uint = |s: &str| -> Option<u32> {
        let s = s.trim_start();
        let n = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        s[..n].parse().ok()
    };
    if kind == AnchorKind::Async {
        let p = lower.find("allocation on device")?;
        return leading_uint(&lower[p + "allocation on device".len()..]);
    }
    if parenthesised {
        // "(GPU 0; 79.35 GiB total capacity; ..." or "(NPU 0; ...".
        let p = lower.find("tried to allocate")?;
        let open = p + lower[p..].find('(')?;
        let inner = &lower[open + 1..];
        let word = inner.len()
            - inner
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let rest = &inner[word..];
        let idx = leading_uint(rest)?;
        return rest
            .trim_start()
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .starts_with(';')
            .then_some(idx);
    }
    let p = lower
        .find("has a total capacity of")
        .or_else(|| lower.find("has a total capacty of"))?;
    let head = lower[..p].trim_end();
    let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    head[head.len() - digits..].parse().ok()
}

/// Inside a container NVML's pids differ from the process's own, so PyTorch
/// prints itself as "Process N has X memory in use" and no "this process"
/// line; the entry that holds at least what PyTorch reserved is then itself.
fn mark_self_in_container(m: &mut OomMessage) {
    if m.this_process.is_some() {
        return;
    }
    let Some(reserved) = m.reserved_bytes() else {
        return;
    };
    // Outside PyTorch a process holds its CUDA context, library workspaces and
    // NCCL buffers: a few GiB at most.
    let slack = (4u64 << 30).max(reserved / 4);
    let best = m
        .other_processes
        .iter_mut()
        .filter(|p| p.used.bounds().1 >= reserved && p.used.bytes <= reserved.saturating_add(slack))
        .min_by_key(|p| p.used.bytes);
    if let Some(p) = best {
        p.likely_this_process = true;
    }
}

// ---------------------------------------------------------------------------
// Sizes

/// Every `format_size` size in `s`: "N bytes" or "F KiB|MiB|GiB" (TiB too).
fn scan_sizes(s: &str) -> Vec<SizeToken> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_number = b[i].is_ascii_digit()
            && (i == 0
                || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.' || b[i - 1] == b'_'));
        if !starts_number {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        }
        let num_end = i;
        if b.get(i) != Some(&b' ') {
            continue;
        }
        let unit_start = i + 1;
        let mut j = unit_start;
        while j < b.len() && b[j].is_ascii_alphabetic() {
            j += 1;
        }
        if j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            continue;
        }
        if unit_bytes(&s[unit_start..j]).is_none() {
            continue;
        }
        let text = format!("{} {}", &s[start..num_end], &s[unit_start..j]);
        if let Some((value, unit)) = parse_size_text(&text) {
            out.push(SizeToken {
                start,
                end: j,
                figure: Figure {
                    bytes: to_u64((value * unit as f64).round()),
                    text,
                },
            });
        }
        i = j;
    }
    out
}

/// The number and unit (in bytes) of a size such as "449.83 MiB".
fn parse_size_text(text: &str) -> Option<(f64, u64)> {
    let (num, unit) = text.split_once(' ')?;
    Some((num.parse().ok()?, unit_bytes(unit)?))
}

fn unit_bytes(unit: &str) -> Option<u64> {
    match unit.to_ascii_lowercase().as_str() {
        "bytes" | "byte" => Some(1),
        "kib" => Some(1 << 10),
        "mib" => Some(1 << 20),
        "gib" => Some(1 << 30),
        "tib" => Some(1 << 40),
        _ => None,
    }
}

/// `x` as u64, saturating (PyTorch prints "no limit" as 2^64 bytes).
fn to_u64(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_bounds() {
        let f = Figure {
            bytes: 0,
            text: "1.00 KiB".into(),
        };
        assert_eq!(f.bounds(), (1019, 1029)); // 1024 +- 5.12
        let f = Figure {
            bytes: 7,
            text: "7 bytes".into(),
        };
        assert_eq!(f.bounds(), (7, 7));
    }

    #[test]
    fn sizes_are_scanned() {
        let t = scan_sizes("x 1.50 GiB, 0 bytes; 12 MiBs 3 KiB");
        let texts: Vec<_> = t.iter().map(|t| t.figure.text.as_str()).collect();
        assert_eq!(texts, ["1.50 GiB", "0 bytes", "3 KiB"]);
        assert_eq!(t[0].figure.bytes, 3 << 29);
    }

    #[test]
    fn prefixes_are_stripped() {
        assert_eq!(normalize("[rank0]: a b\n[rank0]: c d"), "[rank0]: a b c d");
        assert_eq!(normalize("E   one\nE   two"), "E one two");
        assert_eq!(
            normalize("Process 1 x\nProcess 2 y"),
            "Process 1 x Process 2 y"
        );
        assert_eq!(normalize("a\\nb"), "a b");
    }
}
