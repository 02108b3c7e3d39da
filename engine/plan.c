/* plan.c — the memory plan (plan.h). */
#include "plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../libcommon/log.h"
#include "bgsave.h"

/* One dry build on a fresh planning backend; the accounting at its end. */
static int dry_build(const plan_opts_t *p, int rank, int recompute, bk_mem_t *mem, int64_t *S, int64_t *snap)
{
    build_opts_t o = p->o;
    o.recompute = recompute;
    backend_t *be = backend_plan_new(p->device);
    comm_t *world = be ? comm_plan(p->ranks, rank) : NULL;
    shard_t *sh = NULL;
    optim_t *opt = NULL;
    model_t *m = NULL;
    int64_t tokens;
    int rc = build_pass_tokens(o.micro_batch, p->max_len, &tokens) < 0 ? -1
             : world ? build_job(be, world, &p->cfg, &o, tokens, &sh, &opt, &m)
                     : -1;
    rc = rc ? -1 : 0;
    if (rc == 0) {
        *mem = *bk_mem(be);
        *S = shard_count(sh);
        int n_units;
        const ckpt_unit_t *units = shard_units(sh, &n_units);
        *snap = shard_writes(sh) ? bgsave_bytes(units, n_units, *S, precision_dtypes(o.precision).state,
                                                       shard_compress_grads(sh))
                                 : 0;
    }
    model_free(m);
    optim_free(opt);
    shard_free(sh);
    comm_finalize(world);
    backend_free(be);
    return rc;
}

int plan_memory(const plan_opts_t *p, int rank, int64_t device_bytes, plan_t *out)
{
    memset(out, 0, sizeof *out);
    out->rank = rank;
    /* least recompute first: auto takes the first that fits */
    static const int order[3] = {MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_NORMS, MODEL_RECOMPUTE_BLOCK};
    int want = p->o.recompute, got = -1;
    for (int i = 0; i < 3; i++) {
        int lv = order[i];
        bk_mem_t mem;
        int64_t S, snap;
        if (dry_build(p, rank, lv, &mem, &S, &snap) < 0)
            return -1;
        int cuda = !strcmp(p->device, "cuda");
        int64_t context = cuda ? BK_CUDA_CONTEXT_BYTES : 0, total = mem.dev_peak + context;
        out->acts[lv] = mem.at_peak[BK_MEM_ACTS];
        out->peak[lv] = total;
        if (got < 0 && (lv == want || (want == PLAN_RECOMPUTE_AUTO && (total <= device_bytes || i == 2)))) {
            got = lv;
            out->mem = mem;
            out->rounding = mem.dev_peak - mem.peak;
            out->context = context;
            out->total = total;
            out->shard_count = S;
            out->snapshot = snap;
        }
    }
    if (got < 0) {
        ftk_err_set("internal: recompute level %d", want);
        return -1;
    }
    out->recompute = got;
    out->fits = device_bytes > 0 && out->total <= device_bytes;
    return 0;
}

int plan_recompute_auto(const plan_opts_t *p, int rank, backend_t *be, int64_t device_bytes, plan_t *pl,
                        int64_t *budget)
{
    *budget = device_bytes > 0 ? device_bytes : plan_device_bytes(be);
    if (*budget < 0 || plan_memory(p, rank, *budget, pl) < 0) {
        char why[2048];
        snprintf(why, sizeof why, "%s", ftk_err_msg());
        ftk_err_set("--recompute auto: %s", why);
        return FTK_EXIT_USAGE;
    }
    if (!pl->fits) {
        char advice[2048];
        plan_advice(p, *budget, advice, sizeof advice);
        ftk_err_set("--recompute auto: no level fits the device's %.2f GB (planned: none %.2f, norms %.2f, block "
                    "%.2f GB); %s",
                    (double)*budget / 1e9, (double)pl->peak[MODEL_RECOMPUTE_NONE] / 1e9,
                    (double)pl->peak[MODEL_RECOMPUTE_NORMS] / 1e9, (double)pl->peak[MODEL_RECOMPUTE_BLOCK] / 1e9,
                    advice);
        return FTK_EXIT_USAGE;
    }
    return 0;
}

const char *plan_recompute_name(int level)
{
    switch (level) {
    case MODEL_RECOMPUTE_NONE:
        return "none";
    case MODEL_RECOMPUTE_NORMS:
        return "norms";
    case MODEL_RECOMPUTE_BLOCK:
        return "block";
    case PLAN_RECOMPUTE_AUTO:
        return "auto";
    default:
        return "?";
    }
}

/* p with auto's pick against budget on rank 0 and the last rank (ranks differ only by
 * padding): whether both fit, and the larger total with its level. */
typedef struct {
    int fits, level;
    int64_t peak;
} fit_t;

static int fit_of(const plan_opts_t *p, int64_t budget, fit_t *f)
{
    plan_opts_t q = *p;
    q.o.recompute = PLAN_RECOMPUTE_AUTO;
    plan_t a, b;
    if (plan_memory(&q, 0, budget, &a) < 0 || (q.ranks > 1 && plan_memory(&q, q.ranks - 1, budget, &b) < 0))
        return -1;
    const plan_t *w = q.ranks > 1 && b.total > a.total ? &b : &a;
    f->fits = a.fits && (q.ranks == 1 || b.fits);
    f->level = w->recompute;
    f->peak = w->total;
    return 0;
}

/* Appends to one of the advice's two lists, "; "-separated. */
static void add(char *list, size_t n, const char *fmt, ...) FTK_PRINTF(3, 4);
static void add(char *list, size_t n, const char *fmt, ...)
{
    size_t used = strlen(list);
    if (used && used + 2 < n)
        memcpy(list + used, "; ", 3), used += 2;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(list + used, n - used, fmt, ap);
    va_end(ap);
}

void plan_advice(const plan_opts_t *p, int64_t budget, char *out, size_t n)
{
    char yes[1024] = "", no[1024] = ""; /* the changes that fit; those that do not, alone */
    fit_t f;
    /* another precision (bf16-true's gradients are bf16 already: no --compress-grads); none
     * fitting, the one that comes nearest, if nearer than p */
    char near[160] = "";
    int64_t near_peak = INT64_MAX, yes0 = 0;
    if (fit_of(p, budget, &f) == 0)
        near_peak = f.peak; /* one that needs more than p is no advice */
    for (int pr = PREC_FP32; pr <= PREC_BF16_TRUE; pr++) {
        plan_opts_t q = *p;
        if (pr == (int)p->o.precision)
            continue;
        q.o.precision = (precision_t)pr;
        int drop = pr == PREC_BF16_TRUE && q.o.compress_grads;
        if (drop)
            q.o.compress_grads = 0;
        if (fit_of(&q, budget, &f) < 0 || (!f.fits && f.peak >= near_peak))
            continue;
        char what[160];
        snprintf(what, sizeof what, "--precision %s%s (--recompute %s, %.2f GB)", precision_name(q.o.precision),
                 drop ? " without --compress-grads" : "", plan_recompute_name(f.level), (double)f.peak / 1e9);
        if (f.fits)
            add(yes, sizeof yes, "%s", what), yes0++;
        else
            snprintf(near, sizeof near, "%s", what), near_peak = f.peak;
    }
    if (!yes0 && near[0])
        add(no, sizeof no, "%s", near);
    /* a smaller micro-batch: the total grows with it, so the largest that fits is bisected */
    int64_t mb = p->o.micro_batch;
    if (mb > 1) {
        plan_opts_t q = *p;
        q.o.micro_batch = 1;
        if (fit_of(&q, budget, &f) == 0) {
            if (!f.fits) {
                add(no, sizeof no, "--micro-batch 1 (--recompute %s, %.2f GB)", plan_recompute_name(f.level),
                    (double)f.peak / 1e9);
            } else {
                fit_t best = f, g;
                int64_t lo = 1, hi = mb; /* lo fits, hi does not */
                while (hi - lo > 1) {
                    q.o.micro_batch = lo + (hi - lo) / 2;
                    if (fit_of(&q, budget, &g) < 0)
                        break;
                    if (g.fits)
                        lo = q.o.micro_batch, best = g;
                    else
                        hi = q.o.micro_batch;
                }
                add(yes, sizeof yes, "--micro-batch %lld (--recompute %s, %.2f GB)", (long long)lo,
                    plan_recompute_name(best.level), (double)best.peak / 1e9);
            }
        }
    }
    /* more ranks, everything sharded: the total falls with the shard count, so the fewest
     * ranks that fit are bisected */
    int full = p->o.strategy == STRAT_FULL;
    if (p->ranks < PLAN_MAX_RANKS || !full) {
        plan_opts_t q = *p;
        q.o.strategy = STRAT_FULL;
        q.o.group_size = 0;
        q.ranks = PLAN_MAX_RANKS;
        if (fit_of(&q, budget, &f) == 0) {
            if (!f.fits) {
                add(no, sizeof no, "%d ranks with --strategy full (--recompute %s, %.2f GB a rank)", q.ranks,
                    plan_recompute_name(f.level), (double)f.peak / 1e9);
            } else {
                fit_t best = f, g;
                int lo = full ? p->ranks : p->ranks - 1, hi = PLAN_MAX_RANKS; /* lo does not fit, hi does */
                while (hi - lo > 1) {
                    q.ranks = lo + (hi - lo) / 2;
                    if (fit_of(&q, budget, &g) < 0)
                        break;
                    if (g.fits)
                        hi = q.ranks, best = g;
                    else
                        lo = q.ranks;
                }
                add(yes, sizeof yes, "%d rank%s%s (--recompute %s, %.2f GB a rank)", hi, hi == 1 ? "" : "s",
                    full ? "" : " with --strategy full", plan_recompute_name(best.level), (double)best.peak / 1e9);
            }
        }
    }
    snprintf(out, n, "%s%s%s%s%s", yes[0] ? "what would fit: " : "", yes, yes[0] && no[0] ? "; " : "",
             no[0] ? (yes[0] ? "not enough alone: " : "nothing one change away fits: ") : "", no);
}

int64_t plan_device_bytes(backend_t *be)
{
    int64_t avail = be->mem_avail ? be->mem_avail(be) : -1;
    if (avail < 0) {
        ftk_err_set("%s: its free memory is unknown (give --device-memory)", be->device);
        return -1;
    }
    /* in the device's pages, as the plan counts them; the context is in neither avail nor
     * held, and in the plan's total */
    return avail + bk_mem(be)->dev_in_use + (be->mem_pages ? BK_CUDA_CONTEXT_BYTES : 0);
}
