//! `memlens export` through the binary (issue 31 item 4): an export that
//! fails (a bad input, no input) exits 2 with one line and leaves the tables
//! already in the folder as they were, with no temporary file behind.
#![cfg(feature = "export")]

use std::path::Path;

mod run;
use run::{fixture, memlens};

const TABLES: [&str; 4] = [
    "events.parquet",
    "blocks.parquet",
    "segments.parquet",
    "frames.parquet",
];

/// The bytes of every table in `dir`.
fn tables(dir: &Path) -> Vec<Vec<u8>> {
    TABLES
        .iter()
        .map(|t| std::fs::read(dir.join(t)).expect("table there"))
        .collect()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_failed_export_leaves_the_tables_as_they_were() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("tables");
    let out_s = out.to_string_lossy().into_owned();
    let good = fixture("cache_leak.pickle.zst");
    let o = memlens(&["export", &good, "-o", &out_s]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let before = tables(&out);
    assert!(before.iter().all(|t| t.len() > 100));
    let listed = names(&out);

    // A bad file after a good one.
    let bad = dir.path().join("bad.pickle");
    std::fs::write(&bad, b"\x80\x04not a pickle at all").expect("write");
    let bad_s = bad.to_string_lossy().into_owned();
    // An empty file, and a folder with no snapshot in it.
    let empty = dir.path().join("empty.pickle");
    std::fs::write(&empty, b"").expect("write");
    let empty_s = empty.to_string_lossy().into_owned();
    let none = dir.path().join("none");
    std::fs::create_dir(&none).expect("mkdir");
    let none_s = none.to_string_lossy().into_owned();
    for (args, names_it) in [
        (vec![good.as_str(), bad_s.as_str()], &bad_s),
        (vec![empty_s.as_str()], &empty_s),
        (vec![none_s.as_str()], &none_s),
    ] {
        let mut argv = vec!["export"];
        argv.extend(&args);
        argv.extend(["-o", &out_s]);
        let o = memlens(&argv);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{argv:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{argv:?}: {err}");
        assert!(err.contains(names_it.as_str()), "{argv:?}: {err}");
        assert_eq!(tables(&out), before, "{argv:?} changed the tables");
        assert_eq!(names(&out), listed, "{argv:?} left files behind");
    }
}
