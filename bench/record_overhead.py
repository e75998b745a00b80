"""Recording overhead of memlens.record on real models (issue 14 item 7, issue 35 item 2).

    python3 bench/record_overhead.py [--models gpt,cs336,hf_gpt2,resnet50]
        [--steps 30] [--rounds 3] [--json FILE]

Needs torch with CUDA and memlens importable (the wheel). The models are in
bench/workloads.py (a hand-written GPT, a CS336-style TransformerLM with
every op by hand, HF's GPT-2 small, torchvision's ResNet-50); each step ends
with loss.item() as a logging loop does. Each model is measured on its own,
one after the other, in the same process.

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
            history_all;
* with --free-requested-too, history_skip (history without free_requested
            entries, skip_actions=["free_requested"], as memlens.record
            records by default) and every2_fr (memlens.record(every=2,
            free_requested=True), every action recorded); every mode is then
            also given against history_skip.

A step's time runs from its first line to the return of memlens.step().
Reported: median and mean step time per mode, and the overhead of every10 and
every2 beyond `history` (target: at most 3% and 10% of the median), over all
steps and as the median of the rounds' own overheads (in the JSON). For the
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
sys.path.insert(0, HERE)

import torch  # noqa: E402

from workloads import WORKLOADS  # noqa: E402

# Recorder methods timed when the memlens in use has them (_after_step holds the others).
PARTS = ["_mark_step", "_after_step", "_watch_leak", "_check_ring", "_fit_ring", "_dump", "_snapshot", "_clear_ring", "_stitched"]


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


def steps_held(path):
    """(steps whose marker lies inside the snapshot's trace, trace entries) of one
    periodic snapshot: the step markers (memlens.step N annotations) later than
    its first trace entry. A snapshot dumped at step K after one at K - every
    holds `every` of them when its trace was not cut short by the ring."""
    import pickle
    with open(path, "rb") as f:
        snap = pickle.load(f)
    events = [e for t in snap.get("device_traces") or [] for e in t]
    if not events:
        return 0, 0
    first = min(e.get("time_us", 0) for e in events)
    marks = {a.get("name") for a in snap.get("external_annotations") or []
             if str(a.get("name", "")).startswith("memlens.step") and a.get("time_us", 0) > first}
    return len(marks), len(events)


def run_mode(mode, one_step, steps, warmup, tmp, memlens):
    """Step times (s) of one mode; with the memlens modes also the time per
    Recorder part and what each periodic snapshot holds."""
    rec, spent, leak_warnings = None, {}, 0
    # `_all` modes record free stacks too (context="all", memlens's default before
    # it became "alloc"), for the comparison in one run.
    context = "all" if mode.endswith("_all") else "alloc"
    every = None
    if mode.startswith("history"):
        skip = {"skip_actions": ["free_requested"]} if mode.endswith("_skip") else {}
        torch.cuda.memory._record_memory_history(
            enabled="all", context=context, stacks="python",
            max_entries=memlens._capture.default_max_entries(6), **skip)
    elif mode.startswith("every"):
        d = tempfile.mkdtemp(dir=tmp)
        every = int(mode[5:].split("_")[0])
        fr = {"free_requested": True} if mode.endswith("_fr") else {}
        rec = memlens.record(d, every=every, context=context, **fr)
        rec.start()
        instrument(rec, spent)
    times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(warmup + steps):
            t = time.perf_counter()
            one_step()
            if rec is not None:
                memlens.step()
            if i >= warmup:
                times.append(time.perf_counter() - t)
            elif rec is not None and i == warmup - 1:
                spent.clear()
        leak_warnings = sum(1 for w in caught if issubclass(w.category, memlens.LeakWarning))
        ring_warnings = sum(1 for w in caught if "ring buffer" in str(w.message))
    extra = {"leak_warnings": leak_warnings, "ring_warnings": ring_warnings}
    if rec is not None:
        periodic = [p for p in rec.snapshots if ".step" in os.path.basename(p)]
        extra["max_entries"] = rec.max_entries
        in_steps = dict(spent)
        t = time.perf_counter()
        rec.stop()
        stop_s = time.perf_counter() - t
        spent.clear()
        spent.update(in_steps)
        spent["stop (final dump, untimed)"] = stop_s
        # The first periodic snapshot holds the steps since recording began.
        held = [steps_held(p)[0] for p in periodic[1:]]
        extra["step_dumps"] = len(periodic)
        extra["periodic_held_whole"] = sum(1 for h in held if h >= every)
        extra["periodic_checked"] = len(held)
        extra["periodic_fewest_steps"] = min(held) if held else None
    if mode.startswith("history"):
        torch.cuda.memory._record_memory_history(enabled=None)
    return times, spent, extra


def events_per_step(one_step, memlens, n=3):
    """Allocator trace events one step makes (from the allocator's counters)."""
    dev = [torch.cuda.current_device()]
    before = memlens._capture._trace_entries(torch, dev)
    for _ in range(n):
        one_step()
    return (memlens._capture._trace_entries(torch, dev) - before) // n


def measure(name, args, memlens, tmp):
    """Every mode of one model, in interleaved rounds; its figures as a dict."""
    torch.manual_seed(0)
    one_step, description = WORKLOADS[name]()
    for _ in range(3):
        one_step()
    per_step = events_per_step(one_step, memlens)
    print(f"== {name}: {description}; {per_step:,} allocator events a step", flush=True)
    modes = ["none", "history", "every10", "every2"]
    if args.context_all_too:
        modes += ["history_all", "every2_all"]
    if args.free_requested_too:
        modes += ["history_skip", "every2_fr"]
    times = {m: [] for m in modes}
    # Each round's median step time per mode: the figure is the
    # median over rounds of each round's overhead.
    round_medians = {m: [] for m in modes}
    spent = {m: {} for m in modes}
    extra = {m: {} for m in modes}
    for r in range(args.rounds):
        for m in modes:
            t, s, e = run_mode(m, one_step, args.steps, args.warmup, tmp, memlens)
            times[m] += t
            round_medians[m].append(statistics.median(t))
            for k, v in s.items():
                spent[m][k] = spent[m].get(k, 0.0) + v
            for k, v in e.items():
                if isinstance(v, int) and k not in ("max_entries", "periodic_fewest_steps"):
                    extra[m][k] = extra[m].get(k, 0) + v
                elif k == "periodic_fewest_steps" and v is not None:
                    extra[m][k] = min(v, extra[m].get(k, v))
                else:
                    extra[m][k] = v
            print(f"round {r + 1} {m:11s} median {statistics.median(t) * 1e3:7.1f} ms", flush=True)
    res = {"description": description, "events_per_step": per_step,
           "steps_per_mode": args.steps * args.rounds, "modes": {}}

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
               "over_history_median_of_rounds_pct": round(100 * statistics.median(
                   a / b - 1 for a, b in zip(round_medians[m], round_medians[base_of(m)])), 2),
               **({"over_history_skip_median_pct": round(100 * (med / statistics.median(times["history_skip"]) - 1), 2)}
                  if "history_skip" in times else {}),
               **extra[m],
               "ms_per_step_in": {k: round(v * 1e3 / n, 3) for k, v in sorted(spent[m].items())
                                  if not k.startswith("stop")},
               "stop_ms_per_round": round(spent[m].get("stop (final dump, untimed)", 0) * 1e3 / args.rounds, 1)}
        res["modes"][m] = row
        against_skip = row.get("over_history_skip_median_pct")
        print(f"{m:11s} {row['median_ms']:10.1f} {row['mean_ms']:9.1f} {row['over_history_median_pct']:+23.1f}% "
              f"{row['over_history_mean_pct']:+7.1f}%"
              + (f"  ({against_skip:+.1f}% beyond history_skip)" if against_skip is not None else ""))
    for m in [m for m in modes if m.startswith("every")]:
        row = res["modes"][m]
        print(f"{m}: ms per step in {row['ms_per_step_in']}; {row.get('step_dumps')} step snapshots, "
              f"{row.get('periodic_held_whole')} of {row.get('periodic_checked')} checked hold all their steps "
              f"(fewest {row.get('periodic_fewest_steps')}); {row['leak_warnings']} leak warnings, "
              f"{row['ring_warnings']} ring warnings; ring {row.get('max_entries')} entries at the end")
    t10 = res["modes"]["every10"]["over_history_median_pct"] <= 3
    t2 = res["modes"]["every2"]["over_history_median_pct"] <= 10
    res["targets_met"] = {"every10_le_3pct": t10, "every2_le_10pct": t2}
    print(f"{name} targets (median beyond history): every10 <= 3%: {'met' if t10 else 'NOT met'}; "
          f"every2 <= 10%: {'met' if t2 else 'NOT met'}\n", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(WORKLOADS), help="comma-separated, from bench/workloads.py")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--free-requested-too", action="store_true",
                    help="also history_skip and every2_fr: recording without / memlens with free_requested entries")
    ap.add_argument("--context-all-too", action="store_true",
                    help='also history_all and every2_all: context="all" (free stacks kept), against history_all')
    args = ap.parse_args()
    import memlens

    # The first torch.cuda.memory._snapshot() of a process costs seconds once
    # (measured apart here, so it does not land in one model's figures).
    x = torch.ones(1024, device="cuda")
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=10000)
    (x * 2).sum().item()
    t = time.perf_counter()
    torch.cuda.memory._snapshot()
    first_snapshot_s = time.perf_counter() - t
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"first _snapshot() of the process: {first_snapshot_s:.2f} s", flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "memlens": memlens.__version__,
           "first_snapshot_s": round(first_snapshot_s, 3), "models": {}}
    tmp = tempfile.mkdtemp(prefix="memlens-overhead-")
    try:
        for name in args.models.split(","):
            res["models"][name] = measure(name, args, memlens, tmp)
            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("model      events/step  history ms  every10 (median, mean)  every2 (median, mean)")
    for name, r in res["models"].items():
        m = r["modes"]
        print(f"{name:10s} {r['events_per_step']:11,d} {m['history']['median_ms']:11.1f}  "
              f"{m['every10']['over_history_median_pct']:+6.1f}% {m['every10']['over_history_mean_pct']:+6.1f}%"
              f"          {m['every2']['over_history_median_pct']:+6.1f}% {m['every2']['over_history_mean_pct']:+6.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
