"""Training speed on the CPU: ftk-train against PyTorch, same model, data, batch and threads,
measured in the same run; then ftk's bf16 modes against its fp32 (the cost of bf16
emulation on a CPU), with PyTorch's bf16 on the same CPU for scale.

The PyTorch side is the model of tests/ref/model_vs_torch.py in float32 (eager, autograd,
explicit attention with a block-diagonal causal mask for the packed samples: torch 1.13 has
no fused attention on the CPU), torch.optim.AdamW and clip_grad_norm_, on exactly the rows
ftk's step uses. Both are timed over the same steps after one warm-up step; the figure is
real (non-padding) tokens per second.

usage: train_bench.py BIN DATA WORK [STEPS]
"""
import json, os, subprocess, sys, time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
BIN, DATA, WORK = sys.argv[1:4]
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 6
os.makedirs(WORK, exist_ok=True)
threads = torch.get_num_threads()

CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
       "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
       "vocab_size": 32000, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
       "initializer_range": 0.02}
G, B, MAXLEN = 8, 4, 256


def sh(*args):
    subprocess.run(list(args), check=True)


tok = os.path.join(DATA, "llama2-tokenizer", "tokenizer.model")
alpaca = os.path.join(DATA, "alpaca", "BLOOM-LORA_alpaca_data_1k.json")
if not os.path.exists(tok) or not os.path.exists(alpaca):
    print("train bench: skipped (../shared/data missing)")
    sys.exit(0)
cpath, wpath, dpath, run = (os.path.join(WORK, x) for x in ("config.json", "w.h5", "d.h5", "run"))
json.dump(CFG, open(cpath, "w"))
for p in (wpath, dpath):
    if os.path.exists(p):
        os.remove(p)
sh(os.path.join(BIN, "ftk-init"), "-q", "--config", cpath, "-o", wpath)
sh(os.path.join(BIN, "ftk-pack"), "-q", "-t", tok, alpaca, "-o", dpath, "--pack", "--max-len", str(MAXLEN),
   "--val-count", "0")

# --- ftk, in each precision mode ---------------------------------------------------------------
def ftk_tps_of(precision):
    sh("rm", "-rf", run)
    sh(os.path.join(BIN, "ftk-train"), "-q", "-m", wpath, "-d", dpath, "-o", run, "--steps", str(STEPS + 1),
       "--global-batch", str(G), "--micro-batch", str(B), "--schedule", "constant",
       "--warmup", "0", "--eval-every", "0", "-j", str(threads), "--precision", precision)
    m = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"loss"' in l]
    return sum(x["tokens"] for x in m[1:]) / (m[-1]["elapsed_s"] - m[0]["elapsed_s"])


ftk_tps = ftk_tps_of("fp32")
ftk_mixed = ftk_tps_of("bf16-mixed")
ftk_true = ftk_tps_of("bf16-true")

# --- PyTorch on the same rows --------------------------------------------------------------
from torch_llama import batch, forward, split, weights  # noqa: E402

torch.set_default_dtype(torch.float32)
cfg, W = weights(wpath, torch.float32)
params = {k: t.requires_grad_(True) for k, t in W.items()}
norms = [p for k, p in params.items() if "norm" in k]
rest = [p for k, p in params.items() if "norm" not in k]
opt = torch.optim.AdamW([{"params": rest, "weight_decay": 0.1}, {"params": norms, "weight_decay": 0.0}],
                        lr=2e-4, betas=(0.9, 0.95), eps=1e-8)
sp = split(dpath)
R = len(sp["row_offsets"]) - 1
# ftk's order: the rows of each step are recorded in its data order; any G rows of the same
# packed file cost the same, so take them in file order.
steps_rows = [list(range((s * G) % R, (s * G) % R + G)) for s in range(STEPS + 1)]


def torch_run(P, optim, logits_of):
    """Tokens/s of PyTorch over the steps, the logits of a micro-batch's target positions
    from logits_of(P, ids, pos, seg, keep)."""
    t0, tokens = None, 0
    for s, rows in enumerate(steps_rows):
        if s == 1:
            t0 = time.perf_counter()
        optim.zero_grad()
        n_tgt = sum(int(sp["loss_mask"][sp["row_offsets"][r]:sp["row_offsets"][r + 1]].sum()) for r in rows)
        for i in range(0, G, B):
            ids, pos, seg, tgt = batch(sp, rows[i:i + B], torch.float32)
            keep = tgt >= 0
            logits = logits_of(P, ids, pos, seg, keep)
            loss = torch.nn.functional.cross_entropy(logits.float(), tgt[keep], reduction="sum") / n_tgt
            loss.backward()
            if s >= 1:
                tokens += sum(int(sp["sample_lengths"][sp["row_samples"][r]:sp["row_samples"][r + 1]].sum())
                              for r in rows[i:i + B])
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        optim.step()
    return tokens / (time.perf_counter() - t0)


# The head and loss on every position (as transformers and LitGPT do), then on target rows
# only (as ftk does).
torch_all = torch_run(params, opt, lambda P, ids, pos, seg, keep: forward(cfg, P, ids, pos, seg)[keep])
torch_tgt = torch_run(params, opt, lambda P, ids, pos, seg, keep: forward(cfg, P, ids, pos, seg, head_rows=keep))

# PyTorch's bf16 on the same CPU, for scale: the model in bf16 run the way transformers runs
# it (torch_llama.forward_lowp), AdamW on bf16 parameters (bf16-true).
from torch_llama import forward_lowp  # noqa: E402

pb = {k: t.detach().to(torch.bfloat16).requires_grad_(True) for k, t in W.items()}
optb = torch.optim.AdamW(list(pb.values()), lr=2e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
torch_bf16 = torch_run(pb, optb, lambda P, ids, pos, seg, keep: forward_lowp(cfg, P, ids, pos, seg)[keep])

print(f"train (CPU, {threads} threads, {sum(v.numel() for v in W.values()) / 1e6:.1f} M parameters, "
      f"global batch {G} x {MAXLEN} tokens, micro batch {B}, {STEPS} steps):")
print(f"  ftk-train (head on target rows only)              {ftk_tps:10.0f} tokens/s")
print(f"  PyTorch {torch.__version__} eager, head on every position  {torch_all:10.0f} tokens/s   ftk / PyTorch {ftk_tps / torch_all:.2f}x")
print(f"  PyTorch {torch.__version__} eager, head on target rows only  {torch_tgt:10.0f} tokens/s   ftk / PyTorch {ftk_tps / torch_tgt:.2f}x")
print(f"  ftk-train --precision bf16-mixed                   {ftk_mixed:10.0f} tokens/s   vs ftk fp32 {ftk_mixed / ftk_tps:.2f}x")
print(f"  ftk-train --precision bf16-true                    {ftk_true:10.0f} tokens/s   vs ftk fp32 {ftk_true / ftk_tps:.2f}x")
print(f"  PyTorch {torch.__version__} eager bf16 (model.to(bf16))      {torch_bf16:10.0f} tokens/s   ftk bf16-true / PyTorch bf16 {ftk_true / torch_bf16:.2f}x")
print("  (bf16 on this CPU is emulated: stored as 16 bits, widened to fp32 for arithmetic; the ratios above are its cost)")
