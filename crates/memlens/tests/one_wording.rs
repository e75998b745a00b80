//! One wording per fact (issue 29): a trace that began after the allocator
//! did (a ring buffer that wrapped) is said once, in one way, by `doctor`;
//! it printed three findings for it before (the summary's, the replay's and
//! the peak's, each worded its own way).

mod common;

use memlens::doctor::{diagnose, DoctorOptions};
use memlens::replay::initial::LATE_START;
use memlens::Snapshot;

#[test]
fn a_trace_that_began_late_gets_one_caveat_in_one_wording() {
    let mut snap = Snapshot::load(&common::fixture("gpt2_train.pickle.zst")).expect("reads");
    for t in &mut snap.traces {
        let cut = t.events.len() / 3;
        t.events.drain(..cut);
        t.extras.clear();
    }
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
