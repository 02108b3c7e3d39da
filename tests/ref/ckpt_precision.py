#!/usr/bin/python3
"""h5py reads ftk checkpoints of each precision (checkpoint.h), independently of ftk:

  rounded FP32_CKPT BF16_CKPT   the bf16-true checkpoint (same shard count) stores every
                                value of the fp32 one as PyTorch rounds it to bfloat16
                                (.to(torch.bfloat16): nearest even), weights and both
                                moments, as uint16 with dataset attribute dtype = "bfloat16"
  merged BF16_CKPT MERGED.h5    a float32 merge of a bf16-true checkpoint holds, for every
                                tensor (and each moment under /optimizer, when present),
                                exactly the bfloat16 values widened, reassembled from the
                                shards by the manifest's shard map

Prints one line per check; exits 1 when any fails.
"""
import json, os, sys
import h5py, numpy as np

KINDS = ("param", "adam_m", "adam_v")
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += 0 if cond else 1


def manifest(ck):
    with open(os.path.join(ck, "manifest.json")) as f:
        return json.load(f)


def shards(ck, man):
    return [h5py.File(os.path.join(ck, s["file"]), "r") for s in man["shards"]]


def bf16_dataset(ds):
    """A bfloat16 dataset as ftk stores it: its uint16 values, or None when it is not one."""
    a = ds[()]
    tag = ds.attrs.get("dtype")
    tag = tag.decode() if isinstance(tag, bytes) else tag
    return a if a.dtype == np.uint16 and tag == "bfloat16" else None


def widen(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def rounded(fp32_ck, bf16_ck):
    import torch
    ma, mb = manifest(fp32_ck), manifest(bf16_ck)
    check(ma["precision"] in ("fp32", "bf16-mixed") and mb["precision"] == "bf16-true",
          f"precisions {ma['precision']} and {mb['precision']}")
    check(ma["shard_count"] == mb["shard_count"], "the same shard count")
    n = tagged = equal = 0
    for fa, fb in zip(shards(fp32_ck, ma), shards(bf16_ck, mb)):
        for k in KINDS:
            for u in ma["units"]:
                a = fa[f"{k}/{u['name']}"][()]
                b = bf16_dataset(fb[f"{k}/{u['name']}"])
                n += 1
                if a.dtype != np.float32 or b is None:
                    continue
                tagged += 1
                want = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
                equal += np.array_equal(b, want)
    check(tagged == n, f"{n} datasets: float32 in one, uint16 tagged dtype=bfloat16 in the other ({tagged})")
    check(equal == n, f"every value is PyTorch's nearest-even bfloat16 of the float32 one ({equal} of {n} datasets)")


def merged(bf16_ck, merged_h5):
    man = manifest(bf16_ck)
    check(man["precision"] == "bf16-true", "a bf16-true checkpoint")
    files = shards(bf16_ck, man)
    S = man["shard_count"]
    with h5py.File(merged_h5, "r") as m:
        kinds = KINDS if "optimizer" in m else KINDS[:1]
        n = equal = 0
        for k in kinds:
            for u in man["units"]:
                parts = [bf16_dataset(f[f"{k}/{u['name']}"]) for f in files]
                if any(p is None for p in parts) or sum(len(p) for p in parts) != u["padded"]:
                    check(False, f"/{k}/{u['name']}: bfloat16 slices of {u['padded']} // {S} values")
                    continue
                unit = widen(np.concatenate(parts))
                for t in u["tensors"]:
                    numel = int(np.prod(t["shape"]))
                    want = unit[t["offset"]:t["offset"] + numel].reshape(t["shape"])
                    got = m[("tensors/" if k == "param" else f"optimizer/{k}/") + t["name"]][()]
                    n += 1
                    # bit for bit (NaN payloads included)
                    equal += got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
        check(n > 0 and equal == n,
              f"{equal} of {n} merged float32 tensors{' and moments' if len(kinds) > 1 else ''} = the shards' "
              "bfloat16 values widened")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("rounded", "merged"):
        sys.exit(__doc__)
    (rounded if sys.argv[1] == "rounded" else merged)(sys.argv[2], sys.argv[3])
    sys.exit(1 if fails else 0)
