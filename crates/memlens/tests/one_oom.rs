//! One OOM, one advice list (issue 29): `doctor --json`, `oom --json` and the
//! report's data speak of the same OOM (event, device, cause) with the same
//! fixes in the same order, and doctor's findings lead with the same fix, on
//! every OOM of the fixtures and the corpus, on a trace with two OOMs and on
//! a trace with two devices whose OOM is not on the device of the peak.

mod common;

use memlens::doctor::{diagnose_inputs, DoctorOptions};
use memlens::oom::{OomOptions, OomReport};
use memlens::render::documents::oom_doc;
use memlens::snapshot::{Action, Block, BlockState, PoolKind, Segment, TraceEvent};
use memlens::Snapshot;
use std::path::PathBuf;

/// Every snapshot of the fixtures and the corpus whose trace holds an OOM.
fn oom_snapshots() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = vec![
        common::fixture("oom.at_oom.pickle.zst"),
        common::fixture("oom.pickle.zst"),
    ];
    for dir in ["tests/corpus/oom", "tests/corpus"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .expect("corpus folder")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".pickle.zst"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// The fixes as every surface must show them: action, figure, verdict, and
/// whether the simulation says it helps.
fn advice(r: &OomReport) -> Vec<(String, Option<u64>, Option<bool>, bool)> {
    r.advice()
        .map(|(f, helps)| {
            (
                f.action.clone(),
                f.predicted_peak_reserved_bytes,
                f.fits,
                helps,
            )
        })
        .collect()
}

/// Checks that every surface agrees on the OOM of `snap`; returns the OOM.
fn surfaces_agree(name: &str, snap: &Snapshot) -> Option<OomReport> {
    let named = [(name.to_string(), snap)];
    let d = diagnose_inputs(&named, &DoctorOptions::default());
    let from_oom = oom_doc(snap, name, &OomOptions::default()).ok();
    let Some(r) = &d.oom else {
        assert!(
            from_oom.is_none(),
            "{name}: `oom` explains an OOM that doctor does not"
        );
        return None;
    };
    let o =
        from_oom.unwrap_or_else(|| panic!("{name}: doctor explains an OOM that `oom` does not"));
    // doctor --json and oom --json.
    assert_eq!(
        (r.device, r.event_index, r.cause),
        (o.device, o.event_index, o.cause),
        "{name}"
    );
    assert_eq!(advice(r), advice(&o), "{name}: fix lists differ");
    // The report's data.
    let data = memlens::report::from_diagnosis(&[(name.to_string(), snap)], &d);
    let view = data
        .oom
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: report has no OOM"));
    assert_eq!(
        (view.device, view.event_index as usize, view.cause.as_str()),
        (r.device, r.event_index, r.cause.as_str()),
        "{name}"
    );
    let shown: Vec<_> = view
        .fixes
        .iter()
        .map(|f| {
            (
                f.action.clone(),
                f.predicted_peak_reserved_bytes,
                f.fits,
                f.helps,
            )
        })
        .collect();
    assert_eq!(shown, advice(r), "{name}: the report's fix table differs");
    if let Some(seg) = &data.segments {
        // A trace of the `oom` entry alone (PyTorch 2.0's one entry) has
        // nothing to replay: the map is the dump's.
        let expected = if snap.has_allocation_trace() {
            format!("at the OOM (event {})", r.event_index)
        } else {
            "at dump time".to_string()
        };
        assert_eq!(seg.when, expected, "{name}");
    }
    // Doctor's findings: the OOM finding and a fragmentation finding beside
    // it lead with the list's own first fix.
    let lead = r.lead_fix().map(|f| f.action.clone());
    for f in d
        .findings
        .iter()
        .filter(|f| f.kind == "oom" || f.kind == "fragmentation")
    {
        assert_eq!(
            f.suggestion, lead,
            "{name}: the {} finding leads with another fix",
            f.kind
        );
    }
    Some(r.clone())
}

#[test]
fn every_surface_explains_the_same_oom_with_the_same_fixes() {
    let mut seen = 0;
    for path in oom_snapshots() {
        let snap = Snapshot::load(&path).expect("reads");
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if surfaces_agree(&name, &snap).is_some() {
            seen += 1;
        }
    }
    assert!(seen >= 6, "only {seen} OOM snapshots found");
}

#[test]
fn with_two_ooms_the_last_one_is_explained_everywhere() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/oom/two_ooms.pickle.zst");
    let snap = Snapshot::load(&path).expect("reads");
    let t = &snap.traces[0];
    let ooms: Vec<usize> = t
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Oom)
        .map(|(i, _)| i)
        .collect();
    assert!(ooms.len() >= 2, "the trace holds {} OOMs", ooms.len());
    let r = surfaces_agree("two_ooms.pickle.zst", &snap).expect("an OOM");
    assert_eq!(r.event_index, *ooms.last().expect("an OOM"));
}

/// `gpt_warm` (an OOM on device 0) with a copy of its run on device 1 that
/// holds 16 GiB more from the start and raised no OOM: the peak is device
/// 1's, the OOM device 0's.
fn two_devices() -> (Snapshot, u64) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/oom/gpt_warm.pickle.zst");
    let mut snap = Snapshot::load(&path).expect("reads");
    let big_addr = 0x7f00_0000_0000u64;
    let big = 16u64 << 30;
    let mut t1 = snap.traces[0].clone();
    t1.device = 1;
    t1.extras.clear();
    let first = t1
        .events
        .iter()
        .find(|e| e.action == Action::Alloc)
        .copied()
        .expect("an alloc");
    t1.events.retain(|e| e.action != Action::Oom);
    let seg = TraceEvent {
        addr: big_addr,
        size: big,
        action: Action::SegmentAlloc,
        ..first
    };
    let alloc = TraceEvent {
        addr: big_addr,
        size: big,
        action: Action::Alloc,
        ..first
    };
    t1.events.splice(0..0, [seg, alloc]);
    let mut segs: Vec<Segment> = snap
        .segments
        .iter()
        .filter(|s| s.device == 0)
        .cloned()
        .collect();
    for s in &mut segs {
        s.device = 1;
    }
    segs.push(Segment {
        device: 1,
        address: big_addr,
        total_size: big,
        allocated_size: big,
        active_size: big,
        requested_size: big,
        stream: first.stream,
        pool: PoolKind::Large,
        pool_id: (0, 0),
        is_expandable: false,
        stack: first.stack,
        blocks: vec![Block {
            address: big_addr,
            size: big,
            requested_size: big,
            state: BlockState::ActiveAllocated,
            stack: first.stack,
        }],
    });
    snap.segments.extend(segs);
    snap.traces.push(t1);
    (snap, big_addr)
}

#[test]
fn with_two_devices_the_report_draws_the_oom_of_the_device_that_failed() {
    let (snap, big_addr) = two_devices();
    let named = [("two_devices".to_string(), &snap)];
    let d = diagnose_inputs(&named, &DoctorOptions::default());
    assert_eq!(
        d.peak.device, 1,
        "the peak must be device 1's for this test to mean anything"
    );
    let r = surfaces_agree("two_devices", &snap).expect("an OOM");
    assert_eq!(r.device, 0);
    let data = memlens::report::from_diagnosis(&named, &d);
    let seg = data.segments.expect("a segment map");
    assert!(seg.when.starts_with("at the OOM"), "{}", seg.when);
    // Device 0's segments at its OOM, not device 1's (which holds the big one).
    assert!(
        seg.segments.iter().all(|s| s.address != big_addr),
        "the map drawn is device 1's"
    );
    assert!(!seg.segments.is_empty());
}

/// A ResNet-50 under a cap (an H200): cuDNN convolutions' workspaces that
/// PyTorch could not have and gave up for other algorithms are `oom` entries
/// of the trace, caught by PyTorch. At batch 23 the run ran its steps: no
/// surface explains an OOM (doctor said "CUDA out of memory" and advised a
/// smaller batch). At batch 24 the run failed: the OOM explained is its last
/// entry, the program's, not one of the 82 workspaces before it.
#[test]
fn oom_entries_pytorch_caught_are_not_the_runs_oom() {
    use memlens::oom::chosen_oom;
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/oom");
    let ooms = |snap: &Snapshot| -> Vec<(usize, bool)> {
        snap.traces[0]
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Oom)
            .map(|(i, e)| (i, snap.oom_caught_by_pytorch(e)))
            .collect()
    };

    let ran = Snapshot::load(&corpus.join("conv_workspace_caught.pickle.zst")).expect("reads");
    let entries = ooms(&ran);
    assert_eq!(entries.len(), 4);
    assert!(entries.iter().all(|&(_, caught)| caught));
    assert_eq!(chosen_oom(&ran), None);
    let name = "conv_workspace_caught.pickle.zst";
    let d = diagnose_inputs(&[(name.to_string(), &ran)], &DoctorOptions::default());
    assert!(d.oom.is_none());
    assert!(
        d.findings.iter().all(|f| f.kind != "oom"),
        "{:?}",
        d.findings
    );
    // What was given up is said, once, as information; and the C++ stacks'
    // one use here beside the advice to drop them.
    let given_up: Vec<_> = d
        .findings
        .iter()
        .filter(|f| f.kind == "workspaces")
        .collect();
    assert_eq!(given_up.len(), 1, "{:?}", d.findings);
    assert!(
        given_up[0]
            .title
            .starts_with("4 cuDNN convolution workspace"),
        "{}",
        given_up[0].title
    );
    assert_eq!(given_up[0].severity, memlens::doctor::Severity::Info);
    let cpp = d
        .findings
        .iter()
        .find(|f| f.kind == "capture" && f.title.contains("C++ stacks"))
        .expect("the stacks=\"all\" check");
    assert!(
        cpp.title.contains("tell apart the 4 `oom` entries"),
        "{}",
        cpp.title
    );
    let err = oom_doc(&ran, name, &OomOptions::default())
        .expect_err("no OOM to explain")
        .to_string();
    assert!(
        err.contains("its 4 `oom` entries are cuDNN convolution workspaces"),
        "{err}"
    );

    let failed = Snapshot::load(&corpus.join("conv_workspace_oom.pickle.zst")).expect("reads");
    let entries = ooms(&failed);
    assert_eq!(entries.len(), 83);
    assert_eq!(entries.iter().filter(|&&(_, caught)| caught).count(), 82);
    let (last, caught) = *entries.last().expect("an OOM");
    assert!(!caught);
    assert_eq!(chosen_oom(&failed), Some((0, last)));
    let name = "conv_workspace_oom.pickle.zst";
    let r = surfaces_agree(name, &failed).expect("an OOM");
    assert_eq!(r.event_index, last);
    assert_eq!(r.requested_bytes, 8 << 20);
    let d = diagnose_inputs(&[(name.to_string(), &failed)], &DoctorOptions::default());
    let given_up = d
        .findings
        .iter()
        .find(|f| f.kind == "workspaces")
        .expect("said");
    assert!(given_up.title.starts_with("82 cuDNN"), "{}", given_up.title);
    let data = memlens::report::from_diagnosis(&[(name.to_string(), &failed)], &d);
    assert_eq!(data.timeline.expect("a timeline").ooms.len(), 1);
}
