"""A ResNet-50 under autocast (tests/gpu/fit_probes.py's `resnet_amp`) run
under a cap, recorded: the evidence that PyTorch gives up a cuDNN
convolution's workspace it cannot have and runs the convolution with another
algorithm (`try_plans` in Conv_v8.cpp catches the OutOfMemoryError), so that
the trace holds `oom` entries of a run that did not fail.

    python tests/gpu/conv_workspace_cap.py CAP_BYTES BATCH OUT.pickle

Prints what the run did (ok, `oom` entries in the trace and where, num_ooms,
the peaks). tests/corpus/oom/conv_workspace_caught (batch 23) and
conv_workspace_oom (batch 24) were made with CAP_BYTES 892338175 (the cap of
tests/corpus/fit's capped runs) on an H200, 2026-11-29.
"""
import sys, json, collections, pickle
sys.path.insert(0, "tests/gpu")
import torch, fit_probes
cap, batch, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(cap / total)
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
ok = True
try:
    step = fit_probes.build("resnet_amp", batch)
    for _ in range(fit_probes.STEPS):
        step()
    torch.cuda.synchronize()
except torch.OutOfMemoryError:
    ok = False
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._dump_snapshot(out)
tr = snap["device_traces"][0]
ooms = [e for e in tr if e["action"] == "oom"]
def where(e):
    names = [f.get("name", "") for f in e.get("frames", [])]
    return next((n[:60] for n in names if "run_conv_plan" in n or "generate_and_filter" in n or "try_plans" in n), "other")
print(json.dumps({"batch": batch, "ok": ok, "ooms_in_trace": len(ooms), "where": collections.Counter(where(e) for e in ooms),
                  "num_ooms": torch.cuda.memory_stats().get("num_ooms"), "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()}))
