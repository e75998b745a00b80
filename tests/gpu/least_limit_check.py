"""`memlens fit`'s least limit against the GPU (issue 30): each step the
largest-batch search traced (tests/corpus/fit/fake/predict_largest.json:
batch, fits, peaks, least limit) run for real under a cap of its least limit
(`set_per_process_memory_fraction`, fit_probes.py's `capped` mode, 3 steps):
the claim "fits under its least limit" held or not; and the largest batch
found under 96% of its least limit, to see how tight the figure is (not a
claim: a step there may still fit).

    python tests/gpu/least_limit_check.py OUT_DIR [FACTOR,...] [--uncapped]

With FACTORs (e.g. 1.03,1.06), each traced step also runs under its least
limit times each factor: the margin the claim needs to hold. With
--uncapped, each also runs with no cap (`measure`): the GPU's own peaks, to
set beside the trace's.

Runs 8 processes at once on the one GPU (each capped on its own). Results:
OUT_DIR/least_limit.json, one row a run, and a tally printed.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
ROWS = os.path.join(ROOT, "tests", "corpus", "fit", "fake", "predict_largest.json")


def capped(workload, batch, cap):
    mode = "capped" if cap else "measure"
    p = subprocess.run([sys.executable, os.path.join(HERE, "fit_probes.py"), "worker", workload, str(batch),
                        mode, str(cap), ""], capture_output=True, text=True, timeout=400)
    line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
    return json.loads(line) if line else {"workload": workload, "batch": batch, "cap": cap, "ok": None,
                                          "err": p.stderr[-600:]}


def main(out_dir, factors, uncapped):
    os.makedirs(out_dir, exist_ok=True)
    with open(ROWS) as f:
        rows = json.load(f)
    jobs = []
    for r in rows:
        for b, _, _, _, least, _ in r["traces"]:
            if uncapped:
                jobs.append((r["workload"], b, 0, "uncapped", least))
                continue
            jobs.append((r["workload"], b, least, "least", least))
            jobs += [(r["workload"], b, int(least * f), f"x{f}", least) for f in factors]
            if b == r["predicted_largest"]:
                jobs.append((r["workload"], b, int(least * 0.96), "96%", least))
    with ThreadPoolExecutor(8) as ex:
        done = list(ex.map(lambda j: dict(capped(*j[:3]), kind=j[3], least=j[4]), jobs))
    with open(os.path.join(out_dir, "least_limit.json"), "w") as f:
        json.dump(done, f, indent=1)
    for d in done:
        print(json.dumps({k: d.get(k) for k in ("workload", "batch", "kind", "cap", "ok", "max_reserved",
                                                "max_allocated", "least")}))
    for kind in ["least"] + [f"x{f}" for f in factors]:
        held = [d for d in done if d["kind"] == kind]
        print(f"fits under its least limit ({kind}): {sum(d['ok'] is True for d in held)} of {len(held)} held, "
              f"{sum(d['ok'] is None for d in held)} errors")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--uncapped"]
    main(args[0], [float(f) for f in args[1].split(",")] if len(args) > 1 else [], "--uncapped" in sys.argv)
