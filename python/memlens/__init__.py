"""memlens: a GPU memory doctor for PyTorch.

Two jobs, both in the user's own Python process:

* **Capture** (:func:`record`, :func:`start`, :func:`step`, :func:`stop`):
  turns on PyTorch's CUDA memory history, writes snapshots every N steps and
  at the end, writes one at the moment of a CUDA out-of-memory error and
  explains it on stderr, warns (:class:`LeakWarning`) when the memory kept
  between steps grows steadily, and publishes live figures for ``memlens top``.
* **Analysis** (:func:`load`): reads a snapshot in Rust (the GIL is released)
  and returns plain result objects: ``memlens.load(p).summary().reserved_bytes``.

Importing memlens never imports torch; the capture helpers import it lazily.
The ``memlens`` command is installed too, and a pytest plugin with the
``@pytest.mark.cuda_memory(max_peak="2GiB", no_leaks=True)`` marker.
"""

from ._native import MemlensError, __version__
from ._analysis import Result, Snapshot, available, load
from ._fit import fit, predict, predict_config
from ._trace import Trace, trace_step
from ._profile import Profile, profile
from ._why import Holder, why
from ._capture import (
    LeakWarning,
    MemlensWarning,
    Recorder,
    record,
    start,
    step,
    stop,
)

__all__ = [
    "Holder",
    "LeakWarning",
    "MemlensError",
    "MemlensWarning",
    "Profile",
    "Recorder",
    "Result",
    "Snapshot",
    "Trace",
    "__version__",
    "available",
    "fit",
    "load",
    "predict",
    "predict_config",
    "profile",
    "record",
    "start",
    "step",
    "stop",
    "trace_step",
    "why",
]
