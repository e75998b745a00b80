#!/usr/bin/env python3
"""Build a realistic memlens ReportData JSON from a real snapshot, without torch.

This stands in for the Rust analyses while they are being written, so that the
page and its browser test can run on real data. It is a rough model, not the
analyses: allocated bytes are the requests rounded up to 512 bytes, categories
are guessed from function names, findings are made from what the data shows.

Usage: make_sample.py NAME OUTDIR [--fx DIR] [--fixtures DIR]
  NAME      a fixture name (gpt2_eval_leak, oom, varlen, long, ...)
  OUTDIR    where to write NAME.report.json (a temp dir, not the repository)
Prints one JSON line: {"json": PATH, "expected_site": "file:line", ...}.
"""
import argparse, collections, datetime, glob, json, os, pickle, re, subprocess, sys

LIB = re.compile(r"site-packages|dist-packages|/torch/|/lib/python\d|^<")
TOP_SITES = 8
CATS = ["parameter", "gradient", "optimizer_state", "activation", "temporary", "input", "other"]


def load(fx_dir, fixtures, name):
    """A snapshot by name: the raw copy in fx_dir if there is one, else the
    fixture's .pickle.zst (through the zstd command)."""
    raw = os.path.join(fx_dir, name + ".pickle")
    if os.path.exists(raw):
        with open(raw, "rb") as f:
            return pickle.load(f)
    data = subprocess.run(["zstd", "-dc", os.path.join(fixtures, name + ".pickle.zst")],
                          check=True, capture_output=True).stdout
    return pickle.loads(data)


def exists(fx_dir, fixtures, name):
    return (os.path.exists(os.path.join(fx_dir, name + ".pickle"))
            or os.path.exists(os.path.join(fixtures, name + ".pickle.zst")))


def step_names(fx_dir, fixtures, name):
    """Names of the snapshots dumped during the run (NAME.stepK), by K."""
    found = set()
    for d, ext in ((fx_dir, ".pickle"), (fixtures, ".pickle.zst")):
        for p in glob.glob(os.path.join(glob.escape(d), glob.escape(name) + ".step*" + ext)):
            found.add(os.path.basename(p)[: -len(ext)])
    return sorted(found, key=lambda n: int(re.search(r"step(\d+)$", n).group(1)))


def label(fr):
    return "%s:%d in %s" % (fr["filename"], fr["line"], fr["name"])


def site_of(frames):
    """Innermost user frame as (site, function); the innermost frame if none."""
    for fr in frames:
        if not LIB.search(fr["filename"]):
            return "%s:%d" % (fr["filename"], fr["line"]), fr["name"]
    if frames:
        return "%s:%d" % (frames[0]["filename"], frames[0]["line"]), frames[0]["name"]
    return "<unknown>", ""


def category(frames):
    names = [f["name"] for f in frames]
    files = " ".join(f["filename"] for f in frames)
    if any(n in ("_apply", "cuda", "to") for n in names) and "optim" not in files:
        return 0
    if "optim" in files or any("step" == n for n in names):
        return 2
    if any(n in ("backward", "_engine_run_backward") for n in names):
        return 1
    if any(n == "randint" or n == "<listcomp>" for n in names):
        return 5
    if any(n == "forward" for n in names):
        return 3
    return 6


def rnd(n):
    return 512 if n < 512 else (n + 511) // 512 * 512


class Interner:
    def __init__(self):
        self.ids = {}
        self.info = []

    def get(self, frames):
        key = tuple((f["filename"], f["line"], f["name"]) for f in frames)
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.info)
            site, fn = site_of(frames)
            self.info.append({"site": site, "function": fn, "stack": [label(f) for f in frames],
                              "category": category(frames)})
        return i


def replay(trace, stacks):
    """Walks the trace; yields per event (allocated, reserved, active, live-by-site)."""
    live = {}  # addr -> (bytes, stack id, pending)
    alloc = reserved = active = 0
    by_stack = collections.Counter()
    out = []
    for i, e in enumerate(trace):
        a, addr = e["action"], e.get("addr", 0)
        if a == "alloc":
            s = stacks.get(e.get("frames", []))
            b = rnd(e["size"])
            live[addr] = (b, s)
            alloc += b
            active += b
            by_stack[s] += b
        elif a == "free_requested":
            if addr in live:
                b, s = live[addr]
                alloc -= b
                by_stack[s] -= b
        elif a == "free_completed":
            if addr in live:
                b, s = live.pop(addr)
                active -= b
        elif a == "segment_alloc":
            reserved += e["size"]
        elif a == "segment_free":
            reserved -= e["size"]
        elif a == "segment_map":
            reserved += e["size"]
        elif a == "segment_unmap":
            reserved -= e["size"]
        out.append((alloc, reserved, active))
    return out


def live_at(trace, stacks, upto):
    live = {}
    for e in trace[: upto + 1]:
        a, addr = e["action"], e.get("addr", 0)
        if a == "alloc":
            live[addr] = (rnd(e["size"]), stacks.get(e.get("frames", [])))
        elif a == "free_requested":
            live.pop(addr, None)
    return live


def site_series(trace, stacks, top_sites):
    """Bytes of each top site (by site string) after each event."""
    index = {s: k for k, s in enumerate(top_sites)}
    cur = [0] * len(top_sites)
    cols = [[] for _ in top_sites]
    live = {}
    for e in trace:
        a, addr = e["action"], e.get("addr", 0)
        if a == "alloc":
            s = stacks.get(e.get("frames", []))
            k = index.get(stacks.info[s]["site"])
            live[addr] = (rnd(e["size"]), k)
            if k is not None:
                cur[k] += live[addr][0]
        elif a == "free_requested" and addr in live:
            b, k = live.pop(addr)
            if k is not None:
                cur[k] -= b
        for k in range(len(cur)):
            cols[k].append(cur[k])
    return cols


def segments_of(snap, stacks, when):
    rows, sites, site_ids = [], [], {}
    state = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}
    for seg in snap["segments"]:
        blocks = []
        for b in seg["blocks"]:
            st = state.get(b["state"], 2)
            site_id, cat = -1, 6
            if st != 2 and b.get("frames"):
                s = stacks.get(b["frames"])
                info = stacks.info[s]
                cat = info["category"]
                key = info["site"]
                if key not in site_ids:
                    site_ids[key] = len(sites)
                    sites.append({"site": key, "stack": info["stack"][:16]})
                site_id = site_ids[key]
            blocks.append([b["address"] - seg["address"], b["size"],
                           b.get("requested_size", 0) if st != 2 else 0, st, cat, site_id, 1])
        pool = seg.get("segment_type", "large")
        pid = tuple(seg.get("segment_pool_id", (0, 0)))
        if pid != (0, 0):
            pool += " (private %d,%d)" % pid
        if seg.get("is_expandable"):
            pool += ", expandable"
        rows.append({"address": seg["address"], "size": seg["total_size"], "stream": seg["stream"],
                     "pool": pool, "blocks": blocks})
    rows.sort(key=lambda r: r["address"])
    return {"when": when, "segments": rows, "sites": sites}


def live_by_site(snap, stacks):
    c = collections.Counter()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and b.get("frames"):
                c[stacks.info[stacks.get(b["frames"])]["site"]] += b["size"]
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("outdir")
    ap.add_argument("--fx", default="/tmp/fx")
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "../../../shared/fixtures"))
    args = ap.parse_args()
    name = args.name
    snap = load(args.fx, args.fixtures, name)
    stats_path = os.path.join(args.fixtures, name + ".stats.json")
    stats = json.load(open(stats_path)) if os.path.exists(stats_path) else {}
    trace = snap["device_traces"][0] if snap.get("device_traces") else []
    stacks = Interner()
    series = replay(trace, stacks)

    report = {"meta": {}, "findings": []}
    meta = report["meta"]
    meta["title"] = "memlens report: " + name
    meta["files"] = [name + ".pickle"]
    meta["memlens_version"] = "0.1.0 (sample)"
    meta["generated"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta["device"] = "cuda:0" + (" (%s)" % stats["device"] if stats.get("device") else "")
    st = snap.get("allocator_settings", {})
    meta["settings"] = [[k, str(v)] for k, v in st.items() if k != "roundup_power2_divisions"]
    if stats.get("torch"):
        meta["settings"].insert(0, ["torch", stats["torch"]])
    meta["notes"] = ["Sample data built by tests/browser/make_sample.py from a real snapshot "
                     "(allocated = requests rounded to 512 B; categories guessed from function names)."]

    peak_i = max(range(len(series)), key=lambda i: (series[i][0], -i)) if series else None
    peak_alloc = series[peak_i][0] if series else 0
    peak_res = max((s[1] for s in series), default=0)
    ooms = [i for i, e in enumerate(trace) if e["action"] == "oom"]

    # Flame graph of what was live at the peak.
    if series:
        live = live_at(trace, stacks, peak_i)
        names, idx, parent, name_ids, value = ["all live memory"], {}, [0], [0], [0]
        kids = {}
        site_bytes = collections.Counter()
        for b, s in live.values():
            info = stacks.info[s]
            site_bytes[info["site"]] += b
            value[0] += b
            node = 0
            for lab in reversed(info["stack"] or ["<no stack>"]):
                nid = idx.get(lab)
                if nid is None:
                    nid = idx[lab] = len(names)
                    names.append(lab)
                key = (node, nid)
                c = kids.get(key)
                if c is None:
                    c = kids[key] = len(parent)
                    parent.append(node)
                    name_ids.append(nid)
                    value.append(0)
                value[c] += b
                node = c
        report["flame"] = {"title": "live at event {:,} (the peak)".format(peak_i), "names": names,
                           "parent": parent, "name": name_ids, "value": value}

        # Timeline stacked by the top sites at the peak.
        top = [s for s, _ in site_bytes.most_common(TOP_SITES)]
        cols = site_series(trace, stacks, top)
        site_info = {}
        for info in stacks.info:
            site_info.setdefault(info["site"], info)
        times = [e.get("time_us", 0) for e in trace]
        report["timeline"] = {
            "x_unit": "time_us" if times and times[-1] else "event",
            "x": times if times and times[-1] else list(range(len(trace))),
            "event": list(range(len(trace))),
            "allocated": [s[0] for s in series],
            "reserved": [s[1] for s in series],
            "active": [s[2] for s in series],
            "sites": [{"site": s, "function": site_info[s]["function"], "stack": site_info[s]["stack"],
                       "category": CATS[site_info[s]["category"]], "peak_bytes": max(cols[k])}
                      for k, s in enumerate(top)],
            "bands": cols,
            "other": [max(0, series[i][0] - sum(c[i] for c in cols)) for i in range(len(series))],
            "peak": peak_i, "ooms": ooms, "source_points": len(trace),
        }
        report["findings"].append({
            "kind": "peak", "severity": "info",
            "title": "Peak of %.2f GiB allocated; %s holds %.0f%% of it" % (
                peak_alloc / 2**30, top[0], 100 * site_bytes[top[0]] / max(peak_alloc, 1)),
            "site": top[0], "bytes": site_bytes[top[0]],
            "suggestion": None,
            "evidence": ["peak at event %d of %d" % (peak_i, len(trace)),
                         "peak reserved %.2f GiB" % (peak_res / 2**30)],
            "stack": site_info[top[0]]["stack"],
        })
        meta["stats"] = [{"label": "peak allocated", "bytes": peak_alloc},
                         {"label": "peak reserved", "bytes": peak_res},
                         {"label": "trace events", "text": "{:,}".format(len(trace))}]
        expected_site = top[0].rsplit("/", 1)[-1]

    # Segment map: at the OOM when there is a snapshot of it, else in the last
    # snapshot taken during the run (nearest the peak), else at dump time.
    steps = step_names(args.fx, args.fixtures, name)
    if exists(args.fx, args.fixtures, name + ".at_oom"):
        report["segments"] = segments_of(load(args.fx, args.fixtures, name + ".at_oom"), stacks, "at the OOM")
    elif steps:
        step = re.search(r"step(\d+)$", steps[-1]).group(1)
        report["segments"] = segments_of(load(args.fx, args.fixtures, steps[-1]), stacks, "after step " + step)
    else:
        report["segments"] = segments_of(snap, stacks, "at dump time")
    if ooms or stats.get("oom_message"):
        report["findings"].insert(0, {
            "kind": "oom", "severity": "critical", "title": "CUDA out of memory",
            "site": None, "bytes": trace[ooms[0]]["size"] if ooms else None,
            "suggestion": "Reduce the batch size, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "evidence": [stats.get("oom_message", "")[:300]], "stack": []})

    # Leaks across the step snapshots.
    if steps:
        labels = [re.search(r"step(\d+)$", n).group(1) for n in steps]
        per = [live_by_site(load(args.fx, args.fixtures, n), stacks) for n in steps]
        grow = []
        for s in set().union(*per):
            v = [c[s] for c in per]
            if all(b >= a for a, b in zip(v, v[1:])) and v[-1] > v[0] and v[-1] - v[0] > 1 << 20:
                grow.append((v[-1] - v[0], s, v))
        grow.sort(reverse=True)
        nums = [int(x) for x in labels]
        span = max(nums[-1] - nums[0], 1)
        sites = []
        for d, s, v in grow[:6]:
            info = next(i for i in stacks.info if i["site"] == s)
            sites.append({"site": s, "function": info["function"], "stack": info["stack"], "bytes": v,
                          "bytes_per_step": (v[-1] - v[0]) // span, "confidence": "high" if v[-1] > 4 * max(v[0], 1) else "medium",
                          "suggestion": "Tensors from here are kept across steps; detach or drop them (e.g. .item() for losses, torch.no_grad() in eval)."})
        if sites:
            report["leaks"] = {"x_label": "step", "points": labels, "sites": sites}
            report["findings"].insert(0, {
                "kind": "leak", "severity": "critical",
                "title": "Memory grows every step at %s" % sites[0]["site"].rsplit("/", 1)[-1],
                "site": sites[0]["site"], "bytes": sites[0]["bytes"][-1],
                "suggestion": stats.get("leak") and "Known bug: " + stats["leak"] + ". Wrap evaluation in torch.no_grad() and keep loss.item().",
                "evidence": ["live bytes at steps %s: %s" % (", ".join(labels), ", ".join("%.1f MiB" % (b / 2**20) for b in sites[0]["bytes"]))],
                "stack": sites[0]["stack"]})

    # Tune table from the real runs of the same workload under other settings.
    base = name.split("@")[0]
    variants = sorted(glob.glob(os.path.join(args.fixtures, base + "*.stats.json")))
    rows = []
    for p in variants:
        v = json.load(open(p))
        ms = v.get("memory_stats", {})
        if not ms:
            continue
        rows.append({"config": v.get("alloc_conf", ""), "peak_reserved_bytes": ms.get("reserved_bytes.all.peak", 0),
                     "num_ooms": ms.get("num_ooms", 0), "num_device_alloc": ms.get("num_device_alloc", 0),
                     "current": os.path.basename(p) == name + ".stats.json"})
    if len(rows) > 1:
        cur = next((r for r in rows if r["current"]), rows[0])
        for r in rows:
            r["delta_bytes"] = r["peak_reserved_bytes"] - cur["peak_reserved_bytes"]
        rows.sort(key=lambda r: (r["num_ooms"], r["peak_reserved_bytes"]))
        report["tune"] = {"device_memory": None, "rows": rows}
        best = rows[0]
        if not best["current"]:
            report["findings"].append({
                "kind": "tune", "severity": "warning",
                "title": "PYTORCH_CUDA_ALLOC_CONF=%s would reserve %.2f GiB less" % (best["config"], -best["delta_bytes"] / 2**30),
                "site": None, "bytes": -best["delta_bytes"], "suggestion": "export PYTORCH_CUDA_ALLOC_CONF=" + best["config"],
                "evidence": ["measured on real runs of the same workload"], "stack": []})

    os.makedirs(args.outdir, exist_ok=True)
    out = os.path.join(args.outdir, name + ".report.json")
    with open(out, "w") as f:
        json.dump(report, f, separators=(",", ":"))
    print(json.dumps({"json": out, "expected_site": expected_site if series else "",
                      "sections": [k for k in ("timeline", "flame", "segments", "leaks", "tune") if k in report]}))


if __name__ == "__main__":
    sys.exit(main())
