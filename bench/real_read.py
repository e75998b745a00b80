"""Reading speed on real recordings (issue 34's first point), run on the GPU host.

    python bench/real_read.py MEMLENS OUTDIR [--workloads cs336,hf_gpt2,resnet50]
                              [--events N] [--seconds S] [--keep NAME]

For each workload of bench/workloads.py: records its training steps with
PyTorch's own recorder as a user would (`_record_memory_history(enabled="all",
context="all", stacks="python")`, a ring large enough for the whole run) until
the trace holds about N events or S seconds have passed, dumps the snapshot
(`_dump_snapshot`), then times reading it, best of three, alternating:
`memlens summary FILE` (MEMLENS: the release binary) and Python's
`pickle.load` (what users' scripts and PyTorch's `_memory_viz` start with).
Prints one line per workload: file size, events, events a step, seconds and
GB/s for each reader, and memlens's speed-up. --keep NAME gzips that
workload's recording into OUTDIR for profiling elsewhere.
"""
import argparse
import gc
import gzip
import os
import pickle
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def record(name, path, events, seconds):
    import torch
    import workloads

    step, what = workloads.WORKLOADS[name]()
    for _ in range(2):  # warm-up: kernels chosen, optimizer state made
        step()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=events + 200_000
    )
    steps, t0 = 0, time.time()
    per_step = None
    while True:
        step()
        steps += 1
        if steps == 2:
            n = sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])
            per_step = n / 2
        if per_step and (steps * per_step >= events or time.time() - t0 > seconds):
            break
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    return what, steps, per_step


def best(f, runs=3):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("memlens")
    ap.add_argument("outdir")
    ap.add_argument("--workloads", default="cs336,hf_gpt2,resnet50")
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--keep", default="")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    for name in args.workloads.split(","):
        path = os.path.join(args.outdir, f"{name}.pickle")
        # Each recording in its own process, so that the next one's timings
        # do not share a process with a CUDA context and a model.
        if not os.path.exists(path):
            subprocess.run([sys.executable, __file__, "--record-only", name, path,
                            str(args.events), str(args.seconds)], check=True)
        size = os.path.getsize(path)

        def memlens():
            subprocess.run([args.memlens, "summary", path], check=True, stdout=subprocess.DEVNULL)

        def load():
            with open(path, "rb") as f:
                snap = pickle.load(f)
            del snap
            gc.collect()

        t_ml = best(memlens)
        t_py = best(load, runs=2)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        events = sum(len(t) for t in snap["device_traces"])
        meta = snap.get("_bench", {})
        del snap
        print(f"{name}: {size / 1e6:.0f} MB, {events:,} events; memlens summary {t_ml:.2f} s "
              f"({size / t_ml / 1e9:.2f} GB/s), pickle.load {t_py:.2f} s ({size / t_py / 1e9:.2f} GB/s), "
              f"{t_py / t_ml:.1f}x", flush=True)
        if name == args.keep:
            with open(path, "rb") as src, gzip.open(os.path.join(args.outdir, f"{name}.pickle.gz"), "wb", 3) as dst:
                shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--record-only":
        name, path, events, seconds = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        what, steps, per_step = record(name, path, events, seconds)
        print(f"recorded {name} ({what}): {steps} steps, {per_step:,.0f} events a step", flush=True)
    else:
        main()
