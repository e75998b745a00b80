"""GPU check of memlens.integrations.huggingface.MemlensCallback (issue 20):
a tiny GPT-2 (GPT2LMHeadModel from a small GPT2Config, no download) trained by
the Hugging Face Trainer on random tokens with the callback, and a planted
leak: compute_loss keeps every step's `outputs.logits` in a list.

    python3 tests/gpu/hf_callback.py OUTDIR

Checks (PASS/FAIL lines, then `N passed, N failed`):
  * periodic snapshots: OUTDIR/memlens/snapshot.step{4,8,12,16}.pickle and the final one;
  * step markers: a periodic snapshot's external_annotations hold `memlens.step N`;
  * the leak alarm fires, in the Trainer's log history, naming this file
    (the planted compute_loss line);
  * the final snapshot's live memory holds the kept logits (16 x 32 MiB).
"""

from __future__ import annotations

import glob
import os
import pickle
import sys
import warnings

RESULTS = []


def report(ok: bool, name: str, detail: str) -> None:
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


KEPT = []  # the planted leak


def main(out: str) -> int:
    import torch
    import transformers

    import memlens
    from memlens.integrations.huggingface import MemlensCallback

    print(f"INFO torch {torch.__version__}, transformers {transformers.__version__}, "
          f"memlens {memlens.__version__}, {torch.cuda.get_device_name(0)}", flush=True)

    class LeakyTrainer(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            outputs = model(**inputs)
            KEPT.append(outputs.logits)  # PLANTED LEAK: every step's logits stay alive
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=8192,
                                  n_positions=128, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": r, "labels": r} for r in torch.randint(0, 8192, (256, 128), generator=g)]
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=16, per_device_train_batch_size=8, logging_steps=2,
        save_strategy="no", report_to=[], disable_tqdm=True, dataloader_pin_memory=False,
    )
    cb = MemlensCallback(every=4)
    trainer = LeakyTrainer(model=model, args=args, train_dataset=rows, callbacks=[cb])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    leak_warnings = [w for w in caught if issubclass(w.category, memlens.LeakWarning)]

    snaps = os.path.join(out, "memlens")
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(snaps, "*.pickle")))
    print(f"INFO snapshots: {names}", flush=True)
    want = [f"snapshot.step{k}.pickle" for k in (4, 8, 12, 16)] + ["snapshot.pickle"]
    report(all(n in names for n in want), "periodic snapshots", f"{names}")

    with open(os.path.join(snaps, "snapshot.step8.pickle"), "rb") as f:
        snap = pickle.load(f)
    ann = [a.get("name", "") for a in snap.get("external_annotations", []) if isinstance(a, dict)]
    marks = sorted({a for a in ann if a.startswith("memlens.step ")}, key=lambda a: int(a.split()[-1]))
    report(bool(marks) and marks[-1] in ("memlens.step 7", "memlens.step 8"), "step markers",
           f"{len(ann)} annotations in snapshot.step8, memlens.step ones: {marks}")

    logged = [h for h in trainer.state.log_history if "memlens/leak_alarm" in h]
    alarm = logged[0] if logged else {}
    here = os.path.basename(__file__)
    site = str(alarm.get("memlens/leak_site", ""))
    report(bool(logged) and here in site and here in str(cb.leak_alarm), "leak alarm in the Trainer's logs",
           f"{alarm}")
    src_line = next((i + 1 for i, l in enumerate(open(__file__)) if "PLANTED LEAK" in l), 0)
    alloc_line = src_line - 1  # `outputs = model(**inputs)`, the line that made the logits
    report(site.endswith(f"{here}:{alloc_line}"), "alarm names the planted line",
           f"site {site}, planted compute_loss lines {alloc_line}-{src_line}; {len(leak_warnings)} LeakWarning")
    if leak_warnings:
        print("INFO LeakWarning: " + str(leak_warnings[0].message).replace("\n", "\n INFO   "), flush=True)
    final = [h for h in trainer.state.log_history if "memlens/final_snapshot" in h]
    report(bool(final), "final snapshot logged", f"{final[-1] if final else None}")

    logits = sum(t.numel() * t.element_size() for t in KEPT)
    report(len(KEPT) == 16 and logits == 16 * 8 * 128 * 8192 * 4, "planted leak size",
           f"{len(KEPT)} logits kept, {logits / 2**20:.0f} MiB")

    # The Rust analysis on the periodic snapshots (memlens leaks across them).
    import subprocess
    steps = [os.path.join(snaps, f"snapshot.step{k}.pickle") for k in (4, 8, 12, 16)]
    r = subprocess.run([sys.executable, "-m", "memlens", "leaks", *steps], capture_output=True, text=True)
    print("INFO memlens leaks (across step snapshots):\n" + r.stdout[:1500] + r.stderr[:500], flush=True)
    report(r.returncode == 0 and here in r.stdout, "memlens leaks names the planted file", r.stdout.splitlines()[0] if r.stdout else r.stderr)

    passed = sum(RESULTS)
    print(f"{passed} passed, {len(RESULTS) - passed} failed", flush=True)
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
