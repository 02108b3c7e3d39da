/* optim.h — the optimizer step over this rank's owned slices (shard.h exposes them): the
 * global gradient norm and torch's clipping, AdamW (torch.optim.AdamW, decoupled decay)
 * through the backend's adamw_multi or adamw, and the segment table that cuts the owned
 * slices into tensor slices (docs/design.md "The optimizer step").
 *
 * An optim_t holds the step's device accumulators of Σg², one per unit (counted by the
 * backend; lent to the shard, which folds Σg² into its last reduce-scatter adds where it
 * can: shard_set_sumsq), and the table; it uses the shard_t, not owns it. Functions return
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

/* After the step's last pass: completes the gradient all-reduces, clips to the global
 * norm (torch's clip_grad_norm_; the coefficient is applied inside AdamW) and runs AdamW
 * on the owned state, refreshes bf16-mixed's working copy, then clears the gradients and
 * drops gathered parameters. Returns the norm before clipping. */
double optim_step(optim_t *o, const ckpt_train_t *t, int64_t step, double lr);

#endif
