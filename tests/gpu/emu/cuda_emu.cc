/* cuda_emu.cc — the emulated CUDA backend's object (emu.mk: tests/emu/cuda_emu.o): every
 * source of kernels/cuda's backend (the Makefile's CUDA_BACKEND_SRC: the op families and
 * cuda.cu) as launches.pl rewrote it, included ahead of this file by the compiler (-include),
 * over emu_runtime.h; and the runtime's C face (include_c/cuda_runtime_api.h) for the C
 * sources linked with it: engine/comm_nccl.c and, through the executable's exported
 * symbols, the emulated NCCL (emu_nccl.c). One translation unit, so one runtime for all of
 * them, as a process has one CUDA context per device. */
#include <cuda_runtime.h> /* emu_runtime.h (tests/gpu/emu/include) */

#define EMU_C_DEFINING
#include "include_c/cuda_runtime_api.h"

extern "C" {
/* for tests/gpu/gpu_ops.c (a weak reference there): FTK_EMU_STATS's pinned allocations and
 * frees so far */
long emu_c_pinned_calls(void) { return emu::n_pinned_allocs + emu::n_pinned_frees; }
cudaError_t emu_c_cudaGetLastError(void) { return cudaGetLastError(); }
const char *emu_c_cudaGetErrorString(cudaError_t e) { return cudaGetErrorString(e); }
cudaError_t emu_c_cudaGetDevice(int *d) { return cudaGetDevice(d); }
cudaError_t emu_c_cudaSetDevice(int d) { return cudaSetDevice(d); }
cudaError_t emu_c_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) { return cudaStreamCreateWithFlags(s, flags); }
cudaError_t emu_c_cudaStreamDestroy(cudaStream_t s) { return cudaStreamDestroy(s); }
cudaError_t emu_c_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) { return cudaEventCreateWithFlags(e, flags); }
cudaError_t emu_c_cudaEventDestroy(cudaEvent_t e) { return cudaEventDestroy(e); }
cudaError_t emu_c_cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return cudaEventRecord(e, s); }
cudaError_t emu_c_cudaEventQuery(cudaEvent_t e) { return cudaEventQuery(e); }
cudaError_t emu_c_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    return cudaStreamWaitEvent(s, e, flags);
}
}
