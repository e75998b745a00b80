#!/usr/bin/env python3
# Usage: fuzz/minimise_fixture.py FIXTURE.pickle.zst OUT.pickle N_EVENTS (needs the zstd command)
"""Cuts a fixture snapshot down to a small fuzz seed: the last N trace events of
each device (the OOM kept), at most 2 frames per stack, block frames dropped."""
import pickle, subprocess, sys

src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
raw = subprocess.run(["zstd", "-dc", src], capture_output=True, check=True).stdout
snap = pickle.loads(raw)

def cut_frames(d):
    if isinstance(d, dict) and "frames" in d:
        d["frames"] = d["frames"][:2]
    return d

for seg in snap.get("segments", []):
    for b in seg.get("blocks", []):
        b["frames"] = b.get("frames", [])[:1]
traces = snap.get("device_traces", [])
for i, t in enumerate(traces):
    traces[i] = [cut_frames(e) for e in t[-n:]]
with open(dst, "wb") as f:
    pickle.dump(snap, f, protocol=4)
print(dst, len(pickle.dumps(snap, protocol=4)), [len(t) for t in traces], len(snap.get("segments", [])))
