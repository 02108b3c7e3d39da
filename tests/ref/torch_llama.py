"""A Llama in PyTorch written from Hugging Face's conventions, independent of ftk's code:
RMSNorm, rotate_half rotary embedding with rope_theta, grouped-query attention, SwiGLU,
tied or untied head; packed rows become one causal attention block per sample with
positions restarting per sample, targets where the next token's loss_mask is 1.
Used by tests/ref/model_vs_torch.py (float64) and tests/bench/train_bench.py (float32)."""
import math

import h5py
import numpy as np
import torch


def weights(path, dtype=torch.float64):
    """The model config (/config attributes) and tensors of an ftk weights file (float32)."""
    with h5py.File(path, "r") as f:
        cfg = {k: (v.item() if hasattr(v, "item") else v) for k, v in f["config"].attrs.items()}
        t = {k: torch.tensor(np.asarray(v, dtype=np.float64)).to(dtype) for k, v in f["tensors"].items()}
    return cfg, t


def split(path, name="train"):
    with h5py.File(path, "r") as f:
        g = f[name]
        return {k: np.asarray(g[k]) for k in g}


def batch(sp, rows, dtype=torch.float64):
    """Token ids, positions, segment ids and targets (-100: none) of rows laid end to end."""
    ids, pos, seg, tgt = [], [], [], []
    sid = 0
    for r in rows:
        a, b = sp["row_offsets"][r], sp["row_offsets"][r + 1]
        end = a
        for s in range(sp["row_samples"][r], sp["row_samples"][r + 1]):
            st, ln = sp["sample_starts"][s], sp["sample_lengths"][s]
            toks, m = sp["tokens"][st:st + ln], sp["loss_mask"][st:st + ln]
            for i in range(ln):
                ids.append(toks[i]); pos.append(i); seg.append(sid)
                tgt.append(int(toks[i + 1]) if i + 1 < ln and m[i + 1] else -100)
            sid += 1
            end = st + ln
        for i in range(b - end):  # padding: a segment of its own, no targets
            ids.append(sp["tokens"][end + i]); pos.append(i); seg.append(sid); tgt.append(-100)
        sid += 1
    return (torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=dtype),
            torch.tensor(seg), torch.tensor(tgt, dtype=torch.long))


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    hd = x.shape[-1]
    inv = (1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))).to(x.dtype)
    ang = pos[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def forward(cfg, W, ids, pos, seg, head_rows=None):
    """Logits of every position, or only of the positions head_rows (a boolean mask)."""
    D, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, theta = D // H, cfg["rms_norm_eps"], cfg["rope_theta"]
    n = ids.shape[0]
    ar = torch.arange(n)
    allowed = (seg[:, None] == seg[None, :]) & (ar[:, None] >= ar[None, :])
    x = W["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(n, H, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(n, KV, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(n, KV, hd)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd)
        s = s.masked_fill(~allowed[None], float("-inf")).softmax(-1)
        o = torch.einsum("hij,jhd->ihd", s, v).reshape(n, H * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"], eps)
    if head_rows is not None:
        x = x[head_rows]
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


def loss_of(logits, tgt):
    keep = tgt >= 0
    return torch.nn.functional.cross_entropy(logits[keep], tgt[keep], reduction="sum") / keep.sum()


def forward_lowp(cfg, W, ids, pos, seg, dtype=torch.bfloat16):
    """The same Llama run the way Hugging Face's LlamaForCausalLM runs in bfloat16: weights and
    activations in `dtype`, RMSNorm and the attention softmax computed in float32 and rounded
    back, rotary cos/sin computed in float32 and rounded, logits in `dtype` (the caller takes
    the loss on logits.float(), as LitGPT and transformers do)."""
    D, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, theta = D // H, cfg["rms_norm_eps"], cfg["rope_theta"]
    n = ids.shape[0]
    ar = torch.arange(n)
    allowed = (seg[:, None] == seg[None, :]) & (ar[:, None] >= ar[None, :])

    def rmsf(x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype) * w

    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

    def rope_lp(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    x = W["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsf(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(n, H, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(n, KV, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(n, KV, hd)
        q, k = rope_lp(q), rope_lp(k)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd)
        s = s.masked_fill(~allowed[None], float("-inf")).softmax(-1, dtype=torch.float32).to(dtype)
        o = torch.einsum("hij,jhd->ihd", s, v).reshape(n, H * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rmsf(x, W[p + "post_attention_layernorm.weight"])
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rmsf(x, W["model.norm.weight"])
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T
