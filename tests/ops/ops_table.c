/* ops_table.c — the op cases and how each family runs (ops_table.h). */
#include "ops_table.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/sround.h"
#include "../../libcommon/log.h"

const char *const ops_op_names[OP_COUNT] = {
    "convert",  "matmul",   "embed_fwd",   "embed_bwd",  "rows_scatter", "rmsnorm_fwd",
    "rmsnorm_bwd", "rope", "attn_fwd",    "attn_bwd",   "attn_cached",  "swiglu_fwd",
    "swiglu_bwd", "xent",  "add",         "scale",      "sumsq",        "adamw"};
const char *const ops_cfg_names[OPS_NCFG] = {"f32", "bf16", "bf16 in, f32 acc", "f32 in, bf16 out"};

/* ---- the table ------------------------------------------------------------------------- */

#define F32 OPS_CFG(OPS_F32)
#define BOTH (OPS_CFG(OPS_F32) | OPS_CFG(OPS_BF16))
#define ALL (BOTH | OPS_CFG(OPS_MIXED) | OPS_CFG(OPS_NARROW))

/* Segment lists: one-token segments among longer ones, a single token, a packed row and
 * its padding, one odd-length sample. */
static const int64_t seg_101[] = {0, 1, 2, 37, 38, 101};
static const int64_t seg_130[] = {0, 45, 46, 130};
static const int64_t seg_67[] = {0, 67};
static const int64_t seg_53[] = {0, 3, 4, 53};
static const int64_t seg_1[] = {0, 1};
static const int64_t seg_35[] = {0, 33, 34, 35};

#define MM(m, n, k, a, b, al, be) \
    {.op = OP_MATMUL, .cfgs = ALL, .M = m, .N = n, .K = k, .ta = a, .tb = b, .alpha = al, .beta = be}
#define ATTN(o, h, kv, d, s) \
    {.op = o, .cfgs = BOTH, .n_head = h, .n_kv = kv, .hd = d, .seg = s, .n_seg = sizeof s / sizeof *s - 1}

const ops_case_t ops_table[] = {
    {.op = OP_CONVERT, .cfgs = ALL, .n = 1001},
    {.op = OP_CONVERT, .cfgs = ALL, .n = 1},
    {.op = OP_CONVERT, .cfgs = ALL, .n = 1001, .offset = 4},

    /* every transposition and beta across the 256 tiles, then the model's three products
     * (y = x·Wᵀ, dx = dy·W, dW += dyᵀ·x) at 37 tokens, then degenerate sizes */
    MM(300, 260, 270, 0, 0, 1.0f, 0.0f), MM(300, 260, 270, 0, 0, 0.5f, 1.0f),
    MM(300, 260, 270, 0, 1, 1.0f, 0.0f), MM(300, 260, 270, 0, 1, 1.0f, 1.0f),
    MM(300, 260, 270, 1, 0, 1.0f, 0.0f), MM(300, 260, 270, 1, 0, 0.5f, 1.0f),
    MM(300, 260, 270, 1, 1, 1.0f, 0.0f), MM(300, 260, 270, 1, 1, 1.0f, 1.0f),
    MM(37, 300, 100, 0, 1, 1.0f, 0.0f), MM(37, 100, 300, 0, 0, 1.0f, 1.0f),
    MM(300, 100, 37, 1, 0, 1.0f, 1.0f), MM(1, 7, 3, 0, 1, 1.0f, 0.0f),
    MM(5, 1, 513, 1, 0, 1.0f, 1.0f), MM(257, 3, 1, 0, 0, 2.0f, 0.0f),
    {.op = OP_MATMUL, .cfgs = ALL, .M = 300, .N = 259, .K = 270, .tb = 1, .alpha = 1, .beta = 1, .offset = 1},

    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 77, .V = 13, .d = 100},
    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 9, .V = 40, .d = 1000},
    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 1, .V = 3, .d = 64},
    /* few rows: every row collects many tokens */
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 77, .V = 13, .d = 100},
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 9, .V = 40, .d = 1000},
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 1, .V = 3, .d = 64},
    /* chains of ~33 tokens an id: several of the CUDA row kernel's groups of 8 */
    {.op = OP_EMBED_BWD, .cfgs = ALL, .n = 100, .V = 3, .d = 200},
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 13, .V = 40, .d = 100},
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 1, .V = 3, .d = 1000},
    /* views 4 elements in: 8-byte aligned bf16, 16-byte aligned fp32 (the CUDA 16-byte
     * accesses are taken for one and not the other), and 2 in */
    {.op = OP_EMBED_FWD, .cfgs = BOTH, .n = 9, .V = 40, .d = 1000, .offset = 4},
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 13, .V = 40, .d = 96, .offset = 2},
    /* and aligned: many rows 8 elements a thread */
    {.op = OP_ROWS_SCATTER, .cfgs = BOTH, .n = 13, .V = 40, .d = 96},

    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 7, .d = 1000},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 33, .d = 100},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 1, .d = 64},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 130, .d = 96},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 7, .d = 1000},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 33, .d = 100},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 1, .d = 64},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 130, .d = 96},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 5, .d = 1000, .offset = 3},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 5, .d = 1000, .offset = 4},
    /* Llama widths: more than one 8-element group per thread of a row */
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 5, .d = 4096},
    {.op = OP_RMSNORM_FWD, .cfgs = BOTH, .n = 3, .d = 5120},
    {.op = OP_RMSNORM_BWD, .cfgs = ALL, .n = 5, .d = 4096},

    {.op = OP_ROPE, .cfgs = BOTH, .n = 37, .n_head = 4, .hd = 64, .theta = 10000.0f},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 37, .n_head = 4, .hd = 64, .theta = 10000.0f, .inverse = 1},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 5, .n_head = 8, .hd = 80, .theta = 500000.0f, .pos_step = 997},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 130, .n_head = 1, .hd = 96, .theta = 10000.0f, .pos_step = 31, .inverse = 1},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 1, .n_head = 2, .hd = 128, .theta = 10000.0f},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 33, .n_head = 2, .hd = 128, .theta = 10000.0f, .pos_step = 123},
    {.op = OP_ROPE, .cfgs = BOTH, .n = 9, .n_head = 4, .hd = 64, .theta = 10000.0f, .offset = 1},

    ATTN(OP_ATTN_FWD, 8, 2, 64, seg_101), ATTN(OP_ATTN_FWD, 4, 1, 80, seg_130),
    ATTN(OP_ATTN_FWD, 2, 2, 96, seg_67),  ATTN(OP_ATTN_FWD, 4, 1, 128, seg_53),
    ATTN(OP_ATTN_FWD, 1, 1, 64, seg_1),   ATTN(OP_ATTN_FWD, 8, 4, 128, seg_35),
    ATTN(OP_ATTN_BWD, 8, 2, 64, seg_101), ATTN(OP_ATTN_BWD, 4, 1, 80, seg_130),
    ATTN(OP_ATTN_BWD, 2, 2, 96, seg_67),  ATTN(OP_ATTN_BWD, 4, 1, 128, seg_53),
    ATTN(OP_ATTN_BWD, 1, 1, 64, seg_1),   ATTN(OP_ATTN_BWD, 8, 4, 128, seg_35),
    {.op = OP_ATTN_FWD, .cfgs = BOTH, .n_head = 4, .n_kv = 1, .hd = 64, .seg = seg_53, .n_seg = 3, .offset = 1},
    {.op = OP_ATTN_BWD, .cfgs = BOTH, .n_head = 4, .n_kv = 1, .hd = 64, .seg = seg_53, .n_seg = 3, .offset = 1},
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 5, .p0 = 300, .n_head = 8, .n_kv = 2, .hd = 64},
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 1, .p0 = 0, .n_head = 4, .n_kv = 1, .hd = 128},
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 3, .p0 = 61, .n_head = 2, .n_kv = 2, .hd = 80},
    {.op = OP_ATTN_CACHED, .cfgs = BOTH, .n = 2, .p0 = 17, .n_head = 4, .n_kv = 1, .hd = 96},

    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 1000},
    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 4097},
    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 1},
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 1000},
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 4097},
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 1},
    {.op = OP_SWIGLU_FWD, .cfgs = BOTH, .n = 4097, .offset = 4},
    {.op = OP_SWIGLU_BWD, .cfgs = BOTH, .n = 4097, .offset = 2},

    {.op = OP_XENT, .cfgs = F32, .n = 9, .V = 1000},
    {.op = OP_XENT, .cfgs = F32, .n = 9, .V = 1000, .grad_scale = 0.25f},
    {.op = OP_XENT, .cfgs = F32, .n = 3, .V = 32003, .grad_scale = 1.0f},
    {.op = OP_XENT, .cfgs = F32, .n = 1, .V = 5, .grad_scale = 1.0f},

    {.op = OP_ADD, .cfgs = ALL, .n = 1000},
    {.op = OP_ADD, .cfgs = ALL, .n = 4097},
    {.op = OP_ADD, .cfgs = ALL, .n = 1001, .offset = 1},
    {.op = OP_SCALE, .cfgs = BOTH, .n = 1001, .alpha = 0.37f},
    {.op = OP_SCALE, .cfgs = BOTH, .n = 1, .alpha = -3.0f},
    {.op = OP_SCALE, .cfgs = BOTH, .n = 1001, .alpha = 0.37f, .offset = 4},
    {.op = OP_ADD, .cfgs = ALL, .n = 1001, .offset = 4},
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 1000},
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 2 * 65536 + 17}, /* the CPU's blocks and a ragged end */
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 4097, .offset = 1},
    {.op = OP_SUMSQ, .cfgs = BOTH, .n = 4097, .offset = 4},

    {.op = OP_ADAMW, .cfgs = ALL, .n = 1000, .step = 1, .wd = 0.1f},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 4097, .step = 10, .gscale = 0.5f},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 1001, .step = 3, .wd = 0.1f, .stochastic = 1, .index0 = 12345},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 999, .step = 2, .stochastic = 1, .offset = 1},
    {.op = OP_ADAMW, .cfgs = ALL, .n = 999, .step = 2, .stochastic = 1, .offset = 4},
};
const int ops_table_len = (int)(sizeof ops_table / sizeof *ops_table);

void ops_case_name(const ops_case_t *c, char *out, size_t size)
{
    const char *op = ops_op_names[c->op];
    switch (c->op) {
    case OP_MATMUL:
        snprintf(out, size, "%s %lldx%lldx%lld ta=%d tb=%d alpha=%g beta=%g", op, (long long)c->M, (long long)c->N,
                 (long long)c->K, c->ta, c->tb, c->alpha, c->beta);
        break;
    case OP_EMBED_FWD:
    case OP_EMBED_BWD:
    case OP_ROWS_SCATTER:
        snprintf(out, size, "%s n=%lld V=%lld d=%lld", op, (long long)c->n, (long long)c->V, (long long)c->d);
        break;
    case OP_RMSNORM_FWD:
    case OP_RMSNORM_BWD:
        snprintf(out, size, "%s n=%lld d=%lld", op, (long long)c->n, (long long)c->d);
        break;
    case OP_ROPE:
        snprintf(out, size, "%s n=%lld heads=%d hd=%d theta=%g pos*%d%s", op, (long long)c->n, c->n_head, c->hd,
                 c->theta, c->pos_step ? c->pos_step : 1, c->inverse ? " inverse" : "");
        break;
    case OP_ATTN_FWD:
    case OP_ATTN_BWD:
        snprintf(out, size, "%s n=%lld segs=%lld H=%d KV=%d hd=%d", op, (long long)c->seg[c->n_seg],
                 (long long)c->n_seg, c->n_head, c->n_kv, c->hd);
        break;
    case OP_ATTN_CACHED:
        snprintf(out, size, "%s n=%lld p0=%lld H=%d KV=%d hd=%d", op, (long long)c->n, (long long)c->p0, c->n_head,
                 c->n_kv, c->hd);
        break;
    case OP_XENT:
        snprintf(out, size, "%s n=%lld V=%lld grad_scale=%g", op, (long long)c->n, (long long)c->V, c->grad_scale);
        break;
    case OP_ADAMW:
        snprintf(out, size, "%s n=%lld t=%d wd=%g%s", op, (long long)c->n, c->step, c->wd,
                 c->stochastic ? " stochastic" : "");
        break;
    default:
        snprintf(out, size, "%s n=%lld", op, (long long)c->n);
    }
    if (c->offset) {
        size_t len = strlen(out);
        snprintf(out + len, size - len, " at +%lld", (long long)c->offset);
    }
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

/* One run: the backend, the inputs' generator, and what to free at the end. */
typedef struct {
    backend_t *be;
    ops_rng_t rng;
    int full;
    int64_t off; /* the case's offset */
    void *dev[16], *host[16];
    int n_dev, n_host;
    ops_result_t *r;
} run_t;

static void *keep_host(run_t *R, void *p)
{
    R->host[R->n_host++] = p;
    return p;
}
static void *keep_dev(run_t *R, void *p)
{
    R->dev[R->n_dev++] = p;
    return p;
}
/* Random host values (bf16 ones unless full), freed with the run. */
static float *hrand(run_t *R, int64_t n, float scale) { return keep_host(R, ops_rand(&R->rng, n, scale, !R->full)); }
static float *hzeros(run_t *R, int64_t n)
{
    float *p = keep_host(R, ops_xmalloc((size_t)n * sizeof *p));
    memset(p, 0, (size_t)n * sizeof *p);
    return p;
}
/* host's n values on the device in dt (host rounded to dt in place), R->off elements into
 * their allocation. */
static bk_buf_t put(run_t *R, dtype_t dt, float *host, int64_t n)
{
    float *h = ops_xmalloc((size_t)(n + R->off) * sizeof *h);
    for (int64_t i = 0; i < R->off; i++)
        h[i] = NAN;
    memcpy(h + R->off, host, (size_t)n * sizeof *h);
    bk_buf_t b = ops_put(R->be, dt, h, n + R->off);
    memcpy(host, h + R->off, (size_t)n * sizeof *h);
    free(h);
    keep_dev(R, b.p);
    return bk_at(b, R->off);
}
static bk_buf_t poisoned(run_t *R, dtype_t dt, int64_t n)
{
    bk_buf_t b = ops_nan(R->be, dt, n + R->off);
    keep_dev(R, b.p);
    return bk_at(b, R->off);
}
static void *put_raw(run_t *R, const void *host, size_t bytes) { return keep_dev(R, ops_put_raw(R->be, host, bytes)); }

static void output(run_t *R, const char *name, bk_buf_t b, int64_t n, int rounds)
{
    ops_out_t *o = &R->r->out[R->r->n_out++];
    o->name = name;
    o->v = ops_get(R->be, b, n);
    o->n = n;
    o->dt = b.dt;
    o->rounds = rounds;
}

/* The inputs' dtype and the accumulator's (ops_table.h). */
static dtype_t in_dt(ops_cfg_t cfg) { return cfg == OPS_BF16 || cfg == OPS_MIXED ? DT_BF16 : DT_F32; }
static dtype_t acc_dt(ops_cfg_t cfg) { return cfg == OPS_BF16 || cfg == OPS_NARROW ? DT_BF16 : DT_F32; }

static void run_convert(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    bk_buf_t src = put(R, in_dt(cfg), hrand(R, c->n, 3), c->n), dst = poisoned(R, acc_dt(cfg), c->n);
    R->be->convert(R->be, dst, src, c->n);
    output(R, "dst", dst, c->n, 1);
}

static void run_matmul(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
{
    int64_t M = c->M, N = c->N, K = c->K;
    bk_buf_t A = put(R, in_dt(cfg), hrand(R, M * K, 1), M * K), B = put(R, in_dt(cfg), hrand(R, K * N, 1), K * N);
    /* beta = 0 must not read C: NaN there would show */
    bk_buf_t C = c->beta != 0.0f ? put(R, acc_dt(cfg), hrand(R, M * N, 1), M * N) : poisoned(R, acc_dt(cfg), M * N);
    R->be->matmul(R->be, c->ta, c->tb, M, N, K, c->alpha, A, B, c->beta, C);
    output(R, "C", C, M * N, 1);
}

/* embed_fwd, embed_bwd (dtable adds), rows_scatter (distinct rows). */
static void run_embed(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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

static void run_rmsnorm(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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

static void run_rope(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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
static void run_attn(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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

static void run_swiglu(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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

static void run_xent(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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

/* add (y += x, y in the accumulator's dtype), scale, sumsq. */
static void run_pointwise(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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

static void run_adamw(run_t *R, const ops_case_t *c, ops_cfg_t cfg)
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
    R->be->adamw(R->be, p, g, m, v, n, &h);
    output(R, "p", p, n, 1);
    output(R, "m", m, n, 1);
    output(R, "v", v, n, 1);
}

int ops_run(backend_t *be, const ops_case_t *c, ops_cfg_t cfg, uint64_t seed, int full, ops_result_t *r)
{
    memset(r, 0, sizeof *r);
    run_t R = {.be = be, .full = full, .off = c->offset, .r = r};
    /* the inputs depend on the seed, never on the configuration or the backend */
    ops_rng_seed(&R.rng, seed);
    switch (c->op) {
    case OP_CONVERT:
        run_convert(&R, c, cfg);
        break;
    case OP_MATMUL:
        run_matmul(&R, c, cfg);
        break;
    case OP_EMBED_FWD:
    case OP_EMBED_BWD:
    case OP_ROWS_SCATTER:
        run_embed(&R, c, cfg);
        break;
    case OP_RMSNORM_FWD:
    case OP_RMSNORM_BWD:
        run_rmsnorm(&R, c, cfg);
        break;
    case OP_ROPE:
        run_rope(&R, c, cfg);
        break;
    case OP_ATTN_FWD:
    case OP_ATTN_BWD:
    case OP_ATTN_CACHED:
        run_attn(&R, c, cfg);
        break;
    case OP_SWIGLU_FWD:
    case OP_SWIGLU_BWD:
        run_swiglu(&R, c, cfg);
        break;
    case OP_XENT:
        run_xent(&R, c, cfg);
        break;
    case OP_ADD:
    case OP_SCALE:
    case OP_SUMSQ:
        run_pointwise(&R, c, cfg);
        break;
    case OP_ADAMW:
        run_adamw(&R, c, cfg);
        break;
    case OP_COUNT:
        break;
    }
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

const char *const ops_fop_names[FU_COUNT] = {"rope_qk", "qkv_rope", "glu_fwd", "glu_bwd", "add_rmsnorm_fwd"};

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
};
const int ops_fused_len = (int)(sizeof ops_fused_table / sizeof *ops_fused_table);

void ops_fcase_name(const ops_fcase_t *c, char *out, size_t size)
{
    const char *op = ops_fop_names[c->op];
    if (c->op == FU_ROPE_QK || c->op == FU_QKV_ROPE)
        snprintf(out, size, "%s n=%lld H=%d KV=%d hd=%d theta=%g pos*%d%s", op, (long long)c->n, c->n_head, c->n_kv,
                 c->hd, c->theta, c->pos_step ? c->pos_step : 1, c->inverse ? " inverse" : "");
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
        bk_adamw_seg_t segs[NS];
        for (int s = 0; s < NS; s++) {
            int64_t a = am_layout[s].at;
            segs[s] = (bk_adamw_seg_t){.p = bk_at(b[1][0], a).p, .g = bk_at(b[1][1], a).p, .m = bk_at(b[1][2], a).p,
                                       .v = bk_at(b[1][3], a).p, .n = am_layout[s].n, .index0 = am_layout[s].index0,
                                       .key = bk_sround_key(seed, t, s), .wd = s % 3 ? 0.1f : 0.0f};
            bk_adamw_t hs = hp;
            hs.wd = segs[s].wd;
            hs.key = segs[s].key;
            hs.index0 = segs[s].index0;
            ref->adamw(ref, bk_at(b[0][0], a), bk_at(b[0][1], a), bk_at(b[0][2], a), bk_at(b[0][3], a), segs[s].n,
                       &hs);
        }
        be->adamw_multi(be, segs, NS, st, gt, &hp);
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
    for (int k = 0; k < ops_table_len; k++)
        for (int cfg = 0; cfg < OPS_NCFG; cfg++) {
            if (!(ops_table[k].cfgs & OPS_CFG(cfg)))
                continue;
            ops_result_t ra, rb;
            int rc_a = ops_run(a, &ops_table[k], (ops_cfg_t)cfg, seed + (uint64_t)k, 1, &ra);
            int rc_b = ops_run(b, &ops_table[k], (ops_cfg_t)cfg, seed + (uint64_t)k, 1, &rb);
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
