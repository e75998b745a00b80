#!/usr/bin/env bash
# CI part for the Python package (called by tests/run_all.sh): build the wheel,
# install it in a fresh virtualenv, run tests/python.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh"
