#!/usr/bin/env bash
# CI part for `memlens export` (called by tests/run_all.sh): exports three real
# fixtures to Parquet and queries the tables with DuckDB (from PyPI, in a
# private virtualenv), checking row counts and byte sums against the
# snapshots themselves (read with pickle) and the fixtures' stats.json, and
# the allocated peak rebuilt from the events table against `memlens peak`.
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
NAMES=(cache_leak gpt2_train varlen)
FILES=()
for n in "${NAMES[@]}"; do
    FILES+=("$FIX/$n.pickle.zst")
    "$TARGET/debug/memlens" peak "$FIX/$n.pickle.zst" --json > "$OUT/$n.peak.json"
done
"$TARGET/debug/memlens" export "${FILES[@]}" -o "$OUT/tables" --json > "$OUT/export.json"
"$VENV/bin/python" "$HERE/check.py" "$OUT/tables" "$OUT/export.json" "$FIX" "${NAMES[@]}"
