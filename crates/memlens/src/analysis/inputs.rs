//! How several input snapshots relate: periodic snapshots of one process (a
//! time series), the ranks of one distributed job, or unrelated runs that must
//! be analysed one by one.
//!
//! The rules, in order (none reads the order the files were given in):
//! 1. Files whose names carry `rank<N>` (`rank0`, `rank_1`, `rank-2`) belong to
//!    rank N; several files of one rank are that rank's periodic snapshots.
//! 2. Otherwise, files are grouped by process: two snapshots of one process
//!    share trace events (the later trace holds the earlier one's last event,
//!    or both start with the same event), or their names differ only in a
//!    step number.
//! 3. Processes that run the same program (nearly the same set of allocation
//!    sizes, or of frames) and whose traces overlap in time, or that traced
//!    different device indices, are the ranks of one job. Anything else is an
//!    unrelated run: several workloads run at once on one GPU overlap in time
//!    too, but do not run the same program.
//! 4. `--ranks` makes every process a rank of one job.

use super::leaks::step_in_name;
use crate::snapshot::{Action, Snapshot, TraceEvent};
use serde::Serialize;
use std::collections::HashSet;

/// What a group of inputs is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// One snapshot.
    Single,
    /// Periodic snapshots of one process, oldest first.
    Series,
    /// The ranks of one job (each rank one snapshot or a series).
    Ranks,
}

/// One process of a group: a rank, or the only process of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    /// The rank, for a group of ranks: from the file name when it says, else
    /// the position after sorting by device and start time.
    pub rank: Option<u32>,
    /// Indices of the input files, oldest first.
    pub files: Vec<usize>,
}

/// Inputs that are analysed together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    /// Single, series or ranks.
    pub kind: GroupKind,
    /// The processes, by rank (or the one process).
    pub members: Vec<Member>,
}

impl Group {
    /// All files of the group, rank by rank, oldest first.
    pub fn files(&self) -> Vec<usize> {
        self.members
            .iter()
            .flat_map(|m| m.files.iter().copied())
            .collect()
    }
}

/// How the inputs were grouped, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Grouping {
    /// The groups, each analysed on its own (one, unless the inputs are
    /// unrelated runs).
    pub groups: Vec<Group>,
    /// One line for people: what the inputs were taken to be, and why.
    pub reason: String,
}

/// What the grouping reads of one snapshot.
#[derive(Clone, Debug)]
struct Facts {
    name: String,
    rank_in_name: Option<u32>,
    step: Option<u64>,
    /// The name with its step number taken out (series of one run share it).
    stem: String,
    devices: Vec<u32>,
    /// First and last event times (µs), when the trace has times.
    span: Option<(i64, i64)>,
    first: Option<TraceEvent>,
    last: Option<TraceEvent>,
    /// Distinct sizes of the `alloc` events.
    sizes: HashSet<u64>,
    /// Distinct frames (`file:line`).
    frames: HashSet<(String, u32)>,
    /// The allocator settings the process ran with.
    config: crate::sim::config::AllocatorConfig,
}

fn facts(name: &str, snap: &Snapshot) -> Facts {
    let events = || snap.traces.iter().flat_map(|t| t.events.iter());
    let timed = || events().filter(|e| e.time_us > 0);
    let span = match (
        timed().map(|e| e.time_us).min(),
        timed().map(|e| e.time_us).max(),
    ) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    };
    let trace = snap.traces.iter().find(|t| !t.events.is_empty());
    Facts {
        name: name.to_string(),
        rank_in_name: rank_in_name(name),
        step: step_in_name(name),
        stem: without_step(base_name(name)),
        devices: snap
            .traces
            .iter()
            .filter(|t| !t.events.is_empty())
            .map(|t| t.device)
            .collect(),
        span,
        config: crate::replay::config::recorded_config(&snap.settings),
        first: trace.and_then(|t| t.events.first().copied()),
        last: trace.and_then(|t| t.events.last().copied()),
        sizes: events()
            .filter(|e| e.action == Action::Alloc)
            .map(|e| e.size)
            .collect(),
        frames: snap
            .frames
            .iter()
            .map(|f| (snap.str(f.filename).to_string(), f.line))
            .collect(),
    }
}

/// A file's name without its folders (`job/ddp.rank0.pickle` -> `ddp.rank0.pickle`).
pub(crate) fn base_name(name: &str) -> &str {
    name.rsplit(['/', '\\']).next().unwrap_or(name)
}

/// Why `members` processes were taken as the ranks of one job (`why`: the
/// rule that said so, as [`NAMED_RANKS`]).
pub fn ranks_reason(members: usize, why: &str) -> String {
    format!("{members} processes of one job ({why}): analysed as ranks, side by side")
}

/// The grouping's first rule, in the words of [`ranks_reason`].
pub const NAMED_RANKS: &str = "rank<N> in their names";

/// The rank a file name states: `rank` (any case) followed by an optional
/// `_` or `-` and digits, not preceded by a letter (`frank3` is no rank).
pub fn rank_in_name(name: &str) -> Option<u32> {
    let base = base_name(name).to_ascii_lowercase();
    let bytes = base.as_bytes();
    let mut from = 0;
    while let Some(i) = base[from..].find("rank").map(|i| i + from) {
        from = i + 4;
        if i > 0 && bytes[i - 1].is_ascii_alphabetic() {
            continue;
        }
        let mut j = i + 4;
        if matches!(bytes.get(j), Some(b'_' | b'-')) {
            j += 1;
        }
        let digits: String = base[j..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Ok(n) = digits.parse() {
            return Some(n);
        }
    }
    None
}

/// The name with digits after `step` removed (`a.step4.pickle` -> `a.step.pickle`).
fn without_step(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    match lower.find("step") {
        Some(i) => {
            let rest = &name[i + 4..];
            let rest = rest.trim_start_matches(['_', '-']);
            let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{}step{}", &name[..i], rest)
        }
        None => name.to_string(),
    }
}

fn same_event(a: &TraceEvent, b: &TraceEvent) -> bool {
    a.time_us == b.time_us && a.addr == b.addr && a.size == b.size && a.action == b.action
}

/// True when `event` (with a time) is in the traces of `snap`: found by time,
/// as traces are in time order.
fn holds(snap: &Snapshot, event: &TraceEvent) -> bool {
    snap.traces.iter().any(|t| {
        let start = t.events.partition_point(|e| e.time_us < event.time_us);
        t.events[start..]
            .iter()
            .take_while(|e| e.time_us == event.time_us)
            .any(|e| same_event(e, event))
    })
}

/// Whether two snapshots come from one process.
fn same_process(a: (&Facts, &Snapshot), b: (&Facts, &Snapshot)) -> bool {
    let (fa, sa) = a;
    let (fb, sb) = b;
    match (fa.rank_in_name, fb.rank_in_name) {
        (Some(x), Some(y)) => return x == y,
        (Some(_), None) | (None, Some(_)) => return false,
        (None, None) => {}
    }
    if let (Some(x), Some(y)) = (fa.first, fb.first) {
        if x.time_us > 0 && same_event(&x, &y) {
            return true;
        }
    }
    let shares =
        |f: &Facts, other: &Snapshot| f.last.is_some_and(|e| e.time_us > 0 && holds(other, &e));
    if shares(fa, sb) || shares(fb, sa) {
        return true;
    }
    // A series whose trace was cleared between dumps: the names say so.
    fa.step.is_some() && fb.step.is_some() && fa.stem == fb.stem
}

fn overlap(a: Option<(i64, i64)>, b: Option<(i64, i64)>) -> bool {
    match (a, b) {
        (Some((a0, a1)), Some((b0, b1))) => a0.max(b0) <= a1.min(b1),
        _ => false,
    }
}

fn jaccard<T: std::hash::Hash + Eq>(a: &HashSet<T>, b: &HashSet<T>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 0.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

/// Ranks of one job run one program: nearly the same allocation sizes (1.0
/// on the corpus's 2-rank job; at most 0.65 between different workloads of
/// the fixtures), or nearly the same frames when the data differs by rank.
fn same_program(a: &Facts, b: &Facts) -> bool {
    jaccard(&a.sizes, &b.sizes) >= 0.8 || jaccard(&a.frames, &b.frames) >= 0.95
}

/// Where and when a process ran and under which allocator settings: what
/// tells an A/B pair from two ranks.
type Placement<'a> = (
    &'a [u32],
    Option<(i64, i64)>,
    &'a crate::sim::config::AllocatorConfig,
);

/// Two processes on the same devices at the same time under different
/// allocator settings: one program run twice to compare the settings (an
/// A/B pair), not two ranks of one job (ranks share their settings).
fn ab_pair(a: Placement<'_>, b: Placement<'_>) -> bool {
    !a.0.is_empty() && a.0 == b.0 && overlap(a.1, b.1) && a.2 != b.2
}

impl Process {
    /// The process's devices and time span, with its program's settings.
    fn placement<'a>(&'a self, facts: &'a [Facts]) -> Placement<'a> {
        (&self.devices, self.span, &facts[self.head].config)
    }
}

impl Facts {
    /// The file's devices and time span, with its settings.
    fn placement(&self) -> Placement<'_> {
        (&self.devices, self.span, &self.config)
    }
}

/// A process: files of one process, with their facts merged.
struct Process {
    /// The file that stands for the process's program (its latest).
    head: usize,
    files: Vec<usize>,
    rank_in_name: Option<u32>,
    devices: Vec<u32>,
    span: Option<(i64, i64)>,
}

/// Groups `snaps` (name, snapshot); `force_ranks` takes every process to be
/// a rank of one job (`--ranks`).
pub fn group(snaps: &[(String, &Snapshot)], force_ranks: bool) -> Grouping {
    let n = snaps.len();
    // One input is one group: its facts (a walk over its events) are not needed.
    if n <= 1 {
        return Grouping {
            groups: vec![Group {
                kind: GroupKind::Single,
                members: vec![Member {
                    rank: None,
                    files: (0..n).collect(),
                }],
            }],
            reason: String::new(),
        };
    }
    let facts: Vec<Facts> = snaps.iter().map(|(n, s)| facts(n, s)).collect();
    let procs = processes(snaps, &facts);
    let named = procs.iter().all(|p| p.rank_in_name.is_some());
    let jobs = jobs(&procs, &facts, force_ranks, named);
    let mut groups = job_groups(jobs, &procs, &facts);
    // Unrelated runs: oldest first, then by name.
    groups.sort_by_key(|g| {
        let f = g.members[0].files[0];
        (facts[f].span.map(|s| s.0), facts[f].name.clone())
    });
    let reason = reason(&groups, &facts, force_ranks, named);
    Grouping { groups, reason }
}

/// The root of `i` in the union-find forest `p` (halving the path on the way).
fn root(p: &mut [usize], mut i: usize) -> usize {
    while p[i] != i {
        p[i] = p[p[i]];
        i = p[i];
    }
    i
}

/// The processes of `snaps`: connected components of "same process", each
/// with its files oldest first, its devices and its time span.
fn processes(snaps: &[(String, &Snapshot)], facts: &[Facts]) -> Vec<Process> {
    // Processes: connected components of "same process".
    let n = snaps.len();
    let mut parent: Vec<usize> = (0..n).collect();
    for i in 0..n {
        for j in i + 1..n {
            if same_process((&facts[i], snaps[i].1), (&facts[j], snaps[j].1)) {
                let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    let mut procs: Vec<Process> = Vec::new();
    let mut of_root = vec![usize::MAX; n];
    for (i, fact) in facts.iter().enumerate() {
        let r = root(&mut parent, i);
        if of_root[r] == usize::MAX {
            of_root[r] = procs.len();
            procs.push(Process {
                head: i,
                files: Vec::new(),
                rank_in_name: fact.rank_in_name,
                devices: Vec::new(),
                span: None,
            });
        }
        let p = &mut procs[of_root[r]];
        p.files.push(i);
        p.devices.extend(&fact.devices);
        p.span = match (p.span, fact.span) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (s, None) | (None, s) => s,
        };
    }
    for p in &mut procs {
        p.devices.sort_unstable();
        p.devices.dedup();
        // Oldest first: by the last event's time, then by the step in the
        // name (a name without one is the final snapshot), then by name.
        p.files.sort_by(|&a, &b| {
            let key = |i: usize| {
                (
                    facts[i].span.map(|s| s.1),
                    facts[i].step.unwrap_or(u64::MAX),
                    facts[i].name.clone(),
                )
            };
            key(a).cmp(&key(b))
        });
        p.head = *p.files.last().unwrap_or(&p.head);
    }
    procs
}

/// The jobs: groups of processes (indices into `procs`) that ran at the same
/// time on different devices, or whose names state ranks (`named`), or all of
/// them with `force_ranks`.
fn jobs(procs: &[Process], facts: &[Facts], force_ranks: bool, named: bool) -> Vec<Vec<usize>> {
    // Jobs: processes that ran at the same time, on different devices, or
    // whose names state ranks.
    let m = procs.len();
    let mut jp: Vec<usize> = (0..m).collect();
    for i in 0..m {
        for j in i + 1..m {
            let (a, b) = (&procs[i], &procs[j]);
            let at_once = overlap(a.span, b.span)
                || ((a.span.is_none() || b.span.is_none())
                    && !a.devices.is_empty()
                    && !b.devices.is_empty()
                    && a.devices != b.devices);
            let together = force_ranks
                || named
                || (at_once
                    && !ab_pair(a.placement(facts), b.placement(facts))
                    && same_program(&facts[a.head], &facts[b.head]));
            if together {
                let (x, y) = (root(&mut jp, i), root(&mut jp, j));
                jp[x.max(y)] = x.min(y);
            }
        }
    }
    let mut jobs: Vec<Vec<usize>> = Vec::new();
    let mut job_of = vec![usize::MAX; m];
    for i in 0..m {
        let r = root(&mut jp, i);
        if job_of[r] == usize::MAX {
            job_of[r] = jobs.len();
            jobs.push(Vec::new());
        }
        jobs[job_of[r]].push(i);
    }
    jobs
}

/// One group per job: its processes in rank order (as ranks when there are
/// several), or a single file or a series of one process.
fn job_groups(jobs: Vec<Vec<usize>>, procs: &[Process], facts: &[Facts]) -> Vec<Group> {
    let sort_key = |p: &Process| {
        (
            p.rank_in_name,
            p.devices.first().copied(),
            p.span.map(|s| s.0),
            facts[p.files[0]].name.clone(),
        )
    };
    jobs.into_iter()
        .map(|mut job| {
            job.sort_by(|&a, &b| sort_key(&procs[a]).cmp(&sort_key(&procs[b])));
            let ranks = job.len() > 1;
            let members: Vec<Member> = job
                .iter()
                .enumerate()
                .map(|(k, &p)| Member {
                    rank: ranks.then(|| procs[p].rank_in_name.unwrap_or(k as u32)),
                    files: procs[p].files.clone(),
                })
                .collect();
            let kind = match (ranks, members[0].files.len()) {
                (true, _) => GroupKind::Ranks,
                (false, 1) => GroupKind::Single,
                (false, _) => GroupKind::Series,
            };
            Group { kind, members }
        })
        .collect()
}

/// Whether some two of the runs `groups` ran at the same time on the same
/// devices under different allocator settings.
fn ab_runs(groups: &[Group], facts: &[Facts]) -> bool {
    let heads: Vec<&Facts> = groups
        .iter()
        .filter_map(|g| g.files().last().map(|&f| &facts[f]))
        .collect();
    heads.iter().enumerate().any(|(i, a)| {
        heads[i + 1..]
            .iter()
            .any(|b| ab_pair(a.placement(), b.placement()) && same_program(a, b))
    })
}

fn reason(groups: &[Group], facts: &[Facts], force: bool, named: bool) -> String {
    match groups {
        [g] => match g.kind {
            GroupKind::Single => String::new(),
            GroupKind::Series => format!(
                "{} snapshots of one process (they share trace events{}): analysed as a time series, oldest first",
                g.files().len(),
                if g.files().iter().all(|&f| facts[f].step.is_some()) { " or step numbers" } else { "" }
            ),
            GroupKind::Ranks => {
                let why = if force {
                    "--ranks"
                } else if named {
                    NAMED_RANKS
                } else if g.members.windows(2).all(|w| {
                    let s = |m: &Member| {
                        m.files.iter().filter_map(|&f| facts[f].span).reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
                    };
                    overlap(s(&w[0]), s(&w[1]))
                }) {
                    "one program, traces overlapping in time"
                } else {
                    "one program, on different devices"
                };
                ranks_reason(g.members.len(), why)
            }
        },
        many if ab_runs(many, facts) => format!(
            "{} runs of one program on the same GPU at the same time under different allocator settings (an A/B comparison, not ranks): each is analysed on its own",
            many.len()
        ),
        many => format!(
            "{} unrelated runs (no shared trace events, not one program running at the same time, no rank or step in the names): each is analysed on its own",
            many.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ranks_from_names() {
        assert_eq!(rank_in_name("job/ddp.rank0.pickle.zst"), Some(0));
        assert_eq!(rank_in_name("snapshot_rank_12.pickle"), Some(12));
        assert_eq!(rank_in_name("Rank-3.pickle"), Some(3));
        assert_eq!(rank_in_name("frank3.pickle"), None);
        assert_eq!(rank_in_name("ranks.pickle"), None);
    }

    #[test]
    fn strips_steps() {
        assert_eq!(without_step("a.step4.pickle"), "a.step.pickle");
        assert_eq!(without_step("a.step_12.pickle"), "a.step.pickle");
        assert_eq!(without_step("final.pickle"), "final.pickle");
    }
}
