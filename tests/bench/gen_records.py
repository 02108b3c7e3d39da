#!/usr/bin/python3
"""Generates instruction records for ftk-pack's bench and stream tests, as JSON Lines.

Usage: gen_records.py N [--kind alpaca|chat] [--seed S] [--pad BYTES] [--array]
  N          records (0: endless, for piping)
  --kind     alpaca: {"instruction", "input", "output"} (formats/alpaca.h);
             chat: {"messages": [{"role", "content"}, ...]} (conversational records, for
             when ftk-pack reads them; switch the bench with FTK_PACK_BENCH_KIND=chat)
  --pad      an ignored "meta" member of that many bytes per record: a big input that
             costs reading and parsing, not tokenizing (the multi-GB memory test)
  --array    one JSON array instead of JSON Lines
Words are drawn from a fixed vocabulary with a seeded generator, so the output is the
same on every run.
"""
import json, random, sys

args = sys.argv[1:]
n = int(args[0])
kind = args[args.index("--kind") + 1] if "--kind" in args else "alpaca"
rng = random.Random(int(args[args.index("--seed") + 1]) if "--seed" in args else 1)
pad = int(args[args.index("--pad") + 1]) if "--pad" in args else 0
array = "--array" in args
WORDS = ("the a of to and in is it that for on with as was at by be this from or an are not have but "
         "model data train token loss step batch rate learning weight layer attention sequence value "
         "write explain list give describe summarize translate compute answer question story poem code "
         "über café naïve 東京 数据 ").split()


def text(lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def record(i):
    if kind == "chat":
        msgs = [{"role": "system", "content": text(3, 12)}]
        for _ in range(rng.randint(1, 3)):
            msgs += [{"role": "user", "content": text(5, 60)}, {"role": "assistant", "content": text(10, 150)}]
        r = {"messages": msgs}
    else:
        r = {"instruction": text(5, 40), "input": text(0, 30) if rng.random() < 0.4 else "", "output": text(10, 200)}
    if pad:
        r["meta"] = "x" * pad
    return json.dumps(r, ensure_ascii=False)


out = sys.stdout
out.write("[\n" if array else "")
i = 0
try:
    while n == 0 or i < n:
        out.write(("," if array and i else "") + record(i) + "\n")
        i += 1
    out.write("]\n" if array else "")
except BrokenPipeError:
    sys.stderr.close()
