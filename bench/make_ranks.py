#!/usr/bin/env python3
"""Write the rank files of a large job from a real recording, for the
64-rank benchmark (issue 34): each rank is the recording's trace repeated
to about TARGET_MB (as make_large.py does), plus a buffer kept from its
first event to its last at one site (`train.py:88 keep_shadow_copy`),
whose size varies by rank; one rank, the heavy one, keeps 512 MiB there.

    make_ranks.py SRC.pickle[.zst|.gz] OUTDIR N TARGET_MB [--heavy R]

Each rank's allocated peak is the recording's (its `.stats.json`,
`allocated_bytes.all.peak`, measured on the GPU) plus its buffer: the
buffer is its own segment, live through every repetition. OUTDIR gets
`job.rank<R>.pickle` for R in 0..N and `expected.json` (each rank's peak,
the heavy rank and the site). The file is pickled once; each rank's file
is that pickle with the buffer's size written over the 4-byte integer it
takes in the five events that carry it, so writing 64 files of 1 GB takes
about the time of copying them.
"""
import json, os, pickle, struct, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_large import load, tiled  # noqa: E402

MIB = 1 << 20
# The size the pickle is written with: a multiple of 2 MiB (a segment of
# its own, no rounding) whose 4-byte encoding the trace holds nowhere else.
SENTINEL = 682 * MIB
HEAVY = 512 * MIB
FRAME = {"filename": "train.py", "line": 88, "name": "keep_shadow_copy"}
SITE = "train.py:88"


def size_of(rank, heavy):
    """The buffer of `rank`: 12-32 MiB, varied (from 10 MiB a request gets a
    segment of its own size); the heavy rank's 512 MiB."""
    return HEAVY if rank == heavy else ((rank * 37) % 11 + 6) * 2 * MIB


def planted(trace, size):
    """`trace` with a buffer of `size` at a fresh segment, made before its
    first event and released after its last."""
    addr = 0x7E00_0000_0000
    t0, t1 = trace[0]["time_us"] - 10, trace[-1]["time_us"] + 10
    base = {"stream": 0, "compile_context": "N/A", "user_metadata": "", "addr": addr, "size": size}
    frames = [dict(FRAME)]
    head = [
        dict(base, action="segment_alloc", frames=frames, time_us=t0),
        dict(base, action="alloc", frames=frames, time_us=t0 + 1),
    ]
    tail = [
        dict(base, action="free_requested", frames=frames, time_us=t1),
        dict(base, action="free_completed", frames=frames, time_us=t1 + 1),
        dict(base, action="segment_free", frames=frames, time_us=t1 + 2),
    ]
    return head + trace + tail


def main():
    args = sys.argv[1:]
    heavy = 5
    if "--heavy" in args:
        i = args.index("--heavy")
        heavy = int(args[i + 1])
        del args[i : i + 2]
    src, outdir, n, target_mb = args[0], args[1], int(args[2]), float(args[3])
    stats_path = src.split(".pickle")[0] + ".stats.json"
    with open(stats_path) as f:
        base_peak = json.load(f)["memory_stats"]["allocated_bytes.all.peak"]
    snap = load(src)
    snap["device_traces"][0] = planted(tiled(snap, target_mb)[0], SENTINEL)
    data = bytearray(pickle.dumps(snap, protocol=4))
    del snap
    needle = b"J" + struct.pack("<i", SENTINEL)
    at, start = [], 0
    while (i := data.find(needle, start)) >= 0:
        at.append(i + 1)
        start = i + 1
    if len(at) != 5:
        sys.exit(f"the buffer's size occurs {len(at)} times in the pickle, not 5")
    os.makedirs(outdir, exist_ok=True)
    expected = {"heavy_rank": heavy, "site": SITE, "heavy_bytes": HEAVY, "ranks": []}
    for rank in range(n):
        size = size_of(rank, heavy)
        for i in at:
            data[i : i + 4] = struct.pack("<i", size)
        path = os.path.join(outdir, f"job.rank{rank}.pickle")
        with open(path, "wb") as f:
            f.write(data)
        expected["ranks"].append({"rank": rank, "buffer_bytes": size, "peak_allocated": base_peak + size})
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"{outdir}: {n} ranks of {len(data) / 1e6:.0f} MB, rank {heavy} heavy ({HEAVY >> 20} MiB at {SITE})")


if __name__ == "__main__":
    main()
