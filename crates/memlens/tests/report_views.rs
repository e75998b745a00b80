//! Issue 18's sections of the HTML report on real snapshots: any moment
//! inspectable (the moments data), the OOM drawn, the per-snapshot overview of
//! periodic snapshots and the pseudo-sites' bands. The browser half (clicks,
//! drawing, dark theme, 800 px) is `tests/browser/check.mjs`.

mod common;

use common::{fixture, stats};
use memlens::doctor::{diagnose, DoctorOptions};
use memlens::report::*;
use memlens::snapshot::Snapshot;
use std::path::PathBuf;

fn load(path: PathBuf) -> Snapshot {
    Snapshot::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus")
        .join(name)
}

/// Bytes of the kept allocations live right after event `e`, as the page sums them.
fn kept_live_at(m: &Moments, e: i64) -> u64 {
    m.allocs
        .iter()
        .filter(|a| a[0] <= e && (a[1] < 0 || a[1] > e))
        .map(|a| a[2] as u64)
        .sum()
}

#[test]
fn oom_report_draws_the_request_the_free_pieces_and_every_fix() {
    let snap = load(fixture("oom.pickle.zst"));
    let refs = vec![("oom.pickle.zst".to_string(), &snap)];
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d).bounded();
    let st = stats("oom");
    let at_oom = &st["stats_at_oom"];

    let o = data.oom.as_ref().expect("oom section");
    // "Tried to allocate 1000.00 MiB" in PyTorch's message.
    assert_eq!(o.requested_bytes, 1000 << 20);
    // Right before the failure, as PyTorch's message prints it (the stats
    // were read after the exception unwound, so they hold less).
    let msg = st["oom_message"].as_str().expect("message");
    let fb = memlens::units::format_bytes;
    assert!(msg.contains(&format!(
        "{} is allocated by PyTorch",
        fb(o.allocated_bytes)
    )));
    assert!(msg.contains(&format!(
        "{} is reserved by PyTorch but unallocated",
        fb(o.reserved_bytes - o.allocated_bytes)
    )));
    let r = d.oom.as_ref().expect("diagnosis has the OOM");
    assert_eq!(o.fixes.len(), r.fixes.len() + r.not_helpful.len());
    assert!(o.fixes.len() > 1, "every fix, not just one");
    assert_eq!(o.pools.len(), r.pools.len());
    let here = o
        .pools
        .iter()
        .find(|p| p.requested_here)
        .expect("request's pool");
    assert_eq!(here.largest_free_bytes, r.largest_free_block_bytes);
    assert!(here.largest_free_bytes < o.requested_bytes);
    assert!(!o.live.is_empty());

    // The moments: every allocation of the run is kept here (3,446, as
    // PyTorch counted them), so the sum at the peak is the peak exactly.
    let m = data.moments.as_ref().expect("moments");
    assert_eq!(
        m.total_allocs,
        at_oom["allocation.all.allocated"].as_u64().unwrap()
    );
    assert_eq!(m.allocs.len() as u64, m.total_allocs);
    assert_eq!(m.min_kept_bytes, 0);
    let peak = d.peak.peak_event_index.expect("peak") as i64;
    assert_eq!(kept_live_at(m, peak), d.peak.peak_allocated_bytes);
    // Segment maps saved at the peak and at the OOM, at most MOMENT_SEGMENT_MAPS.
    assert!(m.segment_events.contains(&(peak as u64)));
    assert!(m.segment_events.contains(&o.event_index));
    assert!(m.segment_maps.len() <= MOMENT_SEGMENT_MAPS);
    let i = m
        .segment_events
        .iter()
        .position(|&e| e == o.event_index)
        .unwrap();
    let s = &m.segment_maps[i];
    let reserved: u64 =
        s.segments.iter().map(|s| s.size).sum::<u64>() + s.omitted.map_or(0, |o| o.bytes);
    assert_eq!(reserved, o.reserved_bytes);

    // Pseudo-sites (no stack: the backward pass, cuBLAS workspaces) hold their
    // real bytes in the timeline: no band is 0 B everywhere.
    let t = data.timeline.as_ref().expect("timeline");
    assert!(t.sites.iter().any(|s| s.site == "<backward pass>"));
    for (s, band) in t.sites.iter().zip(&t.bands) {
        assert!(s.peak_bytes > 0, "{} is 0 B", s.site);
        assert!(band.iter().any(|&b| b > 0), "{} is 0 B", s.site);
    }
    let p = t.peak.expect("peak point");
    for (s, band) in t.sites.iter().zip(&t.bands) {
        let at_peak: u64 = d
            .peak
            .live_at_peak
            .iter()
            .filter(|l| l.site == s.site)
            .map(|l| l.bytes)
            .sum();
        assert_eq!(band[p], at_peak, "{} at the peak", s.site);
    }
}

#[test]
fn periodic_snapshots_show_each_snapshot_and_the_leak_across_them() {
    let names = [
        "leak_losses.step2.pickle.zst",
        "leak_losses.step4.pickle.zst",
        "leak_losses.step6.pickle.zst",
    ];
    let snaps: Vec<(String, Snapshot)> = names
        .iter()
        .map(|n| (n.to_string(), load(corpus(n))))
        .collect();
    let refs: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d).bounded();

    // The leak: the verdict `memlens leaks` gives on the same files.
    let cli = memlens::analysis::leaks::find(&refs);
    let l = data.leaks.as_ref().expect("leaks");
    assert_eq!(l.points.len(), 3);
    assert_eq!(l.sites[0].site, cli.leaks[0].site);
    assert_eq!(l.sites[0].bytes, cli.leaks[0].evidence);
    assert!(l.sites[0].bytes.windows(2).all(|w| w[0] < w[1]));

    // One row per snapshot, with each one's own peak and the growth between.
    let o = data.overview.as_ref().expect("overview");
    assert_eq!(o.rows.len(), 3);
    for (row, (name, snap)) in o.rows.iter().zip(&refs) {
        assert_eq!(&row.file, name);
        let p = memlens::analysis::peak::peak(snap, 0);
        assert_eq!(row.peak_allocated_bytes, p.peak_allocated_bytes);
        assert_eq!(row.peak_reserved_bytes, p.peak_reserved_bytes);
        let s = memlens::analysis::summary::summarize(snap);
        assert_eq!(row.allocated_bytes, s.allocated_bytes);
    }
    assert_eq!(o.rows[0].growth_bytes, 0);
    for w in o.rows.windows(2) {
        assert_eq!(
            w[1].growth_bytes,
            w[1].allocated_bytes as i64 - w[0].allocated_bytes as i64
        );
        assert!(w[1].growth_bytes > 0, "a leaking run grows");
    }
    // One snapshot: no overview.
    let one = vec![refs[2].clone()];
    let d1 = diagnose(&one, &DoctorOptions::default());
    assert!(from_diagnosis(&one, &d1).overview.is_none());
}

/// Issue 33: a notebook recorded with PyTorch's default stacks (`stacks="all"`)
/// drew a flame graph of C and CPython frames (`??`, `_PyEval_EvalFrameDefault`,
/// `__libc_start_main`) above the user's cell. The flame graph now leaves the
/// native frames out, by the terminal's frame rulebook; the bytes stay.
#[test]
fn the_flame_graph_of_a_stacks_all_recording_leaves_native_frames_out() {
    let snap = load(corpus("notebook.pickle.zst"));
    let refs = vec![("notebook.pickle.zst".to_string(), &snap)];
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d);
    let flame = data.flame.as_ref().expect("flame");
    let native: Vec<&String> = flame
        .names
        .iter()
        .filter(|n| n.starts_with("??:") || n.starts_with(":0 in") || n.contains(".cpp:"))
        .collect();
    assert!(native.is_empty(), "{:?}", &native[..native.len().min(5)]);
    assert!(
        flame.names.iter().any(|n| n.contains("ipykernel")),
        "the cell's frames are drawn: {:?}",
        &flame.names[..flame.names.len().min(10)]
    );
    // Every byte live at the peak is still in the graph.
    assert_eq!(flame.value[0], d.peak.peak_allocated_bytes);
    // The stacks of the timeline's sites and of any moment (the flame graph
    // redrawn at a clicked event) leave them out too.
    let is_native =
        |n: &String| n.starts_with("??:") || n.starts_with(":0 in") || n.contains(".cpp:");
    let timeline = data.timeline.as_ref().expect("timeline");
    for s in &timeline.sites {
        assert!(!s.stack.iter().any(is_native), "{}: {:?}", s.site, s.stack);
    }
    let moments = data.moments.as_ref().expect("moments");
    assert!(!moments.frames.iter().any(is_native));
}

/// Issue 33: memory allocated before recording started is its own band with
/// its bytes (it showed 0 B in the legend while 325 MiB sat in "other
/// sites"), and the flame graph names it as the peak does.
#[test]
fn memory_allocated_before_recording_is_its_own_band_and_flame_frame() {
    let snap = load(corpus("forward_only_preloaded.pickle.zst"));
    let refs = vec![("forward_only_preloaded.pickle.zst".to_string(), &snap)];
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d).bounded();
    let before = "<allocated before recording started>";
    let at_peak: u64 = d
        .peak
        .live_at_peak
        .iter()
        .filter(|l| l.site == before)
        .map(|l| l.bytes)
        .sum();
    assert!(at_peak > 300 << 20, "the preloaded weights: {at_peak}");
    let t = data.timeline.as_ref().expect("timeline");
    let k = t
        .sites
        .iter()
        .position(|s| s.site == before)
        .expect("a band of its own");
    let p = t.peak.expect("peak point");
    assert_eq!(t.bands[k][p], at_peak);
    assert_eq!(t.sites[k].peak_bytes, at_peak);
    let f = data.flame.as_ref().expect("flame");
    let node = f
        .name
        .iter()
        .position(|&n| f.names[n as usize] == before)
        .expect("a flame frame named as the peak names it");
    assert_eq!(f.value[node], at_peak);
    assert!(!f.names.iter().any(|n| n == "<no stack>"));
}

/// Issue 33: each fix in the report carries the verdict the terminal tags it
/// with, from one rule, and no fix says it fits where the verdict does not.
#[test]
fn the_report_s_fixes_carry_the_terminal_s_verdicts() {
    for name in [
        "oom/frag_cap.pickle.zst",
        "oom/gpt_warm.pickle.zst",
        "oom/eval_spike.pickle.zst",
        "legacy_oom.pickle.zst",
    ] {
        let snap = load(corpus(name));
        let refs = vec![(name.to_string(), &snap)];
        let d = diagnose(&refs, &DoctorOptions::default());
        let data = from_diagnosis(&refs, &d).bounded();
        let o = data.oom.as_ref().expect("oom section");
        let r = d.oom.as_ref().expect("diagnosis has the OOM");
        let text = memlens::render::oom::text(r);
        for (i, f) in r.fixes.iter().enumerate() {
            assert_eq!(o.fixes[i].verdict, f.verdict(), "{name} fix {i}");
            assert!(
                text.contains(&format!("[{}] ", f.verdict())),
                "{name}: {text}"
            );
            if f.action.contains("step fits") {
                assert_eq!(f.verdict(), "fits", "{name}: {}", f.action);
            }
        }
        for f in &o.fixes[r.fixes.len()..] {
            assert_eq!(f.verdict, "would not help", "{name}");
        }
    }
}

/// Issue 33: an OOM dumped in PyTorch 2.0's form (a trace of the one `oom`
/// entry) is drawn from the dump: every segment in the map, no timeline of
/// one point, no settings table where nothing can be replayed, no caveat of
/// a trace begun late.
#[test]
fn a_legacy_oom_snapshot_is_drawn_from_its_dump() {
    let snap = load(corpus("legacy_oom.pickle.zst"));
    assert!(!snap.has_allocation_trace());
    let refs = vec![("legacy_oom.pickle.zst".to_string(), &snap)];
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d).bounded();
    assert!(data.timeline.is_none() && data.moments.is_none() && data.tune.is_none());
    let s = data.segments.as_ref().expect("segment map");
    assert_eq!(s.when, "at dump time");
    assert_eq!(
        s.segments.len() as u64 + s.omitted.map_or(0, |o| o.count),
        190
    );
    let reserved: u64 =
        s.segments.iter().map(|s| s.size).sum::<u64>() + s.omitted.map_or(0, |o| o.bytes);
    assert_eq!(
        reserved,
        snap.segments.iter().map(|s| s.total_size).sum::<u64>()
    );
    let o = data.oom.as_ref().expect("the OOM");
    assert_eq!(o.requested_bytes, 2 << 30);
    assert!(data
        .flame
        .as_ref()
        .is_some_and(|f| f.names.iter().any(|n| n.contains("train_oom.py:108"))));
    let late = memlens::replay::initial::LATE_START;
    assert!(
        !d.peak.warnings.iter().any(|w| w.starts_with(late)),
        "{:?}",
        d.peak.warnings
    );
    assert!(!data.meta.notes.iter().any(|w| w.starts_with(late)));
}

/// Issue 33: the report folds library frames by the terminal's frame
/// rulebook: the flame graph and the moments mark exactly the frames
/// `frames::classify` calls PyTorch's, a package's or the standard
/// library's; the user's lines and pseudo-frames are never marked.
#[test]
fn the_report_marks_library_frames_by_the_frame_rulebook() {
    let snap = load(corpus("notebook.pickle.zst"));
    let refs = vec![("notebook.pickle.zst".to_string(), &snap)];
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d).bounded();
    let f = data.flame.as_ref().expect("flame");
    assert!(
        !f.library.is_empty(),
        "a notebook's stacks run through torch"
    );
    for (i, name) in f.names.iter().enumerate() {
        let marked = f.library.contains(&(i as u32));
        let library = name.contains("/site-packages/") || name.starts_with("/usr/lib/python3");
        assert_eq!(marked, library, "{name}");
    }
    assert!(f
        .names
        .iter()
        .any(|n| n.contains("/tmp/ipykernel_") && !n.contains("site-packages")));
    let m = data.moments.as_ref().expect("moments");
    assert!(!m.library.is_empty());
    for &k in &m.library {
        assert!(
            is_library_label(&m.frames[k as usize]),
            "{}",
            m.frames[k as usize]
        );
    }
    for label in [
        "<backward pass>",
        "<allocated before recording started>",
        "/tmp/ipykernel_1/2.py:3 in <module>",
    ] {
        assert!(!is_library_label(label), "{label}");
    }
}

/// Issue 33: doctor's findings and the peak's groups show the same stacks
/// as the report, native frames left out (the notebook's peak finding listed
/// 53 C++ frames of 64); what those frames said is kept as the operators.
#[test]
fn finding_stacks_leave_native_frames_out_and_keep_the_operators() {
    let snap = load(corpus("notebook.pickle.zst"));
    let refs = vec![("notebook.pickle.zst".to_string(), &snap)];
    let d = diagnose(&refs, &DoctorOptions::default());
    let native = |l: &String| l.contains(".cpp:") || l.starts_with("??:") || l.starts_with(":0");
    let peak = d
        .findings
        .iter()
        .find(|f| f.kind == "peak")
        .expect("peak finding");
    assert!(
        !peak.stack.is_empty() && !peak.stack.iter().any(native),
        "{:?}",
        peak.stack
    );
    assert!(
        peak.stack.iter().any(|l| l.contains("/tmp/ipykernel_")),
        "the cell's line: {:?}",
        peak.stack
    );
    for l in &d.peak.live_at_peak {
        assert!(!l.stack.iter().any(native), "{}: {:?}", l.site, l.stack);
    }
    let top = &d.peak.live_at_peak[0];
    assert!(top.ops.iter().any(|o| o == "mm"), "{:?}", top.ops);
}

/// Bytes of the segment pieces reserved right after event `e`.
fn pieces_after(t: &SegmentTimeline, e: i64) -> u64 {
    t.pieces
        .iter()
        .filter(|p| p[0] <= e && (p[1] < 0 || p[1] > e))
        .map(|p| p[2] as u64)
        .sum()
}

/// memory_viz's cached segment timeline: the pieces reserved after each of
/// the timeline's points add up to its reserved bytes, on every fixture and
/// every corpus snapshot with a trace (expandable segments, traces begun
/// late, private pools, OOMs among them).
#[test]
fn the_segment_timeline_adds_up_to_reserved_at_every_point() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(common::fixtures_dir())
        .expect("fixtures")
        .chain(std::fs::read_dir(corpus("")).expect("corpus"))
        .chain(std::fs::read_dir(corpus("oom")).expect("corpus/oom"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".pickle.zst"))
        .collect();
    files.sort();
    let mut checked = 0;
    for path in files {
        let snap = load(path.clone());
        let name = path.display().to_string();
        let refs = vec![(name.clone(), &snap)];
        let d = diagnose(&refs, &DoctorOptions::default());
        let data = from_diagnosis(&refs, &d);
        let (Some(t), Some(tl)) = (data.segment_timeline.as_ref(), data.timeline.as_ref()) else {
            continue;
        };
        assert_eq!(t.omitted, 0, "{name}");
        for (k, &e) in tl.event.iter().enumerate() {
            assert_eq!(
                pieces_after(t, e as i64),
                tl.reserved[k],
                "{name}: event {e}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 40, "{checked} snapshots checked");
}
