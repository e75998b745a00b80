//! `doctor` replays each trace once under its recorded settings and builds
//! its analysed trace once (issue 29): the counts of [`memlens::work`].

mod common;

use memlens::doctor::DoctorOptions;
use memlens::render::documents::doctor_doc;
use memlens::work::{self, WorkCounts};
use memlens::Snapshot;
use std::sync::Mutex;

/// The counters are process-wide: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Reads `names` as the CLI does (with the replay beside the reader) and runs
/// `doctor` on them, writing the report when `report`; the counts of the work.
fn doctor_counts(names: &[&str], report: bool) -> WorkCounts {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let paths: Vec<_> = names.iter().map(|n| common::fixture(n)).collect();
    work::reset();
    let snaps: Vec<(String, Snapshot)> = Snapshot::load_many_for_peak(&paths, || {})
        .into_iter()
        .zip(names)
        .map(|(s, n)| (n.to_string(), s.expect("fixture reads")))
        .collect();
    let named: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let dir = std::env::temp_dir().join(format!("memlens-one-pass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.join("r.html");
    doctor_doc(
        &named,
        &DoctorOptions::default(),
        report.then_some(out.as_path()),
    )
    .expect("doctor runs");
    let _ = std::fs::remove_dir_all(&dir);
    work::counts()
}

// The target is one replay of each trace under its recorded settings
// whatever is asked. Today: the replay beside the reader (the peak), one
// replay the OOM explainer and the what-ifs share (the state before the OOM,
// the `empty_cache()` runs), and one the report's views share (timeline,
// moments, the states at the peak and the OOM). These tests hold each count
// where it is, so that none creeps back up.

#[test]
fn doctor_on_the_oom_with_the_report_replays_three_times_and_analyses_once() {
    let c = doctor_counts(&["oom.at_oom.pickle.zst"], true);
    assert_eq!(c.recorded_replays, 3, "{c:?}");
    assert_eq!(c.analysed_traces, 1, "{c:?}");
    assert_eq!(c.backward_rebuilds, 0, "{c:?}");
}

#[test]
fn doctor_without_the_report_on_a_healthy_run_replays_once() {
    let c = doctor_counts(&["gpt2_train.pickle.zst"], false);
    assert_eq!(c.recorded_replays, 1, "{c:?}");
    assert_eq!(c.analysed_traces, 1, "{c:?}");
    assert_eq!(c.backward_rebuilds, 0, "{c:?}");
}

#[test]
fn doctor_on_periodic_snapshots_replays_each_once_and_the_last_once_more_for_the_report() {
    let names = [
        "cache_leak.step1.pickle.zst",
        "cache_leak.step5.pickle.zst",
        "cache_leak.step9.pickle.zst",
    ];
    let c = doctor_counts(&names, true);
    assert_eq!(c.recorded_replays, 4, "{c:?}");
    assert_eq!(c.analysed_traces, 1, "{c:?}");
    let c = doctor_counts(&names, false);
    assert_eq!(c.recorded_replays, 3, "{c:?}");
}
