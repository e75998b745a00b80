"""One rank of a DDP job predicted from a trace with fake tensors (issue 30,
point 3), against the job run on two GPUs.

    python tests/gpu/fake_ddp.py OUT_DIR [WORKLOAD[:BATCH],...]   (two GPUs)

For each workload of fit_probes.py:
- the job: two processes (NCCL), each the workload's model wrapped in
  DistributedDataParallel (device_ids=[rank], its defaults: 25 MiB buckets,
  gradients copied into them), AdamW, 3 training steps at BATCH; each rank's
  max_memory_allocated()/max_memory_reserved() over the run from an empty
  allocator;
- the prediction: in this process, `memlens.trace_step(..., world_size=2)`
  of the same build and steps, the model wrapped in DDP under fake tensors
  (PyTorch's fake process group, rank 0 of 2: python/memlens/_fake_ddp.py
  says what stands in for the communication), replayed by `memlens.fit`;
  the same model without DDP traced beside it (what DDP adds). Before
  _fake_ddp, DDP under fake tensors failed three ways: its parameter-shape
  check reads shapes back as data, the fake group's all-reduce gives DDP's
  reducer a future without a value (an INTERNAL ASSERT in comm.cpp), and
  the bucket rebuild at the second forward broadcasts the order as data.
RECORD=1 records rank 0 of the job (OUT_DIR/WORKLOAD.bBATCH.rank0.pickle).
FAKE_TRUTH=PATH takes the job's figures from an earlier fake_ddp.json
instead of running it. Results: OUT_DIR/fake_ddp.json.
"""

import json
import os
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
STEPS = 3


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, workload, batch, port, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fit_probes

    torch.cuda.set_device(rank)
    if os.environ.get("RECORD"):
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    step = fit_probes.build(workload, batch, wrap=lambda m: DDP(m, device_ids=[rank]))
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    if os.environ.get("RECORD") and rank == 0:
        torch.cuda.memory._dump_snapshot(os.path.join(out, f"{workload}.b{batch}.rank0.pickle"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"max_allocated": torch.cuda.max_memory_allocated(),
                   "max_reserved": torch.cuda.max_memory_reserved()}, f)
    dist.barrier()
    dist.destroy_process_group()


def job(workload, batch, out):
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(workload, batch, _free_port(), out), nprocs=2, join=True)
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]


def predicted(workload, batch, out, ddp):
    """memlens.trace_step of the build and steps (the model in DDP, one rank
    of 2, when `ddp`), replayed by memlens.fit."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fit_probes
    import memlens

    def build():
        return fit_probes.build(workload, batch, wrap=DDP if ddp else None)

    trace = memlens.trace_step(build, lambda s: s(), steps=STEPS, world_size=2 if ddp else None)
    path = trace.save(os.path.join(out, f"{workload}.b{batch}.{'ddp' if ddp else 'single'}.pickle"))
    answer = memlens.fit([path])
    torch.cuda.synchronize()
    return {"allocated": answer["predicted"]["peak_allocated_bytes"],
            "reserved": answer["predicted"]["peak_reserved_bytes"], "path": path,
            "warnings": answer["warnings"], "gpu_memory_used": torch.cuda.memory_allocated()}


def main(out, cases):
    os.makedirs(out, exist_ok=True)
    rows = []
    for case in cases:
        workload, _, b = case.partition(":")
        batch = int(b or 16)
        row = {"workload": workload, "batch": batch}
        try:
            if os.environ.get("FAKE_TRUTH"):
                earlier = {r["workload"]: r for r in json.load(open(os.environ["FAKE_TRUTH"]))}
                row["job"] = earlier[workload]["job"]
            else:
                row["job"] = job(workload, batch, out)
        except Exception as e:  # noqa: BLE001
            row["job_error"] = f"{type(e).__name__}: {e}"[-1500:]
        row["single"] = predicted(workload, batch, out, False)
        try:
            row["ddp"] = predicted(workload, batch, out, True)
        except Exception:  # noqa: BLE001
            row["ddp_error"] = traceback.format_exc()[-2000:]
        if "job" in row and "ddp" in row:
            truth = row["job"][0]
            row["error_allocated"] = round(row["ddp"]["allocated"] / truth["max_allocated"] - 1, 4)
            row["error_reserved"] = round(row["ddp"]["reserved"] / truth["max_reserved"] - 1, 4)
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out, "fake_ddp.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else ["gpt:16", "hf_gpt2:16"])
