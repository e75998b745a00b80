"""The claims `memlens oom` makes on tests/corpus/oom, as the list `oom_harness.sh rerun` takes.

    python3 tests/gpu/oom_claims.py MEMLENS [CORPUS_DIR] > claims.json

Runs MEMLENS (the binary) on each corpus snapshot twice (no flags but --batch, and with
--message-file) and lists every simulated fix the harness can rerun: a raised cap, a
smaller batch, an allocator setting. Each claim is {"id", "workload", "batch", "cap_bytes",
"conf", "claim", "predicted_peak"}, "claim" being memlens's verdict: "fits", "may_fit"
(simulated on a step known only up to the failure, or without the margin) or "not_enough".
Runs without a GPU; the reruns happen on one (oom_harness.sh rerun OUTDIR claims.json).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The batch each workload failed at, in the unit memlens is told (--batch); the harness
# reruns a workload at `batch` (two_ooms: the training batch; its eval batch is fixed).
WORKLOADS = {
    "gpt_first": dict(batch=16, memlens_batch=16),
    "gpt_warm": dict(batch=16, memlens_batch=16),
    "frag_cap": dict(batch=1, memlens_batch=1),
    "eval_spike": dict(batch=128, memlens_batch=128),
    "two_ooms": dict(batch=16, memlens_batch=128, fixed_batch=True),
}
RERUNNABLE = {"raise_memory_cap", "smaller_batch", "expandable_segments", "max_split_size",
              "garbage_collection"}


def verdict(fix):
    if fix.get("fits") is True:
        return "fits"
    if fix.get("fits") is False:
        return "not_enough"
    return "may_fit"


def claims_of(memlens, corpus, name, w, with_message):
    cmd = [memlens, "oom", os.path.join(corpus, f"{name}.pickle.zst"), "--json",
           "--batch", str(w["memlens_batch"])]
    if with_message:
        cmd += ["--message-file", os.path.join(corpus, f"{name}.message.txt")]
    rep = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    out = []
    for fix in rep["fixes"]:
        spec = fix.get("what_if")
        if fix["kind"] not in RERUNNABLE or spec is None or fix.get("basis") != "simulated":
            continue
        batch = w["batch"]
        if fix["kind"] == "smaller_batch":
            if w.get("fixed_batch"):
                continue
            batch = (rep.get("batch") or {}).get("max_batch")
            if not batch:
                continue
        claim = verdict(fix)
        tag = f"{name}.msg" if with_message else name
        out.append(dict(
            id=f"{tag}:{fix['kind']}:{claim}", workload=name, batch=batch,
            cap_bytes=spec.get("memory_cap_bytes") if fix["kind"] == "raise_memory_cap" else None,
            conf=spec.get("config", ""), claim=claim,
            predicted_peak=fix.get("predicted_peak_reserved_bytes")))
    return out


def main():
    memlens = sys.argv[1]
    corpus = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "corpus", "oom")
    claims = []
    for name, w in WORKLOADS.items():
        for with_message in (False, True):
            claims += claims_of(memlens, corpus, name, w, with_message)
    json.dump(claims, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
