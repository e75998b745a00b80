"""``memlens.trace_step``: a training step traced with fake tensors, with no
GPU memory used, written as the snapshot PyTorch's own recorder would have
written (a trace of every CUDA allocation and free, in order, each with the
Python stack that made it; no segments), for ``memlens fit`` to replay through
its allocator model.

The step runs for real, on PyTorch's ``FakeTensorMode``: every operator runs
its shape function, autograd saves and frees what it would, the optimizer
makes its state, autocast casts; only no data is computed and no memory is
taken. A dispatch mode over it sees every tensor an operator returns; a new
storage on a CUDA device is an allocation (rounded up to 512 bytes, as the
caching allocator does), and a weak reference on it tells when it dies (a
storage's Python object lives exactly as long as the storage). What no
operator returns is not seen: a kernel's own scratch memory and memory
outside PyTorch. Three kinds of scratch are added as PyTorch makes them:
cuBLAS's workspace, which PyTorch allocates through its allocator once per
thread and stream and keeps, at the first matrix product on each thread
(``workspace_bytes``); the staging buffer of a ``sum`` or ``mean`` split
across thread blocks (a bias's gradient), allocated and freed around its
kernel (``_reduce_scratch``); and cuDNN's convolution workspaces, measured
by running each convolution once per layout on the visible GPU
(``_kernel_scratch``). Not added: the fused attention kernels' workspaces.

A value the program reads back from the GPU (``.item()``, ``bool(t)``) has no
data here: a test is taken as False, a number as 1, each counted in the
trace's ``memlens.unknown_values``; an operator whose output size depends
on the data (``nonzero``, ``masked_select``) cannot be traced and raises.
Each allocation's stack starts with the operator that made it
(``aten::mm.default``), as a recording's C++ frames would.
"""

import contextlib
import itertools
import os
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional

from ._fake_ddp import one_rank
from ._kernel_scratch import CUDNN_WORKSPACE_FRAME, MEASURED_OPS, KernelScratch
from ._reduce_scratch import reduction_scratch
from ._snapshot_file import STEP_MARKER, write_snapshot

# The caching allocator rounds every request up to a multiple of 512 bytes
# (kMinBlockSize) and makes no allocation for zero bytes.
_BLOCK = 512
# cuBLAS's workspace per thread and stream, which PyTorch asks of its
# allocator and keeps: 32 MiB on an H100, measured on the forward's thread
# and on autograd's (tests/gpu/fake_step.py calib, tests/gpu/RESULTS.md);
# 4 MiB before Hopper, NVIDIA's recommendation (not measured here).
HOPPER_WORKSPACE = 32 << 20
OLDER_WORKSPACE = 4 << 20
# Operators that run on cuBLAS, and so make its workspace on first use.
_CUBLAS_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm", "addmv", "mv", "_addmm_activation")
# cuBLASLt's own workspace (getCUDABlasLtWorkspace), made once at the first
# product it runs (a matrix product with a bias): 1 MiB, seen in a ViT's
# recording on an H100 (tests/corpus/fit/vit.b16).
CUBLASLT_WORKSPACE = 1 << 20
_CUBLASLT_OPS = ("addmm", "_addmm_activation")
# Recorded as PyTorch records it: this key in the snapshot says how it was made.
TRACE_KEY = "memlens"
TRACE_SCHEMA = "memlens-fake-trace/1"
# Checked on an H200 with CUDA_VISIBLE_DEVICES="" (torch 2.11) and on a
# machine with no GPU (torch 2.15): fake tensors stand in for 8 CUDA
# devices, and the engine asks the real CUDA runtime, which has none, about
# each (tests/gpu/RESULTS.md, twenty-third session).
NO_GPU = (
    "memlens.trace_step needs a CUDA GPU visible to PyTorch (none of the step's memory is put on it): with "
    "none, PyTorch's autograd engine asks the CUDA runtime for device 0's context in the backward pass "
    "(torch 2.11-2.15: \"hasPrimaryContext expects a valid device index\") and torch.autocast(\"cuda\") "
    "turns itself off"
)
_THIS_FILE = os.path.normcase(os.path.abspath(__file__))
_MAX_FRAMES = 48


def _rounded(nbytes: int) -> int:
    return (nbytes + _BLOCK - 1) // _BLOCK * _BLOCK


class _Events:
    """The trace being written: entries as ``torch.cuda.memory._snapshot()``
    gives them (``device_traces[0]``), the step annotations, and the live
    bytes with their peak (the step's ``max_memory_allocated()``)."""

    def __init__(self) -> None:
        self.entries: List[Dict[str, Any]] = []
        self.annotations: List[Dict[str, Any]] = []
        self.live: Dict[int, tuple] = {}
        self.allocated = 0
        self.peak = 0
        self.window_peak = 0
        self.unknown_values = 0
        self.closed = False
        self._clock = itertools.count(1)
        self._next_addr = 0x7F0000000000
        # Reentrant: Python's collector may free a storage (and so call
        # free) while alloc holds the lock, on the same thread.
        self._lock = threading.RLock()

    def now(self) -> int:
        return next(self._clock)

    def alloc(self, key: int, nbytes: int, frames: List[Dict[str, Any]]) -> None:
        size = _rounded(nbytes)
        with self._lock:
            if self.closed:
                return
            # Addresses never reused, so each free names its allocation
            # alone; where blocks lie is the allocator model's to decide.
            addr, self._next_addr = self._next_addr, self._next_addr + size
            self.live[key] = (addr, size)
            self.allocated += size
            self.peak = max(self.peak, self.allocated)
            self.window_peak = max(self.window_peak, self.allocated)
            self.entries.append(
                {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": self.now(), "frames": frames}
            )

    def free(self, key: int) -> None:
        with self._lock:
            got = None if self.closed else self.live.pop(key, None)
            if got is None:
                return
            addr, size = got
            self.allocated -= size
            for action in ("free_requested", "free_completed"):
                self.entries.append(
                    {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.now(), "frames": []}
                )

    def annotate(self, name: str, stage: str) -> None:
        with self._lock:
            self.annotations.append({"device": 0, "stage": stage, "name": name, "time_us": self.now()})


def _python_frames() -> List[Dict[str, Any]]:
    """The Python stack here, innermost first, without this module's frames
    and PyTorch's dispatch machinery between the operator and the caller."""
    out: List[Dict[str, Any]] = []
    f = sys._getframe(1)
    while f is not None and len(out) < _MAX_FRAMES:
        code = f.f_code
        name = code.co_filename
        if os.path.normcase(name) != _THIS_FILE and "_subclasses" not in name and "_python_dispatch" not in name:
            out.append({"filename": name, "line": f.f_lineno, "name": code.co_name})
        f = f.f_back
    return out


def _tracer_mode(torch: Any, events: _Events, workspace_bytes: int, gpu: "tuple[int, int]",
                 kernel_scratch: Optional[KernelScratch]) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    local_scalar = torch.ops.aten._local_scalar_dense.default
    workspaces: Dict[Any, int] = {}
    reductions = _reductions(torch)
    grouped_mm = getattr(torch.ops.aten, "_grouped_mm", None)
    grouped_mm = grouped_mm.default if grouped_mm is not None else None
    scratch_keys = itertools.count(1 << 62)

    def workspace(key: Any, nbytes: int, frames: List[Dict[str, Any]]) -> None:
        # Made once and kept, as PyTorch keeps them; keys below zero never
        # meet a storage's.
        if key not in workspaces:
            workspaces[key] = -1 - len(workspaces)
            events.alloc(workspaces[key], nbytes, frames)

    class StepTracer(TorchDispatchMode):
        """Notes every new CUDA storage an operator returns, and its death."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is local_scalar:
                return unknown_value(args[0])
            op = func.__name__.split(".")[0]
            if workspace_bytes and op in _CUBLAS_OPS:
                frames = _op_frames(func)
                workspace(("cublas", threading.get_ident()), workspace_bytes, frames)
                if op in _CUBLASLT_OPS:
                    workspace("cublaslt", CUBLASLT_WORKSPACE, frames)
            pattern = None
            if kernel_scratch is not None and op in MEASURED_OPS:
                pattern = kernel_scratch.pattern(func, args, kwargs or {})
            try:
                out = func(*args, **(kwargs or {}))
            except RuntimeError:
                if func is not grouped_mm:
                    raise
                out = grouped_mm_in_fp32(args, kwargs or {})
            frames = None
            if pattern is not None:
                frames = _op_frames(func)
                measured_call(pattern, out, frames)
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                    if frames is None:
                        frames = _op_frames(func)
                    note_storage(t, frames)
            reduced = reductions.get(func)
            # A measured call's own reductions (a convolution's bias) are in
            # its pattern already.
            if reduced is not None and pattern is None:
                scratch(func, *reduced(args, kwargs or {}))
            return out

    def measured_call(pattern: List[Any], out: Any, frames: List[Dict[str, Any]]) -> None:
        """The call as the GPU made it (``_kernel_scratch.call_pattern``):
        each output the real call allocated is the fake output of its size
        (in order), each scratch block allocated and freed where it was."""
        pending = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type == "cuda"]
        # cuDNN's workspace, named as a recording's C++ frames name it.
        workspace_frames = [{"filename": "??", "line": 0, "name": CUDNN_WORKSPACE_FRAME}] + frames
        keys: Dict[int, int] = {}
        for step in pattern:
            if step[0] == "output":
                for i, t in enumerate(pending):
                    if _rounded(t.untyped_storage().nbytes()) == step[1]:
                        note_storage(pending.pop(i), frames)
                        break
            elif step[0] == "alloc":
                keys[step[1]] = next(scratch_keys)
                events.alloc(keys[step[1]], step[2], workspace_frames if step[3] else frames)
            else:
                events.free(keys.pop(step[1]))

    def scratch(func: Any, t: Any, dims: Any) -> None:
        """The staging buffer and semaphores the reduction kernel asks of
        the allocator for a sum of ``t`` over ``dims`` (all when empty),
        freed when it is launched (semaphores first, as C++ destroys them)."""
        if t is None or not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            return
        if t.dtype.is_complex:
            return
        acc = 8 if t.dtype == torch.float64 or not t.dtype.is_floating_point else 4
        dims = list(range(t.dim())) if not dims else [int(d) for d in dims]
        sizes = reduction_scratch(tuple(t.shape), tuple(t.stride()), dims, t.element_size(), acc, *gpu)
        if sizes[0] <= 0:
            return
        frames = _op_frames(func)
        keys = [next(scratch_keys) for _ in sizes]
        for key, nbytes in zip(keys, sizes):
            events.alloc(key, nbytes, frames)
        for key in reversed(keys):
            events.free(key)

    def grouped_mm_in_fp32(args: Any, kwargs: Dict[str, Any]) -> Any:
        """``_grouped_mm`` of fp32 matrices (a mixture of experts' layers,
        Mixtral's in transformers), which the GPU runs and PyTorch's fake
        kernel refuses ("Expected inputs of BF16 type"): the output's shape
        from the bf16 product of the same shapes, made in the inputs' dtype.
        Nothing made here is seen by the tracer (the mode is off inside its
        own handler) but the output, noted as every operator's is."""
        def bf16(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
                return x.to(torch.bfloat16)
            return x

        proxy = grouped_mm(*[bf16(a) for a in args], **{k: bf16(v) for k, v in kwargs.items()})
        dtype = kwargs.get("out_dtype") or args[0].dtype
        return torch.empty(proxy.shape, dtype=dtype, device=args[0].device)

    def unknown_value(t: Any) -> Any:
        """A value read back from a tensor (``.item()``, ``bool(t)``): none
        here. A test is taken as False: "skip this layer" (LayerDrop's
        ``rand() < p``), "a NaN was seen" and "the mask has holes" are all
        False in a healthy step, and a guessed True skipped every layer of
        an OPT model. A number is taken as 1. Each guess from a GPU tensor
        is counted (a CPU one, such as the optimizer's step count, sizes
        nothing on the GPU)."""
        dtype = t.dtype
        if t.device.type == "cuda":
            events.unknown_values += 1
        if dtype == torch.bool:
            return False
        return 1.0 if dtype.is_floating_point else 1

    def note_storage(t: Any, frames: List[Dict[str, Any]]) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in events.live:
            return
        nbytes = storage.nbytes()
        if nbytes <= 0:
            return
        events.alloc(key, nbytes, frames)
        weakref.finalize(storage, events.free, key).atexit = False

    return StepTracer()


def _reductions(torch: Any) -> Dict[Any, Any]:
    """The operators that run PyTorch's CUDA reduction kernel, each with how
    to read (tensor reduced, dimensions reduced) from its arguments."""
    aten = torch.ops.aten

    def dim_arg(args: Any, kwargs: Dict[str, Any]) -> Any:
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        return (args[0], [dims] if isinstance(dims, int) else (dims or []))

    def conv_bias(args: Any, kwargs: Dict[str, Any]) -> Any:
        # convolution_backward sums grad_output over every dimension but
        # the channels for the bias's gradient, when asked for it.
        mask = args[10] if len(args) > 10 else kwargs.get("output_mask")
        grad = args[0]
        if not mask or not mask[2] or not isinstance(grad, torch.Tensor):
            return (None, [])
        return (grad, [d for d in range(grad.dim()) if d != 1])

    table = {
        aten.sum.dim_IntList: dim_arg,
        aten.mean.dim: dim_arg,
        aten.sum.default: lambda args, kwargs: (args[0], []),
        aten.mean.default: lambda args, kwargs: (args[0], []),
        aten.convolution_backward.default: conv_bias,
    }
    return table


def _op_frames(func: Any) -> List[Dict[str, Any]]:
    """The operator, as a C++ frame of a recording with ``stacks="all"``
    would name it, over the Python stack."""
    return [{"filename": "??", "line": 0, "name": f"aten::{func.__name__}"}] + _python_frames()


def _autocast(torch: Any, precision: Optional[str]) -> Any:
    if precision in (None, "fp32", "float32"):
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}.get(
        precision
    )
    if dtype is None:
        raise ValueError(f"precision must be fp32, bf16 or fp16, not {precision!r}")
    return torch.autocast("cuda", dtype=dtype)


def gpu_shape(torch: Any) -> "tuple[int, int]":
    """(multiprocessors, threads per multiprocessor) of this machine's first
    GPU, which size a reduction's staging buffer (tracing needs a GPU
    visible: ``trace_step`` says so before it asks)."""
    props = torch.cuda.get_device_properties(0)
    return (int(props.multi_processor_count), int(props.max_threads_per_multi_processor))


def default_workspace_bytes(torch: Any) -> int:
    """cuBLAS's workspace on this machine's first GPU (Hopper's or older)."""
    major, _ = torch.cuda.get_device_capability(0)
    return HOPPER_WORKSPACE if major >= 9 else OLDER_WORKSPACE


class Trace:
    """A traced step: ``snapshot`` (the dict ``_snapshot()`` would return),
    ``peak_allocated_bytes`` (``max_memory_allocated()`` over the build and
    the steps, by the trace's own count), ``step_peaks`` (each step's) and
    ``unknown_values`` (values read back from the GPU, taken as 1)."""

    def __init__(self, snapshot: Dict[str, Any], peak: int, step_peaks: List[int], unknown: int) -> None:
        self.snapshot = snapshot
        self.peak_allocated_bytes = peak
        self.step_peaks = step_peaks
        self.unknown_values = unknown

    def save(self, path: "str | os.PathLike[str]") -> str:
        """Writes the snapshot as ``torch.cuda.memory._dump_snapshot`` would."""
        path = os.fspath(path)
        write_snapshot(self.snapshot, path)
        return path


def trace_step(
    build: Callable[[], Any],
    step: Callable[[Any], Any],
    *,
    steps: int = 2,
    precision: Optional[str] = None,
    workspace_bytes: Optional[int] = None,
    world_size: Optional[int] = None,
    measure_scratch: bool = True,
) -> Trace:
    """Runs ``build()`` and then ``step(built)`` ``steps`` times under fake
    tensors, and returns the :class:`Trace` of every CUDA allocation they
    made. ``build`` makes the model, its optimizer and its batch on a CUDA
    device (``torch.device("cuda:0")``; nothing is allocated); ``step`` runs
    one training step (forward, backward, optimizer step). The default two
    steps include the optimizer state the first step makes. ``precision``
    (``"bf16"``, ``"fp16"``) runs each step under ``torch.autocast``.
    ``workspace_bytes``: cuBLAS's workspace per thread (default: this GPU's).
    ``world_size``: the step is one rank of a DistributedDataParallel job
    of that many (the model wrapped in ``DistributedDataParallel`` in
    ``build``): PyTorch's fake process group is started as rank 0 when none
    is running, and DDP's gradient buckets are traced (``_fake_ddp``: what
    stands in for the communication, and a comm hook of the step's not run).
    ``measure_scratch``: run each convolution once per layout on the GPU to
    measure cuDNN's workspaces (``_kernel_scratch``; one convolution's
    inputs, outputs and workspace on the GPU at a time); False leaves them
    out, and the trace under-counts by them.
    A GPU must be visible to PyTorch (nothing of the step is allocated on
    it): with none, PyTorch's autograd engine fails in the backward pass
    and autocast turns itself off (``RuntimeError`` saying so)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not torch.cuda.is_available():
        raise RuntimeError(NO_GPU)
    events = _Events()
    workspace = default_workspace_bytes(torch) if workspace_bytes is None else workspace_bytes
    kernel_scratch = KernelScratch(torch) if measure_scratch else None
    with _plain_module_moves(torch), _fake_as_plain_tensors(torch), one_rank(world_size) as ranks:
        trace = _traced(torch, FakeTensorMode, events, workspace, gpu_shape(torch), kernel_scratch, build, step,
                        steps, precision)
    trace.snapshot[TRACE_KEY].update(world_size=world_size or 1, ddp_bucket_bytes=ranks.bucket_bytes,
                                     comm_hooks_ignored=len(ranks.hooks_not_run))
    return trace


@contextlib.contextmanager
def _fake_as_plain_tensors(torch: Any) -> Any:
    """PyTorch's defaults that look at a tensor's type take a fake tensor
    for the plain tensor it stands for. An optimizer built with neither
    ``foreach`` nor ``fused`` runs its multi-tensor (foreach) kernels when
    every parameter is a plain CUDA tensor; a fake parameter's type is
    ``FakeTensor``, so under fake tensors it fell back to the one-tensor-at-
    a-time loop, which never holds the foreach kernels' temporaries (AdamW:
    one more copy of every parameter at once during its step; a small ViT
    at batch 2, whose peak is the optimizer step, traced 15% under the GPU).
    ``clip_grad_norm_``'s default asks the same of its gradients."""
    import importlib

    from torch._subclasses.fake_tensor import FakeTensor

    # The lists PyTorch reads at each call (torch 2.x); one it lacks is left.
    lists = []
    for module in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        try:
            lists.append(getattr(importlib.import_module(module), "_foreach_supported_types", None))
        except ImportError:
            pass
    added = [types for types in lists if isinstance(types, list) and FakeTensor not in types]
    for types in added:
        types.append(FakeTensor)
    try:
        yield
    finally:
        for types in added:
            if FakeTensor in types:
                types.remove(FakeTensor)


@contextlib.contextmanager
def _plain_module_moves(torch: Any) -> Any:
    """``module.to(...)`` that fake parameters survive. PyTorch moves a fake
    parameter by swapping its Python object in place, which fails while
    anything holds a weak reference to it ("_apply(): Couldn't swap
    Embedding.weight": fake tensor mode does); here a parameter that
    changes becomes a new Parameter, as PyTorch does for real tensors under
    ``torch.__future__.set_overwrite_module_params_on_conversion(True)``,
    one per tensor (tied weights stay tied). A move to the device a
    parameter is on already changes nothing."""
    original = torch.nn.Module._apply
    depth = [0]
    moved: Dict[int, Any] = {}

    def _apply(self: Any, fn: Any, recurse: bool = True) -> Any:
        depth[0] += 1
        try:
            if recurse:
                for child in self.children():
                    child._apply(fn)
            for key, param in self._parameters.items():
                if param is None:
                    continue
                if id(param) not in moved:
                    with torch.no_grad():
                        applied = fn(param)
                    if applied is not param:
                        new = torch.nn.Parameter(applied, requires_grad=param.requires_grad)
                        if param.grad is not None:
                            with torch.no_grad():
                                new.grad = fn(param.grad)
                        applied = new
                    moved[id(param)] = (param, applied)
                self._parameters[key] = moved[id(param)][1]
            for key, buf in self._buffers.items():
                if buf is not None:
                    self._buffers[key] = fn(buf)
            return self
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                moved.clear()

    torch.nn.Module._apply = _apply
    try:
        yield
    finally:
        torch.nn.Module._apply = original


def _traced(torch: Any, fake_mode: Any, events: _Events, workspace: int, gpu: "tuple[int, int]",
            kernel_scratch: Optional[KernelScratch], build: Any, step: Any, steps: int,
            precision: Optional[str]) -> Trace:
    step_peaks: List[int] = []
    with fake_mode(allow_non_fake_inputs=True), _tracer_mode(torch, events, workspace, gpu, kernel_scratch):
        # Modules made without a device are made on the GPU, where a
        # training script moves them (nothing is allocated before the move).
        with torch.device("cuda:0"):
            built = build()
        for n in range(1, steps + 1):
            events.window_peak = events.allocated
            with _autocast(torch, precision):
                step(built)
            step_peaks.append(events.window_peak)
            events.annotate(f"{STEP_MARKER} {n}", "START")
            events.annotate(f"{STEP_MARKER} {n}", "END")
        # What dies after this is not the step's (``built`` going out of
        # scope); the blocks live now are in the trace, allocated.
        events.closed = True
    snapshot = {
        "segments": [],
        "device_traces": [list(events.entries)],
        "external_annotations": events.annotations,
        TRACE_KEY: {
            "schema": TRACE_SCHEMA,
            "steps": steps,
            "precision": precision or "fp32",
            "workspace_bytes": workspace,
            "multiprocessors": gpu[0],
            "threads_per_multiprocessor": gpu[1],
            "unknown_values": events.unknown_values,
            # Layouts of kernels with scratch of their own run on the GPU
            # (measured) or not (unmeasured: out of memory, or not asked).
            "scratch_measured": kernel_scratch.measured if kernel_scratch else 0,
            "scratch_unmeasured": kernel_scratch.unmeasured if kernel_scratch else 0,
            "scratch_measuring": kernel_scratch is not None,
            # An optimizer built without foreach=/fused= ran its
            # multi-tensor kernels, as on the GPU (_fake_as_plain_tensors).
            "foreach_as_gpu": True,
            "torch": str(torch.__version__),
        },
    }
    return Trace(snapshot, events.peak, step_peaks, events.unknown_values)
