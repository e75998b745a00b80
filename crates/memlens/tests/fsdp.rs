//! FSDP at the peak (issue 34), on a real two-GPU FSDP2 job recorded on two
//! H100s by tests/gpu/fsdp.py (rank 0 of each job, tests/corpus/fsdp): eight
//! MLP blocks and the root sharded with `fully_shard`, recorded with
//! `memlens.record(model=model)`. With `reshard_after_forward=False` (the
//! planted misconfiguration) doctor warns, naming every block's gathered
//! parameters by module; with FSDP2's default it does not, and the default's
//! real peak is lower by no more than the warning said resharding frees.

use memlens::analysis::fsdp::{module_list, units_in_trace, FsdpRole, GatheredUnit};
use memlens::doctor::{diagnose, DoctorOptions, Severity};
use memlens::Snapshot;
use std::path::PathBuf;

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/fsdp")
        .join(name)
}

fn truth(job: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(corpus(&format!("{job}.rank0.truth.json"))).expect("truth");
    serde_json::from_str(&text).expect("truth json")
}

fn doctor(job: &str) -> memlens::doctor::Diagnosis {
    let path = corpus(&format!("{job}.rank0.pickle.zst"));
    let snap = Snapshot::load(&path).expect("loads");
    diagnose(
        &[(path.display().to_string(), &snap)],
        &DoctorOptions::default(),
    )
}

fn num(v: &serde_json::Value) -> u64 {
    v.as_u64().expect("a number")
}

#[test]
fn resharding_off_is_named_with_every_block_by_module() {
    let t = truth("fsdp_noreshard");
    let d = doctor("fsdp_noreshard");
    assert_eq!(d.peak.peak_allocated_bytes, num(&t["max_memory_allocated"]));
    let fsdp = d.fsdp.as_ref().expect("FSDP at the peak");
    assert!(fsdp.reshard_after_forward_off);
    let block = num(&t["block_unsharded_bytes"]);
    let blocks: Vec<&GatheredUnit> = fsdp
        .gathered_units
        .iter()
        .filter(|u| u.module.starts_with("blocks."))
        .collect();
    assert_eq!(blocks.len(), 8, "{:?}", fsdp.gathered_units);
    for (k, u) in blocks.iter().enumerate() {
        assert_eq!(u.module, format!("blocks.{k}"));
        assert_eq!(
            u.bytes, block,
            "blocks.{k}: one block's parameters, unsharded"
        );
        assert!(u.in_forward);
    }
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == "fsdp")
        .expect("an fsdp finding");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.title.contains("resharding after forward is off"),
        "{}",
        f.title
    );
    assert!(f.title.contains("blocks.0-7"), "{}", f.title);
    let fix = f.suggestion.as_deref().unwrap_or_default();
    assert!(fix.contains("reshard_after_forward=True"), "{fix}");

    // The fix, rerun on the GPU (the default job, same model and steps):
    // its peak is lower, by no more than the warning said it frees.
    let fixed = truth("fsdp_default");
    let saved = num(&t["max_memory_allocated"]) - num(&fixed["max_memory_allocated"]);
    let promised = f.bytes.expect("bytes freed");
    assert!(
        saved > 0 && saved <= promised,
        "saved {saved}, promised up to {promised}"
    );
    assert!(
        saved as f64 >= 0.8 * promised as f64,
        "the promise ({promised}) is within 25% of what the rerun saved ({saved})"
    );
}

#[test]
fn the_default_holds_one_block_and_raises_no_warning() {
    let t = truth("fsdp_default");
    let d = doctor("fsdp_default");
    assert_eq!(d.peak.peak_allocated_bytes, num(&t["max_memory_allocated"]));
    let fsdp = d.fsdp.as_ref().expect("FSDP at the peak");
    assert!(!fsdp.reshard_after_forward_off);
    assert!(fsdp.gathered_units.len() <= 2, "{:?}", fsdp.gathered_units);
    assert!(
        fsdp.reduce_scatter_bytes > 0,
        "gradients on their way to shards"
    );
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == "fsdp")
        .expect("an fsdp finding");
    assert_eq!(f.severity, Severity::Info, "{}", f.title);
    assert!(!d
        .findings
        .iter()
        .any(|f| f.severity > Severity::Info && f.kind == "fsdp"));
}

#[test]
fn backward_gathers_take_their_blocks_names_in_reverse() {
    let path = corpus("fsdp_default.rank0.pickle.zst");
    let snap = Snapshot::load(&path).expect("loads");
    let names: Vec<String> = units_in_trace(&snap, 0)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    // Each step: the root and blocks 0-7 in forward, then blocks 7-0 gathered again.
    let forward: Vec<String> = std::iter::once("FSDPNet".to_string())
        .chain((0..8).map(|k| format!("blocks.{k}")))
        .collect();
    let backward: Vec<String> = (0..8)
        .rev()
        .map(|k| format!("blocks.{k} (gathered again in backward)"))
        .collect();
    let step: Vec<String> = forward.into_iter().chain(backward).collect();
    assert!(names.len() >= step.len(), "{names:?}");
    for (k, chunk) in names.chunks(step.len()).enumerate() {
        assert_eq!(chunk, &step[..chunk.len()], "step {k}");
    }
}

#[test]
fn no_fsdp_no_fsdp_report() {
    let path = corpus("../clean.pickle.zst");
    let snap = Snapshot::load(&path).expect("loads");
    let d = diagnose(
        &[(path.display().to_string(), &snap)],
        &DoctorOptions::default(),
    );
    assert!(d.fsdp.is_none());
    assert!(!d.findings.iter().any(|f| f.kind == "fsdp"));
}

#[test]
fn numbered_modules_run_together() {
    let unit = |m: &str| GatheredUnit {
        module: m.into(),
        bytes: 1,
        blocks: 1,
        gathered_at_event: None,
        in_forward: true,
    };
    let units: Vec<GatheredUnit> = [
        "Net", "layers.0", "layers.1", "layers.2", "layers.5", "head",
    ]
    .iter()
    .map(|m| unit(m))
    .collect();
    assert_eq!(module_list(&units), "Net, layers.0-2, layers.5, head");
    let _ = FsdpRole::GatheredParameters;
}
