/* cuda.cu — the CUDA backend (kernels/backend.h, version 2): every op on the GPU in fp32
 * and bf16 storage, matrix products on the tensor cores through cuBLASLt.
 *
 * Products: fp32 operands in bf16 with fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF;
 * FTK_CUDA_MATMUL=fp32 for exact fp32, for checks, or =tf32 for TF32, for the benchmark),
 * read when an instance is made; bf16 operands with fp32 accumulation (CUBLAS_COMPUTE_32F)
 * into an fp32 or bf16 result.
 *
 * Design, kept the same as the CPU reference where that decides the result:
 *  - Storage: kernels are templates over each buffer's element type, float or uint16_t
 *    (bf16's bits). They widen what they read (exact), compute in fp32 and round each
 *    stored value once to nearest even with the bit arithmetic of libcommon/dtype.h
 *    f32_to_bf16 (the hardware conversion makes a different NaN), so a bf16 result is
 *    the CPU's wherever the fp32 value is.
 *  - Determinism (backend.h): no atomics. Reductions over rows (RMSNorm's dw, the loss,
 *    Σx²) sum fixed partitions and then the partial sums in order; the embedding's
 *    backward gives each thread a column and walks the tokens in order, like the CPU.
 *  - Attention, bf16 with a head dimension that is a multiple of 16 up to 128: on the
 *    tensor cores in 64 × 64 tiles (flash_attn.cuh's WMMA kernels; with FTK_CUDA_ATTN=mma
 *    flash_mma.cuh's, accumulators in registers, not yet run on a GPU; both round
 *    probabilities and dS to bf16 before their products, as FlashAttention does).
 *    Otherwise, and with FTK_CUDA_ATTN=simple: one warp per (query row, head), keys visited in order with an
 *    online softmax in fp32, probabilities never rounded; its backward recomputes them
 *    from the saved log-sum-exp, one warp per query row for dq and one per key row for dk
 *    and dv (a key/value head sums its query heads in order). Neither uses atomics.
 *  - Memory-bound elementwise ops (convert, scale, add, swiglu, glu, the embedding's
 *    gather, rows_scatter, AdamW) take 8 elements a thread with 16-byte accesses where
 *    every operand is 16-byte aligned (ELEMENTWISE), one element otherwise and with
 *    FTK_CUDA_VEC=0; the same arithmetic on both paths. The row reductions (RMSNorm,
 *    Σx²'s blocks) take 8 consecutive elements a thread on the same condition: a sum is
 *    then partitioned otherwise (deterministic, not the one-element path's bits). The
 *    embedding's gradient sums each table row over its own tokens (a block per distinct
 *    id; FTK_CUDA_VEC=0: a thread per column walking all tokens): the same additions in
 *    the same order either way.
 *  - AdamW is written without contractions (__fmul_rn …): its fp32 arithmetic is the
 *    CPU's operation for operation, so nearest and stochastic rounding give the CPU's bits;
 *    so are rope's rotation (then every kernel that rotates has the same bits, whatever
 *    ptxas would contract at each call site) and xent's gradient.
 *  - Instances: all state lives in cuda_t (be->ctx); every entry point makes the
 *    instance's device current, so instances on several devices share a thread.
 *  - Streams: every kernel, product and copy goes to the current stream; upload and
 *    download wait for it (the host buffer is free, or filled, when they return).
 *  - Ops have no error path (backend.h): the first CUDA error is kept, later ops are
 *    skipped, and sync() reports it.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <type_traits>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "../../libcommon/log.h"
#include "../backend.h"
}
#include "../sround.h"

/* ---- state and errors ------------------------------------------------------------------ */

struct bk_stream {
    cudaStream_t s;
    bk_stream *next;
};

struct bk_event {
    cudaEvent_t e;
    bk_event *next;
};

/* A product's descriptors and the heuristic's algorithm, made once per shape and kept
 * (the model asks for a few dozen shapes). */
typedef struct {
    int valid, ta, tb, beta0;
    dtype_t dab, dc;
    uint32_t align; /* the pointers' common alignment: the algorithm may rely on it */
    int64_t M, N, K, lda;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan_t;

enum { MAX_PLANS = 256 };
enum { ATTN_FLASH, ATTN_MMA, ATTN_SIMPLE }; /* cuda_t.attn */

/* A pinned staging slot of cu_upload: its copy to the device is queued on the stream, and
 * ev, recorded after it, says when the slot may be written again. */
typedef struct {
    void *p;
    size_t cap;
    cudaEvent_t ev; /* made at the slot's first use */
} up_slot_t;
/* Uploads of up to UP_STAGE bytes go through UP_SLOTS slots in turn (a micro-batch uploads
 * five arrays: the host may run a micro-batch ahead); larger ones wait for the stream. */
enum { UP_SLOTS = 8, UP_STAGE = 1 << 20 };

typedef struct {
    backend_t *be;
    int device;
    cublasComputeType_t f32_compute; /* for fp32 operands (FTK_CUDA_MATMUL) */
    int attn;                        /* FTK_CUDA_ATTN: ATTN_FLASH (default), ATTN_MMA, ATTN_SIMPLE */
    int vec;                         /* elementwise kernels may take 8 elements a thread (FTK_CUDA_VEC) */
    char err[512];                   /* first error, "" when none */
    cudaStream_t def;                /* the instance's default stream */
    cudaStream_t cur;                /* the current stream: def or one of streams */
    bk_stream *streams;              /* made by stream_new and not yet freed */
    bk_event *events;
    cublasLtHandle_t lt;
    void *ws; /* cuBLASLt workspace, BK_CUDA_WORKSPACE_BYTES */
    plan_t plans[MAX_PLANS];
    int n_plans, evict;
    /* Scratch, one per instance, in use by one stream at a time (scratch_claim): the
     * workspace, the segment list, and tmp (partial sums, attention's D, a product's fp32
     * rows, an overlapping copy's staging, embed_bwd's token order). seg and tmp are
     * allocated through bk_alloc when an op first needs them and grown on demand, so they
     * are not in the memory plan's creation-time figure. */
    cudaStream_t scr_owner; /* the stream that used scratch last; NULL: scr_ev marks it */
    cudaEvent_t scr_ev;
    int64_t *seg; /* the segment list of the last attention, on the device */
    size_t seg_cap;
    int64_t *seg_host; /* pinned copy of it, the source of its upload */
    size_t seg_host_cap;
    int64_t seg_n;      /* its n_seg; -1 when none */
    cudaEvent_t seg_ev; /* after the upload from seg_host */
    void *tmp;
    size_t tmp_cap;
    /* adamw_multi's segment table: built in pinned memory, copied into tmp on the stream;
     * am_ev follows that copy, so the host rewrites am_host only after it has run. */
    void *am_host;
    size_t am_host_cap;
    cudaEvent_t am_ev;
    up_slot_t up[UP_SLOTS]; /* cu_upload's staging, used in turn from up_next */
    int up_next;
} cuda_t;

static int failed(cuda_t *c) { return c->err[0] != 0; }

static void note_err(cuda_t *c, const char *what, const char *detail)
{
    if (!failed(c))
        snprintf(c->err, sizeof c->err, "CUDA device %d: %s: %s", c->device, what, detail);
}

static int ck(cuda_t *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    note_err(c, what, cudaGetErrorString(e));
    return -1;
}

static int ck_lt(cuda_t *c, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    char b[64];
    snprintf(b, sizeof b, "cuBLAS status %d", (int)s);
    note_err(c, what, b);
    return -1;
}

/* cudaErrorNotReady is an answer, not a failure: a query (host_wait's, NCCL's polling in
 * engine/comm_nccl.c) leaves it as the thread's last error. The one place that says so. */
static cudaError_t last_error(void)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaErrorNotReady ? cudaSuccess : e;
}

static void launched(cuda_t *c, const char *kernel) { ck(c, last_error(), kernel); }

/* The host waits for stream s, or for event e when it is not NULL: blocking, or with a wait
 * hook (backend.h: a communication library's check for collectives that will never end)
 * polling, calling the hook between queries. */
static cudaError_t host_wait(cuda_t *c, cudaStream_t s, cudaEvent_t e)
{
    backend_t *be = c->be;
    if (!be->wait_hook)
        return e ? cudaEventSynchronize(e) : cudaStreamSynchronize(s);
    for (;;) {
        cudaError_t r = e ? cudaEventQuery(e) : cudaStreamQuery(s);
        if (r != cudaErrorNotReady)
            return r;
        be->wait_hook(be->wait_arg);
        usleep(50);
    }
}

/* The instance behind be, its device made current (another instance may have changed it). */
static cuda_t *enter(backend_t *be)
{
    cuda_t *c = (cuda_t *)be->ctx;
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess || d != c->device)
        ck(c, cudaSetDevice(c->device), "selecting the device");
    return c;
}

static int dt_ok(cuda_t *c, const char *op, dtype_t dt)
{
    if (dt == DT_F32 || dt == DT_BF16)
        return 1;
    char b[64];
    snprintf(b, sizeof b, "dtype %s not taken", dtype_name(dt));
    note_err(c, op, b);
    return 0;
}

/* Calls f with a null pointer of dt's storage type (float, or uint16_t for bf16): the
 * kernels are templates over their buffers' types and this picks the instance. AS casts
 * a buffer to the type picked. */
template <typename F> static void on_dt(dtype_t dt, F &&f)
{
    if (dt == DT_BF16)
        f((uint16_t *)NULL);
    else
        f((float *)NULL);
}
#define AS(tag, buf) ((decltype(tag))(buf).p)

/* Scratch is shared by the instance's streams: the stream about to use it waits (on the
 * device) for the one that used it last. */
static void scratch_claim(cuda_t *c)
{
    if (c->scr_owner == c->cur)
        return;
    if (c->scr_owner)
        ck(c, cudaEventRecord(c->scr_ev, c->scr_owner), "scratch event");
    ck(c, cudaStreamWaitEvent(c->cur, c->scr_ev, 0), "scratch event");
    c->scr_owner = c->cur;
}

/* Grows a scratch buffer to at least bytes; after scratch_claim. */
static void *scratch(cuda_t *c, void **p, size_t *cap, size_t bytes, const char *what)
{
    if (bytes <= *cap)
        return *p;
    if (failed(c))
        return NULL;
    /* Kernels issued earlier may still read it; they all come before the current stream's
     * tail (scratch_claim). */
    if (ck(c, host_wait(c, c->cur, NULL), what) < 0)
        return NULL;
    bk_free(c->be, *p);
    *p = NULL;
    *cap = 0;
    if (!(*p = bk_alloc(c->be, bytes, BK_MEM_WORKSPACE, what))) {
        note_err(c, what, ftk_err_msg());
        return NULL;
    }
    *cap = bytes;
    return *p;
}

static void *tmp_for(cuda_t *c, size_t bytes) { return scratch(c, &c->tmp, &c->tmp_cap, bytes, "CUDA scratch"); }

/* Blocks for a grid-stride loop over n elements. */
static unsigned blocks_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535L * 16)
        b = 65535L * 16;
    return (unsigned)(b > 0 ? b : 1);
}

#define GRID_STRIDE(i, n)                                                                                           \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---- element access ---------------------------------------------------------------------- */

__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const uint16_t *p, int64_t i) { return __uint_as_float((uint32_t)p[i] << 16); }

#include "common.cuh" /* f32_to_bf16_dev, seg_start */

__device__ __forceinline__ void st(float *p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void st(uint16_t *p, int64_t i, float x) { p[i] = f32_to_bf16_dev(x); }

/* ---- elementwise kernels, 8 elements a thread -------------------------------------------- */

/* A memory-bound kernel that moves 2 bytes a thread per access (bf16) keeps too few bytes in
 * flight to fill the memory system: the first H200 run measured 26% of a device copy for
 * bf16 SwiGLU. Where every operand is 16-byte aligned, a thread takes VEC = 8 consecutive
 * elements with one 16-byte access per bf16 operand (two per fp32 one); the elements past
 * the last whole group, and unaligned views, take the one-element path. The arithmetic of
 * an element is the same expression on both paths (one function templated on the group
 * size), so the bits do not depend on the path. FTK_CUDA_VEC=0 keeps the one-element path
 * everywhere, for comparison. */
enum { VEC = 8 };

template <int K> __device__ __forceinline__ void ldk(const float *p, int64_t i, float *x)
{
    if (K == VEC) {
        float4 a = *(const float4 *)(p + i), b = *(const float4 *)(p + i + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else {
        for (int k = 0; k < K; k++)
            x[k] = p[i + k];
    }
}
template <int K> __device__ __forceinline__ void ldk(const uint16_t *p, int64_t i, float *x)
{
    if (K == VEC) {
        uint4 a = *(const uint4 *)(p + i);
        uint32_t w[4] = {a.x, a.y, a.z, a.w};
        for (int k = 0; k < 4; k++) { /* little-endian: element 2k is the low half */
            x[2 * k] = __uint_as_float(w[k] << 16);
            x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    } else {
        for (int k = 0; k < K; k++)
            x[k] = ld(p, i + k);
    }
}
template <int K> __device__ __forceinline__ void stk(float *p, int64_t i, const float *x)
{
    if (K == VEC) {
        *(float4 *)(p + i) = make_float4(x[0], x[1], x[2], x[3]);
        *(float4 *)(p + i + 4) = make_float4(x[4], x[5], x[6], x[7]);
    } else {
        for (int k = 0; k < K; k++)
            p[i + k] = x[k];
    }
}
template <int K> __device__ __forceinline__ void stk(uint16_t *p, int64_t i, const float *x)
{
    if (K == VEC) {
        uint32_t w[4];
        for (int k = 0; k < 4; k++)
            w[k] = (uint32_t)f32_to_bf16_dev(x[2 * k]) | (uint32_t)f32_to_bf16_dev(x[2 * k + 1]) << 16;
        *(uint4 *)(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
        for (int k = 0; k < K; k++)
            st(p, i + k, x[k]);
    }
}

/* Runs f<VEC>(args…, i) for every whole group i = 0, VEC, … below n when vec, then
 * f<1>(args…, i) for the rest, in a grid-stride loop (grid: ew_blocks). */
#define ELEMENTWISE(n, vec, f, ...)                                                                                 \
    do {                                                                                                            \
        int64_t nv_ = (vec) ? (n) / VEC : 0, step_ = (int64_t)gridDim.x * blockDim.x;                               \
        GRID_STRIDE(e_, nv_) f<VEC>(__VA_ARGS__, e_ * VEC);                                                         \
        for (int64_t i_ = nv_ * VEC + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i_ < (n); i_ += step_)       \
            f<1>(__VA_ARGS__, i_);                                                                                  \
    } while (0)

/* ---- reductions inside a block ---------------------------------------------------------- */

template <typename T> __device__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of up to 1024 threads, same order every call; every thread gets it. */
template <typename T> __device__ T block_sum(T v, T *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    T t = 0;
    for (int i = 0; i < nw; i++)
        t += sh[i];
    return t;
}

__device__ float block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < nw; i++)
        t = fmaxf(t, sh[i]);
    return t;
}

/* ---- memory, copies, streams, events ------------------------------------------------------ */

static void *cu_mem_alloc(backend_t *be, size_t bytes)
{
    enter(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report (bk_alloc), not kept */
        return NULL;
    }
    return p;
}

static void cu_mem_free(backend_t *be, void *p)
{
    if (!p)
        return;
    enter(be);
    cudaFree(p);
}

/* Page-locked host memory: the checkpoint snapshot (engine/bgsave.h) downloads into it
 * at the bus's speed, without the driver staging it through a bounce buffer. */
static void *cu_host_alloc(backend_t *be, size_t bytes)
{
    enter(be);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 256, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report, not kept */
        return NULL;
    }
    return p;
}

static void cu_host_free(backend_t *be, void *p)
{
    if (!p)
        return;
    enter(be);
    cudaFreeHost(p);
}

static void cu_upload(backend_t *be, void *dst, const void *src, size_t bytes)
{
    cuda_t *c = enter(be);
    if (!bytes || failed(c))
        return;
    if (bytes <= UP_STAGE) {
        /* Staged: the host buffer is free on return, and the host waits only for this
         * slot's previous copy, not for the stream (a copy from pageable memory would
         * drain it: the first kernels of every micro-batch would wait for the host). */
        up_slot_t *u = &c->up[c->up_next];
        c->up_next = (c->up_next + 1) % UP_SLOTS;
        if (!u->ev && ck(c, cudaEventCreateWithFlags(&u->ev, cudaEventDisableTiming), "upload") < 0)
            return;
        if (ck(c, host_wait(c, NULL, u->ev), "upload") < 0) /* at once when never recorded */
            return;
        if (bytes > u->cap) {
            cudaFreeHost(u->p);
            u->p = NULL;
            u->cap = 0;
            size_t cap = bytes < 4096 ? 4096 : bytes;
            if (ck(c, cudaMallocHost(&u->p, cap), "upload (pinned host memory)") < 0)
                return;
            u->cap = cap;
        }
        memcpy(u->p, src, bytes);
        if (ck(c, cudaMemcpyAsync(dst, u->p, bytes, cudaMemcpyHostToDevice, c->cur), "upload") == 0)
            ck(c, cudaEventRecord(u->ev, c->cur), "upload");
        return;
    }
    /* Waiting makes the host buffer free on return whatever memory it is (pinned memory
     * would otherwise be read later). */
    if (ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->cur), "upload") == 0)
        ck(c, host_wait(c, c->cur, NULL), "upload");
}

static void cu_download(backend_t *be, void *dst, const void *src, size_t bytes)
{
    cuda_t *c = enter(be);
    if (!bytes)
        return;
    if (failed(c) || ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->cur), "download") < 0 ||
        ck(c, host_wait(c, c->cur, NULL), "download") < 0)
        memset(dst, 0xff, bytes); /* NaN where floats: a failed run cannot look healthy */
}

static void cu_zero(backend_t *be, void *p, size_t bytes)
{
    cuda_t *c = enter(be);
    if (bytes && !failed(c))
        ck(c, cudaMemsetAsync(p, 0, bytes, c->cur), "zero");
}

/* Overlapping regions go through scratch in chunks, front to back when dst is below src
 * and back to front otherwise, so no chunk overwrites source bytes not yet copied
 * (cudaMemcpy leaves overlap undefined). */
static void copy_bytes(cuda_t *c, void *dst, const void *src, size_t bytes, const char *what)
{
    if (!bytes || failed(c) || dst == src)
        return;
    const char *s = (const char *)src;
    char *d = (char *)dst;
    if (d + bytes <= s || s + bytes <= d) {
        ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->cur), what);
        return;
    }
    scratch_claim(c);
    size_t ch = bytes < BK_CUDA_WORKSPACE_BYTES ? bytes : BK_CUDA_WORKSPACE_BYTES;
    char *t = (char *)tmp_for(c, ch);
    if (!t)
        return;
    for (size_t done = 0; done < bytes && !failed(c); done += ch) {
        size_t len = bytes - done < ch ? bytes - done : ch, off = d < s ? done : bytes - done - len;
        if (ck(c, cudaMemcpyAsync(t, s + off, len, cudaMemcpyDeviceToDevice, c->cur), what) == 0)
            ck(c, cudaMemcpyAsync(d + off, t, len, cudaMemcpyDeviceToDevice, c->cur), what);
    }
}

static void cu_copy(backend_t *be, void *dst, const void *src, size_t bytes)
{
    copy_bytes(enter(be), dst, src, bytes, "copy");
}

/* Waits for every stream also after a failure (a dtype refused, an allocation that failed):
 * work queued before it still runs, and the caller may free or read what it uses once
 * sync() returns. The first error stays the one reported. */
static int cu_sync(backend_t *be)
{
    cuda_t *c = enter(be);
    ck(c, host_wait(c, c->def, NULL), "synchronize");
    for (bk_stream *s = c->streams; s; s = s->next)
        ck(c, host_wait(c, s->s, NULL), "synchronize");
    ck(c, last_error(), "a kernel");
    if (failed(c)) {
        ftk_err_set("%s", c->err);
        return -1;
    }
    return 0;
}

/* Streams do not block on the legacy default stream: other libraries' work there does
 * not order ours. */
static bk_stream_t *cu_stream_new(backend_t *be)
{
    cuda_t *c = enter(be);
    bk_stream *s = (bk_stream *)calloc(1, sizeof *s);
    if (!s) {
        ftk_err_set("out of memory");
        return NULL;
    }
    cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        ftk_err_set("CUDA device %d: creating a stream: %s", c->device, cudaGetErrorString(e));
        free(s);
        return NULL;
    }
    s->next = c->streams;
    c->streams = s;
    return s;
}

static void stream_release(cuda_t *c, bk_stream *s)
{
    if (c->cur == s->s)
        c->cur = c->def;
    if (c->scr_owner == s->s) { /* later scratch users wait for what it has queued */
        ck(c, cudaEventRecord(c->scr_ev, s->s), "scratch event");
        c->scr_owner = NULL;
    }
    cudaStreamDestroy(s->s); /* work already queued on it still runs */
    free(s);
}

static void cu_stream_free(backend_t *be, bk_stream_t *s)
{
    cuda_t *c = enter(be);
    for (bk_stream **pp = &c->streams; s && *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            stream_release(c, s);
            return;
        }
}

static void cu_set_stream(backend_t *be, bk_stream_t *s)
{
    cuda_t *c = (cuda_t *)be->ctx;
    c->cur = s ? s->s : c->def;
}

static void *cu_stream_native(backend_t *be, bk_stream_t *s)
{
    cuda_t *c = (cuda_t *)be->ctx;
    return s ? (void *)s->s : (void *)c->def;
}

/* Ordering events skip the timestamp (cheaper to record); FTK_PROFILE's timers keep it. */
static bk_event_t *event_make(backend_t *be, unsigned flags)
{
    cuda_t *c = enter(be);
    bk_event *ev = (bk_event *)calloc(1, sizeof *ev);
    if (!ev) {
        ftk_err_set("out of memory");
        return NULL;
    }
    cudaError_t e = cudaEventCreateWithFlags(&ev->e, flags);
    if (e != cudaSuccess) {
        cudaGetLastError();
        ftk_err_set("CUDA device %d: creating an event: %s", c->device, cudaGetErrorString(e));
        free(ev);
        return NULL;
    }
    ev->next = c->events;
    c->events = ev;
    return ev;
}

static bk_event_t *cu_event_new(backend_t *be) { return event_make(be, cudaEventDisableTiming); }
static bk_event_t *cu_timer_new(backend_t *be) { return event_make(be, cudaEventDefault); }

/* Not complete or never recorded (the instance had failed): unknown, and the runtime's last
 * error cleared, or sync() would report it as a kernel's. */
static double cu_timer_elapsed(backend_t *be, bk_event_t *a, bk_event_t *b)
{
    enter(be);
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a->e, b->e) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return ms * 1e-3;
}

static void cu_event_free(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    for (bk_event **pp = &c->events; ev && *pp; pp = &(*pp)->next)
        if (*pp == ev) {
            *pp = ev->next;
            cudaEventDestroy(ev->e);
            free(ev);
            return;
        }
}

static void cu_event_record(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    if (!failed(c))
        ck(c, cudaEventRecord(ev->e, c->cur), "event record");
}

static void cu_event_wait(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    if (!failed(c))
        ck(c, cudaStreamWaitEvent(c->cur, ev->e, 0), "event wait");
}

static int cu_event_sync(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    ck(c, host_wait(c, NULL, ev->e), "event synchronize"); /* waits also after a failure, as sync() */
    if (failed(c)) {
        ftk_err_set("%s", c->err);
        return -1;
    }
    return 0;
}

/* ---- conversion, scaling ------------------------------------------------------------------ */

/* Whether an elementwise op may take its 8-element path (ELEMENTWISE): every operand 16-byte
 * aligned (a view into a buffer may not be), and not FTK_CUDA_VEC=0. */
static int vec_ok(const cuda_t *c, std::initializer_list<const void *> bufs)
{
    if (!c->vec)
        return 0;
    for (const void *p : bufs)
        if ((uintptr_t)p % 16)
            return 0;
    return 1;
}
/* Blocks for an elementwise op over n elements. */
static unsigned ew_blocks(int64_t n, int vec) { return blocks_for(vec ? (n + VEC - 1) / VEC : n, 256); }

template <int K, typename TD, typename TS> __device__ __forceinline__ void convert_at(TD *dst, const TS *src, int64_t i)
{
    float x[K];
    ldk<K>(src, i, x);
    stk<K>(dst, i, x);
}
template <typename TD, typename TS> __global__ void convert_kernel(TD *dst, const TS *src, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, convert_at, dst, src);
}

/* y *= a (0·NaN is NaN, as on the CPU). */
template <int K, typename T> __device__ __forceinline__ void mul_at(T *y, float a, int64_t i)
{
    float x[K];
    ldk<K>(y, i, x);
    for (int k = 0; k < K; k++)
        x[k] = x[k] * a;
    stk<K>(y, i, x);
}
template <typename T> __global__ void mul_kernel(T *y, float a, int64_t n, int vec) { ELEMENTWISE(n, vec, mul_at, y, a); }

/* C = beta·C of a product with K = 0: beta = 0 overwrites, as BLAS does. */
template <typename T> __global__ void scale_c_kernel(T *y, float a, int64_t n)
{
    GRID_STRIDE(i, n) st(y, i, a == 0.0f ? 0.0f : ld(y, i) * a);
}

static void cu_convert(backend_t *be, bk_buf_t dst, bk_buf_t src, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "convert", dst.dt) || !dt_ok(c, "convert", src.dt))
        return;
    if (dst.dt == src.dt) {
        copy_bytes(c, dst.p, src.p, (size_t)n * dtype_size(dst.dt), "convert");
        return;
    }
    on_dt(dst.dt, [&](auto td) {
        on_dt(src.dt,
              [&](auto ts) {
                  int v = vec_ok(c, {dst.p, src.p});
                  convert_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(td, dst), AS(ts, src), n, v);
              });
    });
    launched(c, "convert");
}

/* ---- matrix products (cuBLASLt) --------------------------------------------------------- */

/* Row-major C[M,N] = op(A)·op(B) is column-major Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLAS gets B
 * as its first operand. */

static void plan_release(plan_t *p)
{
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc)
        cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* Model tensors sit at offsets inside unit vectors, so pointers are not all 256-byte
 * aligned (cuBLASLt's default assumption): the heuristic is told the real alignment. */
static uint32_t align_of(const void *a, const void *b, const void *c)
{
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    uint32_t al = 256;
    while (al > 2 && (x & (al - 1)))
        al >>= 1;
    return al;
}

static cudaDataType_t cuda_type(dtype_t dt) { return dt == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* lda: A's leading dimension, M or K unless a product is cut into row blocks. */
static plan_t *plan_for(cuda_t *c, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int beta0,
                        uint32_t align, dtype_t dab, dtype_t dc)
{
    for (int i = 0; i < c->n_plans; i++) {
        plan_t *p = &c->plans[i];
        if (p->valid && p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda &&
            p->beta0 == beta0 && p->align == align && p->dab == dab && p->dc == dc)
            return p;
    }
    plan_t *p; /* more shapes than a model uses: replace the oldest */
    if (c->n_plans < MAX_PLANS)
        p = &c->plans[c->n_plans++];
    else {
        p = &c->plans[c->evict];
        c->evict = (c->evict + 1) % MAX_PLANS;
    }
    plan_release(p);
    p->ta = ta;
    p->tb = tb;
    p->M = M;
    p->N = N;
    p->K = K;
    p->lda = lda;
    p->beta0 = beta0;
    p->align = align;
    p->dab = dab;
    p->dc = dc;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t ct = dab == DT_BF16 ? CUBLAS_COMPUTE_32F : c->f32_compute;
    cudaDataType_t tab = cuda_type(dab), tc = cuda_type(dc);
    if (ck_lt(c, cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F), "matmul descriptor") < 0 ||
        ck_lt(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA") <
            0 ||
        ck_lt(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB") <
            0 ||
        /* first operand: B, stored [N,K] when tb (ld K) else [K,N] (ld N), column-major view */
        ck_lt(c, cublasLtMatrixLayoutCreate(&p->la, tab, tb ? K : N, tb ? N : K, tb ? K : N), "layout B") < 0 ||
        ck_lt(c, cublasLtMatrixLayoutCreate(&p->lb, tab, ta ? M : K, ta ? K : M, lda), "layout A") < 0 ||
        ck_lt(c, cublasLtMatrixLayoutCreate(&p->lc, tc, N, M, N), "layout C") < 0) {
        plan_release(p);
        return NULL;
    }
    cublasLtMatmulPreference_t pref;
    if (ck_lt(c, cublasLtMatmulPreferenceCreate(&pref), "preference") < 0) {
        plan_release(p);
        return NULL;
    }
    size_t ws_bytes = BK_CUDA_WORKSPACE_BYTES;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
    const cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublasLtMatmulPreferenceSetAttribute(pref, al[i], &align, sizeof align);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (ck_lt(c, s, "algorithm heuristic") < 0) {
        plan_release(p);
        return NULL;
    }
    if (!found) {
        note_err(c, "matmul", "cuBLASLt has no algorithm for this shape");
        plan_release(p);
        return NULL;
    }
    p->algo = h.algo;
    p->valid = 1;
    return p;
}

/* One cuBLASLt call; after scratch_claim (the workspace). */
static void gemm(cuda_t *c, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, float alpha, const void *A,
                 const void *B, float beta, void *C, dtype_t dab, dtype_t dc)
{
    plan_t *p = plan_for(c, ta, tb, M, N, K, lda, beta == 0.0f, align_of(A, B, C), dab, dc);
    if (p)
        ck_lt(c,
              cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc, &p->algo, c->ws,
                             BK_CUDA_WORKSPACE_BYTES, c->cur),
              "matmul");
}

/* c[i] = t[i] + beta·c[i], the bf16 result of an fp32 product made in t. */
template <typename T> __global__ void add_product_kernel(T *c, const float *t, float beta, int64_t n)
{
    GRID_STRIDE(i, n) st(c, i, beta == 0.0f ? t[i] : t[i] + beta * ld(c, i));
}

static void cu_matmul(backend_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, bk_buf_t A,
                      bk_buf_t B, float beta, bk_buf_t C)
{
    cuda_t *c = enter(be);
    if (M == 0 || N == 0 || failed(c) || !dt_ok(c, "matmul", A.dt) || !dt_ok(c, "matmul", C.dt))
        return;
    if (A.dt != B.dt) {
        note_err(c, "matmul", "A and B of different dtypes");
        return;
    }
    if (K == 0) { /* cuBLASLt wants k >= 1; C = beta·C */
        on_dt(C.dt,
              [&](auto tc) { scale_c_kernel<<<blocks_for(M * N, 256), 256, 0, c->cur>>>(AS(tc, C), beta, M * N); });
        launched(c, "matmul (k = 0)");
        return;
    }
    scratch_claim(c);
    if (A.dt == DT_BF16 || C.dt == DT_F32) {
        gemm(c, ta, tb, M, N, K, ta ? M : K, alpha, A.p, B.p, beta, C.p, A.dt, C.dt);
        return;
    }
    /* fp32 operands into bf16: cuBLASLt has no such type combination, so the product is
     * made in fp32 rows of scratch (blocks of at most the workspace's size) and added into
     * C, rounded once. */
    int64_t rows = (int64_t)(BK_CUDA_WORKSPACE_BYTES / sizeof(float)) / N;
    rows = rows < 1 ? 1 : rows > M ? M : rows;
    float *t = (float *)tmp_for(c, (size_t)rows * N * sizeof(float));
    if (!t)
        return;
    for (int64_t m0 = 0; m0 < M && !failed(c); m0 += rows) {
        int64_t mr = M - m0 < rows ? M - m0 : rows;
        const float *a = (const float *)A.p + (ta ? m0 : m0 * K);
        gemm(c, ta, tb, mr, N, K, ta ? M : K, alpha, a, B.p, 0.0f, t, DT_F32, DT_F32);
        add_product_kernel<<<blocks_for(mr * N, 256), 256, 0, c->cur>>>((uint16_t *)C.p + m0 * N, t, beta, mr * N);
        launched(c, "matmul (bf16 result)");
    }
}

/* ---- embedding, rows ---------------------------------------------------------------------- */

/* K elements of one dtype moved as they are (16-byte accesses for a whole group). */
template <int K, typename T> __device__ __forceinline__ void cpk(T *dst, const T *src)
{
    if (K == VEC) {
        for (int k = 0; k < (int)(VEC * sizeof(T) / 16); k++)
            ((uint4 *)dst)[k] = ((const uint4 *)src)[k];
    } else {
        for (int k = 0; k < K; k++)
            dst[k] = src[k];
    }
}

/* Output element e = i·d + j is row ids[i]'s element j; a group of VEC stays in one row when d
 * is a multiple of VEC (the only case given the 8-element path). */
template <int K, typename T>
__device__ __forceinline__ void embed_fwd_el(T *out, const int32_t *ids, const T *table, int64_t d, int64_t e)
{
    int64_t i = e / d;
    cpk<K>(out + e, table + (int64_t)ids[i] * d + (e - i * d));
}
template <typename T>
__global__ void embed_fwd_kernel(T *out, const int32_t *ids, const T *table, int64_t n, int64_t d, int vec)
{
    ELEMENTWISE(n * d, vec, embed_fwd_el, out, ids, table, d);
}

/* x as stored in a buffer of p's type (rounded to bf16 for uint16_t). */
__device__ __forceinline__ float as_stored(const float *, float x) { return x; }
__device__ __forceinline__ float as_stored(const uint16_t *, float x)
{
    return __uint_as_float((uint32_t)f32_to_bf16_dev(x) << 16);
}

/* embed_bwd, first kernel (FTK_CUDA_VEC=0): a thread per column, tokens in order: repeated
 * ids add in the CPU's order, and a bf16 table rounds each sum as it is stored, as the
 * CPU does. Only d threads, each through all n tokens: a chain of dependent
 * read-add-writes, ~n memory latencies. */
template <typename TT, typename TD>
__global__ void embed_bwd_kernel(TT *dtable, const int32_t *ids, const TD *dout, int64_t n, int64_t d)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d)
        return;
    for (int64_t i = 0; i < n; i++) {
        int64_t t = (int64_t)ids[i] * d + j;
        st(dtable, t, ld(dtable, t) + ld(dout, i * d + j));
    }
}

/* embed_bwd by id: the sums of different rows are independent, so each row of the table
 * needs only its own tokens in order. First the tokens sorted by (id, position), stably,
 * by counting: a thread per token compares its id with all ids (64-entry shared-memory
 * tiles; n² comparisons, ~n/64 blocks so that a few thousand tokens still fill the
 * device): order[less + before] = i, where less counts the smaller ids and before the
 * same id earlier; the first token of an id (before = 0) keeps its group's start and
 * length, the others a length of 0. */
__global__ void embed_order_kernel(const int32_t *ids, int32_t n, int32_t *order, int32_t *start, int32_t *len)
{
    __shared__ int32_t sh[64];
    int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    int32_t id = i < n ? ids[i] : -1, less = 0, before = 0, same = 0;
    for (int32_t b = 0; b < n; b += 64) {
        __syncthreads();
        if (b + (int32_t)threadIdx.x < n)
            sh[threadIdx.x] = ids[b + threadIdx.x];
        __syncthreads();
        int32_t m = n - b < 64 ? n - b : 64;
        for (int32_t k = 0; k < m; k++) {
            int32_t o = sh[k];
            less += o < id;
            same += o == id;
            before += o == id && b + k < i;
        }
    }
    if (i < n) {
        order[less + before] = i;
        start[i] = less;
        len[i] = before ? 0 : same;
    }
}

/* Then a block per (token, 128 columns), at work for an id's first token only: the row's
 * sum runs through its group of order in a register, rounded as stored after each add
 * (the CPU's bits), and is stored once. The group's positions are contiguous, so a
 * frequent id (padding, "the") has its loads issued 8 at a time, not one latency each. */
template <typename TT, typename TD>
__global__ void embed_bwd_rows_kernel(TT *dtable, const int32_t *ids, const TD *dout, const int32_t *order,
                                      const int32_t *start, const int32_t *len, int64_t d)
{
    enum { U = 8 };
    int32_t i = (int32_t)blockIdx.x, c = len[i];
    int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (!c || j >= d)
        return;
    const int32_t *g = order + start[i];
    int64_t at = (int64_t)ids[i] * d + j;
    float v = ld(dtable, at);
    for (int32_t k = 0; k < c; k += U) {
        float x[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            x[u] = k + u < c ? ld(dout, (int64_t)g[k + u] * d + j) : 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k + u < c) /* not v + 0: -0 + 0 is +0 */
                v = as_stored(dtable, v + x[u]);
    }
    st(dtable, at, v);
}

template <int K, typename T>
__device__ __forceinline__ void rows_scatter_el(T *dst, const int32_t *idx, const T *src, int64_t d, int64_t e)
{
    int64_t i = e / d;
    cpk<K>(dst + (int64_t)idx[i] * d + (e - i * d), src + e);
}
template <typename T>
__global__ void rows_scatter_kernel(T *dst, const int32_t *idx, const T *src, int64_t n, int64_t d, int vec)
{
    ELEMENTWISE(n * d, vec, rows_scatter_el, dst, idx, src, d);
}

static int same_dt(cuda_t *c, const char *op, dtype_t a, dtype_t b)
{
    if (!dt_ok(c, op, a) || !dt_ok(c, op, b))
        return 0;
    if (a != b) {
        note_err(c, op, "buffers of different dtypes");
        return 0;
    }
    return 1;
}

static void cu_embed_fwd(backend_t *be, bk_buf_t out, const int32_t *ids, bk_buf_t table, int64_t n, int64_t d)
{
    cuda_t *c = enter(be);
    if (n * d == 0 || failed(c) || !same_dt(c, "embed_fwd", out.dt, table.dt))
        return;
    on_dt(out.dt, [&](auto t) {
        int v = d % VEC == 0 && vec_ok(c, {out.p, table.p});
        embed_fwd_kernel<<<ew_blocks(n * d, v), 256, 0, c->cur>>>(AS(t, out), ids, AS(t, table), n, d, v);
    });
    launched(c, "embed_fwd");
}

static void cu_embed_bwd(backend_t *be, bk_buf_t dtable, const int32_t *ids, bk_buf_t dout, int64_t n, int64_t d)
{
    cuda_t *c = enter(be);
    if (n * d == 0 || failed(c) || !dt_ok(c, "embed_bwd", dtable.dt) || !dt_ok(c, "embed_bwd", dout.dt))
        return;
    int32_t *links = NULL; /* order, start, len: n each */
    /* by id up to 2^18 tokens (its n² comparisons stay well under the first kernel's n
     * memory round trips), and not with FTK_CUDA_VEC=0 (the first kernel, for comparison) */
    if (c->vec && n <= (1 << 18) && (d + 127) / 128 <= 65535) {
        scratch_claim(c);
        if (!(links = (int32_t *)tmp_for(c, (size_t)n * 3 * sizeof(int32_t))))
            return;
        embed_order_kernel<<<(unsigned)((n + 63) / 64), 64, 0, c->cur>>>(ids, (int32_t)n, links, links + n,
                                                                         links + 2 * n);
        launched(c, "embed_bwd order");
        if (failed(c)) /* its lists are indices into dtable: never read them unwritten */
            return;
    }
    on_dt(dtable.dt, [&](auto tt) {
        on_dt(dout.dt, [&](auto td) {
            if (links)
                embed_bwd_rows_kernel<<<dim3((unsigned)n, (unsigned)((d + 127) / 128)), 128, 0, c->cur>>>(
                    AS(tt, dtable), ids, AS(td, dout), links, links + n, links + 2 * n, d);
            else
                embed_bwd_kernel<<<(unsigned)((d + 127) / 128), 128, 0, c->cur>>>(AS(tt, dtable), ids, AS(td, dout),
                                                                                  n, d);
        });
    });
    launched(c, "embed_bwd");
}

static void cu_rows_scatter(backend_t *be, bk_buf_t dst, const int32_t *idx, bk_buf_t src, int64_t n, int64_t d)
{
    cuda_t *c = enter(be);
    if (n * d == 0 || failed(c) || !same_dt(c, "rows_scatter", dst.dt, src.dt))
        return;
    on_dt(dst.dt, [&](auto t) {
        int v = d % VEC == 0 && vec_ok(c, {dst.p, src.p});
        rows_scatter_kernel<<<ew_blocks(n * d, v), 256, 0, c->cur>>>(AS(t, dst), idx, AS(t, src), n, d, v);
    });
    launched(c, "rows_scatter");
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

/* A block per row; each thread takes K consecutive elements at a time (K = VEC with 16-byte
 * accesses where the row width is a multiple of VEC and every operand aligned, else 1), so
 * the partition of a row, hence the bits of its sum, depends on K: the same K for the same
 * shapes and alignment, so still deterministic. */
template <typename F> static void on_vec(int vec, F &&f)
{
    if (vec)
        f(std::integral_constant<int, VEC>());
    else
        f(std::integral_constant<int, 1>());
}

/* The end of row i's RMSNorm, given each thread's part s of Σx²: the block's sum, rstd, and
 * out = x·rstd·w (each thread reads back only the elements of its own part). Shared by
 * rmsnorm_fwd and add_rmsnorm_fwd, whose bits must agree. */
template <int K, typename TO, typename TX, typename TW>
__device__ __forceinline__ void rms_row_end(TO *out, float *rstd, const TX *xi, const TW *w, int64_t i, int64_t d,
                                            float s, float eps, float *sh)
{
    s = block_sum(s, sh);
    float r = 1.0f / sqrtf(s / (float)d + eps);
    if (threadIdx.x == 0)
        rstd[i] = r;
    for (int64_t j = K * threadIdx.x; j < d; j += K * blockDim.x) {
        float a[K], b[K];
        ldk<K>(xi, j, a);
        ldk<K>(w, j, b);
        for (int k = 0; k < K; k++)
            a[k] = (a[k] * r) * b[k];
        stk<K>(out, i * d + j, a);
    }
}

template <int K, typename TO, typename TX, typename TW>
__global__ void rmsnorm_fwd_kernel(TO *out, float *rstd, const TX *x, const TW *w, int64_t d, float eps)
{
    __shared__ float sh[32];
    int64_t i = blockIdx.x;
    const TX *xi = x + i * d;
    float s = 0;
    for (int64_t j = K * threadIdx.x; j < d; j += K * blockDim.x) {
        float a[K];
        ldk<K>(xi, j, a);
        for (int k = 0; k < K; k++)
            s += a[k] * a[k];
    }
    rms_row_end<K>(out, rstd, xi, w, i, d, s, eps, sh);
}

/* dx = r·(dy·w) − r³/d · x · Σ(dy·w·x), added. */
template <int K, typename TDX, typename TG, typename TX, typename TW>
__global__ void rmsnorm_bwd_dx_kernel(TDX *dx, const TG *dout, const TX *x, const TW *w, const float *rstd,
                                      int64_t d)
{
    __shared__ float sh[32];
    int64_t i = blockIdx.x;
    const TX *xi = x + i * d;
    const TG *gi = dout + i * d;
    float s = 0;
    for (int64_t j = K * threadIdx.x; j < d; j += K * blockDim.x) {
        float g[K], b[K], a[K];
        ldk<K>(gi, j, g);
        ldk<K>(w, j, b);
        ldk<K>(xi, j, a);
        for (int k = 0; k < K; k++)
            s += g[k] * b[k] * a[k];
    }
    s = block_sum(s, sh);
    float r = rstd[i], c = s * r * r * r / (float)d;
    for (int64_t j = K * threadIdx.x; j < d; j += K * blockDim.x) {
        float y[K], g[K], b[K], a[K];
        ldk<K>(dx, i * d + j, y);
        ldk<K>(gi, j, g);
        ldk<K>(w, j, b);
        ldk<K>(xi, j, a);
        for (int k = 0; k < K; k++)
            y[k] = y[k] + (r * g[k] * b[k] - c * a[k]);
        stk<K>(dx, i * d + j, y);
    }
}

/* dw = Σ_i dy·x·r: rows cut into fixed chunks (blockIdx.y), a thread per column, then
 * the chunks summed in order. */
enum { COL_CHUNKS = 64 };

template <typename TG, typename TX>
__global__ void rmsnorm_bwd_dw_part_kernel(float *part, const TG *dout, const TX *x, const float *rstd, int64_t n,
                                           int64_t d)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d)
        return;
    int64_t per = (n + COL_CHUNKS - 1) / COL_CHUNKS, a = blockIdx.y * per, b = a + per < n ? a + per : n;
    float acc = 0;
    for (int64_t i = a; i < b; i++)
        acc += ld(dout, i * d + j) * ld(x, i * d + j) * rstd[i];
    part[(int64_t)blockIdx.y * d + j] = acc;
}

template <typename T> __global__ void colsum_add_kernel(T *dw, const float *part, int64_t d)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d)
        return;
    float acc = 0;
    for (int c = 0; c < COL_CHUNKS; c++)
        acc += part[(int64_t)c * d + j];
    st(dw, j, ld(dw, j) + acc);
}

static void cu_rmsnorm_fwd(backend_t *be, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t w, int64_t n, int64_t d,
                           float eps)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "rmsnorm_fwd", out.dt) || !dt_ok(c, "rmsnorm_fwd", x.dt) ||
        !dt_ok(c, "rmsnorm_fwd", w.dt))
        return;
    on_dt(out.dt, [&](auto to) {
        on_dt(x.dt, [&](auto tx) {
            on_dt(w.dt, [&](auto tw) {
                on_vec(d % VEC == 0 && vec_ok(c, {out.p, x.p, w.p}), [&](auto K) {
                    rmsnorm_fwd_kernel<decltype(K)::value>
                        <<<(unsigned)n, 256, 0, c->cur>>>(AS(to, out), rstd, AS(tx, x), AS(tw, w), d, eps);
                });
            });
        });
    });
    launched(c, "rmsnorm_fwd");
}

static void cu_rmsnorm_bwd(backend_t *be, bk_buf_t dx, bk_buf_t dw, bk_buf_t dout, bk_buf_t x, bk_buf_t w,
                           const float *rstd, int64_t n, int64_t d)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "rmsnorm_bwd", dx.dt) || !dt_ok(c, "rmsnorm_bwd", dw.dt) ||
        !dt_ok(c, "rmsnorm_bwd", dout.dt) || !dt_ok(c, "rmsnorm_bwd", x.dt) || !dt_ok(c, "rmsnorm_bwd", w.dt))
        return;
    on_dt(dx.dt, [&](auto tdx) {
        on_dt(dout.dt, [&](auto tg) {
            on_dt(x.dt, [&](auto tx) {
                on_dt(w.dt, [&](auto tw) {
                    on_vec(d % VEC == 0 && vec_ok(c, {dx.p, dout.p, x.p, w.p}), [&](auto K) {
                        rmsnorm_bwd_dx_kernel<decltype(K)::value><<<(unsigned)n, 256, 0, c->cur>>>(
                            AS(tdx, dx), AS(tg, dout), AS(tx, x), AS(tw, w), rstd, d);
                    });
                });
            });
        });
    });
    launched(c, "rmsnorm_bwd");
    if (failed(c))
        return;
    scratch_claim(c);
    float *part = (float *)tmp_for(c, (size_t)COL_CHUNKS * d * sizeof(float));
    if (!part)
        return;
    dim3 grid((unsigned)((d + 127) / 128), COL_CHUNKS);
    on_dt(dout.dt, [&](auto tg) {
        on_dt(x.dt, [&](auto tx) {
            rmsnorm_bwd_dw_part_kernel<<<grid, 128, 0, c->cur>>>(part, AS(tg, dout), AS(tx, x), rstd, n, d);
        });
    });
    launched(c, "rmsnorm_bwd dw");
    on_dt(dw.dt,
          [&](auto tw) { colsum_add_kernel<<<(unsigned)((d + 127) / 128), 128, 0, c->cur>>>(AS(tw, dw), part, d); });
    launched(c, "rmsnorm_bwd dw sum");
}

/* The residual add and RMSNorm (backend.h add_rmsnorm_fwd): a block per row as
 * rmsnorm_fwd_kernel, with the same partition of the row over threads (the same K where
 * rmsnorm_fwd on xsum would take the same: same width and alignment) and the same
 * reduction, on the sums as stored (rounded to xsum's type): the bits of add then
 * rmsnorm_fwd on this device. Each thread reads back only the sums it wrote. */
template <int K, typename TS, typename TO, typename TW>
__global__ void add_rmsnorm_fwd_kernel(TS *xsum, TO *out, float *rstd, const TS *x, const TS *r, const TW *w, int64_t d,
                                       float eps)
{
    __shared__ float sh[32];
    int64_t i = blockIdx.x;
    TS *si = xsum + i * d;
    const TS *xi = x + i * d, *ri = r + i * d;
    float s = 0;
    for (int64_t j = K * threadIdx.x; j < d; j += K * blockDim.x) {
        float a[K], b[K];
        ldk<K>(xi, j, a);
        ldk<K>(ri, j, b);
        for (int k = 0; k < K; k++) {
            a[k] = as_stored(si, a[k] + b[k]);
            s += a[k] * a[k];
        }
        stk<K>(si, j, a); /* representable: stored as computed */
    }
    rms_row_end<K>(out, rstd, (const TS *)si, w, i, d, s, eps, sh);
}

static void cu_add(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n);

static void cu_add_rmsnorm_fwd(backend_t *be, bk_buf_t xsum, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t r,
                               bk_buf_t w, int64_t n, int64_t d, float eps)
{
    cuda_t *c = enter(be);
    const char *op = "add_rmsnorm_fwd";
    if (n == 0 || failed(c) || !same_dt(c, op, xsum.dt, x.dt) || !same_dt(c, op, xsum.dt, r.dt) ||
        !dt_ok(c, op, out.dt) || !dt_ok(c, op, w.dt))
        return;
    /* The row's partition is the one rmsnorm_fwd on xsum takes (its operands' alignment).
     * Where that is 8-wide but x or r cannot be read 8-wide, the op is its sequence. */
    int vec = d % VEC == 0 && vec_ok(c, {out.p, xsum.p, w.p});
    if (vec && !vec_ok(c, {x.p, r.p})) {
        if (xsum.p == r.p) { /* xsum = r + x: the same bits (IEEE addition commutes) */
            cu_add(be, xsum, x, n * d);
        } else {
            copy_bytes(c, xsum.p, x.p, (size_t)(n * d) * dtype_size(x.dt), op);
            cu_add(be, xsum, r, n * d);
        }
        cu_rmsnorm_fwd(be, out, rstd, xsum, w, n, d, eps);
        return;
    }
    on_dt(xsum.dt, [&](auto ts) {
        on_dt(out.dt, [&](auto to) {
            on_dt(w.dt, [&](auto tw) {
                on_vec(vec, [&](auto K) {
                    add_rmsnorm_fwd_kernel<decltype(K)::value><<<(unsigned)n, 256, 0, c->cur>>>(
                        AS(ts, xsum), AS(to, out), rstd, AS(ts, x), AS(ts, r), AS(tw, w), d, eps);
                });
            });
        });
    });
    launched(c, op);
}

/* ---- rotary embedding --------------------------------------------------------------------- */

/* The rotation of pair j at position pos, from inv = inv_freq_j. HF: inv_freq_j =
 * 1 / theta^(2j/hd) in float32, angle = pos·inv_freq in float32. The inverse frequencies
 * are computed on the host with the CPU backend's expression (rope_freqs: the same libm
 * powf, so the same floats; the device's powf may differ by an ulp or more, and at
 * position p an ulp of inv_freq moves the angle by p ulps). The angle's cosine and sine
 * come from sincospi in double, rounded to float: that reduction is exact for any angle,
 * where cosf/sinf take a slow path with local memory past |a| = 105615, and the values are
 * the nearest floats nearly always (the CPU's glibc cosf/sinf are too). */
__device__ __forceinline__ void rope_cs(float inv, int32_t pos, int inverse, float *c, float *s)
{
    float a = (float)pos * inv;
    double sd, cd;
    sincospi((double)a * 0.318309886183790671537767526745, &sd, &cd); /* a / pi */
    *c = (float)cd;
    *s = inverse ? -(float)sd : (float)sd;
}

/* The inverse frequencies of a head dimension up to 2·ROPE_MAX_HALF, passed by value. */
enum { ROPE_MAX_HALF = 256 };
typedef struct {
    float v[ROPE_MAX_HALF];
} rope_freq_t;

/* cpu.c cpu_rope's table, same expression, same powf. 0 (and the error kept) when hd is
 * larger than the table. */
static int rope_freqs(cuda_t *c, const char *op, int hd, float theta, rope_freq_t *f)
{
    int half = hd / 2;
    if (half > ROPE_MAX_HALF) {
        note_err(c, op, "head dimension over 512");
        return 0;
    }
    for (int j = 0; j < half; j++)
        f->v[j] = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
    return 1;
}

/* Elements j and j + half of one head's row x, rotated into y (which may be x). Each
 * product and sum rounded on its own (the _rn intrinsics are never contracted into an
 * FMA): the CPU's arithmetic, and the same in every kernel that rotates, whatever ptxas
 * does at each call site. */
template <typename T> __device__ __forceinline__ void rope_to(T *y, const T *x, int j, int half, float c, float s)
{
    float x1 = ld(x, j), x2 = ld(x, j + half);
    st(y, j, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    st(y, j + half, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

template <typename T> __device__ __forceinline__ void rope_rot(T *v, int j, int half, float c, float s)
{
    rope_to(v, v, j, half, c, s);
}

/* A thread per (token, pair), the heads in a loop: the angle is the same for all of them,
 * as in the CPU's loop. */
template <typename T>
__global__ void rope_kernel(T *x, const int32_t *pos, int64_t n, int n_head, int hd, const rope_freq_t f,
                            int inverse)
{
    int half = hd / 2;
    GRID_STRIDE(e, n * half)
    {
        int j = (int)(e % half);
        int64_t i = e / half;
        float c, s;
        rope_cs(f.v[j], pos[i], inverse, &c, &s);
        for (int h = 0; h < n_head; h++)
            rope_rot(x + (i * n_head + h) * hd, j, half, c, s);
    }
}

template <typename TQ, typename TK>
__global__ void rope_qk_kernel(TQ *q, TK *k, const int32_t *pos, int64_t n, int n_head, int n_kv, int hd,
                               const rope_freq_t f, int inverse)
{
    int half = hd / 2;
    GRID_STRIDE(e, n * half)
    {
        int j = (int)(e % half);
        int64_t i = e / half;
        float c, s;
        rope_cs(f.v[j], pos[i], inverse, &c, &s);
        for (int h = 0; h < n_head; h++)
            rope_rot(q + (i * n_head + h) * hd, j, half, c, s);
        for (int h = 0; h < n_kv; h++)
            rope_rot(k + (i * n_kv + h) * hd, j, half, c, s);
    }
}

static void cu_rope(backend_t *be, bk_buf_t x, const int32_t *pos, int64_t n, int n_head, int hd, float theta,
                    int inverse)
{
    cuda_t *c = enter(be);
    rope_freq_t f;
    if (n == 0 || hd < 2 || failed(c) || !dt_ok(c, "rope", x.dt) || !rope_freqs(c, "rope", hd, theta, &f))
        return;
    on_dt(x.dt, [&](auto t) {
        rope_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(AS(t, x), pos, n, n_head, hd, f, inverse);
    });
    launched(c, "rope");
}

static void cu_rope_qk(backend_t *be, bk_buf_t q, bk_buf_t k, const int32_t *pos, int64_t n, int n_head, int n_kv,
                       int hd, float theta, int inverse)
{
    cuda_t *c = enter(be);
    rope_freq_t f;
    if (n == 0 || hd < 2 || failed(c) || !dt_ok(c, "rope_qk", q.dt) || !dt_ok(c, "rope_qk", k.dt) ||
        !rope_freqs(c, "rope_qk", hd, theta, &f))
        return;
    on_dt(q.dt, [&](auto tq) {
        on_dt(k.dt, [&](auto tk) {
            rope_qk_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(AS(tq, q), AS(tk, k), pos, n, n_head,
                                                                              n_kv, hd, f, inverse);
        });
    });
    launched(c, "rope_qk");
}

/* q, k, v and the fused product qkv[n, Hq + 2·Hk] (backend.h qkv_rope): a thread per (token,
 * pair) as rope_qk_kernel, the same rotation (rope_cs, rope_to) between a source and a
 * destination, then the pair's elements of every v head copied. Threads of a row take
 * consecutive pairs: reads and writes are coalesced within each head. */

template <typename T>
__global__ void qkv_rope_kernel(T *qkv, T *q, T *k, T *v, const int32_t *pos, int64_t n, int n_head, int n_kv, int hd,
                                const rope_freq_t f, int inverse)
{
    int half = hd / 2;
    int64_t Hq = (int64_t)n_head * hd, Hk = (int64_t)n_kv * hd, W = Hq + 2 * Hk;
    GRID_STRIDE(e, n * half)
    {
        int j = (int)(e % half);
        int64_t i = e / half;
        float c, s;
        rope_cs(f.v[j], pos[i], inverse, &c, &s);
        T *row = qkv + i * W, *qi = q + i * Hq, *ki = k + i * Hk, *vi = v + i * Hk, *vr = row + Hq + Hk;
        for (int h = 0; h < n_head; h++)
            if (inverse)
                rope_to(row + h * hd, qi + h * hd, j, half, c, s);
            else
                rope_to(qi + h * hd, row + h * hd, j, half, c, s);
        for (int h = 0; h < n_kv; h++) {
            int64_t o = (int64_t)h * hd;
            if (inverse) {
                rope_to(row + Hq + o, ki + o, j, half, c, s);
                vr[o + j] = vi[o + j];
                vr[o + j + half] = vi[o + j + half];
            } else {
                rope_to(ki + o, row + Hq + o, j, half, c, s);
                vi[o + j] = vr[o + j];
                vi[o + j + half] = vr[o + j + half];
            }
        }
    }
}

static void cu_qkv_rope(backend_t *be, bk_buf_t qkv, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int32_t *pos, int64_t n,
                        int n_head, int n_kv, int hd, float theta, int inverse)
{
    cuda_t *c = enter(be);
    const char *op = "qkv_rope";
    rope_freq_t f;
    if (n == 0 || hd < 2 || failed(c) || !same_dt(c, op, qkv.dt, q.dt) || !same_dt(c, op, qkv.dt, k.dt) ||
        !same_dt(c, op, qkv.dt, v.dt) || !rope_freqs(c, op, hd, theta, &f))
        return;
    on_dt(qkv.dt, [&](auto t) {
        qkv_rope_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(AS(t, qkv), AS(t, q), AS(t, k), AS(t, v),
                                                                           pos, n, n_head, n_kv, hd, f, inverse);
    });
    launched(c, op);
}

/* ---- attention ---------------------------------------------------------------------------- */

/* A warp holds a row of hd ≤ 32·ATT_PER_LANE values, lane l owning l, l+32, … */
enum { ATT_PER_LANE = 8, ATT_WARPS = 4 };

template <typename T> __device__ void row_load(float *r, const T *src, int hd, int lane)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        r[t] = c < hd ? ld(src, c) : 0.0f;
    }
}

template <typename T> __device__ float row_dot(const float *r, const T *src, int hd, int lane)
{
    float s = 0;
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            s += r[t] * ld(src, c);
    }
    return warp_sum(s);
}

template <typename T> __device__ void row_axpy(float *acc, float a, const T *src, int hd, int lane)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            acc[t] += a * ld(src, c);
    }
}

template <typename T> __device__ void row_store(T *dst, const float *r, int hd, int lane, float scale)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            st(dst, c, r[t] * scale);
    }
}

/* One query row against keys k0 … k0+nk-1 (row stride ks), online softmax in fp32;
 * returns the log-sum-exp of the scaled scores and writes the output row. */
template <typename T>
__device__ float attend_warp(const T *q, const T *k, const T *v, int64_t nk, int64_t ks, int hd, float scale, T *o,
                             int lane)
{
    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
    row_load(qr, q, hd, lane);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        acc[t] = 0;
    float m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < nk; j++) {
        float s = row_dot(qr, k + j * ks, hd, lane) * scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn), p = expf(s - mn);
        sum = sum * corr + p;
#pragma unroll
        for (int t = 0; t < ATT_PER_LANE; t++)
            acc[t] *= corr;
        row_axpy(acc, p, v + j * ks, hd, lane);
        m = mn;
    }
    row_store(o, acc, hd, lane, 1.0f / sum);
    return m + logf(sum);
}

/* Training (seg != NULL): query i sees the keys of its segment up to itself, and its
 * log-sum-exp is kept. Decoding (seg == NULL, lse == NULL): query i sits at position
 * p0 + i of one cached sequence and sees keys 0 … p0 + i. */
template <typename T>
__global__ void attn_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, const int64_t *seg,
                                int64_t n_seg, int64_t p0, int64_t n, int n_head, int n_kv, int hd)
{
    int lane = threadIdx.x & 31;
    int64_t i = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    int h = blockIdx.y;
    if (i >= n)
        return;
    int64_t end, a = seg ? seg_start(seg, n_seg, i, &end) : 0, nk = seg ? i - a + 1 : p0 + i + 1;
    int kh = h / (n_head / n_kv);
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float l = attend_warp(q + i * qs + h * hd, k + a * ks + kh * hd, v + a * ks + kh * hd, nk, ks, hd,
                          1.0f / sqrtf((float)hd), out + i * qs + h * hd, lane);
    if (lse && lane == 0)
        lse[i * n_head + h] = l;
}

/* dq_i = scale·Σ_j ds_ij k_j with ds_ij = p_ij (dout_i·v_j − D_i), D_i = dout_i·out_i;
 * also keeps D_i for the key-side kernel. */
template <typename T>
__global__ void attn_bwd_dq_kernel(T *dq, float *dsum, const T *dout, const T *q, const T *k, const T *v,
                                   const T *out, const float *lse, const int64_t *seg, int64_t n_seg, int64_t n,
                                   int n_head, int n_kv, int hd)
{
    int lane = threadIdx.x & 31;
    int64_t i = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    int h = blockIdx.y;
    if (i >= n)
        return;
    int64_t end, a = seg_start(seg, n_seg, i, &end);
    int kh = h / (n_head / n_kv);
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float qr[ATT_PER_LANE], gr[ATT_PER_LANE], acc[ATT_PER_LANE];
    row_load(qr, q + i * qs + h * hd, hd, lane);
    row_load(gr, dout + i * qs + h * hd, hd, lane);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        acc[t] = 0;
    float D = row_dot(gr, out + i * qs + h * hd, hd, lane), l = lse[i * n_head + h];
    if (lane == 0)
        dsum[i * n_head + h] = D;
    for (int64_t j = a; j <= i; j++) {
        const T *kj = k + j * ks + kh * hd, *vj = v + j * ks + kh * hd;
        float p = expf(row_dot(qr, kj, hd, lane) * scale - l);
        float ds = p * (row_dot(gr, vj, hd, lane) - D);
        row_axpy(acc, ds * scale, kj, hd, lane);
    }
    row_store(dq + i * qs + h * hd, acc, hd, lane, 1.0f);
}

/* dk_j = scale·Σ_{h in group} Σ_{i >= j} ds_ij q_i, dv_j = Σ Σ p_ij dout_i. */
template <typename T>
__global__ void attn_bwd_dkv_kernel(T *dk, T *dv, const float *dsum, const T *dout, const T *q, const T *k,
                                    const T *v, const float *lse, const int64_t *seg, int64_t n_seg, int64_t n,
                                    int n_head, int n_kv, int hd)
{
    int lane = threadIdx.x & 31;
    int64_t j = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    int kh = blockIdx.y, group = n_head / n_kv;
    if (j >= n)
        return;
    int64_t end;
    seg_start(seg, n_seg, j, &end);
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float kr[ATT_PER_LANE], vr[ATT_PER_LANE], dka[ATT_PER_LANE], dva[ATT_PER_LANE];
    row_load(kr, k + j * ks + kh * hd, hd, lane);
    row_load(vr, v + j * ks + kh * hd, hd, lane);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        dka[t] = dva[t] = 0;
    for (int h = kh * group; h < (kh + 1) * group; h++)
        for (int64_t i = j; i < end; i++) {
            const T *qi = q + i * qs + h * hd, *gi = dout + i * qs + h * hd;
            float p = expf(row_dot(kr, qi, hd, lane) * scale - lse[i * n_head + h]);
            float ds = p * (row_dot(vr, gi, hd, lane) - dsum[i * n_head + h]);
            row_axpy(dva, p, gi, hd, lane);
            row_axpy(dka, ds * scale, qi, hd, lane);
        }
    row_store(dk + j * ks + kh * hd, dka, hd, lane, 1.0f);
    row_store(dv + j * ks + kh * hd, dva, hd, lane, 1.0f);
}

#include "flash_attn.cuh"
#include "mma_sync.cuh"
#include "flash_mma.cuh"
/* both kinds of tensor-core kernel are launched on the same grids */
static_assert(fm::BM == fa::BM && fm::BN == fa::BN, "flash_attn.cuh and flash_mma.cuh tiles");
/* flash_mma.cuh is built for Llama's head dimensions only (each one is 3 kernels × 3
 * targets of build time); the others take the WMMA kernels under FTK_CUDA_ATTN=mma too */
static constexpr bool fm_hd(int hd) { return hd == 64 || hd == 80 || hd == 96 || hd == 128; }

/* The tensor-core kernels (flash_attn.cuh's WMMA ones, or flash_mma.cuh's with
 * FTK_CUDA_ATTN=mma) take bf16 with a head dimension that is a multiple of 16 up to 128 and
 * rows on 16-byte boundaries; anything else, and FTK_CUDA_ATTN=simple, takes the
 * warp-per-row kernels above. */
static int flash_ok(cuda_t *c, dtype_t dt, int hd, std::initializer_list<const void *> bufs)
{
    if (c->attn == ATTN_SIMPLE || dt != DT_BF16 || hd % 16 || hd > 128)
        return 0;
    for (const void *p : bufs)
        if ((uintptr_t)p % 16)
            return 0;
    return 1;
}

/* Calls f with std::integral_constant<int, hd> (hd as checked by flash_ok). */
template <typename F> static void on_hd(int hd, F &&f)
{
    switch (hd) {
    case 16: f(std::integral_constant<int, 16>()); break;
    case 32: f(std::integral_constant<int, 32>()); break;
    case 48: f(std::integral_constant<int, 48>()); break;
    case 64: f(std::integral_constant<int, 64>()); break;
    case 80: f(std::integral_constant<int, 80>()); break;
    case 96: f(std::integral_constant<int, 96>()); break;
    case 112: f(std::integral_constant<int, 112>()); break;
    default: f(std::integral_constant<int, 128>()); break;
    }
}

/* A launch of kernel with more than the default 48 KiB of dynamic shared memory. */
template <typename K> static int smem_ok(cuda_t *c, K kernel, size_t bytes, const char *what)
{
    return ck(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), what) == 0;
}

static int attn_args_ok(cuda_t *c, const char *op, int hd, int n_head, int n_kv)
{
    if (hd > 32 * ATT_PER_LANE || hd % 2 || hd <= 0) {
        note_err(c, op, "head dimension over 256 or odd");
        return 0;
    }
    if (n_kv <= 0 || n_head % n_kv) {
        note_err(c, op, "query heads not a multiple of key/value heads");
        return 0;
    }
    return 1;
}

/* The segment list on the device; after scratch_claim. A model's layers all attend over
 * one micro-batch's segments, so a list equal to the last one is not uploaded again. */
static const int64_t *upload_seg(cuda_t *c, const int64_t *seg, int64_t n_seg)
{
    size_t bytes = (size_t)(n_seg + 1) * sizeof *seg;
    if (c->seg_n == n_seg && !memcmp(c->seg_host, seg, bytes))
        return c->seg;
    c->seg_n = -1;
    /* seg_host is the source of the last upload, which may not have run yet */
    if (ck(c, host_wait(c, NULL, c->seg_ev), "segments") < 0)
        return NULL;
    if (bytes > c->seg_host_cap) {
        cudaFreeHost(c->seg_host);
        c->seg_host = NULL;
        c->seg_host_cap = 0;
        if (ck(c, cudaMallocHost((void **)&c->seg_host, bytes), "segments (pinned host memory)") < 0)
            return NULL;
        c->seg_host_cap = bytes;
    }
    if (!scratch(c, (void **)&c->seg, &c->seg_cap, bytes, "attention segments"))
        return NULL;
    memcpy(c->seg_host, seg, bytes);
    if (ck(c, cudaMemcpyAsync(c->seg, c->seg_host, bytes, cudaMemcpyHostToDevice, c->cur), "segments") < 0 ||
        ck(c, cudaEventRecord(c->seg_ev, c->cur), "segments") < 0)
        return NULL;
    c->seg_n = n_seg;
    return c->seg;
}

static void cu_attn_fwd(backend_t *be, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v,
                        const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd)
{
    cuda_t *c = enter(be);
    int64_t n = seg[n_seg];
    if (n == 0 || failed(c) || !attn_args_ok(c, "attn_fwd", hd, n_head, n_kv) ||
        !same_dt(c, "attn_fwd", out.dt, q.dt) || !same_dt(c, "attn_fwd", k.dt, q.dt) ||
        !same_dt(c, "attn_fwd", v.dt, q.dt))
        return;
    scratch_claim(c);
    const int64_t *ds = upload_seg(c, seg, n_seg);
    if (!ds)
        return;
    float scale = 1.0f / sqrtf((float)hd);
    if (flash_ok(c, q.dt, hd, {out.p, q.p, k.p, v.p})) {
        dim3 grid((unsigned)((n + fa::BM - 1) / fa::BM), (unsigned)n_head);
        on_hd(hd, [&](auto HD) {
            if constexpr (fm_hd(HD)) if (c->attn == ATTN_MMA) {
                size_t sm = fm::lay<HD>::fwd;
                if (smem_ok(c, fm::fwd_kernel<HD>, sm, "attn_fwd (mma)"))
                    fm::fwd_kernel<HD><<<grid, fm::THREADS, sm, c->cur>>>((uint16_t *)out.p, lse, (uint16_t *)q.p,
                                                                          (uint16_t *)k.p, (uint16_t *)v.p, ds, n_seg,
                                                                          n, n_head, n_kv, scale);
                return;
            }
            size_t sm = fa::lay<HD>::fwd;
            if (smem_ok(c, fa::fwd_kernel<HD>, sm, "attn_fwd (flash)"))
                fa::fwd_kernel<HD><<<grid, fa::THREADS, sm, c->cur>>>((uint16_t *)out.p, lse, (uint16_t *)q.p,
                                                                      (uint16_t *)k.p, (uint16_t *)v.p, ds, n_seg, n,
                                                                      n_head, n_kv, scale);
        });
        launched(c, "attn_fwd (flash)");
        return;
    }
    dim3 grid((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    on_dt(q.dt, [&](auto t) {
        attn_fwd_kernel<<<grid, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, out), lse, AS(t, q), AS(t, k), AS(t, v), ds,
                                                             n_seg, 0, n, n_head, n_kv, hd);
    });
    launched(c, "attn_fwd");
}

static void cu_attn_bwd(backend_t *be, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k,
                        bk_buf_t v, bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head,
                        int n_kv, int hd)
{
    cuda_t *c = enter(be);
    int64_t n = seg[n_seg];
    const char *op = "attn_bwd";
    if (n == 0 || failed(c) || !attn_args_ok(c, op, hd, n_head, n_kv) || !same_dt(c, op, dq.dt, q.dt) ||
        !same_dt(c, op, dk.dt, q.dt) || !same_dt(c, op, dv.dt, q.dt) || !same_dt(c, op, dout.dt, q.dt) ||
        !same_dt(c, op, k.dt, q.dt) || !same_dt(c, op, v.dt, q.dt) || !same_dt(c, op, out.dt, q.dt))
        return;
    scratch_claim(c);
    const int64_t *ds = upload_seg(c, seg, n_seg);
    float *dsum = (float *)tmp_for(c, (size_t)n * n_head * sizeof(float));
    if (!ds || !dsum)
        return;
    if (flash_ok(c, q.dt, hd, {dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, out.p})) {
        float scale = 1.0f / sqrtf((float)hd);
        dim3 gq((unsigned)((n + fa::BM - 1) / fa::BM), (unsigned)n_head);
        dim3 gk((unsigned)((n + fa::BN - 1) / fa::BN), (unsigned)n_kv);
        const uint16_t *g = (const uint16_t *)dout.p, *qq = (const uint16_t *)q.p, *kk = (const uint16_t *)k.p,
                       *vv = (const uint16_t *)v.p;
        on_hd(hd, [&](auto HD) {
            size_t sm = fa::lay<HD>::bwd;
            fa::dsum_kernel<HD><<<blocks_for(n * n_head, 8), 256, 0, c->cur>>>(dsum, g, (const uint16_t *)out.p,
                                                                               n * n_head);
            launched(c, "attn_bwd D (flash)");
            if constexpr (fm_hd(HD)) if (c->attn == ATTN_MMA) {
                size_t sq = fm::lay<HD>::dq, skv = fm::lay<HD>::dkv;
                if (smem_ok(c, fm::dq_kernel<HD>, sq, "attn_bwd dq (mma)"))
                    fm::dq_kernel<HD><<<gq, fm::THREADS, sq, c->cur>>>((uint16_t *)dq.p, g, qq, kk, vv, lse, dsum,
                                                                       ds, n_seg, n, n_head, n_kv, scale);
                launched(c, "attn_bwd dq (mma)");
                if (smem_ok(c, fm::dkv_kernel<HD>, skv, "attn_bwd dk dv (mma)"))
                    fm::dkv_kernel<HD><<<gk, fm::THREADS, skv, c->cur>>>((uint16_t *)dk.p, (uint16_t *)dv.p, g, qq,
                                                                         kk, vv, lse, dsum, ds, n_seg, n, n_head,
                                                                         n_kv, scale);
                launched(c, "attn_bwd dk dv (mma)");
                return;
            }
            if (smem_ok(c, fa::dq_kernel<HD>, sm, "attn_bwd dq (flash)"))
                fa::dq_kernel<HD><<<gq, fa::THREADS, sm, c->cur>>>((uint16_t *)dq.p, g, qq, kk, vv, lse, dsum, ds,
                                                                   n_seg, n, n_head, n_kv, scale);
            launched(c, "attn_bwd dq (flash)");
            if (smem_ok(c, fa::dkv_kernel<HD>, sm, "attn_bwd dk dv (flash)"))
                fa::dkv_kernel<HD><<<gk, fa::THREADS, sm, c->cur>>>((uint16_t *)dk.p, (uint16_t *)dv.p, g, qq, kk,
                                                                    vv, lse, dsum, ds, n_seg, n, n_head, n_kv, scale);
            launched(c, "attn_bwd dk dv (flash)");
        });
        return;
    }
    dim3 gq((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    dim3 gk((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_kv);
    on_dt(q.dt, [&](auto t) {
        attn_bwd_dq_kernel<<<gq, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, dq), dsum, AS(t, dout), AS(t, q), AS(t, k),
                                                              AS(t, v), AS(t, out), lse, ds, n_seg, n, n_head, n_kv,
                                                              hd);
        launched(c, "attn_bwd dq");
        attn_bwd_dkv_kernel<<<gk, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, dk), AS(t, dv), dsum, AS(t, dout), AS(t, q),
                                                               AS(t, k), AS(t, v), lse, ds, n_seg, n, n_head, n_kv,
                                                               hd);
        launched(c, "attn_bwd dk dv");
    });
}

static void cu_attn_cached(backend_t *be, bk_buf_t out, bk_buf_t q, bk_buf_t kc, bk_buf_t vc, int64_t n, int64_t p0,
                           int n_head, int n_kv, int hd)
{
    cuda_t *c = enter(be);
    const char *op = "attn_cached";
    if (n == 0 || failed(c) || !attn_args_ok(c, op, hd, n_head, n_kv) || !same_dt(c, op, out.dt, q.dt) ||
        !same_dt(c, op, kc.dt, q.dt) || !same_dt(c, op, vc.dt, q.dt))
        return;
    dim3 grid((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    on_dt(q.dt, [&](auto t) {
        attn_fwd_kernel<<<grid, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, out), NULL, AS(t, q), AS(t, kc), AS(t, vc), NULL,
                                                             0, p0, n, n_head, n_kv, hd);
    });
    launched(c, op);
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */

/* The element arithmetic of swiglu and glu, shared: h = silu(g)·u and its derivatives. */
__device__ __forceinline__ float swiglu_h(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ void swiglu_d(float d, float g, float u, float *dg, float *du)
{
    float sg = 1.0f / (1.0f + expf(-g));
    *du = d * g * sg;
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
}

/* SwiGLU of elements i … i+K-1: gate at g_ + ig, up at u + iu, output at h + i. */
template <int K, typename T>
__device__ __forceinline__ void swiglu_fwd_at(T *h, const T *g_, const T *u, int64_t ig, int64_t iu, int64_t i)
{
    float a[K], b[K];
    ldk<K>(g_, ig, a);
    ldk<K>(u, iu, b);
    for (int k = 0; k < K; k++)
        a[k] = swiglu_h(a[k], b[k]);
    stk<K>(h, i, a);
}
template <int K, typename T>
__device__ __forceinline__ void swiglu_bwd_at(T *dg, T *du, const T *dh, const T *g_, const T *u, int64_t ig,
                                              int64_t iu, int64_t i)
{
    float a[K], b[K], d[K], x[K], y[K];
    ldk<K>(g_, ig, a);
    ldk<K>(u, iu, b);
    ldk<K>(dh, i, d);
    for (int k = 0; k < K; k++)
        swiglu_d(d[k], a[k], b[k], &x[k], &y[k]);
    stk<K>(du, iu, y);
    stk<K>(dg, ig, x);
}
template <int K, typename T> __device__ __forceinline__ void swiglu_fwd_el(T *h, const T *g_, const T *u, int64_t i)
{
    swiglu_fwd_at<K>(h, g_, u, i, i, i);
}
template <int K, typename T>
__device__ __forceinline__ void swiglu_bwd_el(T *dg, T *du, const T *dh, const T *g_, const T *u, int64_t i)
{
    swiglu_bwd_at<K>(dg, du, dh, g_, u, i, i, i);
}

template <typename T> __global__ void swiglu_fwd_kernel(T *h, const T *g_, const T *u, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, swiglu_fwd_el, h, g_, u);
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dg, T *du, const T *dh, const T *g_, const T *u, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, swiglu_bwd_el, dg, du, dh, g_, u);
}

static void cu_swiglu_fwd(backend_t *be, bk_buf_t h, bk_buf_t g_, bk_buf_t u, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !same_dt(c, "swiglu_fwd", h.dt, g_.dt) || !same_dt(c, "swiglu_fwd", u.dt, g_.dt))
        return;
    on_dt(h.dt, [&](auto t) {
        int v = vec_ok(c, {h.p, g_.p, u.p});
        swiglu_fwd_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(t, h), AS(t, g_), AS(t, u), n, v);
    });
    launched(c, "swiglu_fwd");
}

static void cu_swiglu_bwd(backend_t *be, bk_buf_t dg, bk_buf_t du, bk_buf_t dh, bk_buf_t g_, bk_buf_t u, int64_t n)
{
    cuda_t *c = enter(be);
    const char *op = "swiglu_bwd";
    if (n == 0 || failed(c) || !same_dt(c, op, dg.dt, g_.dt) || !same_dt(c, op, du.dt, g_.dt) ||
        !same_dt(c, op, dh.dt, g_.dt) || !same_dt(c, op, u.dt, g_.dt))
        return;
    on_dt(g_.dt, [&](auto t) {
        int v = vec_ok(c, {dg.p, du.p, dh.p, g_.p, u.p});
        swiglu_bwd_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(t, dg), AS(t, du), AS(t, dh), AS(t, g_),
                                                               AS(t, u), n, v);
    });
    launched(c, op);
}

/* SwiGLU on one [n, 2F] product (backend.h glu_fwd/bwd): swiglu's element functions, so the
 * bits of the swiglu sequence on the same device. Output element e = i·F + j reads gate
 * i·2F + j and up i·2F + F + j; a group of VEC outputs stays in one row when F is a
 * multiple of VEC (the only case given the 8-element path). */
template <int K, typename T> __device__ __forceinline__ void glu_fwd_el(T *h, const T *gu, int64_t F, int64_t e)
{
    int64_t g = e + e / F * F;
    swiglu_fwd_at<K>(h, gu, gu, g, g + F, e);
}
template <int K, typename T>
__device__ __forceinline__ void glu_bwd_el(T *dgu, const T *dh, const T *gu, int64_t F, int64_t e)
{
    int64_t g = e + e / F * F;
    swiglu_bwd_at<K>(dgu, dgu, dh, gu, gu, g, g + F, e);
}

template <typename T> __global__ void glu_fwd_kernel(T *h, const T *gu, int64_t n, int64_t F, int vec)
{
    ELEMENTWISE(n * F, vec, glu_fwd_el, h, gu, F);
}

template <typename T> __global__ void glu_bwd_kernel(T *dgu, const T *dh, const T *gu, int64_t n, int64_t F, int vec)
{
    ELEMENTWISE(n * F, vec, glu_bwd_el, dgu, dh, gu, F);
}

static void cu_glu_fwd(backend_t *be, bk_buf_t h, bk_buf_t gu, int64_t n, int64_t F)
{
    cuda_t *c = enter(be);
    if (n * F == 0 || failed(c) || !same_dt(c, "glu_fwd", h.dt, gu.dt))
        return;
    on_dt(h.dt, [&](auto t) {
        int v = F % VEC == 0 && vec_ok(c, {h.p, gu.p});
        glu_fwd_kernel<<<ew_blocks(n * F, v), 256, 0, c->cur>>>(AS(t, h), AS(t, gu), n, F, v);
    });
    launched(c, "glu_fwd");
}

static void cu_glu_bwd(backend_t *be, bk_buf_t dgu, bk_buf_t dh, bk_buf_t gu, int64_t n, int64_t F)
{
    cuda_t *c = enter(be);
    const char *op = "glu_bwd";
    if (n * F == 0 || failed(c) || !same_dt(c, op, dgu.dt, gu.dt) || !same_dt(c, op, dh.dt, gu.dt))
        return;
    on_dt(gu.dt, [&](auto t) {
        int v = F % VEC == 0 && vec_ok(c, {dgu.p, dh.p, gu.p});
        glu_bwd_kernel<<<ew_blocks(n * F, v), 256, 0, c->cur>>>(AS(t, dgu), AS(t, dh), AS(t, gu), n, F, v);
    });
    launched(c, op);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

/* A block per row, the CPU's arithmetic: max in float, Σexp in double. */
__global__ void xent_kernel(float *logits, double *row_loss, const int32_t *targets, const float *weights, int64_t V,
                            float grad_scale)
{
    __shared__ float shf[32];
    __shared__ double shd[32];
    int64_t i = blockIdx.x;
    float *x = logits + i * V;
    float w = weights[i];
    if (w == 0.0f) {
        if (threadIdx.x == 0)
            row_loss[i] = 0;
        if (grad_scale != 0.0f)
            for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
                x[j] = 0;
        return;
    }
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        m = fmaxf(m, x[j]);
    m = block_max(m, shf);
    double s = 0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        s += exp((double)(x[j] - m));
    s = block_sum(s, shd);
    double lse = m + log(s);
    int32_t t = targets[i];
    float xt = x[t];
    if (threadIdx.x == 0)
        row_loss[i] = (double)w * (lse - xt);
    if (grad_scale == 0.0f)
        return;
    __syncthreads(); /* every thread has read x[t] */
    float c = grad_scale * w;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        /* rounded as the CPU's two statements (a contracted FMA would round once) */
        x[j] = j == t ? __fsub_rn(__fmul_rn(c, (float)exp((double)x[j] - lse)), c)
                      : __fmul_rn(c, (float)exp((double)x[j] - lse));
}

/* *acc += Σ v[0 … n), the sum taken in order from 0 and then added, as the CPU does (one
 * thread: the loss of a chunk is a few thousand rows, a Σx² a few thousand blocks). */
__global__ void add_sum_in_order_kernel(double *acc, const double *v, int64_t n)
{
    double t = 0;
    for (int64_t i = 0; i < n; i++)
        t += v[i];
    *acc += t;
}

/* Adds the in-order sum of part[0 … n) to *acc on the current stream: nothing is brought
 * back, so the host does not wait (backend.h). */
static void add_parts(cuda_t *c, double *acc, const double *part, int64_t n, const char *what)
{
    add_sum_in_order_kernel<<<1, 1, 0, c->cur>>>(acc, part, n);
    launched(c, what);
}

static void cu_xent(backend_t *be, float *logits, const int32_t *targets, const float *weights, int64_t n, int64_t V,
                    float grad_scale, double *acc)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c))
        return;
    scratch_claim(c);
    double *part = (double *)tmp_for(c, (size_t)n * sizeof(double));
    if (!part)
        return;
    xent_kernel<<<(unsigned)n, 256, 0, c->cur>>>(logits, part, targets, weights, V, grad_scale);
    launched(c, "xent");
    add_parts(c, acc, part, n, "xent sum");
}

/* ---- vectors, the optimizer ---------------------------------------------------------------- */

template <int K, typename TY, typename TX> __device__ __forceinline__ void add_at(TY *y, const TX *x, int64_t i)
{
    float a[K], b[K];
    ldk<K>(y, i, a);
    ldk<K>(x, i, b);
    for (int k = 0; k < K; k++)
        a[k] = a[k] + b[k];
    stk<K>(y, i, a);
}
template <typename TY, typename TX> __global__ void add_kernel(TY *y, const TX *x, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, add_at, y, x);
}

/* Σx² in fixed blocks of SUMSQ_BLOCK elements (a thread block each), then in order. */
enum { SUMSQ_BLOCK = 65536 };
template <int K, typename T> __global__ void sumsq_part_kernel(double *part, const T *x, int64_t n)
{
    __shared__ double sh[32];
    int64_t a = (int64_t)blockIdx.x * SUMSQ_BLOCK, b = a + SUMSQ_BLOCK < n ? a + SUMSQ_BLOCK : n;
    double s = 0;
    /* K consecutive elements a thread (a is a multiple of VEC: whole groups from an aligned
     * x), the last partial group one by one */
    for (int64_t i = a + K * threadIdx.x; i < b; i += K * blockDim.x) {
        float v[K];
        int k1 = i + K <= b ? K : (int)(b - i);
        if (k1 == K)
            ldk<K>(x, i, v);
        else
            for (int k = 0; k < k1; k++)
                v[k] = ld(x, i + k);
        for (int k = 0; k < k1; k++)
            s += (double)v[k] * (double)v[k];
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

/* bk_adamw_t's values as the kernel uses them (fp32, derived on the host as the CPU does). */
typedef struct {
    float b1, b2, omb1, omb2, eps, decay, step, bc2s, gscale;
    int stochastic;
    uint64_t key;
    int64_t index0;
} adamw_args_t;

/* The AdamW store of state w (0 p, 1 m, 2 v) of element i. */
__device__ __forceinline__ void st_adamw(float *p, int64_t i, float x, const adamw_args_t &, int) { p[i] = x; }
__device__ __forceinline__ void st_adamw(uint16_t *p, int64_t i, float x, const adamw_args_t &a, int w)
{
    p[i] = a.stochastic ? bk_sround_bf16(x, bk_sround_bits(a.key, 3 * (a.index0 + i) + w)) : f32_to_bf16_dev(x);
}

/* The stores of K elements of state w from i (stk for a whole group: 16-byte accesses). */
template <int K>
__device__ __forceinline__ void stk_adamw(float *p, int64_t i, const float *x, const adamw_args_t &, int)
{
    stk<K>(p, i, x);
}
template <int K>
__device__ __forceinline__ void stk_adamw(uint16_t *p, int64_t i, const float *x, const adamw_args_t &a, int w)
{
    if (!a.stochastic) {
        stk<K>(p, i, x);
    } else if (K == VEC) {
        uint32_t q[4];
        for (int k = 0; k < 4; k++) {
            uint32_t lo = bk_sround_bf16(x[2 * k], bk_sround_bits(a.key, 3 * (a.index0 + i + 2 * k) + w));
            uint32_t hi = bk_sround_bf16(x[2 * k + 1], bk_sround_bits(a.key, 3 * (a.index0 + i + 2 * k + 1) + w));
            q[k] = lo | hi << 16;
        }
        *(uint4 *)(p + i) = make_uint4(q[0], q[1], q[2], q[3]);
    } else {
        for (int k = 0; k < K; k++)
            st_adamw(p, i + k, x[k], a, w);
    }
}

/* backend.h's formula operation by operation, rounded as written (no FMA contraction),
 * for elements i … i+K-1 (8 with 16-byte accesses, or 1): the one body of adamw_kernel
 * and adamw_multi_kernel. p's update reads the fp32 m and v before they are stored. */
template <int K, typename TP, typename TG>
__device__ __forceinline__ void adamw_at(TP *p, const TG *g_, TP *m, TP *v, const adamw_args_t &a, int64_t i)
{
    float P[K], G[K], M[K], W[K];
    ldk<K>(p, i, P);
    ldk<K>(g_, i, G);
    ldk<K>(m, i, M);
    ldk<K>(v, i, W);
    for (int k = 0; k < K; k++) {
        float gi = __fmul_rn(G[k], a.gscale);
        M[k] = __fadd_rn(__fmul_rn(a.b1, M[k]), __fmul_rn(a.omb1, gi));
        W[k] = __fadd_rn(__fmul_rn(a.b2, W[k]), __fmul_rn(__fmul_rn(a.omb2, gi), gi));
        float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(W[k]), a.bc2s), a.eps);
        P[k] = __fsub_rn(__fmul_rn(P[k], a.decay), __fdiv_rn(__fmul_rn(a.step, M[k]), den));
    }
    stk_adamw<K>(p, i, P, a, 0);
    stk_adamw<K>(m, i, M, a, 1);
    stk_adamw<K>(v, i, W, a, 2);
}

template <typename TP, typename TG>
__global__ void adamw_kernel(TP *p, const TG *g_, TP *m, TP *v, int64_t n, adamw_args_t a, int vec)
{
    ELEMENTWISE(n, vec, adamw_at, p, g_, m, v, a);
}

/* One segment of adamw_multi as the kernel reads it: the per-tensor arguments (decay
 * derived on the host as cu_adamw does) and the first thread block that works on it. */
typedef struct {
    void *p, *m, *v;
    const void *g;
    int64_t n, index0, block0;
    uint64_t key;
    float decay;
    int vec; /* p, m, v, g 16-byte aligned: 8 elements a thread */
} adamw_seg_dev_t;
enum { ADAMW_MULTI_CHUNK = 4096 }; /* elements per thread block */

/* Block b works on elements [(b − block0)·CHUNK, +CHUNK) of the segment whose block0 is the
 * largest not above b (a binary search of the table: block0 grows with the segment). */
template <typename TP, typename TG>
__global__ void adamw_multi_kernel(TP *, const TG *, const adamw_seg_dev_t *segs, int n_segs, adamw_args_t a)
{
    int64_t b = blockIdx.x;
    int lo = 0, hi = n_segs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (segs[mid].block0 <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const adamw_seg_dev_t &s = segs[lo];
    a.decay = s.decay;
    a.key = s.key;
    a.index0 = s.index0;
    int64_t i0 = (b - s.block0) * ADAMW_MULTI_CHUNK, i1 = i0 + ADAMW_MULTI_CHUNK < s.n ? i0 + ADAMW_MULTI_CHUNK : s.n;
    TP *p = (TP *)s.p, *m = (TP *)s.m, *v = (TP *)s.v;
    const TG *g_ = (const TG *)s.g;
    if (!s.vec) {
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
            adamw_at<1>(p, g_, m, v, a, i);
        return;
    }
    /* i0 is a multiple of CHUNK, so of VEC: whole groups from the aligned base, then the tail */
    for (int64_t i = i0 + VEC * (int64_t)threadIdx.x; i < i1; i += VEC * (int64_t)blockDim.x) {
        if (i + VEC <= i1)
            adamw_at<VEC>(p, g_, m, v, a, i);
        else
            for (int64_t j = i; j < i1; j++)
                adamw_at<1>(p, g_, m, v, a, j);
    }
}

static void cu_add(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "add", y.dt) || !dt_ok(c, "add", x.dt))
        return;
    on_dt(y.dt, [&](auto ty) {
        on_dt(x.dt, [&](auto tx) {
            int v = vec_ok(c, {y.p, x.p});
            add_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(ty, y), AS(tx, x), n, v);
        });
    });
    launched(c, "add");
}

static void cu_scale(backend_t *be, bk_buf_t y, float a, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "scale", y.dt))
        return;
    int v = vec_ok(c, {y.p});
    on_dt(y.dt, [&](auto t) { mul_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(t, y), a, n, v); });
    launched(c, "scale");
}

static void cu_sumsq(backend_t *be, bk_buf_t x, int64_t n, double *acc)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "sumsq", x.dt))
        return;
    int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    scratch_claim(c);
    double *part = (double *)tmp_for(c, (size_t)nb * sizeof(double));
    if (!part)
        return;
    on_dt(x.dt, [&](auto t) {
        on_vec(vec_ok(c, {x.p}), [&](auto K) {
            sumsq_part_kernel<decltype(K)::value><<<(unsigned)nb, 256, 0, c->cur>>>(part, AS(t, x), n);
        });
    });
    launched(c, "sumsq");
    add_parts(c, acc, part, nb, "sumsq sum");
}

static adamw_args_t adamw_args_of(const bk_adamw_t *h)
{
    adamw_args_t a;
    a.b1 = h->b1;
    a.b2 = h->b2;
    a.omb1 = 1.0f - h->b1;
    a.omb2 = 1.0f - h->b2;
    a.eps = h->eps;
    a.decay = 1.0f - h->lr * h->wd;
    a.step = (float)(h->lr / h->bc1);
    a.bc2s = (float)sqrt(h->bc2);
    a.gscale = h->gscale;
    a.stochastic = h->stochastic;
    a.key = h->key;
    a.index0 = h->index0;
    return a;
}

static void cu_adamw(backend_t *be, bk_buf_t p, bk_buf_t g_, bk_buf_t m, bk_buf_t v, int64_t n, const bk_adamw_t *h)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !same_dt(c, "adamw", m.dt, p.dt) || !same_dt(c, "adamw", v.dt, p.dt) ||
        !dt_ok(c, "adamw", g_.dt))
        return;
    adamw_args_t a = adamw_args_of(h);
    on_dt(p.dt, [&](auto tp) {
        on_dt(g_.dt, [&](auto tg) {
            int vec = vec_ok(c, {p.p, g_.p, m.p, v.p});
            adamw_kernel<<<ew_blocks(n, vec), 256, 0, c->cur>>>(AS(tp, p), AS(tg, g_), AS(tp, m), AS(tp, v), n, a,
                                                                vec);
        });
    });
    launched(c, "adamw");
}

/* One launch for every segment: the table goes up through pinned staging (upload_seg's
 * pattern: the host waits only for the previous table's copy) into tmp. */
static void cu_adamw_multi(backend_t *be, const bk_adamw_seg_t *segs, int n_segs, dtype_t sdt, dtype_t gdt,
                           const bk_adamw_t *h)
{
    cuda_t *c = enter(be);
    if (n_segs <= 0 || failed(c) || !dt_ok(c, "adamw_multi", sdt) || !dt_ok(c, "adamw_multi", gdt))
        return;
    size_t bytes = (size_t)n_segs * sizeof(adamw_seg_dev_t);
    if (ck(c, host_wait(c, NULL, c->am_ev), "adamw_multi table") < 0)
        return;
    if (bytes > c->am_host_cap) {
        cudaFreeHost(c->am_host);
        c->am_host = NULL;
        c->am_host_cap = 0;
        if (ck(c, cudaMallocHost(&c->am_host, bytes), "adamw_multi table (pinned host memory)") < 0)
            return;
        c->am_host_cap = bytes;
    }
    adamw_seg_dev_t *t = (adamw_seg_dev_t *)c->am_host;
    int k = 0;
    int64_t blocks = 0;
    for (int s = 0; s < n_segs; s++) {
        if (segs[s].n <= 0)
            continue; /* no blocks: block0 must grow strictly for the search */
        t[k].p = segs[s].p;
        t[k].m = segs[s].m;
        t[k].v = segs[s].v;
        t[k].g = segs[s].g;
        t[k].n = segs[s].n;
        t[k].index0 = segs[s].index0;
        t[k].block0 = blocks;
        t[k].key = segs[s].key;
        t[k].decay = 1.0f - h->lr * segs[s].wd; /* as adamw_args_of */
        t[k].vec = vec_ok(c, {segs[s].p, segs[s].m, segs[s].v, segs[s].g});
        blocks += (segs[s].n + ADAMW_MULTI_CHUNK - 1) / ADAMW_MULTI_CHUNK;
        k++;
    }
    if (k == 0)
        return;
    if (blocks > 0x7fffffff) {
        note_err(c, "adamw_multi", "more than 2^31 - 1 thread blocks");
        return;
    }
    scratch_claim(c);
    adamw_seg_dev_t *dt = (adamw_seg_dev_t *)tmp_for(c, (size_t)k * sizeof *t);
    if (!dt)
        return;
    if (ck(c, cudaMemcpyAsync(dt, t, (size_t)k * sizeof *t, cudaMemcpyHostToDevice, c->cur), "adamw_multi table") <
            0 ||
        ck(c, cudaEventRecord(c->am_ev, c->cur), "adamw_multi table") < 0)
        return;
    adamw_args_t a = adamw_args_of(h);
    on_dt(sdt, [&](auto tp) {
        on_dt(gdt, [&](auto tg) {
            adamw_multi_kernel<<<(unsigned)blocks, 256, 0, c->cur>>>(tp, tg, dt, k, a);
        });
    });
    launched(c, "adamw_multi");
}

/* ---- the instance ---------------------------------------------------------------------------- */

/* Frees what the instance made but memory: backend_free has already freed every live
 * bk_alloc() allocation, the workspace and scratch included (backend.h). Also after a
 * creation that stopped half-way. */
static void cu_destroy(backend_t *be)
{
    cuda_t *c = (cuda_t *)be->ctx;
    if (!c)
        return;
    enter(be);
    /* the streams' work may still use the plans */
    if (c->def)
        cudaStreamSynchronize(c->def);
    for (bk_stream *s = c->streams; s; s = s->next)
        cudaStreamSynchronize(s->s);
    for (int i = 0; i < c->n_plans; i++)
        plan_release(&c->plans[i]);
    if (c->seg_host)
        cudaFreeHost(c->seg_host);
    if (c->am_host)
        cudaFreeHost(c->am_host);
    for (int i = 0; i < UP_SLOTS; i++) {
        if (c->up[i].p)
            cudaFreeHost(c->up[i].p);
        if (c->up[i].ev)
            cudaEventDestroy(c->up[i].ev);
    }
    while (c->events) {
        bk_event *e = c->events;
        c->events = e->next;
        cudaEventDestroy(e->e);
        free(e);
    }
    while (c->streams) {
        bk_stream *s = c->streams;
        c->streams = s->next;
        cudaStreamDestroy(s->s);
        free(s);
    }
    if (c->scr_ev)
        cudaEventDestroy(c->scr_ev);
    if (c->seg_ev)
        cudaEventDestroy(c->seg_ev);
    if (c->am_ev)
        cudaEventDestroy(c->am_ev);
    if (c->def)
        cudaStreamDestroy(c->def);
    if (c->lt)
        cublasLtDestroy(c->lt);
    cudaGetLastError();
    free(c);
    be->ctx = NULL;
}

/* Fails the creation of be: the message survives backend_free. */
static backend_t *fail_new(backend_t *be, const char *msg)
{
    char m[512];
    snprintf(m, sizeof m, "%s", msg);
    backend_free(be);
    ftk_err_set("%s", m);
    return NULL;
}

extern "C" backend_t *backend_cuda_new(int device)
{
    const char *mm = getenv("FTK_CUDA_MATMUL");
    cublasComputeType_t f32_compute = CUBLAS_COMPUTE_32F_FAST_16BF;
    if (mm && !strcmp(mm, "fp32"))
        f32_compute = CUBLAS_COMPUTE_32F;
    else if (mm && !strcmp(mm, "tf32"))
        f32_compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    else if (mm && *mm) {
        ftk_err_set("FTK_CUDA_MATMUL=%s: expected fp32 or tf32", mm);
        return NULL;
    }
    const char *at = getenv("FTK_CUDA_ATTN");
    if (at && *at && strcmp(at, "flash") && strcmp(at, "mma") && strcmp(at, "simple")) {
        ftk_err_set("FTK_CUDA_ATTN=%s: expected flash, mma or simple", at);
        return NULL;
    }
    const char *vv = getenv("FTK_CUDA_VEC");
    if (vv && *vv && strcmp(vv, "0") && strcmp(vv, "1")) {
        ftk_err_set("FTK_CUDA_VEC=%s: expected 1 (8 elements a thread where aligned) or 0", vv);
        return NULL;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        ftk_err_set("no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return NULL;
    }
    if (device < 0 || device >= count) {
        ftk_err_set("CUDA device %d asked for, %d present", device, count);
        return NULL;
    }
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        cudaGetLastError();
        ftk_err_set("CUDA device %d: %s", device, cudaGetErrorString(e));
        return NULL;
    }
    char name[96];
    snprintf(name, sizeof name, "cuda:%d (%.72s)", device, prop.name);
    backend_t *be = bk_instance_new("cuda", name);
    if (!be)
        return NULL;
    cuda_t *c = (cuda_t *)calloc(1, sizeof *c);
    if (!c)
        return fail_new(be, "out of memory");
    be->ctx = c;
    c->be = be;
    c->device = device;
    c->seg_n = -1;
    c->f32_compute = f32_compute;
    c->attn = at && !strcmp(at, "simple") ? ATTN_SIMPLE : at && !strcmp(at, "mma") ? ATTN_MMA : ATTN_FLASH;
    c->vec = !(vv && !strcmp(vv, "0"));

    be->destroy = cu_destroy;
    be->mem_alloc = cu_mem_alloc;
    be->mem_free = cu_mem_free;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->zero = cu_zero;
    be->copy = cu_copy;
    be->sync = cu_sync;
    be->stream_new = cu_stream_new;
    be->stream_free = cu_stream_free;
    be->set_stream = cu_set_stream;
    be->stream_native = cu_stream_native;
    be->event_new = cu_event_new;
    be->event_free = cu_event_free;
    be->event_record = cu_event_record;
    be->event_wait = cu_event_wait;
    be->event_sync = cu_event_sync;
    be->timer_new = cu_timer_new;
    be->timer_elapsed = cu_timer_elapsed;
    be->convert = cu_convert;
    be->matmul = cu_matmul;
    be->embed_fwd = cu_embed_fwd;
    be->embed_bwd = cu_embed_bwd;
    be->rows_scatter = cu_rows_scatter;
    be->rmsnorm_fwd = cu_rmsnorm_fwd;
    be->rmsnorm_bwd = cu_rmsnorm_bwd;
    be->rope = cu_rope;
    be->attn_fwd = cu_attn_fwd;
    be->attn_bwd = cu_attn_bwd;
    be->attn_cached = cu_attn_cached;
    be->swiglu_fwd = cu_swiglu_fwd;
    be->swiglu_bwd = cu_swiglu_bwd;
    be->xent = cu_xent;
    be->add = cu_add;
    be->scale = cu_scale;
    be->sumsq = cu_sumsq;
    be->adamw = cu_adamw;
    be->rope_qk = cu_rope_qk;
    be->glu_fwd = cu_glu_fwd;
    be->glu_bwd = cu_glu_bwd;
    be->qkv_rope = cu_qkv_rope;
    be->add_rmsnorm_fwd = cu_add_rmsnorm_fwd;
    be->adamw_multi = cu_adamw_multi;

    char m[256];
    if ((e = cudaStreamCreateWithFlags(&c->def, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->scr_ev, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->seg_ev, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->am_ev, cudaEventDisableTiming)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(m, sizeof m, "CUDA device %d: %s", device, cudaGetErrorString(e));
        return fail_new(be, m);
    }
    c->cur = c->scr_owner = c->def;
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        c->lt = NULL;
        snprintf(m, sizeof m, "CUDA device %d: cuBLASLt could not start", device);
        return fail_new(be, m);
    }
    if (!(c->ws = bk_alloc(be, BK_CUDA_WORKSPACE_BYTES, BK_MEM_WORKSPACE, "cuBLASLt workspace")))
        return fail_new(be, ftk_err_msg());
    if (cu_sync(be) < 0) /* the workspace's zeroing, or anything else that failed */
        return fail_new(be, ftk_err_msg());
    if (bk_fused_select(be, 1) < 0) /* every fused op unless FTK_FUSED says otherwise */
        return fail_new(be, ftk_err_msg());
    return be;
}

extern "C" int backend_cuda_devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
