"""GPU checks of the memlens Python package (run by tests/gpu/run.sh).

    python3 gpu_checks.py all OUTDIR        every check, each in its own process
    python3 gpu_checks.py CHECK OUTDIR      one check (train, leak, oom, marker, multi, ring, alloc_conf, graphs, cupy, top,
                                            trace_conv)

Each check prints `PASS name: ...` or `FAIL name: ...` lines (and `INFO` lines
with figures); `all` ends with a `N passed, N failed` line and exits 1 when
anything failed. Needs torch with CUDA and memlens importable.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings

MIB = 1024 * 1024
HERE = os.path.abspath(__file__)
RESULTS = []


def report(ok: bool, name: str, detail: str) -> None:
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def info(name: str, detail: str) -> None:
    print(f"INFO {name}: {detail}", flush=True)


def model_and_opt(torch, width=2048):
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    ).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(torch, model, opt, batch=256, width=2048):
    x = torch.randn(batch, width, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


# -- checks ----------------------------------------------------------------------


def check_train(out: str) -> None:
    """Healthy training under memlens.record: snapshots, live file, no leak warning."""
    import torch

    import memlens

    d = os.path.join(out, "train")
    model, opt = model_and_opt(torch)
    runtime = os.environ.get("MEMLENS_RUNTIME_DIR") or f"/tmp/memlens-{os.getuid()}"
    live = os.path.join(runtime, f"{os.getpid()}-{torch.cuda.current_device()}.json")
    step_times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memlens.record(d, every=2) as rec:
            for _ in range(8):
                train_step(torch, model, opt)
                t = time.perf_counter()
                memlens.step()
                step_times.append(time.perf_counter() - t)
            live_doc = json.load(open(live)) if os.path.exists(live) else None
            allocated_at_stop = torch.cuda.memory_allocated()
            t = time.perf_counter()
        final_dump_s = time.perf_counter() - t
    names = sorted(n for n in os.listdir(d) if n.endswith(".pickle"))
    want = ["snapshot.pickle", "snapshot.step2.pickle", "snapshot.step4.pickle", "snapshot.step6.pickle", "snapshot.step8.pickle"]
    report(names == want, "train.snapshots", f"{names}")
    # The device's figures beside every snapshot (issue 31 item 5, issue 35).
    beside = [n for n in want if os.path.exists(os.path.join(d, n + ".device.json"))]
    figures = json.load(open(os.path.join(d, "snapshot.pickle.device.json")))["devices"][0] if beside else {}
    report(beside == want and figures.get("total_memory") == torch.cuda.get_device_properties(0).total_memory,
           "train.device_files", f"{len(beside)} of {len(want)}; {figures}")
    leak_warnings = [w for w in caught if issubclass(w.category, memlens.LeakWarning)]
    report(not leak_warnings, "train.no_false_leak_alarm", f"{len(leak_warnings)} leak warnings")
    keys = ["schema", "pid", "device", "rank", "step", "allocated_bytes", "reserved_bytes", "active_bytes",
            "peak_allocated_bytes", "time", "leak_alarm", "cmdline"]
    # cuda_total_bytes: CUDA's total, the optional key `top` accounts with.
    report(live_doc is not None and [k for k in live_doc if k != "cuda_total_bytes"] == keys
           and live_doc["pid"] == os.getpid() and live_doc["allocated_bytes"] > 0
           and live_doc.get("cuda_total_bytes") == torch.cuda.mem_get_info()[1], "train.live_file", f"{live_doc}")
    report(not os.path.exists(live), "train.live_file_removed", live)
    final = os.path.join(d, "snapshot.pickle")
    s = memlens.load(final).summary()
    report(s.allocated_bytes == allocated_at_stop, "train.summary_matches_torch",
           f"summary allocated {s.allocated_bytes}, torch.cuda.memory_allocated {allocated_at_stop}")
    exe = os.path.join(os.path.dirname(memlens.__file__), "..", "bin", "memlens")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "memlens"]
    p = subprocess.run([*cmd, "summary", final, "--json"], capture_output=True, text=True)
    cli = json.loads(p.stdout) if p.returncode == 0 else None
    report(cli == s.to_dict(), "train.cli_json_equals_python", f"rc {p.returncode} {p.stderr.strip()[:200]}")
    snap = pickle.load(open(final, "rb"))
    n_events = sum(len(t) for t in snap["device_traces"])
    info("train", f"max_entries {rec.max_entries}, trace events in final snapshot {n_events}, "
                  f"step() median {sorted(step_times)[len(step_times) // 2] * 1e3:.2f} ms "
                  f"(max {max(step_times) * 1e3:.1f} ms, includes every-2 dumps), final dump {final_dump_s * 1e3:.0f} ms, "
                  f"final snapshot {os.path.getsize(final) / MIB:.1f} MiB")


def check_leak(out: str) -> None:
    """A planted leak: the alarm fires once and names the line that allocates."""
    import torch

    import memlens

    model, opt = model_and_opt(torch)
    kept = []
    src = open(HERE).read().splitlines()
    leak_line = next(i + 1 for i, line in enumerate(src) if line.rstrip().endswith("# LEAK-HERE"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memlens.record(os.path.join(out, "leak")) as rec:
            for _ in range(12):
                train_step(torch, model, opt)
                kept.append(torch.randn(1024, 1024, device="cuda"))  # LEAK-HERE
                memlens.step()
    leaks = [w for w in caught if issubclass(w.category, memlens.LeakWarning)]
    report(len(leaks) == 1, "leak.warned_once", f"{len(leaks)} LeakWarning(s)")
    text = str(leaks[0].message) if leaks else ""
    site = f"{HERE}:{leak_line}"
    report(site in text, "leak.names_the_line", f"expected {site} in: {text!r}")
    report(bool(leaks) and leaks[0].filename == HERE, "leak.warning_points_at_caller",
           f"{leaks[0].filename}:{leaks[0].lineno}" if leaks else "-")
    report(rec.leak_alarm is not None and "4.00 MiB/step" in rec.leak_alarm, "leak.alarm_line", f"{rec.leak_alarm}")
    # What keeps it: the list `kept`, a local of this function (memlens.why).
    report("held by check_leak() local 'kept'" in text, "leak.names_the_holder",
           f"holders {rec.leak_holders}")
    # The same holder beside the final snapshot, shown by `memlens leaks`.
    final = rec.snapshots[-1] if rec.snapshots else ""
    sidecar = final + ".holders.json"
    p = subprocess.run([sys.executable, "-m", "memlens", "leaks", final], capture_output=True, text=True)
    report(os.path.exists(sidecar) and "held by check_leak() local 'kept'" in p.stdout,
           "leak.cli_shows_the_holder", f"sidecar {os.path.exists(sidecar)}; rc {p.returncode}; {p.stdout[-600:]!r}")


def check_oom(out: str) -> None:
    """An OOM under a memory fraction: snapshot at the moment, explanation on
    stderr before the exception reaches the handler (run in a child process)."""
    d = os.path.join(out, "oom")
    code = textwrap.dedent(f"""
        import sys, torch, memlens
        torch.cuda.set_per_process_memory_fraction(0.05)
        held = []
        with memlens.record({d!r}):
            try:
                while True:
                    held.append(torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda"))
            except torch.cuda.OutOfMemoryError:
                print("HANDLER-REACHED", file=sys.stderr, flush=True)
            del held
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    err = p.stderr
    path = os.path.join(d, "snapshot.oom.pickle")
    report(p.returncode == 0, "oom.process_ok", f"rc {p.returncode}")
    report(os.path.exists(path), "oom.snapshot_written", path)
    i_ml = err.find("memlens: CUDA out of memory")
    i_h = err.find("HANDLER-REACHED")
    report(0 <= i_ml < i_h, "oom.explained_before_exception", f"memlens at {i_ml}, handler at {i_h}")
    report(path in err and ("memlens oom" in err or "cause" in err.lower()), "oom.explanation_printed",
           "stderr:\n" + textwrap.indent(err[:3000], "    "))
    if os.path.exists(path):
        import memlens

        snap = pickle.load(open(path, "rb"))
        actions = [e["action"] for t in snap["device_traces"] for e in t]
        report("oom" in actions, "oom.trace_has_oom_event", f"last actions {actions[-3:]}")
        if "oom" in memlens.available():
            r = memlens.load(path).oom()
            report(bool(r.cause), "oom.analysis", f"cause {r.cause}")


MARKER_TESTS = """
import pytest, torch
MIB = 1024 * 1024
KEEP = []

@pytest.mark.cuda_memory(max_peak="256MiB", no_leaks=True)
def test_small_enough():
    x = torch.ones(16 * MIB, device="cuda")  # 64 MiB
    assert float(x.sum()) == 16 * MIB

@pytest.mark.cuda_memory(max_peak="256MiB")
def test_peak_too_high():
    x = torch.ones(128 * MIB, device="cuda")  # 512 MiB
    del x

@pytest.mark.cuda_memory(no_leaks=True)
def test_leaky():
    KEEP.append(torch.ones(8 * MIB, device="cuda"))  # LEAKY-LINE
"""


def check_marker(out: str) -> None:
    """The pytest marker on a real GPU: one test passes, two fail with the diagnosis."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        report(False, "marker.pytest_missing",
               "pytest is not installed here; carry it with MEMLENS_GPU_WHEELHOUSE (see run.sh)")
        return
    d = os.path.join(out, "marker")
    os.makedirs(d, exist_ok=True)
    test_file = os.path.join(d, "test_gpu_marker.py")
    with open(test_file, "w") as f:
        f.write(MARKER_TESTS)
    leaky_line = next(i + 1 for i, line in enumerate(MARKER_TESTS.splitlines()) if "LEAKY-LINE" in line)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", f"--memlens-dir={d}/snaps", test_file],
        capture_output=True, text=True, cwd=d, timeout=240,
    )
    o = p.stdout
    report("PASSED test_gpu_marker.py::test_small_enough" in o, "marker.passes_within_limits", "")
    report("FAILED test_gpu_marker.py::test_peak_too_high" in o and "is over max_peak 256.00 MiB" in o,
           "marker.fails_over_max_peak", "")
    report("FAILED test_gpu_marker.py::test_leaky" in o and f"test_gpu_marker.py:{leaky_line}" in o,
           "marker.leak_names_the_line", f"expected test_gpu_marker.py:{leaky_line}")
    print(textwrap.indent(o[-4000:], "    | "))


def check_multi(out: str) -> None:
    """Two GPUs in one process: one live file per device."""
    import torch

    import memlens

    if torch.cuda.device_count() < 2:
        print("SKIP multi: fewer than 2 GPUs")
        return
    runtime = os.path.join(out, "runtime")
    os.environ["MEMLENS_RUNTIME_DIR"] = runtime
    a = torch.ones(MIB, device="cuda:0")
    b = torch.ones(MIB, device="cuda:1")
    with memlens.record(os.path.join(out, "multi")):
        files = sorted(os.listdir(runtime))
    report(files == [f"{os.getpid()}-0.json", f"{os.getpid()}-1.json"], "multi.live_file_per_device", f"{files}")
    del a, b


def check_ring(out: str) -> None:
    """Periodic snapshots hold every step they promise (issue 35): the CS336-style
    TransformerLM of bench/workloads.py (~4,400 allocator events a step, every
    op by hand) under memlens.record(every=10) for 40 steps, memlens sizing the
    ring. Each periodic snapshot after the first holds the markers of the ten
    steps since the one before, says so under its "memlens" key, and the
    analysis tells nobody to raise max_entries (it did, 14 of 14 runs, when
    the ring was sized for steps_kept alone)."""
    import torch

    import memlens

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "..", "bench"))
    from workloads import cs336

    run = os.path.join(out, "ring")
    step, _ = cs336()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memlens.record(run, every=10, leak_check=False, publish=False) as rec:
            for _ in range(40):
                step()
                memlens.step()
    ring_warnings = [str(w.message) for w in caught if "ring" in str(w.message)]
    report(not ring_warnings, "ring.no_warning", f"memlens sized the ring to {rec.max_entries:,} entries; warnings {ring_warnings}")
    for k in (20, 30, 40):
        path = os.path.join(run, f"snapshot.step{k}.pickle")
        with open(path, "rb") as f:
            snap = pickle.load(f)
        first = min(e["time_us"] for t in snap["device_traces"] for e in t)
        held = sorted({int(a["name"].split()[-1]) for a in snap.get("external_annotations") or []
                       if a["name"].startswith("memlens.step") and a["time_us"] > first})
        info_ = snap.get("memlens", {})
        report(held == list(range(k - 9, k + 1)) and info_.get("trace_from_step") == k - 10
               and info_.get("ring_wrapped") is False,
               f"ring.step{k}", f"trace holds steps {held[:1]}..{held[-1:]} ({len(held)}), "
               f"{info_.get('events_since_trace_start'):,} events in a ring of {info_.get('max_entries'):,}")
        s = memlens.load(path).summary()
        late = [w for w in s["warnings"] if "max_entries" in w]
        report(not late, f"ring.step{k}.analysis", f"no advice to raise max_entries: {s['warnings'][:1]}")
    torch.cuda.synchronize()


def check_alloc_conf(out: str) -> None:
    """A PYTORCH_CUDA_ALLOC_CONF set after CUDA's first allocation is ignored by
    PyTorch, silently (issue 35 item 3). In a child process that sets it late,
    memlens.record warns at start and the analysis of its snapshot names it
    with the fix; in one that sets it before starting, neither does, and the
    setting is in force."""
    script = textwrap.dedent("""
        import os, sys, warnings, torch, memlens
        if sys.argv[2] == "late":
            x = torch.ones(1, device="cuda")  # CUDA's first allocation
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with memlens.record(sys.argv[1], leak_check=False, publish=False):
                y = torch.ones(1 << 20, device="cuda")
                memlens.step()
        print("WARNED" if any("PYTORCH_CUDA_ALLOC_CONF" in str(w.message) for w in caught) else "QUIET")
        s = memlens.load(os.path.join(sys.argv[1], "snapshot.pickle")).summary()
        print("APPLIED", s["allocator_settings"]["expandable_segments"])
        print("CHECKS", [c["check"] for c in s["capture_checks"]])
    """)
    for when in ("late", "early"):
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if when == "early":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        p = subprocess.run([sys.executable, "-c", script, os.path.join(out, f"conf_{when}"), when],
                           capture_output=True, text=True, env=env, timeout=120)
        text = p.stdout
        if when == "late":
            ok = "WARNED" in text and "APPLIED False" in text and "'alloc_conf_not_applied'" in text
        else:
            ok = "QUIET" in text and "APPLIED True" in text and "alloc_conf_not_applied" not in text
        report(ok, f"alloc_conf.{when}", f"{text.strip()!r} {p.stderr[-300:]!r}")


def check_stopped(out: str) -> None:
    """Recording stopped before the dump (issue 35's capture checks), as user
    scripts stop it: `_record_memory_history(enabled=None)` (PyTorch empties
    the trace: doctor names `no_history`) or `enabled="state"` (the trace
    stops, the dump comes later: doctor names `recording_stopped`), each with
    training after the stop; the same script dumping first gets neither."""
    script = textwrap.dedent("""
        import sys, torch
        def step(xs):
            x = torch.randn(256, 2048, device="cuda")
            for _ in range(8):
                x = torch.relu(x @ torch.randn(2048, 2048, device="cuda"))
            xs.append(x.sum())
        kept = []
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        for _ in range(3):
            step(kept)
        how = sys.argv[2]
        if how != "dumped_first":
            torch.cuda.memory._record_memory_history(enabled=None if how == "none" else "state")
        kept.clear()
        for _ in range(3):
            step([])
        torch.cuda.memory._dump_snapshot(sys.argv[1])
        print("EVENTS", sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"]))
        torch.cuda.memory._record_memory_history(enabled=None)
    """)
    want = {"none": "no allocation history was recorded",
            "state": "trace ends before the snapshot",
            "dumped_first": None}
    for how, title in want.items():
        path = os.path.join(out, f"stopped_{how}.pickle")
        p = subprocess.run([sys.executable, "-c", script, path, how],
                           capture_output=True, text=True, timeout=120)
        d = subprocess.run([sys.executable, "-m", "memlens", "doctor", "--no-report", "--json", path],
                           capture_output=True, text=True)
        try:
            findings = json.loads(d.stdout)["diagnosis"]["findings"]
        except Exception as e:  # noqa: BLE001
            report(False, f"stopped.{how}", f"{e!r} {p.stderr[-300:]!r} {d.stderr[-300:]!r}")
            continue
        capture = [f["title"] for f in findings if f.get("kind") == "capture"]
        ok = any(title in c for c in capture) if title else not capture
        report(ok, f"stopped.{how}", f"{p.stdout.strip()}; capture findings: {[c[:90] for c in capture]}")


def device_account(snapshot: str):
    """`memlens doctor --json`'s account of the device (``diagnosis.device``)
    for a snapshot memlens.record wrote, and what went wrong when there is none."""
    p = subprocess.run([sys.executable, "-m", "memlens", "doctor", "--no-report", "--json", snapshot],
                       capture_output=True, text=True)
    try:
        return json.loads(p.stdout)["diagnosis"]["device"], f"(rc {p.returncode})"
    except Exception:  # noqa: BLE001
        return None, f"(rc {p.returncode}) {p.stderr[-300:]!r}"


def check_graphs(out: str) -> None:
    """nvidia-smi reconciled with a CUDA graph in the process (issue 35 item 1):
    a training step captured with torch.cuda.graph (its private memory pool)
    and replayed 10 times under memlens.record; `memlens doctor --json` on the
    final snapshot accounts for the device's used memory within 64 MiB."""
    import torch

    import memlens

    model, _ = model_and_opt(torch, width=1024)
    # Captured optimizer steps need capturable state (on the GPU).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    static_x = torch.randn(256, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up on a side stream, as the CUDA graphs docs do
            opt.zero_grad(set_to_none=True)
            model(static_x).square().mean().backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = model(static_x).square().mean()
        static_loss.backward()
        opt.step()
    run = os.path.join(out, "graphs")
    with memlens.record(run, leak_check=False, publish=False) as rec:
        for _ in range(10):
            static_x.copy_(torch.randn(256, 1024, device="cuda"))
            graph.replay()
            static_loss.item()
            memlens.step()
        accounts = top_accounts()  # the graph's pool still held
    dev, why = device_account(rec.snapshots[-1])
    report(dev is not None and abs(dev["unexplained_bytes"]) <= 64 * MIB, "graphs.device_accounted", f"{dev} {why}")
    report_top("graphs.top_accounted", accounts, torch.cuda.current_device())


def check_cupy(out: str) -> None:
    """nvidia-smi reconciled with CuPy allocating in the same process (issue 35
    item 1): 512 MiB from CuPy's pool while memlens.record runs. doctor's
    account puts them outside PyTorch, since recording began, and leaves
    within 64 MiB unexplained. Skipped without CuPy."""
    import torch

    import memlens

    try:
        import cupy
    except ImportError:
        info("cupy", "skipped: CuPy is not installed")
        return
    model, opt = model_and_opt(torch, width=1024)
    run = os.path.join(out, "cupy")
    with memlens.record(run, leak_check=False, publish=False) as rec:
        kept = cupy.zeros(512 * MIB, dtype=cupy.uint8)  # CuPy's own allocator
        for _ in range(3):
            train_step(torch, model, opt, width=1024).item()
            memlens.step()
        accounts = top_accounts()  # CuPy's 512 MiB still held
    dev, why = device_account(rec.snapshots[-1])
    ok = (dev is not None and abs(dev["unexplained_bytes"]) <= 64 * MIB
          and (dev.get("outside_pytorch_since_start_bytes") or 0) >= 512 * MIB)
    report(ok, "cupy.device_accounted", f"{dev} (CuPy holds {kept.nbytes} B) {why}")
    report_top("cupy.top_accounted", accounts, torch.cuda.current_device())


def top_accounts() -> dict:
    """`memlens top --once --json` now: each GPU's index -> (used bytes, its
    account or None), or {"error": ...}."""
    p = subprocess.run([sys.executable, "-m", "memlens", "top", "--once", "--json"],
                       capture_output=True, text=True, timeout=60)
    try:
        return {g["index"]: (g["used_bytes"], g.get("account")) for g in json.loads(p.stdout)["gpus"]}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{e!r}; rc {p.returncode}; {p.stdout[-300:]!r} {p.stderr[-300:]!r}"}


def report_top(name: str, accounts: dict, gpu: int = 0) -> None:
    """PASS when `top` accounts for GPU ``gpu`` within 64 MiB."""
    used, account = accounts.get(gpu, (None, None))
    ok = account is not None and abs(account["unexplained_bytes"]) <= 64 * MIB
    report(ok, name, f"GPU {gpu} used {used} = {account} {accounts.get('error', '')}")


def check_top(out: str) -> None:
    """`memlens top` accounts for each GPU's used memory (issue 35 item 1): a
    child trains under memlens.record (which publishes CUDA's total), and
    `memlens top --once --json` splits the GPU's nvidia-smi figure into its
    processes, what the driver keeps and a residual within 64 MiB."""
    script = textwrap.dedent("""
        import sys, time, torch, memlens
        x = torch.randn(4096, 4096, device="cuda")
        with memlens.record(sys.argv[1], leak_check=False):
            for _ in range(40):
                y = (x @ x).sum().item()
                memlens.step()
                time.sleep(0.25)
    """)
    env = dict(os.environ, MEMLENS_RUNTIME_DIR=os.path.join(out, "top-runtime"))
    child = subprocess.Popen([sys.executable, "-c", script, os.path.join(out, "top")], env=env)
    try:
        time.sleep(6)
        p = subprocess.run([sys.executable, "-m", "memlens", "top", "--once", "--json"],
                           capture_output=True, text=True, env=env, timeout=60)
    finally:
        child.kill()
        child.wait()
    try:
        sample = json.loads(p.stdout)
        # NVML may list a process under the host's pid (in a container):
        # then the GPU is the one whose account the child's live file made.
        gpu = next((g for g in sample["gpus"] if any(q["pid"] == child.pid for q in g["processes"])),
                   None) or next(g for g in sample["gpus"] if g.get("account"))
        account = gpu["account"]
    except Exception as e:  # noqa: BLE001
        report(False, "top.gpu_accounted", f"{e!r}; rc {p.returncode}; {p.stdout[-500:]!r} {p.stderr[-300:]!r}")
        return
    ok = account is not None and abs(account["unexplained_bytes"]) <= 64 * MIB
    report(ok, "top.gpu_accounted", f"GPU {gpu['index']} used {gpu['used_bytes']} = {account}")


def check_trace_conv(out: str) -> None:
    """memlens.trace_step on a small CNN: cuDNN's workspaces measured on the
    GPU (each convolution layout run once), nothing of the step's left on
    it, the trace's peak against the same steps run for real; and with the
    user's own allocator recording on, nothing measured and the recording
    kept."""
    import torch

    import memlens

    def build():
        torch.manual_seed(0)
        layers = []
        width = 3
        for w in (64, 128, 256):
            layers += [torch.nn.Conv2d(width, w, 3, padding=1, bias=False), torch.nn.BatchNorm2d(w),
                       torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
            width = w
        model = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(256 * 8 * 8, 10)).cuda()
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(state):
        model, opt = state
        x = torch.randn(64, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (64,), device="cuda")
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    before = torch.cuda.memory_allocated()
    trace = memlens.trace_step(build, step, steps=2)
    meta = trace.snapshot["memlens"]
    left = torch.cuda.memory_allocated() - before
    report(meta["scratch_measuring"] and meta["scratch_measured"] >= 6 and meta["scratch_unmeasured"] == 0
           and left == 0, "trace_conv.workspaces_measured",
           f"{meta['scratch_measured']} layouts measured, {meta['scratch_unmeasured']} not; {left} B left on the GPU")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    state = build()
    for _ in range(2):
        step(state)
    torch.cuda.synchronize()
    real = torch.cuda.max_memory_allocated()
    error = trace.peak_allocated_bytes / real - 1
    report(abs(error) <= 0.03, "trace_conv.peak_within_3_percent",
           f"traced {trace.peak_allocated_bytes}, GPU {real} ({error:+.2%})")
    del state
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        x = torch.empty(1 << 20, device="cuda")
        trace = memlens.trace_step(build, step, steps=1)
        kept = any(e.get("size") == x.untyped_storage().nbytes()
                   for e in torch.cuda.memory._snapshot()["device_traces"][0] if e["action"] == "alloc")
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    meta = trace.snapshot["memlens"]
    report(meta["scratch_measured"] == 0 and meta["scratch_unmeasured"] > 0 and kept,
           "trace_conv.user_recording_left_alone",
           f"{meta['scratch_unmeasured']} layouts not measured; the user's recording kept: {kept}")


CHECKS = {"train": check_train, "leak": check_leak, "oom": check_oom, "marker": check_marker, "multi": check_multi,
          "ring": check_ring, "alloc_conf": check_alloc_conf, "stopped": check_stopped,
          "graphs": check_graphs, "cupy": check_cupy, "top": check_top, "trace_conv": check_trace_conv}


def main() -> int:
    what, out = sys.argv[1], os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    if what != "all":
        CHECKS[what](out)
        return 0 if all(RESULTS) else 1
    try:
        import torch

        import memlens

        assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
    except (ImportError, AssertionError) as e:
        print(f"FAIL setup: {e}")
        print("0 passed, 1 failed")
        return 1
    print(f"INFO env: torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, "
          f"python {sys.version.split()[0]}, memlens {memlens.__version__} from {os.path.dirname(memlens.__file__)}, "
          f"analyses {memlens.available()}", flush=True)
    passed = failed = 0
    for name in CHECKS:
        t = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, HERE, name, out], capture_output=True, text=True, timeout=280)
            text, rc = p.stdout, p.returncode
            if p.returncode != 0 and "Traceback" in p.stderr:
                text += f"FAIL {name}.crashed: " + p.stderr[-2000:] + "\n"
        except subprocess.TimeoutExpired:
            text, rc = f"FAIL {name}.timeout: over 280 s\n", 1
        sys.stdout.write(text)
        passed += sum(1 for line in text.splitlines() if line.startswith("PASS "))
        failed += sum(1 for line in text.splitlines() if line.startswith("FAIL "))
        if rc != 0 and "FAIL " not in text:
            failed += 1
            print(f"FAIL {name}: exit code {rc}")
        print(f"INFO {name}: {time.perf_counter() - t:.1f} s", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
