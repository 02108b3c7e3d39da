#!/usr/bin/python3
"""Writes the corpus of Hugging Face folders ftk-import-hf must refuse (exit 2, nothing
written): tests/corpus/safetensors-bad/*.safetensors (each used as model.safetensors beside
config.json there) and tests/corpus/config-bad/*.json (each used as config.json beside a
valid model.safetensors). The expected messages are the .err files next to them, reviewed
by hand; regenerate the inputs with this script, never the messages.
Usage: /usr/bin/python3 tests/corpus/make_weights_bad.py
"""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
ST = os.path.join(HERE, "safetensors-bad")
CF = os.path.join(HERE, "config-bad")

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
          "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
          "num_key_value_heads": 1, "vocab_size": 16, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False, "torch_dtype": "float32"}

def params():
    h, f, v, kv = 8, 16, 16, 4
    p = [("model.embed_tokens.weight", [v, h])]
    p += [("model.layers.0.input_layernorm.weight", [h]), ("model.layers.0.self_attn.q_proj.weight", [h, h]),
          ("model.layers.0.self_attn.k_proj.weight", [kv, h]), ("model.layers.0.self_attn.v_proj.weight", [kv, h]),
          ("model.layers.0.self_attn.o_proj.weight", [h, h]),
          ("model.layers.0.post_attention_layernorm.weight", [h]),
          ("model.layers.0.mlp.gate_proj.weight", [f, h]), ("model.layers.0.mlp.up_proj.weight", [f, h]),
          ("model.layers.0.mlp.down_proj.weight", [h, f])]
    p += [("model.norm.weight", [h]), ("lm_head.weight", [v, h])]
    return p

def size(shape, esize=4):
    n = esize
    for d in shape:
        n *= d
    return n

def layout(tensors, dtype="F32"):
    """A valid header dict and data length for (name, shape) pairs, packed in order."""
    hdr, pos = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = size(shape)
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    return hdr, pos

def raw(header_text, data_len, n_override=None):
    hb = header_text.encode() if isinstance(header_text, str) else header_text
    n = len(hb) if n_override is None else n_override
    return struct.pack("<Q", n) + hb + bytes(data_len)

def st(name, blob):
    with open(os.path.join(ST, name + ".safetensors"), "wb") as f:
        f.write(blob)

def from_hdr(hdr, data_len):
    return raw(json.dumps(hdr), data_len)

def main():
    os.makedirs(ST, exist_ok=True)
    os.makedirs(CF, exist_ok=True)
    with open(os.path.join(ST, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    good, n = layout(params())
    with open(os.path.join(CF, "model.safetensors"), "wb") as f:
        f.write(from_hdr(good, n))

    st("short", b"\x05\x00\x00")
    st("no-tensors", raw("{}", 0))  # valid safetensors (the fuzzer's first find: {} in the parser)
    st("header-huge", struct.pack("<Q", 1 << 40) + b"{}")
    st("header-past-eof", struct.pack("<Q", 1000) + b"{}" + bytes(90))
    st("header-not-object", raw("[1, 2]", 0))
    st("header-bad-json", raw('{"model.norm.weight": {"dtype": "F32",, "shape": [8]}}', 32))
    st("header-bad-utf8", raw(b'{"model.norm.\xff": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}', 32))
    st("header-deep", raw('{"x": {"dtype": "F32", "shape": [[[[8]]]], "data_offsets": [0, 32]}}', 32))
    st("header-duplicate-name", raw('{"model.norm.weight": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}, '
                                   '"model.norm.weight": {"dtype": "F32", "shape": [8], "data_offsets": [32, 64]}}', 64))
    st("header-trailing-garbage", raw('{"model.norm.weight": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}x', 32))

    def variant(name, edit, extra=0):
        h, n = layout(params())
        edit(h)
        st(name, from_hdr(h, n + extra))

    q = "model.layers.0.self_attn.q_proj.weight"
    variant("dtype-unknown", lambda h: h[q].update(dtype="F31"))
    variant("dtype-integer", lambda h: h[q].update(dtype="I32"))
    variant("dtype-not-string", lambda h: h[q].update(dtype=32))
    variant("shape-bytes-mismatch", lambda h: h[q].update(shape=[8, 9]))
    variant("shape-negative", lambda h: h[q].update(shape=[-8, -8]))
    variant("shape-float", lambda h: h[q].update(shape=[8.5, 8]))
    variant("shape-rank-9", lambda h: h[q].update(shape=[1] * 9))
    variant("shape-overflow", lambda h: h[q].update(shape=[2**52, 2**52, 2**52]))
    variant("shape-not-array", lambda h: h[q].update(shape=64))
    variant("offsets-past-end", lambda h: h["lm_head.weight"].update(
        data_offsets=[h["lm_head.weight"]["data_offsets"][0] + 4, h["lm_head.weight"]["data_offsets"][1] + 4]))
    variant("offsets-reversed", lambda h: h[q].update(data_offsets=h[q]["data_offsets"][::-1]))
    variant("offsets-three", lambda h: h[q].update(data_offsets=h[q]["data_offsets"] + [0]))
    variant("offsets-negative", lambda h: h[q].update(data_offsets=[-256, 0]))

    def overlap(h):
        a = h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"]
        h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"] = [a[0] - 16, a[1] - 16]
    variant("offsets-overlap", overlap)
    variant("gap-before-tensor", lambda h: [h[k].update(data_offsets=[v["data_offsets"][0] + 8, v["data_offsets"][1] + 8])
                                            for k, v in h.items() if k == "lm_head.weight"], extra=8)
    variant("bytes-after-last", lambda h: None, extra=12)
    variant("key-unknown", lambda h: h[q].update(offset=0))
    variant("key-missing", lambda h: h[q].pop("data_offsets"))
    variant("entry-not-object", lambda h: h.update({"model.norm.weight": [8]}))
    variant("metadata-not-string", lambda h: h["__metadata__"].update(format=1))
    variant("name-empty", lambda h: h.update({"": h.pop("model.norm.weight")}))
    variant("name-nul", lambda h: h.update({"model.norm.weight\u0000x": h.pop("model.norm.weight")}))

    # Valid safetensors, wrong content for this config.
    st("tensor-missing", from_hdr(*layout([p for p in params() if p[0] != "model.norm.weight"])))
    st("tensor-wrong-shape", from_hdr(*layout([(p[0], [4, 16]) if p[0] == q else p for p in params()])))
    st("tensor-unexpected", from_hdr(*layout(params() + [("model.layers.0.self_attn.q_proj.bias", [8])])))
    st("tensor-layer-out-of-range", from_hdr(*layout(params() + [("model.layers.1.input_layernorm.weight", [8])])))

    def cfg(name, **changes):
        c = dict(CONFIG)
        for k, v in changes.items():
            if v is Ellipsis:
                c.pop(k)
            else:
                c[k] = v
        with open(os.path.join(CF, name + ".json"), "w") as f:
            json.dump(c, f, indent=2)

    cfg("model-type", model_type="mistral")
    cfg("architecture", architectures=["LlamaForSequenceClassification"])
    cfg("rope-scaling", rope_scaling={"type": "linear", "factor": 2.0})
    cfg("attention-bias", attention_bias=True)
    cfg("mlp-bias", mlp_bias=True)
    cfg("hidden-act", hidden_act="gelu")
    cfg("heads-do-not-divide", num_attention_heads=3)
    cfg("kv-heads-do-not-divide", num_attention_heads=4, num_key_value_heads=3)
    cfg("head-dim", head_dim=8)
    cfg("hidden-size-missing", hidden_size=...)
    cfg("hidden-size-string", hidden_size="8")
    cfg("eos-list", eos_token_id=[1, 2])
    cfg("dtype-unknown", torch_dtype="float64")
    cfg("negative-size", intermediate_size=-16)
    with open(os.path.join(CF, "syntax-error.json"), "w") as f:
        f.write('{\n  "model_type": "llama",\n  "hidden_size": 8\n  "num_hidden_layers": 1\n}\n')

if __name__ == "__main__":
    main()
