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
            max_batch=1 << 14, save=None, world_size=None):
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
    batch tried (about five: the line through two traced peaks says where
    to look, and each batch's own trace whether it fits; see
    ``_largest_batch``). ``config``: allocator settings in
    ``PYTORCH_CUDA_ALLOC_CONF`` syntax. ``save``: a path to keep the trace
    at ``batch`` (``memlens fit PATH`` replays it again). ``world_size``:
    the step is one rank of a DistributedDataParallel job of that many
    (``build`` wraps the model in ``DistributedDataParallel``; see
    :func:`memlens.trace_step`).

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
                # The least limit only when searching: it steers the search.
                answers[b] = _replay_traced(build, step, b, steps, precision, limit, config, tmp, world_size,
                                            largest)
            return answers[b]

        answer = dict(at(batch))
        # The least limit steers the search only: the model's edge, not a
        # size to run under (see memlens fit's FitOptions::least_limit).
        answer["predicted"] = {k: v for k, v in answer["predicted"].items() if k != "least_limit_bytes"}
        if save is not None:
            import shutil

            shutil.copyfile(answer.pop("_path"), os.fspath(save))
        answer.pop("_path", None)
        if batch is not None:
            answer["batch"] = batch
        if largest:
            def measure(b):
                predicted = at(b)["predicted"]
                return (predicted["fits"], predicted["peak_allocated_bytes"], predicted["peak_reserved_bytes"],
                        predicted.get("least_limit_bytes"))

            answer["largest_batch"] = _largest_batch(measure, batch, max_batch, limit)
            answer["batches_traced"] = sorted(answers)
        return answer


def predict_config(config, *, batch=8, seq=512, optimizer="adamw", precision=None, limit=None, largest=False,
                   steps=2, alloc_config=None, save=None):
    """:func:`predict` for a Hugging Face model from its config alone (a
    ``config.json`` path, its folder, a dict with ``model_type``, or a config
    object; random weights, nothing downloaded): a training step of ``batch``
    x ``seq`` random token ids as inputs and labels, with ``optimizer``
    (``adamw``, ``adamw-fused``, ``adamw-for-loop``, ``adam``, ``sgd``),
    traced with fake tensors (none of its memory on the GPU; a GPU visible) and
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


def _replay_traced(build, step, batch, steps, precision, limit, config, tmp, world_size=None, least_limit=False):
    """One trace (at ``batch``, or of ``build()`` when None) replayed; with
    ``least_limit`` (and a limit), its least limit in the model too."""
    from ._trace import trace_step

    make = (lambda: build(batch)) if batch is not None else build
    trace = trace_step(make, step, steps=steps, precision=precision, world_size=world_size)
    path = trace.save(os.path.join(tmp, f"step.b{batch}.pickle"))
    answer = json.loads(_native.fit_json([path], [], None, limit, config, None, least_limit=least_limit and limit is not None))
    answer["_path"] = path
    return answer


def _largest_batch(measure, start, max_batch, limit):
    """The largest batch whose step fits (fitting only gets harder as the
    batch grows), tracing as few batches as the peaks allow.

    ``measure(b)`` traces batch ``b`` and gives ``(fits, peak_allocated,
    peak_reserved, least_limit)`` (``least_limit``: the least limit the
    step fits under in the model, ``fit_json(..., least_limit=True)``'s
    ``least_limit_bytes``; None: the reserved peak stands for it). Whether
    a batch fits is only ever taken from its own trace: the answer is a
    batch that fits next to one that does not (or ``max_batch``), as a
    bisection would find it. The peaks only choose which batch to trace
    next: the allocated peak grows about linearly with the batch, so the
    line through the two traced batches nearest the edge says where it
    reaches the limit less what the step needs above its allocated peak
    under a limit (a secant step; ``_secant``), and the batch just past a
    guess that fits (or just below one that does not) is traced next. Two
    steps in a row that do not halve the gap are followed by a bisection,
    so a peak far from a line still ends in a bracket (on 20,000 random
    curves: 5.9 traces on average where doubling and bisecting took 9.4,
    at worst 11 more; on five models' steps traced at every batch from 1
    to 30 on an H200, 5.05 on average under 110 caps between two batches,
    at worst 9, where the line to the limit less the reserved peaks' cache
    took 5.75, at worst 13). Starts from ``start`` and its double (or
    half). None when not even batch 1 fits."""
    peaks = {}
    lo = hi = None  # the largest batch known to fit, the smallest known not to

    def trace(b):
        nonlocal lo, hi
        fits, allocated, reserved, least = measure(b)
        peaks[b] = (allocated, reserved if least is None else least)
        if fits:
            lo = b if lo is None else max(lo, b)
        else:
            hi = b if hi is None else min(hi, b)

    trace(start)
    second = start * 2 if lo is not None else start // 2
    if second > max_batch:
        return lo
    if second < 1:
        return None
    trace(second)
    slow = 0
    while True:
        if hi == 1:
            return None
        if lo is not None and (lo >= max_batch or (hi is not None and hi - lo <= 1)):
            return lo
        floor = 1 if lo is None else lo + 1
        ceiling = max_batch if hi is None else hi - 1
        gap = None if lo is None or hi is None else hi - lo
        guess = None if slow >= 2 else _secant(peaks, lo, hi, limit)
        if guess is None:
            # No usable line, or two slow steps: halve the gap (double or
            # halve while the edge is not yet bracketed).
            slow = 0
            if gap is not None:
                guess = (lo + hi) // 2
            else:
                guess = lo * 2 if lo is not None else hi // 2
        elif lo is not None and hi is None:
            # Extrapolating upwards: not past four times the largest batch
            # traced. Two small batches can both sit where the peak does not
            # grow yet (set by the optimizer step, not the activations: the
            # ViT's at 2 and 4), and their line then points far too high.
            guess = min(guess, 4 * max(peaks))
        guess = min(max(guess, floor), ceiling)
        trace(guess)
        if gap is not None:
            slow = slow + 1 if 2 * (hi - lo) > gap else 0


# A line through two traced peaks is flat when it rises, a batch, by less
# than this share of the larger peak over its batch (what a peak all made of
# activations would rise): the optimizer step, not the activations, sets the
# peak there (a ViT's allocated peak at batches 2, 4 and 8 within 1%: 1.7%),
# and the line points far past the edge; the search doubles instead. Lines
# through peaks the activations set rose by 19-60% on five models.
FLAT_RISE = 0.05


def _secant(peaks, lo, hi, limit):
    """The batch where the line through the allocated peaks of the two
    traced batches nearest the edge (``lo`` and ``hi`` when both are known,
    else the two largest or the two smallest traced) reaches ``limit`` less
    what the step needs above its allocated peak under a limit (its least
    limit less its allocated peak) at the largest batch known to fit, else
    the smallest known not to, rounded down; None when the line is flat
    (``FLAT_RISE``) or falls.

    The least limit, not the reserved peak: without a limit the allocator
    keeps freed blocks cached and a convolution takes its largest
    workspace, which a step near the limit does without (ResNet-50 under
    851 MiB: 94 MiB reserved above its allocated peak at batch 22, 25 MiB
    needed; the reserved peaks' line stopped at 20 and the search stepped up
    one batch at a time to 23). At the batch that fits, not the one that
    does not: past the edge the margin grows (the ViT at 32: 103 MiB, at 24:
    61 MiB), and taken there the line fell short of the edge step after
    step."""
    traced = sorted(peaks)
    if lo is not None and hi is not None:
        a, b = lo, hi
    elif lo is not None:
        a, b = traced[-2], traced[-1]
    else:
        a, b = traced[0], traced[1]
    (alloc_a, _), (alloc_b, _) = peaks[a], peaks[b]
    rise = alloc_b - alloc_a
    if rise * b <= FLAT_RISE * alloc_b * (b - a):
        return None
    near = lo if lo is not None else hi
    above = peaks[near][1] - peaks[near][0]
    return a + (limit - above - alloc_a) * (b - a) // rise
