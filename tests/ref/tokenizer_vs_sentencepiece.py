#!/usr/bin/python3
"""ftk's tokenizer against SentencePiece (Debian's python3-sentencepiece), id for id.

Texts: every instruction/input/output and every full Alpaca prompt of every record in
every file of ../shared/data/alpaca, plus hand-written edge cases. Checks, for both
tokenizer.model and tokenizer.json: ids equal SentencePiece's; decoding gives the text
back; decoding random id sequences equals SentencePiece's DecodeIds.

Usage: tokenizer_vs_sentencepiece.py BIN_DIR DATA_DIR WORK_DIR
Exit: 0 pass, 1 fail, 77 skipped (prints why).
"""
import glob, json, os, random, subprocess, sys

bindir, data, work = sys.argv[1:4]
tok_model = os.path.join(data, "llama2-tokenizer", "tokenizer.model")
tok_json = os.path.join(data, "llama2-tokenizer", "tokenizer.json")
if not os.path.exists(tok_model):
    print("skipped (no ../shared/data/llama2-tokenizer)")
    sys.exit(77)
import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alpaca_template import prompt_of  # noqa: E402

sp = spm.SentencePieceProcessor(model_file=tok_model)

EDGE = [
    "", " ", "  ", "a", " a", "a ", "  leading", "trailing  ", "in  between   spaces",
    "\t", "tab\there", "\n", "new\nline", "\n\nparagraphs\n\n", "\r\n", " \t \n ",
    "0", "123", "3.14159", "1,000,000", "2024-01-01", "x^2 + y^2 = z^2",
    "!!!", "?!?!", "...", "---", "***bold***", "(((nested)))", "a.b,c;d:e",
    "café", "naïve", "Ångström", "résumé", "São Paulo", "Straße",
    "日本語のテキスト", "中文", "한국어", "Привет мир", "مرحبا", "שלום", "ελληνικά",
    "😀", "👩‍👩‍👧", "🇫🇷", "I ❤ Unicode ☃", "\u00a0nbsp\u00a0", "\u200bzero width",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0010FFFF", "\x7f", "\x01\x02",
    "<s>", "</s>", "<unk>", "<s>hello</s>", "<0x41>", "[INST] hi [/INST]", "<<SYS>>",
    "▁", "▁▁x", "a▁b",
    "Below is an instruction that describes a task.",
]

def run(args, inp):
    r = subprocess.run(args, input=inp, capture_output=True)
    if r.returncode != 0:
        print("FAIL:", " ".join(args), "exit", r.returncode, r.stderr.decode()[:2000])
        sys.exit(1)
    return r.stdout

def texts():
    out = list(EDGE)
    files = sorted(glob.glob(os.path.join(data, "alpaca", "*.json")))
    if not files:
        print("skipped (no Alpaca files)")
        sys.exit(77)
    for f in files:
        for rec in json.load(open(f, encoding="utf-8")):
            for k in ("instruction", "input", "output"):
                out.append(rec.get(k, ""))
            out.append(prompt_of(rec))
    return out

def main():
    os.makedirs(work, exist_ok=True)
    ts = texts()
    inp = "".join(json.dumps(t) + "\n" for t in ts).encode()
    expect = [sp.encode(t) for t in ts]
    failed = 0
    nbsp_ids = {8655, 17891, 20246, 30081}  # PROVENANCE.md: U+00A0 replaced in tokenizer.json
    for name, path in (("tokenizer.model", tok_model), ("tokenizer.json", tok_json)):
        if not os.path.exists(path):
            continue
        out = run([os.path.join(bindir, "ftk-tokenize"), "-t", path], inp).decode().split("\n")
        bad = explained = 0
        for t, e, line in zip(ts, expect, out):
            got = [int(x) for x in line.split()]
            if got != e:
                if name == "tokenizer.json" and "\u00a0" in t and nbsp_ids & set(e):
                    explained += 1
                    continue
                bad += 1
                if bad <= 5:
                    print(f"  {name}: mismatch on {t[:80]!r}\n    sentencepiece {e[:40]}\n    ftk           {got[:40]}")
        print(f"{name}: {len(ts) - bad - explained}/{len(ts)} texts equal to SentencePiece"
              + (f" ({explained} differ only through the 4 U+00A0 vocabulary entries, as PROVENANCE.md says)" if explained else ""))
        failed += bad
        # round trip: decode(encode(t)) == t for every text
        dec = run([os.path.join(bindir, "ftk-tokenize"), "-t", path, "--decode"],
                  "\n".join(out).encode()).decode().split("\n")
        rt_bad = 0
        for t, d in zip(ts, dec):
            # "▁" in the text itself reads back as a space, in SentencePiece as here
            want = t if "\u2581" not in t else sp.decode(sp.encode(t))
            got = json.loads(d)
            if name == "tokenizer.json":  # its vocabulary has U+0020 where the model has U+00A0
                want, got = want.replace("\u00a0", " "), got.replace("\u00a0", " ")
            if got != want:
                rt_bad += 1
                if rt_bad <= 5:
                    print(f"  {name}: decode mismatch {t[:60]!r} -> {json.loads(d)[:60]!r}")
        print(f"{name}: {len(ts) - rt_bad}/{len(ts)} texts decode back exactly")
        failed += rt_bad
    # decoding arbitrary id sequences (control, unknown, bytes, pieces) like DecodeIds
    rng = random.Random(1)
    special = [0, 1, 2, 29871, 259, 13] + list(range(3, 259))
    seqs = []
    for _ in range(2000):
        n = rng.randint(0, 12)
        seqs.append([rng.choice(special) if rng.random() < 0.6 else rng.randrange(32000) for _ in range(n)])
    dec = run([os.path.join(bindir, "ftk-tokenize"), "-t", tok_model, "--decode"],
              "".join(" ".join(map(str, s)) + "\n" for s in seqs).encode()).decode().split("\n")
    dbad = 0
    for s, d in zip(seqs, dec):
        if json.loads(d) != sp.decode(s):
            dbad += 1
            if dbad <= 5:
                print(f"  decode of {s}: sentencepiece {sp.decode(s)!r}, ftk {json.loads(d)!r}")
    print(f"random id sequences: {len(seqs) - dbad}/{len(seqs)} decode like SentencePiece")
    failed += dbad
    # invalid UTF-8: SentencePiece replaces each bad byte by U+FFFD; so do we (library level,
    # checked through the bench helper that takes raw bytes)
    sys.exit(1 if failed else 0)

main()
