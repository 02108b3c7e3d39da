/* tests/gpu/emu/include_c: the emulated CUDA runtime's C face, for C sources built over the
 * host emulation (engine/comm_nccl.c; NCCL's own nccl.h, read by emu_nccl.c). The runtime
 * itself is emu_runtime.h, C++, in the emulated backend's object (tests/gpu/emu/cuda_emu.cc
 * defines these emu_c_ functions over it), so a C caller and the CUDA backend share one
 * runtime: the same current device, the same sticky error. Only what those sources call. */
#ifndef EMU_C_CUDA_RUNTIME_API_H
#define EMU_C_CUDA_RUNTIME_API_H
#include <stddef.h>

#include "../emu_cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif
/* the CUDA names, for the C sources; the definitions' file sees the emu_c_ names alone */
#ifndef EMU_C_DEFINING
#define cudaGetLastError emu_c_cudaGetLastError
#define cudaGetErrorString emu_c_cudaGetErrorString
#define cudaGetDevice emu_c_cudaGetDevice
#define cudaSetDevice emu_c_cudaSetDevice
#define cudaStreamCreateWithFlags emu_c_cudaStreamCreateWithFlags
#define cudaStreamDestroy emu_c_cudaStreamDestroy
#define cudaEventCreateWithFlags emu_c_cudaEventCreateWithFlags
#define cudaEventDestroy emu_c_cudaEventDestroy
#define cudaEventRecord emu_c_cudaEventRecord
#define cudaEventQuery emu_c_cudaEventQuery
#define cudaStreamWaitEvent emu_c_cudaStreamWaitEvent
#endif
cudaError_t emu_c_cudaGetLastError(void);
const char *emu_c_cudaGetErrorString(cudaError_t e);
cudaError_t emu_c_cudaGetDevice(int *d);
cudaError_t emu_c_cudaSetDevice(int d);
cudaError_t emu_c_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t emu_c_cudaStreamDestroy(cudaStream_t s);
cudaError_t emu_c_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t emu_c_cudaEventDestroy(cudaEvent_t e);
cudaError_t emu_c_cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t emu_c_cudaEventQuery(cudaEvent_t e);
cudaError_t emu_c_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
#ifdef __cplusplus
}
#endif
#endif
