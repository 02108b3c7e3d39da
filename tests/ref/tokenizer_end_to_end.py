#!/usr/bin/python3
"""The tokenizer carried end to end, checked by transformers.

A Hugging Face Llama folder without tokenizer files (tiny-random-llama's config and weights)
is imported with --tokenizer (Llama 2's tokenizer folder, without tokenizer.json), the Alpaca fixture packed with
the weights file as its tokenizer, trained a few steps, merged and exported. Then:
- transformers' AutoTokenizer loads the exported folder and encodes like the original
  Llama 2 tokenizer folder does;
- AutoModelForCausalLM loads it, every parameter equal to the merged .h5's tensor, and it
  runs a forward pass on those ids;
- the packed data's tokens for a record are the ids AutoTokenizer gives the same text (the
  tokenizer ftk-pack took out of the weights file is the exported one).
Usage: tokenizer_end_to_end.py BIN_DIR DATA_DIR WORK_DIR
"""
import os, shutil, sys

BIN, DATA, WORK = sys.argv[1:4]
try:
    import numpy as np, h5py, torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    transformers.logging.set_verbosity_error()
except Exception as e:  # ImportError, or a transformers too new for this torch
    print(f"skipped (transformers not importable: {e})")
    sys.exit(77)

import ftkref
from ftkref import check, run
ftkref.BIN = BIN

src, tok = os.path.join(DATA, "tiny-random-llama"), os.path.join(DATA, "llama2-tokenizer")
if not os.path.isdir(src) or not os.path.isfile(os.path.join(tok, "tokenizer.model")):
    print(f"skipped ({src} or {tok} missing)")
    sys.exit(77)
shutil.rmtree(WORK, ignore_errors=True)
hf = os.path.join(WORK, "hf")
os.makedirs(hf)
for f in os.listdir(src):  # the folder without its tokenizer files
    if f == "config.json" or f.endswith(".safetensors"):
        shutil.copy(os.path.join(src, f), hf)
check(not any(f.startswith("tokenizer") for f in os.listdir(hf)), "the HF folder has no tokenizer files")

# Llama 2's tokenizer without its tokenizer.json, which tokenizers 0.15.2 cannot read (see
# chat_template_vs_transformers.py); AutoTokenizer gives the slow LlamaTokenizer (SentencePiece;
# building the fast one from tokenizer.model would need protobuf).
given = os.path.join(WORK, "tokenizer")
os.makedirs(given)
for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(os.path.join(tok, f), given)
run("ftk-import-hf", hf, "-o", f"{WORK}/w.h5", "--tokenizer", given)
alpaca = os.path.join(DATA, "alpaca", "litgpt_fixture_alpaca.json")
run("ftk-pack", "-t", f"{WORK}/w.h5", alpaca, "-o", f"{WORK}/d.h5", "--max-len", "64", "--val-count", "2")
run("ftk-train", "-m", f"{WORK}/w.h5", "-d", f"{WORK}/d.h5", "-o", f"{WORK}/run", "--steps", "3",
    "--global-batch", "4", "--micro-batch", "2", "--warmup", "1", "--eval-every", "0", "-j", "1")
run("ftk-merge", f"{WORK}/run", "-o", f"{WORK}/final.h5")
run("ftk-export-hf", f"{WORK}/final.h5", "-o", f"{WORK}/out")

out = f"{WORK}/out"
texts = ["Hello world", "Give three tips for staying healthy.", "  leading spaces and ünïcödé"]
got_tok = AutoTokenizer.from_pretrained(out, use_fast=False)
want_tok = AutoTokenizer.from_pretrained(given, use_fast=False)
check([got_tok(t).input_ids for t in texts] == [want_tok(t).input_ids for t in texts],
      f"AutoTokenizer loads the export ({type(got_tok).__name__}) and encodes as Llama 2's tokenizer folder does")

m = AutoModelForCausalLM.from_pretrained(out).eval()
sd = m.state_dict()
with h5py.File(f"{WORK}/final.h5", "r") as f:
    same = all(np.array_equal(sd[k].numpy(), d[()]) for k, d in f["tensors"].items())
    check(same and len(f["tensors"]) == len(sd), f"AutoModelForCausalLM loads it ({type(m).__name__}), every "
          "parameter equal to the merged weights'")
ids = torch.tensor([got_tok(texts[1]).input_ids])
with torch.no_grad():
    check(bool(torch.isfinite(m(ids).logits).all()), "the model runs a forward pass on the tokenizer's ids")

# The packed rows hold what AutoTokenizer gives the record's text: the Alpaca prompt's
# first tokens (BOS, then the template's "Below is an instruction ...").
with h5py.File(f"{WORK}/d.h5", "r") as f:
    first = f["train"]["tokens"][:8].tolist()
prompt = "Below is an instruction that describes a task"
check(first == got_tok(prompt).input_ids[:8], "the packed data starts with the ids AutoTokenizer gives the prompt")
ftkref.done()
