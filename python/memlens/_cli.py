"""The ``memlens`` console script: runs the Rust CLI in this process.

maturin cannot ship a Rust binary and a PyO3 module in one wheel, so the
command is a ``[project.scripts]`` entry that calls ``memlens_cli::run(argv)``
through the extension module. The exit code comes back (0 ok, 1 a check
failed, 2 bad input or usage) and becomes the process's.
"""

from __future__ import annotations

import signal
import sys
from typing import Optional, Sequence


def _behave_like_a_native_tool() -> None:
    # CPython ignores SIGPIPE, so `memlens ... | head` would make Rust's
    # println! fail with a broken pipe; restoring the default makes the process
    # end quietly, like any Unix tool. Likewise Ctrl-C only sets a Python flag
    # that Rust never looks at while it runs; the default handler stops it now.
    for name in ("SIGPIPE", "SIGINT"):
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            # Not the main thread, or not allowed here: keep Python's handler.
            pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``memlens`` with ``argv`` (default: ``sys.argv``) and returns its exit code."""
    from . import _native

    args = list(sys.argv if argv is None else argv)
    _behave_like_a_native_tool()
    # Python's buffered output must come out before Rust writes to the same fds.
    sys.stdout.flush()
    sys.stderr.flush()
    return int(_native.run_cli(["memlens", *args[1:]]))
