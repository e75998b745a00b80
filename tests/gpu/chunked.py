"""Periodic snapshots that hold only the trace since the previous one (issue 14).

    python3 tests/gpu/chunked.py OUTDIR MEMLENS_BINARY

Trains the corpus GPT for 9 steps under memlens.record(every=2, steps_kept=3)
and checks, on real torch: each periodic snapshot's trace starts after the
previous one's ends (the ring was cleared, nothing overlaps) and holds about
`every` steps of events; the final snapshot's trace is in time order, holds
each event once and reaches back to at least steps_kept steps before the end
(stitched from the periodic files); the step markers of the kept steps are in
it; `memlens leaks` on the run finds no leak. Prints PASS/FAIL lines.
"""
import os
import pickle
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "corpus", "gen"))

import torch  # noqa: E402

import memlens  # noqa: E402
from model import GPT, AdamW, batch, loss_fn  # noqa: E402

out, ml = sys.argv[1], sys.argv[2]
run = os.path.join(out, "chunked")
os.makedirs(run, exist_ok=True)
torch.manual_seed(0)
model = GPT(vocab=8000, d=512, n_layer=4, n_head=8).cuda()
opt = AdamW(model.parameters(), lr=1e-4)
with memlens.record(run, every=2, steps_kept=3) as rec:
    for _ in range(9):
        x, y = batch(8000, 8, 256)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        memlens.step()

failed = 0
passed = 0


def check(ok, what):
    global failed, passed
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    failed += 0 if ok else 1
    passed += 1 if ok else 0


def load(name):
    with open(os.path.join(run, name), "rb") as f:
        return pickle.load(f)


def times(snap):
    return [e["time_us"] for t in snap["device_traces"] for e in t]


def markers(snap):
    return sorted({a["name"] for a in snap.get("external_annotations") or [] if a["name"].startswith("memlens.step")})


periodic = [f"snapshot.step{k}.pickle" for k in (2, 4, 6, 8)]
# The snapshots (each has its device figures beside it, *.device.json).
pickles = sorted(n for n in os.listdir(run) if n.endswith(".pickle"))
check(pickles == sorted(periodic + ["snapshot.pickle"]), f"files: {pickles}")
sizes, last_end = [], None
for name in periodic:
    t = times(load(name))
    sizes.append(len(t))
    print(f"INFO {name}: {len(t)} trace events, markers {markers(load(name))}")
    check(t == sorted(t) and (last_end is None or t[0] > last_end), f"{name}: trace after the previous periodic one's")
    last_end = t[-1]
# Steps 3-8 are alike (step 1-2 build the optimizer state): every=2 steps each.
check(max(sizes[1:]) <= 1.2 * min(sizes[1:]), f"periodic snapshots hold alike spans of ~2 steps: {sizes}")
final = load("snapshot.pickle")
t = times(final)
print(f"INFO final: {len(t)} trace events, markers {markers(final)}")
check(t == sorted(t), "final trace in time order")
ann = {a["name"]: a["time_us"] for a in final.get("external_annotations") or [] if a.get("stage") == "START"}
check(all(f"memlens.step {k}" in ann for k in (5, 6, 7, 8, 9)), "final holds the step markers of steps 5-9")
check(bool(ann) and t[0] <= ann.get("memlens.step 6", 0), "final trace reaches back past steps_kept (3) steps")
files = [os.path.join(run, n) for n in periodic + ["snapshot.pickle"]]
r = subprocess.run([ml, "leaks", "--fail-on-leak", *files], capture_output=True, text=True)
print("INFO memlens leaks: " + (r.stdout.strip().splitlines() or [r.stderr.strip()])[0])
check(r.returncode == 0, f"memlens leaks on the clean chunked run: exit {r.returncode}")
r2 = subprocess.run([ml, "leaks", "--fail-on-leak", os.path.join(run, "snapshot.pickle")], capture_output=True, text=True)
print("INFO memlens leaks final: " + (r2.stdout.strip().splitlines() or [""])[0])
check(r2.returncode == 0, f"memlens leaks on the stitched final snapshot: exit {r2.returncode}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
