/* trainer_state.h — the trainer's state, shared by its two files: engine/trainer.c (inputs,
 * the lifecycle, the step, evaluation) and engine/trainer_ckpt.c (save, asynchronous save,
 * resume), with the agreement helpers both use. Calls between the two run one way: the
 * step polls the background save (trainer_join_write, trainer_save_poll below); the
 * checkpoint file calls nothing of trainer.c. Callers use trainer.h; nothing outside these
 * two files includes this.
 */
#ifndef FTK_TRAINER_STATE_H
#define FTK_TRAINER_STATE_H
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../formats/tokens.h"
#include "../formats/tokens_set.h"
#include "../libcommon/log.h"
#include "bgsave.h"
#include "snapshot.h"
#include "trainer.h"

/* The data set is read a global batch at a time (formats/tokens_set.h has the reader's
 * memory bound); step and eval hold this rank's rows of the current step or pass. */
typedef struct {
    tokens_set_t *set;
    tokens_split_t step, eval;
    /* FTK_STEP's prefetch: the next step's rows, read while the device ran this step's work;
     * valid for the data position (epoch, rows consumed) it was read for */
    tokens_split_t next;
    int next_ok;
    int64_t next_epoch, next_at;
    int64_t max_len, vocab, rows[2], mask_prompt, packed;
    char set_xxh3[32];
} data_t;

/* What each writing rank tells rank 0 about its shard file. */
typedef struct {
    uint64_t bytes, xxh3;
    int64_t code;
    double write_s;
} shard_report_t;

/* The asynchronous checkpoint in flight (every rank agrees on active). */
typedef struct {
    int active;
    ckpt_writer_t w;     /* rank 0: its hidden directory */
    ckpt_meta_t meta;    /* the snapshot's step, data position, options */
    double stall_s;      /* seconds the loop was blocked for it so far */
    int joined;          /* this rank's write is joined: its report is in me */
    shard_report_t me;
    int commit_code;     /* rank 0: a commit at a step boundary failed (reported at the next) */
    char commit_why[2048];
} pending_t;

struct trainer {
    comm_t *world;
    int rank, nranks;
    backend_t *be;
    trainer_opts_t o;
    char why[2048]; /* this rank's failure, then the job's (agree) */
    hid_t wf;
    int lock_fd; /* the run directory's lock (rank 0), -1 when none */
    int made_dir;  /* rank 0 created the run directory (a failure before any checkpoint removes it) */
    int made_parents; /* and this many directories above it (removed with it) */
    int committed; /* a checkpoint of this process is in it under its final name */
    data_t data;
    model_config_t cfg;
    ckpt_meta_t meta;
    int64_t R, per_epoch;
    shard_t *sh;
    optim_t *opt;
    model_t *m;
    int64_t *perm, *rows;
    unsigned step_opts; /* FTK_STEP (build.h build_step_opts) */
    batch_t b;
    /* loss_mean "micro" (loader.h): per micro-batch of the global batch, the counts summed
     * over the ranks (3 + its targets each, as trainer_step's counts) and the weights */
    double *micro_n;
    float *micro_w;
    /* --async-save (bgsave.h): every rank's mode (the HDF5 library allows it); the writing
     * ranks' snapshot; the checkpoint in flight; the commits not yet reported */
    int async;
    bgsave_t *bg;
    pending_t pend;
    trainer_ckpt_t reports[8];
    int n_reports;
    char extended[512]; /* what an --extend resume changed (trainer_extended) */
    snapshot_t *snap;   /* memory snapshots (NULL: none) */
    snapshot_cost_t snap_poll; /* what the last commit inside a step cost (trainer_snapshot adds it) */
    char run_id[17];    /* RUN/.run-id (rank 0 reads it, every rank gets it) */
};

/* ---- every rank agrees ------------------------------------------------------------------- */

/* Records this rank's failure for agree(); returns code. */
static inline int fail(trainer_t *t, int code, const char *fmt, ...) FTK_PRINTF(3, 4);
static inline int fail(trainer_t *t, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->why, sizeof t->why, fmt, ap);
    va_end(ap);
    return code;
}

/* Every rank calls it with its status; returns the highest code of all ranks, with the
 * lowest failing rank's message in ftk_err_msg() everywhere. after_peer: this rank's failure
 * may only follow another rank's (comm_status -2), whose message is then preferred. */
static inline int agree_first(trainer_t *t, int code, int after_peer)
{
    int who;
    if (!(code = comm_agree_first(t->world, code, after_peer, t->why, sizeof t->why, &who)))
        return 0;
    char pre[32];
    snprintf(pre, sizeof pre, "rank %d: ", who);
    if (t->nranks > 1 && who != 0 && !strstr(t->why, pre)) /* NCCL's messages name their rank */
        ftk_err_set("%s%s", pre, t->why);
    else
        ftk_err_set("%s", t->why);
    return code;
}
static inline int agree(trainer_t *t, int code) { return agree_first(t, code, 0); }

/* ---- between the two files ------------------------------------------------------------------ */

/* trainer_ckpt.c's, which the step uses. The background write in flight, joined on this
 * rank: its report (a write that has ended: does not block). */
shard_report_t trainer_join_write(trainer_t *t);
/* At a step boundary, after the step's all-reduce: running is the number of ranks whose
 * write is still under way, failed whether one failed (or a commit did); commits the
 * checkpoint every rank has written, or fails agreed. */
int trainer_save_poll(trainer_t *t, int running, int failed);
/* Inside the step, after its passes: commits the memory snapshot started at the step boundary
 * before (snapshot_poll); a failure is said and ends the snapshots (agreed). */
void trainer_snapshot_poll(trainer_t *t);

#endif
