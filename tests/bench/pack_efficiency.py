#!/usr/bin/python3
"""Padding of ftk-pack's streaming packer against first-fit in input order and against
best-fit-decreasing over the whole split (the packer ftk-pack had before it streamed), on
every Alpaca file of the shared data, at max-len 512 (and 256), one split (--val-count 0).

Usage: pack_efficiency.py BIN_DIR DATA_DIR WORK_DIR
"""
import glob, os, subprocess, sys
import h5py, numpy as np

bindir, data, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
tok = os.path.join(data, "llama2-tokenizer", "tokenizer.model")
if not os.path.exists(tok):
    print("pack efficiency: skipped (no llama2-tokenizer in the data directory)")
    sys.exit(0)


def first_fit(lengths, m):
    rows = []  # free room
    for ln in lengths:
        for i, f in enumerate(rows):
            if f >= ln:
                rows[i] -= ln
                break
        else:
            rows.append(m - ln)
    return len(rows)


def best_fit_decreasing(lengths, m):
    free = [0] * (m + 1)  # rows by free room
    n = 0
    for ln in sorted(lengths, reverse=True):
        r = next((r for r in range(ln, m + 1) if free[r]), None)
        if r is None:
            n += 1
            free[m - ln] += 1
        else:
            free[r] -= 1
            free[r - ln] += 1
    return n


print(f"{'file':38} {'max-len':>7} {'samples':>7} {'streaming':>9} {'first-fit':>9} {'BFD whole':>9}  (padding %)")
for m in (512, 256):
    for src in sorted(glob.glob(os.path.join(data, "alpaca", "*.json"))):
        out = os.path.join(work, "eff.h5")
        subprocess.run([os.path.join(bindir, "ftk-pack"), "-q", "-t", tok, src, "-o", out, "--pack", "--max-len", str(m),
                        "--val-count", "0", "--force"], check=True)
        g = h5py.File(out, "r")["train"]
        rec, ln = g["sample_record"][()], g["sample_lengths"][()]
        lengths = [int(x) for x in ln[np.argsort(rec, kind="stable")]]
        t = sum(lengths)
        pad = lambda rows: 100 * (1 - t / (rows * m))
        print(f"{os.path.basename(src)[:38]:38} {m:7} {len(lengths):7} {pad(int(g.attrs['n_rows'])):9.2f} "
              f"{pad(first_fit(lengths, m)):9.2f} {pad(best_fit_decreasing(lengths, m)):9.2f}")
