//! `memlens estimate`: memory a training step will need, before running it.
