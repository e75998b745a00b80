"""`memlens mcp` driven by the official MCP Python client over stdio.

Every tool is asked on real snapshots (../shared/fixtures and tests/corpus)
and its answer, unpaged, must equal what the command line prints with
`--json`; pages must add up to the whole list; default answers must be
small; bad questions (a hostile pickle, a missing file, a path outside the
roots, a bad cursor) must be tool errors after which the server still
answers; and one snapshot asked many questions must be read once.
"""

import asyncio
import json
import os
import pickle
import subprocess
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(os.environ.get("MEMLENS_FIXTURES", REPO.parent / "shared" / "fixtures")).resolve()
CORPUS = REPO / "tests" / "corpus"
BIN = os.environ.get("MEMLENS_BIN", str(REPO / "target" / "debug" / "memlens"))

TOOLS = {"summary", "peak", "leaks", "oom", "fit", "diff", "ranks", "state", "doctor"}


def fixture(name):
    return str(FIXTURES / name)


def corpus(name):
    return str(CORPUS / name)


def cli(*args):
    """The CLI's JSON document for `args`."""
    out = subprocess.run([BIN, *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def serve(*extra_roots):
    return StdioServerParameters(
        command=BIN,
        args=["mcp", "--root", str(FIXTURES), "--root", str(CORPUS)]
        + [a for r in extra_roots for a in ("--root", str(r))],
    )


def with_session(body, *extra_roots):
    """Runs `body(session)` against a fresh server and returns its result."""

    async def main():
        async with stdio_client(serve(*extra_roots)) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                return await body(s)

    return asyncio.run(main())


async def ask(s, tool, **args):
    """The answer document of a successful call (fails the test otherwise)."""
    res = await s.call_tool(tool, args)
    text = res.content[0].text
    assert not res.is_error, f"{tool} {args}: {text}"
    doc = json.loads(text)
    assert doc == res.structured_content, "the text and the structured content are one document"
    return doc


async def error(s, tool, **args):
    """The message of a call that must fail as a tool error."""
    res = await s.call_tool(tool, args)
    assert res.is_error, f"{tool} {args} should have failed: {res.content[0].text[:300]}"
    return res.content[0].text


def whole(doc):
    """The document without the server's own key."""
    doc = dict(doc)
    doc.pop("answer")
    return doc


# (tool, its arguments, the CLI command that answers the same question)
CASES = [
    ("summary", {"snapshot": fixture("gpt2_train.pickle.zst")},
     ["summary", fixture("gpt2_train.pickle.zst")]),
    ("peak", {"snapshot": fixture("gpt2_train.pickle.zst")},
     ["peak", fixture("gpt2_train.pickle.zst"), "--top", "1000"]),
    ("peak", {"snapshot": fixture("resnet.pickle.zst"), "by": "module"},
     ["peak", fixture("resnet.pickle.zst"), "--by", "module"]),
    ("leaks", {"snapshots": [fixture("cache_leak.pickle.zst")]},
     ["leaks", fixture("cache_leak.pickle.zst")]),
    ("leaks", {"snapshots": [corpus(f"leak_losses.step{i}.pickle.zst") for i in (2, 4, 6, 8)]},
     ["leaks"] + [corpus(f"leak_losses.step{i}.pickle.zst") for i in (2, 4, 6, 8)]),
    ("oom", {"snapshot": fixture("oom.at_oom.pickle.zst"), "device_memory": "H100"},
     ["oom", fixture("oom.at_oom.pickle.zst"), "--device-memory", "H100", "--top", "1000"]),
    ("oom", {"snapshot": corpus("oom/frag_cap.pickle.zst"),
             "message": Path(corpus("oom/frag_cap.message.txt")).read_text()},
     ["oom", corpus("oom/frag_cap.pickle.zst"), "--message-file", corpus("oom/frag_cap.message.txt"),
      "--top", "1000"]),
    ("oom", {"snapshot": corpus("oom/first_step/resnet_amp.b28.pickle.zst"), "batch": 28,
             "optimizer": "sgd-momentum"},
     ["oom", corpus("oom/first_step/resnet_amp.b28.pickle.zst"), "--batch", "28",
      "--optimizer", "sgd-momentum", "--top", "1000"]),
    ("fit", {"probes": [corpus("fit/gpt.b2.pickle.zst"), corpus("fit/gpt.b4.pickle.zst")],
             "recorded_batch": [2, 4], "batch": 16, "memory_limit": "2GiB"},
     ["fit", corpus("fit/gpt.b2.pickle.zst"), corpus("fit/gpt.b4.pickle.zst"),
      "--recorded-batch", "2,4", "--batch", "16", "--limit", "2GiB"]),
    ("fit", {"probes": [corpus("fit/checkpoint/hf_gpt2.pickle.zst")], "checkpoint": "GPT2Block",
             "memory_limit": "1GiB"},
     ["fit", corpus("fit/checkpoint/hf_gpt2.pickle.zst"), "--checkpoint", "GPT2Block", "--limit", "1GiB"]),
    ("diff", {"a": fixture("cache_leak.step1.pickle.zst"), "b": fixture("cache_leak.step9.pickle.zst")},
     ["diff", fixture("cache_leak.step1.pickle.zst"), fixture("cache_leak.step9.pickle.zst")]),
    ("state", {"snapshot": fixture("varlen.pickle.zst"), "event": 1234},
     ["state", fixture("varlen.pickle.zst"), "--event", "1234", "--top", "1000"]),
    ("doctor", {"snapshots": [fixture("gpt2_eval_leak.pickle.zst")]},
     ["doctor", "--no-report", fixture("gpt2_eval_leak.pickle.zst")]),
    ("doctor", {"snapshots": [corpus("ranks/ddp_ema.rank1.pickle.zst"), corpus("ranks/ddp_ema.rank0.pickle.zst")]},
     ["doctor", "--no-report", corpus("ranks/ddp_ema.rank1.pickle.zst"), corpus("ranks/ddp_ema.rank0.pickle.zst")]),
]


def test_lists_every_tool_with_a_schema():
    async def body(s):
        return (await s.list_tools()).tools

    tools = with_session(body)
    assert {t.name for t in tools} == TOOLS
    for t in tools:
        assert t.description and len(t.description) > 40, t.name
        props = t.input_schema["properties"]
        assert {"cursor", "limit", "full"} <= set(props), (t.name, props)


@pytest.mark.parametrize("tool,args,argv", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_answer_equals_the_cli_document(tool, args, argv):
    async def body(s):
        return await ask(s, tool, full=True, limit=1000, **args)

    got = with_session(body)
    assert got["answer"]["tool"] == tool
    assert got["answer"]["next_cursor"] is None
    assert whole(got) == cli(*argv)


def test_ranks_answer_equals_doctors_ranks_and_imbalance():
    files = [corpus("ranks/ddp_ema.rank0.pickle.zst"), corpus("ranks/ddp_ema.rank1.pickle.zst")]

    async def body(s):
        return await ask(s, "ranks", snapshots=files, full=True, limit=1000)

    got = with_session(body)
    doc = cli("doctor", "--no-report", *files)
    assert got["ranks"] == doc["ranks"] and len(got["ranks"]) == 2
    imbalance = [f for f in doc["findings"] if f["kind"] == "imbalance"]
    assert imbalance, "the planted EMA copy on rank 0 is an imbalance"
    assert got["findings"] == imbalance


def test_pages_add_up_to_the_whole_list_and_default_answers_are_small():
    snap = fixture("long.pickle.zst")

    async def body(s):
        full = await ask(s, "peak", snapshot=snap, full=True, limit=1000)
        pages, cursor = [], None
        while True:
            args = {"snapshot": snap, "limit": 3, "full": True}
            if cursor:
                args["cursor"] = cursor
            page = await ask(s, "peak", **args)
            pages.extend(page["live_at_peak"])
            cursor = page["answer"]["next_cursor"]
            if cursor is None:
                break
        sizes = {}
        for tool, args, _ in CASES:
            res = await s.call_tool(tool, args)
            assert not res.is_error, res.content[0].text
            sizes[f"{tool} {json.dumps(args)[:60]}"] = len(res.content[0].text)
        doctor = await ask(s, "doctor", snapshots=[snap])
        sizes["doctor long"] = len(json.dumps(doctor))
        return full, pages, sizes, doctor

    full, pages, sizes, doctor = with_session(body)
    assert pages == full["live_at_peak"] and len(pages) > 3
    assert full["answer"]["total"]["live_at_peak"] == len(pages)
    # An agent's context is small: no default answer above 32 KB.
    assert max(sizes.values()) < 32_000, sizes
    assert "diagnosis" not in doctor and doctor["answer"]["omitted"] == ["diagnosis"]


def test_bad_questions_are_tool_errors_and_the_server_goes_on(tmp_path):
    hostile = tmp_path / "hostile.pickle"
    # A pickle that would run a shell command if loaded with pickle.load.
    hostile.write_bytes(pickle.dumps(Evil(f"touch {tmp_path}/pwned"), protocol=2))
    truncated = tmp_path / "truncated.pickle.zst"
    truncated.write_bytes(Path(fixture("gpt2_train.pickle.zst")).read_bytes()[:5000])
    outside = tmp_path.parent / "elsewhere.pickle"
    outside.write_bytes(b"x")

    async def body(s):
        msgs = {
            "hostile": await error(s, "summary", snapshot=str(hostile)),
            "truncated": await error(s, "peak", snapshot=str(truncated)),
            "missing": await error(s, "summary", snapshot=str(tmp_path / "nope.pickle")),
            "outside": await error(s, "summary", snapshot=str(outside)),
            "dotdot": await error(s, "summary", snapshot=str(tmp_path / ".." / "elsewhere.pickle")),
            "cursor": await error(s, "peak", snapshot=fixture("resnet.pickle.zst"), cursor="zz"),
            "no_oom": await error(s, "oom", snapshot=fixture("resnet.pickle.zst")),
            "event": await error(s, "state", snapshot=fixture("resnet.pickle.zst"), event=10**9),
            "by": await error(s, "peak", snapshot=fixture("resnet.pickle.zst"), by="file"),
            "optimizer": await error(s, "oom", snapshot=fixture("oom.at_oom.pickle.zst"), optimizer="lion"),
        }
        after = await ask(s, "summary", snapshot=fixture("resnet.pickle.zst"))
        return msgs, after

    msgs, after = with_session(body, tmp_path)
    assert not (tmp_path / "pwned").exists(), "a pickle never runs code"
    assert "hostile.pickle" in msgs["hostile"]
    assert "truncated.pickle.zst" in msgs["truncated"]
    assert "nope.pickle" in msgs["missing"]
    for k in ("outside", "dotdot"):
        assert "outside the folders this server may read" in msgs[k], msgs[k]
    assert "cursor" in msgs["cursor"]
    assert "no OOM" in msgs["no_oom"]
    assert "past the trace" in msgs["event"]
    assert "neither site nor module" in msgs["by"]
    assert "unknown" in msgs["optimizer"] and "sgd-momentum" in msgs["optimizer"]
    for m in msgs.values():
        assert "\n" not in m.strip() and "Traceback" not in m and "panicked" not in m, m
    assert after["reserved_bytes"] > 0


def test_many_questions_of_one_snapshot_read_it_once():
    snap = fixture("varlen.pickle.zst")

    async def body(s):
        reads = []
        peak = await ask(s, "peak", snapshot=snap)
        at = peak["peak_event_index"]
        for i in range(8):
            for tool, args in [
                ("summary", {}),
                ("peak", {"limit": 2 + i}),
                ("leaks", None),
                ("state", {"event": at - i}),
                ("doctor", None),
            ]:
                if args is None:
                    doc = await ask(s, tool, snapshots=[snap])
                else:
                    doc = await ask(s, tool, snapshot=snap, **args)
                reads.append(doc["answer"]["snapshot_reads"])
        state = await ask(s, "state", snapshot=snap, event=at)
        return reads, peak, state

    reads, peak, state = with_session(body)
    assert set(reads) == {1}, reads
    # The state at the peak's event is the peak, to the byte.
    assert state["allocated_bytes"] == peak["peak_allocated_bytes"]


class Evil:
    """Pickles as a call of os.system."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_the_evidence_in_answers_checks_out_with_state():
    """The event indices answers give are real: the state at a live site's
    `alloc_event` (and at a leak's) is an allocation at that site, and the
    state at `peak_event_index` holds the peak."""
    snap = fixture("gpt2_eval_leak.pickle.zst")

    async def body(s):
        peak = await ask(s, "peak", snapshot=snap, limit=5)
        leaks = await ask(s, "leaks", snapshots=[snap])
        checks = []
        for row in peak["live_at_peak"] + leaks["leaks"]:
            if row.get("alloc_event") is None or row["site"].startswith("<"):
                continue
            st = await ask(s, "state", snapshot=snap, event=row["alloc_event"])
            checks.append((row["site"], st["event"]["action"], st["event"]["site"]))
        at_peak = await ask(s, "state", snapshot=snap, event=peak["peak_event_index"])
        return peak, leaks, checks, at_peak

    peak, leaks, checks, at_peak = with_session(body)
    assert leaks["leaks"] and leaks["leaks"][0]["alloc_event"] is not None
    assert len(checks) >= 3, checks
    for site, action, at in checks:
        assert action == "alloc" and at == site, (site, action, at)
    assert at_peak["allocated_bytes"] == peak["peak_allocated_bytes"]


# The recordings users have (tests/corpus): PyTorch's default stacks="all",
# one step, torch.compile, a notebook cell, the legacy bare list of segments.
REAL_WORLD = ["default_all", "one_step", "compiled", "notebook", "legacy_kept_logits"]


@pytest.mark.parametrize("name", REAL_WORLD)
def test_answers_equal_the_cli_on_real_world_recordings(name):
    snap = corpus(f"{name}.pickle.zst")
    asks = [
        ("summary", {"snapshot": snap}, ["summary", snap]),
        ("peak", {"snapshot": snap}, ["peak", snap, "--top", "1000"]),
        ("leaks", {"snapshots": [snap]}, ["leaks", snap]),
        ("doctor", {"snapshots": [snap]}, ["doctor", "--no-report", snap]),
    ]

    async def body(s):
        return [await ask(s, tool, full=True, limit=1000, **args) for tool, args, _ in asks]

    answers = with_session(body)
    for (tool, _, argv), got in zip(asks, answers):
        assert whole(got) == cli(*argv), f"{name}: {tool}"
        assert got["answer"]["snapshot_reads"] == 1
