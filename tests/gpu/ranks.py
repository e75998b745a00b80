"""A 2-rank data-parallel job on one GPU, recorded as a user would (issue 17).

    python3 ranks.py launch OUTDIR [--world 2]   spawn the ranks of two jobs, write
                                                 OUTDIR/JOB.rankN.pickle and OUTDIR/JOB.truth.json
    python3 ranks.py worker JOB OUTDIR           one rank (RANK, WORLD_SIZE, MASTER_* set)

Jobs: `ddp_ema` keeps an extra copy of the weights on rank 0 only (the planted
imbalance, an EMA kept on the logging rank, at the line marked `# MARK: ema`);
`ddp_balanced` is the same job without it. Each rank trains the corpus GPT
(tests/corpus/gen/model.py, copied beside this file by ranks.sh) under DDP with
the gloo backend (no network: loopback), both ranks on device 0, recording with
PyTorch's defaults (`_record_memory_history()`: stacks="all").

The truth file holds, per rank, `torch.cuda.max_memory_allocated()` and
`max_memory_reserved()` (the trace starts before the first CUDA allocation, so
a replay of it must give exactly these), the device's total memory, the time
range, and the planted copy's bytes and `file:line` as it appears in the frames.
"""
import json
import os
import subprocess
import sys
import time

STEPS = 4


def marked(path, name):
    """`path:line` of the line tagged `# MARK: name`."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# MARK: {name}"):
                return f"{path}:{i}"
    raise SystemExit(f"no MARK {name} in {path}")


def worker(job, outdir):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    # Recording starts before the first CUDA allocation: the trace holds every block.
    torch.cuda.memory._record_memory_history()
    t0 = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from model import GPT

    torch.manual_seed(0)
    model = GPT(vocab=8192, d=512, n_layer=4, n_head=8).cuda()
    try:
        net = torch.nn.parallel.DistributedDataParallel(model)
        ddp = True
    except Exception as e:  # gloo without CUDA support: all-reduce by hand
        print(f"rank {rank}: DDP unavailable ({e}); manual all_reduce", flush=True)
        net, ddp = model, False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ema = None
    if job == "ddp_ema" and rank == 0:
        ema = [p.detach().clone() for p in model.parameters()]  # MARK: ema
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        idx = torch.randint(0, 8192, (8, 256), generator=g).cuda()
        logits = net(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1))
        loss.backward()
        if not ddp:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        opt.zero_grad(set_to_none=True)
        if ema is not None:
            with torch.no_grad():
                for e, p in zip(ema, model.parameters()):
                    e.mul_(0.99).add_(p, alpha=0.01)
        dist.barrier()
    torch.cuda.synchronize()
    t1 = time.time()
    path = os.path.join(outdir, f"{job}.rank{rank}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    here = os.path.abspath(__file__)
    truth = {
        "rank": rank,
        "world_size": world,
        "pid": os.getpid(),
        "device": torch.cuda.current_device(),
        "device_total_memory": torch.cuda.get_device_properties(0).total_memory,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "memory_allocated": torch.cuda.memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "planted_bytes": sum(e.numel() * e.element_size() for e in ema) if ema else 0,
        "ddp": ddp,
        "steps": STEPS,
        "time_range_s": [t0, t1],
        "lines": {"ema": marked(here, "ema")},
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    with open(os.path.join(outdir, f"{job}.rank{rank}.json"), "w") as f:
        json.dump(truth, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def launch(outdir, world):
    os.makedirs(outdir, exist_ok=True)
    ok = True
    for n, job in enumerate(["ddp_ema", "ddp_balanced"]):
        env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(29531 + n))
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", job, outdir],
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(world)]
        codes = [p.wait(timeout=240) for p in procs]
        print(f"{job}: exit codes {codes}", flush=True)
        ok &= all(c == 0 for c in codes)
        ranks = []
        for r in range(world):
            p = os.path.join(outdir, f"{job}.rank{r}.json")
            if os.path.exists(p):
                with open(p) as f:
                    ranks.append(json.load(f))
                os.remove(p)
        truth = {"job": job, "world_size": world, "ranks": ranks}
        if job == "ddp_ema" and ranks:
            truth["planted"] = {"rank": 0, "bytes": ranks[0]["planted_bytes"],
                                "line": ranks[0]["lines"]["ema"],
                                "what": "an EMA copy of the weights kept on rank 0 only"}
        with open(os.path.join(outdir, f"{job}.truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
        for r in ranks:
            print(f"{job} rank {r['rank']}: max allocated {r['max_memory_allocated']} "
                  f"reserved {r['max_memory_reserved']} planted {r['planted_bytes']} ddp {r['ddp']}",
                  flush=True)
    return ok


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        world = int(sys.argv[sys.argv.index("--world") + 1]) if "--world" in sys.argv else 2
        sys.exit(0 if launch(sys.argv[2], world) else 1)
