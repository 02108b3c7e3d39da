"""forge.py FILE DATASET EDIT: rewrite one dataset of an ftk HDF5 file with valid checksums,
as a hostile or broken producer would: only content checks can catch it.

EDIT is one of
  set:I:V          element I (negative: from the end) becomes V (an integer, nan or inf)
  reshape:D0,D1..  the dataset is replaced by one of that shape (values repeated or cut)
The dataset's xxh3_64 attribute is recomputed (XXH3-64, seed 0, of its little-endian
bytes: formats/h5.h) with the system's libxxhash, and its other attributes kept.

forge.py DIR/manifest.json KEY JSON_VALUE: a checkpoint manifest with one value changed
(KEY a dotted path: data.rows_consumed, train.lr, units.0.padded, shards.1.bytes) and its
seal (manifest_xxh3, formats/checkpoint.h) recomputed; forge.py DIR/manifest.json --seal
only recomputes the seal (after an edit by sed); --sums recomputes every shard's bytes and
xxh3 from the files beside it (after a shard was forged), then the seal. Needs no h5py.
Other scripts import seal, resum, set_key and xxh3 from here."""
import ctypes, ctypes.util, json, re, sys

lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
lib.XXH3_64bits.restype = ctypes.c_uint64
lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(a):
    import numpy as np
    b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return lib.XXH3_64bits(b, len(b))


SEAL = re.compile(r'\n  "manifest_xxh3": "[0-9a-f]{16}"\n}\n\Z')


def seal(text):
    """The manifest with its seal: XXH3-64 of every byte before the seal's line."""
    m = SEAL.search(text)
    if m:
        body = text[: m.start() + 1]
    else:
        body = text.rstrip()
        assert body.endswith("}")
        body = body[:-1].rstrip() + ",\n"
    b = body.encode()
    return body + '  "manifest_xxh3": "%016x"\n}\n' % lib.XXH3_64bits(b, len(b))


def resum(path):
    """The manifest at path with every shard's bytes and xxh3 recomputed from the files
    beside it, and sealed."""
    import os
    doc = json.loads(open(path).read())
    for e in doc["shards"]:
        b = open(os.path.join(os.path.dirname(path), e["file"]), "rb").read()
        e["bytes"], e["xxh3"] = len(b), "%016x" % lib.XXH3_64bits(b, len(b))
    doc.pop("manifest_xxh3", None)
    open(path, "w").write(seal(json.dumps(doc, indent=2) + "\n"))


def set_key(path, key, value):
    """The manifest at path with KEY (a dotted path) set to value, and sealed."""
    doc = json.loads(open(path).read())
    doc.pop("manifest_xxh3", None)
    *keys, last = key.split(".")
    o = doc
    for k in keys:
        o = o[int(k)] if isinstance(o, list) else o[k]
    o[int(last) if isinstance(o, list) else last] = value
    open(path, "w").write(seal(json.dumps(doc, indent=2) + "\n"))


def forge_json():
    path = sys.argv[1]
    if sys.argv[2] == "--sums":  # each shard's bytes and xxh3 from the file beside it
        resum(path)
    elif sys.argv[2] == "--seal":
        text = seal(open(path).read())
        open(path, "w").write(text)
    else:
        set_key(path, sys.argv[2], json.loads(sys.argv[3]))
    print(f"forged {path} ({' '.join(sys.argv[2:])})")


def forge_dataset():
    import h5py
    import numpy as np

    path, name, edit = sys.argv[1:4]
    with h5py.File(path, "r+") as f:
        d = f[name]
        a, attrs, dt = d[...], dict(d.attrs), d.dtype
        kind, arg = edit.split(":", 1)
        if kind == "set":
            i, v = arg.split(":")
            a.reshape(-1)[int(i)] = np.array(float(v) if v.lower() in ("nan", "inf", "-inf") else int(v)).astype(dt)
        elif kind == "reshape":
            shape = tuple(int(x) for x in arg.split(","))
            a = np.resize(a, shape).astype(dt)
        else:
            sys.exit(f"forge.py: unknown edit {edit}")
        del f[name]
        d = f.create_dataset(name, data=a, dtype=dt)
        for k, v in attrs.items():
            d.attrs[k] = v
        d.attrs.modify("xxh3_64", np.uint64(xxh3(a)))
        # A token file's set checksum is made from its datasets' (formats/tokens.h,
        # tokens_set_hash): a producer that forges one forges the other (one-file sets).
        if f.attrs.get("ftk_format") == "tokens" and f.attrs.get("shard_count") == 1:
            names = ["tokens", "loss_mask", "row_offsets", "row_samples", "sample_starts", "sample_lengths",
                     "sample_record"]
            sums = [int(f[g][n].attrs["xxh3_64"]) for g in ("train", "val") for n in names]
            b = b"ftk-tokens-set" + np.array([1], "<i8").tobytes() + np.array(sums, "<u8").tobytes()
            f.attrs["set_xxh3"] = "%016x" % lib.XXH3_64bits(b, len(b))
    print(f"forged {path}:{name} ({edit})")


if __name__ == "__main__":
    forge_json() if sys.argv[1].endswith(".json") else forge_dataset()
