#!/bin/sh
# Control files that are not what ftk wrote (formats/checkpoint.h, libcommon/buf.h
# buf_read_small): RUN/latest as a FIFO, a link to /dev/zero, a link to a good file, a
# directory; a checkpoint's config.json as a FIFO, its manifest.json or config.json as a
# link (to a secret: nothing of it said); RUN/.lock as a link to another file, a
# FIFO, a directory; RUN/metrics.jsonl (read on a resume) as a FIFO or a link. Every tool that reads them (ftk-verify, ftk-merge, ftk-generate,
# ftk-reshard, ftk-train) ends at once — exit 2 naming the file (3 from ftk-verify for
# damage inside a checkpoint) — instead of waiting on the FIFO forever or reading
# /dev/zero until memory runs out, and ftk-train writes nothing through a .lock link.
# Outputs that are not regular files (libcommon/output.h): ftk-plot -o and ftk-train --report
# write a FIFO (its reader gets the bytes), a character device and a link to
# /proc/self/fd/1 in place and leave them as they were; a directory or a dangling link is
# refused (exit 2); an HDF5 output (ftk-init, ftk-merge) refuses a FIFO or a device, and
# ftk-train's run directory (-o) one that is not a directory.
# Every command runs under a timeout, which only a hang reaches.
# Usage: tests/fault/special_files.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
demo_pack "$WORK/d.h5" 64 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
T="$BIN/ftk-train -q -m $WORK/w.h5 -d $WORK/d.h5 --steps 4 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1"
expect "a run stopped at step 2 of 4 (its checkpoint)" 75 $T -o "$WORK/run" --save-every 2 --stop-after 2
TO="timeout -k 5 60"
says() { # says NAME PATTERN: $WORK/err has PATTERN (else it is shown)
    if grep -q -- "$2" "$WORK/err"; then ok "$1"; else
        notok "$1"
        sed 's/^/     | /' "$WORK/err" | head -n 5
    fi
}
# readers NAME PATTERN: every reader of RUN ($WORK/r) exits 2 naming PATTERN
readers() {
    expect "latest $1: ftk-verify RUN exit 2" 2 $TO "$BIN/ftk-verify" "$WORK/r"
    says "latest $1: ftk-verify names it" "$2"
    expect "latest $1: ftk-verify RUN/latest exit 2" 2 $TO "$BIN/ftk-verify" "$WORK/r/latest"
    expect "latest $1: ftk-verify --compare RUN RUN/latest exit 2" 2 $TO "$BIN/ftk-verify" --compare "$WORK/run" \
        "$WORK/r/latest"
    expect "latest $1: ftk-merge exit 2" 2 $TO "$BIN/ftk-merge" -q "$WORK/r" -o "$WORK/m.h5"
    says "latest $1: ftk-merge names it" "$2"
    expect "latest $1: ftk-generate exit 2" 2 $TO "$BIN/ftk-generate" -q -m "$WORK/r" -p hi -n 2 --greedy
    says "latest $1: ftk-generate names it" "$2"
    expect "latest $1: ftk-reshard exit 2" 2 $TO "$BIN/ftk-reshard" -q "$WORK/r" -o "$WORK/rs" --ranks 2
    check "latest $1: nothing written" test ! -e "$WORK/m.h5" -a ! -e "$WORK/rs"
}
fresh() { rm -rf "$WORK/r" && cp -r "$WORK/run" "$WORK/r" && rm "$WORK/r/latest"; }

fresh && mkfifo "$WORK/r/latest"
readers "a FIFO" "r/latest: a FIFO, not"
fresh && ln -s /dev/zero "$WORK/r/latest"
readers "a link to /dev/zero" "r/latest: a symbolic link"
# ftk writes latest as a small file, never as a link: one to a good file is refused too
fresh && echo step-00000002 >"$WORK/good" && ln -s "$WORK/good" "$WORK/r/latest"
readers "a link to a good file" "r/latest: a symbolic link"
fresh && mkdir "$WORK/r/latest"
expect "latest a directory: ftk-merge exit 2" 2 $TO "$BIN/ftk-merge" -q "$WORK/r" -o "$WORK/m.h5"
says "latest a directory: ftk-merge names it" "r/latest: a directory, not"
expect "latest a directory: ftk-verify exit 2" 2 $TO "$BIN/ftk-verify" "$WORK/r"

# config.json of a checkpoint as a FIFO: damage, said, without waiting on it
rm -rf "$WORK/r" && cp -r "$WORK/run" "$WORK/r"
rm "$WORK/r/step-00000002/config.json" && mkfifo "$WORK/r/step-00000002/config.json"
expect "config.json a FIFO: ftk-verify exit 3" 3 $TO "$BIN/ftk-verify" "$WORK/r"
says "config.json a FIFO: ftk-verify names it" "step-00000002/config.json: a FIFO, not"
expect "config.json a FIFO: ftk-merge exit 2" 2 $TO "$BIN/ftk-merge" -q "$WORK/r" -o "$WORK/m.h5"
expect "config.json a FIFO: ftk-train --resume auto exit 2" 2 $TO $T -o "$WORK/r" --resume auto
says "config.json a FIFO: ftk-train names it" "step-00000002/config.json: a FIFO, not"

# manifest.json of a checkpoint as a link (to a good manifest, to a secret): refused, its
# target not read, nothing of it said
rm -rf "$WORK/r" && cp -r "$WORK/run" "$WORK/r"
mv "$WORK/r/step-00000002/manifest.json" "$WORK/manifest" && ln -s "$WORK/manifest" "$WORK/r/step-00000002/manifest.json"
expect "manifest.json a link to a good one: ftk-verify exit 3" 3 $TO "$BIN/ftk-verify" "$WORK/r"
says "manifest.json a link: ftk-verify names it" "step-00000002/manifest.json: a symbolic link"
printf 'root:*:19000:0:99999:7:::\n' >"$WORK/secret" && chmod 600 "$WORK/secret"
ln -sf "$WORK/secret" "$WORK/r/step-00000002/manifest.json"
expect "manifest.json a link to a secret: ftk-train --resume auto exit 2" 2 $TO $T -o "$WORK/r" --resume auto
says "manifest.json a link to a secret: ftk-train names it" "step-00000002/manifest.json: a symbolic link"
silent() { ! grep -q -e root -e 19000 -e "'r'" "$WORK/err"; } # not even its first byte
check "manifest.json a link to a secret: no byte of it said" silent
rm "$WORK/r/step-00000002/manifest.json" && mv "$WORK/manifest" "$WORK/r/step-00000002/manifest.json"
mv "$WORK/r/step-00000002/config.json" "$WORK/config.json" && ln -s "$WORK/config.json" "$WORK/r/step-00000002/config.json"
expect "config.json a link: ftk-verify exit 3" 3 $TO "$BIN/ftk-verify" "$WORK/r"
says "config.json a link: ftk-verify names it" "step-00000002/config.json: a symbolic link"

# .lock not a regular file: ftk-train refuses it, and writes nothing through a link
rm -rf "$WORK/r" && cp -r "$WORK/run" "$WORK/r" && rm "$WORK/r/.lock"
echo "precious" >"$WORK/victim"
ln -s "$WORK/victim" "$WORK/r/.lock"
expect ".lock a link to another file: ftk-train exit 2" 2 $TO $T -o "$WORK/r" --resume auto
says ".lock a link: the message names it" "r/.lock: a symbolic link"
check ".lock a link: the file it names is untouched" grep -qx precious "$WORK/victim"
check ".lock a link: no checkpoint written" test ! -e "$WORK/r/step-00000004"
expect ".lock a link: ftk-reshard into the run exit 2" 2 $TO "$BIN/ftk-reshard" -q "$WORK/run" \
    -o "$WORK/r/step-00000002" --ranks 2 --force
check ".lock a link: ftk-reshard leaves the file untouched" grep -qx precious "$WORK/victim"
rm "$WORK/r/.lock" && ln -s "$WORK/nothing" "$WORK/r/.lock"
expect ".lock a dangling link: ftk-train exit 2" 2 $TO $T -o "$WORK/r" --resume auto
check ".lock a dangling link: nothing created where it points" test ! -e "$WORK/nothing"
rm "$WORK/r/.lock" && mkfifo "$WORK/r/.lock"
expect ".lock a FIFO: ftk-train exit 2" 2 $TO $T -o "$WORK/r" --resume auto
says ".lock a FIFO: the message names it" "r/.lock: not a regular file"
rm "$WORK/r/.lock" && mkdir "$WORK/r/.lock"
expect ".lock a directory: ftk-train exit 2" 2 $TO $T -o "$WORK/r" --resume auto
rmdir "$WORK/r/.lock"

# metrics.jsonl, which a resume reads to cut it back: a FIFO, a link
mv "$WORK/r/metrics.jsonl" "$WORK/metrics" && mkfifo "$WORK/r/metrics.jsonl"
expect "metrics.jsonl a FIFO: ftk-train --resume auto exit 2" 2 $TO $T -o "$WORK/r" --resume auto
says "metrics.jsonl a FIFO: the message names it" "r/metrics.jsonl: a FIFO, not"
rm "$WORK/r/metrics.jsonl" && ln -s "$WORK/victim" "$WORK/r/metrics.jsonl"
expect "metrics.jsonl a link: ftk-train --resume auto exit 2" 2 $TO $T -o "$WORK/r" --resume auto
check "metrics.jsonl a link: the file it names is untouched" grep -qx precious "$WORK/victim"
rm "$WORK/r/metrics.jsonl" && mv "$WORK/metrics" "$WORK/r/metrics.jsonl"
expect "regular files again: ftk-train --resume auto runs" 0 $TO $T -o "$WORK/r" --resume auto

# Outputs a user names (libcommon/output.h): a FIFO, a character device or a link to either
# is written in place and stays what it was; a directory, a link to nothing, and (for HDF5)
# a FIFO or a device are refused with exit 2, nothing written. Device nodes are made here
# (as root): an unfixed tool would replace the system's own /dev/null.
O=$WORK/outputs && mkdir "$O"
if mknod "$O/null" c 1 3 2>/dev/null && mknod "$O/full" c 1 7 2>/dev/null; then NULL=$O/null FULL=$O/full; else
    NULL=/dev/null FULL=/dev/full # not root: nobody can replace them
fi
P="$BIN/ftk-plot -q $WORK/run --csv"
mkfifo "$O/fifo"
# reader NAME: the FIFO's reader in the background, its bytes in $O/NAME (timeout: only a
# writer that never opens the FIFO reaches it)
reader() { $TO cat "$O/fifo" >"$O/$1" & }
reader plot
expect "ftk-plot -o FIFO: exit 0" 0 $TO $P -o "$O/fifo"
wait
check "... the reader got the table" grep -q '^run,step,loss' "$O/plot"
check "... and the FIFO is still a FIFO" test -p "$O/fifo"
expect "ftk-plot -o a device (null): exit 0" 0 $P -o "$NULL"
check "... it is still a character device" test -c "$NULL"
expect "ftk-plot -o a full device: exit 1" 1 $P -o "$FULL"
says "... naming it and the reason" "full: write: No space left on device"
check "... it is still a character device" test -c "$FULL"
ln -s /proc/self/fd/1 "$O/stdout"
{ $P -o "$O/stdout"; echo $? >"$O/rc"; } | cat >"$O/piped"
check "ftk-plot -o a link to /proc/self/fd/1: the pipe got the table, exit 0" \
    sh -c "grep -q '^run,step,loss' '$O/piped' && [ \"\$(cat '$O/rc')\" = 0 ]"
check "... the link is still a link" test -L "$O/stdout"
expect "ftk-plot -o a directory: exit 2" 2 $P -o "$O"
says "... saying what it is" "outputs: a directory: refused"
ln -s "$O/nothing" "$O/dangling"
expect "ftk-plot -o a link to nothing: exit 2" 2 $P -o "$O/dangling"
check "... nothing written (no file, no temporary)" sh -c "[ ! -e '$O/nothing' ] && [ -z \"\$(ls -A '$O' | grep '^\.')\" ]"
reader report
expect "ftk-train --report FIFO: exit 0" 0 $TO $T -o "$WORK/rep" --steps 1 --no-save --report "$O/fifo"
wait
check "... the reader got the report" grep -q '^# Communication and time report' "$O/report"
check "... and the FIFO is still a FIFO" test -p "$O/fifo"
expect "ftk-train --report a device (null): exit 0" 0 $T -o "$WORK/rep2" --steps 1 --no-save --report "$NULL"
check "... it is still a character device" test -c "$NULL"
expect "ftk-init -o FIFO (HDF5): exit 2" 2 "$BIN/ftk-init" -q --preset tiny -o "$O/fifo"
says "... HDF5 needs a regular file" "fifo: a FIFO; this output is HDF5, which needs a regular file"
check "... the FIFO is still a FIFO" test -p "$O/fifo"
expect "ftk-merge -o a device (HDF5): exit 2" 2 "$BIN/ftk-merge" -q "$WORK/run" -o "$NULL"
check "... it is still a character device" test -c "$NULL"
expect "ftk-train -o FIFO (a run directory): exit 2" 2 $T -o "$O/fifo"
says "... saying what it is" "fifo: a FIFO, not a directory"
finish
