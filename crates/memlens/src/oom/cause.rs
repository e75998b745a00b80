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

/// The figures an OOM is classified by, from a snapshot or from a message
/// (`None`: the source does not tell).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The request, compared with the free pieces of the cache.
    pub request: Option<u64>,
    /// The size the allocator tried to get from the device (a segment).
    pub tried: Option<u64>,
    /// Memory PyTorch had reserved.
    pub reserved: Option<u64>,
    /// Free memory in the cache that the request could use (its pool, on
    /// any stream), in pieces of any size.
    pub cache_free: Option<u64>,
    /// The largest free piece there (`None`: unknown, as from a message).
    pub largest_free: Option<u64>,
    /// Free memory in private pools (CUDA graphs, `MemPool`).
    pub private_free: u64,
    /// The device's free memory as `cudaMemGetInfo` reported it.
    pub device_free: Option<u64>,
    /// The device's total memory.
    pub total: Option<u64>,
    /// Memory on the device outside this process's PyTorch.
    pub outside: u64,
    /// The per-process cap, printed or inferred.
    pub cap: Option<u64>,
    /// The message's form cannot print a cap, so one may have been set
    /// unseen.
    pub cap_may_be_unprinted: bool,
}

/// Why the allocation failed, and whether a cap was only supposed (the
/// message's form could not print one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    /// The cause.
    pub cause: Cause,
    /// A cap was supposed, not printed or inferred.
    pub hedged_cap: bool,
}

/// The one rulebook of OOM causes, for snapshots and messages alike, in
/// order:
/// 1. `private_pools`: private pools hold free memory (at least a tenth of
///    reserved) that, with the device's free memory, would have been enough;
/// 2. `fragmentation`: the cache held at least the request in free pieces,
///    none large enough (the allocator had already returned every wholly
///    free segment before raising); also under a cap: had the cache been in
///    one piece, the cap would not have been hit;
/// 3. `memory_cap`: reserved plus the segment tried is over the cap while the
///    device still had room; or, from a message that cannot print a cap, the
///    device had room (a cap is then likely: hedged);
/// 4. `other_processes`: without the memory outside this process it would
///    fit, and that memory is at least a tenth of the device (at least the
///    request when the device's total is unknown);
/// 5. `capacity`: otherwise, this process's own tensors fill the memory.
pub fn classify(e: &Evidence) -> Classified {
    let plain = |cause| Classified {
        cause,
        hedged_cap: false,
    };
    let tried = e.tried.unwrap_or(0);
    let free = e.device_free.unwrap_or(0);
    if let Some(res) = e.reserved {
        if e.private_free > 0
            && e.private_free.saturating_mul(10) >= res
            && free + e.private_free >= tried
        {
            return plain(Cause::PrivatePools);
        }
    }
    if let (Some(cache), Some(r)) = (e.cache_free, e.request) {
        if e.largest_free.is_none_or(|l| l < r) && cache >= r {
            return plain(Cause::Fragmentation);
        }
    }
    let room = matches!((e.device_free, e.tried), (Some(f), Some(t)) if f >= t);
    if let (Some(cap), Some(t)) = (e.cap, e.tried) {
        if e.reserved.unwrap_or(0).saturating_add(t) > cap && (e.device_free.is_none() || room) {
            return plain(Cause::MemoryCap);
        }
    }
    if room && e.cap.is_none() && e.cap_may_be_unprinted {
        return Classified {
            cause: Cause::MemoryCap,
            hedged_cap: true,
        };
    }
    let share_ok = match e.total {
        Some(t) => e.outside.saturating_mul(10) >= t,
        None => e.outside >= tried,
    };
    if e.outside > 0 && e.outside >= tried.saturating_sub(free) && share_ok {
        return plain(Cause::OtherProcesses);
    }
    plain(Cause::Capacity)
}
