"""`memlens.predict(..., largest=True)` end to end (issue 30): the largest
batch under a cap found by tracing fake-tensor steps and replaying them,
against the true largest batch (bisected on the GPU) and Lightning's
BatchSizeFinder (tests/gpu/fit_bsf.py: 20-25 s from the process's start).

    python tests/gpu/fake_largest.py OUT_DIR [WORKLOAD,...] [--lightning]

Needs memlens installed (the wheel). Each workload of fit_probes.py runs in
a process of its own, timed from the process's start (imports included, as
Lightning's were), with the search started at batch 2 (Lightning's
init_val) under the cap of tests/corpus/fit/fake/truth.json. No GPU memory
is used. With --lightning, Lightning's BatchSizeFinder runs right after
each search under the same cap, in a process of its own (fit_bsf.py's
worker: binsearch from batch 2, 3 steps a trial), so both are timed in the
same run on the same machine. Results: OUT_DIR/fake_largest.json.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TRUTH = os.path.join(ROOT, "tests", "corpus", "fit", "fake", "truth.json")
STEPS = 3


def worker(workload):
    sys.path.insert(0, HERE)
    import fit_probes
    import memlens
    import memlens._fit as fit

    # Each trace in the order the search made it: batch, fits, peaks, time.
    order = []
    replay_traced = fit._replay_traced

    def logged(build, step, batch, *rest):
        t = time.time()
        answer = replay_traced(build, step, batch, *rest)
        p = answer["predicted"]
        order.append([batch, p["fits"], p["peak_allocated_bytes"], p["peak_reserved_bytes"],
                      p.get("least_limit_bytes"), round(time.time() - t, 2)])
        return answer

    fit._replay_traced = logged
    with open(TRUTH) as f:
        case = json.load(f)["largest"]["workloads"][workload]
    t0 = time.time()
    answer = memlens.predict(lambda b: fit_probes.build(workload, b), lambda s: s(), batch=2, steps=STEPS,
                             limit=case["cap"], largest=True)
    print("RESULT " + json.dumps({
        "workload": workload, "cap": case["cap"], "true_largest": case["largest_batch"],
        "predicted_largest": answer["largest_batch"], "batches_traced": answer["batches_traced"],
        "search_seconds": round(time.time() - t0, 2), "traces": order,
    }), flush=True)


def main():
    args = [a for a in sys.argv[1:] if a != "--lightning"]
    lightning = "--lightning" in sys.argv
    out_dir = args[0]
    workloads = args[1].split(",") if len(args) > 1 else ["gpt", "hf_gpt2", "resnet_amp", "t5", "vit"]
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for w in workloads:
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "--worker", w], capture_output=True, text=True, timeout=300)
        got = [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        row = got[0] if got else {"workload": w, "error": (p.stderr or p.stdout)[-800:]}
        row["process_seconds"] = round(time.time() - t0, 2)
        if "predicted_largest" in row:
            gap = row["true_largest"] - row["predicted_largest"]
            row["verdict"] = "exact" if gap == 0 else "one below" if gap == 1 else "too many" if gap < 0 else "under"
        if lightning and "cap" in row:
            t0 = time.time()
            p = subprocess.run([sys.executable, os.path.join(HERE, "fit_bsf.py"), "lightning", w, str(row["cap"])],
                               capture_output=True, text=True, timeout=300)
            line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
            row["lightning"] = json.loads(line)["found"] if line else (p.stderr or p.stdout)[-400:]
            row["lightning_seconds"] = round(time.time() - t0, 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, "fake_largest.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
