"""Shared fixtures of the Python tests. They run against the *installed*
wheel (tests/python/run.sh builds and installs it in a fresh virtualenv)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FIXTURES = Path(os.environ.get("MEMLENS_FIXTURES", ROOT.parent / "shared" / "fixtures"))

sys.path.insert(0, str(HERE))  # fake_torch

import fake_torch  # noqa: E402

pytest_plugins = ["pytester"]


def fixture_files(pattern: str = "*.pickle.zst"):
    return sorted(FIXTURES.glob(pattern))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"fixtures not found at {FIXTURES} (set MEMLENS_FIXTURES)")
    return FIXTURES


@pytest.fixture(scope="session")
def memlens_exe() -> str:
    """The `memlens` console script of the virtualenv running the tests."""
    exe = Path(sys.executable).parent / "memlens"
    if exe.exists():
        return str(exe)
    found = shutil.which("memlens")
    assert found, "the memlens entry point is not installed"
    return found


def _reset_capture_state() -> None:
    from memlens import _capture

    if _capture._current is not None and _capture._current.active:
        _capture._current.active = False
    _capture._current = None
    _capture._observer_attached = False
    _capture._warned.clear()


@pytest.fixture
def no_torch(monkeypatch):
    """`import torch` fails, as on a machine without PyTorch."""
    _reset_capture_state()
    fake_torch.uninstall()
    monkeypatch.setitem(sys.modules, "torch", None)
    yield
    _reset_capture_state()


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A fake GPU behind a fake `torch` module, and a private runtime dir."""
    _reset_capture_state()
    state = fake_torch.FakeGPU()
    fake_torch.install(state)
    monkeypatch.setenv("MEMLENS_RUNTIME_DIR", str(tmp_path / "run"))
    yield state
    _reset_capture_state()
    fake_torch.uninstall()
