"""The explanation printed at a CUDA out-of-memory error.

:func:`explain_oom` is the one place that decides what is said: the Rust OOM
explainer (``_native.explain_oom_file``) when this build has it, else the
snapshot's summary and the command that explains it.
"""

from __future__ import annotations

from . import _native


def explain_oom(path: str) -> str:
    """Text explaining the OOM captured in the snapshot at ``path``."""
    explain = getattr(_native, "explain_oom_file", None)
    if explain is not None:
        return str(explain(path))
    from ._analysis import load

    try:
        summary = load(path).summary()
    except (NotImplementedError, _native.MemlensError) as e:
        return f"  (this build of memlens cannot read it: {e})\n  explain it with: memlens oom {path}"
    lines = ["  allocator state at the OOM (memlens summary):"]
    for key, value in summary.to_dict().items():
        if key == "schema" or isinstance(value, (list, dict)):
            continue
        if key.endswith("_bytes") and isinstance(value, int):
            value = _native.format_bytes(value)
        lines.append(f"    {key.replace('_bytes', '').replace('_', ' ')}: {value}")
    lines.append(f"  explain it with: memlens oom {path}")
    return "\n".join(lines)
