"""What PyTorch needs of the machine for a fake-tensor training step (issue
30): a Linear, attention and autocast under FakeTensorMode, then backward,
plainly and with autograd's threads off. Run with CUDA_VISIBLE_DEVICES=""
(tests/gpu/RESULTS.md, tenth session: both fail in the backward on torch
2.11, in GraphTask::stash_current_streams)."""
import os, sys, traceback
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
print("cuda available", torch.cuda.is_available(), torch.cuda.device_count())
def attempt(name, ctx):
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            with ctx():
                lin = torch.nn.Linear(64, 64, device="cuda")
                x = torch.randn(8, 64, device="cuda")
                y = torch.nn.functional.scaled_dot_product_attention(x[None,None], x[None,None], x[None,None])
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    z = lin(y).sum()
                z.backward()
                print(name, "OK", lin.weight.grad.device, z.dtype)
    except Exception as e:
        print(name, "FAIL", repr(e)[:3000])
import contextlib
attempt("plain", contextlib.nullcontext)
attempt("nothreads", lambda: torch.autograd.set_multithreading_enabled(False))
