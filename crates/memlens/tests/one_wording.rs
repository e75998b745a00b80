//! One wording per fact (issue 29): a trace that began after the allocator
//! did (a ring buffer that wrapped) is said once, in one way, by `doctor`;
//! it printed three findings for it before (the summary's, the replay's and
//! the peak's, each worded its own way).

mod common;

use memlens::doctor::{diagnose, DoctorOptions};
use memlens::replay::initial::LATE_START;
use memlens::snapshot::Recording;
use memlens::Snapshot;

/// gpt2_train with the first third of its trace cut off: a trace that began
/// after the allocator did.
fn late_gpt2() -> Snapshot {
    let mut snap = Snapshot::load(&common::fixture("gpt2_train.pickle.zst")).expect("reads");
    for t in &mut snap.traces {
        let cut = t.events.len() / 3;
        t.events.drain(..cut);
        t.extras.clear();
    }
    snap
}

#[test]
fn a_trace_that_began_late_gets_one_caveat_in_one_wording() {
    let snap = late_gpt2();
    let d = diagnose(&[("cut".to_string(), &snap)], &DoctorOptions::default());
    let late: Vec<&str> = d
        .findings
        .iter()
        .filter(|f| f.title.contains("start"))
        .map(|f| f.title.as_str())
        .collect();
    assert_eq!(late.len(), 1, "{late:#?}");
    assert!(late[0].starts_with(LATE_START), "{}", late[0]);
    // Every caveat about it, wherever it is said, starts with the same words.
    for w in d.summary.warnings.iter().chain(d.peak.warnings.iter()) {
        if w.contains("start") || w.contains("ring buffer") {
            assert!(w.starts_with(LATE_START), "{w}");
        }
    }
}

/// A periodic snapshot of memlens.record begins its trace at the one before
/// on purpose (issue 35): its caveat says so, and never tells the user to
/// raise max_entries, which would change nothing. The same cut trace without
/// memlens's word keeps the advice.
#[test]
fn a_trace_memlens_cut_on_purpose_is_not_blamed_on_max_entries() {
    let mut snap = late_gpt2();
    let caveat = |snap: &Snapshot| {
        let d = diagnose(&[("cut".to_string(), snap)], &DoctorOptions::default());
        let late: Vec<String> = d
            .findings
            .iter()
            .filter(|f| f.title.starts_with(LATE_START))
            .map(|f| f.title.clone())
            .collect();
        assert_eq!(late.len(), 1, "{late:#?}");
        late[0].clone()
    };
    let bare = caveat(&snap);
    assert!(bare.contains("max_entries"), "{bare}");

    snap.recording = Some(Recording {
        kind: "periodic".into(),
        step: 20,
        trace_from_step: 10,
        every: Some(10),
        steps_kept: 6,
        max_entries: 45_015,
        sized_by_user: false,
        ring_wrapped: false,
        alloc_conf_env: None,
    });
    let cut = caveat(&snap);
    assert!(!cut.contains("max_entries"), "{cut}");
    assert!(
        cut.contains("memlens.record began this trace after step 10"),
        "{cut}"
    );
    assert!(
        cut.contains("the final snapshot holds the last 6 steps"),
        "{cut}"
    );

    // memlens sized the ring and it still wrapped: say so, and what to pass.
    snap.recording.as_mut().expect("set").ring_wrapped = true;
    let wrapped = caveat(&snap);
    assert!(
        wrapped.contains("ring of 45015 entries, the largest it sizes itself, wrapped"),
        "{wrapped}"
    );
}
