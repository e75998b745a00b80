#!/usr/bin/env bash
# GPU acceptance test of `memlens top`, for a machine with an NVIDIA GPU,
# nvidia-smi, and python3 with a CUDA build of torch. Builds nothing.
#
#   bash tests/gpu/top.sh [path/to/memlens]     (default ./target/release/memlens)
#
# It starts two training-like Python processes: "leak" grows its GPU memory by
# 32 MiB every 0.5 s, "plateau" takes 1 GiB at start and holds it. Both publish
# their allocator figures the way memlens.record does (the file format is
# written here by hand, not through the Python package). Then, in parallel for
# about 22 s:
#   * `memlens top --no-ui --record h.jsonl --alert-growth ... --on-alert ...`
#   * `memlens top --record ui.csv ...` in tmux (the terminal UI), if tmux exists
#   * `memlens top --once --json`, bracketed by two nvidia-smi queries
# and checks: the processes appear with command line and user; NVML figures
# agree with nvidia-smi; PyTorch's figures are joined (gap = used - reserved);
# the growth alert fires once for "leak" and never for "plateau"; records are
# written; the UI shows the rows and the alert; memlens's own footprint (RSS
# and CPU at 1 s refresh) is within target (< 30 MB, < 1% of a core).
# Prints PASS/FAIL per check and a summary; exits 0 only when all pass.
# Artifacts (records, UI capture, JSON) go to $OUT if set, else a temp dir.
set -u

BIN=${1:-./target/release/memlens}
ART=${OUT:-$(mktemp -d /tmp/memlens-top-gpu.XXXXXX)}
mkdir -p "$ART"
RT=$(mktemp -d /tmp/memlens-top-rt.XXXXXX)   # the publication directory
export MEMLENS_RUNTIME_DIR=$RT
WINDOW=10            # --growth-window, seconds
RUN=30               # samples of the monitoring runs (1 s each)
MEASURE=22           # seconds of the footprint measurement
RSS_LIMIT_KB=30720   # 30 MiB
CPU_LIMIT_PCT=1.0
TSESSION=memlens-top-test
TSOCK=memlens-top-test

PASSES=0
FAILS=0
pass() { PASSES=$((PASSES + 1)); echo "PASS  $*"; }
fail() { FAILS=$((FAILS + 1)); echo "FAIL  $*"; }
note() { echo "      $*"; }
check() { # check "description" command...
    local what=$1
    shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    if command -v tmux >/dev/null 2>&1; then
        tmux -L "$TSOCK" kill-session -t "$TSESSION" 2>/dev/null
    fi
    rm -rf "$RT"
}
trap cleanup EXIT

summary() {
    echo
    echo "artifacts: $ART"
    if [ "$FAILS" -eq 0 ]; then
        echo "SUMMARY: PASS ($PASSES checks passed)"
        exit 0
    fi
    echo "SUMMARY: FAIL ($FAILS failed, $PASSES passed)"
    exit 1
}

# ---------------------------------------------------------------- prerequisites
if [ ! -x "$BIN" ]; then
    fail "memlens binary at $BIN (pass its path as \$1)"
    summary
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    fail "nvidia-smi works (an NVIDIA GPU and driver are needed)"
    summary
fi
if ! python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    fail "python3 with a CUDA build of torch"
    summary
fi
echo "memlens: $BIN ($("$BIN" --version 2>&1))"
echo "GPU:     $(nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | head -1)"

# ------------------------------------------------------- the training processes
cat >"$ART/train.py" <<'PY'
import json, os, sys, time
import torch

mode = sys.argv[1]                      # "leak" or "plateau"
dev = torch.cuda.current_device()
rundir = os.environ["MEMLENS_RUNTIME_DIR"]
path = os.path.join(rundir, f"{os.getpid()}-{dev}.json")
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read().rstrip(b"\0").replace(b"\0", b" ").decode()

def publish(step):
    stats = torch.cuda.memory_stats(dev)
    doc = {
        "schema": "memlens/1", "pid": os.getpid(), "device": dev, "rank": None,
        "step": step,
        "allocated_bytes": torch.cuda.memory_allocated(dev),
        "reserved_bytes": torch.cuda.memory_reserved(dev),
        "active_bytes": stats.get("active_bytes.all.current", 0),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(dev),
        "time": time.time(), "leak_alarm": None, "cmdline": cmdline,
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)              # atomic, as memlens.record does

keep = [torch.empty(256 << 20, dtype=torch.uint8, device=dev)]
if mode == "plateau":
    keep.append(torch.empty(1 << 30, dtype=torch.uint8, device=dev))
torch.cuda.synchronize()
open(os.path.join(rundir, f"ready-{mode}"), "w").close()
end = time.time() + 90                 # never outlive a forgotten test
step, last = 0, 0.0
while time.time() < end:
    x = torch.randn(1024, 1024, device=dev)
    (x @ x).sum().item()               # some real work
    if mode == "leak":
        keep.append(torch.empty(32 << 20, dtype=torch.uint8, device=dev))
    step += 1
    if time.time() - last >= 1.0:      # at most once a second
        publish(step)
        last = time.time()
    time.sleep(0.5)
PY

python3 "$ART/train.py" leak >"$ART/leak.log" 2>&1 &
LEAK=$!
PIDS+=("$LEAK")
python3 "$ART/train.py" plateau >"$ART/plateau.log" 2>&1 &
PLATEAU=$!
PIDS+=("$PLATEAU")
echo "leak pid $LEAK, plateau pid $PLATEAU"

for _ in $(seq 1 120); do
    [ -e "$RT/ready-leak" ] && [ -e "$RT/ready-plateau" ] && ls "$RT"/"$LEAK"-*.json >/dev/null 2>&1 && break
    if ! kill -0 "$LEAK" 2>/dev/null || ! kill -0 "$PLATEAU" 2>/dev/null; then break; fi
    sleep 0.5
done
if ! ls "$RT"/"$LEAK"-*.json >/dev/null 2>&1 || ! kill -0 "$PLATEAU" 2>/dev/null; then
    fail "training processes start and publish (see $ART/leak.log, $ART/plateau.log)"
    summary
fi
pass "training processes start and publish"

# ------------------------------------------------------------ monitoring runs
ALERTS=$ART/alerts.txt
: >"$ALERTS"
ON_ALERT="echo \"\$MEMLENS_ALERT_KIND \$MEMLENS_PID \$MEMLENS_GPU \$MEMLENS_ALERT\" >> '$ALERTS'"
ALERT_ARGS=(--interval 1 --alert-growth 500MiB/min --growth-window "$WINDOW" --alert-above 99%)

timeout 60 "$BIN" top --no-ui --count "$RUN" "${ALERT_ARGS[@]}" \
    --record "$ART/h.jsonl" --on-alert "$ON_ALERT" >"$ART/headless.txt" 2>"$ART/headless.err" &
HEADLESS=$!
PIDS+=("$HEADLESS")

UI_PID=
if command -v tmux >/dev/null 2>&1; then
    tmux -L "$TSOCK" new-session -d -s "$TSESSION" -x 200 -y 50 \
        "MEMLENS_RUNTIME_DIR='$RT' exec '$BIN' top ${ALERT_ARGS[*]} --record '$ART/ui.csv' 2>'$ART/ui.err'"
    sleep 0.5
    UI_PID=$(tmux -L "$TSOCK" list-panes -t "$TSESSION" -F '#{pane_pid}' 2>/dev/null | head -1)
else
    note "tmux not found: no UI capture; footprint measured on the headless run"
fi
MEASURED=${UI_PID:-$HEADLESS}

# CPU: user+system ticks of memlens over the run, after a 2 s start-up.
ticks() { awk '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat" 2>/dev/null; }
sleep 2
T0=$(date +%s.%N)
C0=$(ticks "$MEASURED")

# One sample, bracketed by two nvidia-smi queries (the leak grows meanwhile).
sleep 3
smi_apps() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; }
smi_gpus() { nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits; }
smi_apps >"$ART/smi-before.csv"; smi_gpus >"$ART/smi-gpus-before.csv"
timeout 30 "$BIN" top --once --json >"$ART/once.json" 2>"$ART/once.err"
ONCE_RC=$?
smi_apps >"$ART/smi-after.csv"; smi_gpus >"$ART/smi-gpus-after.csv"

# The rest of the measurement window, then read memlens's counters while it
# still runs (the headless run stops by itself after $RUN samples).
sleep "$(awk -v t0="$T0" -v now="$(date +%s.%N)" -v m="$MEASURE" 'BEGIN { d = m - (now - t0); print (d > 0 ? d : 0) }')"
T1=$(date +%s.%N)
C1=$(ticks "$MEASURED")
RSS_KB=$(awk '/^VmHWM:/ { print $2 }' "/proc/$MEASURED/status" 2>/dev/null)
if [ -n "$UI_PID" ]; then
    tmux -L "$TSOCK" capture-pane -p -t "$TSESSION" >"$ART/ui.txt" 2>/dev/null
    tmux -L "$TSOCK" send-keys -t "$TSESSION" q 2>/dev/null
fi
wait "$HEADLESS"
HEADLESS_RC=$?

# ------------------------------------------------------------------- checks
check "memlens top --once --json exits 0 ($(head -c 200 "$ART/once.err"))" test "$ONCE_RC" -eq 0
check "memlens top --no-ui --count $RUN exits 0 ($(head -c 200 "$ART/headless.err"))" test "$HEADLESS_RC" -eq 0

python3 - "$ART" "$LEAK" "$PLATEAU" "$(id -un)" <<'PY' | tee "$ART/checks.txt"
import csv, json, os, sys

art, leak, plateau, user = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
MIB = 1 << 20
fails = 0

def check(ok, what, detail=""):
    global fails
    print(("PASS  " if ok else "FAIL  ") + what + (f"  [{detail}]" if detail else ""))
    fails += 0 if ok else 1

def load(name):
    try:
        with open(os.path.join(art, name)) as f:
            return f.read()
    except OSError:
        return ""

def smi(name):
    out = {}
    for row in csv.reader(load(name).splitlines()):
        try:
            out[int(row[0])] = int(row[1].strip()) * MIB
        except (ValueError, IndexError):
            pass
    return out

def gpus(name):
    out = {}
    for row in csv.reader(load(name).splitlines()):
        try:
            out[int(row[0])] = (int(row[1]) * MIB, int(row[2]) * MIB)
        except (ValueError, IndexError):
            pass
    return out

try:
    doc = json.loads(load("once.json"))
except ValueError:
    doc = {}
check(doc.get("schema") == "memlens/1", "--once --json is a memlens/1 document")
rows = [(g["index"], p) for g in doc.get("gpus", []) for p in g.get("processes", [])]
by_pid = {}
for gi, p in rows:
    by_pid.setdefault(p["pid"], (gi, p))

# The PID namespace: does nvidia-smi know our PIDs?
before, after = smi("smi-before.csv"), smi("smi-after.csv")
container = leak not in before and leak not in after
if container:
    print("      nvidia-smi does not list our PIDs: another PID namespace (container);"
          " expecting 'not in this PID namespace' rows and publication-only rows")

for name, pid in (("leak", leak), ("plateau", plateau)):
    gi, p = by_pid.get(pid, (None, None))
    check(p is not None, f"{name} process (pid {pid}) appears in --once --json")
    if p is None:
        continue
    cmd = p.get("cmdline") or ""
    check("train.py" in cmd and name in cmd, f"{name}: command line shown", cmd)
    if not container:
        check(p.get("visibility") == "local" and p.get("seen_by_nvml"), f"{name}: NVML row is local")
        check(p.get("user") == user, f"{name}: user is {user}", str(p.get("user")))
    t = p.get("torch") or {}
    check(t.get("reserved_bytes", 0) > 0 and t.get("allocated_bytes", 0) > 0,
          f"{name}: PyTorch figures joined from the publication file",
          f"reserved {t.get('reserved_bytes')} allocated {t.get('allocated_bytes')}")
    check(t.get("step") is not None, f"{name}: step shown", str(t.get("step")))
    if not container:
        gap = t.get("gap_bytes")
        check(gap is not None and 0 <= gap < 4 << 30,
              f"{name}: gap (NVML used - reserved) is the CUDA context, 0..4 GiB", f"{gap} B")

# Every process nvidia-smi lists agrees with memlens's NVML figure, within the
# range nvidia-smi saw before and after (the leak grows meanwhile) +-16 MiB.
compared = 0
for pid in sorted(set(before) | set(after)):
    if pid not in by_pid:
        if pid in before and pid in after:
            check(False, f"nvidia-smi pid {pid} appears in memlens")
        continue
    used = by_pid[pid][1].get("used_bytes")
    seen = [v for v in (before.get(pid), after.get(pid)) if v is not None]
    lo, hi = min(seen) - 16 * MIB, max(seen) + 16 * MIB
    ok = used is not None and lo <= used <= hi
    check(ok, f"pid {pid}: NVML used agrees with nvidia-smi",
          f"memlens {used and used // MIB} MiB, nvidia-smi {[v // MIB for v in seen]} MiB")
    compared += 1
check(compared >= (0 if container else 2), f"compared {compared} processes with nvidia-smi")

gb, ga = gpus("smi-gpus-before.csv"), gpus("smi-gpus-after.csv")
for g in doc.get("gpus", []):
    i = g["index"]
    if i in gb and i in ga:
        lo = min(gb[i][0], ga[i][0]) - 64 * MIB
        hi = max(gb[i][0], ga[i][0]) + 64 * MIB
        ok = lo <= g["used_bytes"] <= hi and abs(g["total_bytes"] - gb[i][1]) <= 64 * MIB
        check(ok, f"GPU {i}: used/total agree with nvidia-smi",
              f"memlens {g['used_bytes'] // MIB}/{g['total_bytes'] // MIB} MiB, "
              f"nvidia-smi {gb[i][0] // MIB}..{ga[i][0] // MIB}/{gb[i][1] // MIB} MiB")

# Alerts: growth fires once for the leak, never for the plateau.
alerts = [l.split(" ", 3) for l in load("alerts.txt").splitlines() if l.strip()]
growth = [a for a in alerts if a[0] == "growth"]
leak_growth = [a for a in growth if a[1] == str(leak)]
check(len(leak_growth) == 1, "growth alert fired once for the leak (--on-alert ran)",
      "; ".join(" ".join(a) for a in growth) or "none")
check(not any(a[1] == str(plateau) for a in growth), "no growth alert for the plateau")

# The JSONL record: one line per sample, carrying the alert.
lines = [l for l in load("h.jsonl").splitlines() if l.strip()]
recs = []
for l in lines:
    try:
        recs.append(json.loads(l))
    except ValueError:
        pass
check(len(recs) >= 15 and len(recs) == len(lines), f"--record h.jsonl has one document per sample ({len(recs)})")
has_leak = sum(1 for r in recs for g in r.get("gpus", []) for p in g.get("processes", []) if p["pid"] == leak)
check(has_leak >= 10, f"records hold the leak process ({has_leak} samples)")
check(any(a.get("kind") == "growth" and a.get("pid") == leak for r in recs for a in r.get("alerts", [])),
      "records carry the growth alert")
text = load("headless.txt")
check(text.count("\n") >= 15 and f"ALERT growth: pid {leak}" in text, "headless prints one line per sample and the alert")

# The UI (tmux), when it ran.
ui = load("ui.txt")
if ui:
    for want in ("memlens top", "GPU 0", str(leak), str(plateau), "RESERVED", "GAP", "grows steadily"):
        check(want in ui, f"UI shows {want!r}")
    ui_csv = load("ui.csv").splitlines()
    check(len(ui_csv) > 10 and ui_csv[0].startswith("time,gpu,"), f"UI --record ui.csv written ({len(ui_csv)} lines)")
sys.exit(1 if fails else 0)
PY
# Python printed its own PASS/FAIL lines; fold them into the totals.
PASSES=$((PASSES + $(grep -c '^PASS' "$ART/checks.txt")))
FAILS=$((FAILS + $(grep -c '^FAIL' "$ART/checks.txt")))
if ! grep -q '^PASS' "$ART/checks.txt"; then fail "the Python checks ran"; fi

# Footprint of memlens top at 1 s refresh.
WHO=$([ -n "$UI_PID" ] && echo "terminal UI" || echo "headless run")
if [ -n "$C0" ] && [ -n "$C1" ] && [ -n "$RSS_KB" ]; then
    HZ=$(getconf CLK_TCK)
    CPU=$(awk -v c0="$C0" -v c1="$C1" -v t0="$T0" -v t1="$T1" -v hz="$HZ" \
        'BEGIN { printf "%.2f", (c1 - c0) / hz / (t1 - t0) * 100 }')
    SECS=$(awk -v t0="$T0" -v t1="$T1" 'BEGIN { printf "%.0f", t1 - t0 }')
    echo "      footprint ($WHO, ${SECS} s at 1 s refresh): peak RSS $((RSS_KB / 1024)) MiB ($RSS_KB kB), CPU $CPU% of a core"
    echo "      (nvitop for comparison: ~41 MB, 0.9%)"
    check "memlens top RSS under 30 MiB ($((RSS_KB / 1024)) MiB)" test "$RSS_KB" -lt "$RSS_LIMIT_KB"
    check "memlens top CPU under $CPU_LIMIT_PCT% of a core ($CPU%)" \
        awk -v c="$CPU" -v l="$CPU_LIMIT_PCT" 'BEGIN { exit !(c < l) }'
else
    fail "footprint measured (memlens exited early? see $ART/*.err)"
fi
summary
