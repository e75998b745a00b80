//! Input formats, detected from the bytes: raw pickle, gzip, zstd, JSON.
