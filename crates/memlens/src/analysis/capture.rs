//! How the snapshot was recorded: the silent failures of a capture (issue
//! 35), each found from the file itself and told with the exact change that
//! fixes it. A capture that went wrong still loads and analyses; what it
//! cannot show is easy to miss, so `summary` lists these and `doctor` makes
//! them findings.

use crate::snapshot::Snapshot;
use serde::Serialize;

/// One thing wrong with how a snapshot was recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CaptureCheck {
    /// A stable name: `no_history`, `recording_stopped`, `cpp_stacks` or
    /// `alloc_conf_not_applied`.
    pub check: String,
    /// What went wrong and what it costs, with the file's figures.
    pub problem: String,
    /// The change that fixes it, as code to paste.
    pub fix: String,
    /// Whether it hides what the analyses need (`no_history`,
    /// `recording_stopped`, `alloc_conf_not_applied`) rather than only
    /// costing time.
    pub serious: bool,
}

/// A share of C++ frames from which the recording took C++ stacks:
/// `stacks="python"` leaves none (0 in every Python-stack recording of the
/// fixtures and the corpus), `stacks="all"` 36% (torch.compile, whose
/// generated code is Python) to 91% of the distinct frames.
const CPP_SHARE: f64 = 0.1;

/// Every check that fails on `snap`, most serious first.
pub fn capture_checks(snap: &Snapshot) -> Vec<CaptureCheck> {
    let mut out: Vec<CaptureCheck> = [
        no_history(snap),
        alloc_conf_not_applied(snap),
        cpp_stacks(snap),
    ]
    .into_iter()
    .flatten()
    .collect();
    out.sort_by_key(|c| !c.serious);
    out
}

/// Segments but no trace at all: `_record_memory_history` was off at the
/// dump (never turned on, or turned off before it).
fn no_history(snap: &Snapshot) -> Option<CaptureCheck> {
    if snap.legacy || snap.segments.is_empty() || snap.event_count() > 0 {
        return None;
    }
    Some(CaptureCheck {
        check: "no_history".into(),
        problem: "no allocation history was recorded (the trace is empty): the snapshot holds the \
                  allocator's state at the dump only, so the peak over time, the replay, the \
                  what-ifs and growth between steps cannot be seen"
            .into(),
        fix: "turn recording on before the steps to study: \
              `torch.cuda.memory._record_memory_history(max_entries=100_000)` (or wrap the loop in \
              `memlens.record()`), then dump"
            .into(),
        serious: true,
    })
}

/// The trace ends before the dump: blocks live after the trace's last event
/// (`live_at_end`: their addresses, sorted, from the replay of `device`'s
/// trace) that the dump no longer holds were freed after the trace ended.
/// On PyTorch 2.11 `_record_memory_history(enabled="state")` does this (it
/// stops the trace and keeps it); `enabled=None` empties the trace instead
/// (`no_history`). A ring buffer that wrapped drops the oldest events, never
/// the newest, so it cannot cause this. `None` when every block live at the
/// end is in the dump.
pub fn recording_stopped(
    snap: &Snapshot,
    device: u32,
    live_at_end: &[u64],
) -> Option<CaptureCheck> {
    let mut dumped: Vec<u64> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != crate::snapshot::BlockState::Inactive)
        .map(|b| b.address)
        .collect();
    dumped.sort_unstable();
    let gone = live_at_end
        .iter()
        .filter(|a| dumped.binary_search(a).is_err())
        .count();
    if gone == 0 {
        return None;
    }
    Some(CaptureCheck {
        check: "recording_stopped".into(),
        problem: format!(
            "the trace ends before the snapshot was taken: {gone} block{} live at its last event \
             {} gone from the dump, freed after the trace stopped \
             (`_record_memory_history(enabled=\"state\")` before `_dump_snapshot` keeps the \
             state and stops the trace); what ran after that is not in the trace, so the peak, \
             the timeline and growth between steps cover the recorded part only",
            if gone == 1 { "" } else { "s" },
            if gone == 1 { "is" } else { "are" },
        ),
        fix: "dump before stopping the trace: `torch.cuda.memory._dump_snapshot(path)`, then \
              `torch.cuda.memory._record_memory_history(enabled=None)` (memlens.record does both, \
              in that order)"
            .into(),
        serious: true,
    })
}

/// `PYTORCH_CUDA_ALLOC_CONF` was set in the process's environment (as
/// `memlens.record` saw it) but the allocator ran with none: it reads the
/// variable once, when CUDA first allocates, so setting it later in the
/// script changes nothing.
fn alloc_conf_not_applied(snap: &Snapshot) -> Option<CaptureCheck> {
    let env = snap.recording.as_ref()?.alloc_conf_env.as_deref()?.trim();
    if env.is_empty() || !snap.settings.present || !snap.settings.alloc_conf.trim().is_empty() {
        return None;
    }
    Some(CaptureCheck {
        check: "alloc_conf_not_applied".into(),
        problem: format!(
            "PYTORCH_CUDA_ALLOC_CONF was \"{env}\" in the process's environment, but the allocator \
             ran with none of it: PyTorch reads the variable once, when CUDA first allocates, so \
             a value set after that (os.environ in the script) is ignored"
        ),
        fix: format!(
            "set it before the process starts (`PYTORCH_CUDA_ALLOC_CONF={env} python train.py`), or \
             at the top of the script before anything touches the GPU"
        ),
        serious: true,
    })
}

/// C++ frames in the stacks: recorded with `stacks="all"` (PyTorch's
/// default). memlens names sites by the Python lines; the C++ frames make
/// every dump convert and pickle many times more frames. They tell one
/// thing Python frames cannot: a cuDNN workspace given up
/// ([`Snapshot::oom_caught_by_pytorch`]), said when the run has any.
fn cpp_stacks(snap: &Snapshot) -> Option<CaptureCheck> {
    let frames = &snap.frames;
    if frames.is_empty() {
        return None;
    }
    let cpp = frames
        .iter()
        .filter(|f| crate::frames::is_native(snap.str(f.filename), snap.str(f.name)))
        .count();
    let share = cpp as f64 / frames.len() as f64;
    if share < CPP_SHARE {
        return None;
    }
    // The one thing only C++ frames tell: an `oom` entry that is a cuDNN
    // workspace PyTorch gave up, not the run's OOM.
    let given_up = snap.oom_entries_caught_by_pytorch().count();
    let (tells, but) = if given_up > 0 {
        (
            format!(
                "; here they also tell apart the {given_up} `oom` entries that are cuDNN \
                 workspaces PyTorch gave up, not OOMs of the run"
            ),
            "; with Python stacks such entries read as the run's OOMs",
        )
    } else {
        (" and add nothing memlens names a site by".to_string(), "")
    };
    Some(CaptureCheck {
        check: "cpp_stacks".into(),
        problem: format!(
            "recorded with C++ stacks (stacks=\"all\", PyTorch's default): {:.0}% of the {} \
             distinct frames are C++; they make each dump convert and pickle far more (minutes on \
             long runs){tells}",
            share * 100.0,
            frames.len()
        ),
        fix: format!(
            "record Python stacks only: `torch.cuda.memory._record_memory_history(stacks=\"python\")` \
             (memlens.record's default){but}"
        ),
        serious: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Frame, Recording};

    fn with_frames(names: &[(&str, u32)]) -> Snapshot {
        let mut snap = Snapshot::default();
        for (file, line) in names {
            let filename = snap.strings.intern(file);
            let name = snap.strings.intern("f");
            snap.frames.push(Frame {
                filename,
                line: *line,
                name,
            });
        }
        snap
    }

    #[test]
    fn python_stacks_pass_and_cpp_stacks_are_named() {
        let py = with_frames(&[("train.py", 10), ("model.py", 3), ("<frozen runpy>", 88)]);
        assert!(cpp_stacks(&py).is_none());
        let cpp = with_frames(&[
            ("train.py", 10),
            ("??", 0),
            ("RegisterCUDA_0.cpp", 0),
            ("", 0),
        ]);
        let c = cpp_stacks(&cpp).expect("C++ stacks");
        assert!(
            c.problem.contains("75% of the 4 distinct frames are C++"),
            "{}",
            c.problem
        );
        assert!(c.fix.contains("stacks=\"python\"") && !c.serious);
    }

    #[test]
    fn an_alloc_conf_set_too_late_is_named_only_when_memlens_saw_it() {
        let mut snap = Snapshot::default();
        snap.settings.present = true;
        assert!(alloc_conf_not_applied(&snap).is_none());
        snap.recording = Some(Recording {
            alloc_conf_env: Some("expandable_segments:True".into()),
            ..Default::default()
        });
        let c = alloc_conf_not_applied(&snap).expect("not applied");
        assert!(c
            .fix
            .contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python"));
        snap.settings.alloc_conf = "expandable_segments:True".into();
        assert!(alloc_conf_not_applied(&snap).is_none());
    }
}
