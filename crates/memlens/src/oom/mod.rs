//! The OOM explainer: parse `CUDA out of memory` messages and analyse snapshots at an OOM.
