"""Training steps of real models of different shapes, for the capture benchmarks.

Each workload is a function that builds a model on the GPU and returns
``(step, description)``: ``step()`` runs one training step (forward,
backward, optimizer step, ``loss.item()`` as a logging loop does). No
weights or data are downloaded (random inputs, fresh initialisation), so they
run on a machine without network.

* ``gpt``: the corpus's student GPT (tests/corpus/gen/model.py) at bench size,
  nn.Linear blocks and a hand-written AdamW; ~100 ms a step on an H100.
* ``cs336``: a TransformerLM as the Stanford CS336 assignment 1 has students
  write it: every layer by hand (Linear as an einsum, RMSNorm, RoPE, SwiGLU,
  softmax, cross-entropy, gradient clipping and AdamW), so a step makes many
  small tensors: ~10,000 allocator events a step, three times ``gpt``'s.
* ``hf_gpt2``: transformers' GPT2LMHeadModel at GPT-2 small's shape with
  torch.optim.AdamW.
* ``resnet50``: torchvision's ResNet-50, SGD with momentum, 224x224 images.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def gpt():
    """The corpus's GPT at bench size (vocab 32000, d 1024, 8 blocks, batch 8 x 512)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "corpus", "gen"))
    from model import GPT, AdamW, batch, loss_fn

    vocab, B, T = 32000, 8, 512
    model = GPT(vocab=vocab, d=1024, n_layer=8, n_head=16).cuda()
    opt = AdamW(model.parameters())

    def step():
        x, y = batch(vocab, B, T)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step, "hand-written GPT, 8 x 1024, batch 8 x 512, fp32"


# -- cs336: everything by hand, as the assignment asks --------------------------


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return torch.einsum("...i,oi->...o", x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(dtype)


def rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


def softmax(x, dim):
    x = x - x.max(dim=dim, keepdim=True).values
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


class Attention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.q, self.k, self.v, self.o = Linear(d, d), Linear(d, d), Linear(d, d), Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        h = self.n_head
        q = self.q(x).view(B, T, h, C // h).transpose(1, 2)
        k = self.k(x).view(B, T, h, C // h).transpose(1, 2)
        v = self.v(x).view(B, T, h, C // h).transpose(1, 2)
        pos = torch.arange(T, device=x.device)
        q, k = rope(q, pos), rope(k, pos)
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // h)
        mask = torch.triu(torch.ones(T, T, device=x.device, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = softmax(scores, -1) @ v
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d, d_ff), Linear(d_ff, d), Linear(d, d_ff)

    def forward(self, x):
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, n_head, d_ff):
        super().__init__()
        self.ln1, self.attn = RMSNorm(d), Attention(d, n_head)
        self.ln2, self.ffn = RMSNorm(d), SwiGLU(d, d_ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab, d, n_layer, n_head, d_ff):
        super().__init__()
        self.emb = nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, n_head, d_ff) for _ in range(n_layer)])
        self.ln_f = RMSNorm(d)
        self.head = Linear(d, vocab)

    def forward(self, idx):
        x = self.emb[idx]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def cross_entropy(logits, y):
    logits = logits - logits.max(dim=-1, keepdim=True).values
    lse = torch.log(torch.exp(logits).sum(-1))
    return (lse - logits.gather(-1, y[..., None]).squeeze(-1)).mean()


def clip_grad(params, max_norm):
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.sqrt(sum((g.detach() ** 2).sum() for g in grads))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(scale)


class HandAdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, wd
        self.state = {}

    @torch.no_grad()
    def step(self):
        b1, b2 = self.betas
        for p in self.params:
            if p.grad is None:
                continue
            st = self.state.setdefault(p, {"t": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)})
            st["t"] += 1
            t, g = st["t"], p.grad
            st["m"] = b1 * st["m"] + (1 - b1) * g
            st["v"] = b2 * st["v"] + (1 - b2) * g * g
            lr_t = self.lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            p -= lr_t * st["m"] / (torch.sqrt(st["v"]) + self.eps)
            p -= self.lr * self.wd * p

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def cs336():
    """CS336-style TransformerLM (vocab 10000, context 256, d 512, 4 layers, d_ff 1344, batch 32)."""
    vocab, T, B = 10000, 256, 32
    model = TransformerLM(vocab, d=512, n_layer=4, n_head=16, d_ff=1344).cuda()
    opt = HandAdamW(model.parameters())

    def step():
        x = torch.randint(0, vocab, (B, T + 1), device="cuda")
        loss = cross_entropy(model(x[:, :-1]), x[:, 1:])
        loss.backward()
        clip_grad(opt.params, 1.0)
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step, "CS336-style TransformerLM, 4 x 512, every op by hand, batch 32 x 256, fp32"


def hf_gpt2():
    """transformers' GPT2LMHeadModel at GPT-2 small's shape (12 x 768), batch 8 x 512."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    B, T = 8, 512

    def step():
        x = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, "HF GPT2LMHeadModel (GPT-2 small, 124 M), batch 8 x 512, fp32, torch AdamW"


def resnet50():
    """torchvision's ResNet-50, batch 64 of 224 x 224, SGD with momentum."""
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    B = 64

    def step():
        x = torch.randn(B, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (B,), device="cuda")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, "torchvision ResNet-50, batch 64 x 3 x 224 x 224, fp32, SGD momentum"


WORKLOADS = {"gpt": gpt, "cs336": cs336, "hf_gpt2": hf_gpt2, "resnet50": resnet50}
