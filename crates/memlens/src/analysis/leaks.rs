//! `memlens leaks`: sites whose live memory keeps growing.
//!
//! Two kinds of evidence:
//! * across snapshots of one run: the live bytes of each site at each snapshot
//!   (step numbers are read from names like `snapshot.step5.pickle`);
//! * within one trace: the memory each site still holds at the end of each
//!   step ([`super::steps`]), skipping the first step, whose growth is warm-up
//!   (optimizer state, caches that fill once).
//!
//! A finding is `high` when the site grows in every interval, by at least
//! 1 MiB in all and roughly steadily; `medium` when it grows in most
//! intervals and ends at its maximum; growth that stops is not a leak.

use super::diff::live_by_site;
use super::sites::{stack_lines, Site, SiteIndex};
use super::steps::{self, StepMethod};
use crate::snapshot::{Action, Snapshot, StackId};
use serde::Serialize;
use std::collections::HashMap;

/// How sure a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    /// Some growth, not steady.
    Low,
    /// Growth in most intervals.
    Medium,
    /// Steady growth in every interval.
    High,
}

/// One leak candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Leak {
    /// `file:line` of the innermost user frame of the growing allocations.
    pub site: String,
    /// The function of that line.
    pub function: String,
    /// Growth over the evidence, in bytes.
    pub bytes: u64,
    /// Growth per step (per snapshot interval when steps are unknown).
    pub bytes_per_step: u64,
    /// Growth in the number of live blocks.
    pub count: u64,
    /// Number of steps (or snapshots) the evidence covers.
    pub steps: usize,
    /// How sure the finding is.
    pub confidence: Confidence,
    /// What to change, from what the evidence shows.
    pub suggestion: String,
    /// Live bytes of the site at each snapshot or at the end of each step.
    pub evidence: Vec<u64>,
    /// Where the evidence points were taken (snapshot names or step numbers).
    pub evidence_labels: Vec<String>,
    /// An example stack of the growing allocations, innermost first.
    pub stack: Vec<String>,
    /// The allocating line and the line keeping the tensors alive, when the
    /// source is readable (`source` and `keeper` in JSON); filled by
    /// [`crate::source::SourceFinder::annotate_leaks`].
    #[serde(flatten)]
    pub quote: crate::source::SourceQuote,
}

/// The result of a leak search.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeakReport {
    /// `across_snapshots` or `within_trace`.
    pub method: String,
    /// How steps were found (within a trace).
    pub step_method: Option<StepMethod>,
    /// The loop the steps come from, as `file:function`.
    pub loop_function: Option<String>,
    /// Memory held at each evidence point, all sites together.
    pub retained_bytes: Vec<u64>,
    /// Findings, most likely first.
    pub leaks: Vec<Leak>,
    /// One line for people: the leak and where, or that none was found.
    pub verdict: String,
}

impl LeakReport {
    /// True when a finding of high confidence exists.
    pub fn has_high_confidence(&self) -> bool {
        self.leaks.iter().any(|l| l.confidence == Confidence::High)
    }
}

/// Below this total growth nothing is reported.
const MIN_GROWTH: u64 = 1 << 20;

/// Step number in a snapshot's file name (`...step5...`), if any.
pub fn step_in_name(name: &str) -> Option<u64> {
    let lower = name.to_ascii_lowercase();
    let i = lower.rfind("step")?;
    let digits: String = lower[i + 4..]
        .chars()
        .skip_while(|c| *c == '_' || *c == '-')
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// Judges a series of live bytes; `None` when it is not growth.
fn judge(series: &[u64]) -> Option<Confidence> {
    if series.len() < 2 {
        return None;
    }
    let first = series[0];
    let last = *series.last()?;
    if last < first + MIN_GROWTH {
        return None;
    }
    let deltas: Vec<i128> = series
        .windows(2)
        .map(|w| w[1] as i128 - w[0] as i128)
        .collect();
    let grew = deltas.iter().filter(|d| **d > 0).count();
    let shrank = deltas.iter().filter(|d| **d < 0).count();
    let max = *series.iter().max()?;
    let mean = (last - first) as f64 / deltas.len() as f64;
    let steady = deltas.iter().all(|d| *d as f64 >= 0.25 * mean);
    if grew == deltas.len() && steady && deltas.len() >= 2 {
        Some(Confidence::High)
    } else if grew * 4 >= deltas.len() * 3 && shrank <= 1 && last == max && deltas.len() >= 2 {
        Some(Confidence::Medium)
    } else {
        Some(Confidence::Low)
    }
}

/// What the evidence says about how the memory is kept.
struct Traits {
    /// Backward ran during the steps where the site grew.
    backward_seen: bool,
    /// Average size of a kept block.
    avg_block: u64,
    /// Blocks added per step.
    blocks_per_step: f64,
    /// The site's function is a module's `forward`.
    in_forward: bool,
}

fn suggestion(site: &str, t: &Traits) -> String {
    if t.avg_block <= 4096 && t.blocks_per_step <= 2.0 {
        return format!(
            "A small tensor from {site} is kept every step, like a loss added up as a tensor (`total += loss`). Accumulate a Python number instead: `total += loss.item()`."
        );
    }
    if !t.backward_seen {
        return format!(
            "Memory allocated under {site} is never freed and no backward pass runs: evaluation without `torch.no_grad()` / `torch.inference_mode()` keeps the autograd graph (every saved activation) alive as long as an output is referenced. Wrap the evaluation in `with torch.no_grad():` and keep `loss.item()`, not the tensor."
        );
    }
    if t.in_forward {
        return format!(
            "Tensors made at {site} are kept across steps with their autograd graph: a module attribute, list or cache holds them. Store `.detach()` (or `.detach().cpu()`, or a Python number) instead, or clear the container each step."
        );
    }
    format!(
        "Tensors made at {site} are kept across steps: something (a list, a dict, a module attribute, a global) still references them. Keep `.detach().cpu()` or Python numbers instead, or clear the container each step."
    )
}

fn is_backward_frame(snap: &Snapshot, stack: StackId) -> bool {
    snap.stack(stack).iter().any(|&f| {
        let fr = snap.frame(f);
        let name = snap.str(fr.name);
        let file = snap.str(fr.filename);
        (name == "backward" || name == "_engine_run_backward")
            && (file.contains("torch/autograd") || file.ends_with("torch/_tensor.py"))
    })
}

/// Leaks across several snapshots of one run (given in any order; ordered by
/// the step in their names, else as given).
pub fn across_snapshots(snaps: &[(String, &Snapshot)]) -> LeakReport {
    let mut order: Vec<usize> = (0..snaps.len()).collect();
    let steps: Vec<Option<u64>> = snaps.iter().map(|(n, _)| step_in_name(n)).collect();
    if steps.iter().all(Option::is_some) {
        order.sort_by_key(|&i| steps[i]);
    } else if steps.iter().any(Option::is_some) {
        // Named steps first, in step order; the others (a final snapshot) after.
        order.sort_by_key(|&i| (steps[i].is_none(), steps[i]));
    }
    let lives: Vec<_> = order.iter().map(|&i| live_by_site(snaps[i].1)).collect();
    let labels: Vec<String> = order.iter().map(|&i| snaps[i].0.clone()).collect();
    let retained: Vec<u64> = lives
        .iter()
        .map(|l| l.values().map(|v| v.bytes).sum())
        .collect();
    let mut sites: Vec<&Site> = lives.iter().flat_map(|l| l.keys()).collect();
    sites.sort();
    sites.dedup();
    let last = snaps[*order.last().unwrap_or(&0)].1;
    // Did backward run lately? Look at the last two steps of the last trace.
    let backward_seen = last.traces.first().is_some_and(|t| {
        let st = steps::detect(last, 0);
        let from = st.starts[st.len().saturating_sub(2)];
        t.events[from..]
            .iter()
            .any(|e| e.action == Action::Alloc && is_backward_frame(last, e.stack))
    });
    let step_span = match (steps[order[0]], steps[*order.last().unwrap_or(&0)]) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    let mut leaks = Vec::new();
    for site in sites {
        let series: Vec<u64> = lives
            .iter()
            .map(|l| l.get(site).map_or(0, |v| v.bytes))
            .collect();
        let Some(mut conf) = judge(&series) else {
            continue;
        };
        if series.len() < 3 {
            conf = conf.min(Confidence::Medium);
        }
        let counts: Vec<u64> = lives
            .iter()
            .map(|l| l.get(site).map_or(0, |v| v.count))
            .collect();
        let growth = series.last().unwrap_or(&0) - series[0];
        let per = step_span.unwrap_or((series.len() - 1) as u64).max(1);
        let count = counts.last().unwrap_or(&0).saturating_sub(counts[0]);
        let stack = lives
            .iter()
            .rev()
            .find_map(|l| l.get(site))
            .map_or(0, |v| v.stack);
        let traits = Traits {
            backward_seen,
            avg_block: growth / count.max(1),
            blocks_per_step: count as f64 / per as f64,
            in_forward: site.function == "forward",
        };
        leaks.push(Leak {
            site: site.site.clone(),
            function: site.function.clone(),
            bytes: growth,
            bytes_per_step: growth / per,
            count,
            steps: series.len(),
            confidence: conf,
            suggestion: suggestion(&site.site, &traits),
            evidence: series,
            evidence_labels: labels.clone(),
            stack: stack_lines(last, stack),
            quote: Default::default(),
        });
    }
    finish("across_snapshots", None, None, retained, leaks)
}

/// Leaks within the trace of one snapshot, step by step.
pub fn within_trace(snap: &Snapshot) -> LeakReport {
    let mut leaks = Vec::new();
    let mut retained = Vec::new();
    let mut method = None;
    let mut loop_function = None;
    let index = SiteIndex::new(snap);
    for (ti, trace) in snap.traces.iter().enumerate() {
        let st = steps::detect(snap, ti);
        if st.len() < 4 {
            continue; // too few steps to tell growth from warm-up
        }
        method = Some(st.method);
        loop_function = st.loop_function.clone();
        // Live memory by site at the end of every step.
        let mut live: HashMap<u64, (u64, StackId)> = HashMap::new();
        let mut points: Vec<HashMap<Option<u32>, (u64, u64, StackId)>> = Vec::new();
        let mut backward_in_step = vec![false; st.len()];
        let mut step = 0;
        let mut next_cut = st.starts.get(1).copied().unwrap_or(usize::MAX);
        let record = |live: &HashMap<u64, (u64, StackId)>| {
            let mut agg: HashMap<Option<u32>, (u64, u64, StackId)> = HashMap::new();
            for &(bytes, stack) in live.values() {
                let e = agg.entry(index.site(stack)).or_insert((0, 0, stack));
                e.0 += bytes;
                e.1 += 1;
                // The smallest stack id: the same example whatever the hash order.
                e.2 = e.2.min(stack);
            }
            agg
        };
        for (i, e) in trace.events.iter().enumerate() {
            while i == next_cut {
                points.push(record(&live));
                step += 1;
                next_cut = st.starts.get(step + 1).copied().unwrap_or(usize::MAX);
            }
            match e.action {
                Action::Alloc => {
                    // 512-byte rounding: close to the allocator's block sizes,
                    // and the shape of growth is what matters here.
                    live.insert(e.addr, (e.size.div_ceil(512).max(1) * 512, e.stack));
                    if !backward_in_step[step] && is_backward_frame(snap, e.stack) {
                        backward_in_step[step] = true;
                    }
                }
                Action::FreeCompleted => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        // Points are taken where each step ends and the next begins; the end of
        // the trace is not one, as it may hold the teardown after the loop.
        // Skip the first step: what it leaves behind is warm-up.
        if points.len() < 3 {
            continue;
        }
        let pts = &points[1..];
        retained = pts.iter().map(|p| p.values().map(|v| v.0).sum()).collect();
        let mut keys: Vec<Option<u32>> = pts.iter().flat_map(|p| p.keys().copied()).collect();
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            let series: Vec<u64> = pts.iter().map(|p| p.get(&key).map_or(0, |v| v.0)).collect();
            let Some(conf) = judge(&series) else { continue };
            let counts: Vec<u64> = pts.iter().map(|p| p.get(&key).map_or(0, |v| v.1)).collect();
            let stack = pts
                .iter()
                .rev()
                .find_map(|p| p.get(&key))
                .map_or(0, |v| v.2);
            let site = Site::of(snap, &index, stack);
            let growth = series.last().unwrap_or(&0) - series[0];
            let intervals = (series.len() - 1) as u64;
            let count = counts.last().unwrap_or(&0).saturating_sub(counts[0]);
            let traits = Traits {
                backward_seen: backward_in_step[1..].iter().any(|b| *b),
                avg_block: growth / count.max(1),
                blocks_per_step: count as f64 / intervals as f64,
                in_forward: site.function == "forward",
            };
            leaks.push(Leak {
                suggestion: suggestion(&site.site, &traits),
                site: site.site,
                function: site.function,
                bytes: growth,
                bytes_per_step: growth / intervals,
                count,
                steps: series.len(),
                confidence: conf,
                evidence: series,
                evidence_labels: (2..=pts.len() + 1)
                    .map(|s| format!("after step {s}"))
                    .collect(),
                stack: stack_lines(snap, stack),
                quote: Default::default(),
            });
        }
    }
    finish("within_trace", method, loop_function, retained, leaks)
}

fn finish(
    method: &str,
    step_method: Option<StepMethod>,
    loop_function: Option<String>,
    retained_bytes: Vec<u64>,
    mut leaks: Vec<Leak>,
) -> LeakReport {
    leaks.sort_by_key(|l| std::cmp::Reverse((l.confidence, l.bytes)));
    let verdict = match leaks.first() {
        Some(l) if l.confidence >= Confidence::Medium => format!(
            "Leak: {} per step at {} in {} ({} confidence)",
            crate::units::format_bytes(l.bytes_per_step),
            l.site,
            l.function,
            match l.confidence {
                Confidence::High => "high",
                Confidence::Medium => "medium",
                Confidence::Low => "low",
            }
        ),
        _ => "No leak: no site's memory keeps growing".to_string(),
    };
    LeakReport {
        method: method.to_string(),
        step_method,
        loop_function,
        retained_bytes,
        leaks,
        verdict,
    }
}

/// Leaks from one or several snapshots: across them when there are several,
/// within the trace when there is one.
pub fn find(snaps: &[(String, &Snapshot)]) -> LeakReport {
    match snaps {
        [] => finish("within_trace", None, None, Vec::new(), Vec::new()),
        [(_, one)] => within_trace(one),
        many => across_snapshots(many),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_growth() {
        let mib = 1 << 20;
        assert_eq!(
            judge(&[mib, 2 * mib, 3 * mib, 4 * mib]),
            Some(Confidence::High)
        );
        assert_eq!(judge(&[mib, mib, mib]), None, "flat is healthy");
        assert_eq!(
            judge(&[mib, 3 * mib, 3 * mib, 3 * mib]),
            Some(Confidence::Low),
            "growth that stops"
        );
        assert_eq!(
            judge(&[5 * mib, 2 * mib, 9 * mib, mib, 7 * mib]),
            Some(Confidence::Low)
        );
    }

    #[test]
    fn reads_steps_from_names() {
        assert_eq!(step_in_name("gpt2_eval_leak.step11.pickle.zst"), Some(11));
        assert_eq!(step_in_name("/tmp/run/snapshot_step_5.pickle"), Some(5));
        assert_eq!(step_in_name("final.pickle"), None);
    }
}
