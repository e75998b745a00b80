"""Evidence for `memlens.trace_step` (issue 30): a training step traced with
fake tensors (no GPU memory used) against the same steps run on the GPU.

    python tests/gpu/fake_step.py OUT_DIR [WORKLOAD:PRECISION,...] [--budget S]

Each case runs in a process of its own: first the fake trace (saved as
OUT_DIR/traces/<case>.pickle, for `memlens fit` to replay), then the same
build and steps on the GPU, from an empty allocator: the truth is
`max_memory_allocated()` and `max_memory_reserved()` over the whole run
(build and STEPS steps). Results: OUT_DIR/fake_step.json. The workloads are
fit_probes.py's (hand-written GPT, HF GPT-2, ResNet-50 with autocast, T5,
ViT) and Hugging Face causal and masked LMs built from configs (the families
of issue 30: Llama, GPT-NeoX, OPT, Gemma2, Phi-3, Mixtral, BERT).
Run with CUDA_VISIBLE_DEVICES="" a case is traced only (no GPU to run it
on): the check of what tracing needs of the machine. FAKE_ONLY=1 traces
each case without running it on the GPU (its truth already measured);
REAL_ONLY=1 runs it on the GPU without the trace before it, RECORD_REAL=1
records that run (OUT_DIR/real.<case>.pickle).
A workload `cfg-<family>` is an HF family of the list below built by
memlens.predict_config's front from its saved config.json (memlens._hf).
`calib` measures cuBLAS's workspace per thread on this GPU; `batches=W`
traces fit_probes workload W (no GPU run) at the batches around its true
largest batch under a cap, for `memlens fit TRACE --limit CAP`
(tests/gpu/fake_largest.py runs the whole search, memlens.predict).
"""

import contextlib
import importlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
STEPS = 3
HF_BATCH, HF_SEQ = 8, 512
PROBE_BATCH = 16

HF_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
              num_attention_heads=8, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=512, intermediate_size=2048,
                 num_hidden_layers=6, num_attention_heads=8, vocab_size=50304, max_position_embeddings=2048)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=768, ffn_dim=3072, num_hidden_layers=6,
            num_attention_heads=12, vocab_size=50272, word_embed_proj_dim=768, max_position_embeddings=2048)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(hidden_size=512, intermediate_size=2048,
               num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=32000,
               max_position_embeddings=2048)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
             num_attention_heads=8, num_key_value_heads=8, vocab_size=32064, max_position_embeddings=2048,
             pad_token_id=0)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(hidden_size=512, intermediate_size=1024,
                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, num_local_experts=8,
                num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=2048)),
    "bert": ("BertConfig", "BertForMaskedLM", dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
             intermediate_size=2048, vocab_size=30522)),
}
PROBE_WORKLOADS = ["gpt", "hf_gpt2", "resnet_amp", "t5", "vit"]
DEFAULT_CASES = [f"{w}:{p}" for w in PROBE_WORKLOADS + list(HF_FAMILIES) for p in ("fp32", "bf16")
                 if not (w == "resnet_amp" and p == "bf16")]


def trace_module():
    """memlens._trace: from the installed package (its native module holds
    the reductions' staging-buffer model the tracer calls), else, with no
    wheel installed, a bare package over python/memlens (its own relative
    imports resolve; tracing then fails at its first reduction)."""
    import types

    try:
        import memlens  # noqa: F401

        return importlib.import_module("memlens._trace")
    except ImportError:
        sys.modules.pop("memlens", None)
    if "memlens" not in sys.modules:
        package = types.ModuleType("memlens")
        package.__path__ = [os.path.join(ROOT, "python", "memlens")]
        sys.modules["memlens"] = package
    return importlib.import_module("memlens._trace")


def hf_parts(name):
    import torch
    import transformers as tf

    cfg_name, cls_name, kw = HF_FAMILIES[name]
    cfg = getattr(tf, cfg_name)(**kw)

    def build():
        torch.manual_seed(0)
        model = getattr(tf, cls_name)(cfg).to("cuda")
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, opt

    def step(state):
        model, opt = state
        ids = torch.randint(3, cfg.vocab_size, (HF_BATCH, HF_SEQ), device="cuda")
        out = model(input_ids=ids, labels=ids)
        loss = out.loss
        del out
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    return build, step


def probe_parts(workload):
    import fit_probes

    def build():
        return fit_probes.build(workload, PROBE_BATCH)

    def step(state):
        state()

    return build, step


def config_parts(name, out_dir):
    """The same family through memlens.predict_config's front
    (memlens._hf.hf_step): its config written to config.json, read back."""
    import transformers as tf

    cfg_name, cls_name, kw = HF_FAMILIES[name]
    cfg = getattr(tf, cfg_name)(**kw)
    cfg.architectures = [cls_name]
    folder = os.path.join(out_dir, "configs", name)
    os.makedirs(folder, exist_ok=True)
    cfg.save_pretrained(folder)
    trace_module()
    hf = importlib.import_module("memlens._hf")
    build, step = hf.hf_step(folder, seq=HF_SEQ)
    return (lambda: build(HF_BATCH)), step


def parts(workload, out_dir=None):
    if workload.startswith("cfg-"):
        return config_parts(workload[4:], out_dir)
    return hf_parts(workload) if workload in HF_FAMILIES else probe_parts(workload)


def worker(case, out_dir):
    import torch

    workload, precision = case.split(":")
    trace = trace_module()
    build, step = parts(workload, out_dir)
    result = {"case": case, "workload": workload, "precision": precision, "steps": STEPS}
    t0 = time.time()
    try:
        if os.environ.get("REAL_ONLY"):
            raise RuntimeError("REAL_ONLY: not traced")
        fake = trace.trace_step(build, step, steps=STEPS, precision=None if precision == "fp32" else precision)
        path = os.path.join(out_dir, "traces", case.replace(":", ".") + ".pickle")
        fake.save(path)
        meta = fake.snapshot[trace.TRACE_KEY]
        result.update(fake_peak_allocated=fake.peak_allocated_bytes, fake_step_peaks=fake.step_peaks,
                      unknown_values=fake.unknown_values, events=len(fake.snapshot["device_traces"][0]),
                      scratch_measured=meta.get("scratch_measured"), scratch_unmeasured=meta.get("scratch_unmeasured"),
                      trace=os.path.basename(path))
    except Exception as e:  # noqa: BLE001 - a row, not the end
        result["fake_error"] = (repr(e) + " <- " + repr(e.__cause__))[:600]
        import traceback
        traceback.print_exc()
    result["fake_seconds"] = round(time.time() - t0, 2)
    if not torch.cuda.is_available() or os.environ.get("FAKE_ONLY"):
        # Traced with no GPU visible (CUDA_VISIBLE_DEVICES=""), or the trace
        # alone asked for (FAKE_ONLY=1: the GPU's figures are in truth.json).
        result["no_gpu"] = not torch.cuda.is_available()
        print("RESULT " + json.dumps(result), flush=True)
        return
    result["allocated_after_fake"] = torch.cuda.memory_allocated()
    # The trace ran its convolutions and attention kernels once on the GPU
    # to measure their workspaces: the run below starts from an empty
    # allocator all the same.
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t1 = time.time()
    if os.environ.get("RECORD_REAL"):
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    try:
        state = build()
        for _ in range(STEPS):
            # As the trace ran it: an fp32 case under no autocast context at
            # all. (A disabled one still counts as a nesting level, and the
            # weights' casts of an autocast region inside the step, as in
            # resnet_amp, then stay cached until the outer one ends: 30 MB
            # more at ResNet-50's peak than the run traced.)
            with torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext():
                step(state)
        torch.cuda.synchronize()
        result.update(max_allocated=torch.cuda.max_memory_allocated(), max_reserved=torch.cuda.max_memory_reserved())
    except Exception as e:  # noqa: BLE001
        result["real_error"] = repr(e)[:400]
    result["real_seconds"] = round(time.time() - t1, 2)
    if os.environ.get("RECORD_REAL"):
        torch.cuda.memory._dump_snapshot(os.path.join(out_dir, "real." + case.replace(":", ".") + ".pickle"))
    if "max_allocated" in result and "fake_peak_allocated" in result:
        result["allocated_error"] = round(result["fake_peak_allocated"] / result["max_allocated"] - 1, 4)
    print("RESULT " + json.dumps(result), flush=True)


# The true largest batch under each cap (tests/corpus/fit/fit_truth.json,
# found by bisection on an H100 with set_per_process_memory_fraction).
LARGEST = {"gpt": 18, "hf_gpt2": 18, "resnet_amp": 23, "vit": 25, "t5": 18}


def batches(workload, out_dir):
    """Fake traces of a fit_probes workload at the batches around its true
    largest batch under its cap (and 16, 32), in this one process, for
    `memlens fit TRACE --limit CAP` to say which fit."""
    trace = trace_module()
    import fit_probes

    os.makedirs(os.path.join(out_dir, "traces"), exist_ok=True)

    truth = LARGEST[workload]
    for batch in sorted({16, 32, truth - 1, truth, truth + 1}):
        t0 = time.time()
        row = {"case": f"{workload}.b{batch}", "workload": workload, "batch": batch}
        try:
            fake = trace.trace_step(lambda: fit_probes.build(workload, batch), lambda s: s(), steps=STEPS)
            fake.save(os.path.join(out_dir, "traces", f"{workload}.b{batch}.pickle"))
            row.update(fake_peak_allocated=fake.peak_allocated_bytes, unknown_values=fake.unknown_values)
        except Exception as e:  # noqa: BLE001
            row["fake_error"] = repr(e)[:400]
        row["fake_seconds"] = round(time.time() - t0, 2)
        print("RESULT " + json.dumps(row), flush=True)


def calib():
    """cuBLAS's workspace: what the first matrix product on a thread adds
    beyond its output, on the main thread and on autograd's."""
    import torch

    x = torch.randn(256, 256, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    a0 = torch.cuda.memory_allocated()
    y = x @ x
    torch.cuda.synchronize()
    a1 = torch.cuda.memory_allocated()
    main = a1 - a0 - 256 * 256 * 4
    y.sum().backward()
    torch.cuda.synchronize()
    a2 = torch.cuda.memory_allocated()
    # After backward: y's graph freed; x.grad (256 KiB) added.
    backward = a2 - a1 - 256 * 256 * 4
    print("RESULT " + json.dumps({"case": "calib", "workspace_main": main, "workspace_backward_thread": backward,
                                  "capability": list(torch.cuda.get_device_capability(0))}), flush=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    budget = 480.0
    if "--budget" in sys.argv:
        budget = float(sys.argv[sys.argv.index("--budget") + 1])
        args = [a for a in args if a != sys.argv[sys.argv.index("--budget") + 1]]
    out_dir = args[0]
    cases = args[1].split(",") if len(args) > 1 else ["calib"] + DEFAULT_CASES
    os.makedirs(os.path.join(out_dir, "traces"), exist_ok=True)
    results, t0 = [], time.time()
    for case in cases:
        if time.time() - t0 > budget:
            results.append({"case": case, "skipped": "budget"})
            continue
        p = subprocess.run([sys.executable, __file__, "--worker", case, out_dir], capture_output=True, text=True,
                           timeout=max(30, budget - (time.time() - t0) + 30))
        rows = [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        if not rows:
            rows = [{"case": case, "error": (p.stderr or p.stdout)[-600:]}]
        for r in rows:
            print(json.dumps(r), flush=True)
        results += rows
        with open(os.path.join(out_dir, "fake_step.json"), "w") as f:
            json.dump({"results": results, "seconds": round(time.time() - t0, 1)}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        case = sys.argv[2]
        if case == "calib":
            calib()
        elif case.startswith("batches="):
            batches(case.split("=", 1)[1], sys.argv[3])
        else:
            worker(case, sys.argv[3])
    else:
        main()
