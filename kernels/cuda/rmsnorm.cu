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

/* dw = Σ_i dy·x·r: rows cut into COL_CHUNKS fixed chunks (blockIdx.y), each summed in
 * order per column, then the chunks summed in order (colsum_add_kernel). A thread takes K
 * consecutive columns: K = VEC with 16-byte accesses where d is a multiple of VEC and dy,
 * x and dw are 16-byte aligned (a warp then reads 512 bytes of a bf16 row, not 64), else
 * 1 (and with FTK_CUDA_VEC=0). Each column's additions are the same, in the same order,
 * for both K: the same bits. The products and sums are written uncontracted, the CPU's
 * operations (cpu.c: acc += dy·x·r, in another order). */
enum { COL_CHUNKS = 64, DW_ROWS = 4 };

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

template <int K, typename T> __global__ void colsum_add_kernel(T *dw, const float *part, int64_t d)
{
    int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * K;
    if (j >= d)
        return;
    float acc[K], p[K], w[K];
    for (int k = 0; k < K; k++)
        acc[k] = 0;
    for (int c = 0; c < COL_CHUNKS; c++) {
        ldk<K>(part, (int64_t)c * d + j, p);
        for (int k = 0; k < K; k++)
            acc[k] += p[k];
    }
    ldk<K>(dw, j, w);
    for (int k = 0; k < K; k++)
        w[k] = w[k] + acc[k];
    stk<K>(dw, j, w);
}

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
    /* part is scratch: cudaMalloc'd, 16-byte aligned, as are its chunks' rows when d % VEC == 0 */
    int vec = d % VEC == 0 && vec_ok(c, {dout.p, x.p, dw.p, part});
    /* a block of 128 threads spans 128 columns, or 1024 in 8-wide groups: 64 threads then,
     * to spread the d / VEC threads of a chunk over more blocks */
    int threads = vec ? 64 : 128, span = threads * (vec ? VEC : 1);
    dim3 grid((unsigned)((d + span - 1) / span), COL_CHUNKS);
    on_dt(dout.dt, [&](auto tg) {
        on_dt(x.dt, [&](auto tx) {
            on_vec(vec, [&](auto K) {
                rmsnorm_bwd_dw_part_kernel<decltype(K)::value>
                    <<<grid, threads, 0, c->cur>>>(part, AS(tg, dout), AS(tx, x), rstd, n, d);
            });
        });
    });
    launched(c, "rmsnorm_bwd dw");
    on_dt(dw.dt, [&](auto tw) {
        on_vec(vec, [&](auto K) {
            colsum_add_kernel<decltype(K)::value>
                <<<(unsigned)((d + span - 1) / span), threads, 0, c->cur>>>(AS(tw, dw), part, d);
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
