//! Issue 30, "the largest batch from an OOM snapshot", on real OOMs of seven
//! workloads of different shapes (tests/corpus/oom/first_step, recorded by
//! tests/gpu/first_step_oom.py on an H200 under the caps of
//! tests/corpus/fit, whose bisection on the GPU gives the true largest batch).
//! One batch over the largest, every workload ran its first step and failed in
//! its second (a warm OOM); far over it, most failed in the first step's
//! forward or backward. `oom`'s largest batch is checked against the truth.

use memlens::oom::whatif::TemplateKind;
use memlens::oom::{analyze_snapshot, FirstStepOptimizer, OomOptions, OomReport};
use memlens::Snapshot;
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/oom")
}

fn truth() -> Value {
    let text = std::fs::read_to_string(dir().join("first_step/truth.json")).expect("truth.json");
    serde_json::from_str(&text).expect("valid truth.json")
}

/// `oom` on `first_step/NAME` (or the corpus's own `gpt_first`) with the
/// failing batch and the error text, as a user with both would run it.
fn analyze(name: &str, batch: u64) -> OomReport {
    analyze_with(name, batch, None)
}

/// [`analyze`] told the run's optimizer (`--optimizer`).
fn analyze_with(name: &str, batch: u64, optimizer: Option<FirstStepOptimizer>) -> OomReport {
    let base = if name == "gpt_first" || name == "eval_spike" {
        dir().join(name)
    } else {
        dir().join("first_step").join(name)
    };
    let path = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));
    let text = std::fs::read_to_string(path("message.txt")).expect("message");
    let opts = OomOptions {
        message: Some(memlens::oom::message::find(&text).expect("an OOM message")),
        batch: Some(batch),
        optimizer,
        ..Default::default()
    };
    let snap = Snapshot::load(&path("pickle.zst")).expect("snapshot loads");
    analyze_snapshot(&snap, &opts)
        .expect("analysis runs")
        .expect("the trace holds an OOM")
}

struct Case {
    name: String,
    step: u64,
    phase: String,
    truth: u64,
    said: Option<u64>,
    lower_bound: bool,
    template: TemplateKind,
    state_added: u64,
    /// The step failed in its loss and was completed whole.
    whole: bool,
}

fn cases() -> Vec<Case> {
    let t = truth();
    let mut out = Vec::new();
    let snaps = t["snapshots"].as_object().expect("snapshots");
    let all = snaps
        .iter()
        .map(|(name, r)| (name.clone(), r.clone()))
        // gpt_first: the corpus's student GPT (tests/gpu/oom_harness.py),
        // batch 16 under 3 GiB, largest batch 12 (tests/corpus/oom/truth.json).
        .chain([(
            "gpt_first".to_string(),
            serde_json::json!({"batch": 16, "step": 0, "phase": "backward", "largest_batch": 12}),
        )]);
    for (name, r) in all {
        let batch = r["batch"].as_u64().expect("batch");
        let rep = analyze(&name, batch);
        let b = rep.batch.as_ref();
        let model = rep.step_model.as_ref().expect("a step model");
        out.push(Case {
            name,
            step: r["step"].as_u64().expect("step"),
            phase: r["phase"].as_str().expect("phase").to_string(),
            truth: r["largest_batch"].as_u64().expect("largest_batch"),
            said: b.and_then(|b| b.max_batch),
            lower_bound: b.is_some_and(|b| b.lower_bound),
            template: model.template,
            state_added: model.optimizer_state_added_bytes,
            whole: model.completion.as_ref().is_some_and(|c| c.forward_whole),
        });
    }
    out
}

#[test]
fn the_largest_batch_from_an_oom_snapshot_against_the_gpu() {
    let cases = cases();
    assert_eq!(cases.len(), 20);
    let mut held = 0;
    for c in &cases {
        let said = c
            .said
            .unwrap_or_else(|| panic!("{}: no batch verdict", c.name));
        let ok = said <= c.truth && c.truth - said <= 1;
        held += usize::from(ok);
        eprintln!(
            "{:16} step {} {:8} said {said:2} truth {:2} {:?}{}",
            c.name,
            c.step + 1,
            c.phase,
            c.truth,
            c.template,
            if ok { "" } else { "  (off)" }
        );
        // A batch said to fit (a whole step modelled) is never over the
        // truth: the over-estimates are the steps known only up to the
        // failure, which say "may fit" and "an upper bound".
        if !c.lower_bound {
            assert!(
                said <= c.truth,
                "{}: said {said} fits, true {}",
                c.name,
                c.truth
            );
        }
    }
    // 2 of 20 before this model of the steps (2026-11-29): a first step
    // taken as the template, the previous step's outputs freed by the next,
    // and the optimizer state the steps after a first one hold (9); a first
    // step that failed in its forward completed by a modelled backward and
    // run again as the next step (12); the batches just above the
    // bisection's tried, since fits are not monotone (14: vit 26 and 32 say
    // 24, where the bisection stopped at 22); a step that ran whole before
    // the failing one checked with 2% more of its batch, not 5% (16: bert 24
    // and resnet_amp 24 were four and two below).
    assert!(held >= 16, "exact or one below on {held} of 20");
}

#[test]
fn a_warm_oom_after_one_step_is_modelled_on_that_step() {
    // The first step is the template although it also built the model and
    // made the optimizer state and cuBLAS's workspaces once.
    // ResNet's first step searched cuDNN's plans (`try_configs`, other C++
    // frames) and its second gave up workspaces the first had.
    for c in cases().iter().filter(|c| c.step == 1) {
        assert_eq!(c.template, TemplateKind::PreviousStep, "{}", c.name);
        // Its own operations replayed: exact or one below on all eight.
        let said = c
            .said
            .unwrap_or_else(|| panic!("{}: no batch verdict", c.name));
        assert!(
            said <= c.truth && c.truth - said <= 1,
            "{}: said {said}, true {}",
            c.name,
            c.truth
        );
        assert_eq!(
            c.state_added, 0,
            "{}: its optimizer state was recorded",
            c.name
        );
    }
}

#[test]
fn a_first_step_failing_in_backward_counts_the_optimizer_state_and_is_exact_or_one_below() {
    let cases = cases();
    let first: Vec<&Case> = cases
        .iter()
        .filter(|c| c.step == 0 && c.phase == "backward" && !c.name.starts_with("resnet_amp"))
        .collect();
    assert_eq!(first.len(), 5);
    for c in first {
        assert!(c.state_added > 0, "{}", c.name);
        let said = c.said.expect("a batch");
        // Never over: hf_gpt2 at 24 and bert at 32 failed in NLL loss's
        // backward, whose next node (LogSoftmaxBackward0) is modelled; hf_gpt2
        // said 19 without it (true 18), now 18. bert 32 says 20 with it (23
        // without; true 23), three under. The rest are exact or one below.
        let under = if c.name == "bert.b32" { 3 } else { 1 };
        assert!(
            said <= c.truth && c.truth <= said + under,
            "{}: said {said}, true {}",
            c.name,
            c.truth
        );
    }
}

#[test]
fn the_runs_optimizer_given_replaces_the_assumed_adam_state() {
    // resnet_amp at 28 failed in the backward of its first step; the run
    // used SGD with momentum (tests/gpu/fit_probes.py), one state tensor a
    // parameter where Adam(W), assumed, holds two.
    let truth = truth()["snapshots"]["resnet_amp.b28"]["largest_batch"]
        .as_u64()
        .expect("largest_batch");
    let assumed = analyze("resnet_amp.b28", 28);
    let given = analyze_with("resnet_amp.b28", 28, Some(FirstStepOptimizer::SgdMomentum));
    let (a, g) = (
        assumed.step_model.as_ref().expect("a model"),
        given.step_model.as_ref().expect("a model"),
    );
    assert_eq!(
        (a.first_step_optimizer, a.optimizer_given),
        (Some(FirstStepOptimizer::AdamW), false)
    );
    assert_eq!(
        (g.first_step_optimizer, g.optimizer_given),
        (Some(FirstStepOptimizer::SgdMomentum), true)
    );
    assert_eq!(
        a.optimizer_state_added_bytes,
        2 * g.optimizer_state_added_bytes
    );
    let said = |r: &OomReport| r.batch.as_ref().and_then(|b| b.max_batch).expect("a batch");
    // Assumed, the state errs toward a smaller batch (19); given, the step
    // is one below the GPU's largest.
    assert!(said(&assumed) + 1 < truth, "assumed {}", said(&assumed));
    assert!(
        said(&given) <= truth && truth - said(&given) <= 1,
        "given {}",
        said(&given)
    );
    // Each says which state it counted and whether it was assumed.
    let note = |r: &OomReport| {
        r.warnings
            .iter()
            .find(|w| w.contains("before the optimizer made its state"))
            .cloned()
            .expect("the optimizer note")
    };
    assert!(note(&assumed).contains("assumed"), "{}", note(&assumed));
    assert!(
        note(&given).contains("as given by --optimizer"),
        "{}",
        note(&given)
    );
    // Plain SGD holds none: nothing is added, and the note says so.
    let sgd = analyze_with("resnet_amp.b28", 28, Some(FirstStepOptimizer::Sgd));
    let m = sgd.step_model.as_ref().expect("a model");
    assert_eq!(m.optimizer_state_added_bytes, 0);
    assert!(note(&sgd).contains("no state"), "{}", note(&sgd));
}

#[test]
fn a_first_step_failing_in_its_forward_is_completed_by_a_modelled_backward() {
    let cases = cases();
    let forward: Vec<&Case> = cases
        .iter()
        .filter(|c| c.step == 0 && c.phase == "forward")
        .collect();
    assert_eq!(forward.len(), 6);
    let mut whole = Vec::new();
    for c in forward {
        assert_eq!(c.template, TemplateKind::FailingStepCompleted, "{}", c.name);
        assert!(c.state_added > 0, "{}", c.name);
        // Failed in the loss (the forward's last work): a whole step, whose
        // "fits" is exact or one below. Failed in a layer: the rest of the
        // forward is not recorded, so the batch is an upper bound.
        assert_eq!(c.lower_bound, !c.whole, "{}", c.name);
        if c.whole {
            let said = c.said.expect("a batch");
            assert!(
                said <= c.truth && c.truth <= said + 1,
                "{}: said {said} fits, true {}",
                c.name,
                c.truth
            );
            whole.push(c.name.as_str());
        }
    }
    whole.sort_unstable();
    assert_eq!(whole, ["gpt.b32", "t5.b24"]);
}

#[test]
fn an_evaluation_after_training_is_not_given_a_backward() {
    // tests/corpus/oom/eval_spike: two training steps, then an evaluation
    // under no_grad that fails in its forward; no step before it ran its
    // code, and it has no backward to model.
    let rep = analyze("eval_spike", 128);
    let model = rep.step_model.as_ref().expect("a step model");
    assert_eq!(model.template, TemplateKind::FailingStepOnly);
    assert!(model.completion.is_none());
}
