"""The model and the optimizer against an independent PyTorch implementation.

A Llama written here in PyTorch from Hugging Face's conventions (RMSNorm, rotate_half
rotary embedding with rope_theta, grouped-query attention, SwiGLU, untied head), in
float64, reads the same .h5 weights with h5py and builds the same batches from the
packed token file's datasets (one causal attention block per sample, positions restarting
per sample, targets where loss_mask is 1). Compared with ftk's fp32 CPU backend:

 1. logits, loss and every parameter gradient of one batch of packed rows (probe_model);
 2. the losses of 3 optimizer steps of ftk-train (AdamW, decoupled decay but not on the
    norms, gradient clipping that bites, warmup + cosine, gradient accumulation over
    micro-batches) and the weights and both AdamW moments after them (read from the
    checkpoint through its manifest's shard map);
 3. logits, loss and gradients of ../shared/data/tiny-random-llama imported from HF;
 4. the same with a vocabulary of 65536 on rows of 157 targets, so that the output head
    runs in two chunks of target rows (128 and 29): the only case with more than one.

Errors are relative to the reference's largest magnitude per tensor: max|ftk - ref| / max|ref|.

usage: model_vs_torch.py BIN PROBE DATA WORK
"""
import json, os, subprocess, sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ftkref
from ftkref import check, done, lr_at, relerr, run
from torch_llama import batch, forward, loss_of, split, weights

BIN, PROBE, DATA, WORK = sys.argv[1:5]
ftkref.BIN = BIN
os.makedirs(WORK, exist_ok=True)
torch.set_default_dtype(torch.float64)
TOL = 1e-4
worst = {}


def compare(what, a, b, tol=TOL):
    e = relerr(a, b)
    worst[what.split(":")[0]] = max(worst.get(what.split(":")[0], 0.0), e)
    check(e < tol, f"{what}: relative error {e:.2e}")
    return e


def probe_compare(label, wpath, dpath, rows, packed=True):
    out = os.path.join(WORK, f"probe-{label}.h5")
    r = subprocess.run([PROBE, wpath, dpath, out] + [str(x) for x in rows], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit("probe_model failed")
    print(f"{label}: {r.stdout.strip()}")
    cfg, W = weights(wpath)
    for t in W.values():
        t.requires_grad_(True)
    ids, pos, seg, tgt = batch(split(dpath), rows)
    logits = forward(cfg, W, ids, pos, seg)
    loss = loss_of(logits, tgt)
    loss.backward()
    with h5py.File(out, "r") as f:
        check(int(f["n_targets"][0]) == int((tgt >= 0).sum()), f"{label}: same number of targets ({int((tgt >= 0).sum())})")
        if packed:
            check(len(set(seg.tolist())) > len(rows), f"{label}: the rows hold several samples ({len(set(seg.tolist()))} segments in {len(rows)} rows)")
        compare(f"logits: {label} [{logits.shape[0]} x {logits.shape[1]}]", f["logits"][:], logits.detach().numpy())
        lf = float(f["loss"][0])
        compare(f"loss: {label} ({lf:.6f} vs {loss.item():.6f})", [lf], [loss.item()])
        for name, t in W.items():
            compare(f"grad: {label} {name}", f["grads"][name][:], t.grad.numpy())


def mixed_rows(dpath, k):
    """k rows with the most segments (samples, then padding: the lower index on ties), in
    file order. ftk-pack writes rows in packing order, full single-sample rows of cut
    samples first, so fixed row numbers would not make a batch of several segments."""
    sp = split(dpath)
    counts, ro = np.diff(sp["row_samples"]), sp["row_offsets"]
    lens = sp["sample_lengths"]
    pad = [int(ro[r + 1] - ro[r]) - int(lens[sp["row_samples"][r]:sp["row_samples"][r + 1]].sum())
           for r in range(len(counts))]
    return sorted(sorted(range(len(counts)), key=lambda r: (-int(counts[r]), -pad[r], r))[:k])


def target_rows(dpath, want):
    """The fewest rows, most targets first (the lower index on ties), whose targets exceed
    want; in file order."""
    sp = split(dpath)
    n = []
    for r in range(len(sp["row_offsets"]) - 1):
        _, _, _, tgt = batch(sp, [r])
        n.append(int((tgt >= 0).sum()))
    rows, total = [], 0
    for r in sorted(range(len(n)), key=lambda r: (-n[r], r)):
        if total > want:
            break
        rows.append(r)
        total += n[r]
    return sorted(rows)


def adamw_compare(wpath, dpath):
    run_dir = os.path.join(WORK, "run-adamw")
    sp = split(dpath)
    R = len(sp["row_offsets"]) - 1
    hp = dict(lr=3e-3, min_lr=3e-4, warmup=2, steps=3, wd=0.1, b1=0.9, b2=0.95, eps=1e-8, clip=0.5)
    subprocess.run(["rm", "-rf", run_dir])
    run("ftk-train", "-m", wpath, "-d", dpath, "-o", run_dir, "--steps", "3", "--global-batch", str(R),
        "--micro-batch", "2", "--lr", str(hp["lr"]), "--min-lr", str(hp["min_lr"]), "--warmup", "2",
        "--weight-decay", str(hp["wd"]), "--clip", str(hp["clip"]), "--eval-every", "0", "-q")
    metrics = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in l]

    cfg, W = weights(wpath)
    ids, pos, seg, tgt = batch(sp, list(range(R)))  # every row, every step: the order does not matter

    def torch_steps(dtype):
        params = {k: t.clone().to(dtype).requires_grad_(True) for k, t in W.items()}
        norms = [p for k, p in params.items() if "norm" in k]
        rest = [p for k, p in params.items() if "norm" not in k]
        opt = torch.optim.AdamW([{"params": rest, "weight_decay": hp["wd"]}, {"params": norms, "weight_decay": 0.0}],
                                lr=hp["lr"], betas=(hp["b1"], hp["b2"]), eps=hp["eps"])
        hist = []
        for step in range(1, 4):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, hp["lr"], hp["min_lr"], hp["warmup"], hp["steps"])
            opt.zero_grad()
            loss = loss_of(forward(cfg, params, ids, pos.to(dtype), seg), tgt)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), hp["clip"]).item()
            opt.step()
            hist.append((loss.item(), norm, opt.param_groups[0]["lr"]))
        return params, opt, hist

    params, opt, hist = torch_steps(torch.float64)
    p32, _, _ = torch_steps(torch.float32)
    clipped = 0
    for step in range(1, 4):
        loss, norm, lr = hist[step - 1]
        clipped += norm > hp["clip"]
        m = metrics[step - 1]
        compare(f"adamw loss: step {step} ({m['loss']:.6f} vs {loss:.6f})", [m["loss"]], [loss])
        compare(f"adamw grad norm: step {step} ({m['grad_norm']:.5f} vs {norm:.5f})", [m["grad_norm"]], [norm])
        compare(f"adamw lr: step {step}", [m["lr"]], [lr], 1e-12)
    check(clipped >= 1, f"clipping was active ({clipped} of 3 steps above {hp['clip']})")
    # For scale: how far PyTorch's own float32 run lands from the float64 one.
    e32 = max(relerr(p32[k].detach().numpy(), params[k].detach().numpy()) for k in params)
    print(f"note: PyTorch float32 vs float64 after 3 steps: largest relative weight error {e32:.2e}")

    ck = os.path.join(run_dir, open(os.path.join(run_dir, "latest")).read().strip())
    man = json.load(open(os.path.join(ck, "manifest.json")))
    check(man["step"] == 3 and man["shard_count"] == 1, "checkpoint at step 3, one shard")
    with h5py.File(os.path.join(ck, man["shards"][0]["file"]), "r") as f:
        for u in man["units"]:
            flat = {k: f[k][u["name"]][:] for k in ("param", "adam_m", "adam_v")}
            for t in u["tensors"]:
                n = int(np.prod(t["shape"]))
                p = params[t["name"]]
                st = opt.state[p]
                for k, ref in (("param", p.detach()), ("adam_m", st["exp_avg"]), ("adam_v", st["exp_avg_sq"])):
                    got = flat[k][t["offset"]:t["offset"] + n].reshape(t["shape"])
                    compare(f"adamw {k}: {t['name']}", got, ref.numpy())


def main():
    tok = os.path.join(DATA, "llama2-tokenizer", "tokenizer.model")
    alpaca = os.path.join(DATA, "alpaca", "litgpt_fixture_alpaca.json")
    if not os.path.exists(tok) or not os.path.exists(alpaca):
        print("skipped (../shared/data missing)")
        sys.exit(77)
    cfg = ftkref.SMALL
    wpath = ftkref.small_weights(WORK)
    dpath = os.path.join(WORK, "fixture.h5")
    if os.path.exists(dpath):
        os.remove(dpath)
    run("ftk-pack", "-t", tok, alpaca, "-o", dpath, "--pack", "--max-len", "96", "--val-count", "0", "-q")
    probe_compare("small", wpath, dpath, mixed_rows(dpath, 3))
    adamw_compare(wpath, dpath)

    # The head tied to the embedding (its gradient is the sum of both uses), on unpacked
    # rows (one sample each, of different lengths).
    tied = dict(cfg, tie_word_embeddings=True, num_key_value_heads=4, hidden_size=48, num_attention_heads=4)
    tc, tw, ud = (os.path.join(WORK, x) for x in ("tied.json", "tied.h5", "unpacked.h5"))
    json.dump(tied, open(tc, "w"))
    for p in (tw, ud):
        if os.path.exists(p):
            os.remove(p)
    run("ftk-init", "--config", tc, "--seed", "4", "-o", tw)
    run("ftk-pack", "-t", tok, alpaca, "-o", ud, "--max-len", "80", "--val-count", "0", "-q")
    probe_compare("tied-unpacked", tw, ud, [0, 2, 5, 7], packed=False)

    # The output head a chunk of target rows at a time (engine/model.c: ~32 MiB of fp32
    # logits, whole 128-row tiles): a vocabulary of 65536 makes a chunk 128 rows, and rows
    # with over 128 targets make two, the second partial (logits, loss and the head's and
    # the final norm's gradients summed across chunks).
    wide = dict(cfg, vocab_size=65536)
    wc, ww = (os.path.join(WORK, x) for x in ("wide.json", "wide.h5"))
    json.dump(wide, open(wc, "w"))
    if os.path.exists(ww):
        os.remove(ww)
    run("ftk-init", "--config", wc, "--seed", "5", "-o", ww)
    rows = target_rows(dpath, 128)
    _, _, _, tgt = batch(split(dpath), rows)
    check(128 < int((tgt >= 0).sum()) <= 256, f"head chunks: {int((tgt >= 0).sum())} targets, two chunks of 128 rows")
    probe_compare("head-in-chunks", ww, dpath, rows, packed=False)  # the rows richest in targets: one sample each

    hf = os.path.join(DATA, "tiny-random-llama")
    if os.path.isdir(hf):
        tw = os.path.join(WORK, "tiny-random.h5")
        if os.path.exists(tw):
            os.remove(tw)
        run("ftk-import-hf", hf, "-o", tw)
        probe_compare("tiny-random-llama", tw, dpath, mixed_rows(dpath, 5)[3:])
    print("largest relative errors: " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))
    done()


main()
