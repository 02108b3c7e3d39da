/* build.h — the allocations of a training job: the shards (this rank's state), the
 * optimizer's accumulator, the shards' pool, the model's activations and the backend's
 * scratch, made on a backend in the order a run makes them. The trainer (trainer.h) builds
 * its job with build_job(), and the memory plan (plan.h) builds the same job on the
 * planning backend to count what it holds: one piece of code allocates for both, so the
 * plan cannot drift from the run.
 *
 * FTK_STEP's switches (build_step_opts) are read here: three of them change what the job
 * allocates, so the plan must see them as the run does.
 *
 * Nothing here prints. Functions return 0, or -1 / an FTK_EXIT_* code (libcommon/log.h)
 * with ftk_err_msg() set; what they make is the caller's, freed with model_free,
 * optim_free and shard_free.
 */
#ifndef FTK_BUILD_H
#define FTK_BUILD_H
#include <stdint.h>

#include "comm.h"
#include "model.h"
#include "optim.h"
#include "precision.h"
#include "shard.h"
#include "strategy.h"
#include "units.h"

/* What the allocations of a job depend on (trainer.h trainer_build_opts takes them from
 * a run's options). */
typedef struct {
    strategy_t strategy;
    int group_size;        /* hybrid: ranks per shard group; hpz: per node group (0: the node's) */
    units_policy_t units;  /* the unit of communication (units.h; zero: block) */
    int compress_weights;  /* compress.h COMPRESS_* */
    int compress_grads;    /* compress.h COMPRESS_* */
    precision_t precision;
    int stochastic;        /* bf16-true: AdamW rounds stochastically (else to nearest even) */
    int recompute;         /* model_recompute_t (plan.h: or PLAN_RECOMPUTE_AUTO, which a plan resolves) */
    int64_t micro_batch;   /* rows of a pass */
    int64_t attn_max_seg;  /* the most segments a micro-batch can hold (0: one a row); the backend's
                            * attention is prepared for it (backend.h attn_prepare) */
} build_opts_t;

/* The allocations of a job on be, in the order the trainer makes them: the shards
 * (shard_new, with o's units and compression), the optimizer's accumulator (optim_new), the
 * shards' pool (shard_reserve), the model's activations for max_tokens tokens, the backend's
 * scratch for the run's shapes (backend.h reserve, attn_prepare) and FTK_STEP's switches.
 * Returns 0, or FTK_EXIT_USAGE (the shard layout does not fit the ranks, or FTK_STEP is
 * unknown) or FTK_EXIT_FAIL (out of memory) with ftk_err_msg() set and the objects made so
 * far freed (the pointers NULL). Not agreed: every rank learns its own outcome. */
int build_job(backend_t *be, comm_t *world, const model_config_t *cfg, const build_opts_t *o, int64_t max_tokens,
              shard_t **sh, optim_t **opt, model_t **m);

/* The tokens of one forward/backward pass, micro_batch rows of max_len: 0, or -1 with
 * ftk_err_msg() naming --micro-batch when the product passes BUILD_MAX_PASS_TOKENS (the
 * activations' sizes are products of it and the model's widths: bounded, they cannot
 * overflow). */
#define BUILD_MAX_PASS_TOKENS ((int64_t)1 << 31)
int build_pass_tokens(int64_t micro_batch, int64_t max_len, int64_t *tokens);

/* FTK_STEP: which of the step's savings are on, for comparison with the plain step (every
 * combination gives the same bits): "all" (unset or empty: the default), "none", or a comma
 * list of
 *   device_clip  the clipping coefficient on the device, one host wait a step (optim.h)
 *   first_write  no memset of the gradients: the first pass writes them (shard.h)
 *   prefetch     the next step's rows read from the data file while the device works
 *   sumsq_overlap  on one GPU, each unit's Σg² taken on a second stream as the backward
 *                finishes the unit (shard.h shard_set_sumsq_side)
 * The bits (BUILD_STEP_*) in *opts; -1 with the message for an unknown name. */
enum {
    BUILD_STEP_DEVICE_CLIP = 1,
    BUILD_STEP_FIRST_WRITE = 2,
    BUILD_STEP_PREFETCH = 4,
    BUILD_STEP_SUMSQ_OVERLAP = 8,
    BUILD_STEP_ALL = 15
};
int build_step_opts(unsigned *opts);

#endif
