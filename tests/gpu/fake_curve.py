"""A workload's step traced with fake tensors at every batch from 1 up, kept
(issue 30: the largest-batch search's choice of the next batch to trace,
studied on whole peak curves rather than on the batches one search asked
for).

    python tests/gpu/fake_curve.py OUT_DIR WORKLOAD[,WORKLOAD...] LAST

Each workload of fit_probes.py runs in a process of its own, all at once
(the tracing is CPU work; no GPU memory is used), tracing batches 1..LAST
(3 steps each, as fake_largest.py's search does) and saving each trace as
OUT_DIR/WORKLOAD.bN.pickle, then packing them into OUT_DIR/WORKLOAD.tgz.
OUT_DIR/fake_curve.json: per workload, per batch, the trace's seconds and
`memlens fit`'s answer under the cap of tests/corpus/fit/fake/truth.json.
"""

import json
import os
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TRUTH = os.path.join(ROOT, "tests", "corpus", "fit", "fake", "truth.json")
STEPS = 3


def worker(out_dir, workload, last):
    sys.path.insert(0, HERE)
    import fit_probes
    from memlens import _native
    from memlens._trace import trace_step

    with open(TRUTH) as f:
        cap = json.load(f)["largest"]["workloads"][workload]["cap"]
    rows = []
    for b in range(1, last + 1):
        t = time.time()
        trace = trace_step(lambda: fit_probes.build(workload, b), lambda s: s(), steps=STEPS)
        path = trace.save(os.path.join(out_dir, f"{workload}.b{b}.pickle"))
        seconds = round(time.time() - t, 2)
        answer = json.loads(_native.fit_json([path], [], None, cap, None, None))
        rows.append({"batch": b, "seconds": seconds, "predicted": answer["predicted"]})
        print(json.dumps(rows[-1]), flush=True)
    print("RESULT " + json.dumps({"workload": workload, "cap": cap, "rows": rows}), flush=True)


def main():
    out_dir, workloads, last = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    os.makedirs(out_dir, exist_ok=True)
    procs = {
        w: subprocess.Popen([sys.executable, __file__, "--worker", out_dir, w, str(last)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for w in workloads
    }
    results = []
    for w, p in procs.items():
        out, err = p.communicate(timeout=560)
        got = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        results.append(got[0] if got else {"workload": w, "error": (err or out)[-800:]})
        with tarfile.open(os.path.join(out_dir, f"{w}.tgz"), "w:gz") as tar:
            for name in sorted(os.listdir(out_dir)):
                if name.startswith(f"{w}.b") and name.endswith(".pickle"):
                    tar.add(os.path.join(out_dir, name), arcname=name)
                    os.remove(os.path.join(out_dir, name))
        print(json.dumps(results[-1])[:400], flush=True)
    with open(os.path.join(out_dir, "fake_curve.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
