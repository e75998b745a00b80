#!/usr/bin/env bash
# CI part for `memlens export` (called by tests/run_all.sh): exports two real
# fixtures to Parquet and queries the tables with DuckDB (from PyPI, in a
# private virtualenv), checking row counts and byte sums against the
# snapshots themselves (read with pickle) and the fixtures' stats.json.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
FIX=${MEMLENS_FIXTURES:-$ROOT/../shared/fixtures}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q -p memlens-cli
VENV=${MEMLENS_EXPORT_VENV:-$TARGET/export-venv}
if ! "$VENV/bin/python" -c "import duckdb, zstandard" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check duckdb zstandard
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$TARGET/debug/memlens" export "$FIX/cache_leak.pickle.zst" "$FIX/gpt2_train.pickle.zst" -o "$OUT/tables" --json > "$OUT/export.json"
"$VENV/bin/python" "$HERE/check.py" "$OUT/tables" "$OUT/export.json" "$FIX" cache_leak gpt2_train
