# Helpers shared by the CLI test scripts (sourced). They need $WORK; they count in
# lib_checks/lib_failed (names no script uses for its own: a script's n=... once reset the count).
lib_checks=0 lib_failed=0

ok() { lib_checks=$((lib_checks + 1)); echo "ok   $1"; }
notok() { lib_checks=$((lib_checks + 1)); lib_failed=$((lib_failed + 1)); echo "FAIL $1"; }

# expect NAME CODE CMD...: the command exits with CODE (stdout in $WORK/out, stderr in $WORK/err).
expect() {
    name=$1 code=$2
    shift 2
    "$@" >"$WORK/out" 2>"$WORK/err"
    rc=$?
    if [ $rc -eq "$code" ]; then ok "$name"; else
        notok "$name: exit $rc, expected $code"
        sed 's/^/     | /' "$WORK/err" | head -n 10
    fi
}
same() { # same NAME FILE_GOT FILE_WANT
    if cmp -s "$2" "$3"; then ok "$1"; else
        notok "$1: output differs"
        diff "$3" "$2" | head -n 20 | sed 's/^/     | /'
    fi
}
check() { # check NAME CMD...: the command succeeds (a condition)
    name=$1
    shift
    if "$@"; then ok "$name"; else notok "$name"; fi
}
# few_files N CMD...: CMD with at most N open descriptors (ulimit -n N); its peak resident
# memory in KB into $WORK/rss (through /usr/bin/python3, or $PY)
few_files() {
    (ulimit -n "$1" && shift && exec "${PY:-/usr/bin/python3}" -c 'import resource, subprocess, sys
r = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(r)' "$WORK/rss" "$@")
}
# The embedded demo as test inputs (callers set BIN and ROOT; DEMO_TOOLS, set after this
# file is read, is where ftk-pack and ftk-init are instead: the emulated tests' BIN has
# ftk-train alone).
DEMO_TOOLS=
# demo_pack OUT MAX_LEN: its 40 records packed into rows of MAX_LEN, 4 of them for validation
demo_pack() {
    "${DEMO_TOOLS:-$BIN}/ftk-pack" -q -t "$ROOT/examples/demo/tokenizer.model" "$ROOT/examples/demo/alpaca-demo.json" -o "$1" \
        --pack --max-len "$2" --val-count 4
}
# demo_init OUT PRESET SEED: random weights of an ftk-init preset with the demo tokenizer
demo_init() { "${DEMO_TOOLS:-$BIN}/ftk-init" -q --preset "$2" --seed "$3" -t "$ROOT/examples/demo/tokenizer.model" -o "$1"; }

# flip_bit FILE DATASET [BYTE [MASK]]: the dataset's stored byte at BYTE (default 5) XOR MASK
# (default 0x10), in place (h5py: /usr/bin/python3)
flip_bit() {
    /usr/bin/python3 - "$1" "$2" "${3:-5}" "${4:-0x10}" <<'PYEOF'
import sys, h5py
path, ds, at, mask = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4], 0)
with h5py.File(path, "r") as f:
    off = f[ds].id.get_offset() + at
with open(path, "r+b") as g:
    g.seek(off); b = g.read(1); g.seek(off); g.write(bytes([b[0] ^ mask]))
PYEOF
}

# loss_steps RUN: "STEP LOSS" for every step of RUN/metrics.jsonl
loss_steps() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"step": \([0-9]*\), "loss": \([0-9.e+-]*\).*/\1 \2/'; }
# close_losses NAME RUN_GOT RUN_WANT REL [N]: every step's loss within REL relative of the
# same step's in RUN_WANT (and N steps compared, when given)
close_losses() {
    loss_steps "$2" >"$WORK/cl.got"
    loss_steps "$3" >"$WORK/cl.want"
    if [ -s "$WORK/cl.got" ] && join "$WORK/cl.got" "$WORK/cl.want" | awk -v tol="$4" -v want="${5:-0}" '
        { d = $2 - $3; if (d < 0) d = -d; r = d / ($3 > 0 ? $3 : 1); if (r > worst) worst = r; n++ }
        END { printf "     %d steps, worst relative difference %.3g\n", n, worst
              exit !(n > 0 && (want == 0 || n == want) && worst <= tol) }'
    then ok "$1"; else notok "$1"; fi
}

finish() {
    echo "$((lib_checks - lib_failed)) of $lib_checks checks passed"
    [ $lib_failed -eq 0 ]
}

# closed_pipe COMMAND...: runs COMMAND with stdout and stderr on a pipe whose reader is gone
# (`COMMAND 2>&1 | head` once head has exited, without the race), SIGPIPE at its default.
closed_pipe() {
    ${PYTHON:-/usr/bin/python3} -c 'import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
r, w = os.pipe()
os.close(r)
os.dup2(w, 1)
os.dup2(w, 2)
os.execvp(sys.argv[1], sys.argv[1:])' "$@"
}

# stalled_pipe SIG COMMAND...: runs COMMAND with stdout and stderr on a one-page pipe that
# nobody reads nor closes (mpirun's, once it is signalled), waits until COMMAND is blocked
# writing to it (/proc/PID/syscall: write on fd 1 or 2), sends it SIG, and exits with its
# status: 124 when it has not ended 300 s later (it is then killed), 125 when it ended
# without ever waiting on the pipe.
stalled_pipe() {
    ${PYTHON:-/usr/bin/python3} -c 'import fcntl, os, signal, subprocess, sys, time
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: a few lines fill it
p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=w, stderr=w)
os.close(w)
def waiting():
    try:
        sc = open("/proc/%d/syscall" % p.pid).read().split()
    except OSError:
        return False
    return len(sc) > 1 and sc[0] == "1" and int(sc[1], 16) in (1, 2)
while p.poll() is None and not waiting():
    time.sleep(0.01)
if p.poll() is not None:
    sys.exit(125)
p.send_signal(getattr(signal, "SIG" + sys.argv[1]))
try:
    sys.exit(p.wait(timeout=300))
except subprocess.TimeoutExpired:
    p.kill()
    sys.exit(124)' "$@"
}

# need_mpi: skips the test (exit 77) without mpirun; else sets MPI (the launcher, fit for
# root and more ranks than cores) and TO (a timeout: a hung collective must fail the test,
# not the CI job; 600 s, far beyond a step of any test on the slowest machine, sanitizers
# included).
need_mpi() {
    if ! command -v mpirun >/dev/null; then
        echo "skipped (mpirun not found: run scripts/install-deps.sh)"
        exit 77
    fi
    MPI="mpirun --oversubscribe"
    [ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
    TO="timeout -k 5 600"
}

# wait_for WHAT CMD...: polls CMD every 0.1 s until it succeeds. An event that never comes
# is a failure naming WHAT, after 600 s (far beyond any machine's slowness: no test's
# outcome depends on how long the wait took), never a silent pass; returns 1 then.
wait_for() {
    _what=$1
    shift
    _n=0
    while ! "$@"; do
        _n=$((_n + 1))
        if [ $_n -ge 6000 ]; then
            notok "waited 600 s for $_what"
            return 1
        fi
        sleep 0.1
    done
}

# resume_after_kill TRIAL RUN LAST_STEP COMMAND...: after a kill -9 (who: of whom), COMMAND (a --resume
# auto of the run) must continue from the newest committed checkpoint of RUN — usually
# what `latest` names, or one newer when the kill fell between the directory's rename and
# `latest`'s replacement: that commit stands, since --resume auto lists the step
# directories — and `latest`, if any, must name a whole checkpoint. Counts in mid the
# trials killed while a checkpoint was being written, in live those killed before the run's
# end (LAST_STEP committed).
resume_after_kill() {
    _i=$1 _run=$2 _last=$3
    shift 3
    newest=$(ls -d "$_run"/step-* 2>/dev/null | sort | tail -n 1)
    newest=${newest:+$(basename "$newest")}
    newest=${newest:-none}
    named=$(cat "$_run/latest" 2>/dev/null || echo none)
    stale=$(ls -a "$_run" 2>/dev/null | grep -c '^\.step-.*\.tmp\.')
    [ "$stale" -gt 0 ] && mid=$((mid + 1))
    [ "$newest" != "$(printf 'step-%08d' "$_last")" ] && live=$((live + 1))
    if [ "$named" != none ]; then
        check "kill -9 #$_i: \`latest\` ($named) names a whole checkpoint" sh -c "'$BIN/ftk-verify' -q '$_run/$named' >/dev/null"
    fi
    "$@" >"$WORK/out" 2>"$WORK/err"
    _rc=$?
    if [ "$newest" = none ]; then
        _from="killed before the first commit: starts over"
        grep -q "resuming from" "$WORK/err" && _rc=99
    else
        _from="resumes from the newest committed $newest"
        grep -q "resuming from $_run/$newest " "$WORK/err" || _rc=98
    fi
    [ "$stale" -gt 0 ] && _from="$_from (killed mid-checkpoint: $stale unfinished directory removed)"
    [ "$named" != "$newest" ] && _from="$_from (killed after its rename, before \`latest\` named it: $named)"
    if [ $_rc -eq 0 ]; then ok "kill -9 #$_i ($who): $_from"; else
        notok "kill -9 #$_i ($who): $_from: exit $_rc"
        sed 's/^/     | /' "$WORK/err" | head -n 8
    fi
    check "kill -9 #$_i: no unfinished checkpoint directory left" test -z "$(ls -a "$_run" | grep '^\.step-')"
}
