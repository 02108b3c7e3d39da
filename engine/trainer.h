/* trainer.h — the training job: inputs, the sharded model, the step, evaluation, and the
 * checkpoint save and resume protocol (docs/design.md "Checkpoints"). ftk-train is options,
 * signals and metrics output around it. The job's allocations are build.h's, which the
 * memory plan (plan.h) makes too; --recompute auto is the plan's choice.
 *
 * Every rank calls every function here, in the same order. Whatever can fail on some
 * ranks only (an input, a checkpoint shard, a write) is settled by comm_agree(): every
 * rank returns the same exit code, and ftk_err_msg() holds the lowest failing rank's
 * message on every rank ("rank N: …" when that is not rank 0 of several). No rank is
 * left waiting in a collective. Exit codes are libcommon/log.h's FTK_EXIT_*: 0, FTK_EXIT_FAIL
 * (a runtime failure), FTK_EXIT_USAGE (bad input or options), FTK_EXIT_VERIFY (used inside
 * resume for a damaged checkpoint).
 *
 * Rank 0 reports progress and decisions (resuming from, damaged checkpoint skipped,
 * leftovers removed) with ftk_info/ftk_warn; a tool silences the other ranks (ftk_quiet).
 *
 * The save protocol: rank 0 makes the hidden checkpoint directory (ckpt_begin), every
 * writing rank writes and fsyncs its shard file there one array at a time, rank 0 gathers
 * every shard's size and checksum and commits (manifest, rename, latest, --keep) — or
 * removes the directory if any rank failed.
 *
 * Asynchronous save (trainer_save_async, --async-save): each writing rank copies its state
 * into a host snapshot (bgsave.h; page-locked on a GPU) and a background thread writes,
 * fsyncs and checksums its shard file from it while training goes on. Whether every
 * rank's write has ended is learned at no cost: two more numbers in the all-reduce every
 * step already makes (trainer_step). At the first step boundary where every rank's write
 * has ended and none failed, rank 0 commits — manifest, rename, latest, --keep — as the
 * synchronous save does, and nobody waits for it; a failed commit is reported (agreed) at
 * the next step. A failed write fails the run at that boundary, as a failed synchronous
 * save does; its directory is removed. At most one checkpoint is in flight: the next
 * save (either kind) first waits for it and commits it. trainer_free() waits for a write
 * in flight and removes it uncommitted. Crash safety is the synchronous save's: shard
 * files live in the hidden directory until rank 0 has every rank's report, and `latest`
 * moves only after the rename; a crash (any rank, any instant) leaves the previous
 * checkpoint as `latest` and a hidden directory that the next start removes.
 *
 * Resume: --resume auto walks the committed
 * checkpoints newest first; each must match this run (weights, data, options, precision)
 * and every rank verifies what it reads; a damaged one is reported and the one before is
 * tried, a checkpoint named explicitly is used or refused. A checkpoint of another shard
 * count is resliced on load (each old file checksummed once, spread over the ranks).
 */
#ifndef FTK_TRAINER_H
#define FTK_TRAINER_H
#include <signal.h>
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "build.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "precision.h"
#include "shard.h"
#include "strategy.h"

typedef struct {
    const char *model_path; /* initial weights (weights.h) */
    const char *data_path;  /* packed tokens (tokens.h) */
    const char *out_dir;    /* the run directory */
    const char *resume;     /* "none", "auto", or a checkpoint / run directory */
    ckpt_train_t train;     /* total_steps 0: `epochs` passes over the training rows */
    int64_t epochs;
    strategy_t strategy;
    int group_size;         /* hybrid: ranks per shard group; hpz: per node group (0: the node's) */
    units_policy_t units;   /* the unit of communication (units.h; zero: block) */
    int compress_weights;   /* --compress-weights (compress.h COMPRESS_*) */
    int compress_grads;     /* --compress-grads (compress.h COMPRESS_*) */
    precision_t precision;
    int stochastic;         /* bf16-true: AdamW rounds stochastically (else to nearest even) */
    int recompute;          /* model_recompute_t, or PLAN_RECOMPUTE_AUTO (-1): the least recompute whose
                             * memory plan (plan.h) fits device_bytes, chosen by trainer_new per rank */
    int64_t device_bytes;   /* auto's budget; 0: the backend's free memory (plan_device_bytes) */
    int64_t attn_max_seg;   /* the most segments a micro-batch can hold (trainer_new: from the data,
                             * tokens_set_max_segments); 0: one a row. build_job prepares the
                             * backend's attention for it (backend.h attn_prepare) */
    int64_t eval_rows;      /* validation rows per evaluation (0: the whole split) */
    int64_t keep;           /* checkpoints kept (0: all) */
    int async_save;         /* trainer_save_async() writes in the background (bgsave.h) */
    int extend;             /* a resume may change the steps, epochs, learning rates, warmup and
                               schedule (trainer_extended() says which changed) */
    int allow_other_tokenizer; /* train data packed with a tokenizer the model does not hold */
    int64_t snapshot_every; /* memory snapshots every N steps (engine/snapshot.h; 0: none) */
    const char *memory_dir; /* the node's memory folder for them (--memory-dir) */
} trainer_opts_t;

/* A committed checkpoint, for the metrics. stall_s: seconds rank 0's training loop was
 * blocked for it — the whole save when synchronous; when asynchronous its snapshot, any
 * wait for its write at the next save, and its commit; write_s: the slowest writer's
 * seconds writing its shard file; bytes: every shard file together. */
typedef struct {
    int64_t step;
    int async;
    double stall_s, write_s;
    int64_t bytes;
} trainer_ckpt_t;

/* What one step did (the same on every rank unless said). */
typedef struct {
    int64_t step, total_steps;
    double loss, lr, grad_norm;
    int64_t tokens, tokens_seen, epoch, micro_batches;
    int stop;          /* some rank asked to stop (agreed) */
    int save_due;      /* rank 0's clock asked for a checkpoint (agreed) */
    comm_stats_t comm; /* this rank's communication in the step */
    /* This rank's seconds in the step, by phase: compute (the passes with their
     * micro-batches' assembly, the loss's download, the optimizer step and the backend's
     * sync) and host work (reading and counting the batch, the agreement's bookkeeping,
     * the background save's commit), each less the communication waits inside it;
     * step_s = host_s + compute_s + comm.wait_s, the time from trainer_step's start to its
     * end. comm.overlap_s is the communication hidden under these (comm.h "Accounting"). */
    double step_s, compute_s, host_s;
} trainer_step_t;

typedef struct trainer trainer_t;

/* After trainer_resume() with opts.extend: what the resume changed ("--lr 2e-4 -> 1e-4,
 * --steps 100 -> 200"), or "" when nothing. */
const char *trainer_extended(const trainer_t *t);

/* Opens the inputs, prepares the run directory (rank 0; refuses a directory that holds a
 * run unless resuming, removes leftovers of dead writers) and builds the shards and the
 * model on be (which the trainer uses, not owns). Returns NULL with *code and the message
 * (see above) when any rank failed. */
trainer_t *trainer_new(comm_t *world, backend_t *be, const trainer_opts_t *o, int *code);
void trainer_free(trainer_t *t);
/* After a failure: removes the run directory when this process made it and committed no
 * checkpoint in it (a failed run leaves nothing behind; rank 0 does it, others do nothing).
 * Call it after closing every file of the directory the caller opened (metrics.jsonl).
 * trainer_new() does the same itself when it fails. Returns 1 when it removed the
 * directory (on rank 0), else 0. */
int trainer_discard_new_run(trainer_t *t);

/* attn_max_seg for a run on data: the most segments a micro-batch of micro_batch rows of
 * either split can hold (tokens_set_max_segments); trainer_new's, and --plan's. */
struct tokens_set;
int64_t trainer_attn_max_seg(const struct tokens_set *data, int64_t micro_batch);

/* The options of o that the job's allocations depend on (build.h; the memory plan's
 * plan_opts_t.o). */
build_opts_t trainer_build_opts(const trainer_opts_t *o);

/* Continues the run from a checkpoint as o->resume asks, or starts it from the initial
 * weights (resume "none", or "auto" in a directory without checkpoints). */
int trainer_resume(trainer_t *t);

/* One optimizer step over the next global batch. *stop (a signal handler's flag; may be
 * NULL), read before and after the step's passes: this rank was asked to stop; clock_due:
 * rank 0's clock wants a checkpoint. A non-finite loss is a failure (FTK_EXIT_FAIL;
 * nothing is saved). */
int trainer_step(trainer_t *t, const volatile sig_atomic_t *stop, int clock_due, trainer_step_t *out);

/* Validation loss over the first eval_rows rows of the val split, spread over the ranks:
 * their token mean, or under loss_mean "micro" the mean of the token means of micro-batches
 * of micro_batch rows in the split's order (loader.h). *loss is NaN when the split is empty. */
int trainer_evaluate(trainer_t *t, double *loss, int64_t *n_targets);

/* Writes and commits the checkpoint of the current step (after the one in flight). */
int trainer_save(trainer_t *t);
/* Snapshots the current step's state and starts its background write (see above); with
 * o->async_save off (or an HDF5 that is not thread-safe) it is trainer_save(). */
int trainer_save_async(trainer_t *t);
/* Memory snapshots (engine/snapshot.h), where o.snapshot_every asked for them and the
 * node's memory took them. trainer_snapshot: the snapshot of the current step (agreed; a
 * failure is said and ends the snapshots of this run, never the run: the disk checkpoint
 * is the durable copy); *cost gets what it cost this rank (zero when none was taken).
 * trainer_drop_snapshots: removes them (the run ended, or stopped with a checkpoint of its
 * last step). A resume (--resume auto) reads the newest complete snapshot where it is at
 * least as new as the newest checkpoint on disk. */
struct snapshot_cost;
int trainer_snapshots(const trainer_t *t); /* whether they are taken */
int trainer_snapshot(trainer_t *t, struct snapshot_cost *cost);
void trainer_drop_snapshots(trainer_t *t);
/* The checkpoints committed since the last call, oldest first: at most max into out;
 * returns how many (rank 0's figures; call it after each step and save). */
int trainer_ckpt_reports(trainer_t *t, trainer_ckpt_t *out, int max);

/* Facts of the run. */
const ckpt_meta_t *trainer_meta(const trainer_t *t); /* step, data state, options */
int trainer_done(const trainer_t *t);                 /* the last step is done */
int64_t trainer_steps_per_epoch(const trainer_t *t);
int64_t trainer_rows(const trainer_t *t);             /* training rows */
int64_t trainer_val_rows(const trainer_t *t);
int64_t trainer_n_params(const trainer_t *t);
const bk_mem_t *trainer_memory(const trainer_t *t);   /* this rank's backend accounting */
shard_t *trainer_shard(trainer_t *t);                 /* the shards (layout, groups) */

#endif
