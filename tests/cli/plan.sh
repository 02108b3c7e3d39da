#!/bin/sh
# CLI tests of the memory plan, ftk-train --plan (engine/plan.h):
#  - the plan is what a run measures: for every precision mode x strategy (full, grad-op,
#    none, hybrid with --shard-group-size 2, hpz with its node of 2 and with --node-size 1)
#    on 2 ranks, full on 1 rank, grad-op on 3, and
#    full --recompute (block) and --recompute norms on 2, the plan's total bytes equal rank 0's mem_peak_bytes of a
#    2-step run with the same options, exactly (stories260K's shape; tiny's untied one on 2
#    ranks, full);
#  - --units group:2 (full, fp32), size:600KB (full, bf16-mixed) and group:3 (grad-op,
#    bf16-true) on 2 ranks: the plan equals the run, and group:2 plans more gathered bytes;
#  - with FTK_FUSED=all (the CPU runs the model's fused paths) the plan still equals the run;
#  - the activations row gives every --recompute level's figure, the level's own first,
#    none > norms > block; the levels change only the activations row and the total;
#  - --recompute auto --device-memory B plans the least recompute whose total fits B,
#    and a CPU run with auto (the host's memory) equals its plan;
#  - where no level fits, --plan and a run exit 2 (the run leaves no run directory) saying
#    so and what would fit, each suggestion true when planned: Llama-2-7B fp32 on 80 GB
#    (the issue's 110.18 GB) fits in bf16-true and on the fewest ranks named (one fewer
#    does not), bf16-true at 8 x 512 on 55 GB fits at the largest micro-batch named;
#  - Llama-2-7B bf16-true at 8 x 512 and 4 x 512 on 80 GB and 141 GB: what auto picks
#    (printed: docs/training.md's table);
#  - --plan writes nothing (no run directory even with --out) and needs no --out, and
#    --device cuda plans without a GPU;
#  - Llama-2-7B on one 80 GB GPU (micro-batch 4 x 512 tokens, --recompute): bf16-true fits,
#    bf16-mixed does not (its float32 master weights and moments alone are 12 bytes per
#    parameter, 81 GB), and the weights and optimizer rows are the modes' bytes per parameter;
#  - bad usage exits 2 with a message.
# Usage: tests/cli/plan.sh BIN_DIR WORK_DIR [quick]   (quick: every plan, but runs to measure
#        only for one strategy per mode, 2 ranks: full, none, grad-op; the sanitizer build's pass)
set -u
BIN=$1 WORK=$2 QUICK=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi

demo_pack "$WORK/demo.h5" 128
# stories260K's shape (5 blocks, tied embeddings: full and grad-op differ in what they hold)
# and tiny's (2 blocks, untied).
demo_init "$WORK/s260.h5" stories260k 1
demo_init "$WORK/tiny.h5" tiny 1
OPTS="-d $WORK/demo.h5 --micro-batch 2 --global-batch 7"
P="$BIN/ftk-train --plan -m $WORK/s260.h5 $OPTS"
# The runs measure without checkpoints: a step's mem_peak_bytes is written before that step's
# checkpoint, so the last line never saw one, and the writes only cost time.
T="$BIN/ftk-train $OPTS --steps 2 --eval-every 1 -q -j1 --no-save"

# total FILE: the plan's total in bytes; row FILE NAME: a row's first figure, as printed.
total() { sed -n 's/^  total .*(\([0-9]*\) bytes,.*/\1/p' "$1"; }
row() { sed -n "s/^  $2  *\([0-9.]* [MG]B\).*/\1/p" "$1"; }
peak() { sed -n 's/.*"mem_peak_bytes": \([0-9]*\)}$/\1/p' "$1/metrics.jsonl" | tail -n 1; }

# --- the plan equals the run's high-water mark ------------------------------------------------
for prec in fp32 bf16-mixed bf16-true; do
    for cfg in "s260 2 full" "s260 2 grad-op" "s260 2 none" "s260 2 hybrid --shard-group-size 2" "s260 1 full" \
        "s260 2 hpz" "s260 2 hpz --node-size 1" "s260 3 grad-op" "s260 2 full --recompute" "s260 2 full --recompute norms" "tiny 2 full"; do
        set -- $cfg
        model=$1 np=$2
        shift 2
        tag="$prec, $model, $np rank$([ "$np" = 1 ] || echo s), $*"
        id=$(echo "$prec-$model-$np-$*" | tr -d ' ')
        expect "$tag: --plan" 0 $BIN/ftk-train --plan -m "$WORK/$model.h5" $OPTS --ranks "$np" --precision "$prec" \
            --strategy "$@"
        cp "$WORK/out" "$WORK/$id.plan"
        want=$(total "$WORK/$id.plan")
        if [ -n "$QUICK" ]; then
            case "$prec $cfg" in "fp32 s260 2 full" | "bf16-mixed s260 2 none" | "bf16-true s260 2 grad-op") ;;
                *) continue ;;
            esac
        fi
        expect "$tag: 2 steps" 0 $TO $MPI -np "$np" $T -m "$WORK/$model.h5" -o "$WORK/$id" --precision "$prec" \
            --strategy "$@"
        got=$(peak "$WORK/$id")
        check "$tag: planned total $want bytes == measured mem_peak_bytes ${got:-(none)}" \
            test -n "$want" -a "$want" = "$got"
    done
done

# hpz's secondary copy: 1/n of every unit in the compute dtype, the only difference from full
for prec in fp32 bf16-mixed bf16-true; do
    tf=$(total "$WORK/$prec-s260-2-full.plan") t2=$(total "$WORK/$prec-s260-2-hpz.plan")
    t1=$(total "$WORK/$prec-s260-2-hpz--node-size1.plan")
    check "$prec: hpz adds its secondary copy to full's plan: nodes of 1 ($t1 bytes) twice what nodes of 2 add ($t2)" \
        test -n "$tf" -a -n "$t1" -a -n "$t2" -a $((t2 - tf)) -gt 0 -a $((t1 - tf)) = $((2 * (t2 - tf)))
done
# --- --units (engine/units.h): a larger unit gathers more at once; the plan counts it exactly -----
for cfg in "fp32 full group:2" "bf16-mixed full size:600KB" "bf16-true grad-op group:3"; do
    set -- $cfg
    tag="$1, s260, 2 ranks, $2 --units $3"
    id=units-$1-$2-$(echo "$3" | tr : -)
    expect "$tag: --plan" 0 $P --ranks 2 --precision "$1" --strategy "$2" --units "$3"
    cp "$WORK/out" "$WORK/$id.plan"
    want=$(total "$WORK/$id.plan")
    expect "$tag: 2 steps" 0 $TO $MPI -np 2 $T -m "$WORK/s260.h5" -o "$WORK/$id" --precision "$1" --strategy "$2" \
        --units "$3"
    got=$(peak "$WORK/$id")
    check "$tag: planned total $want bytes == measured mem_peak_bytes ${got:-(none)}" \
        test -n "$want" -a "$want" = "$got"
done
g1=$(row "$WORK/fp32-s260-2-full.plan" 'gathered units')
g2=$(row "$WORK/units-fp32-full-group-2.plan" 'gathered units')
check "full --units group:2 gathers more at once ($g2) than block ($g1)" awk "BEGIN { exit !(${g2% *} > ${g1% *}) }"
check "the plan's header names --units group:2" grep -q -- ", --units group:2," "$WORK/units-fp32-full-group-2.plan"

# --- FTK_FUSED=all (the CPU's default is none): the fused paths allocate other activations
# (one [n, 2F] gate/up buffer, the q/k/v product's scratch); the plan follows the switch
for prec in fp32 bf16-true; do
    for rec in "" --recompute "--recompute norms"; do
        recid=$(echo "$rec" | tr -d ' ')
        tag="FTK_FUSED=all, $prec, s260, 2 ranks, full $rec"
        id="fused-$prec$recid"
        expect "$tag: --plan" 0 env FTK_FUSED=all $BIN/ftk-train --plan -m "$WORK/s260.h5" $OPTS --ranks 2 \
            --precision "$prec" --strategy full $rec
        cp "$WORK/out" "$WORK/$id.plan"
        want=$(total "$WORK/$id.plan")
        expect "$tag: 2 steps" 0 env FTK_FUSED=all $TO $MPI -np 2 $T -m "$WORK/s260.h5" -o "$WORK/$id" \
            --precision "$prec" --strategy full $rec
        got=$(peak "$WORK/$id")
        check "$tag: planned total $want bytes == measured mem_peak_bytes ${got:-(none)}" \
            test -n "$want" -a "$want" = "$got"
        none=$(total "$WORK/$prec-s260-2-full$recid.plan")
        check "$tag: differs from the unfused plan ($none bytes)" test -n "$none" -a "$want" != "$none"
    done
done

# --- --recompute levels: the activations row names each level's figure --------------------------
# acts FILE LEVEL: the activations figure the row gives for LEVEL
acts() { sed -n "s/^  activations .*(--recompute.* $2 \([0-9.]* [MG]B\)[,)].*/\1/p" "$1"; }
F=$WORK/fp32-s260-2-full
an=$(acts "$F.plan" none) am=$(acts "$F.plan" norms) ab=$(acts "$F.plan" block)
check "--recompute levels: none ($an) > norms ($am) > block ($ab)" \
    awk "BEGIN { exit !(${an% *} > ${am% *} && ${am% *} > ${ab% *} && ${ab% *} > 0) }"
for lv in none:"" norms:--recomputenorms block:--recompute; do
    f=$F${lv#*:}.plan
    check "--recompute ${lv%%:*}: its row ($(row "$f" activations)) is its level's figure, the same in every plan" \
        test -n "$(row "$f" activations)" -a "$(row "$f" activations)" = "$(acts "$F.plan" "${lv%%:*}")" \
        -a "$(acts "$f" "${lv%%:*}")" = "$(acts "$F.plan" "${lv%%:*}")"
done
for prec in fp32 bf16-mixed bf16-true; do
    w1=$(grep -v activations "$WORK/$prec-s260-2-full.plan" | grep -v total | grep -v 'memory plan')
    for rec in --recompute --recomputenorms; do
        w2=$(grep -v activations "$WORK/$prec-s260-2-full$rec.plan" | grep -v total | grep -v 'memory plan')
        check "$prec: $rec changes only the activations row and the total" test "$w1" = "$w2"
    done
done

# --- --recompute auto: the least recompute that fits ----------------------------------------------
tn=$(total "$F.plan") tm=$(total "$F--recomputenorms.plan") tb=$(total "$F--recompute.plan")
for case in "$tn none $tn" "$((tn - 1)) norms $tm" "$tm norms $tm" "$((tm - 1)) block $tb" "$tb block $tb"; do
    set -- $case
    expect "--recompute auto --device-memory $1: --plan" 0 $P --ranks 2 --strategy full --recompute auto \
        --device-memory "$1"
    check "auto in $1 bytes (none $tn, norms $tm, block $tb): $2 fits, total $3" \
        sh -c "grep -q -- '--recompute auto: $2 fits ' '$WORK/out' && test '$(total "$WORK/out")' = '$3'"
done
expect "--recompute auto without --device-memory: the host's memory (--plan)" 0 $P --recompute auto
grep -q -- "--recompute auto: none fits " "$WORK/out" && ok "auto on the host: none (a small model)" ||
    notok "auto on the host: none (a small model)"
# --- --recompute auto where no level fits: exit 2, and what would fit -----------------------------
expect "--recompute auto --device-memory $((tb - 1)) (under block's $tb): --plan exits 2" 2 $P --ranks 2 \
    --strategy full --recompute auto --device-memory $((tb - 1))
check "... the header says no level fits, the table is block's" \
    sh -c "grep -q -- '--recompute auto: no level fits ' '$WORK/out' && test '$(total "$WORK/out")' = '$tb'"
check "... stderr says so, naming block's total" grep -q -- "--recompute auto: no level fits .*(the least, block, needs" \
    "$WORK/err"
expect "a run with --recompute auto where no level fits: exit 2" 2 $T -m "$WORK/s260.h5" -o "$WORK/nofit" \
    --recompute auto --device-memory $((tb - 1))
check "... saying so and what would fit, leaving no run directory" \
    sh -c "grep -q -- '--recompute auto: no level fits the device.s .*; what would fit: ' '$WORK/err' && test ! -e '$WORK/nofit'"
# advice WHAT: the GB figure of the suggestion starting with WHAT in $WORK/err ("" when none)
advice() { sed -n "s/.*[:;] $1 (--recompute [a-z]*, \([0-9.]*\) GB.*/\1/p" "$WORK/err"; }
A7="$BIN/ftk-train --plan --preset llama2-7b --max-len 512 --device cuda --recompute auto"
expect "7B fp32, 4 x 512, auto on 80 GB (block: 111.03 GB): --plan exits 2" 2 $A7 --micro-batch 4 --device-memory 80GB
sed 's/^/     | /' "$WORK/err"
bt=$(advice "--precision bf16-true")
nr=$(sed -n 's/.*[:;] \([0-9]*\) ranks (--recompute.*/\1/p' "$WORK/err")
check "... bf16-true would fit (${bt:-not said})" test -n "$bt"
check "... more ranks would (${nr:-not said})" test -n "$nr"
expect "... --precision bf16-true: fits" 0 $A7 --micro-batch 4 --device-memory 80GB --precision bf16-true
check "... at the total the advice said ($bt GB)" test -n "$bt" -a "$(row "$WORK/out" total)" = "$bt GB"
expect "... --ranks ${nr:-?}: fits" 0 $A7 --micro-batch 4 --device-memory 80GB --ranks "${nr:-0}"
expect "... --ranks $((${nr:-1} - 1)): does not (the fewest were named)" 2 $A7 --micro-batch 4 --device-memory 80GB \
    --ranks $((${nr:-1} - 1))
# (block: 5 x 512 56.28 GB, 6 x 512 56.57 GB on 2026-11-28)
expect "7B bf16-true, 8 x 512, auto on 56.4 GB (block: 57.14 GB): --plan exits 2" 2 $A7 --micro-batch 8 \
    --device-memory 56.4GB --precision bf16-true
mb=$(sed -n 's/.*what would fit:\(.*;\)\{0,1\} --micro-batch \([0-9]*\) (--recompute.*/\2/p' "$WORK/err")
check "... a smaller micro-batch would fit (${mb:-not said})" test -n "$mb"
expect "... --micro-batch ${mb:-?}: fits" 0 $A7 --micro-batch "${mb:-0}" --device-memory 56.4GB --precision bf16-true
expect "... --micro-batch $((${mb:-0} + 1)): does not (the largest was named)" 2 $A7 --micro-batch $((${mb:-0} + 1)) \
    --device-memory 56.4GB --precision bf16-true
expect "--recompute auto --device cuda without a GPU or --device-memory: exit 2" 2 $P --recompute auto --device cuda
grep -q -- "--device-memory" "$WORK/err" && ok "auto on cuda: asks for --device-memory" ||
    notok "auto on cuda: asks for --device-memory"
expect "--device-memory without --recompute auto: exit 2" 2 $P --device-memory 80GB
expect "--recompute auto: 2 steps (CPU, 2 ranks)" 0 $TO $MPI -np 2 $T -m "$WORK/s260.h5" -o "$WORK/auto" \
    --recompute auto --device-memory "$tm"
got=$(peak "$WORK/auto")
check "--recompute auto in $tm bytes: measured mem_peak_bytes ${got:-(none)} == the norms plan" test "$got" = "$tm"
g1=$(row "$WORK/fp32-s260-2-full.plan" 'gathered units')
g2=$(row "$WORK/fp32-s260-2-grad-op.plan" 'gathered units')
check "grad-op holds more gathered units ($g2) than full ($g1)" awk "BEGIN { exit !(${g2% *} > ${g1% *}) }"

# --- --plan writes nothing, needs no --out, plans cuda without a GPU ------------------------------
expect "--plan with --out: exit 0" 0 $P -o "$WORK/planned"
check "--plan with --out: no run directory" test ! -e "$WORK/planned"
expect "--plan --device cuda (no GPU needed)" 0 $P --device cuda --precision bf16-true
grep -q "device cuda" "$WORK/out" && test -n "$(total "$WORK/out")" && ok "--device cuda: a plan with a total" ||
    notok "--device cuda: a plan with a total"

# --- Llama-2-7B on an 80 GB GPU -----------------------------------------------------------------
B7="$BIN/ftk-train --plan --preset llama2-7b --max-len 512 --micro-batch 4 --recompute --device cuda"
n7=6738415616 # parameters of Llama-2-7B
for prec in bf16-true bf16-mixed; do
    expect "7B, 1 rank, $prec: --plan" 0 $B7 --precision "$prec"
    cp "$WORK/out" "$WORK/7b-$prec.plan"
    echo "     $prec: total $(row "$WORK/7b-$prec.plan" total), weights $(row "$WORK/7b-$prec.plan" weights)," \
        "optimizer $(row "$WORK/7b-$prec.plan" 'optimizer state')"
done
t=$(total "$WORK/7b-bf16-true.plan")
check "7B bf16-true, micro-batch 4 x 512, --recompute: under 80 GB on 1 rank ($t bytes)" \
    test -n "$t" -a "${t:-0}" -lt 80000000000
t=$(total "$WORK/7b-bf16-mixed.plan")
check "7B bf16-mixed: over 80 GB on 1 rank ($t bytes)" test -n "$t" -a "${t:-0}" -gt 80000000000
# The rows in GB (2 decimals) against bytes per parameter: bf16-true 2 (weights) and 4
# (moments); bf16-mixed 4 + 2 (master and working copy) and 8.
near() { awk -v g="$1" -v b="$2" -v n=$n7 'BEGIN { d = g - b * n / 1e9; exit !(g + 0 > 0 && d * d < 0.006 ^ 2) }'; }
check "7B bf16-true: weights 2 bytes/parameter" near "$(row "$WORK/7b-bf16-true.plan" weights)" 2
check "7B bf16-true: optimizer state 4 bytes/parameter" \
    near "$(row "$WORK/7b-bf16-true.plan" 'optimizer state')" 4
check "7B bf16-mixed: weights 6 bytes/parameter" near "$(row "$WORK/7b-bf16-mixed.plan" weights)" 6
check "7B bf16-mixed: optimizer state 8 bytes/parameter" \
    near "$(row "$WORK/7b-bf16-mixed.plan" 'optimizer state')" 8

# --- Llama-2-7B bf16-true on one GPU: what --recompute auto takes (docs/training.md's table)
for dev in 80GB 141GB; do
    for mb in 8 4; do
        expect "7B bf16-true, $mb x 512, $dev: --plan --recompute auto" 0 $BIN/ftk-train --plan --preset llama2-7b \
            --max-len 512 --micro-batch "$mb" --precision bf16-true --device cuda --recompute auto --device-memory "$dev"
        echo "     $dev, $mb x 512: $(sed -n 's/.*--recompute auto: \([a-z]*\) .*/\1/p' "$WORK/out")," \
            "total $(row "$WORK/out" total); $(sed -n 's/^  total by level  *//p' "$WORK/out")"
        cp "$WORK/out" "$WORK/7b-auto-$dev-$mb.plan"
    done
done
pick() { sed -n 's/.*--recompute auto: \([a-z]*\) .*/\1/p' "$WORK/7b-auto-$1.plan"; }
# bf16-true's state is 8 bytes/parameter (53.9 GB): every activation kept fits both at 4 x 512 and 8 x 512
for c in 80GB-8 80GB-4 141GB-8 141GB-4; do
    check "7B bf16-true, $c: auto takes none ($(pick $c))" test "$(pick $c)" = none
done

# --- bad usage: exit 2 with a message ------------------------------------------------------------
msg() { # msg NAME PATTERN: stderr says PATTERN
    grep -q -- "$2" "$WORK/err" && ok "$1: message '$2'" || { notok "$1: message '$2'"; head -n 3 "$WORK/err"; }
}
expect "--plan without --model or --preset: exit 2" 2 "$BIN/ftk-train" --plan --max-len 128
msg "neither" "exactly one of --model and --preset"
expect "--plan with both --model and --preset: exit 2" 2 "$BIN/ftk-train" --plan -m "$WORK/tiny.h5" \
    --preset tiny --max-len 128
msg "both" "exactly one of --model and --preset"
expect "--plan without --data or --max-len: exit 2" 2 "$BIN/ftk-train" --plan -m "$WORK/tiny.h5"
msg "no length" "give --data or --max-len"
expect "--plan --ranks 0: exit 2" 2 $P --ranks 0
msg "--ranks 0" "option --ranks: .0. is out of range; need an integer 1..99999"
expect "--plan --preset unknown: exit 2" 2 "$BIN/ftk-train" --plan --preset unknown --max-len 128
msg "unknown preset" "unknown"
expect "--ranks without --plan: exit 2" 2 $T -m "$WORK/tiny.h5" -o "$WORK/x" --ranks 2
msg "--ranks without --plan" "are for --plan"
check "no run directory left by refused runs" test ! -e "$WORK/x"
finish
