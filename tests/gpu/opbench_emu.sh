#!/bin/sh
# gpu_opbench's harness at small shapes on the host emulation (build/tests/gpu_opbench_emu):
# every row runs and each figure is positive and finite (the figures mean nothing there).
# Usage: tests/gpu/opbench_emu.sh PROGRAM OUT_FILE
set -u
"$1" >"$2" || exit 1
cat "$2"
grep -Eiq "nan|inf|-[0-9]" "$2" && { echo "a figure that is not positive and finite"; exit 1; }
[ "$(grep -Ec " [0-9]+\.[0-9]+ ms " "$2")" -ge 60 ] || { echo "fewer rows than expected"; exit 1; }
exit 0
