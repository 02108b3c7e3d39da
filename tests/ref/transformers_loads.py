#!/usr/bin/python3
"""transformers' from_pretrained loads what ftk-export-hf writes, unchanged.

- tiny-random-llama imported and exported (single file, then sharded at 1MB): the model
  loads and its logits on a fixed input equal the original folder's exactly.
- ftk-init's tiny preset (grouped-query attention) exported in bfloat16: loads with
  torch_dtype=bfloat16 and every parameter has the bits of the .h5 tensor.
- stories260K imported from llama2.c and exported: greedy decoding for 200 steps from BOS
  with transformers reproduces llama2.c's own output (greedy-200.expected.txt) exactly,
  which proves the q/k permutation and the whole conversion end to end.
Usage: transformers_loads.py BIN_DIR DATA_DIR WORK_DIR
"""
import os, struct, subprocess, sys

BIN, DATA, WORK = sys.argv[1:4]
os.makedirs(WORK, exist_ok=True)
try:
    import numpy as np, h5py, torch
    import transformers
    from transformers import LlamaForCausalLM
    transformers.logging.set_verbosity_error()
except Exception as e:  # ImportError, or a transformers too new for this torch
    print(f"skipped (transformers not importable: {e})")
    sys.exit(77)

import ftkref
from ftkref import check, run
ftkref.BIN = BIN

src = os.path.join(DATA, "tiny-random-llama")
if not os.path.isdir(src):
    print(f"skipped ({src} missing)")
    sys.exit(77)
ids = torch.tensor([[1, 306, 4658, 278, 6593, 310, 2834, 338, 29871, 31999]])
with torch.no_grad():
    want = LlamaForCausalLM.from_pretrained(src).eval()(ids).logits
run("ftk-import-hf", src, "-o", f"{WORK}/tiny.h5", "--force")
for name, extra in (("single", []), ("sharded", ["--max-shard-size", "1MB"])):
    out = f"{WORK}/tiny-{name}"
    run("ftk-export-hf", f"{WORK}/tiny.h5", "-o", out, "--force", *extra)
    with torch.no_grad():
        got = LlamaForCausalLM.from_pretrained(out).eval()(ids).logits
    n = len([f for f in os.listdir(out) if f.endswith(".safetensors")])
    check(torch.equal(got, want), f"{name} export ({n} safetensors files): from_pretrained loads it, logits identical")

run("ftk-init", "--preset", "tiny", "--dtype", "bfloat16", "-o", f"{WORK}/gqa.h5", "--force")
run("ftk-export-hf", f"{WORK}/gqa.h5", "-o", f"{WORK}/gqa-hf", "--force")
m = LlamaForCausalLM.from_pretrained(f"{WORK}/gqa-hf", torch_dtype=torch.bfloat16)
sd = m.state_dict()
with h5py.File(f"{WORK}/gqa.h5", "r") as f:
    same = all(np.array_equal(sd[k].view(torch.int16).numpy().view(np.uint16), d[()]) for k, d in f["tensors"].items())
    check(same and len(f["tensors"]) == len(sd), f"grouped-query bf16 init ({m.config.num_key_value_heads} of "
          f"{m.config.num_attention_heads} KV heads): every parameter loads with the .h5's bits")
with torch.no_grad():
    check(bool(torch.isfinite(m(ids[:, :5] % 512).logits).all()), "grouped-query model runs a forward pass")

d = os.path.join(DATA, "stories260K")
if os.path.isdir(d):
    run("ftk-import-llama2c", f"{d}/stories260K.bin", "-t", f"{d}/tok512.bin", "-o", f"{WORK}/s260.h5", "--force")
    run("ftk-export-hf", f"{WORK}/s260.h5", "-o", f"{WORK}/s260-hf", "--force")
    m = LlamaForCausalLM.from_pretrained(f"{WORK}/s260-hf").eval()
    b = open(f"{d}/tok512.bin", "rb").read()
    p, vocab = 4, []
    for i in range(m.config.vocab_size):
        _, n = struct.unpack_from("<fi", b, p)
        vocab.append(b[p + 8:p + 8 + n])
        p += 8 + n
    seq = [1]
    with torch.no_grad():
        for _ in range(200):  # run.c -n 200: 200 forward steps from BOS, stop at BOS
            nxt = int(torch.argmax(m(torch.tensor([seq])).logits[0, -1]))
            if nxt == 1:
                break
            seq.append(nxt)
    text = b""
    for prev, t in zip(seq, seq[1:]):  # run.c's decode()
        piece = vocab[t]
        if prev == 1 and piece.startswith(b" "):
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            piece = bytes([int(piece[3:5], 16)])
        text += piece
    expected = open(f"{d}/greedy-200.expected.txt", "rb").read()
    check(text == expected, f"stories260K via transformers: greedy 200 tokens equal llama2.c's output "
          f"({len(expected)} bytes)")
    if text != expected:
        print(text.decode(errors="replace"))
else:
    print("skipped part: stories260K missing")

ftkref.done()
