"""Where one periodic dump of memlens.record goes (issue 35 item 2).

    python3 bench/dump_profile.py [--model cs336] [--every 2] [--steps 40]

Runs a bench/workloads.py model under memlens.record(every=N) and times each
part of a periodic dump: torch's _snapshot() (the C++ ring and allocator
state turned into Python objects), pickling, writing the file, the device's
figures written beside it, the ring's clear; and, on one dump taken apart,
the conversion and pickling of the trace against the allocator state, and
how many objects each holds. Needs torch with CUDA and memlens importable.
"""
import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from workloads import WORKLOADS  # noqa: E402


def timed(spent, name, fn):
    def inner(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent.setdefault(name, []).append(time.perf_counter() - t)
    return inner


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cs336")
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    import memlens
    from memlens import _capture

    torch.manual_seed(0)
    one_step, description = WORKLOADS[args.model]()
    for _ in range(3):
        one_step()
    spent = {}
    _capture.write_snapshot = timed(spent, "write_snapshot (pickle + file)", _capture.write_snapshot)
    _capture.write_device = timed(spent, "write_device", _capture.write_device)
    d = tempfile.mkdtemp()
    rec = memlens.record(d, every=args.every)
    rec.start()
    for name in ["_snapshot", "_clear_ring", "_dump", "_after_step", "_check_ring", "_mark_step"]:
        setattr(rec, name, timed(spent, name, getattr(rec, name)))
    steps = []
    for _ in range(args.steps):
        t = time.perf_counter()
        one_step()
        memlens.step()
        steps.append(time.perf_counter() - t)
    # One dump taken apart: the trace and the state converted and pickled.
    one_step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    snap = torch.cuda.memory._snapshot()
    convert = time.perf_counter() - t
    trace = snap["device_traces"]
    state = {k: v for k, v in snap.items() if k != "device_traces"}
    t = time.perf_counter()
    tb = pickle.dumps(trace, protocol=pickle.HIGHEST_PROTOCOL)
    pickle_trace = time.perf_counter() - t
    t = time.perf_counter()
    sb = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    pickle_state = time.perf_counter() - t
    t = time.perf_counter()
    pickle.dumps(snap)
    pickle_default = time.perf_counter() - t
    events = sum(len(x) for x in trace)
    blocks = sum(len(s["blocks"]) for s in snap["segments"])
    frames_blocks = sum(len(b.get("frames") or []) for s in snap["segments"] for b in s["blocks"])
    frames_events = sum(len(e.get("frames") or []) for x in trace for e in x)
    rec.stop()
    print(f"== {args.model}: {description}; every={args.every}, {args.steps} steps, median step "
          f"{statistics.median(steps) * 1e3:.1f} ms, skipped actions {rec.skip_actions}")
    for k, v in sorted(spent.items()):
        print(f"  {k:34s} calls {len(v):3d}  mean {statistics.mean(v) * 1e3:7.2f} ms  "
              f"per step {sum(v) / args.steps * 1e3:6.2f} ms")
    print(f"  one dump taken apart (the trace since the last periodic dump): {events:,} events "
          f"({frames_events:,} frames), {len(snap['segments'])} segments, {blocks:,} blocks ({frames_blocks:,} frames)")
    print(f"    _snapshot() {convert * 1e3:.2f} ms; pickle trace {pickle_trace * 1e3:.2f} ms ({len(tb):,} B), "
          f"state {pickle_state * 1e3:.2f} ms ({len(sb):,} B); pickle.dumps default protocol, whole "
          f"{pickle_default * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
