/* cuda.cu — the CUDA backend (kernels/backend.h): every op on the GPU, fp32 storage,
 * matrix products on the tensor cores through cuBLASLt in bf16 with fp32 accumulation
 * (CUBLAS_COMPUTE_32F_FAST_16BF, or exact fp32 with FTK_CUDA_MATMUL=fp32 for checks).
 *
 * This is the first, plain version: it implements the interface the model is written
 * against and is meant to be checked op by op against the CPU reference on a GPU
 * (tests/gpu/test_ops.c). Storage in bf16 (the precision modes of DESIGN.md), fused
 * kernels and tensor-core attention come after it has been measured; see the README's
 * CUDA section for what has and has not been run.
 *
 * Design, kept the same as the CPU reference where that decides the result:
 *  - Determinism (backend.h): no atomics. Reductions over rows (RMSNorm's dw, the loss,
 *    Σx²) sum fixed partitions and then the partial sums in order; the embedding's
 *    backward gives each thread a column and walks the tokens in order, like the CPU.
 *  - Attention: one warp per (query row, head), keys visited in order with an online
 *    softmax, so no score matrix is materialised; the backward recomputes the
 *    probabilities from the saved log-sum-exp, one warp per query row for dq and one
 *    per key row for dk and dv (a key/value head sums its query heads in order).
 *  - All work goes to the legacy default stream, so uploads and downloads (synchronous
 *    cudaMemcpy) order themselves against the kernels without events.
 *  - Ops have no error path (backend.h): the first CUDA error is kept, later ops are
 *    skipped, and sync() reports it. Scratch buffers grow on demand.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../../libcommon/log.h"
#include "../backend.h"
}

/* ---- state and errors ------------------------------------------------------------------ */

static struct {
    int ready, device, exact;
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    char err[512]; /* first error, "" when none */
    /* scratch, grown on demand */
    int64_t *seg;
    size_t seg_cap;
    float *dsum; /* attention backward: dout·out per (row, head) */
    size_t dsum_cap;
    double *part; /* per-row or per-block partial sums */
    size_t part_cap;
    float *colpart; /* column partial sums (RMSNorm dw) */
    size_t colpart_cap;
} g;

static int failed(void) { return g.err[0] != 0; }

static void note_err(const char *what, const char *detail)
{
    if (!failed())
        snprintf(g.err, sizeof g.err, "CUDA: %s: %s", what, detail);
}

static int ck(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    note_err(what, cudaGetErrorString(e));
    return -1;
}

static int ck_lt(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    char b[64];
    snprintf(b, sizeof b, "cuBLAS status %d", (int)s);
    note_err(what, b);
    return -1;
}

static void launched(const char *kernel) { ck(cudaGetLastError(), kernel); }

/* Grows a device scratch buffer to at least bytes. */
static int grow(void **p, size_t *cap, size_t bytes, const char *what)
{
    if (bytes <= *cap)
        return 0;
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    if (ck(cudaMalloc(p, bytes), what) < 0)
        return -1;
    *cap = bytes;
    return 0;
}

/* Blocks for a grid-stride loop over n elements. */
static unsigned blocks_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535L * 16)
        b = 65535L * 16;
    return (unsigned)(b > 0 ? b : 1);
}

#define GRID_STRIDE(i, n)                                                                                            \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

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

/* ---- memory ------------------------------------------------------------------------------ */

static void *cu_alloc(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e == cudaSuccess)
        e = cudaMemset(p, 0, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        cudaFree(p);
        cudaGetLastError(); /* an allocation failure is reported here, not kept */
        ftk_err_set("CUDA: out of device memory (%zu bytes): %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cu_free(void *p) { cudaFree(p); }

static void cu_upload(void *dst, const void *src, size_t bytes)
{
    if (bytes && !failed())
        ck(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload");
}

static void cu_download(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    if (failed() || ck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download") < 0)
        memset(dst, 0xff, bytes); /* NaN where floats: a failed run cannot look healthy */
}

static void cu_zero(void *p, size_t bytes)
{
    if (bytes && !failed())
        ck(cudaMemsetAsync(p, 0, bytes, 0), "zero");
}

static void cu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && !failed() && dst != src)
        ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0), "copy");
}

static int cu_sync(void)
{
    if (!failed())
        ck(cudaDeviceSynchronize(), "synchronize");
    if (!failed())
        ck(cudaGetLastError(), "a kernel");
    if (failed()) {
        ftk_err_set("%s", g.err);
        return -1;
    }
    return 0;
}

/* ---- matrix products (cuBLASLt) --------------------------------------------------------- */

/* Row-major C[M,N] = op(A)·op(B) is column-major Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLAS gets B
 * as its first operand. A plan (descriptors and the heuristic's algorithm) is made once
 * per shape and kept; the model asks for a few dozen shapes. */
typedef struct {
    int ta, tb, beta0;
    uint32_t align; /* the pointers' common alignment: the algorithm may rely on it */
    int64_t M, N, K;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan_t;

enum { MAX_PLANS = 256 };
static plan_t plans[MAX_PLANS];
static int n_plans;

/* Model tensors sit at offsets inside unit vectors, so pointers are not all 256-byte
 * aligned (cuBLASLt's default assumption): the heuristic is told the real alignment. */
static uint32_t align_of(const void *a, const void *b, const void *c)
{
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    uint32_t al = 256;
    while (al > 4 && (x & (al - 1)))
        al >>= 1;
    return al;
}

static plan_t *plan_for(int ta, int tb, int64_t M, int64_t N, int64_t K, int beta0, uint32_t align)
{
    for (int i = 0; i < n_plans; i++) {
        plan_t *p = &plans[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->beta0 == beta0 &&
            p->align == align)
            return p;
    }
    static int evict;
    plan_t *p = &plans[n_plans < MAX_PLANS ? n_plans : evict];
    if (n_plans == MAX_PLANS) { /* more shapes than a model uses: replace the oldest */
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->lc);
        cublasLtMatmulDescDestroy(p->op);
        evict = (evict + 1) % MAX_PLANS;
        n_plans--;
    }
    memset(p, 0, sizeof *p);
    p->ta = ta;
    p->tb = tb;
    p->M = M;
    p->N = N;
    p->K = K;
    p->beta0 = beta0;
    p->align = align;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t ct = g.exact ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
    if (ck_lt(cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F), "matmul descriptor") < 0 ||
        ck_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA") < 0 ||
        ck_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB") < 0 ||
        /* first operand: B, stored [N,K] when tb (ld K) else [K,N] (ld N), column-major view */
        ck_lt(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_32F, tb ? K : N, tb ? N : K, tb ? K : N), "layout B") < 0 ||
        ck_lt(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_32F, ta ? M : K, ta ? K : M, ta ? M : K), "layout A") < 0 ||
        ck_lt(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, N, M, N), "layout C") < 0)
        return NULL;
    cublasLtMatmulPreference_t pref;
    if (ck_lt(cublasLtMatmulPreferenceCreate(&pref), "preference") < 0)
        return NULL;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g.ws_bytes,
                                         sizeof g.ws_bytes);
    const cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublasLtMatmulPreferenceSetAttribute(pref, al[i], &align, sizeof align);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g.lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (ck_lt(s, "algorithm heuristic") < 0)
        return NULL;
    if (!found) {
        note_err("matmul", "cuBLASLt has no algorithm for this shape");
        return NULL;
    }
    p->algo = h.algo;
    n_plans++;
    return p;
}

__global__ void scale_kernel(float *y, float a, int64_t n)
{
    GRID_STRIDE(i, n) y[i] = a == 0.0f ? 0.0f : y[i] * a;
}

static void cu_matmul(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B,
                      float beta, float *C)
{
    if (M == 0 || N == 0 || failed())
        return;
    if (K == 0) { /* cuBLASLt wants k >= 1; C = beta·C */
        scale_kernel<<<blocks_for(M * N, 256), 256>>>(C, beta, M * N);
        launched("scale");
        return;
    }
    plan_t *p = plan_for(ta, tb, M, N, K, beta == 0.0f, align_of(A, B, C));
    if (!p)
        return;
    ck_lt(cublasLtMatmul(g.lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc, &p->algo, g.ws,
                         g.ws_bytes, 0),
          "matmul");
}

/* ---- embedding, rows ---------------------------------------------------------------------- */

__global__ void embed_fwd_kernel(float *out, const int32_t *ids, const float *table, int64_t n, int64_t d)
{
    GRID_STRIDE(e, n * d)
    {
        int64_t i = e / d, j = e - i * d;
        out[e] = table[(int64_t)ids[i] * d + j];
    }
}

/* A thread per column, tokens in order: repeated ids add in the CPU's order. */
__global__ void embed_bwd_kernel(float *dtable, const int32_t *ids, const float *dout, int64_t n, int64_t d)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d)
        return;
    for (int64_t i = 0; i < n; i++)
        dtable[(int64_t)ids[i] * d + j] += dout[i * d + j];
}

__global__ void rows_scatter_kernel(float *dst, const int32_t *idx, const float *src, int64_t n, int64_t d)
{
    GRID_STRIDE(e, n * d)
    {
        int64_t i = e / d, j = e - i * d;
        dst[(int64_t)idx[i] * d + j] = src[e];
    }
}

static void cu_embed_fwd(float *out, const int32_t *ids, const float *table, int64_t n, int64_t d)
{
    if (n * d == 0 || failed())
        return;
    embed_fwd_kernel<<<blocks_for(n * d, 256), 256>>>(out, ids, table, n, d);
    launched("embed_fwd");
}

static void cu_embed_bwd(float *dtable, const int32_t *ids, const float *dout, int64_t n, int64_t d)
{
    if (n * d == 0 || failed())
        return;
    embed_bwd_kernel<<<(unsigned)((d + 127) / 128), 128>>>(dtable, ids, dout, n, d);
    launched("embed_bwd");
}

static void cu_rows_scatter(float *dst, const int32_t *idx, const float *src, int64_t n, int64_t d)
{
    if (n * d == 0 || failed())
        return;
    rows_scatter_kernel<<<blocks_for(n * d, 256), 256>>>(dst, idx, src, n, d);
    launched("rows_scatter");
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

__global__ void rmsnorm_fwd_kernel(float *out, float *rstd, const float *x, const float *w, int64_t d, float eps)
{
    __shared__ float sh[32];
    int64_t i = blockIdx.x;
    const float *xi = x + i * d;
    float s = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        s += xi[j] * xi[j];
    s = block_sum(s, sh);
    float r = 1.0f / sqrtf(s / (float)d + eps);
    if (threadIdx.x == 0)
        rstd[i] = r;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        out[i * d + j] = (xi[j] * r) * w[j];
}

/* dx = r·(dy·w) − r³/d · x · Σ(dy·w·x), added. */
__global__ void rmsnorm_bwd_dx_kernel(float *dx, const float *dout, const float *x, const float *w,
                                      const float *rstd, int64_t d)
{
    __shared__ float sh[32];
    int64_t i = blockIdx.x;
    const float *xi = x + i * d, *gi = dout + i * d;
    float s = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        s += gi[j] * w[j] * xi[j];
    s = block_sum(s, sh);
    float r = rstd[i], c = s * r * r * r / (float)d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        dx[i * d + j] += r * gi[j] * w[j] - c * xi[j];
}

/* dw = Σ_i dy·x·r: rows cut into fixed chunks (blockIdx.y), a thread per column, then
 * the chunks summed in order. */
enum { COL_CHUNKS = 64 };

__global__ void rmsnorm_bwd_dw_part_kernel(float *part, const float *dout, const float *x, const float *rstd,
                                           int64_t n, int64_t d)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d)
        return;
    int64_t per = (n + COL_CHUNKS - 1) / COL_CHUNKS, a = blockIdx.y * per, b = a + per < n ? a + per : n;
    float acc = 0;
    for (int64_t i = a; i < b; i++)
        acc += dout[i * d + j] * x[i * d + j] * rstd[i];
    part[(int64_t)blockIdx.y * d + j] = acc;
}

__global__ void colsum_add_kernel(float *dw, const float *part, int64_t d)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d)
        return;
    float acc = 0;
    for (int c = 0; c < COL_CHUNKS; c++)
        acc += part[(int64_t)c * d + j];
    dw[j] += acc;
}

static void cu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps)
{
    if (n == 0 || failed())
        return;
    rmsnorm_fwd_kernel<<<(unsigned)n, 256>>>(out, rstd, x, w, d, eps);
    launched("rmsnorm_fwd");
}

static void cu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                           const float *rstd, int64_t n, int64_t d)
{
    if (n == 0 || failed())
        return;
    rmsnorm_bwd_dx_kernel<<<(unsigned)n, 256>>>(dx, dout, x, w, rstd, d);
    launched("rmsnorm_bwd");
    if (grow((void **)&g.colpart, &g.colpart_cap, (size_t)COL_CHUNKS * d * sizeof(float), "scratch") < 0)
        return;
    dim3 grid((unsigned)((d + 127) / 128), COL_CHUNKS);
    rmsnorm_bwd_dw_part_kernel<<<grid, 128>>>(g.colpart, dout, x, rstd, n, d);
    launched("rmsnorm_bwd dw");
    colsum_add_kernel<<<(unsigned)((d + 127) / 128), 128>>>(dw, g.colpart, d);
    launched("rmsnorm_bwd dw sum");
}

/* ---- rotary embedding --------------------------------------------------------------------- */

/* HF: inv_freq_j = 1 / theta^(2j/hd) in float32, angle = pos·inv_freq in float32. */
__global__ void rope_kernel(float *x, const int32_t *pos, int64_t n, int n_head, int hd, float theta, int inverse)
{
    int half = hd / 2;
    GRID_STRIDE(e, n * n_head * half)
    {
        int j = (int)(e % half);
        int64_t ih = e / half, i = ih / n_head;
        float inv = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
        float a = (float)pos[i] * inv;
        float c = cosf(a), s = inverse ? -sinf(a) : sinf(a);
        float *v = x + ih * hd;
        float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * c - x2 * s;
        v[j + half] = x2 * c + x1 * s;
    }
}

static void cu_rope(float *x, const int32_t *pos, int64_t n, int n_head, int hd, float theta, int inverse)
{
    if (n == 0 || failed())
        return;
    rope_kernel<<<blocks_for(n * n_head * (hd / 2), 256), 256>>>(x, pos, n, n_head, hd, theta, inverse);
    launched("rope");
}

/* ---- attention ---------------------------------------------------------------------------- */

/* A warp holds a row of hd ≤ 32·ATT_PER_LANE values, lane l owning l, l+32, … */
enum { ATT_PER_LANE = 8, ATT_WARPS = 4 };

__device__ void row_load(float *r, const float *src, int hd, int lane, float scale)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        r[t] = c < hd ? src[c] * scale : 0.0f;
    }
}

__device__ float row_dot(const float *r, const float *src, int hd, int lane)
{
    float s = 0;
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            s += r[t] * src[c];
    }
    return warp_sum(s);
}

__device__ void row_axpy(float *acc, float a, const float *src, int hd, int lane)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            acc[t] += a * src[c];
    }
}

__device__ void row_store(float *dst, const float *r, int hd, int lane, float scale)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            dst[c] = r[t] * scale;
    }
}

/* The segment holding token i: the last s with seg[s] <= i. */
__device__ int64_t seg_start(const int64_t *seg, int64_t n_seg, int64_t i, int64_t *end)
{
    int64_t lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (seg[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    *end = seg[lo + 1];
    return seg[lo];
}

/* One query row against keys k0 … k0+nk-1 (row stride ks), online softmax; returns the
 * log-sum-exp of the scaled scores and writes the output row. */
__device__ float attend_warp(const float *q, const float *k, const float *v, int64_t nk, int64_t ks, int hd,
                             float scale, float *o, int lane)
{
    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
    row_load(qr, q, hd, lane, 1.0f);
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
__global__ void attn_fwd_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                                const int64_t *seg, int64_t n_seg, int64_t p0, int64_t n, int n_head, int n_kv,
                                int hd)
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
__global__ void attn_bwd_dq_kernel(float *dq, float *dsum, const float *dout, const float *q, const float *k,
                                   const float *v, const float *out, const float *lse, const int64_t *seg,
                                   int64_t n_seg, int64_t n, int n_head, int n_kv, int hd)
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
    row_load(qr, q + i * qs + h * hd, hd, lane, 1.0f);
    row_load(gr, dout + i * qs + h * hd, hd, lane, 1.0f);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        acc[t] = 0;
    float D = row_dot(gr, out + i * qs + h * hd, hd, lane), l = lse[i * n_head + h];
    if (lane == 0)
        dsum[i * n_head + h] = D;
    for (int64_t j = a; j <= i; j++) {
        const float *kj = k + j * ks + kh * hd, *vj = v + j * ks + kh * hd;
        float p = expf(row_dot(qr, kj, hd, lane) * scale - l);
        float ds = p * (row_dot(gr, vj, hd, lane) - D);
        row_axpy(acc, ds * scale, kj, hd, lane);
    }
    row_store(dq + i * qs + h * hd, acc, hd, lane, 1.0f);
}

/* dk_j = scale·Σ_{h in group} Σ_{i >= j} ds_ij q_i, dv_j = Σ Σ p_ij dout_i. */
__global__ void attn_bwd_dkv_kernel(float *dk, float *dv, const float *dsum, const float *dout, const float *q,
                                    const float *k, const float *v, const float *lse, const int64_t *seg,
                                    int64_t n_seg, int64_t n, int n_head, int n_kv, int hd)
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
    row_load(kr, k + j * ks + kh * hd, hd, lane, 1.0f);
    row_load(vr, v + j * ks + kh * hd, hd, lane, 1.0f);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        dka[t] = dva[t] = 0;
    for (int h = kh * group; h < (kh + 1) * group; h++)
        for (int64_t i = j; i < end; i++) {
            const float *qi = q + i * qs + h * hd, *gi = dout + i * qs + h * hd;
            float p = expf(row_dot(kr, qi, hd, lane) * scale - lse[i * n_head + h]);
            float ds = p * (row_dot(vr, gi, hd, lane) - dsum[i * n_head + h]);
            row_axpy(dva, p, gi, hd, lane);
            row_axpy(dka, ds * scale, qi, hd, lane);
        }
    row_store(dk + j * ks + kh * hd, dka, hd, lane, 1.0f);
    row_store(dv + j * ks + kh * hd, dva, hd, lane, 1.0f);
}

static int attn_args_ok(int hd)
{
    if (hd > 32 * ATT_PER_LANE || hd % 2) {
        note_err("attention", "head dimension over 256 or odd");
        return 0;
    }
    return 1;
}

static const int64_t *upload_seg(const int64_t *seg, int64_t n_seg)
{
    size_t bytes = (size_t)(n_seg + 1) * sizeof *seg;
    if (grow((void **)&g.seg, &g.seg_cap, bytes, "scratch") < 0 ||
        ck(cudaMemcpy(g.seg, seg, bytes, cudaMemcpyHostToDevice), "segments") < 0)
        return NULL;
    return g.seg;
}

static void cu_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const int64_t *seg,
                        int64_t n_seg, int n_head, int n_kv, int hd)
{
    int64_t n = seg[n_seg];
    if (n == 0 || failed() || !attn_args_ok(hd))
        return;
    const int64_t *ds = upload_seg(seg, n_seg);
    if (!ds)
        return;
    dim3 grid((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    attn_fwd_kernel<<<grid, 32 * ATT_WARPS>>>(out, lse, q, k, v, ds, n_seg, 0, n, n_head, n_kv, hd);
    launched("attn_fwd");
}

static void cu_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                        const float *v, const float *out, const float *lse, const int64_t *seg, int64_t n_seg,
                        int n_head, int n_kv, int hd)
{
    int64_t n = seg[n_seg];
    if (n == 0 || failed() || !attn_args_ok(hd))
        return;
    const int64_t *ds = upload_seg(seg, n_seg);
    if (!ds || grow((void **)&g.dsum, &g.dsum_cap, (size_t)n * n_head * sizeof(float), "scratch") < 0)
        return;
    dim3 gq((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    attn_bwd_dq_kernel<<<gq, 32 * ATT_WARPS>>>(dq, g.dsum, dout, q, k, v, out, lse, ds, n_seg, n, n_head, n_kv, hd);
    launched("attn_bwd dq");
    dim3 gk((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_kv);
    attn_bwd_dkv_kernel<<<gk, 32 * ATT_WARPS>>>(dk, dv, g.dsum, dout, q, k, v, lse, ds, n_seg, n, n_head, n_kv, hd);
    launched("attn_bwd dk dv");
}

static void cu_attn_cached(float *out, const float *q, const float *kc, const float *vc, int64_t n, int64_t p0,
                           int n_head, int n_kv, int hd)
{
    if (n == 0 || failed() || !attn_args_ok(hd))
        return;
    dim3 grid((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    attn_fwd_kernel<<<grid, 32 * ATT_WARPS>>>(out, NULL, q, kc, vc, NULL, 0, p0, n, n_head, n_kv, hd);
    launched("attn_cached");
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */

__global__ void swiglu_fwd_kernel(float *h, const float *g_, const float *u, int64_t n)
{
    GRID_STRIDE(i, n) h[i] = g_[i] / (1.0f + expf(-g_[i])) * u[i];
}

__global__ void swiglu_bwd_kernel(float *dg, float *du, const float *dh, const float *g_, const float *u, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        float sg = 1.0f / (1.0f + expf(-g_[i]));
        float d = dh[i], gi = g_[i];
        du[i] = d * gi * sg;
        dg[i] = d * u[i] * sg * (1.0f + gi * (1.0f - sg));
    }
}

static void cu_swiglu_fwd(float *h, const float *g_, const float *u, int64_t n)
{
    if (n == 0 || failed())
        return;
    swiglu_fwd_kernel<<<blocks_for(n, 256), 256>>>(h, g_, u, n);
    launched("swiglu_fwd");
}

static void cu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g_, const float *u, int64_t n)
{
    if (n == 0 || failed())
        return;
    swiglu_bwd_kernel<<<blocks_for(n, 256), 256>>>(dg, du, dh, g_, u, n);
    launched("swiglu_bwd");
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
        x[j] = c * (float)exp((double)x[j] - lse) - (j == t ? c : 0.0f);
}

/* Σ of n doubles in order (one thread: the loss of a chunk is a few thousand rows). */
__global__ void sum_in_order_kernel(double *out, const double *v, int64_t n)
{
    double t = 0;
    for (int64_t i = 0; i < n; i++)
        t += v[i];
    *out = t;
}

/* Σ of g.part[1 … n] in order, on the device, brought back; NaN after an error. */
static double sum_parts(int64_t n, const char *what)
{
    sum_in_order_kernel<<<1, 1>>>(g.part, g.part + 1, n);
    launched(what);
    double total = NAN;
    if (!failed())
        ck(cudaMemcpy(&total, g.part, sizeof total, cudaMemcpyDeviceToHost), what);
    return failed() ? NAN : total;
}

static double cu_xent(float *logits, const int32_t *targets, const float *weights, int64_t n, int64_t V,
                      float grad_scale)
{
    if (n == 0 || failed())
        return failed() ? NAN : 0.0;
    if (grow((void **)&g.part, &g.part_cap, (size_t)(n + 1) * sizeof(double), "scratch") < 0)
        return NAN;
    xent_kernel<<<(unsigned)n, 256>>>(logits, g.part + 1, targets, weights, V, grad_scale);
    launched("xent");
    return sum_parts(n, "xent sum");
}

/* ---- vectors, the optimizer ---------------------------------------------------------------- */

__global__ void add_kernel(float *y, const float *x, int64_t n) { GRID_STRIDE(i, n) y[i] += x[i]; }
__global__ void mul_kernel(float *y, float a, int64_t n) { GRID_STRIDE(i, n) y[i] *= a; }

/* Σx² in fixed blocks of SUMSQ_BLOCK elements (a thread block each), then in order. */
enum { SUMSQ_BLOCK = 65536 };
__global__ void sumsq_part_kernel(double *part, const float *x, int64_t n)
{
    __shared__ double sh[32];
    int64_t a = (int64_t)blockIdx.x * SUMSQ_BLOCK, b = a + SUMSQ_BLOCK < n ? a + SUMSQ_BLOCK : n;
    double s = 0;
    for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

__global__ void adamw_kernel(float *p, const float *g_, float *m, float *v, int64_t n, float b1, float b2, float eps,
                             float decay, float step, float bc2s)
{
    GRID_STRIDE(i, n)
    {
        float gi = g_[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) / bc2s + eps);
    }
}

static void cu_add(float *y, const float *x, int64_t n)
{
    if (n == 0 || failed())
        return;
    add_kernel<<<blocks_for(n, 256), 256>>>(y, x, n);
    launched("add");
}

static void cu_scale(float *y, float a, int64_t n)
{
    if (n == 0 || failed())
        return;
    mul_kernel<<<blocks_for(n, 256), 256>>>(y, a, n);
    launched("scale");
}

static double cu_sumsq(const float *x, int64_t n)
{
    if (n == 0 || failed())
        return failed() ? NAN : 0.0;
    int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    if (grow((void **)&g.part, &g.part_cap, (size_t)(nb + 1) * sizeof(double), "scratch") < 0)
        return NAN;
    sumsq_part_kernel<<<(unsigned)nb, 256>>>(g.part + 1, x, n);
    launched("sumsq");
    return sum_parts(nb, "sumsq sum");
}

static void cu_adamw(float *p, const float *g_, float *m, float *v, int64_t n, float lr, float b1, float b2, float eps,
                     float wd, double bc1, double bc2)
{
    if (n == 0 || failed())
        return;
    float decay = 1.0f - lr * wd, step = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
    adamw_kernel<<<blocks_for(n, 256), 256>>>(p, g_, m, v, n, b1, b2, eps, decay, step, bc2s);
    launched("adamw");
}

/* ---- the table ------------------------------------------------------------------------------ */

static backend_t cuda_backend;

static int init(int device)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        ftk_err_set("no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return -1;
    }
    if (device < 0 || device >= count) {
        ftk_err_set("CUDA device %d asked for, %d present", device, count);
        return -1;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        ftk_err_set("CUDA device %d: %s", device, cudaGetErrorString(e));
        return -1;
    }
    const char *mm = getenv("FTK_CUDA_MATMUL");
    g.exact = mm && !strcmp(mm, "fp32");
    g.ws_bytes = (size_t)32 << 20;
    if (cublasLtCreate(&g.lt) != CUBLAS_STATUS_SUCCESS) {
        ftk_err_set("CUDA device %d: cuBLASLt could not start", device);
        return -1;
    }
    if ((e = cudaMalloc(&g.ws, g.ws_bytes)) != cudaSuccess) {
        ftk_err_set("CUDA device %d: workspace: %s", device, cudaGetErrorString(e));
        return -1;
    }
    memset(&cuda_backend, 0, sizeof cuda_backend);
    cuda_backend.name = "cuda";
    cuda_backend.alloc = cu_alloc;
    cuda_backend.free = cu_free;
    cuda_backend.upload = cu_upload;
    cuda_backend.download = cu_download;
    cuda_backend.zero = cu_zero;
    cuda_backend.copy = cu_copy;
    cuda_backend.sync = cu_sync;
    cuda_backend.matmul = cu_matmul;
    cuda_backend.embed_fwd = cu_embed_fwd;
    cuda_backend.embed_bwd = cu_embed_bwd;
    cuda_backend.rows_scatter = cu_rows_scatter;
    cuda_backend.rmsnorm_fwd = cu_rmsnorm_fwd;
    cuda_backend.rmsnorm_bwd = cu_rmsnorm_bwd;
    cuda_backend.rope = cu_rope;
    cuda_backend.attn_fwd = cu_attn_fwd;
    cuda_backend.attn_bwd = cu_attn_bwd;
    cuda_backend.attn_cached = cu_attn_cached;
    cuda_backend.swiglu_fwd = cu_swiglu_fwd;
    cuda_backend.swiglu_bwd = cu_swiglu_bwd;
    cuda_backend.xent = cu_xent;
    cuda_backend.add = cu_add;
    cuda_backend.scale = cu_scale;
    cuda_backend.sumsq = cu_sumsq;
    cuda_backend.adamw = cu_adamw;
    g.device = device;
    g.ready = 1;
    return 0;
}

extern "C" const backend_t *backend_cuda(int device)
{
    if (g.ready) {
        if (device != g.device) {
            ftk_err_set("the CUDA backend is already on device %d (asked for %d)", g.device, device);
            return NULL;
        }
        return &cuda_backend;
    }
    return init(device) < 0 ? NULL : &cuda_backend;
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
