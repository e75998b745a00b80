#!/usr/bin/env bash
# CI part for the Python package (called by tests/run_all.sh): build the wheel,
# install it in a fresh virtualenv, run tests/python (run.sh); then the
# training callbacks against the real torch, transformers and lightning from
# PyPI (frameworks.sh; about 3 GB the first time on a machine, cached after).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$HERE/run.sh"
bash "$HERE/frameworks.sh" "$(ls "$HERE"/../../target/python/wheels/memlens-*.whl)"
