"""``memlens.fit``: will the run fit at another batch size, or with a module
under activation checkpointing (the library call behind ``memlens fit``);
``memlens.predict``: the same for a step traced with fake tensors, with no
GPU."""

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


def predict(build, step, *, batch=None, limit=None, precision=None, config=None, steps=2, largest=False,
            max_batch=1 << 14, save=None):
    """Predicts a training step's GPU memory with none of it used (a GPU
    must be visible to PyTorch, see :func:`memlens.trace_step`): the step is traced
    with fake tensors (:func:`memlens.trace_step`) and every allocation and
    free it made is replayed through memlens's model of PyTorch's caching
    allocator (``memlens fit`` on the trace).

    ``build``: makes the model, its optimizer and the inputs on the GPU
    (modules made without a device are made there; nothing is allocated);
    called with the batch size when ``batch`` is given. ``step(built)``:
    one training step (forward, backward, optimizer step). ``steps``: how
    many steps to trace (two: the first makes the optimizer state).
    ``precision``: ``"bf16"`` or ``"fp16"`` runs the steps under
    ``torch.autocast``. ``limit``: the bytes the allocator may reserve (an
    int or a size such as ``"80GB"``); with ``largest=True`` (and
    ``batch``), the largest batch that fits is searched, one trace per
    batch tried. ``config``: allocator settings in
    ``PYTORCH_CUDA_ALLOC_CONF`` syntax. ``save``: a path to keep the trace
    at ``batch`` (``memlens fit PATH`` replays it again).

    Returns the dict ``memlens fit TRACE --json`` prints (``predicted``:
    ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``fits``; ``basis``;
    ``warnings``), with ``batch``, and ``largest_batch`` when searched.

    Example, a Hugging Face model from its config::

        cfg = transformers.AutoConfig.from_pretrained("config.json")
        def build(batch):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
            ids = torch.randint(0, cfg.vocab_size, (batch, 2048), device="cuda")
            return model, torch.optim.AdamW(model.parameters()), ids
        def step(state):
            model, opt, ids = state
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
        memlens.predict(build, step, batch=8, precision="bf16", limit="79GiB", largest=True)
    """
    import tempfile

    if isinstance(limit, str):
        limit = _native.parse_size(limit)
    if largest and (batch is None or limit is None):
        raise ValueError("largest=True needs a batch to start from and a limit")
    with tempfile.TemporaryDirectory(prefix="memlens-trace-") as tmp:
        answers = {}

        def at(b):
            if b not in answers:
                answers[b] = _replay_traced(build, step, b, steps, precision, limit, config, tmp)
            return answers[b]

        answer = dict(at(batch))
        if save is not None:
            import shutil

            shutil.copyfile(answer.pop("_path"), os.fspath(save))
        answer.pop("_path", None)
        if batch is not None:
            answer["batch"] = batch
        if largest:
            answer["largest_batch"] = _largest_batch(lambda b: at(b)["predicted"]["fits"], batch, max_batch)
            answer["batches_traced"] = sorted(answers)
        return answer


def predict_config(config, *, batch=8, seq=512, optimizer="adamw", precision=None, limit=None, largest=False,
                   steps=2, alloc_config=None, save=None):
    """:func:`predict` for a Hugging Face model from its config alone (a
    ``config.json`` path, its folder, a dict with ``model_type``, or a config
    object; random weights, nothing downloaded): a training step of ``batch``
    x ``seq`` random token ids as inputs and labels, with ``optimizer``
    (``adamw``, ``adamw-fused``, ``adamw-for-loop``, ``adam``, ``sgd``),
    traced with fake tensors (no GPU memory used; a GPU visible) and
    replayed. ``alloc_config``: allocator settings; the rest as
    :func:`predict`. The answer adds ``seq`` and ``optimizer``.

    Example: ``memlens.predict_config("Llama-3.2-1B/config.json", batch=4,
    seq=2048, precision="bf16", limit="79GiB", largest=True)``."""
    from ._hf import hf_step

    build, step = hf_step(config, seq=seq, optimizer=optimizer)
    answer = predict(build, step, batch=batch, limit=limit, precision=precision, config=alloc_config, steps=steps,
                     largest=largest, save=save)
    answer["seq"] = seq
    answer["optimizer"] = optimizer
    return answer


def _replay_traced(build, step, batch, steps, precision, limit, config, tmp):
    """One trace (at ``batch``, or of ``build()`` when None) replayed."""
    from ._trace import trace_step

    make = (lambda: build(batch)) if batch is not None else build
    trace = trace_step(make, step, steps=steps, precision=precision)
    path = trace.save(os.path.join(tmp, f"step.b{batch}.pickle"))
    answer = json.loads(_native.fit_json([path], [], None, limit, config, None))
    answer["_path"] = path
    return answer


def _largest_batch(fits, start, max_batch):
    """The largest batch for which ``fits`` holds (fitting only gets harder
    as the batch grows): doubling or halving from ``start`` to a bracket,
    then halving the gap. None when not even batch 1 fits."""
    if fits(start):
        lo, hi = start, None
        while hi is None:
            nxt = lo * 2
            if nxt > max_batch:
                return lo
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        lo, hi = None, start
        while lo is None:
            nxt = hi // 2
            if nxt < 1:
                return None
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
