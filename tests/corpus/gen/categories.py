"""Recordings for issue 31's item 3 (one category rulebook), one function each.

    python3 categories.py OUTDIR NAME [NAME...]

Like train.py (same helpers, same project copy under /home/user/proj), each NAME
writes OUTDIR/NAME.pickle and OUTDIR/NAME.truth.json. The truth's `expect`
maps a tag to {line, category, bytes, count}: the user line (`# MARK:` here),
what the memory made there is, and the bytes and blocks alive at the dump whose
stack holds that line (read back from the pickle, as train.py's leak truth).
`peak` (resnet50_amp) holds what the model's own tensors add up to at the
allocated peak, for the activation share.
"""
import json
import os
import sys
# Line numbers must match the frames of the recordings in tests/corpus/categories:
# keep every line above the workloads where it is.

import torch

import train
from model import GPT, AdamW, batch, loss_fn
from train import SMALL, B, T, bytes_under, marked, stats

OUT = NAME = None


def dump(truth):
    truth["memory_stats"] = stats()
    path = os.path.join(OUT, f"{NAME}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    truth.setdefault("files", []).append(os.path.basename(path))
    return path


def storage_bytes(tensors):
    """Bytes the allocator gave these tensors' storages (rounded to 512 B), each storage once."""
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += (s.nbytes() + 511) // 512 * 512
    return total


def w_kv_generate(truth):
    """HF GPT-2 (small config, no download) moved with .to("cuda"), then three greedy generate() calls with the KV cache, PyTorch's default recording."""
    kv_generate(truth, freed=False)


def w_kv_generate_freed(truth):
    """As kv_generate with Python stacks, the model deleted (and its weights freed) before the dump."""
    kv_generate(truth, freed=True)


def kv_generate(truth, freed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if freed:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=200000)
    else:
        torch.cuda.memory._record_memory_history()
    cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8192, n_positions=512)
    model = GPT2LMHeadModel(cfg)
    model = model.to("cuda")  # MARK: kv_weights
    model.eval()
    prompt = torch.randint(0, 8192, (4, 64)).to("cuda")  # MARK: kv_prompt
    with torch.no_grad():
        for _ in range(3):
            out = model.generate(prompt, max_new_tokens=48, do_sample=False, use_cache=True, pad_token_id=0)  # MARK: kv_call
    truth.update(steps=0, backward=False, parameter_bytes=storage_bytes(model.parameters()), kept_output=list(out.shape),
                 recording=dict(call="_record_memory_history(stacks='python', max_entries=200000)", stacks="python") if freed
                 else dict(call="_record_memory_history()", stacks="all"))
    if freed:
        truth["weights_bytes"] = storage_bytes(list(model.parameters()) + list(model.buffers()))
        del model
        torch.cuda.synchronize()
        truth["expect"] = {}
        truth["note"] = "the weights (kv_weights line) are freed before the dump: at the peak they are the parameter category"
        truth["lines"] = {"kv_weights": marked("kv_weights", __file__)}
    else:
        truth["expect"] = {"kv_weights": dict(line=marked("kv_weights", __file__), category="parameter")}
    dump(truth)


def w_cuda_graph(truth):
    """The student GPT moved with .to("cuda") and its forward captured in a CUDA graph (warm-up on a side stream), replayed 5 times; Python stacks."""
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=100000)
    model = GPT(**SMALL).to("cuda")  # MARK: graph_weights
    model.eval()
    static_x, _ = batch(SMALL["vocab"], B, T)
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = model(static_x)  # MARK: graph_capture
        for _ in range(5):
            x, _ = batch(SMALL["vocab"], B, T)
            static_x.copy_(x)
            g.replay()
    torch.cuda.synchronize()
    truth.update(steps=0, backward=False, recording=dict(call="_record_memory_history(stacks='python', max_entries=100000)", stacks="python"),
                 parameter_bytes=storage_bytes(model.parameters()), static_out=list(static_out.shape))
    truth["expect"] = {"graph_weights": dict(line=marked("graph_weights", __file__), category="parameter")}
    dump(truth)


def w_sidestream(truth):
    """The student GPT trained 3 steps (hand-written AdamW); after each step a matrix product on a side stream, outside any model call; Python stacks."""
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=100000)
    model = GPT(**SMALL).cuda()
    opt = AdamW(model.parameters())
    a = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    for _ in range(3):
        train.train_step(model, opt)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            prod = a @ a  # MARK: side_matmul
        torch.cuda.current_stream().wait_stream(side)
        prod.sum().item()
    truth.update(steps=3, backward=True, recording=dict(call="_record_memory_history(stacks='python', max_entries=100000)", stacks="python"),
                 side_stream=side.cuda_stream)
    truth["expect"] = {"side_matmul_workspace": dict(line=marked("side_matmul", __file__), category="other",
                                                     note="the cuBLAS workspace of the side stream (plus the product, freed each step)")}
    dump(truth)


def w_compiled_backward(truth):
    """torch.compile'd student GPT with torch.optim.AdamW, recorded from before the first compile; dumped after the third step's optimizer step, before zero_grad (gradients alive); Python stacks."""
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=200000)
    model = GPT(**SMALL).cuda()
    cmodel = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(3):
        x, y = batch(SMALL["vocab"], B, T)
        logits = cmodel(x)  # MARK: cb_forward
        loss = loss_fn(logits, y)
        loss.backward()  # MARK: cb_backward
        opt.step()
        if step < 2:
            opt.zero_grad(set_to_none=True)
        loss.item()
    params = list(model.parameters())
    truth.update(steps=3, backward=True, recording=dict(call="_record_memory_history(stacks='python', max_entries=200000)", stacks="python"),
                 parameter_bytes=storage_bytes(params), gradient_bytes=storage_bytes([p.grad for p in params]),
                 optimizer_state_bytes=storage_bytes([t for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.is_cuda]))
    truth["expect"] = {}
    dump(truth)


def w_resnet50_amp(truth):
    """torchvision ResNet-50 trained 2 steps under fp16 autocast with GradScaler and SGD momentum, batch 96 at 224x224; Python stacks."""
    resnet50_amp(truth, stacks="python")


def w_resnet50_amp_all(truth):
    """As resnet50_amp, recorded with PyTorch's default (C++ frames too)."""
    resnet50_amp(truth, stacks="all")


def resnet50_amp(truth, stacks):
    import torchvision

    torch.manual_seed(0)
    if stacks == "python":
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=200000)
    else:
        torch.cuda.memory._record_memory_history()
    model = torchvision.models.resnet50().cuda()  # MARK: rn_weights
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(96, 3, 224, 224, device="cuda")  # MARK: rn_input
    y = torch.randint(0, 1000, (96,), device="cuda")
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)  # MARK: rn_forward
            loss = torch.nn.functional.cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    params = list(model.parameters())
    truth.update(steps=2, backward=True, parameter_bytes=storage_bytes(params),
                 recording=dict(call="_record_memory_history(stacks='python', max_entries=200000)", stacks="python") if stacks == "python"
                 else dict(call="_record_memory_history()", stacks="all"),
                 buffer_bytes=storage_bytes(list(model.buffers())),
                 optimizer_state_bytes=storage_bytes([t for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.is_cuda]),
                 input_bytes=storage_bytes([x, y]))
    truth["expect"] = {"rn_weights": dict(line=marked("rn_weights", __file__), category="parameter")}
    dump(truth)


def add_expected_bytes(final, truth):
    for e in truth.get("expect", {}).values():
        e.update(bytes_under(final, e["line"]))


def main():
    train.run_workloads(sys.modules[__name__], add_expected_bytes)


if __name__ == "__main__":
    main()
