#!/usr/bin/python3
"""Raw-byte edge cases against SentencePiece: invalid UTF-8 (each bad byte is read as
U+FFFD, as SentencePiece does), NUL bytes, and random byte strings, through the unit-test
helper build/tests/tok_bytes (hex in, ids out). Uses the demo model, and Llama 2's when
../shared/data has it.

Usage: tokenizer_bytes.py BIN_DIR DEMO_MODEL DATA_DIR
"""
import os, random, subprocess, sys
import sentencepiece as spm

bindir, demo, data = sys.argv[1:4]
helper = os.path.join(os.path.dirname(os.path.abspath(bindir)), "build", "tests", "tok_bytes")
if not os.path.exists(helper):
    helper = os.path.join("build", "tests", "tok_bytes")
models = [demo]
llama = os.path.join(data, "llama2-tokenizer", "tokenizer.model")
if os.path.exists(llama):
    models.append(llama)
rng = random.Random(3)
cases = [b"\xff", b"abc\xc3", b"\xe6\x97", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"a\x00b", b"ok \xfe\xfe ok",
         "café".encode("latin-1")]
alphabet = b" abc\n\t\x00\x7f\x80\xbf\xc2\xc3\xe2\x96\x81\xf0\x9f\x98\x80\xff"
cases += [bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(3000)]
fails = 0
for m in models:
    sp = spm.SentencePieceProcessor(model_file=m)
    r = subprocess.run([helper, m], input="".join(c.hex() + "\n" for c in cases).encode(), capture_output=True)
    if r.returncode != 0:
        print("FAIL helper:", r.stderr.decode()[:500])
        sys.exit(1)
    got = r.stdout.decode().split("\n")
    bad = 0
    for c, line in zip(cases, got):
        want = sp.encode(c)
        if [int(x) for x in line.split()] != want:
            bad += 1
            if bad <= 5:
                print(f"FAIL {os.path.basename(m)}: {c!r}: sentencepiece {want}, ftk {line}")
    print(f"{os.path.basename(m)}: {len(cases) - bad}/{len(cases)} byte strings tokenized as SentencePiece does")
    fails += bad
sys.exit(1 if fails else 0)
