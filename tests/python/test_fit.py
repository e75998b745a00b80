"""``memlens.fit`` is ``memlens fit``: the same library call, the same JSON."""

import json
import os
import subprocess
import sys

import pytest

import memlens

HERE = os.path.dirname(os.path.abspath(__file__))
FIT = os.path.join(HERE, "..", "corpus", "fit")


def probes(w):
    return [os.path.join(FIT, f"{w}.b2.pickle.zst"), os.path.join(FIT, f"{w}.b4.pickle.zst")]


def test_fit_predicts_the_measured_peak_within_three_percent():
    truth = json.load(open(os.path.join(FIT, "fit_truth.json")))
    r = memlens.fit(probes("hf_gpt2"), [2, 4], batch=16, limit="3GiB")
    want = truth["workloads"]["hf_gpt2"]["measured"]["16"]["max_reserved"]
    got = r["predicted"]["peak_reserved_bytes"]
    assert abs(got / want - 1) <= 0.03
    assert r["predicted"]["fits"] is True
    assert r["limit_bytes"] == 3 << 30
    assert r["largest_batch"] >= 16


def test_fit_with_a_missing_batch_size_is_an_error():
    with pytest.raises(memlens.MemlensError):
        memlens.fit(probes("gpt"), [2])


def test_fit_checkpoint_is_the_cli_s_answer_and_near_the_gpu(memlens_exe):
    rec = os.path.join(FIT, "checkpoint", "vit.pickle.zst")
    truth = json.load(open(os.path.join(FIT, "checkpoint", "truth.json")))
    r = memlens.fit(rec, checkpoint="EncoderBlock", limit="1GiB")
    want = truth["workloads"]["vit"]["checkpointed"]["max_allocated"]
    assert abs(r["predicted"]["peak_allocated_bytes"] / want - 1) <= 0.10
    assert r["predicted"]["peak_allocated_bytes"] < r["recorded"]["peak_allocated_bytes"]
    assert r["predicted"]["fits"] is True
    assert r["basis"]["module"] == "EncoderBlock"
    # The CLI's JSON is the same document.
    out = subprocess.run(
        [memlens_exe, "fit", rec, "--checkpoint", "EncoderBlock", "--limit", "1GiB", "--json"],
        capture_output=True, text=True, check=True,
    )
    doc = json.loads(out.stdout)
    doc.pop("schema", None)
    assert doc == r


def test_fit_checkpoint_of_a_module_that_never_ran_is_an_error():
    with pytest.raises(memlens.MemlensError, match="EncoderBlock"):
        memlens.fit(os.path.join(FIT, "checkpoint", "vit.pickle.zst"), checkpoint="NoSuchBlock")


class _StubTrace:
    """What memlens.trace_step returns, for a step whose size is known: 100
    MiB of parameters kept, then per step ``batch`` activations of 10 MiB
    made and freed (a fake trace's format, with no torch)."""

    MIB = 1 << 20

    def __init__(self, batch):
        entries, addr, clock = [], 0x7F0000000000, [0]

        def event(action, a, size):
            clock[0] += 1
            frames = [{"filename": "train.py", "line": 10, "name": "step"}] if action == "alloc" else []
            entries.append({"action": action, "addr": a, "size": size, "stream": 0, "time_us": clock[0],
                            "frames": frames})

        event("alloc", addr, 100 * self.MIB)
        addr += 100 * self.MIB
        for _ in range(2):
            acts = []
            for _ in range(batch):
                event("alloc", addr, 10 * self.MIB)
                acts.append(addr)
                addr += 10 * self.MIB
            for a in reversed(acts):
                event("free_requested", a, 10 * self.MIB)
                event("free_completed", a, 10 * self.MIB)
        self.snapshot = {"segments": [], "device_traces": [entries], "external_annotations": [],
                         "memlens": {"schema": "memlens-fake-trace/1", "steps": 2, "precision": "fp32",
                                     "workspace_bytes": 0, "unknown_values": 0, "torch": "stub"}}

    def save(self, path):
        import pickle

        with open(path, "wb") as f:
            pickle.dump(self.snapshot, f)
        return path


def test_predict_replays_the_trace_and_searches_the_largest_batch(monkeypatch, tmp_path):
    import memlens._trace as trace

    built = []

    def stub_trace_step(build, step, steps=2, precision=None, world_size=None):
        batch = build()
        built.append(batch)
        return _StubTrace(batch)

    monkeypatch.setattr(trace, "trace_step", stub_trace_step)
    saved = tmp_path / "step.pickle"
    r = memlens.predict(lambda b: b, lambda s: None, batch=4, limit="300MiB", largest=True, save=saved)
    # 100 MiB + 4 x 10 MiB, each tensor its own segment: 140 MiB.
    assert r["predicted"]["peak_allocated_bytes"] == 140 << 20
    assert r["predicted"]["peak_reserved_bytes"] == 140 << 20
    assert r["predicted"]["fits"] is True
    assert r["basis"]["source"] == "fake tensors"
    assert r["batch"] == 4
    # The least limit steered the search; it is not an answer to run under.
    assert "least_limit_bytes" not in r["predicted"]
    # 100 + 10 b <= 300 MiB: batch 20. Batches 4 and 8 draw the line, which
    # names 20; 20 fits and 21 does not: four traces (bisecting took eight).
    assert r["largest_batch"] == 20
    assert r["batches_traced"] == sorted(set(built))
    assert built == [4, 8, 20, 21]
    # The trace at the batch asked is kept, and `memlens fit` replays it.
    again = memlens.fit([str(saved)], limit="300MiB")
    assert again["predicted"] == r["predicted"]


def test_predict_config_traces_the_config_s_step_and_replays_it(monkeypatch):
    # The build and step come from memlens._hf (run on real torch and
    # transformers in tests/gpu/fake_step.py cfg-<family>: the same traces
    # as the harness's own build, byte for byte); here a stub stands in.
    import memlens._hf as hf
    import memlens._trace as trace

    asked = {}

    def stub_hf_step(config, seq=512, optimizer="adamw"):
        asked.update(config=config, seq=seq, optimizer=optimizer)
        return (lambda b: b), (lambda s: None)

    monkeypatch.setattr(hf, "hf_step", stub_hf_step)
    monkeypatch.setattr(trace, "trace_step", lambda build, step, steps=2, precision=None, world_size=None:
                        _StubTrace(build()))
    r = memlens.predict_config({"model_type": "llama"}, batch=4, seq=128, optimizer="sgd", limit="300MiB",
                               largest=True)
    assert asked == {"config": {"model_type": "llama"}, "seq": 128, "optimizer": "sgd"}
    assert r["predicted"]["peak_allocated_bytes"] == 140 << 20
    assert (r["batch"], r["largest_batch"], r["seq"], r["optimizer"]) == (4, 20, 128, "sgd")


def test_an_optimizer_memlens_cannot_build_is_named():
    import memlens._hf as hf

    with pytest.raises(ValueError, match="adamw-fused"):
        hf.hf_step({"model_type": "llama"}, optimizer="lion")


def test_predict_says_what_it_needs():
    with pytest.raises(ValueError):
        memlens.predict(lambda: None, lambda s: None, largest=True, limit="1GiB")


def test_a_fake_trace_is_replayed_by_fit_and_refused_by_load():
    path = os.path.join(FIT, "fake", "gpt.fp32.pickle.zst")
    r = memlens.fit(path, limit="2GiB")
    assert r["predicted"]["fits"] is True
    assert r["basis"]["source"] == "fake tensors"
    with pytest.raises(memlens.MemlensError, match="traced with fake tensors"):
        memlens.load(path)


def _search(peak, limit, start, max_batch=1 << 14):
    """Runs the largest-batch search on a peak curve; the answer and the
    batches traced, in order."""
    from memlens._fit import _largest_batch

    traced = []

    def measure(b):
        traced.append(b)
        return peak(b) <= limit, peak(b), peak(b), None

    return _largest_batch(measure, start, max_batch, limit), traced


def _truth(peak, limit, max_batch):
    best = None
    for b in range(1, max_batch + 1):
        if peak(b) > limit:
            break
        best = b
    return best


def test_the_largest_batch_is_the_one_a_scan_finds_on_any_curve():
    # The peaks only choose which batch to trace; the answer is a batch that
    # fits beside one that does not, whatever the curve's shape.
    import random

    rng = random.Random(7)
    for _ in range(3000):
        fixed, per = rng.randrange(0, 5 << 30), rng.randrange(1 << 20, 512 << 20)
        bend = rng.choice([0, 0, rng.randrange(0, 8 << 20)])
        steps = rng.choice([1, 2 << 20, 20 << 20])
        limit = rng.randrange(1 << 30, 80 << 30)
        max_batch = rng.choice([1 << 14, 64, 1000])

        def peak(b):
            return (fixed + per * b + bend * b * b) // steps * steps

        start = rng.choice([1, 2, 4, 8, 16, 64])
        answer, traced = _search(peak, limit, start, max_batch)
        assert answer == _truth(peak, limit, max_batch), (fixed, per, bend, limit, start, traced)
        assert len(traced) == len(set(traced))


def test_a_straight_peak_costs_five_traces_where_bisection_took_nine():
    # A step's peak grows about linearly with the batch: from batch 2, the
    # line through 2 and 4 points at 19, traced at 16 first (no further than
    # four times the largest batch traced), then the edge and the batch past
    # it. Doubling and bisecting traced 2, 4, 8, 16, 32, 24, 20, 18, 19.
    def peak(b):
        return 1_000_000_000 + 60_000_000 * b

    answer, traced = _search(peak, 2_194_669_568, 2)
    assert answer == 19 and traced == [2, 4, 16, 19, 20]
    # Past max_batch the answer is max_batch itself (doubling used to stop
    # at the last power of two below it, 512), four times further a trace.
    answer, traced = _search(peak, 100 << 30, 2, max_batch=1000)
    assert answer == 1000 and traced == [2, 4, 16, 64, 256, 1000]


def test_a_peak_far_from_a_line_falls_back_to_bisecting():
    # Flat, then a wall at 37: lines through flat points say nothing.
    def peak(b):
        return 1 << 30 if b < 37 else 10 << 30

    answer, traced = _search(peak, 2 << 30, 2)
    assert answer == 36
    assert len(traced) <= 12


def test_no_batch_fits_when_batch_one_does_not():
    answer, traced = _search(lambda b: (5 << 30) + b, 1 << 30, 8)
    assert answer is None
    assert traced[-1] == 1


def test_the_search_on_the_h200_s_peaks_traces_what_it_traced_there():
    # tests/gpu/fake_largest.py's rows: each trace the search made on the
    # GPU host, in order, with its answer, peaks and least limit. Fed those
    # answers, the search asks for the same batches in the same order and
    # names the same batch: five traces on four models, seven on the ViT,
    # whose peak up to batch ~12 is its optimizer step's (bisecting from
    # batch 2 took nine; the line to the limit less the reserved peaks'
    # cache, seven on the ResNet).
    import json
    import os

    from memlens._fit import _largest_batch

    path = os.path.join(os.path.dirname(__file__), "..", "corpus", "fit", "fake", "predict_largest.json")
    with open(path) as f:
        rows = json.load(f)
    assert len(rows) == 5
    for row in rows:
        recorded = {b: (fits, allocated, reserved, least) for b, fits, allocated, reserved, least, _ in row["traces"]}
        asked = []

        def measure(b):
            asked.append(b)
            return recorded[b]

        answer = _largest_batch(measure, 2, 1 << 14, row["cap"])
        assert answer == row["predicted_largest"], row["workload"]
        assert asked == [t[0] for t in row["traces"]], row["workload"]
        assert len(asked) == (7 if row["workload"] == "vit" else 5), row["workload"]
        assert row["true_largest"] - answer in (0, 1), row["workload"]


def _curves():
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "corpus", "fit", "fake", "peak_curves.json")
    with open(path) as f:
        return json.load(f)["workloads"]


def _search_curve(batches, limit, least=True):
    """The search over a traced curve ([batch, allocated, reserved, least
    limit] rows), a step fitting where its least limit is at most
    ``limit``; ``least=False`` hides the least limits (the search's line
    then takes the reserved peaks)."""
    from memlens._fit import _largest_batch

    rows = {b: (a, r, n) for b, a, r, n in batches}
    asked = []

    def measure(b):
        asked.append(b)
        a, r, n = rows[b]
        return n <= limit, a, r, (n if least else None)

    return _largest_batch(measure, 2, len(rows), limit), asked


def test_the_least_limit_line_finds_the_edge_in_five_traces_on_four_h200_curves():
    # The five workloads' steps traced at every batch from 1 to 30 on the
    # H200: under the caps of truth.json the search traces 2, 4, 16 and the
    # two batches at the edge on four. The ViT's peak is its optimizer
    # step's up to batch ~12 (flat lines: doubled past them), seven traces.
    # Its line once took the reserved peaks, whose cache (and, on the
    # ResNet, largest cuDNN workspaces) a step under a cap does without:
    # seven traces on the ResNet, nine on the ViT.
    expected = {"gpt": [2, 4, 16, 19, 18], "hf_gpt2": [2, 4, 16, 19, 18], "resnet_amp": [2, 4, 16, 22, 23],
                "t5": [2, 4, 16, 19, 18], "vit": [2, 4, 8, 16, 28, 24, 25]}
    for name, w in _curves().items():
        rows = {b: n for b, _, _, n in w["batches"]}
        truth = max(b for b, n in rows.items() if n <= w["cap"])
        answer, asked = _search_curve(w["batches"], w["cap"])
        assert answer == truth, name
        assert asked == expected[name], (name, asked)


def test_the_least_limit_line_is_right_under_any_cap_and_costs_fewer_traces():
    # Every cap between two batches' least limits on the five curves (110
    # searches): the answer is the batch a scan finds, and the least limits'
    # line traces fewer batches than the reserved peaks' does (5.05 on
    # average, at worst 9).
    with_least, without = [], []
    for name, w in _curves().items():
        rows = {b: n for b, _, _, n in w["batches"]}
        for k in range(5, 29):
            if rows[k + 1] <= rows[k]:
                continue
            cap = (rows[k] + rows[k + 1]) // 2
            answer, asked = _search_curve(w["batches"], cap)
            fits = [b for b, n in rows.items() if n <= cap]
            assert answer in fits and (answer == 30 or rows[answer + 1] > cap), (name, cap, asked)
            with_least.append(len(asked))
            without.append(len(_search_curve(w["batches"], cap, least=False)[1]))
    assert len(with_least) == 110
    assert sum(with_least) < sum(without)
    assert sum(with_least) / len(with_least) < 5.1 and max(with_least) <= 9


def test_a_ddp_rank_s_trace_says_what_it_is_and_what_it_cannot_hold(tmp_path):
    # memlens.trace_step(..., world_size=2) writes the job's size and the
    # comm hooks it ran without (tests/gpu/fake_ddp.py traces real DDP jobs
    # that way on the GPU host); memlens fit says both.
    trace = _StubTrace(4)
    trace.snapshot["memlens"].update(world_size=2, comm_hooks_ignored=1, ddp_bucket_bytes=109_740_032)
    r = memlens.fit([trace.save(str(tmp_path / "rank.pickle"))])
    assert r["basis"]["world_size"] == 2
    assert any("one rank of a DistributedDataParallel job of 2" in w for w in r["warnings"])
    # One set of buckets, the most a run of the same job held beyond it.
    assert any("up to 104.66 MiB more (one set of DDP's gradient buckets)" in w for w in r["warnings"])
    assert any("1 DDP comm hook(s)" in w for w in r["warnings"])
    # Whether it fits counts that set: 140 MiB traced, 104.66 MiB more in
    # the runs that held it, under a 200 MiB cap: not judged to fit.
    capped = memlens.fit([str(tmp_path / "rank.pickle")], limit="200MiB")
    assert capped["predicted"]["peak_allocated_bytes"] == 140 << 20
    assert capped["predicted"]["fits"] is False
    assert capped["limit_bytes"] == 200 << 20
    assert memlens.fit([str(tmp_path / "rank.pickle")], limit="250MiB")["predicted"]["fits"] is True
    # A step on one GPU: neither.
    plain = memlens.fit([_StubTrace(4).save(str(tmp_path / "one.pickle"))])
    assert "world_size" not in plain["basis"]
    assert not any("DistributedDataParallel" in w for w in plain["warnings"])


def test_one_set_of_buckets_is_every_gradient_ddp_reduces():
    from memlens._fake_ddp import _bucket_bytes

    class P:
        def __init__(self, n, size, grad=True):
            self.n, self.size, self.requires_grad = n, size, grad

        def numel(self):
            return self.n

        def element_size(self):
            return self.size

    class Module:
        def parameters(self):
            return [P(1000, 4), P(10, 2), P(5000, 4, grad=False)]

    class DDP:
        module = Module()

    # 4,000 + 20 bytes (the frozen parameter has no gradient), rounded up
    # to 512.
    assert _bucket_bytes(DDP()) == 4096


def test_world_size_must_be_a_positive_integer():
    from memlens._fake_ddp import one_rank

    with pytest.raises(ValueError, match="world_size"):
        with one_rank(0):
            pass
    with one_rank(None) as ranks:
        assert ranks.hooks_not_run == [] and ranks.bucket_bytes == 0
