"""Probe: torch's C++ _memory_snapshot_pickled against _snapshot() + pickle (issue 35)."""
import ctypes, gc, os, pickle, statistics, struct, subprocess, sys, tempfile, time
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch
from workloads import WORKLOADS

lib_path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
names = subprocess.run(["nm", "-D", lib_path], capture_output=True, text=True).stdout
sym = [l.split()[-1] for l in names.splitlines() if "memory_snapshot_pickled" in l]
print("symbols", sym)
lib = ctypes.CDLL(lib_path)
f = getattr(lib, sym[0]); f.restype = None; f.argtypes = [ctypes.c_void_p]

def cpp_pickled():
    buf = ctypes.create_string_buffer(32)
    f(buf)
    ptr, size = struct.unpack_from("QQ", buf.raw)
    return ctypes.string_at(ptr, size)  # leaks the string (probe only)

def py_pickled():
    gc.disable()
    try:
        s = torch.cuda.memory._snapshot()
        return s, pickle.dumps(s)
    finally:
        gc.enable()

for model in sys.argv[1:] or ["cs336"]:
    torch.manual_seed(0)
    one_step, desc = WORKLOADS[model]()
    for _ in range(3): one_step()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
        max_entries=200000, skip_actions=["free_requested"])
    for steps in (2, 10):
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
            max_entries=200000, skip_actions=["free_requested"], clear_history=True)
        for i in range(steps):
            with torch.profiler.record_function(f"memlens.step {i}"): pass
            one_step()
        torch.cuda.synchronize()
        ta, tb = [], []
        for _ in range(5):
            t = time.perf_counter(); s, pa = py_pickled(); ta.append(time.perf_counter() - t)
            t = time.perf_counter(); pb = cpp_pickled(); tb.append(time.perf_counter() - t)
        t = time.perf_counter(); b = pickle.loads(pb); tl = time.perf_counter() - t
        ev_a = sum(len(x) for x in s["device_traces"]); ev_b = sum(len(x) for x in b["device_traces"])
        print(f"== {model} {steps} steps: events py {ev_a} cpp {ev_b}; py {statistics.median(ta)*1e3:.2f} ms ({len(pa):,} B) "
              f"cpp {statistics.median(tb)*1e3:.2f} ms ({len(pb):,} B); loads(cpp) {tl*1e3:.2f} ms")
        print("   keys py", sorted(s.keys()), "cpp", sorted(b.keys()))
        ea = s["device_traces"][0][:ev_b and 3]; eb = b["device_traces"][0][:3]
        for x, y in zip(ea, eb):
            print("   py ", {k: (v[:2] if isinstance(v, list) else v) for k, v in x.items()})
            print("   cpp", {k: (v[:2] if isinstance(v, list) else v) for k, v in y.items()})
        same = all(
            (x["action"], x["addr"], x["size"], [(fr["filename"], fr["line"], fr["name"]) for fr in x.get("frames", [])])
            == (y["action"], y["addr"], y["size"], [(fr["filename"], fr["line"], fr["name"]) for fr in y.get("frames", [])])
            for x, y in zip(s["device_traces"][0], b["device_traces"][0]))
        print("   traces equal (action, addr, size, frames):", same, "; segments py", len(s["segments"]), "cpp", len(b["segments"]))
        print("   py annotations", len(s.get("external_annotations", [])), "cpp", len(b.get("external_annotations", [])))
        seg_keys = sorted(s["segments"][0].keys()), sorted(b["segments"][0].keys())
        print("   seg keys", seg_keys)
        print("   settings py", s.get("allocator_settings"), "cpp", b.get("allocator_settings"))
    torch.cuda.memory._record_memory_history(enabled=None)
