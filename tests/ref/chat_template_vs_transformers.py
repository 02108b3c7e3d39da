#!/usr/bin/python3
"""ftk-pack's chat templates against transformers' apply_chat_template, record for record.

Generates multi-turn conversations (system prompts or none, empty and whitespace-only
turns, leading/trailing spaces, tabs, newlines, Unicode spaces and letters, emoji, real
Alpaca texts, a final unanswered user turn; "messages" and ShareGPT "conversations"
records), packs them with `ftk-pack --template llama-2-chat` and `--template chatml`,
and checks for every sample:
  - tokens == LlamaTokenizer.apply_chat_template(messages, chat_template=T), T the official
    Llama-2-chat template of meta-llama/Llama-2-7b-chat-hf (tokenizer_config.json), or a
    ChatML template ("{{ bos_token }}" + the usual ChatML loop, ftk's chatml);
  - the loss mask: 1 exactly on tokens whose text overlaps an assistant span. Spans come
    from rendering prefixes of the conversation (render(messages[:i]) is a prefix of the
    whole), token text offsets from SentencePiece (immutable_proto) on the rendered text
    split at <s>/</s>; this re-tokenization must also give apply_chat_template's ids.
    llama-2-chat span: an assistant turn's whole rendering (" answer </s>"); chatml: the
    content + "<|im_end|>".
  - --no-mask-prompt: every token but the first is a target.
Also: records transformers refuses (roles not alternating) are refused by ftk-pack (exit 2).

Tokenizer: the slow LlamaTokenizer (SentencePiece tokenizer.model, the default legacy
mode, as ../shared/data/llama2-tokenizer's tokenizer_config.json leaves it). The fast one
is not used: that directory's tokenizer.json does not load in tokenizers 0.15.2 and marks
its special tokens "normalized", unlike Meta's.
Generated texts never contain "<s>", "</s>" or "<unk>" (transformers parses those out of
text; ftk keeps data text as text).

Usage: chat_template_vs_transformers.py BIN_DIR DATA_DIR WORK_DIR
Exit: 0 pass, 1 fail, 77 skipped (prints why).
"""
import glob, json, os, random, subprocess, sys

bindir, data, work = sys.argv[1:4]
tok_dir = os.path.join(data, "llama2-tokenizer")
if not os.path.exists(os.path.join(tok_dir, "tokenizer.model")):
    print("skipped (no ../shared/data/llama2-tokenizer)")
    sys.exit(77)
try:
    import h5py
    import jinja2  # noqa: F401  (apply_chat_template needs it)
    from transformers import LlamaTokenizer
    from transformers.utils import logging as hf_logging
except ImportError as e:
    print(f"skipped (no transformers/jinja2/h5py: {e}; tests/run.sh installs them into build/pylib)")
    sys.exit(77)
hf_logging.set_verbosity_error()
os.makedirs(work, exist_ok=True)

# meta-llama/Llama-2-7b-chat-hf, tokenizer_config.json "chat_template", verbatim.
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
)

tk = LlamaTokenizer.from_pretrained(tok_dir)
sp = tk.sp_model
BOS, EOS = tk.bos_token_id, tk.eos_token_id
rng = random.Random(19)

WORDS = ["hello", "world", "The", "quick", "brown", "fox", "42", "3.14", "don't", "e.g.", "(x+y)^2", "café",
         "naïve", "日本語", "中文", "Привет", "مرحبا", "😀", "👩‍👩‍👧", "▁", "a▁b", "[INST]", "[/INST]", "<<SYS>>",
         "<|im_end|>", "###", "\\n", "def f(x):", "    return x", "}", "{", "\"quoted\"", "-", "•", "ß"]
SEPS = [" "] * 8 + ["  ", "\n", "\n\n", "\t", " \n", "\u00a0", "\u3000", "\u2028", "\r\n"]
EDGE_WS = ["", " ", "  ", "\n", "\t", " \n ", "\u00a0", "\u3000", "\u2003", "\x1c", "\x85", "\u200b", "\ufeff"]

real = []
for f in sorted(glob.glob(os.path.join(data, "alpaca", "*.json")))[:2]:
    for r in json.load(open(f, encoding="utf-8"))[:300]:
        real += [r.get("instruction", ""), r.get("output", "")]
real = [t for t in real if t and not any(s in t for s in ("<s>", "</s>", "<unk>"))]


def text():
    x = rng.random()
    if x < 0.08:
        return ""
    if x < 0.13:
        return rng.choice(EDGE_WS) + rng.choice(EDGE_WS)
    if x < 0.35 and real:
        body = rng.choice(real)
    else:
        n = rng.randint(1, 14)
        body = "".join(rng.choice(WORDS) + (rng.choice(SEPS) if i + 1 < n else "") for i in range(n))
    return rng.choice(EDGE_WS) + body + rng.choice(EDGE_WS)


def conversation():
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": text()})
    for t in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": text()})
        msgs.append({"role": "assistant", "content": text()})
    if rng.random() < 0.15:
        msgs.append({"role": "user", "content": text()})  # unanswered: rendered, no target
    return msgs


def as_record(msgs):
    if rng.random() < 0.5:
        return {"messages": msgs}
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    return {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in msgs], "id": "x"}


def offsets_ids(s):
    """ids and [begin, end) char offsets of the rendered string s: split at <s>/</s> as the
    tokenizer does, each piece by SentencePiece with its offsets."""
    ids, offs, i = [], [], 0
    while i < len(s):
        j, special = len(s), None
        for tok, tid in (("<s>", BOS), ("</s>", EOS)):
            k = s.find(tok, i)
            if k >= 0 and k < j:
                j, special = k, (tok, tid)
        if j > i:
            for p in sp.encode(s[i:j], out_type="immutable_proto").pieces:
                ids.append(p.id)
                # the leading byte pieces of a character come with an empty range at it
                e = p.end if p.end > p.begin or not sp.is_byte(p.id) else p.begin + 1
                offs.append((i + p.begin, i + e))
        if special:
            ids.append(special[1])
            offs.append((j, j + len(special[0])))
            j += len(special[0])
        i = j
    return ids, offs


failures = 0


def fail(msg):
    global failures
    failures += 1
    if failures <= 10:
        print("FAIL", msg)


def expected(msgs, template, name):
    ids = tk.apply_chat_template(msgs, chat_template=template)
    s = tk.apply_chat_template(msgs, chat_template=template, tokenize=False)
    ids2, offs = offsets_ids(s)
    if ids2 != ids:
        fail(f"{name}: the reference's own re-tokenization differs from apply_chat_template: {msgs!r}")
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        a = len(tk.apply_chat_template(msgs[:i], chat_template=template, tokenize=False)) if i else 0
        b_s = tk.apply_chat_template(msgs[:i + 1], chat_template=template, tokenize=False)
        assert s.startswith(b_s), "template is not prefix-monotone"
        b = len(b_s)
        if name == "chatml":  # content + "<|im_end|>", not the role header nor the final newline
            a, b = a + len("<|im_start|>assistant\n"), b - 1
        spans.append((a, b))
    mask = [int(any(o0 < b and o1 > a for a, b in spans)) for o0, o1 in offs]
    return ids, mask


def pack(recs, template, extra, tag):
    src = os.path.join(work, tag + ".jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=rng.random() < 0.5) + "\n")
    out = os.path.join(work, tag + ".h5")
    r = subprocess.run([os.path.join(bindir, "ftk-pack"), "-t", os.path.join(tok_dir, "tokenizer.model"), src, "-o", out,
                        "-q", "--template", template, "--max-len", "8192", "--val-count", "0", "--force"] + extra,
                       capture_output=True)
    if r.returncode != 0:
        fail(f"{tag}: ftk-pack exit {r.returncode}: {r.stderr.decode()[:2000]}")
        return None
    f = h5py.File(out, "r")
    assert f.attrs["template"] == template, f.attrs["template"]
    assert int(f.attrs["n_truncated"]) == 0
    g = f["train"]
    t, m = g["tokens"][()], g["loss_mask"][()]
    got = {}
    for s, n, rec in zip(g["sample_starts"][()], g["sample_lengths"][()], g["sample_record"][()]):
        got[int(rec)] = (t[s:s + n].tolist(), m[s:s + n].tolist())
    return got


def roles(rec):
    if "messages" in rec:
        return rec["messages"]
    back = {"system": "system", "human": "user", "gpt": "assistant"}
    return [{"role": back[c["from"]], "content": c["value"]} for c in rec["conversations"]]


for name, template, n in (("llama-2-chat", LLAMA2, 500), ("chatml", CHATML, 150)):
    convs = [conversation() for _ in range(n)]
    recs = [as_record(c) for c in convs]
    got = pack(recs, name, [], name)
    got_all = pack(recs, name, ["--no-mask-prompt"], name + "-nomask")
    if got is None or got_all is None:
        continue
    bad = 0
    for i, rec in enumerate(recs):
        ids, mask = expected(roles(rec), template, name)
        g_ids, g_mask = got[i]
        if g_ids != ids or g_mask != mask:
            bad += 1
            k = next((k for k in range(min(len(ids), len(g_ids))) if (ids[k], mask[k]) != (g_ids[k], g_mask[k])), 0)
            fail(f"{name}: record {i}: tokens equal {g_ids == ids}, mask equal {g_mask == mask}; first difference "
                 f"at token {k}: want {list(zip(ids, mask))[k:k + 6]}, got {list(zip(g_ids, g_mask))[k:k + 6]}\n"
                 f"  {rec!r}"[:3000])
        if got_all[i] != (ids, [0] + [1] * (len(ids) - 1)):
            bad += 1
            fail(f"{name} --no-mask-prompt: record {i} differs")
    print(f"{name}: {len(recs)} records ({sum(len(c) for c in convs)} turns), {bad} differ from apply_chat_template")

# What the Llama 2 template refuses, ftk-pack refuses too (exit 2, nothing written).
for tag, msgs in (("two-users", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                 {"role": "assistant", "content": "c"}]),
                  ("assistant-first", [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]),
                  ("system-second", [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                                     {"role": "assistant", "content": "c"}])):
    try:
        tk.apply_chat_template(msgs, chat_template=LLAMA2)
        hf = "renders"
    except Exception:
        hf = "raises"
    src = os.path.join(work, tag + ".json")
    json.dump([{"messages": msgs}], open(src, "w"))
    out = os.path.join(work, tag + ".h5")
    r = subprocess.run([os.path.join(bindir, "ftk-pack"), "-t", os.path.join(tok_dir, "tokenizer.model"), src, "-o", out,
                        "--val-count", "0"], capture_output=True)
    if r.returncode != 2 or os.path.exists(out):
        fail(f"{tag}: ftk-pack exit {r.returncode} (want 2, no output); transformers {hf}")
    else:
        print(f"{tag}: transformers {hf}; ftk-pack: {r.stderr.decode().strip()}")

sys.exit(1 if failures else 0)
