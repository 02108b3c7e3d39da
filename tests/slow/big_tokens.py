"""big_tokens.py BASE GB SHARDS [MAX_LEN]: writes a generated token set of about GB
gigabytes (formats/tokens.h, version 1) without holding it in memory: BASE.h5 for 1 shard,
else BASE-0000k-of-0000N.h5, with valid dataset checksums and set_xxh3, for measuring
ftk-train's data reader on inputs larger than any test file.

Rows are packed, MAX_LEN (default 512) tokens each, one sample per row of MAX_LEN - (r % 7)
tokens (BOS, ids in [3, 512): the demo tokenizer's vocabulary, then padding with pad_id 2),
loss on every token but the first; 64 validation rows."""
import ctypes, ctypes.util, sys

import h5py
import numpy as np

lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
lib.XXH3_createState.restype = ctypes.c_void_p
lib.XXH3_64bits_reset.argtypes = [ctypes.c_void_p]
lib.XXH3_64bits_update.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
lib.XXH3_64bits_digest.argtypes = [ctypes.c_void_p]
lib.XXH3_64bits_digest.restype = ctypes.c_uint64
lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.XXH3_64bits.restype = ctypes.c_uint64
VOCAB, BOS, PAD = 512, 1, 2
NAMES = ["tokens", "loss_mask", "row_offsets", "row_samples", "sample_starts", "sample_lengths", "sample_record"]
TYPES = ["<i4", "u1", "<i8", "<i8", "<i8", "<i8", "<i8"]


class Hashed:
    """A 1-D dataset written front to back in pieces, its XXH3-64 computed on the way."""

    def __init__(self, g, name, n, dt):
        self.d = g.create_dataset(name, shape=(n,), dtype=dt)
        self.at, self.dt = 0, dt
        self.st = lib.XXH3_createState()
        lib.XXH3_64bits_reset(self.st)

    def put(self, a):
        a = np.ascontiguousarray(a, dtype=self.dt)
        self.d[self.at:self.at + len(a)] = a
        self.at += len(a)
        b = a.tobytes()
        lib.XXH3_64bits_update(self.st, b, len(b))

    def close(self):
        assert self.at == self.d.shape[0]
        s = lib.XXH3_64bits_digest(self.st)
        self.d.attrs["xxh3_64"] = np.uint64(s)
        return s


def split(f, group, r0, n, max_len, rng):
    """Global rows [r0, r0 + n) as group; returns the datasets' checksums."""
    g = f.create_group(group)
    T = n * max_len
    ds = [Hashed(g, nm, c, dt) for nm, c, dt in zip(NAMES, [T, T, n + 1, n + 1, n, n, n], TYPES)]
    step, n_pad = 8192, 0
    for a in range(0, n, step):
        k = min(step, n - a)
        r = np.arange(r0 + a, r0 + a + k)
        lens = max_len - (r % 7)
        ids = rng.integers(3, VOCAB, size=(k, max_len), dtype=np.int32)
        ids[:, 0] = BOS
        col = np.arange(max_len)[None, :]
        pad = col >= lens[:, None]
        ids[pad] = PAD
        mask = ((col > 0) & ~pad).astype(np.uint8)
        n_pad += int(pad.sum())
        ds[0].put(ids.reshape(-1))
        ds[1].put(mask.reshape(-1))
        local = np.arange(a, a + k, dtype=np.int64)
        ds[2].put(local * max_len)
        ds[3].put(local)
        ds[4].put(local * max_len)
        ds[5].put(lens)
        ds[6].put(r)
    ds[2].put([n * max_len])
    ds[3].put([n])
    g.attrs["n_rows"], g.attrs["n_samples"] = np.int64(n), np.int64(n)
    g.attrs["n_tokens"], g.attrs["n_pad"] = np.int64(T), np.int64(n_pad)
    return [d.close() for d in ds]


def main():
    base, gb, shards = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    max_len = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    rows, val = int(gb * 1e9 / (5 * max_len)), 64
    names = [base + ".h5"] if shards == 1 else ["%s-%05d-of-%05d.h5" % (base, k + 1, shards) for k in range(shards)]
    sums = []
    for k, name in enumerate(names):
        with h5py.File(name, "w") as f:
            for key, v in [("ftk_format", "tokens"), ("ftk_format_version", 1), ("ftk_version", "big_tokens.py"),
                           ("tokenizer_format", "sentencepiece"), ("tokenizer_xxh3", "0" * 16),
                           ("vocab_size", VOCAB), ("bos_id", BOS), ("eos_id", PAD), ("pad_id", PAD),
                           ("template", "alpaca"), ("mask_prompt", 1), ("max_len", max_len), ("packed", 1),
                           ("seed", 0), ("source_name", "big_tokens.py"), ("source_xxh3", "0" * 16),
                           ("n_records", rows + val), ("n_samples", rows + val), ("shard_index", k + 1),
                           ("shard_count", shards)]:
                f.attrs[key] = np.int64(v) if isinstance(v, int) else v
            rng = np.random.default_rng(k)
            s = split(f, "train", rows * k // shards, rows * (k + 1) // shards - rows * k // shards, max_len, rng)
            s += split(f, "val", val * k // shards, val * (k + 1) // shards - val * k // shards, max_len, rng)
            sums.append(s)
    b = b"ftk-tokens-set" + b"".join(np.array([k + 1], "<i8").tobytes() + np.array(s, "<u8").tobytes()
                                     for k, s in enumerate(sums))
    h = "%016x" % lib.XXH3_64bits(b, len(b))
    for name in names:
        with h5py.File(name, "r+") as f:
            f.attrs["set_xxh3"] = h
    print("%s: %d train rows of %d tokens in %d file(s), set_xxh3 %s" % (base, rows, max_len, shards, h))


main()
