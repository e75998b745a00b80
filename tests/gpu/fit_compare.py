"""Compares `memlens fit` on the probes of tests/gpu/fit_probes.py with what
the GPU measured: the peaks at larger batches and the largest batch under a
cap.

    python tests/gpu/fit_compare.py MEMLENS_BINARY DIR   (DIR: fit_probes.py's OUT_DIR)
"""

import json
import subprocess
import sys


def fit(binary, d, w, batch, limit):
    args = [binary, "fit", f"{d}/probes/{w}.b2.pickle", f"{d}/probes/{w}.b4.pickle",
            "--recorded-batch", "2,4", "--batch", str(batch), "--json"]
    if limit:
        args += ["--limit", str(limit)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip()}
    return json.loads(p.stdout)


def main(binary, d):
    truth = json.load(open(f"{d}/fit_truth.json"))
    rows, cases, within3, never_fits_wrong = [], 0, 0, True
    for w, rec in truth["workloads"].items():
        cap = rec.get("capped", {}).get("cap")
        for b, m in sorted(rec["measured"].items(), key=lambda x: int(x[0])):
            r = fit(binary, d, w, int(b), cap)
            if "error" in r:
                rows.append(f"| {w} | {b} | error: {r['error'][:80]} | | | |")
                continue
            p = r["predicted"]
            err_r = p["peak_reserved_bytes"] / m["max_reserved"] - 1
            err_a = p["peak_allocated_bytes"] / m["max_allocated"] - 1
            cases += 1
            within3 += abs(err_r) <= 0.03
            rows.append(f"| {w} | {b} | {m['max_reserved'] / 2**20:.0f} MiB | "
                        f"{p['peak_reserved_bytes'] / 2**20:.0f} MiB ({err_r:+.1%}) | "
                        f"{m['max_allocated'] / 2**20:.0f} MiB | "
                        f"{p['peak_allocated_bytes'] / 2**20:.0f} MiB ({err_a:+.1%}) |")
        if cap:
            r = fit(binary, d, w, 16, cap)
            true_largest = rec["capped"]["largest_batch"]
            pred = r.get("largest_batch")
            runs = {x["batch"]: x.get("ok") for x in rec["capped"]["runs"]}
            # A "fits" claim that a run under the cap contradicted.
            wrong = [b for b, ok in runs.items() if ok is False and pred is not None and b <= pred]
            never_fits_wrong &= not wrong
            rows.append(f"| {w} | largest under {cap / 2**20:.0f} MiB | true {true_largest} | "
                        f"predicted {pred} | | {'held' if pred in (true_largest, true_largest - 1) else 'missed'} |")
    print("| workload | batch | measured reserved | predicted reserved | measured allocated | predicted allocated |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\npeak reserved within 3%: {within3} of {cases}; a 'fits' contradicted by a rerun: {not never_fits_wrong}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
