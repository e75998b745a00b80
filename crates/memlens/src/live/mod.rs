//! Live GPU memory (`memlens top`): the sampling model, alerts and data sources.
