"""Recordings for issue 22 (per-module memory, the line profiler, profiler traces).

    python3 tests/gpu/modules.py OUTDIR

A small GPT-2 (GPT2LMHeadModel from a GPT2Config built here, no download),
trained with torch.optim.AdamW on random tokens:

  (i)   named.pickle: 3 steps under memlens.record(model=model) (module scopes);
  (ii)  plain.pickle: 3 steps under plain _record_memory_history (stacks="python");
  (iii) planted.pickle: `planted()` below under @memlens.profile, with
        allocations of known sizes; truth: its per-line figures;
  (iv)  trace.json: 2 steps under torch.profiler(profile_memory=True), exported
        as a Chrome trace; truth: torch.cuda.max_memory_allocated() after
        reset_peak_memory_stats() at the profiler's start;
  plus the overhead of the module hooks (step time, record(model=) against
  record()) and of memlens.profile beyond PyTorch's recording, and
  src.tar: the source files of the `forward` frames (for --source-root).
Writes OUTDIR/truth.json.
"""
import json
import os
import pickle
import sys
import tarfile
import time

import torch
import transformers

import memlens

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
MiB = 1 << 20
truth = {
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "gpu": torch.cuda.get_device_name(0),
}

torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=8192, n_positions=256,
                              bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, 8192, (8, 256), device="cuda")


def train_step():
    out_ = model(input_ids=x, labels=x)
    out_.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def stats():
    s = torch.cuda.memory_stats()
    return {k: int(s.get(k, 0)) for k in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                                         "reserved_bytes.all.current", "reserved_bytes.all.peak")}


train_step()  # the optimizer state exists before the recordings
torch.cuda.synchronize()

# (i) named
torch.cuda.reset_peak_memory_stats()
with memlens.record(os.path.join(out, "named.pickle"), model=model, publish=False, leak_check=False):
    for _ in range(3):
        train_step()
        memlens.step()
truth["named"] = stats()
print("INFO named", truth["named"], flush=True)

# (ii) plain
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
for _ in range(3):
    train_step()
torch.cuda.memory._dump_snapshot(os.path.join(out, "plain.pickle"))
torch.cuda.memory._record_memory_history(enabled=None)
truth["plain"] = stats()
print("INFO plain", truth["plain"], flush=True)
srcs = set()
with open(os.path.join(out, "plain.pickle"), "rb") as f:
    snap = pickle.load(f)
for t in snap["device_traces"]:
    for e in t:
        for fr in e.get("frames") or []:
            if fr.get("name") == "forward" and fr.get("filename", "").endswith(".py"):
                srcs.add(fr["filename"])
truth["forward_files"] = sorted(srcs)
with tarfile.open(os.path.join(out, "src.tar"), "w") as tar:
    for p in sorted(srcs):
        if os.path.exists(p):
            tar.add(p, arcname=p.lstrip("/"))
del snap


# (iii) planted: line -> (allocated, freed) in bytes, from the sizes below.
def planted():
    a = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")  # LINE a
    b = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")  # LINE b
    for _ in range(3):
        t = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")  # LINE loop
    c = a.float()  # LINE c
    del a  # LINE del_a
    del t  # LINE del_t
    d = c[: 2 * MiB].clone()  # LINE d
    del c  # LINE del_c
    return b, d


src, first = __import__("inspect").getsourcelines(planted)
lines = {}
for i, text in enumerate(src):
    if "# LINE " in text:
        lines[text.split("# LINE ")[1].strip()] = first + i
want = {  # allocated, freed
    "a": (8 * MiB, 0), "b": (4 * MiB, 0), "loop": (6 * MiB, 4 * MiB), "c": (32 * MiB, 0),
    "del_a": (0, 8 * MiB), "del_t": (0, 2 * MiB), "d": (8 * MiB, 0), "del_c": (0, 32 * MiB),
}
order = ["a", "b", "loop", "c", "del_a", "del_t", "d", "del_c"]
torch.cuda.synchronize()
base = torch.cuda.memory_allocated()
level, planted_truth = base, {}
for k in order:
    al, fr = want[k]
    # Peak while the line ran: the largest total before or after one of its
    # events (the loop's second run allocates the next t before the old one is freed).
    peak = level + (4 * MiB if k == "loop" else al)
    planted_truth[str(lines[k])] = {"name": k, "allocated": al, "freed": fr, "net": al - fr, "peak": peak}
    level += al - fr
prof = memlens.profile(path=os.path.join(out, "planted.pickle"), print_to=None)
fn = prof(planted)
keep = fn()
torch.cuda.synchronize()
truth["planted"] = {"file": planted.__code__.co_filename, "function": "planted", "base": base,
                    "lines": planted_truth, "overhead_s": prof.overhead_s}
del keep


# Overhead of memlens.profile beyond PyTorch's recording: the same call
# under plain recording, and under memlens.profile (snapshot + analysis;
# the analysis runs only where the native part has it).
def timed(f, n=20):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = f()
        del r
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def plain_recorded():
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=300_000)
    r = planted()
    s = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return r, s


truth["profile_overhead"] = {
    "bare_s": timed(planted),
    "plain_recording_with_snapshot_s": timed(plain_recorded),
    "memlens_profile_s": timed(memlens.profile(print_to=None)(planted)),
}
print("INFO profile overhead", truth["profile_overhead"], flush=True)


# Module hook overhead: step time under record() and record(model=model).
def step_time(named, n=15):
    d = os.path.join(out, "tmp_overhead")
    kw = {"model": model} if named else {}
    with memlens.record(d, publish=False, leak_check=False, **kw):
        for _ in range(3):
            train_step()
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            train_step()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


rounds = [(step_time(False), step_time(True)) for _ in range(3)]
calls = sum(1 for _ in model.named_modules())
truth["module_hooks"] = {"record_s": [r[0] for r in rounds], "record_model_s": [r[1] for r in rounds],
                         "modules": calls}
print("INFO module hooks", truth["module_hooks"], flush=True)
import shutil  # noqa: E402
shutil.rmtree(os.path.join(out, "tmp_overhead"), ignore_errors=True)

# (iv) profiler trace
from torch.profiler import ProfilerActivity, profile  # noqa: E402
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
start_allocated = torch.cuda.memory_allocated()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as p:
    for _ in range(2):
        train_step()
    torch.cuda.synchronize()
truth["trace"] = {"max_memory_allocated": int(torch.cuda.max_memory_allocated()),
                  "allocated_at_start": int(start_allocated), "steps": 2, **stats()}
p.export_chrome_trace(os.path.join(out, "trace.json"))
print("INFO trace", truth["trace"], flush=True)
with open(os.path.join(out, "truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
print("DONE", flush=True)
