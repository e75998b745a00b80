//! Options of an analysis, as Python passes them: a JSON object of keyword
//! arguments (`{"top": 10, "device_memory": "80GiB"}`).

use memlens::{Error, Result};
use serde_json::{Map, Value};

/// Keyword arguments of one analysis call.
#[derive(Debug, Default)]
pub struct Options(Map<String, Value>);

// Some accessors are used only by analyses not yet in the table; keep them so
// that binding one stays a one-line change.
#[allow(dead_code)]
impl Options {
    /// Parses the JSON object Python sends.
    pub fn parse(text: &str) -> Result<Options> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => Ok(Options(map)),
            Ok(_) => Err(Error::usage("analysis options must be a JSON object")),
            Err(e) => Err(Error::usage(format!("analysis options: {e}"))),
        }
    }

    /// A string option (`config`, `message`, `path`), if given and not null.
    pub fn string(&self, key: &str) -> Result<Option<String>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(Error::usage(format!(
                "option {key}: expected a string, got {other}"
            ))),
        }
    }

    /// A count option (`top`), if given and not null.
    pub fn count(&self, key: &str) -> Result<Option<usize>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::usage(format!(
                        "option {key}: expected a non-negative integer, got {v}"
                    ))
                }),
        }
    }

    /// A size option (`device_memory`): a number of bytes or a string such as `80GiB`.
    pub fn size(&self, key: &str) -> Result<Option<u64>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => memlens::units::parse_size(s).map(Some),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                Error::usage(format!(
                    "option {key}: expected a size such as 80GiB or a number of bytes, got {v}"
                ))
            }),
        }
    }
}
