#!/usr/bin/env bash
# The browser part of tests/run_all.sh (issues 7 and 18's acceptance): `memlens report`
# on real snapshots (gpt2_eval_leak, varlen, oom, and the 1 GB benchmark
# snapshot made from long.pickle.zst), each opened in headless Chromium by
# tests/browser/run.sh, which fails on any console error or network request,
# checks every section drew (timeline points, flame graph with the expected
# site, segment rows) and saves a screenshot. Screenshots and reports go to
# $MEMLENS_BROWSER_OUT if set. MEMLENS_SKIP_BIG=1 skips the 1 GB report.
# The report served by `memlens report --serve` is clicked by served.sh: the
# state the page shows at each clicked event equals `memlens state`'s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ -n "${MEMLENS_BROWSER_OUT:-}" ]; then
  out=$MEMLENS_BROWSER_OUT; mkdir -p "$out"
else
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fi
fx=${MEMLENS_FIXTURES:-$root/../shared/fixtures}
(cd "$root" && cargo build -q --release -p memlens-cli)
ml="$root/target/release/memlens"

# name : expected site in the flame graph (lines of fixtures/gen/workloads.py)
# : what the page must show (MEMLENS_EXPECT of check.mjs). Every case also
# clicks the timeline at the peak (and the OOM), checks the legend, 800 px and
# the dark theme, and saves NAME.png and NAME-dark.png.
for case in gpt2_eval_leak:workloads.py:55:moments varlen:workloads.py:99:moments oom:workloads.py:112:oom,moments; do
  name=${case%%:*}; rest=${case#*:}; site=${rest%:*}; expect=${rest##*:}
  "$ml" report "$fx/$name.pickle.zst" -o "$out/$name.html" >/dev/null
  MEMLENS_EXPECT=$expect "$here/run.sh" "$out/$name.html" "$site" "$out/$name.png"
done

# Three periodic snapshots of one leaking run (tests/corpus): the leak found
# across them (as `memlens leaks` finds it on the same files) and one row per
# snapshot in the overview.
corpus="$root/tests/corpus"
"$ml" report "$corpus"/leak_losses.step{2,4,6}.pickle.zst -o "$out/leak_losses-3.html" >/dev/null
MEMLENS_EXPECT=leak,overview,moments "$here/run.sh" "$out/leak_losses-3.html" "model.py:121" "$out/leak_losses-3.png"

# The fragmentation OOM (tests/corpus/oom/frag_cap: 2.41 GiB cached in 380
# pieces of at most 7 MiB, a 2 GiB request): every fix with the terminal's
# verdict, none contradicting itself, the map at the OOM.
"$ml" report "$corpus"/oom/frag_cap.pickle.zst -o "$out/frag_cap.html" >/dev/null
MEMLENS_EXPECT=oom,moments MEMLENS_SEGMENTS=190 "$here/run.sh" "$out/frag_cap.html" "train_oom.py:108" "$out/frag_cap.png"

# An OOM dumped in PyTorch 2.0's form (tests/corpus/legacy_oom: 190 segments,
# a trace of the one `oom` entry): the dump's segment map and flame graph, the
# OOM and its fixes, no empty chart over time.
"$ml" report "$corpus"/legacy_oom.pickle.zst -o "$out/legacy_oom.html" >/dev/null
MEMLENS_EXPECT=oom,dump MEMLENS_SEGMENTS=190 "$here/run.sh" "$out/legacy_oom.html" "train_oom.py:108" "$out/legacy_oom.png"

# Weights loaded before recording began (tests/corpus/forward_only_preloaded):
# 325.6 MiB under <allocated before recording started>, a band with its
# bytes (no legend entry at 0 B) and a frame of the flame graph by that name.
"$ml" report "$corpus"/forward_only_preloaded.pickle.zst -o "$out/preloaded.html" >/dev/null
MEMLENS_EXPECT=moments "$here/run.sh" "$out/preloaded.html" "<allocated before recording started>" "$out/preloaded.png"

# A healthy run (tests/corpus/clean: no leak, no OOM): the page says so in one sentence.
"$ml" report "$corpus"/clean.pickle.zst -o "$out/clean.html" >/dev/null
MEMLENS_EXPECT=healthy,moments "$here/run.sh" "$out/clean.html" "model.py:77" "$out/clean.png"

# A notebook recorded with PyTorch's default stacks ("all", C and CPython frames
# interleaved; tests/corpus/notebook): the flame graph draws the cell's lines
# and no native frame (check.mjs fails on any).
"$ml" report "$corpus"/notebook.pickle.zst -o "$out/notebook.html" >/dev/null
MEMLENS_EXPECT=moments "$here/run.sh" "$out/notebook.html" "ipykernel" "$out/notebook.png"

# The two ranks of one DDP job (tests/corpus/ranks, rank 0 keeps an EMA copy at
# train_ddp.py:61): both ranks' exact peaks and charts, in either file order,
# in light and dark: no "every snapshot" table, a title naming the job.
"$ml" report "$corpus"/ranks/ddp_ema.rank{1,0}.pickle.zst -o "$out/ddp_ema.html" >/dev/null
MEMLENS_EXPECT=ranks "$here/run.sh" "$out/ddp_ema.html" "train_ddp.py:61" "$out/ddp_ema.png"
"$ml" report "$corpus"/ranks/ddp_ema.rank{0,1}.pickle.zst -o "$out/ddp_ema01.html" >/dev/null
MEMLENS_EXPECT=ranks "$here/run.sh" "$out/ddp_ema01.html" "train_ddp.py:61" "$out/ddp_ema01.png"

if [ "${MEMLENS_SKIP_BIG:-}" != 1 ]; then
  big="$root/bench/data/large-1gb.pickle"
  mkdir -p "$(dirname "$big")"
  [ -f "$big" ] || python3 "$root/bench/make_large.py" "$fx/long.pickle.zst" "$big" 1160
  start=$(date +%s.%N)
  "$ml" report "$big" -o "$out/large-1gb.html" >/dev/null
  echo "report of $(basename "$big") ($(( $(stat -c %s "$big") / 1000000 )) MB): $(echo "$(date +%s.%N) - $start" | bc) s, $(stat -c %s "$out/large-1gb.html") bytes"
  size=$(stat -c %s "$out/large-1gb.html")
  if [ "$size" -ge 10000000 ]; then echo "FAIL: the 1 GB snapshot's report is $size bytes (limit 10 MB)" >&2; exit 1; fi
  MEMLENS_EXPECT=moments MEMLENS_MAX_LOAD_MS=3000 "$here/run.sh" "$out/large-1gb.html" "workloads.py:148" "$out/large-1gb.png"
  # Served, the 1 GB trace is exact at any clicked event: what the page shows
  # there equals `memlens state --event N` (issue 33).
  "$here/served.sh" "$ml" "$big" "$out"
fi
# The same on a small real trace, whatever MEMLENS_SKIP_BIG says.
"$here/served.sh" "$ml" "$fx/gpt2_train.pickle.zst" "$out"

# The report shown in a notebook (`snap.show_report()`'s iframe and script)
# follows the notebook's theme against the system's: JupyterLab dark on a
# light system, JupyterLab light on a dark one, VS Code's dark; a page that
# marks no theme keeps the system's.
for host_case in jupyterlab-dark:light:dark jupyterlab-light:dark:light vscode-dark:light:dark plain:dark:dark plain:light:light; do
  host=${host_case%%:*}; rest=${host_case#*:}; system=${rest%%:*}; want=${rest#*:}
  python3 "$here/notebook_frame.py" "$out/clean.html" "$out/nb-$host-$system.html" "$host"
  (cd "$here" && node jupyter_theme.mjs "$out/nb-$host-$system.html" "$system" "$want")
done
