"""``memlens.fit``: will the run fit at another batch size (the library call
behind ``memlens fit``)."""

import json
import os

from . import _native


def fit(probes, recorded_batch, batch=None, limit=None, config=None):
    """Predicts a training run at another batch size from two probes.

    ``probes``: two snapshots of the same run (same code, same number of
    steps, recorded from the start of the process) at the batch sizes
    ``recorded_batch``, in order. ``batch``: the batch to predict. ``limit``:
    the bytes PyTorch's allocator may reserve (an int or a size such as
    ``"70GiB"``); with it, the answer says whether ``batch`` fits and the
    largest batch that does. ``config``: allocator settings in
    ``PYTORCH_CUDA_ALLOC_CONF`` syntax (default: the probes').

    Returns the dict ``memlens fit --json`` prints: ``predicted``
    (``peak_allocated_bytes``, ``peak_reserved_bytes``, ``fits``),
    ``largest_batch``, ``limit_bytes``, ``basis``.
    """
    if isinstance(limit, str):
        limit = _native.parse_size(limit)
    paths = [os.fspath(p) for p in probes]
    batches = [int(b) for b in recorded_batch]
    return json.loads(_native.fit_json(paths, batches, batch, limit, config))
