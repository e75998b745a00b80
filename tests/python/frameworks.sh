#!/usr/bin/env bash
# The training callbacks (memlens.integrations) against the REAL frameworks:
# torch, transformers and lightning from PyPI, in a virtualenv of their own,
# running tests/python/test_integrations_frameworks.py on the CPU.
#
#   tests/python/frameworks.sh path/to/memlens-*.whl   (tests/python/ci.sh calls it)
#
# Cost, measured (PyPI from a CI-like machine, 2026-11): PyPI has no CPU-only
# torch for Linux, so torch pulls its CUDA libraries: 69 wheels, 3.05 GB to
# download (torch 539 MB, cuDNN 519 MB, cuBLAS 405 MB, triton 286 MB...),
# about 3.5 minutes, ~6.5 GB installed. The virtualenv is therefore kept
# outside the clone, under ~/.cache/memlens (MEMLENS_FRAMEWORKS_VENV to move
# it), keyed by the pins below, and reused by later runs on the same machine;
# the memlens wheel is reinstalled into it every run.
set -euo pipefail

WHEEL=${1:?usage: tests/python/frameworks.sh path/to/memlens-*.whl}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}
# Pinned: the versions these tests were written against.
# accelerate: transformers' Trainer needs it with torch.
REQS=(torch==2.15.0 transformers==5.24.0 accelerate==1.15.0 lightning==2.6.6 "pytest>=7")
KEY=$( { "$PY" --version; printf '%s\n' "${REQS[@]}"; } | sha256sum | cut -c1-12)
VENV=${MEMLENS_FRAMEWORKS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/memlens/frameworks-$KEY}

if ! "$VENV/bin/python" -c "import torch, transformers, accelerate, lightning, pytest" 2>/dev/null; then
    echo "== installing ${REQS[*]} into $VENV (about 3 GB the first time)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    start=$(date +%s)
    "$VENV/bin/pip" install -q --disable-pip-version-check "${REQS[@]}"
    echo "== installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"

echo "== pytest, real frameworks ($("$VENV/bin/python" -c 'import torch, transformers, lightning; print("torch", torch.__version__, "transformers", transformers.__version__, "lightning", lightning.__version__)'))"
cd "$ROOT/target/python"
# Skipping is not allowed here: a missing framework must fail the run.
export MEMLENS_REQUIRE_FRAMEWORKS=1
# test_why.py: memlens.why against the real torch (CPU tensors); the suite of
# run.sh has no torch and skips it. test_fake_ddp_torch.py: the stand-ins for
# DDP's communication in a trace of one rank, on the real torch's DDP (CPU).
# test_trace_torch.py: the tracer's view of torch's optimizer defaults.
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q "$ROOT/tests/python/test_integrations_frameworks.py" \
    "$ROOT/tests/python/test_why.py" "$ROOT/tests/python/test_fake_ddp_torch.py" \
    "$ROOT/tests/python/test_trace_torch.py"
