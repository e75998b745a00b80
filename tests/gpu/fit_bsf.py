"""`memlens fit` beside Lightning's batch-size finder (issue 30): on the
workloads of fit_probes.py, under the cap fit_truth.json bisected, how long
each takes to name the largest batch, and what it names.

    python tests/gpu/fit_bsf.py MEMLENS_BINARY TRUTH_JSON OUT_DIR [WORKLOAD,...]

- Lightning: `Tuner(trainer).scale_batch_size(module, mode="binsearch",
  steps_per_trial=3, init_val=2)` in one process under the cap (doubling
  until a trial fails, then bisecting), timed from the process's start.
- memlens: the two probes (batch 2 and 4, 3 steps each, a process each,
  `fit_probes.py worker W B record`), then `memlens fit --limit CAP`; the
  time is all three together.
Prints one JSON line a workload, then a table for tests/gpu/RESULTS.md.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROBES = os.path.join(HERE, "fit_probes.py")


def lightning_worker(workload, cap):
    """One process: the cap, the module, the finder; prints its answer."""
    t0 = time.time()
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    sys.path.insert(0, HERE)
    from fit_probes import parts

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.net, self.make_opt, self.make, self.loss_fn = parts(workload)

        def train_dataloader(self):
            # Indices only: each step makes its own batch on the GPU.
            data = torch.utils.data.TensorDataset(torch.arange(1 << 16))
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

        def training_step(self, batch, _):
            # Lightning's own loop: the loss is returned, the outputs are
            # freed before backward (a plain loop holding them needs more).
            return self.loss_fn(self.net, self.make(batch[0].shape[0]))[0]

        def configure_optimizers(self):
            return self.make_opt(self.net)

    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=3, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    found = Tuner(trainer).scale_batch_size(
        Module(), mode="binsearch", steps_per_trial=3, init_val=2, max_trials=25
    )
    print(json.dumps({"found": found, "seconds_in_process": round(time.time() - t0, 1)}))


def timed(cmd):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p, round(time.time() - t0, 1)


def main(binary, truth_path, out, workloads):
    truth = json.load(open(truth_path))["workloads"]
    os.makedirs(out, exist_ok=True)
    rows = []
    for w in workloads:
        cap = truth[w]["capped"]["cap"]
        true_largest = truth[w]["capped"]["largest_batch"]
        p, bsf_s = timed([sys.executable, __file__, "lightning", w, str(cap)])
        line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
        bsf = json.loads(line)["found"] if line else None
        if line is None:
            print(p.stderr[-3000:], file=sys.stderr)
        probe_s = 0.0
        for b in (2, 4):
            _, s = timed([sys.executable, PROBES, "worker", w, str(b), "record", "0",
                          os.path.join(out, f"{w}.b{b}.pickle")])
            probe_s += s
        p, fit_s = timed([binary, "fit", os.path.join(out, f"{w}.b2.pickle"),
                          os.path.join(out, f"{w}.b4.pickle"), "--recorded-batch", "2,4",
                          "--limit", str(cap), "--json"])
        fit = json.loads(p.stdout)["largest_batch"] if p.returncode == 0 else None
        r = {"workload": w, "cap": cap, "true_largest": true_largest,
             "lightning": bsf, "lightning_seconds": bsf_s,
             "memlens": fit, "memlens_seconds": round(probe_s + fit_s, 1),
             "memlens_fit_seconds": fit_s}
        print(json.dumps(r), flush=True)
        rows.append(r)
    print()
    print("| workload | cap | true largest | Lightning binsearch | its time | memlens fit | its time (probes + fit) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['cap'] / 2**20:.0f} MiB | {r['true_largest']} | {r['lightning']} | "
              f"{r['lightning_seconds']} s | {r['memlens']} | {r['memlens_seconds']} s "
              f"({r['memlens_fit_seconds']} s fit) |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "lightning":
        lightning_worker(sys.argv[2], int(sys.argv[3]))
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3],
             sys.argv[4].split(",") if len(sys.argv) > 4 else
             ["gpt", "hf_gpt2", "resnet_amp", "t5", "vit"])
