#!/usr/bin/env bash
# CI part for `memlens mcp` (called by tests/run_all.sh): drives the server
# with the official MCP Python client (`mcp` from PyPI, in a private
# virtualenv) over stdio: every tool against the CLI's JSON on real
# fixtures, paging, bounded answers, bad questions, one read per snapshot.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q -p memlens-cli
VENV=${MEMLENS_MCP_VENV:-$TARGET/mcp-venv}
if ! "$VENV/bin/python" -c "import mcp, pytest" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "mcp>=2,<3" pytest
fi
MEMLENS_BIN="$TARGET/debug/memlens" "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$HERE" "$@"
