//! Helpers shared by the `top` tests, which stand a child `sleep 60` in for
//! the training process and a publication file (as `memlens.record` writes
//! it) in for its allocator figures.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What `/proc/PID/cmdline` says of `pid`, arguments joined by spaces, as
/// memlens shows it. Normally `sleep 60`; but some CI sandboxes mount a
/// `/proc` of another PID namespace, where the entry of the child's PID is
/// another process (a kernel thread has no command line), and memlens must
/// show what `/proc` says, not what the test hopes.
pub fn proc_cmdline(pid: u32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let text = String::from_utf8_lossy(&bytes)
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    (!text.is_empty()).then_some(text)
}

/// Spawns the stand-in training process, `sleep 60`, and waits (at most five
/// seconds) until it has exec'd. Until then its /proc command line is empty
/// or the test binary's, and two runs of `top` on either side of the exec
/// label the process differently (a flake seen on a loaded CI machine).
/// Where `/proc` belongs to another PID namespace the wait runs out and the
/// test goes on with what `/proc` says.
pub fn spawn_sleep() -> Child {
    let child = Command::new("sleep").arg("60").spawn().unwrap();
    let started = Instant::now();
    while proc_cmdline(child.id()).as_deref() != Some("sleep 60")
        && started.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// Writes the publication of process `pid` into the runtime directory `rt`,
/// stamped now, with `fields` (the JSON members after `schema`, `pid` and
/// `time`). Call it before each run of `top`: publications older than ten
/// seconds are stale, and on a loaded CI machine two runs can be that far
/// apart. Written then renamed into place, as `memlens.record` does, so no
/// reader sees half a file.
pub fn publish(rt: &Path, pid: u32, fields: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let doc = format!(r#"{{"schema":"memlens/1","pid":{pid},"time":{now},{fields}}}"#);
    let tmp = rt.join(format!("{pid}-0.json.tmp"));
    std::fs::write(&tmp, doc).unwrap();
    std::fs::rename(&tmp, rt.join(format!("{pid}-0.json"))).unwrap();
}
