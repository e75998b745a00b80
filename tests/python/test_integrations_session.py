"""The framework-independent part of the training callbacks
(memlens.integrations._session), driving the real memlens.Recorder over the
fake torch: periodic snapshots, the leak alarm and OOM snapshot handed to the
logs once each, the final snapshot. And the import rules: memlens never
imports a framework, and a missing framework gives a clear ImportError."""

from __future__ import annotations

import importlib
import subprocess
import sys

import fake_torch
import pytest

import memlens
from memlens.integrations._session import Session

MIB = 1024 * 1024


def test_session_records_steps_alarm_oom_and_final_snapshot(gpu, tmp_path):
    s = Session(None, None, {"every": 4})
    s.begin(str(tmp_path / "out"))
    assert s.active and s.owned
    kept = []
    with pytest.warns(memlens.LeakWarning):
        for step in range(1, 13):
            tmp = gpu.alloc(64 * MIB, file="/home/me/train.py", line=10, name="forward")
            kept.append(gpu.alloc(4 * MIB, file="/home/me/train.py", line=42, name="validate"))
            gpu.free(tmp)
            s.step()
            news = s.news()
            if step < 8:
                # 3 warmup steps (the baseline is taken at step 3), then 5 rises: step 8
                assert news == {}, step
            elif step == 8:
                assert news["memlens/leak_alarm"].startswith("+4.00 MiB/step over 5 steps")
                assert news["memlens/leak_alarm_step"] == 8
                assert news["memlens/leak_site"] == "/home/me/train.py:42"
            else:
                assert news == {}, "the alarm is logged once"
    snaps = tmp_path / "out" / "memlens"
    assert sorted(p.name for p in snaps.iterdir() if p.name.endswith(".pickle")) == [
        "snapshot.step12.pickle", "snapshot.step4.pickle", "snapshot.step8.pickle",
    ]
    assert s.figures() == {"memlens/leak_alarm": 1.0, "memlens/ooms": 0.0, "memlens/snapshots": 3.0}
    with pytest.raises(fake_torch.FakeOutOfMemoryError):
        gpu.oom(2048 * MIB)
    news = s.news()
    assert news == {"memlens/oom_snapshot": str(snaps / "snapshot.oom.pickle"), "memlens/ooms": 1}
    assert s.news() == {}
    final = s.end()
    assert final == str(snaps / "snapshot.pickle")
    assert not s.active and s.end() is None


def test_session_adopts_a_recording_the_user_started_and_leaves_it_running(gpu, tmp_path):
    with memlens.record(tmp_path / "mine") as rec:
        s = Session(None, None, {})
        s.begin(str(tmp_path / "out"))
        assert s.recorder is rec and not s.owned
        s.step()
        assert rec.steps == 1
        assert s.end() is None and rec.active
    assert not (tmp_path / "out").exists()


def test_session_without_cuda_records_nothing(gpu, tmp_path):
    gpu.available = False
    s = Session(None, None, {"every": 1})
    with pytest.warns(memlens.MemlensWarning, match="CUDA is not available"):
        s.begin(str(tmp_path))
    s.step()
    assert not s.active and s.news() == {} and s.figures() == {} and s.end() is None
    assert not (tmp_path / "memlens").exists()


def test_importing_memlens_never_imports_a_framework():
    code = (
        "import sys, memlens, memlens.integrations, memlens.integrations._session\n"
        "bad = [m for m in ('transformers', 'lightning', 'pytorch_lightning', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "module, package",
    [("memlens.integrations.huggingface", "transformers"), ("memlens.integrations.lightning", "lightning")],
)
def test_a_missing_framework_gives_a_clear_import_error(monkeypatch, module, package):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` fails
    if package == "lightning":
        monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=f"needs the `{package}` package \\(pip install {package}\\)"):
        importlib.import_module(module)
