"""memlens's stand-ins for DDP's communication (``memlens._fake_ddp``,
used by ``trace_step(..., world_size=N)``) against the real torch: here on
the CPU with real tensors (tracing needs a GPU: tests/gpu/fake_ddp.py runs
them under fake tensors on two H200s), so that a torch whose DDP changed
the names they stand in for fails here first. Run by frameworks.sh."""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def _step(model):
    x = torch.randn(8, 16)
    model(x).sum().backward()


def test_one_rank_runs_ddp_on_the_fake_group_and_leaves_nothing_behind():
    from torch.nn.parallel import DistributedDataParallel

    from memlens._fake_ddp import one_rank

    init = DistributedDataParallel.__init__
    assert not dist.is_initialized()
    with one_rank(2) as ranks:
        assert dist.is_initialized() and dist.get_backend() == "fake" and dist.get_world_size() == 2
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        ddp = DistributedDataParallel(model)
        # Three steps: the second's forward is where DDP rebuilds its buckets.
        for _ in range(3):
            _step(ddp)
        assert all(p.grad is not None for p in model.parameters())
        # One set of buckets: every gradient, 16*32 + 32 + 32*4 + 4 = 676
        # floats (2,704 bytes), rounded up to 512.
        assert ranks.bucket_bytes == 3072
        # A comm hook of the step's own is counted, not run.
        ddp.register_comm_hook(None, lambda state, bucket: None)
        _step(ddp)
        assert len(ranks.hooks_not_run) == 1
    assert not dist.is_initialized()
    assert DistributedDataParallel.__init__ is init


def test_another_process_group_is_refused():
    from memlens._fake_ddp import one_rank

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29561", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="gloo process group is running"):
            with one_rank(2):
                pass
    finally:
        dist.destroy_process_group()
