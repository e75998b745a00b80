"""Ten clean training runs of real models under `memlens.record` (issue 32):
no leak alarm, no holder named, and `memlens leaks` on the final snapshot
finds no leak of high confidence and shows no holder.

    python tests/gpu/clean_runs.py [MODEL,...]     (one JSON line a model, then a table)

Each model trains in a process of its own for STEPS steps with random
weights (the device machine has no network; shapes, not weights, make the
memory): a hand-written GPT, four Hugging Face models built from their
configs, five torchvision models.
"""

import json
import os
import subprocess
import sys
import tempfile
import warnings

STEPS = 40


def build(name, torch):
    """The model, a batch maker and the loss of a step."""
    nn = torch.nn
    dev = "cuda"
    if name == "gpt_hand":
        class Block(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.attn = nn.MultiheadAttention(d, 8, batch_first=True)
                self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

            def forward(self, x):
                h = self.ln1(x)
                x = x + self.attn(h, h, h, need_weights=False)[0]
                return x + self.mlp(self.ln2(x))

        class GPT(nn.Module):
            def __init__(self, vocab=8192, d=512, layers=6):
                super().__init__()
                self.tok = nn.Embedding(vocab, d)
                self.blocks = nn.Sequential(*[Block(d) for _ in range(layers)])
                self.head = nn.Linear(d, vocab)

            def forward(self, idx):
                return self.head(self.blocks(self.tok(idx)))

        model = GPT().to(dev)

        def batch():
            return torch.randint(0, 8192, (8, 256), device=dev)

        def loss(m, x):
            logits = m(x)
            return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), x.view(-1))

        return model, batch, loss
    if name.startswith("hf_"):
        import transformers as tf

        kind = name[3:]
        if kind == "gpt2":
            model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=6))
        elif kind == "bert":
            model = tf.BertForMaskedLM(tf.BertConfig(num_hidden_layers=6))
        elif kind == "t5":
            model = tf.T5ForConditionalGeneration(tf.T5Config(num_layers=4, num_decoder_layers=4, decoder_start_token_id=0))
        else:  # llama
            model = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=512, intermediate_size=1376,
                                                       num_hidden_layers=6, num_attention_heads=8,
                                                       num_key_value_heads=8, vocab_size=8192))
        model = model.to(dev)
        vocab = model.config.vocab_size

        def batch():
            return torch.randint(0, vocab, (8, 128), device=dev)

        def loss(m, x):
            return m(input_ids=x, labels=x).loss

        return model, batch, loss
    import torchvision

    ctor = getattr(torchvision.models, name[3:])
    model = ctor(weights=None).to(dev)
    size = 224

    def batch():
        return torch.randn(16, 3, size, size, device=dev)

    def loss(m, x):
        return m(x).float().pow(2).mean()

    return model, batch, loss


MODELS = ["gpt_hand", "hf_gpt2", "hf_bert", "hf_t5", "hf_llama",
          "tv_resnet50", "tv_vit_b_16", "tv_convnext_tiny", "tv_efficientnet_b0", "tv_mobilenet_v3_large"]


def run(name):
    import torch

    import memlens

    model, batch, loss_of = build(name, torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    out = tempfile.mkdtemp(prefix=f"clean-{name}-")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memlens.record(out) as rec:
            for _ in range(STEPS):
                loss = loss_of(model, batch())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                memlens.step()
    alarms = [str(w.message)[:300] for w in caught if issubclass(w.category, memlens.LeakWarning)]
    final = rec.snapshots[-1]
    p = subprocess.run([sys.executable, "-m", "memlens", "leaks", final, "--json"], capture_output=True, text=True)
    doc = json.loads(p.stdout) if p.returncode == 0 else {}
    found = doc.get("leaks", [])
    return {
        "model": name,
        "steps": STEPS,
        "alarms": alarms,
        "holders": rec.leak_holders,
        "holders_file": os.path.exists(final + ".holders.json"),
        "cli_high": [l["site"] for l in found if l.get("confidence") == "high"],
        "cli_holders": [h["path"] for l in found for h in l.get("holders", [])],
        "cli_verdict": doc.get("verdict", p.stderr[-300:]),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }


def main(models):
    rows = []
    for name in models:
        p = subprocess.run([sys.executable, __file__, "worker", name], capture_output=True, text=True)
        line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
        r = json.loads(line[len("RESULT "):]) if line else {"model": name, "error": p.stderr[-1500:]}
        r["ok"] = "error" not in r and not (r["alarms"] or r["holders"] or r["holders_file"]
                                            or r["cli_high"] or r["cli_holders"])
        print(json.dumps(r), flush=True)
        rows.append(r)
    print()
    print("| model | steps | peak | alarm | holder named | `leaks` high-confidence | silent |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | error: {r['error'][-200:]!r} | | | | | NO |")
            continue
        print(f"| {r['model']} | {r['steps']} | {r['peak_gib']} GiB | {len(r['alarms'])} | "
              f"{len(r['holders']) + len(r['cli_holders'])} | {len(r['cli_high'])} | {'yes' if r['ok'] else 'NO'} |")
    print(f"\n{sum(r['ok'] for r in rows)} of {len(rows)} clean runs silent")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        print("RESULT " + json.dumps(run(sys.argv[2])))
    else:
        main(sys.argv[1].split(",") if len(sys.argv) > 1 else MODELS)
