#!/usr/bin/python3
"""Tokenizer speed: ftk against SentencePiece (Python binding, one call per text), same
texts, same run. Texts: every prompt (Alpaca template) and every output of every record of
every Alpaca file in ../shared/data (or the demo data when that is missing).
Usage: tokenize_bench.py ROOT DATA_DIR WORK_DIR"""
import glob, json, os, subprocess, sys, time
import sentencepiece as spm

root, data, work = sys.argv[1:4]
sys.path.insert(0, os.path.join(root, "tests", "ref"))
from alpaca_template import prompt_of  # noqa: E402

tok = os.path.join(data, "llama2-tokenizer", "tokenizer.model")
files = sorted(glob.glob(os.path.join(data, "alpaca", "*.json")))
if not (os.path.exists(tok) and files):
    tok, files = os.path.join(root, "examples/demo/tokenizer.model"), [os.path.join(root, "examples/demo/alpaca-demo.json")]
texts = []
for f in files:
    for r in json.load(open(f, encoding="utf-8")):
        texts += [prompt_of(r), r["output"]]
os.makedirs(work, exist_ok=True)
path = os.path.join(work, "texts.jsonl")
with open(path, "w", encoding="utf-8") as fh:
    for t in texts:
        fh.write(json.dumps(t, ensure_ascii=False) + "\n")
nbytes = sum(len(t.encode()) for t in texts)

sp = spm.SentencePieceProcessor(model_file=tok)
reps, t0 = 0, time.perf_counter()
while True:
    for t in texts:
        sp.encode(t)
    reps += 1
    el = time.perf_counter() - t0
    if el >= 1.0:
        break
sp_mbps = nbytes * reps / el / 1e6
r = subprocess.run([os.path.join(root, "build/tests/bench_tokenize"), tok, path, str(os.cpu_count())],
                   capture_output=True, text=True, check=True)
ftk = json.loads(r.stdout)
print(f"tokenizer: {os.path.relpath(tok, root)}; {len(texts)} texts, {nbytes / 1e6:.2f} MB")
print(f"  SentencePiece (Python, one call per text): {sp_mbps:8.2f} MB/s")
print(f"  ftk, 1 thread:                             {ftk['mbps_1']:8.2f} MB/s   ratio {ftk['mbps_1'] / sp_mbps:5.2f}x")
print(f"  ftk, {ftk['threads']} threads:                            {ftk['mbps_n']:8.2f} MB/s   ratio {ftk['mbps_n'] / sp_mbps:5.2f}x")
