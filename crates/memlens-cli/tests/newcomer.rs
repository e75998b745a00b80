//! What a newcomer runs into (issue 31 item 9): the exit codes in `--help`,
//! `doctor`'s verdict when its report cannot be written, and `report` not
//! replacing a file of the user's.

use std::path::Path;

mod run;
use run::{fixture, memlens_in};

#[test]
fn help_gives_the_exit_codes() {
    let o = memlens_in(Path::new("."), &["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("Exit codes:"), "{text}");
    for code in ["0  success", "1  a check failed", "2  bad input or usage"] {
        assert!(text.contains(code), "{text}");
    }
}

/// The report's folder cannot be made (it would be under a regular file:
/// this fails for root too, who ignores permissions): the verdict is printed
/// all the same, then one line says the report was not written and how to
/// choose, and the exit code is 2.
#[test]
fn doctor_prints_its_verdict_when_the_report_cannot_be_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a folder").expect("write");
    let report = file.join("report.html");
    let report_s = report.to_string_lossy().into_owned();
    let snap = fixture("gpt2_eval_leak.pickle.zst");
    let o = memlens_in(dir.path(), &["doctor", &snap, "-o", &report_s]);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    let verdict = memlens_in(dir.path(), &["doctor", &snap, "--no-report"]);
    assert_eq!(verdict.status.code(), Some(0));
    assert_eq!(
        o.stdout, verdict.stdout,
        "the same verdict, without 'Report:'"
    );
    assert!(!out.trim().is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    for needle in [
        "the report was not written",
        report_s.as_str(),
        "-o FILE",
        "--no-report",
    ] {
        assert!(err.contains(needle), "{err}");
    }
}

/// `memlens report` writes memlens-report.html in the working directory by
/// default: never over a file memlens did not write, unless `-o` names it.
#[test]
fn report_does_not_replace_a_file_of_the_users() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mine = dir.path().join("memlens-report.html");
    std::fs::write(&mine, "my notes").expect("write");
    let snap = fixture("cache_leak.pickle.zst");
    let o = memlens_in(dir.path(), &["report", &snap]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("memlens-report.html") && err.contains("-o"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&mine).expect("read"), "my notes");

    // Named with -o, it is replaced; then, being memlens's, it is replaced
    // without -o too.
    let o = memlens_in(dir.path(), &["report", &snap, "-o", "memlens-report.html"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let first = std::fs::read_to_string(&mine).expect("read");
    assert!(first.contains("<html"), "a report");
    let o = memlens_in(dir.path(), &["report", &snap]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}
