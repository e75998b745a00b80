"""Acceptance checks of issue 14 on a GPU (run by tests/gpu/realworld.sh).

    python3 realworld.py all OUTDIR --proj PROJ --memlens BIN [--runs 10]
    python3 realworld.py check OUTDIR --memlens BIN    (b) and (c) on OUTDIR/leaks, no GPU:
        e.g. the corpus: mkdir -p X/leaks; zstd -d tests/corpus/{clean,leak_*}*.zst
        --output-dir-flat X/leaks; cp tests/corpus/{clean,leak_*}.truth.json X/leaks

PROJ holds the corpus workloads (tests/corpus/gen/model.py and train.py, copied
there by realworld.sh so frames read like a user's project); BIN is the memlens
binary; memlens (the wheel) and torch must be importable.

(a) clean: `--runs` clean runs of the ~100 ms/step student GPT (bench size)
    under memlens.record(every=10, leak_check on), 30 steps each: no LeakWarning,
    and `memlens top --once --json` shows no leak alarm for this process;
(b) alarm: train.py's clean and three planted-leak workloads (kept.append(logits),
    losses.append(loss), eval without no_grad) under memlens.record(every=2), 8
    steps: the clean one warns never, each leak warns and names its call path
    (the entry line of the training loop, from NAME.truth.json);
(c) cli: `memlens leaks --json` and `memlens doctor --json` on the periodic
    snapshots alone and on the final trace alone of each: no leak on clean,
    the planted leak first with high confidence at its call path on each leak.

Prints PASS/FAIL/INFO lines and ends with "N passed, N failed" (exit 1 on a failure).
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

RESULTS = []


def report(ok, name, detail):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {str(detail)[:300]}", flush=True)


def info(name, detail):
    print(f"INFO {name}: {str(detail)[:300]}", flush=True)


def find_pid(doc, pid):
    """The dicts of a JSON document that carry "pid": pid."""
    found = []
    if isinstance(doc, dict):
        if doc.get("pid") == pid:
            found.append(doc)
        for v in doc.values():
            found += find_pid(v, pid)
    elif isinstance(doc, list):
        for v in doc:
            found += find_pid(v, pid)
    return found


def check_clean_runs(args):
    sys.path.insert(0, args.proj)
    import torch

    import memlens
    from model import GPT, AdamW, batch, loss_fn

    cfg = dict(vocab=32000, d=1024, n_layer=8, n_head=16)
    total_warnings, alarms = 0, []
    for run in range(1, args.runs + 1):
        torch.manual_seed(run)
        model = GPT(**cfg).cuda()
        opt = AdamW(model.parameters())
        d = os.path.join(args.out, "clean_runs", f"run{run}")
        times, top_doc = [], None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with memlens.record(d, every=10) as rec:
                for step in range(1, 31):
                    t = time.perf_counter()
                    x, y = batch(cfg["vocab"], 8, 512)
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    loss.item()
                    memlens.step()
                    times.append(time.perf_counter() - t)
                    if run == args.runs and step == 25:
                        time.sleep(1.1)  # the publisher writes at most once a second
                        p = subprocess.run([args.memlens, "top", "--once", "--json"], capture_output=True, text=True,
                                           timeout=60)
                        try:
                            top_doc = json.loads(p.stdout)
                        except ValueError:
                            info("clean.top", f"rc {p.returncode}: {p.stdout[:200]} {p.stderr[:200]}")
        n = sum(1 for w in caught if issubclass(w.category, memlens.LeakWarning))
        total_warnings += n
        if n:
            alarms.append(f"run {run}: {rec.leak_alarm}")
        info(f"clean.run{run}", f"{n} leak warnings, median step {statistics.median(times[3:]) * 1e3:.1f} ms, "
                                f"allocated after the last step {torch.cuda.memory_allocated() / 2**20:.1f} MiB")
        del model, opt
        torch.cuda.empty_cache()
    report(total_warnings == 0, "clean.no_false_alarms", f"{total_warnings} LeakWarnings in {args.runs} runs {alarms}")
    if top_doc is not None:
        # Each process of the sample carries its published figures under "torch".
        views = [m["torch"] for m in find_pid(top_doc, os.getpid()) if isinstance(m.get("torch"), dict)]
        if views:
            alarm = [v.get("leak_alarm") for v in views]
            report(all(a is None for a in alarm), "clean.top_no_alarm",
                   f"memlens top --once --json for pid {os.getpid()}: leak_alarm {alarm}")
        else:
            info("clean.top", f"pid {os.getpid()} not in memlens top --once --json: {json.dumps(top_doc)[:200]}")


WORKLOADS = ["clean", "leak_kept_logits", "leak_losses", "leak_eval_nograd"]


def record_workloads(args):
    d = os.path.join(args.out, "leaks")
    os.makedirs(d, exist_ok=True)
    procs = {w: subprocess.Popen([sys.executable, os.path.join(args.proj, "train.py"), d, w], cwd=args.proj,
                                 stdout=open(os.path.join(d, f"log.{w}.txt"), "w"), stderr=subprocess.STDOUT)
             for w in WORKLOADS}
    for w, p in procs.items():
        rc = p.wait(timeout=600)
        ok = rc == 0 and os.path.exists(os.path.join(d, f"{w}.truth.json"))
        if not ok:
            with open(os.path.join(d, f"log.{w}.txt")) as f:
                report(False, f"record.{w}", f"rc {rc}: {f.read()[-300:]}")
    return d


def mentions(doc, lines):
    """The lines of `lines` that `doc` names as its place: in its site, path,
    title or text, not merely somewhere in its whole stack (every allocation of
    a training loop has the loop's lines in its stack)."""
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k not in ("stack", "evidence", "evidence_labels")}
    text = json.dumps(doc) if not isinstance(doc, str) else doc
    return [ln for ln in lines if ln in text]


def check_alarm(d):
    for w in WORKLOADS:
        p = os.path.join(d, f"{w}.truth.json")
        if not os.path.exists(p):
            continue
        truth = json.load(open(p))
        warned = truth["in_process"]["leak_warnings"]
        if truth["clean"]:
            report(not warned, f"alarm.{w}.silent", f"{len(warned)} LeakWarnings {warned[:1]}")
            continue
        leak = truth["leak"]
        info(f"alarm.{w}", f"kept {leak['bytes_kept_per_step']} bytes/step; planted at {leak['planted_line']}")
        report(len(warned) >= 1, f"alarm.{w}.fires", f"{len(warned)} LeakWarnings; alarm line {truth['in_process']['leak_alarm']}")
        if warned:
            hit = mentions(warned[0], leak["entry_lines"])
            report(bool(hit), f"alarm.{w}.names_call_path",
                   f"expected one of {leak['entry_lines']} in: {warned[0]!r}")


def cli(args, *argv):
    p = subprocess.run([args.memlens, *argv], capture_output=True, text=True, timeout=600)
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        return p.returncode, {"error": (p.stdout + p.stderr)[-300:]}


def check_cli(args, d):
    for w in WORKLOADS:
        p = os.path.join(d, f"{w}.truth.json")
        if not os.path.exists(p):
            continue
        truth = json.load(open(p))
        final = os.path.join(d, f"{w}.pickle")
        periodic = sorted(glob.glob(os.path.join(d, f"{w}.step*.pickle")),
                          key=lambda s: int(s.rsplit(".step", 1)[1].split(".")[0]))
        for label, files in (("periodic", periodic), ("final", [final])):
            rc, doc = cli(args, "leaks", *files, "--json")
            leaks = doc.get("leaks", []) if isinstance(doc, dict) else []
            rc2, doc2 = cli(args, "doctor", *files, "--json", "-o", os.path.join(d, f"{w}.{label}.html"))
            findings = [f for f in doc2.get("findings", []) if f.get("kind") == "leak"] if isinstance(doc2, dict) else []
            if truth["clean"]:
                report(rc in (0,) and not leaks, f"cli.{w}.{label}.leaks_none",
                       f"rc {rc}, {len(leaks)} leaks {json.dumps(leaks[:1])[:200]} {doc.get('error', '')}")
                report(rc2 == 0 and not findings, f"cli.{w}.{label}.doctor_no_leak",
                       f"rc {rc2}, {len(findings)} leak findings {json.dumps(findings[:1])[:200]} {doc2.get('error', '')}")
                continue
            leak = truth["leak"]
            top = leaks[0] if leaks else {}
            report(bool(top) and top.get("confidence") == "high" and mentions(top, leak["entry_lines"]),
                   f"cli.{w}.{label}.leaks_found",
                   f"rc {rc}, top {json.dumps(top)[:220]}; want high confidence naming one of {leak['entry_lines']}"
                   f" {doc.get('error', '')}")
            if top:
                per = top.get("bytes_per_step", 0)
                want = leak["bytes_kept_per_step"]
                info(f"cli.{w}.{label}.rate", f"bytes_per_step {per} vs kept per step {want} (x{per / max(want, 1):.2f})")
            good = [f for f in findings if mentions(f, leak["entry_lines"])]
            report(rc2 == 0 and good, f"cli.{w}.{label}.doctor_leak",
                   f"rc {rc2}, {len(findings)} leak findings, want one naming one of {leak['entry_lines']}: "
                   f"{json.dumps(findings[:1])[:200]} {doc2.get('error', '')}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["all", "clean", "alarm", "check"],
                    help="check: only (b) and (c), on snapshots already in OUTDIR/leaks (no GPU needed)")
    ap.add_argument("out")
    ap.add_argument("--proj", default="/home/user/proj")
    ap.add_argument("--memlens", required=True)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.what in ("all", "alarm", "check"):
        d = record_workloads(args) if args.what != "check" else os.path.join(args.out, "leaks")
        check_alarm(d)
        check_cli(args, d)
    if args.what in ("all", "clean"):
        check_clean_runs(args)
    print(f"{sum(RESULTS)} passed, {len(RESULTS) - sum(RESULTS)} failed", flush=True)
    sys.exit(0 if all(RESULTS) else 1)


if __name__ == "__main__":
    main()
