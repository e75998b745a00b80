# A training loop that keeps a tensor every 10th step (the leak), or nothing
# (clean), recorded from the start with PyTorch's default recording
# (stacks="all"). Copied to /home/user/proj/ by the recording command, so its
# frames read /home/user/proj/leak_every.py.
#
#   python3 leak_every.py OUT.pickle STEPS KEEP_EVERY   (KEEP_EVERY 0: clean)
import sys
import torch

out, steps, keep_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
dev = "cuda"
model = torch.nn.Sequential(*[m for _ in range(24) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
kept = []
for step in range(steps):
    x = torch.randn(64, 256, device=dev)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if keep_every and step % keep_every == 0:
        kept.append(torch.randn(64 * 1024, device=dev))  # MARK: the leak, 256 KiB every KEEP_EVERY steps
torch.cuda.synchronize()
print(f"{out}: {steps} steps, {len(kept)} tensors kept, max allocated {torch.cuda.max_memory_allocated()}")
torch.cuda.memory._dump_snapshot(out)
