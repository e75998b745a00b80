"""What measuring cuDNN's workspaces costs a fake trace (issue 30): ResNet-50
(fit_probes' resnet_amp) traced at batch 16 and 22 in one process, with
measure_scratch off, on (C++ stacks, as shipped), and on with Python
stacks only (how much of the cost is symbolising C++ frames).

    python tests/gpu/trace_scratch_cost.py
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fit_probes  # noqa: E402
import memlens  # noqa: E402
import memlens._kernel_scratch as ks  # noqa: E402


def timed(label, batch, **kw):
    t = time.time()
    trace = memlens.trace_step(lambda: fit_probes.build("resnet_amp", batch), lambda s: s(), steps=3, **kw)
    meta = trace.snapshot["memlens"]
    print(f"{label} batch {batch}: {time.time() - t:.2f} s, {meta['scratch_measured']} layouts measured", flush=True)


timed("warm-up", 8)
for batch in (16, 22):
    timed("off", batch, measure_scratch=False)
    timed("on, C++ stacks", batch)
record = ks.KernelScratch._record


def python_stacks(self, call):
    torch = self.torch
    memory = torch.cuda.memory
    original = memory._record_memory_history

    def lighter(*a, **k):
        if k.get("stacks") == "all":
            k.update(stacks="python", context=None)
        return original(*a, **k)

    memory._record_memory_history = lighter
    try:
        return record(self, call)
    finally:
        memory._record_memory_history = original


ks.KernelScratch._record = python_stacks
for batch in (16, 22):
    timed("on, no stacks", batch)
