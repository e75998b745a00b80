"""Module naming (memlens.record(model=...)) and the line profiler
(@memlens.profile, with memlens.profile()) without a GPU: the fake torch
records the record_function scopes in `external_annotations`, and its
allocator's events carry the frames the tests give them."""

from __future__ import annotations

import os
import pickle

import pytest

import memlens

MIB = 1024 * 1024


class Module:
    """Just enough of nn.Module: named_modules, forward (pre-)hooks, __call__."""

    def __init__(self, **children):
        self.children = children
        self.pre, self.post = [], []

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self.children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def register_forward_pre_hook(self, hook):
        return self._handle(self.pre, hook)

    def register_forward_hook(self, hook, always_call=False):
        return self._handle(self.post, hook)

    @staticmethod
    def _handle(hooks, hook):
        hooks.append(hook)

        class Handle:
            def remove(self):
                if hook in hooks:
                    hooks.remove(hook)

        return Handle()

    def __call__(self, x):
        for h in list(self.pre):
            h(self, (x,))
        out = self.forward(x)
        for h in list(self.post):
            h(self, (x,), out)
        return out


class Linear(Module):
    def __init__(self, gpu, size):
        super().__init__()
        self.gpu, self.size = gpu, size

    def forward(self, x):
        return self.gpu.alloc(self.size, file="/venv/site-packages/torch/nn/modules/linear.py", line=125, name="forward")


class Net(Module):
    def forward(self, x):
        return [self.children["fc1"](x), self.children["fc2"](x)]


def test_record_with_a_model_names_module_instances(gpu, tmp_path):
    net = Net(fc1=Linear(gpu, 4 * MIB), fc2=Linear(gpu, 2 * MIB))
    with memlens.record(tmp_path / "run.pickle", model=net, publish=False, leak_check=False):
        net(None)
        memlens.step()
    # The hooks are gone once recording stops.
    assert all(not m.pre and not m.post for _, m in net.named_modules())
    with open(tmp_path / "run.pickle", "rb") as f:
        snap = pickle.load(f)
    names = [(a["stage"], a["name"]) for a in snap["external_annotations"] if a["name"].startswith("memlens.module")]
    assert names == [
        ("START", "memlens.module :Net"),
        ("START", "memlens.module fc1:Linear"),
        ("END", "memlens.module fc1:Linear"),
        ("START", "memlens.module fc2:Linear"),
        ("END", "memlens.module fc2:Linear"),
        ("END", "memlens.module :Net"),
    ]
    if "modules" not in memlens.available():
        return
    r = memlens.load(tmp_path / "run.pickle").modules()
    assert r.naming == "instances"
    top = r.groups[0]
    assert (top["name"], top["class"], top["bytes"]) == ("Net", "Net", 6 * MIB)
    kids = {g["name"]: g["bytes"] for g in top["children"]}
    assert kids == {"fc1": 4 * MIB, "fc2": 2 * MIB}
    assert sum(g["bytes"] for g in r.groups) == r.peak_allocated_bytes


def test_profile_decorator_prints_the_per_line_table(gpu, tmp_path, capsys):
    code_file = os.path.abspath(__file__)

    def planted():
        a = gpu.alloc(8 * MIB, file=code_file, line=101, name="planted")
        b = gpu.alloc(2 * MIB, file=code_file, line=102, name="planted")
        gpu.free(a)  # frames of the allocation: charged to line 101
        return b

    prof = memlens.Profile(path=str(tmp_path / "p.pickle"))
    wrapped = prof(planted)
    wrapped()
    assert (tmp_path / "p.pickle").exists()
    with open(tmp_path / "p.pickle", "rb") as f:
        snap = pickle.load(f)
    scopes = [a["name"] for a in snap["external_annotations"]]
    assert scopes and all(n.startswith("memlens.profile ") for n in scopes)
    # History was turned on for the call and off after it.
    assert gpu.history_calls[0]["enabled"] == "all" and gpu.history_calls[-1]["enabled"] is None
    if "lines" not in memlens.available():
        return
    rows = {r["line"]: r for r in prof.last["rows"]}
    assert rows[101]["allocated_bytes"] == 8 * MIB and rows[101]["freed_bytes"] == 8 * MIB
    assert rows[102]["allocated_bytes"] == 2 * MIB and rows[102]["net_bytes"] == 2 * MIB
    out = capsys.readouterr().out
    assert "Memory by line of planted" in out and "8.00 MiB" in out
    # The fake's frees carry their allocation's stack, as context="alloc" records them.
    assert any("context=\"alloc\"" in w for w in prof.last["warnings"])


def test_profile_as_a_context_manager_reuses_an_active_recording(gpu, tmp_path):
    with memlens.record(tmp_path / "run.pickle", publish=False, leak_check=False, context="all"):
        calls = len(gpu.history_calls)
        with memlens.profile(print_to=None) as prof:
            gpu.alloc(MIB, file=os.path.abspath(__file__), line=1, name="test_x")
        # No second history toggled inside the recording.
        assert len(gpu.history_calls) == calls
    assert prof.overhead_s >= 0


def test_without_cuda_profile_runs_the_function(no_torch):
    @memlens.profile
    def f(x):
        return x + 1

    with pytest.warns(memlens.MemlensWarning):
        assert f(1) == 2


def test_profile_inside_a_recording_with_allocation_stacks_only_records_free_stacks(gpu, tmp_path):
    with memlens.record(tmp_path / "run.pickle", publish=False, leak_check=False) as rec:
        rec.context = "alloc"  # allocation stacks only (memlens.record's default on main since 3e05aa7)
        calls = len(gpu.history_calls)
        with memlens.profile(print_to=None):
            pass
        switched = gpu.history_calls[calls:]
        assert [c["context"] for c in switched] == ["all", "alloc"]
        assert all(c["max_entries"] == rec.max_entries for c in switched)
