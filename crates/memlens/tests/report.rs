//! The HTML report: its data model, the level-of-detail helpers and rendering.
//!
//! The browser half of the acceptance (the page draws every section without a
//! console error) is `tests/browser/run.sh`; these tests hold the Rust half.

mod common;

use common::{fixture, stats};
use memlens::report::*;
use memlens::snapshot::{BlockState as SnapState, Snapshot};

/// A small report with every section, built as the analyses would.
fn sample() -> ReportData {
    let stack = vec![
        "/home/user/train/model.py:42 in forward".to_string(),
        "/home/user/train/train.py:10 in main".to_string(),
    ];
    let mut flame = FlameBuilder::new("live at the peak");
    flame.add_innermost_first(&stack, 3 << 30);
    flame.add(
        ["/home/user/train/train.py:10 in main", "adamw.py:7 in step"],
        1 << 30,
    );
    let site = TimelineSite {
        site: "/home/user/train/model.py:42".into(),
        function: "forward".into(),
        stack: stack.clone(),
        category: Category::Activation,
        peak_bytes: 3 << 30,
    };
    let mut tb = TimelineBuilder::new(XUnit::Event, vec![site], 100, DEFAULT_MAX_POINTS);
    for i in 0..100u64 {
        let band = [i << 20];
        tb.push(TimelinePoint {
            x: i as i64,
            event: i,
            allocated: (i << 20) + (5 << 20),
            reserved: 1 << 30,
            active: Some((i << 20) + (5 << 20)),
            bands: &band,
            oom: i == 99,
            keep: false,
        });
    }
    ReportData {
        meta: Meta {
            title: "memlens report: train".into(),
            stats: vec![Stat {
                label: "peak allocated".into(),
                bytes: Some(4 << 30),
                text: None,
            }],
            ..Meta::now(vec!["train.pickle".into()])
        },
        findings: vec![Finding {
            kind: "leak".into(),
            severity: Severity::Critical,
            title: "Memory grows every step".into(),
            site: Some("/home/user/train/model.py:42".into()),
            bytes: Some(3 << 30),
            suggestion: Some("wrap evaluation in torch.no_grad()".into()),
            evidence: vec!["+100 MiB per step".into()],
            stack: stack.clone(),
            quote: Default::default(),
        }],
        timeline: Some(tb.finish()),
        flame: Some(flame.finish()),
        segments: Some(SegmentMap {
            when: "at the peak".into(),
            segments: vec![SegmentRow {
                address: 0x7f00_0000_0000,
                size: 20 << 20,
                stream: 0,
                pool: "large".into(),
                blocks: vec![
                    SegmentBlock {
                        offset: 0,
                        size: 12 << 20,
                        requested: 12 << 20,
                        state: BlockState::Allocated,
                        category: Category::Activation,
                        site: Some(0),
                        count: 1,
                    },
                    SegmentBlock {
                        offset: 12 << 20,
                        size: 8 << 20,
                        state: BlockState::Free,
                        count: 1,
                        ..SegmentBlock::default()
                    },
                ],
            }],
            sites: vec![BlockSite {
                site: "/home/user/train/model.py:42".into(),
                stack: stack.clone(),
            }],
            omitted: None,
        }),
        leaks: Some(Leaks {
            x_label: "step".into(),
            points: vec!["1".into(), "5".into(), "11".into()],
            sites: vec![LeakSite {
                site: "/home/user/train/model.py:42".into(),
                function: "forward".into(),
                stack,
                bytes: vec![1 << 30, 2 << 30, 3 << 30],
                bytes_per_step: 100 << 20,
                confidence: "high".into(),
                suggestion: None,
                held_by: vec!["model.cache [module]: 3 tensors, 3.00 GiB via list".into()],
                kept_by: Some("model.py:43: self.cache.append(x)".into()),
            }],
        }),
        tune: Some(Tune {
            device_memory: None,
            rows: vec![
                TuneRow {
                    config: "expandable_segments:True".into(),
                    peak_reserved_bytes: 12 << 30,
                    num_ooms: 0,
                    num_device_alloc: Some(67),
                    num_alloc_retries: None,
                    delta_bytes: -(388 << 20),
                    current: false,
                },
                TuneRow {
                    config: String::new(),
                    peak_reserved_bytes: (12 << 30) + (388 << 20),
                    num_ooms: 0,
                    num_device_alloc: Some(72),
                    num_alloc_retries: None,
                    delta_bytes: 0,
                    current: true,
                },
            ],
        }),
        ..ReportData::default()
    }
}

/// The JSON embedded in a page, unescaped by a JSON parser.
fn embedded(html: &str) -> serde_json::Value {
    let open = "<script type=\"application/json\" id=\"memlens-data\">";
    let start = html.find(open).expect("data script") + open.len();
    let len = html[start..].find("</script>").expect("data script closes");
    serde_json::from_str(&html[start..start + len]).expect("embedded JSON parses")
}

#[test]
fn page_embeds_the_data_and_every_asset() {
    let data = sample();
    let html = render_html(&data);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<title>memlens report: train</title>"));
    assert!(html.contains("var uPlot=function()"), "uPlot is inlined");
    assert!(html.contains("window.memlens"), "report.js is inlined");
    assert!(!html.contains("{{"), "every placeholder is replaced");
    let back: ReportData = serde_json::from_value(embedded(&html)).unwrap();
    assert_eq!(back, data);
}

#[test]
fn page_needs_no_network() {
    let html = render_html(&sample());
    let lower = html.to_ascii_lowercase();
    for needle in ["<script src", "<link", "@import", "url(http", "src=\"http"] {
        assert!(!lower.contains(needle), "page contains {needle:?}");
    }
    // The page asks memlens for states and stretches only when served by
    // `memlens report --serve`, which puts their paths in its data; a page
    // written to a file has none, so it fetches nothing (the browser test
    // fails on any request of a written page).
    for (at, _) in html.match_indices("fetch(") {
        let call = &html[at..at + 24.min(html.len() - at)];
        assert!(
            call.starts_with("fetch(D.state_url") || call.starts_with("fetch(D.stretch_url"),
            "a fetch of something else: {call}"
        );
    }
    assert!(!html.contains("\"state_url\":") && !html.contains("\"stretch_url\":"));
}

#[test]
fn a_site_name_cannot_break_out_of_the_data_script() {
    let evil = "</script><script>alert(1)</script><!-- \u{2028}\u{2029}";
    let mut data = sample();
    data.meta.title = format!("<b>{evil}</b>");
    data.findings[0].site = Some(evil.to_string());
    if let Some(f) = &mut data.flame {
        f.names.push(evil.to_string());
    }
    let html = render_html(&data);
    // Six scripts (data, uPlot, views.js, moments.js, segments.js,
    // report.js), each closed once; nothing else.
    assert_eq!(html.matches("</script>").count(), 6);
    assert!(!html.contains("<script>alert(1)"));
    // No raw line separators in the data (they end lines in old JavaScript).
    let open = "id=\"memlens-data\">";
    let start = html.find(open).unwrap();
    let data_text = &html[start..start + html[start..].find("</script>").unwrap()];
    assert!(!data_text.contains('\u{2028}') && !data_text.contains('\u{2029}'));
    assert!(!data_text.contains('<'));
    // The title is escaped as text.
    assert!(html.contains("<title>&lt;b&gt;&lt;/script&gt;"));
    // And the data survives the trip intact.
    let back: ReportData = serde_json::from_value(embedded(&html)).unwrap();
    assert_eq!(back.findings[0].site.as_deref(), Some(evil));
    assert_eq!(back, data);
}

#[test]
fn render_from_json_matches_render() {
    let data = sample();
    let json = serde_json::to_string(&data).unwrap();
    assert_eq!(render_html_from_json(&json).unwrap(), render_html(&data));
    let err = render_html_from_json("{\"findings\": 3}").unwrap_err();
    assert!(matches!(err, memlens::Error::Json { .. }), "{err}");
}

#[test]
fn every_section_is_optional() {
    let html = render_html_from_json("{}").unwrap();
    let v = embedded(&html);
    for key in ["timeline", "flame", "segments", "leaks", "tune"] {
        assert!(v[key].is_null(), "{key}");
    }
    assert_eq!(v["findings"], serde_json::json!([]));
}

#[test]
fn blocks_serialize_as_compact_arrays() {
    let data = sample();
    let v = serde_json::to_value(data.segments.as_ref().unwrap()).unwrap();
    assert_eq!(
        v["segments"][0]["blocks"],
        serde_json::json!([
            [0, 12 << 20, 12 << 20, 0, 3, 0, 1],
            [12 << 20, 8 << 20, 0, 2, 6, -1, 1]
        ])
    );
    assert_eq!(
        serde_json::to_value(Severity::Critical).unwrap(),
        "critical"
    );
    assert_eq!(
        serde_json::to_value(Category::OptimizerState).unwrap(),
        "optimizer_state"
    );
}

/// A long, noisy series: a sawtooth with spikes, one global peak and OOMs.
fn long_timeline(n: usize) -> (Timeline, usize) {
    let peak = n * 2 / 3 + 17;
    let mut t = Timeline {
        x_unit: XUnit::TimeUs,
        sites: vec![TimelineSite::default(), TimelineSite::default()],
        bands: vec![Vec::with_capacity(n), Vec::with_capacity(n)],
        ..Timeline::default()
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for i in 0..n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let base = ((i % 5000) as u64) << 16;
        let noise = seed % (1 << 20);
        let alloc = if i == peak { 9 << 30 } else { base + noise };
        let a = alloc / 2;
        let b = alloc / 4;
        t.x.push(1_795_318_608_747_332 + i as i64 * 3);
        t.event.push(i as u64);
        t.allocated.push(alloc);
        t.reserved.push(alloc + (1 << 28));
        t.active.push(alloc);
        t.bands[0].push(a);
        t.bands[1].push(b);
        t.other.push(alloc - a - b);
    }
    t.peak = Some(peak);
    t.ooms = vec![n / 3, n - 5];
    t.source_points = n as u64;
    (t, peak)
}

#[test]
fn downsampling_keeps_peaks_and_ooms_exactly() {
    let n = 1_000_000;
    let (t, peak) = long_timeline(n);
    let d = downsample_timeline(&t, DEFAULT_MAX_POINTS);
    let m = d.x.len();
    assert!(m <= DEFAULT_MAX_POINTS + t.ooms.len(), "{m} points");
    assert!(m > DEFAULT_MAX_POINTS / 2, "{m} points");
    for col in [&d.event, &d.allocated, &d.reserved, &d.active, &d.other] {
        assert_eq!(col.len(), m);
    }
    assert_eq!(d.source_points, n as u64);
    // The peak: same event, same value.
    let p = d.peak.expect("peak");
    assert_eq!(d.event[p], peak as u64);
    assert_eq!(d.allocated[p], 9 << 30);
    assert_eq!(d.allocated.iter().max(), t.allocated.iter().max());
    assert_eq!(d.reserved.iter().max(), t.reserved.iter().max());
    assert_eq!(d.allocated.iter().min(), t.allocated.iter().min());
    // OOMs kept, first and last points kept, order kept.
    let ooms: Vec<u64> = d.ooms.iter().map(|&i| d.event[i]).collect();
    assert_eq!(ooms, vec![(n / 3) as u64, (n - 5) as u64]);
    assert_eq!(d.event[0], 0);
    assert_eq!(*d.event.last().unwrap(), (n - 1) as u64);
    assert!(d.event.windows(2).all(|w| w[0] < w[1]));
    // Every kept point is a real point, whole: the bands still stack up.
    for i in 0..m {
        let j = d.event[i] as usize;
        assert_eq!(d.x[i], t.x[j]);
        assert_eq!(d.allocated[i], t.allocated[j]);
        assert_eq!(d.bands[0][i] + d.bands[1][i] + d.other[i], d.allocated[i]);
    }
    // Small timelines come back as they are.
    let (small, _) = long_timeline(3000);
    assert_eq!(downsample_timeline(&small, DEFAULT_MAX_POINTS), small);
}

#[test]
fn builder_stays_bounded_when_more_points_come_than_announced() {
    let mut b = TimelineBuilder::new(XUnit::Event, Vec::new(), 1000, 400);
    for i in 0..100_000u64 {
        b.push(TimelinePoint {
            x: i as i64,
            event: i,
            allocated: (i * 7919) % 100_003,
            reserved: 200_000,
            ..TimelinePoint::default()
        });
    }
    let t = b.finish();
    assert!(t.x.len() <= 400, "{}", t.x.len());
    assert!(t.active.is_empty() && t.other.is_empty());
    let p = t.peak.unwrap();
    assert_eq!(t.allocated[p], 100_002);
    assert_eq!(t.source_points, 100_000);
}

#[test]
fn flame_builder_merges_common_prefixes() {
    let mut b = FlameBuilder::new("t");
    b.add(["a", "b", "c"], 10);
    b.add(["a", "b", "d"], 5);
    b.add(["a", "e"], 1);
    b.add(Vec::<&str>::new(), 2);
    let f = b.finish();
    assert_eq!(f.value[0], 18);
    assert_eq!(f.parent.len(), 7); // root, a, b, c, d, e, <no stack>
    let label = |i: usize| f.names[f.name[i] as usize].as_str();
    let none = (1..7).find(|&i| label(i) == FLAME_NO_STACK).unwrap();
    assert_eq!((f.value[none], f.parent[none]), (2, 0));
    assert_eq!(label(0), FLAME_ROOT);
    let a = (1..7).find(|&i| label(i) == "a").unwrap();
    assert_eq!(f.value[a], 16);
    assert_eq!(f.parent[a], 0);
    let b_ = (1..7).find(|&i| label(i) == "b").unwrap();
    assert_eq!((f.value[b_], f.parent[b_] as usize), (15, a));
    assert!((1..7).all(|i| (f.parent[i] as usize) < i));
}

#[test]
fn flame_pruning_merges_small_nodes_into_other() {
    let mut b = FlameBuilder::new("t");
    b.add(["main", "big"], 1_000_000);
    for k in 0..5000 {
        let name = format!("tiny{k}");
        b.add(["main", name.as_str(), "deeper"], 10);
    }
    let f = b.finish();
    let p = prune_flame(&f, DEFAULT_FLAME_MIN_FRACTION);
    let label = |i: usize| p.names[p.name[i] as usize].as_str();
    assert_eq!(p.value[0], f.value[0]);
    assert_eq!(p.parent.len(), 4, "root, main, big, …other");
    let other = (0..4).find(|&i| label(i) == FLAME_OTHER).unwrap();
    assert_eq!(p.value[other], 50_000);
    assert_eq!(label(p.parent[other] as usize), "main");
    // Children never hold more than their parent.
    for i in 1..p.parent.len() {
        let kids: u64 = (1..p.parent.len())
            .filter(|&j| p.parent[j] as usize == i)
            .map(|j| p.value[j])
            .sum();
        assert!(kids <= p.value[i]);
    }
}

#[test]
fn segment_capping_keeps_the_largest_and_sums_the_rest() {
    let mut segments = Vec::new();
    let mut total = 0u64;
    for s in 0..1000u64 {
        let size = if s % 10 == 0 { 64 << 20 } else { 2 << 20 };
        // 2048 blocks alternating allocated / free, of 1 KiB .. 32 KiB each.
        let mut blocks = Vec::new();
        let mut off = 0u64;
        let mut k = 0u64;
        while off < size {
            let len = ((1 + (k * 7 + s) % 32) << 10).min(size - off);
            blocks.push(SegmentBlock {
                offset: off,
                size: len,
                requested: len,
                state: if k.is_multiple_of(2) {
                    BlockState::Allocated
                } else {
                    BlockState::Free
                },
                category: Category::Activation,
                site: Some((k % 3) as u32),
                count: 1,
            });
            off += len;
            k += 1;
        }
        total += size;
        segments.push(SegmentRow {
            address: (1000 - s) << 30,
            size,
            stream: 0,
            pool: "large".into(),
            blocks,
        });
    }
    let sites = (0..5)
        .map(|k| BlockSite {
            site: format!("model.py:{k}"),
            stack: vec!["frame".into(); 40],
        })
        .collect();
    let m = SegmentMap {
        when: "at the peak".into(),
        segments,
        sites,
        omitted: None,
    };
    let c = cap_segments(&m, 256, 512);
    assert_eq!(c.segments.len(), 256);
    assert!(c.segments.windows(2).all(|w| w[0].address < w[1].address));
    // The 100 big ones are all kept.
    assert_eq!(
        c.segments.iter().filter(|s| s.size == 64 << 20).count(),
        100
    );
    let o = c.omitted.expect("omitted");
    assert_eq!(o.count, 744);
    let kept: u64 = c.segments.iter().map(|s| s.size).sum();
    assert_eq!(kept + o.bytes, total);
    assert_eq!(
        o.allocated_bytes + o.pending_free_bytes + o.free_bytes,
        o.bytes
    );
    assert!(o.allocated_bytes > 0 && o.free_bytes > 0);
    for s in &c.segments {
        assert!(s.blocks.len() <= 2 * 512 + 1, "{} blocks", s.blocks.len());
        // Blocks still tile the segment.
        let mut off = 0;
        for b in &s.blocks {
            assert_eq!(b.offset, off);
            off += b.size;
        }
        assert_eq!(off, s.size);
    }
    // Only the used sites remain, with stacks cut short.
    assert_eq!(c.sites.len(), 3);
    assert!(c
        .sites
        .iter()
        .all(|s| s.stack.len() == MAX_BLOCK_STACK_FRAMES));
}

#[test]
fn a_huge_report_stays_under_ten_megabytes() {
    // The shape of a 1 GB snapshot: millions of events, deep stacks, thousands
    // of segments with many blocks each.
    let (t, _) = long_timeline(2_000_000);
    let mut fb = FlameBuilder::new("live at the peak");
    for k in 0..20_000u64 {
        let frames: Vec<String> = (0..40)
            .map(|d| {
                format!(
                    "/venv/lib/site-packages/pkg/mod{}.py:{} in fn{}",
                    (k >> (d % 12)) % 7,
                    d,
                    d
                )
            })
            .collect();
        fb.add(&frames, 4096 + (k % 1000) * 512);
    }
    let mut segments = Vec::new();
    for s in 0..3000u64 {
        let blocks = (0..400u64)
            .map(|k| SegmentBlock {
                offset: k * 50_000,
                size: 50_000,
                requested: 49_000,
                state: BlockState::from_code((k % 3) as u8),
                category: Category::from_code((k % 7) as u8),
                site: Some((k % 50) as u32),
                count: 1,
            })
            .collect();
        segments.push(SegmentRow {
            address: s << 32,
            size: 20_000_000,
            stream: 0,
            pool: "large".into(),
            blocks,
        });
    }
    let sites = (0..50)
        .map(|k| BlockSite {
            site: format!("/home/user/train/model.py:{k}"),
            stack: vec!["/home/user/train/model.py:1 in forward".into(); 30],
        })
        .collect();
    let data = ReportData {
        timeline: Some(t),
        flame: Some(fb.finish()),
        segments: Some(SegmentMap {
            segments,
            sites,
            ..SegmentMap::default()
        }),
        ..sample()
    }
    .bounded();
    let html = render_html(&data);
    assert!(html.len() < 10_000_000, "{} bytes", html.len());
    // For the browser test on the worst case: MEMLENS_HUGE_REPORT_OUT=FILE.html.
    if let Ok(p) = std::env::var("MEMLENS_HUGE_REPORT_OUT") {
        std::fs::write(p, &html).unwrap();
    }
    assert!(data.timeline.as_ref().unwrap().x.len() <= DEFAULT_MAX_POINTS + 2);
    assert!(data.segments.as_ref().unwrap().segments.len() <= DEFAULT_MAX_SEGMENTS);
}

#[test]
fn generated_time_is_rfc3339_utc() {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    assert_eq!(utc_rfc3339(t), "2023-11-14T22:13:20Z");
    assert_eq!(utc_rfc3339(std::time::UNIX_EPOCH), "1970-01-01T00:00:00Z");
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400); // leap day
    assert_eq!(utc_rfc3339(t), "2000-02-29T00:00:00Z");
}

fn load(name: &str) -> Snapshot {
    let p = fixture(name);
    Snapshot::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The innermost frame in the workload's own file, as `file:line`.
fn workload_site(snap: &Snapshot, stack: u32) -> Option<String> {
    snap.stack(stack)
        .iter()
        .find(|&&f| snap.str(snap.frame(f).filename).ends_with("workloads.py"))
        .map(|&f| snap.frame_location(f))
}

#[test]
fn segment_map_of_the_real_oom_snapshot_matches_memory_stats() {
    let snap = load("oom.at_oom.pickle.zst");
    let st = stats("oom");
    let at_oom = &st["stats_at_oom"];
    let m = segment_map(
        &snap,
        &snap.segments,
        "at the OOM",
        |s| workload_site(&snap, s),
        |_| Category::Activation,
    );
    let sum = |state: BlockState| -> u64 {
        m.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == state)
            .map(|b| b.size)
            .sum()
    };
    let reserved: u64 = m.segments.iter().map(|s| s.size).sum();
    assert_eq!(
        reserved,
        at_oom["reserved_bytes.all.current"].as_u64().unwrap()
    );
    assert_eq!(
        sum(BlockState::Allocated),
        at_oom["allocated_bytes.all.current"].as_u64().unwrap()
    );
    assert_eq!(
        sum(BlockState::Allocated) + sum(BlockState::PendingFree),
        at_oom["active_bytes.all.current"].as_u64().unwrap()
    );
    // Blocks tile their segments, in address order.
    for s in &m.segments {
        let mut off = 0;
        for b in &s.blocks {
            assert_eq!(b.offset, off, "segment {:#x}", s.address);
            off += b.size;
        }
        assert_eq!(off, s.size);
    }
    assert!(m.sites.iter().any(|s| s.site.ends_with("workloads.py:112")));
    // Through the page and back, bounded.
    let data = ReportData {
        segments: Some(cap_segments(
            &m,
            DEFAULT_MAX_SEGMENTS,
            DEFAULT_MAX_BLOCKS_PER_SEGMENT,
        )),
        meta: Meta {
            settings: settings_pairs(&snap.settings),
            ..Meta::now(vec!["oom.at_oom.pickle.zst".into()])
        },
        ..ReportData::default()
    };
    let html = render_html(&data);
    let back: ReportData = serde_json::from_value(embedded(&html)).unwrap();
    assert_eq!(back, data);
    assert!(back
        .meta
        .settings
        .iter()
        .any(|(k, v)| k == "expandable_segments" && v == "false"));
}

#[test]
fn flame_of_the_real_live_blocks_adds_up_to_allocated_bytes() {
    let snap = load("gpt2_train.pickle.zst");
    let st = stats("gpt2_train");
    let mut fb = FlameBuilder::new("live at dump time");
    for seg in &snap.segments {
        for b in seg
            .blocks
            .iter()
            .filter(|b| b.state == SnapState::ActiveAllocated)
        {
            fb.add_innermost_first(&stack_labels(&snap, b.stack), b.size);
        }
    }
    let f = fb.finish();
    let allocated = st["memory_stats"]["allocated_bytes.all.current"]
        .as_u64()
        .unwrap();
    assert_eq!(f.value[0], allocated);
    let top: u64 = (1..f.parent.len())
        .filter(|&i| f.parent[i] == 0)
        .map(|i| f.value[i])
        .sum();
    assert_eq!(top, allocated, "the root's children cover it");
    let p = prune_flame(&f, DEFAULT_FLAME_MIN_FRACTION);
    assert_eq!(p.value[0], allocated);
    assert!(p.parent.len() <= f.parent.len());
    assert!(p
        .names
        .iter()
        .any(|n| n.contains("/home/user/train/workloads.py:")));
}

/// The page's small integer codes and the JSON names round-trip for every
/// category (the report and the analyses share one `Category`).
#[test]
fn category_codes_and_names_round_trip() {
    for (i, c) in Category::ALL.into_iter().enumerate() {
        assert_eq!(c.code() as usize, i);
        assert_eq!(Category::from_code(c.code()), c);
        assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        let back: Category = serde_json::from_value(serde_json::json!(c.as_str())).unwrap();
        assert_eq!(back, c);
    }
    assert_eq!(Category::from_code(200), Category::Other);
}

/// The whole report of a real run, from `doctor`'s diagnosis.
#[test]
fn report_of_the_real_leaking_run_holds_every_figure_exactly() {
    use memlens::doctor::{diagnose, DoctorOptions};
    let names = [
        "gpt2_eval_leak.step1.pickle.zst",
        "gpt2_eval_leak.step5.pickle.zst",
        "gpt2_eval_leak.step11.pickle.zst",
    ];
    let snaps: Vec<(String, Snapshot)> = names.iter().map(|n| (n.to_string(), load(n))).collect();
    let refs: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d).bounded();

    // Timeline: the replayed peak, exactly, at the analysis' event.
    let t = data.timeline.as_ref().expect("timeline");
    let p = t.peak.expect("peak");
    assert_eq!(t.allocated[p], d.peak.peak_allocated_bytes);
    assert_eq!(Some(t.event[p] as usize), d.peak.peak_event_index);
    assert_eq!(t.reserved.iter().max(), Some(&d.peak.peak_reserved_bytes));
    assert!(t.x.len() <= DEFAULT_MAX_POINTS + t.ooms.len());
    assert!(t.sites.iter().any(|s| s.site.ends_with("workloads.py:55")));
    for i in 0..t.x.len() {
        let bands: u64 = t.bands.iter().map(|b| b[i]).sum();
        assert_eq!(bands + t.other[i], t.allocated[i]);
    }
    // Flame: what was allocated at the peak.
    let f = data.flame.as_ref().expect("flame");
    assert_eq!(f.value[0], d.peak.peak_allocated_bytes);
    assert!(f.names.iter().any(|n| n.contains("workloads.py:55 in ")));
    // Segments at the peak: reserved and allocated there.
    let m = data.segments.as_ref().expect("segments");
    let kept: u64 = m.segments.iter().map(|s| s.size).sum();
    let omitted = m.omitted.map_or(0, |o| o.bytes);
    assert_eq!(kept + omitted, t.reserved[p]);
    let allocated: u64 = m
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::Allocated)
        .map(|b| b.size)
        .sum::<u64>()
        + m.omitted.map_or(0, |o| o.allocated_bytes);
    assert_eq!(allocated, d.peak.peak_allocated_bytes);
    // Leaks across the three snapshots, the planted one first.
    let l = data.leaks.as_ref().expect("leaks");
    assert_eq!(l.points.len(), 3);
    assert!(l.sites[0].site.ends_with("workloads.py:55"));
    assert!(l.sites[0].bytes.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(data.findings.len(), d.findings.len());
    assert!(data
        .meta
        .stats
        .iter()
        .any(|s| s.bytes == Some(d.peak.peak_allocated_bytes)));

    let html = render_html(&data);
    let back: ReportData = serde_json::from_value(embedded(&html)).unwrap();
    assert_eq!(back, data);
}

#[test]
fn report_of_the_real_oom_shows_the_segments_at_the_oom() {
    use memlens::doctor::{diagnose, DoctorOptions};
    let snap = load("oom.pickle.zst");
    let refs = vec![("oom.pickle.zst".to_string(), &snap)];
    let d = diagnose(&refs, &DoctorOptions::default());
    let data = from_diagnosis(&refs, &d).bounded();
    let t = data.timeline.as_ref().expect("timeline");
    assert_eq!(t.ooms.len(), 1);
    let m = data.segments.as_ref().expect("segments");
    assert!(m.when.starts_with("at the OOM"), "{}", m.when);
    let reserved: u64 =
        m.segments.iter().map(|s| s.size).sum::<u64>() + m.omitted.map_or(0, |o| o.bytes);
    assert_eq!(reserved, t.reserved[t.ooms[0]]);
}
