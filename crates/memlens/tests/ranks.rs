//! Ranks of one job (tests/corpus/ranks, a 2-rank DDP job recorded on one
//! H100 by tests/gpu/ranks.sh): grouping, each rank's exact peak against the
//! ranks' own `torch.cuda.max_memory_*`, and the planted rank-0 EMA copy found
//! as an imbalance at its line, whatever the file order.

mod common;

use memlens::analysis::inputs::{group, GroupKind};
use memlens::analysis::ranks::compare;
use memlens::Snapshot;
use std::path::PathBuf;

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/ranks")
        .join(name)
}

fn truth(job: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(corpus(&format!("{job}.truth.json"))).expect("truth");
    serde_json::from_str(&text).expect("truth json")
}

fn load(job: &str, rank: u32) -> (String, Snapshot) {
    let p = corpus(&format!("{job}.rank{rank}.pickle.zst"));
    let s = Snapshot::load(&p).expect("rank snapshot loads");
    (p.display().to_string(), s)
}

fn num(v: &serde_json::Value) -> u64 {
    v.as_u64().expect("a number")
}

#[test]
fn each_ranks_peak_is_exact_and_the_planted_copy_is_found_in_either_order() {
    let t = truth("ddp_ema");
    let a = load("ddp_ema", 0);
    let b = load("ddp_ema", 1);
    for order in [[&a, &b], [&b, &a]] {
        let snaps: Vec<(String, &Snapshot)> = order.iter().map(|(n, s)| (n.clone(), s)).collect();
        let g = group(&snaps, false);
        assert_eq!(g.groups.len(), 1, "{}", g.reason);
        assert_eq!(g.groups[0].kind, GroupKind::Ranks);
        let ranks: Vec<(u32, String, &Snapshot)> = g.groups[0]
            .members
            .iter()
            .map(|m| {
                let f = *m.files.last().expect("a file");
                (m.rank.expect("a rank"), snaps[f].0.clone(), snaps[f].1)
            })
            .collect();
        let r = compare(&ranks, Some(num(&t["ranks"][0]["device_total_memory"])));
        for (row, tr) in r.ranks.iter().zip(t["ranks"].as_array().expect("ranks")) {
            assert_eq!(row.rank as u64, num(&tr["rank"]));
            assert_eq!(row.peak_allocated_bytes, num(&tr["max_memory_allocated"]));
            assert_eq!(row.peak_reserved_bytes, num(&tr["max_memory_reserved"]));
        }
        assert_eq!(r.closest_to_oom, Some(0));
        let im = r.imbalance.expect("an imbalance");
        assert_eq!(im.rank, 0);
        let planted = num(&t["planted"]["bytes"]) as f64;
        let site = &im.sites[0];
        assert_eq!(site.site, t["planted"]["line"].as_str().expect("line"));
        assert!(
            (site.excess_bytes as f64 - planted).abs() <= 0.05 * planted,
            "{} vs planted {planted}",
            site.excess_bytes
        );
        assert!(im.suggestion.contains("EMA"), "{}", im.suggestion);
        // The sites listed first explain at least 90% of the gap, and no
        // fewer would.
        assert!(im.explaining_sites >= 1 && im.explaining_sites <= im.sites.len());
        assert!(im.explained_bytes as f64 >= 0.9 * im.excess_bytes as f64);
        let fewer: u64 = im.sites[..im.explaining_sites - 1]
            .iter()
            .map(|s| s.excess_bytes)
            .sum();
        assert!((fewer as f64) < 0.9 * im.excess_bytes as f64);
        let by_category: u64 = im.by_category.iter().map(|c| c.1).sum();
        let by_site: u64 = im.sites.iter().map(|s| s.excess_bytes).sum();
        assert_eq!(by_category, by_site, "categories split the sites' excess");
    }
}

#[test]
fn ranks_are_told_by_overlapping_times_when_names_do_not_say() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut snaps = Vec::new();
    for (rank, name) in [(1, "b.pickle.zst"), (0, "a.pickle.zst")] {
        let p = dir.path().join(name);
        std::fs::copy(corpus(&format!("ddp_ema.rank{rank}.pickle.zst")), &p).expect("copy");
        snaps.push((p.display().to_string(), Snapshot::load(&p).expect("loads")));
    }
    let named: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let g = group(&named, false);
    assert_eq!(g.groups.len(), 1);
    assert_eq!(g.groups[0].kind, GroupKind::Ranks);
    assert!(g.reason.contains("overlapping in time"), "{}", g.reason);
    // Ranks are numbered by start time: rank 0 started first.
    let t = truth("ddp_ema");
    let r0_started_first =
        t["ranks"][0]["time_range_s"][0].as_f64() < t["ranks"][1]["time_range_s"][0].as_f64();
    let first = &g.groups[0].members[0];
    assert_eq!(first.rank, Some(0));
    assert_eq!(
        named[first.files[0]].0.ends_with("a.pickle.zst"),
        r0_started_first
    );
}

#[test]
fn a_balanced_job_has_no_imbalance() {
    let t = truth("ddp_balanced");
    let a = load("ddp_balanced", 0);
    let b = load("ddp_balanced", 1);
    let ranks = vec![(0, a.0.clone(), &a.1), (1, b.0.clone(), &b.1)];
    let r = compare(&ranks, None);
    assert!(r.imbalance.is_none(), "{:?}", r.imbalance);
    for (row, tr) in r.ranks.iter().zip(t["ranks"].as_array().expect("ranks")) {
        assert_eq!(row.peak_allocated_bytes, num(&tr["max_memory_allocated"]));
        assert_eq!(row.headroom_bytes, None);
    }
    // The heavier reserved peak is the closest to an OOM (ties: the lower rank).
    let max_r = t["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| num(&r["max_memory_reserved"]))
        .max();
    let closest = r.closest_to_oom.expect("a rank");
    assert_eq!(Some(r.ranks[closest as usize].peak_reserved_bytes), max_r);
}

#[test]
fn unrelated_runs_are_split_and_periodic_snapshots_kept_together() {
    let names = [
        "resnet.pickle.zst",
        "varlen.pickle.zst",
        "gpt2_eval_leak.pickle.zst",
    ];
    let snaps: Vec<(String, Snapshot)> = names
        .iter()
        .map(|n| {
            (
                n.to_string(),
                Snapshot::load(&common::fixture(n)).expect("fixture"),
            )
        })
        .collect();
    let named: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let g = group(&named, false);
    assert_eq!(g.groups.len(), 3, "{}", g.reason);
    assert!(g.groups.iter().all(|g| g.kind == GroupKind::Single));
    assert!(g.reason.contains("unrelated"), "{}", g.reason);

    // The leak run's periodic snapshots, shuffled: one series, oldest first.
    let names = [
        "gpt2_eval_leak.step11.pickle.zst",
        "gpt2_eval_leak.step1.pickle.zst",
        "gpt2_eval_leak.pickle.zst",
        "gpt2_eval_leak.step5.pickle.zst",
    ];
    let snaps: Vec<(String, Snapshot)> = names
        .iter()
        .map(|n| {
            (
                n.to_string(),
                Snapshot::load(&common::fixture(n)).expect("fixture"),
            )
        })
        .collect();
    let named: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let g = group(&named, false);
    assert_eq!(g.groups.len(), 1, "{}", g.reason);
    assert_eq!(g.groups[0].kind, GroupKind::Series);
    let order: Vec<&str> = g.groups[0].files().iter().map(|&i| names[i]).collect();
    assert_eq!(
        order,
        [names[1], names[3], names[0], names[2]],
        "step1, step5, step11, then the final dump"
    );
}

#[test]
fn the_report_shows_both_ranks_side_by_side() {
    let t = truth("ddp_ema");
    let b = load("ddp_ema", 1);
    let a = load("ddp_ema", 0);
    let snaps: Vec<(String, &Snapshot)> = vec![(b.0.clone(), &b.1), (a.0.clone(), &a.1)];
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ranks.html");
    let doc = memlens::render::documents::doctor_doc(&snaps, &Default::default(), Some(&path))
        .expect("doctor");
    assert_eq!(doc.findings[0].kind, "imbalance");
    let html = std::fs::read_to_string(&path).expect("report");
    let start = html.find("id=\"memlens-data\">").expect("data") + "id=\"memlens-data\">".len();
    let end = start + html[start..].find("</script>").expect("end");
    let data: serde_json::Value = serde_json::from_str(&html[start..end]).expect("json");
    let ranks = data["ranks"]["ranks"]
        .as_array()
        .expect("ranks in the report");
    assert_eq!(ranks.len(), 2);
    for (row, tr) in ranks.iter().zip(t["ranks"].as_array().expect("ranks")) {
        assert_eq!(row["peak_allocated_bytes"], tr["max_memory_allocated"]);
    }
    assert_eq!(data["ranks"]["imbalance_rank"], 0);
    assert_eq!(data["ranks"]["imbalance_site"], t["planted"]["line"]);
    let series = data["ranks"]["series"].as_array().expect("series");
    assert_eq!(series.len(), 2, "one timeline per rank");
    for (s, tr) in series.iter().zip(t["ranks"].as_array().expect("ranks")) {
        // Bucket maxima keep each rank's exact peak.
        let max = s["allocated"]
            .as_array()
            .expect("points")
            .iter()
            .filter_map(|v| v.as_u64())
            .max();
        assert_eq!(max, tr["max_memory_allocated"].as_u64());
    }
    // The one-snapshot sections say which file they show: rank 0's.
    assert_eq!(data["shown_file"].as_str(), Some(a.0.as_str()));
    assert!(html.contains("renderRanks"));
    // Issue 33: the ranks are no run over time (no "every snapshot" table
    // with growth from rank 1 to rank 0), and the title names the job.
    assert!(data["overview"].is_null(), "{}", data["overview"]);
    assert_eq!(
        data["meta"]["title"],
        "memlens report: ddp_ema.rank*.pickle.zst, 2 ranks"
    );
}
