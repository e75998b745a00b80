"""``memlens.trace_step``'s bookkeeping, without torch: the trace it writes
is the one ``torch.cuda.memory._snapshot()`` would hold (the tracing itself
runs on real torch in tests/gpu/fake_step.py)."""

import os

import memlens
from memlens import _trace


def test_allocations_are_rounded_as_the_caching_allocator_rounds_and_frees_come_in_pairs():
    events = _trace._Events()
    events.alloc(1, 1, [])
    events.alloc(2, 513, [{"filename": "train.py", "line": 3, "name": "step"}])
    assert [e["size"] for e in events.entries] == [512, 1024]
    assert events.allocated == 1536 and events.peak == 1536
    events.free(1)
    assert [e["action"] for e in events.entries[2:]] == ["free_requested", "free_completed"]
    assert events.entries[2]["addr"] == events.entries[0]["addr"]
    assert events.allocated == 1024 and events.peak == 1536
    # A storage that dies twice (or was never seen) frees nothing.
    events.free(1)
    events.free(99)
    assert len(events.entries) == 4
    # Addresses are never reused.
    events.alloc(3, 512, [])
    assert len({e["addr"] for e in events.entries if e["action"] == "alloc"}) == 3
    # Once the steps are over, what dies (the model going out of scope) is not the step's.
    events.closed = True
    events.free(2)
    events.alloc(4, 512, [])
    assert len(events.entries) == 5


def test_a_saved_trace_is_replayed_by_memlens_fit(tmp_path):
    events = _trace._Events()
    events.alloc(1, 100 << 20, [{"filename": "train.py", "line": 3, "name": "build"}])
    events.alloc(2, 30 << 20, [{"filename": "train.py", "line": 7, "name": "step"}])
    events.free(2)
    snapshot = {"segments": [], "device_traces": [events.entries], "external_annotations": [],
                _trace.TRACE_KEY: {"schema": _trace.TRACE_SCHEMA, "steps": 1, "precision": "bf16",
                                   "workspace_bytes": 0, "unknown_values": 0, "torch": "none"}}
    path = _trace.Trace(snapshot, events.peak, [events.peak], 0).save(tmp_path / "step.pickle")
    assert os.listdir(tmp_path) == ["step.pickle"]
    r = memlens.fit(path)
    assert r["predicted"]["peak_allocated_bytes"] == 130 << 20
    assert r["basis"]["precision"] == "bf16"
    assert r["predicted"]["fits"] is None


def test_tracing_with_no_gpu_visible_says_why_it_cannot(monkeypatch):
    class NoCuda:
        @staticmethod
        def is_available():
            return False

    import sys
    import types

    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = NoCuda
    subclasses = types.ModuleType("torch._subclasses")
    fake_tensor = types.ModuleType("torch._subclasses.fake_tensor")
    fake_tensor.FakeTensorMode = object
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "torch._subclasses", subclasses)
    monkeypatch.setitem(sys.modules, "torch._subclasses.fake_tensor", fake_tensor)
    try:
        _trace.trace_step(lambda: None, lambda built: None)
    except RuntimeError as e:
        assert "needs a CUDA GPU visible" in str(e) and "hasPrimaryContext" in str(e)
    else:
        raise AssertionError("traced with no GPU")
