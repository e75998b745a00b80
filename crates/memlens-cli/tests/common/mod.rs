//! Helpers shared by the `top` tests, which stand a child `sleep 60` in for
//! the training process.

use std::time::{Duration, Instant};

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

/// Waits (at most five seconds) until the spawned child has exec'd `sleep 60`.
/// Until then its /proc command line is empty or the test binary's, and two
/// runs of `top` on either side of the exec label the process differently
/// (a flake seen on a loaded CI machine). Where `/proc` belongs to another PID
/// namespace the wait runs out and the test goes on with what `/proc` says.
pub fn wait_for_sleep(pid: u32) {
    let started = Instant::now();
    while proc_cmdline(pid).as_deref() != Some("sleep 60")
        && started.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
}
