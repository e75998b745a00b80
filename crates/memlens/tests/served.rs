//! `memlens report --serve` (issue 33: a trace of any size explorable event
//! by event): the served page asks memlens for the state at a clicked event,
//! and that state is `memlens state`'s, to the byte, with every block drawn.
//! The browser half (a click on a 1 GB trace) is `tests/browser/served.sh`.

mod common;

use common::fixture;
use memlens::analysis::peak::AnalysedSet;
use memlens::analysis::state::state_at_event;
use memlens::doctor::{diagnose_inputs_in, Diagnosis, DoctorOptions};
use memlens::http::Request;
use memlens::report::{Explorer, STATE_PATH, STRETCH_PATH, STRETCH_POINTS};
use memlens::snapshot::Snapshot;
use memlens::trace::Analysed;

fn get<'a>(path: &'a str, query: &'a str) -> Request<'a> {
    Request {
        method: "GET",
        path,
        query,
    }
}

/// Runs `f` with the served explorer of fixture `name`, the snapshot and its
/// diagnosis.
fn with_explorer(name: &str, f: impl FnOnce(&mut Explorer<'_, '_>, &Snapshot, &Diagnosis)) {
    let snap = Snapshot::load(&fixture(name)).expect("fixture");
    let named = vec![(name.to_string(), &snap)];
    let set = AnalysedSet::new(&named);
    let d = diagnose_inputs_in(&set, &named, &DoctorOptions::default());
    let mut ex = Explorer::new(&set, &named, &d);
    f(&mut ex, &snap, &d);
}

#[test]
fn a_served_state_is_memlens_states_whatever_order_events_are_asked_in() {
    with_explorer("gpt2_train.pickle.zst", |ex, snap, d| {
        assert!(ex
            .page()
            .contains(&format!("\"state_url\":\"{STATE_PATH}\"")));
        let an = Analysed::new(snap);
        let n = snap.traces[0].events.len();
        let peak = d.peak.peak_event_index.expect("a peak");
        // Forward (the kept replay goes on), back (a new one), the peak, the last.
        for e in [10, 4_000, 9_000, 2_500, peak, n - 1] {
            let served = ex.state(e).expect("a state");
            let want = state_at_event(&an, None, e, 15).expect("memlens state");
            assert_eq!(served.state, want, "event {e}");
            // Every live block is in the flame graph: its root holds them all.
            assert_eq!(served.flame.value[0], want.allocated_bytes, "event {e}");
            assert!(served
                .flame
                .title
                .contains(&memlens::units::group_digits(e as u64)));
            assert!(served.segments.when.contains("replayed by memlens"));
            let seg_bytes: u64 = served.segments.segments.iter().map(|s| s.size).sum::<u64>()
                + served.segments.omitted.as_ref().map_or(0, |o| o.bytes);
            assert_eq!(
                seg_bytes, want.reserved_bytes,
                "event {e}: the map holds what is reserved"
            );
        }
        assert_eq!(
            ex.state(peak).expect("peak").state.allocated_bytes,
            d.peak.peak_allocated_bytes
        );
        assert!(ex.state(n).is_none(), "past the trace");
    });
}

#[test]
fn the_server_answers_the_page_a_state_and_clear_errors() {
    with_explorer("varlen.pickle.zst", |ex, _, _| {
        let page = ex.answer(&get("/", ""));
        assert_eq!(page.status, 200);
        assert!(page.content_type.starts_with("text/html"));
        assert!(page.body.contains("id=\"memlens-data\""));
        let s = ex.answer(&get(STATE_PATH, "event=100"));
        assert_eq!(
            (s.status, s.content_type.as_str()),
            (200, "application/json")
        );
        let v: serde_json::Value = serde_json::from_str(&s.body).expect("JSON");
        assert_eq!(v["state"]["event_index"], 100);
        for key in ["flame", "segments"] {
            assert!(v[key].is_object(), "{key}");
        }
        assert_eq!(ex.answer(&get(STATE_PATH, "")).status, 400);
        assert_eq!(ex.answer(&get(STATE_PATH, "event=-1")).status, 400);
        let past = ex.answer(&get(STATE_PATH, "event=99999999"));
        assert_eq!(past.status, 404);
        assert!(past.body.contains("no event 99999999"));
        assert_eq!(ex.answer(&get("/nope", "")).status, 404);
    });
}

#[test]
fn a_written_report_does_not_ask_for_states() {
    let snap = Snapshot::load(&fixture("varlen.pickle.zst")).expect("fixture");
    let named = vec![("varlen.pickle.zst".to_string(), &snap)];
    let d = memlens::doctor::diagnose(&named, &DoctorOptions::default());
    let data = memlens::report::from_diagnosis(&named, &d).bounded();
    assert!(data.state_url.is_none());
    assert!(!memlens::report::render_html(&data).contains("\"state_url\":"));
}

#[test]
fn a_zoomed_stretch_is_exact_event_by_event_and_bounded_when_long() {
    with_explorer("gpt2_train.pickle.zst", |ex, snap, d| {
        let an = Analysed::new(snap);
        // A short stretch: every event, each as `memlens state` has it.
        let s = ex.stretch(7_000, 7_100).expect("a stretch");
        assert_eq!(s.event, (7_000..=7_100).collect::<Vec<u64>>());
        assert_eq!(s.source_points, 101);
        for k in [0, 37, 100] {
            let want = state_at_event(&an, None, s.event[k] as usize, 1).expect("state");
            assert_eq!(
                (s.allocated[k], s.reserved[k]),
                (want.allocated_bytes, want.reserved_bytes)
            );
        }
        // Every event up to STRETCH_POINTS of them.
        let most = ex
            .stretch(1_000, 1_000 + STRETCH_POINTS - 1)
            .expect("a stretch");
        assert_eq!(most.event.len(), STRETCH_POINTS);
        assert_eq!(
            most.event.last(),
            Some(&((1_000 + STRETCH_POINTS - 1) as u64))
        );
        // The whole trace: bounded, its peak kept exactly.
        let n = snap.traces[0].events.len();
        let all = ex.stretch(0, n + 50).expect("clamped to the trace");
        assert_eq!(all.source_points as usize, n);
        assert!(all.event.len() <= STRETCH_POINTS + 2, "{}", all.event.len());
        assert_eq!(
            all.allocated.iter().max(),
            Some(&d.peak.peak_allocated_bytes)
        );
        assert!(ex.stretch(n, n + 1).is_none());
        // Over HTTP, and clear errors.
        let r = ex.answer(&get(STRETCH_PATH, "from=10&to=12"));
        assert_eq!(r.status, 200);
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("JSON");
        assert_eq!(v["event"], serde_json::json!([10, 11, 12]));
        assert_eq!(ex.answer(&get(STRETCH_PATH, "from=10")).status, 400);
        assert!(ex
            .page()
            .contains(&format!("\"stretch_url\":\"{STRETCH_PATH}\"")));
    });
}

/// Bytes of the listed allocations live right after event `e`.
fn shapes_live_after(a: &memlens::report::StretchAllocations, e: i64) -> u64 {
    a.allocs
        .iter()
        .filter(|x| x[0] <= e && (x[1] < 0 || x[1] > e))
        .map(|x| x[2] as u64)
        .sum()
}

#[test]
fn a_short_stretch_lists_every_allocation_and_they_add_up_to_allocated() {
    for name in [
        "gpt2_train.pickle.zst",
        "varlen@expandable.pickle.zst",
        "oom.at_oom.pickle.zst",
    ] {
        let snap = Snapshot::load(&fixture(name)).expect("fixture");
        let named = vec![(name.to_string(), &snap)];
        let set = AnalysedSet::new(&named);
        let d = diagnose_inputs_in(&set, &named, &DoctorOptions::default());
        let mut ex = Explorer::new(&set, &named, &d);
        let n = snap
            .traces
            .iter()
            .map(|t| t.events.len())
            .max()
            .unwrap_or(0);
        let peak = d.peak.peak_event_index.expect("a peak");
        for from in [0, peak.saturating_sub(300), n / 2, n.saturating_sub(500)] {
            let s = ex.stretch(from, from + 999).expect("a stretch");
            let a = s
                .allocations
                .as_ref()
                .unwrap_or_else(|| panic!("{name} {from}: listed"));
            assert_eq!(s.event.len() as u64, s.source_points, "{name}: every event");
            for (k, &e) in s.event.iter().enumerate() {
                assert_eq!(
                    shapes_live_after(a, e as i64),
                    s.allocated[k],
                    "{name}: event {e}"
                );
            }
            for x in &a.allocs {
                assert!(x[3] <= x[2], "{name}: a request over its block: {x:?}");
                assert!((x[5] as usize) < a.sites.len());
                assert!(x[6] < a.stacks.len() as i64);
            }
        }
        // A stretch too long to draw each allocation lists none.
        let long = ex.stretch(0, n).expect("a stretch");
        assert_eq!(
            long.allocations.is_none(),
            n > memlens::report::SHAPES_MAX_EVENTS,
            "{name}"
        );
    }
}
