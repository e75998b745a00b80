"""Recordings for issue 31's item 2 (runs, ranks, folders), on one GPU.

    python3 runs.py OUTDIR ab          two processes at once, one program, two allocator settings
    python3 runs.py OUTDIR ddp12       two DDP ranks (gloo, both on cuda:0), 12 steps, a snapshot every 2

`ab` writes OUTDIR/ab/ab_default.pickle and ab_expandable.pickle: the student GPT
trained 6 steps by two processes started together, one under the default
allocator and one under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. They
are two runs to compare, not two ranks of a job.

`ddp12` writes OUTDIR/ddp12/rank{R}.step{K}.pickle (K = 2, 4, ..., 12): a clean
DistributedDataParallel job (no leak planted) whose snapshots hold the whole
trace from the start. Twelve steps are little evidence: no leak of high
confidence may come from them. Each folder gets a truth.json.
"""
import json
import os
import subprocess
import sys
import time

import torch

from model import GPT, batch, loss_fn
from train import SMALL, B, T, stats

STEPS_AB, STEPS_DDP, EVERY = 6, 12, 2


def ab_child(out, name):
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=200000)
    model = GPT(**SMALL).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(STEPS_AB):
        x, y = batch(SMALL["vocab"], B, T)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        time.sleep(0.05)  # both runs overlap in time whatever their start
    truth = {"memory_stats": stats(), "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "pid": os.getpid()}
    torch.cuda.memory._dump_snapshot(os.path.join(out, f"{name}.pickle"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(truth, f, indent=1)


def ab(out):
    out = os.path.join(out, "ab")
    os.makedirs(out, exist_ok=True)
    procs = []
    for name, conf in [("ab_default", ""), ("ab_expandable", "expandable_segments:True")]:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        procs.append(subprocess.Popen([sys.executable, __file__, out, "ab_child", name], env=env))
    codes = [p.wait() for p in procs]
    runs = {}
    for name in ("ab_default", "ab_expandable"):
        with open(os.path.join(out, f"{name}.json")) as f:
            runs[name] = json.load(f)
        os.remove(os.path.join(out, f"{name}.json"))
    truth = {"what": "one program run twice at the same time on one GPU under two allocator settings: an A/B pair, not ranks",
             "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "steps": STEPS_AB, "exit_codes": codes, "runs": runs}
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)


def ddp_rank(rank, world, out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=400000)
    model = DDP(GPT(**SMALL).cuda(), device_ids=[0])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    allocated = []
    for step in range(1, STEPS_DDP + 1):
        x, y = batch(SMALL["vocab"], B, T)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
        if step % EVERY == 0:
            torch.cuda.memory._dump_snapshot(os.path.join(out, f"rank{rank}.step{step}.pickle"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"allocated_after_step": allocated, "memory_stats": stats()}, f)
    dist.destroy_process_group()


def ddp12(out):
    import torch.multiprocessing as mp

    out = os.path.join(out, "ddp12")
    os.makedirs(out, exist_ok=True)
    mp.spawn(ddp_rank, args=(2, out), nprocs=2)
    ranks = {}
    for r in range(2):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks[f"rank{r}"] = json.load(f)
        os.remove(os.path.join(out, f"rank{r}.json"))
    truth = {"what": "a clean 2-rank DDP job (gloo, both ranks on cuda:0), 12 steps, a snapshot every 2 steps; no leak planted",
             "clean": True, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "steps": STEPS_DDP, "every": EVERY,
             "ranks": ranks}
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)


if __name__ == "__main__":
    if sys.argv[2] == "ab_child":
        ab_child(sys.argv[1], sys.argv[3])
    else:
        {"ab": ab, "ddp12": ddp12}[sys.argv[2]](os.path.abspath(sys.argv[1]))
        print("done", sys.argv[2])
