#!/usr/bin/python3
"""How examples/demo/tokenizer.model was made (kept for provenance; not run by the build).

A small SentencePiece BPE model trained on the demo records with Llama 2's settings:
BPE, byte fallback, identity normalization, dummy prefix, no whitespace folding,
<unk>=0 <s>=1 </s>=2. Run from the repository root with Debian's python3-sentencepiece.
"""
import json
import sentencepiece as spm

recs = json.load(open("examples/demo/alpaca-demo.json", encoding="utf-8"))
lines = []
for r in recs:
    lines += [r["instruction"], r["input"], r["output"]]
lines += [
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.",
    "### Instruction:", "### Input:", "### Response:",
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
]
open("/tmp/ftk-demo-corpus.txt", "w", encoding="utf-8").write("\n".join(l for l in lines if l))
spm.SentencePieceTrainer.train(
    input="/tmp/ftk-demo-corpus.txt", model_prefix="examples/demo/tokenizer", model_type="bpe",
    vocab_size=512, byte_fallback=True, normalization_rule_name="identity",
    remove_extra_whitespaces=False, add_dummy_prefix=True, character_coverage=1.0,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, split_digits=True, hard_vocab_limit=False,
)
