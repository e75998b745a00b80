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

    def stub_trace_step(build, step, steps=2, precision=None):
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
    # 100 + 10 b <= 300 MiB: batch 20, found by doubling from 4 and halving.
    assert r["largest_batch"] == 20
    assert r["batches_traced"] == sorted(set(built))
    assert 20 in built and 21 in built and len(built) <= 8
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
    monkeypatch.setattr(trace, "trace_step", lambda build, step, steps=2, precision=None: _StubTrace(build()))
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
