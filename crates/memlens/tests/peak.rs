//! `peak` on the real fixtures (issue 3's acceptance): exact peaks, and
//! plausible categories.

mod common;

use common::{fixture, stats, FIXTURES};
use memlens::analysis::peak::peak;
use memlens::snapshot::Snapshot;

fn load(name: &str) -> Snapshot {
    Snapshot::load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn peaks_equal_memory_stats_exactly() {
    for name in FIXTURES {
        let st = stats(name);
        let ms = &st["memory_stats"];
        let r = peak(&load(&format!("{name}.pickle.zst")), 10);
        assert_eq!(
            Some(r.peak_allocated_bytes),
            ms["allocated_bytes.all.peak"].as_u64(),
            "{name} allocated peak"
        );
        assert_eq!(
            Some(r.peak_reserved_bytes),
            ms["reserved_bytes.all.peak"].as_u64(),
            "{name} reserved peak"
        );
        assert!(r.peak_event_index.is_some(), "{name}");
        let live: u64 = r.category_detail.iter().map(|c| c.bytes).sum();
        assert!(
            live <= r.peak_allocated_bytes,
            "{name}: live at peak within the peak"
        );
    }
}

fn cat(r: &memlens::analysis::peak::PeakReport, c: &str) -> f64 {
    r.categories.get(c).copied().unwrap_or(0) as f64
}

/// GPT-2 with AdamW: parameters are `params` x 4 bytes (fp32 weights under
/// autocast), AdamW keeps two fp32 moments, activations are the bulk.
#[test]
fn gpt2_train_categories_are_plausible() {
    let params = stats("gpt2_train")["params"].as_u64().unwrap() as f64;
    let r = peak(&load("gpt2_train.pickle.zst"), 10);
    let p = cat(&r, "parameter");
    assert!(
        (p / (params * 4.0) - 1.0).abs() < 0.02,
        "parameters {p} vs {}",
        params * 4.0
    );
    let o = cat(&r, "optimizer_state");
    assert!(
        (o / (params * 8.0) - 1.0).abs() < 0.05,
        "AdamW state {o} vs {}",
        params * 8.0
    );
    let a = cat(&r, "activation");
    let largest = r.categories.values().max().copied().unwrap() as f64;
    assert_eq!(
        a, largest,
        "activations are the largest category: {:?}",
        r.categories
    );
    assert!(a > 0.4 * r.peak_allocated_bytes as f64);
    // Six optimizer steps; the teardown after the last one only frees and
    // is not a step (issue 31 item 5).
    assert_eq!(r.steps.len(), 6);
    assert_eq!(
        r.step_method,
        memlens::analysis::steps::StepMethod::Optimizer
    );
}

/// ResNet-50 (25,557,032 parameters) with SGD momentum: one momentum buffer
/// per parameter.
#[test]
fn resnet_momentum_is_about_the_parameters() {
    let param_bytes = 25_557_032.0 * 4.0;
    let r = peak(&load("resnet.pickle.zst"), 10);
    let p = cat(&r, "parameter");
    let o = cat(&r, "optimizer_state");
    assert!((p / param_bytes - 1.0).abs() < 0.05, "parameters {p}");
    assert!((o / param_bytes - 1.0).abs() < 0.10, "momentum {o}");
    assert!(cat(&r, "activation") > 0.5 * r.peak_allocated_bytes as f64);
}

#[test]
fn live_at_peak_names_user_sites() {
    let r = peak(&load("gpt2_train.pickle.zst"), 5);
    let top = &r.live_at_peak[0];
    assert_eq!(top.site, "/home/user/train/workloads.py:34"); // out = model(input_ids=x, labels=x)
    assert_eq!(top.category.as_str(), "activation");
    assert!(top.stack.len() > 3);
    assert!(r.other_sites > 0 || r.live_at_peak.len() <= 5);
}

/// Every training fixture (H100: 32 MiB workspaces) makes two cuBLAS
/// workspaces that live to the end: one at the first forward matmul, one on
/// the autograd thread. They are `other`, not a kept activation and a
/// gradient; on `gpt2_train` (gradients set to None before the forward pass
/// that peaks) no gradient is left at the peak.
#[test]
fn cublas_workspaces_are_not_activations_or_gradients() {
    for name in ["gpt2_train", "resnet", "long"] {
        let r = peak(&load(&format!("{name}.pickle.zst")), 50);
        let ws: Vec<_> = r
            .live_at_peak
            .iter()
            .filter(|s| s.site.starts_with("<cuBLAS workspace"))
            .collect();
        assert_eq!(ws.len(), 2, "{name}: {:?}", r.live_at_peak);
        for s in ws {
            // The block may keep an unsplit remainder of up to 1 MiB.
            assert!(
                (32 << 20..=33 << 20).contains(&s.bytes),
                "{name}: {}",
                s.bytes
            );
            assert_eq!(s.category.as_str(), "other", "{name}");
        }
        assert!(cat(&r, "other") >= (64 << 20) as f64, "{name}");
    }
    let r = peak(&load("gpt2_train.pickle.zst"), 10);
    assert_eq!(cat(&r, "gradient"), 0.0, "{:?}", r.categories);
}

/// A source whose analysed trace is never ready before it is waited for,
/// with a replay of its own (not the one the analysed trace holds).
struct ComesLast<'a, 's>(
    &'a memlens::trace::Analysed<'s>,
    memlens::replay::during_read::RecordedPasses,
);

impl<'s> memlens::analysis::peak::AnalysedSource<'s> for ComesLast<'_, 's> {
    fn wait(&self) -> &memlens::trace::Analysed<'s> {
        self.0
    }
    fn recorded(&self) -> &memlens::replay::during_read::RecordedPasses {
        &self.1
    }
}

#[test]
fn peak_is_the_same_whenever_the_analysed_trace_arrives() {
    use memlens::analysis::peak::{peak_and_live, peak_and_live_later, AnalysedLater};
    for name in FIXTURES {
        let snap = load(&format!("{name}.pickle.zst"));
        let an = memlens::trace::Analysed::new(&snap);
        let (at_once, live_at_once) = peak_and_live(&an, 10);
        assert!(
            at_once.steps.len() > 1 || name.contains("oom"),
            "{name}: steps"
        );
        let (last, live_last) = peak_and_live_later(&snap, &ComesLast(&an, Default::default()), 10);
        assert_eq!(at_once, last, "{name}");
        // On two threads, as doctor runs it.
        let later = AnalysedLater::new();
        let (threaded, live_threaded) = std::thread::scope(|s| {
            let replay = s.spawn(|| peak_and_live_later(&snap, &later, 10));
            later.build(&snap);
            replay.join().expect("replay thread")
        });
        assert_eq!(at_once, threaded, "{name}");
        for live in [&live_last, &live_threaded] {
            let (a, b) = (live_at_once.as_ref(), live.as_ref());
            assert_eq!(a.map(|l| l.allocated), b.map(|l| l.allocated), "{name}");
            assert_eq!(
                a.map(|l| l.blocks.len()),
                b.map(|l| l.blocks.len()),
                "{name}"
            );
        }
        // The live blocks hold the peak's bytes.
        let live = live_at_once.expect("a trace");
        assert_eq!(live.allocated, at_once.peak_allocated_bytes, "{name}");
    }
}

/// Every snapshot of the fixtures and of the real-world-like corpus.
fn every_snapshot() -> Vec<std::path::PathBuf> {
    let corpus = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus");
    let mut files = Vec::new();
    for dir in [common::fixtures_dir(), corpus] {
        for e in std::fs::read_dir(&dir).expect("a folder").flatten() {
            if e.path().to_string_lossy().ends_with(".pickle.zst") {
                files.push(e.path());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_peak_of_a_trace_replayed_while_read_is_the_peak() {
    use memlens::analysis::peak::peak_and_live;
    use memlens::replay::during_read;
    let mut used = Vec::new();
    let mut shown = Vec::new();
    let mut not_shown = 0;
    for path in every_snapshot() {
        let name = path.display().to_string();
        let plain = Snapshot::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let read = during_read::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let replayed = &read.snap;
        let pass = read.pass.as_deref().and_then(during_read::PendingPass::get);
        let (a, live_a) = peak_and_live(&memlens::trace::Analysed::new(&plain), 10);
        let fed = memlens::trace::Analysed::with_pass(replayed, read.pass.clone());
        let (b, live_b) = peak_and_live(&fed, 10);
        assert_eq!(a, b, "{name}");
        let blocks = |l: &Option<memlens::analysis::peak::LiveAtPeak>| {
            l.as_ref().map(|l| (l.allocated, l.blocks.clone()))
        };
        assert_eq!(blocks(&live_a), blocks(&live_b), "{name}");
        // The summary takes the pass's word that every free found its
        // allocation: the same summary as counting them.
        let summary = |s: &Snapshot, fed| {
            serde_json::to_value(memlens::analysis::summary::summarize_with(s, fed))
                .expect("serializes")
        };
        assert_eq!(
            summary(&plain, None),
            summary(replayed, read.pass.as_deref()),
            "{name}"
        );
        // The pass is used exactly when its guesses hold: the allocator was
        // empty when the trace began, under PyTorch's default settings.
        if replayed.event_count() == 0 {
            assert!(pass.is_none(), "{name}: no trace, no pass");
            continue;
        }
        let device = replayed.first_traced_device();
        let t = replayed.device_trace(device);
        let initial = memlens::replay::initial::reconstruct(replayed, device, t);
        // Where the pass shows the allocator empty before the trace, undoing
        // the trace gives exactly that.
        let shown_empty = pass.is_some_and(|p| p.starts_empty(replayed, device));
        if shown_empty {
            assert_eq!(initial, Default::default(), "{name}");
            shown.push(name.clone());
        } else if pass.is_some() && !initial.is_empty() {
            // A pass that replayed a trace begun after the allocator was
            // used, and says so.
            not_shown += 1;
        }
        assert_eq!(
            memlens::replay::initial::before_trace_with(replayed, device, pass),
            initial,
            "{name}"
        );
        let default = memlens::replay::config::recorded_config(&Default::default());
        let expected = initial.is_empty()
            && memlens::replay::config::recorded_config(&replayed.settings) == default;
        let fits = pass.is_some_and(|p| p.fits(replayed, device, &initial, &Default::default()));
        assert_eq!(fits, expected, "{name}");
        if fits {
            used.push(name);
        }
    }
    // 24 of the 52 recordings start with the process under default settings.
    assert!(used.len() >= 20, "{} used: {used:?}", used.len());
    // The pass shows most of those empty without undoing the trace, and
    // does not where a warning-free replay began after the allocator was
    // used (one recording here).
    assert!(shown.len() >= 15, "{} shown empty: {shown:?}", shown.len());
    assert!(not_shown >= 1, "no replayed trace that began late");
    eprintln!(
        "{} traces replayed while read, {} shown empty by the pass, {not_shown} replayed but not empty before",
        used.len(),
        shown.len()
    );
}
