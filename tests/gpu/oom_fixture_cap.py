"""The shared `oom` fixture's workload (gen/workloads.py w_oom: GPT-2 6 layers, AdamW, bf16
autocast, batches 2, 4, 8, 16, 32 x 512) under a cap in bytes: does batch 32's step run?"""
import json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
cap = int(sys.argv[1])
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(cap / total)
cfg = GPT2Config(n_layer=6, n_embd=768, n_head=12, vocab_size=32000, n_positions=1024)
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ok = []
try:
    for b in (2, 4, 8, 16, 32):
        x = torch.randint(0, 32000, (b, 512), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        out.loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        ok.append(b)
        del out, x
except torch.OutOfMemoryError as e:
    pass
s = torch.cuda.memory_stats()
print(json.dumps(dict(cap=cap, ran=ok, step32_ran=32 in ok, peak_reserved=s["reserved_bytes.all.peak"],
                      peak_allocated=s["allocated_bytes.all.peak"], num_ooms=s["num_ooms"], retries=s["num_alloc_retries"])))
