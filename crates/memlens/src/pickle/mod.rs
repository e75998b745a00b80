//! A safe, streaming reader of the pickle opcodes PyTorch snapshots use.
//!
//! It never runs code: `GLOBAL`, `REDUCE` and the other opcodes that make
//! Python import or call something are refused.

/// An error in a pickle stream, with the byte offset where it was found.
#[derive(Debug, thiserror::Error)]
#[error("{message} (at byte {offset})")]
pub struct PickleError {
    /// Byte offset of the opcode at fault.
    pub offset: u64,
    /// What is wrong.
    pub message: String,
}
