//! A first diagnosis from an out-of-memory message alone.
//!
//! The message prints a handful of figures; they are enough to tell which
//! limit was hit, not which tensors filled the memory (that takes a snapshot).
//! With R the requested size, F the device's free memory, T its capacity,
//! reserved = allocated + reserved-but-unallocated (U), P the private pools'
//! free memory and O the memory of other processes, the rules, in order:
//!
//! 1. **`private_pools`**: P is at least a tenth of reserved and F + P >= R
//!    (the pools' free memory would have been enough; U includes it).
//! 2. **`fragmentation`**: U >= R: enough free memory sits in the cache, but
//!    in pieces none of which is large enough (the allocator already returned
//!    every wholly free segment to the device before raising). Also under a
//!    cap: had the cache been in one piece, the cap would not have been hit.
//! 3. **`memory_cap`**: a cap is printed ("allowed" below the capacity, or the
//!    `cudaMallocAsync` limit), reserved + R is over it, and the device still
//!    had F >= R free. Also when F >= R and no cap is printed by a form that
//!    cannot print one (2.1 to 2.3, before 1.10): a cap is then the likely
//!    reason, and the explanation says so.
//! 4. **`other_processes`**: O >= R - F (without them it would fit) and O is at
//!    least a tenth of the device (or at least R when T is not printed).
//! 5. **`capacity`**: otherwise: this process's own tensors fill the memory.
//!
//! These are the rules of [`super::cause::classify`], which the snapshot
//! analysis applies too: one rulebook, two sources of figures.
//!
//! `expandable_segments` is suggested only when U is significant (at least
//! half of R).

use super::cause::{Cause, Fix};
use super::message::{find, Allocator, MessageForm, OomMessage};
use crate::units::format_bytes;
use serde::Serialize;

/// The diagnosis of one message, with the keys of the `memlens oom --json`
/// contract first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MessageDiagnosis {
    /// What was analysed: always `"message"` here (`"snapshot"` for the
    /// snapshot analysis).
    pub source: &'static str,
    /// Why the allocation failed.
    pub cause: Cause,
    /// The size the allocator tried to get (the rounded block size; see
    /// [`OomMessage::requested`]).
    pub requested_bytes: Option<u64>,
    /// The largest free block in PyTorch's cache: a message does not print it,
    /// so always `None` (JSON `null`) here.
    pub largest_free_block_bytes: Option<u64>,
    /// Reserved by PyTorch but unallocated (printed or derived).
    pub reserved_unallocated_bytes: Option<u64>,
    /// What to do, best first.
    pub fixes: Vec<Fix>,
    /// A short paragraph with the numbers, for people.
    pub explanation: String,
    /// Memory PyTorch had reserved (allocated + unallocated, or as printed).
    pub reserved_bytes: Option<u64>,
    /// The per-process cap when one was set.
    pub memory_cap_bytes: Option<u64>,
    /// Memory held by other processes on the device.
    pub other_processes_bytes: u64,
    /// The message and every figure it printed.
    pub message: OomMessage,
}

/// Finds the out-of-memory message in `text` and diagnoses it.
pub fn explain_message(text: &str) -> crate::Result<MessageDiagnosis> {
    Ok(diagnose(find(text)?))
}

/// Diagnoses a parsed message (the rules are in the module documentation).
pub fn diagnose(message: OomMessage) -> MessageDiagnosis {
    let f = Facts::of(&message);
    let (cause, hedged_cap) = classify(&f, &message);
    let explanation = explain(&f, &message, cause, hedged_cap);
    let fixes = fixes(&f, &message, cause);
    MessageDiagnosis {
        source: "message",
        cause,
        requested_bytes: f.requested,
        largest_free_block_bytes: None,
        reserved_unallocated_bytes: f.unallocated,
        fixes,
        explanation,
        reserved_bytes: f.reserved,
        memory_cap_bytes: f.cap,
        other_processes_bytes: f.others,
        message,
    }
}

/// The figures the rules use, in bytes.
struct Facts {
    requested: Option<u64>,
    free: Option<u64>,
    total: Option<u64>,
    reserved: Option<u64>,
    unallocated: Option<u64>,
    private: u64,
    others: u64,
    cap: Option<u64>,
}

impl Facts {
    fn of(m: &OomMessage) -> Self {
        Facts {
            requested: m.requested.as_ref().map(|x| x.bytes),
            free: m.device_free.as_ref().map(|x| x.bytes),
            total: m.total_capacity.as_ref().map(|x| x.bytes),
            reserved: m.reserved_bytes(),
            unallocated: m.reserved_unallocated_bytes(),
            private: m.private_pools.as_ref().map_or(0, |x| x.bytes),
            others: m.other_processes_bytes(),
            cap: m.memory_cap(),
        }
    }

    /// Reserved-but-unallocated memory large enough to matter for this request.
    fn unallocated_significant(&self) -> bool {
        match (self.unallocated, self.requested) {
            (Some(u), Some(r)) => u > 0 && u.saturating_mul(2) >= r,
            _ => false,
        }
    }
}

/// Forms that print the cap whenever one is set.
fn prints_cap(m: &OomMessage) -> bool {
    match m.form {
        MessageForm::Current | MessageForm::V1_10To2_0 | MessageForm::CudaMallocAsync => true,
        MessageForm::V2_2To2_9 | MessageForm::Modern => m.pytorch_versions.starts_with("2.4"),
        _ => false,
    }
}

/// The cause, and whether a cap was only supposed (not printed): the one
/// rulebook ([`super::cause::classify`]) on the message's figures.
fn classify(f: &Facts, m: &OomMessage) -> (Cause, bool) {
    let c = super::cause::classify(&super::cause::Evidence {
        request: f.requested,
        tried: f.requested,
        reserved: f.reserved,
        // The unallocated figure: the cache's free memory (a message does
        // not tell pools apart, nor print the largest piece).
        cache_free: f.unallocated,
        largest_free: None,
        private_free: f.private,
        device_free: f.free,
        total: f.total,
        outside: f.others,
        cap: f.cap,
        cap_may_be_unprinted: !prints_cap(m),
    });
    (c.cause, c.hedged_cap)
}

fn text_or(fig: &Option<super::message::Figure>, fallback: &str) -> String {
    fig.as_ref()
        .map_or(fallback.to_string(), |x| x.text.clone())
}

fn explain(f: &Facts, m: &OomMessage, cause: Cause, hedged_cap: bool) -> String {
    let mut s = what_failed(m);
    match (&m.total_capacity, &m.device_free) {
        (Some(t), Some(fr)) => s.push_str(&format!(" ({} in total, {} free)", t.text, fr.text)),
        (Some(t), None) => s.push_str(&format!(" ({} in total)", t.text)),
        (None, Some(fr)) => s.push_str(&format!(" ({} free)", fr.text)),
        (None, None) => {}
    }
    s.push_str(". ");
    s.push_str(&why(f, m, cause, hedged_cap));
    s.push_str(&outside_pytorch(f, m, cause));
    let any_figure = m.total_capacity.is_some() || m.device_free.is_some() || m.allocated.is_some();
    if !any_figure {
        return s.trim_end().to_string();
    }
    if m.allocator == Allocator::Native
        && m.requested.is_some()
        && m.form != MessageForm::MoreThan1Eb
    {
        s.push_str(
            "Figures are as printed (two decimals); \"Tried to allocate\" is the rounded block \
             size the allocator asked the device for, not the tensor's size.",
        );
    } else {
        s.push_str("Figures are as printed (two decimals).");
    }
    s
}

/// What failed, on which device: the first words of the explanation.
fn what_failed(m: &OomMessage) -> String {
    let req = text_or(&m.requested, "the request");
    let device = match (&m.device_kind, m.device_index) {
        (Some(k), Some(i)) => format!("{k} device {i}"),
        (None, Some(i)) => format!("device {i}"),
        (Some(k), None) => format!("the {k} device"),
        (None, None) => "the device".to_string(),
    };
    let what = match (&m.requested, m.allocator) {
        (None, Allocator::CudaMallocAsync) => {
            format!("cudaMallocAsync ran out of memory on {device}")
        }
        (Some(_), Allocator::CudaMallocAsync) => {
            format!("cudaMallocAsync could not allocate {req} on {device}")
        }
        _ if m.form == MessageForm::MoreThan1Eb => {
            format!("PyTorch was asked for more than 1 EiB on {device}")
        }
        (None, _) => format!("PyTorch's caching allocator ran out of memory on {device}"),
        (Some(_), _) => {
            format!("PyTorch's caching allocator could not get a {req} block on {device}")
        }
    };
    what
}

/// The cause in a sentence or two, with the message's figures.
fn why(f: &Facts, m: &OomMessage, cause: Cause, hedged_cap: bool) -> String {
    let mut s = String::new();
    let req = text_or(&m.requested, "the request");
    let held = held_text(m, f);
    match cause {
        Cause::MemoryCap if hedged_cap => s.push_str(&format!(
            "The device still had more free memory than the {req} asked for, so the limit was \
             not the device: most likely a per-process cap (torch.cuda.set_per_process_memory_fraction, \
             or an MPS memory limit), which this message form ({}) does not print. ",
            m.pytorch_versions
        )),
        Cause::MemoryCap => {
            let cap = f.cap.unwrap_or(0);
            let share = match f.total {
                Some(t) if t > 0 => format!(" ({:.0}% of the device)", cap as f64 * 100.0 / t as f64),
                _ => String::new(),
            };
            let sum = f.reserved.unwrap_or(0).saturating_add(f.requested.unwrap_or(0));
            s.push_str(&format!(
                "The limit it hit is the process's own cap, not the device: the process may hold at \
                 most {}{share}, PyTorch already held {held}, and that plus {req} is {}, over the cap",
                text_or(&m.allowed, &format_bytes(cap)),
                format_bytes(sum)
            ));
            match &m.device_free {
                Some(fr) => s.push_str(&format!(", while the device still had {} free. ", fr.text)),
                None => s.push_str(". "),
            }
        }
        Cause::PrivatePools => s.push_str(&format!(
            "{} sits free in private memory pools (CUDA graphs, torch.compile's reduce-overhead mode, \
             torch.cuda.MemPool), where this allocation cannot use it; with it the device would have \
             had {} for the {req}. PyTorch held {held}. ",
            text_or(&m.private_pools, "memory"),
            format_bytes(f.free.unwrap_or(0).saturating_add(f.private))
        )),
        Cause::Fragmentation => s.push_str(&format!(
            "PyTorch held {held}: it had {} cached and unused, at least the {req} it needed, yet no \
             free block was large enough. The cache is fragmented: the free pieces lie in segments \
             that still hold live tensors, so they could not be returned to the device either. ",
            format_bytes(f.unallocated.unwrap_or(0))
        )),
        Cause::OtherProcesses => {
            let list = m
                .other_processes
                .iter()
                .filter(|p| !p.likely_this_process)
                .map(|p| format!("pid {} {}", p.pid, p.used.text))
                .collect::<Vec<_>>()
                .join(", ");
            s.push_str(&format!(
                "Other processes hold {} of this device ({list}); without them it would have had {} \
                 free. PyTorch itself held {held}. ",
                format_bytes(f.others),
                format_bytes(f.free.unwrap_or(0).saturating_add(f.others))
            ));
        }
        Cause::Capacity => {
            match (f.requested, f.total) {
                _ if m.form == MessageForm::MoreThan1Eb => s.push_str(
                    "No device has that much memory: the size is almost certainly a bug (a wrong \
                     shape, or a size computation that overflowed or went negative). ",
                ),
                (Some(r), Some(t)) if r > t => s.push_str(&format!(
                    "The request alone is larger than the whole device: no allocator setting can \
                     fit it. PyTorch held {held}. "
                )),
                _ if f.reserved.is_some() => s.push_str(&format!(
                    "The memory is taken by this process's own tensors: PyTorch held {held}, with \
                     little of it cached and unused, and the device had no room left for the \
                     request. "
                )),
                _ => s.push_str(
                    "The message prints too few figures to tell more; a snapshot taken at the OOM \
                     would (memlens oom SNAP). ",
                ),
            }
        }
    }
    s
}

/// Memory outside PyTorch's allocator: other processes (when they are not
/// the cause), this process seen from a container, its non-PyTorch memory.
fn outside_pytorch(f: &Facts, m: &OomMessage, cause: Cause) -> String {
    let mut s = String::new();
    if cause != Cause::OtherProcesses && f.others > 0 {
        let n = m
            .other_processes
            .iter()
            .filter(|p| !p.likely_this_process)
            .count();
        s.push_str(&format!(
            "Other processes hold {} of the device ({n} process{}). ",
            format_bytes(f.others),
            if n == 1 { "" } else { "es" }
        ));
    }
    if let Some(p) = m.other_processes.iter().find(|p| p.likely_this_process) {
        s.push_str(&format!(
            "Process {} ({}) is most likely this process itself, seen from inside a container. ",
            p.pid, p.used.text
        ));
    }
    let this = m
        .this_process
        .as_ref()
        .map(|x| (x.bytes, x.text.clone()))
        .or_else(|| {
            m.other_processes
                .iter()
                .find(|p| p.likely_this_process)
                .map(|p| (p.used.bytes, p.used.text.clone()))
        });
    if let (Some((bytes, text)), Some(res)) = (this, f.reserved) {
        if bytes > res {
            s.push_str(&format!(
                "This process uses {text} in all, about {} of it outside PyTorch's allocator (CUDA \
                 context, library workspaces, NCCL). ",
                format_bytes(bytes - res)
            ));
        }
    }
    s
}

/// "7.87 GiB (7.43 GiB allocated + 449.83 MiB cached but unallocated)".
fn held_text(m: &OomMessage, f: &Facts) -> String {
    let Some(res) = f.reserved else {
        return match &m.allocated {
            Some(a) => format!("{} allocated", a.text),
            None => "an unknown amount".to_string(),
        };
    };
    match (&m.allocated, &m.reserved_unallocated, &m.reserved_total) {
        (Some(a), Some(u), _) => format!(
            "{} ({} allocated + {} cached but unallocated)",
            format_bytes(res),
            a.text,
            u.text
        ),
        (Some(a), None, Some(r)) => format!("{} reserved ({} allocated)", r.text, a.text),
        _ => format_bytes(res),
    }
}

const LOWER_BATCH: &str =
    "lower the batch size or sequence length, or save activation memory with activation \
     checkpointing or bf16 autocast";

fn fixes(f: &Facts, m: &OomMessage, cause: Cause) -> Vec<Fix> {
    let mut out = Vec::new();
    match cause {
        Cause::MemoryCap => {
            let room = m.device_free.as_ref().map_or(String::new(), |x| {
                format!(": the device had {} free", x.text)
            });
            out.push(Fix::advice(format!(
                "Raise or remove the per-process memory cap (torch.cuda.set_per_process_memory_fraction{}){room}",
                m.allowed
                    .as_ref()
                    .filter(|_| f.cap.is_some())
                    .map_or(String::new(), |a| format!(", now {}", a.text))
            )));
            out.push(Fix::advice(format!(
                "Or make the step fit under the cap: {LOWER_BATCH}"
            )));
        }
        Cause::PrivatePools => {
            out.push(Fix::advice(
                "Release private pools you no longer need: delete CUDA graphs you do not replay, \
                 share one pool between graphs (torch.cuda.graph_pool_handle()), or capture fewer \
                 shapes with torch.compile(mode=\"reduce-overhead\")",
            ));
            out.push(Fix::advice(format!("Or {LOWER_BATCH}")));
        }
        Cause::Fragmentation => {
            out.push(expandable_fix(m));
            // A message alone cannot show that shapes vary between steps
            // (a snapshot can: `oom::snapshot`): said as a condition.
            out.push(Fix::advice(
                "If tensor shapes vary between steps (variable sequence lengths), pad them to a \
                 few bucket sizes so freed blocks fit the next requests",
            ));
            out.push(Fix::advice(format!("Or {LOWER_BATCH}")));
        }
        Cause::OtherProcesses => {
            let pids = m
                .other_processes
                .iter()
                .filter(|p| !p.likely_this_process)
                .map(|p| p.pid.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            out.push(Fix::advice(format!(
                "Free the device: stop the other processes (pid {pids}), or run on a GPU of your \
                 own (CUDA_VISIBLE_DEVICES)"
            )));
            out.push(Fix::advice(format!(
                "Or fit in what is left: {LOWER_BATCH}"
            )));
        }
        Cause::Capacity if m.form == MessageForm::MoreThan1Eb => {
            out.push(Fix::advice(
                "Check the shape and dtype of the tensor being created: a size over 1 EiB comes \
                 from a bug (an overflowed or negative dimension), not from memory pressure",
            ));
        }
        Cause::Capacity => {
            if matches!((f.requested, f.total), (Some(r), Some(t)) if r > t) {
                out.push(Fix::advice(
                    "Change the computation: a single tensor this large cannot fit on this device \
                     (process it in chunks, or shard it across GPUs)",
                ));
            }
            let lower = LOWER_BATCH[..1].to_uppercase() + &LOWER_BATCH[1..];
            out.push(Fix::advice(lower));
            out.push(Fix::advice(
                "For training, shrink optimizer state and gradients: an 8-bit or sharded optimizer \
                 (FSDP, ZeRO), or gradient accumulation with a smaller micro-batch",
            ));
            out.push(Fix::advice(
                "Use a GPU with more memory, or shard the model across GPUs",
            ));
        }
    }
    if cause != Cause::Fragmentation && f.unallocated_significant() {
        out.push(expandable_fix(m));
    }
    out
}

/// The fragmentation fix the message's PyTorch supports.
fn expandable_fix(m: &OomMessage) -> Fix {
    // max_split_size_mb arrived in 1.10, expandable_segments in 2.1.
    if m.form == MessageForm::Before1_10 {
        Fix::advice(
            "Upgrade PyTorch (2.1 or later) and set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
             so segments grow in place instead of leaving unusable pieces",
        )
    } else if m.form == MessageForm::V1_10To2_0 {
        Fix::advice(
            "Set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<size> (e.g. 128) so large cached \
             blocks are not split; on PyTorch 2.1 or later prefer expandable_segments:True",
        )
    } else {
        Fix::advice(
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow in place \
             instead of leaving unusable pieces",
        )
    }
}
