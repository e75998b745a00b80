"""``MemlensCallback`` for the Hugging Face ``transformers.Trainer``::

    from memlens.integrations.huggingface import MemlensCallback

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[MemlensCallback(every=200)])
    trainer.train()

* ``on_train_begin``: starts recording (snapshots in ``<output_dir>/memlens``
  unless ``path_or_dir`` is given; each rank writes its own);
* ``on_step_end`` (after each optimizer step, so once per gradient
  accumulation cycle): ``memlens.step()``, which writes a snapshot every
  ``every`` steps and runs the leak alarm;
* a CUDA out-of-memory error: the snapshot ``snapshot.oom.pickle`` and the
  explanation on stderr come from the recorder, at the moment of the OOM;
* ``on_log``: the leak alarm (``memlens/leak_alarm``, ``memlens/leak_site``,
  ``memlens/leak_alarm_step``) and a new OOM snapshot (``memlens/oom_snapshot``)
  go into that log entry, once each: into ``logs`` for the reporting callbacks
  after this one, and into ``state.log_history`` (which the Trainer filled
  before calling the callbacks);
* ``on_train_end``: the final snapshot (``memlens/final_snapshot`` in
  ``state.log_history``).

Without CUDA (or torch) recording is off, with one :class:`memlens.MemlensWarning`,
and the callback does nothing else.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "memlens.integrations.huggingface needs the `transformers` package "
        "(pip install transformers); memlens itself works without it"
    ) from e

from ._session import PREFIX, Session

__all__ = ["MemlensCallback"]


class MemlensCallback(TrainerCallback):
    """Records GPU memory during ``Trainer.train()``; see the module doc.

    ``path_or_dir``: where snapshots go (default ``<args.output_dir>/memlens``).
    ``every``: a snapshot every N optimizer steps (None: only the final one and
    OOMs). ``recorder``: a :class:`memlens.Recorder` (or an object with its
    face) to drive instead of a new one. Other keyword options go to
    :class:`memlens.Recorder` (``leak_check``, ``leak_min_bytes``,
    ``max_entries``...).
    """

    def __init__(
        self,
        path_or_dir: Optional[str] = None,
        *,
        every: Optional[int] = 100,
        recorder: Any = None,
        **options: Any,
    ) -> None:
        self.session = Session(path_or_dir, recorder, dict(options, every=every))

    @property
    def leak_alarm(self) -> Optional[str]:
        """The leak alarm, once it fired."""
        return self.session.leak_alarm

    @property
    def snapshots(self) -> list:
        """The snapshots written so far."""
        return self.session.snapshots

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.begin(str(getattr(args, "output_dir", None) or "."))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.step()

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        news = self.session.news()
        if not news:
            return
        if logs is not None:
            logs.update(news)
        _into_history(state, news)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # An alarm that fired after the last log would otherwise go unlogged.
        news = self.session.news()
        final = self.session.end()
        if final is not None:
            news[PREFIX + "final_snapshot"] = final
        if news:
            news["step"] = state.global_step
            state.log_history.append(news)


def _into_history(state: Any, news: Dict[str, Any]) -> None:
    """Adds ``news`` to the entry the Trainer just appended for this log call."""
    history = getattr(state, "log_history", None)
    if history is None:
        return
    if history and history[-1].get("step") == state.global_step:
        history[-1].update(news)
    else:
        history.append(dict(news, step=state.global_step))
