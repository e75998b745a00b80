"""`memlens.why`: the holder named for each way users keep tensors alive, on
CPU tensors with the real torch (skipped where torch is missing, as in the CI
Python suite). The site search (`why(site=...)`) runs here on a snapshot made
from CPU tensors' addresses; tests/gpu/leak_holders.py runs it on CUDA.

`_why.py` needs nothing else from memlens, so where no installed wheel has
it, it is loaded from the source file alone (python/ is not put on
sys.path: in the CI session the source package would shadow the installed
wheel for the other tests).
"""

import gc
import importlib.util
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCE = ROOT / "python" / "memlens" / "_why.py"
HERE = os.path.basename(__file__)


def _load_why():
    try:
        from memlens import _why

        return _why
    except ImportError:
        spec = importlib.util.spec_from_file_location("memlens_why", SOURCE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["memlens_why"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module


W = _load_why()
why = W.why


def line_here():
    """The caller's current line."""
    return sys._getframe(1).f_lineno


# Globals the cases fill, as training scripts do by mistake.
kept_outputs = []
metrics = {}
callbacks = []
cached_by_class = []


def remember(t, _seen=[]):  # noqa: B006 (the leak under test)
    _seen.append(t)


def add_callback(t):
    feat = t * 2
    callbacks.append(lambda: feat.sum())


def fail_with(t):
    big = t.repeat(4)
    fail_with.big = weakref.ref(big)
    raise ValueError("bad batch")


class Cached(torch.nn.Module):
    """Keeps every output in a list: `self.cache.append(y)` in forward."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.cache = []

    def forward(self, x):
        y = self.lin(x)
        self.cache.append(y.detach())
        return y


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Cached()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block.attn(x)
        return x


class Store:
    items = cached_by_class  # a class attribute holding a list


@pytest.fixture(autouse=True)
def _clean_globals():
    yield
    kept_outputs.clear()
    metrics.clear()
    callbacks.clear()
    cached_by_class.clear()
    remember.__defaults__[0].clear()
    for name in ("last_traceback", "last_value", "last_type"):
        if hasattr(sys, name):
            delattr(sys, name)


def test_module_list_appended_in_forward():
    model = Cached()
    for _ in range(3):
        model(torch.randn(2, 8))
    holders, line = why(model.cache), line_here()
    first = holders[0]
    assert (first.kind, first.path) == ("module", "model.cache")
    assert first.root == f"test_module_list_appended_in_forward() local 'model' ({HERE}:{line})"
    assert first.tensors == 3 and first.bytes == 3 * 2 * 8 * 4
    assert first.via == ("list of 3 tensors (192 B)",)
    assert len(holders) == 1


def test_nested_module_path():
    model = Net()
    model(torch.randn(2, 8))
    holders = why(list(model.blocks[1].attn.cache))
    assert [(h.kind, h.path) for h in holders] == [("module", "model.blocks.1.attn.cache")]


def test_forward_hook_into_a_global_list():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    model[1].register_forward_hook(lambda module, inputs, output: kept_outputs.append(output.detach()))
    for _ in range(4):
        model(torch.randn(2, 8))
    holders = why(list(kept_outputs))
    assert [(h.kind, h.path) for h in holders] == [("global", f"{__name__}.kept_outputs")]
    assert holders[0].tensors == 4
    assert holders[0].via == ("list of 4 tensors (256 B)",)


def keep_output(module, inputs, output):
    kept_outputs.append(output.detach())


def test_the_hook_that_fills_a_global_is_named():
    """Issue 32 item 3: the tensors were allocated by the model's layer (the
    user's line is `model(x)`); what to remove is the hook storing them."""
    kept_outputs.clear()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    handle = model[1].register_forward_hook(keep_output)
    try:
        for _ in range(3):
            model(torch.randn(2, 8))
        holders = why(list(kept_outputs))
        assert [(h.kind, h.path) for h in holders] == [("global", f"{__name__}.kept_outputs")]
        line = keep_output.__code__.co_firstlineno
        assert holders[0].filled_by == (f"forward hook keep_output ({HERE}:{line}) on GELU",)
        assert str(holders[0]).endswith(f"; filled by forward hook keep_output ({HERE}:{line}) on GELU")
        assert holders[0].to_dict()["filled_by"] == list(holders[0].filled_by)
    finally:
        handle.remove()
        kept_outputs.clear()
    # A global no hook names: no filler.
    metrics.clear()
    metrics[0] = torch.randn(4)
    assert why([metrics[0]])[0].filled_by == ()
    metrics.clear()


def test_forward_hook_keeping_outputs_in_its_closure():
    def make_hook():
        store = []

        def keep(module, inputs, output):
            store.append(output.detach() * 2)  # memory of its own (not the cache's)

        return keep

    model = Net()
    model.blocks[0].attn.register_forward_hook(make_hook())
    model(torch.randn(2, 8))
    keep = next(iter(model.blocks[0].attn._forward_hooks.values()))
    outputs = list(keep.__closure__[0].cell_contents)
    closure = f"closure of {keep.__qualname__} variable 'store' ({HERE}:{keep.__code__.co_firstlineno})"
    del keep
    holders = why(outputs)
    del outputs
    first = holders[0]
    assert (first.kind, first.path) == ("hook", "forward hook keep on model.blocks.0.attn")
    assert first.via == (closure, "list of 1 tensor (64 B)")
    assert first.root.startswith("test_forward_hook_keeping_outputs_in_its_closure() local 'model'")
    assert len(holders) == 2  # and `outputs`, the test's own local


def test_outputs_kept_in_a_dict_keyed_by_step():
    model = torch.nn.Linear(8, 8)
    for step in range(3):
        metrics[step] = model(torch.randn(2, 8)).detach()
    holders = why(list(metrics.values()))
    assert [(h.kind, h.path) for h in holders] == [("global", f"{__name__}.metrics")]
    assert holders[0].via == ("dict keyed by int (3 items, 192 B)",)


def test_closure_default_argument():
    for _ in range(2):
        remember(torch.ones(4) * 1)
    holders = why(list(remember.__defaults__[0]))
    first = holders[0]
    assert (first.kind, first.path) == ("default", "default argument '_seen' of remember")
    assert first.where == f"{HERE}:{remember.__code__.co_firstlineno}"
    assert first.root == f"{__name__}.remember"
    assert first.via == ("list of 2 tensors (32 B)",)


def test_callback_list_of_lambdas_capturing_tensors():
    for _ in range(3):
        add_callback(torch.ones(4))
    feats = [cb.__closure__[0].cell_contents for cb in callbacks]
    holders = why(feats)
    del feats
    first = holders[0]
    assert (first.kind, first.path) == ("global", f"{__name__}.callbacks")
    assert first.tensors == 3
    fn = callbacks[0]
    assert first.via == (
        "list of 3 functions",
        f"closure of {fn.__qualname__} variable 'feat' ({HERE}:{fn.__code__.co_firstlineno})",
    )


def test_autograd_graph_kept_by_total_loss():
    w = torch.ones(16, requires_grad=True)
    total_loss = 0
    for _ in range(3):
        x = torch.randn(16)  # an activation: MulBackward0 saves it (w needs its grad)
        total_loss += (x * w).sum()
    del x  # from here on only the graph keeps the last activation
    saved = _last_saved(total_loss.grad_fn, "MulBackward0")
    holders, line = why([saved._saved_self]), line_here()
    del saved
    assert [(h.kind, h.path) for h in holders] == [
        ("autograd", "autograd graph of test_autograd_graph_kept_by_total_loss() local 'total_loss' (saved by MulBackward0)")
    ]
    assert holders[0].where == f"{HERE}:{line}"
    assert (holders[0].tensors, holders[0].bytes) == (1, 64)


def _last_saved(node, name):
    """The first node called `name` met from `node` down the graph."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if type(cur).__name__ == name:
            return cur
        stack.extend(n for n, _ in cur.next_functions if n is not None)
    raise AssertionError(f"no {name}")


def test_local_of_the_calling_frame():
    history = [torch.ones(4) for _ in range(3)]
    holders, line = why(history), line_here()
    assert [(h.kind, h.path) for h in holders] == [("local", "test_local_of_the_calling_frame() local 'history'")]
    assert holders[0].where == f"{HERE}:{line}"
    assert holders[0].via == ("list of 3 tensors (48 B)",)
    assert holders[0].root == ""


def test_last_traceback_keeps_a_frames_locals():
    try:
        fail_with(torch.ones(8))
    except ValueError as e:
        sys.last_traceback = e.__traceback__
    big = fail_with.big
    holders = why([big()])
    assert [(h.kind, h.path) for h in holders] == [("traceback", "sys.last_traceback")]
    raise_line = fail_with.__code__.co_firstlineno + 3
    assert holders[0].via == (f"fail_with() local 'big' ({HERE}:{raise_line})",)
    assert holders[0].bytes == 4 * 8 * 4
    del sys.last_traceback
    assert big() is None


def test_clean_local_is_named_and_argument_alone_is_not():
    t = torch.ones(5)
    holders = why(t)
    assert [(h.kind, h.path) for h in holders] == [("local", "test_clean_local_is_named_and_argument_alone_is_not() local 't'")]
    alone = why(torch.ones(5))  # (not inside the assert: pytest would keep it in a local)
    assert alone == []
    alone = why([torch.ones(5)])
    assert alone == []


def test_view_keeps_the_storage():
    base = torch.ones(10)
    cached_by_class.append(base[2:4])
    holders = why(base)
    assert {(h.kind, h.path) for h in holders[:2]} == {
        ("global", f"{__name__}.Store.items"),  # the class attribute
        ("global", f"{__name__}.cached_by_class"),  # the same list, as a global
    }
    assert holders[2:] == [W.Holder("local", "test_view_keeps_the_storage() local 'base'", 1, 40, holders[2].where)]
    assert holders[0].via == ("list of 1 tensor (40 B)",)


def test_reference_cycle_is_unknown():
    was_on = gc.isenabled()
    gc.disable()
    try:
        t = torch.ones(3)
        ref = weakref.ref(t)
        cycle = [t]
        cycle.append(cycle)
        del cycle, t
        holders = why([ref()])
        assert [(h.kind, h.path) for h in holders] == [("unknown", "<list>")]
        assert holders[0].via == (
            "held by no global, running function or module "
            "(a reference cycle not yet collected, or a reference from C code)",
            "list of 2 items (12 B)",
        )
    finally:
        if was_on:
            gc.enable()
    gc.collect()
    assert ref() is None


def test_reference_counts_unchanged_and_weakref_dies():
    model = Cached()
    for _ in range(2):
        model(torch.randn(2, 8))
    for step in range(2):
        metrics[step] = torch.randn(3)
    w = torch.ones(4, requires_grad=True)
    total_loss = (torch.randn(4) * w).sum()
    targets = list(model.cache) + list(metrics.values())
    watched = targets + [targets, model, model.cache, model.__dict__, metrics, total_loss, w, total_loss.grad_fn]
    before = [sys.getrefcount(o) for o in watched]
    holders = why(targets)
    after = [sys.getrefcount(o) for o in watched]
    assert before == after
    assert {(h.kind, h.path) for h in holders} >= {("module", "model.cache"), ("global", f"{__name__}.metrics")}
    refs = [weakref.ref(t) for t in targets]
    del targets, watched, holders
    model.cache.clear()
    metrics.clear()
    assert [r() for r in refs] == [None] * 4  # no gc.collect(): nothing of the search is left


def test_weakref_dies_when_the_holder_is_dropped_after_why():
    model = Cached()
    model(torch.randn(2, 8))
    ref = weakref.ref(model.cache[0])
    assert why(model.cache)[0].path == "model.cache"
    model.cache.clear()
    assert ref() is None


def test_gc_state_restored():
    t = torch.ones(2)
    assert gc.isenabled()
    why(t)
    assert gc.isenabled()
    gc.disable()
    try:
        why(t)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_site_finds_the_tensors_allocated_there(monkeypatch):
    kept = [torch.ones(16) for _ in range(2)]
    other = torch.zeros(16)

    def block(t, line):
        storage = t.untyped_storage()
        frames = [
            {"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 9, "name": "linear"},
            {"filename": "/home/me/project/train.py", "line": line, "name": "main"},
        ]
        return {"address": storage.data_ptr(), "size": storage.nbytes(), "state": "active_allocated", "frames": frames}

    snapshot = {"segments": [{"address": 0, "blocks": [block(kept[0], 42), block(kept[1], 42), block(other, 43)]}]}
    monkeypatch.setattr(W, "_cuda_snapshot", lambda torch: snapshot)
    holders = why(site="train.py:42")
    assert [(h.kind, h.path, h.tensors) for h in holders] == [
        ("local", "test_site_finds_the_tensors_allocated_there() local 'kept'", 2)
    ]
    assert why(site="project/train.py:43")[0].path.endswith("local 'other'")
    assert why(site="train.py:44") == []


def test_site_spans_from_a_snapshot_without_block_addresses():
    frames = [{"filename": "a/train.py", "line": 7, "name": "f"}]
    snapshot = {
        "segments": [
            {
                "address": 1000,
                "blocks": [
                    {"size": 512, "state": "active_allocated", "frames": frames},
                    {"size": 512, "state": "inactive", "frames": frames},
                    {"size": 1024, "state": "active_allocated", "frames": []},
                    {"size": 512, "state": "active_allocated", "history": [{"frames": frames}]},
                ],
            }
        ]
    }
    assert W._site_spans("train.py:7", snapshot) == [(1000, 512), (3048, 512)]
    assert W._site_spans("rain.py:7", snapshot) == []
    bare = {"segments": [{"address": 0, "blocks": [{"size": 512, "state": "active_allocated"}]}]}
    with pytest.raises(ValueError, match="_record_memory_history"):
        W._site_spans("train.py:7", bare)
    with pytest.raises(ValueError, match="FILE:LINE"):
        W._parse_site("train.py")


def test_holder_text_and_dict():
    h = W.Holder("module", "model.cache", 1024, 4 << 30, root="train() local 'model' (train.py:9)", via=("list of 1,024 tensors (4.0 GiB)",))
    assert str(h) == (
        "model.cache [module]: 1,024 tensors, 4.0 GiB via list of 1,024 tensors (4.0 GiB); "
        "reached from train() local 'model' (train.py:9)"
    )
    assert h.to_dict() == {
        "kind": "module", "path": "model.cache", "tensors": 1024, "bytes": 4 << 30, "where": "",
        "root": "train() local 'model' (train.py:9)", "via": ["list of 1,024 tensors (4.0 GiB)"],
    }


def test_large_frontier_uses_the_pass_over_all_objects():
    many = [torch.ones(1) for _ in range(W._REFERRERS_AT_ONCE * 3)]
    holders = why(many)
    assert [(h.kind, h.path, h.tensors) for h in holders] == [
        ("local", "test_large_frontier_uses_the_pass_over_all_objects() local 'many'", len(many))
    ]


def test_importing_why_does_not_import_torch():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('memlens_why', {str(SOURCE)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['memlens_why'] = m\n"
        "spec.loader.exec_module(m)\n"
        "assert 'torch' not in sys.modules\n"
        "assert m.holders_of([]) == []\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exported_as_memlens_why():
    if W.__name__ != "memlens._why":
        pytest.skip("no wheel with memlens._why installed here (loaded from the source file)")
    import memlens

    assert memlens.why is W.why and memlens.Holder is W.Holder
