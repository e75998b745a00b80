"""First-step OOMs of tests/gpu/fit_probes.py's workloads, recorded: the
evidence for issue 30's "largest batch from a first-step OOM snapshot".

    python tests/gpu/first_step_oom.py OUT_DIR [WORKLOAD:BATCH,...]

Each run is a process of its own under the cap of tests/corpus/fit's capped
runs (fit_truth.json, whose bisection gives the true largest batch), recorded
with torch's default stacks, at a batch that fails. Writes
OUT_DIR/<workload>.b<batch>.pickle (dumped at the OOM) and prints one JSON
line a run: ok, the step and phase (forward, backward, optimizer) it failed
in, the peaks.
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
TRUTH = os.path.join(HERE, "..", "corpus", "fit", "fit_truth.json")
DEFAULT = ["gpt:32", "hf_gpt2:32", "resnet_amp:32", "t5:32", "vit:32", "bert:32", "vit_b:32"]


def worker(workload, batch, cap, out):
    import torch

    sys.path.insert(0, HERE)
    import fit_probes

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    model, make_opt, make, loss = fit_probes.parts(workload)
    opt = make_opt(model)
    result = {"workload": workload, "batch": batch, "cap": cap, "ok": True}
    phase = "build"
    try:
        for i in range(fit_probes.STEPS):
            result["step"] = i
            phase = "forward"
            inputs = make(batch)
            value, held = loss(model, inputs)
            phase = "backward"
            value.backward()
            phase = "optimizer"
            opt.step()
            opt.zero_grad(set_to_none=True)
            del inputs, value, held
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        result["ok"] = False
        result["phase"] = phase
        result["message"] = str(e).split("\n")[0][:400]
        torch.cuda.memory._dump_snapshot(out)
    result["max_reserved"] = torch.cuda.max_memory_reserved()
    result["max_allocated"] = torch.cuda.max_memory_allocated()
    print("RESULT " + json.dumps(result), flush=True)


def run(spec):
    workload, batch, cap, out = spec
    p = subprocess.run([sys.executable, __file__, "worker", workload, str(batch), str(cap), out],
                       capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"workload": workload, "batch": batch, "error": p.stderr[-1500:]}


def main(out_dir, runs):
    os.makedirs(out_dir, exist_ok=True)
    with open(TRUTH) as f:
        truth = json.load(f)["workloads"]
    specs = []
    for item in runs:
        w, b = item.split(":")
        cap = truth[w]["capped"]["cap"]
        specs.append((w, int(b), cap, os.path.join(out_dir, f"{w}.b{b}.pickle")))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, specs))
    for r in results:
        r["largest_batch"] = truth[r["workload"]]["capped"]["largest_batch"]
        print(json.dumps(r), flush=True)
    with open(os.path.join(out_dir, "first_step.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else DEFAULT)
