#!/bin/sh
# A run's metrics as people look at them:
#  - metrics.jsonl records carry "kind" (step, eval, checkpoint) and a wall-clock "time";
#    elapsed_s continues across a resume (it counts the run's whole history), and a run
#    resharded into a new directory carries its history there;
#  - the history across crashes is one history: a run killed before its first checkpoint
#    starts again without a second step-0 validation; a resume trims the records after its
#    checkpoint whatever their JSON spelling (compact "step":5), only by a record's own
#    "step", and 300 000 lines without one in one pass (it once took 34 s for 100 000);
#  - the per-step line shows the percentage done and an ETA;
#  - ftk-plot draws runs as an SVG (a well-formed XML document with a line per run and
#    panel, also for names and titles with control bytes or invalid UTF-8, and for values
#    a few ulps apart at 1e17, where its tick loop once never ended) and writes the CSV
#    table (one row per step, the evaluations in place); a half-written last line (a
#    killed run) is the history up to there; a malformed line elsewhere is exit 2 naming
#    its line;
#  - ftk-train --tensorboard DIR writes event files that TensorBoard's own reader (the
#    tensorboard package, test-only, from PyPI into build/pylib-tb) reads back: the same
#    steps and values, each step once in the files (trimmed on resume like metrics.jsonl),
#    in TensorBoard's view, and in the view of a TensorBoard that read the killed
#    processes' files as they were written (the resume's START record).
# Usage: tests/cli/metrics.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
demo_pack "$WORK/d.h5" 128 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
T="$BIN/ftk-train -m $WORK/w.h5 -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 3 -j1 --steps 8"

# A run's history across crashes: killed (kill -9) after step 0's validation and step 1,
# before any checkpoint; started again from step 0 and killed after step 6 (its checkpoint
# at 4); its metrics.jsonl rewritten as compact JSON ("step":5, as any JSON tool may);
# resumed to the end. Each record once: no second step-0 validation, no steps 5-6 twice.
# tb-seen: each process's event file as a TensorBoard running all along has read it
mkdir -p "$WORK/tb-seen"
seen() { cp "$WORK/tb/$(ls -t "$WORK/tb" | head -n 1)" "$WORK/tb-seen/events.out.tfevents.$1"; }
expect "train 8 steps with --tensorboard, killed after step 1 (before any checkpoint)" 137 env \
    FTK_FAULT=train.step-end:1:kill $T -o "$WORK/r" --save-every 4 --tensorboard "$WORK/tb"
seen 1
expect "--resume auto starts again from step 0, killed after step 6 (checkpoint at 4)" 137 env \
    FTK_FAULT=train.step-end:6:kill $T -o "$WORK/r" --save-every 4 --resume auto --tensorboard "$WORK/tb"
seen 2
check "the step line shows the percentage and an ETA" grep -q "^ftk-train: step 2/8 (25%) .* ETA [0-9]*m[0-9][0-9]s$" \
    "$WORK/err"
"$PY" -c "
import json
r = [json.loads(l) for l in open('$WORK/r/metrics.jsonl')]
open('$WORK/r/metrics.jsonl', 'w').write(''.join(json.dumps(x, separators=(',', ':')) + '\\n' for x in r))"
expect "--resume auto finishes it" 0 $T -o "$WORK/r" --save-every 4 --resume auto --tensorboard "$WORK/tb"
seen 3
check "one history: steps 1-8, evaluations 0 3 6 8, checkpoints 4 8, each once; kind and time on each; elapsed_s rising" \
    "$PY" -c "
import json, re, sys
r = [json.loads(l) for l in open('$WORK/r/metrics.jsonl')]
kinds = lambda k: [x['step'] for x in r if x.get('kind') == k]
el = [x['elapsed_s'] for x in r if x.get('kind') == 'step']
print(kinds('step'), kinds('eval'), kinds('checkpoint'))
sys.exit(not (kinds('step') == list(range(1, 9)) and kinds('eval') == [0, 3, 6, 8] and kinds('checkpoint') == [4, 8]
              and all(re.fullmatch(r'20[0-9-]*T[0-9:.]*Z', x.get('time', '')) for x in r)
              and el == sorted(el)))"

# a resharded run carries its history (metrics up to the checkpoint, the kept options)
expect "a run stopped at step 3" 75 $T -o "$WORK/h" --stop-after 3
expect "ftk-reshard it into a new run directory" 0 "$BIN/ftk-reshard" "$WORK/h/latest" -o "$WORK/h2" --ranks 2
expect "... which resumes with -o alone (its options came along)" 0 "$BIN/ftk-train" -j1 -o "$WORK/h2" --resume auto
check "... its metrics.jsonl holds steps 1-8, elapsed_s never decreasing" sh -c "
    [ \"\$(grep -o '\"kind\": \"step\", \"step\": [0-9]*' '$WORK/h2/metrics.jsonl' | grep -o '[0-9]*\$' | tr '\n' ' ')\" = '1 2 3 4 5 6 7 8 ' ] &&
    awk '/\"kind\": \"step\"/ { sub(/.*\"elapsed_s\": /, \"\"); v = \$0 + 0; if (v < last) bad = 1; last = v } END { exit bad }' \
    '$WORK/h2/metrics.jsonl'"

# --- ftk-plot ---------------------------------------------------------------------------------
expect "a second run to overlay" 0 $T -o "$WORK/r2" --lr 1e-3
expect "ftk-plot two runs -o SVG" 0 "$BIN/ftk-plot" "$WORK/r" "$WORK/r2/metrics.jsonl" -o "$WORK/p.svg"
if [ -x "$PY" ]; then
    check "the SVG is well-formed XML with 10 lines (2 runs x 4 panels + 2 validation) and a legend" "$PY" -c "
import sys, xml.etree.ElementTree as E
r = E.parse('$WORK/p.svg').getroot(); ns = '{http://www.w3.org/2000/svg}'
lines = r.findall(ns + 'polyline'); texts = [t.text for t in r.iter(ns + 'text')]
sys.exit(not (len(lines) == 10 and '$WORK/r' in texts and 'tokens/s' in texts))"
fi
expect "ftk-plot --csv -o -" 0 "$BIN/ftk-plot" "$WORK/r" --csv -o -
check "CSV: a header, 8 step rows and the step-0 evaluation's row; val_loss at steps 3, 6, 8" sh -c "
    [ \$(wc -l <'$WORK/out') = 10 ] && head -n 1 '$WORK/out' | grep -qx 'run,step,loss,val_loss,lr,grad_norm,tokens_per_s,elapsed_s' &&
    [ \$(awk -F, 'NR > 1 && \$4 != \"\"' '$WORK/out' | wc -l) = 4 ]"
head -n 5 "$WORK/r/metrics.jsonl" >"$WORK/cut.jsonl"
head -c 40 "$WORK/r/metrics.jsonl" | tail -c 40 >>"$WORK/cut.jsonl" # a half-written last line
expect "a half-written last line: the history up to there" 0 "$BIN/ftk-plot" "$WORK/cut.jsonl" --csv -o "$WORK/cut.csv"
{ head -n 2 "$WORK/r/metrics.jsonl"; echo '{"kind": "step", "step": 3,'; tail -n 2 "$WORK/r/metrics.jsonl"; } \
    >"$WORK/bad.jsonl"
expect "a malformed line inside: exit 2" 2 "$BIN/ftk-plot" "$WORK/bad.jsonl" -o "$WORK/bad.svg"
check "... naming its line, nothing written" sh -c "grep -q 'bad.jsonl: line 3' '$WORK/err' && [ ! -e '$WORK/bad.svg' ]"
expect "a missing run: exit 2" 2 "$BIN/ftk-plot" "$WORK/nope" -o "$WORK/x.svg"
check "... No such file or directory" grep -q "nope: No such file or directory" "$WORK/err"
expect "no -o: exit 2" 2 "$BIN/ftk-plot" "$WORK/r"
# the tick loop once stalled where a tick step is below the spacing of doubles (1e17 + 2 ==
# 1e17) and grew its output forever; timeout: a hang fails, not the CI job
M='"lr": 1, "grad_norm": 1, "tokens_per_s": 1, "elapsed_s": 1}'
printf '{"kind": "step", "step": 1, "loss": 1e17, %s\n{"kind": "step", "step": 2, "loss": 1.0000000000000002e17, %s\n' \
    "$M" "$M" >"$WORK/big-loss.jsonl"
printf '{"kind": "step", "step": 1e17, "loss": 1, %s\n{"kind": "step", "step": 100000000000000016, "loss": 2, %s\n' \
    "$M" "$M" >"$WORK/big-step.jsonl"
printf '{"kind": "step", "step": 1, "loss": -1e308, %s\n{"kind": "step", "step": 1e300, "loss": 1e308, %s\n' \
    "$M" "$M" >"$WORK/huge.jsonl"
for f in big-loss big-step huge; do
    expect "ftk-plot, $f (values a few ulps apart, or spanning all doubles): exit 0" 0 timeout -k 5 60 \
        "$BIN/ftk-plot" "$WORK/$f.jsonl" -o "$WORK/$f.svg"
done
# names and titles are any bytes: control bytes and invalid UTF-8 come out as well-formed XML
odd=$(printf 'run\001\033<&"\377\342\202')
mkdir -p "$WORK/$odd" && cp "$WORK/huge.jsonl" "$WORK/$odd/metrics.jsonl"
expect "ftk-plot of a run whose name has control bytes and invalid UTF-8, --title likewise" 0 "$BIN/ftk-plot" \
    "$WORK/big-loss.jsonl" "$WORK/$odd" -o "$WORK/odd.svg" --title "$(printf 'T\002\357\277\276\300\257')"
check "the SVGs are well-formed XML, at most 64 KiB, with no nan, the two loss ticks apart" "$PY" -c "
import os, sys, xml.etree.ElementTree as E
ok = True
for f in ('big-loss', 'big-step', 'huge', 'odd'):
    p = '$WORK/' + f + '.svg'
    r = E.parse(p).getroot()
    ok = ok and os.path.getsize(p) <= 65536 and 'nan' not in open(p).read()
t = [x.text for x in E.parse('$WORK/big-loss.svg').getroot().iter('{http://www.w3.org/2000/svg}text')]
ok = ok and '1e+17' in t and '1.0000000000000002e+17' in t
sys.exit(not ok)"
# trimming parses the records: a compact "step":9 goes, a "step" inside another object does
# not count, and a long run of lines without a step is one pass (it once searched the
# rest of the file for each: 100 000 lines took 34 s)
cp "$WORK/r2/metrics.jsonl" "$WORK/r2.jsonl"
{ echo '{"kind":"step","step":9,"loss":1}'; echo '{"kind": "note", "detail": {"step": 99}}'
  yes '{"kind": "note"}' | head -n 300000; echo '{"kind":"eval","step":9.0e0,"val_loss":1}'; } >>"$WORK/r2/metrics.jsonl"
expect "--resume auto of the finished run r2 (nothing to do) trims its metrics.jsonl" 0 timeout -k 5 60 $T -o "$WORK/r2" \
    --lr 1e-3 --resume auto
check "... to its 8 steps' records and the 300 001 lines without a step of its own" sh -c "
    [ \$(grep -c '\"step\":9' '$WORK/r2/metrics.jsonl') = 0 ] &&
    [ \$(wc -l <'$WORK/r2/metrics.jsonl') = \$((\$(wc -l <'$WORK/r2.jsonl') + 300001)) ]"

# --- TensorBoard ------------------------------------------------------------------------------
TB=$ROOT/build/pylib-tb
TB_PINS="tensorboard==2.15.2 protobuf==4.25.3 six==1.16.0 absl-py==2.1.0"
. "$ROOT/tests/extras.sh"
if [ -x "$PY" ] && ! extras_kept "$TB" $TB_PINS; then
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$TB" $TB_PINS >"$WORK/pip.log" 2>&1 &&
        extras_done "$TB" $TB_PINS
fi
if [ -x "$PY" ] && PYTHONPATH=$TB "$PY" -c 'import tensorboard.backend.event_processing.event_accumulator' 2>/dev/null
then
    check "two event files (the first, emptied by the restart from step 0, is gone)" \
        test "$(ls "$WORK/tb" | grep -c '^events.out.tfevents.')" = 2
    # every record of every file as a reader that purges nothing sees it (TensorBoard's file
    # loader), then TensorBoard's view, and the view of one that read the files as they were
    # written (tb-seen: the killed processes' steps, then each START record)
    check "TensorBoard: loss at steps 1-8, val_loss at 0 3 6 8, once each: files, view, view all along; = metrics.jsonl" \
        env PYTHONPATH="$TB" "$PY" -c "
import glob, json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as A
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader as L
m = [json.loads(l) for l in open('$WORK/r/metrics.jsonl')]
want = {r['step']: r['loss'] for r in m if r['kind'] == 'step'}
wval = {r['step']: r['val_loss'] for r in m if r['kind'] == 'eval'}
raw = {}
for f in sorted(glob.glob('$WORK/tb/events.out.tfevents.*')):
    for e in L(f).Load():
        for v in e.summary.value:
            raw.setdefault(v.tag, []).append(e.step)
ok = sorted(raw['train/loss']) == list(range(1, 9)) and sorted(raw['eval/val_loss']) == [0, 3, 6, 8]
ok = ok and len(raw['train/learning_rate']) == 8
print('in the files: steps', sorted(raw['train/loss']), 'val', sorted(raw['eval/val_loss']))
for d in ('$WORK/tb', '$WORK/tb-seen'):
    a = A(d, size_guidance={'scalars': 0}); a.Reload()
    loss = [(e.step, e.value) for e in a.Scalars('train/loss')]
    val = [(e.step, e.value) for e in a.Scalars('eval/val_loss')]
    print(d, 'steps', [s for s, _ in loss], 'val', [s for s, _ in val])
    ok = ok and [s for s, _ in loss] == list(range(1, 9)) and [s for s, _ in val] == [0, 3, 6, 8]
    ok = ok and all(abs(v - want[s]) <= 1e-6 * abs(want[s]) for s, v in loss)
    ok = ok and all(abs(v - wval[s]) <= 1e-6 * abs(wval[s]) for s, v in val)
sys.exit(not ok)" 2>"$WORK/tb.err"
    expect "--tensorboard on a file that is not a directory: exit 1 naming it" 1 $T -o "$WORK/r3" --steps 2 \
        --tensorboard "$WORK/p.svg"
else
    echo "skipped: the TensorBoard read-back (the tensorboard package could not be installed: $WORK/pip.log)"
fi
finish
