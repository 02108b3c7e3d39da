"""Distributed training is the same training: 20 steps on 1, 2, 3 and 4 MPI ranks with
every strategy (full, grad-op, none; hybrid with shard groups of 2 on 4 ranks and of the
node on 2) give the single-process losses within a relative 1e-5 at every step, the same
validation losses, and the same final weights and AdamW moments within tolerance (read
from the shard files with h5py and reassembled from the manifest's shard map, not by
ftk). Each step's reported communication volume must equal DESIGN.md's formulas for the
strategy, computed here from the manifest's padded unit sizes.

Usage: dist_equivalence.py BIN_DIR ROOT WORK  (mpirun on PATH)"""
import json, os, shutil, subprocess, sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import ftkref
from ftkref import check, done

BIN, ROOT, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
ftkref.BIN = BIN
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
MPIRUN = ["mpirun", "--oversubscribe", "-np"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")

# An untied model with grouped-query attention whose unit sizes are not multiples of 3
# or 4 (so padding is exercised), and the tied stories260k shape.
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 48,
       "intermediate_size": 130, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "torch_dtype": "float32", "hidden_act": "silu", "initializer_range": 0.02}
with open(f"{WORK}/config.json", "w") as f:
    json.dump(cfg, f)
tok = f"{ROOT}/examples/demo/tokenizer.model"
ftkref.run("ftk-init", "-q", "--config", f"{WORK}/config.json", "--seed", "3", "-t", tok, "-o", f"{WORK}/untied.h5")
ftkref.run("ftk-init", "-q", "--preset", "stories260k", "--seed", "1", "-t", tok, "-o", f"{WORK}/tied.h5")
ftkref.run("ftk-pack", "-q", "-t", tok, f"{ROOT}/examples/demo/alpaca-demo.json", "-o", f"{WORK}/data.h5",
           "--pack", "--max-len", "128", "--val-count", "4")

STEPS = 20


def train(name, model, ranks, *extra):
    out = f"{WORK}/{name}"
    cmd = MPIRUN + [str(ranks), f"{BIN}/ftk-train", "-m", model, "-d", f"{WORK}/data.h5", "-o", out,
                    "--steps", str(STEPS), "--global-batch", "7", "--micro-batch", "2", "--lr", "2e-3",
                    "--warmup", "3", "--eval-every", "10", "-q", "-j1"] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"{name}: mpirun exit {r.returncode}")
    lines = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    return out, [l for l in lines if "loss" in l], [l for l in lines if "val_loss" in l]


def state(run):
    """Whole units (param, adam_m, adam_v) from every shard, trimmed to their length."""
    d = f"{run}/step-{STEPS:08d}"
    man = json.load(open(f"{d}/manifest.json"))
    S = man["shard_count"]
    out = {}
    for k in ("param", "adam_m", "adam_v"):
        for u in man["units"]:
            parts = [h5py.File(f"{d}/{s['file']}", "r")[f"{k}/{u['name']}"][()] for s in man["shards"]]
            v = np.concatenate(parts)
            assert v.size == u["padded"], (u["name"], v.size, u["padded"])
            assert not v[u["length"]:].any(), "padding must stay zero"
            out[(k, u["name"])] = v[: u["length"]]
    return man, out


def reldiff(a, b):
    return 0.0 if a == b else abs(a - b) / max(abs(b), 1e-30)


def expected_volume(man, strategy, ranks, group, micro):
    """Bytes per rank per step (DESIGN.md): AG and RS (1-1/p)*N*4, AR 2(1-1/p)*N*4."""
    P = [u["padded"] for u in man["units"]]
    S = group if strategy == "hybrid" else ranks
    f = (S - 1) / S * 4
    if strategy == "none":
        return 0.0, 0.0, 2 * (ranks - 1) / ranks * 4 * sum(P)
    rs = f * micro * sum(P)
    if strategy == "grad-op":
        ag = f * sum(P)
    else:  # full, hybrid: blocks twice (forward, backward), the embedding and the head once
        ag = f * micro * (2 * sum(P[1:-1]) + P[0] + P[-1])
    ar = 0.0
    if strategy == "hybrid":
        g = ranks // S
        ar = 2 * (g - 1) / g * 4 * sum(p // S for p in P)
    return ag, rs, ar


for model in ("untied", "tied"):
    ref, ref_loss, ref_val = train(f"{model}-1", f"{WORK}/{model}.h5", 1)
    _, ref_state = state(ref)
    configs = [(r, s, 0) for r in (2, 3, 4) for s in ("full", "grad-op", "none")]
    configs += [(4, "hybrid", 2), (2, "hybrid", 0), (1, "none", 0)]
    if model == "tied":  # the tied shape once per strategy is enough
        configs = [(3, "full", 0), (4, "grad-op", 0), (3, "none", 0), (4, "hybrid", 2)]
    worst_loss = worst_w = 0.0
    for ranks, strat, group in configs:
        extra = ["--strategy", strat] + (["--shard-group-size", str(group)] if group else [])
        name = f"{model}-{ranks}-{strat}" + (f"-g{group}" if group else "")
        run, loss, val = train(name, f"{WORK}/{model}.h5", ranks, *extra)
        rel = max(reldiff(a["loss"], b["loss"]) for a, b in zip(loss, ref_loss))
        vrel = max(reldiff(a["val_loss"], b["val_loss"]) for a, b in zip(val, ref_val))
        man, st = state(run)
        S = group if group else ranks
        wdiff = max(float(np.abs(st[k] - ref_state[k]).max()) for k in st if k[0] == "param")
        mdiff = max(float(np.abs(st[k] - ref_state[k]).max()) for k in st if k[0] != "param")
        worst_loss, worst_w = max(worst_loss, rel, vrel), max(worst_w, wdiff)
        check(len(loss) == STEPS and rel <= 1e-5 and vrel <= 1e-5,
              f"{name}: {len(loss)} steps, max relative loss difference {rel:.2e}, validation {vrel:.2e} (<= 1e-5)")
        check(wdiff <= 2e-4 and mdiff <= 2e-4,
              f"{name}: final weights within {wdiff:.2e}, AdamW moments within {mdiff:.2e} of 1 rank (<= 2e-4)")
        check(man["shard_count"] == S and man["world_size"] == ranks and man["strategy"] == strat and
              sorted(f for f in os.listdir(f"{run}/step-{STEPS:08d}") if f.startswith("shard-")) ==
              [s["file"] for s in man["shards"]],
              f"{name}: {S} shard files, manifest says strategy {man['strategy']}, world {man['world_size']}")
        bad = []
        for l in loss:
            want = expected_volume(man, strat, ranks, S, l["micro_batches"])
            got = (l["comm"]["allgather_bytes"], l["comm"]["reduce_scatter_bytes"], l["comm"]["allreduce_bytes"])
            if any(abs(g - w) > 1e-6 * max(1.0, w) for g, w in zip(got, want)):
                bad.append((l["step"], got, want))
        l0 = loss[0]
        check(not bad, f"{name}: comm volume per step = DESIGN.md's formulas (step 1: all-gather "
              f"{l0['comm']['allgather_bytes']:.0f} B, reduce-scatter {l0['comm']['reduce_scatter_bytes']:.0f} B, "
              f"all-reduce {l0['comm']['allreduce_bytes']:.0f} B, {l0['micro_batches']} micro-batches)"
              + (f"; mismatches {bad[:2]}" if bad else ""))
    print(f"note: {model}: largest relative loss difference {worst_loss:.2e}, largest weight difference {worst_w:.2e}")
done()
