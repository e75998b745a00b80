//! What MODEL names: a `config.json`, a `.safetensors` file (with the
//! `config.json` beside it when there is one), a sharded checkpoint's
//! `model.safetensors.index.json`, or a directory holding them.

use super::hf_config::parse_config;
use super::model::{Family, ModelSpec, ParamTensor};
use super::safetensors::{read_header, TensorInfo};
use crate::error::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A `config.json` larger than this is not one.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// What the checkpoint's `.safetensors` headers say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    /// The files read (headers only).
    pub files: Vec<PathBuf>,
    /// Floating-point tensors that are parameters, summed.
    pub parameters: u64,
    /// Parameters by checkpoint dtype (`BF16` -> count).
    pub dtypes: BTreeMap<String, u64>,
    /// Bytes of weight data in the files.
    pub bytes: u64,
    /// Tensors left out as buffers (integer or bool dtype, attention masks,
    /// `inv_freq`, `position_ids`).
    pub buffers: Vec<String>,
}

/// Reads the model at `path`; see the module documentation for what it may be.
pub fn load_model(path: &Path) -> Result<(ModelSpec, Option<Checkpoint>)> {
    let io = |error| Error::Io {
        path: path.to_path_buf(),
        error,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let (config, shards) = if meta.is_dir() {
        let config = Some(path.join("config.json")).filter(|p| p.is_file());
        let mut shards: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
            .collect();
        shards.sort();
        if config.is_none() && shards.is_empty() {
            return Err(Error::Model {
                path: path.to_path_buf(),
                what: "directory holds neither config.json nor .safetensors files".into(),
            });
        }
        (config, shards)
    } else if is_safetensors(path)? {
        (sibling_config(path), vec![path.to_path_buf()])
    } else {
        let text = read_json(path)?;
        match index_shards(&text, path)? {
            Some(shards) => (sibling_config(path), shards),
            None => {
                let spec = parse_config(&text, path)?;
                return Ok((spec, None));
            }
        }
    };
    let checkpoint = if shards.is_empty() {
        None
    } else {
        let mut infos = Vec::new();
        for s in &shards {
            infos.extend(read_header(s)?.tensors);
        }
        Some((shards, infos))
    };
    let mut spec = match &config {
        Some(c) => parse_config(&read_json(c)?, c)?,
        None => ModelSpec {
            family: Family::Tensors,
            model_type: "safetensors".into(),
            architecture_class: None,
            source: path.to_path_buf(),
            arch: None,
            tensors: Vec::new(),
            tensors_from: "safetensors",
            notes: vec![
                "no config.json beside the checkpoint: activations are not estimated (put the config.json next to it, or pass it)".into(),
            ],
        },
    };
    let Some((files, infos)) = checkpoint else {
        return Ok((spec, None));
    };
    let (tensors, ck) = checkpoint_tensors(files, &infos);
    if spec.arch.is_none() {
        spec.tensors = tensors;
        spec.source = path.to_path_buf();
    } else if ck.parameters != spec.parameters() {
        spec.notes.push(format!(
            "the checkpoint stores {} parameters, the config describes {}; the estimate uses the config's",
            ck.parameters,
            spec.parameters()
        ));
    }
    Ok((spec, Some(ck)))
}

/// Whether `path` is a `.safetensors` file: by its extension, else by its
/// first bytes (a safetensors header is an 8-byte length then `{`; JSON starts
/// with `{`). Anything else is neither.
fn is_safetensors(path: &Path) -> Result<bool> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => return Ok(true),
        Some("json") => return Ok(false),
        _ => {}
    }
    use std::io::Read;
    let io = |error| Error::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut head = Vec::with_capacity(64);
    std::fs::File::open(path)
        .map_err(io)?
        .take(64)
        .read_to_end(&mut head)
        .map_err(io)?;
    if head.get(8) == Some(&b'{') {
        return Ok(true);
    }
    if head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        return Ok(false);
    }
    Err(Error::Model {
        path: path.to_path_buf(),
        what: "neither a Hugging Face config.json nor a .safetensors file".into(),
    })
}

fn sibling_config(path: &Path) -> Option<PathBuf> {
    let c = path.parent()?.join("config.json");
    c.is_file().then_some(c)
}

fn read_json(path: &Path) -> Result<String> {
    let io = |error| Error::Io {
        path: path.to_path_buf(),
        error,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_CONFIG_BYTES {
        return Err(Error::Model {
            path: path.to_path_buf(),
            what: format!("{len} bytes is too large for a config.json"),
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    String::from_utf8(bytes).map_err(|_| Error::Model {
        path: path.to_path_buf(),
        what: "not UTF-8 text: expected a config.json or a .safetensors file".into(),
    })
}

/// The shard files of a `model.safetensors.index.json`, or `None` when the
/// JSON is not an index.
fn index_shards(text: &str, path: &Path) -> Result<Option<Vec<PathBuf>>> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Ok(None);
    };
    let Some(weight_map) = map.get("weight_map").and_then(|w| w.as_object()) else {
        return Ok(None);
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = weight_map
        .values()
        .filter_map(|v| v.as_str())
        // Only the file name: an index cannot point outside its directory.
        .filter_map(|name| Path::new(name).file_name().map(|f| dir.join(f)))
        .collect();
    files.sort();
    files.dedup();
    if files.is_empty() {
        return Err(Error::Model {
            path: path.to_path_buf(),
            what: "index lists no shard files in weight_map".into(),
        });
    }
    Ok(Some(files))
}

/// Whether a stored tensor is a buffer rather than a trained parameter.
fn is_buffer(t: &TensorInfo) -> bool {
    !t.is_float()
        || t.name.ends_with(".attn.bias")
        || t.name.ends_with(".attn.masked_bias")
        || t.name.ends_with("inv_freq")
        || t.name.ends_with("position_ids")
}

/// The layer a tensor name belongs to (`...layers.3.`, `h.3.`, `block.3.`),
/// numbered in order of first appearance of each `prefix.N`.
fn layer_key(name: &str) -> Option<String> {
    let parts: Vec<&str> = name.split('.').collect();
    for (i, w) in parts.windows(2).enumerate() {
        if let [stack, n] = w {
            if matches!(*stack, "h" | "layers" | "layer" | "block" | "blocks")
                && n.parse::<u64>().is_ok()
            {
                return Some(parts.get(..i + 2)?.join("."));
            }
        }
    }
    None
}

fn checkpoint_tensors(files: Vec<PathBuf>, infos: &[TensorInfo]) -> (Vec<ParamTensor>, Checkpoint) {
    let mut ck = Checkpoint {
        files,
        ..Default::default()
    };
    let mut layers: BTreeMap<String, u64> = BTreeMap::new();
    let mut tensors = Vec::new();
    for t in infos {
        ck.bytes = ck.bytes.saturating_add(t.bytes);
        if is_buffer(t) {
            ck.buffers.push(t.name.clone());
            continue;
        }
        ck.parameters = ck.parameters.saturating_add(t.numel);
        let e = ck.dtypes.entry(t.dtype.clone()).or_default();
        *e = e.saturating_add(t.numel);
        let layer = layer_key(&t.name).map(|k| {
            let next = layers.len() as u64;
            *layers.entry(k).or_insert(next)
        });
        // Without the architecture, a 2-D tensor that is not an embedding is
        // taken for a Linear weight.
        let lname = t.name.to_ascii_lowercase();
        let embedding = ["embed", "wte", "wpe", "shared", "position"]
            .iter()
            .any(|k| lname.contains(k));
        let mut p = ParamTensor::new(
            t.name.clone(),
            &t.shape,
            t.shape.len() >= 2 && !embedding,
            layer,
        );
        p.checkpoint_dtype = Some(t.dtype.clone());
        tensors.push(p);
    }
    (tensors, ck)
}
