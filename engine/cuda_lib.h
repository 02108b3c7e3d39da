/* cuda_lib.h — the CUDA library's table of entry points: the one name a program looks up to
 * reach the CUDA backend (kernels/cuda) and NCCL's layer (engine/comm_nccl.c).
 *
 * cuda_lib.c defines cuda_lib_entry(), the table, and goes with the objects it names: into
 * libftk-cuda.so, which the tools open (engine/cuda_load.h), and into the programs linked
 * with the backend's objects (test_comm, the host emulation's programs), which export that
 * one name (the Makefile's CUDA_LIB_EXPORT) so that the loader finds it in the program
 * itself. It is not in libftk.a: a program without the backend has no such name.
 *
 * The table is static, never freed; each entry is what the name it points to says. */
#ifndef FTK_CUDA_LIB_H
#define FTK_CUDA_LIB_H

#include "../kernels/backend.h"
#include "comm_dev.h"

typedef struct {
    /* backend_cuda_new (backend.h): the backend on that device, or NULL with ftk_err_msg(). */
    backend_t *(*backend_new)(int device);
    /* backend_cuda_devices (backend.h): the CUDA devices this process sees. */
    int (*devices)(void);
    /* comm_nccl_ops (comm_dev.h), or NULL where the library was built without nccl.h. */
    const comm_dev_ops_t *(*nccl_ops)(void);
} cuda_lib_t;

/* The name the loader looks up (dlsym), in the program first, then in the library. */
#define CUDA_LIB_ENTRY "cuda_lib_entry"

const cuda_lib_t *cuda_lib_entry(void);

#endif
