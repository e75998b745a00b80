"""A fake `torch` with just enough of `torch.cuda` for memlens's capture code.

The fake keeps a model of the caching allocator's bookkeeping (live blocks with
their frames, counters, peaks) so the capture logic is exercised for real:
record/step/stop, snapshot names, the live files, the leak alarm and the OOM
observer. Install with `install()`, which puts it in `sys.modules["torch"]`.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Dict, List, Optional

MIB = 1024 * 1024
TORCH_FILE = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"


class FakeOutOfMemoryError(RuntimeError):
    pass


class FakeGPU:
    """The state behind the fake `torch.cuda`."""

    def __init__(self, devices: int = 1, available: bool = True) -> None:
        self.available = available
        self.n_devices = devices
        self.current = 0
        self.blocks: Dict[int, List[Dict[str, Any]]] = {d: [] for d in range(devices)}
        self.reserved: Dict[int, int] = {d: 0 for d in range(devices)}
        self.peak: Dict[int, int] = {d: 0 for d in range(devices)}
        self.peak_reserved: Dict[int, int] = {d: 0 for d in range(devices)}
        self.n_allocs: Dict[int, int] = {d: 0 for d in range(devices)}
        self.n_segments: Dict[int, int] = {d: 0 for d in range(devices)}
        self.trace: Dict[int, List[Dict[str, Any]]] = {d: [] for d in range(devices)}
        self.history_calls: List[Dict[str, Any]] = []
        self.observers: List[Callable[..., None]] = []
        self.rank: Optional[int] = None
        self.next_addr = 0x7F0000000000
        self.stats_error: Optional[Exception] = None
        self.cublas_cleared = 0
        self.snapshots_taken = 0
        # torch before 2.1 has no clear_history argument.
        self.clear_history_supported = True
        # torch >= 2.? leaves the actions in skip_actions out of the trace.
        self.skip_actions_supported = True
        self.skip_actions: List[str] = []
        # A running event clock, so time_us stays increasing when the trace is cleared.
        self.clock = 0
        # record_function scopes (torch keeps them in `external_annotations`).
        self.annotations: List[Dict[str, Any]] = []
        # The card and the per-process fraction in force.
        self.total_memory = 80 << 30
        self.memory_fraction = 1.0
        # The trace ring's size: a snapshot holds the last max_entries events.
        self.max_entries = sys.maxsize

    # -- what tests drive ---------------------------------------------------

    def alloc(self, size: int, file: str = "train.py", line: int = 1, name: str = "step", device: int = 0) -> Dict[str, Any]:
        frames = [
            {"filename": TORCH_FILE, "line": 1790, "name": "_call_impl"},
            {"filename": file, "line": line, "name": name},
        ]
        addr = self.next_addr
        self.next_addr += max(size, 512)
        blk = {"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
        self.blocks[device].append(blk)
        self.n_allocs[device] += 1
        used = self.allocated(device)
        while self.reserved[device] < used:
            self.reserved[device] += 20 * MIB
            self.n_segments[device] += 1
        self.peak[device] = max(self.peak[device], used)
        self.peak_reserved[device] = max(self.peak_reserved[device], self.reserved[device])
        self.trace[device].append(
            {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": self.tick(),
             "frames": frames, "compile_context": "N/A", "user_metadata": ""}
        )
        return blk

    def free(self, blk: Dict[str, Any], device: int = 0) -> None:
        self.blocks[device].remove(blk)
        for action in [a for a in ("free_requested", "free_completed") if a not in self.skip_actions]:
            self.trace[device].append(
                {"action": action, "addr": blk["address"], "size": blk["size"], "stream": 0,
                 "time_us": self.tick(), "frames": blk["frames"], "compile_context": "N/A",
                 "user_metadata": ""}
            )

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def oom(self, size: int, device: int = 0) -> None:
        """What the caching allocator does at an OOM: observers, then the exception."""
        for obs in self.observers:
            obs(device, size, self.allocated(device), 1 * MIB)
        raise FakeOutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes")

    def allocated(self, device: int = 0) -> int:
        return sum(b["size"] for b in self.blocks[device])

    # -- the snapshot, shaped like torch.cuda.memory._snapshot() -------------

    def snapshot(self) -> Dict[str, Any]:
        self.snapshots_taken += 1
        segments = []
        for d in range(self.n_devices):
            blocks = sorted((dict(b) for b in self.blocks[d]), key=lambda b: b["address"])
            total = self.reserved[d]
            used = sum(b["size"] for b in blocks)
            # One segment holding the live blocks where they are (memlens rejects
            # blocks outside their segment, as PyTorch never writes them), the
            # rest of the reservation free after the last one.
            start = blocks[0]["address"] if blocks else self.next_addr
            end = blocks[-1]["address"] + blocks[-1]["size"] if blocks else start
            if total > used:
                blocks.append({"address": end, "size": total - used, "requested_size": 0,
                               "state": "inactive", "frames": []})
                end += total - used
            if total:
                segments.append({
                    "device": d, "address": start, "total_size": max(total, end - start), "allocated_size": used,
                    "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
                    "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
                })
        return {
            "segments": segments,
            "device_traces": [list(self.trace[d][-self.max_entries:]) for d in range(self.n_devices)],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
            "external_annotations": [dict(a) for a in self.annotations],
        }

    def memory_stats(self, device: Optional[int] = None) -> Dict[str, int]:
        if self.stats_error is not None:
            raise self.stats_error
        d = self.current if device is None else int(device)
        return {
            "allocated_bytes.all.current": self.allocated(d),
            "allocated_bytes.all.peak": self.peak[d],
            "reserved_bytes.all.current": self.reserved[d],
            "reserved_bytes.all.peak": self.peak_reserved[d],
            "active_bytes.all.current": self.allocated(d),
            "allocation.all.allocated": self.n_allocs[d],
            "segment.all.allocated": self.n_segments[d],
            "segment.all.freed": 0,
        }


def build(gpu: FakeGPU) -> types.ModuleType:
    """The fake `torch` module over `gpu`."""
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    c = types.ModuleType("torch._C")
    dist = types.ModuleType("torch.distributed")

    def dev(d: Optional[int]) -> int:
        return gpu.current if d is None else int(d)

    cuda.is_available = lambda: gpu.available
    cuda.device_count = lambda: gpu.n_devices
    cuda.current_device = lambda: gpu.current
    cuda.init = lambda: None
    cuda.synchronize = lambda device=None: None
    cuda.memory_stats = lambda device=None: gpu.memory_stats(device)
    cuda.memory_allocated = lambda device=None: gpu.memory_stats(device)["allocated_bytes.all.current"]
    cuda.memory_reserved = lambda device=None: gpu.memory_stats(device)["reserved_bytes.all.current"]
    cuda.max_memory_allocated = lambda device=None: gpu.peak[dev(device)]
    cuda.max_memory_reserved = lambda device=None: gpu.peak_reserved[dev(device)]

    def reset_peak(device: Optional[int] = None) -> None:
        d = dev(device)
        gpu.peak[d] = gpu.allocated(d)
        gpu.peak_reserved[d] = gpu.reserved[d]

    cuda.reset_peak_memory_stats = reset_peak
    # An 80 GiB card; the fraction as set_per_process_memory_fraction left it.
    cuda.get_device_properties = lambda d=None: types.SimpleNamespace(total_memory=gpu.total_memory)
    cuda.get_per_process_memory_fraction = lambda d=None: gpu.memory_fraction
    cuda.mem_get_info = lambda d=None: (gpu.total_memory - gpu.reserved[dev(d)], gpu.total_memory)
    cuda.OutOfMemoryError = FakeOutOfMemoryError

    def record_memory_history(enabled: Any = "all", context: Any = "all", stacks: str = "all", max_entries: int = sys.maxsize, **kw: Any) -> None:
        if kw.get("clear_history") and not gpu.clear_history_supported:
            raise TypeError("_record_memory_history() got an unexpected keyword argument 'clear_history'")
        if "skip_actions" in kw and not gpu.skip_actions_supported:
            raise TypeError("_record_memory_history() got an unexpected keyword argument 'skip_actions'")
        gpu.skip_actions = list(kw.get("skip_actions") or [])
        gpu.history_calls.append({"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries, **kw})
        if enabled:
            gpu.max_entries = max_entries
        if kw.get("clear_history"):
            for d in gpu.trace:
                gpu.trace[d] = []

    memory._record_memory_history = record_memory_history
    memory._snapshot = lambda device=None: gpu.snapshot()
    cuda.memory = memory

    c._cuda_attach_out_of_memory_observer = lambda fn: gpu.observers.append(fn)

    def clear_cublas() -> None:
        gpu.cublas_cleared += 1

    c._cuda_clearCublasWorkspaces = clear_cublas

    dist.is_available = lambda: True
    dist.is_initialized = lambda: gpu.rank is not None
    dist.get_rank = lambda: gpu.rank

    class record_function:
        """torch.autograd.profiler.record_function: START/END annotations."""

        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> "record_function":
            gpu.annotations.append({"stage": "START", "name": self.name, "device": gpu.current, "time_us": gpu.tick()})
            return self

        def __exit__(self, *exc: Any) -> None:
            gpu.annotations.append({"stage": "END", "name": self.name, "device": gpu.current, "time_us": gpu.tick()})

    autograd = types.ModuleType("torch.autograd")
    profiler = types.ModuleType("torch.autograd.profiler")
    profiler.record_function = record_function
    autograd.profiler = profiler
    torch.autograd = autograd
    torch.cuda = cuda
    torch._C = c
    torch.distributed = dist
    torch.__fake__ = True
    return torch


def install(gpu: FakeGPU) -> types.ModuleType:
    """Puts the fake in sys.modules; returns it."""
    torch = build(gpu)
    sys.modules["torch"] = torch
    sys.modules["torch.cuda"] = torch.cuda
    sys.modules["torch.cuda.memory"] = torch.cuda.memory
    sys.modules["torch._C"] = torch._C
    sys.modules["torch.distributed"] = torch.distributed
    return torch


def uninstall() -> None:
    for name in ("torch", "torch.cuda", "torch.cuda.memory", "torch._C", "torch.distributed"):
        sys.modules.pop(name, None)
