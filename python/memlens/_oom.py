"""The explanation printed at a CUDA out-of-memory error.

:func:`explain_oom` is the one place that decides what is said: the Rust OOM
explainer (``_native.explain_oom_file``) when this build has it, else the
snapshot's summary and the command that explains it (also when the snapshot
holds no ``oom`` event to explain).
"""

from __future__ import annotations

from . import _native


def explain_oom(path: str) -> str:
    """Text explaining the OOM captured in the snapshot at ``path``."""
    explain = getattr(_native, "explain_oom_file", None)
    if explain is not None:
        try:
            return str(explain(path))
        except _native.MemlensError:
            # No `oom` event in the trace (recording off, or a torch that
            # does not log it): the summary below still says what was live.
            pass
    try:
        text = _native.summary_text(path)
    except _native.MemlensError as e:
        text = f"(this build of memlens cannot read it: {e})"
    return f"{text.rstrip()}\n  explain it with: memlens oom {path}"
