"""Times `memlens.why` on a process of about a million Python objects.

    python bench/why_search.py [--objects 1000000] [--runs 5]

Needs torch (CPU is enough). Builds the objects (small dicts, lists and
tuples, as a data pipeline or a tokenizer cache leaves them), plants the
holders users plant, then times `why()` on each, `--runs` times, and prints
per case the min / median / max seconds and the holders named.
`_why.py` is loaded from its file, so no wheel is needed.
"""

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def load_why():
    path = os.path.join(HERE, "..", "python", "memlens", "_why.py")
    spec = importlib.util.spec_from_file_location("memlens_why", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["memlens_why"] = module
    spec.loader.exec_module(module)
    return module


# The planted holders (module globals, as in a training script).
losses = []
metrics = {}
state = {}
noise = []


def build_noise(n):
    """`n` more tracked objects: dicts, lists and tuples (5 a round: a dict
    and the list in it, a list, a tuple and the list in it; a dict or a
    tuple of ints alone would not be tracked)."""
    for i in range(n // 5):
        noise.append({"ids": [i]})
        noise.append([i, str(i)])
        noise.append((i, [i]))


def plant(torch):
    """The holders, with the tensors each case asks about."""

    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)
            self.cache = []

        def forward(self, x):
            y = self.lin(x)
            self.cache.append(y.detach())
            return y

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), Cached())
    w = torch.ones(64, requires_grad=True)
    total_loss = 0
    for step in range(8):
        out = model(torch.randn(16, 64))
        metrics[step] = out.detach().clone()
        act = out.detach() * 1  # memory of its own, which only the graph keeps
        total_loss += (act * w).sum()
    many = [torch.ones(4) for _ in range(1024)]
    losses.extend(many)
    state["model"], state["total_loss"] = model, total_loss
    # (The cases name what they need through `state`: a closure over `model`
    # would be one more holder.)
    return {
        "module attribute (state['model'].1.cache, 8 tensors)": lambda: list(state["model"][1].cache),
        "global dict keyed by step (8 tensors)": lambda: list(metrics.values()),
        "global list of 1,024 tensors (large frontier)": lambda: list(losses),
        "autograd graph of a global (total_loss)": lambda: [_saved_activation(state["total_loss"])],
        "nothing holds it": lambda: [torch.ones(4)],
    }


def _saved_activation(total_loss):
    """The tensor the graph's last MulBackward0 saved."""
    return total_loss.grad_fn.next_functions[1][0].next_functions[0][0]._saved_self


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    import torch

    why = load_why().why
    build_noise(args.objects - len(gc.get_objects()))
    cases = plant(torch)
    gc.collect()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"{len(gc.get_objects()):,} tracked objects, load average {os.getloadavg()[0]:.2f}")
    for name, targets in cases.items():
        times = []
        first = "(none)"
        for _ in range(args.runs):
            start = time.perf_counter()
            holders = why(targets())  # the list only the call holds
            times.append(time.perf_counter() - start)
        print(f"{name}: min {min(times):.3f} s, median {statistics.median(times):.3f} s, "
              f"max {max(times):.3f} s")
        for holder in holders or ["(no holder)"]:
            print(f"    {holder}")


if __name__ == "__main__":
    main()
