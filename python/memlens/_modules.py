"""Module names in snapshots: ``memlens.record(..., model=model)``.

A snapshot's frames carry only function names (``forward``), not which
module instance ran. With a model given, memlens registers a forward pre-hook
and a forward hook on each of its modules that open and close a
``record_function`` scope named ``memlens.module QUALNAME:CLASS``
(``memlens.module transformer.h.3.attn:GPT2Attention``; the root's QUALNAME is
empty). ``_record_memory_history`` keeps those scopes, with their times, in the
snapshot's ``external_annotations``, and ``memlens peak --by module`` puts each
allocation under the innermost module whose scope was open when it was made.

Cost: two record_function calls per module call (measured in BENCHMARKS.md);
the hooks are removed when recording stops.
"""

from __future__ import annotations

from typing import Any, List

# Prefix of the scopes; the analysis (crates/memlens/src/analysis/modules.rs)
# reads the same string.
MODULE_MARKER = "memlens.module "


class ModuleScopes:
    """The hooks on one model; :meth:`remove` takes them off."""

    def __init__(self, torch: Any, model: Any) -> None:
        self._handles: List[Any] = []
        rf = getattr(getattr(getattr(torch, "autograd", None), "profiler", None), "record_function", None)
        if rf is None:
            raise RuntimeError("this torch has no torch.autograd.profiler.record_function")
        for qualname, module in model.named_modules():
            name = f"{MODULE_MARKER}{qualname}:{type(module).__name__}"
            # A stack per module: a module may be called again inside its
            # own forward (recursion, weight sharing).
            open_scopes: List[Any] = []

            def pre(_module: Any, _args: Any, name: str = name, open_scopes: List[Any] = open_scopes) -> None:
                scope = rf(name)
                scope.__enter__()
                open_scopes.append(scope)

            def post(_module: Any, _args: Any, _out: Any, open_scopes: List[Any] = open_scopes) -> None:
                if open_scopes:
                    open_scopes.pop().__exit__(None, None, None)

            try:
                # prepend: the scope opens before hooks registered earlier
                # run, so that what they allocate for this module (FSDP's
                # all-gather of its parameters) is named by it.
                self._handles.append(module.register_forward_pre_hook(pre, prepend=True))
            except TypeError:  # torch < 2.0
                self._handles.append(module.register_forward_pre_hook(pre))
            try:
                # always_call: the scope closes even when forward raises (an OOM).
                self._handles.append(module.register_forward_hook(post, always_call=True))
            except TypeError:  # torch < 2.0
                self._handles.append(module.register_forward_hook(post))

    def remove(self) -> None:
        """Removes every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles = []
