"""Evidence for `memlens fit` (issue 30): workloads of different shapes,
each recorded at two small batches (the probes), then run at larger batches
(the truth: torch.cuda.max_memory_reserved/allocated after the same steps),
and under a cap, where the true largest batch is found by bisection.

    python tests/gpu/fit_probes.py OUT_DIR [WORKLOAD,...]

Writes OUT_DIR/probes/<workload>.b<N>.pickle (the probes) and
OUT_DIR/fit_truth.json (every measurement). Every run is a process of its own,
so that each recording starts with the process (as `memlens fit` needs) and
no run inherits another's cache. `tests/gpu/fit_compare.py` compares
`memlens fit` on the probes with the truth.
"""

import json
import os
import subprocess
import sys
import time

STEPS = 3
PROBES = (2, 4)
MEASURE = (8, 16, 32)
SEQ = 256
WORKLOADS = ["gpt", "hf_gpt2", "resnet_amp", "t5", "vit"]


def parts(workload):
    """The workload's model (on the GPU), its optimizer's factory, a batch
    maker (`make(batch)`) and its loss (`loss(model, inputs)`, which gives
    the loss and what the step held through backward: the outputs, as the
    probes and measurements in tests/corpus/fit were recorded)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    dev = "cuda"
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-4)  # noqa: E731
    if workload == "gpt":
        # A GPT-style LM written by hand.
        class Block(nn.Module):
            def __init__(self, d, h):
                super().__init__()
                self.ln1 = nn.LayerNorm(d)
                self.attn = nn.MultiheadAttention(d, h, batch_first=True)
                self.ln2 = nn.LayerNorm(d)
                self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

            def forward(self, x, mask):
                y = self.ln1(x)
                x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
                return x + self.mlp(self.ln2(x))

        class GPT(nn.Module):
            def __init__(self, vocab=8192, d=512, h=8, layers=6):
                super().__init__()
                self.emb = nn.Embedding(vocab, d)
                self.pos = nn.Embedding(SEQ, d)
                self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
                self.ln = nn.LayerNorm(d)
                self.head = nn.Linear(d, vocab, bias=False)

            def forward(self, idx):
                t = idx.shape[1]
                mask = torch.triu(torch.ones(t, t, device=idx.device, dtype=torch.bool), 1)
                x = self.emb(idx) + self.pos(torch.arange(t, device=idx.device))
                for b in self.blocks:
                    x = b(x, mask)
                return self.head(self.ln(x))

        def make(batch):
            return torch.randint(0, 8192, (batch, SEQ), device=dev)

        def loss(model, idx):
            logits = model(idx)
            return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1)), logits

        return GPT().to(dev), adamw, make, loss
    def hf_token_lm(model):
        """An HF language model on random tokens, its own loss on them."""
        model.train()

        def make(batch):
            return torch.randint(0, 8192, (batch, SEQ), device=dev)

        def loss(model, idx):
            out = model(input_ids=idx, labels=idx)
            return out.loss, out

        return model, adamw, make, loss

    if workload == "hf_gpt2":
        # An HF causal LM through its own forward and loss.
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8192, n_positions=SEQ)
        return hf_token_lm(GPT2LMHeadModel(cfg).to(dev))
    if workload == "resnet_amp":
        # A CNN with AMP (bf16 autocast), SGD with momentum.
        import torchvision

        torch.backends.cudnn.benchmark = False
        model = torchvision.models.resnet50(num_classes=100).to(dev)

        def make(batch):
            return (
                torch.randn(batch, 3, 160, 160, device=dev),
                torch.randint(0, 100, (batch,), device=dev),
            )

        def loss(model, xy):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return nn.functional.cross_entropy(model(xy[0]), xy[1]), None

        sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # noqa: E731
        return model, sgd, make, loss
    if workload == "t5":
        # An encoder-decoder: HF T5 from a config, its own loss.
        from transformers import T5Config, T5ForConditionalGeneration

        cfg = T5Config(
            vocab_size=8192, d_model=512, d_kv=64, d_ff=2048, num_layers=4, num_heads=8,
            decoder_start_token_id=0, pad_token_id=0,
        )
        model = T5ForConditionalGeneration(cfg).to(dev)
        model.train()

        def make(batch):
            return (
                torch.randint(0, 8192, (batch, SEQ), device=dev),
                torch.randint(0, 8192, (batch, SEQ // 2), device=dev),
            )

        def loss(model, st):
            out = model(input_ids=st[0], labels=st[1])
            return out.loss, out

        return model, adamw, make, loss
    if workload in ("vit", "vit_b"):
        # torchvision's ViT, AdamW: `vit` 6 layers of width 512 on 128x128
        # images (65 tokens); `vit_b` ViT-B/16's shape at 224x224 (197
        # tokens, width 768), 4 layers, added after the reductions' staging
        # buffers were modelled: other widths and rows (out of sample).
        from torchvision.models import VisionTransformer

        image = 128 if workload == "vit" else 224
        shape = (
            dict(num_layers=6, num_heads=8, hidden_dim=512, mlp_dim=2048)
            if workload == "vit"
            else dict(num_layers=4, num_heads=12, hidden_dim=768, mlp_dim=3072)
        )
        model = VisionTransformer(image_size=image, patch_size=16, num_classes=100, **shape).to(dev)

        def make(batch):
            return (
                torch.randn(batch, 3, image, image, device=dev),
                torch.randint(0, 100, (batch,), device=dev),
            )

        def loss(model, xy):
            return nn.functional.cross_entropy(model(xy[0]), xy[1]), None

        return model, adamw, make, loss
    if workload == "bert":
        # An HF encoder with a bias on every linear layer, masked-LM loss
        # (added after the staging buffers were modelled: out of sample).
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(
            vocab_size=8192, hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
            intermediate_size=2048, max_position_embeddings=SEQ,
        )
        return hf_token_lm(BertForMaskedLM(cfg).to(dev))
    raise SystemExit(f"unknown workload {workload}")


def build(workload, batch, wrap=None):
    """The model, the optimizer and one training step at `batch`; `wrap`
    (e.g. DistributedDataParallel) wraps the model first."""
    model, make_opt, make, loss = parts(workload)
    if wrap is not None:
        model = wrap(model)
    opt = make_opt(model)

    def step():
        inputs = make(batch)
        value, held = loss(model, inputs)
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del inputs, value, held

    return step


def worker(workload, batch, mode, cap, out):
    """One run in this process: `record` (a probe), `measure` or `capped`."""
    import torch

    if mode == "record":
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    if mode == "capped":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(cap / total)
    result = {"workload": workload, "batch": batch, "mode": mode, "cap": cap}
    try:
        step = build(workload, batch)
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        result["ok"] = True
    except torch.OutOfMemoryError:
        result["ok"] = False
    result["max_reserved"] = torch.cuda.max_memory_reserved()
    result["max_allocated"] = torch.cuda.max_memory_allocated()
    if mode == "record":
        torch.cuda.memory._dump_snapshot(out)
    print(json.dumps(result))


def run(workload, batch, mode, cap=0, out=""):
    p = subprocess.run(
        [sys.executable, __file__, "worker", workload, str(batch), mode, str(cap), out],
        capture_output=True,
        text=True,
    )
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    return {"workload": workload, "batch": batch, "mode": mode, "ok": None, "err": p.stderr[-2000:]}


def bisect_largest(workload, cap, hi=64):
    """The largest batch that completes under `cap`, by bisection, and its runs."""
    runs = []
    lo, top = 0, hi + 1
    while top - lo > 1:
        mid = (lo + top) // 2
        r = run(workload, mid, "capped", cap)
        runs.append(r)
        if r.get("ok"):
            lo = mid
        else:
            top = mid
    return lo, runs


def main(out_dir, workloads):
    os.makedirs(os.path.join(out_dir, "probes"), exist_ok=True)
    truth = {"steps": STEPS, "seq": SEQ, "workloads": {}}
    for w in workloads:
        t0 = time.time()
        rec = {"probes": {}, "measured": {}, "capped": {}}
        for b in PROBES:
            path = os.path.join(out_dir, "probes", f"{w}.b{b}.pickle")
            rec["probes"][b] = run(w, b, "record", 0, path)
        for b in MEASURE:
            rec["measured"][b] = run(w, b, "measure")
        m16 = rec["measured"][16].get("max_reserved") or 0
        if m16:
            # A cap near batch 16's need, so that the largest batch is not a
            # power of two the search would hit by luck.
            cap = int(m16 * 1.15)
            largest, runs = bisect_largest(w, cap)
            rec["capped"] = {"cap": cap, "largest_batch": largest, "runs": runs}
        rec["seconds"] = round(time.time() - t0, 1)
        truth["workloads"][w] = rec
        with open(os.path.join(out_dir, "fit_truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
        print(w, json.dumps({k: v for k, v in rec.items() if k != "capped"})[:400], flush=True)
        print(w, "capped", rec["capped"].get("cap"), rec["capped"].get("largest_batch"), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
    else:
        main(
            sys.argv[1] if len(sys.argv) > 1 else "out",
            sys.argv[2].split(",") if len(sys.argv) > 2 else WORKLOADS,
        )
