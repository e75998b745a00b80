"""Builds the legacy-format snapshots of the corpus from two recorded ones.

    python3 tests/corpus/gen/legacy.py tests/corpus

PyTorch ~1.13-2.0 wrote a snapshot in the "legacy form" (../shared/docs/
pytorch-memory-internals.md, section 1.4): each block is {size, state,
history?} where history is a list of {addr, real_size, frames}; segments have
no requested_size, frames, segment_pool_id or is_expandable; there is no
allocator_settings. `_record_memory_history(True)` kept a trace of
trace_alloc_max_entries=1 entries, so the trace holds only the `snapshot`
action that the dump itself recorded; `torch.cuda.memory_snapshot()` returned a
bare list of segments. No torch of that age runs on the H100 machine, so these
are converted from recorded snapshots, by the rules of that section, keeping
every block, size, state and stack:

* legacy_kept_logits.pickle.zst, from leak_kept_logits.pickle.zst (final):
  {segments (legacy form), device_traces: [[one `snapshot` entry]]};
* legacy_forward_only_list.pickle.zst, from forward_only.pickle.zst: a bare list
  of legacy segments;
* legacy_oom.pickle.zst, from oom/frag_cap.pickle.zst (dumped by the OOM
  observer at the failure): {segments (legacy form), device_traces: [[the `oom`
  entry]]}, the one entry a trace of one entry keeps at that moment.

Ground truth (NAME.truth.json) is recomputed from the converted blocks and
checked against the source recording's memory_stats.
"""
import json
import os
import pickle
import subprocess
import sys
from collections import defaultdict

USER = "/home/user/proj/"


def load_zst(path):
    return pickle.loads(subprocess.run(["zstd", "-dc", path], capture_output=True, check=True).stdout)


def legacy_segment(seg):
    blocks = []
    addr = seg["address"]
    for b in seg["blocks"]:
        blk = {"size": b["size"], "state": b["state"]}
        if b["state"] != "inactive":
            # The current allocation of an active block; frames as recorded.
            blk["history"] = [{"addr": addr, "real_size": b.get("requested_size", b["size"]),
                               "frames": b.get("frames", [])}]
        blocks.append(blk)
        addr += b["size"]
    keep = ["device", "address", "total_size", "allocated_size", "active_size", "stream", "segment_type"]
    return {**{k: seg[k] for k in keep}, "blocks": blocks}


def user_line(frames):
    for f in frames:
        if f["filename"].startswith(USER):
            return f"{f['filename']}:{f['line']}"
    return "<no user frame>"


def truth_of(name, source, segments, stats, what):
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    reserved = sum(s["total_size"] for s in segments)
    assert allocated == stats["allocated_bytes.all.current"], (name, allocated, stats)
    assert reserved == stats["reserved_bytes.all.current"], (name, reserved, stats)
    by_site = defaultdict(lambda: [0, 0])
    for s in segments:
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                site = user_line(b["history"][0]["frames"])
                by_site[site][0] += b["size"]
                by_site[site][1] += 1
    top = sorted(by_site.items(), key=lambda kv: -kv[1][0])[:3]
    return {
        "name": name,
        "description": what,
        "derived_from": source,
        "recording": {"call": "legacy form, converted by gen/legacy.py", "stacks": "python"},
        "files": [f"{name}.pickle"],
        "memory_stats": {k: stats[k] for k in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                                               "segment.all.current")},
        "note": "no trace to replay: peaks are unknown; only the state at the dump is ground truth",
        "allocated_by_user_line": [{"site": s, "bytes": v[0], "count": v[1]} for s, v in top],
        "steps": None,
        "backward": None,
        "clean": None,
    }


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    # 1. The kept-logits leak, final snapshot, as torch 2.0 would write it.
    src = load_zst(os.path.join(d, "leak_kept_logits.pickle.zst"))
    stats = json.load(open(os.path.join(d, "leak_kept_logits.truth.json")))["memory_stats"]
    segs = [legacy_segment(s) for s in src["segments"]]
    total_active = sum(s["active_size"] for s in segs)
    snap = {"segments": segs, "device_traces": [[{"action": "snapshot", "addr": 0, "size": total_active, "stream": 0}]]}
    name = "legacy_kept_logits"
    truth = truth_of(name, "leak_kept_logits.pickle.zst", segs, stats,
                     "Legacy form (torch ~2.0): per-block history stacks, a trace with only the `snapshot` action; "
                     "the kept-logits leak after 8 steps. Stacks exist (in history): no '<no stack>'.")
    truth["leak"] = {"planted_line": json.load(open(os.path.join(d, "leak_kept_logits.truth.json")))["leak"]["planted_line"],
                     "note": "one snapshot and no trace: no growth to measure; the kept logits are the largest holder"}
    write(d, name, snap, truth)
    # 2. Inference forward, as a bare list of legacy segments.
    src = load_zst(os.path.join(d, "forward_only.pickle.zst"))
    stats = json.load(open(os.path.join(d, "forward_only.truth.json")))["memory_stats"]
    segs = [legacy_segment(s) for s in src["segments"]]
    name = "legacy_forward_only_list"
    truth = truth_of(name, "forward_only.pickle.zst", segs, stats,
                     "Legacy bare list of segments (torch.cuda.memory_snapshot() of torch <= 2.0) with per-block "
                     "history stacks: the 24-block inference model's weights and its logits.")
    write(d, name, segs, truth)
    # 3. The fragmentation OOM (190 segments of 7 MiB pieces under a 4 GiB cap),
    # dumped at the failure as torch 2.0's OOM observer would have.
    src = load_zst(os.path.join(d, "oom", "frag_cap.pickle.zst"))
    segs = [legacy_segment(s) for s in src["segments"]]
    oom = [e for e in src["device_traces"][0] if e["action"] == "oom"][-1]
    entry = {k: oom[k] for k in ("action", "size", "stream", "device_free")}
    snap = {"segments": segs, "device_traces": [[entry]]}
    stats = {"allocated_bytes.all.current": sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated"),
             "reserved_bytes.all.current": sum(s["total_size"] for s in segs), "segment.all.current": len(segs)}
    name = "legacy_oom"
    truth = truth_of(name, "oom/frag_cap.pickle.zst", segs, stats,
                     "Legacy form (torch ~2.0) dumped at a fragmentation OOM: 190 segments whose free 7 MiB pieces "
                     "sit beside live inputs; the trace holds only the `oom` entry (request 2 GiB).")
    truth["oom"] = {"requested_bytes": entry["size"], "device_free_bytes": entry["device_free"],
                    "message": open(os.path.join(d, "oom", "frag_cap.message.txt")).read().strip()}
    write(d, name, snap, truth)
    # 4. The kept-logits leak's periodic snapshots (steps 2, 4, 6, 8), each as
    # torch 2.0 would have dumped it: a series to find the leak across by the
    # blocks' history alone.
    leak_truth = json.load(open(os.path.join(d, "leak_kept_logits.truth.json")))
    for k in (2, 4, 6, 8):
        src = load_zst(os.path.join(d, f"leak_kept_logits.step{k}.pickle.zst"))
        stats = leak_truth["periodic_memory_stats"][f"leak_kept_logits.step{k}.pickle"]
        segs = [legacy_segment(s) for s in src["segments"]]
        total_active = sum(s["active_size"] for s in segs)
        snap = {"segments": segs, "device_traces": [[{"action": "snapshot", "addr": 0, "size": total_active, "stream": 0}]]}
        name = f"legacy_kept_logits.step{k}"
        truth = truth_of(name, f"leak_kept_logits.step{k}.pickle.zst", segs, stats,
                         f"Legacy form (torch ~2.0) of the kept-logits leak after step {k}: one of a series of four.")
        truth["leak"] = {k2: leak_truth["leak"][k2] for k2 in ("planted_line", "alloc_path", "entry_lines", "bytes_kept_per_step")}
        write(d, name, snap, truth)


def write(d, name, obj, truth):
    raw = pickle.dumps(obj, protocol=2)  # what torch of that age wrote
    subprocess.run(["zstd", "-q", "-19", "-f", "-o", os.path.join(d, f"{name}.pickle.zst")], input=raw, check=True)
    with open(os.path.join(d, f"{name}.truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(name, len(raw), truth["allocated_by_user_line"][:2])


if __name__ == "__main__":
    main()
