"""The ``memlens`` console script: runs the ``memlens`` binary.

The command line is the Rust binary, which the wheel carries inside the
package (``memlens/_bin/memlens``, put there by ``tests/python/run.sh`` before
``maturin build``), or a ``memlens`` built by ``cargo install`` on the PATH.
This script finds it and replaces the Python process with it, so exit codes,
signals and closed pipes behave as the binary's own. ``MEMLENS_BIN`` names
another binary to run. A package built by a plain ``pip install .`` has no
binary (maturin builds the extension module only): then the same command line,
compiled into the extension, runs in this process (``_native.run_cli``), with
Ctrl-C and closed pipes set back to end the process as they would the binary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional, Sequence


def binary() -> Optional[str]:
    """The ``memlens`` binary to run: ``$MEMLENS_BIN``, else the one in the
    package, else a native ``memlens`` on the PATH (``cargo install``), never a
    script such as this one."""
    env = os.environ.get("MEMLENS_BIN")
    if env:
        return env
    name = "memlens.exe" if os.name == "nt" else "memlens"
    shipped = Path(__file__).resolve().parent / "_bin" / name
    if shipped.is_file():
        return str(shipped)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder or ".") / name
        if candidate.is_file() and os.access(candidate, os.X_OK) and not _is_script(candidate):
            return str(candidate)
    return None


def _is_script(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``memlens`` with ``argv`` (default: ``sys.argv``) and returns its exit code."""
    args = list(sys.argv if argv is None else argv)[1:]
    exe = binary()
    if exe is None:
        return _run_in_process(args, whole_process=argv is None)
    # Python's buffered output must come out before the binary writes to the same fds.
    sys.stdout.flush()
    sys.stderr.flush()
    if argv is None and os.name == "posix":
        # The process becomes the binary: no Python left to ignore SIGPIPE or
        # to hold Ctrl-C in a flag.
        os.execv(exe, ["memlens", *args])
    return subprocess.run([exe, *args]).returncode


def _run_in_process(args: Sequence[str], whole_process: bool) -> int:
    """The command line compiled into the extension module, run here;
    `whole_process`: this process is the console script, not a caller's."""
    from memlens import _native

    sys.stdout.flush()
    sys.stderr.flush()
    if whole_process and os.name == "posix" and threading.current_thread() is threading.main_thread():
        # Python ignores SIGPIPE and turns SIGINT into an exception it checks
        # between bytecodes: neither reaches Rust code, so give both their
        # default (end the process), as the binary has them.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return int(_native.run_cli(["memlens", *args]))
