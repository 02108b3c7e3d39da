/* schedule.c — the learning-rate schedule (schedule.h). */
#include "schedule.h"

#include <math.h>
#include <string.h>

double schedule_lr(const ckpt_train_t *t, int64_t step)
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
