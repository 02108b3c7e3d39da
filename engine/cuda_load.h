/* cuda_load.h — the loader of the CUDA library (engine/cuda_lib.h's table): how a program
 * reaches the CUDA backend and NCCL, whichever way it was built. Every caller that opens a
 * GPU or asks for NCCL goes through it (the tools, engine/comm.c, test_comm); only the GPU
 * op tests, always linked with the backend, call backend_cuda_new themselves.
 *
 * Where the table comes from, looked at in this order on the first call and kept:
 *   1. the program itself: a program linked with the backend's objects (test_comm, the host
 *      emulation's programs) carries cuda_lib.c and exports its one name, which dlsym finds
 *      among the program's symbols;
 *   2. libftk-cuda.so, in a build that made it (the Makefile's CUDA_LOAD_LIB=1): the tools
 *      do not link CUDA, so that they start, plan and train on the CPU where the CUDA
 *      libraries are not installed, and only --device cuda says that they are missing
 *      (docs/gpu.md, "Without the CUDA libraries"). The library is looked for beside the
 *      executable's folder ($ORIGIN/../lib: the build's lib/, a bundle's lib/;
 *      $ORIGIN/../lib/ftk: an installation, wherever it was moved), then in the
 *      installation's FTK_LIBDIR (PREFIX/lib/ftk, as built), and opened RTLD_LOCAL. The tools
 *      export their symbols (-rdynamic), so the library's calls into libftk (ftk_err_set,
 *      the instance's helpers) reach the tool's own copies: one error slot, one log;
 *   3. none: a build without nvcc, and the sanitizer build; every answer then says so.
 * Each name is defined once: the backend's in kernels/cuda/cuda.cu, NCCL's in
 * engine/comm_nccl.c, the table in engine/cuda_lib.c, these in cuda_load.c; no definition
 * stands in for another.
 *
 * Threads: the first call loads; make it from the main thread, before any team of threads
 * (the tools do). Errors: NULL with ftk_err_msg() set; nothing here prints. */
#ifndef FTK_CUDA_LOAD_H
#define FTK_CUDA_LOAD_H

#include "cuda_lib.h"

/* The table, or NULL with ftk_err_msg() saying why: "this build has no CUDA backend (…)",
 * "cannot load the CUDA backend: …" (a CUDA library libftk-cuda.so needs is missing), or
 * "the CUDA backend libftk-cuda.so is not found (looked for …)". */
const cuda_lib_t *cuda_load(void);

/* The CUDA backend on that device (backend_cuda_new), or NULL with ftk_err_msg() set:
 * cuda_load()'s reason, or the backend's. */
backend_t *cuda_load_backend(int device);

/* The CUDA devices this process sees; 0 where there is no table (no library, no GPU, as in
 * a build without CUDA: cuda_load_backend then names what is missing), the error slot left
 * as it was. The form backend_default_device takes. */
int cuda_load_devices(void);

/* NCCL's table (comm_dev.h), or NULL with ftk_err_msg() saying why: cuda_load()'s reason,
 * "this build has no NCCL (…)", or NCCL's own (libnccl.so.2 does not load). */
const comm_dev_ops_t *cuda_load_nccl(void);

#endif
