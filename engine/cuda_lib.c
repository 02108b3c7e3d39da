/* cuda_lib.c — the CUDA library's table of entry points (cuda_lib.h). Compiled with
 * CUDA_LIB_NCCL=1 where engine/comm_nccl.c is linked beside it (the Makefile: where nccl.h
 * is found), 0 where it is not. */
#include "cuda_lib.h"

#ifndef CUDA_LIB_NCCL
#define CUDA_LIB_NCCL 0
#endif

static const cuda_lib_t cuda_lib = {
    .backend_new = backend_cuda_new,
    .devices = backend_cuda_devices,
#if CUDA_LIB_NCCL
    .nccl_ops = comm_nccl_ops,
#endif
};

const cuda_lib_t *cuda_lib_entry(void) { return &cuda_lib; }
