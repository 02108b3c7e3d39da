/* ops_defs.c — one descriptor per op (ops_table.h's ops_desc_t): for each op, its cases, how
 * a case runs, how it is named, its bounds on the CPU and on CUDA with their reasons, its
 * gradient check, its rows in the benchmark; OPS_LIST (ops_table.h) registers them in
 * ops_descs[]. Ops of one family share a run function and a section. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/sround.h"
#include "../../libcommon/log.h"
#include "ops_impl.h"

#define U_BF16 OPS_U_BF16
#define EPS32 OPS_EPS32

/* the dtype configurations a case runs in */
#define F32 OPS_CFG(OPS_F32)
#define BOTH (OPS_CFG(OPS_F32) | OPS_CFG(OPS_BF16))
#define ALL (BOTH | OPS_CFG(OPS_MIXED) | OPS_CFG(OPS_NARROW))
#define NARROW OPS_CFG(OPS_NARROW)
/* a descriptor's cases, and its larger ones */
#define CASES(a) .cases = a, .n_cases = (int)(sizeof a / sizeof *a)
#define LARGE(a) .large = a, .n_large = (int)(sizeof a / sizeof *a)
#define PERF(a) .perf = a, .n_perf = (int)(sizeof a / sizeof *a)

/* n floats in a new f32 buffer on be (the gradient checks' inputs and outputs) */
static bk_buf_t up(backend_t *be, const float *x, int64_t n) { return ops_fd_up(be, x, n); }

static int always(const ops_case_t *c)
{
    (void)c;
    return 1;
}

/* shapes shared by several ops */
static void shape_nd(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "n=%lld d=%lld", (long long)c->n, (long long)c->d);
}

/* ---- convert ---------------------------------------------------------------------------- */

static void run_convert(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    bk_buf_t src = put(R, in_dt(cfg), hrand(R, c->n, 3), c->n), dst = poisoned(R, acc_dt(cfg), c->n);
    R->be->convert(R->be, dst, src, c->n);
    output(R, "dst", dst, c->n, 1);
}

static const ops_case_t cases_convert[] = {
    {.op = OP_CONVERT, .cfgs = ALL, .n = 1001},
    {.op = OP_CONVERT, .cfgs = ALL, .n = 1},
    {.op = OP_CONVERT, .cfgs = ALL, .n = 1001, .offset = 4},
};

/* A copy with one rounding: the CPU's bits on CUDA. */
static const ops_desc_t desc_convert = {
    .name = "convert",
    CASES(cases_convert),
    .run = run_convert,
};

/* ---- matmul ----------------------------------------------------------------------------- */

static void run_matmul(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    int64_t M = c->M, N = c->N, K = c->K;
    bk_buf_t A = put(R, in_dt(cfg), hrand(R, M * K, 1), M * K), B = put(R, in_dt(cfg), hrand(R, K * N, 1), K * N);
    /* beta = 0 must not read C: NaN there would show */
    bk_buf_t C = c->beta != 0.0f ? put(R, acc_dt(cfg), hrand(R, M * N, 1), M * N) : poisoned(R, acc_dt(cfg), M * N);
    R->be->matmul(R->be, c->ta, c->tb, M, N, K, c->alpha, A, B, c->beta, C);
    output(R, "C", C, M * N, 1);
}

static void shape_matmul(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "%lldx%lldx%lld ta=%d tb=%d alpha=%g beta=%g", (long long)c->M, (long long)c->N,
             (long long)c->K, c->ta, c->tb, c->alpha, c->beta);
}

/* CPU: the fp32 path is one BLAS call per tile of C over all of K, the bf16 path (bf16 A
 * and B, or a bf16 C) multiplies 256-tiles and sums over K tiles in its own fp32 tile: two
 * fp32 sums of K products in different orders. Their difference is of the order √K·2^-24
 * of rms(C) (random rounding errors); the bound K·2^-24 leaves a factor √K, plus u when C
 * is bf16. Not the fp32 result rounded, then. */
static double cpu_tol_matmul(const ops_case_t *c, const ops_out_t *o, int *exact)
{
    *exact = 0;
    return (o->dt == DT_BF16 ? o->rounds * U_BF16 : 0) + (double)c->K * EPS32;
}

/* CUDA: two sums of K fp32 products in different orders differ by about 0.6·√K·2^-24 of
 * rms(C) (random rounding errors); 16·√K·2^-24 leaves the largest of a million elements
 * room, and at least 1e-5. When the GPU multiplies f32 inputs in bf16 (FTK_CUDA_MATMUL
 * unset) each input is rounded by up to 2^-8: an error of about 2^-8 of rms(C) (its largest
 * element reached 1.1e-2 on the CPU simulating it), bound 3e-2. bf16 inputs multiply
 * exactly either way. */
static double gpu_tol_matmul(const ops_case_t *c, ops_cfg_t cfg, const ops_out_t *o, int mm_exact)
{
    (void)o;
    return !mm_exact && (cfg == OPS_F32 || cfg == OPS_NARROW) ? 3e-2 : fmax(1e-5, 16 * sqrt((double)c->K) / 16777216);
}

/* matmul: L(A, B) = Σ w·(alpha·op(A)·op(B) + beta·C0); the gradients through the other
 * three transpositions: dA = alpha·dC·op(B)ᵀ (stored as A is, so (alpha·op(B)·dCᵀ) when
 * ta), dB = alpha·op(A)ᵀ·dC (alpha·dCᵀ·op(A) when tb). */
static double mm_loss(ops_fd_t *f, float *const *x)
{
    const ops_case_t *c = f->c;
    backend_t *be = f->be;
    bk_buf_t A = up(be, x[0], c->M * c->K), B = up(be, x[1], c->K * c->N), C = up(be, f->scratch[2], c->M * c->N);
    be->matmul(be, c->ta, c->tb, c->M, c->N, c->K, c->alpha, A, B, c->beta, C);
    float *y = ops_get(be, C, c->M * c->N);
    double L = ops_fd_wdot(f, y, c->M * c->N);
    free(y);
    bk_free(be, A.p);
    bk_free(be, B.p);
    bk_free(be, C.p);
    return L;
}
static void grad_matmul(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *gs)
{
    ops_fd_t f = {.be = be, .c = c, .loss = mm_loss};
    int64_t M = c->M, N = c->N, K = c->K;
    ops_fd_input(&f, rng, "A", M * K, 1);
    ops_fd_input(&f, rng, "B", K * N, 1);
    f.w = ops_rand(rng, M * N, 1, 1);
    f.scratch[2] = ops_rand(rng, M * N, 1, 1); /* C0, not perturbed */
    bk_buf_t A = up(be, f.x[0], M * K), B = up(be, f.x[1], K * N), dC = up(be, f.w, M * N);
    bk_buf_t dA = up(be, f.e[0], M * K), dB = up(be, f.e[1], K * N); /* overwritten: beta 0 */
    if (c->ta) /* A is [K, M]: dA = op(B)·dCᵀ */
        be->matmul(be, c->tb, 1, K, M, N, c->alpha, B, dC, 0, dA);
    else
        be->matmul(be, 0, !c->tb, M, K, N, c->alpha, dC, B, 0, dA);
    if (c->tb) /* B is [N, K]: dB = dCᵀ·op(A) */
        be->matmul(be, 1, c->ta, N, K, M, c->alpha, dC, A, 0, dB);
    else
        be->matmul(be, !c->ta, 0, K, N, M, c->alpha, A, dC, 0, dB);
    float *g[2] = {ops_get(be, dA, M * K), ops_get(be, dB, K * N)};
    ops_fd_check(&f, g, gs);
    free(g[0]);
    free(g[1]);
    free(f.scratch[2]);
    f.scratch[2] = NULL;
    bk_free(be, A.p), bk_free(be, B.p), bk_free(be, dC.p), bk_free(be, dA.p), bk_free(be, dB.p);
    ops_fd_free(&f);
}

#define MM(m, n, k, a, b, al, be) \
    {.op = OP_MATMUL, .cfgs = ALL, .M = m, .N = n, .K = k, .ta = a, .tb = b, .alpha = al, .beta = be}
/* every transposition and beta across the 256 tiles, then the model's three products
 * (y = x·Wᵀ, dx = dy·W, dW += dyᵀ·x) at 37 tokens, dW at 998 tokens (K over BLAS's K
 * block, which OpenBLAS cuts differently on one thread and on several: test_ops compares
 * 1 and 2 threads), then degenerate sizes */
static const ops_case_t cases_matmul[] = {
    MM(300, 260, 270, 0, 0, 1.0f, 0.0f), MM(300, 260, 270, 0, 0, 0.5f, 1.0f),
    MM(300, 260, 270, 0, 1, 1.0f, 0.0f), MM(300, 260, 270, 0, 1, 1.0f, 1.0f),
    MM(300, 260, 270, 1, 0, 1.0f, 0.0f), MM(300, 260, 270, 1, 0, 0.5f, 1.0f),
    MM(300, 260, 270, 1, 1, 1.0f, 0.0f), MM(300, 260, 270, 1, 1, 1.0f, 1.0f),
    MM(37, 300, 100, 0, 1, 1.0f, 0.0f), MM(37, 100, 300, 0, 0, 1.0f, 1.0f),
    MM(300, 100, 37, 1, 0, 1.0f, 1.0f), MM(100, 70, 998, 1, 0, 1.0f, 1.0f), MM(1, 7, 3, 0, 1, 1.0f, 0.0f),
    MM(5, 1, 513, 1, 0, 1.0f, 1.0f), MM(257, 3, 1, 0, 0, 2.0f, 0.0f),
    {.op = OP_MATMUL, .cfgs = ALL, .M = 300, .N = 259, .K = 270, .tb = 1, .alpha = 1, .beta = 1, .offset = 1},
};
/* larger (gpu_ops): many blocks; f32 inputs into a bf16 C larger than the 32 MiB workspace:
 * the GPU makes the product in fp32 blocks of rows (3994 rows of 2100, then 106), A read at
 * an offset into each */
static const ops_case_t large_matmul[] = {
    {.op = OP_MATMUL, .cfgs = ALL, .M = 1000, .N = 1536, .K = 1030, .tb = 1, .alpha = 1},
    {.op = OP_MATMUL, .cfgs = ALL, .M = 1536, .N = 1000, .K = 1030, .ta = 1, .alpha = 1, .beta = 1},
    {.op = OP_MATMUL, .cfgs = NARROW, .M = 4100, .N = 2100, .K = 64, .ta = 1, .alpha = 0.5f, .beta = 1},
    {.op = OP_MATMUL, .cfgs = NARROW, .M = 4100, .N = 2100, .K = 64, .tb = 1, .alpha = 1},
};

static const ops_desc_t desc_matmul = {
    .name = "matmul",
    CASES(cases_matmul),
    LARGE(large_matmul),
    .run = run_matmul,
    .shape = shape_matmul,
    .cpu_tol = cpu_tol_matmul,
    .gpu_tol_fn = gpu_tol_matmul,
    .grad = grad_matmul,
    .grad_names = {"dA", "dB"},
};

/* ---- embed_fwd, embed_bwd, rows_scatter --------------------------------------------------- */

/* embed_fwd, embed_bwd (dtable adds), rows_scatter (distinct rows). */
static void run_embed(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    backend_t *be = R->be;
    int64_t n = c->n, d = c->d, V = c->V;
    int32_t *ids;
    if (c->op == OP_ROWS_SCATTER) { /* distinct: the first n of a random permutation */
        ids = keep_host(R, ops_xmalloc((size_t)V * sizeof *ids));
        for (int64_t i = 0; i < V; i++)
            ids[i] = (int32_t)i;
        for (int64_t i = V - 1; i > 0; i--) {
            int64_t j = (int64_t)(ops_urand(&R->rng) * (double)(i + 1));
            int32_t t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
        }
    } else {
        ids = keep_host(R, ops_rand_ids(&R->rng, n, V));
    }
    const int32_t *d_ids = put_raw(R, ids, (size_t)n * sizeof *ids);
    if (c->op == OP_EMBED_FWD) {
        bk_buf_t table = put(R, in_dt(cfg), hrand(R, V * d, 1), V * d), out = poisoned(R, in_dt(cfg), n * d);
        be->embed_fwd(be, out, d_ids, table, n, d);
        output(R, "out", out, n * d, 1);
    } else if (c->op == OP_EMBED_BWD) {
        bk_buf_t dtable = put(R, acc_dt(cfg), hrand(R, V * d, 1), V * d);
        bk_buf_t dout = put(R, in_dt(cfg), hrand(R, n * d, 1), n * d);
        be->embed_bwd(be, dtable, d_ids, dout, n, d);
        int64_t most = 0; /* the most tokens one row collects: each add is rounded */
        for (int64_t v = 0; v < V; v++) {
            int64_t k = 0;
            for (int64_t i = 0; i < n; i++)
                k += ids[i] == v;
            most = k > most ? k : most;
        }
        output(R, "dtable", dtable, V * d, (int)(most > 0 ? most : 1));
    } else {
        bk_buf_t dst = put(R, in_dt(cfg), hrand(R, V * d, 1), V * d), src = put(R, in_dt(cfg), hrand(R, n * d, 1), n * d);
        be->rows_scatter(be, dst, d_ids, src, n, d);
        output(R, "dst", dst, V * d, 1);
    }
}

static void shape_embed(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "n=%lld V=%lld d=%lld", (long long)c->n, (long long)c->V, (long long)c->d);
}

/* embed: L(table) = Σ w·table[ids]; the gradient by embed_bwd into zeros. */
static double embed_loss(ops_fd_t *f, float *const *x)
{
    const ops_case_t *c = f->c;
    backend_t *be = f->be;
    bk_buf_t T = up(be, x[0], c->V * c->d), O = up(be, f->w, c->n * c->d);
    int32_t *ids = ops_put_raw(be, f->ids, (size_t)c->n * sizeof *ids);
    be->embed_fwd(be, O, ids, T, c->n, c->d);
    float *y = ops_get(be, O, c->n * c->d);
    double L = ops_fd_wdot(f, y, c->n * c->d);
    free(y);
    bk_free(be, T.p), bk_free(be, O.p), bk_free(be, ids);
    return L;
}
static void grad_embed(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *gs)
{
    ops_fd_t f = {.be = be, .c = c, .loss = embed_loss};
    ops_fd_input(&f, rng, "table", c->V * c->d, 1);
    f.w = ops_rand(rng, c->n * c->d, 1, 1);
    f.ids = ops_rand_ids(rng, c->n, c->V);
    float *zero = calloc((size_t)(c->V * c->d), sizeof *zero);
    bk_buf_t dT = up(be, zero, c->V * c->d), dO = up(be, f.w, c->n * c->d);
    int32_t *ids = ops_put_raw(be, f.ids, (size_t)c->n * sizeof *ids);
    be->embed_bwd(be, dT, ids, dO, c->n, c->d);
    float *g[1] = {ops_get(be, dT, c->V * c->d)};
    ops_fd_check(&f, g, gs);
    free(g[0]);
    free(zero);
    bk_free(be, dT.p), bk_free(be, dO.p), bk_free(be, ids);
    ops_fd_free(&f);
}

static const ops_case_t cases_embed_fwd[] = {
    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 77, .V = 13, .d = 100},
    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 9, .V = 40, .d = 1000},
    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 1, .V = 3, .d = 64},
    /* a view 4 elements in: 8-byte aligned bf16, 16-byte aligned fp32 (the CUDA 16-byte
     * accesses are taken for one and not the other) */
    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 9, .V = 40, .d = 1000, .offset = 4},
};
/* few rows: every row collects many tokens */
static const ops_case_t cases_embed_bwd[] = {
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 77, .V = 13, .d = 100},
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 9, .V = 40, .d = 1000},
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 1, .V = 3, .d = 64},
    /* chains of ~33 tokens an id: several of the CUDA row kernel's groups of 8 */
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 100, .V = 3, .d = 200},
};
static const ops_case_t large_embed_bwd[] = {
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 700, .V = 50, .d = 384},
};
static const ops_case_t cases_rows_scatter[] = {
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 13, .V = 40, .d = 100},
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 1, .V = 3, .d = 1000},
    /* a view 2 elements in, and aligned: many rows 8 elements a thread */
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 13, .V = 40, .d = 96, .offset = 2},
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 13, .V = 40, .d = 96},
};

/* the benchmark: gathers of N rows of D */
static void perf_embed_fwd(const ops_bench_t *s) { s->be->embed_fwd(s->be, s->y, s->ids, s->w, s->N, s->D); }
static const ops_perf_t perf_embed_fwd_rows[] = {
    {"embed_fwd", perf_embed_fwd, 2, OPS_PER_ND, "embed_fwd bf16, one element a thread"},
};

/* the embedding's gradient into the table (its values only grow a little): read dout, read
 * and write the rows; distinct ids, and one token in 7 the same id */
static void perf_embed_bwd(const ops_bench_t *s) { s->be->embed_bwd(s->be, s->w, s->ids, s->y, s->N, s->D); }
static void perf_embed_bwd_rep(const ops_bench_t *s) { s->be->embed_bwd(s->be, s->w, s->ids_rep, s->y, s->N, s->D); }
static const ops_perf_t perf_embed_bwd_rows[] = {
    {"embed_bwd distinct ids", perf_embed_bwd, 3, OPS_PER_ND, "embed_bwd bf16, per column"},
    {"embed_bwd 1 in 7 one id", perf_embed_bwd_rep, 3, OPS_PER_ND, "embed_bwd bf16 1/7 one id, per column"},
};

/* Gathers and scatters of rows: the CPU's bits on CUDA. embed_bwd rounds the sum of each add
 * into a bf16 dtable: a row that collects r tokens is rounded r times (the output's rounds),
 * each time by at most u of a partial sum. Partial sums of these random-signed terms (a
 * random walk from the initial row) are of the size of |ref| + rms(ref), not bounded by
 * it: r·u is a typical worst case, not a proof (over 200 seeds the largest error seen was
 * 0.76 of it, at r = 2). On CUDA the token sums are made in order, fp32 additions as on
 * the CPU: its bits. */
static const ops_desc_t desc_embed_fwd = {
    .name = "embed_fwd",
    CASES(cases_embed_fwd),
    .run = run_embed,
    .shape = shape_embed,
    PERF(perf_embed_fwd_rows),
};
static const ops_desc_t desc_embed_bwd = {
    .name = "embed_bwd",
    CASES(cases_embed_bwd),
    LARGE(large_embed_bwd),
    .run = run_embed,
    .shape = shape_embed,
    .backward = always,
    .grad = grad_embed,
    .grad_names = {"dtable"},
    PERF(perf_embed_bwd_rows),
};
static const ops_desc_t desc_rows_scatter = {
    .name = "rows_scatter",
    CASES(cases_rows_scatter),
    .run = run_embed,
    .shape = shape_embed,
};

/* ---- rmsnorm_fwd, rmsnorm_bwd ------------------------------------------------------------ */

static void run_rmsnorm(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    backend_t *be = R->be;
    int64_t n = c->n, d = c->d;
    const float eps = 1e-5f;
    float *hx = hrand(R, n * d, 2), *hw = hrand(R, d, 0.5f);
    for (int64_t j = 0; j < d; j++)
        hw[j] = R->full ? 1.0f + hw[j] : ops_round_bf16(1.0f + hw[j]);
    bk_buf_t x = put(R, in_dt(cfg), hx, n * d), w = put(R, in_dt(cfg), hw, d);
    if (c->op == OP_RMSNORM_FWD) {
        bk_buf_t out = poisoned(R, in_dt(cfg), n * d);
        float *rstd = poisoned(R, DT_F32, n).p;
        be->rmsnorm_fwd(be, out, rstd, x, w, n, d, eps);
        output(R, "out", out, n * d, 1);
        output(R, "rstd", bk_buf(rstd, DT_F32), n, 1);
        return;
    }
    /* rstd as the forward pass would have left it, from the stored x */
    float *hr = hzeros(R, n);
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int64_t j = 0; j < d; j++)
            s += (double)hx[i * d + j] * hx[i * d + j];
        hr[i] = (float)(1.0 / sqrt(s / (double)d + eps));
    }
    float *rstd = put(R, DT_F32, hr, n).p;
    bk_buf_t dout = put(R, in_dt(cfg), hrand(R, n * d, 1), n * d);
    bk_buf_t dx = put(R, in_dt(cfg), hrand(R, n * d, 1), n * d), dw = put(R, acc_dt(cfg), hrand(R, d, 1), d);
    be->rmsnorm_bwd(be, dx, dw, dout, x, w, rstd, n, d);
    output(R, "dx", dx, n * d, 1);
    output(R, "dw", dw, d, 1);
}

/* CUDA: dw is a row reduction feeding a second one (over the tokens): 1e-4. */
static double gpu_tol_rmsnorm_bwd(const ops_case_t *c, ops_cfg_t cfg, const ops_out_t *o, int mm_exact)
{
    (void)c, (void)cfg, (void)mm_exact;
    return !strcmp(o->name, "dw") ? 1e-4 : 1e-5;
}

/* rmsnorm: L(x, w) = Σ dout·rmsnorm(x, w); dx and dw by rmsnorm_bwd into zeros. */
static double rms_loss(ops_fd_t *f, float *const *x)
{
    const ops_case_t *c = f->c;
    backend_t *be = f->be;
    int64_t n = c->n, d = c->d;
    bk_buf_t X = up(be, x[0], n * d), W = up(be, x[1], d), O = up(be, f->w, n * d), R = up(be, f->w, n);
    be->rmsnorm_fwd(be, O, R.p, X, W, n, d, 1e-5f);
    float *y = ops_get(be, O, n * d);
    double L = ops_fd_wdot(f, y, n * d);
    free(y);
    bk_free(be, X.p), bk_free(be, W.p), bk_free(be, O.p), bk_free(be, R.p);
    return L;
}
static void grad_rmsnorm(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *gs)
{
    int64_t n = c->n, d = c->d;
    ops_fd_t f = {.be = be, .c = c, .loss = rms_loss};
    ops_fd_input(&f, rng, "x", n * d, 2);
    ops_fd_input(&f, rng, "w", d, 0.5f);
    for (int64_t j = 0; j < d; j++)
        f.x[1][j] = ops_round_bf16(1.0f + f.x[1][j]);
    f.w = ops_rand(rng, n * d, 1, 1);
    float *zero = calloc((size_t)(n * d), sizeof *zero);
    bk_buf_t X = up(be, f.x[0], n * d), W = up(be, f.x[1], d), O = up(be, zero, n * d), R = up(be, zero, n);
    bk_buf_t dO = up(be, f.w, n * d), dX = up(be, zero, n * d), dW = up(be, zero, d);
    be->rmsnorm_fwd(be, O, R.p, X, W, n, d, 1e-5f);
    be->rmsnorm_bwd(be, dX, dW, dO, X, W, R.p, n, d);
    float *g[2] = {ops_get(be, dX, n * d), ops_get(be, dW, d)};
    ops_fd_check(&f, g, gs);
    free(g[0]), free(g[1]), free(zero);
    bk_free(be, X.p), bk_free(be, W.p), bk_free(be, O.p), bk_free(be, R.p), bk_free(be, dO.p), bk_free(be, dX.p),
        bk_free(be, dW.p);
    ops_fd_free(&f);
}

static const ops_case_t cases_rmsnorm_fwd[] = {
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 7, .d = 1000},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 33, .d = 100},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 1, .d = 64},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 130, .d = 96},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 5, .d = 1000, .offset = 4},
    /* Llama widths: more than one 8-element group per thread of a row */
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 5, .d = 4096},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 3, .d = 5120},
};
static const ops_case_t large_rmsnorm_fwd[] = {
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 513, .d = 1000},
};
static const ops_case_t cases_rmsnorm_bwd[] = {
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 7, .d = 1000},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 33, .d = 100},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 1, .d = 64},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 130, .d = 96},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 5, .d = 1000, .offset = 3},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 5, .d = 4096},
    /* CUDA's 16-byte paths: an odd width (neither), the narrowest 8-wide one, a 16-byte
     * aligned view; dx and dw in one pass in blocks of 16 rows, their partials summed in
     * groups of 16: 19 blocks, 2 groups, the last ragged; over 8192 wide the two passes
     * with 8-wide dw columns, 64 chunks of rows */
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 9, .d = 77},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 3, .d = 8},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 70, .d = 1000, .offset = 8},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 300, .d = 64},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 3, .d = 8200},
};
static const ops_case_t large_rmsnorm_bwd[] = {
    {.op = OP_RMSNORM_BWD, .cfgs = BOTH | OPS_CFG(OPS_MIXED), .n = 513, .d = 1000},
    /* over 16384 rows the fused pass's blocks take more than 16 (at most 1024 blocks) */
    {.op = OP_RMSNORM_BWD, .cfgs = BOTH, .n = 16500, .d = 16},
};

static void perf_rmsnorm_fwd(const ops_bench_t *s)
{
    s->be->rmsnorm_fwd(s->be, s->y, s->rstd, s->x, s->w, s->N, s->D, 1e-5f);
}
static const ops_perf_t perf_rmsnorm_fwd_rows[] = {
    {"rmsnorm_fwd", perf_rmsnorm_fwd, 2, OPS_PER_ND, "rmsnorm_fwd bf16, one element a thread"},
};
static void perf_rmsnorm_bwd(const ops_bench_t *s)
{
    s->be->rmsnorm_bwd(s->be, s->y, s->c, s->x, s->x, s->w, s->rstd, s->N, s->D);
}
static const ops_perf_t perf_rmsnorm_bwd_rows[] = {
    {"rmsnorm_bwd (dx and dw)", perf_rmsnorm_bwd, 4, OPS_PER_ND, "rmsnorm_bwd bf16, one element a thread"},
};

static const ops_desc_t desc_rmsnorm_fwd = {
    .name = "rmsnorm_fwd",
    CASES(cases_rmsnorm_fwd),
    LARGE(large_rmsnorm_fwd),
    .run = run_rmsnorm,
    .shape = shape_nd,
    .gpu_tol = 1e-5,
    PERF(perf_rmsnorm_fwd_rows),
};
static const ops_desc_t desc_rmsnorm_bwd = {
    .name = "rmsnorm_bwd",
    CASES(cases_rmsnorm_bwd),
    LARGE(large_rmsnorm_bwd),
    .run = run_rmsnorm,
    .shape = shape_nd,
    .gpu_tol_fn = gpu_tol_rmsnorm_bwd,
    .backward = always,
    .grad = grad_rmsnorm,
    .grad_names = {"dx", "dw"},
    PERF(perf_rmsnorm_bwd_rows),
};

/* ---- rope ------------------------------------------------------------------------------- */

static void run_rope(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    int64_t n = c->n, w = (int64_t)c->n_head * c->hd;
    int32_t *pos = keep_host(R, ops_xmalloc((size_t)n * sizeof *pos));
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)((i * (c->pos_step ? c->pos_step : 1)) % 4096);
    const int32_t *d_pos = put_raw(R, pos, (size_t)n * sizeof *pos);
    bk_buf_t x = put(R, in_dt(cfg), hrand(R, n * w, 2), n * w);
    R->be->rope(R->be, x, d_pos, n, c->n_head, c->hd, c->theta, c->inverse);
    output(R, "x", x, n * w, 1);
}

static void shape_rope(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "n=%lld heads=%d hd=%d theta=%g pos*%d%s", (long long)c->n, c->n_head, c->hd, c->theta,
             c->pos_step ? c->pos_step : 1, c->inverse ? " inverse" : "");
}

/* rope is linear: its inverse must be its transpose, ⟨R a, b⟩ = ⟨a, Rᵀ b⟩, both sides in
 * double from fp32 outputs, each within a few 2^-24 of Σ|terms|: bound 2^-20 of Σ|a·Rᵀb|.
 * And the inverse undoes it: Rᵀ(R x) within a few 2^-24 of |x| + rms: bound 2^-20. Into
 * gs->worst[0] and [1] (the descriptor's grad_names). */
static void grad_rope(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *gs)
{
    int64_t n = c->n, w = (int64_t)c->n_head * c->hd;
    float *a = ops_rand(rng, n * w, 2, 1), *b = ops_rand(rng, n * w, 2, 1);
    int32_t *pos = ops_xmalloc((size_t)n * sizeof *pos);
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)((i * (c->pos_step ? c->pos_step : 1)) % 4096);
    int32_t *dpos = ops_put_raw(be, pos, (size_t)n * sizeof *pos);
    bk_buf_t A = up(be, a, n * w), B = up(be, b, n * w);
    be->rope(be, A, dpos, n, c->n_head, c->hd, c->theta, c->inverse);
    be->rope(be, B, dpos, n, c->n_head, c->hd, c->theta, !c->inverse);
    float *ra = ops_get(be, A, n * w), *rb = ops_get(be, B, n * w);
    double lhs = 0, rhs = 0, S = 0;
    for (int64_t i = 0; i < n * w; i++) {
        lhs += (double)ra[i] * b[i];
        rhs += (double)a[i] * rb[i];
        S += fabs((double)a[i] * rb[i]);
    }
    double rel = fabs(lhs - rhs) / S;
    gs->worst[0] = rel > gs->worst[0] ? rel : gs->worst[0];
    int ok_t = rel <= 1.0 / (1 << 20);
    be->rope(be, A, dpos, n, c->n_head, c->hd, c->theta, !c->inverse); /* back to a */
    float *back = ops_get(be, A, n * w);
    ops_err_t e = ops_compare(a, back, n * w);
    gs->worst[1] = e.max_rel > gs->worst[1] ? e.max_rel : gs->worst[1];
    int ok_rt = e.nan == 0 && e.max_rel <= 1.0 / (1 << 20);
    if (!ok_t || !ok_rt) {
        char name[128];
        ops_case_name(c, name, sizeof name);
        fprintf(stderr, "  %s: inverse against transpose %.3e, inverse(forward(x)) %.3e (bound 2^-20)\n", name, rel,
                e.max_rel);
    }
    gs->checks += 2;
    gs->bad += !ok_t + !ok_rt;
    gs->cases++;
    free(a), free(b), free(pos), free(ra), free(rb), free(back);
    bk_free(be, dpos), bk_free(be, A.p), bk_free(be, B.p);
}

static const ops_case_t cases_rope[] = {
    {.op = OP_ROPE, .cfgs = BOTH, .n = 37, .n_head = 4, .hd = 64, .theta = 10000.0f},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 37, .n_head = 4, .hd = 64, .theta = 10000.0f, .inverse = 1},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 5, .n_head = 8, .hd = 80, .theta = 500000.0f, .pos_step = 997},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 130, .n_head = 1, .hd = 96, .theta = 10000.0f, .pos_step = 31, .inverse = 1},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 1, .n_head = 2, .hd = 128, .theta = 10000.0f},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 33, .n_head = 2, .hd = 128, .theta = 10000.0f, .pos_step = 123},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 9, .n_head = 4, .hd = 64, .theta = 10000.0f, .offset = 1},
    /* CUDA's 16-byte path (hd % 16 == 0, 16-byte aligned) takes 4 heads a thread: 5 leave
     * a tail; at +8 a view that is aligned; hd 24 and 36 (half not a multiple of 8) the
     * one-pair kernel */
    {.op = OP_ROPE, .cfgs = BOTH, .n = 9, .n_head = 5, .hd = 128, .theta = 10000.0f, .pos_step = 7},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 9, .n_head = 4, .hd = 64, .theta = 10000.0f, .inverse = 1, .offset = 8},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 11, .n_head = 3, .hd = 24, .theta = 10000.0f, .pos_step = 5},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 7, .n_head = 2, .hd = 36, .theta = 10000.0f, .inverse = 1},
};
static const ops_case_t large_rope[] = {
    {.op = OP_ROPE, .cfgs = BOTH, .n = 600, .n_head = 6, .hd = 128, .theta = 10000.0f},
};

static void perf_rope(const ops_bench_t *s)
{
    s->be->rope(s->be, s->q, s->pos, s->N, (int)s->H, (int)s->HD, 10000.0f, 0);
}
static const ops_perf_t perf_rope_rows[] = {
    {"rope (q)", perf_rope, 2, OPS_PER_NQ, "rope (q) bf16, one pair a thread"},
};

/* CUDA: the same angles, cosf/sinf of another libm, contracted products: 1e-5. */
static const ops_desc_t desc_rope = {
    .name = "rope",
    CASES(cases_rope),
    LARGE(large_rope),
    .run = run_rope,
    .shape = shape_rope,
    .gpu_tol = 1e-5,
    .grad = grad_rope,
    .grad_names = {"inverse = transpose", "inverse(forward(x)) = x"},
    .grad_linear = 1,
    PERF(perf_rope_rows),
};

/* ---- attn_fwd, attn_bwd, attn_cached ----------------------------------------------------- */

/* Causal attention inside segments, in double on the host (attn_bwd's out and lse). */
static void host_attn(const float *q, const float *k, const float *v, const int64_t *seg, int64_t n_seg, int H, int KV,
                      int hd, float *out, float *lse)
{
    int64_t qs = (int64_t)H * hd, ks = (int64_t)KV * hd, lmax = 1;
    for (int64_t s = 0; s < n_seg; s++)
        lmax = seg[s + 1] - seg[s] > lmax ? seg[s + 1] - seg[s] : lmax;
    double *p = ops_xmalloc((size_t)lmax * sizeof *p), scale = 1.0 / sqrt((double)hd);
    for (int64_t s = 0; s < n_seg; s++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KV);
            for (int64_t i = seg[s]; i < seg[s + 1]; i++) {
                double m = -INFINITY, sum = 0;
                for (int64_t j = seg[s]; j <= i; j++) {
                    double dot = 0;
                    for (int t = 0; t < hd; t++)
                        dot += (double)q[i * qs + h * hd + t] * k[j * ks + kh * hd + t];
                    p[j - seg[s]] = dot * scale;
                    m = fmax(m, dot * scale);
                }
                for (int64_t j = seg[s]; j <= i; j++)
                    sum += p[j - seg[s]] = exp(p[j - seg[s]] - m);
                for (int t = 0; t < hd; t++) {
                    double o = 0;
                    for (int64_t j = seg[s]; j <= i; j++)
                        o += p[j - seg[s]] * v[j * ks + kh * hd + t];
                    out[i * qs + h * hd + t] = (float)(o / sum);
                }
                lse[i * H + h] = (float)(m + log(sum));
            }
        }
    free(p);
}

/* attn_fwd, attn_bwd (from the host's forward), attn_cached. */
static void run_attn(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    backend_t *be = R->be;
    dtype_t dt = in_dt(cfg);
    int H = c->n_head, KV = c->n_kv, hd = c->hd;
    if (c->op == OP_ATTN_CACHED) {
        int64_t n = c->n, ctx = c->p0 + n, qn = n * H * hd, kn = ctx * KV * hd;
        bk_buf_t q = put(R, dt, hrand(R, qn, 2), qn), kc = put(R, dt, hrand(R, kn, 1), kn);
        bk_buf_t vc = put(R, dt, hrand(R, kn, 1), kn), out = poisoned(R, dt, qn);
        be->attn_cached(be, out, q, kc, vc, n, c->p0, H, KV, hd);
        output(R, "out", out, qn, 1);
        return;
    }
    int64_t n = c->seg[c->n_seg], qn = n * H * hd, kn = n * KV * hd;
    /* q twice k's scale: scores of a few units, so the softmax is neither flat nor one-hot */
    float *hq = hrand(R, qn, 2), *hk = hrand(R, kn, 1), *hv = hrand(R, kn, 1);
    bk_buf_t q = put(R, dt, hq, qn), k = put(R, dt, hk, kn), v = put(R, dt, hv, kn);
    if (c->op == OP_ATTN_FWD) {
        bk_buf_t out = poisoned(R, dt, qn);
        float *lse = poisoned(R, DT_F32, n * H).p;
        be->attn_fwd(be, out, lse, q, k, v, c->seg, c->n_seg, H, KV, hd);
        output(R, "out", out, qn, 1);
        output(R, "lse", bk_buf(lse, DT_F32), n * H, 1);
        return;
    }
    float *ho = hzeros(R, qn), *hl = hzeros(R, n * H);
    host_attn(hq, hk, hv, c->seg, c->n_seg, H, KV, hd, ho, hl);
    for (int64_t i = 0; !R->full && i < qn; i++) /* an input like the others */
        ho[i] = ops_round_bf16(ho[i]);
    bk_buf_t out = put(R, dt, ho, qn), dout = put(R, dt, hrand(R, qn, 1), qn);
    float *lse = put(R, DT_F32, hl, n * H).p;
    bk_buf_t dq = poisoned(R, dt, qn), dk = poisoned(R, dt, kn), dv = poisoned(R, dt, kn);
    be->attn_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, c->seg, c->n_seg, H, KV, hd);
    output(R, "dq", dq, qn, 1);
    output(R, "dk", dk, kn, 1);
    output(R, "dv", dv, kn, 1);
}

static void shape_attn(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "n=%lld segs=%lld H=%d KV=%d hd=%d", (long long)c->seg[c->n_seg], (long long)c->n_seg,
             c->n_head, c->n_kv, c->hd);
}
static void shape_attn_cached(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "n=%lld p0=%lld H=%d KV=%d hd=%d", (long long)c->n, (long long)c->p0, c->n_head, c->n_kv,
             c->hd);
}

/* attention: L(q, k, v) = Σ dout·attn(q, k, v); dq, dk, dv by attn_bwd from the forward's
 * out and lse. */
static double attn_loss_out(ops_fd_t *f, float *const *x, float *out_host, float *lse_host)
{
    const ops_case_t *c = f->c;
    backend_t *be = f->be;
    int64_t n = c->seg[c->n_seg], qn = n * c->n_head * c->hd, kn = n * c->n_kv * c->hd;
    bk_buf_t Q = up(be, x[0], qn), K = up(be, x[1], kn), V = up(be, x[2], kn), O = up(be, f->w, qn);
    bk_buf_t L = up(be, f->w, n * c->n_head);
    be->attn_fwd(be, O, L.p, Q, K, V, c->seg, c->n_seg, c->n_head, c->n_kv, c->hd);
    float *y = ops_get(be, O, qn);
    double s = ops_fd_wdot(f, y, qn);
    if (out_host) {
        memcpy(out_host, y, (size_t)qn * sizeof *y);
        be->download(be, lse_host, L.p, (size_t)(n * c->n_head) * sizeof(float));
    }
    free(y);
    bk_free(be, Q.p), bk_free(be, K.p), bk_free(be, V.p), bk_free(be, O.p), bk_free(be, L.p);
    return s;
}
static double attn_loss(ops_fd_t *f, float *const *x) { return attn_loss_out(f, x, NULL, NULL); }
static void grad_attn(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *gs)
{
    int64_t n = c->seg[c->n_seg], qn = n * c->n_head * c->hd, kn = n * c->n_kv * c->hd;
    ops_fd_t f = {.be = be, .c = c, .loss = attn_loss};
    ops_fd_input(&f, rng, "q", qn, 2);
    ops_fd_input(&f, rng, "k", kn, 1);
    ops_fd_input(&f, rng, "v", kn, 1);
    f.w = ops_rand(rng, qn, 1, 1);
    float *ho = ops_xmalloc((size_t)qn * sizeof *ho), *hl = ops_xmalloc((size_t)(n * c->n_head) * sizeof *hl);
    attn_loss_out(&f, f.x, ho, hl);
    bk_buf_t Q = up(be, f.x[0], qn), K = up(be, f.x[1], kn), V = up(be, f.x[2], kn), O = up(be, ho, qn);
    bk_buf_t L = up(be, hl, n * c->n_head), dO = up(be, f.w, qn);
    bk_buf_t dQ = up(be, ho, qn), dK = up(be, f.x[1], kn), dV = up(be, f.x[2], kn); /* overwritten */
    be->attn_bwd(be, dQ, dK, dV, dO, Q, K, V, O, L.p, c->seg, c->n_seg, c->n_head, c->n_kv, c->hd);
    float *g[3] = {ops_get(be, dQ, qn), ops_get(be, dK, kn), ops_get(be, dV, kn)};
    ops_fd_check(&f, g, gs);
    free(g[0]), free(g[1]), free(g[2]), free(ho), free(hl);
    bk_buf_t all[] = {Q, K, V, O, L, dO, dQ, dK, dV};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        bk_free(be, all[i].p);
    ops_fd_free(&f);
}

/* Segment lists: one-token segments among longer ones, a single token, a packed row and
 * its padding, one odd-length sample. */
static const int64_t seg_101[] = {0, 1, 2, 37, 38, 101};
static const int64_t seg_130[] = {0, 45, 46, 130};
static const int64_t seg_67[] = {0, 67};
static const int64_t seg_53[] = {0, 3, 4, 53};
static const int64_t seg_1[] = {0, 1};
static const int64_t seg_35[] = {0, 33, 34, 35};
/* larger (gpu_ops): a packed row of 1024 tokens; and as long, other boundaries: the
 * backend keeps the last list on the device and must upload this one (then seg_1024 again
 * for the cases after it) */
static const int64_t seg_1024[] = {0, 100, 350, 511, 1024};
static const int64_t seg_1024b[] = {0, 1, 600, 601, 1024};

#define ATTN(o, h, kv, d, s) \
    {.op = o, .cfgs = BOTH, .n_head = h, .n_kv = kv, .hd = d, .seg = s, .n_seg = sizeof s / sizeof *s - 1}
static const ops_case_t cases_attn_fwd[] = {
    ATTN(OP_ATTN_FWD, 8, 2, 64, seg_101), ATTN(OP_ATTN_FWD, 4, 1, 80, seg_130),
    ATTN(OP_ATTN_FWD, 2, 2, 96, seg_67),  ATTN(OP_ATTN_FWD, 4, 1, 128, seg_53),
    ATTN(OP_ATTN_FWD, 1, 1, 64, seg_1),   ATTN(OP_ATTN_FWD, 8, 4, 128, seg_35),
    {.op = OP_ATTN_FWD, .cfgs = BOTH, .n_head = 4, .n_kv = 1, .hd = 64, .seg = seg_53, .n_seg = 3, .offset = 1},
};
/* the tensor-core kernels' head dimensions, grouped queries, segments across tiles */
static const ops_case_t large_attn_fwd[] = {
    ATTN(OP_ATTN_FWD, 8, 2, 64, seg_1024), ATTN(OP_ATTN_FWD, 8, 2, 64, seg_1024b),
    ATTN(OP_ATTN_FWD, 4, 1, 128, seg_1024b), ATTN(OP_ATTN_FWD, 6, 2, 80, seg_1024),
};
static const ops_case_t cases_attn_bwd[] = {
    ATTN(OP_ATTN_BWD, 8, 2, 64, seg_101), ATTN(OP_ATTN_BWD, 4, 1, 80, seg_130),
    ATTN(OP_ATTN_BWD, 2, 2, 96, seg_67),  ATTN(OP_ATTN_BWD, 4, 1, 128, seg_53),
    ATTN(OP_ATTN_BWD, 1, 1, 64, seg_1),   ATTN(OP_ATTN_BWD, 8, 4, 128, seg_35),
    {.op = OP_ATTN_BWD, .cfgs = BOTH, .n_head = 4, .n_kv = 1, .hd = 64, .seg = seg_53, .n_seg = 3, .offset = 1},
};
static const ops_case_t large_attn_bwd[] = {
    ATTN(OP_ATTN_BWD, 8, 2, 64, seg_1024), ATTN(OP_ATTN_BWD, 4, 4, 128, seg_1024),
    ATTN(OP_ATTN_BWD, 6, 2, 96, seg_1024b), ATTN(OP_ATTN_BWD, 8, 1, 128, seg_1024),
};
static const ops_case_t cases_attn_cached[] = {
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 5, .p0 = 300, .n_head = 8, .n_kv = 2, .hd = 64},
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 1, .p0 = 0, .n_head = 4, .n_kv = 1, .hd = 128},
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 3, .p0 = 61, .n_head = 2, .n_kv = 2, .hd = 80},
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 2, .p0 = 17, .n_head = 4, .n_kv = 1, .hd = 96},
};
static const ops_case_t large_attn_cached[] = {
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 5, .p0 = 1000, .n_head = 8, .n_kv = 2, .hd = 128},
};

/* CUDA: a row reduction (the softmax) in another order: 1e-5; the backward's dout·v − D
 * cancels: 3e-4. bf16 attention on the tensor cores (unless FTK_CUDA_ATTN=simple) rounds
 * the probabilities, and in the backward dS, to bf16 before their products (as
 * FlashAttention does). Each output element then carries a random error of about u/√3 of
 * its (token, head) row's scale; rows near a segment start (few keys, large
 * probabilities) are many times the tensor's rms, so these outputs are measured against
 * their row's rms (ops_compare_rows), with 4u more (the largest of a million elements,
 * about 5σ, is 2.9u). Measured against the tensor's rms the 1024-token cases reached
 * 3.0e-2, at rows 0–6 and 100–103 of segments starting at 0 and 100 (H200, 2026-11-23). */
static const ops_desc_t desc_attn_fwd = {
    .name = "attn_fwd",
    CASES(cases_attn_fwd),
    LARGE(large_attn_fwd),
    .run = run_attn,
    .shape = shape_attn,
    .gpu_tol = 1e-5,
    .flash = 1,
};
static const ops_desc_t desc_attn_bwd = {
    .name = "attn_bwd",
    CASES(cases_attn_bwd),
    LARGE(large_attn_bwd),
    .run = run_attn,
    .shape = shape_attn,
    .gpu_tol = 3e-4,
    .flash = 1,
    .backward = always,
    .grad = grad_attn,
    .grad_names = {"dq", "dk", "dv"},
};
static const ops_desc_t desc_attn_cached = {
    .name = "attn_cached",
    CASES(cases_attn_cached),
    LARGE(large_attn_cached),
    .run = run_attn,
    .shape = shape_attn_cached,
    .gpu_tol = 1e-5,
};

/* ---- swiglu_fwd, swiglu_bwd -------------------------------------------------------------- */

static void run_swiglu(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    dtype_t dt = in_dt(cfg);
    int64_t n = c->n;
    /* g over ±6: silu's saturated tails and its dip near -1.3 */
    bk_buf_t g = put(R, dt, hrand(R, n, 6), n), u = put(R, dt, hrand(R, n, 2), n);
    if (c->op == OP_SWIGLU_FWD) {
        bk_buf_t h = poisoned(R, dt, n);
        R->be->swiglu_fwd(R->be, h, g, u, n);
        output(R, "h", h, n, 1);
        return;
    }
    bk_buf_t dh = put(R, dt, hrand(R, n, 1), n), dg = poisoned(R, dt, n), du = poisoned(R, dt, n);
    R->be->swiglu_bwd(R->be, dg, du, dh, g, u, n);
    output(R, "dg", dg, n, 1);
    output(R, "du", du, n, 1);
}

/* swiglu: L(g, u) = Σ dh·silu(g)·u. */
static double swiglu_loss(ops_fd_t *f, float *const *x)
{
    backend_t *be = f->be;
    int64_t n = f->c->n;
    bk_buf_t G = up(be, x[0], n), U = up(be, x[1], n), H = up(be, f->w, n);
    be->swiglu_fwd(be, H, G, U, n);
    float *y = ops_get(be, H, n);
    double L = ops_fd_wdot(f, y, n);
    free(y);
    bk_free(be, G.p), bk_free(be, U.p), bk_free(be, H.p);
    return L;
}
static void grad_swiglu(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *gs)
{
    int64_t n = c->n;
    ops_fd_t f = {.be = be, .c = c, .loss = swiglu_loss};
    ops_fd_input(&f, rng, "g", n, 6);
    ops_fd_input(&f, rng, "u", n, 2);
    f.w = ops_rand(rng, n, 1, 1);
    bk_buf_t G = up(be, f.x[0], n), U = up(be, f.x[1], n), dH = up(be, f.w, n), dG = up(be, f.w, n),
             dU = up(be, f.w, n);
    be->swiglu_bwd(be, dG, dU, dH, G, U, n);
    float *g[2] = {ops_get(be, dG, n), ops_get(be, dU, n)};
    ops_fd_check(&f, g, gs);
    free(g[0]), free(g[1]);
    bk_free(be, G.p), bk_free(be, U.p), bk_free(be, dH.p), bk_free(be, dG.p), bk_free(be, dU.p);
    ops_fd_free(&f);
}

static const ops_case_t cases_swiglu_fwd[] = {
    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 1000},
    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 4097},
    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 1},
    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 4097, .offset = 4},
};
static const ops_case_t cases_swiglu_bwd[] = {
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 1000},
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 4097},
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 1},
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 4097, .offset = 2},
};
static const ops_case_t large_swiglu_bwd[] = {
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 1 << 20},
};

static void perf_swiglu_fwd(const ops_bench_t *s) { s->be->swiglu_fwd(s->be, s->c, s->a, s->b, s->N * s->F); }
static void perf_swiglu_bwd(const ops_bench_t *s)
{
    s->be->swiglu_bwd(s->be, s->c, s->m, s->a, s->b, s->a, s->N * s->F);
}
static const ops_perf_t perf_swiglu_fwd_rows[] = {
    {"swiglu_fwd", perf_swiglu_fwd, 3, OPS_PER_NF, "swiglu_fwd bf16, one element a thread"},
};
static const ops_perf_t perf_swiglu_bwd_rows[] = {
    {"swiglu_bwd", perf_swiglu_bwd, 5, OPS_PER_NF, NULL},
};

/* CUDA: pointwise fp32 (expf, one quotient) with another libm: 1e-6. */
static const ops_desc_t desc_swiglu_fwd = {
    .name = "swiglu_fwd",
    CASES(cases_swiglu_fwd),
    .run = run_swiglu,
    .gpu_tol = 1e-6,
    PERF(perf_swiglu_fwd_rows),
};
static const ops_desc_t desc_swiglu_bwd = {
    .name = "swiglu_bwd",
    CASES(cases_swiglu_bwd),
    LARGE(large_swiglu_bwd),
    .run = run_swiglu,
    .gpu_tol = 1e-6,
    .backward = always,
    .grad = grad_swiglu,
    .grad_names = {"dg", "du"},
    PERF(perf_swiglu_bwd_rows),
};

/* ---- xent ------------------------------------------------------------------------------- */

static void run_xent(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    (void)cfg;
    int64_t n = c->n, V = c->V;
    int32_t *tgt = keep_host(R, ops_rand_ids(&R->rng, n, V));
    float *w = hzeros(R, n);
    for (int64_t i = 0; i < n; i++) /* masked rows and a weighted one */
        w[i] = i % 4 == 1 ? 0.0f : i % 4 == 2 ? 0.5f : 1.0f;
    bk_buf_t logits = put(R, DT_F32, hrand(R, n * V, 8), n * V);
    const int32_t *d_tgt = put_raw(R, tgt, (size_t)n * sizeof *tgt);
    const float *d_w = put_raw(R, w, (size_t)n * sizeof *w);
    double *acc = put_raw(R, &(double){0}, sizeof(double));
    R->be->xent(R->be, logits.p, d_tgt, d_w, n, V, c->grad_scale, acc);
    R->be->download(R->be, &R->r->scalar, acc, sizeof(double));
    R->r->has_scalar = 1;
    output(R, c->grad_scale != 0.0f ? "dlogits" : "logits", logits, n * V, 1);
}

static void shape_xent(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "n=%lld V=%lld grad_scale=%g", (long long)c->n, (long long)c->V, c->grad_scale);
}
static int xent_backward(const ops_case_t *c) { return c->grad_scale != 0.0f; }

/* xent: L(logits) = the loss; its gradient is what xent leaves in the logits at grad_scale 1. */
static double xent_loss(ops_fd_t *f, float *const *x)
{
    const ops_case_t *c = f->c;
    backend_t *be = f->be;
    bk_buf_t X = up(be, x[0], c->n * c->V), W = up(be, f->w, c->n);
    int32_t *t = ops_put_raw(be, f->ids, (size_t)c->n * sizeof *t);
    double L = 0, *acc = ops_put_raw(be, &L, sizeof L);
    be->xent(be, X.p, t, W.p, c->n, c->V, 0, acc);
    be->download(be, &L, acc, sizeof L);
    f->T = fabs(L);
    bk_free(be, X.p), bk_free(be, W.p), bk_free(be, t), bk_free(be, acc);
    return L;
}
static void grad_xent(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *gs)
{
    if (c->grad_scale == 0.0f) /* the loss only */
        return;
    ops_fd_t f = {.be = be, .c = c, .loss = xent_loss};
    ops_fd_input(&f, rng, "logits", c->n * c->V, 8);
    f.w = ops_xmalloc((size_t)c->n * sizeof *f.w);
    for (int64_t i = 0; i < c->n; i++)
        f.w[i] = i % 4 == 1 ? 0.0f : i % 4 == 2 ? 0.5f : 1.0f;
    f.ids = ops_rand_ids(rng, c->n, c->V);
    bk_buf_t X = up(be, f.x[0], c->n * c->V), W = up(be, f.w, c->n);
    int32_t *t = ops_put_raw(be, f.ids, (size_t)c->n * sizeof *t);
    double *acc = ops_put_raw(be, &(double){0}, sizeof(double));
    be->xent(be, X.p, t, W.p, c->n, c->V, 1.0f, acc);
    float *g[1] = {ops_get(be, X, c->n * c->V)};
    ops_fd_check(&f, g, gs);
    free(g[0]);
    bk_free(be, X.p), bk_free(be, W.p), bk_free(be, t), bk_free(be, acc);
    ops_fd_free(&f);
}

static const ops_case_t cases_xent[] = {
    {.op = OP_XENT, .cfgs = F32, .n = 9, .V = 1000},
    {.op = OP_XENT, .cfgs = F32, .n = 9, .V = 1000, .grad_scale = 0.25f},
    {.op = OP_XENT, .cfgs = F32, .n = 3, .V = 32003, .grad_scale = 1.0f},
    {.op = OP_XENT, .cfgs = F32, .n = 1, .V = 5, .grad_scale = 1.0f},
    /* CUDA's 8-wide path (V % 8 == 0, 16-byte aligned): a view at +4 takes it, at +2 not;
     * V = 1004 not (V % 8 = 4) */
    {.op = OP_XENT, .cfgs = F32, .n = 9, .V = 1000, .grad_scale = 1.0f, .offset = 4},
    {.op = OP_XENT, .cfgs = F32, .n = 9, .V = 1000, .grad_scale = 1.0f, .offset = 2},
    {.op = OP_XENT, .cfgs = F32, .n = 6, .V = 1004, .grad_scale = 0.5f},
};
static const ops_case_t large_xent[] = {
    {.op = OP_XENT, .cfgs = F32, .n = 96, .V = 32000, .grad_scale = 0.25f},
};

/* fp32 logits only. CUDA: a row reduction (the loss) in another order: 1e-5 (the loss itself,
 * a double, is held to 1e-12 by gpu_ops). */
static const ops_desc_t desc_xent = {
    .name = "xent",
    CASES(cases_xent),
    LARGE(large_xent),
    .run = run_xent,
    .shape = shape_xent,
    .gpu_tol = 1e-5,
    .backward = xent_backward,
    .grad = grad_xent,
    .grad_names = {"dlogits"},
};

/* ---- add, scale, sumsq ------------------------------------------------------------------- */

/* add (y += x, y in the accumulator's dtype), scale, sumsq. */
static void run_pointwise(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    backend_t *be = R->be;
    int64_t n = c->n;
    if (c->op == OP_ADD) {
        bk_buf_t y = put(R, acc_dt(cfg), hrand(R, n, 1), n), x = put(R, in_dt(cfg), hrand(R, n, 1), n);
        be->add(be, y, x, n);
        output(R, "y", y, n, 1);
    } else if (c->op == OP_SCALE) {
        bk_buf_t y = put(R, in_dt(cfg), hrand(R, n, 3), n);
        be->scale(be, y, c->alpha, n);
        output(R, "y", y, n, 1);
    } else {
        bk_buf_t x = put(R, in_dt(cfg), hrand(R, n, 3), n);
        double *acc = put_raw(R, &(double){0}, sizeof(double));
        be->sumsq(be, x, n, acc);
        be->download(be, &R->r->scalar, acc, sizeof(double));
        R->r->has_scalar = 1;
    }
}

static const ops_case_t cases_add[] = {
    {.op = OP_ADD, .cfgs = ALL, .n = 1000},
    {.op = OP_ADD, .cfgs = ALL, .n = 4097},
    {.op = OP_ADD, .cfgs = ALL, .n = 1001, .offset = 1},
    {.op = OP_ADD, .cfgs = ALL, .n = 1001, .offset = 4},
};
static const ops_case_t cases_scale[] = {
    {.op = OP_SCALE, .cfgs = BOTH, .n = 1001, .alpha = 0.37f},
    {.op = OP_SCALE, .cfgs = BOTH, .n = 1, .alpha = -3.0f},
    {.op = OP_SCALE, .cfgs = BOTH, .n = 1001, .alpha = 0.37f, .offset = 4},
};
/* past the grid's cap (blocks_for: 1,048,560 blocks of 256 threads) with one element a
 * thread (FTK_CUDA_VEC=0, the ops-fp32 run): a second grid-stride pass */
static const ops_case_t large_scale[] = {
    {.op = OP_SCALE, .cfgs = BOTH, .n = 300000017, .alpha = 0.37f},
};
static const ops_case_t cases_sumsq[] = {
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 1000},
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 2 * 65536 + 17}, /* the CPU's blocks and a ragged end */
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 4097, .offset = 1},
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 4097, .offset = 4},
};
static const ops_case_t large_sumsq[] = {
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 5000017},
};

static void perf_add(const ops_bench_t *s) { s->be->add(s->be, s->b, s->a, s->N * s->F); }
static void perf_scale(const ops_bench_t *s) { s->be->scale(s->be, s->b, 1.0f, s->N * s->F); }
static void perf_sumsq(const ops_bench_t *s) { s->be->sumsq(s->be, s->a, s->N * s->F, s->acc); }
static const ops_perf_t perf_add_rows[] = {{"add", perf_add, 3, OPS_PER_NF, NULL}};
static const ops_perf_t perf_scale_rows[] = {{"scale", perf_scale, 2, OPS_PER_NF, NULL}};
static const ops_perf_t perf_sumsq_rows[] = {
    {"sumsq", perf_sumsq, 1, OPS_PER_NF, "sumsq bf16, one element a thread"},
};

/* add and scale: one IEEE operation then one rounding: the CPU's bits on CUDA. sumsq: double
 * sums of the same values in the same order on the CPU in every dtype (identical); on CUDA in
 * another order (1e-12 on the scalar, gpu_ops). */
static const ops_desc_t desc_add = {
    .name = "add",
    CASES(cases_add),
    .run = run_pointwise,
    PERF(perf_add_rows),
};
static const ops_desc_t desc_scale = {
    .name = "scale",
    CASES(cases_scale),
    LARGE(large_scale),
    .run = run_pointwise,
    PERF(perf_scale_rows),
};
static const ops_desc_t desc_sumsq = {
    .name = "sumsq",
    CASES(cases_sumsq),
    LARGE(large_sumsq),
    .run = run_pointwise,
    .gpu_tol = 1e-5,
    PERF(perf_sumsq_rows),
};

/* ---- quant_i8, dequant_i8 ------------------------------------------------------------------ */

/* x to int8 codes and block scales (block c->d) and back, into y of the accumulator's dtype:
 * the codes show in y. With two blocks or more the first block is zeros (a scale of 0). */
static void run_quant_i8(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    backend_t *be = R->be;
    int64_t n = c->n, block = c->d, nb = (n + block - 1) / block;
    float *h = hrand(R, n, 3);
    for (int64_t i = 0; nb > 1 && i < block; i++)
        h[i] = 0.0f;
    bk_buf_t x = put(R, in_dt(cfg), h, n), scales = poisoned(R, DT_F32, nb), y = poisoned(R, acc_dt(cfg), n);
    int8_t *codes = ops_xmalloc((size_t)n);
    memset(codes, 0x80, (size_t)n); /* -128: never a code */
    int8_t *dcodes = put_raw(R, codes, (size_t)n);
    free(codes);
    be->quant_i8(be, dcodes, scales.p, x, n, block);
    be->dequant_i8(be, y, dcodes, scales.p, n, block);
    output(R, "scales", scales, nb, 1);
    output(R, "y", y, n, 1);
}

static void shape_quant_i8(const ops_case_t *c, char *out, size_t size)
{
    snprintf(out, size, "n=%lld block=%lld", (long long)c->n, (long long)c->d);
}

static const ops_case_t cases_quant_i8[] = {
    {.op = OP_QUANT_I8, .cfgs = ALL, .n = 1000, .d = 256}, /* a ragged last block */
    {.op = OP_QUANT_I8, .cfgs = ALL, .n = 1, .d = 256},
    {.op = OP_QUANT_I8, .cfgs = ALL, .n = 4097, .d = 100, .offset = 1},
    {.op = OP_QUANT_I8, .cfgs = ALL, .n = 300, .d = 7, .offset = 4},
};
static const ops_case_t large_quant_i8[] = {
    {.op = OP_QUANT_I8, .cfgs = BOTH, .n = 5000017, .d = 256},
};

/* One maximum, one IEEE division and rounding, one product per element: the CPU's bits on
 * CUDA; in bf16 configurations the same codes (the inputs are bf16 values) and y rounded once. */
static const ops_desc_t desc_quant_i8 = {
    .name = "quant_i8",
    CASES(cases_quant_i8),
    LARGE(large_quant_i8),
    .run = run_quant_i8,
    .shape = shape_quant_i8,
};

/* ---- adamw ------------------------------------------------------------------------------ */

static void run_adamw(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    int64_t n = c->n;
    dtype_t st = acc_dt(cfg);
    float *hv = hrand(R, n, 1e-5f);
    for (int64_t i = 0; i < n; i++)
        hv[i] = fabsf(hv[i]);
    bk_buf_t p = put(R, st, hrand(R, n, 0.5f), n), g = put(R, in_dt(cfg), hrand(R, n, 1e-2f), n);
    bk_buf_t m = put(R, st, hrand(R, n, 1e-3f), n), v = put(R, st, hv, n);
    bk_adamw_t h = {.lr = 1e-3f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .wd = c->wd,
                    .gscale = c->gscale != 0.0f ? c->gscale : 1.0f,
                    .bc1 = 1.0 - pow(0.9, c->step), .bc2 = 1.0 - pow(0.95, c->step),
                    .stochastic = c->stochastic, .key = bk_sround_key(7, c->step, 3), .index0 = c->index0};
    float *coef = NULL;
    if (c->clip != 0.0f) { /* the coefficient from the device's slots: 1 / (2 + 1e-6) at clip 1 */
        double *sq = put_raw(R, (double[]){2.25, 1.75}, 2 * sizeof(double));
        coef = put_raw(R, (float[]){NAN}, sizeof(float));
        R->be->clip_coef(R->be, coef, sq, 2, c->clip > 0 ? c->clip : 0.0);
        h.gscale = NAN; /* unused */
        h.gscale_dev = coef;
    }
    R->be->adamw(R->be, p, g, m, v, n, &h);
    if (coef)
        output(R, "coef", bk_buf(coef, DT_F32), 1, 1);
    output(R, "p", p, n, 1);
    output(R, "m", m, n, 1);
    output(R, "v", v, n, 1);
}

static void shape_adamw(const ops_case_t *c, char *out, size_t size)
{
    int k = snprintf(out, size, "n=%lld t=%d wd=%g%s", (long long)c->n, c->step, c->wd,
                     c->stochastic == BK_SROUND_HASH3 ? " stochastic, 3 hashes" : c->stochastic ? " stochastic" : "");
    if (c->clip != 0.0f && k >= 0 && (size_t)k < size)
        snprintf(out + k, size - (size_t)k, " clip_coef(max %g)", c->clip > 0 ? c->clip : 0.0);
}

/* CPU: nearest rounding as the default (one rounding of the same fp32 arithmetic); with
 * stochastic rounding a bf16 state is one of the two neighbours: less than one ulp, 2u. */
static double cpu_tol_adamw(const ops_case_t *c, const ops_out_t *o, int *exact)
{
    *exact = o->rounds == 1 && !c->stochastic;
    return o->dt == DT_BF16 ? (c->stochastic ? 2 : o->rounds) * U_BF16 : 0;
}

static const ops_case_t cases_adamw[] = {
    {.op = OP_ADAMW, .cfgs = ALL, .n = 1000, .step = 1, .wd = 0.1f},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 4097, .step = 10, .gscale = 0.5f},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 1001, .step = 3, .wd = 0.1f, .stochastic = 1, .index0 = 12345},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 999, .step = 2, .stochastic = 1, .offset = 1},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 999, .step = 2, .stochastic = 1, .offset = 4},
    /* the three-hash rule (FTK_SROUND_HASHES=3), kept for timing against the one-hash rule */
    {.op = OP_ADAMW, .cfgs = ALL, .n = 1001, .step = 3, .wd = 0.1f, .stochastic = BK_SROUND_HASH3, .index0 = 12345},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 999, .step = 2, .stochastic = BK_SROUND_HASH3, .offset = 1},
    /* the scale on the device (clip_coef, gscale_dev): clipping, no clipping (c ≥ 1), off */
    {.op = OP_ADAMW, .cfgs = ALL, .n = 4097, .step = 10, .clip = 1.0f},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 1001, .step = 3, .stochastic = 1, .clip = 3.0f},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 1000, .step = 2, .clip = -1.0f},
};
static const ops_case_t large_adamw[] = {
    {.op = OP_ADAMW, .cfgs = ALL, .n = 5000017, .step = 7, .wd = 0.1f, .stochastic = 1},
};

/* nearest rounding unless s->h says stochastic (gpu_opbench times both in bf16) */
static void perf_adamw(const ops_bench_t *s) { s->be->adamw(s->be, s->a, s->b, s->m, s->v, s->N * s->F, &s->h); }
static const ops_perf_t perf_adamw_rows[] = {
    {"adamw (nearest)", perf_adamw, 7, OPS_PER_NF, "adamw (nearest) bf16, one element a thread"},
};

/* CUDA: fp32 arithmetic operation for operation the CPU's with correctly rounded operations
 * only (no contraction, sqrt and quotients correctly rounded), so nearest and stochastic
 * rounding give the CPU's bits — a bound of a bf16 ulp would let a wrong stochastic-rounding
 * index (index0 + i) or field through. */
static const ops_desc_t desc_adamw = {
    .name = "adamw",
    CASES(cases_adamw),
    LARGE(large_adamw),
    .run = run_adamw,
    .shape = shape_adamw,
    .cpu_tol = cpu_tol_adamw,
    PERF(perf_adamw_rows),
};

double ops_perf_elems(const ops_perf_t *p, const ops_bench_t *s)
{
    double n = (double)s->N;
    return p->elems * n * (double)(p->per == OPS_PER_ND ? s->D : p->per == OPS_PER_NF ? s->F : s->H * s->HD);
}

/* ---- the registry ------------------------------------------------------------------------ */

#define OPS_REGISTER(e, name) [OP_##e] = &desc_##name,
const ops_desc_t *const ops_descs[OP_COUNT] = {OPS_LIST(OPS_REGISTER)};
#undef OPS_REGISTER
