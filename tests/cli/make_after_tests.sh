#!/bin/sh
# make_after_tests.sh — the checkout still builds once the suite's scratch exists. make reads
# the compiler's dependency files from the object folders only; build/ also holds what the
# tests, the demo and the benchmarks leave, and there a folder named as a dependency file is
# would stop every later make ("…/empty.d: Is a directory. Stop."), and so would a file that
# is no makefile ("missing separator"). Both are planted in this test's work folder (under
# build/, as tests/run.sh gives every test). Then, in the checkout, with nothing run:
# `make -n` of every entry point that builds (all, test, test-slow, demo, bench, gpu-check,
# gpu-bundle) and of the sanitizer build; then `make all` and `make SAN=1 all` themselves,
# which find make test's builds complete: nothing is compiled.
# Exit 77 where make, or the checkout's Makefile, is not there.
# Usage: tests/cli/make_after_tests.sh WORK_DIR   (WORK_DIR under the checkout's build/)
set -u
WORK=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
command -v make >/dev/null || { echo "skipped (make not found)"; exit 77; }
[ -f "$ROOT/Makefile" ] || { echo "skipped (no Makefile at $ROOT: not a checkout)"; exit 77; }
rm -rf "$WORK" && mkdir -p "$WORK/planted/spare.d" || exit 1
WORK=$(cd "$WORK" && pwd)
. "$ROOT/tests/cli/lib.sh"
case $WORK in
"$ROOT"/build/*) ;;
*) echo "FAIL: $WORK is not under $ROOT/build: what is planted there proves nothing"; exit 1 ;;
esac
printf 'no makefile (a dependency include that reads this line stops there)\n' >"$WORK/planted/leftover.d"
# the outer make's flags (its jobserver's descriptors among them) are not this make's
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES
cd "$ROOT" || exit 1
expect "make -n all test test-slow demo bench gpu-check gpu-bundle, with the suite's scratch in build/" 0 make -n all test test-slow demo bench gpu-check gpu-bundle
grep -q 'planted\|Is a directory\|missing separator' "$WORK/out" "$WORK/err" &&
    notok "... and make never read what was planted" || ok "... and make never read what was planted"
expect "make -n SAN=1 all" 0 make -n SAN=1 all
# built [asan/]: what make wrote after the stamp (in bin/, lib/ and build/ or build/asan/,
# the tests' work folders aside)
built() {
    find bin lib "build/${1:-}" -path 'build/test-work*' -prune -o -newer "$WORK/stamp" -type f -print 2>/dev/null |
        head -n 5 | tr '\n' ' '
}
: >"$WORK/stamp"
expect "make all" 0 make all
b=$(built)
check "... built nothing: make test built it all, and nothing the tests left is newer${b:+ (it built $b)}" test -z "$b"
: >"$WORK/stamp"
expect "make SAN=1 all" 0 make SAN=1 all
b=$(built asan/)
check "... built nothing either${b:+ (it built $b)}" test -z "$b"
finish
