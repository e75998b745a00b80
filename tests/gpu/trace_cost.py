"""Where a fake-tensor search's time goes (issue 30): the process's imports,
CUDA's start, and each trace of `memlens.trace_step` in one process, one
profiled (cProfile, top entries by cumulative and by own time): the first,
or the one at index `PROFILE` (`PROFILE=1`: the second, once warm).

    [PROFILE=I] python tests/gpu/trace_cost.py WORKLOAD [BATCH,...]
"""

import cProfile
import io
import os
import pstats
import sys
import time

t0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(workload, batches):
    import torch

    t = time.time()
    print(f"import torch {t - t0:.2f} s", flush=True)
    torch.cuda.init()
    torch.cuda.get_device_properties(0)
    print(f"cuda init {time.time() - t:.2f} s", flush=True)
    import fit_probes
    import memlens

    profiled = int(os.environ.get("PROFILE", "0"))
    for i, b in enumerate(batches):
        t = time.time()
        if i == profiled:
            prof = cProfile.Profile()
            prof.enable()
        trace = memlens.trace_step(lambda: fit_probes.build(workload, b), lambda s: s(), steps=3)
        if i == profiled:
            prof.disable()
        print(f"trace b={b} {time.time() - t:.2f} s, peak {trace.peak_allocated_bytes}", flush=True)
        if i == profiled:
            for order in ("cumulative", "tottime"):
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats(order).print_stats(30)
                print(out.getvalue()[:6000])
    print(f"total {time.time() - t0:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1], [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "2,4,2").split(",")])
