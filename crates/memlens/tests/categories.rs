//! One category rulebook on the recordings of issue 31's item 3
//! (tests/corpus/categories, recorded on an H200 by
//! `tests/corpus/gen/categories.sh`): what memlens calls each byte, at the
//! dump and at the allocated peak, against what the recording process knew
//! (`NAME.truth.json`: its parameters', gradients' and optimizer state's
//! storages, and the bytes alive under its marked lines).

use memlens::analysis::peak::peak;
use memlens::analysis::state::{state_at_event, EventState};
use memlens::trace::Analysed;
use memlens::Snapshot;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

const MIB: u64 = 1 << 20;
/// The cuBLAS workspace PyTorch gives each handle and stream on Hopper.
const WORKSPACE: u64 = 32 * MIB;

fn recording(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/categories")
        .join(name)
}

fn load(name: &str) -> (Snapshot, Value) {
    let snap = Snapshot::load(&recording(&format!("{name}.pickle.zst"))).expect("recording loads");
    let text = std::fs::read_to_string(recording(&format!("{name}.truth.json"))).expect("truth");
    (snap, serde_json::from_str(&text).expect("truth is JSON"))
}

fn figure(truth: &Value, key: &str) -> u64 {
    truth[key]
        .as_u64()
        .unwrap_or_else(|| panic!("truth has {key}"))
}

/// The state right after the trace's last event: the dump.
fn dump_state(snap: &Snapshot) -> EventState {
    let an = Analysed::new(snap);
    let last = snap.traces[0].events.len() - 1;
    state_at_event(&an, None, last, 100).expect("state at the last event")
}

/// Bytes by category at the dump.
fn at_dump(snap: &Snapshot) -> BTreeMap<String, u64> {
    dump_state(snap).categories
}

fn bytes(cats: &BTreeMap<String, u64>, category: &str) -> u64 {
    cats.get(category).copied().unwrap_or(0)
}

#[test]
fn weights_moved_with_to_are_parameters_while_alive_and_after_they_are_freed() {
    // Alive at the dump (PyTorch's default recording, C++ frames too).
    let (snap, truth) = load("kv_generate");
    let cats = at_dump(&snap);
    let weights = &truth["expect"]["kv_weights"];
    assert_eq!(weights["category"], "parameter");
    assert_eq!(
        bytes(&cats, "parameter"),
        weights["bytes"].as_u64().unwrap(),
        "{cats:?}"
    );
    assert_eq!(
        bytes(&cats, "other"),
        WORKSPACE,
        "one cuBLAS workspace: {cats:?}"
    );

    // Freed before the dump (`del model`), in an inference run with no steps
    // to outlive: at the peak they were the model all the same (this was
    // "temporary": born moving the model, freed in user code).
    let (freed, truth) = load("kv_generate_freed");
    assert_eq!(bytes(&at_dump(&freed), "parameter"), 0);
    let p = peak(&freed, 10);
    let weights = figure(&truth, "weights_bytes");
    let parameter = bytes(&p.categories, "parameter");
    // The allocator's blocks: each storage rounded, a few under 1 MiB not split.
    assert!(
        parameter >= weights && parameter <= weights + 2 * MIB,
        "parameter at the peak {parameter}, the model's storages {weights}: {:?}",
        p.categories
    );
}

#[test]
fn a_cuda_graphs_weights_are_parameters_and_each_stream_has_its_workspace() {
    let (snap, truth) = load("cuda_graph");
    let cats = at_dump(&snap);
    assert_eq!(
        bytes(&cats, "parameter"),
        figure(&truth, "parameter_bytes"),
        "{cats:?}"
    );
    // Warm-up on a side stream, capture on the graph's stream.
    assert_eq!(bytes(&cats, "other"), 2 * WORKSPACE, "{cats:?}");
}

#[test]
fn a_side_streams_cublas_workspace_is_a_workspace_not_an_input() {
    let (snap, truth) = load("sidestream");
    let state = dump_state(&snap);
    // The main thread's, the autograd engine's and the side stream's.
    assert_eq!(
        bytes(&state.categories, "other"),
        3 * WORKSPACE,
        "{:?}",
        state.categories
    );
    let line = truth["expect"]["side_matmul_workspace"]["line"]
        .as_str()
        .unwrap();
    let line = line.rsplit('/').next().unwrap();
    let workspace = state
        .live
        .iter()
        .find(|l| l.site.starts_with("<cuBLAS workspace: first matmul at") && l.site.contains(line))
        .unwrap_or_else(|| panic!("a workspace named after {line}: {:?}", state.live));
    assert_eq!(
        (workspace.bytes, workspace.category.as_str()),
        (WORKSPACE, "other")
    );
    // What is left as input: the side product and its operand, 4 MiB each.
    assert_eq!(
        bytes(&state.categories, "input"),
        8 * MIB,
        "{:?}",
        state.categories
    );
}

#[test]
fn a_compiled_backwards_gradients_are_gradients() {
    // Dumped after the optimizer step, before zero_grad: every gradient alive.
    let (snap, truth) = load("compiled_backward");
    let cats = at_dump(&snap);
    assert_eq!(
        bytes(&cats, "gradient"),
        figure(&truth, "gradient_bytes"),
        "{cats:?}"
    );
    assert_eq!(
        bytes(&cats, "parameter"),
        figure(&truth, "parameter_bytes"),
        "{cats:?}"
    );
    assert_eq!(
        bytes(&cats, "optimizer_state"),
        figure(&truth, "optimizer_state_bytes"),
        "{cats:?}"
    );
    // The user's thread's workspace and the engine's, which runs the
    // compiled backward with Python frames.
    assert_eq!(bytes(&cats, "other"), 2 * WORKSPACE, "{cats:?}");
    assert!(
        bytes(&cats, "input") < MIB,
        "no gradient called an input: {cats:?}"
    );
}

#[test]
fn resnet50s_activations_under_autocast_are_activations_however_recorded() {
    for name in ["resnet50_amp", "resnet50_amp_all"] {
        let (snap, truth) = load(name);
        let model = figure(&truth, "parameter_bytes") + figure(&truth, "buffer_bytes");
        assert_eq!(bytes(&at_dump(&snap), "parameter"), model, "{name}");
        let p = peak(&snap, 10);
        assert_eq!(
            p.peak_allocated_bytes,
            figure(&truth["memory_stats"], "allocated_bytes.all.peak")
        );
        let activation = bytes(&p.categories, "activation");
        let temporary = bytes(&p.categories, "temporary");
        assert!(
            activation * 100 >= p.peak_allocated_bytes * 90,
            "{name}: activation {activation} of {}: {:?}",
            p.peak_allocated_bytes,
            p.categories
        );
        assert!(
            temporary * 100 < p.peak_allocated_bytes,
            "{name}: {:?}",
            p.categories
        );
    }
}

#[test]
fn a_kept_loss_is_the_graph_it_keeps_not_a_parameter_or_an_input() {
    // tests/corpus/leak_losses: `losses.append(loss)` keeps every step's
    // graph; its largest holder is the loss line (F.cross_entropy in user
    // code), 64 MiB a step. It was "parameter" (torch/nn frames taken for
    // model building), then "input".
    let snap = Snapshot::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus/leak_losses.pickle.zst"),
    )
    .expect("corpus file loads");
    let p = peak(&snap, 10);
    let loss = p
        .live_at_peak
        .iter()
        .find(|l| l.site.ends_with("model.py:121") && l.bytes > 256 * MIB)
        .unwrap_or_else(|| panic!("the loss line holds the graph: {:?}", p.live_at_peak));
    assert_eq!(loss.category.as_str(), "activation");
    assert!(
        bytes(&p.categories, "parameter") < 64 * MIB,
        "{:?}",
        p.categories
    );
    assert!(bytes(&p.categories, "input") < MIB, "{:?}", p.categories);
}

#[test]
fn a_batch_made_by_a_training_loops_own_step_function_is_input_not_optimizer_state() {
    // tests/gpu/fit_probes.py: `def step(): inputs = make(batch); ...;
    // opt.step()`. The user's `step` was read as a hand-written optimizer's,
    // so the batch `make` returned (alive across the optimizer step) was
    // optimizer state, and so was the loss. The SGD momentum buffers
    // (torch/optim frames, under the same `step`) stay optimizer state.
    let snap = Snapshot::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus/oom/conv_workspace_caught.pickle.zst"),
    )
    .expect("corpus file loads");
    let p = peak(&snap, 20);
    let at = |line: &str| -> Vec<&str> {
        p.live_at_peak
            .iter()
            .filter(|l| l.site.ends_with(line))
            .map(|l| l.category.as_str())
            .collect()
    };
    assert_eq!(at("fit_probes.py:107"), ["input"], "{:?}", p.live_at_peak);
    assert_eq!(at("fit_probes.py:189"), ["optimizer_state"]);
    assert_eq!(at("fit_probes.py:113"), ["activation"]);
    // The momentum buffers of ResNet-50's 161 parameters.
    let state = p
        .live_at_peak
        .iter()
        .find(|l| l.site.ends_with("fit_probes.py:189"))
        .expect("the optimizer's line");
    assert_eq!(state.count, 161);
}
