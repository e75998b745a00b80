//! `memlens summary`: the allocator state at dump time.
