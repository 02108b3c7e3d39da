/* cuda_internal.cuh — what the CUDA backend's files (kernels/cuda, but device.cu) share:
 * the instance (cuda_t) and its error, stream and scratch helpers, the kernels' element
 * access, their 8-elements-a-thread machinery and block reductions, and the entry points
 * each op family defines for the op table in cuda.cu (the ops' declarations are made from
 * backend.h's op list, BK_OPS). The families:
 *   runtime.cu    memory, copies, streams, events, conversion; host_wait and the scratch
 *   matmul.cu     matrix products (cuBLASLt) and their plans
 *   embed.cu      the embedding and rows_scatter
 *   rmsnorm.cu    RMSNorm, the residual add fused with it
 *   rope.cu       rotary embedding, alone and fused with q/k (and the qkv product)
 *   attention.cu  the warp-per-row kernels, the tensor-core dispatch (flash_attn.cuh,
 *                 flash_mma.cuh) and the segment list
 *   attention_cudnn.cu  FTK_CUDA_ATTN=cudnn: cuDNN's fused attention, opened at run time
 *   swiglu.cu     SwiGLU and glu (SwiGLU on one [n, 2F] product)
 *   xent.cu       cross-entropy
 *   vectors.cu    add, scale, Σx², add with Σy², int8 codes in blocks, AdamW (one tensor, and many in one launch), and
 *                 add_parts (the fixed-tree sum of partial sums that xent and sumsq share)
 *   cuda.cu       the instance: creation, the op table, destruction
 * Each family is its own translation unit, built without relocatable device code (no
 * nvcc -rdc): everything defined here is inline, static inline or a template, so each unit
 * has its own copy; a host function several families call and too large to copy is
 * defined once, in the file named beside its declaration. The host emulation
 * (tests/gpu/emu) builds the same files as one unit, so a name is defined once across
 * them all. */
#pragma once

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
#include "../clip.h"
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
enum { ATTN_FLASH, ATTN_MMA, ATTN_SIMPLE, ATTN_CUDNN }; /* cuda_t.attn */
struct dnn_t; /* attention_cudnn.cu's state: cuDNN's handle, plans, sequence tables */

/* A pinned staging slot of cu_upload: its copy to the device is queued on the stream, and
 * ev, recorded after it, says when the slot may be written again. Both are made at the
 * slot's first use, p at the whole UP_STAGE: never freed or grown while the instance runs
 * (cudaFreeHost and cudaMallocHost wait for the device). */
typedef struct {
    void *p;
    cudaEvent_t ev;
} up_slot_t;
/* Uploads of up to UP_STAGE bytes go through UP_SLOTS slots in turn (a micro-batch uploads
 * five arrays: the host may run a micro-batch ahead); larger ones wait for the stream.
 * 8 MiB of pinned memory an instance once every slot is in use. */
enum { UP_SLOTS = 8, UP_STAGE = 1 << 20 };

typedef struct {
    backend_t *be;
    int device;
    cublasComputeType_t f32_compute; /* for fp32 operands (FTK_CUDA_MATMUL) */
    int attn;                        /* FTK_CUDA_ATTN: ATTN_FLASH (default), ATTN_MMA, ATTN_SIMPLE,
                                      * ATTN_CUDNN (ATTN_FLASH once cuDNN is given up) */
    dnn_t *dnn;                      /* with ATTN_CUDNN: cuDNN opened for this instance */
    int dnn_strict;                  /* FTK_CUDNN_STRICT=1 when dnn_open ran: a refusal is an error */
    int vec;                         /* elementwise kernels may take 8 elements a thread, sums of partial
                                      * sums by a tree, adamw_multi's block map (FTK_CUDA_VEC) */
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
     * rows, an overlapping copy's staging, embed_bwd's token order). tmp, seg and am_map
     * are allocated through bk_alloc: by cu_reserve for a training run's shapes before its
     * first step (the memory plan counts the same sizes, cuda_mem.h bk_cuda_scratch), else
     * when an op first needs them, and grown on demand past what was reserved. */
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
    /* sumsq's partial sums when it runs on a stream other than def (the sharding engine's
     * Σg² beside the backward pass, engine/shard.c): its own, so that it does not take the
     * shared scratch from the ops it overlaps; ordered by that stream alone */
    void *side_part;
    size_t side_part_cap;
    /* adamw_multi's segment table: built in pinned memory, copied into tmp on the stream;
     * am_ev follows that copy, so the host rewrites am_host only after it has run. */
    void *am_host;
    size_t am_host_cap;
    cudaEvent_t am_ev;
    /* adamw_multi's block map (thread block -> segment, one int32 a block), kept on the
     * device (a bk_alloc'd buffer, am_map_cap bytes) for the layout it was made for: the
     * kept segments' block counts, am_layout[0 … am_layout_n) (malloc'd). Rebuilt and
     * uploaded only when the layout changes (an engine's never does). */
    void *am_map;
    size_t am_map_cap;
    int64_t *am_layout;
    int am_layout_n;
    up_slot_t up[UP_SLOTS]; /* cu_upload's staging, used in turn from up_next */
    int up_next;
} cuda_t;

static inline int failed(cuda_t *c) { return c->err[0] != 0; }

static inline void note_err(cuda_t *c, const char *what, const char *detail)
{
    if (!failed(c))
        snprintf(c->err, sizeof c->err, "CUDA device %d: %s: %s", c->device, what, detail);
}

static inline int ck(cuda_t *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    note_err(c, what, cudaGetErrorString(e));
    return -1;
}

static inline int ck_lt(cuda_t *c, cublasStatus_t s, const char *what)
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
static inline cudaError_t last_error(void)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaErrorNotReady ? cudaSuccess : e;
}

static inline void launched(cuda_t *c, const char *kernel) { ck(c, last_error(), kernel); }

/* The host waits for stream s, or for event e when it is not NULL: blocking, or with a wait
 * hook (backend.h: a communication library's check for collectives that will never end)
 * polling, calling the hook between queries. */
cudaError_t host_wait(cuda_t *c, cudaStream_t s, cudaEvent_t e); /* runtime.cu */

/* The instance behind be, its device made current (another instance may have changed it). */
static inline cuda_t *enter(backend_t *be)
{
    cuda_t *c = (cuda_t *)be->ctx;
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess || d != c->device)
        ck(c, cudaSetDevice(c->device), "selecting the device");
    return c;
}

static inline int dt_ok(cuda_t *c, const char *op, dtype_t dt)
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
template <typename F> static inline void on_dt(dtype_t dt, F &&f)
{
    if (dt == DT_BF16)
        f((uint16_t *)NULL);
    else
        f((float *)NULL);
}
#define AS(tag, buf) ((decltype(tag))(buf).p)

/* Scratch is shared by the instance's streams: the stream about to use it waits (on the
 * device) for the one that used it last. */
void scratch_claim(cuda_t *c); /* runtime.cu */

/* Grows a scratch buffer to at least bytes; after scratch_claim (runtime.cu). */
void *scratch(cuda_t *c, void **p, size_t *cap, size_t bytes, const char *what);

static inline void *tmp_for(cuda_t *c, size_t bytes) { return scratch(c, &c->tmp, &c->tmp_cap, bytes, "CUDA scratch"); }

/* Blocks for a grid-stride loop over n elements. */
static inline unsigned blocks_for(int64_t n, int threads)
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

static __device__ inline float warp_max(float v)
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

static __device__ inline float block_max(float v, float *sh)
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

/* x as stored in a buffer of p's type (rounded to bf16 for uint16_t). */
__device__ __forceinline__ float as_stored(const float *, float x) { return x; }
__device__ __forceinline__ float as_stored(const uint16_t *, float x)
{
    return __uint_as_float((uint32_t)f32_to_bf16_dev(x) << 16);
}

/* ---- host helpers of several families ------------------------------------------------------ */

/* Whether an elementwise op may take its 8-element path (ELEMENTWISE): every operand 16-byte
 * aligned (a view into a buffer may not be), and not FTK_CUDA_VEC=0. */
static inline int vec_ok(const cuda_t *c, std::initializer_list<const void *> bufs)
{
    if (!c->vec)
        return 0;
    for (const void *p : bufs)
        if ((uintptr_t)p % 16)
            return 0;
    return 1;
}
/* Blocks for an elementwise op over n elements. */
static inline unsigned ew_blocks(int64_t n, int vec) { return blocks_for(vec ? (n + VEC - 1) / VEC : n, 256); }

/* Both dtypes taken, and the same (the error kept otherwise). */
static inline int same_dt(cuda_t *c, const char *op, dtype_t a, dtype_t b)
{
    if (!dt_ok(c, op, a) || !dt_ok(c, op, b))
        return 0;
    if (a != b) {
        note_err(c, op, "buffers of different dtypes");
        return 0;
    }
    return 1;
}

/* Calls f with std::integral_constant<int, K>, K = VEC when vec else 1: the elements a
 * thread takes at a time in a row reduction (RMSNorm, Σx²) as a template argument. */
template <typename F> static inline void on_vec(int vec, F &&f)
{
    if (vec)
        f(std::integral_constant<int, VEC>());
    else
        f(std::integral_constant<int, 1>());
}

/* ---- what each family defines ----------------------------------------------------------- */

/* The ops: cu_NAME for every op of backend.h's list (BK_OPS), each defined in its family's
 * file; cuda.cu fills the table from the same list. */
#define CU_OP(name, kind, params, args, cost) void cu_##name(backend_t *be, BK_UNPAREN params);
BK_OPS(CU_OP)
#undef CU_OP

/* runtime.cu: backend.h's memory, copy, stream and event entry points. */
int64_t cu_mem_avail(backend_t *be);
int64_t cu_mem_used(backend_t *be);
int cu_reserve(backend_t *be, const bk_reserve_t *r);
void *cu_mem_alloc(backend_t *be, size_t bytes);
void cu_mem_free(backend_t *be, void *p);
void *cu_host_alloc(backend_t *be, size_t bytes);
void cu_host_free(backend_t *be, void *p);
void cu_upload(backend_t *be, void *dst, const void *src, size_t bytes);
void cu_download_async(backend_t *be, void *dst, const void *src, size_t bytes);
void cu_download(backend_t *be, void *dst, const void *src, size_t bytes);
void cu_zero(backend_t *be, void *p, size_t bytes);
void cu_copy(backend_t *be, void *dst, const void *src, size_t bytes);
int cu_sync(backend_t *be);
bk_stream_t *cu_stream_new(backend_t *be);
void cu_stream_free(backend_t *be, bk_stream_t *s);
void cu_set_stream(backend_t *be, bk_stream_t *s);
void *cu_stream_native(backend_t *be, bk_stream_t *s);
bk_event_t *cu_event_new(backend_t *be);
bk_event_t *cu_timer_new(backend_t *be);
double cu_timer_elapsed(backend_t *be, bk_event_t *a, bk_event_t *b);
void cu_event_free(backend_t *be, bk_event_t *ev);
void cu_event_record(backend_t *be, bk_event_t *ev);
void cu_event_wait(backend_t *be, bk_event_t *ev);
int cu_event_sync(backend_t *be, bk_event_t *ev);
/* A device-to-device copy of bytes on the current stream; overlapping regions go through
 * scratch. what names the op in an error. */
void copy_bytes(cuda_t *c, void *dst, const void *src, size_t bytes, const char *what);

/* matmul.cu */
void plan_release(plan_t *p); /* frees a plan's descriptors (cuda.cu: at destruction) */

/* attention_cudnn.cu. dnn_open: at creation with ATTN_CUDNN, latches FTK_CUDNN_STRICT and
 * opens cuDNN, or says in one line why not and sets ATTN_FLASH (strict: an error kept in c);
 * dnn_close: at destruction. cu_attn_prepare: the backend's attn_prepare (backend.h), the
 * plans for the run's bound and their workspace. The ops: 0 when queued on cuDNN, 1 when
 * not taken (no cuDNN, not bf16, a view off 16 bytes, a plan cuDNN refuses: then ATTN_FLASH
 * and one line) and the caller's kernels run it, -1 after an error kept in c (strict: a
 * refusal). After scratch_claim. */
int cu_attn_prepare(backend_t *be, int64_t max_seg, int64_t max_len, int n_head, int n_kv, int hd, dtype_t dt);
void dnn_open(cuda_t *c);
void dnn_close(cuda_t *c);
int dnn_attn_fwd(cuda_t *c, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int64_t *seg,
                 int64_t n_seg, int n_head, int n_kv, int hd);
int dnn_attn_bwd(cuda_t *c, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k, bk_buf_t v,
                 bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd);

/* vectors.cu: adds the sum of part[0 … n) to *acc on the current stream: nothing is
 * brought back, so the host does not wait (backend.h). The sum is a fixed tree whose shape
 * depends on n alone, in order from 0 with FTK_CUDA_VEC=0: the same bits on every call. */
void add_parts(cuda_t *c, double *acc, const double *part, int64_t n, const char *what);
