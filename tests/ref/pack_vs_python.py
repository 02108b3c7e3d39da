#!/usr/bin/python3
"""ftk-pack against an independent re-derivation in Python (SentencePiece + h5py).

For every sample of every split, the tokens ftk-pack wrote must equal
[BOS] + sp.encode(alpaca prompt) + sp.encode(output) + [EOS], cut to max_len, for the record
that sample_record names, and the loss mask must be what --mask-prompt says. Also checks
that every record appears exactly once, the split sizes, and the metadata attributes.
The validation rule and the streaming packer (formats/pack.h, formats/tokens.h) are
implemented again here from their documentation, and the rows must hold exactly the
records, in the order, that this re-implementation gives. --shards 3 must give the same
global row order as one file.
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


M64 = (1 << 64) - 1
PHI = 0x9E3779B97F4A7C15


def val_key(seed, idx):
    """splitmix64's output for the state seed*phi + idx (formats/pack.c, val_key)."""
    z = (seed * PHI + idx + PHI) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


BATCH, WINDOW = 512, 256  # formats/tokens.h


def pack_rows(stream, max_len, packed):
    """stream: (record, length) in arrival order -> rows, each a list of records."""
    if not packed:
        return [[r] for r, _ in stream]
    rows, window = [], []  # window: [used, [records]] in opening order

    def place(batch):
        order = sorted(range(len(batch)), key=lambda i: (-batch[i][1], i))
        for i in order:
            rec, ln = batch[i]
            best = -1
            for j, (used, _) in enumerate(window):
                room = max_len - used
                if room >= ln and (best < 0 or room < max_len - window[best][0]):
                    best = j
            if best < 0:
                if len(window) == WINDOW:
                    full = 0
                    for j in range(1, len(window)):
                        if window[j][0] > window[full][0]:
                            full = j
                    rows.append(window.pop(full)[1])
                window.append([0, []])
                best = len(window) - 1
            window[best][0] += ln
            window[best][1].append(rec)
            if window[best][0] == max_len:
                rows.append(window.pop(best)[1])

    batch = []
    for x in stream:
        batch.append(x)
        if len(batch) == BATCH:
            place(batch)
            batch = []
    place(batch)
    rows += [w[1] for w in window]
    return rows


def expected_rows(lengths, seed, val_count, val_fraction, max_len, packed):
    """lengths: per kept record, (record, length) in input order -> (train rows, val rows)."""
    train, val = [], []
    if val_count is None:
        thr = int(val_fraction * 2.0**64)
        for r, ln in lengths:
            (val if val_key(seed, r) < thr else train).append((r, ln))
    elif val_count == 0:
        train = list(lengths)
    else:
        held = []  # (key, record, length), the val_count smallest keys so far
        for r, ln in lengths:
            k = (val_key(seed, r), r)
            if len(held) < val_count:
                held.append((k, r, ln))
            else:
                top = max(held)
                if k < top[0]:
                    held.remove(top)
                    train.append((top[1], top[2]))
                    held.append((k, r, ln))
                else:
                    train.append((r, ln))
        val = sorted((r, ln) for _, r, ln in held)
    return pack_rows(train, max_len, packed), pack_rows(val, max_len, packed)


def rows_of(g):
    rec, rs = g["sample_record"][()], g["row_samples"][()]
    return [rec[rs[i]:rs[i + 1]].tolist() for i in range(len(rs) - 1)]


def opt(args, name, conv, default):
    return conv(args[args.index(name) + 1]) if name in args else default


def check(tokpath, src, args, tag):
    out = os.path.join(work, tag + ".h5")
    r = subprocess.run([os.path.join(bindir, "ftk-pack"), "-t", tokpath, src, "-o", out, "-q", "--force"] + args,
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
    lengths = []
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
            lengths.append((int(rec[s]), len(want)))
        seen += rec.tolist()
    if sorted(seen) != list(range(len(recs))):
        fail(f"{tag}: records are not each packed exactly once")
    if n_tokens != int(a["n_tokens"]):
        fail(f"{tag}: n_tokens {int(a['n_tokens'])}, recount {n_tokens}")
    want_tr, want_va = expected_rows(sorted(lengths), opt(args, "--seed", int, 42), opt(args, "--val-count", int, None),
                                     opt(args, "--val-fraction", float, 0.03865), max_len, packed)
    got_tr, got_va = rows_of(f["train"]), rows_of(f["val"])
    if got_tr != want_tr or got_va != want_va:
        fail(f"{tag}: rows differ from the Python packer: train {len(got_tr)} vs {len(want_tr)} rows "
             f"(equal {got_tr == want_tr}), val {len(got_va)} vs {len(want_va)} (equal {got_va == want_va})")
    pad = 1 - n_tokens / max(1, sum(int(f[sp_].attrs["n_tokens"]) for sp_ in ("train", "val")))
    print(f"{tag}: {len(seen)} samples re-derived in Python, tokens and masks equal; "
          f"{len(got_tr)}+{len(got_va)} rows as the Python packer places them; padding {100 * pad:.2f}%")
    if "--shards" in args:
        return
    # The same input in 3 shards: the same rows, in the same global order.
    base = os.path.join(work, tag + "-sh")
    r = subprocess.run([os.path.join(bindir, "ftk-pack"), "-t", tokpath, src, "-o", base + ".h5", "-q", "--shards", "3",
                        "--force"] + args, capture_output=True)
    if r.returncode != 0:
        fail(f"{tag} --shards 3: exit {r.returncode}: {r.stderr.decode()}")
        return
    for split, want in (("train", got_tr), ("val", got_va)):
        got, toks = [], []
        for k in range(1, 4):
            g = h5py.File(f"{base}-{k:05d}-of-00003.h5", "r")[split]
            got += rows_of(g)
            toks.append(g["tokens"][()])
        if got != want or not np.array_equal(np.concatenate(toks), f[split]["tokens"][()]):
            fail(f"{tag}: --shards 3 does not give the rows of one file in the same order ({split})")


demo_tok = os.path.join(root, "examples/demo/tokenizer.model")
demo = os.path.join(root, "examples/demo/alpaca-demo.json")
check(demo_tok, demo, ["--pack", "--max-len", "256", "--val-count", "5"], "demo-packed")
check(demo_tok, demo, ["--max-len", "64", "--no-mask-prompt", "--seed", "7"], "demo-unpacked-cut")
check(demo_tok, demo, ["--pack", "--max-len", "64", "--val-fraction", "0.2", "--seed", "3", "-j", "1"], "demo-packed-cut")
llama = os.path.join(data, "llama2-tokenizer", "tokenizer.model")
if os.path.exists(llama):
    for src in sorted(glob.glob(os.path.join(data, "alpaca", "*.json"))):
        name = os.path.basename(src).split(".")[0]
        check(llama, src, ["--pack"], name + "-packed")
else:
    print("note: ../shared/data missing; checked the demo data only")
sys.exit(1 if failures else 0)
