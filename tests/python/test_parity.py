"""One document per analysis: for every analysis and every fixture it applies
to, Python's ``to_dict()`` equals the JSON ``memlens NAME --json`` prints.

Both come from the library (``memlens::render``), so any difference is a bug.
Volatile keys dropped before comparing, and why:
- ``stack`` of a leak row: an example stack picked among tied blocks in a
  HashMap walk, which varies from process to process (see test_analysis.py);
- ``report`` of ``doctor``: the path of the HTML report, which differs by
  design (the CLI is run with ``--no-report``, Python with no path: both null,
  so it is compared after all).
"""

from __future__ import annotations

import json
import subprocess

import pytest

import memlens
from conftest import fixture_files

SNAPSHOTS = fixture_files()
ANALYSES = ["summary", "peak", "leaks", "check", "oom", "simulate", "tune", "doctor"]

# (CLI arguments after the snapshot, Python call) for each analysis of one snapshot.
CALLS = {
    "summary": ([], lambda s: s.summary()),
    "peak": (["--top", "7"], lambda s: s.peak(top=7)),
    "leaks": ([], lambda s: s.leaks()),
    "check": (["--max-peak", "1GiB"], lambda s: s.check(max_peak="1GiB")),
    # Snapshot.oom() takes no device_memory keyword: called through _run below.
    "oom": (["--device-memory", "80GiB"], None),
    "simulate": (
        ["--config", "expandable_segments:True", "--device-memory", "80GiB"],
        lambda s: s.simulate(config="expandable_segments:True", device_memory="80GiB"),
    ),
    "tune": (["--device-memory", "80GiB"], lambda s: s.tune(device_memory="80GiB")),
    "doctor": (["--no-report"], lambda s: s.doctor()),
}


def strip_volatile(name, doc):
    if name in ("leaks",):
        doc["leaks"] = [{k: v for k, v in row.items() if k != "stack"} for row in doc["leaks"]]
    if name == "doctor":
        leaks = doc["diagnosis"]["leaks"]
        leaks["leaks"] = [{k: v for k, v in row.items() if k != "stack"} for row in leaks["leaks"]]
        for f in doc["findings"] + doc["diagnosis"]["findings"]:
            if f.get("kind") == "leak":
                f.pop("stack", None)
    return doc


def cli(exe, *args):
    return subprocess.run([exe, *args, "--json"], capture_output=True, text=True)


def python_call(name, snap):
    if name == "oom":
        return snap._run("oom", device_memory="80GiB")
    return CALLS[name][1](snap)


@pytest.mark.parametrize("name", ANALYSES)
@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name)
def test_cli_json_equals_python_to_dict(name, path, memlens_exe):
    if name not in memlens.available():
        pytest.fail(f"{name} is not bound in this build")
    proc = cli(memlens_exe, name, str(path), *CALLS[name][0])
    snap = memlens.load(str(path))
    if proc.returncode == 2:
        # Refused on the CLI (oom without an OOM, no trace to simulate): Python
        # refuses too, with the same one-line message.
        with pytest.raises(memlens.MemlensError) as e:
            python_call(name, snap)
        assert str(e.value) in proc.stderr, (str(e.value), proc.stderr)
        return
    assert proc.returncode in (0, 1), proc.stderr  # check exits 1 when a limit is broken
    ours = strip_volatile(name, python_call(name, snap).to_dict())
    theirs = strip_volatile(name, json.loads(proc.stdout))
    assert ours == theirs


def test_oom_without_an_oom_is_an_error_on_both(fixtures_dir, memlens_exe):
    path = str(fixtures_dir / "resnet.pickle.zst")
    proc = cli(memlens_exe, "oom", path)
    assert proc.returncode == 2 and "holds no OOM" in proc.stderr
    with pytest.raises(memlens.MemlensError, match="holds no OOM"):
        memlens.load(path).oom()


def test_diff_equals_the_cli_on_every_pair_of_a_run(fixtures_dir, memlens_exe):
    for run in ("cache_leak", "gpt2_eval_leak"):
        steps = sorted(str(p) for p in fixtures_dir.glob(f"{run}.step*.pickle.zst"))
        for a, b in zip(steps, steps[1:]):
            proc = cli(memlens_exe, "diff", a, b)
            assert proc.returncode == 0, proc.stderr
            assert memlens.load(a).diff(b).to_dict() == json.loads(proc.stdout)


def test_simulate_carries_the_cli_keys(fixtures_dir):
    doc = memlens.load(str(fixtures_dir / "oom.pickle.zst")).simulate(device_memory="80GiB").to_dict()
    for key in ("snapshot", "first_oom_index", "first_oom_site", "recorded"):
        assert key in doc, key


@pytest.mark.parametrize("path", [p for p in SNAPSHOTS if "oom" in p.name], ids=lambda p: p.name)
def test_oom_and_doctor_explain_the_same_oom_with_the_same_fixes(path):
    """One OOM, one advice list (issue 29): Python's ``snap.oom()`` and the
    OOM of ``snap.doctor()`` name the same event, device and cause, with the
    same fixes in the same order, and doctor's OOM finding leads with one of
    them."""
    snap = memlens.load(str(path))
    try:
        oom = snap.oom().to_dict()
    except memlens.MemlensError:
        pytest.skip("no OOM in this trace")
    doc = snap.doctor().to_dict()
    d = doc["diagnosis"]["oom"]
    keys = ("event_index", "device", "cause")
    assert [oom[k] for k in keys] == [d[k] for k in keys]
    assert oom["fixes"] == d["fixes"]
    assert oom["not_helpful"] == d["not_helpful"]
    actions = [f["action"] for f in oom["fixes"]]
    leads = [f["suggestion"] for f in doc["findings"] if f["kind"] == "oom"]
    assert leads and all(s in actions for s in leads)
