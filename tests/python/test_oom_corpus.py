"""Issue 16 from Python: the OOM hook of ``memlens.record`` prints what
``memlens oom`` prints (``_native.explain_oom_file`` is the same library call),
and with two OOMs in one trace, the hook, ``memlens oom`` and doctor speak of the
same one (the last) and give it the same cause. The snapshots are the real OOMs
of tests/corpus/oom (tests/gpu/oom_harness.py on an H100)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import memlens
from memlens import _native
from memlens._oom import explain_oom

OOM = Path(__file__).resolve().parent.parent / "corpus" / "oom"


def cli(exe: str, *args: str) -> str:
    return subprocess.run([exe, *args], capture_output=True, text=True, check=True).stdout


def test_the_extension_explains_oom_files():
    assert hasattr(_native, "explain_oom_file")


def test_the_hook_prints_what_memlens_oom_prints(memlens_exe):
    path = str(OOM / "frag_cap.pickle.zst")
    text = explain_oom(path)
    assert text.strip() == cli(memlens_exe, "oom", path).strip()
    # Fragmentation under a cap, with the fixes.
    assert "cause fragmentation" in text
    assert "fixes" in text


def test_two_ooms_one_choice(memlens_exe):
    path = str(OOM / "two_ooms.pickle.zst")
    oom = json.loads(cli(memlens_exe, "oom", path, "--json"))
    truth = json.loads((OOM / "truth.json").read_text())["workloads"]["two_ooms"]["recorded"]
    assert truth["num_ooms"] == 2 and oom["ooms_in_trace"] == 2
    # The last OOM: the 1 GiB request in evaluation, not the 256 MiB one in training.
    assert oom["tried_to_allocate_bytes"] == 1 << 30
    text = explain_oom(path)
    assert f"at event {oom['event_index']} " in text and f"cause {oom['cause']}" in text
    doctor = memlens.load(path).doctor().to_dict()
    assert doctor["diagnosis"]["oom"]["event_index"] == oom["event_index"]
    assert doctor["diagnosis"]["oom"]["cause"] == oom["cause"]
    finding = next(f for f in doctor["findings"] if f["kind"] == "oom")
    assert finding["bytes"] == 1 << 30


def test_the_runs_optimizer_reaches_the_model_as_on_the_command_line(memlens_exe):
    """``snap.oom(optimizer=...)`` is ``memlens oom --optimizer``: resnet_amp at 28
    failed in its first step, before its SGD with momentum made any state."""
    import pytest

    path = OOM / "first_step" / "resnet_amp.b28.pickle.zst"
    snap = memlens.load(path)
    for name, key in [(None, "adamw"), ("sgd-momentum", "sgd_momentum"), ("sgd", "sgd")]:
        model = snap.oom(optimizer=name).to_dict()["step_model"]
        args = ["oom", str(path), "--json"] + (["--optimizer", name] if name else [])
        assert model == json.loads(cli(memlens_exe, *args))["step_model"]
        assert model["first_step_optimizer"] == key
        assert model["optimizer_given"] is (name is not None)
    with pytest.raises(memlens.MemlensError, match="unknown optimizer"):
        snap.oom(optimizer="lion")
