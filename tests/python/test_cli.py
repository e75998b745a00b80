"""The `memlens` entry point installed by pip runs the memlens binary the wheel carries."""

from __future__ import annotations

import subprocess
import sys

import memlens


def run(*args, exe=None):
    return subprocess.run([*(exe if isinstance(exe, list) else [exe]), *args], capture_output=True, text=True)


def test_version_and_help_exit_0(memlens_exe):
    v = run("--version", exe=memlens_exe)
    assert v.returncode == 0 and v.stdout.strip() == f"memlens {memlens.__version__}"
    h = run("--help", exe=memlens_exe)
    assert h.returncode == 0 and "Usage: memlens" in h.stdout and "summary" in h.stdout


def test_python_dash_m_is_the_same_cli():
    v = run("--version", exe=[sys.executable, "-m", "memlens"])
    assert v.returncode == 0 and v.stdout.strip() == f"memlens {memlens.__version__}"


def test_unknown_command_is_a_usage_error_exit_2(memlens_exe):
    p = run("frobnicate", exe=memlens_exe)
    assert p.returncode == 2 and "frobnicate" in p.stderr
    assert "Traceback" not in p.stderr


def test_bad_snapshot_exits_2_with_one_line(memlens_exe, tmp_path):
    missing = tmp_path / "nope.pickle"
    p = run("summary", str(missing), exe=memlens_exe)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memlens: error: ") and str(missing) in lines[0]
    assert p.stdout == ""


def test_summary_runs_on_a_fixture(memlens_exe, fixtures_dir):
    p = run("summary", str(fixtures_dir / "resnet.pickle.zst"), exe=memlens_exe)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()


def test_closed_pipe_is_quiet(memlens_exe):
    # `memlens --help | head -c1`: no Python traceback, no panic message.
    proc = subprocess.Popen([memlens_exe, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait()
    assert "Traceback" not in err and "panicked" not in err


# A package built by a plain `pip install .` has no binary beside it (maturin
# builds the extension module only): the command line compiled into the
# extension runs instead, with the binary's exit codes, output and pipes.
NO_BINARY = "import sys, memlens._cli as c; c.binary = lambda: None; sys.exit(c.main())"


def test_without_a_binary_the_command_line_runs_in_the_extension(fixtures_dir):
    fixture = str(fixtures_dir / "resnet.pickle.zst")
    inproc = run("summary", fixture, exe=[sys.executable, "-c", NO_BINARY])
    assert inproc.returncode == 0, inproc.stderr
    assert inproc.stdout == run("summary", fixture, exe=[sys.executable, "-m", "memlens"]).stdout
    v = run("--version", exe=[sys.executable, "-c", NO_BINARY])
    assert v.returncode == 0 and v.stdout.strip() == f"memlens {memlens.__version__}"
    bad = run("summary", "/nonexistent/nope.pickle", exe=[sys.executable, "-c", NO_BINARY])
    assert bad.returncode == 2 and bad.stderr.startswith("memlens: error: ") and "Traceback" not in bad.stderr


def test_without_a_binary_a_closed_pipe_is_quiet():
    proc = subprocess.Popen([sys.executable, "-c", NO_BINARY, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait()
    assert "Traceback" not in err and "panicked" not in err
