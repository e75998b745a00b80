//! Who a PID is: its command line and user from `/proc`, and whether the PID
//! NVML reports is really the GPU process here or a PID of another namespace.
//!
//! NVML reports PIDs of the host's PID namespace. Inside a container (without
//! `--pid=host`) those PIDs either do not exist in our `/proc` or, worse, name
//! some unrelated process of the container. We check the second case by looking
//! for an open `/dev/nvidia*` file among the process's descriptors: every CUDA
//! process holds `/dev/nvidiactl` and `/dev/nvidia<N>` open. When we may not
//! read its descriptors (another user's process, no root) we cannot tell, and
//! trust the PID.

use serde::Serialize;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Descriptors we look at before giving up on finding `/dev/nvidia*`; a process
/// with more open files than this is trusted rather than scanned forever.
const MAX_FDS_SCANNED: usize = 4096;

/// Whether a PID NVML reports is the GPU process as this `/proc` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Visibility {
    /// The PID exists here and is (or may be) the GPU process.
    Local,
    /// No such PID here: the process lives in another PID namespace.
    NotInNamespace,
    /// The PID exists here but names a process with no GPU device open: the
    /// GPU process is in another PID namespace and this PID is a stranger.
    OtherProcess,
}

impl Visibility {
    /// True when command line and user may be shown for this PID.
    pub fn is_local(self) -> bool {
        self == Visibility::Local
    }
}

/// What `/proc` tells about one PID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcDetails {
    /// Whether the PID is the GPU process here.
    pub visibility: Visibility,
    /// The owner's user name (or the numeric uid when `/etc/passwd` lacks it).
    pub user: Option<String>,
    /// The command line, arguments joined by spaces.
    pub cmdline: Option<String>,
}

/// One cached lookup, valid while the process's start time is unchanged (a
/// reused PID has a new start time).
#[derive(Debug, Clone)]
struct Entry {
    start_time: Option<u64>,
    details: ProcDetails,
}

/// Reads `/proc` and `/etc/passwd` (or stand-ins under other roots, for tests),
/// caching per PID so each tick costs one small read per process.
#[derive(Debug)]
pub struct ProcFs {
    root: PathBuf,
    passwd: PathBuf,
    users: Option<HashMap<u32, String>>,
    cache: HashMap<u32, Entry>,
    check_devices: bool,
}

impl ProcFs {
    /// The real `/proc` and `/etc/passwd`.
    pub fn system() -> Self {
        Self::with_roots("/proc", "/etc/passwd")
    }

    /// A `/proc` and a passwd file at other paths (tests build fake ones).
    pub fn with_roots(root: impl Into<PathBuf>, passwd: impl Into<PathBuf>) -> Self {
        ProcFs {
            root: root.into(),
            passwd: passwd.into(),
            users: None,
            cache: HashMap::new(),
            check_devices: true,
        }
    }

    /// Trusts every PID that exists here, without looking for an open GPU
    /// device (for a fake GPU source, whose processes hold none).
    pub fn without_device_check(mut self) -> Self {
        self.check_devices = false;
        self
    }

    /// True when `pid` exists in this PID namespace.
    pub fn alive(&self, pid: u32) -> bool {
        self.root.join(pid.to_string()).is_dir()
    }

    /// The uid this process runs as (the owner of `/proc/self`).
    pub fn own_uid(&self) -> Option<u32> {
        std::fs::metadata(self.root.join("self"))
            .ok()
            .map(|m| m.uid())
    }

    /// Command line, user and visibility of `pid`.
    pub fn lookup(&mut self, pid: u32) -> ProcDetails {
        let dir = self.root.join(pid.to_string());
        let meta = match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => m,
            _ => {
                self.cache.remove(&pid);
                return ProcDetails {
                    visibility: Visibility::NotInNamespace,
                    user: None,
                    cmdline: None,
                };
            }
        };
        let start_time = read_start_time(&dir);
        if let Some(e) = self.cache.get(&pid) {
            if e.start_time == start_time {
                return e.details.clone();
            }
        }
        let visibility = if self.check_devices && holds_gpu_device(&dir) == Some(false) {
            Visibility::OtherProcess
        } else {
            Visibility::Local
        };
        let details = ProcDetails {
            visibility,
            user: Some(self.user_name(meta.uid())),
            cmdline: read_cmdline(&dir),
        };
        self.cache.insert(
            pid,
            Entry {
                start_time,
                details: details.clone(),
            },
        );
        details
    }

    /// Forgets cached PIDs not in `keep`, so the cache stays as small as the
    /// set of GPU processes.
    pub fn retain(&mut self, keep: &dyn Fn(u32) -> bool) {
        self.cache.retain(|pid, _| keep(*pid));
    }

    fn user_name(&mut self, uid: u32) -> String {
        let passwd = &self.passwd;
        let users = self.users.get_or_insert_with(|| {
            std::fs::read_to_string(passwd)
                .map(|t| parse_passwd(&t))
                .unwrap_or_default()
        });
        users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }
}

/// Parses `/etc/passwd` lines (`name:x:uid:gid:...`) into uid -> name; the
/// first name of a uid wins, as `getpwuid` does. Malformed lines are skipped.
pub fn parse_passwd(text: &str) -> HashMap<u32, String> {
    let mut users = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(uid)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if let (false, Ok(uid)) = (name.is_empty(), uid.trim().parse::<u32>()) {
            users.entry(uid).or_insert_with(|| name.to_string());
        }
    }
    users
}

/// The command line from `cmdline` (NUL-separated arguments), or None for a
/// kernel thread, a zombie or an unreadable file.
fn read_cmdline(dir: &Path) -> Option<String> {
    let bytes = std::fs::read(dir.join("cmdline")).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let joined = text
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let clean = one_line(&joined);
    (!clean.is_empty()).then_some(clean)
}

/// A command line on one line: control characters (an argument of
/// `python -c` holds newlines) become spaces, and the ends are trimmed, so a
/// table row or a CSV line stays one line.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// The process's start time (field 22 of `stat`), which tells a reused PID
/// from the process we cached.
fn read_start_time(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: skip past
    // the last ')'. Field 3 (state) is then the first, field 22 the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Some(true) when the process has a `/dev/nvidia*` file open, Some(false)
/// when its descriptors were read and none is, None when they cannot be read.
fn holds_gpu_device(dir: &Path) -> Option<bool> {
    let entries = std::fs::read_dir(dir.join("fd")).ok()?;
    for entry in entries.take(MAX_FDS_SCANNED) {
        let Ok(entry) = entry else { continue };
        if let Ok(target) = std::fs::read_link(entry.path()) {
            if target.to_string_lossy().starts_with("/dev/nvidia") {
                return Some(true);
            }
        }
    }
    Some(false)
}

#[cfg(test)]
pub(crate) mod testing {
    //! A fake `/proc` for tests of this module and the sampler.
    use std::path::{Path, PathBuf};

    /// A unique scratch directory under the system temp dir.
    pub fn scratch(name: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "memlens-live-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Adds a process to the fake `/proc` at `root`; `gpu` decides whether it
    /// holds `/dev/nvidia0` open.
    pub fn add_proc(root: &Path, pid: u32, args: &[&str], gpu: bool) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        let mut cmdline = args.join("\0");
        cmdline.push('\0');
        std::fs::write(dir.join("cmdline"), cmdline).unwrap();
        let stat = format!(
            "{pid} (py thon) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 0 0",
            1000 + pid
        );
        std::fs::write(dir.join("stat"), stat).unwrap();
        let target = if gpu { "/dev/nvidia0" } else { "/dev/null" };
        std::os::unix::fs::symlink(target, dir.join("fd").join("3")).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn passwd_parsing_skips_garbage() {
        let users = parse_passwd("root:x:0:0::/root:/bin/sh\n# c\nbad\nalice:x:1000:1000::/h:/bin/sh\nalias:x:1000:1::/:/\n:x:5:5\nbob:x:notanumber:1\n");
        assert_eq!(users.get(&0).map(String::as_str), Some("root"));
        assert_eq!(users.get(&1000).map(String::as_str), Some("alice"));
        assert_eq!(users.len(), 2);
    }

    #[test]
    fn lookup_reads_cmdline_user_and_visibility() {
        let root = scratch("procfs");
        add_proc(&root, 42, &["python", "train.py", "--lr", "3e-4"], true);
        add_proc(&root, 43, &["bash"], false);
        let uid = std::fs::metadata(&root).unwrap().uid();
        let passwd = root.join("passwd");
        std::fs::write(&passwd, format!("trainer:x:{uid}:{uid}::/:/bin/sh\n")).unwrap();
        let mut fs = ProcFs::with_roots(&root, &passwd);

        let d = fs.lookup(42);
        assert_eq!(d.visibility, Visibility::Local);
        assert_eq!(d.cmdline.as_deref(), Some("python train.py --lr 3e-4"));
        assert_eq!(d.user.as_deref(), Some("trainer"));
        assert!(fs.alive(42));

        // A PID that exists but holds no GPU device is a stranger.
        assert_eq!(fs.lookup(43).visibility, Visibility::OtherProcess);
        let mut trusting = ProcFs::with_roots(&root, &passwd).without_device_check();
        assert_eq!(trusting.lookup(43).visibility, Visibility::Local);
        // A PID that does not exist is in another namespace.
        assert_eq!(fs.lookup(44).visibility, Visibility::NotInNamespace);
        assert!(!fs.alive(44));

        // Cached until the start time changes (PID reuse).
        std::fs::write(root.join("42/cmdline"), "other\0").unwrap();
        assert_eq!(
            fs.lookup(42).cmdline.as_deref(),
            Some("python train.py --lr 3e-4")
        );
        std::fs::write(
            root.join("42/stat"),
            "42 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0",
        )
        .unwrap();
        assert_eq!(fs.lookup(42).cmdline.as_deref(), Some("other"));
        fs.retain(&|p| p == 42);
        assert_eq!(fs.cache.len(), 1);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn command_lines_are_one_line() {
        assert_eq!(
            one_line("python -c \nimport x\n\tprint(1)\n"),
            "python -c  import x  print(1)"
        );
        let root = scratch("procfs-oneline");
        add_proc(&root, 9, &["python", "-c", "import os\nos.getpid()"], true);
        let mut fs = ProcFs::with_roots(&root, root.join("passwd"));
        assert_eq!(
            fs.lookup(9).cmdline.as_deref(),
            Some("python -c import os os.getpid()")
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn unknown_uid_shows_as_number() {
        let root = scratch("procfs-nouser");
        add_proc(&root, 7, &["x"], true);
        let mut fs = ProcFs::with_roots(&root, root.join("missing-passwd"));
        let uid = std::fs::metadata(&root).unwrap().uid();
        assert_eq!(fs.lookup(7).user, Some(uid.to_string()));
        std::fs::remove_dir_all(root).unwrap();
    }
}
