"""What memlens writes into snapshot files and how, shared by the recorder
(``memlens.record``) and the fake-tensor tracer (``memlens.trace_step``).
Imports nothing of memlens (the tracer is loaded on its own where the
native module is not built: tests/gpu/fake_step.py)."""

import os
import pickle
from typing import Any, Dict

# Name of the record_function scope memlens.step() opens and closes at the end of
# each step; the analysis reads it from `external_annotations` as the step marker.
STEP_MARKER = "memlens.step"


def write_snapshot(snapshot: Dict[str, Any], path: str) -> None:
    """What torch.cuda.memory._dump_snapshot does, but through a temporary
    file so a reader never sees half a snapshot."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f)
    os.replace(tmp, path)
