#!/bin/sh
# A full disk: every tool that writes files runs on a tmpfs too small for its
# output, at several sizes (so that the disk fills in a dataset write, in HDF5's closing
# flush, in a text file, in a rename's `latest`), and must exit 1 with a message that names
# the file and the system's reason ("No space left on device") and leave nothing behind;
# before the fix HDF5 1.10's exit handler crashed after a failed close (exit 139) and the
# checkpoint manifest was closed twice (exit 134). ftk-train --tensorboard: no empty event
# file, and the error names the event file. ftk-train: a failure before its first
# checkpoint removes the run directory it made; a committed checkpoint whose `latest`
# could not be written is no damage (ftk-verify warns and passes, --resume auto goes on).
# ftk-train --async-save: a background write that fails prints ftk's message, not HDF5's.
# Needs root and a system that permits mounting a tmpfs, else it is skipped.
# Usage: tests/fault/disk.sh BIN_DIR WORK_DIR [DATA_DIR]   (DATA_DIR: stories260K for
#        ftk-import-llama2c, optional)
set -u
BIN=$1 WORK=$2 DATA=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M=$WORK/disk
# The tmpfs is mounted in a mount namespace of this test's own where there is one: it goes
# with the test's last process, however that ends (a kill -9, an interrupted make test),
# and never stands in the way of the next run's rm -rf of the work folder.
if [ -z "${FTK_DISK_NS:-}" ]; then
    umount "$M" 2>/dev/null # a mount an earlier run left where there was no namespace
    rm -rf "$WORK" && mkdir -p "$M" || exit 1
    [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null &&
        FTK_DISK_NS=1 exec unshare -m sh "$0" "$@"
fi
. "$ROOT/tests/cli/lib.sh"
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=64m tmpfs "$M" 2>/dev/null; then
    echo "skipped (cannot mount a tmpfs at $M: a full disk is simulated with a small tmpfs, which needs root and a system that permits mounting)"
    exit 77
fi
trap 'umount "$M"' EXIT
TOK=$ROOT/examples/demo/tokenizer.model

# inputs, on the real disk
demo_pack "$WORK/d.h5" 128 2>/dev/null || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
"$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$WORK/hf" || exit 1
T="$BIN/ftk-train -q -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1"
$T -m "$WORK/w.h5" --steps 2 -o "$WORK/run" || exit 1

# disk SIZE: an empty tmpfs of SIZE (KiB, whole pages)
disk() {
    rm -rf "$M"/* "$M"/.[!.]* 2>/dev/null
    mount -o remount,size=$(($1 / 4 * 4))k "$M"
}
used() { df -k --output=used "$M" | tail -n 1 | tr -d ' '; }
# need CMD...: the KiB the command's output takes (run on a large disk; must succeed, or
# stop as asked: 75)
need() {
    disk 65536
    "$@" >/dev/null 2>&1
    rc=$?
    [ $rc -eq 0 ] || [ $rc -eq 75 ] || { echo "FAIL: $* on a large disk: exit $rc" >&2; exit 1; }
    used
}
# full NAME SIZE CMD...: on a disk of SIZE KiB the command exits 1, its message names a
# file on that disk and says "No space left on device", and the disk is left empty
full() {
    name=$1 size=$2
    shift 2
    disk "$size"
    expect "$name, ${size} KiB disk: exit 1" 1 "$@"
    if grep -q "$M/[^ ]*: .*No space left on device" "$WORK/err"; then ok "$name, ${size} KiB: names the file and the reason"
    else
        notok "$name, ${size} KiB: names the file and the reason"
        sed 's/^/     | /' "$WORK/err" | head -n 5
    fi
    left=$(find "$M" -mindepth 1 | head -n 5)
    check "$name, ${size} KiB: nothing left behind${left:+ ($left)}" test -z "$left"
}
# sizes NEED: 4 KiB (nothing fits), a third, two thirds, and one page short
sizes() { echo 4 $(($1 / 3)) $(($1 * 2 / 3)) $(($1 - 4)); }

u=$(need "$BIN/ftk-init" -q --preset tiny --seed 1 -t "$TOK" -o "$M/w.h5")
for s in $(sizes "$u"); do full ftk-init "$s" "$BIN/ftk-init" -q --preset tiny --seed 1 -t "$TOK" -o "$M/w.h5"; done

PACK="$BIN/ftk-pack -q -t $TOK $ROOT/examples/demo/alpaca-demo.json --pack --max-len 128 --val-count 4"
u=$(need $PACK -o "$M/d.h5")
for s in $(sizes "$u"); do full ftk-pack "$s" $PACK -o "$M/d.h5"; done
u=$(need $PACK -o "$M/d.h5" --shards 2)
full "ftk-pack --shards 2" $((u - 4)) $PACK -o "$M/d.h5" --shards 2

u=$(need "$BIN/ftk-import-hf" -q "$WORK/hf" -o "$M/h.h5")
for s in $(sizes "$u"); do full ftk-import-hf "$s" "$BIN/ftk-import-hf" -q "$WORK/hf" -o "$M/h.h5"; done

if [ -f "$DATA/stories260K/stories260K.bin" ]; then
    L="$BIN/ftk-import-llama2c -q $DATA/stories260K/stories260K.bin -t $DATA/stories260K/tok512.bin"
    u=$(need $L -o "$M/s.h5")
    for s in $(sizes "$u"); do full ftk-import-llama2c "$s" $L -o "$M/s.h5"; done
fi

u=$(need "$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$M/hf")
for s in $(sizes "$u"); do full ftk-export-hf "$s" "$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$M/hf"; done

u=$(need "$BIN/ftk-merge" -q "$WORK/run" -o "$M/m.h5" --with-optimizer)
for s in $(sizes "$u"); do full ftk-merge "$s" "$BIN/ftk-merge" -q "$WORK/run" -o "$M/m.h5" --with-optimizer; done

# ftk-reshard makes the run directory too: it goes when nothing was committed into it
R="$BIN/ftk-reshard -q $WORK/run --ranks 2 -o"
u=$(need $R "$M/r/step-00000002")
for s in $(sizes "$u" | cut -d' ' -f1-3) $((u - 8)); do full ftk-reshard "$s" $R "$M/r/step-00000002"; done
disk $((u - 4))
expect "ftk-reshard, latest cannot be written: exit 1" 1 $R "$M/r/step-00000002"
check "the message says the checkpoint is committed and latest could not be updated" \
    grep -q "step-00000002 is committed, but $M/r/latest could not be updated.*No space left" "$WORK/err"
expect "the new checkpoint verifies" 0 "$BIN/ftk-verify" "$M/r/step-00000002"

# ftk-train: metrics.jsonl (no room even for its first line), the checkpoint's shard
# (written, closed), its manifest (8 KiB short: the manifest's page and latest's), then
# `latest` alone
T="$T -m $WORK/w.h5 --steps 4 --stop-after 2"
u=$(need $T -o "$M/run")
full "ftk-train, metrics.jsonl" 4 $T -o "$M/run"
check "... the message names the first file written (metrics.jsonl or options.yaml)" \
    grep -Eq "$M/run/(metrics.jsonl|options.yaml): No space left on device" "$WORK/err"
for s in $(sizes "$u" | cut -d' ' -f2-3) $((u - 8)); do
    full "ftk-train checkpoint" "$s" $T -o "$M/run"
done
disk $((u - 4))
expect "ftk-train, latest cannot be written: exit 1" 1 $T -o "$M/run"
check "the message says step-00000002 is committed and latest could not be updated" \
    grep -q "step-00000002 is committed, but $M/run/latest could not be updated.*: $M/run/.latest.tmp.*No space left" \
    "$WORK/err"
check "no latest, no temporary left" test ! -e "$M/run/latest" -a -z "$(find "$M/run" -name '*.tmp*')"
expect "ftk-verify of the run: not damage (exit 0)" 0 "$BIN/ftk-verify" "$M/run"
check "ftk-verify says latest could not be written, not damage" grep -q "no \`latest\` file: .*not damage" "$WORK/err"
expect "ftk-train without --resume refuses the run (exit 2)" 2 $T -o "$M/run"
mount -o remount,size=65536k "$M"
expect "--resume auto continues from step-00000002" 0 $(echo "$T" | sed 's/ -q / /') -o "$M/run" --resume auto
grep -q "resuming from $M/run/step-00000002" "$WORK/err" && ok "... from step-00000002" || notok "... from step-00000002"
check "... to step 4, latest written" grep -qx step-00000004 "$M/run/latest"

# ftk-train --tensorboard: the event file meets the full disk. With no room at all (the run
# and its TensorBoard directory on the disk) nothing is left, no empty event file; the
# TensorBoard directory alone on a disk that fills after some steps (the run's on the real
# disk): the error names the event file, not metrics.jsonl, and the failed run leaves no
# event file (its steps are gone with its run directory) and no directory it made
B="$BIN/ftk-train -q -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1 -m $WORK/w.h5"
TBMSG="^ftk-train: error: --tensorboard $M/tb/events.out.tfevents.[^ ]*: No space left on device"
full "ftk-train --tensorboard" 4 $B --steps 2 -o "$M/run" --tensorboard "$M/tb"
check "... the message names the event file" grep -q "$TBMSG" "$WORK/err"
disk 4
rm -rf "$WORK/run-tb"
expect "ftk-train --tensorboard on a disk that fills at step ~17, the run directory elsewhere: exit 1" 1 \
    $B --steps 30 -o "$WORK/run-tb" --tensorboard "$M/tb"
check "... the message names the event file, not metrics.jsonl" grep -q "$TBMSG" "$WORK/err"
left=$(find "$M" -mindepth 1 | head -n 5)
check "... nothing left of the run${left:+ ($left)}" test -z "$left" -a ! -e "$WORK/run-tb"

# ftk-train --async-save: the shard the background thread writes meets the full disk. One
# line from ftk, not HDF5's error stack beside it (its automatic printing is per
# thread)
# (steps 2: step 1's checkpoint is the background one; a third of the room the run needs
# takes metrics.jsonl, not that checkpoint)
A="$BIN/ftk-train -q -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1 -m $WORK/w.h5 --steps 2"
A="$A --save-every 1 --async-save"
u=$(need $A -o "$M/run")
for s in $(sizes "$u" | cut -d' ' -f2); do
    full "ftk-train --async-save" "$s" $A -o "$M/run"
    if grep -q "not thread-safe" "$WORK/err"; then
        ok "... (this HDF5 is not thread-safe: the checkpoints were written synchronously)"
    else
        check "... no HDF5 error stack printed (HDF5-DIAG), ftk's message alone" sh -c \
            "! grep -q 'HDF5-DIAG' '$WORK/err' && [ \$(wc -l <'$WORK/err') -le 3 ]"
    fi
done
finish
