#!/bin/sh
# gpu-bundle.sh OUT: the self-contained GPU check (`make gpu-bundle`: OUT = gpu/). Writes the
# folder OUT (at most GPU_BUNDLE_MAX_MIB, 48 MiB) that a bare GPU machine needs to run every
# GPU check and benchmark with one command, `sh OUT/run.sh OUTDIR [BUDGET_S]`
# (tests/gpu/bundle/run.sh; docs/gpu.md, "The GPU bundle"), and nothing that machine has.
# OUT holds run.sh, BUILD_INFO and payload.tar.gz (gzip: OpenBLAS alone is 36 MB unpacked),
# which run.sh unpacks outside the folder it was sent in; the payload holds:
#   libexec/   the built programs, stripped
#   bin/, build/tests/   a wrapper of each (the repository's layout, which the test scripts
#              expect) that runs it with the bundle's libraries (LD_LIBRARY_PATH set for
#              that program alone: python3 and PyTorch there keep their own)
#   lib/       libftk-cuda.so, the CUDA backend ftk-train and ftk-generate open at run time
#              ($ORIGIN/../lib; its CUDA code: sm_80, sm_90, compute_90 PTX), and
#              the shared libraries they need beyond the C library, libstdc++ and CUDA's:
#              HDF5, zstd, xxHash, OpenBLAS, libgfortran, libgomp, Open MPI and their own
#   mpi/       Open MPI's launcher (mpirun), its plugins (not the network ones: one machine),
#              PMIx's, their help texts; env.sh points Open MPI there (OPAL_PREFIX and kin)
#   tests/, examples/demo/, data/   the scripts the steps run and the small data they read
#              (the Llama 2 tokenizer, the Alpaca files; no weights: the 7B benchmark makes
#              random ones there with ftk-init)
# Not bundled: libcudart, cuBLAS(Lt), NCCL, cuDNN and the driver (run.sh finds the system's,
# else PyTorch's wheels), the C library (build where glibc is not newer than the target's).
# gpu-bundle.sh --emulated OUT (tests/gpu/bundle/rehearsal.sh): a folder of the same programs
# on the host emulation of CUDA (build/tests/emu, tests/gpu/emu; libexec/) and its
# libnccl.so.2 (lib/): `FTK_BUNDLE_EMULATED=OUT sh gpu/run.sh ...` puts them in place of the
# GPU's, so that run.sh can be rehearsed without a GPU, with the bundle's libraries.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
EMU=""
[ "${1:-}" = --emulated ] && { EMU=--emulated; shift; }
OUT=${1:?usage: gpu-bundle.sh [--emulated] OUT}
DATA=${FTK_DATA:-$ROOT/../shared/data}
MAX_MIB=${GPU_BUNDLE_MAX_MIB:-48}
# GPU_BUNDLE_GZIP: the payload's gzip level (default 6)
die() { echo "gpu-bundle: error: $*" >&2; exit 1; }

TOOLS="ftk ftk-train ftk-pack ftk-init ftk-generate ftk-verify ftk-info"
TESTS="gpu_smoke gpu_ops gpu_opbench cudnn_graphs test_comm"
for t in $TOOLS; do [ -x "bin/$t" ] || die "bin/$t missing: run make first"; done
[ -f lib/libftk-cuda.so ] || die "lib/libftk-cuda.so missing: the bundle needs the CUDA build (make, where nvcc is found)"
for t in $TESTS; do
    [ -x "build/tests/$t" ] || die "build/tests/$t missing: the bundle needs the CUDA build (make, where nvcc is found)"
done
if [ "$EMU" = --emulated ]; then
    for t in build/tests/emu/bin/ftk-train build/tests/emu/bin/ftk-generate build/tests/emu/bin/test_comm \
        build/tests/gpu_ops_emu build/tests/gpu_opbench_emu build/tests/emu/lib/libnccl.so.2; do
        [ -e "$t" ] || die "$t missing (the host emulation of CUDA: make)"
    done
fi
command -v strip >/dev/null || die "strip not found (binutils)"

if [ "$EMU" = --emulated ]; then
    tmp=$OUT.tmp.$$
    rm -rf "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/libexec" "$tmp/lib"
    for p in build/tests/emu/bin/ftk-train build/tests/emu/bin/ftk-generate build/tests/emu/bin/test_comm \
        build/tests/gpu_ops_emu:gpu_ops build/tests/gpu_opbench_emu:gpu_opbench; do
        n=${p#*:}
        [ "$n" = "$p" ] && n=$(basename "$p")
        cp "${p%%:*}" "$tmp/libexec/$n" && strip "$tmp/libexec/$n"
    done
    # found through the emulated programs' DT_RPATH, $ORIGIN/../lib, ahead of any other NCCL
    cp build/tests/emu/lib/libnccl.so.2 "$tmp/lib/" && strip "$tmp/lib/libnccl.so.2"
    echo "the host emulation of CUDA, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >"$tmp/EMULATED"
    rm -rf "$OUT"
    mv "$tmp" "$OUT"
    trap - EXIT
    echo "gpu-bundle: $OUT: the emulated programs ($(du -sh "$OUT" | cut -f1))"
    exit 0
fi

tmp=$OUT.tmp.$$
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
stage=$tmp/stage
mkdir -p "$stage/libexec" "$stage/bin" "$stage/build/tests" "$stage/lib" "$stage/mpi/bin" "$stage/mpi/lib/openmpi3" \
    "$stage/mpi/lib/pmix" "$stage/mpi/share" "$stage/mpi/etc" "$stage/tests/gpu" "$stage/tests/cli" "$stage/tests/bench" \
    "$stage/examples/demo" "$stage/data/alpaca" "$stage/data/llama2-tokenizer" "$stage/plugin"

# put SRC NAME: a program, stripped, into libexec/
put() { cp "$1" "$stage/libexec/$2" && strip "$stage/libexec/$2"; }
for t in $TOOLS; do put "bin/$t" "$t"; done
for t in $TESTS; do put "build/tests/$t" "$t"; done
# the CUDA backend of ftk-train and ftk-generate, found through $ORIGIN/../lib (engine/cuda_load.c)
cp lib/libftk-cuda.so "$stage/lib/" && strip --strip-debug "$stage/lib/libftk-cuda.so"
[ -f build/plugin/libh5zstd.so ] && cp build/plugin/libh5zstd.so "$stage/plugin/"

# The wrappers: tools in bin/, test programs in build/tests/ (where the scripts look).
wrap() { # wrap DIR NAME UP: DIR/NAME runs libexec/NAME; UP leads from DIR to the bundle
    cat >"$stage/$1/$2" <<EOF
#!/bin/sh
# gpu bundle: libexec/$2 with the bundle's libraries (env.sh)
B=\$(cd "\$(dirname "\$0")/$3" && pwd)
[ -n "\${FTK_BUNDLE_LD_PATH:-}" ] || . "\$B/env.sh"
# FTK_BUNDLE_RUNS=FILE (run.sh's training steps): rank 0's command line appended, fields
# ended by 0x1f, the world size first, so the step can plan each run beside its peak
[ -z "\${FTK_BUNDLE_RUNS:-}" ] || [ "\${OMPI_COMM_WORLD_RANK:-0}" != 0 ] ||
    { printf '%s\037' "\${OMPI_COMM_WORLD_SIZE:-1}" "$2" "\$@"; echo; } >>"\$FTK_BUNDLE_RUNS"
LD_LIBRARY_PATH=\$FTK_BUNDLE_LD_PATH exec "\$B/libexec/$2" "\$@"
EOF
    chmod 755 "$stage/$1/$2"
}
for t in $TOOLS; do wrap bin "$t" ..; done
for t in $TESTS; do wrap build/tests "$t" ../..; done

# Open MPI's run time (ftk-train links libmpi even alone; mpirun for the NCCL steps): the
# launcher and the plugins of one machine (no InfiniBand, OFI, UCX, PSM: their libraries
# are large and a single node needs shared memory only).
MA=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
ompi=/usr/lib/$MA/openmpi/lib/openmpi3
pmix=/usr/lib/$MA/pmix2
if [ -d "$ompi" ]; then
    for f in "$ompi"/*.so; do
        case $(basename "$f") in *ofi* | *ucx* | *openib* | *verbs* | *psm* | *usnic* | *portals* | *java* | *cuda*) continue ;; esac
        cp "$f" "$stage/mpi/lib/openmpi3/"
    done
    [ -d "$pmix/lib/pmix" ] && cp "$pmix"/lib/pmix/*.so "$stage/mpi/lib/pmix/"
    for b in orterun orted; do cp -L "/usr/bin/$b" "$stage/mpi/libexec-$b" && strip "$stage/mpi/libexec-$b"; done
    [ -d /usr/share/openmpi ] && cp -a /usr/share/openmpi "$stage/mpi/share/"
    [ -d "$pmix/share/pmix" ] && cp -a "$pmix/share/pmix" "$stage/mpi/share/"
    [ -d /etc/openmpi ] && cp -L /etc/openmpi/* "$stage/mpi/etc/" 2>/dev/null || true
    for b in orterun orted; do
        cat >"$stage/mpi/bin/$b" <<EOF
#!/bin/sh
# gpu bundle: Open MPI's $b with the bundle's libraries and plugins (env.sh)
B=\$(cd "\$(dirname "\$0")/../.." && pwd)
[ -n "\${FTK_BUNDLE_LD_PATH:-}" ] || . "\$B/env.sh"
LD_LIBRARY_PATH=\$FTK_BUNDLE_LD_PATH exec "\$B/mpi/libexec-$b" "\$@"
EOF
        chmod 755 "$stage/mpi/bin/$b"
    done
    ln -s orterun "$stage/mpi/bin/mpirun"
    ln -s orterun "$stage/mpi/bin/mpiexec"
fi

# The libraries: what ldd resolves for every program and plugin, under the name asked for,
# less the C library, libstdc++/libgcc_s (every machine that runs PyTorch has newer ones)
# and CUDA's own (the GPU machine's must be used).
is_elf() { [ "$(head -c 4 "$1" | tail -c 3)" = ELF ]; }
objs=$(find "$stage/libexec" "$stage/mpi" "$stage/plugin" "$stage/lib/libftk-cuda.so" -type f \( -name '*.so*' -o -perm -u+x \) ! -name '*.txt')
for f in $objs; do
    is_elf "$f" || continue
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | grep -Ev '^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas[^ ]*|libcudnn[^ ]*|libnccl|libnvidia[^ ]*|libmvec)\.so' |
    while read -r name path; do
        [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"
    done
missing=$(for f in $objs; do is_elf "$f" && ldd "$f" 2>/dev/null | grep 'not found'; done |
    grep -Ev 'lib(cuda|cudart|cublas|nccl)' | sort -u || true)
[ -z "$missing" ] || die "unresolved here: $missing"
# shared objects: stripped of their debug sections only (their symbols are their interface)
for l in "$stage"/lib/*.so*; do strip --strip-debug "$l" 2>/dev/null || true; done

# env.sh: what run.sh and the wrappers set (the bundle's own paths; the CUDA libraries are
# added by run.sh, which finds them).
cat >"$stage/env.sh" <<'EOF'
# gpu bundle: sourced by run.sh and the wrappers; B is the bundle's folder.
FTK_BUNDLE_LD_PATH=$B/lib${FTK_BUNDLE_CUDA_PATH:+:$FTK_BUNDLE_CUDA_PATH}
export FTK_BUNDLE_LD_PATH
# Open MPI and PMIx relocated into mpi/ (their installation paths are those of the build machine)
export OPAL_PREFIX="$B/mpi" OPAL_EXEC_PREFIX="$B/mpi" OPAL_BINDIR="$B/mpi/bin" OPAL_LIBDIR="$B/lib" \
    OPAL_PKGLIBDIR="$B/mpi/lib/openmpi3" OPAL_DATAROOTDIR="$B/mpi/share" OPAL_DATADIR="$B/mpi/share" \
    OPAL_PKGDATADIR="$B/mpi/share/openmpi" OPAL_SYSCONFDIR="$B/mpi/etc" OPAL_LIBEXECDIR="$B/mpi/bin"
export OMPI_MCA_mca_base_component_path="$B/mpi/lib/openmpi3"
export PMIX_PREFIX="$B/mpi" PMIX_EXEC_PREFIX="$B/mpi" PMIX_LIBDIR="$B/lib" PMIX_PKGLIBDIR="$B/mpi/lib/pmix" \
    PMIX_MCA_mca_base_component_path="$B/mpi/lib/pmix" PMIX_DATADIR="$B/mpi/share" PMIX_PKGDATADIR="$B/mpi/share/pmix"
# one machine: shared memory between ranks, nothing else (no network plugins are bundled)
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export HDF5_PLUGIN_PATH="$B/plugin"
case ":$PATH:" in *":$B/mpi/bin:"*) ;; *) PATH=$B/mpi/bin:$PATH ;; esac
export PATH
EOF

# The scripts the steps run, where the repository has them.
cp tests/gpu/bundle/run.sh "$stage/run.sh"
cp tests/gpu/train_vs_cpu.sh tests/gpu/nccl_vs_mpi.sh tests/gpu/attn_e2e.sh tests/gpu/demo_vs_cpu.sh \
    "$stage/tests/gpu/"
cp tests/cli/lib.sh "$stage/tests/cli/"
cp tests/bench/gpu_bench.py tests/bench/reuse.py "$stage/tests/bench/"
cp examples/demo/tokenizer.model examples/demo/alpaca-demo.json "$stage/examples/demo/"
chmod 755 "$stage/run.sh"
# The data: the tokenizer and the Alpaca files (a few MB), if this machine has them.
if [ -f "$DATA/llama2-tokenizer/tokenizer.model" ] && ls "$DATA"/alpaca/*.json >/dev/null 2>&1; then
    cp "$DATA/llama2-tokenizer/tokenizer.model" "$stage/data/llama2-tokenizer/"
    cp "$DATA"/alpaca/*.json "$stage/data/alpaca/"
    [ -f "$DATA/alpaca/STANFORD_ALPACA_DATA_LICENSE" ] && cp "$DATA/alpaca/STANFORD_ALPACA_DATA_LICENSE" "$stage/data/alpaca/"
else
    echo "gpu-bundle: note: $DATA has no Llama 2 tokenizer or Alpaca files: the benchmarks will say skipped" >&2
    rmdir "$stage/data/alpaca" "$stage/data/llama2-tokenizer"
fi
{
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), $(ldd --version | head -n 1)"
    echo "nvcc: $({ command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version; } 2>/dev/null | grep -m1 release)"
    echo "data: $(ls "$stage/data/alpaca" 2>/dev/null | tr '\n' ' ')$([ -d "$stage/data/alpaca" ] || echo "none ($DATA has no Llama 2 tokenizer or Alpaca files)")"
} >"$stage/BUILD_INFO"
cp "$stage/run.sh" "$stage/BUILD_INFO" "$tmp/"
unpacked=$(du -sk "$stage" | cut -f1)
nlib=$(ls "$stage/lib" | wc -l)
tar -C "$stage" -cf - . | gzip -"${GPU_BUNDLE_GZIP:-6}" >"$tmp/payload.tar.gz"
rm -rf "$stage"
kib=$(du -sk "$tmp" | cut -f1)
[ "$kib" -le $((MAX_MIB * 1024)) ] || die "$kib KiB, over $MAX_MIB MiB"
rm -rf "$OUT"
mv "$tmp" "$OUT"
trap - EXIT
echo "gpu-bundle: $OUT: $((kib / 1024)).$(((kib % 1024) * 10 / 1024)) MiB ($((unpacked / 1024)) MiB unpacked: the programs, $nlib libraries, Open MPI's run time, the scripts, the data)"
