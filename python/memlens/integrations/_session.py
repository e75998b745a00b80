"""What every framework callback does, whatever the framework: start a
recording at the start of training, step it at each optimizer step, stop it at
the end, and say once what is new for the logs (a leak alarm, an OOM snapshot).

The framework modules only map their hooks onto :class:`Session`, so this
logic is tested once, with the fake torch of the tests, and each framework's
wiring is tested against the real framework.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from .. import _capture

#: Prefix of every key memlens adds to a framework's logs.
PREFIX = "memlens/"


class Session:
    """One callback's recording.

    ``path_or_dir``: where snapshots go (None: ``<the run's output dir>/memlens``,
    given to :meth:`begin`). ``recorder``: a recorder to drive instead of a new
    :class:`memlens.Recorder` (anything with its ``start``/``step``/``stop`` and
    ``active``, ``steps``, ``snapshots``, ``leak_alarm``, ``leak_sites``,
    ``ooms``). ``options``: passed to :class:`memlens.Recorder` (``every``,
    ``leak_check``, ``max_entries``...).
    """

    def __init__(self, path_or_dir: Optional[str], recorder: Any, options: Dict[str, Any]) -> None:
        self.path_or_dir = path_or_dir
        self.options = options
        self.recorder: Any = recorder
        # Whether this session started the recorder and so must stop it; a
        # recording the user started around the training is theirs to stop.
        self.owned = False
        self.final_snapshot: Optional[str] = None
        self._alarm_logged = False
        # The step at which the alarm was first seen (it fires inside step()).
        self._alarm_step: Optional[int] = None
        self._ooms_logged = 0

    # -- the hooks ------------------------------------------------------------

    def begin(self, default_dir: str) -> None:
        """Starts recording, unless it already runs (a retry of the same training
        after an OOM, or a recording the user started themselves)."""
        if self.recorder is not None and self.recorder.active:
            return
        if self.recorder is None:
            current = _capture.current()
            if current is not None and current.active:
                self.recorder = current
                return
            where = self.path_or_dir or os.path.join(default_dir, "memlens")
            self.recorder = _capture.Recorder(where, **self.options)
        self.recorder.start()
        self.owned = True

    def step(self) -> None:
        """The end of one optimizer step."""
        rec = self.recorder
        if rec is None:
            return
        rec.step()
        if rec.leak_alarm and self._alarm_step is None:
            self._alarm_step = int(rec.steps)

    def end(self) -> Optional[str]:
        """Stops a recording this session started; returns the final snapshot's
        path (None when nothing was recorded or the recording is the user's)."""
        rec = self.recorder
        if rec is None or not self.owned or not rec.active:
            return None
        self.final_snapshot = rec.stop()
        self.owned = False
        return self.final_snapshot

    # -- what the logs get ----------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether GPU memory is being recorded now."""
        return bool(self.recorder is not None and self.recorder.active)

    @property
    def leak_alarm(self) -> Optional[str]:
        """The recorder's one-line leak alarm, once it fired."""
        return None if self.recorder is None else self.recorder.leak_alarm

    @property
    def snapshots(self) -> List[str]:
        """Snapshots written so far (periodic, OOM and final)."""
        return [] if self.recorder is None else list(self.recorder.snapshots)

    def news(self) -> Dict[str, Any]:
        """Log entries not given before: the leak alarm (its text, the step it
        fired at, the top growing site) once, and the path of each new OOM
        snapshot. Empty when nothing is new."""
        rec = self.recorder
        out: Dict[str, Any] = {}
        if rec is None:
            return out
        if rec.leak_alarm and not self._alarm_logged:
            self._alarm_logged = True
            out[PREFIX + "leak_alarm"] = rec.leak_alarm
            out[PREFIX + "leak_alarm_step"] = self._alarm_step if self._alarm_step is not None else int(rec.steps)
            sites = getattr(rec, "leak_sites", None) or []
            if sites:
                out[PREFIX + "leak_site"] = str(sites[0].get("site", "?"))
        ooms = min(int(rec.ooms), _capture.MAX_OOM_SNAPSHOTS)
        if ooms > self._ooms_logged:
            kinds = ["oom" if n == 1 else f"oom{n}" for n in range(self._ooms_logged + 1, ooms + 1)]
            paths = [p for p in rec.snapshots if any(p.endswith(f".{k}.pickle") for k in kinds)]
            out[PREFIX + "oom_snapshot"] = paths[-1] if paths else None
            out[PREFIX + "ooms"] = int(rec.ooms)
            self._ooms_logged = ooms
        return out

    def figures(self) -> Dict[str, float]:
        """Numeric entries for loggers that take only numbers (Lightning's):
        whether the leak alarm fired, OOMs and snapshots so far."""
        rec = self.recorder
        if rec is None or not (rec.active or rec.snapshots):
            return {}
        return {
            PREFIX + "leak_alarm": 1.0 if rec.leak_alarm else 0.0,
            PREFIX + "ooms": float(rec.ooms),
            PREFIX + "snapshots": float(len(rec.snapshots)),
        }
