"""`ftk-train --recipe litgpt` against LitGPT itself (make test-slow; tests/slow/litgpt_ref.sh
installs the pinned litgpt into build/litgpt-venv and runs this with that interpreter).

 1. Tokens: LitGPT's SFTDataset (Alpaca prompt style, mask_prompt False, max_seq_length 64,
    a sentencepiece tokenizer with add_bos_token) gives, for every record of the demo's
    Alpaca file, the token ids of ftk-pack --no-mask-prompt --max-len 64's row, and its
    labels are the row's targets (every token but the first).
 2. Training: LitGPT's own finetune loop — litgpt.finetune.full.fit, its get_lr_scheduler,
    chunked_cross_entropy, the AdamW of its recipe, Fabric on the CPU in 32-true — on a tiny
    Llama loaded from ftk's initial weights through LitGPT's own HF converter, fed the rows
    in ftk-train's order (ftkref.train_order), against ftk-train --recipe litgpt --precision
    fp32: the loss LitGPT logs at each step within 1e-5 relative, and the final weights
    (converted by the same function) within 1e-4 in the L2 norm per tensor and 1e-3 of its
    largest magnitude (tests/ref/litgpt_recipe.py says why); with one micro-batch per step
    (8 rows) and with several (4 of 2 rows).

usage: litgpt_ref.py BIN ROOT WORK"""
import json, os, shutil, subprocess, sys
from pathlib import Path

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import ftkref
from ftkref import check, done, relerr, run

import lightning as L
import litgpt
from litgpt.args import EvalArgs, TrainArgs
from litgpt.data import Alpaca
from litgpt.data.base import SFTDataset, get_sft_collate_fn
from litgpt.finetune import full as lfull
from litgpt.model import GPT, Config
from litgpt.prompts import Alpaca as AlpacaStyle
from litgpt.scripts.convert_hf_checkpoint import copy_weights_hf_llama
from litgpt.tokenizer import Tokenizer
from litgpt.utils import instantiate_torch_optimizer

BIN, ROOT, WORK = sys.argv[1:4]
ftkref.BIN = BIN
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
torch.manual_seed(0)
from importlib.metadata import version
print(f"litgpt {version('litgpt')}, torch {torch.__version__}, lightning {L.__version__}")

cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 48,
       "intermediate_size": 130, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "torch_dtype": "float32", "hidden_act": "silu", "initializer_range": 0.02}
json.dump(cfg, open(f"{WORK}/config.json", "w"))
tok = f"{ROOT}/examples/demo/tokenizer.model"
src = f"{ROOT}/examples/demo/alpaca-demo.json"
MODEL, DATA, MAXLEN = f"{WORK}/model.h5", f"{WORK}/data.h5", 160
run("ftk-init", "-q", "--config", f"{WORK}/config.json", "--seed", "3", "-t", tok, "-o", MODEL)
run("ftk-pack", "-q", "-t", tok, src, "-o", DATA, "--no-mask-prompt", "--max-len", str(MAXLEN), "--val-count", "0")

# LitGPT's checkpoint directory: the tokenizer as Llama 2's repository has it
CK = Path(WORK) / "litgpt-ckpt"
CK.mkdir()
shutil.copy(tok, CK / "tokenizer.model")
json.dump({"add_bos_token": True, "add_eos_token": False, "tokenizer_class": "LlamaTokenizer"},
          open(CK / "tokenizer_config.json", "w"))
config = Config(name="tiny-llama", block_size=256, vocab_size=512, padded_vocab_size=512, n_layer=2, n_head=4,
                n_embd=48, n_query_groups=2, rotary_percentage=1.0, parallel_residual=False, bias=False,
                norm_class_name="RMSNorm", norm_eps=1e-5, mlp_class_name="LLaMAMLP", intermediate_size=130,
                rope_base=10000)


def lit_state(h5path):
    """An ftk weights file (HF names and layout) as LitGPT's state dict, by LitGPT's converter."""
    with h5py.File(h5path, "r") as f:
        hf = {k: torch.tensor(np.asarray(v, dtype=np.float32)) for k, v in f["tensors"].items()}
    sd = {}
    copy_weights_hf_llama(config, {}, sd, hf, dtype=torch.float32)
    return sd


# ---- 1: tokens -----------------------------------------------------------------------------
records = json.load(open(src))
tokenizer = Tokenizer(CK)
for n in (MAXLEN, 256):
    path = DATA if n == MAXLEN else f"{WORK}/data-{n}.h5"
    if n != MAXLEN:
        run("ftk-pack", "-q", "-t", tok, src, "-o", path, "--no-mask-prompt", "--max-len", str(n), "--val-count", "0")
    sft = SFTDataset(records, tokenizer, prompt_style=AlpacaStyle(), max_seq_length=n, mask_prompt=False,
                     ignore_index=-100)
    with h5py.File(path, "r") as f:
        g = f["train"]
        toks, off, rec = np.asarray(g["tokens"]), np.asarray(g["row_offsets"]), np.asarray(g["sample_record"])
        mask = np.asarray(g["loss_mask"])
    R = len(off) - 1
    check(R == len(records) and list(rec) == list(range(R)), f"max length {n}: {R} rows, one per record, in order")
    items = [sft[i] for i in range(R)]
    bad_ids = [i for i in range(R) if items[i]["input_ids"].tolist() != toks[off[i]:off[i + 1]].tolist()]
    bad_lab = [i for i in range(R) if items[i]["labels"].tolist()[1:] !=
               [int(t) if m else -100 for t, m in zip(toks[off[i] + 1:off[i + 1]], mask[off[i] + 1:off[i + 1]])]]
    cut = sum(len(x["input_ids"]) == n for x in items)
    check(not bad_ids, f"max length {n}: the token ids of every record are LitGPT's SFTDataset's ({R} records, "
          f"{cut} cut; differing: {bad_ids[:5]})")
    check(not bad_lab, f"max length {n}: the targets are SFTDataset's labels (differing: {bad_lab[:5]})")
    if n == MAXLEN:
        ds, R = sft, R

# ---- 2: training ---------------------------------------------------------------------------
STEPS, G, W, LR, SEED = 8, 8, 3, 3e-3, 1337


class Capture(L.fabric.loggers.Logger):
    def __init__(self):
        super().__init__()
        self.rows = []

    @property
    def name(self):
        return "capture"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        self.rows.append(dict(metrics))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class Rows(torch.utils.data.Dataset):
    def __init__(self, idx):
        self.idx = idx

    def __len__(self):
        return len(self.idx)

    def __getitem__(self, i):
        return ds[self.idx[i]]


def litgpt_run(mb):
    batches, epoch = [], 0
    while len(batches) < STEPS:  # ftk's global batches: a batch does not cross an epoch
        perm = ftkref.train_order(SEED, epoch, R)
        batches += [perm[i:i + G] for i in range(0, R, G)]
        epoch += 1
    batches = batches[:STEPS]
    assert all(len(b) == G for b in batches)  # LitGPT steps on full accumulation windows only
    rows = [r for b in batches for r in b]
    log = Capture()
    fabric = L.Fabric(devices=1, accelerator="cpu", precision="32-true", loggers=[log])
    fabric.seed_everything(SEED)
    model = GPT(config)
    model.load_state_dict(lit_state(MODEL))
    model = fabric.setup(model)
    opt = instantiate_torch_optimizer({"class_path": "torch.optim.AdamW",
                                       "init_args": {"lr": LR, "weight_decay": 0.1, "betas": [0.9, 0.95]}},
                                      model.parameters())
    opt = fabric.setup_optimizers(opt)
    sched = lfull.get_lr_scheduler(opt, warmup_steps=W, max_steps=STEPS)
    state = {"model": model, "optimizer": opt, "scheduler": sched, "iter_num": 0, "step_count": 0}
    collate = get_sft_collate_fn(max_seq_length=MAXLEN, pad_id=0, ignore_index=-100)
    tl = torch.utils.data.DataLoader(Rows(rows), batch_size=mb, shuffle=False, collate_fn=collate)
    vl = torch.utils.data.DataLoader(Rows(list(range(4))), batch_size=mb, shuffle=False, collate_fn=collate)
    tl, vl = fabric.setup_dataloaders(tl, vl)
    train = TrainArgs(save_interval=None, log_interval=1, global_batch_size=G, micro_batch_size=mb,
                      lr_warmup_steps=W, epochs=1, max_steps=STEPS, max_seq_length=MAXLEN)
    ev = EvalArgs(interval=10 ** 6, max_new_tokens=10, max_iters=2, initial_validation=False,
                  final_validation=False)
    lfull.fit(fabric, state, tl, vl, 1, False, CK, Path(WORK) / "litgpt-out", train, ev, Alpaca())
    acc = G // mb
    losses = [r["loss"] for r in log.rows if "loss" in r and r["iter"] % acc == 0]
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def ftk_run(mb, *extra):
    out = f"{WORK}/ftk-mb{mb}" + "".join(extra)
    run("ftk-train", "-q", "-m", MODEL, "-d", DATA, "-o", out, "--recipe", "litgpt", "--precision", "fp32", *extra,
        "--steps", str(STEPS), "--global-batch", str(G), "--micro-batch", str(mb), "--lr", str(LR), "--warmup",
        str(W), "--eval-every", "0", "--seed", str(SEED), "-j1")
    st = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    run("ftk-merge", "-q", f"{out}/step-{STEPS:08d}", "-o", f"{out}.h5")
    return [s["loss"] for s in st if "loss" in s], lit_state(f"{out}.h5")


for mb in (8, 2):
    ll, lw = litgpt_run(mb)
    fl, fw = ftk_run(mb)
    print(f"     LitGPT {[round(x, 6) for x in ll]}\n     ftk    {[round(x, 6) for x in fl]}")
    e = max(abs(a - b) / abs(b) for a, b in zip(fl, ll)) if len(ll) == len(fl) == STEPS else float("inf")
    check(e < 1e-5, f"{G // mb} micro-batch(es) of {mb} a step: the losses of {len(ll)} LitGPT steps within {e:.2e} "
          f"relative (bound 1e-5)")
    keys = [k for k in lw if k in fw]
    we = max(relerr(fw[k].numpy(), lw[k].numpy()) for k in keys)
    rms = max(float(np.linalg.norm(fw[k].numpy() - lw[k].numpy()) / np.linalg.norm(lw[k].numpy())) for k in keys)
    check(len(keys) == len(lw) and we < 1e-3 and rms < 1e-4,
          f"{G // mb} micro-batch(es) a step: final weights within {rms:.2e} in the L2 norm (bound 1e-4), {we:.2e} "
          f"of the largest (bound 1e-3), {len(keys)} tensors")
    if mb < G:  # the test sees the loss mean: ftk's token mean of the global batch is not LitGPT's
        gl, _ = ftk_run(mb, "--loss-mean", "global")
        d = max(abs(a - b) / abs(b) for a, b in zip(gl, ll))
        check(d > 1e-5, f"--loss-mean global is {d:.2e} from LitGPT's losses (more than the bound: the test sees it)")
done()
