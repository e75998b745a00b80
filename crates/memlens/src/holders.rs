//! What keeps a leak alive, as the process itself saw it.
//!
//! A trace says which line allocated the memory that grows; it cannot say
//! what still refers to it. The Python package can: when its leak alarm
//! fires, `memlens.record` searches the live objects (`memlens.why`) for what
//! holds each growing site's tensors (a module attribute, a global, a
//! running frame's local, a closure, a hook, an autograd graph) and writes
//! the answer beside the snapshot, in `<snapshot>.holders.json`:
//!
//! ```json
//! {"format": "memlens-holders/1", "step": 40,
//!  "sites": {"/home/u/train.py:55": [
//!    {"kind": "module", "path": "model.cache", "tensors": 1024, "bytes": 2147483648,
//!     "where": "", "root": "train() local 'model' (train.py:12)", "via": ["list"]}]}}
//! ```
//!
//! [`HoldersBySite::beside`] reads those files back, so `leaks`, `doctor`
//! and the report name the holder instead of guessing it from the source.
//! The file is evidence beside the snapshot, not part of it: a missing one
//! is normal (the alarm did not fire, or the snapshot came from elsewhere), a
//! bad one costs a warning, never the analysis.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What the holders file beside a snapshot is called: the snapshot's own
/// name with this appended.
pub const SIDECAR_SUFFIX: &str = ".holders.json";

/// The `format` of a holders file this version reads.
pub const FORMAT: &str = "memlens-holders/1";

/// Larger holders files are not read (a real one is a few KiB: at most three
/// holders for each of a few sites).
const MAX_SIDECAR_BYTES: u64 = 4 << 20;

/// One thing that keeps a site's tensors alive, as `memlens.why` named it
/// (the fields of its `Holder`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// `global`, `module` (an `nn.Module` attribute path), `local`,
    /// `traceback`, `hook`, `closure`, `default`, `autograd` or `unknown`.
    pub kind: String,
    /// The holder's name: `model.cache`, `train() local 'history'`.
    pub path: String,
    /// How many of the site's tensors it keeps.
    pub tensors: u64,
    /// The bytes of those tensors' storages.
    pub bytes: u64,
    /// `file:line` of the frame (a local) or of the function (a closure, a
    /// hook, a default argument); empty when the kind has none.
    #[serde(rename = "where", default, skip_serializing_if = "String::is_empty")]
    pub at: String,
    /// How the holder itself is reached, when its name does not say it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub root: String,
    /// The steps from the holder down to the tensors (containers, frames,
    /// closure variables).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub via: Vec<String>,
    /// For a global: the hooks registered on modules whose code stores into
    /// it (`forward hook keep (train.py:30) on GELU`), the code to change
    /// when the tensors were allocated by a library layer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filled_by: Vec<String>,
}

impl Holder {
    /// One line for people, as the Python alarm prints it:
    /// `model.cache [module]: 1,024 tensors, 2.00 GiB via list`.
    pub fn describe(&self) -> String {
        let mut text = format!("{} [{}]", self.path, self.kind);
        if !self.at.is_empty() {
            text.push_str(&format!(" at {}", self.at));
        }
        let count = |n: u64, what: &str| {
            format!(
                "{} {what}{}",
                crate::units::group_digits(n),
                if n == 1 { "" } else { "s" }
            )
        };
        if self.bytes > 0 {
            text.push_str(&format!(
                ": {}, {}",
                count(self.tensors, "tensor"),
                crate::units::format_bytes(self.bytes)
            ));
        } else {
            text.push_str(&format!(": {}", count(self.tensors, "object")));
        }
        if !self.via.is_empty() {
            text.push_str(&format!(" via {}", self.via.join(" -> ")));
        }
        if !self.root.is_empty() {
            text.push_str(&format!("; reached from {}", self.root));
        }
        if !self.filled_by.is_empty() {
            text.push_str(&format!("; filled by {}", self.filled_by.join(", ")));
        }
        text
    }
}

/// A holders file as written by `memlens.record`.
#[derive(Debug, Deserialize)]
struct HoldersFile {
    format: String,
    /// Holders by `file:line` site, largest first.
    sites: BTreeMap<String, Vec<Holder>>,
}

/// The holders found beside a run's snapshots, by site.
#[derive(Clone, Debug, Default)]
pub struct HoldersBySite {
    by_site: HashMap<String, Vec<Holder>>,
    /// One line for each holders file that exists but could not be used.
    pub warnings: Vec<String>,
}

impl HoldersBySite {
    /// The holders file that belongs to the snapshot at `snapshot`.
    pub fn sidecar_of(snapshot: &Path) -> PathBuf {
        crate::beside::path_of(snapshot, SIDECAR_SUFFIX)
    }

    /// The holders written beside each of `snapshots` (paths, oldest first):
    /// for a site named in several files, the newest file's holders.
    pub fn beside<'a>(snapshots: impl IntoIterator<Item = &'a str>) -> Self {
        let mut found = HoldersBySite::default();
        for snapshot in snapshots {
            let path = Self::sidecar_of(Path::new(snapshot));
            match read_sidecar(&path) {
                Ok(None) => {}
                Ok(Some(file)) => found.by_site.extend(file.sites),
                Err(why) => found.warnings.push(format!(
                    "{}: {why}; the holders it names are not shown",
                    path.display()
                )),
            }
        }
        found
    }

    /// What keeps the memory of `site` alive, largest first (empty when the
    /// process did not say).
    pub fn of(&self, site: &str) -> &[Holder] {
        self.by_site.get(site).map_or(&[], Vec::as_slice)
    }

    /// True when no holder is known.
    pub fn is_empty(&self) -> bool {
        self.by_site.is_empty()
    }
}

/// The holders file at `path`: `None` when there is none, an error (one
/// phrase) when it exists but is not one this version reads.
fn read_sidecar(path: &Path) -> Result<Option<HoldersFile>, String> {
    let Some(file) =
        crate::beside::read_json::<HoldersFile>(path, MAX_SIDECAR_BYTES, "holders file")?
    else {
        return Ok(None);
    };
    if file.format != FORMAT {
        return Err(format!(
            "format {:?}, this memlens reads {FORMAT:?}",
            file.format
        ));
    }
    Ok(Some(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder() -> Holder {
        Holder {
            kind: "module".into(),
            path: "model.cache".into(),
            tensors: 1024,
            bytes: 2 << 30,
            at: String::new(),
            root: String::new(),
            via: vec!["list".into()],
            filled_by: Vec::new(),
        }
    }

    #[test]
    fn describes_a_holder_as_the_alarm_does() {
        assert_eq!(
            holder().describe(),
            "model.cache [module]: 1,024 tensors, 2.00 GiB via list"
        );
        let local = Holder {
            kind: "local".into(),
            path: "train() local 'kept'".into(),
            tensors: 1,
            bytes: 0,
            at: "train.py:12".into(),
            root: "main() local 'x'".into(),
            via: vec![],
            filled_by: Vec::new(),
        };
        assert_eq!(
            local.describe(),
            "train() local 'kept' [local] at train.py:12: 1 object; reached from main() local 'x'"
        );
        let hooked = Holder {
            kind: "global".into(),
            path: "train.kept".into(),
            tensors: 2,
            bytes: 1024,
            at: String::new(),
            root: String::new(),
            via: vec![],
            filled_by: vec!["forward hook keep (train.py:30) on GELU".into()],
        };
        assert_eq!(
            hooked.describe(),
            "train.kept [global]: 2 tensors, 1.00 KiB; filled by forward hook keep (train.py:30) on GELU"
        );
    }

    #[test]
    fn reads_the_file_beside_each_snapshot_newest_last() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.pickle");
        let b = dir.path().join("b.pickle");
        let write = |snap: &Path, text: &str| {
            std::fs::write(HoldersBySite::sidecar_of(snap), text).unwrap();
        };
        write(
            &a,
            r#"{"format":"memlens-holders/1","step":3,"sites":{"t.py:5":[{"kind":"global","path":"t.old","tensors":1,"bytes":512}]}}"#,
        );
        write(
            &b,
            &format!(
                r#"{{"format":"memlens-holders/1","sites":{{"t.py:5":[{}]}}}}"#,
                serde_json::to_string(&holder()).unwrap()
            ),
        );
        let names = [a.to_str().unwrap(), b.to_str().unwrap()];
        let found = HoldersBySite::beside(names);
        assert!(found.warnings.is_empty(), "{:?}", found.warnings);
        assert_eq!(found.of("t.py:5"), [holder()]);
        assert!(found.of("t.py:6").is_empty());
        // No file: nothing, and no warning.
        let none = HoldersBySite::beside([dir.path().join("c.pickle").to_str().unwrap()]);
        assert!(none.is_empty() && none.warnings.is_empty());
    }

    #[test]
    fn a_bad_file_is_one_warning_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("s.pickle");
        std::fs::write(HoldersBySite::sidecar_of(&snap), "{not json").unwrap();
        let found = HoldersBySite::beside([snap.to_str().unwrap()]);
        assert!(found.is_empty());
        assert_eq!(found.warnings.len(), 1);
        assert!(found.warnings[0].contains("s.pickle.holders.json: not a holders file"));
        std::fs::write(
            HoldersBySite::sidecar_of(&snap),
            r#"{"format":"memlens-holders/9","sites":{}}"#,
        )
        .unwrap();
        let found = HoldersBySite::beside([snap.to_str().unwrap()]);
        assert!(found.warnings[0].contains("memlens-holders/9"));
    }
}
