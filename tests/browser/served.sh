#!/usr/bin/env bash
# The report served by `memlens report --serve` (issue 33: "a 1 GB trace: the
# state at a clicked event equals `memlens state` replayed to that event"):
# serves SNAP on a free port, clicks the timeline at three places in headless
# Chromium, steps with the arrow keys and zooms in to single events
# (tests/browser/served.mjs), and compares what the page showed of each
# clicked or stepped event with `memlens state SNAP --event N --json` (the
# event, the allocated and reserved bytes, the live sites: site, category,
# bytes) and the zoomed stretch's figures with the same.
#   tests/browser/served.sh MEMLENS SNAP OUT_DIR
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 MEMLENS SNAP OUT_DIR" >&2
  exit 2
fi
ml=$1; snap=$2; out=$3
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$snap")
"$ml" report "$snap" --serve 127.0.0.1:0 > "$out/$name.serve.out" 2> "$out/$name.serve.err" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  [ -s "$out/$name.serve.out" ] && break
  kill -0 $pid 2>/dev/null || { cat "$out/$name.serve.err" >&2; exit 1; }
  sleep 0.5
done
url=$(head -1 "$out/$name.serve.out")
# The address is printed when it is bound; the page once the analysis is done.
for _ in $(seq 1 240); do
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url" 2>/dev/null && break
  sleep 0.5
done
start=$(date +%s.%N)
(cd "$here" && node served.mjs "$url" "$out/$name.served.json")
echo "served $(basename "$snap"): clicks, steps and zooms answered in $(echo "$(date +%s.%N) - $start" | bc) s"
kill $pid 2>/dev/null || true
python3 - "$ml" "$snap" "$out/$name.served.json" <<'PY'
import json, subprocess, sys
ml, snap, shown = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
bad = 0
for c in shown["clicks"] + shown["zoomed"]:
    s = json.loads(subprocess.run([ml, "state", snap, "--event", str(c["event"]), "--json"],
                                  check=True, capture_output=True, text=True).stdout)
    got = [s["event_index"], s["allocated_bytes"], s["reserved_bytes"]]
    page = [c["event"], c["allocated"], c["reserved"]]
    what = c.get("what", "zoomed stretch")
    if "live" in c:
        got.append([[l["site"], l["category"], l["bytes"]] for l in s["live"]])
        page.append(c["live"])
    if got != page:
        bad += 1
        print(f"FAIL: {what}: event {c['event']}: the page shows {page[:3]}, memlens state {got[:3]}"
              + (" (live sites differ)" if page[:3] == got[:3] else ""), file=sys.stderr)
    else:
        sites = f", {len(got[3])} live sites" if len(got) > 3 else ""
        print(f"{what}: event {c['event']:,}: {c['allocated']:,} B allocated, {c['reserved']:,} B reserved{sites}: equal to memlens state")
# The allocation hovered in the zoomed view is live there, in its site's bytes.
for h in shown.get("hovered", []):
    s = json.loads(subprocess.run([ml, "state", snap, "--event", str(h["event"]), "--json", "--top", "1000"],
                                  check=True, capture_output=True, text=True).stdout)
    held = sum(l["bytes"] for l in s["live"] if l["site"] == h["site"])
    if held < h["size"]:
        bad += 1
        print(f"FAIL: the hovered allocation ({h['size']:,} B at {h['site']}) is not live at event {h['event']} in memlens state ({held:,} B there)", file=sys.stderr)
    else:
        print(f"hovered at event {h['event']:,}: {h['size']:,} B at 0x{h['address']:x} from {h['site']}: live there in memlens state ({held:,} B at that site)")
sys.exit(1 if bad else 0)
PY
