//! `memlens diff A B`: live memory in B that was not in A, and the reverse,
//! grouped by allocation site. Sites are matched by file, function and line,
//! never by address, so A and B may come from two different runs.

use super::sites::{stack_lines, Site, SiteIndex};
use crate::snapshot::{BlockState, Snapshot, StackId};
use serde::Serialize;
use std::collections::HashMap;

/// Live memory of one site in one snapshot.
#[derive(Clone, Debug, Default)]
pub struct SiteLive {
    /// Bytes of allocated blocks (rounded sizes, as `allocated_bytes` counts).
    pub bytes: u64,
    /// Number of blocks.
    pub count: u64,
    /// The stack of the largest block, as an example.
    pub stack: StackId,
    largest: u64,
}

/// Live (allocated) memory of a snapshot, by site.
pub fn live_by_site(snap: &Snapshot) -> HashMap<Site, SiteLive> {
    let index = SiteIndex::new(snap);
    let mut by_stack: HashMap<StackId, SiteLive> = HashMap::new();
    for seg in &snap.segments {
        for b in seg
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
        {
            let e = by_stack.entry(b.stack).or_default();
            e.bytes += b.size;
            e.count += 1;
            if b.size >= e.largest {
                e.largest = b.size;
                e.stack = b.stack;
            }
        }
    }
    let mut out: HashMap<Site, SiteLive> = HashMap::new();
    for (stack, live) in by_stack {
        let e = out.entry(Site::of(snap, &index, stack)).or_default();
        e.bytes += live.bytes;
        e.count += live.count;
        // Ties go to the smallest stack id, so the example does not depend on hash order.
        if live.largest > e.largest || (live.largest == e.largest && live.stack < e.stack) {
            e.largest = live.largest;
            e.stack = live.stack;
        }
    }
    out
}

/// One site's change between A and B.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteChange {
    /// `file:line` of the innermost user frame.
    pub site: String,
    /// The function of that line.
    pub function: String,
    /// The user frames from the entry script down to `site`.
    pub path: Vec<String>,
    /// `caller -> site in function`, as the other commands show a site.
    pub display: String,
    /// How much the site's live bytes changed (always positive; the list says which way).
    pub bytes: u64,
    /// How much the number of live blocks changed (absolute).
    pub count: u64,
    /// Live bytes in A.
    pub bytes_a: u64,
    /// Live bytes in B.
    pub bytes_b: u64,
    /// Live blocks in A.
    pub count_a: u64,
    /// Live blocks in B.
    pub count_b: u64,
    /// An example stack (the largest block's), innermost first.
    pub stack: Vec<String>,
}

/// The difference between two snapshots.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diff {
    /// Allocated bytes in A.
    pub allocated_a: u64,
    /// Allocated bytes in B.
    pub allocated_b: u64,
    /// Sites holding more in B than in A, largest growth first.
    pub grown: Vec<SiteChange>,
    /// Sites holding less in B than in A, largest drop first.
    pub shrunk: Vec<SiteChange>,
}

/// Compares the live memory of two snapshots by site.
pub fn diff(a: &Snapshot, b: &Snapshot) -> Diff {
    let la = live_by_site(a);
    let lb = live_by_site(b);
    let mut grown = Vec::new();
    let mut shrunk = Vec::new();
    let empty = SiteLive::default();
    let mut sites: Vec<&Site> = la.keys().chain(lb.keys()).collect();
    sites.sort();
    sites.dedup();
    for site in sites {
        let x = la.get(site).unwrap_or(&empty);
        let y = lb.get(site).unwrap_or(&empty);
        if x.bytes == y.bytes && x.count == y.count {
            continue;
        }
        let (snap, stack) = if y.bytes >= x.bytes {
            (b, y.stack)
        } else {
            (a, x.stack)
        };
        let change = SiteChange {
            site: site.site.clone(),
            function: site.function.clone(),
            path: site.path.clone(),
            display: site.display(),
            bytes: x.bytes.abs_diff(y.bytes),
            count: x.count.abs_diff(y.count),
            bytes_a: x.bytes,
            bytes_b: y.bytes,
            count_a: x.count,
            count_b: y.count,
            stack: stack_lines(snap, stack),
        };
        if y.bytes > x.bytes || (y.bytes == x.bytes && y.count > x.count) {
            grown.push(change);
        } else {
            shrunk.push(change);
        }
    }
    let key = |c: &SiteChange| (std::cmp::Reverse(c.bytes), c.site.clone());
    grown.sort_by_key(key);
    shrunk.sort_by_key(key);
    let total = |l: &HashMap<Site, SiteLive>| l.values().map(|v| v.bytes).sum();
    Diff {
        allocated_a: total(&la),
        allocated_b: total(&lb),
        grown,
        shrunk,
    }
}
