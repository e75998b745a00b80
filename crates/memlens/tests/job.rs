//! A job read rank by rank (`memlens::job`, what `doctor` does for jobs too
//! large to read at once) gives the diagnosis and the report's ranks section
//! of the all-at-once path, on the recorded DDP jobs (tests/corpus/ranks) and
//! on a four-rank job made of their files, read two ranks at a time.

use memlens::analysis::peak::AnalysedSet;
use memlens::doctor::{diagnose_inputs_in, DoctorOptions};
use memlens::job::{diagnose_job, ranks_by_name, workers_for, RankFiles};
use memlens::report::from_diagnosis;
use memlens::Snapshot;
use std::path::PathBuf;

fn corpus(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/ranks")
        .join(name)
}

/// The all-at-once diagnosis and report ranks section, as JSON, beside the
/// rank-by-rank one.
fn both_ways(files: &[PathBuf], workers: usize) -> [(serde_json::Value, serde_json::Value); 2] {
    let snaps: Vec<(String, Snapshot)> = files
        .iter()
        .map(|f| (f.display().to_string(), Snapshot::load(f).expect("loads")))
        .collect();
    let named: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let opts = DoctorOptions::default();
    let set = AnalysedSet::new(&named);
    let mut together = diagnose_inputs_in(&set, &named, &opts);
    let sources = memlens::source::SourceFinder::with_env(Vec::new());
    let run = memlens::source::RunEvidence::of(&named);
    together.leaks.annotate(&sources, &run);
    for p in &mut together.parts {
        p.diagnosis.leaks.annotate(&sources, &run);
    }
    let view = from_diagnosis(&named, &together)
        .ranks
        .expect("a ranks view");

    let ranks = ranks_by_name(files).expect("ranks in the names");
    let job = diagnose_job(&ranks, &opts, workers, || {}).expect("the job is read");
    [
        (json(&together), json(&job.diagnosis)),
        (json(&view), json(&job.ranks_view)),
    ]
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).expect("serializes")
}

#[test]
fn rank_by_rank_equals_all_at_once_on_recorded_jobs() {
    for job in ["ddp_ema", "ddp_balanced"] {
        let files: Vec<PathBuf> = (0..2)
            .map(|r| corpus(&format!("{job}.rank{r}.pickle.zst")))
            .collect();
        let [(a, b), (va, vb)] = both_ways(&files, 2);
        assert_eq!(a, b, "{job}: the diagnosis differs");
        assert_eq!(va, vb, "{job}: the report's ranks section differs");
        if job == "ddp_ema" {
            assert_eq!(
                b["ranks"]["imbalance"]["rank"], 0,
                "the planted rank-0 copy"
            );
        }
    }
}

#[test]
fn four_ranks_read_two_at_a_time_match_and_keep_rank_order() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    // Ranks 0 and 2 carry the planted EMA copy, 1 and 3 do not.
    let files: Vec<PathBuf> = (0..4)
        .map(|r| {
            let src = corpus(&format!("ddp_ema.rank{}.pickle.zst", r % 2));
            let dst = dir.path().join(format!("job.rank{r}.pickle.zst"));
            std::fs::copy(src, &dst).expect("copied");
            dst
        })
        .collect();
    // Given in reverse: the ranks come back in rank order all the same.
    let reversed: Vec<PathBuf> = files.iter().rev().cloned().collect();
    let [(a, b), (va, vb)] = both_ways(&reversed, 2);
    assert_eq!(a, b, "the diagnosis differs");
    assert_eq!(va, vb, "the report's ranks section differs");
    let ranks: Vec<u64> = b["ranks"]["ranks"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["rank"].as_u64().expect("a rank"))
        .collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
    assert_eq!(b["parts"].as_array().map(Vec::len), Some(4));
}

#[test]
fn ranks_given_as_periodic_snapshots_match_and_take_their_highest_peak() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let corpus_file = |name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus")
            .join(name)
    };
    // Two ranks, each a series of periodic snapshots (memlens.record(every=2)):
    // rank 0 the clean run, rank 1 the planted leak.
    let mut files = Vec::new();
    for (rank, run) in [(0, "clean"), (1, "leak_losses")] {
        for step in ["step2.", "step4.", ""] {
            let dst = dir.path().join(format!("job.rank{rank}.{step}pickle.zst"));
            std::fs::copy(corpus_file(&format!("{run}.{step}pickle.zst")), &dst).expect("copied");
            files.push(dst);
        }
    }
    let [(a, b), (va, vb)] = both_ways(&files, 2);
    assert_eq!(a, b, "the diagnosis differs");
    assert_eq!(va, vb, "the report's ranks section differs");
    // Each rank's row is its highest peak over its snapshots.
    for (rank, row) in b["ranks"]["ranks"]
        .as_array()
        .expect("rows")
        .iter()
        .enumerate()
    {
        let peaks: Vec<u64> = b["parts"][rank]["files"]
            .as_array()
            .expect("files")
            .iter()
            .map(|f| {
                let s = Snapshot::load(std::path::Path::new(f.as_str().expect("a path")))
                    .expect("loads");
                memlens::analysis::peak::peak(&s, 1).peak_allocated_bytes
            })
            .collect();
        assert_eq!(peaks.len(), 3, "the rank's three snapshots, together");
        // ... and the run's max_memory_allocated(), from the GPU.
        let run = ["clean", "leak_losses"][rank];
        let truth: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(corpus_file(&format!("{run}.truth.json"))).expect("truth"),
        )
        .expect("truth json");
        assert_eq!(
            row["peak_allocated_bytes"].as_u64(),
            truth["memory_stats"]["allocated_bytes.all.peak"].as_u64(),
            "rank {rank}: the GPU's peak"
        );
        assert_eq!(
            row["peak_allocated_bytes"].as_u64(),
            peaks.iter().max().copied(),
            "rank {rank}"
        );
    }
}

#[test]
fn only_files_that_all_name_ranks_are_a_job() {
    let p = |s: &str| PathBuf::from(s);
    assert_eq!(ranks_by_name(&[p("a.rank0.pickle"), p("b.pickle")]), None);
    assert_eq!(
        ranks_by_name(&[p("a.rank0.pickle"), p("a.rank0.step2.pickle")]),
        None
    );
    let job = ranks_by_name(&[
        p("run/r.rank1.step2.pickle"),
        p("run/r.rank0.pickle"),
        p("run/r.rank1.step1.pickle"),
    ])
    .expect("two ranks");
    assert_eq!(job.len(), 2);
    assert_eq!(job[0].rank, 0);
    assert_eq!(
        job[1].files.len(),
        2,
        "a rank's periodic snapshots stay together"
    );
}

#[test]
fn workers_are_bounded_by_cores_memory_and_ranks() {
    let file = corpus("ddp_ema.rank0.pickle.zst");
    let bytes = std::fs::metadata(&file).expect("exists").len();
    let ranks: Vec<RankFiles> = (0..8)
        .map(|rank| RankFiles {
            rank,
            files: vec![file.clone()],
        })
        .collect();
    // Compressed: about ten times its size in memory.
    let held = bytes * 10;
    assert_eq!(workers_for(&ranks, 16, held * 3), 3, "memory");
    assert_eq!(workers_for(&ranks, 4, held * 100), 2, "two cores a rank");
    assert_eq!(workers_for(&ranks[..1], 16, held * 100), 1, "one rank");
    assert_eq!(workers_for(&ranks, 16, 1), 1, "at least one");
}
