"""The scratch memory of kernels that take it from PyTorch's caching
allocator inside their own call, which no fake tensor shows: cuDNN's
convolution workspaces.

Their sizes are the library's choice (cuDNN picks an algorithm by its own
heuristics, or by timing them under ``torch.backends.cudnn.benchmark``, and
asks for that algorithm's workspace), so they are not modelled but
measured: the first time a traced step runs a convolution with given
shapes, strides and dtypes, the operator runs once for real on the visible
GPU (on uninitialised inputs of the same layout; nothing of the step's is
moved there) with PyTorch's allocator recording, and what the call
allocated is kept as its pattern: the outputs it returned, and each block it
allocated and freed before returning, in order. The fake trace then repeats
that pattern around the fake operator, every time the step runs it.

The fused attention kernels' workspaces are not measured: run so, on
uninitialised inputs, the memory-efficient kernel's fp32 backward with an
attention mask crashed the process (HF GPT-2, T5 and BERT on an H200), and a
tracer must not. (They were 4 MiB blocks in a ViT's recording.)

ResNet-50's fake trace without them was 1.0% (allocated) and 2.7%
(reserved) under the GPU's peaks, with them 0.2% and 2.2% over
(tests/gpu/RESULTS.md). The GPU memory this takes is one convolution's
inputs, outputs and workspace at a time, freed before the trace goes on; a
convolution the GPU cannot run (out of memory) is traced without its
scratch and counted as unmeasured.
"""

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# Operators (by their ATen name without overload) whose CUDA kernels
# allocate scratch inside the call.
MEASURED_OPS = frozenset({"convolution", "convolution_backward"})

# The C++ frame under which cuDNN's workspace is allocated, as a recording
# with C++ stacks names it (memlens::frames::is_cudnn_workspace reads the
# same): PyTorch runs the next algorithm when that allocation fails, which
# the allocator model replays (an optional allocation).
CUDNN_WORKSPACE_FRAME = "at::native::run_conv_plan"

# One step of a call's pattern: ("output", size), ("alloc", n, size,
# is_cudnn_workspace) or ("free", n), n numbering the call's scratch blocks.
Step = Tuple[Any, ...]


def call_pattern(entries: Iterable[Dict[str, Any]]) -> List[Step]:
    """A call's pattern from the allocator's trace entries recorded around
    it (``_snapshot()["device_traces"][d]``, in order): a block allocated
    and still live at the end is an output the call returned; a block
    allocated and freed is scratch, cuDNN's workspace when its stack says
    so. Frees of blocks allocated before the recording (none in a recording
    of one call) are not the call's."""
    steps: List[Step] = []
    blocks = 0
    index_of_output: Dict[int, int] = {}
    workspace: Dict[int, bool] = {}
    for e in entries:
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            index_of_output[addr] = len(steps)
            workspace[addr] = any(CUDNN_WORKSPACE_FRAME in str(f.get("name", "")) for f in e.get("frames") or [])
            steps.append(("output", int(e.get("size", 0))))
        elif action == "free_requested" and addr in index_of_output:
            at = index_of_output.pop(addr)
            size = steps[at][1]
            steps[at] = ("alloc", blocks, size, workspace.pop(addr, False))
            steps.append(("free", blocks))
            blocks += 1
    return steps


def _tensor_layout(torch: Any, value: Any) -> Any:
    """What a measurement of ``value`` depends on: a tensor's shape, strides,
    dtype and device (its offset in its storage is not reproduced by the
    measurement, so not part of it); anything else as it prints."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype), value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_tensor_layout(torch, v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _tensor_layout(torch, v)) for k, v in value.items()))
    return repr(value)


class KernelScratch:
    """The patterns measured so far, by operator and layout (the tracer's one
    instance per trace). ``measured``: layouts run on the GPU;
    ``unmeasured``: layouts the GPU could not run (their calls are traced
    without scratch)."""

    def __init__(self, torch: Any) -> None:
        import inspect

        self.torch = torch
        self.measured = 0
        self.unmeasured = 0
        # The user's own recording of the allocator would be stopped and
        # cleared by a measurement: then nothing is measured.
        self.enabled = not busy_recording(torch)
        # Each recording starts empty (older PyTorch cleared it on stopping).
        params = inspect.signature(torch.cuda.memory._record_memory_history).parameters
        self._clear = {"clear_history": True} if "clear_history" in params else {}
        # key -> [pattern of the first call, pattern of later calls]; None:
        # not measurable.
        self._patterns: Dict[Any, Optional[List[List[Step]]]] = {}
        self._calls: Dict[Any, int] = {}

    def pattern(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[List[Step]]:
        """The pattern of this call of ``func`` (an operator of
        ``MEASURED_OPS``) on these fake arguments: measured on the first
        call of its layout, the same after (under cuDNN's benchmark mode,
        the first call's own: it times the algorithms, each with its
        workspace, once per layout in a process)."""
        torch = self.torch
        cudnn = torch.backends.cudnn
        key = (func, _tensor_layout(torch, list(args)), _tensor_layout(torch, kwargs), bool(cudnn.benchmark),
               bool(cudnn.deterministic), bool(cudnn.allow_tf32))
        if key not in self._patterns:
            self._patterns[key] = self._measure(func, args, kwargs)
        patterns = self._patterns[key]
        if patterns is None:
            return None
        seen = self._calls.get(key, 0)
        self._calls[key] = seen + 1
        return patterns[0] if seen == 0 else patterns[1]

    def _measure(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[List[List[Step]]]:
        """The patterns of a first and a later call of this layout, or None
        (counted unmeasured) when it cannot be run."""
        if not self.enabled:
            self.unmeasured += 1
            return None
        torch = self.torch
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils._pytree import tree_map

        def real(value: Any) -> Any:
            # Every fake tensor, the CPU's too.
            if isinstance(value, torch.Tensor):
                return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype,
                                           device=value.device)
            return value

        runs = 2 if torch.backends.cudnn.benchmark else 1
        patterns: List[List[Step]] = []
        try:
            with _disable_current_modes(), torch.no_grad(), torch.autocast("cuda", enabled=False):
                real_args = tree_map(real, list(args))
                real_kwargs = tree_map(real, dict(kwargs))
                for _ in range(runs):
                    patterns.append(self._record(lambda: func(*real_args, **real_kwargs)))
                del real_args, real_kwargs
        except (RuntimeError, ValueError):
            # Out of memory, or a kernel this GPU has not got.
            self.unmeasured += 1
            return None
        self.measured += 1
        return [patterns[0], patterns[-1]]

    def _record(self, call: Any) -> List[Step]:
        """The pattern of one real call, from the allocator's own trace."""
        torch = self.torch
        memory = torch.cuda.memory
        torch.cuda.synchronize()
        # C++ stacks: they tell cuDNN's workspace from the call's other
        # scratch (a few events a call).
        memory._record_memory_history(enabled="all", context="alloc", stacks="all", max_entries=100_000,
                                      **self._clear)
        try:
            out = call()
            torch.cuda.synchronize()
            snap = memory._snapshot()
        finally:
            memory._record_memory_history(enabled=None)
        del out
        device = torch.cuda.current_device()
        traces = snap.get("device_traces", [])
        return call_pattern(traces[device] if device < len(traces) else [])


def busy_recording(torch: Any) -> bool:
    """Whether PyTorch's allocator is recording history already (the
    user's own recording, which a measurement would stop and clear)."""
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(probe()) if probe is not None else False
