"""The device file beside a snapshot, on a real GPU (issue 31 item 5).

    python tests/gpu/device_file.py OUTDIR

1. frag_cap (oom_harness.py's fragmentation-under-a-cap workload) under a 4 GiB
   cap with expandable segments, recorded by memlens.record: its OOM snapshot
   and the `.device.json` beside it (checked against torch: total, fraction,
   and the cap against the OOM message's "allowed").
2. The same program under the default settings, not recorded: the truth for
   what `memlens tune` must predict for the defaults on snapshot 1 (OOMs, peak
   reserved).
Writes OUTDIR/device_file.json; the snapshot goes to OUTDIR/frag/.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30


def recorded(out):
    import torch

    import memlens

    sys.path.insert(0, HERE)
    import oom_harness

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(4 * GIB / total)
    message = None
    with memlens.record(os.path.join(out, "frag"), stacks="python", explain_oom=False) as rec:
        try:
            oom_harness.w_frag_cap(torch, 1, lambda *_: None)
        except torch.OutOfMemoryError as e:
            message = str(e)
    oom = [p for p in rec.snapshots if ".oom." in p]
    return dict(total=total, fraction=torch.cuda.get_per_process_memory_fraction(0), message=message,
                oom_snapshot=oom[0] if oom else None,
                device_file=json.load(open(oom[0] + ".device.json")) if oom else None)


def truth():
    import torch

    sys.path.insert(0, HERE)
    import oom_harness

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(4 * GIB / total)
    oomed = False
    try:
        oom_harness.w_frag_cap(torch, 1, lambda *_: None)
    except torch.OutOfMemoryError:
        oomed = True
    s = torch.cuda.memory_stats()
    return dict(oom=oomed, num_ooms=s["num_ooms"], peak_reserved_bytes=s["reserved_bytes.all.peak"])


def child(kind, out):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if kind == "recorded":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    p = subprocess.run([sys.executable, __file__, "--child", kind, out], env=env,
                       capture_output=True, text=True, timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{kind} failed:\n{p.stderr[-3000:]}")


def main():
    if sys.argv[1] == "--child":
        kind, out = sys.argv[2], sys.argv[3]
        r = recorded(out) if kind == "recorded" else truth()
        print("RESULT " + json.dumps(r), flush=True)
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    r = dict(recorded=child("recorded", out), defaults=child("defaults", out))
    dev = r["recorded"]["device_file"]["devices"][0]
    cap = int(dev["memory_fraction"] * dev["total_memory"])
    checks = {
        "total equals torch": dev["total_memory"] == r["recorded"]["total"],
        "fraction equals torch": dev["memory_fraction"] == r["recorded"]["fraction"],
        # fraction * total in floating point, as PyTorch computes it: within bytes of 4 GiB.
        "cap is 4 GiB": abs(cap - 4 * GIB) <= 16,
        "message says 4.00 GiB allowed": "4.00 GiB allowed" in (r["recorded"]["message"] or ""),
        "the defaults OOM too": r["defaults"]["oom"],
    }
    r["checks"] = checks
    json.dump(r, open(os.path.join(out, "device_file.json"), "w"), indent=1)
    for k, v in checks.items():
        print(("PASS " if v else "FAIL ") + k)
    print(json.dumps(r["defaults"]))


if __name__ == "__main__":
    main()
