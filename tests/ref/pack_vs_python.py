#!/usr/bin/python3
"""ftk-pack against an independent re-derivation in Python (SentencePiece + h5py).

For every sample of every split, the tokens ftk-pack wrote must equal
[BOS] + sp.encode(alpaca prompt) + sp.encode(output) + [EOS], cut to max_len, for the record
that sample_record names, and the loss mask must be what --mask-prompt says. Also checks
that every record appears exactly once, the split sizes, and the metadata attributes.
Runs on the demo data (always) and on every Alpaca file of ../shared/data (when present).

Usage: pack_vs_python.py BIN_DIR ROOT DATA_DIR WORK_DIR
"""
import glob, json, os, subprocess, sys
import h5py, numpy as np, sentencepiece as spm

bindir, root, data, work = sys.argv[1:5]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alpaca_template import prompt_of  # noqa: E402

os.makedirs(work, exist_ok=True)
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL", msg)


def check(tokpath, src, args, tag):
    out = os.path.join(work, tag + ".h5")
    r = subprocess.run([os.path.join(bindir, "ftk-pack"), "-t", tokpath, src, "-o", out, "-q"] + args,
                       capture_output=True)
    if r.returncode != 0:
        fail(f"{tag}: ftk-pack exit {r.returncode}: {r.stderr.decode()}")
        return
    sp = spm.SentencePieceProcessor(model_file=tokpath)
    recs = json.load(open(src, encoding="utf-8"))
    f = h5py.File(out, "r")
    a = f.attrs
    max_len, mask_prompt, packed = int(a["max_len"]), bool(a["mask_prompt"]), bool(a["packed"])
    assert a["ftk_format"] == "tokens" and int(a["ftk_format_version"]) == 1
    assert int(a["vocab_size"]) == sp.vocab_size() and int(a["bos_id"]) == sp.bos_id() and int(a["eos_id"]) == sp.eos_id()
    assert int(a["n_records"]) == len(recs)
    seen = []
    n_tokens = 0
    for split in ("train", "val"):
        g = f[split]
        toks, mask = g["tokens"][()], g["loss_mask"][()]
        starts, lens, rec = g["sample_starts"][()], g["sample_lengths"][()], g["sample_record"][()]
        rows = g["row_offsets"][()]
        if packed and len(rows) > 1 and not np.all(np.diff(rows) == max_len):
            fail(f"{tag}/{split}: packed rows are not all {max_len} long")
        bad = 0
        for s in range(len(starts)):
            rr = recs[rec[s]]
            p = [sp.bos_id()] + sp.encode(prompt_of(rr))
            full = p + sp.encode(rr["output"]) + [sp.eos_id()]
            want = full[:max_len]
            got = toks[starts[s]:starts[s] + lens[s]].tolist()
            wm = [0] + [(1 if (not mask_prompt or k >= len(p)) else 0) for k in range(1, len(want))]
            gm = mask[starts[s]:starts[s] + lens[s]].tolist()
            if got != want or gm != wm:
                bad += 1
                if bad <= 3:
                    fail(f"{tag}/{split}: sample {s} (record {rec[s]}) differs: tokens equal {got == want}, mask equal {gm == wm}")
            n_tokens += len(want)
        seen += rec.tolist()
    if sorted(seen) != list(range(len(recs))):
        fail(f"{tag}: records are not each packed exactly once")
    if n_tokens != int(a["n_tokens"]):
        fail(f"{tag}: n_tokens {int(a['n_tokens'])}, recount {n_tokens}")
    print(f"{tag}: {len(seen)} samples re-derived in Python, tokens and masks equal")


demo_tok = os.path.join(root, "examples/demo/tokenizer.model")
demo = os.path.join(root, "examples/demo/alpaca-demo.json")
check(demo_tok, demo, ["--pack", "--max-len", "256", "--val-count", "5"], "demo-packed")
check(demo_tok, demo, ["--max-len", "64", "--no-mask-prompt", "--seed", "7"], "demo-unpacked-cut")
llama = os.path.join(data, "llama2-tokenizer", "tokenizer.model")
if os.path.exists(llama):
    for src in sorted(glob.glob(os.path.join(data, "alpaca", "*.json"))):
        name = os.path.basename(src).split(".")[0]
        check(llama, src, ["--pack"], name + "-packed")
else:
    print("note: ../shared/data missing; checked the demo data only")
sys.exit(1 if failures else 0)
