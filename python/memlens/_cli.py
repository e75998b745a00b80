"""The ``memlens`` console script: runs the ``memlens`` binary.

The Python extension depends on the memlens library only (no command line, no
terminal UI, no NVML). The command line is the Rust binary itself, which the
wheel carries inside the package (``memlens/_bin/memlens``, put there by
``tests/python/run.sh`` before ``maturin build``; a plain ``pip install .``
falls back to a ``memlens`` built by ``cargo install``). This script finds it and
replaces the Python process with it, so exit codes, signals and closed pipes
behave as the binary's own. ``MEMLENS_BIN`` names another binary to run.
"""

from __future__ import annotations

import os
import subprocess
import sys
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
        sys.stderr.write(
            "memlens: error: the memlens binary is not in this installation "
            "(install it with `cargo install --locked --path crates/memlens-cli` or set MEMLENS_BIN)\n"
        )
        return 2
    # Python's buffered output must come out before the binary writes to the same fds.
    sys.stdout.flush()
    sys.stderr.flush()
    if argv is None and os.name == "posix":
        # The process becomes the binary: no Python left to ignore SIGPIPE or
        # to hold Ctrl-C in a flag.
        os.execv(exe, ["memlens", *args])
    return subprocess.run([exe, *args]).returncode
