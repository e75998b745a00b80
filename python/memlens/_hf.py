"""A Hugging Face model's training step from its config alone, for
:func:`memlens.predict` (issue 30: "from a config, with no GPU memory used").

``hf_step(config)`` gives the ``build`` and ``step`` that
``memlens.predict`` traces with fake tensors: the model made from the config
(random weights, nothing downloaded), in training mode, an optimizer over its
parameters, and a step of random token ids as inputs and labels: forward,
loss, backward, optimizer step, gradients set to None. Which model head: the
config's own ``architectures`` when it names one, else a causal LM, else a
sequence-to-sequence LM (T5), else a masked LM.
"""

import os
from typing import Any, Callable, Dict, Tuple, Union

# The optimizers a step can take, as torch.optim makes them.
OPTIMIZERS = ("adamw", "adamw-fused", "adamw-for-loop", "adam", "sgd")
_HEADS = (
    ("AutoModelForCausalLM", ("ForCausalLM", "LMHeadModel")),
    ("AutoModelForSeq2SeqLM", ("ForConditionalGeneration",)),
    ("AutoModelForMaskedLM", ("ForMaskedLM",)),
)


def load_config(config: Union[str, "os.PathLike[str]", Dict[str, Any], Any]) -> Any:
    """A transformers config from a ``config.json`` path, a folder holding
    one, a dict (with its ``model_type``) or a config object."""
    import transformers

    if isinstance(config, (str, os.PathLike)):
        return transformers.AutoConfig.from_pretrained(os.fspath(config))
    if isinstance(config, dict):
        fields = dict(config)
        model_type = fields.pop("model_type", None)
        if model_type is None:
            raise ValueError("a config dict needs its model_type (\"llama\", \"t5\", ...)")
        return transformers.AutoConfig.for_model(model_type, **fields)
    return config


def _auto_class(cfg: Any) -> Any:
    import transformers

    names = [a for a in (getattr(cfg, "architectures", None) or []) if isinstance(a, str)]
    for auto, suffixes in _HEADS:
        if any(name.endswith(suffixes) for name in names):
            return getattr(transformers, auto)
    for auto, _ in _HEADS:
        cls = getattr(transformers, auto)
        try:
            if type(cfg) in cls._model_mapping:
                return cls
        except Exception:  # noqa: BLE001 - a mapping this version lacks
            continue
    raise ValueError(f"no language-model head in transformers for a {type(cfg).__name__}")


def _optimizer(torch: Any, params: Any, name: str) -> Any:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    if name == "adamw-for-loop":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {name!r}")


def hf_step(config: Any, *, seq: int = 512, optimizer: str = "adamw") -> Tuple[Callable[[int], Any], Callable[[Any], None]]:
    """``(build, step)`` for :func:`memlens.predict`: ``build(batch)`` makes
    the model from ``config`` (see :func:`load_config`) on the GPU with its
    optimizer; ``step`` runs one training step on ``batch`` x ``seq`` random
    token ids."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    import torch

    cfg = load_config(config)
    auto = _auto_class(cfg)
    vocab = int(cfg.vocab_size)

    def build(batch: int) -> Any:
        torch.manual_seed(0)
        model = auto.from_config(cfg).to("cuda")
        model.train()
        return model, _optimizer(torch, model.parameters(), optimizer), batch

    def step(state: Any) -> None:
        model, opt, batch = state
        ids = torch.randint(3, vocab, (batch, seq), device="cuda")
        out = model(input_ids=ids, labels=ids)
        loss = out.loss
        # A training loop keeps the loss, not the outputs (logits, cache).
        del out
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    return build, step
