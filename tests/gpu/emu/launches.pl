#!/usr/bin/perl -0777 -p
# launches.pl — a CUDA source made plain C++ for tests/gpu/emu (emu.h, emu_runtime.h):
#  - kernel<<<grid, block, smem, stream>>>(args) becomes
#    emu::launch("kernel", emu::config(grid, block, smem, stream), [&] { kernel(args); }),
#    the kernel called as each thread of the grid in turn (its template arguments deduced
#    from args, as the launch deduces them);
#  - the dynamic shared memory (extern __shared__ … smem[]) becomes emu::dyn_smem;
#  - mma_sync.cuh's PTX primitives become emu_mma_sync.h's.
s{(?<k>\b[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*(?<ta><(?:[^<>;]++|(?&ta))*>)?)\s*<<<(?<cfg>.*?)>>>\s*(?<args>\((?:[^()]++|(?&args))*\))}
 {emu::launch("$+{k}", emu::config($+{cfg}), [&] { $+{k}$+{args}; })}gs;
s{extern __shared__ __align__\(128\) unsigned char smem\[\];}{unsigned char *smem = emu::dyn_smem;}g;
s{#include "mma_sync.cuh"}{#include "emu_mma_sync.h"}g;
