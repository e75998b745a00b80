"""Evidence for `memlens.why` (issue 32): leaks planted on the GPU, each kind
in a process of its own, and the holder the in-process search names for the
line that allocated the leaked tensors.

    python tests/gpu/leak_holders.py [KIND,...]     (prints one JSON line a kind, then a table)

Each kind trains a small model for a few steps on CUDA under
`torch.cuda.memory._record_memory_history`, keeps memory the way users do by
mistake, then calls `why(site="leak_holders.py:LINE")` with the line marked
`# LEAK` in its code (the line memlens names as the leak's site). A kind
passes when the first holder names what the code really keeps (`expect`).
The `clean` kind keeps nothing: its search must name no holder.

`why` is imported from python/memlens/_why.py directly (it needs no wheel).
"""

import gc
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 5


def load_why():
    path = os.path.join(HERE, "..", "..", "python", "memlens", "_why.py")
    spec = importlib.util.spec_from_file_location("memlens_why", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["memlens_why"] = mod
    spec.loader.exec_module(mod)
    return mod


def leak_line(kind):
    """The line of this file marked `# LEAK kind`."""
    with open(__file__) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# LEAK {kind}"):
                return n
    raise SystemExit(f"no line marked for {kind}")


# Globals some kinds fill (module globals are what users keep by mistake).
kept_outputs = []
metrics = {}
callbacks = []


def model_and_data(torch):
    nn = torch.nn
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, opt


def search(torch, kind):
    """`why` on the line marked for `kind`, once the GPU is idle and the
    garbage collected: the site and the holders it names."""
    torch.cuda.synchronize()
    gc.collect()
    site = f"leak_holders.py:{leak_line(kind)}"
    holders = load_why().why(site=site)
    return {
        "kind": kind,
        "site": site,
        "holders": [h.to_dict() for h in holders],
        "text": [str(h) for h in holders],
    }


def remember(t, _seen=[]):  # noqa: B006 - the mistake planted by closure_default
    _seen.append(t)


total_loss = 0


def step_with_exception(x):
    big = x.repeat(4, 1)  # LEAK last_traceback
    raise ValueError(f"bad batch of {big.shape[0]}")


def prepare(kind, model):
    """The model as `kind` needs it: wrapped in a module that caches its
    outputs, or with a forward hook that keeps them in a global."""
    import torch

    nn = torch.nn
    if kind == "module_list":
        class Cached(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner
                self.cache = []

            def forward(self, x):
                y = self.inner(x)  # LEAK module_list
                self.cache.append(y)
                return y

        return Cached(model)
    if kind == "hook_global":
        def keep(module, inputs, output):
            kept_outputs.append(output.detach())

        model[1].register_forward_hook(keep)
    return model


def plant(kind, model, x, step, owner):
    """One step's forward, keeping memory the way `kind` does by mistake; the
    loss to train on. The same code runs in a plain loop, in a Lightning
    `training_step` and in a Hugging Face Trainer's `compute_loss` (`owner`
    is the loop's object: the LightningModule, the Trainer, or a plain one)."""
    global total_loss
    if kind == "hook_global":
        out = model(x)  # LEAK hook_global
    elif kind == "metrics_dict":
        out = model(x)  # LEAK metrics_dict
        metrics[step] = out.detach()
    elif kind == "closure_default":
        out = model(x)
        remember(out.detach() * 1)  # LEAK closure_default
    elif kind == "callback_lambdas":
        out = model(x)
        feat = out.detach() * 2  # LEAK callback_lambdas
        callbacks.append(lambda: feat.mean())
    elif kind == "autograd_total":
        out = model(x)
        # An evaluation pass without no_grad, its loss added up as a tensor:
        # every step's graph and the activations it saved stay alive.
        val = model(x * 0.5)  # LEAK autograd_total
        total_loss = total_loss + val.float().pow(2).mean()
    elif kind == "step_outputs":
        out = model(x)  # LEAK step_outputs
        owner.step_outputs.append(out.detach())
    elif kind == "last_traceback":
        out = model(x)
        if step == 0:
            try:
                step_with_exception(x)
            except ValueError as e:
                sys.last_traceback = e.__traceback__
    else:  # clean, and module_list (its line is in Cached.forward)
        out = model(x)  # LEAK clean
    return out.float().pow(2).mean()


class Owner:
    """The plain loop's object (what a LightningModule or Trainer is to theirs)."""

    def __init__(self):
        self.step_outputs = []


def net(torch):
    nn = torch.nn
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))


def run_plain(kind, torch):
    model = prepare(kind, net(torch)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    owner = Owner()
    history = []
    for step in range(STEPS):
        x = torch.randn(256, 1024, device="cuda")
        if kind == "local_history":
            out = model(x)
            history.append(out.detach().clone())  # LEAK local_history
            loss = out.float().pow(2).mean()
        else:
            loss = plant(kind, model, x, step, owner)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
    # Still held here, as a training script would hold them.
    return search(torch, kind), len(history)


def run_lightning(kind, torch):
    import lightning.pytorch as pl

    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 256, 1024))

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = prepare(kind, net(torch))
            self.step_outputs = []

        def training_step(self, batch, i):
            return plant(kind, self.net, batch[0], i, self)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    module = Module()
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=256))
    return search(torch, kind), module


def run_hf(kind, torch):
    from transformers import Trainer, TrainingArguments

    nn = torch.nn
    data = torch.randn(STEPS * 256, 1024)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = prepare(kind, net(torch))

        def forward(self, x):
            return self.net(x)

    class KeepingTrainer(Trainer):
        step_outputs = []

        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            return plant(kind, model.net, inputs["x"], self.state.global_step, self)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return STEPS * 256

        def __getitem__(self, i):
            return {"x": data[i]}

    args = TrainingArguments(output_dir="/tmp/hf-leak", max_steps=STEPS,
                             per_device_train_batch_size=256, report_to=[],
                             save_strategy="no", logging_strategy="no",
                             remove_unused_columns=False, disable_tqdm=True)
    trainer = KeepingTrainer(model=Net().cuda(), args=args, train_dataset=Rows())
    trainer.train()
    return search(torch, kind), trainer


def run_kind(kind, loop):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=200_000)
    run = {"plain": run_plain, "lightning": run_lightning, "hf": run_hf}[loop]
    found, _keep_alive = run(kind, torch)
    return {**found, "loop": loop}


# What each kind's first holder must name (a substring of its text).
EXPECT = {
    "module_list": "cache",
    "hook_global": ("kept_outputs", "filled by forward hook keep"),
    "metrics_dict": "metrics",
    "closure_default": "default argument",
    "callback_lambdas": "callbacks",
    "autograd_total": "total_loss",
    "step_outputs": "step_outputs",
    "local_history": "history",
    "last_traceback": "last_traceback",
    "clean": None,
}

#: The loop styles each kind runs in (a local of the loop's frame exists
#: only in a loop the user wrote).
LOOPS = ("plain", "lightning", "hf")


def loops_of(kind):
    return ("plain",) if kind == "local_history" else LOOPS


def main(kinds):
    rows = []
    for kind, loop in [(k, lp) for k in kinds for lp in loops_of(k)]:
        p = subprocess.run([sys.executable, __file__, "worker", kind, loop], capture_output=True, text=True)
        # Frameworks print dicts of their own: the result has a prefix.
        line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            r = {"kind": kind, "loop": loop, "error": p.stderr[-1500:]}
        else:
            r = json.loads(line[len("RESULT "):])
        want = EXPECT[kind]
        text = r.get("text") or []
        if "error" in r:
            ok = False
        elif want is None:
            ok = not text
        else:
            wants = want if isinstance(want, tuple) else (want,)
            ok = bool(text) and all(w in text[0] for w in wants)
        r["ok"] = ok
        print(json.dumps(r), flush=True)
        rows.append(r)
    print()
    print("| kind | loop | site | first holder named | expected | right |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        first = (r.get("text") or ["(none)"])[0] if "error" not in r else "error: " + r["error"][-200:].replace("\n", " ")
        print(f"| {r['kind']} | {r['loop']} | {r.get('site', '')} | {first} | {' + '.join(EXPECT[r['kind']]) if isinstance(EXPECT[r['kind']], tuple) else (EXPECT[r['kind']] or '(no holder)')} | {'yes' if r['ok'] else 'NO'} |")
    held = sum(r["ok"] for r in rows)
    print(f"\n{held} of {len(rows)} named right")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        print("RESULT " + json.dumps(run_kind(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "plain")))
    else:
        main(sys.argv[1].split(",") if len(sys.argv) > 1 else list(EXPECT))
