/* embed.cu — the CUDA backend's embedding (forward: a gather; backward: each table row
 * summed over its own tokens in order) and rows_scatter. */
#include "cuda_internal.cuh"

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

void cu_embed_fwd(backend_t *be, bk_buf_t out, const int32_t *ids, bk_buf_t table, int64_t n, int64_t d)
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

void cu_embed_bwd(backend_t *be, bk_buf_t dtable, const int32_t *ids, bk_buf_t dout, int64_t n, int64_t d)
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

void cu_rows_scatter(backend_t *be, bk_buf_t dst, const int32_t *idx, bk_buf_t src, int64_t n, int64_t d)
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
