//! Issue 22 on recordings made on an H100 by tests/gpu/modules.py
//! (tests/corpus/modules: a GPT-2 from transformers, 3 training steps, under
//! memlens.record(model=...) and under plain recording; a function with
//! planted allocations under @memlens.profile; a torch.profiler Chrome trace),
//! checked against the truth.json the same process wrote, and on the shared
//! fixtures and the corpus for the exact sums.

use memlens::analysis::lines::{lines, LineOptions};
use memlens::analysis::modules::{
    modules_at_peak, ModuleGroup, ModuleReport, Naming, BEFORE_RECORDING, OUTSIDE,
};
use memlens::analysis::peak::peak;
use memlens::input::{kind, InputKind};
use memlens::profiler::{self, ProfilerTrace, BEFORE_TRACE};
use memlens::source::SourceFinder;
use memlens::trace::Analysed;
use memlens::Snapshot;
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/modules")
}

fn load(name: &str) -> Snapshot {
    Snapshot::load(&dir().join(format!("{name}.pickle.zst"))).expect("recording loads")
}

fn truth() -> Value {
    let text = std::fs::read_to_string(dir().join("truth.json")).expect("truth");
    serde_json::from_str(&text).expect("truth is JSON")
}

fn by_module(snap: &Snapshot, roots: Vec<PathBuf>) -> ModuleReport {
    modules_at_peak(&Analysed::new(snap), &SourceFinder::new(roots))
}

/// The group at `path` (names from the top).
fn find<'a>(groups: &'a [ModuleGroup], path: &[&str]) -> Option<&'a ModuleGroup> {
    let (first, rest) = path.split_first()?;
    let g = groups.iter().find(|g| g.name == *first)?;
    if rest.is_empty() {
        Some(g)
    } else {
        find(&g.children, rest)
    }
}

/// Every node holds at least what its children hold, and the top level sums
/// to the peak exactly.
fn assert_sums(r: &ModuleReport, what: &str) {
    let top: u64 = r.groups.iter().map(|g| g.bytes).sum();
    assert_eq!(
        top, r.peak_allocated_bytes,
        "{what}: top-level groups sum to the peak"
    );
    fn walk(g: &ModuleGroup, what: &str) {
        let kids: u64 = g.children.iter().map(|c| c.bytes).sum();
        assert!(
            kids <= g.bytes,
            "{what}: {} holds less than its children",
            g.name
        );
        let cats: u64 = g.categories.values().sum();
        assert_eq!(
            cats, g.bytes,
            "{what}: {} categories sum to its bytes",
            g.name
        );
        g.children.iter().for_each(|c| walk(c, what));
    }
    r.groups.iter().for_each(|g| walk(g, what));
}

fn activation(g: &ModuleGroup) -> u64 {
    g.categories.get("activation").copied().unwrap_or(0)
}

#[test]
fn named_recording_puts_activations_under_module_instances() {
    let t = truth();
    let snap = load("named");
    let r = by_module(&snap, Vec::new());
    assert_eq!(r.naming, Naming::Instances);
    assert_eq!(
        r.peak_allocated_bytes,
        t["named"]["allocated_bytes.all.peak"].as_u64().unwrap()
    );
    assert_eq!(r.peak_allocated_bytes, peak(&snap, 5).peak_allocated_bytes);
    assert_sums(&r, "named");
    for layer in 0..2 {
        let block = [
            "GPT2LMHeadModel",
            "transformer",
            &format!("transformer.h.{layer}"),
        ];
        let attn_name = format!("transformer.h.{layer}.attn");
        let mlp_name = format!("transformer.h.{layer}.mlp");
        let attn = find(&r.groups, &[block[0], block[1], block[2], &attn_name]).expect("attention");
        let mlp = find(&r.groups, &[block[0], block[1], block[2], &mlp_name]).expect("MLP");
        assert_eq!(attn.class.as_deref(), Some("GPT2Attention"));
        assert_eq!(mlp.class.as_deref(), Some("GPT2MLP"));
        assert!(activation(attn) > 0 && activation(mlp) > 0);
        // The MLP's GELU keeps 4 blocks of batch x seq x 4d floats: 8*256*1024*4 B each.
        let act = find(&mlp.children, &[&format!("{mlp_name}.act")]).expect("GELU");
        assert_eq!(act.class.as_deref(), Some("NewGELUActivation"));
        assert_eq!((act.bytes, act.count), (32 << 20, 4));
    }
    // The model existed before recording: its parameters and optimizer state
    // are outside any forward, from before the recording (allocated at the start).
    let before = find(&r.groups, &[OUTSIDE, BEFORE_RECORDING]).expect("before the recording");
    assert_eq!(
        before.bytes,
        t["named"]["allocated_bytes.all.current"].as_u64().unwrap()
    );
}

#[test]
fn plain_recording_names_classes_from_source_else_files() {
    let t = truth();
    let snap = load("plain");
    let peak_bytes = t["plain"]["allocated_bytes.all.peak"].as_u64().unwrap();
    let with_src = by_module(&snap, vec![dir().join("src")]);
    assert_eq!(with_src.naming, Naming::Frames);
    assert_eq!(with_src.peak_allocated_bytes, peak_bytes);
    assert_sums(&with_src, "plain, source readable");
    let block = ["GPT2LMHeadModel", "GPT2Model", "GPT2Block"];
    let attn = find(
        &with_src.groups,
        &[block[0], block[1], block[2], "GPT2Attention"],
    )
    .expect("attn");
    let mlp = find(&with_src.groups, &[block[0], block[1], block[2], "GPT2MLP"]).expect("mlp");
    assert!(activation(attn) > 0 && activation(mlp) > 0);
    // Both layers' GELU outputs, 4 blocks of 8 MiB each per layer.
    let gelu = find(&mlp.children, &["NewGELUActivation"]).expect("GELU");
    assert_eq!((gelu.bytes, gelu.count), (64 << 20, 8));

    let no_src = by_module(&snap, Vec::new());
    assert_sums(&no_src, "plain, no source");
    let f = "modeling_gpt2.py:forward";
    let inner = find(&no_src.groups, &[f, f, f]).expect("files");
    assert_eq!(inner.bytes, find(&with_src.groups, &block).unwrap().bytes);
}

#[test]
fn module_groups_sum_to_the_peak_on_fixtures_and_corpus() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures");
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus");
    let files = [
        fixtures.join("gpt2_train.pickle.zst"),
        fixtures.join("checkpointed.pickle.zst"),
        fixtures.join("resnet.pickle.zst"),
        corpus.join("hf_default.pickle.zst"),
        corpus.join("compiled.pickle.zst"),
        corpus.join("notebook.pickle.zst"),
    ];
    for f in files {
        let snap = Snapshot::load(&f).expect("loads");
        let r = by_module(&snap, Vec::new());
        let p = peak(&snap, 1);
        assert_eq!(
            r.peak_allocated_bytes,
            p.peak_allocated_bytes,
            "{}",
            f.display()
        );
        assert_sums(&r, &f.display().to_string());
        assert!(r.warnings.is_empty(), "{}: {:?}", f.display(), r.warnings);
    }
}

#[test]
fn line_profiler_figures_equal_the_planted_sizes() {
    let t = truth();
    let snap = load("planted");
    let p = &t["planted"];
    let mut opts = LineOptions::parse("modules.py:planted");
    opts.scope = Some("memlens.profile 1".into());
    let r = lines(&snap, &opts, &SourceFinder::new(Vec::new()));
    assert_eq!(r.file, p["file"].as_str().unwrap());
    assert_eq!(r.allocated_before_bytes, p["base"].as_u64().unwrap());
    let want = p["lines"].as_object().unwrap();
    assert_eq!(r.rows.len(), want.len(), "{:?}", r.rows);
    for row in &r.rows {
        let w = &want[&row.line.to_string()];
        let name = w["name"].as_str().unwrap();
        assert_eq!(
            row.allocated_bytes,
            w["allocated"].as_u64().unwrap(),
            "{name} allocated"
        );
        assert_eq!(
            row.freed_bytes,
            w["freed"].as_u64().unwrap(),
            "{name} freed"
        );
        assert_eq!(row.net_bytes, w["net"].as_i64().unwrap(), "{name} net");
        assert_eq!(
            row.peak_allocated_bytes,
            w["peak"].as_u64().unwrap(),
            "{name} peak"
        );
    }
    // Recorded with context="all": the frees carry the freeing line, no warning.
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // The loop line ran 3 times: 3 allocations, the 2 earlier tensors freed.
    let lp = r
        .rows
        .iter()
        .find(|r| r.allocations == 3)
        .expect("loop line");
    assert_eq!(lp.frees, 2);
    // The source is quoted when readable (tests/gpu/modules.py is the recorded file).
    let src = SourceFinder::new(vec![dir().join("../../gpu")]);
    let quoted = lines(&snap, &opts, &src);
    assert!(quoted.rows[0].text.as_deref().unwrap().contains("# LINE a"));
    // A block: only lines in [first, last].
    opts.first_line = Some(r.rows[2].line);
    opts.last_line = Some(r.rows[3].line);
    assert_eq!(lines(&snap, &opts, &src).rows.len(), 2);
}

#[test]
fn profiler_trace_peak_equals_max_memory_allocated() {
    let t = truth();
    let path = dir().join("trace.json.zst");
    assert_eq!(kind(&path).unwrap(), InputKind::ProfilerTrace);
    assert_eq!(
        kind(&dir().join("named.pickle.zst")).unwrap(),
        InputKind::Snapshot
    );
    let trace = ProfilerTrace::load(&path).expect("trace loads");
    let max = t["trace"]["max_memory_allocated"].as_u64().unwrap();
    let s = profiler::summary(&trace);
    assert_eq!(s.devices.len(), 1);
    assert_eq!(s.devices[0].peak_allocated_bytes, max);
    assert_eq!(
        s.devices[0].peak_reserved_bytes,
        t["trace"]["reserved_bytes.all.peak"].as_u64().unwrap()
    );
    assert_eq!(
        s.devices[0].allocated_at_start_bytes,
        t["trace"]["allocated_at_start"].as_u64().unwrap()
    );
    assert_eq!(
        s.devices[0].allocated_at_end_bytes,
        t["trace"]["allocated_bytes.all.current"].as_u64().unwrap()
    );
    assert_eq!(s.devices[0].allocations, s.devices[0].frees);
    assert_eq!(s.timeline.iter().map(|p| p.1).max(), Some(max));
    let p = profiler::peak(&trace, usize::MAX);
    assert_eq!(p.peak_allocated_bytes, max);
    assert_eq!(p.live_at_peak.iter().map(|r| r.bytes).sum::<u64>(), max);
    // What was there before the profiler started is named as such, and is
    // what was allocated at its start (nothing of it was freed before the peak).
    let before = p
        .live_at_peak
        .iter()
        .find(|r| r.operator == BEFORE_TRACE)
        .unwrap();
    assert_eq!(
        before.bytes,
        t["trace"]["allocated_at_start"].as_u64().unwrap()
    );
    assert!(p.live_at_peak.iter().any(|r| r.operator == "aten::linear"));
    assert!(!p.snapshot_would_add.is_empty());
}

#[test]
fn a_damaged_trace_is_a_one_line_error_naming_the_file() {
    let e = ProfilerTrace::from_json(b"{\"traceEvents\": [", std::path::Path::new("t.json"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("t.json: not a readable Chrome trace"), "{e}");
    assert!(!e.contains('\n'));
}
