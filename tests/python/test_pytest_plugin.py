"""The `cuda_memory` marker, run in inner pytest sessions (pytester) with the
plugin loaded from the installed wheel's `pytest11` entry point."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from memlens._guard import limits, snapshot_file

HERE = Path(__file__).resolve().parent

FAKE_CONFTEST = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import fake_torch
GPU = fake_torch.FakeGPU()
fake_torch.install(GPU)
import pytest

@pytest.fixture
def gpu():
    return GPU
"""

TESTS = """
import pytest
MIB = 1024 * 1024

@pytest.mark.cuda_memory(max_peak="64MiB", no_leaks=True)
def test_within_limits(gpu):
    a = gpu.alloc(32 * MIB, file="/home/me/test_x.py", line=8)
    gpu.free(a)

@pytest.mark.cuda_memory(max_peak="64MiB")
def test_peak_too_high(gpu):
    a = gpu.alloc(100 * MIB, file="/home/me/test_x.py", line=12)
    gpu.free(a)

@pytest.mark.cuda_memory(max_reserved="16MiB")
def test_reserved_too_high(gpu):
    gpu.free(gpu.alloc(MIB))

KEEP = []

@pytest.mark.cuda_memory(no_leaks=True)
def test_leaks(gpu):
    KEEP.append(gpu.alloc(6 * MIB, file="/home/me/test_x.py", line=24, name="test_leaks"))

@pytest.mark.cuda_memory(no_leaks=True, leak_tolerance="8MiB")
def test_leak_within_tolerance(gpu):
    KEEP.append(gpu.alloc(6 * MIB, file="/home/me/test_x.py", line=28))

@pytest.mark.cuda_memory(max_peak="1GiB")
def test_failing_by_itself(gpu):
    assert 1 == 2

@pytest.mark.cuda_memory(max_peak="a lot")
def test_bad_marker(gpu):
    pass

def test_unmarked(gpu):
    gpu.alloc(500 * MIB)
"""


def outcomes(result):
    d = result.parseoutcomes()
    return {k: d.get(k, 0) for k in ("passed", "failed", "skipped", "errors")}


def test_marker_passes_fails_and_explains(pytester, tmp_path):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_x=TESTS)
    snaps = tmp_path / "snaps"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--memlens-dir={snaps}", "-rA")
    out = result.stdout.str()
    assert outcomes(result) == {"passed": 3, "failed": 4, "skipped": 0, "errors": 1}, out
    result.stdout.fnmatch_lines(["PASSED test_x.py::test_within_limits",
                                 "PASSED test_x.py::test_leak_within_tolerance",
                                 "PASSED test_x.py::test_unmarked"])
    assert "memlens cuda_memory: peak allocated 100.00 MiB is over max_peak 64.00 MiB" in out
    # (the fake GPU is shared by the tests of the session and never releases memory)
    result.stdout.fnmatch_lines(["memlens cuda_memory: peak reserved * MiB is over max_reserved 16.00 MiB"])
    assert "During handling" not in out
    assert "memlens cuda_memory: 6.00 MiB more is allocated after the test than before it" in out
    assert "+6.00 MiB  1 blocks  /home/me/test_x.py:24 in test_leaks" in out
    assert "memlens: bad @pytest.mark.cuda_memory(...): max_peak: invalid size" in out
    assert "assert 1 == 2" in out  # the test's own failure, not memlens's
    saved = snaps / "test_x.py_test_peak_too_high.pickle"
    assert saved.exists() and f"snapshot: {saved}" in out


def test_marker_skips_without_cuda(pytester):
    pytester.makeconftest(FAKE_CONFTEST + "\nGPU.available = False\n")
    pytester.makepyfile(test_x=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    assert outcomes(result) == {"passed": 1, "failed": 0, "skipped": 6, "errors": 1}
    result.stdout.fnmatch_lines(["*memlens cuda_memory: CUDA is not available*"])


def test_marker_skips_without_torch(pytester):
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    pytester.makepyfile(
        test_y=textwrap.dedent(
            """
            import pytest
            @pytest.mark.cuda_memory(max_peak="1GiB")
            def test_a():
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    assert outcomes(result) == {"passed": 0, "failed": 0, "skipped": 1, "errors": 0}
    result.stdout.fnmatch_lines(["*memlens cuda_memory: torch is not installed*"])


def test_marker_is_registered(pytester):
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.cuda_memory(max_peak=None, max_reserved=None, no_leaks=False*"])


def test_limits_parsing():
    assert limits("2GiB").max_peak == 2 * 1024**3
    assert limits(max_reserved=1000, no_leaks=1).max_reserved == 1000
    assert limits(leak_tolerance="1MiB").leak_tolerance == 1024**2
    with pytest.raises(TypeError):
        limits(max_peak=True)
    with pytest.raises(TypeError):
        limits(max_peek="1GiB")
    with pytest.raises(ValueError):
        limits(max_peak=-1)
    assert snapshot_file("/d", "tests/test_a.py::test_b[x-1]") == "/d/tests_test_a.py_test_b_x-1.pickle"
