"""Recording overhead of memlens.record on a ~100 ms/step transformer (issue 14, item 7).

    python3 bench/record_overhead.py [--steps 30] [--rounds 3] [--json FILE]

Needs torch with CUDA and memlens importable (the wheel). The model is the
student GPT of the corpus (tests/corpus/gen/model.py) at bench size: vocab
32000, d 1024, 8 blocks, 16 heads, batch 8 x 512 tokens, fp32, the
hand-written AdamW; each step ends with loss.item() as a logging loop does.

Modes, each `--steps` timed steps after `--warmup` untimed ones, in rounds that
interleave the modes so drift of the machine hits them alike:

* none:     no recording;
* history:  torch.cuda.memory._record_memory_history with memlens's settings
            (enabled="all", context="alloc", stacks="python", memlens's default
            max_entries) and nothing else: PyTorch's own cost;
* every10:  memlens.record(every=10), memlens.step() after each step;
* every2:   memlens.record(every=2);
* with --context-all-too, history_all and every2_all: the same with
            context="all" (free stacks recorded too), every2_all against
            history_all.

A step's time runs from its first line to the return of memlens.step().
Reported: median and mean step time per mode, and the overhead of every10 and
every2 beyond `history` (target: at most 3% and 10% of the median). For the
memlens modes, where the time of memlens.step() goes (the Recorder's own
methods, timed by wrapping them). Final snapshots (stop()) are not timed.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "corpus", "gen"))

import torch  # noqa: E402

from model import GPT, AdamW, batch, loss_fn  # noqa: E402

BENCH = dict(vocab=32000, d=1024, n_layer=8, n_head=16)
B, T = 8, 512
# Recorder methods timed when the memlens in use has them (_after_step holds the others).
PARTS = ["_mark_step", "_after_step", "_watch_leak", "_check_ring", "_fit_ring", "_dump", "_snapshot", "_clear_ring", "_stitched"]


def one_step(model, opt):
    x, y = batch(BENCH["vocab"], B, T)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def instrument(rec, spent):
    """Wraps the Recorder's step-path methods to add their wall time to spent[name]."""
    def wrap(obj, name):
        inner = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        setattr(obj, name, timed)
    for name in PARTS:
        if hasattr(rec, name):
            wrap(rec, name)
    if rec._publisher is not None:
        wrap(rec._publisher, "publish")


def run_mode(mode, model, opt, steps, warmup, tmp, memlens):
    """Step times (s) of one mode; with the memlens modes also the time per Recorder part."""
    rec, spent, leak_warnings = None, {}, 0
    # `_all` modes record free stacks too (context="all", memlens's default before
    # it became "alloc"), for the comparison in one run.
    context = "all" if mode.endswith("_all") else "alloc"
    if mode.startswith("history"):
        torch.cuda.memory._record_memory_history(
            enabled="all", context=context, stacks="python",
            max_entries=memlens._capture.default_max_entries(6))
    elif mode.startswith("every"):
        d = tempfile.mkdtemp(dir=tmp)
        rec = memlens.record(d, every=int(mode[5:].split("_")[0]), context=context)
        rec.start()
        instrument(rec, spent)
    times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(warmup + steps):
            t = time.perf_counter()
            one_step(model, opt)
            if rec is not None:
                memlens.step()
            if i >= warmup:
                times.append(time.perf_counter() - t)
            elif rec is not None and i == warmup - 1:
                spent.clear()
        leak_warnings = sum(1 for w in caught if issubclass(w.category, memlens.LeakWarning))
    dumps, max_entries = 0, None
    if rec is not None:
        dumps = sum(1 for p in rec.snapshots if ".step" in os.path.basename(p))
        max_entries = rec.max_entries
        in_steps = dict(spent)
        t = time.perf_counter()
        rec.stop()
        stop_s = time.perf_counter() - t
        spent.clear()
        spent.update(in_steps)
        spent["stop (final dump, untimed)"] = stop_s
    if mode.startswith("history"):
        torch.cuda.memory._record_memory_history(enabled=None)
    return times, spent, leak_warnings, dumps, max_entries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--context-all-too", action="store_true",
                    help='also history_all and every2_all: context="all" (free stacks kept), against history_all')
    args = ap.parse_args()
    import memlens

    torch.manual_seed(0)
    model = GPT(**BENCH).cuda()
    opt = AdamW(model.parameters())
    for _ in range(3):
        one_step(model, opt)
    # The first torch.cuda.memory._snapshot() of a process costs seconds once
    # (measured apart here, so it does not land in one mode's figures).
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=10000)
    one_step(model, opt)
    t = time.perf_counter()
    torch.cuda.memory._snapshot()
    first_snapshot_s = time.perf_counter() - t
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"first _snapshot() of the process: {first_snapshot_s:.2f} s", flush=True)
    modes = ["none", "history", "every10", "every2"]
    if args.context_all_too:
        modes += ["history_all", "every2_all"]
    times = {m: [] for m in modes}
    spent = {m: {} for m in modes}
    extra = {m: {"leak_warnings": 0, "step_dumps": 0, "max_entries": None} for m in modes}
    tmp = tempfile.mkdtemp(prefix="memlens-overhead-")
    try:
        for r in range(args.rounds):
            for m in modes:
                t, s, lw, dumps, max_entries = run_mode(m, model, opt, args.steps, args.warmup, tmp, memlens)
                times[m] += t
                for k, v in s.items():
                    spent[m][k] = spent[m].get(k, 0.0) + v
                extra[m]["leak_warnings"] += lw
                extra[m]["step_dumps"] += dumps
                extra[m]["max_entries"] = max_entries
                print(f"round {r + 1} {m:11s} median {statistics.median(t) * 1e3:7.1f} ms", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "memlens": memlens.__version__,
           "model": {**BENCH, "batch": B, "seq": T,
                     "parameters": sum(p.numel() for p in model.parameters())},
           "steps_per_mode": args.steps * args.rounds, "first_snapshot_s": round(first_snapshot_s, 3),
           "modes": {}}
    def base_of(m):
        return "history_all" if m.endswith("_all") else "history"
    print(f"\n{'mode':11s} {'median ms':>10s} {'mean ms':>9s} {'beyond history (median)':>24s} {'(mean)':>8s}")
    for m in modes:
        med, mean = statistics.median(times[m]), statistics.mean(times[m])
        base, base_mean = statistics.median(times[base_of(m)]), statistics.mean(times[base_of(m)])
        n = len(times[m])
        row = {"median_ms": round(med * 1e3, 2), "mean_ms": round(mean * 1e3, 2),
               "p90_ms": round(sorted(times[m])[int(0.9 * (n - 1))] * 1e3, 2),
               "over_history_median_pct": round(100 * (med / base - 1), 2),
               "over_history_mean_pct": round(100 * (mean / base_mean - 1), 2),
               **extra[m],
               "ms_per_step_in": {k: round(v * 1e3 / n, 3) for k, v in sorted(spent[m].items())
                                  if not k.startswith("stop")},
               "stop_ms_per_round": round(spent[m].get("stop (final dump, untimed)", 0) * 1e3 / args.rounds, 1)}
        res["modes"][m] = row
        print(f"{m:11s} {row['median_ms']:10.1f} {row['mean_ms']:9.1f} {row['over_history_median_pct']:+23.1f}% "
              f"{row['over_history_mean_pct']:+7.1f}%")
    for m in [m for m in modes if m.startswith("every")]:
        print(f"{m}: ms per step in {res['modes'][m]['ms_per_step_in']}, "
              f"{res['modes'][m]['step_dumps']} step snapshots, {res['modes'][m]['leak_warnings']} leak warnings, "
              f"ring {res['modes'][m]['max_entries']} entries at the end")
    t10 = res["modes"]["every10"]["over_history_median_pct"] <= 3
    t2 = res["modes"]["every2"]["over_history_median_pct"] <= 10
    res["targets_met"] = {"every10_le_3pct": t10, "every2_le_10pct": t2}
    print(f"targets (median beyond history): every10 <= 3%: {'met' if t10 else 'NOT met'}; "
          f"every2 <= 10%: {'met' if t2 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
