"""`ftk-train --recipe litgpt` against LitGPT's formulas written again in PyTorch (LitGPT
itself, which needs torch 2.x, is make test-slow's tests/slow/litgpt_ref.py):

 1. the learning rate of every step: LitGPT's finetune scheduler, built here from Debian
    torch's own classes as litgpt/finetune/full.py builds it — SequentialLR of
    LambdaLR(step / warmup) and CosineAnnealingLR(T_max = steps - warmup, eta_min 0),
    stepped after each optimizer step — so step 1 runs at 0 and the decay ends at 0
    although --min-lr 6e-5 is given (ftk-train says it is not used);
 2. the loss of every step and the weights after the last: a float64 Llama (torch_llama.py)
    trained as LitGPT's loop does — each micro-batch's own token mean divided by the number
    of micro-batches (backward of loss / J), torch.optim.AdamW with weight decay on every
    parameter, no clipping — on the rows in ftk-train's order (ftkref.train_order), with one
    micro-batch per step (8 rows) and with three (3 + 3 + 2 rows: the last one shorter);
 3. the recipe on 2 and 3 MPI ranks: the same losses as on one (a micro-batch is rows
    [j·B, (j+1)·B) of the global batch, however the ranks split it: with 3 ranks and B = 3
    every micro-batch but one spans two ranks);
 4. resume: stopped after 4 steps and resumed, the losses and the final checkpoint are
    those of the run that did not stop, bit for bit; a resume with another --loss-mean or
    without the recipe is refused naming the option; the manifest records the recipe;
 5. without the recipe nothing changed: --loss-mean global --warmup-style ftk given
    explicitly give the default run's losses bit for bit, and --warmup-style ftk's lr is
    ftk's schedule (ftkref.lr_at).

Bounds: losses 1e-5 relative (float32 against float64: 6e-8 seen); final weights 1e-4 in
the L2 norm per tensor (7e-6 seen) and 1e-3 of its largest magnitude (2.7e-4 seen, in the
embedding: AdamW moves a weight by up to lr whatever its gradient's size, so the rows of
rarely seen tokens, whose gradients are float32 roundings, wander by more than the rest,
1e-5 and below); ranks 1e-5 (dist_equivalence.py's fp32 bound; 2e-9 seen).

usage: litgpt_recipe.py BIN ROOT WORK"""
import json, os, shutil, subprocess, sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ftkref
from ftkref import check, done, relerr, run
from torch_llama import batch, forward, split, weights

BIN, ROOT, WORK = sys.argv[1:4]
ftkref.BIN = BIN
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
torch.set_default_dtype(torch.float64)
MPIRUN = ["mpirun", "--oversubscribe", "-np"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")

cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 48,
       "intermediate_size": 130, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "torch_dtype": "float32", "hidden_act": "silu", "initializer_range": 0.02}
json.dump(cfg, open(f"{WORK}/config.json", "w"))
tok = f"{ROOT}/examples/demo/tokenizer.model"
MODEL, DATA = f"{WORK}/model.h5", f"{WORK}/data.h5"
run("ftk-init", "-q", "--config", f"{WORK}/config.json", "--seed", "3", "-t", tok, "-o", MODEL)
# LitGPT's Alpaca: one sample per row, the prompt's tokens targets too
run("ftk-pack", "-q", "-t", tok, f"{ROOT}/examples/demo/alpaca-demo.json", "-o", DATA, "--no-mask-prompt",
    "--max-len", "64", "--val-count", "7")

# 33 training rows: 5 steps an epoch (the last of 1 row), so the order turns over; 7 validation rows
STEPS, G, W, LR, SEED = 8, 8, 3, 3e-3, 1337


def train(name, mb, *extra, ranks=1, code=0, ev=0):
    out = f"{WORK}/{name}"
    cmd = ([] if ranks == 1 else MPIRUN + [str(ranks)]) + [
        f"{BIN}/ftk-train", "-m", MODEL, "-d", DATA, "-o", out, "--steps", str(STEPS), "--global-batch", str(G),
        "--micro-batch", str(mb), "--lr", str(LR), "--warmup", str(W), "--precision", "fp32", "--eval-every", str(ev),
        "-j1"] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != code:
        print(r.stdout, r.stderr)
        raise SystemExit(f"{name}: exit {r.returncode}, expected {code}")
    if code:
        return out, r.stderr
    steps = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    return out, [s for s in steps if "loss" in s or "val_loss" in s], r.stderr


def final_weights(out, name):
    run("ftk-merge", "-q", f"{out}/step-{STEPS:08d}", "-o", f"{WORK}/{name}.h5")
    return weights(f"{WORK}/{name}.h5")[1]


# ---- the reference: LitGPT's loop, written again ----------------------------------------

def litgpt_scheduler(opt, warmup, max_steps):
    """litgpt/finetune/full.py's get_lr_scheduler."""
    s1 = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: step / warmup)
    s2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=(max_steps - warmup))
    return torch.optim.lr_scheduler.SequentialLR(opt, [s1, s2], milestones=[warmup])


def mean_of_means(c, params, sp, rows, mb):
    """LitGPT's loss of rows cut into micro-batches of mb: the mean of their token means."""
    out = []
    for j in range(0, len(rows), mb):
        ids, pos, seg, tgt = batch(sp, rows[j:j + mb])
        keep = tgt >= 0
        logits = forward(c, params, ids, pos, seg, head_rows=keep)
        # chunked_cross_entropy: the micro-batch's own token mean
        out.append(torch.nn.functional.cross_entropy(logits, tgt[keep], reduction="sum") / max(int(keep.sum()), 1))
    return out


def reference(mb):
    """The losses and lrs of the steps, the validation losses at steps 0, 4 and 8 (all 7 rows,
    micro-batches of mb), the final weights."""
    c, W0 = weights(MODEL)
    sp, vsp = split(DATA), split(DATA, "val")
    val_rows = list(range(len(vsp["row_offsets"]) - 1))
    val = {}
    R = len(sp["row_offsets"]) - 1
    params = {k: v.clone().requires_grad_(True) for k, v in W0.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    sched = litgpt_scheduler(opt, W, STEPS)
    epoch, done_rows, perm = 0, 0, ftkref.train_order(SEED, 0, R)
    losses, lrs = [], []
    for step in range(STEPS):
        if step % 4 == 0:
            with torch.no_grad():
                val[step] = float(sum(mean_of_means(c, params, vsp, val_rows, mb)) / -(-len(val_rows) // mb))
        if done_rows >= R:
            epoch, done_rows = epoch + 1, 0
            perm = ftkref.train_order(SEED, epoch, R)
        rows = perm[done_rows:done_rows + G]
        done_rows += len(rows)
        micro = [rows[j:j + mb] for j in range(0, len(rows), mb)]
        lrs.append(opt.param_groups[0]["lr"])
        total = 0.0
        for loss in mean_of_means(c, params, sp, rows, mb):
            (loss / len(micro)).backward()  # fabric.backward(loss / gradient_accumulation_iters)
            total += loss.item() / len(micro)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(total)
    with torch.no_grad():
        val[STEPS] = float(sum(mean_of_means(c, params, vsp, val_rows, mb)) / -(-len(val_rows) // mb))
    return losses, lrs, val, {k: v.detach() for k, v in params.items()}


def max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


# ---- 1, 2: one micro-batch per step, and three --------------------------------------------
runs = {}
for mb in (8, 3):
    out, st, err = train(f"recipe-mb{mb}", mb, "--recipe", "litgpt", "--min-lr", "6e-5", "--save-every", "4", ev=4)
    vals = {s["step"]: s["val_loss"] for s in st if "val_loss" in s}
    st = [s for s in st if "loss" in s]
    runs[mb] = (out, st, vals)
    ref_loss, ref_lr, ref_val, ref_w = reference(mb)
    e = max(abs(vals[k] - ref_val[k]) / ref_val[k] for k in ref_val) if sorted(vals) == sorted(ref_val) else 1
    check(e < 1e-5, f"micro-batch {mb}: validation losses at steps {sorted(vals)} within {e:.2e} of the mean of "
          f"micro-batch means over the 7 rows (bound 1e-5)")
    check(len(st) == STEPS, f"micro-batch {mb}: {len(st)} steps")
    if mb == 8:
        check("--min-lr 6e-05 is not used" in err, "--recipe litgpt says that --min-lr is not used")
        lr_err = max(abs(s["lr"] - r) / LR for s, r in zip(st, ref_lr))
        print(f"     lr  ftk {[round(s['lr'], 8) for s in st]}\n     lr  ref {[round(r, 8) for r in ref_lr]}")
        check(lr_err < 1e-12 and st[0]["lr"] == 0.0, f"the lr of every step is LitGPT's (max error {lr_err:.2e} of lr; "
              f"step 1 at {st[0]['lr']}, the last at {st[-1]['lr']:.3g})")
    e = max_rel([s["loss"] for s in st], ref_loss)
    check(e < 1e-5, f"micro-batch {mb} ({-(-G // mb)} a step): losses within {e:.2e} relative of the mean of "
          f"micro-batch means (bound 1e-5)")
    fw = final_weights(out, f"final-mb{mb}")
    we = max(relerr(fw[k].numpy(), ref_w[k].numpy()) for k in ref_w)
    rms = max(float(np.linalg.norm(fw[k].numpy() - ref_w[k].numpy()) / np.linalg.norm(ref_w[k].numpy()))
              for k in ref_w)
    print("     " + ", ".join(f"{k.replace('model.', '')} {relerr(fw[k].numpy(), ref_w[k].numpy()):.1e}" for k in ref_w))
    check(we < 1e-3 and rms < 1e-4, f"micro-batch {mb}: final weights within {we:.2e} of the largest (bound 1e-3), "
          f"{rms:.2e} in the L2 norm (bound 1e-4)")

# the micro-batch means are not the global mean: the test can tell them apart
_, st_g, err = train("global-mb3", 3, "--recipe", "litgpt", "--loss-mean", "global", "--no-save")
check("not used" not in err, "without --min-lr, no word about it")
d = max_rel([s["loss"] for s in st_g], [s["loss"] for s in runs[3][1]])
check(d > 1e-5, f"--loss-mean global differs from micro by {d:.2e} relative (the test can see the difference)")

# ---- 3: ranks ---------------------------------------------------------------------------------
for n in (2, 3):
    _, st_n, _ = train(f"recipe-mb3-np{n}", 3, "--recipe", "litgpt", "--no-save", ranks=n, ev=4)
    vals = {s["step"]: s["val_loss"] for s in st_n if "val_loss" in s}
    st_n = [s for s in st_n if "loss" in s]
    e = max_rel([s["loss"] for s in st_n], [s["loss"] for s in runs[3][1]])
    check(len(st_n) == STEPS and e < 1e-5, f"{n} ranks: the losses of 1 rank within {e:.2e} (bound 1e-5)")
    e = max(abs(vals[k] - runs[3][2][k]) / runs[3][2][k] for k in vals) if sorted(vals) == sorted(runs[3][2]) else 1
    check(e < 1e-5, f"{n} ranks: the validation losses of 1 rank within {e:.2e} (bound 1e-5)")

# ---- 4: resume ---------------------------------------------------------------------------------
out, err = train("resume", 3, "--recipe", "litgpt", "--save-every", "4", "--stop-after", "4", code=75)
man = json.load(open(f"{out}/step-00000004/manifest.json"))["train"]
check((man.get("recipe"), man.get("warmup_style"), man.get("loss_mean"), man.get("min_lr"), man.get("clip"),
       man.get("decay_norms")) == ("litgpt", "litgpt", "micro", 0, 0, True),
      f"the manifest records the recipe: {man.get('recipe')}, {man.get('warmup_style')}, {man.get('loss_mean')}, "
      f"min_lr {man.get('min_lr')}, clip {man.get('clip')}, decay_norms {man.get('decay_norms')}")
_, err = train("resume", 3, "--recipe", "litgpt", "--loss-mean", "global", "--resume", "auto", code=2)
check("--loss-mean differs" in err, "a resume with another --loss-mean is refused naming it")
_, err = train("resume", 3, "--resume", "auto", "--clip", "0", "--decay-norms", "--min-lr", "0", code=2)
check("--recipe differs" in err, "a resume without the recipe is refused naming --recipe")
_, st_r, _ = train("resume", 3, "--recipe", "litgpt", "--save-every", "4", "--resume", "auto")
same = [s["loss"] for s in st_r] == [s["loss"] for s in runs[3][1]]
check(same, "resumed after 4 steps: the losses of the run that did not stop, bit for bit")
a, b = h5py.File(f"{out}/step-{STEPS:08d}/shard-00001-of-00001.h5"), \
    h5py.File(f"{runs[3][0]}/step-{STEPS:08d}/shard-00001-of-00001.h5")
check(all(np.array_equal(a[g][u][...], b[g][u][...]) for g in ("param", "adam_m", "adam_v") for u in a[g]),
      "resumed: the final weights and moments bit for bit")

# resharded to 2 ranks at step 4 and resumed there: the losses of the 1-rank run
rs = f"{WORK}/reshard"
os.makedirs(rs)
run("ftk-reshard", "-q", f"{out}/step-00000004", "-o", f"{rs}/step-00000004", "--ranks", "2")
open(f"{rs}/latest", "w").write("step-00000004\n")
man = json.load(open(f"{rs}/step-00000004/manifest.json"))["train"]
check((man.get("recipe"), man.get("loss_mean")) == ("litgpt", "micro"), "ftk-reshard keeps the recipe")
r = subprocess.run(MPIRUN + ["2", f"{BIN}/ftk-train", "-m", MODEL, "-d", DATA, "-o", rs, "--steps", str(STEPS),
                             "--global-batch", str(G), "--micro-batch", "3", "--lr", str(LR), "--warmup", str(W),
                             "--precision", "fp32", "--eval-every", "0", "-j1", "--recipe", "litgpt", "--save-every",
                             "4", "--resume", "auto"], capture_output=True, text=True, timeout=600)
st_rs = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{rs}/metrics.jsonl") if '"loss"' in l}
one = {s["step"]: s["loss"] for s in runs[3][1]}
e = max(abs(st_rs[k] - one[k]) / one[k] for k in st_rs) if st_rs else float("inf")
# (ftk-reshard carried the history of steps 1-4 into the new run directory)
check(r.returncode == 0 and sorted(st_rs) == list(range(1, STEPS + 1)) and e < 1e-5,
      f"resharded to 2 ranks and resumed: steps {sorted(st_rs)} within {e:.2e} of 1 rank's (bound 1e-5)")

# ---- 5: the switches at their defaults change nothing ----------------------------------------
_, st0, _ = train("default", 3, "--no-save")
_, st1, _ = train("explicit", 3, "--no-save", "--recipe", "ftk", "--loss-mean", "global", "--warmup-style", "ftk")
check([s["loss"] for s in st0] == [s["loss"] for s in st1] and [s["lr"] for s in st0] == [s["lr"] for s in st1],
      "--recipe ftk --loss-mean global --warmup-style ftk: the default run, bit for bit")
e = max(abs(s["lr"] - ftkref.lr_at(s["step"], LR, 6e-5, W, STEPS)) for s in st0)
check(e < 1e-15, f"the default lr is ftk's schedule (error {e:.1e}; step 1 at {st0[0]['lr']:.3g})")
_, st2, _ = train("style-only", 3, "--no-save", "--warmup-style", "litgpt", "--min-lr", "0")
check([s["lr"] for s in st2] == [s["lr"] for s in runs[3][1]] and st2[0]["lr"] == 0,
      "--warmup-style litgpt --min-lr 0 alone: the recipe's lr")
done()
