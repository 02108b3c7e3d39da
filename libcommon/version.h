/* version.h — the ftk version, recorded in every file ftk writes. */
#ifndef FTK_VERSION_H
#define FTK_VERSION_H
#define FTK_VERSION "0.2.0"

#include <stdio.h>

/* What --version prints: the tool, release and commit it was built from (where the build
 * was a git checkout), then the backends and libraries this build
 * holds (CUDA, MPI, NCCL built in or not; the versions of HDF5, zstd, xxHash, OpenBLAS as
 * loaded), so a user can tell what a binary can do before asking it to. */
void ftk_version_print(FILE *out, const char *tool);
#endif
