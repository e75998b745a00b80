"""``MemlensCallback`` for ``lightning.pytorch.Trainer``::

    from memlens.integrations.lightning import MemlensCallback

    trainer = lightning.pytorch.Trainer(callbacks=[MemlensCallback(every=200)])
    trainer.fit(model, loader)

* ``on_fit_start``: starts recording (snapshots in
  ``<trainer.default_root_dir>/memlens`` unless ``path_or_dir`` is given);
* ``on_train_batch_end``: ``memlens.step()`` when the batch ended an optimizer
  step (``trainer.global_step`` moved: with gradient accumulation, once per
  cycle), which writes a snapshot every ``every`` steps and runs the leak alarm;
  then logs ``memlens/leak_alarm`` (0 or 1), ``memlens/ooms`` and
  ``memlens/snapshots`` through ``pl_module.log`` (Lightning's loggers take
  numbers only; the alarm's text is the :class:`memlens.LeakWarning` and
  :attr:`MemlensCallback.leak_alarm`);
* a CUDA out-of-memory error: the snapshot ``snapshot.oom.pickle`` and the
  explanation on stderr come from the recorder, at the moment of the OOM; then
  ``on_exception`` writes the final snapshot and stops;
* ``on_fit_end``: the final snapshot.

Without CUDA (or torch) recording is off, with one :class:`memlens.MemlensWarning`,
and the callback does nothing else.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    from lightning.pytorch import Callback
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "memlens.integrations.lightning needs the `lightning` package "
        "(pip install lightning); memlens itself works without it"
    ) from e

from ._session import Session

__all__ = ["MemlensCallback"]


class MemlensCallback(Callback):
    """Records GPU memory during ``Trainer.fit()``; see the module doc.

    ``path_or_dir``: where snapshots go (default
    ``<trainer.default_root_dir>/memlens``). ``every``: a snapshot every N
    optimizer steps (None: only the final one and OOMs). ``recorder``: a
    :class:`memlens.Recorder` (or an object with its face) to drive instead of
    a new one. ``log``: whether to log the figures through ``pl_module.log``.
    Other keyword options go to :class:`memlens.Recorder`.
    """

    def __init__(
        self,
        path_or_dir: Optional[str] = None,
        *,
        every: Optional[int] = 100,
        recorder: Any = None,
        log: bool = True,
        **options: Any,
    ) -> None:
        self.session = Session(path_or_dir, recorder, dict(options, every=every))
        self.log = log
        self.final_snapshot: Optional[str] = None
        self._global_step = 0

    @property
    def leak_alarm(self) -> Optional[str]:
        """The leak alarm, once it fired."""
        return self.session.leak_alarm

    @property
    def snapshots(self) -> list:
        """The snapshots written so far."""
        return self.session.snapshots

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._global_step = int(trainer.global_step)
        self.session.begin(str(getattr(trainer, "default_root_dir", None) or "."))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # global_step counts optimizer steps: a batch that only accumulated
        # gradients leaves it where it was.
        now = int(trainer.global_step)
        if now == self._global_step:
            return
        self._global_step = now
        self.session.step()
        self.session.news()  # the alarm's text is the LeakWarning; numbers below
        if self.log:
            for name, value in self.session.figures().items():
                pl_module.log(name, value, on_step=True, on_epoch=False, logger=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish()

    def _finish(self) -> None:
        final = self.session.end()
        if final is not None:
            self.final_snapshot = final
