"""The in-process leak alarm on leaks that grow every few steps, and on clean
loops long enough to tempt it (GPU; run by tests/gpu/alarm_every.sh).

Workloads, each under ``memlens.record`` with the default leak rule, the
student GPT of tests/corpus/gen/model.py:

* ``every10``: keeps the step's logits every 10th step (150 steps);
* ``every25``: keeps the step's logits every 25th step (200 steps);
* ``clean`` x3: the same loop keeping nothing (300 steps each);
* ``clean_shapes`` x3: sequence lengths drawn at random from 64-512 each step
  (300 steps each): the allocator's free blocks change shape all the time;
* ``clean_eval``: an evaluation under ``torch.no_grad()`` every 10th step whose
  mean loss is kept as a float (300 steps).

Claims checked: each leak raises a LeakWarning that names the planted call
path (the forward line whose output is kept); no clean run raises one.
Prints PASS/FAIL lines and "N passed, N failed".
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import warnings

PASSED, FAILED = [], []


def report(ok, name, detail):
    (PASSED if ok else FAILED).append(name)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def line_of(tag):
    """The line of this file that carries ``# MARK: tag``, as ``file:line``."""
    here = os.path.abspath(__file__)
    with open(here) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# MARK: {tag}"):
                return f"{here}:{n}"
    raise KeyError(tag)


def run(steps, keep_every=0, shapes=False, eval_every=0, seed=0):
    import torch

    import memlens
    from model import GPT, AdamW, batch, loss_fn

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = GPT(vocab=8192, d=256, n_layer=4, n_head=4).cuda()
    opt = AdamW(model.parameters())
    kept, evals = [], []
    with tempfile.TemporaryDirectory() as d:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with memlens.record(d) as rec:
                for step in range(1, steps + 1):
                    t = rng.randrange(64, 513) if shapes else 256
                    x, y = batch(8192, 8, t)
                    logits = model(x)  # MARK: forward
                    loss = loss_fn(logits, y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    if keep_every and step % keep_every == 0:
                        kept.append(logits)  # MARK: plant
                    if eval_every and step % eval_every == 0:
                        with torch.no_grad():
                            xv, yv = batch(8192, 8, 256)
                            evals.append(loss_fn(model(xv), yv).item())
                    del logits, loss
                    memlens.step()
    warned = [str(w.message) for w in caught if issubclass(w.category, memlens.LeakWarning)]
    allocated = torch.cuda.memory_allocated()
    del model, opt, kept
    torch.cuda.empty_cache()
    return warned, rec.leak_alarm, allocated


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proj", required=True, help="directory holding the corpus's model.py")
    args = ap.parse_args()
    sys.path.insert(0, args.proj)
    forward = line_of("forward")
    for name, steps, every in (("every10", 150, 10), ("every25", 200, 25)):
        warned, alarm, _ = run(steps, keep_every=every)
        report(len(warned) == 1, f"alarm.{name}.fires", f"{len(warned)} LeakWarnings; alarm line {alarm!r}")
        if warned:
            report(forward in warned[0], f"alarm.{name}.names_call_path",
                   f"want {forward} in: {warned[0]!r}")
    clean = [(f"clean{i}", dict(seed=i)) for i in (1, 2, 3)]
    clean += [(f"clean_shapes{i}", dict(seed=i, shapes=True)) for i in (1, 2, 3)]
    clean += [("clean_eval", dict(seed=7, eval_every=10))]
    for name, kw in clean:
        warned, alarm, allocated = run(300, **kw)
        report(not warned and alarm is None, f"alarm.{name}.silent",
               f"{len(warned)} LeakWarnings {warned[:1]}; {allocated / 2**20:.1f} MiB allocated after 300 steps")
    print(f"{len(PASSED)} passed, {len(FAILED)} failed", flush=True)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
