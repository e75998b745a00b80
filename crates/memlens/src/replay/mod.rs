//! Replay of a snapshot's trace through the allocator model.
