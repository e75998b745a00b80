"""The analysis API over the real fixtures: figures equal the CLI's JSON, and
the result objects behave as documented."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import fake_torch
import pytest

import memlens
from memlens import _native
from conftest import fixture_files

METHODS = {
    "summary": lambda s, o: s.summary(),
    "peak": lambda s, o: s.peak(top=5),
    "diff": lambda s, o: s.diff(o),
    "leaks": lambda s, o: s.leaks(o),
    "oom": lambda s, o: s.oom(),
    "simulate": lambda s, o: s.simulate(config="expandable_segments:True", device_memory="80GiB"),
    "tune": lambda s, o: s.tune(device_memory="80GiB"),
    "doctor": lambda s, o: s.doctor(),
    "check": lambda s, o: s.check(max_peak="1GiB"),
}
FINAL = [p for p in fixture_files() if ".step" not in p.name and ".at_oom" not in p.name]


def cli_json(exe, *args):
    proc = subprocess.run([exe, *args, "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_summary_is_bound():
    assert "summary" in memlens.available()


@pytest.mark.parametrize("path", FINAL + [p for p in fixture_files() if ".step" in p.name or ".at_oom" in p.name],
                         ids=lambda p: p.name)
def test_summary_equals_the_cli_json(path, memlens_exe):
    if "summary" not in memlens.available():
        pytest.fail("summary is not bound in this build")
    py = memlens.load(path).summary().to_dict()
    assert py == cli_json(memlens_exe, "summary", str(path))
    assert py["schema"] == "memlens/1"


CLI_SAME = [
    # (analysis, Python call, CLI arguments), on fixtures of this kind
    ("peak", lambda f, fx: memlens.load(f).peak(), lambda f, fx: ["peak", str(f)]),
    ("peak", lambda f, fx: memlens.load(f).peak(top=3), lambda f, fx: ["peak", str(f), "--top", "3"]),
    ("leaks", lambda f, fx: memlens.load(f).leaks(), lambda f, fx: ["leaks", str(f)]),
    ("check", lambda f, fx: memlens.load(f).check(max_peak="1GiB"),
     lambda f, fx: ["check", str(f), "--max-peak", "1GiB"]),
]


@pytest.mark.parametrize("name, py, cli", CLI_SAME, ids=[c[0] + str(i) for i, c in enumerate(CLI_SAME)])
@pytest.mark.parametrize("fixture", ["cache_leak.pickle.zst", "gpt2_train.pickle.zst", "oom.at_oom.pickle.zst"])
def test_analyses_equal_the_cli_json(name, py, cli, fixture, fixtures_dir, memlens_exe):
    if name not in memlens.available():
        pytest.skip(f"{name} is not in this build")
    f = fixtures_dir / fixture
    proc = subprocess.run([memlens_exe, *cli(f, fixtures_dir), "--json"], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr  # check exits 1 when a limit is broken
    ours, theirs = py(f, fixtures_dir).to_dict(), json.loads(proc.stdout)
    if name == "leaks":
        ours, theirs = without_stacks(ours), without_stacks(theirs)
    assert ours == theirs


def without_stacks(doc):
    doc["leaks"] = [{k: v for k, v in row.items() if k != "stack"} for row in doc["leaks"]]
    return doc


def test_diff_and_leaks_across_snapshots_equal_the_cli_json(fixtures_dir, memlens_exe):
    steps = [str(fixtures_dir / f"gpt2_eval_leak.step{k}.pickle.zst") for k in (1, 5, 11)]
    if "diff" in memlens.available():
        py = memlens.load(steps[0]).diff(steps[2]).to_dict()
        assert py == cli_json(memlens_exe, "diff", steps[0], steps[2])
        assert py["grown"] and py["grown"][0]["bytes"] > 0
    if "leaks" in memlens.available():
        py = memlens.load(steps[0]).leaks(steps[1], steps[2])
        # The example `stack` of a leak is picked from a HashMap walk in the
        # library and varies from process to process (a tie between equal
        # blocks); every figure is compared.
        assert without_stacks(py.to_dict()) == without_stacks(cli_json(memlens_exe, "leaks", *steps))
        assert py.leaks and py.leaks[0].site.startswith("/home/user/train/workloads.py:")


def test_summary_figures_match_torch_memory_stats(fixtures_dir):
    """The final snapshot's state reproduces memory_stats' .current figures."""
    for path in FINAL:
        stats = json.loads((fixtures_dir / path.name.replace(".pickle.zst", ".stats.json")).read_text())
        ms = stats["memory_stats"]
        s = memlens.load(path).summary()
        assert s.reserved_bytes == ms["reserved_bytes.all.current"], path.name
        assert s.allocated_bytes == ms["allocated_bytes.all.current"], path.name
        assert s.active_bytes == ms["active_bytes.all.current"], path.name


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_works_or_says_it_is_not_in_this_build(name, fixtures_dir):
    snap = memlens.load(fixtures_dir / "cache_leak.step1.pickle.zst")
    other = fixtures_dir / "cache_leak.step9.pickle.zst"
    if name == "oom" and name in memlens.available():
        # No OOM in this trace: an error, as on the CLI (exit 2); see test_parity.py.
        with pytest.raises(memlens.MemlensError, match="holds no OOM"):
            METHODS[name](snap, other)
    elif name in memlens.available():
        r = METHODS[name](snap, other)
        assert isinstance(r, memlens.Result) and r.schema == "memlens/1" and r.kind == name
    else:
        with pytest.raises(NotImplementedError, match=f"memlens {name} is not available in this build"):
            METHODS[name](snap, other)


def test_report_writes_html_or_is_not_in_this_build(fixtures_dir, tmp_path):
    snap = memlens.load(fixtures_dir / "cache_leak.pickle.zst")
    out = tmp_path / "r.html"
    if "report" in memlens.available():
        r = snap.report(out)
        assert out.exists() and r.report == str(out)
    else:
        with pytest.raises(NotImplementedError):
            snap.report(out)


def test_snapshot_properties(fixtures_dir):
    path = fixtures_dir / "gpt2_train.pickle.zst"
    snap = memlens.load(str(path))
    assert snap.path == str(path)
    assert snap.devices == [0]
    assert snap.event_count == 14138
    assert memlens.load(snap) is snap
    assert "gpt2_train" in repr(snap)


def test_an_in_memory_snapshot_loads_like_a_file():
    gpu = fake_torch.FakeGPU()
    gpu.alloc(3 * 1024 * 1024, file="/home/me/x.py", line=4)
    snap = memlens.load(gpu.snapshot())
    assert snap.path == "<memory>"
    assert snap.event_count == 1
    if "summary" in memlens.available():
        assert snap.summary().allocated_bytes == 3 * 1024 * 1024


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda d: d / "missing.pickle", "missing.pickle"),
        (lambda d: d, ""),
        (lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt", "notes.txt"),
        (lambda d: (d / "t.pickle").write_bytes(b"\x80\x04\x95") and d / "t.pickle", "t.pickle"),
    ],
    ids=["missing", "directory", "text", "truncated"],
)
def test_bad_input_raises_one_line_memlens_error(make, fragment, tmp_path):
    path = make(tmp_path)
    with pytest.raises(memlens.MemlensError) as e:
        memlens.load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and fragment in msg


def test_bad_option_is_a_memlens_error(fixtures_dir):
    snap = memlens.load(fixtures_dir / "cache_leak.pickle.zst")
    with pytest.raises((memlens.MemlensError, NotImplementedError)):
        snap.simulate(device_memory="eighty gigs")


# -- Result ------------------------------------------------------------------------


DOC = {
    "schema": "memlens/1",
    "peak_allocated_bytes": 10,
    "categories": {"activations": 7, "parameters": 3},
    "live_at_peak": [{"site": "a.py:1", "bytes": 7, "count": 2}, {"site": "b.py:2", "bytes": 3, "count": 1}],
}


def test_result_attribute_access_and_to_dict():
    r = memlens.Result(json.loads(json.dumps(DOC)), "peak")
    assert r.peak_allocated_bytes == 10 and r["peak_allocated_bytes"] == 10
    assert r.categories.activations == 7
    assert r.live_at_peak[0].site == "a.py:1"
    assert r.kind == "peak" and "live_at_peak" in r and len(r) == 4
    assert r == DOC and r.to_dict() == DOC and r.get("nope", 5) == 5
    d = r.to_dict()
    d["live_at_peak"].clear()
    assert len(r.live_at_peak) == 2  # to_dict is a copy
    with pytest.raises(AttributeError, match="no field 'nope'"):
        r.nope
    with pytest.raises(AttributeError):
        r.peak_allocated_bytes = 3
    assert "live_at_peak" in dir(r)
    assert repr(r).startswith("Peak(peak_allocated_bytes=10")
    assert json.loads(r.to_json()) == DOC


def test_result_to_pandas_without_pandas_says_how(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        memlens.Result(DOC, "peak").to_pandas()


def test_result_to_pandas_picks_the_table(monkeypatch):
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda rows: ("frame", rows)
    monkeypatch.setitem(sys.modules, "pandas", fake)
    assert memlens.Result(DOC, "peak").to_pandas() == ("frame", DOC["live_at_peak"])
    assert memlens.Result(DOC, "other").to_pandas() == ("frame", DOC["live_at_peak"])
    assert memlens.Result({"a": 1, "b": [1]}, "summary").to_pandas() == ("frame", [{"a": 1}])
    two = {"grown": [{"x": 1}], "shrunk": [{"x": 2}]}
    assert memlens.Result(two, "diff").to_pandas() == ("frame", [{"x": 1}])
    assert memlens.Result(two, "diff").to_pandas("shrunk") == ("frame", [{"x": 2}])
    with pytest.raises(ValueError, match="several tables"):
        memlens.Result(two, "x").to_pandas()


def test_native_helpers():
    assert _native.parse_size("2GiB") == 2 * 1024**3
    assert _native.parse_size("80GB") == 80 * 10**9
    assert _native.format_bytes(1536 * 1024 * 1024) == "1.50 GiB"
    with pytest.raises(memlens.MemlensError, match="invalid size"):
        _native.parse_size("lots")
    assert memlens.__version__ == _native.__version__


def test_summary_and_check_frames_need_no_key(monkeypatch):
    """Issue 31 item 9: summary() has several lists (devices, pools) and
    check() an empty ``failures`` when it passes: both give the row of their
    figures, with no key= needed (a key still picks a list)."""
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda rows: ("frame", rows)
    monkeypatch.setitem(sys.modules, "pandas", fake)
    path = fixture_files("cache_leak.pickle.zst")[0]
    snap = memlens.load(path)
    summary = snap.summary()
    _, rows = summary.to_pandas()
    assert len(rows) == 1
    assert rows[0]["reserved_bytes"] == summary.reserved_bytes
    assert "devices" not in rows[0] and "schema" not in rows[0]
    assert summary.to_pandas("pools") == ("frame", summary.to_dict()["pools"])
    check = snap.check(max_peak="100GiB")
    _, rows = check.to_pandas()
    assert rows == [{k: v for k, v in check.to_dict().items()
                     if k not in ("failures", "schema")}]
    assert rows[0]["ok"] is True
