# Helpers shared by the CLI test scripts (sourced). They need $WORK; they count in n/bad.
n=0 bad=0

ok() { n=$((n + 1)); echo "ok   $1"; }
notok() { n=$((n + 1)); bad=$((bad + 1)); echo "FAIL $1"; }

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
# The embedded demo as test inputs (callers set BIN and ROOT).
# demo_pack OUT MAX_LEN: its 40 records packed into rows of MAX_LEN, 4 of them for validation
demo_pack() {
    "$BIN/ftk-pack" -q -t "$ROOT/examples/demo/tokenizer.model" "$ROOT/examples/demo/alpaca-demo.json" -o "$1" \
        --pack --max-len "$2" --val-count 4
}
# demo_init OUT PRESET SEED: random weights of an ftk-init preset with the demo tokenizer
demo_init() { "$BIN/ftk-init" -q --preset "$2" --seed "$3" -t "$ROOT/examples/demo/tokenizer.model" -o "$1"; }

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
    echo "$((n - bad)) of $n checks passed"
    [ $bad -eq 0 ]
}

# need_mpi: skips the test (exit 77) without mpirun; else sets MPI (the launcher, fit for
# root and more ranks than cores) and TO (a timeout: a hung collective must fail the test,
# not the CI job).
need_mpi() {
    if ! command -v mpirun >/dev/null; then
        echo "skipped (mpirun not found: run scripts/install-deps.sh)"
        exit 77
    fi
    MPI="mpirun --oversubscribe"
    [ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
    TO="timeout -k 5 120"
}
