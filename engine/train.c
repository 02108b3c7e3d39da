/* train.c — data order, schedule, optimizer (train.h). */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "../libcommon/rng.h"

void train_order(uint64_t seed, int64_t epoch, int64_t n, int64_t *perm)
{
    rng_t r;
    rng_seed(&r, seed ^ (0xA0761D6478BD642Full * (uint64_t)(epoch + 1)));
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    rng_shuffle_i64(&r, perm, (size_t)n);
}

int64_t train_row_targets(const tokens_split_t *s, int64_t r)
{
    int64_t c = 0;
    for (int64_t t = s->row_offsets[r]; t < s->row_offsets[r + 1]; t++)
        c += s->loss_mask[t];
    return c;
}

double train_lr(const ckpt_train_t *t, int64_t step)
{
    if (t->warmup > 0 && step <= t->warmup)
        return t->lr * (double)step / (double)t->warmup;
    if (!strcmp(t->schedule, "constant"))
        return t->lr;
    int64_t span = t->total_steps - t->warmup;
    double p = span > 0 ? (double)(step - t->warmup) / (double)span : 1.0;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    if (!strcmp(t->schedule, "linear"))
        return t->lr + (t->min_lr - t->lr) * p;
    return t->min_lr + 0.5 * (1.0 + cos(M_PI * p)) * (t->lr - t->min_lr);
}

int optim_init(optim_t *o, model_t *model)
{
    int n;
    const ckpt_unit_t *u = model_units(model, &n);
    memset(o, 0, sizeof *o);
    o->be = model_backend(model);
    o->n_units = n;
    o->m = calloc((size_t)n, sizeof *o->m);
    o->v = calloc((size_t)n, sizeof *o->v);
    if (!o->m || !o->v) {
        ftk_err_set("out of memory");
        optim_free(o);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (!(o->m[i] = o->be->alloc((size_t)u[i].padded * sizeof(float))) ||
            !(o->v[i] = o->be->alloc((size_t)u[i].padded * sizeof(float)))) {
            optim_free(o);
            return -1;
        }
    return 0;
}

void optim_free(optim_t *o)
{
    for (int i = 0; i < o->n_units; i++) {
        if (o->m)
            o->be->free(o->m[i]);
        if (o->v)
            o->be->free(o->v[i]);
    }
    free(o->m);
    free(o->v);
    memset(o, 0, sizeof *o);
}

double optim_step(optim_t *o, model_t *model, const ckpt_train_t *t, int64_t step, double lr)
{
    const backend_t *be = o->be;
    int n;
    const ckpt_unit_t *u = model_units(model, &n);
    /* torch: total = ‖(‖g_1‖, …, ‖g_k‖)‖; coef = max / (total + 1e-6), clamped to 1. */
    double sq = 0;
    for (int i = 0; i < n; i++)
        sq += be->sumsq(model_unit_grad(model, i), u[i].padded);
    double norm = sqrt(sq);
    if (t->clip > 0) {
        double coef = t->clip / (norm + 1e-6);
        if (coef < 1.0)
            for (int i = 0; i < n; i++)
                be->scale(model_unit_grad(model, i), (float)coef, u[i].padded);
    }
    double bc1 = 1.0 - pow(t->beta1, (double)step), bc2 = 1.0 - pow(t->beta2, (double)step);
    for (int i = 0; i < n; i++) {
        float *p = model_unit_param(model, i), *g = model_unit_grad(model, i);
        for (int k = 0; k < u[i].n_tensors; k++) {
            const ckpt_tensor_t *x = &u[i].t[k];
            float wd = x->is_norm && !t->decay_norms ? 0.0f : (float)t->weight_decay;
            be->adamw(p + x->offset, g + x->offset, o->m[i] + x->offset, o->v[i] + x->offset, x->numel, (float)lr,
                      (float)t->beta1, (float)t->beta2, (float)t->eps, wd, bc1, bc2);
        }
    }
    return norm;
}
