"""The training callbacks against the REAL frameworks: a tiny model trained on
CPU by transformers' Trainer and by Lightning's Trainer, exercising every hook
the callbacks use. CUDA is absent here, so memory recording itself is off: the
callbacks drive a RecorderDouble (the real Recorder's face, with a scripted
leak alarm and OOM) and these tests check the wiring: one start, one
memlens.step() per optimizer step (not per micro-batch), the alarm and the OOM
snapshot in the framework's logs, the final snapshot at the end. The recorder
itself is tested over the fake torch (test_capture.py, test_integrations_session.py)
and on a GPU (tests/gpu).

tests/python/ci.sh installs torch, transformers and lightning for these
(tests/python/frameworks.sh); where they are absent the tests are skipped."""

from __future__ import annotations

import importlib
import os
import warnings

import pytest


def _need(module: str):
    """The framework module; the test is skipped when it is missing, except
    under tests/python/frameworks.sh (MEMLENS_REQUIRE_FRAMEWORKS=1), where a
    missing framework is a failure."""
    if os.environ.get("MEMLENS_REQUIRE_FRAMEWORKS"):
        return importlib.import_module(module)
    return pytest.importorskip(
        module, reason=f"{module} is not installed here (tests/python/frameworks.sh installs it, CI runs it)"
    )


torch = _need("torch")

from recorder_double import RecorderDouble  # noqa: E402

import memlens  # noqa: E402


def _token_rows(n: int, seq: int = 8, vocab: int = 64):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    return [{"input_ids": r, "labels": r} for r in ids]


# -- Hugging Face transformers -------------------------------------------------


def _hf_trainer(tmp_path, callback, max_steps=8, accumulation=2):
    transformers = _need("transformers")
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=_token_rows(64), callbacks=[callback])


def test_hf_callback_wires_every_hook(tmp_path):
    from memlens.integrations.huggingface import MemlensCallback

    rec = RecorderDouble(str(tmp_path / "snaps"), alarm_at=5, oom_at=3)
    cb = MemlensCallback(recorder=rec)
    trainer = _hf_trainer(tmp_path, cb)
    trainer.train()
    # One recording for the run; one step per optimizer step (8), not per
    # micro-batch (16, with 2 accumulation steps).
    assert rec.starts == 1 and rec.stops == 1
    assert rec.steps == trainer.state.global_step == 8
    history = trainer.state.log_history
    by_step = {h["step"]: h for h in history if "loss" in h}
    assert sorted(by_step) == [2, 4, 6, 8]
    # The OOM of step 3 is logged at step 4's log, the alarm of step 5 at step 6's.
    assert by_step[4]["memlens/oom_snapshot"] == str(tmp_path / "snaps" / "snapshot.oom.pickle")
    assert by_step[4]["memlens/ooms"] == 1
    assert by_step[6]["memlens/leak_alarm"] == rec.leak_alarm
    assert by_step[6]["memlens/leak_alarm_step"] == 5
    assert by_step[6]["memlens/leak_site"] == "/home/me/train.py:42"
    assert not any("memlens/leak_alarm" in by_step[s] for s in (2, 4, 8)), "logged once"
    assert cb.leak_alarm == rec.leak_alarm
    assert history[-1]["memlens/final_snapshot"] == str(tmp_path / "snaps" / "snapshot.pickle")
    assert history[-1]["step"] == 8


def test_hf_callback_without_cuda_trains_and_records_nothing(tmp_path):
    from memlens.integrations.huggingface import MemlensCallback

    cb = MemlensCallback(every=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _hf_trainer(tmp_path, cb, max_steps=4, accumulation=1)
        trainer.train()
    ours = [w for w in caught if issubclass(w.category, memlens.MemlensWarning)]
    assert len(ours) == 1 and "CUDA is not available" in str(ours[0].message)
    assert trainer.state.global_step == 4
    assert not any(k.startswith("memlens/") for h in trainer.state.log_history for k in h)
    assert not (tmp_path / "hf" / "memlens").exists()


# -- Lightning -------------------------------------------------------------------


def _lightning_module(fail_at=None):
    L = _need("lightning.pytorch")

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            if fail_at is not None and self.global_step == fail_at:
                raise RuntimeError("planted failure")
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    return L, Tiny(), torch.utils.data.DataLoader(data, batch_size=4)


def _lightning_trainer(L, tmp_path, callback, max_steps):
    return L.Trainer(
        default_root_dir=str(tmp_path / "pl"),
        max_steps=max_steps,
        accumulate_grad_batches=2,
        accelerator="cpu",
        devices=1,
        logger=L.loggers.CSVLogger(str(tmp_path / "pl"), name="logs"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )


def test_lightning_callback_wires_every_hook(tmp_path):
    from memlens.integrations.lightning import MemlensCallback

    L, module, loader = _lightning_module()
    rec = RecorderDouble(str(tmp_path / "snaps"), alarm_at=4, oom_at=2)
    cb = MemlensCallback(recorder=rec)
    trainer = _lightning_trainer(L, tmp_path, cb, max_steps=6)
    trainer.fit(module, loader)
    assert rec.starts == 1 and rec.stops == 1
    # 12 batches, 2 accumulated per optimizer step: 6 steps.
    assert rec.steps == trainer.global_step == 6
    assert cb.final_snapshot == str(tmp_path / "snaps" / "snapshot.pickle")
    assert cb.leak_alarm == rec.leak_alarm
    m = trainer.callback_metrics
    assert float(m["memlens/leak_alarm"]) == 1.0
    assert float(m["memlens/ooms"]) == 1.0
    assert float(m["memlens/snapshots"]) == 1.0  # the OOM snapshot (the final one came after)
    # The logger got them at every optimizer step (Lightning writes step k as
    # k - 1): the alarm from step 4, the OOM from step 2.
    import csv

    with open(trainer.logger.log_dir + "/metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("memlens/leak_alarm")]
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3, 4, 5]
    assert [float(r["memlens/leak_alarm"]) for r in rows] == [0, 0, 0, 1, 1, 1]
    assert [float(r["memlens/ooms"]) for r in rows] == [0, 1, 1, 1, 1, 1]


def test_lightning_callback_stops_on_an_exception(tmp_path):
    from memlens.integrations.lightning import MemlensCallback

    L, module, loader = _lightning_module(fail_at=3)
    rec = RecorderDouble(str(tmp_path / "snaps"))
    cb = MemlensCallback(recorder=rec)
    trainer = _lightning_trainer(L, tmp_path, cb, max_steps=6)
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.fit(module, loader)
    assert rec.steps == 3 and rec.stops == 1 and not rec.active
    assert cb.final_snapshot == str(tmp_path / "snaps" / "snapshot.pickle")
