"""forge_type.py FILE DATASET DTYPE [ADD]: rewrite one dataset of an ftk token file in another
HDF5 type (numpy's name: float32, float64, uint16, int32, ...), its values kept (plus ADD,
e.g. 0.7 or -0.1: a float32 loss_mask of 0.9), with valid checksums, as a producer that
ignores formats/tokens.h would: only a type check can catch it.

The dataset's xxh3_64 attribute is recomputed over its new little-endian bytes, and the
set checksum (set_xxh3, tokens_set_hash) of every shard of the file's set, so that the set
still holds together. The other attributes are kept."""
import ctypes, ctypes.util, glob, re, sys

import h5py
import numpy as np

lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
lib.XXH3_64bits.restype = ctypes.c_uint64
lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
NAMES = ["tokens", "loss_mask", "row_offsets", "row_samples", "sample_starts", "sample_lengths", "sample_record"]


def xxh3(a):
    b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return lib.XXH3_64bits(b, len(b))


path, name, dtype = sys.argv[1:4]
add = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
with h5py.File(path, "r+") as f:
    d = f[name]
    a, attrs = d[...], dict(d.attrs)
    a = a.astype(np.dtype(dtype))
    if add:
        a = a + np.array(add).astype(a.dtype) * (a != 0)
    del f[name]
    d = f.create_dataset(name, data=a)
    for k, v in attrs.items():
        d.attrs[k] = v
    d.attrs.modify("xxh3_64", np.uint64(xxh3(a)))
    count = int(f.attrs["shard_count"])

# the set checksum, in every shard (formats/tokens.c, tokens_set_hash)
m = re.fullmatch(r"(.*)-\d{5}-of-(\d{5})\.h5", path)
shards = sorted(glob.glob("%s-*-of-%s.h5" % (m.group(1), m.group(2)))) if m and count > 1 else [path]
b = b"ftk-tokens-set"
for k, p in enumerate(shards):
    with h5py.File(p, "r") as f:
        sums = [int(f[g][n].attrs["xxh3_64"]) for g in ("train", "val") for n in NAMES]
    b += np.array([k + 1], "<i8").tobytes() + np.array(sums, "<u8").tobytes()
for p in shards:
    with h5py.File(p, "r+") as f:
        f.attrs["set_xxh3"] = "%016x" % lib.XXH3_64bits(b, len(b))
print(f"forged {path}:{name} as {dtype}")
