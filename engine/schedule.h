/* schedule.h — the learning-rate schedule of ftk-train's loop. */
#ifndef FTK_SCHEDULE_H
#define FTK_SCHEDULE_H
#include <stdint.h>

#include "../formats/checkpoint.h"

/* Learning rate of step `step` (1-based): linear warmup from lr/warmup to lr over
 * `warmup` steps, then schedule "cosine" or "linear" from lr down to min_lr at
 * total_steps, or "constant". With warmup_style "litgpt" step k takes that of step k-1
 * (step 0: 0 when warmup > 0, else lr), which is what LitGPT's finetune computes: its
 * LambdaLR(step / warmup) then CosineAnnealingLR(T_max = total - warmup), stepped after
 * each optimizer step (docs/litgpt.md). */
double schedule_lr(const ckpt_train_t *t, int64_t step);

#endif
