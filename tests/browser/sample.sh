#!/usr/bin/env bash
# Builds a sample report from a real fixture (without the Rust analyses) and
# runs the browser test on it.
#   tests/browser/sample.sh [NAME] [OUTDIR]     (default: gpt2_eval_leak, a temp dir)
# Writes OUTDIR/NAME.report.json, OUTDIR/NAME.html and OUTDIR/NAME.png.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${1:-gpt2_eval_leak}
out=${2:-$(mktemp -d)}
info=$(python3 "$here/make_sample.py" "$name" "$out")
site=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["expected_site"])' "$info")
(cd "$root" && cargo run -q -p memlens --example render_report -- "$out/$name.report.json" "$out/$name.html")
"$here/run.sh" "$out/$name.html" "$site" "$out/$name.png"
