"""``memlens.why``: what keeps a tensor (or the memory a line allocated) alive.

memlens names the line that allocated a leak; the next question is what
still holds it. :func:`why` answers it in the user's own process and names
the holder the way a user would write it:

* a module global, ``train.losses``; a class attribute, ``train.Cache.items``;
* an ``nn.Module`` attribute path, ``model.layer3.attn.cache``;
* a local of a running function, ``train() local 'history'``, with its line;
* ``sys.last_traceback`` (a notebook keeps the frames of the last error and
  their locals);
* a hook on a module, ``forward hook keep on model.layer3``;
* a closure or a default argument, ``closure of make_cb.<locals>.cb``,
  ``default argument '_seen' of remember``;
* an autograd graph, ``autograd graph of train() local 'total_loss' (saved
  by MulBackward0)``: a tensor that requires grad keeps every tensor its
  ``grad_fn`` graph saved (``total_loss += loss``).

The containers in between are described (``list of 1,024 tensors (4.0 GiB)``,
``dict keyed by int (200 items, 800.0 KiB)``).

How. The targets are *storages*: those of the tensors given, or, with
``site="train.py:42"``, the live CUDA blocks that line allocated (read from
``torch.cuda.memory._snapshot()``, which needs the allocator's history on).
Every live Python tensor whose storage lies in a target is a starting point,
and so is every tensor whose ``grad_fn`` graph saves one (its nodes'
``_saved_*`` tensors). From there :func:`holders_of` walks the references
backwards, one level at a time, until it meets a root: a module's
``__dict__``, a local of a running frame (``sys._current_frames()`` and the
``f_back`` chains), a class or a module object. Running frames are read
through ``f_locals``: the collector does not see their locals (Python >=
3.11). Frames that finished but are kept (by a traceback) are walked through
like any object, and their locals named.

Never keeping anything alive, never changing the program:

* results are plain strings and ints (:class:`Holder`); the targets are
  handed from :func:`why` to :func:`holders_of` as weak references;
* the search holds its objects in a few containers of its own, skipped as
  referrers while it runs and emptied before it returns (an error too);
* the collector is paused during the search (``gc.disable()``) and turned
  back on only if it was on;
* on Python < 3.13 reading ``frame.f_locals`` leaves a snapshot of the
  frame's locals on the frame, which would keep a training loop's old
  batches alive after the loop rebinds them; the search empties that
  snapshot again when nothing else can see it (no tracer, no other holder).
  Python >= 3.13 keeps no snapshot.

Speed. The search never builds the whole reverse graph: each level of the
walk is one pass of the collector over every tracked object, in C
(``gc.get_referrers`` with the whole frontier), or, for a frontier of more
than 128 objects (``gc.get_referrers`` compares each reference with each
frontier object, so its cost grows with the frontier), one pass over a
``gc.get_objects()`` list that tests 512 objects at once against the
frontier's ids and looks inside a chunk only when it matches. The live
tensors are picked out of ``gc.get_objects()`` in C as well. On a process of
a million objects a level costs about 25 ms and a whole search 0.16 to
0.41 s (bench/why_search.py; BENCHMARKS.md).

Limits: references held only by C code (autograd's C++ nodes, extension
caches) or by a running frame's evaluation stack are invisible: a tensor
kept only that way gets no holder; one kept by objects that nothing named
reaches (a reference cycle not yet collected) gets an ``unknown`` holder.
Reading a saved tensor (``node._saved_self``) runs the graph's saved-tensor
unpack hooks, if the program registered any (activation offloading would
copy it back). A dict that a debugger or the program holds as a running
frame's ``locals()`` (Python < 3.13) is refreshed by the read, as any
``locals()`` call would.

Importing this module never imports torch; it imports nothing from memlens
(so it also loads as a single file, without the native extension).
"""

from __future__ import annotations

import bisect
import collections
import gc
import itertools
import os
import sys
import types
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

__all__ = ["Holder", "Saved", "holders_of", "why"]

StorageKey = Tuple[int, int]
"""A storage as ``(data_ptr, nbytes)``."""

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_CO_OPTIMIZED = 0x0001  # inspect.CO_OPTIMIZED: a function's frame (fast locals)
_REFERRERS_AT_ONCE = 128  # frontier size up to which gc.get_referrers is faster
_CHUNK = 512  # objects tested at once by the pass over gc.get_objects()
_MAX_NODES = 200_000  # objects the walk may meet before it stops
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
_NAMESPACE_ITEMS = 32  # a dict keyed by str up to this size is named through: cfg['model']
_MODULE_MAPS = ("_modules", "_parameters", "_buffers")
_SYS_LAST = ("sys.last_traceback", "sys.last_value", "sys.last_exc", "sys.last_type")
# Order among holders of equal bytes, by the root of their path: what a global
# keeps outlives a step; a structure under a running function's local (its
# model's cache, a hook) comes next; a plain local (often the step's own
# `out`) after, as it goes when the function rebinds it or returns.
_RANK = {"local": 1, "unknown": 3}
_RANK_PLAIN_LOCAL = 2


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Holder:
    """One thing that keeps target tensors alive, named for a user.

    ``kind``: ``"global"``, ``"module"`` (an ``nn.Module`` attribute path),
    ``"local"`` (a running function's local), ``"traceback"``
    (``sys.last_traceback`` and its kin), ``"hook"``, ``"closure"``,
    ``"default"`` (a default argument), ``"autograd"`` (a graph that saved
    the tensors), ``"unknown"`` (held, but by nothing the search can name).
    ``path``: the holder's name (``model.cache``, ``train() local
    'history'``). ``tensors`` and ``bytes``: the target storages it keeps
    (for targets of :func:`holders_of` that are not tensors: the objects,
    0 bytes).
    ``where``: ``file:line`` of the frame (a local) or of the function (a
    closure, a default argument). ``root``: how ``path`` itself is reached,
    when the path does not say it (``train() local 'model' (train.py:12)``).
    ``via``: the steps from ``path`` down to the tensors (containers,
    frames, closure variables). ``filled_by``: for a global, the hooks
    registered on modules whose code stores into it (``forward hook keep
    (train.py:30) on GELU``): what to remove when the holder is filled by a
    hook rather than by the line that allocated.
    """

    kind: str
    path: str
    tensors: int
    bytes: int
    where: str = ""
    root: str = ""
    via: Tuple[str, ...] = ()
    filled_by: Tuple[str, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a JSON-ready dict (tuples as lists; ``filled_by``
        only when there is one)."""
        data = asdict(self)
        data["via"] = list(self.via)
        if self.filled_by:
            data["filled_by"] = list(self.filled_by)
        else:
            del data["filled_by"]
        return data

    def __str__(self) -> str:
        text = f"{self.path} [{self.kind}]"
        if self.where:
            text += f" at {self.where}"
        if self.bytes:
            text += f": {_count(self.tensors, 'tensor')}, {_size(self.bytes)}"
        else:
            text += f": {_count(self.tensors, 'object')}"
        if self.via:
            text += " via " + " -> ".join(self.via)
        if self.root:
            text += f"; reached from {self.root}"
        if self.filled_by:
            text += "; filled by " + ", ".join(self.filled_by)
        return text


class Saved(NamedTuple):
    """A tensor whose autograd graph saves target storages (input of
    :func:`holders_of`, made by :func:`why`)."""

    owner: Callable[[], Any]
    """A weak reference to the tensor (its ``grad_fn`` graph is the holder)."""
    storages: FrozenSet[StorageKey]
    """The target storages its graph saves."""
    nodes: Tuple[str, ...]
    """Names of the graph nodes that save them (``MulBackward0``)."""


# ---------------------------------------------------------------- public entry points


def why(
    tensors: Any = None,
    *,
    site: Optional[str] = None,
    max_depth: int = 20,
    limit: int = 20,
) -> List[Holder]:
    """Names what keeps ``tensors`` (a tensor or an iterable of tensors), or
    the live CUDA memory allocated at ``site`` (``"train.py:42"``, as memlens
    prints a leak's site), alive.

    Every live tensor sharing a target's storage counts (a view keeps its
    base's memory), and so does every tensor whose autograd graph saves one.
    ``site`` needs ``torch.cuda.memory._record_memory_history()`` to have run
    before the allocations (the blocks carry their stack frames then).
    ``max_depth``: the references followed from a tensor up to a holder.
    ``limit``: the most holders returned. Returns the holders, those keeping
    the most bytes first; an empty list when nothing but the caller's own
    argument holds the tensors.
    """
    if (tensors is None) == (site is None):
        raise TypeError("why() takes tensors or site=, one of them")
    import torch

    with _gc_paused():
        targets, saved = _resolve(torch, tensors, site)
        ignore = (id(tensors),) if tensors is not None else ()
        found = holders_of(targets, saved=saved, max_depth=max_depth, limit=limit, ignore_ids=ignore)
        return _with_hook_fillers(torch, found)


def holders_of(
    targets: Iterable[Any],
    *,
    saved: Sequence[Saved] = (),
    max_depth: int = 20,
    limit: int = 20,
    ignore_ids: Iterable[int] = (),
) -> List[Holder]:
    """Names what holds each of ``targets`` (any Python objects, or weak
    references to them), by walking the references backwards up to a module
    global, a running frame's local, a class or a module object.

    Tensors are counted by storage (``tensors`` and ``bytes`` of each
    holder). ``saved``: tensors whose autograd graphs save target storages;
    what holds them is reported as an ``autograd`` holder. ``ignore_ids``:
    ids of objects never to report as an unnamed holder (the caller's own
    argument list; they are still walked through). The search keeps nothing:
    see the module's documentation.
    """
    with _gc_paused():
        search = _Search(_env(), set(ignore_ids) | {id(targets)})
        try:
            search.add_targets(targets, saved)
            search.walk(max_depth)
            return search.holders(limit)
        finally:
            search.close()


# ---------------------------------------------------------------- hooks that fill a global

#: The hook dicts of an ``nn.Module`` instance, and how each is named.
_MODULE_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _with_hook_fillers(torch: Any, holders: List[Holder]) -> List[Holder]:
    """``holders`` with ``filled_by`` set on each global that a module hook
    stores into: a forward hook appending outputs to ``train.kept`` is the
    code to change, though the tensors were allocated by the model's layer
    (and memlens's site is the user's ``model(x)``). A hook counts when its
    function's module globals are the holder's module and its code names the
    global. Reads the live modules once, and only when a global was named."""
    globals_named = [h for h in holders if h.kind == "global" and "." in h.path]
    if not globals_named:
        return holders
    module_type = getattr(getattr(torch, "nn", None), "Module", None)
    if module_type is None:
        return holders
    hooks = _registered_hooks(module_type)
    if not hooks:
        return holders
    out = []
    for h in holders:
        fillers: Tuple[str, ...] = ()
        if h in globals_named:
            fillers = tuple(_fillers_of(h.path, hooks))
        out.append(replace(h, filled_by=fillers) if fillers else h)
    return out


def _registered_hooks(module_type: type) -> List[Tuple[str, str, Any]]:
    """Every hook registered on a live module: (hook label, module class name,
    the function)."""
    modules = _live_instances(module_type)
    found = []
    try:
        for module in modules:
            state = _instance_dict(module) or {}
            for attr in _MODULE_HOOK_DICTS:
                registered = state.get(attr)
                if isinstance(registered, dict):
                    for fn in list(registered.values()):
                        found.append((_hook_label(attr), type(module).__name__, fn))
    finally:
        modules.clear()
    return found


def _fillers_of(path: str, hooks: List[Tuple[str, str, Any]]) -> Iterator[str]:
    """The hooks whose code stores into the global ``path`` (``train.kept``,
    a module as :func:`_module_name` names it, then the global's name)."""
    seen = set()
    for label, owner, fn in hooks:
        inner = getattr(fn, "func", fn)  # functools.partial
        inner = getattr(inner, "__func__", inner)  # a bound method
        code = getattr(inner, "__code__", None)
        space = getattr(inner, "__globals__", None)
        if code is None or not isinstance(space, dict):
            continue
        module = sys.modules.get(str(space.get("__name__")))
        if module is None or getattr(module, "__dict__", None) is not space:
            continue
        prefix = _module_name(module) + "."
        if not path.startswith(prefix):
            continue
        name = path[len(prefix):].split(".")[0].split("[")[0]
        if name not in space or name not in _names_used(code):
            continue
        text = f"{label} {_hook_name(fn)} ({_def_site(inner)}) on {owner}"
        if text not in seen:
            seen.add(text)
            yield text


def _names_used(code: types.CodeType) -> Set[str]:
    """The global names a function's code (and the code nested in it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


# ---------------------------------------------------------------- targets (torch)


def _resolve(torch: Any, tensors: Any, site: Optional[str]) -> Tuple[List[Any], List[Saved]]:
    """Weak references to the target tensors, and the graphs that save their storages."""
    given = _given_tensors(tensors, torch.Tensor) if tensors is not None else []
    if site is not None:
        spans = _site_spans(site, _cuda_snapshot(torch))
    else:
        spans = sorted({key for key in map(_storage_key, given) if key is not None})
    table = _SpanTable(spans)
    live = _live_instances(torch.Tensor)
    try:
        hits = [t for t in live if table.holds(_storage_key(t))]
        hits += [t for t in given if _storage_key(t) is None]  # no storage: the object itself
        refs = [weakref.ref(t) for t in hits]
        hits.clear()
        saved = _graph_saves(live, table) if spans else []
    finally:
        live.clear()
        given.clear()
    return refs, saved


def _given_tensors(tensors: Any, tensor_type: type) -> List[Any]:
    """The argument of :func:`why` as a list of tensors."""
    if isinstance(tensors, tensor_type):
        return [tensors]
    out = list(tensors)
    for t in out:
        if not isinstance(t, tensor_type):
            out.clear()
            raise TypeError(f"why() takes tensors, got a {type(t).__name__}")
    return out


def _cuda_snapshot(torch: Any) -> Dict[str, Any]:
    """PyTorch's snapshot of the CUDA caching allocator (segments and blocks)."""
    return torch.cuda.memory._snapshot()


def _parse_site(site: str) -> Tuple[str, int]:
    """``"train.py:42"`` as ``("train.py", 42)``."""
    path, sep, line = site.strip().rpartition(":")
    if not sep or not path or not line.isdigit():
        raise ValueError(f"site {site!r}: FILE:LINE expected, as memlens prints it (train.py:42)")
    return path.replace("\\", "/"), int(line)


def _site_spans(site: str, snapshot: Dict[str, Any]) -> List[Tuple[int, int]]:
    """``(address, size)`` of the live blocks whose stack has ``site``."""
    path, line = _parse_site(site)
    spans = []
    framed = live = 0
    for segment in snapshot.get("segments", ()):
        for address, size, block in _blocks(segment):
            if block.get("state") != "active_allocated":
                continue
            live += 1
            frames = _frames(block)
            framed += bool(frames)
            if any(_at(frame, path, line) for frame in frames):
                spans.append((address, size))
    if live and not framed:
        raise ValueError(
            "the CUDA snapshot has no stack frames: call "
            "torch.cuda.memory._record_memory_history() before the allocations"
        )
    return sorted(spans)


def _blocks(segment: Dict[str, Any]) -> Iterator[Tuple[int, int, Dict[str, Any]]]:
    """``(address, size, block)`` of a segment's blocks (older snapshots give
    no block address: blocks follow each other from the segment's)."""
    address = segment.get("address", 0)
    for block in segment.get("blocks", ()):
        address = block.get("address", address)
        yield address, block["size"], block
        address += block["size"]


def _frames(block: Dict[str, Any]) -> List[Dict[str, Any]]:
    """A block's allocation stack (``frames``, or those of its ``history``)."""
    frames = block.get("frames")
    if frames:
        return frames
    return [f for h in block.get("history", ()) for f in h.get("frames", ())]


def _at(frame: Dict[str, Any], path: str, line: int) -> bool:
    """Whether a snapshot frame is ``path:line`` (``path`` matched as a suffix)."""
    if frame.get("line") != line:
        return False
    name = str(frame.get("filename", "")).replace("\\", "/")
    return name == path or name.endswith("/" + path.lstrip("/"))


class _SpanTable:
    """Sorted address ranges; answers whether a storage starts inside one."""

    def __init__(self, spans: Sequence[Tuple[int, int]]) -> None:
        self.starts = [start for start, _ in spans]
        self.ends = [start + size for start, size in spans]

    def holds(self, key: Optional[StorageKey]) -> bool:
        """Whether the storage ``key`` starts inside a span."""
        if key is None:
            return False
        i = bisect.bisect_right(self.starts, key[0]) - 1
        return i >= 0 and key[0] < self.ends[i]


def _storage_key(tensor: Any) -> Optional[StorageKey]:
    """``(data_ptr, nbytes)`` of a tensor's storage; None without one."""
    try:
        storage = tensor.untyped_storage()
        key = (int(storage.data_ptr()), int(storage.nbytes()))
    except Exception:  # meta, sparse, fake tensors
        return None
    return key if key[0] and key[1] else None


def _live_instances(base: type) -> List[Any]:
    """Every object the collector tracks that is an instance of ``base``
    (tensors and modules are all tracked). The filter runs in C
    (``compress`` over ``map``): a loop in Python over a million objects
    would cost a quarter of a second."""
    every = gc.get_objects()
    try:
        kinds = {cls for cls in set(map(type, every)) if _subclass(cls, base)}
        return list(itertools.compress(every, map(kinds.__contains__, map(type, every))))
    finally:
        every.clear()


def _subclass(cls: type, base: type) -> bool:
    try:
        return issubclass(cls, base)
    except TypeError:
        return False


# ---------------------------------------------------------------- autograd graphs


def _graph_saves(live: List[Any], table: _SpanTable) -> List[Saved]:
    """The live tensors whose ``grad_fn`` graph saves a target storage."""
    below: Dict[int, FrozenSet[StorageKey]] = {}  # node id -> storages saved at or below it
    keep: List[Any] = []  # the nodes met, so that their ids stay theirs
    names: Dict[StorageKey, Set[str]] = {}
    attrs: Dict[type, Tuple[str, ...]] = {}
    out = []
    try:
        for tensor in live:
            fn = _grad_fn(tensor)
            if fn is None:
                continue
            keys = _saved_below(fn, below, keep, names, attrs, table)
            if keys:
                nodes = sorted({n for key in keys for n in names[key]})
                out.append(Saved(weakref.ref(tensor), keys, tuple(nodes)))
            del fn
    finally:
        keep.clear()
    return out


def _grad_fn(tensor: Any) -> Any:
    """``tensor.grad_fn``, or None."""
    try:
        return tensor.grad_fn
    except Exception:
        return None


def _saved_below(
    root: Any,
    below: Dict[int, FrozenSet[StorageKey]],
    keep: List[Any],
    names: Dict[StorageKey, Set[str]],
    attrs: Dict[type, Tuple[str, ...]],
    table: _SpanTable,
) -> FrozenSet[StorageKey]:
    """The target storages saved by ``root`` and the nodes below it
    (post-order over ``next_functions``, each node once across calls)."""
    empty: FrozenSet[StorageKey] = frozenset()
    stack: List[Tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            if id(node) in below:
                continue
            keep.append(node)
            below[id(node)] = empty  # graphs have no cycles; this marks it met
            stack.append((node, True))
            stack.extend((nxt, False) for nxt in _next_nodes(node) if id(nxt) not in below)
            continue
        own = _node_saves(node, attrs, table)
        for key in own:
            names.setdefault(key, set()).add(type(node).__name__)
        below[id(node)] = _union([own] + [below.get(id(n), empty) for n in _next_nodes(node)])
    return below[id(root)]


def _next_nodes(node: Any) -> List[Any]:
    """The nodes a graph node leads to."""
    try:
        return [n for n, _ in node.next_functions if n is not None]
    except Exception:
        return []


def _union(sets: List[FrozenSet[StorageKey]]) -> FrozenSet[StorageKey]:
    """The union, reusing the one non-empty set when there is one (chains stay cheap)."""
    full = [s for s in sets if s]
    if not full:
        return frozenset()
    if all(s is full[0] for s in full):
        return full[0]
    return frozenset().union(*full)


def _node_saves(node: Any, attrs: Dict[type, Tuple[str, ...]], table: _SpanTable) -> Set[StorageKey]:
    """The target storages a node saves itself (each saved tensor is read
    once and dropped: reading makes a new tensor object every time)."""
    found: Set[StorageKey] = set()
    for name in _saved_attrs(node, attrs):
        try:
            value = getattr(node, name)
        except Exception:  # freed by backward, or modified in place
            continue
        for item in value if isinstance(value, (tuple, list)) else (value,):
            key = _storage_key(item) if hasattr(item, "untyped_storage") else None
            if table.holds(key):
                found.add(key)  # type: ignore[arg-type]
        del value
    return found


def _saved_attrs(node: Any, attrs: Dict[type, Tuple[str, ...]]) -> Tuple[str, ...]:
    """The attributes of a node's class that return saved tensors."""
    cls = type(node)
    if cls not in attrs:
        listed = dir(node)
        saved = [n for n in listed if n.startswith("_saved_")]
        saved += [n for n in ("saved_tensors", "variable") if n in listed]
        attrs[cls] = tuple(saved)
    return attrs[cls]


# ---------------------------------------------------------------- roots


class _Env(NamedTuple):
    """torch's types, when torch is imported (the search imports nothing)."""

    tensor: Optional[type]
    module: Optional[type]


def _env() -> _Env:
    torch = sys.modules.get("torch")
    nn = sys.modules.get("torch.nn")
    tensor = getattr(torch, "Tensor", None)
    module = getattr(nn, "Module", None)
    return _Env(
        tensor if isinstance(tensor, type) else None,
        module if isinstance(module, type) else None,
    )


def _is_ours(path: str) -> bool:
    """Whether a file belongs to the memlens package."""
    folder = os.path.dirname(os.path.abspath(path))
    return folder == _PACKAGE_DIR or folder.startswith(_PACKAGE_DIR + os.sep)


def _module_name(module: types.ModuleType) -> str:
    """A module as a user names it: a script run as ``__main__`` by its file."""
    name = getattr(module, "__name__", None) or "?"
    if name == "__main__":
        path = getattr(module, "__file__", None)
        if path:
            return os.path.splitext(os.path.basename(path))[0]
    return name


def _module_dicts() -> Tuple[Dict[int, str], Set[int]]:
    """ids of the ``__dict__`` of the modules in ``sys.modules`` with their
    names, and the ids of memlens's own module dicts."""
    names: Dict[int, str] = {}
    ours: Set[int] = set()
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        space = vars(module)
        path = space.get("__file__")
        if space is globals() or (isinstance(path, str) and _is_ours(path)):
            ours.add(id(space))
        else:
            names.setdefault(id(space), _module_name(module))
    return names, ours


class _Local(NamedTuple):
    """A running frame's local variable, as a root."""

    name: str
    label: str  # "train() local 'history'"
    where: str  # "train.py:12"


def _running_frames() -> List[types.FrameType]:
    """The running frames of every thread but the search's own. (This
    function's own frame is among the tops: a local still naming it when the
    function returns would be a cycle that keeps the caller's frames and
    arguments alive until the next collection; hence the cleanup.)"""
    frames = []
    tops = list(sys._current_frames().values())
    frame: Optional[types.FrameType] = None
    try:
        for frame in tops:
            while frame is not None:
                if not _is_ours(frame.f_code.co_filename):
                    frames.append(frame)
                frame = frame.f_back
    finally:
        tops.clear()
        frame = None
    return frames


def _frame_name(frame: types.FrameType) -> str:
    return f"{frame.f_code.co_name}()"


def _frame_where(frame: types.FrameType) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _frame_locals(frames: List[types.FrameType]) -> Dict[int, List[_Local]]:
    """id of each value held by a running function's local -> the locals."""
    out: Dict[int, List[_Local]] = {}
    for frame in frames:
        if not frame.f_code.co_flags & _CO_OPTIMIZED:
            continue  # module level: its locals are the module's globals
        label, where = _frame_name(frame), _frame_where(frame)
        for name, value_id in _local_ids(frame):
            out.setdefault(value_id, []).append(_Local(name, f"{label} local '{name}'", where))
    return out


def _local_ids(frame: types.FrameType) -> List[Tuple[str, int]]:
    """``(name, id(value))`` of a frame's locals (cells give their contents),
    read without leaving a copy of them on the frame (see the module doc)."""
    try:
        space = frame.f_locals
    except Exception:
        return []
    pairs = [(str(name), id(value)) for name, value in space.items()]
    if type(space) is dict and frame.f_code.co_flags & _CO_OPTIMIZED and _may_clear(frame):
        # Our read made (or refreshed) the frame's snapshot dict: the frame
        # and `space` are its only holders (getrefcount's argument is the
        # third), so nobody can see it and emptying it frees our references.
        if sys.getrefcount(space) <= 3:
            space.clear()
    del space
    return pairs


def _may_clear(frame: types.FrameType) -> bool:
    """Whether no Python tracer can be between syncing a frame's locals and
    writing them back (a debugger's ``LocalsToFast`` would read the cleared
    snapshot as deleted locals)."""
    threading = sys.modules.get("threading")
    return (
        frame.f_trace is None
        and sys.gettrace() is None
        and getattr(threading, "_trace_hook", None) is None
    )


def _local_name(frame: types.FrameType, child: Any) -> Optional[str]:
    """The local of a (finished) frame that holds ``child`` or the cell ``child``."""
    targets = {id(child)}
    if isinstance(child, types.CellType):
        try:
            targets.add(id(child.cell_contents))
        except ValueError:  # an empty cell
            pass
    for name, value_id in _local_ids(frame):
        if value_id in targets:
            return name
    return None


# ---------------------------------------------------------------- naming one reference


class _Step(NamedTuple):
    """How a parent holds a child on the way down to the targets."""

    kind: str  # attr, hook, closure, default, frame, note, pass
    text: str = ""
    where: str = ""
    name: str = ""  # the variable, argument or function named by the step
    role: Any = None  # what the child is to its own children (a closure tuple...)
    module: bool = False  # an nn.Module's attribute


_PASS = _Step("pass")


def _step(parent: Any, child: Any, role: Any, env: _Env) -> _Step:
    """Names the reference from ``parent`` to ``child``; ``role`` is what
    ``parent`` was to its own parent (a module's ``__dict__``, a closure
    tuple...), or None."""
    if role is not None:
        return _role_step(parent, child, role)
    if isinstance(parent, types.FunctionType):
        return _function_step(parent, child)
    if isinstance(parent, types.FrameType):
        return _frame_step(parent, child)
    if isinstance(parent, (types.TracebackType, types.MethodType, types.CellType)):
        return _PASS
    if isinstance(parent, _CONTAINERS):
        return _Step("note", _describe(parent, env))
    return _object_step(parent, child, env)


def _role_step(parent: Any, child: Any, role: Tuple[Any, ...]) -> _Step:
    """A step out of a namespace dict, a hook dict, a closure or defaults tuple."""
    tag = role[0]
    if tag == "names":
        name = _key_for(parent, child)
        if name is None:
            return _Step("note", f"a key of a {type(parent).__name__}")
        return _attr_step(name, child, role[1])
    if tag == "keys":
        name = _key_for(parent, child)
        return _Step("attr", f"[{name!r}]") if name is not None else _Step("note", "a dict")
    if tag == "hooks":
        name = _hook_name(child)
        return _Step("hook", f"{role[1]} {name}", name=name)
    if tag == "closure":
        fn = role[1]
        i = _index_of(parent, child)
        free = fn.__code__.co_freevars
        var = free[i] if i is not None and i < len(free) else "?"
        return _Step("pass", role=("cell", fn, var))
    if tag == "cell":
        fn, var = role[1], role[2]
        return _Step("closure", f"closure of {fn.__qualname__}", _def_site(fn), var)
    if tag in ("defaults", "kwdefaults"):
        fn = role[1]
        if tag == "defaults":
            arg = _default_name(fn, _index_of(parent, child))
        else:
            arg = _key_for(parent, child) or "?"
        return _Step("default", f"default argument '{arg}' of {fn.__qualname__}", _def_site(fn), arg)
    return _PASS


def _function_step(fn: types.FunctionType, child: Any) -> _Step:
    """A function holds values through its closure, defaults and ``__dict__``."""
    if child is fn.__closure__:
        return _Step("pass", role=("closure", fn))
    if child is fn.__defaults__:
        return _Step("pass", role=("defaults", fn))
    if child is fn.__kwdefaults__:
        return _Step("pass", role=("kwdefaults", fn))
    if isinstance(child, dict) and child is fn.__dict__:
        return _Step("pass", role=("names", False))
    return _Step("note", f"function {fn.__qualname__}")


def _frame_step(frame: types.FrameType, child: Any) -> _Step:
    """A finished frame (kept by a traceback) holds its locals."""
    name = _local_name(frame, child)
    if name is None:
        return _Step("note", f"frame of {_frame_name(frame)}")
    role = ("cellvalue",) if isinstance(child, types.CellType) else None
    return _Step("frame", f"{_frame_name(frame)} local '{name}'", _frame_where(frame), name, role)


def _object_step(parent: Any, child: Any, env: _Env) -> _Step:
    """An object holds values as attributes (``__dict__``, inline values, slots)."""
    module = env.module is not None and isinstance(parent, env.module)
    space = _instance_dict(parent)
    if space is not None and child is space:
        return _Step("pass", role=("names", module))
    if isinstance(parent, type) and isinstance(child, dict):
        return _Step("pass", role=("names", False))  # the class's namespace
    name = _key_for(space, child) if space is not None else None
    if name is None:
        name = _slot_for(parent, child)
    if name is None:
        return _Step("note", f"a {type(parent).__name__}")
    return _attr_step(name, child, module)


def _namespace_like(container: Any) -> bool:
    """A small dict keyed by str (``{"model": model, "opt": opt}``): its keys
    name what it holds, as attributes do."""
    return (
        type(container) is dict
        and len(container) <= _NAMESPACE_ITEMS
        and all(isinstance(key, str) for key in container)
    )


def _attr_step(name: str, child: Any, module: bool) -> _Step:
    """An attribute; an nn.Module's submodules, parameters, buffers and hooks
    are named as the user writes them (``model.layer3``, a forward hook)."""
    if module and name in _MODULE_MAPS:
        return _Step("pass", role=("names", True))
    if module and name.endswith("hooks") and isinstance(child, dict):
        return _Step("pass", role=("hooks", _hook_label(name)))
    return _Step("attr", "." + name, module=module)


def _hook_label(attr: str) -> str:
    """``_forward_pre_hooks`` -> ``forward pre-hook``."""
    words = attr.strip("_")[: -len("hooks")].strip("_")
    if words.endswith("_pre"):
        return words[: -len("_pre")].replace("_", " ") + " pre-hook"
    return (words.replace("_", " ") + " hook").strip()


def _instance_dict(obj: Any) -> Optional[dict]:
    """``obj.__dict__`` when it is a plain dict (not a class's mappingproxy)."""
    try:
        space = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return space if type(space) is dict else None


def _key_for(space: Any, child: Any) -> Optional[str]:
    """The key under which a dict holds ``child``."""
    try:
        items = list(space.items())
    except Exception:
        return None
    for key, value in items:
        if value is child:
            return key if isinstance(key, str) else repr(key)
    return None


def _slot_for(obj: Any, child: Any) -> Optional[str]:
    """The ``__slots__`` member of ``obj`` that holds ``child``."""
    for cls in type(obj).__mro__:
        for name, member in vars(cls).items():
            if isinstance(member, types.MemberDescriptorType):
                try:
                    if member.__get__(obj, cls) is child:
                        return name
                except AttributeError:
                    continue
    return None


def _index_of(sequence: Any, child: Any) -> Optional[int]:
    for i, item in enumerate(sequence):
        if item is child:
            return i
    return None


def _default_name(fn: types.FunctionType, index: Optional[int]) -> str:
    """The parameter whose default is ``fn.__defaults__[index]``."""
    code = fn.__code__
    positional = code.co_varnames[: code.co_argcount]
    j = len(positional) - len(fn.__defaults__ or ()) + (index if index is not None else -10**9)
    return positional[j] if 0 <= j < len(positional) else "?"


def _def_site(fn: types.FunctionType) -> str:
    code = fn.__code__
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _hook_name(fn: Any) -> str:
    """A hook as registered: a function's or method's name, ``partial(name)``."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and not hasattr(fn, "__name__"):
        return f"partial({_hook_name(inner)})"
    return getattr(fn, "__name__", None) or type(fn).__name__


# ---------------------------------------------------------------- describing


def _describe(container: Any, env: _Env) -> str:
    """``list of 1,024 tensors (4.0 GiB)``, ``dict keyed by int (200 items, 8.0 MiB)``."""
    kind = type(container).__name__
    n = len(container)
    if isinstance(container, dict):
        keys = _item_word(container.keys(), env)
        total = _tensor_bytes(container.values(), n, env)
        inside = f"{n:,} item{'s' if n != 1 else ''}" + (f", {_size(total)}" if total else "")
        return f"{kind} keyed by {keys} ({inside})" if keys else f"{kind} ({inside})"
    word = _item_word(container, env) or "item"
    total = _tensor_bytes(container, n, env)
    return f"{kind} of {_count(n, word)}" + (f" ({_size(total)})" if total else "")


def _item_word(items: Iterable[Any], env: _Env) -> Optional[str]:
    """The one kind of the items (``tensor``, ``int``, ``function``), or None if mixed."""
    first = None
    for i, item in enumerate(items):
        if i >= 1000:
            break
        if env.tensor is not None and isinstance(item, env.tensor):
            word = "tensor"
        elif isinstance(item, (types.FunctionType, types.BuiltinFunctionType)):
            word = "function"
        else:
            word = type(item).__name__
        if first is None:
            first = word
        elif word != first:
            return None
    return first


def _tensor_bytes(items: Iterable[Any], n: int, env: _Env) -> int:
    """Bytes of the distinct storages of the tensors among ``items``
    (0 past 100,000 items, to stay fast)."""
    if env.tensor is None or n > 100_000:
        return 0
    keys = {_storage_key(x) for x in items if isinstance(x, env.tensor)}
    keys.discard(None)
    return sum(size for _, size in keys)  # type: ignore[misc]


def _size(n: int) -> str:
    """Bytes in binary units: ``512 B``, ``4.0 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------- the search


class _Root(NamedTuple):
    """Where a path starts: a namespace (module dict, module, class) or a local."""

    node: int  # id of the root object, or of the local's value
    expr: str  # "train", "model"
    kind: str  # "global", "local", "unknown"
    label: str = ""  # the root's own name when it is not expr: "train() local 'model'"
    root: str = ""  # said in Holder.root when the path goes further
    where: str = ""
    role: Any = None  # what the root object is to its children
    value: bool = False  # the root is the value itself (a local)


@dataclass(frozen=True)
class _Trail:
    """The name of a path, built one step at a time from its root down."""

    kind: str
    expr: str
    start: str
    label: str = ""
    root: str = ""
    where: str = ""
    head: Optional[str] = None  # the holder's name, once a step settled it
    tail: str = ""  # the expression after the head (a closure variable's attributes)
    tail0: str = ""
    notes: Tuple[str, ...] = ()
    rank: int = 0  # _RANK of the root

    @classmethod
    def of(cls, root: _Root) -> "_Trail":
        rank = _RANK.get(root.kind, 0)
        return cls(root.kind, root.expr, root.expr, root.label, root.root, root.where, rank=rank)

    def reached(self) -> str:
        """What the path names so far."""
        return self.label if self.label and self.expr == self.start else self.expr

    def reached_full(self) -> str:
        return self.root if self.root and self.expr == self.start else self.expr

    def flushed(self) -> Tuple[str, ...]:
        return self.notes + ((self.tail,) if self.tail != self.tail0 else ())

    def after(self, step: _Step) -> "_Trail":
        if step.kind == "attr":
            return self._attr(step)
        if step.kind in ("hook", "closure", "default"):
            return self._special(step)
        if step.kind == "frame":
            note = f"{step.text} ({step.where})"
            head = self.head if self.head is not None else self.reached()
            return replace(self, head=head, notes=self.flushed() + (note,), tail=step.name, tail0=step.name)
        if step.kind == "note":
            return replace(self, notes=self.flushed() + (step.text,), tail0=self.tail)
        return self

    def _attr(self, step: _Step) -> "_Trail":
        if self.head is not None:
            return replace(self, tail=self.tail + step.text)
        expr = self.expr + step.text
        kind = self.kind
        if step.module and kind in ("global", "local"):
            kind = "module"
        if expr in _SYS_LAST:
            kind = "traceback"
        return replace(self, expr=expr, kind=kind)

    def _special(self, step: _Step) -> "_Trail":
        """A hook, a closure or a default argument: the first one names the holder."""
        if self.head is not None:
            note = step.text + (f" variable '{step.name}'" if step.kind == "closure" else "")
            note += f" ({step.where})" if step.where else ""
            return replace(self, notes=self.flushed() + (note,), tail=step.name, tail0=step.name)
        if step.kind == "hook":
            head, root = f"{step.text} on {self.reached()}", self.root
            notes = self.notes
        else:
            head, root = step.text, self.reached_full()
            notes = self.notes + ((f"variable '{step.name}'",) if step.kind == "closure" else ())
        return replace(
            self, kind=step.kind, head=head, root=root, where=step.where,
            notes=notes, tail=step.name, tail0=step.name,
        )

    def found(self, node: int, container: str = "", inside: Tuple[str, ...] = ()) -> "_Found":
        """The holder this path names, for the targets under ``node``
        (``container``: how ``node`` is described when the name ends at it,
        ``inside``: what lies between it and the targets)."""
        path = self.head if self.head is not None else self.reached()
        via = self.flushed() + ((container,) if container else ()) + inside
        where = self.where if self.kind in ("local", "closure", "default") else ""
        root = self.root if self.root and path != self.label else ""
        rank = _RANK_PLAIN_LOCAL if self.kind == "local" else self.rank
        return _Found(self.kind, path, where, root, via, node, rank)


class _Found(NamedTuple):
    kind: str
    path: str
    where: str
    root: str
    via: Tuple[str, ...]
    node: int  # the targets it keeps are those under this node
    rank: int


class _Group:
    """The holders found under one name, merged."""

    def __init__(self, found: _Found, order: int) -> None:
        self.found = found
        self.order = order
        self.items: Set[Any] = set()  # storage keys, or ("object", id)

    def holder(self, kind: str, path: str) -> Holder:
        keys = [k for k in self.items if k[0] != "object"]
        f = self.found
        return Holder(kind, path, len(self.items), sum(k[1] for k in keys), f.where, f.root, f.via)


class _Search:
    """The reverse-reference walk. It holds the objects it meets (in
    ``objs``, skipped as a referrer) until :meth:`close`."""

    def __init__(self, env: _Env, ignore: Set[int]) -> None:
        self.env = env
        self.ignore = ignore
        self.objs: Dict[int, Any] = {}
        self.children: Dict[int, List[int]] = {}
        self.roots: List[_Root] = []
        self.root_ids: Set[int] = set()
        self.keys: Dict[int, Any] = {}  # target id -> storage key or ("object", id)
        self.saves: Dict[int, Saved] = {}  # graph owner id -> what its graph saves
        self.left: List[int] = []  # frontier left when the walk stopped short
        self.every: List[Any] = []  # gc.get_objects(), taken when a frontier is large
        self.modules, ours = _module_dicts()
        frames = _running_frames()
        self.running = {id(f) for f in frames}
        self.locals = _frame_locals(frames)
        frames.clear()
        self.skip = ours | {
            id(self.objs), id(self.children), id(self.roots), id(self.every), id(gc.garbage),
        }

    # -- targets

    def add_targets(self, targets: Iterable[Any], saved: Sequence[Saved]) -> None:
        """Dereferences the targets and the graph owners into ``objs``."""
        for target in targets:
            obj = target() if isinstance(target, weakref.ref) else target
            if obj is None:
                continue
            key = _storage_key(obj) if self.env.tensor and isinstance(obj, self.env.tensor) else None
            self.keys[id(obj)] = key if key is not None else ("object", id(obj))
            self.objs[id(obj)] = obj
            del obj
        for entry in saved:
            owner = entry.owner()
            if owner is not None:
                self.saves[id(owner)] = entry
                self.objs[id(owner)] = owner
            del owner

    # -- the walk

    def walk(self, max_depth: int) -> None:
        """Level by level from the targets up, until no object is left to
        expand, ``max_depth`` levels, or ``_MAX_NODES`` objects."""
        frontier = list(self.objs)
        for _ in range(max_depth):
            self._note_locals(frontier)
            if not frontier or len(self.objs) > _MAX_NODES:
                break
            frontier = self._level(frontier)
        else:
            self._note_locals(frontier)
        self.left = frontier

    def _note_locals(self, frontier: List[int]) -> None:
        """Frontier objects held by a running function's local are roots (and
        are still expanded: a global may hold them too)."""
        for nid in frontier:
            for local in self.locals.get(nid, ()):
                self.roots.append(_Root(
                    nid, local.name, "local", local.label,
                    f"{local.label} ({local.where})", local.where, value=True,
                ))

    def _level(self, frontier: List[int]) -> List[int]:
        """The objects that refer to the frontier and were not met before."""
        wanted = set(frontier)
        found = self._referrers(frontier, wanted)
        nxt = []
        for ref in found:
            rid = id(ref)
            if rid in self.skip or self._ignored(ref):
                continue
            kids = [id(c) for c in gc.get_referents(ref) if id(c) in wanted]
            if not kids:
                continue
            if rid in self.objs:
                self.children.setdefault(rid, []).extend(k for k in kids if k != rid)
                continue
            self.objs[rid] = ref
            self.children[rid] = kids
            root = self._root_of(ref)
            if root is not None:
                self.roots.append(root)
                self.root_ids.add(rid)
            else:
                nxt.append(rid)
        found.clear()
        return nxt

    def _referrers(self, frontier: List[int], wanted: Set[int]) -> List[Any]:
        """Every tracked object that refers to a frontier object."""
        if len(frontier) <= _REFERRERS_AT_ONCE:
            # An exact tuple: CPython < 3.13 passes it on as the call's
            # argument tuple, which gc.get_referrers leaves out of its answer;
            # 3.13 makes a new one, and then `batch` is among the referrers.
            batch = tuple(self.objs[i] for i in frontier)
            found = gc.get_referrers(*batch)
            return [ref for ref in found if ref is not batch]
        return self._scan_referrers(wanted)

    def _scan_referrers(self, wanted: Set[int]) -> List[Any]:
        """The referrers of a large frontier: one pass over ``gc.get_objects()``
        testing a chunk of objects at once (their referents' ids against the
        frontier's), and one object at a time only inside a matching chunk."""
        if not self.every:
            self.every.extend(gc.get_objects())
        every, referents = self.every, gc.get_referents
        hits = []
        for i in range(0, len(every), _CHUNK):
            chunk = every[i : i + _CHUNK]
            if not wanted.isdisjoint(map(id, referents(*chunk))):
                hits.extend(o for o in chunk if not wanted.isdisjoint(map(id, referents(o))))
            chunk.clear()
        return hits

    def _ignored(self, ref: Any) -> bool:
        """Running frames (their locals are roots already) and memlens's frames."""
        if isinstance(ref, types.FrameType):
            return id(ref) in self.running or _is_ours(ref.f_code.co_filename)
        return False

    def _root_of(self, ref: Any) -> Optional[_Root]:
        """A module's namespace, a module object or a class: a global."""
        rid = id(ref)
        if rid in self.modules:
            return _Root(rid, self.modules[rid], "global", role=("names", False))
        if isinstance(ref, types.ModuleType):
            return _Root(rid, _module_name(ref), "global")
        if isinstance(ref, type):
            module = sys.modules.get(getattr(ref, "__module__", ""), None)
            prefix = _module_name(module) if isinstance(module, types.ModuleType) else ref.__module__
            return _Root(rid, f"{prefix}.{ref.__qualname__}", "global")
        return None

    # -- naming

    def holders(self, limit: int) -> List[Holder]:
        """The holders found, merged by name, those keeping the most bytes first."""
        groups: Dict[Tuple[str, str], _Group] = {}
        for root in self.roots:
            self._collect(self._render(root), groups)
        self._collect(self._unnamed(groups), groups)
        ranked = sorted(
            ((group.holder(kind, path), group) for (kind, path), group in groups.items()),
            key=lambda pair: (-pair[0].bytes, pair[1].found.rank, pair[1].order),
        )
        return [holder for holder, _ in ranked[:limit]]

    def _collect(self, found: List[_Found], groups: Dict[Tuple[str, str], _Group]) -> None:
        """Adds each found path's targets (and graphs) to the group of its name."""
        for f in found:
            under = self._under(f.node)
            direct = {self.keys[t] for t in under if t in self.keys}
            if direct:
                self._group(groups, (f.kind, f.path), f).items.update(direct)
            owners = [self.saves[t] for t in under if t in self.saves]
            if owners:
                nodes = sorted({n for s in owners for n in s.nodes})
                shown = ", ".join(nodes[:3]) + (", ..." if len(nodes) > 3 else "")
                path = f"autograd graph of {f.path} (saved by {shown})"
                group = self._group(groups, ("autograd", path), f)
                group.items.update(k for s in owners for k in s.storages)

    def _group(self, groups: Dict[Tuple[str, str], _Group], key: Tuple[str, str], f: _Found) -> _Group:
        if key not in groups:
            groups[key] = _Group(f, len(groups))
        return groups[key]

    def _render(self, root: _Root) -> List[_Found]:
        """The named paths from one root down to the targets."""
        out: List[_Found] = []
        trail = _Trail.of(root)
        seen: Set[int] = set()
        if root.value:
            self._descend(root.node, trail, None, out, seen)
            return out
        seen.add(root.node)
        parent = self.objs[root.node]
        for kid in self.children.get(root.node, ()):
            step = _step(parent, self.objs[kid], root.role, self.env)
            self._descend(kid, trail.after(step), step.role, out, seen)
        return out

    def _descend(self, nid: int, trail: _Trail, role: Any, out: List[_Found], seen: Set[int]) -> None:
        """Follows the references from ``nid`` down; a container ends the name."""
        if nid in seen:
            return
        seen.add(nid)
        node = self.objs[nid]
        if nid in self.keys or nid in self.saves:
            out.append(trail.found(nid))
        kids = self.children.get(nid, ())
        if not kids:
            return
        if role is None and isinstance(node, _CONTAINERS):
            if not _namespace_like(node):
                out.append(trail.found(nid, _describe(node, self.env), self._inside(nid)))
                return
            role = ("keys",)
        for kid in kids:
            step = _step(node, self.objs[kid], role, self.env)
            self._descend(kid, trail.after(step), step.role, out, seen)

    def _inside(self, nid: int) -> Tuple[str, ...]:
        """What lies between a container and the targets (closures, frames,
        nested containers), along its first reference down."""
        kids = self.children.get(nid)
        if not kids:
            return ()
        trail = _Trail("", "", "", head="")
        cur, role, seen = kids[0], None, {nid}
        while cur not in seen and cur not in self.keys and cur not in self.saves:
            seen.add(cur)
            kids = self.children.get(cur)
            if not kids:
                break
            step = _step(self.objs[cur], self.objs[kids[0]], role, self.env)
            trail, cur, role = trail.after(step), kids[0], step.role
        return trail.flushed()

    def _under(self, nid: int) -> Set[int]:
        """The targets and graph owners at or below ``nid``."""
        found, stack, seen = set(), [nid], {nid}
        while stack:
            cur = stack.pop()
            if cur in self.keys or cur in self.saves:
                found.add(cur)
            for kid in self.children.get(cur, ()):
                if kid not in seen:
                    seen.add(kid)
                    stack.append(kid)
        return found

    def _unnamed(self, groups: Dict[Tuple[str, str], _Group]) -> List[_Found]:
        """Paths for targets no root reaches: from the topmost objects that
        hold them (a reference cycle, or a reference from C code)."""
        covered = set().union(*(g.items for g in groups.values())) if groups else set()
        left = set(self.left)
        parents = self._parents()
        out: List[_Found] = []
        for tid, key in self.keys.items():
            if key in covered or not parents.get(tid):
                continue  # named, or held by nothing the collector sees
            for top in self._tops(tid, parents):
                if top in self.ignore:
                    continue
                reason = "the search stopped here (max_depth, or too many objects)" if top in left else (
                    "held by no global, running function or module "
                    "(a reference cycle not yet collected, or a reference from C code)"
                )
                name = f"<{type(self.objs[top]).__name__}>"
                trail = _Trail("unknown", name, name, notes=(reason,), rank=_RANK["unknown"])
                self._descend(top, trail, None, out, set())
        return out

    def _parents(self) -> Dict[int, List[int]]:
        parents: Dict[int, List[int]] = {}
        for pid, kids in self.children.items():
            for kid in kids:
                parents.setdefault(kid, []).append(pid)
        return parents

    def _tops(self, tid: int, parents: Dict[int, List[int]]) -> List[int]:
        """The objects above ``tid`` that nothing met refers to (and that are
        not roots)."""
        tops, stack, seen = [], [tid], {tid}
        while stack:
            cur = stack.pop()
            ups = parents.get(cur, ())
            if not ups and cur != tid and cur not in self.root_ids:
                tops.append(cur)
            for up in ups:
                if up not in seen:
                    seen.add(up)
                    stack.append(up)
        return [t for t in tops if t not in self.locals][:5]

    def close(self) -> None:
        """Drops every reference the search holds (the rest are ids and strings)."""
        self.objs.clear()
        self.roots.clear()
        self.every.clear()
        self.saves.clear()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The collector off for the search; back on after only if it was on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
