/* plan.h — the memory plan of a training job: what each rank's backend will hold, found by
 * running the code that allocates (build.h build_job(): the shards, their pool, the model) on
 * the planning backend (kernels/backend.h backend_plan_new) in a pretend world of N ranks
 * (comm_plan). Nothing is read but the model's configuration, nothing is computed or
 * written, and a device that is not present can be planned for. On the CPU backend the
 * plan equals the high-water mark a run measures (tests/cli/plan.sh).
 *
 * The snapshot of --async-save (engine/bgsave.h: a host copy of the rank's shard, page-
 * locked on a GPU) is host memory beside the backend's: reported on its own line
 * (bgsave_bytes, the size bgsave_new allocates), not in the backend's peak.
 *
 * On cuda the plan's total is what the device will hold: the allocations in the driver's
 * pages, the CUDA backend's scratch (reserved for the run's shapes before its first step,
 * backend.h reserve) and the CUDA context (kernels/cuda_mem.h; docs/training.md, "What
 * --plan counts on a GPU", says which terms only a GPU confirms).
 *
 * What the plan cannot see: host memory (batches, checkpoint buffers, the CPU backend's
 * per-op scratch of a few rows per thread), scratch an op grows past the reservation
 * (shapes larger than the run's), and other processes on the device.
 */
#ifndef FTK_PLAN_H
#define FTK_PLAN_H
#include <stddef.h>
#include <stdint.h>

#include "build.h"

typedef struct {
    model_config_t cfg;
    build_opts_t o;    /* what the job allocates by; recompute may be PLAN_RECOMPUTE_AUTO */
    int64_t max_len;   /* tokens per row */
    int ranks;         /* world size planned for */
    const char *device; /* "cpu" or "cuda" */
} plan_opts_t;

typedef struct {
    int rank;            /* the rank this is for */
    int64_t shard_count; /* S */
    bk_mem_t mem;        /* peak and per class at the peak (the bytes bk_alloc is asked for) */
    /* What the device holds beyond mem.peak (0 off cuda; cuda_mem.h): the allocations'
     * rounding to the driver's pages at their peak (mem.dev_peak − mem.peak), and the CUDA
     * context. total = mem.peak + rounding + context: what a GPU measures in use
     * (cudaMemGetInfo), and what fitting is judged on. */
    int64_t rounding, context, total;
    int recompute;       /* the level planned (model_recompute_t): o.recompute, or auto's pick */
    int64_t acts[3];     /* activations with each level (indexed by model_recompute_t) */
    int64_t peak[3];     /* the total with each level */
    int64_t snapshot;    /* --async-save's host snapshot (0 on a rank that writes no shard) */
    int fits;            /* the total is at most device_bytes (auto: 0 when no level's is; block planned) */
} plan_t;

/* The most ranks a plan is made for (ftk-train --ranks, and the search of plan_advice). */
#define PLAN_MAX_RANKS 99999
#define PLAN_RANKS_RANGE "1..99999"

/* The plan of rank `rank`, with every recompute level's activations and total beside it.
 * o.recompute PLAN_RECOMPUTE_AUTO plans the least recompute whose total is at most
 * device_bytes (none, then norms, then block; block, with fits 0, when none fits). 0 or
 * -1 with ftk_err_msg() set (a bad configuration). */
#define PLAN_RECOMPUTE_AUTO (-1)
int plan_memory(const plan_opts_t *p, int rank, int64_t device_bytes, plan_t *out);

/* --recompute auto on rank `rank` of p: the least recompute whose plan fits the budget,
 * device_bytes or, where that is 0, what be can still take (plan_device_bytes). Ranks may
 * pick differently (padding, free memory): every level gives the same bits. 0 with the
 * plan in *pl (pl->recompute: the level) and the budget in *budget; FTK_EXIT_USAGE with
 * ftk_err_msg() set ("--recompute auto: …") when the budget is unknown, the plan fails, or
 * no level fits (the allocation would fail later, or swap: the message says what would
 * fit, plan_advice). */
int plan_recompute_auto(const plan_opts_t *p, int rank, backend_t *be, int64_t device_bytes, plan_t *pl,
                        int64_t *budget);

/* "none", "norms", "block" (model_recompute_t), "auto" (PLAN_RECOMPUTE_AUTO). */
const char *plan_recompute_name(int level);

/* Where no recompute level of p's plan fits device_bytes: what would, each change alone,
 * planned by the same dry run with the least recompute that fits (rank 0 and the last
 * rank): another precision; the largest smaller micro-batch; the fewest more ranks (up to
 * PLAN_MAX_RANKS) with strategy full. Writes one line for a message into out, e.g.
 * "what would fit: --precision bf16-true (--recompute none, 62.98 GB); 2 ranks with
 * --strategy full (--recompute none, 69.18 GB a rank); no --micro-batch below 4 (at 1:
 * 108.23 GB)". A change whose plan fails (a configuration it makes invalid) is left out. */
void plan_advice(const plan_opts_t *p, int64_t device_bytes, char *out, size_t n);

/* The bytes of the device a backend could still take: its mem_avail (backend.h) plus
 * what it holds already (its creation-time workspaces, and on cuda the context: both
 * counted in a plan's total).
 * -1 with ftk_err_msg() set where the backend cannot tell. */
int64_t plan_device_bytes(backend_t *be);

#endif
