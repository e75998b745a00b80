"""Analysis from Python: :func:`load` a snapshot, call an analysis, get a result.

The bridge is generic. The Rust binding runs an analysis and returns the very
JSON document ``memlens NAME --json`` prints; :class:`Result` wraps it with
attribute access, ``to_dict()`` and ``to_pandas()``. No analysis logic lives
here: a method below only names the analysis and passes its options.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from typing import Any, Dict, Iterator, List, Optional, Union

from . import _native

PathLike = Union[str, "os.PathLike[str]"]

# The list-valued key that makes the natural table of each analysis, for
# Result.to_pandas() with no key. Presentation only.
# Analyses whose result is a set of figures (one row), not a table: their
# frame is that row by default (``check``'s ``failures`` is empty when the
# check passes; ``summary``'s lists, devices and pools, are detail).
_ROW_KINDS = {"check", "summary"}

_TABLE_KEYS = {
    "doctor": "findings",
    "peak": "live_at_peak",
    "lines": "rows",
    "modules": "groups",
    "diff": "grown",
    "leaks": "leaks",
    "oom": "fixes",
    "tune": "candidates",
}


def available() -> List[str]:
    """Names of the analyses this build of memlens provides."""
    return list(_native.analyses())


class Result:
    """The result of one analysis: attribute access over the JSON document.

    ``r.reserved_bytes`` and ``r["reserved_bytes"]`` read a key; nested objects
    come back as :class:`Result` too and lists as lists. ``to_dict()`` gives
    the plain document (equal to ``memlens NAME --json``), ``to_pandas()`` a
    DataFrame of the table the analysis returns.
    """

    __slots__ = ("_data", "_kind")

    def __init__(self, data: Dict[str, Any], kind: str = "result") -> None:
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_kind", kind)

    @property
    def kind(self) -> str:
        """Which analysis produced this result (``"summary"``, ``"peak"``, ...)."""
        return self._kind

    def __getattr__(self, name: str) -> Any:
        data = object.__getattribute__(self, "_data")
        try:
            return _wrap(data[name], name)
        except KeyError:
            raise AttributeError(
                f"{self._kind} result has no field {name!r}; fields: {', '.join(data)}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("memlens results are read-only")

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key], key)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> List[str]:
        """The field names."""
        return list(self._data)

    def get(self, key: str, default: Any = None) -> Any:
        """A field, or ``default`` when absent."""
        return _wrap(self._data[key], key) if key in self._data else default

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | {k for k in self._data if k.isidentifier()})

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Result):
            return self._data == other._data
        if isinstance(other, dict):
            return self._data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like dict

    def __repr__(self) -> str:
        fields = []
        for k, v in self._data.items():
            if k == "schema":
                continue
            if isinstance(v, list):
                fields.append(f"{k}=[{len(v)} items]")
            elif isinstance(v, dict):
                fields.append(f"{k}={{...}}")
            else:
                fields.append(f"{k}={v!r}")
        return f"{self._kind.capitalize()}({', '.join(fields)})"

    def to_dict(self) -> Dict[str, Any]:
        """The plain JSON document, as ``memlens NAME --json`` prints it (a deep copy)."""
        return copy.deepcopy(self._data)

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The JSON document as text."""
        return json.dumps(self._data, indent=indent)

    def to_pandas(self, key: Optional[str] = None) -> Any:
        """A pandas DataFrame of a list-valued field (default: the analysis's
        main table, e.g. ``live_at_peak`` for peak), or a one-row frame of the
        scalar fields when the result has no table, and by default for
        ``summary`` and ``check`` (figures, not a table). Needs pandas
        installed."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "Result.to_pandas() needs pandas: pip install pandas "
                "(or use to_dict(), which needs nothing)"
            ) from None
        tables = [k for k, v in self._data.items() if _is_table(v)]
        if key is None and self._kind in _ROW_KINDS:
            return pd.DataFrame([self._scalars()])
        if key is None:
            key = _TABLE_KEYS.get(self._kind)
            if key not in self._data:
                key = tables[0] if len(tables) == 1 else None
        if key is None:
            if tables:
                raise ValueError(
                    f"{self._kind} result has several tables; pass key= one of {tables}"
                )
            return pd.DataFrame([self._scalars()])
        value = self._data[key]
        if not isinstance(value, list):
            raise ValueError(f"field {key!r} is not a list")
        return pd.DataFrame(copy.deepcopy(value))

    def _scalars(self) -> dict:
        """The fields that are neither lists nor dicts (``schema`` left out)."""
        return _scalar_row(self._data)


def _scalar_row(data: dict) -> dict:
    return {k: v for k, v in data.items() if not isinstance(v, (list, dict)) and k != "schema"}


def _is_table(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _wrap(value: Any, kind: str) -> Any:
    if isinstance(value, dict):
        return Result(value, kind)
    if isinstance(value, list):
        return [_wrap(v, kind) for v in value]
    return value


SnapshotLike = Union["Snapshot", PathLike, Dict[str, Any]]


class Snapshot:
    """A snapshot read by the Rust core. Create with :func:`load`.

    Every analysis method returns a :class:`Result`; one that this build does
    not provide raises ``NotImplementedError``. Parsing and analysis run with
    the GIL released.
    """

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def path(self) -> str:
        """The file it was read from (``"<memory>"`` for an in-memory snapshot)."""
        return self._native.path

    @property
    def event_count(self) -> int:
        """Trace events over all devices."""
        return self._native.event_count

    @property
    def devices(self) -> List[int]:
        """Device ordinals present in the snapshot."""
        return list(self._native.devices)

    @property
    def warnings(self) -> List[str]:
        """Problems found while reading that did not stop the analysis."""
        return list(self._native.warnings)

    def to_arrow(self, rank: Optional[int] = None) -> Dict[str, Any]:
        """The tables of ``memlens export`` as ``pyarrow.Table``: a dict with
        ``events``, ``blocks``, ``segments`` and ``frames`` (the same columns as
        the Parquet files; ``rank`` fills the ``rank`` column). For Polars,
        ``polars.from_arrow(t)``; for pandas, ``t.to_pandas()``. Needs pyarrow
        (``pip install pyarrow``)."""
        try:
            import pyarrow.ipc
        except ImportError as e:
            raise ImportError(
                "Snapshot.to_arrow() needs pyarrow: pip install pyarrow"
            ) from e
        return {
            name: pyarrow.ipc.open_stream(data).read_all()
            for name, data in self._native.arrow_ipc(rank)
        }

    def __repr__(self) -> str:
        return repr(self._native)

    def _repr_html_(self) -> str:
        """Jupyter's view: a compact summary (figures and findings)."""
        from ._notebook import summary_html

        return summary_html(self.path, self.summary().to_dict(), self.doctor().to_dict())

    def report_html(self, *others: SnapshotLike) -> str:
        """The self-contained HTML report of this snapshot (and ``others``,
        later snapshots of the run) as text."""
        from ._notebook import write_report_text

        return write_report_text(self, others)

    def show_report(self, *others: SnapshotLike, height: int = 900, theme: Optional[str] = None) -> Any:
        """Shows the HTML report inline in a Jupyter notebook (an
        ``IPython.display.HTML`` of an ``<iframe srcdoc>``; no server, no
        network), in the notebook's theme (``theme="dark"`` or ``"light"``
        forces one). Needs IPython."""
        from ._notebook import iframe_html

        try:
            from IPython.display import HTML
        except ImportError:
            raise ImportError(
                "show_report() needs IPython (Jupyter); report_html() gives the page as text"
            ) from None
        return HTML(iframe_html(self.report_html(*others), height, theme))

    def _run(self, name: str, *others: SnapshotLike, **options: Any) -> Result:
        natives = [load(o)._native for o in others]
        opts = {k: _plain(v) for k, v in options.items() if v is not None}
        text = self._native.analyze(name, natives, json.dumps(opts))
        return Result(json.loads(text), name)

    def summary(self) -> Result:
        """Allocator state at dump time (``memlens summary``)."""
        return self._run("summary")

    def peak(self, top: Optional[int] = None) -> Result:
        """The peak of the trace and what was live at it, by site (``memlens peak``)."""
        return self._run("peak", top=top)

    def modules(self) -> Result:
        """What was live at the peak by module, as a tree (``memlens peak --by module``)."""
        return self._run("modules")

    def lines(self, target: str, scope: Optional[str] = None) -> Result:
        """Memory allocated and freed by each line of ``FILE[:FUNCTION]``
        (``memlens lines``)."""
        file, _, function = target.rpartition(":")
        if not file or function.isdigit() or len(file) == 1:
            file, function = target, ""
        return self._run("lines", file=file, function=function or None, scope=scope)

    def diff(self, other: SnapshotLike) -> Result:
        """What ``other`` holds that this snapshot did not, and the reverse (``memlens diff``)."""
        return self._run("diff", other)

    def leaks(self, *later: SnapshotLike) -> Result:
        """Leak candidates, within this trace or across this and ``later`` snapshots
        (in the order taken) (``memlens leaks``)."""
        return self._run("leaks", *later)

    def oom(self, message: Optional[str] = None, optimizer: Optional[str] = None) -> Result:
        """Why an allocation failed and what would fix it (``memlens oom``).
        ``optimizer`` ("adamw", "adam", "sgd-momentum", "sgd"): the run's, whose
        state a run that failed in its first step had not made yet (Adam(W)'s
        is assumed without it)."""
        return self._run("oom", message=message, optimizer=optimizer)

    def simulate(
        self,
        config: Optional[str] = None,
        device_memory: Union[int, str, None] = None,
    ) -> Result:
        """Replays the trace under ``config`` (``PYTORCH_CUDA_ALLOC_CONF`` syntax)
        on a device of ``device_memory`` (bytes or ``"80GiB"``) (``memlens simulate``)."""
        return self._run("simulate", config=config, device_memory=device_memory)

    def tune(self, device_memory: Union[int, str, None] = None) -> Result:
        """Simulates the usual allocator settings and ranks them (``memlens tune``)."""
        return self._run("tune", device_memory=device_memory)

    def check(
        self,
        max_peak: Union[int, str, None] = None,
        max_reserved: Union[int, str, None] = None,
    ) -> Result:
        """A memory gate: ``ok`` is False when a peak is over its limit (``memlens check``)."""
        return self._run("check", max_peak=max_peak, max_reserved=max_reserved)

    def report(self, path: PathLike, *others: SnapshotLike) -> Result:
        """Writes the self-contained HTML report to ``path`` (``memlens report``)."""
        return self._run("report", *others, path=os.fspath(path))

    def doctor(self, path: Optional[PathLike] = None) -> Result:
        """The whole diagnosis: findings and, when ``path`` is given, the HTML report."""
        return self._run("doctor", path=None if path is None else os.fspath(path))


def _plain(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def load(source: SnapshotLike) -> Snapshot:
    """Reads a snapshot: a file (.pickle, .pickle.gz, .pickle.zst, JSON), or the
    dict ``torch.cuda.memory._snapshot()`` returns. Raises
    :class:`memlens.MemlensError` with a one-line message on bad input. Reading
    a file can be interrupted with Ctrl-C (``KeyboardInterrupt``)."""
    if isinstance(source, Snapshot):
        return source
    if isinstance(source, (dict, list)):
        data = pickle.dumps(source, protocol=4)
        return Snapshot(_native.Snapshot.from_bytes(data, "<memory>"))
    return Snapshot(_native.Snapshot.load(os.fspath(source)))
