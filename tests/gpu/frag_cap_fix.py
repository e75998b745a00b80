# Reruns the frag_cap workload (tests/gpu/oom_harness.py) with the fix memlens leads with:
# free the tensors kept at the `keep.append` line before the 2 GiB request. Under the same 4 GiB cap.
import torch, json
MIB, GIB = 1 << 20, 1 << 30
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(4 * GIB / total)
res = {}
for variant in ["as_recorded", "keep_freed"]:
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    keep, drop = [], []
    for _ in range(190):
        drop.append(torch.empty(7 * MIB, dtype=torch.uint8, device="cuda"))
        keep.append(torch.empty(7 * MIB, dtype=torch.uint8, device="cuda"))
    del drop
    if variant == "keep_freed":
        del keep
    try:
        big = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
        ok = True
        del big
    except torch.OutOfMemoryError:
        ok = False
    keep = None
    res[variant] = {"ok": ok, "peak_reserved": torch.cuda.max_memory_reserved(), "retries": torch.cuda.memory_stats()["num_alloc_retries"]}
print(json.dumps(res))
