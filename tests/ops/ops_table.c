/* ops_table.c — the op cases, running one through its descriptor (ops_defs.c), the fused
 * cases, comparisons and helpers (ops_table.h). */
#include "ops_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/sround.h"
#include "../../libcommon/log.h"

const char *const ops_cfg_names[OPS_NCFG] = {"f32", "bf16", "bf16 in, f32 acc", "f32 in, bf16 out"};

/* ---- the table ------------------------------------------------------------------------- */

int ops_n_cases(int large)
{
    int n = 0;
    for (int op = 0; op < OP_COUNT; op++)
        n += OPS_DESC(op)->n_cases + (large ? OPS_DESC(op)->n_large : 0);
    return n;
}

const ops_case_t *ops_case_at(int k)
{
    for (int op = 0; op < OP_COUNT; k -= OPS_DESC(op++)->n_cases)
        if (k < OPS_DESC(op)->n_cases)
            return &OPS_DESC(op)->cases[k];
    for (int op = 0; op < OP_COUNT; k -= OPS_DESC(op++)->n_large)
        if (k < OPS_DESC(op)->n_large)
            return &OPS_DESC(op)->large[k];
    return NULL;
}

void ops_case_name(const ops_case_t *c, char *out, size_t size)
{
    const ops_desc_t *d = OPS_DESC(c->op);
    int len = snprintf(out, size, "%s ", d->name);
    if (len < 0 || (size_t)len >= size)
        return;
    if (d->shape)
        d->shape(c, out + len, size - (size_t)len);
    else
        snprintf(out + len, size - (size_t)len, "n=%lld", (long long)c->n);
    if (c->offset) {
        size_t l = strlen(out);
        snprintf(out + l, size - l, " at +%lld", (long long)c->offset);
    }
}

/* ---- tolerances ------------------------------------------------------------------------- */

/* The CPU computes in fp32 from inputs widened exactly, in the same order in every
 * configuration (cpu.c: f32 buffers are used in place, bf16 rows widened into scratch),
 * so an f32 output is the fp32 run's bits (bound 0) and a bf16 one is the fp32 result
 * rounded once to nearest (within u = 2^-8 of |ref|, and exactly f32_to_bf16(ref)) — or
 * o->rounds times where the op rounds an element more than once. */
double ops_cpu_tol_rounded(const ops_case_t *c, const ops_out_t *o, int *exact)
{
    (void)c;
    *exact = o->rounds == 1;
    return o->dt == DT_BF16 ? o->rounds * OPS_U_BF16 : 0;
}

double ops_cpu_tol(const ops_case_t *c, const ops_out_t *o, int *exact)
{
    const ops_desc_t *d = OPS_DESC(c->op);
    return (d->cpu_tol ? d->cpu_tol : ops_cpu_tol_rounded)(c, o, exact);
}

int ops_flash_rows(const ops_case_t *c, const ops_out_t *o) { return OPS_DESC(c->op)->flash && o->dt == DT_BF16; }

/* A bf16 output may round the other way where the fp32 results straddle a rounding
 * boundary: one ulp, 2u, for each rounding of the element. */
double ops_gpu_tol(const ops_case_t *c, ops_cfg_t cfg, const ops_out_t *o, int mm_exact, int flash_rows)
{
    const ops_desc_t *d = OPS_DESC(c->op);
    double b = d->gpu_tol_fn ? d->gpu_tol_fn(c, cfg, o, mm_exact) : d->gpu_tol;
    if (b == 0) /* the CPU's bits */
        return 0;
    if (o->dt == DT_BF16)
        b += 2 * OPS_U_BF16 * o->rounds;
    if (flash_rows)
        b += 4 * OPS_U_BF16;
    return b;
}

/* ---- helpers ----------------------------------------------------------------------------- */

void *ops_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

void ops_rng_seed(ops_rng_t *r, uint64_t seed) { r->s = bk_mix64(seed ^ 0x6f70732d7461626cull) | 1; }

double ops_urand(ops_rng_t *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) / 9007199254740992.0;
}

float ops_round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

float *ops_rand(ops_rng_t *r, int64_t n, float scale, int round_bf16)
{
    float *p = ops_xmalloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)((2 * ops_urand(r) - 1) * scale);
        if (round_bf16)
            p[i] = ops_round_bf16(p[i]);
    }
    return p;
}

int32_t *ops_rand_ids(ops_rng_t *r, int64_t n, int64_t range)
{
    int32_t *p = ops_xmalloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (int32_t)(ops_urand(r) * (double)range);
    return p;
}

static void *dev_alloc(backend_t *be, size_t bytes, const char *what)
{
    void *p = bk_alloc(be, bytes, BK_MEM_OTHER, what);
    if (!p) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        exit(1);
    }
    return p;
}

bk_buf_t ops_put(backend_t *be, dtype_t dt, float *host, int64_t n)
{
    size_t es = dtype_size(dt);
    void *raw = ops_xmalloc((size_t)n * es);
    dtype_convert(raw, dt, host, DT_F32, (size_t)n);
    dtype_convert(host, DT_F32, raw, dt, (size_t)n);
    bk_buf_t b = bk_buf(dev_alloc(be, (size_t)n * es, "a test input"), dt);
    be->upload(be, b.p, raw, (size_t)n * es);
    free(raw);
    return b;
}

bk_buf_t ops_nan(backend_t *be, dtype_t dt, int64_t n)
{
    float *h = ops_xmalloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++)
        h[i] = NAN;
    bk_buf_t b = ops_put(be, dt, h, n);
    free(h);
    return b;
}

void *ops_put_raw(backend_t *be, const void *host, size_t bytes)
{
    void *p = dev_alloc(be, bytes, "a test input");
    be->upload(be, p, host, bytes);
    return p;
}

float *ops_get(backend_t *be, bk_buf_t b, int64_t n)
{
    size_t es = dtype_size(b.dt);
    void *raw = ops_xmalloc((size_t)n * es);
    float *f = ops_xmalloc((size_t)n * sizeof *f);
    be->download(be, raw, b.p, (size_t)n * es);
    dtype_convert(f, DT_F32, raw, b.dt, (size_t)n);
    free(raw);
    return f;
}

static ops_err_t compare(const float *ref, const float *got, int64_t n, int64_t row)
{
    ops_err_t e = {0};
    double ss = 0, dd = 0, rms = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]))
            ss += (double)ref[i] * ref[i];
    for (int64_t i = 0; i < n; i++) {
        if (i % row == 0) { /* the scale of the row starting here */
            int64_t m = n - i < row ? n - i : row;
            double rs = 0;
            for (int64_t k = i; k < i + m; k++)
                if (isfinite(ref[k]))
                    rs += (double)ref[k] * ref[k];
            rms = m ? sqrt(rs / (double)m) : 0;
        }
        if (memcmp(&ref[i], &got[i], sizeof(float)))
            e.differ++;
        if (isnan(ref[i]) || isnan(got[i])) {
            e.nan++;
            continue;
        }
        double d = got[i] == ref[i] ? 0 : fabs((double)got[i] - ref[i]);
        double den = fabs((double)ref[i]) + rms;
        double rel = den > 0 ? d / den : d;
        dd += d * d;
        if (rel > e.max_rel) {
            e.max_rel = rel;
            e.worst = i;
        }
    }
    e.norm_rel = ss > 0 ? sqrt(dd / ss) : sqrt(dd);
    return e;
}

ops_err_t ops_compare(const float *ref, const float *got, int64_t n) { return compare(ref, got, n, n > 0 ? n : 1); }

ops_err_t ops_compare_rows(const float *ref, const float *got, int64_t n, int64_t row)
{
    return compare(ref, got, n, row > 0 ? row : 1);
}

/* ---- running a case ---------------------------------------------------------------------- */

int ops_run(backend_t *be, const ops_case_t *c, ops_cfg_t cfg, uint64_t seed, int full, ops_result_t *r)
{
    memset(r, 0, sizeof *r);
    ops_ctx_t R = {.be = be, .full = full, .off = c->offset, .r = r};
    /* the inputs depend on the seed, never on the configuration or the backend */
    ops_rng_seed(&R.rng, seed);
    OPS_DESC(c->op)->run(&R, c, cfg);
    int rc = be->sync(be);
    for (int i = 0; i < R.n_dev; i++)
        bk_free(be, R.dev[i]);
    for (int i = 0; i < R.n_host; i++)
        free(R.host[i]);
    if (rc < 0)
        ops_result_free(r);
    return rc;
}

void ops_result_free(ops_result_t *r)
{
    for (int i = 0; i < r->n_out; i++)
        free(r->out[i].v);
    memset(r, 0, sizeof *r);
}

/* ---- fused ops against their sequences ---------------------------------------------------- */

const char *const ops_fop_names[FU_COUNT] = {"rope_qk", "qkv_rope", "glu_fwd", "glu_bwd", "add_rmsnorm_fwd",
                                               "add_sumsq"};

#define FQK(o, n_, h, kv, d_, th, inv, ps) \
    {.op = o, .n = n_, .n_head = h, .n_kv = kv, .hd = d_, .theta = th, .inverse = inv, .pos_step = ps}
const ops_fcase_t ops_fused_table[] = {
    FQK(FU_ROPE_QK, 37, 8, 2, 64, 10000.0f, 0, 0),
    FQK(FU_ROPE_QK, 5, 4, 1, 80, 500000.0f, 1, 997),
    FQK(FU_ROPE_QK, 1, 2, 2, 128, 10000.0f, 0, 0),
    FQK(FU_QKV_ROPE, 37, 8, 2, 64, 10000.0f, 0, 0),
    FQK(FU_QKV_ROPE, 37, 8, 2, 64, 10000.0f, 1, 0),
    FQK(FU_QKV_ROPE, 5, 4, 1, 80, 500000.0f, 0, 997),
    FQK(FU_QKV_ROPE, 5, 4, 1, 80, 500000.0f, 1, 997),
    FQK(FU_QKV_ROPE, 130, 6, 2, 96, 10000.0f, 0, 31),
    FQK(FU_QKV_ROPE, 130, 6, 2, 96, 10000.0f, 1, 31),
    FQK(FU_QKV_ROPE, 1, 2, 2, 128, 10000.0f, 0, 0),
    FQK(FU_QKV_ROPE, 33, 4, 1, 128, 10000.0f, 1, 123),
    /* CUDA's 16-byte path in chunks of 4 heads (5 and 6: a tail), and hd 24 and 36 (the
     * one-pair kernels) */
    FQK(FU_ROPE_QK, 9, 5, 5, 128, 10000.0f, 1, 7),
    FQK(FU_ROPE_QK, 11, 6, 3, 24, 10000.0f, 0, 0),
    FQK(FU_QKV_ROPE, 9, 5, 1, 128, 10000.0f, 0, 7),
    FQK(FU_QKV_ROPE, 9, 6, 6, 128, 10000.0f, 1, 7),
    FQK(FU_QKV_ROPE, 7, 3, 3, 36, 10000.0f, 1, 0),
    {.op = FU_GLU_FWD, .n = 7, .d = 1000},
    {.op = FU_GLU_FWD, .n = 33, .d = 250},
    {.op = FU_GLU_FWD, .n = 1, .d = 1},
    {.op = FU_GLU_FWD, .n = 130, .d = 688},
    {.op = FU_GLU_BWD, .n = 7, .d = 1000},
    {.op = FU_GLU_BWD, .n = 33, .d = 250},
    {.op = FU_GLU_BWD, .n = 1, .d = 1},
    {.op = FU_GLU_BWD, .n = 130, .d = 688},
    {.op = FU_ADD_RMSNORM, .n = 7, .d = 1000},
    {.op = FU_ADD_RMSNORM, .n = 33, .d = 100},
    {.op = FU_ADD_RMSNORM, .n = 1, .d = 64},
    {.op = FU_ADD_RMSNORM, .n = 130, .d = 96},
    /* Llama widths (7B: D = 4096, F = 11008; 13B: D = 5120) */
    {.op = FU_GLU_FWD, .n = 5, .d = 11008},
    {.op = FU_GLU_BWD, .n = 5, .d = 11008},
    {.op = FU_ADD_RMSNORM, .n = 5, .d = 4096},
    {.op = FU_ADD_RMSNORM, .n = 3, .d = 5120},
    /* x and r misaligned (at +1; at +4 in bf16 only, fp32 is then 16-byte aligned), xsum,
     * out and w not: the row is still split as rmsnorm_fwd splits it (on CUDA the op is
     * then its sequence) */
    {.op = FU_ADD_RMSNORM, .n = 5, .d = 1000, .offset = 1},
    {.op = FU_ADD_RMSNORM, .n = 5, .d = 4096, .offset = 4},
    /* the sum in place of x or of r (backend.h allows both), also misaligned */
    {.op = FU_ADD_RMSNORM, .n = 7, .d = 1000, .alias = 1},
    {.op = FU_ADD_RMSNORM, .n = 7, .d = 1000, .alias = 2},
    {.op = FU_ADD_RMSNORM, .n = 5, .d = 1000, .offset = 1, .alias = 2},
    {.op = FU_ADD_RMSNORM, .n = 5, .d = 4096, .offset = 4, .alias = 1},
    /* add_sumsq: sumsq's blocks of 65536 and a ragged end; x misaligned against y (CUDA:
     * the sequence where y could take 16-byte accesses and x not), and both */
    {.op = FU_ADD_SUMSQ, .n = 1000},
    {.op = FU_ADD_SUMSQ, .n = 1},
    {.op = FU_ADD_SUMSQ, .n = 2 * 65536 + 17},
    {.op = FU_ADD_SUMSQ, .n = 4097, .offset = 1},
    {.op = FU_ADD_SUMSQ, .n = 4097, .offset = 4},
    {.op = FU_ADD_SUMSQ, .n = 70001, .offset = 3, .alias = 1},
};
const int ops_fused_len = (int)(sizeof ops_fused_table / sizeof *ops_fused_table);

void ops_fcase_name(const ops_fcase_t *c, char *out, size_t size)
{
    const char *op = ops_fop_names[c->op];
    if (c->op == FU_ROPE_QK || c->op == FU_QKV_ROPE)
        snprintf(out, size, "%s n=%lld H=%d KV=%d hd=%d theta=%g pos*%d%s", op, (long long)c->n, c->n_head, c->n_kv,
                 c->hd, c->theta, c->pos_step ? c->pos_step : 1, c->inverse ? " inverse" : "");
    else if (c->op == FU_ADD_SUMSQ)
        snprintf(out, size, "%s n=%lld%s%.0lld", op, (long long)c->n,
                 !c->offset ? "" : c->alias ? " y,x at +" : " x at +", (long long)c->offset);
    else
        snprintf(out, size, "%s n=%lld %s=%lld%s%.0lld%s", op, (long long)c->n, c->op == FU_ADD_RMSNORM ? "d" : "F",
                 (long long)c->d, c->offset ? " x,r at +" : "", (long long)c->offset,
                 c->alias == 1 ? " xsum=x" : c->alias == 2 ? " xsum=r" : "");
}

int ops_fused_has(const backend_t *be, const ops_fcase_t *c)
{
    switch (c->op) {
    case FU_ROPE_QK:
        return be->rope_qk != NULL;
    case FU_QKV_ROPE:
        return be->qkv_rope != NULL;
    case FU_GLU_FWD:
    case FU_GLU_BWD:
        return be->glu_fwd != NULL && be->glu_bwd != NULL;
    case FU_ADD_RMSNORM:
        return be->add_rmsnorm_fwd != NULL;
    case FU_ADD_SUMSQ:
        return be->add_sumsq != NULL;
    default:
        return 0;
    }
}

/* Columns [c0, c0 + w) of the rows of a row-major [n, W] host matrix, as [n, w] (malloc'd). */
static float *cols(const float *a, int64_t n, int64_t W, int64_t c0, int64_t w)
{
    float *p = ops_xmalloc((size_t)(n * w > 0 ? n * w : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        memcpy(p + i * w, a + i * W + c0, (size_t)w * sizeof *p);
    return p;
}
/* The [n, w] blocks b[k] side by side as one [n, Σw] matrix (malloc'd). */
static float *side_by_side(float *const *b, const int64_t *w, int k, int64_t n)
{
    int64_t W = 0;
    for (int j = 0; j < k; j++)
        W += w[j];
    float *p = ops_xmalloc((size_t)(n * W > 0 ? n * W : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        for (int j = 0, c0 = 0; j < k; c0 += (int)w[j], j++)
            memcpy(p + i * W + c0, b[j] + i * w[j], (size_t)w[j] * sizeof *p);
    return p;
}

static void add_out(ops_result_t *r, const char *name, backend_t *be, bk_buf_t b, int64_t n)
{
    ops_out_t *o = &r->out[r->n_out++];
    o->name = name;
    o->v = ops_get(be, b, n);
    o->n = n;
    o->dt = b.dt;
    o->rounds = 1;
}
/* An output downloaded as one buffer and handed back as column blocks. */
static void add_cols(ops_result_t *r, const char *const *names, const float *all, int64_t n, int64_t W,
                     const int64_t *w, int k, dtype_t dt)
{
    for (int j = 0, c0 = 0; j < k; c0 += (int)w[j], j++) {
        ops_out_t *o = &r->out[r->n_out++];
        o->name = names[j];
        o->v = cols(all, n, W, c0, w[j]);
        o->n = n * w[j];
        o->dt = dt;
        o->rounds = 1;
    }
}

int ops_fused_run(backend_t *be, const ops_fcase_t *c, dtype_t dt, int fused, uint64_t seed, ops_result_t *r)
{
    memset(r, 0, sizeof *r);
    ops_rng_t rng;
    ops_rng_seed(&rng, seed ^ (0x66757365ull + (uint64_t)c->op));
    int64_t n = c->n;
    void *dev[8] = {0};
    int nd = 0;
    float *host[8] = {0};
    int nh = 0;
    int32_t *pos = NULL;
    if (c->op == FU_ROPE_QK || c->op == FU_QKV_ROPE) {
        int32_t *hp = ops_xmalloc((size_t)n * sizeof *hp);
        for (int64_t i = 0; i < n; i++)
            hp[i] = (int32_t)((i * (c->pos_step ? c->pos_step : 1)) % 4096);
        pos = dev[nd++] = ops_put_raw(be, hp, (size_t)n * sizeof *hp);
        free(hp);
    }
    switch (c->op) {
    case FU_ROPE_QK: {
        int64_t qn = n * c->n_head * c->hd, kn = n * c->n_kv * c->hd;
        float *hq = host[nh++] = ops_rand(&rng, qn, 2, 0), *hk = host[nh++] = ops_rand(&rng, kn, 2, 0);
        bk_buf_t q = ops_put(be, dt, hq, qn), k = ops_put(be, dt, hk, kn);
        dev[nd++] = q.p, dev[nd++] = k.p;
        if (fused) {
            be->rope_qk(be, q, k, pos, n, c->n_head, c->n_kv, c->hd, c->theta, c->inverse);
        } else {
            be->rope(be, q, pos, n, c->n_head, c->hd, c->theta, c->inverse);
            be->rope(be, k, pos, n, c->n_kv, c->hd, c->theta, c->inverse);
        }
        add_out(r, "q", be, q, qn);
        add_out(r, "k", be, k, kn);
        break;
    }
    case FU_QKV_ROPE: {
        int64_t Hq = (int64_t)c->n_head * c->hd, Hk = (int64_t)c->n_kv * c->hd, W = Hq + 2 * Hk;
        int64_t w[3] = {Hq, Hk, Hk};
        if (!c->inverse) { /* qkv in; q, k, v out */
            float *hx = host[nh++] = ops_rand(&rng, n * W, 2, 0);
            bk_buf_t x = ops_put(be, dt, hx, n * W);
            bk_buf_t q = ops_nan(be, dt, n * Hq), k = ops_nan(be, dt, n * Hk), v = ops_nan(be, dt, n * Hk);
            dev[nd++] = x.p, dev[nd++] = q.p, dev[nd++] = k.p, dev[nd++] = v.p;
            if (fused) {
                be->qkv_rope(be, x, q, k, v, pos, n, c->n_head, c->n_kv, c->hd, c->theta, 0);
            } else {
                /* the blocks cut out on the host: the sequence's copies, exact */
                float *b[3] = {cols(hx, n, W, 0, Hq), cols(hx, n, W, Hq, Hk), cols(hx, n, W, Hq + Hk, Hk)};
                bk_buf_t d3[3] = {q, k, v};
                for (int j = 0; j < 3; j++) {
                    void *raw = ops_xmalloc((size_t)(n * w[j]) * dtype_size(dt));
                    dtype_convert(raw, dt, b[j], DT_F32, (size_t)(n * w[j]));
                    be->upload(be, d3[j].p, raw, (size_t)(n * w[j]) * dtype_size(dt));
                    free(raw), free(b[j]);
                }
                be->rope(be, q, pos, n, c->n_head, c->hd, c->theta, 0);
                be->rope(be, k, pos, n, c->n_kv, c->hd, c->theta, 0);
            }
            add_out(r, "q", be, q, n * Hq);
            add_out(r, "k", be, k, n * Hk);
            add_out(r, "v", be, v, n * Hk);
        } else { /* dq, dk, dv in; dqkv out */
            float *hq = host[nh++] = ops_rand(&rng, n * Hq, 2, 0), *hk = host[nh++] = ops_rand(&rng, n * Hk, 2, 0);
            float *hv = host[nh++] = ops_rand(&rng, n * Hk, 2, 0);
            bk_buf_t q = ops_put(be, dt, hq, n * Hq), k = ops_put(be, dt, hk, n * Hk), v = ops_put(be, dt, hv, n * Hk);
            bk_buf_t x = ops_nan(be, dt, n * W);
            dev[nd++] = x.p, dev[nd++] = q.p, dev[nd++] = k.p, dev[nd++] = v.p;
            float *all;
            if (fused) {
                be->qkv_rope(be, x, q, k, v, pos, n, c->n_head, c->n_kv, c->hd, c->theta, 1);
                all = ops_get(be, x, n * W);
                /* the inputs are left as they were */
                float *q2 = ops_get(be, q, n * Hq), *k2 = ops_get(be, k, n * Hk), *v2 = ops_get(be, v, n * Hk);
                int same = !memcmp(q2, hq, (size_t)(n * Hq) * 4) && !memcmp(k2, hk, (size_t)(n * Hk) * 4) &&
                           !memcmp(v2, hv, (size_t)(n * Hk) * 4);
                free(q2), free(k2), free(v2);
                if (!same) /* shows as a NaN output */
                    all[0] = NAN;
            } else {
                be->rope(be, q, pos, n, c->n_head, c->hd, c->theta, 1);
                be->rope(be, k, pos, n, c->n_kv, c->hd, c->theta, 1);
                float *b[3] = {ops_get(be, q, n * Hq), ops_get(be, k, n * Hk), ops_get(be, v, n * Hk)};
                all = side_by_side(b, w, 3, n);
                free(b[0]), free(b[1]), free(b[2]);
            }
            const char *names[3] = {"dqkv[q]", "dqkv[k]", "dqkv[v]"};
            add_cols(r, names, all, n, W, w, 3, dt);
            free(all);
        }
        break;
    }
    case FU_GLU_FWD:
    case FU_GLU_BWD: {
        int64_t F = c->d, nf = n * F;
        float *hgu = host[nh++] = ops_rand(&rng, 2 * nf, 4, 0);
        float *hdh = host[nh++] = ops_rand(&rng, nf, 1, 0);
        bk_buf_t gu = ops_put(be, dt, hgu, 2 * nf), dh = ops_put(be, dt, hdh, nf);
        dev[nd++] = gu.p, dev[nd++] = dh.p;
        int64_t w[2] = {F, F};
        if (c->op == FU_GLU_FWD) {
            bk_buf_t h = ops_nan(be, dt, nf);
            dev[nd++] = h.p;
            if (fused) {
                be->glu_fwd(be, h, gu, n, F);
            } else {
                float *g = cols(hgu, n, 2 * F, 0, F), *u = cols(hgu, n, 2 * F, F, F);
                bk_buf_t G = ops_put(be, dt, g, nf), U = ops_put(be, dt, u, nf);
                be->swiglu_fwd(be, h, G, U, nf);
                bk_free(be, G.p), bk_free(be, U.p), free(g), free(u);
            }
            add_out(r, "h", be, h, nf);
        } else {
            float *all;
            if (fused) {
                bk_buf_t dgu = ops_nan(be, dt, 2 * nf);
                dev[nd++] = dgu.p;
                be->glu_bwd(be, dgu, dh, gu, n, F);
                all = ops_get(be, dgu, 2 * nf);
            } else {
                float *g = cols(hgu, n, 2 * F, 0, F), *u = cols(hgu, n, 2 * F, F, F);
                bk_buf_t G = ops_put(be, dt, g, nf), U = ops_put(be, dt, u, nf);
                bk_buf_t dG = ops_nan(be, dt, nf), dU = ops_nan(be, dt, nf);
                be->swiglu_bwd(be, dG, dU, dh, G, U, nf);
                float *b[2] = {ops_get(be, dG, nf), ops_get(be, dU, nf)};
                all = side_by_side(b, w, 2, n);
                free(b[0]), free(b[1]), free(g), free(u);
                bk_free(be, G.p), bk_free(be, U.p), bk_free(be, dG.p), bk_free(be, dU.p);
            }
            const char *names[2] = {"dgu[g]", "dgu[u]"};
            add_cols(r, names, all, n, 2 * F, w, 2, dt);
            free(all);
        }
        break;
    }
    case FU_ADD_RMSNORM: {
        int64_t d = c->d, nd2 = n * d;
        int64_t o = c->offset; /* x and r only */
        float *hx = host[nh++] = ops_rand(&rng, nd2 + o, 2, 0), *hr = host[nh++] = ops_rand(&rng, nd2 + o, 2, 0);
        float *hw = host[nh++] = ops_rand(&rng, d, 1, 0);
        for (int64_t j = 0; j < d; j++)
            hw[j] += 1.0f;
        bk_buf_t x = ops_put(be, dt, hx, nd2 + o), rr = ops_put(be, dt, hr, nd2 + o), w = ops_put(be, dt, hw, d);
        bk_buf_t xs = ops_nan(be, dt, nd2), out = ops_nan(be, dt, nd2);
        float *rstd = ops_put_raw(be, hx, (size_t)n * sizeof(float)); /* overwritten */
        dev[nd++] = x.p, dev[nd++] = rr.p, dev[nd++] = w.p, dev[nd++] = xs.p, dev[nd++] = out.p, dev[nd++] = rstd;
        x = bk_at(x, o), rr = bk_at(rr, o);
        if (fused) {
            if (c->alias) /* the sum lands where x or r is (read by the same kernel) */
                xs = c->alias == 1 ? x : rr;
            be->add_rmsnorm_fwd(be, xs, out, rstd, x, rr, w, n, d, 1e-5f);
        } else {
            /* the sum where the fused op puts it: a device's row partition may depend on
             * xsum's alignment (CUDA: 8 elements a thread where aligned) */
            if (c->alias == 1)
                xs = x, be->add(be, xs, rr, nd2);
            else if (c->alias == 2)
                xs = rr, be->add(be, xs, x, nd2);
            else
                be->copy(be, xs.p, x.p, (size_t)nd2 * dtype_size(dt)), be->add(be, xs, rr, nd2);
            be->rmsnorm_fwd(be, out, rstd, xs, w, n, d, 1e-5f);
        }
        add_out(r, "xsum", be, xs, nd2);
        add_out(r, "out", be, out, nd2);
        add_out(r, "rstd", be, bk_buf(rstd, DT_F32), n);
        break;
    }
    case FU_ADD_SUMSQ: {
        int64_t o = c->offset, oy = c->alias ? o : 0;
        float *hy = host[nh++] = ops_rand(&rng, n + oy, 2, 0), *hx = host[nh++] = ops_rand(&rng, n + o, 2, 0);
        bk_buf_t y = ops_put(be, dt, hy, n + oy), x = ops_put(be, dt, hx, n + o);
        double *acc = ops_put_raw(be, &(double){0.5}, sizeof(double)); /* it adds */
        dev[nd++] = y.p, dev[nd++] = x.p, dev[nd++] = acc;
        y = bk_at(y, oy), x = bk_at(x, o);
        if (fused) {
            be->add_sumsq(be, y, x, n, acc);
        } else {
            be->add(be, y, x, n);
            be->sumsq(be, y, n, acc);
        }
        add_out(r, "y", be, y, n);
        be->download(be, &r->scalar, acc, sizeof(double));
        r->has_scalar = 1;
        break;
    }
    default:
        break;
    }
    int rc = be->sync(be);
    for (int i = 0; i < nd; i++)
        bk_free(be, dev[i]);
    for (int i = 0; i < nh; i++)
        free(host[i]);
    if (rc < 0) {
        ops_result_free(r);
        return -1;
    }
    return 0;
}

/* ---- adamw_multi against adamw ---------------------------------------------------------------- */

/* Segments in one buffer: lengths 1, odd, across the CUDA kernel's 4096-element blocks and
 * the CPU's chunks, an empty one; index0 offsets; gaps (elements no segment covers, which
 * must keep their bits); offsets that leave bf16 pointers 2-byte aligned only, then two at
 * multiples of 8 elements (the CUDA kernel's 8-element groups, one with a ragged end). */
static const struct {
    int64_t at, n, index0;
} am_layout[] = {{0, 1, 0},        {1, 7, 3},          {9, 1000, 100000}, {1011, 4097, 17},
                 {5109, 3, 0},     {5113, 0, 5},       {5113, 70001, 4096}, {75115, 8193, 1 << 20},
                 {83309, 1, 77},   {83312, 8203, 5},   {91520, 4096, 0}};
#define AM_TOTAL 95618 /* the last segment's end, and 2 gap elements */

const ops_adamw_cfg_t ops_adamw_cfgs[4] = {
    {DT_F32, DT_F32, "f32"}, {DT_BF16, DT_BF16, "bf16"}, {DT_F32, DT_BF16, "mixed"}, {DT_BF16, DT_F32, "narrow"}};

const char *ops_sround_name(int stochastic)
{
    return stochastic == BK_SROUND_HASH3 ? "stochastic3" : stochastic == BK_SROUND ? "stochastic" : "nearest";
}

int64_t ops_adamw_multi_diff(backend_t *ref, backend_t *be, dtype_t st, dtype_t gt, int stochastic, int step,
                             uint64_t seed)
{
    enum { NS = sizeof am_layout / sizeof *am_layout };
    const int64_t T = AM_TOTAL;
    ops_rng_t rng;
    ops_rng_seed(&rng, seed);
    float *h[4] = {ops_rand(&rng, T, 1, 0), ops_rand(&rng, T, 1e-2f, 0), ops_rand(&rng, T, 1e-3f, 0),
                   ops_rand(&rng, T, 1e-5f, 0)}; /* p, g, m, v */
    for (int64_t i = 0; i < T; i++)
        h[3][i] = fabsf(h[3][i]);
    backend_t *bes[2] = {ref, be};
    bk_buf_t b[2][4];
    const dtype_t dts[4] = {st, gt, st, st};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++)
            b[k][j] = ops_put(bes[k], dts[j], h[j], T);
    /* two steps back to back, nothing waited for between them: the second call's segment
     * table must not overwrite the first's before it has reached the device */
    for (int t = step; t < step + 2; t++) {
        bk_adamw_t hp = {.lr = 1e-3f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .gscale = 0.75f,
                         .bc1 = 1.0 - pow(0.9, t), .bc2 = 1.0 - pow(0.95, t), .stochastic = stochastic,
                         /* ignored by adamw_multi: the segments' own are used */
                         .wd = 123.0f, .key = 1, .index0 = 999};
        /* the second step without the third segment: another layout on the same instance
         * (a backend that keeps something per layout must notice) */
        bk_adamw_seg_t segs[NS];
        int ns = 0;
        for (int s = 0; s < NS; s++) {
            if (t > step && s == 2)
                continue;
            int64_t a = am_layout[s].at;
            segs[ns] = (bk_adamw_seg_t){.p = bk_at(b[1][0], a).p, .g = bk_at(b[1][1], a).p, .m = bk_at(b[1][2], a).p,
                                        .v = bk_at(b[1][3], a).p, .n = am_layout[s].n, .index0 = am_layout[s].index0,
                                        .key = bk_sround_key(seed, t, s), .wd = s % 3 ? 0.1f : 0.0f};
            bk_adamw_t hs = hp;
            hs.wd = segs[ns].wd;
            hs.key = segs[ns].key;
            hs.index0 = segs[ns].index0;
            ref->adamw(ref, bk_at(b[0][0], a), bk_at(b[0][1], a), bk_at(b[0][2], a), bk_at(b[0][3], a), segs[ns].n,
                       &hs);
            ns++;
        }
        be->adamw_multi(be, segs, ns, st, gt, &hp);
    }
    int64_t differ = ref->sync(ref) < 0 || be->sync(be) < 0 ? -1 : 0;
    size_t bytes = (size_t)T * dtype_size(st);
    unsigned char *x = ops_xmalloc(bytes), *y = ops_xmalloc(bytes);
    for (int j = 0; j < 4 && differ >= 0; j += j == 0 ? 2 : 1) { /* p, m, v */
        ref->download(ref, x, b[0][j].p, bytes);
        be->download(be, y, b[1][j].p, bytes);
        for (size_t i = 0; i < bytes; i++)
            differ += x[i] != y[i];
    }
    free(x), free(y);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++)
            bk_free(bes[k], b[k][j].p);
    for (int j = 0; j < 4; j++)
        free(h[j]);
    return differ;
}

/* ---- two backends that must agree bit for bit ------------------------------------------ */

int ops_same(const ops_result_t *a, const ops_result_t *b)
{
    if (a->n_out != b->n_out || a->has_scalar != b->has_scalar ||
        (a->has_scalar && memcmp(&a->scalar, &b->scalar, sizeof a->scalar)))
        return 0;
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i].n != b->out[i].n || memcmp(a->out[i].v, b->out[i].v, (size_t)a->out[i].n * sizeof(float)))
            return 0;
    return 1;
}

/* One run on each: 0 the same bits, 1 not, -1 a failure. */
static int differ_pair(int rc_a, ops_result_t *ra, int rc_b, ops_result_t *rb)
{
    if (rc_a < 0 || rc_b < 0) {
        if (rc_a == 0)
            ops_result_free(ra);
        if (rc_b == 0)
            ops_result_free(rb);
        return -1;
    }
    int d = !ops_same(ra, rb);
    ops_result_free(ra);
    ops_result_free(rb);
    return d;
}

int ops_table_differ(backend_t *a, backend_t *b, uint64_t seed, int *runs)
{
    int bad = 0;
    *runs = 0;
    for (int k = 0; k < ops_n_cases(0); k++)
        for (int cfg = 0; cfg < OPS_NCFG; cfg++) {
            const ops_case_t *c = ops_case_at(k);
            if (!(c->cfgs & OPS_CFG(cfg)))
                continue;
            ops_result_t ra, rb;
            int rc_a = ops_run(a, c, (ops_cfg_t)cfg, seed + (uint64_t)k, 1, &ra);
            int rc_b = ops_run(b, c, (ops_cfg_t)cfg, seed + (uint64_t)k, 1, &rb);
            int d = differ_pair(rc_a, &ra, rc_b, &rb);
            if (d < 0)
                return -1;
            bad += d;
            ++*runs;
        }
    const dtype_t dts[2] = {DT_F32, DT_BF16};
    for (int k = 0; k < ops_fused_len; k++)
        for (int j = 0; j < 2 && ops_fused_has(a, &ops_fused_table[k]) && ops_fused_has(b, &ops_fused_table[k]); j++) {
            ops_result_t ra, rb;
            int rc_a = ops_fused_run(a, &ops_fused_table[k], dts[j], 1, seed + (uint64_t)k, &ra);
            int rc_b = ops_fused_run(b, &ops_fused_table[k], dts[j], 1, seed + (uint64_t)k, &rb);
            int d = differ_pair(rc_a, &ra, rc_b, &rb);
            if (d < 0)
                return -1;
            bad += d;
            ++*runs;
        }
    return bad;
}
