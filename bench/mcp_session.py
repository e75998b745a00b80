"""A coding agent's session with `memlens mcp`: 100 questions of one large
snapshot (issue 36). Prints, as JSON: the server's reads of the file (the
`answer.snapshot_reads` of the last answer), the time of the first question
(it reads and analyses the file) and of the other 99, the server's peak RSS,
and the same questions' cost on the command line, where each reads the file
again (measured on one question of each kind, times the count of that kind).

    target/mcp-venv/bin/python bench/mcp_session.py [SNAPSHOT] [MEMLENS]

Default: bench/data/large-350mb.pickle (bench/run.sh makes it) and
target/release/memlens. The virtualenv is the one tests/mcp/ci.sh makes.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[1]
SNAP = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "bench/data/large-350mb.pickle").resolve()
BIN = sys.argv[2] if len(sys.argv) > 2 else str(ROOT / "target/release/memlens")


def questions(peak_event, events):
    """The 100 questions after the first (`doctor`): what an agent asks next."""
    qs = [("peak", {"snapshot": str(SNAP)})]
    qs += [("peak", {"snapshot": str(SNAP), "cursor": str(10 * i)}) for i in range(1, 4)]
    qs += [("summary", {"snapshot": str(SNAP)})] * 5
    qs += [("leaks", {"snapshots": [str(SNAP)]})] * 5
    qs += [("peak", {"snapshot": str(SNAP), "by": "module"})] * 5
    step = max(1, events // 80)
    qs += [("state", {"snapshot": str(SNAP), "event": max(0, min(events - 1, peak_event + (i - 40) * step))})
           for i in range(80)]
    return qs[:99]


def cli_argv(tool, args):
    snap = str(SNAP)
    return {
        "doctor": ["doctor", "--no-report", snap],
        "peak": ["peak", snap] + (["--by", "module"] if args.get("by") == "module" else []),
        "summary": ["summary", snap],
        "leaks": ["leaks", snap],
        "state": ["state", snap, "--event", str(args.get("event", 0))],
    }[tool] + ["--json"]


def server_rss_kb():
    """Peak RSS of the `memlens mcp` process (VmHWM), in KiB."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if cmd[0].endswith(b"memlens") and b"mcp" in cmd:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except (OSError, IndexError):
            continue
    return None


async def session():
    params = StdioServerParameters(command=BIN, args=["mcp", "--root", str(SNAP.parent)])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            t0 = time.perf_counter()
            first = await s.call_tool("doctor", {"snapshots": [str(SNAP)]})
            t_first = time.perf_counter() - t0
            assert not first.is_error, first.content[0].text
            peak = json.loads((await s.call_tool("peak", {"snapshot": str(SNAP)})).content[0].text)
            summary = json.loads((await s.call_tool("summary", {"snapshot": str(SNAP)})).content[0].text)
            qs = questions(peak["peak_event_index"], summary["trace_events"])
            t1 = time.perf_counter()
            sizes, last = [], None
            for tool, args in qs:
                r = await s.call_tool(tool, args)
                assert not r.is_error, (tool, args, r.content[0].text)
                sizes.append(len(r.content[0].text))
                last = json.loads(r.content[0].text)
            t_rest = time.perf_counter() - t1
            return {
                "questions": 1 + len(qs),
                "snapshot_reads": last["answer"]["snapshot_reads"],
                "first_question_s": round(t_first, 3),
                "other_questions_s": round(t_rest, 3),
                "largest_answer_bytes": max(sizes),
                "server_peak_rss_mb": round((server_rss_kb() or 0) / 1024),
                "kinds": Counter(t for t, _ in [("doctor", {})] + qs),
                "qs": [("doctor", {})] + qs,
            }


def main():
    r = asyncio.run(session())
    cli = {}
    for tool, args in r.pop("qs"):
        key = tool if tool != "peak" else ("peak module" if args.get("by") == "module" else "peak")
        if key in cli:
            continue
        t = time.perf_counter()
        subprocess.run([BIN, *cli_argv(tool, args)], check=True, capture_output=True)
        cli[key] = time.perf_counter() - t
    counts = Counter()
    for tool, n in r["kinds"].items():
        counts[tool] = n
    # Peak by module and by site share one count: split them as asked.
    module_n = 5
    cli_total = (
        cli["doctor"] * counts["doctor"]
        + cli["peak"] * (counts["peak"] - module_n)
        + cli["peak module"] * module_n
        + cli["summary"] * counts["summary"]
        + cli["leaks"] * counts["leaks"]
        + cli["state"] * counts["state"]
    )
    r["kinds"] = dict(r["kinds"])
    r["cli_one_each_s"] = {k: round(v, 3) for k, v in cli.items()}
    r["cli_same_questions_s"] = round(cli_total, 1)
    r["snapshot"] = f"{SNAP.name} ({SNAP.stat().st_size / 1e6:.0f} MB)"
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
