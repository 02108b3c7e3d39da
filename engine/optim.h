/* optim.h — the optimizer step over this rank's owned slices (shard.h exposes them): the
 * global gradient norm and torch's clipping, AdamW (torch.optim.AdamW, decoupled decay)
 * through the backend's adamw_multi or adamw, and the segment table that cuts the owned
 * slices into tensor slices (docs/design.md "The optimizer step").
 *
 * An optim_t holds the step's device accumulators: the loss (lent to the model) and Σg², one
 * per unit (lent to the shard, which folds Σg² into its last reduce-scatter adds where it
 * can: shard_set_sumsq), side by side (counted by the backend), the clipping coefficient,
 * their page-locked host copy, and the table; it uses the shard_t, not owns it. Functions return
 * a pointer, or NULL with ftk_err_msg() set.
 */
#ifndef FTK_OPTIM_H
#define FTK_OPTIM_H
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../kernels/backend.h"
#include "shard.h"

typedef struct optim optim_t;

/* For the owned state of sh on be (call right after shard_new: its one allocation is part
 * of the memory plan). stochastic: bf16 stores of AdamW round stochastically (bf16-true;
 * else to nearest even), one hash an element (FTK_SROUND_HASHES=3: one a stored state, the
 * rule before 2026-11-28, for comparison; another value is an error: NULL). */
optim_t *optim_new(backend_t *be, shard_t *sh, int stochastic);
void optim_free(optim_t *o);

/* The step's numbers. The loss accumulator the model adds into (model_set_loss_acc), one
 * double in the backend's memory beside the Σg² slots, so that one copy brings both back. */
double *optim_loss_acc(optim_t *o);

/* on (the default): where the norm needs no communication (shard_sum_needed is 0: one GPU,
 * none, a group of one) the clipping coefficient is computed on the device (clip_coef) and
 * AdamW reads it there (gscale_dev), so a step waits for the device once, after the update.
 * off, and wherever ranks must sum their Σg², the host computes it between the two halves
 * below (FTK_STEP's device_clip, engine/trainer.c). Same bits either way. */
void optim_set_device_clip(optim_t *o, int on);
int optim_device_clip(const optim_t *o); /* in effect for this shard */

/* After the step's last pass: completes the gradient all-reduces, takes Σg² of the owned
 * gradients, and with the device's clipping queues the coefficient, AdamW on the owned
 * state, bf16-mixed's working copy and the gradients' clearing (shard_step_done, which
 * also drops gathered parameters); then queues the copy of the step's numbers (loss, Σg²)
 * to the host. Nothing here waits for the device (without download_async, the copy
 * does). */
void optim_queue(optim_t *o, const ckpt_train_t *t, int64_t step, double lr);
/* After the caller's sync (the step's one wait): the step's Σ weight·loss in *loss and the
 * norm before clipping, returned; with the host's clipping, sums Σg² over the shard group
 * (collective), clips to the global norm (torch's clip_grad_norm_) and queues AdamW as
 * optim_queue does on the device — the caller then syncs again to learn its errors. */
double optim_finish(optim_t *o, const ckpt_train_t *t, int64_t step, double lr, double *loss);

#endif
