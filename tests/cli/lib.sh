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
