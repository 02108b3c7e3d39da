"""Asynchronous checkpoints (ftk-train --async-save) against synchronous ones, measured in the
same run, on the largest model that trains on these machines: the 1.1 B shape (ftk-init
--preset llama-1b) in bf16-true, one process, micro-batch 1 of 128 tokens.

The same job runs twice, 5 steps saving at steps 2 and 4 (and at the end, 5, synchronously as
always):
once with synchronous saves, once with --async-save. Reported:
  - stall per checkpoint: the seconds the training loop was blocked (metrics.jsonl stall_s),
    async against the synchronous save's (goal <= 5 %);
  - step time while a background write is under way (the steps between a save and the
    step boundary where it committed) against the same steps of the synchronous run, when
    no write runs (goal <= 1.1x);
  - that both runs end on the same checkpoint (the manifests, with every shard's checksum,
    identical) and the same losses.
Skipped (exit 0, with the reason) where the memory (the plan's total + the snapshot + 1 GiB)
or the disk (two checkpoints and the weights) is not there.

usage: async_save_bench.py BIN DATA WORK [LAYERS]
LAYERS: the same shape with fewer blocks (default 22, the preset's), for a machine without the
memory or disk of the whole one.
"""
import json, os, re, shutil, subprocess, sys
from reuse import reuse  # tests/bench/reuse.py, beside this script

BIN, DATA, WORK = sys.argv[1:4]
LAYERS = int(sys.argv[4]) if len(sys.argv) > 4 else 22
os.makedirs(WORK, exist_ok=True)
tok = os.path.join(DATA, "llama2-tokenizer", "tokenizer.model")
alpaca = os.path.join(DATA, "alpaca", "BLOOM-LORA_alpaca_data_1k.json")
if not os.path.exists(tok) or not os.path.exists(alpaca):
    print("async-save bench: skipped (../shared/data missing)")
    sys.exit(0)
OPTS = ["--precision", "bf16-true", "--global-batch", "1", "--micro-batch", "1", "--steps", "5",
        "--save-every", "2", "--keep", "1", "--eval-every", "0", "--warmup", "0", "--schedule", "constant",
        "--lr", "1e-5", "-q"]


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, **kw)


# llama-1b's shape (formats/hfconfig.c), with LAYERS blocks
CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
       "intermediate_size": 5632, "num_hidden_layers": LAYERS, "num_attention_heads": 32, "num_key_value_heads": 4,
       "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
       "initializer_range": 0.02}
cpath, w, d = (os.path.join(WORK, x) for x in ("config.json", f"w{LAYERS}.h5", "d.h5"))
json.dump(CFG, open(cpath, "w"))
if not reuse(w, os.path.join(BIN, "ftk-init"), tok):
    shape = ["--preset", "llama-1b"] if LAYERS == 22 else ["--config", cpath]
    sh(os.path.join(BIN, "ftk-init"), "-q", *shape, "--dtype", "bfloat16", "-t", tok, "-o", w)
plan = sh(os.path.join(BIN, "ftk-train"), "--plan", "-m", w, "--max-len", "128", "--async-save", *OPTS,
          capture_output=True, text=True).stdout
need = int(re.search(r"total \+ snapshot .*\((\d+) bytes", plan).group(1)) + (1 << 30)
avail = int(re.search(r"MemAvailable:\s+(\d+) kB", open("/proc/meminfo").read()).group(1)) * 1024
snap = re.search(r"snapshot\s+([0-9.]+ [MG]B)", plan).group(1)
snap_bytes = float(snap.split()[0]) * (1e9 if snap.endswith("GB") else 1e6)
params = re.search(r"\(([0-9.]+ [MB]) parameters\)", plan).group(1)
if avail < need:
    print(f"async-save bench: skipped (needs {need / 2**30:.1f} GiB of memory, {avail / 2**30:.1f} GiB available)")
    sys.exit(0)
free = shutil.disk_usage(WORK).free
if free < 2.2 * snap_bytes:  # two checkpoints on disk at a commit (--keep 1 prunes after it)
    print(f"async-save bench: skipped (needs {2.2 * snap_bytes / 1e9:.0f} GB of disk for two checkpoints; "
          f"{free / 1e9:.0f} GB free)")
    sys.exit(0)
if not reuse(d, os.path.join(BIN, "ftk-pack"), tok, alpaca):
    sh(os.path.join(BIN, "ftk-pack"), "-q", "-t", tok, alpaca, "-o", d, "--pack", "--max-len", "128",
       "--val-count", "0")


SAVES = (2, 4)


def run(name, extra):
    out = os.path.join(WORK, name)
    shutil.rmtree(out, ignore_errors=True)
    sh(os.path.join(BIN, "ftk-train"), "-m", w, "-d", d, "-o", out, *OPTS, *extra)
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    manifest = open(os.path.join(out, "step-00000005", "manifest.json")).read()
    shutil.rmtree(out, ignore_errors=True)  # 6.6 GB a checkpoint: one run's at a time on disk
    return manifest, lines


def step_times(lines):
    """Seconds of each step's own work (tokens / tokens_per_s: a save after it is not in it)."""
    return {l["step"]: l["tokens"] / l["tokens_per_s"] for l in lines if "loss" in l}


def during_writes(lines):
    """Steps that ran while a background write was under way: those after a save's step, up to
    the one at whose boundary it committed (its checkpoint line comes just before that step's)."""
    out, inflight, committed = set(), set(), False
    for l in lines:
        if "checkpoint" in l and l["async"]:
            inflight.discard(l["step"])
            committed = True
        elif "loss" in l:
            if inflight or committed:
                out.add(l["step"])
            committed = False
            if l["step"] in SAVES:
                inflight.add(l["step"])
    return out


sync_man, sync = run("sync", [])
async_man, asyn = run("async", ["--async-save"])
ck = lambda lines, a: {l["step"]: l for l in lines if "checkpoint" in l and l["async"] == a}
cs, ca = ck(sync, False), ck(asyn, True)
same = sync_man == async_man
losses = lambda lines: [l["loss"] for l in lines if "loss" in l]
ts, ta = step_times(sync), step_times(asyn)
busy = sorted(s for s in during_writes(asyn) if s in ta and s in ts)
quiet = sorted(s for s in ta if s not in busy and s > 1)
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")

print(f"async-save bench (CPU, {os.cpu_count()} cores; llama-1b shape with {LAYERS} blocks, {params} parameters, "
      f"bf16-true, 1 process; "
      f"checkpoint {cs[2]['bytes'] / 1e9:.2f} GB, snapshot {snap})")
for s in SAVES:
    print(f"  checkpoint at step {s}: synchronous save {cs[s]['stall_s']:7.2f} s; --async-save: training blocked "
          f"{ca[s]['stall_s']:6.2f} s ({100 * ca[s]['stall_s'] / cs[s]['stall_s']:.1f} % of the synchronous save), "
          f"background write {ca[s]['write_s']:.2f} s")
print(f"  step time while a write is under way (steps {busy}): {mean([ta[s] for s in busy]):.2f} s, the same steps "
      f"of the synchronous run (no write): {mean([ts[s] for s in busy]):.2f} s: "
      f"{mean([ta[s] for s in busy]) / mean([ts[s] for s in busy]):.2f}x")
print(f"  step time of the async run without a write (steps {quiet}): {mean([ta[s] for s in quiet]):.2f} s")
print(f"  final checkpoints identical (manifests with every shard's checksum): {'yes' if same else 'NO'}; "
      f"losses identical: {'yes' if losses(sync) == losses(asyn) else 'NO'}")
