#!/usr/bin/env python3
"""Make large, realistic snapshots for benchmarks from a real one.

Usage: make_large.py SRC.pickle[.zst|.gz] OUT.pickle TARGET_MB

The trace of SRC (a real run, e.g. fixtures/long.pickle.zst) is repeated with
shifted times until the pickle reaches about TARGET_MB. To keep the result a
valid history that a replay can follow, every repetition but the last ends the
way `torch.cuda.empty_cache()` after `del model` would: each block still live
is freed (free_requested, free_completed) and each segment released
(segment_free). The next repetition then starts from an empty allocator, as
the original run did, and the final segments are the original ones. Frames
stay shared objects, so the pickle memoizes them as PyTorch's own does.
"""
import io, os, pickle, subprocess, sys


def load(path):
    if path.endswith(".gz"):
        import gzip
        with gzip.open(path, "rb") as f:
            return pickle.load(f)
    if path.endswith(".zst"):
        raw = subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
        return pickle.loads(raw)
    with open(path, "rb") as f:
        return pickle.load(f)


def cleanup(trace, t0):
    """Events that free every live block and segment at the end of `trace`."""
    live, segs = {}, {}
    for e in trace:
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = e
        elif a == "free_completed":
            live.pop(e["addr"], None)
        elif a == "segment_alloc":
            segs[e["addr"]] = e["size"]
        elif a == "segment_free":
            segs.pop(e["addr"], None)
    out, t = [], t0
    base = {"stream": 0, "compile_context": "N/A", "user_metadata": "", "frames": []}
    for addr, e in live.items():
        for action in ("free_requested", "free_completed"):
            t += 1
            out.append(dict(base, action=action, addr=addr, size=e["size"], stream=e["stream"], time_us=t))
    for addr, size in segs.items():
        t += 1
        out.append(dict(base, action="segment_free", addr=addr, size=size, time_us=t))
    return out


def tiled(snap, target_mb):
    """The trace of `snap` repeated, with shifted times, until the pickle
    reaches about target_mb; every repetition but the last ends as
    `empty_cache()` after `del model` would. Returns (events, copies)."""
    trace = snap["device_traces"][0]
    probe = io.BytesIO()
    pickle.dump(snap, probe, protocol=4)
    per_copy = probe.tell()
    copies = max(1, round(target_mb * 1e6 / per_copy))
    span = trace[-1]["time_us"] - trace[0]["time_us"] + 1000
    tail = cleanup(trace, trace[-1]["time_us"])
    out = []
    for k in range(copies):
        shift = k * (span + len(tail) + 1000)
        out.extend(dict(e, time_us=e["time_us"] + shift) for e in trace)
        if k + 1 < copies:
            out.extend(dict(e, time_us=e["time_us"] + shift) for e in tail)
    return out, copies


def main():
    src, dst, target_mb = sys.argv[1], sys.argv[2], float(sys.argv[3])
    snap = load(src)
    out, copies = tiled(snap, target_mb)
    snap["device_traces"][0] = out
    with open(dst, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    print(f"{dst}: {copies} copies of the trace, {len(out)} events, {os.path.getsize(dst) / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
