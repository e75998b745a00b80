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
