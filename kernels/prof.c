/* prof.c — FTK_PROFILE's per-op times (prof.h): a wrapper per op entry that counts the call
 * under its row and brackets it with a pair of timer events (or the host's clock), and the
 * table. The ops' wrappers are made from backend.h's op list (BK_OPS: a row's name and work
 * are its cost column); sync's and the byte moves' are written here. The wrappers call the
 * entries that were there before (prof_t.orig) with the same instance, so the backend's
 * context sees nothing of them. */
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
/* The (query, key) pairs of attn_cached: n queries after p0 cached positions. */
static double cached_keys(int64_t n, int64_t p0) { return (double)n * (double)p0 + (double)n * (double)(n + 1) / 2; }
/* The elements of adamw_multi's segments. */
static double seg_elems(const bk_adamw_seg_t *segs, int n_segs)
{
    double n = 0;
    for (int i = 0; i < n_segs; i++)
        n += (double)segs[i].n;
    return n;
}

/* Expands to its arguments where the kind is timed (backend.h BK_OPS), to nothing where not. */
#define PF_IF_TIMED(kind, ...) PF_IF_(BK_KIND_TIMED(kind), __VA_ARGS__)
#define PF_IF_(timed, ...) PF_IF__(timed, __VA_ARGS__)
#define PF_IF__(timed, ...) PF_IF_##timed(__VA_ARGS__)
#define PF_IF_1(...) __VA_ARGS__
#define PF_IF_0(...)

/* Every timed op of BK_OPS: its row (the list's cost column), then the op as it was. */
#define PF_WRAPPER(name, kind, params, args, cost)                                                                   \
    PF_IF_TIMED(kind, static void pf_##name(backend_t *be, BK_UNPAREN params) {                                     \
        pf_tok_t t = pf_begin(be, BK_UNPAREN cost);                                                                  \
        CALL(name, BK_UNPAREN args);                                                                                 \
        pf_end(be, t);                                                                                               \
    })
BK_OPS(PF_WRAPPER)
#undef PF_WRAPPER

/* ---- attach, reset, write, free --------------------------------------------------------- */

/* The entries bk_prof_attach wraps and bk_prof_free gives back: sync, the byte moves
 * and the timed ops. */
#define PF_MOVES(X) X(sync) X(upload) X(download) X(zero) X(copy)

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
#define WRAP_OP(name, kind, params, args, cost) PF_IF_TIMED(kind, WRAP(name))
    PF_MOVES(WRAP)
    BK_OPS(WRAP_OP)
#undef WRAP_OP
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
#define UNWRAP_OP(name, kind, params, args, cost) PF_IF_TIMED(kind, UNWRAP(name))
    PF_MOVES(UNWRAP)
    BK_OPS(UNWRAP_OP)
#undef UNWRAP_OP
#undef UNWRAP
    free(p->ev);
    free(p->pair_row);
    free(p->rows);
    free(p);
    be->prof = NULL;
}
