#!/usr/bin/env bash
# The browser part of tests/run_all.sh: HTML reports of real fixtures opened in
# headless Chromium (tests/browser/run.sh checks every section drew, no console
# error, no network request). Screenshots go to $MEMLENS_BROWSER_OUT if set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ -n "${MEMLENS_BROWSER_OUT:-}" ]; then
  out=$MEMLENS_BROWSER_OUT; mkdir -p "$out"
else
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fi
if ! command -v zstd >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zstd >/dev/null
fi

# 1. The page on sample data made from real snapshots (a stand-in for the
#    analyses): leaks across steps, the tune table, an OOM.
for name in gpt2_eval_leak varlen oom; do
  "$here/sample.sh" "$name" "$out"
done

# 2. The pages `memlens report` writes from the real analyses: a leak across
#    three snapshots, an OOM, dynamic shapes.
fx=${MEMLENS_FIXTURES:-$root/../shared/fixtures}
(cd "$root" && cargo build -q -p memlens-cli)
memlens="$root/target/debug/memlens"
"$memlens" report "$fx/gpt2_eval_leak.step1.pickle.zst" "$fx/gpt2_eval_leak.step5.pickle.zst" \
  "$fx/gpt2_eval_leak.step11.pickle.zst" -o "$out/real_leak.html"
"$here/run.sh" "$out/real_leak.html" "workloads.py:55" "$out/real_leak.png"
"$memlens" report "$fx/oom.pickle.zst" -o "$out/real_oom.html"
"$here/run.sh" "$out/real_oom.html" "workloads.py:112" "$out/real_oom.png"
"$memlens" report "$fx/varlen.pickle.zst" -o "$out/real_varlen.html"
"$here/run.sh" "$out/real_varlen.html" "workloads.py:99" "$out/real_varlen.png"
