//! The example snapshot built into the binary, so `memlens doctor` with no
//! argument shows what the tool does on a real file.
//!
//! It is `gpt2_eval_leak.pickle.zst` from the project's fixtures: a real run on
//! an H100 whose validation loop keeps every loss tensor (and so its autograd
//! graph) alive, a classic leak.

/// File name shown for the embedded example in messages and reports.
pub const EXAMPLE_NAME: &str = "example:gpt2_eval_leak.pickle.zst";

/// The bytes of the example snapshot (zstd-compressed pickle).
pub const EXAMPLE_SNAPSHOT: &[u8] = include_bytes!("../assets/example.pickle.zst");
