//! Errors of the library. Each one renders as a single line that names the
//! file and what is wrong with it; the CLI prints it and exits with code 2.

use std::path::PathBuf;

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while reading or analysing a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or read.
    // The OS error is part of the message, not a `source`: the CLI prints
    // the whole chain on one line and would show it twice.
    #[error("{path}: {error}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The operating system's error.
        error: std::io::Error,
    },
    /// The input is a directory, or a pattern that names no single file.
    #[error("{path}: {what}")]
    NotAFile {
        /// What the user passed.
        path: PathBuf,
        /// Why it is not usable ("is a directory; pass one snapshot file").
        what: String,
    },
    /// The bytes are not in any format memlens reads.
    #[error("{path}: {what}")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        what: String,
    },
    /// The pickle stream is malformed, truncated or hostile.
    #[error("{path}: {error}")]
    Pickle {
        /// The file.
        path: PathBuf,
        /// The reader's error, with the byte offset.
        error: crate::pickle::PickleError,
    },
    /// The file decoded, but it is not a PyTorch memory snapshot.
    #[error("{path}: not a PyTorch memory snapshot: {what}")]
    NotASnapshot {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        what: String,
    },
    /// A model description (`config.json`, `.safetensors`) that `estimate`
    /// cannot use: unknown architecture, missing field, corrupt header.
    #[error("{path}: {what}")]
    Model {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// Reading stopped because the caller asked (Ctrl-C in Python).
    #[error("{path}: reading was cancelled")]
    Cancelled {
        /// The file.
        path: PathBuf,
    },
    /// A bad argument or value given by the user (a size, a config string).
    #[error("{0}")]
    Usage(String),
    /// A JSON input that is not valid JSON.
    #[error("{path}: invalid JSON: {what}")]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's message.
        what: String,
    },
}

impl Error {
    /// A usage error with the given message.
    pub fn usage(msg: impl Into<String>) -> Self {
        Error::Usage(msg.into())
    }
}
