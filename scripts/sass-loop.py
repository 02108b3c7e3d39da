#!/usr/bin/env python3
"""sass-loop.py — the instructions one iteration of a CUDA kernel's 16-byte loop executes,
read from its SASS (an estimate of the kernel's issue cost per element, without a GPU).

Usage: cuobjdump -sass -arch sm_90 build/kernels/cuda/vectors.o > v.sass
       scripts/sass-loop.py v.sass 'adamw_multi_kernelILi1Ett' [ELEMENTS]

FUNCTION is a substring of the mangled name (the first function that has it). The loop is
the first backward branch whose body loads 16 bytes (LDG.E.128); the walk goes from its
head to that branch once: unconditional branches are followed; a forward conditional
branch is taken when the instructions it skips hold a CALL (the slow paths of IEEE
division and square root), otherwise it falls through (finite values: the NaN and
infinity cases are skipped by their own branches further on); a predicated instruction
counts as issued. BSSY, BSYNC and NOP are not counted. ELEMENTS (default 8) divides the
counts: the elements one iteration handles.

Written for AdamW's stochastic-rounding kernels (docs/gpu.md); the rule for conditional
branches fits kernels whose only forward branches skip slow paths or special values.
"""
import collections
import re
import sys

INT = ['IMAD', 'LOP3', 'SHF', 'IADD3', 'LEA', 'ISETP', 'SEL', 'PRMT', 'IMNMX', 'VIMNMX', 'MOV', 'FLO', 'POPC']


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    text = open(sys.argv[1]).read()
    per = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    body = next((f for f in re.split(r'\n\s*Function : ', text)[1:] if sys.argv[2] in f.split('\n', 1)[0]), None)
    if body is None:
        sys.exit('no function with %s in %s' % (sys.argv[2], sys.argv[1]))
    ins = []  # (address, predicate, opcode, opcode with modifiers, branch target)
    for line in body.split('\n'):
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);', line)
        if m:
            t = re.search(r'0x([0-9a-f]+)', m.group(5)) if m.group(3) == 'BRA' else None
            ins.append((int(m.group(1), 16), (m.group(2) or '').strip(), m.group(3), m.group(3) + m.group(4),
                        int(t.group(1), 16) if t else None))
    at = {a: k for k, (a, *_r) in enumerate(ins)}
    loop = next(((at[t], k) for k, (a, p, op, full, t) in enumerate(ins) if op == 'BRA' and t is not None and t < a
                 and any(x[3].startswith('LDG.E.128') for x in ins[at[t]:k + 1])), None)
    if loop is None:
        sys.exit('no loop with 16-byte loads in that function')
    k, back = loop
    cnt = collections.Counter()
    while k != back:
        a, p, op, full, t = ins[k]
        if op in ('BSSY', 'BSYNC', 'NOP'):
            k += 1
            continue
        cnt[op] += 1
        if op == 'BRA' and t is not None and (not p or (t > a and any(x[2] == 'CALL' for x in ins[k + 1:at[t]]))):
            k = at[t]
            continue
        k += 1
    print('%-22s %6s %9s' % ('', 'total', 'a element' if per == 1 else 'per elem'))
    row = lambda name, n: print('%-22s %6d %9.1f' % (name, n, n / per))
    row('instructions', sum(cnt.values()))
    for o in INT:
        if cnt[o]:
            row('  ' + o, cnt[o])
    row('integer ALU (above)', sum(cnt[o] for o in INT))
    row('IMAD + LOP3 + SHF', cnt['IMAD'] + cnt['LOP3'] + cnt['SHF'])
    row('floating point', sum(v for o, v in cnt.items() if o[0] == 'F' or o == 'MUFU'))
    row('memory (LDG, STG)', cnt['LDG'] + cnt['STG'])


if __name__ == '__main__':
    main()
