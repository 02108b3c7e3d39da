"""forge_residual.py RUN CASE...: copies RUN-CASE of run directory RUN whose newest checkpoint
is given the gradient residuals of --compress-grads (formats/checkpoint.h: "compress_grads":
"bf16" in the manifest, /grad_residual/UNIT in every shard, [padded] float32, small finite
values), as a run on several ranks writes them, then one of them forged as CASE says, with
its xxh3_64, the shard's size and checksum in the manifest and the manifest's seal recomputed
(a producer that ignores the format, or a hostile one: only content checks can catch it):
  ok        nothing forged
  short     /grad_residual/layer.0 one element short        long   one element too many
  float64   /grad_residual/layer.0 stored as float64        int32  as int32 (values kept)
  2d        /grad_residual/layer.0 of shape [1, padded]     nan    its first value NaN
  nogroup   the /grad_residual group deleted
One process for every case (h5py starts once). Needs h5py and numpy."""
import json, os, shutil, sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forge import resum, set_key, xxh3  # noqa: E402

run, cases = sys.argv[1], sys.argv[2:]
step = open(os.path.join(run, "latest")).read().strip()


def put(g, name, a):
    d = g.create_dataset(name, data=a)
    d.attrs["xxh3_64"] = np.uint64(xxh3(a))


for case in cases:
    dst = f"{run}-{case}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(run, dst)
    ck = os.path.join(dst, step)
    man = json.load(open(os.path.join(ck, "manifest.json")))
    rng = np.random.default_rng(1)
    for e in man["shards"]:
        with h5py.File(os.path.join(ck, e["file"]), "r+") as f:
            g = f.create_group("grad_residual")
            for u in man["units"]:
                a = (rng.standard_normal(u["padded"]) * 1e-6).astype("<f4")
                a[u["length"]:] = 0
                if u["name"] != "layer.0" or case == "ok":
                    put(g, u["name"], a)
                elif case in ("short", "long"):
                    put(g, u["name"], np.resize(a, u["padded"] + (1 if case == "long" else -1)))
                elif case in ("float64", "int32"):
                    put(g, u["name"], a.astype("<f8" if case == "float64" else "<i4"))
                elif case == "2d":
                    put(g, u["name"], a.reshape(1, -1))
                elif case == "nan":
                    a[0] = np.nan
                    put(g, u["name"], a)
                elif case == "nogroup":
                    put(g, u["name"], a)
                else:
                    sys.exit(f"forge_residual.py: unknown case {case}")
            if case == "nogroup":
                del f["grad_residual"]
    set_key(os.path.join(ck, "manifest.json"), "compress_grads", "bf16")
    resum(os.path.join(ck, "manifest.json"))
    print(f"forged {ck} ({case})")
