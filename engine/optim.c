/* optim.c — gradient clipping and AdamW on the owned slices (optim.h). */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/clip.h"
#include "../kernels/sround.h"
#include "../libcommon/log.h"

struct optim {
    backend_t *be;
    shard_t *sh;
    int stochastic;
    int device_clip;      /* optim_set_device_clip */
    double *d_stat;       /* the step's numbers on the device: [0] the loss, [1 + u] Σg² of unit u */
    double *h_stat;       /* their copy on the host (host_alloc: page-locked on a GPU) */
    int h_pinned;         /* h_stat from host_alloc, else malloc */
    float *d_coef;        /* clip_coef's result, adamw's gscale_dev */
    bk_adamw_seg_t *segs; /* adamw_multi's table: every owned tensor slice */
    int n_segs;
};

optim_t *optim_new(backend_t *be, shard_t *sh, int stochastic)
{
    /* FTK_SROUND_HASHES=3: the three-hash rounding (a hash per stored state, other
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
    o->device_clip = 1;
    int n_units, n_tensors = 0;
    const ckpt_unit_t *units = shard_units(sh, &n_units);
    size_t sb = (size_t)(1 + n_units) * sizeof(double);
    if (!(o->d_stat = bk_alloc(be, sb, BK_MEM_OTHER, "the step's loss and gradient norm accumulators")) ||
        !(o->d_coef = bk_alloc(be, sizeof(float), BK_MEM_OTHER, "the gradient clipping coefficient"))) {
        optim_free(o);
        return NULL;
    }
    for (int u = 0; u < n_units; u++)
        n_tensors += units[u].n_tensors;
    if (be->host_alloc && (o->h_stat = be->host_alloc(be, sb)))
        o->h_pinned = 1;
    if (!o->h_stat)
        o->h_stat = calloc(1 + (size_t)n_units, sizeof *o->h_stat);
    if (!(o->segs = calloc((size_t)n_tensors, sizeof *o->segs)) || !o->h_stat) {
        ftk_err_set("out of memory");
        optim_free(o);
        return NULL;
    }
    shard_set_sumsq(sh, o->d_stat + 1); /* zero now (bk_alloc), and after each step's download */
    return o;
}

void optim_free(optim_t *o)
{
    if (!o)
        return;
    bk_free(o->be, o->d_stat);
    bk_free(o->be, o->d_coef);
    if (o->h_pinned)
        o->be->host_free(o->be, o->h_stat);
    else
        free(o->h_stat);
    free(o->segs);
    free(o);
}

double *optim_loss_acc(optim_t *o) { return o->d_stat; }

void optim_set_device_clip(optim_t *o, int on) { o->device_clip = on; }

int optim_device_clip(const optim_t *o) { return o->device_clip && !shard_sum_needed(o->sh); }

/* AdamW on every owned tensor slice, with h's gscale or gscale_dev: one adamw_multi call
 * when the backend has it, else an adamw call each (the same bits, backend.h). */
static void adamw_all(optim_t *o, const ckpt_train_t *t, int64_t step, bk_adamw_t *h)
{
    backend_t *be = o->be;
    shard_t *s = o->sh;
    int n;
    const ckpt_unit_t *units = shard_units(s, &n);
    precision_dtypes_t dt = shard_dtypes(s);
    dtype_t gdt = dt.grad, sdt = dt.state;
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
        be->adamw_multi(be, o->segs, o->n_segs, sdt, gdt, h);
    } else {
        for (int i = 0; i < o->n_segs; i++) {
            const bk_adamw_seg_t *sg = &o->segs[i];
            h->wd = sg->wd;
            h->key = sg->key;
            h->index0 = sg->index0;
            be->adamw(be, bk_buf(sg->p, sdt), bk_buf((void *)sg->g, gdt), bk_buf(sg->m, sdt), bk_buf(sg->v, sdt),
                      sg->n, h);
        }
    }
    shard_step_done(s);
}

static bk_adamw_t adamw_h(const optim_t *o, const ckpt_train_t *t, int64_t step, double lr)
{
    return (bk_adamw_t){.lr = (float)lr, .b1 = (float)t->beta1, .b2 = (float)t->beta2, .eps = (float)t->eps,
                        .gscale = 1.0f, .bc1 = 1.0 - pow(t->beta1, (double)step),
                        .bc2 = 1.0 - pow(t->beta2, (double)step), .stochastic = o->stochastic};
}

void optim_queue(optim_t *o, const ckpt_train_t *t, int64_t step, double lr)
{
    backend_t *be = o->be;
    shard_t *s = o->sh;
    int n;
    shard_units(s, &n);
    dtype_t gdt = shard_dtypes(s).grad;
    shard_grads_complete(s);
    /* torch: total = ‖(‖g_1‖, …, ‖g_k‖)‖; coef = max / (total + 1e-6), clamped to 1.
     * Each unit's Σg² goes to a slot of its own, taken by the shard where it could (the
     * reduce-scatter's last add, or on one GPU a sumsq on a second stream as the backward
     * finished the unit: shard_sumsq_folded), else by sumsq here. The slots are added in
     * unit order, on the host or by clip_coef (the same arithmetic): one running sum
     * ((0 + Σ_0) + Σ_1) + …, each Σ_u summed in sumsq's fixed order (add_sumsq's too), so
     * the norm's bits do not depend on where Σ_u was taken. */
    for (int u = 0; u < n; u++) {
        shard_slice_t sl = shard_owned(s, u);
        if (!shard_sumsq_folded(s, u))
            be->sumsq(be, bk_buf(sl.g, gdt), sl.len, &o->d_stat[1 + u]);
    }
    if (optim_device_clip(o)) {
        /* The coefficient and AdamW queued behind Σg²: the host waits once, after the
         * update (the trainer's sync), not for the norm before it. */
        be->clip_coef(be, o->d_coef, o->d_stat + 1, n, t->clip);
        shard_drop(s); /* nothing may still read or gather the slices AdamW updates */
        bk_adamw_t h = adamw_h(o, t, step, lr);
        h.gscale_dev = o->d_coef;
        adamw_all(o, t, step, &h);
    }
    for (int u = 0; u <= n; u++)
        o->h_stat[u] = NAN; /* stays NaN when a failed backend skips the download */
    if (be->download_async)
        be->download_async(be, o->h_stat, o->d_stat, (size_t)(1 + n) * sizeof(double));
    else
        be->download(be, o->h_stat, o->d_stat, (size_t)(1 + n) * sizeof(double));
    be->zero(be, o->d_stat, (size_t)(1 + n) * sizeof(double)); /* the next step's start at zero */
}

double optim_finish(optim_t *o, const ckpt_train_t *t, int64_t step, double lr, double *loss)
{
    shard_t *s = o->sh;
    int n;
    shard_units(s, &n);
    *loss = o->h_stat[0];
    double sq = 0;
    for (int u = 0; u < n; u++)
        sq += o->h_stat[1 + u];
    if (!optim_device_clip(o)) {
        shard_sum_owned(s, &sq);
        shard_drop(s); /* nothing may still read or gather the slices AdamW updates */
        bk_adamw_t h = adamw_h(o, t, step, lr);
        h.gscale = bk_clip_coef(sq, t->clip);
        adamw_all(o, t, step, &h);
    }
    return sqrt(sq);
}
