//! Leak finder and snapshot diff on the real fixtures (issue 4's acceptance).

mod common;

use common::fixture;
use memlens::analysis::diff::diff;
use memlens::analysis::leaks::{find, Confidence};
use memlens::analysis::steps::StepMethod;
use memlens::snapshot::{BlockState, Snapshot};
use memlens::trace::Analysed;

fn load(name: &str) -> Snapshot {
    Snapshot::load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

// Lines of ../shared/fixtures/gen/workloads.py that keep memory alive.
const EVAL_FORWARD: &str = "/home/user/train/workloads.py:55"; // out = model(input_ids=x, labels=x)
const CACHE_RELU: &str = "/home/user/train/workloads.py:75"; // x = torch.relu(layer(x))

fn first_finding(names: &[&str]) -> memlens::analysis::leaks::Leak {
    let snaps: Vec<(String, Snapshot)> = names.iter().map(|n| (n.to_string(), load(n))).collect();
    let refs: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let report = find(&refs);
    assert!(
        report.has_high_confidence(),
        "{names:?}: {}",
        report.verdict
    );
    report.leaks[0].clone()
}

#[test]
fn eval_leak_is_found_in_the_step_snapshots() {
    let l = first_finding(&[
        "gpt2_eval_leak.step11.pickle.zst",
        "gpt2_eval_leak.step1.pickle.zst",
        "gpt2_eval_leak.step5.pickle.zst",
    ]);
    assert_eq!(l.site, EVAL_FORWARD);
    assert_eq!(l.confidence, Confidence::High);
    assert_eq!(
        l.evidence_labels[0], "gpt2_eval_leak.step1.pickle.zst",
        "ordered by step"
    );
    assert!(l.suggestion.contains("torch.no_grad()"), "{}", l.suggestion);
    // Ten steps from step 1 to 11: about 500 MiB of saved activations a step.
    assert_eq!(l.bytes_per_step, l.bytes / 10);
    assert!(
        (400 << 20..600 << 20).contains(&l.bytes_per_step),
        "{}",
        l.bytes_per_step
    );
}

#[test]
fn eval_leak_is_found_in_the_final_trace_alone() {
    let l = first_finding(&["gpt2_eval_leak.pickle.zst"]);
    assert_eq!(l.site, EVAL_FORWARD);
    assert_eq!(l.function, "w_gpt2_eval_leak");
    assert!(l.suggestion.contains("torch.no_grad()"), "{}", l.suggestion);
    assert!(l.steps >= 8);
}

#[test]
fn cache_leak_is_found_both_ways() {
    for names in [
        vec![
            "cache_leak.step1.pickle.zst",
            "cache_leak.step5.pickle.zst",
            "cache_leak.step9.pickle.zst",
        ],
        vec!["cache_leak.pickle.zst"],
    ] {
        let l = first_finding(&names);
        assert_eq!(l.site, CACHE_RELU, "{names:?}");
        assert_eq!(l.function, "forward");
        assert_eq!(l.confidence, Confidence::High);
        // Each step keeps four 16x64x64x64 fp32 feature maps: 64 MiB.
        assert_eq!(l.bytes_per_step, 64 << 20, "{names:?}");
        assert!(l.suggestion.contains(".detach()"), "{}", l.suggestion);
    }
}

#[test]
fn healthy_runs_report_no_leak() {
    for name in [
        "gpt2_train",
        "resnet",
        "long",
        "varlen",
        "checkpointed",
        "gpt2_train@expandable",
        "oom",
    ] {
        let snap = load(&format!("{name}.pickle.zst"));
        let report = find(&[(name.to_string(), &snap)]);
        assert!(
            report.leaks.iter().all(|l| l.confidence == Confidence::Low),
            "{name}: {:?}",
            report.leaks.first()
        );
        // checkpointed crashed in its second step: too few steps to judge.
        let expected = if name == "checkpointed" {
            "No verdict: 2 steps recorded"
        } else {
            "No leak"
        };
        assert!(
            report.verdict.starts_with(expected),
            "{name}: {}",
            report.verdict
        );
    }
}

#[test]
fn steps_are_found_from_evidence() {
    // Training with torch.optim: PyTorch's Optimizer.step annotations (the
    // training steps, plus the teardown after the last one as a partial
    // step); an evaluation loop after training has no optimizer steps: the
    // loop of the workload function.
    let cases = [
        ("gpt2_train", StepMethod::Optimizer, 6 + 1, ""),
        ("resnet", StepMethod::Optimizer, 4 + 1, ""),
        ("varlen", StepMethod::Optimizer, 16 + 1, ""),
        ("long", StepMethod::Optimizer, 300 + 1, ""),
        ("cache_leak", StepMethod::Optimizer, 10 + 1, ""),
        ("gpt2_eval_leak", StepMethod::Loop, 12, "w_gpt2_eval_leak"),
    ];
    for (name, method, n, func) in cases {
        let snap = load(&format!("{name}.pickle.zst"));
        let an = Analysed::new(&snap);
        let st = &an.traces[0].steps;
        assert_eq!(st.method, method, "{name}");
        assert_eq!(st.len(), n, "{name}");
        assert!(
            st.loop_function.as_deref().unwrap_or("").ends_with(func),
            "{name}"
        );
    }
}

/// Bytes of allocated blocks whose innermost workloads.py frame is `site`,
/// summed directly over a snapshot's blocks.
fn direct_sum(snap: &Snapshot, site: &str) -> u64 {
    let mut total = 0;
    for seg in &snap.segments {
        for b in seg
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
        {
            let innermost = snap
                .stack(b.stack)
                .iter()
                .find(|&&f| snap.str(snap.frame(f).filename).ends_with("workloads.py"))
                .map(|&f| snap.frame_location(f));
            if innermost.as_deref() == Some(site) {
                total += b.size;
            }
        }
    }
    total
}

#[test]
fn diff_shows_the_leaking_site_on_top_with_exact_bytes() {
    let a = load("gpt2_eval_leak.step1.pickle.zst");
    let b = load("gpt2_eval_leak.step11.pickle.zst");
    let d = diff(&a, &b);
    let top = &d.grown[0];
    assert_eq!(top.site, EVAL_FORWARD);
    let (sa, sb) = (direct_sum(&a, EVAL_FORWARD), direct_sum(&b, EVAL_FORWARD));
    assert_eq!(top.bytes_a, sa);
    assert_eq!(top.bytes_b, sb);
    assert_eq!(top.bytes, sb - sa);
    assert!(!top.stack.is_empty());
    // The reverse direction puts it on top of the shrunk list.
    let r = diff(&b, &a);
    assert_eq!(r.shrunk[0].site, EVAL_FORWARD);
    assert_eq!(r.shrunk[0].bytes, sb - sa);
}
