/* emu_cuda_types.h — the CUDA runtime's types as the host emulation defines them, in C that
 * C++ also reads: emu_runtime.h (the runtime, C++) and include_c/cuda_runtime_api.h (its C
 * face, for engine/comm_nccl.c and the emulated NCCL) share them, so both sides of a call
 * agree on every value and layout. */
#ifndef EMU_CUDA_TYPES_H
#define EMU_CUDA_TYPES_H

typedef enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice,
    cudaMemcpyDefault
} cudaMemcpyKind;
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };
enum { cudaHostAllocDefault = 0 };
struct emu_stream {
    int flags;
};
struct emu_event {
    int flags;
    double t; /* host seconds when recorded; < 0: never */
};
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

#endif
