/* optim.c — gradient clipping and AdamW on the owned slices (optim.h). */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/sround.h"
#include "../libcommon/log.h"

struct optim {
    backend_t *be;
    shard_t *sh;
    int stochastic;
    double *d_sq;         /* Σg² of each unit's owned gradient, a slot each, on the device */
    double *h_sq;         /* the slots downloaded */
    bk_adamw_seg_t *segs; /* adamw_multi's table: every owned tensor slice */
    int n_segs;
};

optim_t *optim_new(backend_t *be, shard_t *sh, int stochastic)
{
    /* FTK_SROUND_HASHES=3: the rounding before 2026-11-28 (a hash per stored state, other
     * bits), so a GPU can time the step with both; a checkpoint does not record it */
    const char *e = getenv("FTK_SROUND_HASHES");
    if (e && strcmp(e, "1") && strcmp(e, "3")) {
        ftk_err_set("FTK_SROUND_HASHES=%s: expected 1 (one hash an element) or 3 (one a stored state)", e);
        return NULL;
    }
    optim_t *o = calloc(1, sizeof *o);
    if (!o) {
        ftk_err_set("out of memory");
        return NULL;
    }
    o->be = be;
    o->sh = sh;
    o->stochastic = !stochastic ? BK_ROUND_NEAREST : e && !strcmp(e, "3") ? BK_SROUND_HASH3 : BK_SROUND;
    int n_units, n_tensors = 0;
    const ckpt_unit_t *units = shard_units(sh, &n_units);
    if (!(o->d_sq = bk_alloc(be, (size_t)n_units * sizeof(double), BK_MEM_OTHER, "the gradient norm's accumulators"))) {
        optim_free(o);
        return NULL;
    }
    for (int u = 0; u < n_units; u++)
        n_tensors += units[u].n_tensors;
    if (!(o->segs = calloc((size_t)n_tensors, sizeof *o->segs)) ||
        !(o->h_sq = calloc((size_t)n_units, sizeof *o->h_sq))) {
        ftk_err_set("out of memory");
        optim_free(o);
        return NULL;
    }
    shard_set_sumsq(sh, o->d_sq); /* zero now (bk_alloc), and after each step's download */
    return o;
}

void optim_free(optim_t *o)
{
    if (!o)
        return;
    bk_free(o->be, o->d_sq);
    free(o->h_sq);
    free(o->segs);
    free(o);
}

double optim_step(optim_t *o, const ckpt_train_t *t, int64_t step, double lr)
{
    backend_t *be = o->be;
    shard_t *s = o->sh;
    int n;
    const ckpt_unit_t *units = shard_units(s, &n);
    precision_dtypes_t dt = shard_dtypes(s);
    dtype_t gdt = dt.grad, sdt = dt.state;
    shard_grads_complete(s);
    /* torch: total = ‖(‖g_1‖, …, ‖g_k‖)‖; coef = max / (total + 1e-6), clamped to 1.
     * Each unit's Σg² goes to a slot of its own, from the reduce-scatter's last add where
     * the shard folded it there (units complete in the backward's order), else from sumsq
     * here; the slots come back in one download and are added in unit order on the host.
     * The association is that of one running sum: ((0 + Σ_0) + Σ_1) + …, each Σ_u summed
     * in sumsq's fixed order (add_sumsq's too), so the norm's bits do not depend on where
     * Σ_u was taken. */
    for (int u = 0; u < n; u++) {
        shard_slice_t sl = shard_owned(s, u);
        if (!shard_sumsq_folded(s, u))
            be->sumsq(be, bk_buf(sl.g, gdt), sl.len, &o->d_sq[u]);
    }
    for (int u = 0; u < n; u++)
        o->h_sq[u] = NAN; /* stays NaN when a failed backend skips the download */
    be->download(be, o->h_sq, o->d_sq, (size_t)n * sizeof(double));
    be->zero(be, o->d_sq, (size_t)n * sizeof(double)); /* the next step's slots start at zero */
    double sq = 0;
    for (int u = 0; u < n; u++)
        sq += o->h_sq[u];
    shard_sum_owned(s, &sq);
    double norm = sqrt(sq);
    float gscale = 1.0f;
    if (t->clip > 0) {
        double coef = t->clip / (norm + 1e-6);
        if (coef < 1.0)
            gscale = (float)coef;
    }
    shard_drop(s); /* nothing may still read or gather the slices AdamW updates */
    bk_adamw_t h = {.lr = (float)lr, .b1 = (float)t->beta1, .b2 = (float)t->beta2, .eps = (float)t->eps,
                    .gscale = gscale, .bc1 = 1.0 - pow(t->beta1, (double)step),
                    .bc2 = 1.0 - pow(t->beta2, (double)step), .stochastic = o->stochastic};
    /* Every owned tensor slice: one adamw_multi call when the backend has it, else an adamw
     * call each (the same bits, backend.h). */
    o->n_segs = 0;
    for (int u = 0; u < n; u++) {
        shard_slice_t sl = shard_owned(s, u);
        int64_t lo = sl.lo, hi = lo + sl.len;
        for (int k = 0; k < units[u].n_tensors; k++) {
            const ckpt_tensor_t *x = &units[u].t[k];
            /* The part [a, b) of the tensor inside the owned range. */
            int64_t a = x->offset > lo ? x->offset : lo;
            int64_t b = x->offset + x->numel < hi ? x->offset + x->numel : hi;
            if (a >= b)
                continue;
            int64_t off = a - lo;
            bk_adamw_seg_t *sg = &o->segs[o->n_segs++];
            sg->p = bk_at(bk_buf(sl.p, sdt), off).p;
            sg->m = bk_at(bk_buf(sl.m, sdt), off).p;
            sg->v = bk_at(bk_buf(sl.v, sdt), off).p;
            sg->g = bk_at(bk_buf(sl.g, gdt), off).p;
            sg->n = b - a;
            sg->wd = x->is_norm && !t->decay_norms ? 0.0f : (float)t->weight_decay;
            /* the rounding bits of an element depend on its tensor and index, not the slicing */
            sg->key = bk_sround_key((uint64_t)t->seed, step, (int64_t)u * 16 + k);
            sg->index0 = a - x->offset;
        }
    }
    if (be->adamw_multi) {
        be->adamw_multi(be, o->segs, o->n_segs, sdt, gdt, &h);
    } else {
        for (int i = 0; i < o->n_segs; i++) {
            const bk_adamw_seg_t *sg = &o->segs[i];
            h.wd = sg->wd;
            h.key = sg->key;
            h.index0 = sg->index0;
            be->adamw(be, bk_buf(sg->p, sdt), bk_buf((void *)sg->g, gdt), bk_buf(sg->m, sdt), bk_buf(sg->v, sdt),
                      sg->n, &h);
        }
    }
    shard_step_done(s);
    return norm;
}
