#!/usr/bin/python3
"""h5py (Debian's python3-h5py) opens ftk files, plain and zstd-compressed (through the
project's plugin, HDF5_PLUGIN_PATH=build/plugin), and reads the same values; the stored
xxh3_64 of each dataset matches its bytes as written by the uncompressed twin; the
compressed datasets really use filter 32015.

Usage: h5py_reads.py BIN_DIR ROOT WORK_DIR
"""
import os, subprocess, sys
import h5py, numpy as np

bindir, root, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
tok = os.path.join(root, "examples/demo/tokenizer.model")
src = os.path.join(root, "examples/demo/alpaca-demo.json")
plain, comp = os.path.join(work, "plain.h5"), os.path.join(work, "zstd.h5")
for out, extra in ((plain, []), (comp, ["--compress", "zstd:9"])):
    subprocess.run([os.path.join(bindir, "ftk-pack"), "-t", tok, src, "-o", out, "-q", "--pack", "--max-len", "256",
                    "--force"] + extra, check=True)
assert os.environ.get("HDF5_PLUGIN_PATH"), "HDF5_PLUGIN_PATH must point at build/plugin"
fails = 0
with h5py.File(plain, "r") as p, h5py.File(comp, "r") as z:
    assert p.attrs["ftk_format"] == "tokens", p.attrs["ftk_format"]
    n = 0
    def visit(name, obj):
        global fails, n
        if not isinstance(obj, h5py.Dataset):
            return
        n += 1
        a, b = obj[()], z[name][()]
        if not np.array_equal(a, b):
            fails += 1
            print("FAIL", name, "differs between the plain and the zstd file")
        if obj.attrs["xxh3_64"] != z[name].attrs["xxh3_64"]:
            fails += 1
            print("FAIL", name, "checksums differ")
        filters = z[name]._filters
        if a.size and "32015" not in filters:
            fails += 1
            print("FAIL", name, "not compressed with filter 32015:", filters)
    p.visititems(visit)
    t = p["train/tokens"][()]
    assert t.dtype == np.int32 and p["train/loss_mask"][()].dtype == np.uint8
    print(f"h5py read {n} datasets from both files: equal values; zstd file through filter 32015")
    print(f"sizes: plain {os.path.getsize(plain)} bytes, zstd {os.path.getsize(comp)} bytes")
# h5dump (hdf5-tools) reads the compressed file through the plugin as well
r = subprocess.run(["h5dump", "-d", "/train/tokens", "-c", "4", comp], capture_output=True, text=True)
if r.returncode != 0 or "DATA" not in r.stdout:
    fails += 1
    print("FAIL h5dump could not read the zstd dataset:", r.stderr[:500])
else:
    print("h5dump reads the zstd dataset through the plugin")
sys.exit(1 if fails else 0)
