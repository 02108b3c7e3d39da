/* emu_runtime.h — the part of the CUDA runtime and of cuBLASLt that the CUDA backend
 * (kernels/cuda) uses, on the host, over emu.h's kernels (tests/gpu/emu/include/ makes
 * <cuda_runtime.h>, <cublasLt.h>, <cuda_bf16.h> and <mma.h> resolve to this). FTK_EMU_GPUS devices (default 1),
 * the current one per host thread; device memory is host memory; every launch, copy and
 * product runs to its end when issued, so streams and events only order what is already in
 * order (events keep the host time they were recorded at, for cudaEventElapsedTime). C
 * sources reach the same runtime through include_c/cuda_runtime_api.h (cuda_emu.cc).
 *
 * Checked as the GPU would: launch configurations (emu.h), dynamic shared memory over 48 KiB
 * only after cudaFuncSetAttribute allowed that much (to some kernel: a launch here does not
 * know its kernel's address, so the largest allowance counts), a product's operands aligned as the
 * preference its algorithm was chosen with promised (cuBLASLt may rely on it). A kernel's
 * failure (emu::fault) is printed once and then sticky, as an error that ends a CUDA
 * context is: every later call answers cudaErrorLaunchFailure.
 *
 * cuBLASLt's products: D = alpha·op(A)·op(B) + beta·C, column-major, with the compute
 * type's rounding of fp32 operands (32F_FAST_16BF: to bf16, nearest even; 32F_FAST_TF32:
 * to TF32's 10 fraction bits), products summed in fp32 by OpenBLAS (in another order than
 * the GPU's: last bits), the result rounded once to D's type. */
#pragma once
#include <cblas.h>
#include <time.h>

#include <mutex>
#include <unordered_map>

#include "../../../kernels/cuda_mem.h"
#include "emu.h"

/* ---- types ------------------------------------------------------------------------------ */

#include "emu_cuda_types.h"

namespace emu {
static const size_t DEVICE_BYTES = (size_t)16 << 30; /* each emulated device's memory */
}

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin;
    int major, minor, multiProcessorCount, warpSize, maxThreadsPerBlock;
};

namespace emu {
static thread_local cudaError_t last = cudaSuccess; /* per host thread, as CUDA's */
static thread_local int current; /* the thread's device (cudaSetDevice) */
static int reported;    /* the sticky fault has been printed */
static size_t smem_allowed = 48 << 10; /* the largest cudaFuncSetAttribute gave any kernel */

static double now()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* cudaErrorLaunchFailure once a kernel failed, else e */
static cudaError_t sticky(cudaError_t e) { return fault[0] ? cudaErrorLaunchFailure : e; }
static cudaError_t set(cudaError_t e)
{
    if (e != cudaSuccess && last == cudaSuccess)
        last = e;
    return e;
}

/* The launch the rewritten `kernel<<<grid, block, smem, stream>>>(args)` makes
 * (tests/gpu/emu/launches.pl): the body calls the kernel as one thread. */
struct config {
    dim3 g, b;
    size_t smem;
    config(dim3 g_, dim3 b_, size_t smem_ = 0, cudaStream_t = NULL) : g(g_), b(b_), smem(smem_) {}
};
static void launch(const char *name, const config &c, const std::function<void()> &body)
{
    if (fault[0]) {
        set(cudaErrorLaunchFailure);
        return;
    }
    if (c.smem > smem_allowed) {
        fprintf(stderr, "emulator: %s: %zu bytes of dynamic shared memory, %zu allowed (cudaFuncSetAttribute)\n", name,
                c.smem, smem_allowed);
        set(cudaErrorInvalidValue);
        return;
    }
    int rc = run_grid(name, c.g, c.b, c.smem, body);
    if (rc == -2) {
        fprintf(stderr, "emulator: %s\n", refused);
        set(cudaErrorInvalidConfiguration);
    } else if (rc < 0 || fault[0]) {
        if (!reported++)
            fprintf(stderr, "emulator: %s\n", fault);
        set(cudaErrorLaunchFailure);
    }
}
} /* namespace emu */

/* ---- the runtime ------------------------------------------------------------------------- */

static inline cudaError_t cudaGetLastError()
{
    cudaError_t e = emu::last;
    emu::last = cudaSuccess;
    return emu::sticky(e);
}
static inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated kernel failed)";
    }
    return "unknown error";
}
/* FTK_EMU_GPUS=N (1 to 8, default 1) devices, all the same host memory: what a node of N GPUs
 * looks like to the device selection (comm_node_gpu) and to NCCL's duplicate-GPU check
 * (emu_nccl.c). */
static inline int emu_devices()
{
    const char *v = getenv("FTK_EMU_GPUS");
    int n = v && *v ? atoi(v) : 1;
    return n < 1 ? 1 : n > 8 ? 8 : n;
}
static inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = emu_devices();
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= emu_devices())
        return emu::set(cudaErrorInvalidDevice);
    emu::current = d;
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaGetDevice(int *d)
{
    *d = emu::current;
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d < 0 || d >= emu_devices())
        return emu::set(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation, tests/gpu/emu");
    p->totalGlobalMem = emu::DEVICE_BYTES;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = emu::SMEM;
    p->major = 9;
    p->multiProcessorCount = 1;
    p->warpSize = 32;
    p->maxThreadsPerBlock = emu::MAX_THREADS;
    return cudaSuccess;
}
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *, cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || (size_t)v > emu::SMEM)
        return emu::set(cudaErrorInvalidValue);
    if ((size_t)v > emu::smem_allowed)
        emu::smem_allowed = (size_t)v;
    return emu::sticky(cudaSuccess);
}

/* FTK_EMU_STATS=FILE: at exit, the host's waits for the device are appended to FILE as
 * "stream_syncs N event_syncs M pinned_allocs A pinned_frees F": a stream synchronize drains
 * the queue (the host waits for everything issued), an event's waits only for what came
 * before it; allocating or freeing page-locked host memory (cudaMallocHost, cudaHostAlloc,
 * cudaFreeHost) waits for the whole device on a GPU. What a test counts: drains that grow
 * with the micro-batches of a step would be host waits inside the step; pinned memory
 * allocated or freed in every step, a drain each time. */
namespace emu {
static long n_stream_syncs, n_event_syncs, n_pinned_allocs, n_pinned_frees;
static void stats_write()
{
    const char *f = getenv("FTK_EMU_STATS");
    FILE *o = f && *f ? fopen(f, "a") : NULL;
    if (o) {
        fprintf(o, "stream_syncs %ld event_syncs %ld pinned_allocs %ld pinned_frees %ld\n", n_stream_syncs,
                n_event_syncs, n_pinned_allocs, n_pinned_frees);
        fclose(o);
    }
}
static void stats_count(long *n)
{
    static bool registered;
    if (!registered && getenv("FTK_EMU_STATS"))
        atexit(stats_write);
    registered = true;
    ++*n;
}
} /* namespace emu */

/* Device memory: host memory, 256-byte aligned as cudaMalloc's, counted per device as the
 * driver takes it (kernels/cuda_mem.h: whole 2 MiB pages for an allocation over 1 MiB,
 * 512-byte pieces of shared pages below; the same model the memory plan counts with, so a
 * difference between the plan and this count is an allocation the plan did not see). The
 * device has 16 GiB (cudaGetDeviceProperties) and no context: cudaMemGetInfo's free
 * memory is the 16 GiB less the live allocations' pages. FTK_EMU_STATS also gets a line
 * "device_peak_bytes N asked_peak_bytes M": the most any device held in pages, and the most
 * bytes its live allocations asked for (a byte the plan did not count shows there even
 * where it fits a page already held). Page-locked host memory is not the device's and is
 * not counted. */
namespace emu {
struct dev_alloc {
    int64_t bytes;
    int dev;
};
static std::mutex dev_mu;
static std::unordered_map<void *, dev_alloc> dev_allocs;
static bk_cuda_mem_t dev_mem[8];
static int64_t dev_asked[8];
static int64_t dev_peak, asked_peak;
static void dev_stats_write()
{
    const char *f = getenv("FTK_EMU_STATS");
    FILE *o = f && *f ? fopen(f, "a") : NULL;
    if (o) {
        fprintf(o, "device_peak_bytes %lld asked_peak_bytes %lld\n", (long long)dev_peak, (long long)asked_peak);
        fclose(o);
    }
}
static int64_t dev_in_use(int d) { return bk_cuda_mem_total(&dev_mem[d]); }
} /* namespace emu */

template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
    *p = (T *)aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!*p)
        return emu::set(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(emu::dev_mu);
    static bool registered;
    if (!registered && getenv("FTK_EMU_STATS"))
        atexit(emu::dev_stats_write);
    registered = true;
    int d = emu::current;
    emu::dev_allocs[(void *)*p] = emu::dev_alloc{(int64_t)bytes, d};
    bk_cuda_mem_add(&emu::dev_mem[d], (int64_t)bytes, 1);
    emu::dev_asked[d] += (int64_t)bytes;
    if (emu::dev_in_use(d) > emu::dev_peak)
        emu::dev_peak = emu::dev_in_use(d);
    if (emu::dev_asked[d] > emu::asked_peak)
        emu::asked_peak = emu::dev_asked[d];
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaFree(void *p)
{
    if (p) {
        std::lock_guard<std::mutex> g(emu::dev_mu);
        auto it = emu::dev_allocs.find(p);
        if (it != emu::dev_allocs.end()) {
            bk_cuda_mem_add(&emu::dev_mem[it->second.dev], it->second.bytes, -1);
            emu::dev_asked[it->second.dev] -= it->second.bytes;
            emu::dev_allocs.erase(it);
        }
    }
    free(p);
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    std::lock_guard<std::mutex> g(emu::dev_mu);
    int64_t used = emu::dev_in_use(emu::current);
    *total = emu::DEVICE_BYTES;
    *free_bytes = used < (int64_t)emu::DEVICE_BYTES ? emu::DEVICE_BYTES - (size_t)used : 0;
    return emu::sticky(cudaSuccess);
}
template <typename T> static inline cudaError_t cudaMallocHost(T **p, size_t bytes)
{
    emu::stats_count(&emu::n_pinned_allocs);
    *p = (T *)aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *p ? emu::sticky(cudaSuccess) : emu::set(cudaErrorMemoryAllocation);
}
template <typename T> static inline cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned)
{
    return cudaMallocHost(p, bytes);
}
static inline cudaError_t cudaFreeHost(void *p)
{
    if (p)
        emu::stats_count(&emu::n_pinned_frees);
    free(p);
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind)
{
    if (emu::fault[0])
        return emu::set(cudaErrorLaunchFailure);
    memmove(d, s, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t = NULL)
{
    return cudaMemcpy(d, s, n, k);
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t = NULL)
{
    if (emu::fault[0])
        return emu::set(cudaErrorLaunchFailure);
    memset(p, v, n);
    return cudaSuccess;
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    *s = (cudaStream_t)calloc(1, sizeof **s);
    if (!*s)
        return emu::set(cudaErrorMemoryAllocation);
    (*s)->flags = (int)flags;
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    free(s);
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    emu::stats_count(&emu::n_stream_syncs);
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaStreamQuery(cudaStream_t) { return emu::sticky(cudaSuccess); }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    *e = (cudaEvent_t)calloc(1, sizeof **e);
    if (!*e)
        return emu::set(cudaErrorMemoryAllocation);
    (*e)->flags = (int)flags;
    (*e)->t = -1;
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = NULL)
{
    e->t = emu::now();
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return emu::sticky(cudaSuccess); }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t)
{
    emu::stats_count(&emu::n_event_syncs);
    return emu::sticky(cudaSuccess);
}
static inline cudaError_t cudaEventQuery(cudaEvent_t) { return emu::sticky(cudaSuccess); }
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if ((a->flags | b->flags) & cudaEventDisableTiming || a->t < 0 || b->t < 0)
        return emu::set(cudaErrorInvalidValue);
    *ms = (float)(1e3 * (b->t - a->t));
    return emu::sticky(cudaSuccess);
}

/* ---- cuBLASLt ------------------------------------------------------------------------------ */

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasLtMatmulDescAttributes_t { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 };
enum cublasLtMatmulPreferenceAttributes_t {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};
struct emu_lt {
    int n_products;
};
struct emu_lt_desc {
    cublasComputeType_t compute;
    cublasOperation_t ta, tb;
};
struct emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct emu_lt_pref {
    uint64_t ws;
    uint32_t align[4]; /* A, B, C, D */
};
typedef emu_lt *cublasLtHandle_t;
typedef emu_lt_desc *cublasLtMatmulDesc_t;
typedef emu_lt_layout *cublasLtMatrixLayout_t;
typedef emu_lt_pref *cublasLtMatmulPreference_t;
/* what the algorithm was chosen for: the pointers' alignments and the workspace */
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

template <typename T> static inline cublasStatus_t emu_lt_new(T **p)
{
    *p = (T *)calloc(1, sizeof **p);
    return *p ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { return emu_lt_new(h); }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return free(h), CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t scale)
{
    if (scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    cublasStatus_t s = emu_lt_new(d);
    if (s == CUBLAS_STATUS_SUCCESS)
        (*d)->compute = ct;
    return s;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { return free(d), CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                            const void *v, size_t n)
{
    if (n != sizeof(cublasOperation_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a == CUBLASLT_MATMUL_DESC_TRANSA)
        memcpy(&d->ta, v, n);
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB)
        memcpy(&d->tb, v, n);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows,
                                                        uint64_t cols, int64_t ld)
{
    if (ld < (int64_t)rows || ld < 1)
        return CUBLAS_STATUS_INVALID_VALUE; /* column-major: a column's rows fit in ld */
    cublasStatus_t s = emu_lt_new(l);
    if (s == CUBLAS_STATUS_SUCCESS)
        (*l)->type = t, (*l)->rows = rows, (*l)->cols = cols, (*l)->ld = ld;
    return s;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { return free(l), CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    cublasStatus_t s = emu_lt_new(p);
    if (s == CUBLAS_STATUS_SUCCESS)
        for (int i = 0; i < 4; i++)
            (*p)->align[i] = 256; /* cuBLASLt's default: every operand 256-byte aligned */
    return s;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { return free(p), CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                  cublasLtMatmulPreferenceAttributes_t a, const void *v,
                                                                  size_t n)
{
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && n == sizeof(uint64_t))
        memcpy(&p->ws, v, n);
    else if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES &&
             n == sizeof(uint32_t))
        memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], v, n);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
/* op(X) is rows × cols of a layout (its transpose with T) */
static inline void emu_lt_shape(const emu_lt_layout *l, cublasOperation_t t, uint64_t *r, uint64_t *c)
{
    *r = t == CUBLAS_OP_N ? l->rows : l->cols;
    *c = t == CUBLAS_OP_N ? l->cols : l->rows;
}
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                                            cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                            cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                                            cublasLtMatmulPreference_t p, int n,
                                                            cublasLtMatmulHeuristicResult_t *r, int *found)
{
    uint64_t am, ak, bk, bn;
    emu_lt_shape(a, d->ta, &am, &ak);
    emu_lt_shape(b, d->tb, &bk, &bn);
    *found = 0;
    if (n < 1 || ak != bk || c->rows != am || c->cols != bn || dl->rows != am || dl->cols != bn ||
        a->type != b->type || (d->compute != CUBLAS_COMPUTE_32F && a->type != CUDA_R_32F))
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 4; i++)
        r->algo.data[i] = p->align[i];
    r->algo.data[4] = p->ws;
    r->state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

namespace emu {
static inline float lt_ld(const void *p, cudaDataType_t t, int64_t i)
{
    return t == CUDA_R_16BF ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
/* an fp32 operand as the compute type takes it */
static inline float lt_round(float x, cublasComputeType_t ct)
{
    int drop = ct == CUBLAS_COMPUTE_32F_FAST_16BF ? 16 : ct == CUBLAS_COMPUTE_32F_FAST_TF32 ? 13 : 0;
    uint32_t u = __float_as_uint(x);
    if (!drop || (u & 0x7fffffffu) >= 0x7f800000u)
        return x;
    uint32_t half = 1u << (drop - 1), keep = ~((1u << drop) - 1);
    u += half - 1 + ((u >> drop) & 1);
    return __uint_as_float(u & keep);
}
} /* namespace emu */

static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                                            const void *A, cublasLtMatrixLayout_t la, const void *B,
                                            cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                                            cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                                            const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t)
{
    if (emu::fault[0])
        return CUBLAS_STATUS_INVALID_VALUE;
    const void *ptr[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptr[i] % algo->data[i]) {
            fprintf(stderr, "emulator: cublasLtMatmul: operand %c at %p, the algorithm was chosen for %llu-byte "
                    "alignment\n", "ABCD"[i], ptr[i], (unsigned long long)algo->data[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    if (algo->data[4] > ws_bytes || (ws_bytes && !ws))
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t M, K, K2, N;
    emu_lt_shape(la, d->ta, &M, &K);
    emu_lt_shape(lb, d->tb, &K2, &N);
    if (K != K2 || lc->rows != M || lc->cols != N || ld->rows != M || ld->cols != N)
        return CUBLAS_STATUS_INVALID_VALUE;
    float a = *(const float *)alpha, b = *(const float *)beta;
    cublasComputeType_t ct = la->type == CUDA_R_32F ? d->compute : CUBLAS_COMPUTE_32F;
    /* op(A)(i, k) = A[i + k·lda] (N) or A[k + i·lda] (T); column-major D(i, j) = D[i + j·ldd] */
    int64_t sa_i = d->ta == CUBLAS_OP_N ? 1 : la->ld, sa_k = d->ta == CUBLAS_OP_N ? la->ld : 1;
    int64_t sb_k = d->tb == CUBLAS_OP_N ? 1 : lb->ld, sb_j = d->tb == CUBLAS_OP_N ? lb->ld : 1;
    /* op(A) [M, K] and op(B)ᵀ [N, K] row-major, as the compute type takes them; their
     * product by OpenBLAS (its order of the k sum is not the GPU's either) */
    float *ra = (float *)malloc(sizeof(float) * (M * K + 1)), *rb = (float *)malloc(sizeof(float) * (N * K + 1)),
          *p = (float *)malloc(sizeof(float) * (M * N + 1));
    if (!ra || !rb || !p) {
        free(ra), free(rb), free(p);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    for (uint64_t i = 0; i < M; i++)
        for (uint64_t k = 0; k < K; k++)
            ra[i * K + k] = emu::lt_round(emu::lt_ld(A, la->type, (int64_t)i * sa_i + (int64_t)k * sa_k), ct);
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t k = 0; k < K; k++)
            rb[j * K + k] = emu::lt_round(emu::lt_ld(B, lb->type, (int64_t)k * sb_k + (int64_t)j * sb_j), ct);
    if (K)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, ra, (int)K, rb, (int)K, 0.0f,
                    p, (int)N);
    else
        memset(p, 0, sizeof(float) * M * N);
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++) {
            float v = a * p[i * N + j];
            if (b != 0.0f)
                v += b * emu::lt_ld(C, lc->type, (int64_t)i + (int64_t)j * lc->ld);
            int64_t o = (int64_t)i + (int64_t)j * ld->ld;
            if (ld->type == CUDA_R_16BF)
                ((uint16_t *)D)[o] = f32_to_bf16(v);
            else
                ((float *)D)[o] = v;
        }
    free(ra), free(rb), free(p);
    h->n_products++;
    return CUBLAS_STATUS_SUCCESS;
}
