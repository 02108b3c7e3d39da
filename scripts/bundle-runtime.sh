#!/bin/sh
# bundle-runtime.sh OUT.tar.gz [BINARY...]: pack the shared libraries that ftk's binaries
# (bin/*, lib/libftk-cuda.so, build/tests/*, the HDF5 plugin) and Open MPI need, with Open
# MPI's plugins, help files and launcher, as a tar of absolute paths. For a machine that has
# the CUDA driver and toolkit but not the distribution's packages (a lent GPU node, a
# container image):
#   tar -C / --skip-old-files -xzf OUT.tar.gz && ldconfig
# --skip-old-files keeps every library the target already has (its C library, libstdc++,
# CUDA's), so only what is missing is added. The C library and CUDA are never packed: the
# target's own must be used (build on a system whose glibc is not newer than the target's).
set -eu
out=$1
shift
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- bin/* lib/*.so build/tests/* build/plugin/*.so
ompi=/usr/lib/x86_64-linux-gnu/openmpi
list=$(mktemp)
trap 'rm -f "$list"' EXIT
objs="$*"
[ -d "$ompi" ] && objs="$objs $(find "$ompi" -name '*.so*' -type f) /usr/bin/orted /usr/bin/orterun"
tools=""  # HDF5's command-line tools, which the tests use to look inside files
for b in h5dump h5ls; do command -v $b >/dev/null && tools="$tools $(command -v $b)"; done
objs="$objs $tools"
for f in $objs; do
    [ -f "$f" ] && [ -x "$f" -o "${f%.so*}" != "$f" ] || continue
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas[^/]*|libnccl|libnvidia[^/]*)\.so' >"$list" || true
# each library under its soname, dereferenced, in /usr/lib (merged /usr on both sides)
stage=$(mktemp -d)
trap 'rm -rf "$list" "$stage"' EXIT
mkdir -p "$stage/usr/lib/x86_64-linux-gnu" "$stage/usr/bin"
while read -r l; do cp -L "$l" "$stage/usr/lib/x86_64-linux-gnu/$(basename "$l")"; done <"$list"
for b in $tools; do cp -L "$b" "$stage/usr/bin/"; done
if [ -d "$ompi" ]; then
    mkdir -p "$stage$ompi" "$stage/usr/share" "$stage/etc"
    cp -a "$ompi/." "$stage$ompi/"
    [ -d /usr/share/openmpi ] && cp -a /usr/share/openmpi "$stage/usr/share/"
    [ -d /etc/openmpi ] && cp -a /etc/openmpi "$stage/etc/"
    for b in orted orterun; do cp -L "/usr/bin/$b" "$stage/usr/bin/$b"; done
    ln -s orterun "$stage/usr/bin/mpirun"
    ln -s orterun "$stage/usr/bin/mpiexec"
fi
tar -C "$stage" -czf "$out" .
echo "bundle-runtime: $(wc -l <"$list") libraries$([ -d "$ompi" ] && echo ' + Open MPI') -> $out ($(du -h "$out" | cut -f1))"
