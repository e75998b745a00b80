"""``memlens.fit``: will the run fit at another batch size, or with a module
under activation checkpointing (the library call behind ``memlens fit``)."""

import json
import os

from . import _native


def fit(probes, recorded_batch=None, batch=None, limit=None, config=None, checkpoint=None):
    """Predicts a training run at another batch size from two probes, or the
    recorded run with a module under activation checkpointing.

    ``probes``: two snapshots of the same run (same code, same number of
    steps, recorded from the start of the process) at the batch sizes
    ``recorded_batch``, in order. ``batch``: the batch to predict. ``limit``:
    the bytes PyTorch's allocator may reserve (an int or a size such as
    ``"70GiB"``); with it, the answer says whether ``batch`` fits and the
    largest batch that does. ``config``: allocator settings in
    ``PYTORCH_CUDA_ALLOC_CONF`` syntax (default: the probes').

    ``checkpoint``: a module (a class such as ``"GPT2Block"``, or an instance
    such as ``"transformer.h.3"``) to predict under
    ``torch.utils.checkpoint``; then ``probes`` is one recording made with
    ``memlens.record(..., model=model)`` and no ``recorded_batch``.

    Returns the dict ``memlens fit --json`` prints: ``predicted``
    (``peak_allocated_bytes``, ``peak_reserved_bytes``, ``fits``),
    ``limit_bytes``, ``basis``, and ``largest_batch`` from probes or
    ``recorded`` (the run as recorded) with ``checkpoint``.
    """
    if isinstance(limit, str):
        limit = _native.parse_size(limit)
    if isinstance(probes, (str, os.PathLike)):
        probes = [probes]
    paths = [os.fspath(p) for p in probes]
    batches = [int(b) for b in (recorded_batch or [])]
    return json.loads(_native.fit_json(paths, batches, batch, limit, config, checkpoint))
