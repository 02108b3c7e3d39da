#!/usr/bin/python3
"""The weights stage against independent implementations.

- ftk-import-hf of ../shared/data/tiny-random-llama (written by transformers): every tensor
  read back with h5py is bit-identical to what the safetensors reference library reads from
  the original; the /config attributes equal config.json's.
- ftk-export-hf of it: the safetensors library reads the same names, shapes, dtypes and
  bits as the original.
- dtype conversions: float32 values chosen to hit every rounding case (ties, subnormals,
  the float16 overflow boundary, inf, NaN, -0) and 200k random values of every scale,
  imported with --dtype bfloat16 and float16, equal PyTorch's .to(bfloat16/float16) and
  numpy's astype(float16) bit for bit; widening back (export --dtype float32) is exact;
  float16 -> bfloat16 equals PyTorch's.
- ftk-import-llama2c of stories260K: every tensor equals the llama2.c file's with Hugging
  Face's q/k permutation (written here with numpy reshapes, as transformers' conversion does).
Usage: weights_vs_reference.py BIN_DIR DATA_DIR WORK_DIR
"""
import json, os, subprocess, sys
import numpy as np
import h5py

np.seterr(over="ignore")  # astype(float16) of huge values is meant to give inf

BIN, DATA, WORK = sys.argv[1:4]
os.makedirs(WORK, exist_ok=True)
try:
    import torch
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print(f"skipped ({e}: needs python3-torch and the safetensors package)")
    sys.exit(77)

import ftkref
from ftkref import check, run
ftkref.BIN = BIN

def h5_tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        for name, d in f["tensors"].items():
            out[name] = (d[()], d.attrs.get("dtype"))
    return out

def bits(a):
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])

# 1. tiny-random-llama: import, compare with the reference reader.
src = os.path.join(DATA, "tiny-random-llama")
if not os.path.isdir(src):
    print(f"skipped ({src} missing)")
    sys.exit(77)
ref = load_file(os.path.join(src, "model.safetensors"))
run("ftk-import-hf", src, "-o", f"{WORK}/tiny.h5", "--force")
got = h5_tensors(f"{WORK}/tiny.h5")
check(set(got) == set(ref), f"same {len(ref)} tensor names as the safetensors library reads")
check(all(np.array_equal(bits(got[k][0]), bits(ref[k])) and got[k][0].shape == ref[k].shape for k in ref),
      "every tensor bit-identical (h5py vs safetensors library)")
cfg = json.load(open(os.path.join(src, "config.json")))
with h5py.File(f"{WORK}/tiny.h5", "r") as f:
    a = f["config"].attrs
    keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "max_position_embeddings", "bos_token_id", "eos_token_id", "rms_norm_eps", "rope_theta"]
    check(all(a[k] == cfg[k] for k in keys) and bool(a["tie_word_embeddings"]) == cfg["tie_word_embeddings"],
          "/config attributes equal config.json")
    check(f.attrs["ftk_format"] == "weights" and f.attrs["dtype"] == "float32", "root attributes")

# 2. export: the reference library reads the original bits back.
run("ftk-export-hf", f"{WORK}/tiny.h5", "-o", f"{WORK}/tiny-hf", "--force")
back = load_file(f"{WORK}/tiny-hf/model.safetensors")
check(set(back) == set(ref) and all(back[k].dtype == ref[k].dtype and np.array_equal(bits(back[k]), bits(ref[k]))
                                    for k in ref), "export: safetensors library reads identical tensors")
out_cfg = json.load(open(f"{WORK}/tiny-hf/config.json"))
check(all(out_cfg[k] == cfg[k] for k in keys + ["tie_word_embeddings", "model_type", "architectures"]),
      "export: config.json fields equal the original's")

# 3. dtype conversions against PyTorch and numpy.
special = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.996, 65520.0, 65536.0, -65520.0, 1e-8, 6e-8, 2.9802322e-08,
                    5.9604645e-08, 8.940697e-08, 6.097555e-05, 6.1035156e-05, 3.4e38, -3.4e38, np.inf, -np.inf,
                    1.0000001, 1.00390625, 1.01171875, 1.0039063, 1.0117188, 2.0**-126, 2.0**-149, 2.0**-133],
                   dtype=np.float32)
ties = (np.arange(1, 2001, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exact bf16 halfway points
ties16 = ((np.arange(1, 2001, dtype=np.uint32) << 13 | 0x1000) + 0x38800000).view(np.float32)  # f16 halfway
rng = np.random.default_rng(1)
rand = (rng.standard_normal(200000) * 10.0 ** rng.integers(-9, 6, 200000)).astype(np.float32)
nan = np.array([np.nan, -np.nan], dtype=np.float32)
vals = np.concatenate([special, -special, ties, -ties, ties16, rand, nan]).astype(np.float32)
vocab, hidden = 32000, 16
emb = np.resize(vals, (vocab, hidden)).astype(np.float32)
tensors = {k: v.copy() for k, v in ref.items()}
tensors["model.embed_tokens.weight"] = emb
os.makedirs(f"{WORK}/conv", exist_ok=True)
save_file(tensors, f"{WORK}/conv/model.safetensors", metadata={"format": "pt"})
with open(f"{WORK}/conv/config.json", "w") as f:
    json.dump(cfg, f)
t = torch.from_numpy(emb)
for dt, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
    run("ftk-import-hf", f"{WORK}/conv", "--dtype", dt, "-o", f"{WORK}/conv-{dt}.h5", "--force")
    g = h5_tensors(f"{WORK}/conv-{dt}.h5")["model.embed_tokens.weight"]
    want = t.to(tdt).view(torch.int16).numpy().view(np.uint16)
    gotb = g[0].view(np.uint16)
    isnan = np.isnan(t.to(tdt).float().numpy())
    check(np.array_equal(gotb[~isnan], want[~isnan]), f"float32 -> {dt}: every value equals PyTorch's bits "
          f"({(~isnan).sum()} values)")
    expo = 0x7F80 if dt == "bfloat16" else 0x7C00
    check(np.all((gotb[isnan] & 0x7FFF) > expo), f"float32 -> {dt}: NaN stays NaN")
    if dt == "float16":
        check(g[0].dtype == np.float16 and np.array_equal(bits(g[0])[~isnan], bits(emb.astype(np.float16))[~isnan]),
              "float32 -> float16: h5py reads numpy float16 equal to numpy's astype")
    else:
        check(g[1] == "bfloat16" and g[0].dtype == np.uint16, "bfloat16 stored as uint16 with dtype attribute")
    # widening back is exact
    run("ftk-export-hf", f"{WORK}/conv-{dt}.h5", "--dtype", "float32", "-o", f"{WORK}/conv-{dt}-f32", "--force")
    wide = load_file(f"{WORK}/conv-{dt}-f32/model.safetensors")["model.embed_tokens.weight"]
    want_wide = t.to(tdt).float().numpy()
    check(np.array_equal(bits(wide)[~isnan], bits(want_wide)[~isnan]) and np.all(np.isnan(wide[isnan])),
          f"{dt} -> float32 is exact (equals PyTorch's .float())")
# float16 -> bfloat16: one rounding, like PyTorch's
run("ftk-export-hf", f"{WORK}/conv-float16.h5", "-o", f"{WORK}/conv-f16", "--force")
run("ftk-import-hf", f"{WORK}/conv-f16", "--dtype", "bfloat16", "-o", f"{WORK}/conv-f16-bf16.h5", "--force")
g = h5_tensors(f"{WORK}/conv-f16-bf16.h5")["model.embed_tokens.weight"][0].view(np.uint16)
h = t.to(torch.float16)
want = h.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
isnan = np.isnan(h.float().numpy())
check(np.array_equal(g[~isnan], want[~isnan]), "float16 -> bfloat16 equals PyTorch's bits")
# exhaustive: every float16 bit pattern widens exactly
allh = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
tensors["model.embed_tokens.weight"] = np.resize(allh.astype(np.float32), (vocab, hidden))
tensors16 = {k: v.astype(np.float16) for k, v in tensors.items()}
tensors16["model.embed_tokens.weight"] = np.resize(allh, (vocab, hidden))
os.makedirs(f"{WORK}/all16", exist_ok=True)
save_file(tensors16, f"{WORK}/all16/model.safetensors", metadata={"format": "pt"})
with open(f"{WORK}/all16/config.json", "w") as f:
    json.dump(cfg, f)
run("ftk-import-hf", f"{WORK}/all16", "--dtype", "float32", "-o", f"{WORK}/all16.h5", "--force")
g = h5_tensors(f"{WORK}/all16.h5")["model.embed_tokens.weight"][0].reshape(-1)[:65536]
w = allh.astype(np.float32)
nn = ~np.isnan(w)
check(np.array_equal(bits(g)[nn], bits(w)[nn]) and np.all(np.isnan(g[~nn])),
      "all 65536 float16 values widen to float32 exactly (numpy)")

# 4. llama2.c: the HF permutation, written independently with numpy reshapes.
mbin = os.path.join(DATA, "stories260K", "stories260K.bin")
if os.path.exists(mbin):
    run("ftk-import-llama2c", mbin, "-t", os.path.join(DATA, "stories260K", "tok512.bin"), "-o", f"{WORK}/s260.h5",
        "--force")
    raw = np.fromfile(mbin, dtype=np.int32, count=7)
    dim, hid, L, nh, nkv, vs, sl = (int(x) for x in raw)
    w = np.fromfile(mbin, dtype=np.float32, offset=28)
    hd = dim // nh
    kvd = nkv * hd
    pos = 0
    def take(*shape):
        global pos
        n = int(np.prod(shape))
        a = w[pos:pos + n].reshape(shape)
        pos += n
        return a
    emb = take(abs(vs), dim); att = take(L, dim); wq = take(L, dim, dim); wk = take(L, kvd, dim)
    wv = take(L, kvd, dim); wo = take(L, dim, dim); ffn = take(L, dim); w1 = take(L, hid, dim)
    w2 = take(L, dim, hid); w3 = take(L, hid, dim); fin = take(dim); take(sl, hd // 2); take(sl, hd // 2)
    check(pos == w.size, "llama2.c file fully consumed by the reference reader")
    def permute(x, heads):  # transformers' convert_llama_weights_to_hf
        return x.reshape(heads, x.shape[0] // heads // 2, 2, x.shape[1]).transpose(0, 2, 1, 3).reshape(x.shape)
    want = {"model.embed_tokens.weight": emb, "model.norm.weight": fin}
    for l in range(L):
        p = f"model.layers.{l}."
        want.update({p + "input_layernorm.weight": att[l], p + "post_attention_layernorm.weight": ffn[l],
                     p + "self_attn.q_proj.weight": permute(wq[l], nh), p + "self_attn.k_proj.weight": permute(wk[l], nkv),
                     p + "self_attn.v_proj.weight": wv[l], p + "self_attn.o_proj.weight": wo[l],
                     p + "mlp.gate_proj.weight": w1[l], p + "mlp.down_proj.weight": w2[l], p + "mlp.up_proj.weight": w3[l]})
    got = h5_tensors(f"{WORK}/s260.h5")
    check(set(got) == set(want), f"llama2.c: the {len(want)} HF tensor names (shared classifier: no lm_head)")
    check(all(np.array_equal(got[k][0], want[k]) for k in want), "llama2.c: every tensor equals the reference, "
          "q/k permuted per head (grouped-query k with 4 heads)")
    with h5py.File(f"{WORK}/s260.h5", "r") as f:
        a = f["config"].attrs
        check((a["hidden_size"], a["num_key_value_heads"], a["tie_word_embeddings"], a["rms_norm_eps"]) ==
              (64, 4, 1, 1e-5), "llama2.c: config (GQA, tied, eps 1e-5)")
        check(bytes(f["tokenizer/tokenizer.bin"][()]) == open(os.path.join(DATA, "stories260K", "tok512.bin"), "rb").read(),
              "llama2.c: tokenizer.bin stored byte for byte")
else:
    print("skipped part: stories260K missing")

ftkref.done()
