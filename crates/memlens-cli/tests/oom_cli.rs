//! `memlens oom` from a message: exit codes of the message-only path.

fn run(args: &[&str]) -> u8 {
    memlens_cli::run(std::iter::once("memlens").chain(args.iter().copied()))
}

const MESSAGE: &str = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total \
    capacity of 8.00 GiB of which 0 bytes is free. Of the allocated memory 7.51 GiB is allocated \
    by PyTorch, and 15.90 MiB is reserved by PyTorch but unallocated.";

#[test]
fn message_text_and_file() {
    assert_eq!(run(&["oom", "--message", MESSAGE]), 0);
    assert_eq!(run(&["oom", "--message", MESSAGE, "--json"]), 0);
    let dir = std::env::temp_dir().join(format!("memlens-oom-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("train.log");
    std::fs::write(
        &file,
        format!("step 7\nTraceback ...\nRuntimeError: {MESSAGE}\n"),
    )
    .unwrap();
    assert_eq!(run(&["oom", "--message-file", file.to_str().unwrap()]), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_exits_2() {
    assert_eq!(run(&["oom", "--message", "all good"]), 2);
    assert_eq!(run(&["oom", "--message-file", "/nonexistent/train.log"]), 2);
    // Snapshot analysis is not built yet: a clear error, not a panic.
    assert_eq!(run(&["oom", "snapshot.pickle"]), 2);
    assert_eq!(run(&["oom", "snapshot.pickle", "--message", MESSAGE]), 2);
    assert_eq!(
        run(&["oom", "--message", MESSAGE, "--message-file", "x"]),
        2
    );
    // The run's optimizer applies to a snapshot's model only; a name it
    // does not know is refused.
    assert_eq!(run(&["oom", "--message", MESSAGE, "--optimizer", "sgd"]), 2);
    assert_eq!(run(&["oom", "snapshot.pickle", "--optimizer", "lion"]), 2);
}
