"""Capture in the user's training process: record, step, stop.

::

    with memlens.record("runs/mem", every=100):
        for batch in loader:
            train_step(batch)
            memlens.step()

or ``memlens.start("runs/mem", every=100)`` ... ``memlens.stop()``.

What it does:

* turns on ``torch.cuda.memory._record_memory_history(enabled="all",
  context="alloc", stacks="python", max_entries=...)``: the stack of every
  allocation (not of every free: memlens names sites by where memory was
  allocated, and free stacks were 60% of a dump's frames), Python stacks only
  (C++ stacks make dumps slow) and a bounded ring buffer (see *max_entries*
  below); ``context="all"`` keeps free stacks too, but on torch 2.11 it
  breaks Hugging Face gradient checkpointing (the recomputation fails with
  ``SystemError: ... returned NULL without setting an exception``; measured,
  tests/gpu/RESULTS.md), which ``"alloc"`` does not; and, where torch has
  ``skip_actions``, without ``free_requested`` entries (torch writes one
  before every ``free_completed``: a third of the trace; memlens reads a
  free as its ``free_completed``; ``free_requested=True`` keeps them);
* every ``every`` calls of :func:`step` writes ``<dir>/snapshot.step{K}.pickle``
  (for ``memlens leaks`` across snapshots), and ``<dir>/snapshot.pickle`` at the
  end. A periodic snapshot holds the whole allocator state but only the trace
  since the previous one (the ring is cleared after each periodic dump, so a
  dump costs what ``every`` steps recorded, not the whole ring); the final and
  OOM snapshots hold at least the last ``steps_kept`` steps of trace, stitched
  from the periodic files and the ring; with torch.distributed initialised the rank is in the name
  (``snapshot.rank{R}.step{K}.pickle``). Given a file name ``run.pickle``
  instead of a directory, the names are ``run.step{K}.pickle`` and so on;
* at a CUDA out-of-memory error, writes ``snapshot.oom.pickle`` at that moment
  and prints memlens's explanation to stderr before the exception reaches the
  caller (the first three OOMs: ``oom``, ``oom2``, ``oom3``);
* after each step, watches the memory still allocated and warns once with
  :class:`LeakWarning`, naming the allocation sites, when it grows steadily
  (the rule is in ``memlens._leak``);
* publishes live figures for ``memlens top`` (the format is in ``memlens._live``).

*max_entries*: the trace ring buffer keeps the last ``max_entries`` allocator
events. Not given, memlens sizes it: 60,000 entries to begin with, then, after
step 2, from the events a step really makes (``torch.cuda.memory_stats()``'s
counters; each tensor allocation makes 2: alloc and free_completed, or 3
with free_requested): the largest step so far times 1.5 times the steps the ring
must hold, which are ``every`` (the steps from one periodic snapshot to the
next, since each dump empties it) or, without periodic snapshots,
``steps_kept``; within [10,000, 1,000,000], and sized again at every periodic
snapshot as steps grow. So a periodic snapshot's trace holds all the steps
since the one before. Where 1,000,000 is too few for them (a model making
~100,000 events a step at ``every=10``) memlens warns once with what the
trace will hold and the value to pass. Given by the caller, it is kept, with
a warning when it holds fewer than those steps. Every snapshot memlens writes
says how it was recorded under its ``"memlens"`` key (where its trace begins,
who sized the ring, whether the ring wrapped), for the analysis.

Without torch or CUDA, recording warns once (:class:`MemlensWarning`) and
:func:`step` and :func:`stop` do nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import json
import os
import pickle
import sys
import warnings
from typing import Any, Dict, List, Optional, Union

from . import _native
from ._diff import confirmed_leaks, without_trace
from ._leak import ALARM, BASELINE, MIDPOINT, LeakRule
from ._live import Publisher
from ._oom import explain_oom
from ._snapshot_file import STEP_MARKER, write_snapshot

MIB = 1024 * 1024
ENTRIES_PER_STEP = 10_000
MIN_ENTRIES = 10_000
MAX_ENTRIES = 1_000_000
MAX_OOM_SNAPSHOTS = 3
# The default ring is fitted to the model after this many steps (see Recorder._fit_ring).
FIT_AFTER_STEPS = 2
FIT_MARGIN = 1.5
# The key memlens adds to the snapshots it writes: how the recording was made
# (see Recorder._recording_info), for the analysis to tell a trace memlens cut
# on purpose from one that lost its start.
RECORDING_KEY = "memlens"
RECORDING_SCHEMA = "memlens-recording/1"


class MemlensWarning(UserWarning):
    """memlens could not do what was asked (no torch, no CUDA, a failed dump)."""


class LeakWarning(UserWarning):
    """The memory kept between training steps grows steadily: a likely leak."""


_current: Optional["Recorder"] = None
_observer_attached = False
_warned: set = set()


def _warn_once(key: str, message: str, category: type = MemlensWarning) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, category, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside memlens."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame = frame.f_back
        level += 1
    return level


def _cuda_torch() -> Optional[Any]:
    """torch, when it is installed and CUDA works; else None, after one warning."""
    try:
        import torch
    except ImportError:
        _warn_once(
            "no-torch",
            "memlens: torch is not installed, so GPU memory is not recorded "
            "(memlens.step() and memlens.stop() do nothing)",
        )
        return None
    cuda = getattr(torch, "cuda", None)
    try:
        ok = bool(cuda is not None and cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver reads as no CUDA
        ok = False
    if not ok:
        _warn_once(
            "no-cuda",
            "memlens: CUDA is not available, so GPU memory is not recorded "
            "(memlens.step() and memlens.stop() do nothing)",
        )
        return None
    return torch


def _rank(torch: Any) -> Optional[int]:
    """This process's rank when torch.distributed is initialised, else None."""
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001
        pass
    return None


def default_max_entries(steps_kept: int) -> int:
    """The ring buffer size memlens uses when none is given (see the module doc)."""
    return max(MIN_ENTRIES, min(MAX_ENTRIES, ENTRIES_PER_STEP * max(1, steps_kept)))


def layout(path_or_dir: Union[str, "os.PathLike[str]"]) -> "tuple[str, str]":
    """``(directory, prefix)`` of the snapshot names: a path ending in
    ``.pickle`` is a file name (its stem is the prefix), anything else a
    directory (prefix ``snapshot``)."""
    p = os.fspath(path_or_dir)
    if p.endswith(".pickle"):
        return (os.path.dirname(p) or ".", os.path.basename(p)[: -len(".pickle")])
    return (p, "snapshot")


def snapshot_name(directory: str, prefix: str, rank: Optional[int], kind: Optional[str]) -> str:
    """``<dir>/<prefix>[.rank{R}][.<kind>].pickle``; kind is ``step{K}``, ``oom`` or None (final)."""
    parts = [prefix]
    if rank is not None:
        parts.append(f"rank{rank}")
    if kind:
        parts.append(kind)
    return os.path.join(directory, ".".join(parts) + ".pickle")


@contextlib.contextmanager
def _gc_paused() -> Any:
    """Python's cyclic garbage collector off while a snapshot is built and
    pickled. torch's _snapshot() makes a few container objects per trace entry
    (hundreds of thousands for a full ring), which otherwise set off repeated
    collections over the training process's whole heap; measured on an H100
    with a 60,000-entry ring: 45-52 ms per _snapshot() with the collector
    paused, 56-57 ms with it running. Nothing here makes reference cycles, so
    pausing it leaks nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check_alloc_conf_applied(torch: Any) -> None:
    """Warns once when ``PYTORCH_CUDA_ALLOC_CONF`` is set in the environment
    but the allocator runs with none of it: PyTorch reads the variable once,
    when CUDA first allocates, so a script that sets ``os.environ`` after
    that changes nothing, silently. Taken from the allocator's own settings
    (a snapshot before recording starts holds no trace, so it is cheap)."""
    env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").strip()
    if not env:
        return
    try:
        with _gc_paused():
            settings = torch.cuda.memory._snapshot().get("allocator_settings")
    except Exception:  # noqa: BLE001 - a check, never a failure
        return
    if not isinstance(settings, dict) or str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "")).strip():
        return
    _warn_once(
        "alloc-conf",
        f"memlens: PYTORCH_CUDA_ALLOC_CONF is \"{env}\" in the environment, but the allocator runs "
        f"with none of it: PyTorch reads it once, when CUDA first allocates, so setting it later "
        f"changes nothing. Set it before the process starts (PYTORCH_CUDA_ALLOC_CONF={env} python "
        f"train.py) or at the top of the script, before anything touches the GPU",
    )


def _check_context_with_checkpointing(context: str, model: Any) -> None:
    """Warns once when free stacks (``context="all"``) are recorded for a
    Hugging Face model with gradient checkpointing on: on torch 2.11 the
    recomputation then fails (``SystemError: ... returned NULL without
    setting an exception``; measured, tests/gpu/RESULTS.md), while
    ``context="alloc"`` runs."""
    if context != "all" or model is None:
        return
    try:
        on = bool(getattr(model, "is_gradient_checkpointing", False))
    except Exception:  # noqa: BLE001 - a check, never a failure
        return
    if on:
        _warn_once(
            "context-checkpointing",
            "memlens: context=\"all\" records a stack at every free, and with gradient checkpointing "
            "on, PyTorch's recording of those stacks breaks the recomputation (torch 2.11: "
            "SystemError: ... returned NULL without setting an exception); record with the default "
            "context=\"alloc\", which names every allocation site the same way",
        )


def _trace_entries(torch: Any, devices: List[int], per_allocation: int = 3) -> int:
    """Allocator trace events so far, from the cumulative counters
    (*per_allocation* per allocation: alloc, free_requested, free_completed,
    or 2 when free_requested is not recorded; 1 per segment allocated or
    freed)."""
    total = 0
    for d in devices:
        s = torch.cuda.memory_stats(d)
        total += per_allocation * int(s.get("allocation.all.allocated", 0))
        total += int(s.get("segment.all.allocated", 0)) + int(s.get("segment.all.freed", 0))
    return total


class Recorder:
    """One recording session; see :func:`record` for the arguments."""

    def __init__(
        self,
        path_or_dir: Union[str, "os.PathLike[str]"],
        *,
        every: Optional[int] = None,
        max_entries: Optional[int] = None,
        steps_kept: int = 6,
        stacks: str = "python",
        context: str = "alloc",
        leak_check: bool = True,
        leak_warmup: int = 3,
        leak_steps: int = 5,
        leak_min_bytes: int = 8 * MIB,
        publish: bool = True,
        explain_oom: bool = True,
        model: Any = None,
        free_requested: bool = False,
    ) -> None:
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive integer, not {every!r}")
        if max_entries is not None and (not isinstance(max_entries, int) or max_entries < 1):
            raise ValueError(f"max_entries must be a positive integer, not {max_entries!r}")
        self.directory, self.prefix = layout(path_or_dir)
        self.every = every
        self.steps_kept = steps_kept
        self.max_entries = max_entries if max_entries is not None else default_max_entries(steps_kept)
        self.stacks = stacks
        self.context = context
        # PyTorch's free_requested events (a block freed by the program but
        # still in use by another stream) are left out of the trace unless
        # asked for: torch records one before every free_completed, so they
        # are a third of its entries and of what each dump converts, and no
        # memlens analysis needs them (a free is its free_completed).
        # Emptied at start when this torch has no skip_actions.
        self.skip_actions: List[str] = [] if free_requested else ["free_requested"]
        self.publish = publish
        self.explain_oom = explain_oom
        self._leak = LeakRule(leak_warmup, leak_steps, leak_min_bytes) if leak_check else None
        self.active = False
        self.steps = 0
        self.snapshots: List[str] = []
        self.leak_alarm: Optional[str] = None
        self.leak_sites: List[Dict[str, Any]] = []
        # What keeps the growing sites' memory alive, by site (memlens.why's
        # Holders), from the leak alarm; written beside every snapshot dumped
        # after it (HOLDERS_SUFFIX) for `memlens leaks`/`doctor`.
        self._holders: Dict[str, List[Any]] = {}
        self.ooms = 0
        self._torch: Any = None
        self._publisher: Optional[Publisher] = None
        self._leak_points: List[Any] = []
        self._baseline_step = 0
        self._entries = 0
        # The ring buffer is sized once the first steps are measured, unless
        # the caller chose max_entries (see _fit_ring).
        self._sized_by_user = max_entries is not None
        self._outside_at_start: Optional[int] = None
        self._fit_pending = max_entries is None
        # Trace entries counted when the ring was last emptied (at start, then
        # at each periodic dump): what the ring holds now is the difference.
        self._entries_at_clear = 0
        self._per_step_max = 0
        # torch's _snapshot() at the current step boundary, shared by the leak
        # watch and the periodic dump when both need one after the same step.
        self._step_snapshot: Optional[Dict[str, Any]] = None
        self._in_step = False
        # Periodic snapshots written since the ring was last cleared after
        # them, newest last, with the steps each one's trace covers and whether
        # its ring wrapped: the final and OOM snapshots stitch their traces in
        # front of the ring's (see _stitched). False once torch refuses
        # clear_history.
        self._chunks: List["tuple[str, int, bool]"] = []
        self._chunked = True
        self._steps_at_clear = 0
        # The model whose module instances are named in the snapshot (see
        # memlens._modules), and its hooks while recording.
        self.model = model
        self._module_scopes: Any = None

    # -- the public face --------------------------------------------------

    @property
    def leak_holders(self) -> Dict[str, List[str]]:
        """What keeps the growing sites' memory alive, by site: each holder's
        one-line text, as the leak alarm prints it."""
        return {site: [str(h) for h in hs] for site, hs in self._holders.items()}

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def snapshot_path(self, kind: Optional[str]) -> str:
        """Where the snapshot of ``kind`` (``step{K}``, ``oom``, None for the final one) goes."""
        rank = _rank(self._torch) if self._torch is not None else None
        return snapshot_name(self.directory, self.prefix, rank, kind)

    def start(self) -> "Recorder":
        """Turns recording on. Without torch or CUDA: one warning, and nothing is recorded."""
        global _current
        if self.active:
            return self
        if _current is not None and _current.active:
            raise RuntimeError("memlens is already recording; call memlens.stop() first")
        torch = _cuda_torch()
        if torch is None:
            return self
        os.makedirs(self.directory, exist_ok=True)
        init = getattr(torch.cuda, "init", None)
        if init is not None:
            init()  # the allocator must exist before observers attach; makes no context
        _check_alloc_conf_applied(torch)
        _check_context_with_checkpointing(self.context, self.model)
        # The CUDA context and the libraries loaded so far: what is outside
        # PyTorch before the run adds NCCL buffers, workspaces, graphs.
        self._outside_at_start = outside_pytorch(torch)
        self._torch = torch
        self._arm_history(self.max_entries)
        _attach_oom_observer(torch)
        self.active = True
        _current = self
        devices = self._devices()
        self._entries = self._trace_entries(devices)
        self._entries_at_clear = self._entries
        if self.model is not None:
            from ._modules import ModuleScopes

            try:
                self._module_scopes = ModuleScopes(torch, self.model)
            except Exception as e:  # noqa: BLE001 - recording goes on without module names
                _warn_once("module-scopes", f"memlens: modules are not named in the snapshot: {e!r}")
        if self.publish:
            self._publisher = Publisher(torch, self._devices)
            self._publisher.publish(step=None, rank=_rank(torch), leak_alarm=None, force=True)
        return self

    def step(self) -> None:
        """Marks the end of a training step (see the module doc). Never raises:
        a failure warns once and training goes on."""
        if not self.active:
            return
        self.steps += 1
        try:
            self._mark_step()
            self._after_step()
        except Exception as e:  # noqa: BLE001 - never break the user's training
            _warn_once("step-failed", f"memlens: step() failed and is skipped: {e!r}")


    def stop(self) -> Optional[str]:
        """Writes the final snapshot, turns recording off and removes the live
        files; returns the final snapshot's path (None when nothing was recorded)."""
        global _current
        if not self.active:
            return None
        path: Optional[str] = None
        try:
            path = self._dump(None)
        except Exception as e:  # noqa: BLE001
            _warn_once("final-dump", f"memlens: could not write the final snapshot: {e!r}")
        finally:
            self.active = False
            if _current is self:
                _current = None
            if self._module_scopes is not None:
                self._module_scopes.remove()
                self._module_scopes = None
            try:
                self._torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001
                pass
            if self._publisher is not None:
                self._publisher.remove()
            self._leak_points = []
        return path

    # -- the work ---------------------------------------------------------

    def _devices(self) -> List[int]:
        """Devices this process uses: the current one and any with reserved memory."""
        cuda = self._torch.cuda
        devices = {int(cuda.current_device())}
        for d in range(int(cuda.device_count())):
            if d not in devices and int(cuda.memory_reserved(d)) > 0:
                devices.add(d)
        return sorted(devices)

    def _mark_step(self) -> None:
        """Leaves a ``memlens.step N`` annotation in the snapshot (a record_function
        scope, which ``_record_memory_history`` keeps in ``external_annotations``
        with its time), so the analysis cuts steps where the user said, not at
        inner loops it has to guess from stacks."""
        rf = getattr(getattr(self._torch, "profiler", None), "record_function", None)
        if rf is None:
            return
        with rf(f"{STEP_MARKER} {self.steps}"):
            pass

    def _after_step(self) -> None:
        torch = self._torch
        devices = self._devices()
        self._step_snapshot, self._in_step = None, True
        try:
            if self._leak is not None and not self._leak.fired:
                allocated = sum(int(torch.cuda.memory_allocated(d)) for d in devices)
                self._watch_leak(self._leak.update(allocated))
            self._check_ring(devices)
            if self.every and self.steps % self.every == 0:
                self._dump(f"step{self.steps}")
        finally:
            self._step_snapshot, self._in_step = None, False
        if self._publisher is not None:
            self._publisher.publish(step=self.steps, rank=_rank(torch), leak_alarm=self.leak_alarm)

    def _snapshot(self) -> Dict[str, Any]:
        """torch's snapshot now, with the collector paused; at one step boundary
        taken once (nothing allocates between the leak watch and the dump)."""
        if self._in_step and self._step_snapshot is not None:
            return self._step_snapshot
        with _gc_paused():
            snapshot = self._torch.cuda.memory._snapshot()
        if self._in_step:
            self._step_snapshot = snapshot
        return snapshot

    def _dump(self, kind: Optional[str]) -> str:
        path = self.snapshot_path(kind)
        snapshot = self._snapshot()
        periodic = kind is not None and kind.startswith("step")
        entries = self._trace_entries(self._devices())
        info = self._recording_info(kind, entries)
        if periodic:
            # Clear the ring before writing: nothing allocates on this thread
            # in between, so no event is lost, and the next dump converts and
            # pickles only the steps since this one.
            cleared = self._clear_ring(entries)
        else:
            snapshot, info["trace_from_step"], wrapped = self._stitched(snapshot)
            info["ring_wrapped"] = info["ring_wrapped"] or wrapped
        # A new top-level dict: the leak watch may hold torch's at this step.
        snapshot = {**snapshot, RECORDING_KEY: info}
        # Written on the training thread: pickling on a thread of its own was
        # measured no faster (it holds the GIL the training thread needs;
        # BENCHMARKS.md, issue 35).
        with _gc_paused():
            write_snapshot(snapshot, path)
        if self._holders:
            write_holders(path, self.steps, self._holders)
        write_device(path, self._torch, self._outside_at_start)
        self.snapshots.append(path)
        if periodic and cleared:
            self._chunks.append((path, self.steps - self._steps_at_clear, bool(info["ring_wrapped"])))
            self._steps_at_clear = self.steps
            self._drop_old_chunks()
        return path

    def _recording_info(self, kind: Optional[str], entries: int) -> Dict[str, Any]:
        """How this snapshot was recorded, under RECORDING_KEY in it: where its
        trace begins (``trace_from_step``: the steps finished before it; 0 is
        where recording began), who sized the ring, and whether the ring
        wrapped since it was last emptied (then the trace lost its start).
        The analysis reads it to say the right thing about a trace that does
        not start at the allocator's birth: a periodic snapshot's begins at
        the one before by design, and raising max_entries would not change it."""
        events = entries - self._entries_at_clear
        periodic = kind is not None and kind.startswith("step")
        return {
            "schema": RECORDING_SCHEMA,
            "kind": "periodic" if periodic else ("oom" if kind else "final"),
            "step": self.steps,
            "trace_from_step": self._steps_at_clear,
            "every": self.every,
            "steps_kept": self.steps_kept,
            "max_entries": self.max_entries,
            "sized_by": "user" if self._sized_by_user else "memlens",
            "events_since_trace_start": events,
            "ring_wrapped": events > self.max_entries,
            # For the analysis to tell a setting that was never applied
            # (analysis::capture in Rust): the allocator reads it once.
            "alloc_conf_env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            # Trace actions torch was asked not to record ("free_requested"
            # by default): a free is then its free_completed alone.
            "skipped_actions": list(self.skip_actions),
        }

    def _arm_history(self, max_entries: int, clear_history: bool = False) -> None:
        """(Re-)arms torch's recording with this Recorder's settings. A torch
        without ``skip_actions`` records every action (and the Recorder then
        counts three entries an allocation); a TypeError about
        ``clear_history`` reaches the caller (see _clear_ring)."""
        kwargs: Dict[str, Any] = {
            "enabled": "all",
            "context": self.context,
            "stacks": self.stacks,
            "max_entries": max_entries,
        }
        if clear_history:
            kwargs["clear_history"] = True
        record = self._torch.cuda.memory._record_memory_history
        if self.skip_actions:
            try:
                record(**kwargs, skip_actions=self.skip_actions)
                return
            except TypeError:
                self.skip_actions = []
        record(**kwargs)

    def _trace_entries(self, devices: List[int]) -> int:
        """Trace entries torch has recorded so far (see the module function):
        two an allocation when free_requested is skipped."""
        per_allocation = 2 if "free_requested" in self.skip_actions else 3
        return _trace_entries(self._torch, devices, per_allocation)

    def _clear_ring(self, entries: int) -> bool:
        """Empties torch's trace ring (recording goes on with the same
        settings) and, when memlens sizes the ring, re-sizes it to the
        steps until the next dump (an empty ring can take any size). A dump
        converts every ring entry into Python objects and pickles it (~1.5 us
        an entry on an H100), so with ``every`` smaller than the ring's span
        each periodic dump would re-serialise the same steps again and again:
        at ``every=2`` that cost more than a whole step of a 100 ms/step
        model. False when this torch has no clear_history (then periodic
        snapshots hold the whole ring, as before)."""
        if not self._chunked:
            return False
        size = self.max_entries if self._sized_by_user or self._per_step_max == 0 else self._fitted_size()
        try:
            self._arm_history(size, clear_history=True)
        except TypeError:
            self._chunked = False
            self._chunks = []
            return False
        self.max_entries = size
        self._entries_at_clear = entries
        return True

    def _drop_old_chunks(self) -> None:
        """Keeps the fewest newest chunks that cover ``steps_kept`` steps."""
        covered, keep = 0, 0
        for _, steps, _ in reversed(self._chunks):
            if covered >= self.steps_kept:
                break
            covered += steps
            keep += 1
        del self._chunks[: len(self._chunks) - keep]

    def _stitched(self, snapshot: Dict[str, Any]) -> "tuple[Dict[str, Any], int, bool]":
        """``snapshot`` with the traces of the kept periodic snapshots in front
        of its own, so a final or OOM snapshot holds the last ``steps_kept``
        steps although the ring was cleared since; with the step its trace now
        begins after and whether a chunk's ring had wrapped. The chunks are
        read back from their files (keeping them in memory would hold hundreds
        of thousands of dicts for the whole run). A chunk that cannot be read
        ends the stitching there: what goes in front must be contiguous."""
        from_step = self._steps_at_clear
        if not self._chunks:
            return snapshot, from_step, False
        earlier: List[Dict[str, Any]] = []
        wrapped = False
        with _gc_paused():
            for path, steps, chunk_wrapped in reversed(self._chunks):
                try:
                    with open(path, "rb") as f:
                        earlier.append(pickle.load(f))
                except Exception:  # noqa: BLE001 - a deleted or damaged file: stop here
                    break
                from_step -= steps
                wrapped = wrapped or chunk_wrapped
        if not earlier:
            return snapshot, from_step, False
        earlier.reverse()
        out = dict(snapshot)
        traces = [list(t) for t in snapshot.get("device_traces") or []]
        for chunk in reversed(earlier):
            for d, trace in enumerate(chunk.get("device_traces") or []):
                while len(traces) <= d:
                    traces.append([])
                traces[d] = list(trace) + traces[d]
        out["device_traces"] = traces
        # Annotations (the step markers): the union, in time order, whether or
        # not this torch clears them with the trace.
        seen = set()
        notes = []
        for part in earlier + [snapshot]:
            for a in part.get("external_annotations") or []:
                key = (a.get("device"), a.get("stage"), a.get("name"), a.get("time_us"))
                if key not in seen:
                    seen.add(key)
                    notes.append(a)
        if notes:
            notes.sort(key=lambda a: a.get("time_us") or 0)
            out["external_annotations"] = notes
        return out, from_step, wrapped

    def _window_steps(self) -> int:
        """Steps of trace the ring must hold: with a periodic dump clearing it,
        those from one dump to the next; else the ``steps_kept`` (or
        ``every``) steps the snapshots promise."""
        if self.every and self._chunked:
            return self.every
        return max(self.steps_kept, self.every or 0)

    def _fitted_size(self) -> int:
        """The ring for :meth:`_window_steps` steps of the largest step seen,
        with FIT_MARGIN to spare, within [MIN_ENTRIES, MAX_ENTRIES]."""
        want = int(self._per_step_max * self._window_steps() * FIT_MARGIN)
        return max(MIN_ENTRIES, min(MAX_ENTRIES, want))

    def _check_ring(self, devices: List[int]) -> None:
        entries = self._trace_entries(devices)
        per_step, self._entries = entries - self._entries, entries
        self._per_step_max = max(self._per_step_max, per_step)
        if self._fit_pending and self.steps >= FIT_AFTER_STEPS:
            self._fit_ring(entries - self._entries_at_clear)
        window = self._window_steps()
        if self._sized_by_user:
            if per_step * window > self.max_entries:
                _warn_once(
                    "ring",
                    f"memlens: a step makes about {per_step:,} allocator trace entries, but the "
                    f"ring buffer keeps {self.max_entries:,} (about {self.max_entries // max(1, per_step)} "
                    f"steps), so snapshots miss the start of the {window} steps they should hold; "
                    f"pass max_entries={per_step * window:,} to keep {window} steps",
                )
        elif not self._fit_pending and per_step * window > MAX_ENTRIES:
            held = max(1, MAX_ENTRIES // max(1, per_step))
            _warn_once(
                "ring-capped",
                f"memlens: a step makes about {per_step:,} allocator trace entries, so {window} steps make "
                f"{per_step * window:,}; memlens keeps at most {MAX_ENTRIES:,} (each dump costs time in "
                f"proportion), so a snapshot's trace holds its last {held} steps (the allocator state is "
                f"whole); pass max_entries={int(per_step * window * FIT_MARGIN):,} to keep all {window}",
            )

    def _fit_ring(self, recorded: int) -> None:
        """Sizes the default ring buffer to what this model needs, once, after
        FIT_AFTER_STEPS steps: :meth:`_window_steps` times the largest step so
        far, with FIT_MARGIN to spare (:meth:`_fitted_size`). Periodic dumps
        re-size it again at each clear (:meth:`_clear_ring`), as steps grow.

        Every snapshot converts the whole ring into Python objects and pickles
        it, so its cost grows with the ring, not with the steps wanted: on an
        H100, 60,000 entries cost ~95 ms a dump (~0.8 us an entry in
        _snapshot(), ~0.65 us in pickle). Too small a ring is worse: a
        periodic snapshot then lacks the first of the steps it should hold
        (``every=10`` kept 9 of 10 when the ring was sized for ``steps_kept``
        alone). Re-arming the history with another max_entries keeps the
        order of the ring only while it has not wrapped (torch appends until
        it holds max_entries, then overwrites in a circle), so it is done only
        when fewer entries than both sizes were recorded since the last clear.
        """
        self._fit_pending = False
        want = self._fitted_size()
        if want == self.max_entries or recorded >= min(want, self.max_entries):
            return
        self._arm_history(want)
        self.max_entries = want

    def _watch_leak(self, event: Optional[str]) -> None:
        if event == BASELINE:
            self._leak_points = [(self.steps, without_trace(self._snapshot()))]
            self._baseline_step = self.steps
        elif event == MIDPOINT and self._leak_points:
            self._leak_points.append((self.steps, without_trace(self._snapshot())))
        elif event == ALARM:
            rule = self._leak
            assert rule is not None
            points = self._leak_points + [(self.steps, without_trace(self._snapshot()))]
            self._leak_points = []
            sites = confirmed_leaks(points)
            if not sites:
                # The total grew, but no site kept growing: allocator noise or
                # a tensor replaced by a larger one. Not a leak; watch again.
                rule.dismiss()
                return
            self.leak_sites = sites
            self.leak_alarm = leak_alarm_line(rule, sites)
            self._holders = holders_of_sites(sites[:LEAK_HOLDER_SITES])
            warnings.warn(
                leak_message(rule, sites, self.steps, self._baseline_step, self.leak_holders),
                LeakWarning,
                stacklevel=_user_stacklevel(),
            )

    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        self.ooms += 1
        if self.ooms > MAX_OOM_SNAPSHOTS:
            if self.ooms == MAX_OOM_SNAPSHOTS + 1:
                print(
                    f"memlens: more CUDA out-of-memory errors; only the first {MAX_OOM_SNAPSHOTS} are recorded",
                    file=sys.stderr,
                )
            return
        kind = "oom" if self.ooms == 1 else f"oom{self.ooms}"
        path = self._dump(kind)
        lines = [
            f"memlens: CUDA out of memory on device {device}: {_native.format_bytes(int(alloc))} "
            f"requested, {_native.format_bytes(int(device_free))} free on the device; "
            f"snapshot written to {path}",
        ]
        if self.explain_oom:
            lines.append(explain_oom(path))
        sys.stdout.flush()
        print("\n".join(lines), file=sys.stderr, flush=True)


def leak_alarm_line(rule: LeakRule, sites: List[Dict[str, Any]]) -> str:
    """The one-line alarm published for ``memlens top``."""
    fb = _native.format_bytes
    line = f"+{fb(rule.per_step())}/step over {rule.span()} steps"
    if sites:
        line += f", top site {_where(sites[0])}"
    return line


def _where(row: Dict[str, Any]) -> str:
    """A site as the CLI shows it (``caller -> file:line in function``): the
    row's own ``display`` when Rust gave one, else Rust's rule applied to the
    row's ``site``, ``function`` and ``path``."""
    shown = row.get("display")
    if shown:
        return str(shown)
    return _native.site_display(
        str(row.get("site", "?")),
        str(row.get("function") or ""),
        [str(p) for p in row.get("path") or []],
    )


#: The growing sites (largest first) whose holders the alarm looks for.
LEAK_HOLDER_SITES = 2


def holders_of_sites(sites: List[Dict[str, Any]]) -> Dict[str, List[Any]]:
    """What keeps each site's memory alive, by site, as :func:`memlens.why`
    names it (a module attribute, a global, a local, a closure, an autograd
    graph...): its :class:`memlens.Holder` objects, largest first, at most
    three a site. The search reads only live objects, keeps nothing alive and
    takes well under a second on a million objects; a search that fails (no
    allocator history, an unusual object) costs the alarm only its holder
    line, never the training run."""
    from ._why import why

    found: Dict[str, List[Any]] = {}
    for row in sites:
        site = str(row.get("site", ""))
        if not site or site.startswith("<"):
            continue  # a pseudo-site (<backward pass>): no line to search from
        try:
            holders = why(site=site)[:3]
        except Exception:  # noqa: BLE001 - the alarm must not break a run
            continue
        if holders:
            found[site] = holders
    return found


#: The holders file beside a snapshot: ``<snapshot><HOLDERS_SUFFIX>``, read by
#: ``memlens leaks``, ``doctor`` and the report (``memlens::holders`` in Rust).
HOLDERS_SUFFIX = ".holders.json"

#: Its format tag; the Rust reader refuses any other.
HOLDERS_FORMAT = "memlens-holders/1"


def write_holders(snapshot_path: str, step: int, holders: Dict[str, List[Any]]) -> str:
    """Writes what holds each site (:class:`memlens.Holder` lists by
    ``file:line`` site) beside the snapshot at ``snapshot_path``; returns the
    file's path. A write that fails (a full disk) warns and costs only the
    holders file."""
    sites = {site: [h.to_dict() for h in hs] for site, hs in holders.items()}
    doc = {"format": HOLDERS_FORMAT, "step": int(step), "sites": sites}
    return _write_beside(snapshot_path, HOLDERS_SUFFIX, doc, "the leak holders")


#: The file beside each snapshot with the device's figures at the dump.
DEVICE_SUFFIX = ".device.json"
DEVICE_FORMAT = "memlens-device/1"


def device_figures(torch: Any) -> List[Dict[str, Any]]:
    """The current GPU at this moment: its total memory, the per-process
    fraction in force (``set_per_process_memory_fraction``) and its free
    memory, none of which a snapshot stores. Only the current device: asking
    another for its free memory would make a CUDA context on it. Empty when
    torch cannot tell."""
    cuda = torch.cuda
    try:
        d = int(cuda.current_device())
        props = cuda.get_device_properties(d)
        row: Dict[str, Any] = {"device": d, "total_memory": int(props.total_memory)}
    except Exception:
        return []
    # How reduction kernels split their sums (their staging buffers, which
    # `memlens fit` computes at other batch sizes).
    for key, attr in (("multiprocessors", "multi_processor_count"),
                      ("threads_per_multiprocessor", "max_threads_per_multi_processor")):
        value = getattr(props, attr, None)
        if isinstance(value, int) and value > 0:
            row[key] = value
    fraction = getattr(cuda, "get_per_process_memory_fraction", None) or getattr(
        getattr(cuda, "memory", None), "get_per_process_memory_fraction", None
    )
    if fraction is not None:
        try:
            row["memory_fraction"] = float(fraction(d))
        except Exception:
            pass
    try:
        row["free_memory"] = int(cuda.mem_get_info(d)[0])
        row["reserved_memory"] = int(cuda.memory_reserved(d))
    except Exception:
        pass
    row.update(_nvml_figures(cuda, d))
    return [row]


def outside_pytorch(torch: Any) -> Optional[int]:
    """This process's memory on the current GPU outside PyTorch's allocator
    now (NVML's figure for the process less ``memory_reserved``); None when
    NVML does not list the process (no CUDA context yet, or a container that
    hides pids)."""
    rows = device_figures(torch)
    if not rows or "process_used_memory" not in rows[0] or "reserved_memory" not in rows[0]:
        return None
    return max(0, int(rows[0]["process_used_memory"]) - int(rows[0]["reserved_memory"]))


class _NvmlProcess(ctypes.Structure):
    """nvmlProcessInfo_t (the v2 layout that the _v3 query fills)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _NvmlMemory(ctypes.Structure):
    """nvmlMemory_t."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _NvmlMemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t: its ``used`` leaves out what the driver reserves (as
    nvidia-smi shows it), which ``reserved`` gives apart."""

    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _nvml_memory(lib: Any, handle: Any) -> Dict[str, int]:
    """The device's total and used memory as nvidia-smi shows them, and the
    driver's reserve where NVML's v2 query gives it (v1's ``used`` counts it)."""
    v2 = _NvmlMemoryV2(version=ctypes.sizeof(_NvmlMemoryV2) | (2 << 24))
    query = getattr(lib, "nvmlDeviceGetMemoryInfo_v2", None)
    if query is not None and query(handle, ctypes.byref(v2)) == 0:
        return {"nvml_total_memory": int(v2.total), "nvml_used_memory": int(v2.used),
                "nvml_reserved_memory": int(v2.reserved)}
    mem = _NvmlMemory()
    if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0:
        return {"nvml_total_memory": int(mem.total), "nvml_used_memory": int(mem.used)}
    return {}


_NVML: List[Any] = []  # [library] once loaded and initialised, [None] when it cannot be


def _nvml() -> Any:
    if not _NVML:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            _NVML.append(lib if lib.nvmlInit_v2() == 0 else None)
        except (OSError, AttributeError):
            _NVML.append(None)
    return _NVML[0]


def _nvml_figures(cuda: Any, d: int) -> Dict[str, int]:
    """What nvidia-smi sees of device ``d`` (found by its UUID, whatever
    CUDA_VISIBLE_DEVICES renumbered): its total and used memory, this
    process's memory on it and the other processes' (when NVML lists this
    process by its pid; not inside some containers). Empty without NVML."""
    lib = _nvml()
    if lib is None:
        return {}
    try:
        uuid = str(cuda.get_device_properties(d).uuid)
        uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0:
            return {}
        out: Dict[str, int] = _nvml_memory(lib, handle)
        count = ctypes.c_uint(256)
        procs = (_NvmlProcess * 256)()
        if lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), procs) == 0:
            rows = [(procs[i].pid, int(procs[i].usedGpuMemory)) for i in range(min(count.value, 256))]
            mine = [used for pid, used in rows if pid == os.getpid()]
            if mine:
                out["process_used_memory"] = mine[0]
                out["other_processes_memory"] = sum(used for pid, used in rows if pid != os.getpid())
        return out
    except Exception:
        return {}


def write_device(snapshot_path: str, torch: Any, outside_at_start: Optional[int] = None) -> Optional[str]:
    """Writes the device's figures (:func:`device_figures`) beside the
    snapshot at ``snapshot_path``, for the what-ifs to run under the cap and
    the total the run had, and for ``doctor`` to account for nvidia-smi's
    figure; ``outside_at_start`` (:func:`outside_pytorch`, when recording
    began) splits what is outside PyTorch into the CUDA context and what came
    since. The file's path, or None when torch could not tell them."""
    devices = device_figures(torch)
    if not devices:
        return None
    if outside_at_start is not None:
        devices[0]["outside_pytorch_at_start"] = int(outside_at_start)
    doc = {"format": DEVICE_FORMAT, "devices": devices}
    return _write_beside(snapshot_path, DEVICE_SUFFIX, doc, "the device's figures")


def _write_beside(snapshot_path: str, suffix: str, doc: Dict[str, Any], what: str) -> str:
    """Writes ``doc`` as JSON to ``snapshot_path + suffix`` through a
    temporary file, so a reader never sees half of it. A failed write (a full
    disk) warns once and costs only that file."""
    path = snapshot_path + suffix
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        _warn_once(f"write{suffix}", f"memlens: {what} were not written beside {snapshot_path}: {e}")
    return path


def leak_message(
    rule: LeakRule,
    sites: List[Dict[str, Any]],
    step: int,
    since: int,
    holders: Optional[Dict[str, List[str]]] = None,
) -> str:
    """The text of the :class:`LeakWarning`; ``holders`` (by site, from
    :func:`holders_of_sites`) adds what keeps each site's memory alive."""
    fb = _native.format_bytes
    span, rises = rule.span(), rule.rises
    steady = rises == span
    how = f"in each of the last {span} steps" if steady else f"in {rises} of the last {span} steps and never fell back"
    text = (
        f"memlens: possible GPU memory leak: the memory still allocated after each step grew "
        f"{how} (+{fb(rule.growth())}, +{fb(rule.per_step())} a step{'' if steady else ' on average'}; "
        f"{fb(rule.history[-1])} after step {step})."
    )
    if sites:
        text += f"\nGrowing since step {since}, by allocation site (as `memlens leaks` judges it):"
        for row in sites[:5]:
            per = int(row.get("bytes_per_step", 0))
            rate = f" (+{fb(per)}/step)" if per else ""
            text += f"\n  +{fb(int(row.get('bytes', 0)))}{rate}  {int(row.get('count', 0))} blocks  {_where(row)}"
            for held in (holders or {}).get(str(row.get("site", "")), []):
                text += f"\n      held by {held}"
    else:
        text += "\n(no allocation site could be named: record with context='alloc' or 'all')"
    return text


def _attach_oom_observer(torch: Any) -> None:
    """Attaches memlens's OOM observer once per process (PyTorch has no detach);
    it acts only while a recorder is active."""
    global _observer_attached
    if _observer_attached:
        return
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        _warn_once("no-oom-observer", "memlens: this torch cannot report OOMs to memlens; OOM snapshots are off")
        return
    attach(_oom_observer)
    _observer_attached = True


def _oom_observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    # Called by the caching allocator at the OOM, before the exception is
    # thrown, with the allocator's lock released. It must never raise.
    rec = _current
    if rec is None or not rec.active:
        return
    try:
        rec._on_oom(device, alloc, device_allocated, device_free)
    except Exception as e:  # noqa: BLE001
        print(f"memlens: could not record the CUDA out-of-memory error: {e!r}", file=sys.stderr)


def record(path_or_dir: Union[str, "os.PathLike[str]"] = "memlens-snapshots", **options: Any) -> Recorder:
    """A :class:`Recorder`, to use as a context manager (``with memlens.record(d):``)
    or to ``.start()``.

    ``path_or_dir``: a directory (snapshots ``snapshot.*.pickle`` in it) or a
    file name ending in ``.pickle``. Options: ``every`` (write a snapshot
    every N steps), ``max_entries`` (ring buffer size; default from
    ``steps_kept``, see the module doc), ``stacks`` ("python" or "all"),
    ``leak_check``/``leak_warmup``/``leak_steps``/``leak_min_bytes`` (the leak
    rule), ``publish`` (live figures for ``memlens top``), ``explain_oom``,
    ``model`` (an ``nn.Module``: its module instances are named in the
    snapshot, for ``memlens peak --by module``; see ``memlens._modules``),
    ``free_requested`` (False by default: the trace leaves out torch's
    free_requested entries, a third of all entries, which makes every dump
    cheaper; pass True to keep them, e.g. for memory_viz's "Allocator State
    History", which otherwise draws every block freed later in the trace as
    waiting on another stream).
    """
    return Recorder(path_or_dir, **options)


def start(path_or_dir: Union[str, "os.PathLike[str]"] = "memlens-snapshots", **options: Any) -> Recorder:
    """Starts recording (``record(...).start()``); returns the recorder."""
    return Recorder(path_or_dir, **options).start()


def step() -> None:
    """Marks the end of a training step; does nothing when not recording."""
    rec = _current
    if rec is not None:
        rec.step()


def stop() -> Optional[str]:
    """Stops recording; returns the final snapshot's path, or None when not recording."""
    rec = _current
    if rec is None:
        return None
    return rec.stop()


def current() -> Optional[Recorder]:
    """The active recorder, if any."""
    return _current


def _remove_live_files_at_exit() -> None:
    rec = _current
    if rec is not None and rec._publisher is not None:
        rec._publisher.remove()


atexit.register(_remove_live_files_at_exit)
