"""One rank of a DistributedDataParallel job, traced with fake tensors
(``memlens.trace_step(..., world_size=N)``).

DDP's memory on a rank is its gradient buckets: flat buffers it copies each
gradient into (25 MiB each by default, the first 1 MiB) and all-reduces.
Under PyTorch's fake process group (``init_process_group("fake")``, rank 0
of N, no communication) DDP builds them as it does on a GPU, so a trace of
the step holds them. Three things DDP does read data back from the other
ranks, which neither a fake tensor nor a fake group has, and are stood in
for while tracing (checked on an H200 against two-GPU NCCL jobs of three
models, tests/gpu/fake_ddp.py):

- the check at construction that every rank's parameters have the same
  shapes (it reads them back as data): skipped, as one rank agrees with
  itself;
- the all-reduce's result: the fake group's leaves its future without a
  value, which DDP's reducer refuses; DDP's own no-op comm hook hands the
  bucket back as it is, as an in-place all-reduce would (neither takes
  memory of its own). A comm hook the step registers is not run (its own
  memory, e.g. a compressed copy of each bucket, is not in the trace): the
  trace counts them (``comm_hooks_ignored``) and ``memlens fit`` says so;
- the buckets' rebuild at the second step's forward (rank 0 broadcasts
  the order gradients became ready in, as data): the buckets keep their
  first order. The rebuild frees the old buckets and makes new ones of the
  same sizes in all, so the trace holds the bytes of a run where the old
  set is gone by then. On the GPU the same two-GPU job's rank peak came
  out, run to run, that or one set of buckets more (gpt 1,922,370,560 or
  2,032,110,592 B: 109,740,032 more, its gradients' size; GPT-2 93 MB and
  the ViT 78 MB more, theirs): in some runs the old set outlives the
  rebuild (while NCCL's stream still holds it). The trace records one
  set's size (``ddp_bucket_bytes``) and ``memlens fit`` says it.
"""

import contextlib
from typing import Any, Iterator, List, Optional


class Ranks:
    """What a trace of one rank says of its DDP modules: one set of their
    gradient buckets' bytes, and the comm hooks the step registered that
    the trace ran without."""

    def __init__(self) -> None:
        self.bucket_bytes = 0
        self.hooks_not_run: List[str] = []


class _BucketsKept:
    """DDP's reducer, but for the rebuild of its buckets, which reads data
    (see the module's doc)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _bucket_bytes(ddp: Any) -> int:
    """What one set of ``ddp``'s gradient buckets holds: every gradient it
    reduces (the parameters that require one), the total rounded up as the
    caching allocator rounds a block (buckets are at least 1 MiB but for
    the last, so rounding each bucket instead would add at most a few
    hundred bytes a bucket)."""
    # Imported here: _trace imports this module.
    from ._trace import _rounded

    return _rounded(sum(p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad))


@contextlib.contextmanager
def one_rank(world_size: Optional[int]) -> Iterator["Ranks"]:
    """While tracing: DDP as one rank of a job of ``world_size`` sees it
    (nothing changed when None). Starts PyTorch's fake process group as rank
    0 when no process group is running (and ends it after); a fake group
    the caller started is used as it is, any other refused. Yields what the
    trace should say (:class:`Ranks`), filled as DDP is built and run."""
    seen = Ranks()
    if world_size is None:
        yield seen
        return
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
    import torch.distributed as dist
    import torch.nn.parallel.distributed as ddp_module
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
    from torch.nn.parallel import DistributedDataParallel

    started = False
    if dist.is_initialized() and dist.get_backend() != "fake":
        # DDP would run its collectives on it with tensors that hold no
        # data, and the other ranks would wait for this one.
        raise RuntimeError(
            f"memlens traces one rank of a DDP job on PyTorch's fake process group, but a "
            f"{dist.get_backend()} process group is running in this process: trace in a process "
            f"without one (or one started with init_process_group(\"fake\"))"
        )
    if not dist.is_initialized():
        # Importing it registers the "fake" backend.
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        started = True
    check = ddp_module._verify_param_shape_across_processes
    init = DistributedDataParallel.__init__
    register = DistributedDataParallel.register_comm_hook

    def traced_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        register(self, None, noop_hook)
        self.reducer = _BucketsKept(self.reducer)
        seen.bucket_bytes += _bucket_bytes(self)

    def step_hook(self: Any, state: Any, hook: Any) -> None:
        seen.hooks_not_run.append(getattr(hook, "__qualname__", repr(hook)))

    ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None
    DistributedDataParallel.__init__ = traced_init
    DistributedDataParallel.register_comm_hook = step_hook
    try:
        yield seen
    finally:
        ddp_module._verify_param_shape_across_processes = check
        DistributedDataParallel.__init__ = init
        DistributedDataParallel.register_comm_hook = register
        if started:
            dist.destroy_process_group()
