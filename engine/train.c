/* train.c — data order and schedule (train.h). */
#include "train.h"

#include <math.h>
#include <string.h>

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
    /* LitGPT steps its LambdaLR/CosineAnnealingLR after each optimizer step: step k runs at
     * the rate the schedule gives k - 1 (0 for the first step when there is a warmup). */
    if (!strcmp(ckpt_warmup_style(t), "litgpt"))
        step = step > 0 ? step - 1 : 0;
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

void train_micro_weights(const double *n, int64_t J, float *w)
{
    for (int64_t j = 0; j < J; j++)
        w[j] = n[j] > 0 ? (float)(1.0 / ((double)J * n[j])) : 0.0f;
}
