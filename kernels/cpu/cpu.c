/* cpu.c — the CPU backend: OpenMP, BLAS for the matrix products, fp32 and bf16 storage.
 * This is the reference every other backend is checked against, so it is written to be
 * read: one plain loop nest per op, the maths of backend.h and nothing clever.
 *
 * Dtypes. Every op computes in fp32 on fp32 rows: a bf16 input row is widened into
 * per-thread scratch first, a bf16 output row is computed in scratch and rounded to
 * nearest even once when stored (an op that adds into bf16 widens the old row, adds, and
 * rounds the sum). An f32 buffer is used in place, so the f32 path converts nothing.
 * bf16 products widen tiles of A and B into the instance's workspace and multiply them
 * with BLAS in fp32 (bf16 × bf16 is exact in fp32), accumulating each C tile over K in
 * fp32 and rounding it once.
 *
 * Determinism (backend.h): work is split so that every output element is computed by
 * one thread in a fixed order, and reductions across threads (Σx², the loss) sum
 * fixed-size blocks then add the block sums in order, so the result does not depend on
 * the number of threads. Products are cut into tiles fixed by the shapes, each made by
 * one BLAS call on one thread (BLAS's own threading splits K differently on different
 * thread counts). Dot products use 8 independent partial sums, which lets the compiler
 * vectorise them without -ffast-math. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../libcommon/log.h"
#include "../backend.h"
#include "../clip.h"
#include "../sround.h"

/* OpenBLAS's own (declared here too: another cblas.h may lack them); ftk links OpenBLAS. */
int openblas_get_parallel(void); /* 0 sequential, 1 its own threads, 2 OpenMP's */
void openblas_set_num_threads(int n);

typedef struct {
    float *ws;     /* BK_CPU_WORKSPACE_BYTES: the A, B and C tiles of bf16 products */
    char err[512]; /* the first failure, reported by sync() */
} cpu_ctx_t;

static cpu_ctx_t *ctx_of(backend_t *be) { return be->ctx; }

/* Records the first misuse; the op is then skipped (backend.h: no error path in an op). */
static int bad(backend_t *be, const char *fmt, ...) FTK_PRINTF(2, 3);
static int bad(backend_t *be, const char *fmt, ...)
{
    cpu_ctx_t *c = ctx_of(be);
    if (!c->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, sizeof c->err, fmt, ap);
        va_end(ap);
    }
    return 1;
}
#define FAILED(be) (ctx_of(be)->err[0] != 0)

static int is_fp(dtype_t t) { return t == DT_F32 || t == DT_BF16; }
/* 0 when every buffer has a dtype the op takes; else records the misuse. */
static int check_dt(backend_t *be, const char *op, int n, const bk_buf_t *b)
{
    if (FAILED(be))
        return -1;
    for (int i = 0; i < n; i++)
        if (!is_fp(b[i].dt))
            return bad(be, "internal: %s: argument %d has dtype %s", op, i + 1, dtype_name(b[i].dt)), -1;
    return 0;
}
static int same_dt(backend_t *be, const char *op, int n, const bk_buf_t *b)
{
    if (check_dt(be, op, n, b) < 0)
        return -1;
    for (int i = 1; i < n; i++)
        if (b[i].dt != b[0].dt)
            return bad(be, "internal: %s takes one dtype for these arguments (%s and %s)", op, dtype_name(b[0].dt),
                       dtype_name(b[i].dt)),
                   -1;
    return 0;
}

/* ---- widening and narrowing rows ---------------------------------------------------------- */

static inline float ld(bk_buf_t b, int64_t i)
{
    return b.dt == DT_F32 ? ((const float *)b.p)[i] : bf16_to_f32(((const uint16_t *)b.p)[i]);
}
static inline void st(bk_buf_t b, int64_t i, float v)
{
    if (b.dt == DT_F32)
        ((float *)b.p)[i] = v;
    else
        ((uint16_t *)b.p)[i] = f32_to_bf16(v);
}

/* Elements [off, off+n) of b as fp32: b itself when it is f32, else widened into tmp. */
static float *rd(bk_buf_t b, int64_t off, int64_t n, float *tmp)
{
    if (b.dt == DT_F32)
        return (float *)b.p + off;
    const uint16_t *s = (const uint16_t *)b.p + off;
    for (int64_t i = 0; i < n; i++)
        tmp[i] = bf16_to_f32(s[i]);
    return tmp;
}
/* Where to compute elements [off, off+n) of an output: in place for f32, else tmp
 * (then wr() stores them). */
static float *wp(bk_buf_t b, int64_t off, float *tmp) { return b.dt == DT_F32 ? (float *)b.p + off : tmp; }
static void wr(bk_buf_t b, int64_t off, int64_t n, const float *v)
{
    if (b.dt == DT_F32)
        return;
    uint16_t *d = (uint16_t *)b.p + off;
    for (int64_t i = 0; i < n; i++)
        d[i] = f32_to_bf16(v[i]);
}

/* Per-thread scratch of a few rows: like a kernel's registers, not worth an error path. */
static float *scratch(int64_t floats)
{
    float *p = malloc((size_t)(floats > 0 ? floats : 1) * sizeof *p);
    if (!p)
        abort();
    return p;
}

/* ---- memory ---------------------------------------------------------------- */

static void *cpu_mem_alloc(backend_t *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) ? NULL : p;
}
/* The host's MemAvailable (/proc/meminfo: what can be allocated without swapping), else
 * its free pages. */
static int64_t cpu_mem_avail(backend_t *be)
{
    (void)be;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    if (kb >= 0)
        return (int64_t)kb * 1024;
#ifdef _SC_AVPHYS_PAGES
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (int64_t)pages * size : -1;
#else
    return -1;
#endif
}

static void *cpu_host_ptr(backend_t *be, void *p)
{
    (void)be;
    return p;
}

static void cpu_mem_free(backend_t *be, void *p)
{
    (void)be;
    free(p);
}
/* memmove: a world of one's collectives copy through this too (comm_set_copy). */
static void cpu_copy(backend_t *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}
static void cpu_zero(backend_t *be, void *p, size_t bytes)
{
    (void)be;
    if (bytes)
        memset(p, 0, bytes);
}

static int cpu_sync(backend_t *be)
{
    if (!FAILED(be))
        return 0;
    ftk_err_set("%s", ctx_of(be)->err);
    return -1;
}

/* ---- ops ------------------------------------------------------------------------------------- */

static void cpu_convert(backend_t *be, bk_buf_t dst, bk_buf_t src, int64_t n)
{
    bk_buf_t b[2] = {dst, src};
    if (check_dt(be, "convert", 2, b) < 0 || n <= 0)
        return;
    if (dst.dt == src.dt) {
        memmove(dst.p, src.p, (size_t)n * dtype_size(dst.dt));
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        st(dst, i, ld(src, i));
}

/* A tile of op(X) for X stored row-major with row length ld: rows r0.., cols c0.. of the
 * stored matrix, widened into t (row length cols). */
static void widen_tile(float *t, bk_buf_t x, int64_t ldx, int64_t r0, int64_t rows, int64_t c0, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            t[r * cols + c] = ld(x, (r0 + r) * ldx + c0 + c);
}

#define MM_STRIP 64 /* rows of a bf16 product's tile per BLAS call */

/* fp32 products: C in square tiles of mm_tile() elements a side, each made by one BLAS
 * call over the whole of K on one thread, from inside a parallel loop. A threaded BLAS
 * splits a call its own way, and OpenBLAS blocks K one way on one thread and another on
 * several (an sgemm with K = 1000 differs in the last bits between 1 and 2 threads), so
 * one call for the whole product would make the bits depend on the thread count. The
 * tiles depend on M and N only: from 512 down to 64 until there are MM_TILES of them, so a
 * product has work for many cores and a large tile keeps BLAS's blocking efficient. */
#define MM_TILE_MAX 512
#define MM_TILE_MIN 64
#define MM_TILES 64

static int64_t mm_tile(int64_t M, int64_t N)
{
    int64_t t = MM_TILE_MAX;
    while (t > MM_TILE_MIN && ((M + t - 1) / t) * ((N + t - 1) / t) < MM_TILES)
        t /= 2;
    return t;
}

static void cpu_matmul(backend_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, bk_buf_t A,
                       bk_buf_t B, float beta, bk_buf_t C)
{
    bk_buf_t ab[2] = {A, B};
    if (same_dt(be, "matmul", 2, ab) < 0 || check_dt(be, "matmul", 1, &C) < 0 || M == 0 || N == 0)
        return;
    if (A.dt == DT_F32 && C.dt == DT_F32) {
        const float *a = A.p, *b = B.p;
        float *c = C.p;
        int64_t T = mm_tile(M, N), tn = (N + T - 1) / T, nt_all = (M + T - 1) / T * tn;
        int64_t lda = ta ? M : K, ldb = tb ? K : N;
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < nt_all; t++) {
            int64_t i0 = t / tn * T, j0 = t % tn * T;
            int64_t mt = M - i0 < T ? M - i0 : T, nt = N - j0 < T ? N - j0 : T;
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)mt, (int)nt,
                        (int)K, alpha, ta ? a + i0 : a + i0 * lda, (int)lda, tb ? b + j0 * ldb : b + j0, (int)ldb,
                        beta, c + i0 * N + j0, (int)N);
        }
        return;
    }
    /* Tiles: C[i0.., j0..] accumulates op(A)[i0.., k0..]·op(B)[k0.., j0..] over k0 in fp32,
     * then is rounded once. */
    const int64_t T = BK_CPU_TILE;
    float *at = ctx_of(be)->ws, *bt = at + T * T, *ct = bt + T * T;
    int64_t lda = ta ? M : K, ldb = tb ? K : N;
    for (int64_t i0 = 0; i0 < M; i0 += T) {
        int64_t mt = M - i0 < T ? M - i0 : T;
        for (int64_t j0 = 0; j0 < N; j0 += T) {
            int64_t nt = N - j0 < T ? N - j0 : T;
            for (int64_t r = 0; r < mt; r++)
                for (int64_t c = 0; c < nt; c++)
                    ct[r * nt + c] = beta != 0.0f ? beta * ld(C, (i0 + r) * N + j0 + c) : 0.0f;
            for (int64_t k0 = 0; k0 < K; k0 += T) {
                int64_t kt = K - k0 < T ? K - k0 : T;
                if (ta)
                    widen_tile(at, A, lda, k0, kt, i0, mt); /* stored [K, M] */
                else
                    widen_tile(at, A, lda, i0, mt, k0, kt);
                if (tb)
                    widen_tile(bt, B, ldb, j0, nt, k0, kt); /* stored [N, K] */
                else
                    widen_tile(bt, B, ldb, k0, kt, j0, nt);
                /* One BLAS call per fixed strip of rows, from inside a parallel loop: a threaded
                 * BLAS (OpenBLAS) then runs each call on one thread, so the bits do not depend
                 * on the thread count as they would if BLAS split one tile its own way. */
#pragma omp parallel for schedule(static)
                for (int64_t r0 = 0; r0 < mt; r0 += MM_STRIP) {
                    int64_t rs = mt - r0 < MM_STRIP ? mt - r0 : MM_STRIP;
                    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                                (int)rs, (int)nt, (int)kt, alpha, ta ? at + r0 : at + r0 * kt, ta ? (int)mt : (int)kt,
                                bt, tb ? (int)kt : (int)nt, 1.0f, ct + r0 * nt, (int)nt);
                }
            }
            for (int64_t r = 0; r < mt; r++)
                for (int64_t c = 0; c < nt; c++)
                    st(C, (i0 + r) * N + j0 + c, ct[r * nt + c]);
        }
    }
}

static inline float dot(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static inline void axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void cpu_embed_fwd(backend_t *be, bk_buf_t out, const int32_t *ids, bk_buf_t table, int64_t n, int64_t d)
{
    bk_buf_t b[2] = {out, table};
    if (same_dt(be, "embed_fwd", 2, b) < 0)
        return;
    size_t es = dtype_size(out.dt);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)out.p + (size_t)(i * d) * es, (const char *)table.p + (size_t)((int64_t)ids[i] * d) * es,
               (size_t)d * es);
}

/* Columns are split over threads; each thread walks the tokens in order, so repeated ids
 * accumulate in the same order whatever the thread count. */
static void cpu_embed_bwd(backend_t *be, bk_buf_t dtable, const int32_t *ids, bk_buf_t dout, int64_t n, int64_t d)
{
    bk_buf_t b[2] = {dtable, dout};
    if (check_dt(be, "embed_bwd", 2, b) < 0)
        return;
    const int64_t cb = 64;
    if (dtable.dt == DT_F32 && dout.dt == DT_F32) {
        float *dt = dtable.p;
        const float *go = dout.p;
#pragma omp parallel for schedule(static)
        for (int64_t c0 = 0; c0 < d; c0 += cb) {
            int64_t c1 = c0 + cb < d ? c0 + cb : d;
            for (int64_t i = 0; i < n; i++) {
                float *row = dt + (int64_t)ids[i] * d;
                const float *g = go + i * d;
                for (int64_t c = c0; c < c1; c++)
                    row[c] += g[c];
            }
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < d; c0 += cb) {
        int64_t c1 = c0 + cb < d ? c0 + cb : d;
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = c0; c < c1; c++) {
                int64_t at = (int64_t)ids[i] * d + c;
                st(dtable, at, ld(dtable, at) + ld(dout, i * d + c));
            }
    }
}

static void cpu_rows_scatter(backend_t *be, bk_buf_t dst, const int32_t *idx, bk_buf_t src, int64_t n, int64_t d)
{
    bk_buf_t b[2] = {dst, src};
    if (same_dt(be, "rows_scatter", 2, b) < 0)
        return;
    size_t es = dtype_size(dst.dt);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)dst.p + (size_t)((int64_t)idx[i] * d) * es, (const char *)src.p + (size_t)(i * d) * es,
               (size_t)d * es);
}

static void cpu_rmsnorm_fwd(backend_t *be, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t w, int64_t n, int64_t d,
                            float eps)
{
    bk_buf_t b[3] = {out, x, w};
    if (check_dt(be, "rmsnorm_fwd", 3, b) < 0)
        return;
    float *wtmp = scratch(d);
    const float *wf = rd(w, 0, d, wtmp);
#pragma omp parallel
    {
        float *tx = scratch(d), *to = scratch(d);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *xi = rd(x, i * d, d, tx);
            float *oi = wp(out, i * d, to);
            float r = 1.0f / sqrtf(dot(xi, xi, d) / (float)d + eps);
            rstd[i] = r;
            for (int64_t j = 0; j < d; j++)
                oi[j] = (xi[j] * r) * wf[j];
            wr(out, i * d, d, oi);
        }
        free(tx);
        free(to);
    }
    free(wtmp);
}

/* y = x·r·w with r = (mean(x²)+eps)^-1/2:
 * dx = r·(dy·w) − r³/d · x · Σ(dy·w·x);  dw = Σ_i dy·x·r. */
static void cpu_rmsnorm_bwd(backend_t *be, bk_buf_t dx, bk_buf_t dw, bk_buf_t dout, bk_buf_t x, bk_buf_t w,
                            const float *rstd, int64_t n, int64_t d)
{
    bk_buf_t b[5] = {dx, dw, dout, x, w};
    if (check_dt(be, "rmsnorm_bwd", 5, b) < 0)
        return;
    float *wtmp = scratch(d);
    const float *wf = rd(w, 0, d, wtmp);
#pragma omp parallel
    {
        float *tx = scratch(d), *tg = scratch(d), *td = scratch(d);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *xi = rd(x, i * d, d, tx), *gi = rd(dout, i * d, d, tg);
            float *dxi = rd(dx, i * d, d, td);
            float r = rstd[i];
            float acc[8] = {0};
            int64_t j = 0;
            for (; j + 8 <= d; j += 8)
                for (int l = 0; l < 8; l++)
                    acc[l] += gi[j + l] * wf[j + l] * xi[j + l];
            float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; j < d; j++)
                s += gi[j] * wf[j] * xi[j];
            float c = s * r * r * r / (float)d;
            for (j = 0; j < d; j++)
                dxi[j] += r * gi[j] * wf[j] - c * xi[j];
            wr(dx, i * d, d, dxi);
        }
        const int64_t cb = 64;
#pragma omp for schedule(static)
        for (int64_t c0 = 0; c0 < d; c0 += cb) {
            int64_t c1 = c0 + cb < d ? c0 + cb : d;
            float acc[64] = {0};
            if (dout.dt == DT_F32 && x.dt == DT_F32) {
                const float *go = dout.p, *xo = x.p;
                for (int64_t i = 0; i < n; i++)
                    for (int64_t c = c0; c < c1; c++)
                        acc[c - c0] += go[i * d + c] * xo[i * d + c] * rstd[i];
            } else {
                for (int64_t i = 0; i < n; i++)
                    for (int64_t c = c0; c < c1; c++)
                        acc[c - c0] += ld(dout, i * d + c) * ld(x, i * d + c) * rstd[i];
            }
            for (int64_t c = c0; c < c1; c++)
                st(dw, c, ld(dw, c) + acc[c - c0]);
        }
        free(tx);
        free(tg);
        free(td);
    }
    free(wtmp);
}

/* HF: inv_freq_j = 1 / theta^(2j/hd) in float32, angle = pos·inv_freq in float32. */
static void cpu_rope(backend_t *be, bk_buf_t x, const int32_t *pos, int64_t n, int n_head, int hd, float theta,
                     int inverse)
{
    if (check_dt(be, "rope", 1, &x) < 0)
        return;
    int half = hd / 2;
    int64_t row = (int64_t)n_head * hd;
    float *inv = scratch(half);
    for (int j = 0; j < half; j++)
        inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
#pragma omp parallel
    {
        float *t = x.dt == DT_F32 ? NULL : scratch(row);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float *xi = rd(x, i * row, row, t);
            for (int j = 0; j < half; j++) {
                float a = (float)pos[i] * inv[j];
                float c = cosf(a), s = inverse ? -sinf(a) : sinf(a);
                for (int h = 0; h < n_head; h++) {
                    float *v = xi + (int64_t)h * hd;
                    float x1 = v[j], x2 = v[j + half];
                    v[j] = x1 * c - x2 * s;
                    v[j + half] = x2 * c + x1 * s;
                }
            }
            wr(x, i * row, row, xi);
        }
        free(t);
    }
    free(inv);
}

static int64_t max_seg_len(const int64_t *seg, int64_t n_seg)
{
    int64_t m = 1;
    for (int64_t s = 0; s < n_seg; s++)
        if (seg[s + 1] - seg[s] > m)
            m = seg[s + 1] - seg[s];
    return m;
}

/* One query row against keys/values 0..n-1 (row strides ks): o = softmax(q·kᵀ·scale)·v;
 * returns the log-sum-exp. p is scratch for n scores. */
static float attend_row(const float *q, const float *k, const float *v, int64_t n, int64_t ks, int hd, float scale,
                        float *p, float *o)
{
    float m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; j++) {
        p[j] = dot(q, k + j * ks, hd) * scale;
        m = p[j] > m ? p[j] : m;
    }
    for (int64_t j = 0; j < n; j++) {
        p[j] = expf(p[j] - m);
        sum += p[j];
    }
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int64_t j = 0; j < n; j++)
        axpy(o, p[j] / sum, v + j * ks, hd);
    return m + logf(sum);
}

/* The head slice [rows, hd] of a [*, row_len] bf16 or f32 buffer starting at element off,
 * as fp32: in place (stride row_len) for f32, else widened into t (stride hd). */
static const float *head_rows(bk_buf_t b, int64_t off, int64_t rows, int64_t row_len, int hd, float *t,
                              int64_t *stride)
{
    if (b.dt == DT_F32) {
        *stride = row_len;
        return (const float *)b.p + off;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < hd; c++)
            t[r * hd + c] = ld(b, off + r * row_len + c);
    *stride = hd;
    return t;
}

/* One task per (segment, query head): writes only that head's rows of out and lse. */
static void cpu_attn_fwd(backend_t *be, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v,
                         const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd)
{
    bk_buf_t b[4] = {out, q, k, v};
    if (same_dt(be, "attn_fwd", 4, b) < 0)
        return;
    int64_t lmax = max_seg_len(seg, n_seg);
    int group = n_head / n_kv, wide = q.dt == DT_F32;
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *p = scratch(lmax);
        float *tk = wide ? NULL : scratch(lmax * hd), *tv = wide ? NULL : scratch(lmax * hd);
        float *tq = scratch(hd), *to = scratch(hd);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_seg * n_head; task++) {
            int64_t s = task / n_head, a = seg[s], len = seg[s + 1] - a, kstr;
            int h = (int)(task % n_head), kh = h / group;
            const float *kb = head_rows(k, a * ks + kh * hd, len, ks, hd, tk, &kstr);
            const float *vb = head_rows(v, a * ks + kh * hd, len, ks, hd, tv, &kstr);
            for (int64_t i = 0; i < len; i++) {
                int64_t at = (a + i) * qs + h * hd;
                const float *qi = rd(q, at, hd, tq);
                float *oi = wp(out, at, to);
                lse[(a + i) * n_head + h] = attend_row(qi, kb, vb, i + 1, kstr, hd, scale, p, oi);
                wr(out, at, hd, oi);
            }
        }
        free(p);
        free(tk);
        free(tv);
        free(tq);
        free(to);
    }
}

/* One task per (segment, key/value head): it owns dk and dv of that head in the segment
 * and dq of the query heads of its group, so no two tasks write the same element.
 * With p = softmax row, D_i = dout_i·out_i: ds_j = p_j (dout_i·v_j − D_i). In bf16, the
 * task's k, v are widened and its dk, dv accumulate in fp32 scratch, rounded at the end. */
static void cpu_attn_bwd(backend_t *be, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k,
                         bk_buf_t v, bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head,
                         int n_kv, int hd)
{
    bk_buf_t b[8] = {dq, dk, dv, dout, q, k, v, out};
    if (same_dt(be, "attn_bwd", 8, b) < 0)
        return;
    int64_t lmax = max_seg_len(seg, n_seg);
    int group = n_head / n_kv, wide = q.dt == DT_F32;
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *ds = scratch(lmax);
        float *tk = wide ? NULL : scratch(lmax * hd), *tv = wide ? NULL : scratch(lmax * hd);
        float *tdk = wide ? NULL : scratch(lmax * hd), *tdv = wide ? NULL : scratch(lmax * hd);
        float *tq = scratch(hd), *tg = scratch(hd), *to = scratch(hd), *tdq = scratch(hd);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_seg * n_kv; task++) {
            int64_t s = task / n_kv, a = seg[s], len = seg[s + 1] - a, kstr;
            int kh = (int)(task % n_kv);
            int64_t base = a * ks + kh * hd;
            const float *kb = head_rows(k, base, len, ks, hd, tk, &kstr);
            const float *vb = head_rows(v, base, len, ks, hd, tv, &kstr);
            float *dkb = wide ? (float *)dk.p + base : tdk, *dvb = wide ? (float *)dv.p + base : tdv;
            for (int64_t i = 0; i < len; i++) {
                memset(dkb + i * kstr, 0, (size_t)hd * sizeof(float));
                memset(dvb + i * kstr, 0, (size_t)hd * sizeof(float));
            }
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                for (int64_t i = 0; i < len; i++) {
                    int64_t at = (a + i) * qs + h * hd;
                    const float *qi = rd(q, at, hd, tq), *gi = rd(dout, at, hd, tg), *oi = rd(out, at, hd, to);
                    float l = lse[(a + i) * n_head + h];
                    float D = dot(gi, oi, hd);
                    float *dqi = wp(dq, at, tdq);
                    memset(dqi, 0, (size_t)hd * sizeof *dqi);
                    for (int64_t j = 0; j <= i; j++) {
                        const float *kj = kb + j * kstr, *vj = vb + j * kstr;
                        float pj = expf(dot(qi, kj, hd) * scale - l);
                        ds[j] = pj * (dot(gi, vj, hd) - D);
                        axpy(dvb + j * kstr, pj, gi, hd);
                    }
                    for (int64_t j = 0; j <= i; j++) {
                        axpy(dqi, ds[j] * scale, kb + j * kstr, hd);
                        axpy(dkb + j * kstr, ds[j] * scale, qi, hd);
                    }
                    wr(dq, at, hd, dqi);
                }
            }
            if (!wide)
                for (int64_t i = 0; i < len; i++) {
                    wr(dk, base + i * ks, hd, dkb + i * hd);
                    wr(dv, base + i * ks, hd, dvb + i * hd);
                }
        }
        free(ds);
        free(tk);
        free(tv);
        free(tdk);
        free(tdv);
        free(tq);
        free(tg);
        free(to);
        free(tdq);
    }
}

static void cpu_attn_cached(backend_t *be, bk_buf_t out, bk_buf_t q, bk_buf_t kc, bk_buf_t vc, int64_t n, int64_t p0,
                            int n_head, int n_kv, int hd)
{
    bk_buf_t b[4] = {out, q, kc, vc};
    if (same_dt(be, "attn_cached", 4, b) < 0)
        return;
    int group = n_head / n_kv, wide = q.dt == DT_F32;
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd, ctx = p0 + n;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *p = scratch(ctx);
        float *tk = wide ? NULL : scratch(ctx * hd), *tv = wide ? NULL : scratch(ctx * hd);
        float *tq = scratch(hd), *to = scratch(hd);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n * n_head; task++) {
            int64_t i = task / n_head, last = p0 + i, kstr;
            int h = (int)(task % n_head), kh = h / group;
            const float *kb = head_rows(kc, kh * hd, last + 1, ks, hd, tk, &kstr);
            const float *vb = head_rows(vc, kh * hd, last + 1, ks, hd, tv, &kstr);
            int64_t at = i * qs + h * hd;
            float *oi = wp(out, at, to);
            attend_row(rd(q, at, hd, tq), kb, vb, last + 1, kstr, hd, scale, p, oi);
            wr(out, at, hd, oi);
        }
        free(p);
        free(tk);
        free(tv);
        free(tq);
        free(to);
    }
}

/* SwiGLU's element arithmetic, shared by swiglu and glu (the fused op must give its bits). */
static inline float swiglu_h(float g, float u) { return g / (1.0f + expf(-g)) * u; }
static inline void swiglu_d(float d, float g, float u, float *dg, float *du)
{
    float sg = 1.0f / (1.0f + expf(-g));
    *du = d * g * sg;
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
}

static void cpu_swiglu_fwd(backend_t *be, bk_buf_t h, bk_buf_t g, bk_buf_t u, int64_t n)
{
    bk_buf_t b[3] = {h, g, u};
    if (same_dt(be, "swiglu_fwd", 3, b) < 0)
        return;
    if (h.dt == DT_F32) {
        float *hp = h.p;
        const float *gp = g.p, *up = u.p;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            hp[i] = swiglu_h(gp[i], up[i]);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        st(h, i, swiglu_h(ld(g, i), ld(u, i)));
}

/* silu(g) = g·σ(g); silu'(g) = σ(g)·(1 + g·(1 − σ(g))). */
static void cpu_swiglu_bwd(backend_t *be, bk_buf_t dg, bk_buf_t du, bk_buf_t dh, bk_buf_t g, bk_buf_t u, int64_t n)
{
    bk_buf_t b[5] = {dg, du, dh, g, u};
    if (same_dt(be, "swiglu_bwd", 5, b) < 0)
        return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float a, b;
        swiglu_d(ld(dh, i), ld(g, i), ld(u, i), &a, &b);
        st(du, i, b);
        st(dg, i, a);
    }
}

static void cpu_xent(backend_t *be, float *logits, const int32_t *targets, const float *weights, int64_t n,
                     int64_t V, float grad_scale, double *acc)
{
    if (FAILED(be))
        return;
    double *row_loss = malloc((size_t)(n ? n : 1) * sizeof *row_loss);
    if (!row_loss)
        abort();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float *x = logits + i * V;
        float w = weights[i];
        if (w == 0.0f) {
            row_loss[i] = 0;
            if (grad_scale != 0.0f)
                memset(x, 0, (size_t)V * sizeof *x);
            continue;
        }
        float m = -INFINITY;
        for (int64_t j = 0; j < V; j++)
            m = x[j] > m ? x[j] : m;
        double sum = 0;
        for (int64_t j = 0; j < V; j++)
            sum += exp((double)(x[j] - m));
        double lse = m + log(sum);
        row_loss[i] = (double)w * (lse - x[targets[i]]);
        if (grad_scale != 0.0f) {
            float c = grad_scale * w;
            for (int64_t j = 0; j < V; j++)
                x[j] = c * (float)exp((double)x[j] - lse);
            x[targets[i]] -= c;
        }
    }
    double total = 0;
    for (int64_t i = 0; i < n; i++)
        total += row_loss[i];
    free(row_loss);
    *acc += total;
}

static void cpu_add(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n)
{
    bk_buf_t b[2] = {y, x};
    if (check_dt(be, "add", 2, b) < 0)
        return;
    if (y.dt == DT_F32 && x.dt == DT_F32) {
        float *yp = y.p;
        const float *xp = x.p;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            yp[i] += xp[i];
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        st(y, i, ld(y, i) + ld(x, i));
}

static void cpu_scale(backend_t *be, bk_buf_t y, float a, int64_t n)
{
    if (check_dt(be, "scale", 1, &y) < 0)
        return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        st(y, i, ld(y, i) * a);
}

#define SUMSQ_BLOCK 65536
/* Σy² over blocks of SUMSQ_BLOCK elements, each block summed in order and the blocks'
 * sums added in order, so the bits do not depend on the threads. With x, each block first
 * gets y += x (add's arithmetic) while it is in the cache: add_sumsq's bits are those of
 * add then sumsq by construction. */
static double sumsq_blocks(bk_buf_t y, const bk_buf_t *x, int64_t n)
{
    int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double *part = malloc((size_t)(nb ? nb : 1) * sizeof *part);
    if (!part)
        abort();
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t a = b * SUMSQ_BLOCK, e = a + SUMSQ_BLOCK < n ? a + SUMSQ_BLOCK : n;
        if (x && y.dt == DT_F32 && x->dt == DT_F32) {
            float *yp = y.p;
            const float *xp = x->p;
            for (int64_t i = a; i < e; i++)
                yp[i] += xp[i];
        } else if (x) {
            for (int64_t i = a; i < e; i++)
                st(y, i, ld(y, i) + ld(*x, i));
        }
        double s = 0;
        if (y.dt == DT_F32) {
            const float *yp = y.p;
            for (int64_t i = a; i < e; i++)
                s += (double)yp[i] * yp[i];
        } else {
            for (int64_t i = a; i < e; i++) {
                double v = ld(y, i);
                s += v * v;
            }
        }
        part[b] = s;
    }
    double total = 0;
    for (int64_t b = 0; b < nb; b++)
        total += part[b];
    free(part);
    return total;
}

static void cpu_sumsq(backend_t *be, bk_buf_t x, int64_t n, double *acc)
{
    if (check_dt(be, "sumsq", 1, &x) < 0)
        return;
    *acc += sumsq_blocks(x, NULL, n);
}

/* add then sumsq (off by default like every fused op on the CPU) */
static void cpu_add_sumsq(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n, double *acc)
{
    bk_buf_t b[2] = {y, x};
    if (check_dt(be, "add_sumsq", 2, b) < 0)
        return;
    *acc += sumsq_blocks(y, &x, n);
}

/* The int8 codes of one block (backend.h quant_i8): fmaxf skips NaN, so a NaN element
 * leaves the scale to the others and then clamps to -127 (fmaxf again). */
static void cpu_quant_i8(backend_t *be, int8_t *codes, float *scales, bk_buf_t x, int64_t n, int64_t block)
{
    if (check_dt(be, "quant_i8", 1, &x) < 0 || n <= 0 || block <= 0)
        return;
    int64_t nb = (n + block - 1) / block;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t a = b * block, e = a + block < n ? a + block : n;
        float amax = 0.0f;
        for (int64_t i = a; i < e; i++)
            amax = fmaxf(amax, fabsf(ld(x, i)));
        float sc = amax / 127.0f;
        scales[b] = sc;
        for (int64_t i = a; i < e; i++) {
            float q = sc > 0.0f ? rintf(ld(x, i) / sc) : 0.0f;
            codes[i] = (int8_t)fminf(fmaxf(q, -127.0f), 127.0f);
        }
    }
}

static void cpu_dequant_i8(backend_t *be, bk_buf_t y, const int8_t *codes, const float *scales, int64_t n,
                           int64_t block)
{
    if (check_dt(be, "dequant_i8", 1, &y) < 0 || n <= 0 || block <= 0)
        return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        st(y, i, (float)codes[i] * scales[i / block]);
}

/* Stores v into element i of a bf16 or f32 state array w (0 p, 1 m, 2 v) of an AdamW call;
 * r is the element's hash under BK_SROUND (sround.h). */
static inline void st_state(bk_buf_t b, int64_t i, float v, const bk_adamw_t *h, uint64_t r, int w)
{
    if (b.dt == DT_F32)
        ((float *)b.p)[i] = v;
    else if (h->stochastic == BK_SROUND)
        ((uint16_t *)b.p)[i] = bk_sround_bf16(v, bk_sround_field(r, w));
    else if (h->stochastic == BK_SROUND_HASH3)
        ((uint16_t *)b.p)[i] = bk_sround_bf16(v, bk_sround_bits3(h->key, h->index0 + i, w));
    else
        ((uint16_t *)b.p)[i] = f32_to_bf16(v);
}

static void cpu_clip_coef(backend_t *be, float *coef, const double *sq, int n, double max_norm)
{
    (void)be;
    double total = 0;
    for (int i = 0; i < n; i++)
        total += sq[i];
    *coef = bk_clip_coef(total, max_norm);
}

static void cpu_adamw(backend_t *be, bk_buf_t p, bk_buf_t g, bk_buf_t m, bk_buf_t v, int64_t n, const bk_adamw_t *h)
{
    bk_buf_t pmv[3] = {p, m, v};
    if (same_dt(be, "adamw", 3, pmv) < 0 || check_dt(be, "adamw", 1, &g) < 0)
        return;
    if (h->stochastic != BK_ROUND_NEAREST && h->stochastic != BK_SROUND && h->stochastic != BK_SROUND_HASH3) {
        bad(be, "internal: adamw: rounding %d unknown", h->stochastic);
        return;
    }
    float b1 = h->b1, b2 = h->b2, eps = h->eps, gs = h->gscale_dev ? *h->gscale_dev : h->gscale;
    float decay = 1.0f - h->lr * h->wd;
    float step = (float)(h->lr / h->bc1);
    float bc2s = (float)sqrt(h->bc2);
    if (p.dt == DT_F32 && g.dt == DT_F32) {
        float *pp = p.p, *mp = m.p, *vp = v.p;
        const float *gp = g.p;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float gi = gp[i] * gs;
            mp[i] = b1 * mp[i] + (1.0f - b1) * gi;
            vp[i] = b2 * vp[i] + (1.0f - b2) * gi * gi;
            pp[i] = pp[i] * decay - step * mp[i] / (sqrtf(vp[i]) / bc2s + eps);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = ld(g, i) * gs;
        float mi = b1 * ld(m, i) + (1.0f - b1) * gi;
        float vi = b2 * ld(v, i) + (1.0f - b2) * gi * gi;
        float pi = ld(p, i) * decay - step * mi / (sqrtf(vi) / bc2s + eps);
        uint64_t r = p.dt == DT_BF16 && h->stochastic == BK_SROUND ? bk_sround_hash(h->key, h->index0 + i) : 0;
        st_state(p, i, pi, h, r, 0);
        st_state(m, i, mi, h, r, 1);
        st_state(v, i, vi, h, r, 2);
    }
}

/* ---- optional fused ops (backend.h; off unless FTK_FUSED selects them) ---------------------- */

/* Each is its documented sequence in one call, with the sequence's arithmetic element by
 * element: the same bits as the plain ops, so FTK_FUSED=all on the CPU checks the model's
 * fused path, not other numerics. */

static void cpu_rope_qk(backend_t *be, bk_buf_t q, bk_buf_t k, const int32_t *pos, int64_t n, int n_head, int n_kv,
                        int hd, float theta, int inverse)
{
    cpu_rope(be, q, pos, n, n_head, hd, theta, inverse);
    cpu_rope(be, k, pos, n, n_kv, hd, theta, inverse);
}

/* swiglu_fwd/bwd's expressions, with g and u the column blocks of one gu row. */
static void cpu_glu_fwd(backend_t *be, bk_buf_t h, bk_buf_t gu, int64_t n, int64_t F)
{
    bk_buf_t b[2] = {h, gu};
    if (same_dt(be, "glu_fwd", 2, b) < 0)
        return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < F; j++)
            st(h, i * F + j, swiglu_h(ld(gu, i * 2 * F + j), ld(gu, i * 2 * F + F + j)));
}

static void cpu_glu_bwd(backend_t *be, bk_buf_t dgu, bk_buf_t dh, bk_buf_t gu, int64_t n, int64_t F)
{
    bk_buf_t b[3] = {dgu, dh, gu};
    if (same_dt(be, "glu_bwd", 3, b) < 0)
        return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < F; j++) {
            int64_t g = i * 2 * F + j, u = g + F;
            float a, b;
            swiglu_d(ld(dh, i * F + j), ld(gu, g), ld(gu, u), &a, &b);
            st(dgu, u, b);
            st(dgu, g, a);
        }
}

/* q, k, v and the fused product's row side by side; per row, cpu_rope's rotation (the same
 * table and expressions) between the widened source and the stored destination. */
static void cpu_qkv_rope(backend_t *be, bk_buf_t qkv, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int32_t *pos,
                         int64_t n, int n_head, int n_kv, int hd, float theta, int inverse)
{
    bk_buf_t b[4] = {qkv, q, k, v};
    if (same_dt(be, "qkv_rope", 4, b) < 0)
        return;
    int half = hd / 2;
    int64_t Hq = (int64_t)n_head * hd, Hk = (int64_t)n_kv * hd, W = Hq + 2 * Hk;
    size_t es = dtype_size(qkv.dt);
    float *inv = scratch(half);
    for (int j = 0; j < half; j++)
        inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
#pragma omp parallel
    {
        float *t = scratch(W), *o = scratch(W); /* a row of [q k] read, and rotated */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            /* source and destination of the q and k parts, as fp32 rows */
            const float *src;
            if (!inverse) {
                src = rd(qkv, i * W, Hq + Hk, t);
            } else {
                rd(q, i * Hq, Hq, t);
                rd(k, i * Hk, Hk, t + Hq);
                if (q.dt == DT_F32) { /* rd returned the buffers themselves: gather them */
                    memcpy(t, (const float *)q.p + i * Hq, (size_t)Hq * sizeof *t);
                    memcpy(t + Hq, (const float *)k.p + i * Hk, (size_t)Hk * sizeof *t);
                }
                src = t;
            }
            for (int j = 0; j < half; j++) {
                float a = (float)pos[i] * inv[j];
                float c = cosf(a), s = inverse ? -sinf(a) : sinf(a);
                for (int h = 0; h < n_head + n_kv; h++) {
                    const float *x = src + (int64_t)h * hd;
                    float *y = o + (int64_t)h * hd;
                    float x1 = x[j], x2 = x[j + half];
                    y[j] = x1 * c - x2 * s;
                    y[j + half] = x2 * c + x1 * s;
                }
            }
            if (!inverse) {
                for (int64_t e = 0; e < Hq; e++)
                    st(q, i * Hq + e, o[e]);
                for (int64_t e = 0; e < Hk; e++)
                    st(k, i * Hk + e, o[Hq + e]);
                memcpy((char *)v.p + (size_t)(i * Hk) * es, (const char *)qkv.p + (size_t)(i * W + Hq + Hk) * es,
                       (size_t)Hk * es);
            } else {
                for (int64_t e = 0; e < Hq + Hk; e++)
                    st(qkv, i * W + e, o[e]);
                memcpy((char *)qkv.p + (size_t)(i * W + Hq + Hk) * es, (const char *)v.p + (size_t)(i * Hk) * es,
                       (size_t)Hk * es);
            }
        }
        free(t);
        free(o);
    }
    free(inv);
}

/* add's sum rounded to xsum, then cpu_rmsnorm_fwd on the stored values: the reference is
 * the sequence itself (two passes; the fusion is the GPU's business). */
static void cpu_add_rmsnorm_fwd(backend_t *be, bk_buf_t xsum, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t r,
                                bk_buf_t w, int64_t n, int64_t d, float eps)
{
    bk_buf_t s3[3] = {xsum, x, r}, b[2] = {out, w};
    if (same_dt(be, "add_rmsnorm_fwd", 3, s3) < 0 || check_dt(be, "add_rmsnorm_fwd", 2, b) < 0)
        return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n * d; i++)
        st(xsum, i, ld(x, i) + ld(r, i));
    cpu_rmsnorm_fwd(be, out, rstd, xsum, w, n, d, eps);
}

/* The reference: adamw tensor by tensor, exactly backend.h's definition. Off by default
 * like every fused op on the CPU; FTK_FUSED=all (unit/trainer-fused) runs the sharding
 * engine's path through it. */
static void cpu_adamw_multi(backend_t *be, const bk_adamw_seg_t *segs, int n_segs, dtype_t state_dt, dtype_t grad_dt,
                            const bk_adamw_t *h)
{
    for (int s = 0; s < n_segs; s++) {
        bk_adamw_t hs = *h;
        hs.wd = segs[s].wd;
        hs.key = segs[s].key;
        hs.index0 = segs[s].index0;
        cpu_adamw(be, bk_buf(segs[s].p, state_dt), bk_buf((void *)segs[s].g, grad_dt), bk_buf(segs[s].m, state_dt),
                  bk_buf(segs[s].v, state_dt), segs[s].n, &hs);
    }
}

static void cpu_destroy(backend_t *be) { free(be->ctx); }

backend_t *backend_cpu_new(void)
{
    backend_t *be = bk_instance_ctx_new("cpu", "cpu", sizeof(cpu_ctx_t));
    if (!be)
        return NULL;
    cpu_ctx_t *c = be->ctx;
    /* Every product calls BLAS from inside a parallel loop, one call per thread. OpenBLAS's
     * OpenMP build then runs each call on its thread; a build with threads of its own would
     * split each call again by the machine's core count: make it run them on one. (In the
     * OpenMP build openblas_set_num_threads would also set OpenMP's count, -j.) */
    if (openblas_get_parallel() == 1)
        openblas_set_num_threads(1);
    be->destroy = cpu_destroy;
    be->mem_alloc = cpu_mem_alloc;
    be->mem_free = cpu_mem_free;
    be->mem_avail = cpu_mem_avail;
    be->host_ptr = cpu_host_ptr;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->zero = cpu_zero;
    be->copy = cpu_copy;
    be->sync = cpu_sync;
    bk_host_streams(be); /* every op has finished when it returns */
#define CPU_OP(name, kind, params, args, cost) be->name = cpu_##name;
    BK_OPS(CPU_OP)
#undef CPU_OP
    if (!(c->ws = bk_alloc(be, BK_CPU_WORKSPACE_BYTES, BK_MEM_WORKSPACE, "the bf16 product tiles"))) {
        backend_free(be);
        return NULL;
    }
    /* The reference runs the sequence unless FTK_FUSED says otherwise. */
    if (bk_fused_select(be, 0) < 0) {
        backend_free(be);
        return NULL;
    }
    return be;
}
