/* prof.c — FTK_PROFILE's per-op times (prof.h): a wrapper per op entry that counts the call
 * under its row and brackets it with a pair of timer events (or the host's clock), and the
 * table. The wrappers call the entries that were there before (prof_t.orig) with the same
 * instance, so the backend's context sees nothing of them. */
#include "prof.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "../libcommon/timer.h"

#define PF_LABEL 96
#define PF_SLOTS 4096     /* label hash table (a power of two) */
#define PF_MAX_ROWS 2048  /* more distinct labels than this: the calls go uncounted */
#define PF_MAX_PAIRS 32768 /* timer pairs waiting to be read: then the wrapper syncs */

typedef struct {
    char label[PF_LABEL];
    uint64_t calls;
    double secs, flops, bytes;
} pf_row_t;

typedef struct {
    backend_t orig; /* the entries before bk_prof_attach: what the wrappers call */
    pf_row_t *rows;
    int n_rows;
    int slot[PF_SLOTS]; /* row index + 1, 0: free */
    /* timer pairs: ev[2i] before and ev[2i+1] after a call counted under row pair_row[i] */
    bk_event_t **ev;
    int *pair_row;
    int n_made, n_used, cap;
    uint64_t untimed; /* calls not timed: no row left, no timer, a time that could not be read */
} prof_t;

static prof_t *P(backend_t *be) { return (prof_t *)be->prof; }

static const char *dn(dtype_t t) { return t == DT_F32 ? "f32" : t == DT_BF16 ? "bf16" : t == DT_F16 ? "f16" : "?"; }
static double sz(bk_buf_t b) { return (double)dtype_size(b.dt); }

static int row_of(prof_t *p, const char *label)
{
    uint32_t h = 2166136261u;
    for (const char *s = label; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    for (uint32_t i = h & (PF_SLOTS - 1);; i = (i + 1) & (PF_SLOTS - 1)) {
        int r = p->slot[i] - 1;
        if (r >= 0 && !strcmp(p->rows[r].label, label))
            return r;
        if (r < 0) {
            if (p->n_rows == PF_MAX_ROWS)
                return -1;
            r = p->n_rows++;
            memset(&p->rows[r], 0, sizeof p->rows[r]);
            snprintf(p->rows[r].label, PF_LABEL, "%s", label);
            p->slot[i] = r + 1;
            return r;
        }
    }
}

/* Reads the pairs in flight into their rows; every one has completed (after sync). */
static void drain(backend_t *be)
{
    prof_t *p = P(be);
    for (int i = 0; i < p->n_used; i++) {
        double s = p->orig.timer_elapsed(be, p->ev[2 * i], p->ev[2 * i + 1]);
        if (s >= 0 && p->pair_row[i] >= 0)
            p->rows[p->pair_row[i]].secs += s;
        else
            p->untimed++;
    }
    p->n_used = 0;
}

static int pf_sync(backend_t *be)
{
    int rc = P(be)->orig.sync(be);
    if (P(be)->orig.timer_new)
        drain(be);
    return rc;
}

/* A free timer pair (made on first use), or -1. */
static int pair_take(backend_t *be)
{
    prof_t *p = P(be);
    if (p->n_used == PF_MAX_PAIRS)
        pf_sync(be); /* an error stays the backend's, reported at the caller's next sync */
    if (p->n_used == p->n_made) {
        if (p->n_made == p->cap) {
            int cap = p->cap ? 2 * p->cap : 256;
            bk_event_t **ev = realloc(p->ev, 2 * (size_t)cap * sizeof *ev);
            if (ev)
                p->ev = ev;
            int *pr = ev ? realloc(p->pair_row, (size_t)cap * sizeof *pr) : NULL;
            if (!pr)
                return -1;
            p->pair_row = pr;
            p->cap = cap;
        }
        bk_event_t *a = p->orig.timer_new(be), *b = a ? p->orig.timer_new(be) : NULL;
        if (!b) {
            if (a)
                p->orig.event_free(be, a);
            return -1;
        }
        p->ev[2 * p->n_made] = a;
        p->ev[2 * p->n_made + 1] = b;
        p->n_made++;
    }
    return p->n_used++;
}

typedef struct {
    int row, pair;
    double t0;
} pf_tok_t;

/* Counts a call of the row LABEL (printf-style) with its work, and starts its clock. */
static pf_tok_t pf_begin(backend_t *be, double flops, double bytes, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static pf_tok_t pf_begin(backend_t *be, double flops, double bytes, const char *fmt, ...)
{
    prof_t *p = P(be);
    char label[PF_LABEL];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(label, sizeof label, fmt, ap);
    va_end(ap);
    pf_tok_t t = {row_of(p, label), -1, 0};
    if (t.row >= 0) {
        p->rows[t.row].calls++;
        p->rows[t.row].flops += flops;
        p->rows[t.row].bytes += bytes;
    }
    if (!p->orig.timer_new) {
        t.t0 = time_now();
        return t;
    }
    if ((t.pair = pair_take(be)) < 0)
        return t;
    p->pair_row[t.pair] = t.row;
    p->orig.event_record(be, p->ev[2 * t.pair]);
    return t;
}

static void pf_end(backend_t *be, pf_tok_t t)
{
    prof_t *p = P(be);
    if (!p->orig.timer_new) {
        if (t.row >= 0)
            p->rows[t.row].secs += time_now() - t.t0;
        else
            p->untimed++;
    } else if (t.pair >= 0) {
        p->orig.event_record(be, p->ev[2 * t.pair + 1]);
    } else {
        p->untimed++;
    }
}

/* ---- the wrappers: a row and its work, then the op as it was ---------------------------- */

#define CALL(op, ...) P(be)->orig.op(be, __VA_ARGS__)

static void pf_upload(backend_t *be, void *dst, const void *src, size_t bytes)
{
    pf_tok_t t = pf_begin(be, 0, (double)bytes, "upload");
    CALL(upload, dst, src, bytes);
    pf_end(be, t);
}
static void pf_download(backend_t *be, void *dst, const void *src, size_t bytes)
{
    pf_tok_t t = pf_begin(be, 0, (double)bytes, "download");
    CALL(download, dst, src, bytes);
    pf_end(be, t);
}
static void pf_zero(backend_t *be, void *p, size_t bytes)
{
    pf_tok_t t = pf_begin(be, 0, (double)bytes, "zero");
    CALL(zero, p, bytes);
    pf_end(be, t);
}
static void pf_copy(backend_t *be, void *dst, const void *src, size_t bytes)
{
    pf_tok_t t = pf_begin(be, 0, 2.0 * (double)bytes, "copy");
    CALL(copy, dst, src, bytes);
    pf_end(be, t);
}
static void pf_convert(backend_t *be, bk_buf_t dst, bk_buf_t src, int64_t n)
{
    pf_tok_t t = pf_begin(be, 0, (double)n * (sz(dst) + sz(src)), "convert %s→%s", dn(src.dt), dn(dst.dt));
    CALL(convert, dst, src, n);
    pf_end(be, t);
}
static void pf_matmul(backend_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, bk_buf_t A,
                      bk_buf_t B, float beta, bk_buf_t C)
{
    pf_tok_t t = pf_begin(be, 2.0 * (double)M * (double)N * (double)K, 0, "matmul %c%c %lldx%lldx%lld %s %s %s",
                          ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, dn(A.dt),
                          beta != 0 ? "+=" : "→", dn(C.dt));
    CALL(matmul, ta, tb, M, N, K, alpha, A, B, beta, C);
    pf_end(be, t);
}
static void pf_embed_fwd(backend_t *be, bk_buf_t out, const int32_t *ids, bk_buf_t table, int64_t n, int64_t d)
{
    pf_tok_t t = pf_begin(be, 0, 2.0 * (double)n * (double)d * sz(out) + 4.0 * (double)n, "embed_fwd %s", dn(out.dt));
    CALL(embed_fwd, out, ids, table, n, d);
    pf_end(be, t);
}
static void pf_embed_bwd(backend_t *be, bk_buf_t dtable, const int32_t *ids, bk_buf_t dout, int64_t n, int64_t d)
{
    pf_tok_t t = pf_begin(be, 0, 0, "embed_bwd %s += %s", dn(dtable.dt), dn(dout.dt));
    CALL(embed_bwd, dtable, ids, dout, n, d);
    pf_end(be, t);
}
static void pf_rows_scatter(backend_t *be, bk_buf_t dst, const int32_t *idx, bk_buf_t src, int64_t n, int64_t d)
{
    pf_tok_t t = pf_begin(be, 0, 2.0 * (double)n * (double)d * sz(dst), "rows_scatter %s", dn(dst.dt));
    CALL(rows_scatter, dst, idx, src, n, d);
    pf_end(be, t);
}
static void pf_rmsnorm_fwd(backend_t *be, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t w, int64_t n, int64_t d,
                           float eps)
{
    double nd = (double)n * (double)d;
    pf_tok_t t = pf_begin(be, 0, nd * (sz(x) + sz(out)) + (double)d * sz(w) + 4.0 * (double)n, "rmsnorm_fwd %s→%s",
                          dn(x.dt), dn(out.dt));
    CALL(rmsnorm_fwd, out, rstd, x, w, n, d, eps);
    pf_end(be, t);
}
static void pf_rmsnorm_bwd(backend_t *be, bk_buf_t dx, bk_buf_t dw, bk_buf_t dout, bk_buf_t x, bk_buf_t w,
                           const float *rstd, int64_t n, int64_t d)
{
    double nd = (double)n * (double)d;
    pf_tok_t t = pf_begin(be, 0,
                          nd * (2 * sz(dx) + sz(dout) + sz(x)) + (double)d * (2 * sz(dw) + sz(w)) + 4.0 * (double)n,
                          "rmsnorm_bwd %s", dn(dx.dt));
    CALL(rmsnorm_bwd, dx, dw, dout, x, w, rstd, n, d);
    pf_end(be, t);
}
static void pf_rope(backend_t *be, bk_buf_t x, const int32_t *pos, int64_t n, int n_head, int hd, float theta,
                    int inverse)
{
    pf_tok_t t = pf_begin(be, 0, 2.0 * (double)n * n_head * hd * sz(x), "rope %s", dn(x.dt));
    CALL(rope, x, pos, n, n_head, hd, theta, inverse);
    pf_end(be, t);
}

/* Σ over segments of L(L+1)/2: the causal (query, key) pairs of one head. */
static double causal_pairs(const int64_t *seg, int64_t n_seg)
{
    double s = 0;
    for (int64_t i = 0; i < n_seg; i++) {
        double l = (double)(seg[i + 1] - seg[i]);
        s += l * (l + 1) / 2;
    }
    return s;
}

static void pf_attn_fwd(backend_t *be, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v,
                        const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd)
{
    pf_tok_t t = pf_begin(be, 4.0 * causal_pairs(seg, n_seg) * n_head * hd, 0, "attn_fwd %s hd%d %d/%d", dn(q.dt), hd,
                          n_head, n_kv);
    CALL(attn_fwd, out, lse, q, k, v, seg, n_seg, n_head, n_kv, hd);
    pf_end(be, t);
}
static void pf_attn_bwd(backend_t *be, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k,
                        bk_buf_t v, bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head,
                        int n_kv, int hd)
{
    pf_tok_t t = pf_begin(be, 8.0 * causal_pairs(seg, n_seg) * n_head * hd, 0, "attn_bwd %s hd%d %d/%d", dn(q.dt), hd,
                          n_head, n_kv);
    CALL(attn_bwd, dq, dk, dv, dout, q, k, v, out, lse, seg, n_seg, n_head, n_kv, hd);
    pf_end(be, t);
}
static void pf_attn_cached(backend_t *be, bk_buf_t out, bk_buf_t q, bk_buf_t kc, bk_buf_t vc, int64_t n, int64_t p0,
                           int n_head, int n_kv, int hd)
{
    double keys = (double)n * (double)p0 + (double)n * (double)(n + 1) / 2;
    pf_tok_t t = pf_begin(be, 4.0 * keys * n_head * hd, 0, "attn_cached %s hd%d %d/%d", dn(q.dt), hd, n_head, n_kv);
    CALL(attn_cached, out, q, kc, vc, n, p0, n_head, n_kv, hd);
    pf_end(be, t);
}
static void pf_swiglu_fwd(backend_t *be, bk_buf_t h, bk_buf_t g, bk_buf_t u, int64_t n)
{
    pf_tok_t t = pf_begin(be, 0, 3.0 * (double)n * sz(h), "swiglu_fwd %s", dn(h.dt));
    CALL(swiglu_fwd, h, g, u, n);
    pf_end(be, t);
}
static void pf_swiglu_bwd(backend_t *be, bk_buf_t dg, bk_buf_t du, bk_buf_t dh, bk_buf_t g, bk_buf_t u, int64_t n)
{
    pf_tok_t t = pf_begin(be, 0, 5.0 * (double)n * sz(dg), "swiglu_bwd %s", dn(dg.dt));
    CALL(swiglu_bwd, dg, du, dh, g, u, n);
    pf_end(be, t);
}
static void pf_xent(backend_t *be, float *logits, const int32_t *targets, const float *weights, int64_t n, int64_t V,
                    float grad_scale, double *acc)
{
    pf_tok_t t = pf_begin(be, 0, (grad_scale != 0 ? 8.0 : 4.0) * (double)n * (double)V, "xent V=%lld%s",
                          (long long)V, grad_scale != 0 ? " with gradient" : "");
    CALL(xent, logits, targets, weights, n, V, grad_scale, acc);
    pf_end(be, t);
}
static void pf_add(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n)
{
    pf_tok_t t = pf_begin(be, 0, (double)n * (2 * sz(y) + sz(x)), "add %s += %s", dn(y.dt), dn(x.dt));
    CALL(add, y, x, n);
    pf_end(be, t);
}
static void pf_scale(backend_t *be, bk_buf_t y, float a, int64_t n)
{
    pf_tok_t t = pf_begin(be, 0, 2.0 * (double)n * sz(y), "scale %s", dn(y.dt));
    CALL(scale, y, a, n);
    pf_end(be, t);
}
static void pf_sumsq(backend_t *be, bk_buf_t x, int64_t n, double *acc)
{
    pf_tok_t t = pf_begin(be, 0, (double)n * sz(x), "sumsq %s", dn(x.dt));
    CALL(sumsq, x, n, acc);
    pf_end(be, t);
}
static void pf_adamw(backend_t *be, bk_buf_t p, bk_buf_t g, bk_buf_t m, bk_buf_t v, int64_t n, const bk_adamw_t *h)
{
    pf_tok_t t = pf_begin(be, 0, (double)n * (6 * sz(p) + sz(g)), "adamw %s, gradient %s", dn(p.dt), dn(g.dt));
    CALL(adamw, p, g, m, v, n, h);
    pf_end(be, t);
}
static void pf_quant_i8(backend_t *be, int8_t *codes, float *scales, bk_buf_t x, int64_t n, int64_t block)
{
    pf_tok_t t = pf_begin(be, 0, (double)n * (sz(x) + 1), "quant_i8 %s", dn(x.dt));
    CALL(quant_i8, codes, scales, x, n, block);
    pf_end(be, t);
}
static void pf_dequant_i8(backend_t *be, bk_buf_t y, const int8_t *codes, const float *scales, int64_t n,
                          int64_t block)
{
    pf_tok_t t = pf_begin(be, 0, (double)n * (sz(y) + 1), "dequant_i8 %s", dn(y.dt));
    CALL(dequant_i8, y, codes, scales, n, block);
    pf_end(be, t);
}
static void pf_rope_qk(backend_t *be, bk_buf_t q, bk_buf_t k, const int32_t *pos, int64_t n, int n_head, int n_kv,
                       int hd, float theta, int inverse)
{
    pf_tok_t t = pf_begin(be, 0, 2.0 * (double)n * (n_head + n_kv) * hd * sz(q), "rope_qk %s", dn(q.dt));
    CALL(rope_qk, q, k, pos, n, n_head, n_kv, hd, theta, inverse);
    pf_end(be, t);
}
static void pf_glu_fwd(backend_t *be, bk_buf_t h, bk_buf_t gu, int64_t n, int64_t F)
{
    pf_tok_t t = pf_begin(be, 0, 3.0 * (double)n * (double)F * sz(h), "glu_fwd %s", dn(h.dt));
    CALL(glu_fwd, h, gu, n, F);
    pf_end(be, t);
}
static void pf_glu_bwd(backend_t *be, bk_buf_t dgu, bk_buf_t dh, bk_buf_t gu, int64_t n, int64_t F)
{
    pf_tok_t t = pf_begin(be, 0, 5.0 * (double)n * (double)F * sz(dgu), "glu_bwd %s", dn(dgu.dt));
    CALL(glu_bwd, dgu, dh, gu, n, F);
    pf_end(be, t);
}
static void pf_qkv_rope(backend_t *be, bk_buf_t qkv, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int32_t *pos,
                        int64_t n, int n_head, int n_kv, int hd, float theta, int inverse)
{
    pf_tok_t t = pf_begin(be, 0, 2.0 * (double)n * (n_head + 2 * n_kv) * hd * sz(qkv), "qkv_rope %s%s", dn(qkv.dt),
                          inverse ? " inverse" : "");
    CALL(qkv_rope, qkv, q, k, v, pos, n, n_head, n_kv, hd, theta, inverse);
    pf_end(be, t);
}
static void pf_add_rmsnorm_fwd(backend_t *be, bk_buf_t xsum, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t r,
                               bk_buf_t w, int64_t n, int64_t d, float eps)
{
    double nd = (double)n * (double)d;
    pf_tok_t t = pf_begin(be, 0, nd * (sz(x) + sz(r) + sz(xsum) + sz(out)) + (double)d * sz(w) + 4.0 * (double)n,
                          "add_rmsnorm_fwd %s→%s", dn(x.dt), dn(out.dt));
    CALL(add_rmsnorm_fwd, xsum, out, rstd, x, r, w, n, d, eps);
    pf_end(be, t);
}
static void pf_adamw_multi(backend_t *be, const bk_adamw_seg_t *segs, int n_segs, dtype_t state_dt, dtype_t grad_dt,
                           const bk_adamw_t *h)
{
    double n = 0;
    for (int i = 0; i < n_segs; i++)
        n += (double)segs[i].n;
    pf_tok_t t = pf_begin(be, 0, n * (6.0 * (double)dtype_size(state_dt) + (double)dtype_size(grad_dt)),
                          "adamw_multi %s, gradient %s", dn(state_dt), dn(grad_dt));
    CALL(adamw_multi, segs, n_segs, state_dt, grad_dt, h);
    pf_end(be, t);
}

static void pf_add_sumsq(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n, double *acc)
{
    pf_tok_t t = pf_begin(be, 0, (double)n * (2 * sz(y) + sz(x)), "add_sumsq %s += %s", dn(y.dt), dn(x.dt));
    CALL(add_sumsq, y, x, n, acc);
    pf_end(be, t);
}

/* ---- attach, reset, write, free --------------------------------------------------------- */

/* The entries bk_prof_attach wraps and bk_prof_free gives back. */
#define PF_ENTRIES(X)                                                                                                \
    X(sync) X(upload) X(download) X(zero) X(copy) X(convert) X(matmul) X(embed_fwd) X(embed_bwd) X(rows_scatter)     \
    X(rmsnorm_fwd) X(rmsnorm_bwd) X(rope) X(attn_fwd) X(attn_bwd) X(attn_cached) X(swiglu_fwd) X(swiglu_bwd) X(xent) \
    X(add) X(scale) X(sumsq) X(adamw) X(quant_i8) X(dequant_i8) X(rope_qk) X(glu_fwd) X(glu_bwd) X(qkv_rope)     \
    X(add_rmsnorm_fwd) X(adamw_multi) X(add_sumsq)

int bk_prof_attach(backend_t *be)
{
    if (be->prof) {
        ftk_err_set("%s: already profiled", be->device);
        return -1;
    }
    prof_t *p = calloc(1, sizeof *p);
    pf_row_t *rows = calloc(PF_MAX_ROWS, sizeof *rows);
    if (!p || !rows) {
        free(p);
        free(rows);
        ftk_err_set("out of memory");
        return -1;
    }
    p->orig = *be;
    p->rows = rows;
    be->prof = p;
    /* every entry there is: the optional ones stay NULL where they are */
#define WRAP(op)                                                                                                     \
    if (be->op)                                                                                                      \
        be->op = pf_##op;
    PF_ENTRIES(WRAP)
#undef WRAP
    return 0;
}

void bk_prof_reset(backend_t *be)
{
    prof_t *p = P(be);
    if (!p)
        return;
    pf_sync(be);
    p->n_rows = 0;
    p->untimed = 0;
    memset(p->slot, 0, sizeof p->slot);
}

static int by_secs(const void *a, const void *b)
{
    const pf_row_t *x = *(const pf_row_t *const *)a, *y = *(const pf_row_t *const *)b;
    return x->secs < y->secs ? 1 : x->secs > y->secs ? -1 : x < y ? -1 : x > y;
}

/* The rows longest first, as a markdown table. */
static void table(FILE *f, pf_row_t *rows, int n, double total)
{
    const pf_row_t **ix = malloc(((size_t)n + 1) * sizeof *ix);
    if (!ix) {
        fprintf(f, "(no memory to sort the rows)\n");
        return;
    }
    for (int i = 0; i < n; i++)
        ix[i] = &rows[i];
    qsort(ix, (size_t)n, sizeof *ix, by_secs);
    fprintf(f, "| op | calls | ms | share | µs/call | TFLOP/s | GB/s |\n"
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int j = 0; j < n; j++) {
        const pf_row_t *r = ix[j];
        fprintf(f, "| %s | %llu | %.3f | %.1f%% | %.1f |", r->label, (unsigned long long)r->calls, r->secs * 1e3,
                total > 0 ? 100 * r->secs / total : 0.0, r->calls ? r->secs * 1e6 / (double)r->calls : 0.0);
        if (r->flops > 0 && r->secs > 0)
            fprintf(f, " %.3g |", r->flops / r->secs / 1e12);
        else
            fprintf(f, " |");
        if (r->bytes > 0 && r->secs > 0)
            fprintf(f, " %.3g |\n", r->bytes / r->secs / 1e9);
        else
            fprintf(f, " |\n");
    }
    free(ix);
}

int bk_prof_write(backend_t *be, FILE *f, double wall_s)
{
    prof_t *p = P(be);
    if (!p) {
        ftk_err_set("%s: not profiled", be->device);
        return -1;
    }
    int rc = pf_sync(be) < 0 ? -1 : 0;
    char err[512] = "";
    if (rc)
        snprintf(err, sizeof err, "%s", ftk_err_msg());
    /* the ops summed over their shapes and dtypes: the rows' first words */
    pf_row_t *ops = calloc((size_t)p->n_rows + 1, sizeof *ops);
    int n_ops = 0;
    double total = 0;
    uint64_t calls = 0;
    for (int i = 0; i < p->n_rows; i++) {
        const pf_row_t *r = &p->rows[i];
        total += r->secs;
        calls += r->calls;
        size_t w = strcspn(r->label, " ");
        int k = 0;
        while (ops && k < n_ops && !(strlen(ops[k].label) == w && !strncmp(ops[k].label, r->label, w)))
            k++;
        if (!ops)
            continue;
        if (k == n_ops)
            snprintf(ops[n_ops++].label, PF_LABEL, "%.*s", (int)w, r->label);
        ops[k].calls += r->calls;
        ops[k].secs += r->secs;
        ops[k].flops += r->flops;
        ops[k].bytes += r->bytes;
    }
    fprintf(f, "Per-op times on %s (%s): %llu calls, %.3f s in the ops", be->device,
            p->orig.timer_new ? "device events" : "host clock", (unsigned long long)calls, total);
    if (wall_s > 0)
        fprintf(f, " of %.3f s wall (%.1f%%)", wall_s, 100 * total / wall_s);
    if (p->untimed)
        fprintf(f, "; %llu calls not timed", (unsigned long long)p->untimed);
    fprintf(f, "\n\nBy op:\n\n");
    if (ops)
        table(f, ops, n_ops, total);
    fprintf(f, "\nBy op, shape and dtype:\n\n");
    table(f, p->rows, p->n_rows, total);
    free(ops);
    if (fflush(f) != 0 || ferror(f)) {
        ftk_err_set("writing the profile failed");
        return -1;
    }
    if (rc)
        ftk_err_set("%s", err);
    return rc;
}

int bk_prof_row(backend_t *be, const char *label, bk_prof_row_t *out)
{
    prof_t *p = P(be);
    memset(out, 0, sizeof *out);
    if (!p) {
        ftk_err_set("%s: not profiled", be->device);
        return -1;
    }
    pf_sync(be);
    int found = 0;
    for (int i = 0; i < p->n_rows; i++)
        if (!label || !strcmp(p->rows[i].label, label)) {
            out->calls += p->rows[i].calls;
            out->secs += p->rows[i].secs;
            out->flops += p->rows[i].flops;
            out->bytes += p->rows[i].bytes;
            found = 1;
        }
    out->untimed = p->untimed;
    if (!found && label) {
        ftk_err_set("no call made the row '%s'", label);
        return -1;
    }
    return 0;
}

void bk_prof_free(backend_t *be)
{
    prof_t *p = be ? P(be) : NULL;
    if (!p)
        return;
    /* newest first: an event list that pushes at its head finds each at once */
    for (int i = 2 * p->n_made - 1; i >= 0; i--)
        p->orig.event_free(be, p->ev[i]);
#define UNWRAP(op) be->op = p->orig.op;
    PF_ENTRIES(UNWRAP)
#undef UNWRAP
    free(p->ev);
    free(p->pair_row);
    free(p->rows);
    free(p);
    be->prof = NULL;
}
