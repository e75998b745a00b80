"""Real CUDA out-of-memory errors for issue 16, and the truth to judge memlens's advice by.

    python3 oom_harness.py record OUTDIR              # the OOM recordings + the truth
    python3 oom_harness.py rerun OUTDIR FIXES.json    # rerun fixes (memlens's "[fits]" claims)
    python3 oom_harness.py slope OUTDIR               # gpt_warm's memory per sample, measured
    python3 oom_harness.py trial SPEC_JSON            # internal: one run in a fresh process

Every run is a fresh process (the allocator settings are read at CUDA start, and
each OOM must start from a clean allocator). The cap is set with
torch.cuda.set_per_process_memory_fraction(cap / total).

Workloads (`b` is the batch the workload scales with):

* gpt_first  - the corpus's student GPT (tests/corpus/gen/model.py) with torch.optim.AdamW,
               3 training steps at batch b under a 3 GiB cap; too large a batch fails in step 1.
* gpt_warm   - the same model: warm steps at batch 4, 6, 8, then steps at batch b (a batch
               ramp); too large a b fails after three good steps (optimizer state exists).
* frag_cap   - 7 MiB tensors filling 20 MiB segments under a 4 GiB cap, every other one
               freed, then a 2 GiB request: fragmentation under a cap.
* eval_spike - 2 training steps at batch 4, then an evaluation pass at batch b that keeps
               every batch's probabilities (the eval spike).
* two_ooms   - a training loop that catches its first OOM (batch 16), halves the batch and goes
               on, then fails in evaluation at batch 128: two OOMs in one trace.

`record` runs each workload once alone with the memory history on (python stacks), dumps
the snapshot at the OOM (the trace holds the `oom` event) with the error text, then finds
each workload's true largest batch by a parallel k-ary search (every probe a fresh run of
the same steps under the same cap), and reruns the recorded batch under the usual
allocator settings, recording OOM or not and the peak reserved.
`rerun` takes a list of {"id", "workload", "batch", "conf", "cap_bytes"} and does the same.
`slope` runs gpt_warm's model at batch 4 (warm-up: the optimizer state is made), then one
step at each of batch 4, 6, 8, 10, 12 with the peak statistics reset before each, and
records what each step added at its peak (max_memory_allocated - memory_allocated at its
start) and the least-squares line of that against the batch: the truth for the slope
memlens fits on gpt_warm's steps.
Writes OUTDIR/truth.json (record), OUTDIR/reruns.json (rerun) or OUTDIR/slope.json (slope).
"""
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
MIB = 1 << 20
# The recorded configuration of each workload: the cap and the batch that fails.
WORKLOADS = {
    "gpt_first": dict(cap=3 * GIB, batch=16, search=(1, 40)),
    "gpt_warm": dict(cap=3 * GIB, batch=16, search=(1, 40)),
    "frag_cap": dict(cap=4 * GIB, batch=1, search=None),
    "eval_spike": dict(cap=3 * GIB, batch=128, search=(1, 256)),
    "two_ooms": dict(cap=3 * GIB, batch=16, search=None),
}
GPT = dict(vocab=8192, d=512, n_layer=6, n_head=8, max_len=512)
T = 512
PARALLEL = int(os.environ.get("OOM_HARNESS_PARALLEL", "10"))
CONFS = ["expandable_segments:True", "max_split_size_mb:64", "garbage_collection_threshold:0.6"]


# -- the workloads (run inside a trial process) ---------------------------------------------

def gpt(torch):
    from model import GPT as Model
    torch.manual_seed(0)
    model = Model(**GPT).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    return model, opt


def train_step(torch, model, opt, b):
    from model import batch, loss_fn
    x, y = batch(GPT["vocab"], b, T)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss)


def evaluate(torch, model, b):
    from model import batch
    kept = []
    with torch.no_grad():
        for _ in range(2):
            x, _y = batch(GPT["vocab"], b, T)
            kept.append(model(x).softmax(-1))  # every batch's probabilities, kept
    return kept


def w_gpt_first(torch, b, log):
    model, opt = gpt(torch)
    for i in range(3):
        log(f"step {i} batch {b}")
        train_step(torch, model, opt, b)


def w_gpt_warm(torch, b, log):
    model, opt = gpt(torch)
    for i, bb in enumerate([4, 6, 8, b, b]):
        log(f"step {i} batch {bb}")
        train_step(torch, model, opt, bb)


def w_frag_cap(torch, b, log):
    piece = 7 * MIB
    keep, drop = [], []
    # 190 pairs: 190 segments of 20 MiB (3,800 MiB of the 4 GiB cap) under the default
    # settings. A fixed count, so that a rerun under other settings runs the same program.
    for _ in range(190):
        drop.append(torch.empty(piece, dtype=torch.uint8, device="cuda"))
        keep.append(torch.empty(piece, dtype=torch.uint8, device="cuda"))
    log(f"{len(keep)} pieces kept, reserved {torch.cuda.memory_reserved()}")
    del drop
    big = torch.empty(2 * GIB * b, dtype=torch.uint8, device="cuda")
    return keep, big


SLOPE_BATCHES = [4, 6, 8, 10, 12]


def w_gpt_slope(torch, b, log):
    model, opt = gpt(torch)
    train_step(torch, model, opt, 4)  # warm-up: AdamW makes its state in the first step
    for bb in SLOPE_BATCHES:
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_step(torch, model, opt, bb)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        log(json.dumps(dict(batch=bb, start_allocated=start, peak_allocated=peak,
                            rise=peak - start)))


def w_eval_spike(torch, b, log):
    model, opt = gpt(torch)
    for i in range(2):
        train_step(torch, model, opt, 4)
    log(f"eval batch {b}")
    evaluate(torch, model, b)


def w_two_ooms(torch, b, log):
    model, opt = gpt(torch)
    batch_size, step = b, 0
    while step < 3:
        try:
            train_step(torch, model, opt, batch_size)
            step += 1
        except torch.OutOfMemoryError as e:
            log(f"first OOM at batch {batch_size}: {str(e).splitlines()[0]}")
            log_message("first", str(e))
            opt.zero_grad(set_to_none=True)
            batch_size //= 2
    log(f"eval batch 128 after training at {batch_size}")
    evaluate(torch, model, 128)


MESSAGES = {}


def log_message(kind, text):
    MESSAGES[kind] = text


def trial(spec):
    """One run in this (fresh) process; prints one JSON line."""
    sys.path.insert(0, spec["proj"])
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(spec["cap_bytes"] / total)
    if spec.get("snapshot"):
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                 max_entries=300000)
    logs = []
    out = dict(id=spec.get("id"), workload=spec["workload"], batch=spec["batch"],
               conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), cap_bytes=spec["cap_bytes"],
               device_total_bytes=total, oom=False)
    fn = globals()["w_" + spec["workload"]]
    t0 = time.time()
    try:
        fn(torch, spec["batch"], logs.append)
    except torch.OutOfMemoryError as e:
        out["oom"] = True
        out["message"] = str(e)
        free, _ = torch.cuda.mem_get_info()
        s = torch.cuda.memory_stats()
        out["at_oom"] = dict(device_free_bytes=free, reserved_bytes=s["reserved_bytes.all.current"],
                             allocated_bytes=s["allocated_bytes.all.current"],
                             inactive_split_bytes=s["inactive_split_bytes.all.current"])
        if spec.get("snapshot"):
            torch.cuda.memory._dump_snapshot(spec["snapshot"])
    s = torch.cuda.memory_stats()
    out.update(peak_reserved_bytes=s["reserved_bytes.all.peak"],
               peak_allocated_bytes=s["allocated_bytes.all.peak"], num_ooms=s["num_ooms"],
               num_alloc_retries=s["num_alloc_retries"], seconds=round(time.time() - t0, 2),
               log=logs)
    if MESSAGES:
        out["messages"] = dict(MESSAGES)
    print("RESULT " + json.dumps(out), flush=True)


# -- the driver -----------------------------------------------------------------------------

def run_trial(spec):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if spec.get("conf"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = spec["conf"]
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "trial", json.dumps(spec)],
                           env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return dict(spec, error="timed out")
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return dict(spec, error=(p.stderr or p.stdout)[-2000:])


def run_all(specs):
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(run_trial, specs))


def largest_batches(proj, names):
    """The largest batch that runs without OOM, per workload: k-ary search, all workloads'
    probes of a round in parallel (a run at b fits => every smaller b fits, assumed and
    checked on the probes)."""
    ranges = {n: list(WORKLOADS[n]["search"]) for n in names}  # [lo fits?, hi]
    fits = {n: {} for n in names}
    lo = {n: 0 for n in names}          # largest known to fit
    hi = {n: ranges[n][1] + 1 for n in names}  # smallest known to fail
    while True:
        specs = []
        for n in names:
            if hi[n] - lo[n] <= 1:
                continue
            span = hi[n] - lo[n]
            k = min(span - 1, max(1, PARALLEL * 2 // len(names)))
            probes = sorted({lo[n] + max(1, round(span * (i + 1) / (k + 1))) for i in range(k)})
            probes = [p for p in probes if lo[n] < p < hi[n]]
            specs += [dict(workload=n, batch=p, cap_bytes=WORKLOADS[n]["cap"], proj=proj) for p in probes]
        if not specs:
            break
        for r in run_all(specs):
            n, b = r["workload"], r["batch"]
            if "error" in r:
                print(f"probe {n} b={b} error: {r['error'][-300:]}", flush=True)
                hi[n] = min(hi[n], b)
                continue
            fits[n][b] = not r["oom"]
            if r["oom"]:
                hi[n] = min(hi[n], b)
            else:
                lo[n] = max(lo[n], b)
        print("search", {n: (lo[n], hi[n]) for n in names}, flush=True)
    return {n: dict(largest_batch=lo[n], smallest_failing=hi[n], probes=fits[n]) for n in names}


def record(outdir, proj):
    os.makedirs(outdir, exist_ok=True)
    truth = dict(workloads={})
    for name, w in WORKLOADS.items():
        spec = dict(workload=name, batch=w["batch"], cap_bytes=w["cap"], proj=proj,
                    snapshot=os.path.join(outdir, f"{name}.pickle"))
        r = run_trial(spec)
        print(name, "oom" if r.get("oom") else "NO OOM", r.get("error", "")[-500:], flush=True)
        if r.get("message"):
            with open(os.path.join(outdir, f"{name}.message.txt"), "w") as f:
                f.write(r["message"] + "\n")
        for kind, text in (r.get("messages") or {}).items():
            with open(os.path.join(outdir, f"{name}.{kind}.message.txt"), "w") as f:
                f.write(text + "\n")
        truth["workloads"][name] = dict(recorded=r)
    searched = [n for n, w in WORKLOADS.items() if w["search"]]
    for n, t in largest_batches(proj, searched).items():
        truth["workloads"][n].update(t)
    specs = [dict(id=f"{n}@{c}", workload=n, batch=w["batch"], cap_bytes=w["cap"], conf=c, proj=proj)
             for n, w in WORKLOADS.items() for c in CONFS]
    truth["reruns"] = run_all(specs)
    for r in truth["reruns"]:
        print("rerun", r.get("id"), "OOM" if r.get("oom") else "ok",
              r.get("peak_reserved_bytes"), r.get("error", "")[-300:], flush=True)
    with open(os.path.join(outdir, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)


def rerun(outdir, proj, fixes_path):
    with open(fixes_path) as f:
        fixes = json.load(f)
    specs = [dict(id=x["id"], workload=x["workload"], batch=x["batch"],
                  cap_bytes=x.get("cap_bytes") or WORKLOADS[x["workload"]]["cap"],
                  conf=x.get("conf", ""), proj=proj) for x in fixes]
    results = run_all(specs)
    for r in results:
        print("rerun", r.get("id"), "OOM" if r.get("oom") else "ok", r.get("peak_reserved_bytes"),
              r.get("error", "")[-300:], flush=True)
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "reruns.json"), "w") as f:
        json.dump(results, f, indent=1)


def slope(outdir, proj):
    r = run_trial(dict(workload="gpt_slope", batch=0, cap_bytes=8 * GIB, proj=proj))
    if "error" in r or r.get("oom"):
        print("slope run failed:", r.get("error", r.get("message")), flush=True)
        sys.exit(1)
    steps = [json.loads(line) for line in r["log"]]
    xs = [st["batch"] for st in steps]
    ys = [st["rise"] for st in steps]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    s = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    out = dict(workload="gpt_warm", steps=steps, slope_bytes_per_sample=s,
               intercept_bytes=my - s * mx, run=r)
    print("slope", round(s), "bytes per sample; intercept", round(my - s * mx), flush=True)
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "slope.json"), "w") as f:
        json.dump(out, f, indent=1)


def main():
    cmd = sys.argv[1]
    proj = os.environ.get("PROJ", os.path.join(HERE, "..", "corpus", "gen"))
    if cmd == "trial":
        trial(json.loads(sys.argv[2]))
    elif cmd == "record":
        record(sys.argv[2], proj)
    elif cmd == "rerun":
        rerun(sys.argv[2], proj, sys.argv[3])
    elif cmd == "slope":
        slope(sys.argv[2], proj)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
