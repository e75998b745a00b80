#!/usr/bin/env bash
# Records the ground truth `memlens estimate` is checked against: runs
# tests/gpu/estimate_truth.py on a machine with an NVIDIA GPU, torch and
# transformers (no network needed). Copy OUTDIR/truth.json and
# OUTDIR/configs/*.config.json into tests/estimate/ afterwards.
#
#   tests/gpu/estimate_truth.sh OUTDIR [--budget SECONDS]
set -uo pipefail
OUTDIR=${1:?usage: tests/gpu/estimate_truth.sh OUTDIR [--budget SECONDS]}
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"${PYTHON:-python3}" "$HERE/estimate_truth.py" "$OUTDIR" "$@" 2>&1 | tee "$OUTDIR/estimate-truth-log.txt"
exit "${PIPESTATUS[0]}"
