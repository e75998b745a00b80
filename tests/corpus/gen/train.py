"""Workloads of the real-world corpus (tests/corpus), one function each.

    python3 train.py OUTDIR NAME [NAME...]

Each NAME writes OUTDIR/NAME.pickle (plus NAME.stepK.pickle for the periodic
snapshots of memlens.record) and OUTDIR/NAME.truth.json, the ground truth: the
torch.cuda.memory_stats() figures at the dump, steps, backward, clean or the
planted leak and its lines as "file:line" exactly as they appear in the frames
(looked up at run time from the `# MARK:` / `# PLANT:` comments).
run.sh copies this folder to /home/user/proj/ first, so the frames read like a
user's project. The model and the hand-written AdamW are in model.py.
"""
import json
import os
import sys
import time
import traceback
import warnings

import torch

from model import GPT, AdamW, batch, loss_fn

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = dict(vocab=8192, d=256, n_layer=4, n_head=4)
B, T = 8, 256
STAT_KEYS = [
    "allocated_bytes.all.current", "allocated_bytes.all.peak",
    "reserved_bytes.all.current", "reserved_bytes.all.peak",
    "active_bytes.all.current", "inactive_split_bytes.all.current",
    "segment.all.current", "num_alloc_retries", "num_ooms",
]
OUT = NAME = None


def marked(tag, path=None):
    """'file:line' of the line tagged `# MARK: tag` or `# PLANT: tag` in path."""
    path = os.path.abspath(path or __file__)
    with open(path) as f:
        for i, text in enumerate(f, 1):
            if text.rstrip().endswith((f"# MARK: {tag}", f"# PLANT: {tag}")):
                return f"{path}:{i}"
    raise KeyError(f"no line tagged {tag} in {path}")


def model_line(tag):
    return marked(tag, os.path.join(HERE, "model.py"))


def stats():
    s = torch.cuda.memory_stats()
    out = {k: int(s.get(k, 0)) for k in STAT_KEYS}
    out["max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
    return out


def seed():
    torch.manual_seed(0)


def dump_final(truth):
    """Ground-truth figures, then the snapshot, with nothing allocated between."""
    truth["memory_stats"] = stats()
    path = os.path.join(OUT, f"{NAME}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    truth.setdefault("files", []).append(os.path.basename(path))


def train_step(model, opt, amp=False):
    x, y = batch(SMALL["vocab"], B, T)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        logits = model(x)  # MARK: train_forward
        loss = loss_fn(logits, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


# -- plain recordings (torch.cuda.memory._record_memory_history) --------------------------


def w_default_all(truth):
    """PyTorch's default recording (stacks="all"), 5 steps of the student GPT with torch.optim.AdamW."""
    torch.cuda.memory._record_memory_history()
    model = GPT(**SMALL).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(5):
        x, y = batch(SMALL["vocab"], B, T)
        logits = model(x)  # MARK: default_forward
        loss = loss_fn(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}")
    truth.update(steps=5, backward=True, clean=True, recording=dict(call="_record_memory_history()", stacks="all"))
    truth["lines"] = {"forward_call": marked("default_forward"), "lm_head": model_line("lm_head")}
    dump_final(truth)


def prog(truth, stacks):
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=100000)
    model = GPT(**SMALL).cuda()
    opt = AdamW(model.parameters())
    for step in range(4):
        train_step(model, opt, amp=True)
    truth.update(steps=4, backward=True, clean=True,
                 recording=dict(call=f"_record_memory_history(stacks={stacks!r}, max_entries=100000)", stacks=stacks))
    truth["lines"] = {"forward_call": marked("train_forward"), "lm_head": model_line("lm_head"),
                      "adam_state": model_line("adam_state")}
    dump_final(truth)


def w_prog_python(truth):
    """The same program as prog_all (student GPT, bf16 autocast, hand-written AdamW, 4 steps), stacks="python"."""
    prog(truth, "python")


def w_prog_all(truth):
    """The same program as prog_python, recorded with stacks="all"."""
    prog(truth, "all")


def w_one_step(truth):
    """ONE training step with the hand-written AdamW: its state (m, v) is created in that step."""
    torch.cuda.memory._record_memory_history(max_entries=100000)
    model = GPT(**SMALL).cuda()
    opt = AdamW(model.parameters())
    train_step(model, opt)
    n = sum(p.numel() for p in model.parameters())
    truth.update(steps=1, backward=True, clean=True, recording=dict(call="_record_memory_history(max_entries=100000)", stacks="all"))
    truth["optimizer_state_bytes"] = sum(2 * p.numel() * p.element_size() for p in model.parameters())
    truth["parameter_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    truth["parameters"] = n
    truth["optimizer_param_tensors"] = len(opt.params)
    truth["lines"] = {"adam_state": model_line("adam_state"), "forward_call": marked("train_forward")}
    truth["expected"] = "one step: no growth verdict; m and v (adam_state line) are 'initialised in step 1', never a leak"
    dump_final(truth)


DEEP = dict(vocab=8192, d=512, n_layer=24, n_head=8)


def forward_only(truth, preload):
    seed()
    model = GPT(**DEEP).eval()
    if preload:
        model.cuda()  # MARK: preload_cuda
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
    if not preload:
        model.cuda()  # MARK: weights_cuda
    x, _ = batch(DEEP["vocab"], B, T)
    with torch.no_grad():
        logits = model(x)  # MARK: infer_forward
        next_token = logits[:, -1].argmax(-1)
    truth.update(steps=1, backward=False, clean=True, layers=DEEP["n_layer"],
                 recording=dict(call="_record_memory_history(stacks='python', max_entries=100000)", stacks="python"))
    truth["parameter_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    truth["lines"] = {"forward_call": marked("infer_forward"), "lm_head": model_line("lm_head")}
    if preload:
        truth["lines"]["preload_cuda"] = marked("preload_cuda")
        truth["expected"] = ("weights (parameter_bytes) were allocated before recording: "
                             "'<allocated before recording started>', parameters, never a leak")
        truth["dominant_at_end"] = "<allocated before recording started>"
    else:
        truth["lines"]["weights_cuda"] = marked("weights_cuda")
        truth["expected"] = "weights moved by model.cuda() are parameters (not temporary); forward only: no backward, one step"
        truth["dominant_at_end"] = marked("weights_cuda")
    dump_final(truth)
    del next_token


def w_forward_only(truth):
    """Inference: one no_grad forward through 24 blocks; weights moved by model.cuda() while recording."""
    forward_only(truth, preload=False)


def w_forward_only_preloaded(truth):
    """The same inference forward with the weights on the GPU before recording started."""
    forward_only(truth, preload=True)


def w_compiled(truth):
    """torch.compile'd student GPT: 2 warm-up steps (compile) unrecorded, then 3 recorded steps."""
    seed()
    model = GPT(**SMALL).cuda()
    cmodel = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(2):
        train_step(cmodel, opt)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    for _ in range(3):
        x, y = batch(SMALL["vocab"], B, T)
        logits = cmodel(x)  # MARK: compiled_forward
        loss = loss_fn(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
    truth.update(steps=3, backward=True, clean=True, warmup_steps_unrecorded=2,
                 recording=dict(call="_record_memory_history(max_entries=100000) after 2 warm-up steps", stacks="all"))
    truth["lines"] = {"forward_call": marked("compiled_forward")}
    truth["expected"] = "no /tmp/torchinductor_* frame named as a site; the user's line compiled_forward instead (tagged compiled)"
    dump_final(truth)


CELL2 = '''\
import torch
torch.cuda.memory._record_memory_history()
model = GPT(vocab=8192, d=256, n_layer=4, n_head=4).cuda()
opt = AdamW(model.parameters())
for step in range(4):
    x, y = batch(8192, 8, 256)
    logits = model(x)
    loss = loss_fn(logits, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(step, loss.item())
'''


RUNNER = """\
def run_cell(code, ns, errors):
    try:
        exec(code, ns)
    except BaseException as e:
        errors.append(e)
"""


def w_notebook(truth):
    """Notebook-style: model.py's source as cell 1, the training loop as cell 2, compiled under
    /tmp/ipykernel_<pid>/<n>.py file names as Jupyter does; 4 steps, default recording. The cells
    run on a thread from a runner compiled as IPython's interactiveshell.py in site-packages, so
    no frame of train.py is on their stacks (as in a kernel, where only library frames are)."""
    import sysconfig
    import threading

    d = f"/tmp/ipykernel_{os.getpid()}"
    cell1, cell2 = f"{d}/1817032837.py", f"{d}/2484311212.py"
    shell = os.path.join(sysconfig.get_paths()["purelib"], "IPython", "core", "interactiveshell.py")
    kernel = {}
    exec(compile(RUNNER, shell, "exec"), kernel)
    ns = {"__name__": "__main__"}
    with open(os.path.join(HERE, "model.py")) as f:
        src1 = f.read()
    errors = []
    for src, name in ((src1, cell1), (CELL2, cell2)):
        t = threading.Thread(target=kernel["run_cell"], args=(compile(src, name, "exec"), ns, errors))
        t.start()
        t.join()
        if errors:
            raise errors[0]
    lm = int(model_line("lm_head").rsplit(":", 1)[1])
    fwd = 1 + CELL2.splitlines().index("    logits = model(x)")
    truth.update(steps=4, backward=True, clean=True, recording=dict(call="_record_memory_history() in a cell", stacks="all"))
    truth["cells"] = {"model": cell1, "train": cell2, "runner": shell}
    truth["lines"] = {"forward_call": f"{cell2}:{fwd}", "lm_head": f"{cell1}:{lm}",
                      "adam_state": f"{cell1}:{int(model_line('adam_state').rsplit(':', 1)[1])}"}
    truth["expected"] = "cells are user code: sites name /tmp/ipykernel_<pid>/<n>.py lines"
    dump_final(truth)


def w_hf_default(truth):
    """Hugging Face GPT2LMHeadModel from a small config (no download), torch.optim.AdamW, 3 steps, default recording."""
    from transformers import GPT2Config, GPT2LMHeadModel

    seed()
    torch.cuda.memory._record_memory_history()
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=256)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(3):
        x = torch.randint(0, 8192, (B, T), device="cuda")
        out = model(input_ids=x, labels=x)  # MARK: hf_forward
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(step, out.loss.item())
    import transformers
    truth.update(steps=3, backward=True, clean=True, transformers=transformers.__version__,
                 recording=dict(call="_record_memory_history()", stacks="all"))
    truth["lines"] = {"forward_call": marked("hf_forward")}
    dump_final(truth)


# -- under memlens.record ------------------------------------------------------------


STEPS, EVERY = 8, 2


def under_memlens(truth, loop, leak=None):
    """Runs loop(model, opt, step) STEPS times under memlens.record(every=2), memlens.step() each step."""
    import memlens

    seed()
    model = GPT(**SMALL).cuda()
    opt = AdamW(model.parameters())
    path = os.path.join(OUT, f"{NAME}.pickle")
    after, periodic = [], {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memlens.record(path, every=EVERY) as rec:
            for step in range(1, STEPS + 1):
                loop(model, opt)
                after.append(int(torch.cuda.memory_allocated()))
                if step % EVERY == 0:
                    periodic[f"{NAME}.step{step}.pickle"] = stats()
                memlens.step()
            truth["memory_stats"] = stats()
    leaks = [str(w.message) for w in caught if issubclass(w.category, memlens.LeakWarning)]
    truth.update(steps=STEPS, backward=True, clean=leak is None, every=EVERY,
                 recording=dict(call=f"memlens.record({NAME}.pickle, every={EVERY})", stacks="python",
                                max_entries=rec.max_entries, memlens=memlens.__version__))
    truth["files"] = sorted(periodic) + [f"{NAME}.pickle"]
    truth["periodic_memory_stats"] = periodic
    truth["allocated_after_step"] = after
    growth = [b - a for a, b in zip(after[1:], after[2:])]  # from step 2 on: state exists
    truth["growth_per_step_from_step2"] = growth
    truth["in_process"] = {"leak_warnings": leaks, "leak_alarm": rec.leak_alarm}
    if leak:
        growth_sorted = sorted(growth)
        leak["bytes_kept_per_step"] = growth_sorted[len(growth_sorted) // 2]
        truth["leak"] = leak


def clean_loop(model, opt):
    x, y = batch(SMALL["vocab"], B, T)
    logits = model(x)  # MARK: clean_forward
    loss = loss_fn(logits, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def w_clean(truth):
    """Healthy training of the student GPT under memlens.record(every=2), 8 steps."""
    under_memlens(truth, clean_loop)
    truth["lines"] = {"forward_call": marked("clean_forward")}


kept = []


def kept_logits_loop(model, opt):
    x, y = batch(SMALL["vocab"], B, T)
    logits = model(x)  # MARK: kept_forward
    loss = loss_fn(logits, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    kept.append(logits)  # PLANT: kept_logits
    return loss.item()


def w_leak_kept_logits(truth):
    """Leak: the training loop keeps every step's logits in a list (kept.append(logits))."""
    leak = {"what": "kept.append(logits): each step's logits (B*T*vocab fp32) stay alive",
            "planted_line": marked("kept_logits"),
            "alloc_path": [marked("kept_forward"), model_line("lm_head")],
            "entry_lines": [marked("kept_forward")],
            "expected_bytes_per_step": B * T * SMALL["vocab"] * 4}
    under_memlens(truth, kept_logits_loop, leak)


losses = []


def losses_loop(model, opt):
    x, y = batch(SMALL["vocab"], B, T)
    logits = model(x)  # MARK: losses_forward
    loss = loss_fn(logits, y)  # MARK: losses_loss
    loss.backward(retain_graph=True)
    opt.step()
    opt.zero_grad()
    losses.append(loss)  # PLANT: losses
    return float(sum(losses) / len(losses))


def w_leak_losses(truth):
    """Leak: losses.append(loss) without .item(); backward(retain_graph=True) (added to silence an
    error, as students do) so each kept loss holds its step's whole graph and saved activations."""
    leak = {"what": "losses.append(loss) with backward(retain_graph=True): each kept loss keeps the step's "
                    "autograd graph and its saved activations (the largest: cross_entropy's log_softmax)",
            "planted_line": marked("losses"),
            "alloc_path": [marked("losses_loss"), model_line("loss_fn")],
            "entry_lines": [marked("losses_forward"), marked("losses_loss")]}
    under_memlens(truth, losses_loop, leak)


val_outputs = []


def eval_nograd_loop(model, opt):
    clean_loop(model, opt)
    xv, _ = batch(SMALL["vocab"], B, T)
    out = model(xv)  # MARK: eval_forward
    val_outputs.append(out)  # PLANT: eval_nograd
    return out


def w_leak_eval_nograd(truth):
    """Leak: an evaluation after each step without torch.no_grad(), keeping its outputs (and so
    their graphs with every saved activation)."""
    leak = {"what": "eval forward without no_grad, outputs kept in val_outputs: each keeps its graph",
            "planted_line": marked("eval_nograd"),
            "alloc_path": [marked("eval_forward")],
            "entry_lines": [marked("eval_forward")],
            "fix": "wrap the evaluation in torch.no_grad() (no backward runs for it)"}
    under_memlens(truth, eval_nograd_loop, leak)
    truth["lines"] = {"train_forward": marked("clean_forward")}


# -- checks on what was written -------------------------------------------------------


def bytes_under(path, site):
    """Bytes and count of the blocks alive in a snapshot whose stack holds `site` (file:line)."""
    import pickle

    with open(path, "rb") as f:
        snap = pickle.load(f)
    fname, line = site.rsplit(":", 1)
    total = count = 0
    for seg in snap.get("segments", []):
        for blk in seg.get("blocks", []):
            if blk.get("state") != "active_allocated":
                continue
            if any(fr.get("filename") == fname and fr.get("line") == int(line) for fr in blk.get("frames", [])):
                total += int(blk["size"])
                count += 1
    return {"bytes": total, "count": count}


def run_workloads(module, finish):
    """Runs each workload NAME named on the command line (`module.w_NAME`) with
    `module.OUT` and `module.NAME` set, then `finish(snapshot path, truth)`, and
    writes OUT/NAME.truth.json. Shared by train.py and categories.py."""
    module.OUT = os.path.abspath(sys.argv[1])
    os.makedirs(module.OUT, exist_ok=True)
    for name in sys.argv[2:]:
        module.NAME = name
        fn = getattr(module, f"w_{name}")
        truth = {"name": name, "description": fn.__doc__, "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name(), "pid": os.getpid()}
        t0 = time.time()
        try:
            fn(truth)
        except Exception:
            traceback.print_exc()
            print(f"FAILED {name}")
            continue
        truth["seconds"] = round(time.time() - t0, 1)
        finish(os.path.join(module.OUT, f"{name}.pickle"), truth)
        with open(os.path.join(module.OUT, f"{name}.truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
        print(f"done {name} in {truth['seconds']} s")


def add_leak_bytes(final, truth):
    leak = truth.get("leak")
    if leak:
        leak["final_alive_under_entry_lines"] = {e: bytes_under(final, e) for e in leak["entry_lines"]}


def main():
    run_workloads(sys.modules[__name__], add_leak_bytes)


if __name__ == "__main__":
    main()
