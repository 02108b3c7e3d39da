#include "version.h"

#include <hdf5.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

/* Set by the Makefile for this file alone: what the build holds. */
#ifndef FTK_BUILD_CUDA
#define FTK_BUILD_CUDA "" /* the CUDA toolkit's version, empty when kernels/cuda was not built */
#endif
#ifndef FTK_BUILD_NCCL
#define FTK_BUILD_NCCL 0
#endif
#ifndef FTK_COMMIT
#define FTK_COMMIT "" /* the commit built, empty outside a git checkout */
#endif
#ifndef FTK_BUILD_MPI
#define FTK_BUILD_MPI "" /* Open MPI's version, empty when ftk-train was built without MPI */
#endif

char *openblas_get_config(void); /* OpenBLAS's own: "OpenBLAS 0.3.21 DYNAMIC_ARCH …" */

void ftk_version_print(FILE *out, const char *tool)
{
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
    const char *blas = openblas_get_config();
    int blas_n = 0; /* "OpenBLAS 0.3.21": its first two words */
    for (int words = 0; blas && blas[blas_n] && words < 2; blas_n++)
        words += blas[blas_n + 1] == ' ' || blas[blas_n + 1] == 0;
    unsigned xx = XXH_versionNumber();
    if (FTK_COMMIT[0])
        fprintf(out, "%s %s (commit %s)\n", tool, FTK_VERSION, FTK_COMMIT);
    else
        fprintf(out, "%s %s\n", tool, FTK_VERSION);
    fprintf(out, "backends:      cpu (OpenMP, %.*s)", blas_n, blas ? blas : "");
    if (FTK_BUILD_CUDA[0])
        fprintf(out, ", cuda (built with CUDA %s; used by ftk-train and ftk-generate --device cuda)\n", FTK_BUILD_CUDA);
    else
        fprintf(out, "; cuda not built in (no nvcc when ftk was built)\n");
    fprintf(out, "communication: %s%s%s, NCCL %s\n", FTK_BUILD_MPI[0] ? "MPI (Open MPI " : "MPI not built in",
            FTK_BUILD_MPI, FTK_BUILD_MPI[0] ? "; ftk-train)" : "",
            FTK_BUILD_NCCL ? "built in (libnccl.so.2 opened at run time)" : "not built in");
    fprintf(out, "libraries:     HDF5 %u.%u.%u, zstd %s, xxHash %u.%u.%u\n", maj, min, rel, ZSTD_versionString(),
            xx / 10000, xx / 100 % 100, xx % 100);
}
