"""Evidence for `memlens fit --checkpoint` (issue 30): what activation
checkpointing really does to a training step's memory, against what memlens
predicts from a recording made without it.

    python tests/gpu/checkpoint.py OUT_DIR [WORKLOAD,...] [--batch N]

For each workload of tests/gpu/fit_probes.py (the same models, the same
steps), three processes of their own, so that none inherits another's cache:
- `record`: the step as written, recorded from the start of the process with
  the module scopes `memlens.record(model=...)` writes (memlens's own
  `_modules.ModuleScopes`, loaded from python/memlens without the native
  part), dumped to OUT_DIR/<workload>.pickle.gz;
- `plain`: the same step unrecorded (the recording must not change the peaks);
- `checkpointed`: every instance of the workload's repeated block class run
  under `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`: for a
  transformers model through its own `gradient_checkpointing_enable()` (which
  also turns the KV cache off in training), else by wrapping each instance.
- `record_late` (LATE_ONLY=1, instead of the three above): the step recorded
  as `memlens.record(model=...)` records it, from once the model is built
  (`context="alloc"`, `stacks="python"`, `skip_actions=["free_requested"]`
  unless NO_SKIP=1), to `<workload>.late.pickle.gz`;
- `checkpointed_record` (workloads named in RECORD_CHECKPOINTED): the
  checkpointed run recorded with its module scopes, to compare the rewrite's
  operations with the real ones.
Every step keeps its loss and drops the model's outputs before backward, as
a training loop (or HF's Trainer) does.
Each run's `max_memory_allocated()`/`max_memory_reserved()` after STEPS steps
go to OUT_DIR/checkpoint_truth.json; `tests/fit_checkpoint.rs` compares
`memlens fit --checkpoint` on the recordings with them.
"""

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fit_probes import parts  # noqa: E402

STEPS = 3
BATCH = 16
# The repeated block of each workload: what a user would checkpoint.
BLOCKS = {
    "gpt": "Block",
    "hf_gpt2": "GPT2Block",
    "vit": "EncoderBlock",
    "t5": "T5Block",
    "resnet_amp": "Bottleneck",
}


def module_scopes(torch, model):
    path = os.path.join(HERE, "..", "..", "python", "memlens", "_modules.py")
    spec = importlib.util.spec_from_file_location("memlens_modules", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ModuleScopes(torch, model)


def checkpoint_blocks(model, cls):
    """Runs every `cls` instance's forward under non-reentrant checkpointing:
    through transformers' own switch where the model has one (it also turns
    the KV cache off in training, as users get it), else by wrapping each
    instance's forward."""
    import torch.utils.checkpoint as cp

    if hasattr(model, "gradient_checkpointing_enable") and getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return sum(1 for m in model.modules() if type(m).__name__ == cls)
    n = 0
    for m in model.modules():
        if type(m).__name__ == cls:
            inner = m.forward

            def forward(*args, _inner=inner, **kwargs):
                return cp.checkpoint(_inner, *args, use_reentrant=False, **kwargs)

            m.forward = forward
            n += 1
    return n


def worker(workload, batch, mode, out):
    import torch

    if mode in ("record", "checkpointed_record"):
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    model, make_opt, make, loss = parts(workload)
    result = {"workload": workload, "batch": batch, "mode": mode, "block": BLOCKS[workload]}
    if mode == "record_late":
        # As memlens.record(model=model) starts: once the model is built,
        # without free_requested entries (NO_SKIP=1: with them, as before
        # 2026-11-28).
        skip = {} if os.environ.get("NO_SKIP") else {"skip_actions": ["free_requested"]}
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, context="alloc", stacks="python", **skip)
    if mode in ("record", "checkpointed_record", "record_late"):
        scopes = module_scopes(torch, model)
    if mode.startswith("checkpointed"):
        result["blocks_checkpointed"] = checkpoint_blocks(model, BLOCKS[workload])
    opt = make_opt(model)
    try:
        for _ in range(STEPS):
            inputs = make(batch)
            # The loss kept, the outputs dropped before backward, as a
            # training loop (or HF's Trainer) has it.
            value = loss(model, inputs)[0]
            value.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del inputs, value
        torch.cuda.synchronize()
        result["ok"] = True
    except torch.OutOfMemoryError:
        result["ok"] = False
    result["max_allocated"] = torch.cuda.max_memory_allocated()
    result["max_reserved"] = torch.cuda.max_memory_reserved()
    if mode in ("record", "checkpointed_record", "record_late"):
        scopes.remove()
        raw = out + ".raw"
        torch.cuda.memory._dump_snapshot(raw)
        with open(raw, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
    print(json.dumps(result))


def run(workload, batch, mode, out=""):
    p = subprocess.run(
        [sys.executable, __file__, "worker", workload, str(batch), mode, out],
        capture_output=True,
        text=True,
    )
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    return {"workload": workload, "batch": batch, "mode": mode, "ok": None, "err": p.stderr[-2000:]}


def main(out_dir, workloads, batch):
    os.makedirs(out_dir, exist_ok=True)
    truth = {"steps": STEPS, "batch": batch, "workloads": {}}
    for w in workloads:
        t0 = time.time()
        rec = {}
        if os.environ.get("LATE_ONLY"):
            # Only the recording as memlens.record(model=...) makes it (the
            # truth of the other runs does not depend on it).
            rec["record_late"] = run(w, batch, "record_late", os.path.join(out_dir, f"{w}.late.pickle.gz"))
            truth["workloads"][w] = rec
            with open(os.path.join(out_dir, "checkpoint_truth.json"), "w") as f:
                json.dump(truth, f, indent=1)
            print(w, json.dumps(rec)[:600], flush=True)
            continue
        rec["record"] = run(w, batch, "record", os.path.join(out_dir, f"{w}.pickle.gz"))
        rec["plain"] = run(w, batch, "plain")
        rec["checkpointed"] = run(w, batch, "checkpointed")
        if w in os.environ.get("RECORD_CHECKPOINTED", "").split(","):
            # The checkpointed run's own trace, to compare the rewrite with.
            rec["checkpointed_record"] = run(
                w, batch, "checkpointed_record", os.path.join(out_dir, f"{w}.checkpointed.pickle.gz")
            )
        rec["seconds"] = round(time.time() - t0, 1)
        truth["workloads"][w] = rec
        with open(os.path.join(out_dir, "checkpoint_truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
        print(w, json.dumps(rec)[:600], flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        args = [a for a in sys.argv[1:] if not a.startswith("--")]
        batch = BATCH
        if "--batch" in sys.argv:
            batch = int(sys.argv[sys.argv.index("--batch") + 1])
            args = [a for a in args if a != str(batch)]
        main(
            args[0] if args else "out",
            args[1].split(",") if len(args) > 1 else list(BLOCKS),
            batch,
        )
