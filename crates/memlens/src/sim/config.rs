//! The allocator settings that change placement, parsed from
//! `PYTORCH_CUDA_ALLOC_CONF` syntax. The model knows no snapshot type: the
//! settings a snapshot recorded are converted in `replay::config`.
//!
//! The parser follows `c10/core/AllocatorConfig.cpp` and
//! `c10/cuda/CUDAAllocatorConfig.cpp`: tokens split at `,`, `:`, `[` and `]`,
//! whitespace ignored, booleans spelled `True`/`False`, unknown keys rejected.

use serde::Serialize;
use std::fmt;

const MIB: u64 = 1 << 20;

/// Number of `roundup_power2_divisions` intervals (1 MiB .. 64 GiB, doubling).
pub const ROUNDUP_INTERVALS: usize = 16;

/// A PyTorch release, for the few rules that changed between versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct TorchVersion {
    /// Major version (2 for 2.4).
    pub major: u16,
    /// Minor version (4 for 2.4).
    pub minor: u16,
}

impl TorchVersion {
    /// The newest behaviour modelled (the fixtures were recorded with 2.11).
    pub const NEWEST: TorchVersion = TorchVersion {
        major: 2,
        minor: 11,
    };

    /// Parses `2.4`, `2.4.1` or `2.4.1+cu121`.
    pub fn parse(text: &str) -> Result<TorchVersion, ConfigError> {
        let bad = || ConfigError::BadVersion(text.to_string());
        let core = text.trim().split(['+', 'a', 'b', 'r']).next().unwrap_or("");
        let mut parts = core.split('.');
        let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let minor = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        Ok(TorchVersion { major, minor })
    }

    fn at_least(self, major: u16, minor: u16) -> bool {
        self >= TorchVersion { major, minor }
    }

    /// `round_size` applies power-of-two divisions only when `divisions > 1`
    /// (newer builds); older builds test `divisions > 0`, so a value of 1 rounds
    /// up to the next power of two there.
    pub fn divisions_need_two(self) -> bool {
        self.at_least(2, 5)
    }

    /// `release_available_cached_blocks` and the GC skip expandable blocks.
    pub fn release_skips_expandable(self) -> bool {
        self.at_least(2, 5)
    }

    /// Private pools (CUDA graphs) may use expandable segments (about 2.2
    /// still cudaMalloc'ed them).
    pub fn expandable_private_pools(self) -> bool {
        self.at_least(2, 3)
    }
}

impl Default for TorchVersion {
    fn default() -> Self {
        TorchVersion::NEWEST
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What is wrong with an allocator config string.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A key PyTorch does not know.
    #[error("unrecognized key {0:?} in allocator config")]
    UnknownKey(String),
    /// A value that does not parse or is out of range.
    #[error("invalid value for {key}: {why}")]
    BadValue {
        /// The option.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// The text is not `key:value,...`.
    #[error("malformed allocator config {text:?}: {why}")]
    Syntax {
        /// The whole config.
        text: String,
        /// What was expected.
        why: String,
    },
    /// A setting the model does not cover.
    #[error("{0} is not modelled")]
    Unsupported(String),
    /// A PyTorch version that does not parse.
    #[error("invalid PyTorch version {0:?}: expected e.g. 2.4")]
    BadVersion(String),
}

impl From<ConfigError> for crate::Error {
    fn from(e: ConfigError) -> Self {
        crate::Error::Usage(e.to_string())
    }
}

/// Every setting of the caching allocator that changes where blocks go.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocatorConfig {
    /// `max_split_size_mb` in bytes; `None` is unlimited (the default).
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb` in bytes (default 20 MiB).
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions`, one value per interval: index 0 is below
    /// 2 MiB, index k is `[2^(20+k), 2^(21+k))`, index 15 is 32 GiB and up.
    pub roundup_power2_divisions: [u32; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `per_process_memory_fraction` (or `set_per_process_memory_fraction`);
    /// `None` when 1.0.
    pub per_process_memory_fraction: Option<f64>,
    /// `large_segment_size_mb` in bytes (default 20 MiB): the segment for
    /// 1-10 MiB requests and the expandable large page.
    pub large_segment_size: u64,
    /// The PyTorch version whose rules apply.
    pub version: TorchVersion,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: None,
            large_segment_size: 20 * MIB,
            version: TorchVersion::NEWEST,
        }
    }
}

/// Keys PyTorch accepts that do not change placement (host allocator, locking,
/// graph capture, the legacy bypass threshold).
const INERT_KEYS: &[&str] = &[
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
    "roundup_bypass_threshold_mb",
    "expandable_segments_handle_type",
];

impl AllocatorConfig {
    /// Parses `PYTORCH_CUDA_ALLOC_CONF` syntax on top of the defaults, e.g.
    /// `expandable_segments:True,max_split_size_mb:128` or
    /// `roundup_power2_divisions:[256:1,512:2,>:8]`.
    pub fn parse(text: &str) -> Result<AllocatorConfig, ConfigError> {
        let mut c = AllocatorConfig::default();
        c.apply(text)?;
        Ok(c)
    }

    /// Applies a config string to these settings, as `parseArgs` does:
    /// `max_split_size`, `roundup_power2_divisions` and the GC threshold reset
    /// to their defaults first; the rest keep their values unless named.
    pub fn apply(&mut self, text: &str) -> Result<(), ConfigError> {
        self.max_split_size = None;
        self.roundup_power2_divisions = [0; ROUNDUP_INTERVALS];
        self.garbage_collection_threshold = 0.0;
        let tokens = tokenize(text);
        let mut p = Parser {
            text,
            tokens: &tokens,
            i: 0,
        };
        while p.i < tokens.len() {
            let key = p.next_token()?;
            p.expect(":")?;
            match key {
                "max_split_size_mb" => {
                    let mb = p.size_value(key)?;
                    if mb < 20 {
                        return Err(bad(key, "must be >= 20"));
                    }
                    self.max_split_size = Some(mb.saturating_mul(MIB));
                }
                "max_non_split_rounding_mb" => {
                    let mb = p.size_value(key)?;
                    if mb < 20 {
                        return Err(bad(key, "must be >= 20"));
                    }
                    self.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "large_segment_size_mb" => {
                    let mb = p.size_value(key)?;
                    if mb == 0 {
                        return Err(bad(key, "must be > 0"));
                    }
                    self.large_segment_size = mb.saturating_mul(MIB);
                }
                "garbage_collection_threshold" => {
                    let v = p.float_value(key)?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(bad(key, "set it in (0.0, 1.0)"));
                    }
                    self.garbage_collection_threshold = v;
                }
                "per_process_memory_fraction" => {
                    let v = p.float_value(key)?;
                    if !(0.0..=1.0).contains(&v) {
                        return Err(bad(key, "set it in [0.0, 1.0]"));
                    }
                    self.per_process_memory_fraction = (v < 1.0).then_some(v);
                }
                "expandable_segments" => self.expandable_segments = p.bool_value(key)?,
                "roundup_power2_divisions" => {
                    self.roundup_power2_divisions = p.divisions()?;
                }
                "backend" => {
                    let v = p.next_token()?;
                    match v {
                        "native" => {}
                        "cudaMallocAsync" => {
                            return Err(ConfigError::Unsupported(
                                "backend:cudaMallocAsync".to_string(),
                            ))
                        }
                        _ => return Err(bad(key, "expected native or cudaMallocAsync")),
                    }
                }
                k if INERT_KEYS.contains(&k) => p.skip_value()?,
                other => return Err(ConfigError::UnknownKey(other.to_string())),
            }
            if p.i < tokens.len() {
                p.expect(",")?;
            }
        }
        Ok(())
    }

    /// The divisions for a (rounded-to-512) request size, as
    /// `AcceleratorAllocatorConfig::roundup_power2_divisions(size)`.
    pub fn divisions_for(&self, size: u64) -> u32 {
        let log = 63 - size.max(1).leading_zeros() as usize;
        let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }

    /// `max_split_size`, `u64::MAX` when unlimited (as `SIZE_MAX` in PyTorch).
    pub fn max_split(&self) -> u64 {
        self.max_split_size.unwrap_or(u64::MAX)
    }

    /// The settings in `PYTORCH_CUDA_ALLOC_CONF` syntax; empty for the
    /// defaults. Parsing the result gives these settings back.
    pub fn to_conf_string(&self) -> String {
        let d = AllocatorConfig::default();
        let mut parts = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != d.max_non_split_rounding {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        if self.roundup_power2_divisions != d.roundup_power2_divisions {
            parts.push(format!(
                "roundup_power2_divisions:{}",
                divisions_string(&self.roundup_power2_divisions)
            ));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if let Some(f) = self.per_process_memory_fraction {
            parts.push(format!("per_process_memory_fraction:{f}"));
        }
        if self.large_segment_size != d.large_segment_size {
            parts.push(format!(
                "large_segment_size_mb:{}",
                self.large_segment_size / MIB
            ));
        }
        parts.join(",")
    }
}

/// Writes divisions in the list form: `[1:4,>:8]`-like, one entry per change.
fn divisions_string(d: &[u32; ROUNDUP_INTERVALS]) -> String {
    if d.iter().all(|v| *v == d[0]) {
        return d[0].to_string();
    }
    // Key K (MB) sets index log2(K); the first key also fills the indices
    // below it, and `>` fills every index after the last key.
    let mut first_end = 0;
    while first_end + 1 < ROUNDUP_INTERVALS && d[first_end + 1] == d[0] {
        first_end += 1;
    }
    let mut tail = ROUNDUP_INTERVALS - 1;
    while tail > first_end + 1 && d[tail - 1] == d[ROUNDUP_INTERVALS - 1] {
        tail -= 1;
    }
    let mut out = vec![format!("{}:{}", 1u64 << first_end, d[0])];
    for (i, v) in d.iter().enumerate().take(tail).skip(first_end + 1) {
        out.push(format!("{}:{}", 1u64 << i, v));
    }
    out.push(format!(">:{}", d[tail]));
    format!("[{}]", out.join(","))
}

fn bad(key: &str, why: &str) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_string(),
        why: why.to_string(),
    }
}

/// Splits at `,`, `:`, `[`, `]` (kept as tokens) and drops whitespace, like
/// PyTorch's `ConfigTokenizer`.
fn tokenize(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, ch) in text.char_indices() {
        if matches!(ch, ',' | ':' | '[' | ']') || ch.is_whitespace() {
            if let Some(s) = start.take() {
                out.push(&text[s..i]);
            }
            if !ch.is_whitespace() {
                out.push(&text[i..i + 1]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out
}

struct Parser<'a> {
    text: &'a str,
    tokens: &'a [&'a str],
    i: usize,
}

impl<'a> Parser<'a> {
    fn syntax(&self, why: &str) -> ConfigError {
        ConfigError::Syntax {
            text: self.text.to_string(),
            why: why.to_string(),
        }
    }

    fn next_token(&mut self) -> Result<&'a str, ConfigError> {
        let t = self
            .tokens
            .get(self.i)
            .copied()
            .ok_or_else(|| self.syntax("unexpected end"))?;
        self.i += 1;
        Ok(t)
    }

    fn peek(&self) -> Option<&'a str> {
        self.tokens.get(self.i).copied()
    }

    fn expect(&mut self, tok: &str) -> Result<(), ConfigError> {
        let t = self.next_token()?;
        if t == tok {
            Ok(())
        } else {
            Err(self.syntax(&format!("expected {tok:?}, found {t:?}")))
        }
    }

    fn size_value(&mut self, key: &str) -> Result<u64, ConfigError> {
        let t = self.next_token()?;
        t.parse::<u64>()
            .map_err(|_| bad(key, &format!("{t:?} is not a non-negative integer")))
    }

    fn float_value(&mut self, key: &str) -> Result<f64, ConfigError> {
        let t = self.next_token()?;
        t.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| bad(key, &format!("{t:?} is not a number")))
    }

    fn bool_value(&mut self, key: &str) -> Result<bool, ConfigError> {
        match self.next_token()? {
            "True" => Ok(true),
            "False" => Ok(false),
            t => Err(bad(key, &format!("expected True or False, found {t:?}"))),
        }
    }

    /// Skips one value: a token, or a bracketed list.
    fn skip_value(&mut self) -> Result<(), ConfigError> {
        if self.next_token()? == "[" {
            while self.next_token()? != "]" {}
        }
        Ok(())
    }

    /// `roundup_power2_divisions`: a single power of two, or
    /// `[K:V,...,>:V]` with K in MB (powers of two) and V 0 or a power of two.
    fn divisions(&mut self) -> Result<[u32; ROUNDUP_INTERVALS], ConfigError> {
        const KEY: &str = "roundup_power2_divisions";
        let mut d = [0u32; ROUNDUP_INTERVALS];
        let parse_div = |t: &str| -> Result<u32, ConfigError> {
            let v: u32 = t
                .parse()
                .map_err(|_| bad(KEY, &format!("{t:?} is not an integer")))?;
            if v != 0 && !v.is_power_of_two() {
                return Err(bad(KEY, "divisions must be a power of 2 or 0"));
            }
            Ok(v)
        };
        if self.peek() != Some("[") {
            let t = self.next_token()?;
            let v = parse_div(t)?;
            if v == 0 {
                return Err(bad(KEY, "divisions must be a power of 2"));
            }
            return Ok([v; ROUNDUP_INTERVALS]);
        }
        self.expect("[")?;
        let mut first = true;
        let mut last_index = 0usize;
        loop {
            let k = self.next_token()?;
            if k == "]" {
                break;
            }
            self.expect(":")?;
            let v = parse_div(self.next_token()?)?;
            if k == ">" {
                for x in d.iter_mut().skip(last_index + 1) {
                    *x = v;
                }
            } else {
                let boundary: u64 = k
                    .parse()
                    .map_err(|_| bad(KEY, &format!("interval {k:?} is not an integer")))?;
                if !boundary.is_power_of_two() {
                    return Err(bad(KEY, "intervals must be powers of 2"));
                }
                let index = (63 - boundary.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                if first {
                    for x in d.iter_mut().take(index) {
                        *x = v;
                    }
                    first = false;
                }
                d[index] = v;
                last_index = index;
            }
            match self.next_token()? {
                "," => {}
                "]" => break,
                t => return Err(self.syntax(&format!("expected ',' or ']', found {t:?}"))),
            }
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_settings() {
        let c = AllocatorConfig::parse("expandable_segments:True").unwrap();
        assert!(c.expandable_segments);
        let c = AllocatorConfig::parse(" garbage_collection_threshold:0.6, max_split_size_mb:128 ")
            .unwrap();
        assert_eq!(c.max_split_size, Some(128 << 20));
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert_eq!(
            AllocatorConfig::parse("").unwrap(),
            AllocatorConfig::default()
        );
    }

    #[test]
    fn divisions_forms() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        // Key 256 writes index 8 ([256 MB, 512 MB)) and fills 0..8 too.
        assert_eq!(&c.roundup_power2_divisions[..8], &[1; 8]);
        assert_eq!(c.roundup_power2_divisions[8], 1);
        assert_eq!(c.roundup_power2_divisions[9], 2);
        assert_eq!(c.roundup_power2_divisions[10], 4);
        assert_eq!(&c.roundup_power2_divisions[11..], &[8; 5]);
        assert_eq!(c.divisions_for(300 << 20), 1);
        assert_eq!(c.divisions_for(600 << 20), 2);
        assert_eq!(c.divisions_for(1 << 10), 1);
    }

    #[test]
    fn conf_string_round_trips() {
        for s in [
            "expandable_segments:True",
            "max_split_size_mb:64",
            "roundup_power2_divisions:4",
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
        ] {
            let c = AllocatorConfig::parse(s).unwrap();
            let again = AllocatorConfig::parse(&c.to_conf_string()).unwrap();
            assert_eq!(c, again, "{s} -> {}", c.to_conf_string());
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(
            AllocatorConfig::parse("max_split_size:64"),
            Err(ConfigError::UnknownKey(_))
        ));
        assert!(AllocatorConfig::parse("max_split_size_mb:10").is_err());
        assert!(AllocatorConfig::parse("max_split_size_mb").is_err());
        assert!(AllocatorConfig::parse("expandable_segments:true").is_err());
        assert!(AllocatorConfig::parse("garbage_collection_threshold:1.5").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:3").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[3:4]").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:4").is_err());
        assert!(AllocatorConfig::parse("backend:cudaMallocAsync").is_err());
        assert!(AllocatorConfig::parse("release_lock_on_cudamalloc:True").is_ok());
    }

    #[test]
    fn versions() {
        assert_eq!(
            TorchVersion::parse("2.4.1+cu121").unwrap(),
            TorchVersion { major: 2, minor: 4 }
        );
        assert!(TorchVersion::parse("two").is_err());
        assert!(!TorchVersion::parse("2.2").unwrap().divisions_need_two());
    }
}
