"""Callbacks for the training frameworks people already use.

* :mod:`memlens.integrations.huggingface`: ``MemlensCallback`` for the
  Hugging Face ``transformers.Trainer``;
* :mod:`memlens.integrations.lightning`: ``MemlensCallback`` for
  ``lightning.pytorch.Trainer``.

Each records GPU memory with :class:`memlens.Recorder` for the length of the
training run, marks every optimizer step with ``memlens.step()``, writes
snapshots every ``every`` steps and at the end (and one at a CUDA OOM, with
memlens's explanation on stderr), and puts the leak alarm and OOM snapshot
paths into the framework's logs.

Importing ``memlens`` (or this package) never imports a framework: only the
module of that framework does, and it says what to install when the framework
is missing.
"""
