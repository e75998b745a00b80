//! The vocabulary of OOM diagnoses, shared by the message triage and the
//! snapshot analysis: why an allocation failed, and what would fix it.

use serde::Serialize;

/// Why an allocation failed. Serialised as the stable snake_case names of the
/// `memlens oom --json` contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The memory is held by this process's own live tensors: there is simply
    /// not enough of it.
    Capacity,
    /// Enough memory sits free in PyTorch's cache, but in pieces, none large
    /// enough for the request.
    Fragmentation,
    /// The process hit its own cap (`set_per_process_memory_fraction`, or the
    /// `cudaMallocAsync` limit) while the device still had room.
    MemoryCap,
    /// Other processes hold the memory this one would need.
    OtherProcesses,
    /// Free memory sits in private pools (CUDA graphs, `MemPool`) that this
    /// allocation cannot use.
    PrivatePools,
}

impl Cause {
    /// The stable name: `capacity`, `fragmentation`, `memory_cap`,
    /// `other_processes` or `private_pools`.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Capacity => "capacity",
            Cause::Fragmentation => "fragmentation",
            Cause::MemoryCap => "memory_cap",
            Cause::OtherProcesses => "other_processes",
            Cause::PrivatePools => "private_pools",
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing the user can do. From a message alone the fixes are qualitative;
/// the snapshot analysis adds what a replay predicts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fix {
    /// What to do, in a sentence.
    pub action: String,
    /// Peak reserved memory a replay under this fix predicts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_peak_reserved_bytes: Option<u64>,
    /// Whether the run would fit under this fix, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fits: Option<bool>,
}

impl Fix {
    /// A fix with no prediction.
    pub fn advice(action: impl Into<String>) -> Self {
        Fix {
            action: action.into(),
            predicted_peak_reserved_bytes: None,
            fits: None,
        }
    }
}
