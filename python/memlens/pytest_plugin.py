"""pytest plugin (entry point ``pytest11``): the ``cuda_memory`` marker.

::

    @pytest.mark.cuda_memory(max_peak="2GiB", max_reserved="3GiB", no_leaks=True)
    def test_training_step():
        ...

The test fails with memlens's diagnosis when a limit is broken (see
``memlens._guard`` for what each limit measures) and is skipped, with the
reason, when torch or CUDA is absent. Snapshots of failing tests go to
``--memlens-dir`` (default ``<tmp>/memlens-pytest-<uid>``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Generator

import pytest

MARKER = "cuda_memory"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("memlens", "memlens GPU memory limits")
    group.addoption(
        "--memlens-dir",
        default=None,
        help="where the cuda_memory marker writes the snapshots of failing tests "
        "(default: <tmp>/memlens-pytest-<uid>)",
    )


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(max_peak=None, max_reserved=None, no_leaks=False, leak_tolerance=0): "
        "fail the test when its CUDA memory peak, reserved memory or leaked memory "
        "breaks the limit; sizes like '2GiB' (memlens)",
    )


def _limits(item: Any) -> Any:
    from ._guard import limits

    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    try:
        return limits(*marker.args, **marker.kwargs)
    except (TypeError, ValueError) as e:
        problem = str(e)
    # Outside the except block, so the report is the one line, not a chain.
    pytest.fail(f"memlens: bad @pytest.mark.{MARKER}(...): {problem}", pytrace=False)


def _snapshot_dir(config: Any) -> str:
    chosen = config.getoption("memlens_dir", default=None)
    if chosen:
        return str(chosen)
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"memlens-pytest-{uid}")


def pytest_runtest_setup(item: Any) -> None:
    if _limits(item) is None:
        return
    from ._guard import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is not None:
        pytest.skip(f"memlens {MARKER}: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Generator[None, Any, None]:
    lim = _limits(item)
    if lim is None:
        yield
        return
    import torch

    from ._guard import Guard, snapshot_file

    guard = Guard(torch, lim, snapshot_file(_snapshot_dir(item.config), item.nodeid))
    guard.before()
    outcome = yield
    failure = guard.after(test_failed=outcome.excinfo is not None)
    if failure is None:
        return
    exc = pytest.fail.Exception(failure, pytrace=False)
    force = getattr(outcome, "force_exception", None)
    if force is not None:
        force(exc)
    else:  # pluggy < 1.1
        raise exc
