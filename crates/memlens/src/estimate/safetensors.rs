//! The header of a `.safetensors` file: tensor names, dtypes and shapes, read
//! without touching the weights.
//!
//! The format is an 8-byte little-endian length `N`, then `N` bytes of JSON
//! (`{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//! "__metadata__": {..}}`), then the raw data. Only the first `8 + N` bytes are
//! read. `N` comes from the file, so it is checked against the file's length and
//! against the 100 MB cap the reference implementation sets before anything is
//! allocated: a hostile length cannot make us allocate gigabytes.

use crate::error::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Largest header accepted, as the reference `safetensors` crate limits it.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor listed in the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    /// Its name in the state dict (`model.layers.0.mlp.up_proj.weight`).
    pub name: String,
    /// The dtype as the format spells it (`F32`, `BF16`, `I64`, ...).
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Number of elements (product of the shape; 1 for a scalar).
    pub numel: u64,
    /// Bytes of data it occupies in the file (`end - begin`).
    pub bytes: u64,
}

impl TensorInfo {
    /// Whether the dtype is a floating-point one (only those can be trained
    /// parameters; integer and bool tensors are buffers such as `position_ids`).
    pub fn is_float(&self) -> bool {
        self.dtype.starts_with('F') || self.dtype == "BF16"
    }
}

/// What the header says about a file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SafetensorsHeader {
    /// Tensors, in the order of their data in the file.
    pub tensors: Vec<TensorInfo>,
    /// The free-form `__metadata__` strings (`{"format": "pt"}`).
    pub metadata: BTreeMap<String, String>,
    /// Length of the JSON header in bytes.
    pub header_bytes: u64,
    /// Length of the data section in bytes.
    pub data_bytes: u64,
}

/// Bytes per element of the dtypes the format defines; `None` for dtypes
/// narrower than a byte or unknown to us (their size is then taken from the
/// data offsets).
pub fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "F8_E4M3" | "F8_E5M2" | "F8_E8M0" | "I8" | "U8" | "BOOL" => 1,
        _ => return None,
    })
}

/// Reads the header of the `.safetensors` file at `path`.
pub fn read_header(path: &Path) -> Result<SafetensorsHeader> {
    let io = |error| Error::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    read_header_from(&mut file, len).map_err(|what| Error::Model {
        path: path.to_path_buf(),
        what: format!("not a usable .safetensors file: {what}"),
    })
}

/// Reads a header from `reader`, the start of a file of `file_len` bytes.
/// The error is a one-line description of what is wrong.
pub fn read_header_from<R: Read>(
    reader: &mut R,
    file_len: u64,
) -> std::result::Result<SafetensorsHeader, String> {
    let mut len_bytes = [0u8; 8];
    reader.read_exact(&mut len_bytes).map_err(|_| {
        format!("truncated: {file_len} bytes, shorter than the 8-byte header length")
    })?;
    let n = u64::from_le_bytes(len_bytes);
    if n > MAX_HEADER_BYTES {
        return Err(format!(
            "header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit (corrupt, or not a safetensors file)"
        ));
    }
    let available = file_len.saturating_sub(8);
    if n > available {
        return Err(format!(
            "truncated: the header claims {n} bytes but only {available} follow the length"
        ));
    }
    // n <= 100 MB and <= the file's length: safe to allocate.
    let mut buf = Vec::with_capacity(n as usize);
    reader
        .take(n)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading the header: {e}"))?;
    if (buf.len() as u64) < n {
        return Err(format!(
            "truncated: the header claims {n} bytes, read {}",
            buf.len()
        ));
    }
    parse_header_json(&buf, n, available - n)
}

/// Parses and checks the JSON header; `data_bytes` is the length of the data
/// section that follows it.
fn parse_header_json(
    json: &[u8],
    header_bytes: u64,
    data_bytes: u64,
) -> std::result::Result<SafetensorsHeader, String> {
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let serde_json::Value::Object(map) = value else {
        return Err("header is not a JSON object".into());
    };
    let mut out = SafetensorsHeader {
        header_bytes,
        data_bytes,
        ..Default::default()
    };
    let mut begins = Vec::with_capacity(map.len());
    for (name, v) in map {
        if name == "__metadata__" {
            if let serde_json::Value::Object(m) = v {
                for (k, v) in m {
                    let s = match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    out.metadata.insert(k, s);
                }
            }
            continue;
        }
        let (info, begin) = parse_tensor(&name, &v, data_bytes)?;
        begins.push(begin);
        out.tensors.push(info);
    }
    // Order by position in the file, as the writer laid them out.
    let mut order: Vec<usize> = (0..out.tensors.len()).collect();
    order.sort_by_key(|&i| begins.get(i).copied().unwrap_or(0));
    let mut sorted = Vec::with_capacity(out.tensors.len());
    for i in order {
        if let Some(t) = out.tensors.get(i) {
            sorted.push(t.clone());
        }
    }
    out.tensors = sorted;
    Ok(out)
}

/// One tensor entry; returns it with its begin offset.
fn parse_tensor(
    name: &str,
    v: &serde_json::Value,
    data_bytes: u64,
) -> std::result::Result<(TensorInfo, u64), String> {
    let bad = |what: &str| format!("tensor {name:?}: {what}");
    let obj = v.as_object().ok_or_else(|| bad("entry is not an object"))?;
    let dtype = obj
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| bad("missing dtype"))?
        .to_string();
    let shape: Vec<u64> = obj
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or_else(|| bad("missing shape"))?
        .iter()
        .map(|d| d.as_u64().ok_or_else(|| bad("shape holds a non-integer")))
        .collect::<std::result::Result<_, _>>()?;
    let offsets = obj
        .get("data_offsets")
        .and_then(|s| s.as_array())
        .ok_or_else(|| bad("missing data_offsets"))?;
    let (begin, end) = match offsets.as_slice() {
        [b, e] => (
            b.as_u64().ok_or_else(|| bad("bad data_offsets"))?,
            e.as_u64().ok_or_else(|| bad("bad data_offsets"))?,
        ),
        _ => return Err(bad("data_offsets must be [begin, end]")),
    };
    if begin > end || end > data_bytes {
        return Err(bad(&format!(
            "data_offsets [{begin}, {end}] outside the {data_bytes}-byte data section"
        )));
    }
    let numel = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("shape overflows"))?;
    let bytes = end - begin;
    if let Some(size) = dtype_bytes(&dtype) {
        let want = numel
            .checked_mul(size)
            .ok_or_else(|| bad("size overflows"))?;
        if want != bytes {
            return Err(bad(&format!(
                "shape {shape:?} of {dtype} needs {want} bytes, data_offsets span {bytes}"
            )));
        }
    }
    Ok((
        TensorInfo {
            name: name.to_string(),
            dtype,
            shape,
            numel,
            bytes,
        },
        begin,
    ))
}

/// Builds a `.safetensors` file image from `(name, dtype, shape)` entries with
/// zeroed data: for tests and examples.
pub fn build_file(tensors: &[(&str, &str, &[u64])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let numel: u64 = shape.iter().product();
        let size = numel * dtype_bytes(dtype).unwrap_or(1);
        header.insert(
            (*name).to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}),
        );
        offset += size;
    }
    let json = serde_json::Value::Object(header).to_string();
    let mut out = Vec::with_capacity(8 + json.len() + offset as usize);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.resize(out.len() + offset as usize, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> std::result::Result<SafetensorsHeader, String> {
        read_header_from(&mut &bytes[..], bytes.len() as u64)
    }

    #[test]
    fn reads_a_built_file() {
        let f = build_file(&[("a.weight", "F32", &[3, 4]), ("b", "BF16", &[5])]);
        let h = parse(&f).unwrap();
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].name, "a.weight");
        assert_eq!(h.tensors[0].numel, 12);
        assert_eq!(h.tensors[0].bytes, 48);
        assert_eq!(h.tensors[1].bytes, 10);
        assert_eq!(h.data_bytes, 58);
        assert_eq!(h.metadata.get("format").map(String::as_str), Some("pt"));
    }

    #[test]
    fn rejects_hostile_lengths() {
        let mut f = u64::MAX.to_le_bytes().to_vec();
        f.extend_from_slice(b"{}");
        assert!(parse(&f).unwrap_err().contains("exceeds"));
        let mut f = 1000u64.to_le_bytes().to_vec();
        f.extend_from_slice(b"{}");
        assert!(parse(&f).unwrap_err().contains("truncated"));
        assert!(parse(&[1, 2, 3]).unwrap_err().contains("truncated"));
    }

    #[test]
    fn rejects_inconsistent_entries() {
        let json = br#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}"#;
        let mut f = (json.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(json);
        f.extend_from_slice(&[0; 8]);
        assert!(parse(&f).unwrap_err().contains("needs 16 bytes"));
        let json = br#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        let mut f = (json.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(json);
        assert!(parse(&f).unwrap_err().contains("outside"));
        let json = br#"[1,2]"#;
        let mut f = (json.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(json);
        assert!(parse(&f).unwrap_err().contains("not a JSON object"));
    }
}
