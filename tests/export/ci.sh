#!/usr/bin/env bash
# CI part for `memlens export` (called by tests/run_all.sh): exports three real
# fixtures to Parquet and queries the tables with DuckDB (from PyPI, in a
# private virtualenv), checking row counts and byte sums against the
# snapshots themselves (read with pickle) and the fixtures' stats.json, and
# the allocated peak rebuilt from the events table against `memlens peak`;
# then the fleet queries of examples/fleet on DuckDB and PySpark (fleet.py).
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

# The fleet queries (examples/fleet) on DuckDB and, where it installs, on
# PySpark in local mode (it needs Java): answers against the GPU's truth and
# memlens's figures, and Spark's rows against DuckDB's.
CORPUS="$ROOT/tests/corpus"
FLEET=(ranks/ddp_ema.rank0 ranks/ddp_ema.rank1 leak_losses clean)
FLEET_FILES=()
for n in "${FLEET[@]}"; do
    FLEET_FILES+=("$CORPUS/$n.pickle.zst")
    "$TARGET/debug/memlens" peak "$CORPUS/$n.pickle.zst" --json > "$OUT/$(basename "$n").peak.json"
done
"$TARGET/debug/memlens" export "${FLEET_FILES[@]}" -o "$OUT/fleet" > /dev/null
SPARK_JSON=()
SPARK_VENV=${MEMLENS_SPARK_VENV:-$TARGET/spark-venv}
if command -v java > /dev/null; then
    if ! "$SPARK_VENV/bin/python" -c "import pyspark" 2>/dev/null; then
        python3 -m venv "$SPARK_VENV" && "$SPARK_VENV/bin/pip" install -q --disable-pip-version-check pyspark \
            || echo "SKIP Spark: pyspark did not install"
    fi
    if "$SPARK_VENV/bin/python" -c "import pyspark" 2>/dev/null; then
        "$SPARK_VENV/bin/python" "$ROOT/examples/fleet/queries.py" "$OUT/fleet" --engine spark --json \
            > "$OUT/spark.json" 2> "$OUT/spark.log" || { cat "$OUT/spark.log"; exit 1; }
        SPARK_JSON=("$OUT/spark.json")
    fi
else
    echo "SKIP Spark: no Java runtime"
fi
"$VENV/bin/python" "$HERE/fleet.py" "$OUT/fleet" "$CORPUS" "$OUT" "${SPARK_JSON[@]}"

# A recording without free_requested (what memlens.record writes by default):
# the same queries rebuild its peak from free_completed.
NOFR="$CORPUS/no_free_requested.pickle.zst"
"$TARGET/debug/memlens" peak "$NOFR" --json > "$OUT/no_free_requested.peak.json"
"$TARGET/debug/memlens" export "$NOFR" -o "$OUT/no_free_requested" > /dev/null
"$VENV/bin/python" "$HERE/unrequested.py" "$OUT/no_free_requested" "$OUT/no_free_requested.peak.json"
