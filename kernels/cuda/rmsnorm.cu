/* rmsnorm.cu — the CUDA backend's RMSNorm, forward and backward, and the residual add
 * fused with it (add_rmsnorm_fwd). */
#include "cuda_internal.cuh"

/* A block per row; each thread takes K consecutive elements at a time (K = VEC with 16-byte
 * accesses where the row width is a multiple of VEC and every operand aligned, else 1;
 * on_vec), so the partition of a row, hence the bits of its sum, depends on K: the same K
 * for the same shapes and alignment, so still deterministic. */

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

/* Σ_j dy·w·x of row i over the block, each thread K columns at a time: one function for the
 * dx kernel and the fused pass, so both give the same dx. */
template <int K, typename TG, typename TX, typename TW>
__device__ __forceinline__ float row_dyw_x(const TG *gi, const TW *w, const TX *xi, int64_t d, float *sh)
{
    float s = 0;
    for (int64_t j = K * threadIdx.x; j < d; j += K * blockDim.x) {
        float g[K], b[K], a[K];
        ldk<K>(gi, j, g);
        ldk<K>(w, j, b);
        ldk<K>(xi, j, a);
        for (int k = 0; k < K; k++)
            s += g[k] * b[k] * a[k];
    }
    return block_sum(s, sh);
}

/* dx[i, j..j+K) += r·dy·w − c·x; dy and x are left in g and a (the fused pass sums dw
 * from them). One function for both kernels: the same dx. */
template <int K, typename TDX, typename TG, typename TX, typename TW>
__device__ __forceinline__ void row_dx_at(TDX *dx, const TG *gi, const TW *w, const TX *xi, int64_t i, int64_t d,
                                          int64_t j, float r, float c, float *g, float *a)
{
    float y[K], b[K];
    ldk<K>(dx, i * d + j, y);
    ldk<K>(gi, j, g);
    ldk<K>(w, j, b);
    ldk<K>(xi, j, a);
    for (int k = 0; k < K; k++)
        y[k] = y[k] + (r * g[k] * b[k] - c * a[k]);
    stk<K>(dx, i * d + j, y);
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
    float s = row_dyw_x<K>(gi, w, xi, d, sh);
    float r = rstd[i], c = s * r * r * r / (float)d;
    for (int64_t j = K * threadIdx.x; j < d; j += K * blockDim.x) {
        float g[K], a[K];
        row_dx_at<K>(dx, gi, w, xi, i, d, j, r, c, g, a);
    }
}

/* dw = Σ_i dy·x·r. Where the 16-byte path fits (below: d ≤ 8192), in the dx pass
 * (rmsnorm_bwd_fused_kernel). Otherwise a second pass: rows cut into COL_CHUNKS fixed
 * chunks (blockIdx.y), each summed in order per column, then the chunks summed in order
 * (colsum_kernel). A thread takes K consecutive columns: K = VEC with 16-byte accesses
 * where d is a multiple of VEC and dy, x and dw are 16-byte aligned (a warp then reads
 * 512 bytes of a bf16 row, not 64), else 1 (and with FTK_CUDA_VEC=0); each column's
 * additions are the same, in the same order, for both K: the same bits. The products and
 * sums are written uncontracted on every path, the CPU's operations (cpu.c: acc += dy·x·r,
 * in another order). */
enum { COL_CHUNKS = BK_CUDA_COL_CHUNKS, DW_ROWS = 4 }; /* cuda_mem.h sizes the scratch from them */

template <int K, typename TG, typename TX>
__global__ void rmsnorm_bwd_dw_part_kernel(float *part, const TG *dout, const TX *x, const float *rstd, int64_t n,
                                           int64_t d)
{
    int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * K;
    if (j >= d)
        return;
    int64_t per = (n + COL_CHUNKS - 1) / COL_CHUNKS, a = blockIdx.y * per, b = a + per < n ? a + per : n;
    float acc[K];
    for (int k = 0; k < K; k++)
        acc[k] = 0;
    /* DW_ROWS rows' loads issued before their sums (ptxas left an unrolled loop's loads
     * each beside its use), then added in row order as below */
    int64_t i = a;
    for (; i + DW_ROWS <= b; i += DW_ROWS) {
        float g[DW_ROWS][K], v[DW_ROWS][K], r[DW_ROWS];
        for (int u = 0; u < DW_ROWS; u++) {
            ldk<K>(dout, (i + u) * d + j, g[u]);
            ldk<K>(x, (i + u) * d + j, v[u]);
            r[u] = rstd[i + u];
        }
        for (int u = 0; u < DW_ROWS; u++)
            for (int k = 0; k < K; k++)
                acc[k] = __fadd_rn(acc[k], __fmul_rn(__fmul_rn(g[u][k], v[u][k]), r[u]));
    }
    for (; i < b; i++) {
        float g[K], v[K], r = rstd[i];
        ldk<K>(dout, i * d + j, g);
        ldk<K>(x, i * d + j, v);
        for (int k = 0; k < K; k++)
            acc[k] = __fadd_rn(acc[k], __fmul_rn(__fmul_rn(g[k], v[k]), r));
    }
    stk<K>(part, (int64_t)blockIdx.y * d + j, acc);
}

/* Sums of part's rows (chunks of d floats) in order, per column, K columns a thread: block
 * row g sums chunks g·per … (g + 1)·per (those below chunks); add: dst[j] += the sum
 * (one block row), else dst[g·d + j] = it. */
template <int K, typename T>
__global__ void colsum_kernel(T *dst, int add, const float *part, int64_t d, int64_t chunks, int64_t per)
{
    int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * K;
    if (j >= d)
        return;
    int64_t c0 = (int64_t)blockIdx.y * per, c1 = c0 + per < chunks ? c0 + per : chunks;
    float acc[K], p[K], w[K];
    for (int k = 0; k < K; k++)
        acc[k] = 0;
    for (int64_t c = c0; c < c1; c++) {
        ldk<K>(part, c * d + j, p);
        for (int k = 0; k < K; k++)
            acc[k] += p[k];
    }
    if (!add) {
        stk<K>(dst, (int64_t)blockIdx.y * d + j, acc);
        return;
    }
    ldk<K>(dst, j, w);
    for (int k = 0; k < K; k++)
        w[k] = w[k] + acc[k];
    stk<K>(dst, j, w);
}

/* dx and dw's partial sums in one pass (16-byte path): a block takes `rows` consecutive
 * rows, each as rmsnorm_bwd_dx_kernel<VEC> takes it (the same partition and expressions:
 * the same dx), and adds dy·x·r of each into its columns' sums, in row order, held in
 * registers (DW_GROUPS groups of VEC columns a thread: d ≤ DW_GROUPS·VEC·blockDim); then
 * writes them as part's row blockIdx.x. dy and x are read for dw where dx reads them,
 * not in a second pass. */
enum { DW_GROUPS = 4 };
template <typename TDX, typename TG, typename TX, typename TW>
__global__ void rmsnorm_bwd_fused_kernel(TDX *dx, float *part, const TG *dout, const TX *x, const TW *w,
                                         const float *rstd, int64_t n, int64_t d, int64_t rows)
{
    constexpr int K = VEC;
    __shared__ float sh[32];
    float acc[DW_GROUPS][K];
    for (int m = 0; m < DW_GROUPS; m++)
        for (int k = 0; k < K; k++)
            acc[m][k] = 0;
    int64_t i0 = (int64_t)blockIdx.x * rows, i1 = i0 + rows < n ? i0 + rows : n;
    for (int64_t i = i0; i < i1; i++) {
        const TX *xi = x + i * d;
        const TG *gi = dout + i * d;
        float s = row_dyw_x<K>(gi, w, xi, d, sh);
        float r = rstd[i], c = s * r * r * r / (float)d;
#pragma unroll
        for (int m = 0; m < DW_GROUPS; m++) {
            int64_t j = K * (threadIdx.x + (int64_t)m * blockDim.x);
            if (j >= d)
                break;
            float g[K], a[K];
            row_dx_at<K>(dx, gi, w, xi, i, d, j, r, c, g, a);
            for (int k = 0; k < K; k++)
                acc[m][k] = __fadd_rn(acc[m][k], __fmul_rn(__fmul_rn(g[k], a[k]), r));
        }
    }
#pragma unroll
    for (int m = 0; m < DW_GROUPS; m++) {
        int64_t j = K * (threadIdx.x + (int64_t)m * blockDim.x);
        if (j >= d)
            break;
        stk<K>(part, (int64_t)blockIdx.x * d + j, acc[m]);
    }
}

/* The fused pass's rows a block and its partials' two-level sum: cuda_mem.h
 * (bk_cuda_norm_rows), which sizes the scratch from them. One level would be a chain of up
 * to 1024 dependent additions per column. */
enum { FUSED_GROUP = BK_CUDA_NORM_GROUP, BWD_THREADS = 256 };

void cu_rmsnorm_fwd(backend_t *be, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t w, int64_t n, int64_t d,
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

void cu_rmsnorm_bwd(backend_t *be, bk_buf_t dx, bk_buf_t dw, bk_buf_t dout, bk_buf_t x, bk_buf_t w,
                           const float *rstd, int64_t n, int64_t d)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "rmsnorm_bwd", dx.dt) || !dt_ok(c, "rmsnorm_bwd", dw.dt) ||
        !dt_ok(c, "rmsnorm_bwd", dout.dt) || !dt_ok(c, "rmsnorm_bwd", x.dt) || !dt_ok(c, "rmsnorm_bwd", w.dt))
        return;
    int vec = d % VEC == 0 && vec_ok(c, {dx.p, dout.p, x.p, w.p});
    if (vec && vec_ok(c, {dw.p}) && d <= (int64_t)DW_GROUPS * VEC * BWD_THREADS) {
        /* dx and dw's partials in one pass, then the partials' two-level sum */
        int64_t rows = bk_cuda_norm_rows(n), chunks = (n + rows - 1) / rows;
        int64_t groups = (chunks + FUSED_GROUP - 1) / FUSED_GROUP;
        scratch_claim(c);
        float *part = (float *)tmp_for(c, (size_t)(chunks + groups) * d * sizeof(float));
        if (!part)
            return;
        float *sums = part + chunks * d; /* 16-byte aligned: d % VEC == 0 */
        on_dt(dx.dt, [&](auto tdx) {
            on_dt(dout.dt, [&](auto tg) {
                on_dt(x.dt, [&](auto tx) {
                    on_dt(w.dt, [&](auto tw) {
                        rmsnorm_bwd_fused_kernel<<<(unsigned)chunks, BWD_THREADS, 0, c->cur>>>(
                            AS(tdx, dx), part, AS(tg, dout), AS(tx, x), AS(tw, w), rstd, n, d, rows);
                    });
                });
            });
        });
        launched(c, "rmsnorm_bwd");
        unsigned cb = (unsigned)((d + 64 * VEC - 1) / (64 * VEC));
        colsum_kernel<VEC><<<dim3(cb, (unsigned)groups), 64, 0, c->cur>>>(sums, 0, part, d, chunks, FUSED_GROUP);
        launched(c, "rmsnorm_bwd dw sums");
        on_dt(dw.dt, [&](auto tw) {
            colsum_kernel<VEC><<<cb, 64, 0, c->cur>>>(AS(tw, dw), 1, (const float *)sums, d, groups, groups);
        });
        launched(c, "rmsnorm_bwd dw sum");
        return;
    }
    on_dt(dx.dt, [&](auto tdx) {
        on_dt(dout.dt, [&](auto tg) {
            on_dt(x.dt, [&](auto tx) {
                on_dt(w.dt, [&](auto tw) {
                    on_vec(vec, [&](auto K) {
                        rmsnorm_bwd_dx_kernel<decltype(K)::value><<<(unsigned)n, BWD_THREADS, 0, c->cur>>>(
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
    /* part is scratch: cudaMalloc'd, 16-byte aligned, as are its chunks' rows when d % VEC == 0 */
    int vdw = d % VEC == 0 && vec_ok(c, {dout.p, x.p, dw.p, part});
    /* a block of 128 threads spans 128 columns, or 1024 in 8-wide groups: 64 threads then,
     * to spread the d / VEC threads of a chunk over more blocks */
    int threads = vdw ? 64 : 128, span = threads * (vdw ? VEC : 1);
    dim3 grid((unsigned)((d + span - 1) / span), COL_CHUNKS);
    on_dt(dout.dt, [&](auto tg) {
        on_dt(x.dt, [&](auto tx) {
            on_vec(vdw, [&](auto K) {
                rmsnorm_bwd_dw_part_kernel<decltype(K)::value>
                    <<<grid, threads, 0, c->cur>>>(part, AS(tg, dout), AS(tx, x), rstd, n, d);
            });
        });
    });
    launched(c, "rmsnorm_bwd dw");
    on_dt(dw.dt, [&](auto tw) {
        on_vec(vdw, [&](auto K) {
            colsum_kernel<decltype(K)::value><<<(unsigned)((d + span - 1) / span), threads, 0, c->cur>>>(
                AS(tw, dw), 1, (const float *)part, d, (int64_t)COL_CHUNKS, (int64_t)COL_CHUNKS);
        });
    });
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

void cu_add_rmsnorm_fwd(backend_t *be, bk_buf_t xsum, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t r,
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
