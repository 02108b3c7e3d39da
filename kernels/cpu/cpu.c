/* cpu.c — the CPU backend: fp32, OpenMP, BLAS for the matrix products. This is the
 * reference every other backend is checked against, so it is written to be read: one
 * plain loop nest per op, the maths of backend.h and nothing clever.
 *
 * Determinism (backend.h): work is split so that every output element is computed by
 * one thread in a fixed order, and reductions across threads (Σx², the loss) sum
 * fixed-size blocks then add the block sums in order, so the result does not depend on
 * the number of threads. Dot products use 8 independent partial sums, which lets the
 * compiler vectorise them without -ffast-math. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../../libcommon/log.h"
#include "../backend.h"

static void *cpu_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
        ftk_err_set("out of memory (%zu bytes)", bytes);
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}
static void cpu_free(void *p) { free(p); }
/* memmove: a world of one's collectives copy through this too (comm_set_copy). */
static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}
static void cpu_zero(void *p, size_t bytes)
{
    if (bytes)
        memset(p, 0, bytes);
}

static int cpu_sync(void) { return 0; }

static void cpu_matmul(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B,
                       float beta, float *C)
{
    if (M == 0 || N == 0)
        return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, alpha, A, ta ? (int)M : (int)K, B, tb ? (int)K : (int)N, beta, C, (int)N);
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

static void cpu_embed_fwd(float *out, const int32_t *ids, const float *table, int64_t n, int64_t d)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy(out + i * d, table + (int64_t)ids[i] * d, (size_t)d * sizeof(float));
}

/* Columns are split over threads; each thread walks the tokens in order, so repeated ids
 * accumulate in the same order whatever the thread count. */
static void cpu_embed_bwd(float *dtable, const int32_t *ids, const float *dout, int64_t n, int64_t d)
{
    const int64_t cb = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < d; c0 += cb) {
        int64_t c1 = c0 + cb < d ? c0 + cb : d;
        for (int64_t i = 0; i < n; i++) {
            float *row = dtable + (int64_t)ids[i] * d;
            const float *g = dout + i * d;
            for (int64_t c = c0; c < c1; c++)
                row[c] += g[c];
        }
    }
}

static void cpu_rows_scatter(float *dst, const int32_t *idx, const float *src, int64_t n, int64_t d)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + (int64_t)idx[i] * d, src + i * d, (size_t)d * sizeof(float));
}

static void cpu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        float r = 1.0f / sqrtf(dot(xi, xi, d) / (float)d + eps);
        rstd[i] = r;
        for (int64_t j = 0; j < d; j++)
            out[i * d + j] = (xi[j] * r) * w[j];
    }
}

/* y = x·r·w with r = (mean(x²)+eps)^-1/2:
 * dx = r·(dy·w) − r³/d · x · Σ(dy·w·x);  dw = Σ_i dy·x·r. */
static void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                            const float *rstd, int64_t n, int64_t d)
{
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *xi = x + i * d, *gi = dout + i * d;
            float r = rstd[i];
            float acc[8] = {0};
            int64_t j = 0;
            for (; j + 8 <= d; j += 8)
                for (int l = 0; l < 8; l++)
                    acc[l] += gi[j + l] * w[j + l] * xi[j + l];
            float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; j < d; j++)
                s += gi[j] * w[j] * xi[j];
            float c = s * r * r * r / (float)d;
            for (j = 0; j < d; j++)
                dx[i * d + j] += r * gi[j] * w[j] - c * xi[j];
        }
        const int64_t cb = 64;
#pragma omp for schedule(static)
        for (int64_t c0 = 0; c0 < d; c0 += cb) {
            int64_t c1 = c0 + cb < d ? c0 + cb : d;
            float acc[64] = {0};
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = c0; c < c1; c++)
                    acc[c - c0] += dout[i * d + c] * x[i * d + c] * rstd[i];
            for (int64_t c = c0; c < c1; c++)
                dw[c] += acc[c - c0];
        }
    }
}

/* HF: inv_freq_j = 1 / theta^(2j/hd) in float32, angle = pos·inv_freq in float32. */
static void cpu_rope(float *x, const int32_t *pos, int64_t n, int n_head, int hd, float theta, int inverse)
{
    int half = hd / 2;
    float *inv = malloc((size_t)half * sizeof *inv);
    if (!inv)
        abort(); /* a few hundred bytes: not worth an error path through every caller */
    for (int j = 0; j < half; j++)
        inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < half; j++) {
            float a = (float)pos[i] * inv[j];
            float c = cosf(a), s = inverse ? -sinf(a) : sinf(a);
            for (int h = 0; h < n_head; h++) {
                float *v = x + (i * n_head + h) * hd;
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * c - x2 * s;
                v[j + half] = x2 * c + x1 * s;
            }
        }
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

/* One task per (segment, query head): writes only that head's rows of out and lse. */
static void cpu_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const int64_t *seg,
                         int64_t n_seg, int n_head, int n_kv, int hd)
{
    int64_t lmax = max_seg_len(seg, n_seg);
    int group = n_head / n_kv;
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *p = malloc((size_t)lmax * sizeof *p);
        if (!p)
            abort();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_seg * n_head; task++) {
            int64_t s = task / n_head, a = seg[s], len = seg[s + 1] - a;
            int h = (int)(task % n_head), kh = h / group;
            for (int64_t i = 0; i < len; i++)
                lse[(a + i) * n_head + h] = attend_row(q + (a + i) * qs + h * hd, k + a * ks + kh * hd,
                                                       v + a * ks + kh * hd, i + 1, ks, hd, scale, p,
                                                       out + (a + i) * qs + h * hd);
        }
        free(p);
    }
}

/* One task per (segment, key/value head): it owns dk and dv of that head in the segment
 * and dq of the query heads of its group, so no two tasks write the same element.
 * With p = softmax row, D_i = dout_i·out_i: ds_j = p_j (dout_i·v_j − D_i). */
static void cpu_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *out, const float *lse, const int64_t *seg, int64_t n_seg,
                         int n_head, int n_kv, int hd)
{
    int64_t lmax = max_seg_len(seg, n_seg);
    int group = n_head / n_kv;
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *ds = malloc((size_t)lmax * sizeof *ds);
        if (!ds)
            abort();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_seg * n_kv; task++) {
            int64_t s = task / n_kv, a = seg[s], len = seg[s + 1] - a;
            int kh = (int)(task % n_kv);
            for (int64_t i = 0; i < len; i++) {
                memset(dk + (a + i) * ks + kh * hd, 0, (size_t)hd * sizeof(float));
                memset(dv + (a + i) * ks + kh * hd, 0, (size_t)hd * sizeof(float));
            }
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                for (int64_t i = 0; i < len; i++) {
                    const float *qi = q + (a + i) * qs + h * hd, *gi = dout + (a + i) * qs + h * hd;
                    float l = lse[(a + i) * n_head + h];
                    float D = dot(gi, out + (a + i) * qs + h * hd, hd);
                    float *dqi = dq + (a + i) * qs + h * hd;
                    memset(dqi, 0, (size_t)hd * sizeof *dqi);
                    for (int64_t j = 0; j <= i; j++) {
                        const float *kj = k + (a + j) * ks + kh * hd, *vj = v + (a + j) * ks + kh * hd;
                        float pj = expf(dot(qi, kj, hd) * scale - l);
                        ds[j] = pj * (dot(gi, vj, hd) - D);
                        axpy(dv + (a + j) * ks + kh * hd, pj, gi, hd);
                    }
                    for (int64_t j = 0; j <= i; j++) {
                        axpy(dqi, ds[j] * scale, k + (a + j) * ks + kh * hd, hd);
                        axpy(dk + (a + j) * ks + kh * hd, ds[j] * scale, qi, hd);
                    }
                }
            }
        }
        free(ds);
    }
}

static void cpu_attn_cached(float *out, const float *q, const float *kc, const float *vc, int64_t n, int64_t p0,
                            int n_head, int n_kv, int hd)
{
    int group = n_head / n_kv;
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *p = malloc((size_t)(p0 + n) * sizeof *p);
        if (!p)
            abort();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n * n_head; task++) {
            int64_t i = task / n_head, last = p0 + i;
            int h = (int)(task % n_head), kh = h / group;
            attend_row(q + i * qs + h * hd, kc + kh * hd, vc + kh * hd, last + 1, ks, hd, scale, p,
                       out + i * qs + h * hd);
        }
        free(p);
    }
}

static void cpu_swiglu_fwd(float *h, const float *g, const float *u, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* silu(g) = g·σ(g); silu'(g) = σ(g)·(1 + g·(1 − σ(g))). */
static void cpu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + expf(-g[i]));
        du[i] = dh[i] * g[i] * sg;
        dg[i] = dh[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
    }
}

static double cpu_xent(float *logits, const int32_t *targets, const float *weights, int64_t n, int64_t V,
                       float grad_scale)
{
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
    return total;
}

static void cpu_add(float *y, const float *x, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

static void cpu_scale(float *y, float a, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        y[i] *= a;
}

#define SUMSQ_BLOCK 65536
static double cpu_sumsq(const float *x, int64_t n)
{
    int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double *part = malloc((size_t)(nb ? nb : 1) * sizeof *part);
    if (!part)
        abort();
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t e = (b + 1) * SUMSQ_BLOCK < n ? (b + 1) * SUMSQ_BLOCK : n;
        double s = 0;
        for (int64_t i = b * SUMSQ_BLOCK; i < e; i++)
            s += (double)x[i] * x[i];
        part[b] = s;
    }
    double total = 0;
    for (int64_t b = 0; b < nb; b++)
        total += part[b];
    free(part);
    return total;
}

static void cpu_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2, float eps,
                      float wd, double bc1, double bc2)
{
    float decay = 1.0f - lr * wd;
    float step = (float)(lr / bc1);
    float bc2s = (float)sqrt(bc2);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        p[i] = p[i] * decay - step * m[i] / (sqrtf(v[i]) / bc2s + eps);
    }
}

static const backend_t cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .matmul = cpu_matmul,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .rows_scatter = cpu_rows_scatter,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope = cpu_rope,
    .attn_fwd = cpu_attn_fwd,
    .attn_bwd = cpu_attn_bwd,
    .attn_cached = cpu_attn_cached,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .xent = cpu_xent,
    .add = cpu_add,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
};

const backend_t *backend_cpu(void) { return &cpu_backend; }
