"""Helpers shared by the reference tests: check() prints ok/FAIL and counts, run() runs
an ftk tool and stops the test when it fails, done() prints the summary and exits."""
import json, math, os, subprocess, sys

BIN = None
fails = 0

# PyTorch as on a CPU without AVX-512: its bf16 products leave oneDNN (which it takes only
# where AVX-512 BW/VL/DQ are present) for ATen's own loops; with ATEN_CPU_CAPABILITY=avx2
# that is what an AVX2-only Intel or AMD machine runs (precision_vs_torch.py).
if os.environ.get("FTK_REF_NO_MKLDNN"):
    import torch
    torch.backends.mkldnn.enabled = False

def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += 0 if cond else 1

def run(*args):
    r = subprocess.run([os.path.join(BIN, args[0])] + list(args[1:]), capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit(f"{args[0]} failed with exit {r.returncode}")

def done():
    print(f"{'FAILED' if fails else 'all passed'} ({fails} failures)")
    sys.exit(1 if fails else 0)


def lr_at(step, lr, min_lr, warmup, total):
    """The schedule of `ftk-train --help`, written again: linear warmup, then cosine."""
    if step <= warmup:
        return lr * step / warmup
    p = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    return min_lr + 0.5 * (1 + math.cos(math.pi * p)) * (lr - min_lr)


# A small Llama with grouped-query attention, an untied head and a non-default rope_theta.
SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
         "vocab_size": 32000, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 5000.0,
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
         "initializer_range": 0.05}


def small_weights(work, name="small"):
    """ftk-init weights of SMALL in WORK/NAME.h5, with non-unit RMSNorm gains (so that their
    gradients and decay matter); returns the path."""
    import h5py
    import numpy as np
    cpath, wpath = os.path.join(work, name + ".json"), os.path.join(work, name + ".h5")
    json.dump(SMALL, open(cpath, "w"))
    if os.path.exists(wpath):
        os.remove(wpath)
    run("ftk-init", "--config", cpath, "--seed", "3", "-o", wpath)
    import ctypes, ctypes.util
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    with h5py.File(wpath, "r+") as f:
        rng = np.random.default_rng(0)
        for k in f["tensors"]:
            if "norm" in k:
                a = (1 + 0.1 * rng.standard_normal(f["tensors"][k].shape)).astype("<f4")
                f["tensors"][k][...] = a
                # the file stays a whole one: its checksum (formats/h5.h: XXH3-64 of the
                # little-endian bytes) follows the new values, which ftk-train checks at load
                b = a.tobytes()
                f["tensors"][k].attrs.modify("xxh3_64", np.uint64(lib.XXH3_64bits(b, len(b))))
    return wpath


def relerr(a, b):
    """max|a - b| / max|b|: an error relative to the reference's largest magnitude."""
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a).max())


def train_order(seed, epoch, n):
    """engine/loader.c's loader_order, written again: the rows of an epoch in ftk-train's order
    (xoshiro256** seeded through splitmix64, Fisher-Yates from the end, libcommon/rng.h)."""
    M = (1 << 64) - 1
    x = (seed ^ ((0xA0761D6478BD642F * (epoch + 1)) & M)) & M
    s = []
    for _ in range(4):
        x = (x + 0x9E3779B97F4A7C15) & M
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        s.append(z ^ (z >> 31))

    def nxt():
        r = (((s[1] * 5) & M) << 7 | ((s[1] * 5) & M) >> 57) & M
        r = (r * 9) & M
        t = (s[1] << 17) & M
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t
        s[3] = ((s[3] << 45) | (s[3] >> 19)) & M
        return r

    def below(k):
        limit = M - M % k
        while True:
            v = nxt()
            if v < limit:
                return v % k

    perm = list(range(n))
    for i in range(n, 1, -1):
        j = below(i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return perm
