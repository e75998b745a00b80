"""Ground truth for `memlens estimate`: real training steps of Hugging Face
models built from configs written here (the device has no network).

For each (model, setting, batch, seq) it builds the model on the GPU, trains 3
steps with AdamW and records, for step 2 (the first with optimizer state during
backward), the peak of `torch.cuda.max_memory_allocated()` over the whole step
and over each phase (forward, backward, optimizer step), plus the memory
allocated between them. The parameter count (`sum(p.numel())`, tied tensors
once) and the named parameter shapes are recorded per model, and the configs
are written as JSON for memlens to read.

Settings:
  amp_eager  fp32 weights, torch.autocast(bfloat16), attn_implementation="eager"
  bf16_sdpa  weights cast to bfloat16, attn_implementation="sdpa"

    python3 tests/gpu/estimate_truth.py OUTDIR [--budget SECONDS]

Writes OUTDIR/truth.json, the configs under its "configs" key (one file, as
the device tool brings back few); tests/gpu/estimate_truth_split.py writes
them out as tests/estimate/configs/NAME.config.json.
"""

import argparse
import gc
import json
import os
import sys
import time
import traceback

import torch
import transformers as tf

GiB = 1 << 30


def models():
    """(name, config, class name, shapes [(batch, seq)], extra settings)."""
    m = []

    def add(name, cfg, cls, shapes, opt_impls=False):
        cfg.architectures = [cls]
        m.append((name, cfg, cls, shapes, opt_impls))

    dec_shapes = [(2, 256), (4, 512), (1, 1024)]
    add("llama-60m", tf.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
        "LlamaForCausalLM", dec_shapes, opt_impls=True)
    add("llama-220m", tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
        num_attention_heads=16, num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048),
        "LlamaForCausalLM", dec_shapes)
    add("llama-1.1b", tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
        "LlamaForCausalLM", [(1, 1024), (4, 512)])
    add("gpt2-small6", tf.GPT2Config(n_embd=768, n_layer=6, n_head=12, vocab_size=50257, n_positions=1024),
        "GPT2LMHeadModel", dec_shapes, opt_impls=True)
    add("gpt2-medium", tf.GPT2Config(n_embd=1024, n_layer=24, n_head=16, vocab_size=50257, n_positions=1024),
        "GPT2LMHeadModel", [(2, 256), (4, 512), (2, 1024)])
    add("qwen2-90m", tf.Qwen2Config(hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
        tie_word_embeddings=False), "Qwen2ForCausalLM", dec_shapes, opt_impls=True)
    add("qwen2-0.5b", tf.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        tie_word_embeddings=True), "Qwen2ForCausalLM", [(2, 256), (4, 512), (1, 1024)])
    enc_shapes = [(4, 128), (8, 256), (2, 512)]
    add("bert-small", tf.BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
        intermediate_size=2048, vocab_size=30522), "BertForMaskedLM", enc_shapes, opt_impls=True)
    add("bert-base", tf.BertConfig(), "BertForMaskedLM", enc_shapes)
    add("bert-large", tf.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096), "BertForMaskedLM", [(8, 256), (4, 512)])
    # Cheap extras: relatives the same code paths claim to cover.
    for extra in [
        ("mistral-110m", "MistralConfig", "MistralForCausalLM", dict(hidden_size=768, intermediate_size=2048,
         num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
         max_position_embeddings=4096, sliding_window=None)),
        ("qwen3-100m", "Qwen3Config", "Qwen3ForCausalLM", dict(hidden_size=512, intermediate_size=1536,
         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=128,
         vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True)),
        ("roberta-base", "RobertaConfig", "RobertaForMaskedLM", dict(vocab_size=50265,
         max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    ]:
        name, cfg_cls, cls, kw = extra
        if hasattr(tf, cfg_cls):
            shapes = enc_shapes[:2] if "roberta" in name else [(2, 256), (4, 512)]
            add(name, getattr(tf, cfg_cls)(**kw), cls, shapes)
    return m


SETTINGS = {
    "amp_eager": dict(dtype=torch.float32, autocast=True, attn="eager"),
    "bf16_sdpa": dict(dtype=torch.bfloat16, autocast=False, attn="sdpa"),
}


def build(cfg, cls_name, attn):
    cls = getattr(tf, cls_name)
    with torch.device("cuda"):
        try:
            model = cls._from_config(cfg, attn_implementation=attn)
        except (TypeError, ValueError):
            cfg._attn_implementation = attn
            model = cls(cfg)
    return model


def batch_for(cfg, cls_name, b, s):
    v = cfg.vocab_size
    ids = torch.randint(3, v, (b, s), device="cuda")
    out = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids.clone())
    return out


def run_one(cfg, cls_name, setting, b, s, opt_impl, keep_outputs=False):
    st = SETTINGS[setting]
    torch.manual_seed(0)
    model = build(cfg, cls_name, st["attn"])
    if st["dtype"] != torch.float32:
        model = model.to(st["dtype"])
    model.train()
    kw = {"foreach": dict(), "fused": dict(fused=True), "for-loop": dict(foreach=False)}[opt_impl]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **kw)
    batch = batch_for(cfg, cls_name, b, s)
    rec = {}
    for step in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        a0 = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=st["autocast"]):
            out = model(**batch)
            loss = out.loss
        if not keep_outputs:
            del out
        torch.cuda.synchronize()
        pf = torch.cuda.max_memory_allocated()
        a1 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        del loss
        out = None
        torch.cuda.synchronize()
        pb = torch.cuda.max_memory_allocated()
        a2 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        torch.cuda.synchronize()
        po = torch.cuda.max_memory_allocated()
        opt.zero_grad(set_to_none=True)
        a3 = torch.cuda.memory_allocated()
        if step == 1:
            rec = dict(peak=max(pf, pb, po), forward_peak=pf, backward_peak=pb, step_peak=po,
                       start=a0, after_forward=a1, after_backward=a2, after_step=a3)
    del model, opt, batch
    gc.collect()
    torch.cuda.empty_cache()
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=240.0)
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(args.outdir, exist_ok=True)
    truth = dict(
        torch=torch.__version__, transformers=tf.__version__,
        gpu=torch.cuda.get_device_name(0), python=sys.version.split()[0],
        notes="peak = torch.cuda.max_memory_allocated() of training step 2 (reset before it); "
              "AdamW lr 1e-5; labels = input_ids; attention_mask of ones; model.train() (config dropout)",
        models={}, configs={}, runs=[],
    )
    path = os.path.join(args.outdir, "truth.json")

    def save():
        with open(path, "w") as f:
            json.dump(truth, f, indent=1)

    for name, cfg, cls_name, shapes, opt_impls in models():
        truth["configs"][name] = json.loads(json.dumps(cfg.to_dict(), default=str))
        try:
            with torch.device("meta"):
                m = getattr(tf, cls_name)(cfg)
            named = [(n, list(p.shape)) for n, p in m.named_parameters()]
            truth["models"][name] = dict(
                class_name=cls_name, parameters=sum(p.numel() for p in m.parameters()),
                tensors=named)
            del m
        except Exception as e:  # noqa: BLE001 - record and go on
            truth["models"][name] = dict(class_name=cls_name, error=repr(e))
            save()
            continue
        plan = [(st, b, s, "foreach", False) for st in SETTINGS for (b, s) in shapes]
        if opt_impls:
            b, s = shapes[1]
            plan += [(st, b, s, impl, False) for st in SETTINGS for impl in ("fused", "for-loop")]
            # `out = model(...)` held through backward, as many loops do.
            plan += [(st, b, s, "foreach", True) for st in SETTINGS]
        for setting, b, s, impl, keep in plan:
            if time.time() - t0 > args.budget:
                truth.setdefault("skipped", []).append([name, setting, b, s, impl, keep])
                continue
            row = dict(model=name, setting=setting, batch=b, seq=s, optimizer_impl=impl,
                       keep_outputs=keep)
            t1 = time.time()
            try:
                row.update(run_one(cfg, cls_name, setting, b, s, impl, keep))
            except Exception as e:  # noqa: BLE001 - an OOM or an API change is a row, not the end
                row["error"] = repr(e)[:500]
                traceback.print_exc()
                gc.collect()
                torch.cuda.empty_cache()
            row["seconds"] = round(time.time() - t1, 2)
            truth["runs"].append(row)
            print(json.dumps(row), flush=True)
            save()
    truth["seconds"] = round(time.time() - t0, 1)
    save()


if __name__ == "__main__":
    main()
