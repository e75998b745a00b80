"""The capture helpers without a GPU: no torch, no CUDA, and a fake torch whose
allocator bookkeeping drives record/step/stop, snapshot names, the live files,
the leak alarm and the OOM observer for real."""

from __future__ import annotations

import json
import os
import pickle
import warnings

import fake_torch
import pytest

import memlens
from memlens import _capture, _live
from memlens._leak import ALARM, BASELINE, MIDPOINT, LeakRule

MIB = 1024 * 1024
LIVE_KEYS = [
    "schema", "pid", "device", "rank", "step", "allocated_bytes", "reserved_bytes",
    "active_bytes", "peak_allocated_bytes", "cuda_total_bytes", "time", "leak_alarm", "cmdline",
]


def pickles(folder, pattern="*"):
    """The snapshots in ``folder`` (without the files written beside them)."""
    return sorted(p.name for p in folder.glob(pattern) if p.name.endswith(".pickle"))


def live_files(tmp_path):
    d = tmp_path / "run"
    return sorted(p.name for p in d.glob("*.json")) if d.is_dir() else []


def read_live(tmp_path, device=0):
    return json.loads((tmp_path / "run" / f"{os.getpid()}-{device}.json").read_text())


# -- without torch or CUDA ---------------------------------------------------


def test_without_torch_everything_is_a_noop_with_one_warning(no_torch, tmp_path):
    with pytest.warns(memlens.MemlensWarning, match="torch is not installed") as caught:
        with memlens.record(tmp_path / "snaps", every=1) as rec:
            memlens.step()
            memlens.step()
        memlens.start(tmp_path / "again")
    assert len(caught) == 1
    assert not rec.active and rec.steps == 0 and rec.snapshots == []
    assert memlens.stop() is None
    memlens.step()
    assert not (tmp_path / "snaps").exists()


def test_without_cuda_everything_is_a_noop(gpu, tmp_path):
    gpu.available = False
    with pytest.warns(memlens.MemlensWarning, match="CUDA is not available"):
        rec = memlens.start(tmp_path / "snaps")
    memlens.step()
    assert memlens.stop() is None
    assert gpu.history_calls == [] and not rec.active and live_files(tmp_path) == []


def test_bad_arguments_are_refused_before_anything_starts(gpu, tmp_path):
    with pytest.raises(ValueError, match="stacks"):
        memlens.record(tmp_path, stacks="cpp")
    with pytest.raises(ValueError, match="every"):
        memlens.record(tmp_path, every=0)
    assert gpu.history_calls == []


# -- recording, snapshot names, live files -------------------------------------


def test_record_turns_history_on_with_python_stacks_and_a_bounded_ring(gpu, tmp_path):
    with memlens.record(tmp_path / "snaps"):
        pass
    on, off = gpu.history_calls
    assert on == {"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 60_000,
                  "skip_actions": ["free_requested"]}
    assert off["enabled"] is None
    assert len(gpu.observers) == 1


def test_free_requested_is_left_out_of_the_trace_unless_asked_for(gpu, tmp_path):
    # Left out (torch's skip_actions): a free is its free_completed alone, the
    # snapshot says so, and the ring counts two entries an allocation.
    with memlens.record(tmp_path / "a", leak_check=False, publish=False) as rec:
        gpu.free(gpu.alloc(512))
    snap = pickle.loads(open(rec.snapshots[-1], "rb").read())
    actions = [e["action"] for t in snap["device_traces"] for e in t]
    assert actions.count("free_completed") == 1 and "free_requested" not in actions
    assert snap["memlens"]["skipped_actions"] == ["free_requested"]
    # Asked for: torch records every action.
    gpu.history_calls.clear()
    with memlens.record(tmp_path / "b", leak_check=False, publish=False, free_requested=True) as rec:
        gpu.free(gpu.alloc(512))
    assert "skip_actions" not in gpu.history_calls[0]
    snap = pickle.loads(open(rec.snapshots[-1], "rb").read())
    assert [e["action"] for t in snap["device_traces"] for e in t if e["action"].startswith("free")][-2:] == [
        "free_requested", "free_completed"]
    assert snap["memlens"]["skipped_actions"] == []
    # A torch without skip_actions: recording goes on with every action, and
    # the snapshot does not claim any was skipped.
    gpu.history_calls.clear()
    gpu.skip_actions_supported = False
    with memlens.record(tmp_path / "c", leak_check=False, publish=False) as rec:
        gpu.free(gpu.alloc(512))
    assert rec.skip_actions == [] and gpu.history_calls[0]["enabled"] == "all"
    assert pickle.loads(open(rec.snapshots[-1], "rb").read())["memlens"]["skipped_actions"] == []


def test_max_entries_rule():
    assert _capture.default_max_entries(6) == 60_000
    assert _capture.default_max_entries(1) == 10_000
    assert _capture.default_max_entries(500) == 1_000_000


def test_snapshots_every_n_steps_and_at_the_end(gpu, tmp_path):
    out = tmp_path / "snaps"
    with memlens.record(out, every=2) as rec:
        for _ in range(5):
            gpu.alloc(MIB)
            memlens.step()
    names = pickles(out)
    assert names == ["snapshot.pickle", "snapshot.step2.pickle", "snapshot.step4.pickle"]
    assert rec.snapshots == [str(out / n) for n in ["snapshot.step2.pickle", "snapshot.step4.pickle", "snapshot.pickle"]]
    # The files are the snapshots PyTorch returned, pickled as _dump_snapshot does.
    step4 = pickle.loads((out / "snapshot.step4.pickle").read_bytes())
    assert sum(b["size"] for s in step4["segments"] for b in s["blocks"] if b["state"] == "active_allocated") == 4 * MIB
    assert set(step4) == {"segments", "device_traces", "allocator_settings", "external_annotations", "memlens"}


def _alloc_times(snapshot):
    return [e["time_us"] for t in snapshot["device_traces"] for e in t if e["action"] == "alloc"]


def test_periodic_snapshots_hold_the_trace_since_the_previous_one(gpu, tmp_path):
    # Each step allocates one block at a known line and frees the previous
    # one: 3 events a step, the step's number in the line.
    out = tmp_path / "snaps"
    kept = None
    with memlens.record(out, every=2, steps_kept=3, leak_check=False):
        for step in range(1, 10):
            blk = gpu.alloc(MIB, line=step)
            if kept is not None:
                gpu.free(kept)
            kept = blk
            memlens.step()
    lines = lambda snap: [e["frames"][-1]["line"] for t in snap["device_traces"] for e in t if e["action"] == "alloc"]
    snaps = {n: pickle.loads((out / n).read_bytes()) for n in pickles(out)}
    # A periodic dump clears the ring after it: each periodic file holds its
    # own two steps, nothing of the steps before.
    assert lines(snaps["snapshot.step2.pickle"]) == [1, 2]
    assert lines(snaps["snapshot.step4.pickle"]) == [3, 4]
    assert lines(snaps["snapshot.step8.pickle"]) == [7, 8]
    # The whole state is still in every file (the kept block of step 8).
    step8_live = [b for s in snaps["snapshot.step8.pickle"]["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert [b["frames"][-1]["line"] for b in step8_live] == [8]
    # The final one stitches the newest periodic traces that cover steps_kept
    # (3) steps in front of the ring's: steps 5-6, 7-8 and the ring's 9, in
    # time order, every event once.
    final = snaps["snapshot.pickle"]
    assert lines(final) == [5, 6, 7, 8, 9]
    times = [e["time_us"] for t in final["device_traces"] for e in t]
    assert times == sorted(times) and len(times) == len(set(times))
    assert len(times) == 5 * 2  # alloc + free_completed a step (free_requested skipped)


def test_the_oom_snapshot_is_stitched_too(gpu, tmp_path, capsys):
    out = tmp_path / "snaps"
    with memlens.record(out, every=1, steps_kept=2, leak_check=False, explain_oom=False):
        for step in range(1, 5):
            gpu.alloc(MIB, line=step)
            memlens.step()
        gpu.alloc(MIB, line=5)
        with pytest.raises(fake_torch.FakeOutOfMemoryError):
            gpu.oom(10 * 1024 * MIB)
    oom = pickle.loads((out / "snapshot.oom.pickle").read_bytes())
    assert [e["frames"][-1]["line"] for t in oom["device_traces"] for e in t] == [3, 4, 5]


def test_without_clear_history_periodic_snapshots_hold_the_whole_ring(gpu, tmp_path):
    gpu.clear_history_supported = False
    out = tmp_path / "snaps"
    with memlens.record(out, every=2, leak_check=False):
        for step in range(1, 5):
            gpu.alloc(MIB, line=step)
            memlens.step()
    step4 = pickle.loads((out / "snapshot.step4.pickle").read_bytes())
    assert [e["frames"][-1]["line"] for t in step4["device_traces"] for e in t] == [1, 2, 3, 4]
    final = pickle.loads((out / "snapshot.pickle").read_bytes())
    assert len(final["device_traces"][0]) == 4


def test_file_name_mode_and_start_stop_functions(gpu, tmp_path):
    rec = memlens.start(tmp_path / "run1.pickle", every=1)
    assert _capture.current() is rec
    memlens.step()
    final = memlens.stop()
    assert final == str(tmp_path / "run1.pickle")
    assert pickles(tmp_path, "run1*") == ["run1.pickle", "run1.step1.pickle"]
    assert _capture.current() is None
    assert memlens.stop() is None


def test_rank_goes_in_the_names_once_distributed_is_initialised(gpu, tmp_path):
    out = tmp_path / "snaps"
    with memlens.record(out, every=2):
        gpu.rank = 3  # init_process_group after record() started, as usual
        memlens.step()
        memlens.step()
        assert read_live(tmp_path)["rank"] in (None, 3)
    assert pickles(out) == ["snapshot.rank3.pickle", "snapshot.rank3.step2.pickle"]


def test_only_one_recording_at_a_time(gpu, tmp_path):
    with memlens.record(tmp_path / "a"):
        with pytest.raises(RuntimeError, match="already recording"):
            memlens.start(tmp_path / "b")


def test_live_file_format_and_removal(gpu, tmp_path, monkeypatch):
    gpu.alloc(3 * MIB)
    rec = memlens.start(tmp_path / "snaps")
    assert live_files(tmp_path) == [f"{os.getpid()}-0.json"]
    doc = read_live(tmp_path)
    assert list(doc) == LIVE_KEYS
    assert doc["schema"] == "memlens/1" and doc["pid"] == os.getpid() and doc["device"] == 0
    assert doc["step"] is None and doc["rank"] is None and doc["leak_alarm"] is None
    assert doc["allocated_bytes"] == 3 * MIB and doc["reserved_bytes"] == 20 * MIB
    assert doc["active_bytes"] == 3 * MIB and doc["peak_allocated_bytes"] == 3 * MIB
    assert isinstance(doc["time"], float) and isinstance(doc["cmdline"], str) and doc["cmdline"]
    # At most once a second: a step right after start does not rewrite it ...
    clock = [1000.0]
    monkeypatch.setattr(_live, "_monotonic", lambda: clock[0])
    rec._publisher._last = clock[0]
    memlens.step()
    assert read_live(tmp_path)["step"] is None
    # ... one a second later does.
    clock[0] += 1.0
    memlens.step()
    assert read_live(tmp_path)["step"] == 2
    assert not list((tmp_path / "run").glob("*.tmp"))
    memlens.stop()
    assert live_files(tmp_path) == []


def test_publisher_throttles_and_writes_atomically(tmp_path):
    gpu = fake_torch.FakeGPU()
    torch = fake_torch.build(gpu)
    clock = [10.0]
    pub = _live.Publisher(torch, lambda: [0], clock=lambda: clock[0], directory=str(tmp_path))
    assert pub.publish(step=1, rank=None, leak_alarm=None)
    assert not pub.publish(step=2, rank=None, leak_alarm=None)
    clock[0] += 0.5
    assert not pub.publish(step=3, rank=None, leak_alarm=None)
    assert pub.publish(step=4, rank=None, leak_alarm="x", force=True)
    clock[0] += 1.0
    assert pub.publish(step=5, rank=2, leak_alarm=None)
    doc = json.loads((tmp_path / f"{os.getpid()}-0.json").read_text())
    assert doc["step"] == 5 and doc["rank"] == 2
    assert (tmp_path.stat().st_mode & 0o777) in (0o700, 0o755, 0o775)  # tmp_path existed before
    pub.remove()
    assert list(tmp_path.iterdir()) == []


def test_runtime_dir_default(monkeypatch):
    monkeypatch.delenv("MEMLENS_RUNTIME_DIR", raising=False)
    assert _live.runtime_dir() == f"/tmp/memlens-{os.getuid()}"
    monkeypatch.setenv("MEMLENS_RUNTIME_DIR", "/x/y")
    assert _live.runtime_dir() == "/x/y"


def test_one_live_file_per_device_in_use(tmp_path, monkeypatch):
    from conftest import _reset_capture_state

    _reset_capture_state()
    monkeypatch.setenv("MEMLENS_RUNTIME_DIR", str(tmp_path / "run"))
    gpu = fake_torch.FakeGPU(devices=3)
    fake_torch.install(gpu)
    try:
        gpu.alloc(MIB, device=0)
        gpu.alloc(5 * MIB, device=2)  # device 1 unused: no file
        with memlens.record(tmp_path / "snaps"):
            assert live_files(tmp_path) == [f"{os.getpid()}-0.json", f"{os.getpid()}-2.json"]
            assert read_live(tmp_path, 2)["allocated_bytes"] == 5 * MIB
        assert live_files(tmp_path) == []
    finally:
        _reset_capture_state()
        fake_torch.uninstall()


def test_a_failing_step_warns_once_and_training_goes_on(gpu, tmp_path):
    with memlens.record(tmp_path / "snaps", every=1):
        gpu.stats_error = RuntimeError("driver hiccup")
        with pytest.warns(memlens.MemlensWarning, match="step\\(\\) failed") as caught:
            memlens.step()
            memlens.step()
        assert len(caught) == 1
        gpu.stats_error = None


def test_ring_buffer_too_small_warns_once_with_the_value_to_pass(gpu, tmp_path):
    gpu.free(gpu.alloc(512))  # the segment exists before recording starts
    with memlens.record(tmp_path / "snaps", max_entries=10_000, leak_check=False):
        with pytest.warns(memlens.MemlensWarning, match="max_entries=") as caught:
            for _ in range(3):
                for _ in range(3000):  # 3000 allocations: 6000 events a step
                    gpu.free(gpu.alloc(512))
                memlens.step()
    assert len(caught) == 1
    assert "6,000" in str(caught[0].message) and "36,000" in str(caught[0].message)


def test_default_ring_is_fitted_to_the_model_after_two_steps(gpu, tmp_path):
    # 1,000 allocations a step: 2,000 trace events (alloc, free_completed;
    # free_requested is skipped), 2,001 in step 1 (its segment_alloc);
    # steps_kept 6 with half again to spare: 9 x 2,001 = 18,009 entries.
    with memlens.record(tmp_path / "snaps", leak_check=False, publish=False) as rec:
        for step in range(4):
            for _ in range(1000):
                gpu.free(gpu.alloc(512))
            memlens.step()
            if step == 0:
                assert len(gpu.history_calls) == 1  # not after one step
    on, fitted, off = gpu.history_calls
    assert on["max_entries"] == 60_000
    assert fitted == {"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 18_009,
                      "skip_actions": ["free_requested"]}
    assert off["enabled"] is None
    assert rec.max_entries == 18_009


def test_ring_is_never_fitted_when_chosen_and_grows_or_shrinks_to_the_model(gpu, tmp_path):
    # Chosen by the caller: kept.
    with memlens.record(tmp_path / "a", max_entries=50_000, leak_check=False, publish=False):
        for _ in range(3):
            for _ in range(1000):
                gpu.free(gpu.alloc(512))
            memlens.step()
    assert [c["max_entries"] for c in gpu.history_calls[:-1]] == [50_000]
    gpu.history_calls.clear()
    # A model whose steps outgrow the first 60,000 (15,000 events a step, 6
    # steps kept): grown to them while the ring has not wrapped.
    with memlens.record(tmp_path / "b", leak_check=False, publish=False) as rec:
        for _ in range(3):
            for _ in range(7500):
                gpu.free(gpu.alloc(512))
            memlens.step()
    assert [c["max_entries"] for c in gpu.history_calls[:-1]] == [60_000, 135_000] and rec.max_entries == 135_000
    gpu.history_calls.clear()
    # A tiny model: not below MIN_ENTRIES.
    with memlens.record(tmp_path / "c", leak_check=False, publish=False) as rec:
        for _ in range(3):
            gpu.free(gpu.alloc(512))
            memlens.step()
    assert [c["max_entries"] for c in gpu.history_calls[:-1]] == [60_000, 10_000]


def _alloc_lines(snapshot):
    return [e["frames"][-1]["line"] for t in snapshot["device_traces"] for e in t if e["action"] == "alloc"]


def test_every_periodic_snapshot_holds_the_steps_it_promises(gpu, tmp_path):
    # 3,000 events a step at every=10: a ring sized for steps_kept (6) steps
    # alone held 9 of the 10 steps between two snapshots (measured on an
    # H200, BENCHMARKS.md). Sized for `every`, each holds all ten, and says so.
    out = tmp_path / "snaps"
    with memlens.record(out, every=10, leak_check=False, publish=False) as rec:
        for step in range(1, 41):
            for _ in range(1500):  # 3,000 events: alloc, free_completed
                gpu.free(gpu.alloc(512, line=step))
            memlens.step()
    assert rec.max_entries == 10 * 3000 * 3 // 2 + 15  # the largest step (3,001 events) x 10 x 1.5
    for k in (20, 30, 40):
        snap = pickle.loads((out / f"snapshot.step{k}.pickle").read_bytes())
        assert sorted(set(_alloc_lines(snap))) == list(range(k - 9, k + 1)), k
        info = snap["memlens"]
        assert info["kind"] == "periodic" and info["trace_from_step"] == k - 10 and info["step"] == k
        assert info["sized_by"] == "memlens" and info["ring_wrapped"] is False
        assert info["events_since_trace_start"] == 30_000
    final = pickle.loads((out / "snapshot.pickle").read_bytes())
    # steps_kept (6): the periodic file of steps 31-40 covers them; nothing after.
    assert final["memlens"]["kind"] == "final" and final["memlens"]["trace_from_step"] == 30
    assert sorted(set(_alloc_lines(final))) == list(range(31, 41))


def test_a_ring_the_caller_made_too_small_is_said_to_have_wrapped(gpu, tmp_path):
    out = tmp_path / "snaps"
    with pytest.warns(memlens.MemlensWarning, match="max_entries="):
        with memlens.record(out, every=4, max_entries=10_000, leak_check=False, publish=False):
            for step in range(1, 9):
                for _ in range(1500):  # 3,000 events: alloc, free_completed
                    gpu.free(gpu.alloc(512, line=step))
                memlens.step()
    snap = pickle.loads((out / "snapshot.step8.pickle").read_bytes())
    assert snap["memlens"]["sized_by"] == "user" and snap["memlens"]["ring_wrapped"] is True
    assert _alloc_lines(snap).count(5) < 1500  # the start of the first of the four was lost


def test_a_window_beyond_the_largest_ring_warns_once_with_what_it_holds(gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(_capture, "MAX_ENTRIES", 20_000)
    with pytest.warns(memlens.MemlensWarning, match=r"holds its last 6 steps .* max_entries=45,0") as caught:
        with memlens.record(tmp_path / "s", every=10, leak_check=False, publish=False) as rec:
            for _ in range(12):
                for _ in range(1500):  # 3,000 events: alloc, free_completed
                    gpu.free(gpu.alloc(512))
                memlens.step()
    assert len([w for w in caught if "holds its last" in str(w.message)]) == 1
    assert rec.max_entries == 20_000


def test_one_snapshot_per_step_serves_the_leak_watch_and_the_dump(gpu, tmp_path):
    # Growing steps 4 and 5 start a streak whose baseline snapshot (at its
    # second rise, 8 MiB up) falls on a dump step: one _snapshot() call serves both.
    with memlens.record(tmp_path / "snaps", every=5, publish=False) as rec:
        for step in range(1, 6):
            if step >= 4:
                gpu.alloc(4 * MIB)
            before = gpu.snapshots_taken
            memlens.step()
        assert gpu.snapshots_taken - before == 1 and rec._leak_points
    assert (tmp_path / "snaps" / "snapshot.step5.pickle").exists()


# -- the leak alarm ------------------------------------------------------------


def test_leak_rule_fires_once_after_warmup_and_a_streak():
    rule = LeakRule(warmup=3, steps=5, min_bytes=8 * MIB)
    events = [rule.update(100 * MIB + i * 4 * MIB) for i in range(12)]
    # Steps 1-3 are warm-up; step 4 starts the streak, step 5 (its second
    # rise) takes the baseline, step 8 completes 5 growing steps.
    assert events[4] == BASELINE
    assert events[5] == MIDPOINT  # a third snapshot, so the sites are judged on three points
    assert events[7] == ALARM
    assert [e for i, e in enumerate(events) if i not in (4, 5, 7)] == [None] * 9
    assert rule.growth() == 20 * MIB and rule.per_step() == 4 * MIB


def test_leak_rule_ignores_flat_noisy_and_small_growth():
    flat = LeakRule()
    assert all(flat.update(50 * MIB) is None for _ in range(30))
    noisy = LeakRule()
    assert ALARM not in [noisy.update(50 * MIB + (i % 2) * 30 * MIB) for i in range(30)]
    small = LeakRule(min_bytes=8 * MIB)
    assert ALARM not in [small.update(50 * MIB + i * 1024) for i in range(30)]
    interrupted = LeakRule()
    seq = [10, 10, 10, 20, 30, 40, 10, 50, 60, 70, 80, 90]
    # Three rises, then everything given back (10): the watch ends; a new one
    # begins at 50 and reaches five rises at 90.
    assert ALARM not in [interrupted.update(v * MIB) for v in seq[:-1]]
    assert interrupted.update(seq[-1] * MIB) == ALARM
    once = LeakRule()
    # One rise that stays (a cache filled once) is no leak, however long it stays.
    assert ALARM not in [once.update((50 if i < 10 else 90) * MIB) for i in range(500)]
    with pytest.raises(ValueError):
        LeakRule(steps=1)


def test_a_figure_that_goes_up_and_down_takes_no_snapshot():
    # A buffer kept every other step: each rise is given back at the next
    # step. The watch begins and ends; its first snapshot waits for a second
    # rise, so none is taken (each converts the whole trace ring).
    rule = LeakRule()
    assert [rule.update((50 + (i % 2) * 4) * MIB) for i in range(40)] == [None] * 40
    # The memory left after each step of the CS336-style model of
    # bench/workloads.py, measured on an H200: it wanders within 2.4 MB, with
    # runs of rises; no snapshot (each converted the whole ring: 3 ms a step).
    walk = [0, 819200, 1015808, 1736704, 1867776, 2359296, 1114112, 2457600, 2326528, 1343488,
            1835008, 1835008, 229376, 1343488, 622592, 229376, 1212416, 851968, 491520, 1966080,
            1474560, 491520, 229376, 720896, 1212416, 1474560, 491520, 1245184, 491520, 983040]
    wander = LeakRule()
    assert [wander.update(500 * MIB + b) for b in walk] == [None] * len(walk)
    # A rule that fires after 3 rises still needs three points: its first
    # snapshot is at the first rise.
    short = LeakRule(warmup=0, steps=3, min_bytes=0)
    assert [short.update(v * MIB) for v in (10, 20, 30, 40)] == [None, BASELINE, MIDPOINT, ALARM]


def test_leak_rule_fires_on_growth_every_few_steps():
    # A loop that keeps 2 MiB every 10th step: flat steps between the rises
    # neither count nor end the watch.
    rule = LeakRule(warmup=3, steps=5, min_bytes=8 * MIB)
    figures = [100 * MIB + (i // 10) * 2 * MIB for i in range(1, 101)]
    events = {i + 1: e for i, e in enumerate(rule.update(f) for f in figures) if e}
    assert events == {20: BASELINE, 30: MIDPOINT, 50: ALARM}
    assert rule.rises == 5 and rule.span() == 41 and rule.growth() == 10 * MIB
    # Noise on top (a buffer that comes and goes) does not end it either, as
    # long as the figure stays above where the watch began.
    noisy = LeakRule(warmup=3, steps=5, min_bytes=8 * MIB)
    noise = [f + (3 * MIB if i % 7 == 0 else 0) for i, f in enumerate(figures)]
    assert ALARM in [noisy.update(f) for f in noise]


def test_leak_message_says_how_often_it_grew():
    rule = LeakRule(warmup=3, steps=5, min_bytes=8 * MIB)
    for i in range(1, 51):
        rule.update(100 * MIB + (i // 10) * 2 * MIB)
    text = _capture.leak_message(rule, [], 50, 10)
    assert "grew in 5 of the last 41 steps and never fell back (+10.00 MiB" in text, text
    assert _capture.leak_alarm_line(rule, []).endswith("over 41 steps")


def test_leak_message_names_what_holds_each_site():
    rule = LeakRule(warmup=3, steps=5, min_bytes=8 * MIB)
    for i in range(1, 20):
        rule.update(100 * MIB + i * 4 * MIB)
    row = {"site": "/proj/train.py:42", "function": "train", "bytes": 16 * MIB, "count": 4,
           "bytes_per_step": 4 * MIB}
    held = "train() local 'kept' [local] at train.py:50: 4 tensors, 16.0 MiB via list of 4 tensors"
    text = _capture.leak_message(rule, [row], 19, 3, {"/proj/train.py:42": [held]})
    assert f"\n      held by {held}" in text, text
    # No holder found: the site's line alone, as before.
    assert "held by" not in _capture.leak_message(rule, [row], 19, 3, {})


def test_a_failing_holder_search_costs_the_alarm_only_its_holder_line(monkeypatch):
    import memlens._why as why_module

    def broken(*_a, **_k):
        raise RuntimeError("no allocator history")

    monkeypatch.setattr(why_module, "why", broken)
    rows = [{"site": "/proj/train.py:42"}, {"site": "<backward pass>"}]
    assert _capture.holders_of_sites(rows) == {}


def test_leak_alarm_names_the_site_that_grows(gpu, tmp_path):
    kept = []
    with memlens.record(tmp_path / "snaps") as rec:
        with pytest.warns(memlens.LeakWarning) as caught:
            for step in range(15):
                tmp = gpu.alloc(64 * MIB, file="/home/me/train.py", line=10, name="forward")
                kept.append(gpu.alloc(4 * MIB, file="/home/me/train.py", line=42, name="validate"))
                gpu.free(tmp)
                memlens.step()
        assert len(caught) == 1  # warned once, though it kept growing
        text = str(caught[0].message)
        assert "/home/me/train.py:42 in validate" in text
        assert "train.py:10" not in text
        assert "+4.00 MiB a step" in text
        assert caught[0].filename == __file__  # points at the caller's memlens.step()
        assert rec.leak_sites[0]["site"] == "/home/me/train.py:42"
        # Created during the 3 steps after the baseline (taken at the watch's second rise).
        assert rec.leak_sites[0]["bytes"] == 3 * 4 * MIB
        assert rec.leak_alarm.startswith("+4.00 MiB/step over 5 steps")
        assert "train.py:42" in rec.leak_alarm
        rec._publisher._last = None
        memlens.step()
        assert read_live(tmp_path)["leak_alarm"] == rec.leak_alarm


def test_the_holders_are_written_beside_the_snapshot_and_read_by_leaks(gpu, tmp_path, monkeypatch, memlens_exe):
    """Issue 32: what the alarm found holding a site goes beside every
    snapshot dumped after it (``<snapshot>.holders.json``), and `memlens
    leaks` (the CLI and ``memlens.load().leaks()``) shows it."""
    import json
    import subprocess

    import memlens._why as why_module

    held = memlens.Holder(kind="global", path="train.kept", tensors=5, bytes=20 * MIB, via=("list",))
    asked = []

    def fake_why(site=None, **_k):
        asked.append(site)
        return [held]

    monkeypatch.setattr(why_module, "why", fake_why)
    kept = []
    with memlens.record(tmp_path / "snaps", every=3) as rec:
        with pytest.warns(memlens.LeakWarning) as caught:
            for _ in range(15):
                kept.append(gpu.alloc(4 * MIB, file="/home/me/train.py", line=42, name="validate"))
                memlens.step()
    assert asked == ["/home/me/train.py:42"]
    # The fake trace has no step markers: the leak is found across the
    # periodic snapshots; the newest holders file beside them is read.
    periodic = [p for p in rec.snapshots if ".step" in p]
    assert "held by train.kept [global]: 5 tensors, 20.0 MiB via list" in str(caught[0].message)
    final = rec.snapshots[-1]
    doc = json.loads(open(final + _capture.HOLDERS_SUFFIX).read())
    assert doc["format"] == "memlens-holders/1"
    assert doc["sites"] == {"/home/me/train.py:42": [held.to_dict()]}
    assert os.path.exists(periodic[-1] + _capture.HOLDERS_SUFFIX)
    assert not os.path.exists(periodic[0] + _capture.HOLDERS_SUFFIX)  # dumped before the alarm
    out = subprocess.run([memlens_exe, "leaks", *periodic], capture_output=True, text=True, check=True).stdout
    assert "held by train.kept [global]: 5 tensors, 20.00 MiB via list" in out, out
    found = memlens.load(periodic[0]).leaks(*periodic[1:])["leaks"]
    assert found[0]["holders"][0]["path"] == "train.kept", found[0]


def test_allocator_noise_that_grows_the_total_is_not_a_leak(gpu, tmp_path):
    # The total allocated grows for many steps in a row, but only because one
    # buffer is replaced by a larger one each step (irregularly, as varying
    # shapes and allocator rounding do): no site keeps more tensors, so the
    # rules of `memlens leaks` see no leak and the alarm stays silent.
    held = gpu.alloc(8 * MIB, file="/home/me/train.py", line=20, name="collate")
    sizes = [9, 10, 11, 12, 13, 14, 20, 21, 22, 23, 40, 41]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with memlens.record(tmp_path / "snaps") as rec:
            for mib in sizes:
                tmp = gpu.alloc(64 * MIB, file="/home/me/train.py", line=10, name="forward")
                gpu.free(tmp)
                gpu.free(held)
                held = gpu.alloc(mib * MIB, file="/home/me/train.py", line=20, name="collate")
                memlens.step()
        assert rec.leak_alarm is None and rec.leak_sites == []


def test_healthy_training_never_warns(gpu, tmp_path):
    params = gpu.alloc(100 * MIB, file="/home/me/model.py", line=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with memlens.record(tmp_path / "snaps"):
            for step in range(30):
                acts = [gpu.alloc(8 * MIB, file="/home/me/train.py", line=7) for _ in range(4)]
                for a in acts:
                    gpu.free(a)
                memlens.step()
    assert params in gpu.blocks[0]
    # No baseline snapshots were needed: the retained memory never grew.
    assert gpu.snapshots_taken == 1  # the final one


def test_leak_check_can_be_turned_off(gpu, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with memlens.record(tmp_path / "snaps", leak_check=False):
            for _ in range(15):
                gpu.alloc(16 * MIB)
                memlens.step()


# -- the OOM observer ----------------------------------------------------------


def test_oom_writes_a_snapshot_and_explains_before_the_exception(gpu, tmp_path, capsys):
    out = tmp_path / "snaps"
    with memlens.record(out):
        gpu.alloc(30 * MIB, file="/home/me/train.py", line=5)
        with pytest.raises(fake_torch.FakeOutOfMemoryError):
            gpu.oom(2 * 1024 * MIB)
        err = capsys.readouterr().err
        oom = out / "snapshot.oom.pickle"
        assert oom.exists()
        assert "memlens: CUDA out of memory on device 0: 2.00 GiB requested, 1.00 MiB free" in err
        assert str(oom) in err
        assert f"memlens oom {oom}" in err or "explain" in err.lower()
        snap = pickle.loads(oom.read_bytes())
        assert snap["segments"][0]["blocks"][0]["size"] == 30 * MIB
        # Further OOMs: two more snapshots, then one line.
        for _ in range(4):
            with pytest.raises(fake_torch.FakeOutOfMemoryError):
                gpu.oom(MIB)
        err = capsys.readouterr().err
        assert (out / "snapshot.oom2.pickle").exists() and (out / "snapshot.oom3.pickle").exists()
        assert not (out / "snapshot.oom4.pickle").exists()
        assert err.count("only the first 3 are recorded") == 1


def test_oom_observer_is_attached_once_and_idle_when_not_recording(gpu, tmp_path, capsys):
    with memlens.record(tmp_path / "a"):
        pass
    with memlens.record(tmp_path / "b"):
        pass
    assert len(gpu.observers) == 1
    with pytest.raises(fake_torch.FakeOutOfMemoryError):
        gpu.oom(MIB)
    assert capsys.readouterr().err == ""
    assert not list(tmp_path.glob("*/snapshot.oom.pickle"))


def test_oom_explanation_goes_through_one_function(gpu, tmp_path, capsys, monkeypatch):
    from memlens import _native

    monkeypatch.setattr(_native, "explain_oom_file", lambda path: f"EXPLAINED {os.path.basename(path)}", raising=False)
    with memlens.record(tmp_path / "snaps"):
        with pytest.raises(fake_torch.FakeOutOfMemoryError):
            gpu.oom(MIB)
    assert "EXPLAINED snapshot.oom.pickle" in capsys.readouterr().err


# -- what grew between two snapshots (Rust's diff) ---------------------------------


def test_grown_sites_groups_by_innermost_user_frame():
    from memlens import _native
    from memlens._diff import grown_sites

    # The one rulebook (Rust, memlens::frames) decides what is user code.
    def is_user_file(name: str) -> bool:
        return _native.frame_kind(name) == "user"

    assert not is_user_file("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py")
    assert not is_user_file("/usr/lib/python3.11/threading.py")
    assert not is_user_file("/work/pytorch/torch/autograd/__init__.py")
    assert is_user_file("/home/me/train.py")
    assert not is_user_file("Objects/methodobject.c")
    assert not is_user_file("thread48.o")
    assert not is_user_file("/tmp/torchinductor_me/ab/cab12.py")
    assert is_user_file("/tmp/ipykernel_4123/2771456321.py")

    gpu = fake_torch.FakeGPU()
    keep = gpu.alloc(10 * MIB, file="/home/me/a.py", line=1)
    gone = gpu.alloc(3 * MIB, file="/home/me/b.py", line=2)
    before = gpu.snapshot()
    gpu.free(gone)
    gpu.alloc(5 * MIB, file="/home/me/c.py", line=3, name="leaky")
    gpu.alloc(2 * MIB, file="/home/me/c.py", line=3, name="leaky")
    after = gpu.snapshot()
    grown = grown_sites(before, after)
    assert [(r["site"], r["function"], r["bytes"], r["count"]) for r in grown] == [
        ("/home/me/c.py:3", "leaky", 7 * MIB, 2)
    ]
    assert keep in gpu.blocks[0]


def test_the_device_figures_are_written_beside_every_snapshot(gpu, tmp_path):
    """Issue 31 item 5: a snapshot stores neither the device's total nor the
    per-process cap; the recorder writes them beside each snapshot
    (``<snapshot>.device.json``) for ``tune``/``simulate`` to use."""
    import json

    gpu.memory_fraction = 0.05
    with memlens.record(tmp_path / "snaps", every=2) as rec:
        for _ in range(4):
            gpu.alloc(4 * MIB)
            memlens.step()
    assert rec.snapshots
    for snap in rec.snapshots:
        doc = json.loads(open(snap + _capture.DEVICE_SUFFIX).read())
        assert doc["format"] == "memlens-device/1"
        (row,) = doc["devices"]
        assert row["device"] == 0 and row["total_memory"] == 80 << 30
        assert row["memory_fraction"] == 0.05
        assert 0 < row["free_memory"] <= 80 << 30


def test_the_device_file_names_the_gpu_s_multiprocessors(gpu, tmp_path):
    """How reduction kernels split their sums (their staging buffers, which
    `memlens fit` computes at other batch sizes) depends on the GPU's
    multiprocessors: written when torch gives them, left out when not."""
    import json
    import types

    import torch

    torch.cuda.get_device_properties = lambda d=None: types.SimpleNamespace(
        total_memory=80 << 30, multi_processor_count=108, max_threads_per_multi_processor=2048
    )
    with memlens.record(tmp_path / "snaps") as rec:
        gpu.alloc(MIB)
    (row,) = json.loads(open(rec.snapshots[-1] + _capture.DEVICE_SUFFIX).read())["devices"]
    assert row["multiprocessors"] == 108 and row["threads_per_multiprocessor"] == 2048
    torch.cuda.get_device_properties = lambda d=None: types.SimpleNamespace(total_memory=80 << 30)
    with memlens.record(tmp_path / "plain") as rec:
        gpu.alloc(MIB)
    (row,) = json.loads(open(rec.snapshots[-1] + _capture.DEVICE_SUFFIX).read())["devices"]
    assert "multiprocessors" not in row


def test_no_device_file_when_torch_cannot_tell(gpu, tmp_path):
    """A torch without the device's properties costs only the file."""
    import torch

    del torch.cuda.get_device_properties
    with memlens.record(tmp_path / "snaps") as rec:
        gpu.alloc(MIB)
    assert rec.snapshots
    assert not any(os.path.exists(p + _capture.DEVICE_SUFFIX) for p in rec.snapshots)


def test_the_analysis_reads_how_memlens_recorded_and_blames_no_ring(gpu, tmp_path):
    # A block allocated in each step and freed in the next: every periodic
    # snapshot after the first frees one block allocated before its trace.
    # The analysis (Rust) reads the "memlens" key: the trace was cut on
    # purpose, so no advice to raise max_entries (issue 35).
    out = tmp_path / "snaps"
    kept = None
    with memlens.record(out, every=4, leak_check=False, publish=False):
        for step in range(1, 9):
            blk = gpu.alloc(MIB, line=step)
            if kept is not None:
                gpu.free(kept)
            kept = blk
            memlens.step()
    late = [w for w in memlens.load(str(out / "snapshot.step8.pickle")).summary()["warnings"]
            if w.startswith("the trace does not start")]
    assert len(late) == 1 and "memlens.record began this trace after step 4" in late[0], late
    assert "max_entries" not in late[0]


def test_an_alloc_conf_set_too_late_warns_at_start_and_is_kept_for_the_analysis(gpu, tmp_path, monkeypatch):
    # The fake allocator runs with no settings (its snapshot's
    # PYTORCH_CUDA_ALLOC_CONF is ""), as torch's does when the variable was
    # set after CUDA's first allocation.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    out = tmp_path / "snaps"
    with pytest.warns(memlens.MemlensWarning, match="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python"):
        with memlens.record(out, leak_check=False, publish=False):
            gpu.alloc(MIB)
            memlens.step()
    snap = pickle.loads((out / "snapshot.pickle").read_bytes())
    assert snap["memlens"]["alloc_conf_env"] == "expandable_segments:True"
    # The analysis makes it a capture check with the same fix.
    checks = memlens.load(str(out / "snapshot.pickle")).summary()["capture_checks"]
    assert [c["check"] for c in checks] == ["alloc_conf_not_applied"], checks
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python" in checks[0]["fix"]


def test_an_applied_or_absent_alloc_conf_says_nothing(gpu, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", memlens.MemlensWarning)
        with memlens.record(tmp_path / "a", leak_check=False, publish=False):
            memlens.step()
    snap = pickle.loads((tmp_path / "a" / "snapshot.pickle").read_bytes())
    assert snap["memlens"]["alloc_conf_env"] is None


def test_what_is_outside_pytorch_when_recording_begins_goes_in_the_device_file(gpu, tmp_path, monkeypatch):
    # NVML's view of this process, faked: 600 MiB at start over what PyTorch
    # reserved (the CUDA context), then 100 MiB more (say NCCL's buffers).
    extra = {"outside": 600 * MIB}

    def nvml(cuda, d):
        return {"process_used_memory": gpu.reserved[d] + extra["outside"], "nvml_used_memory": 0}

    monkeypatch.setattr(_capture, "_nvml_figures", nvml)
    out = tmp_path / "snaps"
    with memlens.record(out, leak_check=False, publish=False):
        gpu.alloc(MIB)
        extra["outside"] = 700 * MIB
        memlens.step()
    doc = json.loads((out / "snapshot.pickle.device.json").read_text())
    row = doc["devices"][0]
    assert row["outside_pytorch_at_start"] == 600 * MIB
    assert row["process_used_memory"] - row["reserved_memory"] == 700 * MIB


def test_free_stacks_with_hf_gradient_checkpointing_warn_at_start(gpu, tmp_path):
    class CheckpointedModel:
        is_gradient_checkpointing = True

        def named_modules(self):
            return []

    with pytest.warns(memlens.MemlensWarning, match='context="alloc"'):
        with memlens.record(tmp_path / "a", context="all", model=CheckpointedModel(),
                            leak_check=False, publish=False):
            gpu.alloc(MIB)
            memlens.step()
    # The default context, or no checkpointing: nothing said.
    memlens._capture._warned.discard("context-checkpointing")
    with warnings.catch_warnings():
        warnings.simplefilter("error", memlens.MemlensWarning)
        with memlens.record(tmp_path / "b", model=CheckpointedModel(), leak_check=False, publish=False):
            gpu.alloc(MIB)
            memlens.step()
