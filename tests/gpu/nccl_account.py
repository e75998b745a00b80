"""nvidia-smi reconciled on two ranks with NCCL (issue 35 item 1).

    python3 tests/gpu/nccl_account.py OUTDIR

Two processes, one GPU each, NCCL, DistributedDataParallel over the corpus
GPT, recorded by memlens.record (the rank in the snapshots' names). For each
rank, `memlens doctor --json` on its final snapshot accounts for its GPU's
used memory: PyTorch reserved + outside PyTorch (the CUDA context when
recording began, then what came since: NCCL's communicator buffers) + other
processes + the driver + the residual, which must stay within 64 MiB; and
`memlens top`, run while both ranks hold their communicators, accounts for
each GPU within 64 MiB too.
Prints PASS/FAIL and INFO lines and "N passed, N failed". Needs 2 GPUs.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


def worker(rank, out):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.join(HERE, "..", "corpus", "gen"))
    import memlens
    from model import GPT, batch, loss_fn

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(GPT(vocab=8000, d=512, n_layer=4, n_head=8).cuda(),
                                                      device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with memlens.record(out, leak_check=False, publish=False):
        for _ in range(6):
            x, y = batch(8000, 8, 256)
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            memlens.step()
    dist.barrier()
    if rank == 0:
        # Both ranks hold their communicators: `top` accounts for each GPU.
        sys.path.insert(0, HERE)
        from gpu_checks import top_accounts

        with open(os.path.join(out, "top.json"), "w") as f:
            json.dump({str(k): v for k, v in top_accounts().items()}, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    if len(sys.argv) > 2:
        worker(int(sys.argv[2]), out)
        return 0
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    procs = [subprocess.Popen([sys.executable, __file__, out, str(r)], env=env) for r in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    passed = failed = 0
    sys.path.insert(0, HERE)
    from gpu_checks import device_account

    for rank in range(2):
        dev, why = device_account(os.path.join(out, f"snapshot.rank{rank}.pickle"))
        ok = codes[rank] == 0 and dev is not None and abs(dev["unexplained_bytes"]) <= 64 * MIB
        print(f"{'PASS' if ok else 'FAIL'} nccl.rank{rank}.device_accounted: exit {codes[rank]}; {dev} {why}",
              flush=True)
        passed, failed = passed + ok, failed + (not ok)
    try:
        tops = json.load(open(os.path.join(out, "top.json")))
    except (OSError, ValueError) as e:
        tops = {"error": repr(e)}
    for gpu in range(2):
        used, account = tops.get(str(gpu), (None, None))
        ok = account is not None and abs(account["unexplained_bytes"]) <= 64 * MIB
        print(f"{'PASS' if ok else 'FAIL'} nccl.gpu{gpu}.top_accounted: used {used} = {account} "
              f"{tops.get('error', '')}", flush=True)
        passed, failed = passed + ok, failed + (not ok)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
