//! `memlens::session` (what `memlens mcp` serves): one read per snapshot,
//! answers equal to the commands' documents, paths confined to the roots.

mod common;

use memlens::session::{Question, Session, Window};
use serde_json::Value;

fn whole() -> Window {
    Window {
        limit: 1000,
        full: true,
        ..Window::default()
    }
}

fn without_answer(mut v: Value) -> Value {
    v.as_object_mut().map(|o| o.remove("answer"));
    v
}

#[test]
fn questions_of_one_snapshot_read_it_once_and_match_the_commands() {
    let dir = common::fixtures_dir();
    let session = Session::new(std::slice::from_ref(&dir)).unwrap();
    let name = "gpt2_train.pickle.zst";
    let path = common::fixture(name).display().to_string();
    let peak = session
        .answer(
            &Question::Peak {
                snapshot: path.clone(),
                by_module: false,
            },
            &whole(),
        )
        .unwrap();
    // The same document `memlens peak --json` prints.
    let snap = memlens::Snapshot::load(&common::fixture(name)).unwrap();
    let expected = memlens::render::json_value(&memlens::analysis::peak::peak(&snap, usize::MAX));
    assert_eq!(without_answer(peak.clone()), expected.unwrap());
    assert_eq!(
        peak["peak_allocated_bytes"].as_u64(),
        Some(common::stat("gpt2_train", "allocated_bytes.all.peak"))
    );
    // A relative path is under the first root; the state at the peak is the peak.
    let at = peak["peak_event_index"].as_u64().unwrap() as usize;
    let state = session
        .answer(
            &Question::State {
                snapshot: name.into(),
                event: at,
                device: None,
            },
            &Window::default(),
        )
        .unwrap();
    assert_eq!(state["allocated_bytes"], peak["peak_allocated_bytes"]);
    for _ in 0..5 {
        session
            .answer(
                &Question::Summary {
                    snapshot: path.clone(),
                },
                &Window::default(),
            )
            .unwrap();
    }
    assert_eq!(session.reads(), 1);
    assert_eq!(state["answer"]["snapshot_reads"], 1);
}

#[test]
fn a_path_outside_the_roots_is_refused_and_a_changed_file_read_again() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let inside = root.path().join("run.pickle.zst");
    std::fs::copy(common::fixture("resnet.pickle.zst"), &inside).unwrap();
    let outside = elsewhere.path().join("run.pickle.zst");
    std::fs::copy(common::fixture("resnet.pickle.zst"), &outside).unwrap();
    // A link inside the root to a file outside it is outside.
    let link = root.path().join("link.pickle.zst");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let session = Session::new(&[root.path().to_path_buf()]).unwrap();
    let ask = |p: &std::path::Path| {
        session.answer(
            &Question::Summary {
                snapshot: p.display().to_string(),
            },
            &Window::default(),
        )
    };
    for p in [&outside, &link, &root.path().join("../x.pickle")] {
        let e = ask(p).unwrap_err().to_string();
        assert!(
            e.contains("outside the folders") || e.contains("No such file"),
            "{e}"
        );
    }
    ask(&inside).unwrap();
    ask(&inside).unwrap();
    assert_eq!(session.reads(), 1);
    std::fs::copy(common::fixture("cache_leak.pickle.zst"), &inside).unwrap();
    let changed = ask(&inside).unwrap();
    assert_eq!(session.reads(), 2, "a changed file is read again");
    assert_eq!(
        changed["reserved_bytes"].as_u64(),
        Some(common::stat("cache_leak", "reserved_bytes.all.current"))
    );
}

#[test]
fn a_fake_trace_is_answered_by_fit_and_refused_by_the_rest() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/fit/fake")
        .canonicalize()
        .unwrap();
    let session = Session::new(std::slice::from_ref(&dir)).unwrap();
    let name = "gpt.fp32.pickle.zst";
    let fit = session
        .answer(
            &Question::Fit {
                probes: vec![name.into()],
                recorded_batch: Vec::new(),
                checkpoint: None,
                batch: None,
                limit: Some(2 << 30),
                config: None,
            },
            &whole(),
        )
        .unwrap();
    assert_eq!(fit["predicted"]["fits"], serde_json::json!(true));
    assert_eq!(fit["basis"]["source"], "fake tensors");
    let err = session
        .answer(
            &Question::Summary {
                snapshot: name.into(),
            },
            &whole(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("traced with fake tensors"), "{err}");
}
