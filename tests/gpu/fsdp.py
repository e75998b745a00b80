"""Records a two-GPU FSDP2 job (issue 34): a stack of MLP blocks, each block
and the root sharded with `fully_shard`, AdamW, a few steps, recorded by
`memlens.start(..., model=model)` on each rank. Two jobs: `fsdp_default`
(`reshard_after_forward=True`, FSDP2's default) and `fsdp_noreshard` (the
planted misconfiguration: `reshard_after_forward=False` on every block, which
keeps each block's all-gathered parameters from its forward to its backward).

    python3 fsdp.py launch OUTDIR      (spawns both jobs on GPUs 0 and 1)

Writes OUTDIR/JOB.rank<R>.pickle and JOB.truth.json (each rank's
max_memory_allocated/reserved, the unsharded bytes of one block).
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

D, BLOCKS, STEPS = 2048, 8, 4


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, d)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def worker(rank, world, out, job, reshard, port):
    import memlens
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Net(D, BLOCKS).cuda()
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4, 512, D, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    # memlens names each rank's file itself (JOB.rank<R>.pickle).
    path = os.path.join(out, f"{job}.pickle")
    memlens.start(path, model=model)
    for _ in range(STEPS):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        memlens.step()
    torch.cuda.synchronize()
    memlens.stop()
    truth = {
        "rank": rank,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "block_unsharded_bytes": block_bytes,
        "blocks": BLOCKS,
        "reshard_after_forward": reshard,
        "torch": torch.__version__,
    }
    with open(os.path.join(out, f"{job}.rank{rank}.truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    for port, (job, reshard) in enumerate([("fsdp_default", True), ("fsdp_noreshard", False)]):
        mp.spawn(worker, args=(2, out, job, reshard, 29611 + port), nprocs=2, join=True)
        print(f"{job}: recorded")


if __name__ == "__main__":
    main()
