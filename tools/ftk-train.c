/* ftk-train — full-parameter finetuning, one process or many (mpirun/srun): the loop
 * around engine/ (model, sharding strategies, data order, schedule) and
 * formats/checkpoint (sharded save, resume).
 *
 * Every rank runs this same program. Whatever can fail on some ranks only (an input, a
 * checkpoint shard, a write) is settled by agree(): all ranks learn the highest exit code
 * and one message (the lowest failing rank's), which rank 0 prints; no rank is left
 * waiting in a collective. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/comm.h"
#include "../engine/model.h"
#include "../engine/shard.h"
#include "../engine/train.h"
#include "../formats/checkpoint.h"
#include "../formats/h5.h"
#include "../formats/tokens.h"
#include "../formats/weights.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/timer.h"

static const char *model_path, *data_path, *out_dir, *resume = "none", *schedule = "cosine", *device = "cpu";
static const char *strategy_arg = "full";
static int64_t steps, epochs = 1, global_batch = 64, micro_batch = 4, warmup = 25, seed = 1337;
static int64_t save_every, keep, eval_every = 25, eval_rows = 400, stop_after;
static double lr = 2e-4, min_lr = 6e-5, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0;
static double save_minutes;
static int decay_norms, recompute, threads, group_size;

static const opt_t options[] = {
    {"model", 'm', OPT_STR, &model_path, "FILE.h5", "initial weights (ftk-import-hf, ftk-init) (required)"},
    {"data", 'd', OPT_STR, &data_path, "FILE.h5", "token data from ftk-pack (required)"},
    {"out", 'o', OPT_STR, &out_dir, "DIR", "run directory: checkpoints, latest, metrics.jsonl (required)"},
    {"steps", 0, OPT_I64, &steps, "N", "optimizer steps (0: --epochs worth)"},
    {"epochs", 0, OPT_I64, &epochs, "E", "passes over the training rows when --steps is 0"},
    {"global-batch", 0, OPT_I64, &global_batch, "G", "rows per optimizer step, over all ranks"},
    {"micro-batch", 0, OPT_I64, &micro_batch, "B", "rows per forward/backward pass on a rank (gradients accumulate)"},
    {"lr", 0, OPT_DOUBLE, &lr, "LR", "peak learning rate"},
    {"min-lr", 0, OPT_DOUBLE, &min_lr, "LR", "learning rate at the end of the decay"},
    {"warmup", 0, OPT_I64, &warmup, "N", "linear warmup steps"},
    {"schedule", 0, OPT_STR, &schedule, "cosine|linear|constant", "decay after the warmup"},
    {"beta1", 0, OPT_DOUBLE, &beta1, "B1", "AdamW beta1"},
    {"beta2", 0, OPT_DOUBLE, &beta2, "B2", "AdamW beta2"},
    {"eps", 0, OPT_DOUBLE, &eps, "EPS", "AdamW epsilon"},
    {"weight-decay", 0, OPT_DOUBLE, &weight_decay, "WD", "decoupled weight decay"},
    {"decay-norms", 0, OPT_FLAG, &decay_norms, NULL, "also decay the RMSNorm gains (not by default)"},
    {"clip", 0, OPT_DOUBLE, &clip, "NORM", "clip gradients to this global L2 norm (0: off)"},
    {"seed", 0, OPT_I64, &seed, "S", "seed of the data order"},
    {"strategy", 0, OPT_STR, &strategy_arg, "full|grad-op|none|hybrid", "how ranks share the model (FSDP names)"},
    {"shard-group-size", 0, OPT_INT, &group_size, "N", "hybrid: ranks per shard group (0: the ranks of a node)"},
    {"save-every", 0, OPT_I64, &save_every, "K", "checkpoint every K steps (0: only at the end)"},
    {"save-every-minutes", 0, OPT_DOUBLE, &save_minutes, "M", "also checkpoint when M minutes passed since the last"},
    {"keep", 0, OPT_I64, &keep, "N", "keep the newest N checkpoints (0: all)"},
    {"eval-every", 0, OPT_I64, &eval_every, "K", "validation loss every K steps and at the end (0: never)"},
    {"eval-rows", 0, OPT_I64, &eval_rows, "N", "validation rows per evaluation (0: the whole split)"},
    {"recompute", 0, OPT_FLAG, &recompute, NULL, "recompute each block's activations in the backward pass"},
    {"resume", 0, OPT_STR, &resume, "none|auto|DIR", "auto: continue from the newest intact checkpoint in OUT"},
    {"stop-after", 0, OPT_I64, &stop_after, "N", "stop after N steps of this run: checkpoint, exit 75"},
    {"device", 0, OPT_STR, &device, "cpu|cuda",
     "compute backend: cpu (fp32, OpenMP + BLAS) or cuda (the GPU of this rank's node-local index; one process per "
     "job until the NCCL backend lands)"},
    {"threads", 'j', OPT_INT, &threads, "N", "threads per rank (0: all cores)"},
    {0},
};

static const opt_spec_t spec = {
    .tool = "ftk-train",
    .usage = "--model W.h5 --data D.h5 --out RUN/ [options]      (or: mpirun -np N ftk-train …)",
    .summary =
        "Full-parameter finetuning of a Llama model: AdamW, gradient clipping, warmup + cosine schedule,\n"
        "gradient accumulation to a global batch, sharded data parallelism over MPI ranks. Defaults follow\n"
        "LitGPT's Llama-2-7B full finetune (lr 2e-4, betas 0.9/0.95, weight decay 0.1, warmup 25, min lr\n"
        "6e-5, global batch 64, micro batch 4, one epoch). The loss of a step is the mean over the targets\n"
        "of its global batch, whatever the number of ranks.",
    .epilog =
        "Strategies (engine/shard.h): full = ZeRO-3 (parameters, gradients and AdamW state sharded; units\n"
        "gathered when used), grad-op = ZeRO-2 (parameters gathered once per step), none = DDP (replicated,\n"
        "gradients all-reduced), hybrid = full inside shard groups, replicated across them. Started without\n"
        "mpirun or srun, ftk-train is a world of one.\n"
        "Outputs in RUN/: step-NNNNNNNN/ checkpoints (formats/checkpoint.h; one shard file per rank),\n"
        "`latest`, and metrics.jsonl: one JSON object per step {step, loss, lr, grad_norm, tokens,\n"
        "tokens_seen, tokens_per_s, elapsed_s, epoch, ranks, micro_batches, comm} where comm holds the bytes\n"
        "this rank all-gathered, reduce-scattered and all-reduced in the step and the seconds it waited;\n"
        "and per evaluation {step, val_loss, val_tokens}. A readable line per step goes to stderr.\n"
        "Resuming (--resume auto|DIR) continues bit for bit at the same number of ranks and strategy: the\n"
        "same options must be given again (a difference is refused, naming the option). auto takes the\n"
        "newest checkpoint that verifies, falling back past damaged ones.\n"
        "Signals: SIGTERM or SIGUSR1 (to any rank) finish the current step on every rank, write a\n"
        "checkpoint and exit 75.\n"
        "Exit status: 0 done, 1 runtime failure, 2 bad usage or input, 75 stopped with a checkpoint\n"
        "written (preempted or --stop-after): run the same command with --resume auto.\n",
    .opts = options,
    .min_pos = 0,
    .max_pos = 0,
};

/* ---- every rank agrees ------------------------------------------------------------------- */

static comm_t *world;
static int rank, nranks;
static char why[2048]; /* this rank's failure, then the job's (agree()) */

/* Records this rank's failure for agree(); returns code. */
static int fail(int code, const char *fmt, ...) FTK_PRINTF(2, 3);
static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return code;
}

/* Every rank calls it with its status. Returns the highest code of all ranks; then `why`
 * holds the message of the lowest failing rank everywhere, and with print rank 0 has
 * printed it. */
static int agree(int code, int print)
{
    int64_t v[2] = {code, code ? -(int64_t)rank : INT64_MIN};
    comm_allreduce_i64(world, v, 2, COMM_MAX);
    if (!v[0])
        return 0;
    int who = (int)-v[1];
    comm_bcast(world, why, sizeof why, who);
    why[sizeof why - 1] = 0;
    if (print && rank == 0) {
        if (nranks > 1 && who != 0)
            ftk_error("rank %d: %s", who, why);
        else
            ftk_error("%s", why);
    }
    return (int)v[0];
}

static volatile sig_atomic_t stop_signal;
static void on_stop(int sig) { stop_signal = sig; }

typedef struct {
    hid_t file;
    tokens_split_t train, val;
    int64_t max_len, vocab;
    char set_xxh3[32];
} data_t;

static int open_data(const char *path, data_t *d)
{
    memset(d, 0, sizeof *d);
    d->file = h5_open(path, TOKENS_FORMAT, TOKENS_VERSION, NULL, NULL);
    if (d->file < 0)
        return -1;
    int64_t shards;
    char *set = NULL;
    if (h5_attr_get_i64(d->file, "max_len", &d->max_len) < 0 || h5_attr_get_i64(d->file, "vocab_size", &d->vocab) < 0 ||
        h5_attr_get_i64(d->file, "shard_count", &shards) < 0 || h5_attr_get_str(d->file, "set_xxh3", &set) < 0)
        return -1;
    snprintf(d->set_xxh3, sizeof d->set_xxh3, "%s", set);
    free(set);
    if (shards != 1) {
        ftk_err_set("%s is shard of a set of %lld; train on an unsharded file (ftk-pack without --shards)", path,
                    (long long)shards);
        return -1;
    }
    if (tokens_read_split(d->file, "train", &d->train) < 0 || tokens_read_split(d->file, "val", &d->val) < 0)
        return -1;
    return 0;
}


/* The batch of k rows starting at r0 (of rows[] when given, else of the split itself);
 * k <= 0: an idle pass (batch_add_idle). */
static int make_batch(batch_t *b, const tokens_split_t *s, const int64_t *rows, int64_t r0, int64_t k)
{
    batch_clear(b);
    if (k <= 0)
        return batch_add_idle(b);
    int64_t *v = malloc((size_t)k * sizeof *v);
    if (!v) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int64_t i = 0; i < k; i++)
        v[i] = rows ? rows[r0 + i] : r0 + i;
    int rc = batch_add_rows(b, s, v, k);
    free(v);
    return rc;
}

/* Validation loss over the first eval_rows rows of the val split, spread over the ranks. */
static int evaluate(model_t *m, shard_t *sh, const data_t *d, batch_t *b, double *loss, int64_t *n_tgt)
{
    int64_t rows = eval_rows > 0 && eval_rows < d->val.n_rows ? eval_rows : d->val.n_rows;
    int64_t lo = rows * rank / nranks, hi = rows * (rank + 1) / nranks;
    int64_t per = (rows + nranks - 1) / nranks, passes = (per + micro_batch - 1) / micro_batch;
    double v[3] = {0, 0, 0}; /* loss, targets, errors */
    for (int64_t p = 0; p < passes; p++) {
        int64_t r0 = lo + p * micro_batch, k = hi - r0 < micro_batch ? hi - r0 : micro_batch;
        if (make_batch(b, &d->val, NULL, r0, k) < 0) {
            ftk_error("rank %d: %s", rank, ftk_err_msg());
            v[2] = 1;
            make_batch(b, &d->val, NULL, 0, 0); /* keep the collectives in step */
        }
        shard_pass_begin(sh, 0, 0);
        v[0] += model_step(m, b, 0.0f, NULL);
        shard_pass_end(sh);
        v[1] += (double)b->n_tgt;
    }
    shard_drop(sh);
    comm_allreduce_f64(world, v, 3, COMM_SUM);
    *n_tgt = (int64_t)v[1];
    *loss = v[1] ? v[0] / v[1] : NAN;
    return v[2] ? -1 : 0;
}
/* Keeps the metrics lines of steps <= step (a resumed run rewrites what came after). */
static int trim_metrics(const char *path, int64_t step)
{
    buf_t in = {0}, out = {0};
    if (buf_read_file(&in, path) < 0) {
        buf_free(&in);
        return 0; /* none yet */
    }
    size_t i = 0;
    while (i < in.len) {
        char *nl = memchr(in.data + i, '\n', in.len - i);
        size_t e = nl ? (size_t)(nl - in.data) + 1 : in.len;
        const char *s = strstr(in.data + i, "\"step\": ");
        long long st = s && s < in.data + e ? atoll(s + 8) : 0;
        if (nl && st <= step)
            buf_append(&out, in.data + i, e - i);
        i = e;
    }
    atomic_file_t a;
    int rc = atomic_begin(&a, path);
    if (rc == 0) {
        FILE *f = fopen(a.tmp_path, "wb");
        if (!f || fwrite(out.data ? out.data : "", 1, out.len, f) != out.len || fclose(f) != 0) {
            ftk_err_set("%s: %s", a.tmp_path, strerror(errno));
            atomic_abort(&a);
            rc = -1;
        } else {
            rc = atomic_commit(&a);
        }
    }
    buf_free(&in);
    buf_free(&out);
    return rc;
}

static int same_config(const model_config_t *a, const model_config_t *b)
{
    return a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
           a->num_hidden_layers == b->num_hidden_layers && a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->vocab_size == b->vocab_size &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->rms_norm_eps == b->rms_norm_eps &&
           a->rope_theta == b->rope_theta;
}

/* The options that define the run must be the checkpoint's. */
static int check_resume_options(const ckpt_train_t *c, const ckpt_train_t *t)
{
#define SAME(field, opt)                                                                                             \
    if (c->field != t->field) {                                                                                      \
        ftk_err_set("--%s differs from the checkpoint's (%g there, %g here); resume with the same options", opt,     \
                    (double)c->field, (double)t->field);                                                             \
        return -1;                                                                                                   \
    }
    SAME(lr, "lr")
    SAME(min_lr, "min-lr")
    SAME(warmup, "warmup")
    SAME(total_steps, "steps/--epochs (total steps)")
    SAME(global_batch, "global-batch")
    SAME(micro_batch, "micro-batch")
    SAME(beta1, "beta1")
    SAME(beta2, "beta2")
    SAME(eps, "eps")
    SAME(weight_decay, "weight-decay")
    SAME(decay_norms, "decay-norms")
    SAME(clip, "clip")
    SAME(seed, "seed")
#undef SAME
    if (strcmp(c->schedule, t->schedule)) {
        ftk_err_set("--schedule differs from the checkpoint's (%s there, %s here)", c->schedule, t->schedule);
        return -1;
    }
    return 0;
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

typedef struct {
    uint64_t bytes, xxh3;
    int64_t code;
} shard_report_t;

/* Every rank calls it: rank 0 makes the hidden directory, the writing ranks write their
 * shards into it in parallel, rank 0 commits with every shard's size and checksum.
 * Returns 0 or the agreed exit code (its message printed). */
static int save(shard_t *sh, const ckpt_meta_t *meta, const model_config_t *cfg, hid_t tok_src)
{
    ckpt_writer_t w;
    char dir[4096] = "";
    int code = 0;
    if (rank == 0) {
        if (ckpt_begin(&w, out_dir, meta->step) < 0)
            code = fail(FTK_EXIT_FAIL, "checkpoint at step %lld: %s", (long long)meta->step, ftk_err_msg());
        else
            snprintf(dir, sizeof dir, "%s", w.dir);
    }
    if ((code = agree(code, 1)))
        return code;
    comm_bcast(world, dir, sizeof dir, 0);

    int n_units;
    const ckpt_unit_t *units = shard_units(sh, &n_units);
    shard_report_t me = {0, 0, 0};
    if (shard_writes(sh)) {
        /* One array at a time through one unit-sized buffer: saving never doubles the
         * memory of the state. */
        ckpt_shard_sum_t sum = {0, 0};
        int64_t idx = shard_index(sh), S = meta->shard_count, most = 0;
        for (int u = 0; u < n_units; u++)
            most = units[u].padded / S > most ? units[u].padded / S : most;
        float *buf = malloc((size_t)most * sizeof *buf);
        ckpt_shard_writer_t *sw = buf ? ckpt_shard_create(dir, meta, units, n_units, idx) : NULL;
        int bad = !sw;
        if (!buf)
            ftk_err_set("out of memory");
        for (int k = 0; k < CKPT_KINDS && !bad; k++)
            for (int u = 0; u < n_units && !bad; u++)
                bad = shard_get_slice(sh, k, u, buf) < 0 || ckpt_shard_put(sw, k, u, buf) < 0;
        if (sw && ckpt_shard_finish(sw, idx == 0 ? tok_src : -1, &sum) < 0)
            bad = 1;
        if (bad)
            me.code = fail(FTK_EXIT_FAIL, "checkpoint at step %lld: %s", (long long)meta->step, ftk_err_msg());
        free(buf);
        me.bytes = sum.bytes;
        me.xxh3 = sum.xxh3;
    }
    /* The writers are ranks 0 … S−1 (replica 0); rank 0 collects their reports. */
    shard_report_t *all = rank == 0 ? calloc((size_t)nranks, sizeof *all) : NULL;
    if (rank == 0 && !all)
        abort(); /* a few bytes per rank */
    comm_gather(world, &me, all, sizeof me, 0);
    code = (int)me.code;
    if (rank == 0) {
        ckpt_shard_sum_t *sums = calloc((size_t)meta->shard_count, sizeof *sums);
        for (int64_t i = 0; i < meta->shard_count && sums; i++) {
            sums[i].bytes = all[i].bytes;
            sums[i].xxh3 = all[i].xxh3;
            code = all[i].code > code ? (int)all[i].code : code;
        }
        if (!sums)
            code = fail(FTK_EXIT_FAIL, "out of memory");
        if (code)
            ckpt_abort(&w);
        else if (ckpt_commit(&w, meta, cfg, units, n_units, sums, (int)keep) < 0)
            code = fail(FTK_EXIT_FAIL, "checkpoint at step %lld: %s", (long long)meta->step, ftk_err_msg());
        free(sums);
        free(all);
    }
    return agree(code, 1);
}

/* This rank's part of a checkpoint (every rank calls it): the manifest checked against
 * this run, then its shard read and verified into *st — or, when the checkpoint has
 * another shard count, its new slices read from the old shards. Returns 0,
 * FTK_EXIT_VERIFY (damaged: another checkpoint may do) or FTK_EXIT_USAGE (not this
 * run's), with why set. */
static int read_checkpoint(const char *ck, shard_t *sh, const ckpt_meta_t *meta, const model_config_t *cfg,
                           ckpt_meta_t *cm, ckpt_state_t *st)
{
    ckpt_manifest_t man;
    int code = 0;
    memset(st, 0, sizeof *st);
    memset(cm, 0, sizeof *cm);
    if (ckpt_open(ck, &man) < 0)
        code = fail(FTK_EXIT_VERIFY, "%s", ftk_err_msg());
    else
        *cm = man.meta;
    if ((code = agree(code, 0))) {
        ckpt_manifest_free(&man); /* opened here if another rank failed (ckpt_open clears it on failure) */
        return code;
    }
    if (!same_config(&man.cfg, cfg) || strcmp(cm->init_xxh3, meta->init_xxh3))
        code = fail(FTK_EXIT_USAGE, "%s is a checkpoint of a run started from other weights (%s) than %s", ck,
                    cm->init_file, model_path);
    else if (strcmp(cm->data_set_xxh3, meta->data_set_xxh3) || cm->data_rows != meta->data_rows)
        code = fail(FTK_EXIT_USAGE, "%s was trained on other data (set %s, %lld rows) than %s (set %s, %lld rows)", ck,
                    cm->data_set_xxh3, (long long)cm->data_rows, data_path, meta->data_set_xxh3,
                    (long long)meta->data_rows);
    else if (check_resume_options(&cm->train, &meta->train) < 0)
        code = fail(FTK_EXIT_USAGE, "%s", ftk_err_msg());
    else if (strcmp(cm->precision, meta->precision))
        code = fail(FTK_EXIT_USAGE, "%s is of precision %s, this run is %s (ftk-reshard --precision converts it)", ck,
                    cm->precision, meta->precision);
    else if (cm->shard_count == meta->shard_count) {
        if (ckpt_read_shard(ck, &man, shard_index(sh), 0, st) < 0)
            code = fail(FTK_EXIT_VERIFY, "%s", ftk_err_msg());
    } else {
        /* Reshard on load: every old shard file is checksummed by one rank (round robin),
         * then each rank reads only the element ranges overlapping its new slices. */
        for (int64_t i = rank; i < cm->shard_count && !code; i += nranks) {
            hid_t f = ckpt_shard_open(ck, &man, i, 1);
            if (f < 0)
                code = fail(FTK_EXIT_VERIFY, "%s", ftk_err_msg());
            else
                h5_close(f);
        }
        code = agree(code, 0);
        if (!code && ckpt_read_resliced(ck, &man, meta->shard_count, shard_index(sh), 0, st) < 0)
            code = fail(FTK_EXIT_VERIFY, "%s", ftk_err_msg());
        if (!code && rank == 0)
            ftk_info("%s: %lld shards (%lld ranks, strategy %s) resliced on load into %lld (%d ranks, strategy %s)",
                     ck, (long long)cm->shard_count, (long long)cm->world_size, cm->strategy,
                     (long long)meta->shard_count, nranks, meta->strategy);
    }
    ckpt_manifest_free(&man);
    return code;
}

/* --resume: settles on one checkpoint for every rank and loads it (0, or an exit code
 * with its message printed); *found = 0 when there is none to resume from. */
static int resume_run(shard_t *sh, ckpt_meta_t *meta, const model_config_t *cfg, int *found)
{
    char **cand = NULL;
    size_t n_cand = 0;
    int code = 0, damaged = 0, is_auto = !strcmp(resume, "auto");
    *found = 0;
    if (rank == 0) {
        if (is_auto) {
            cand = ckpt_list(out_dir, &n_cand);
        } else {
            char *c = ckpt_resolve(resume);
            if (!c)
                code = fail(FTK_EXIT_USAGE, "--resume: %s", ftk_err_msg());
            else if (!(cand = malloc(sizeof *cand))) {
                free(c);
                code = fail(FTK_EXIT_FAIL, "out of memory");
            } else
                cand[n_cand++] = c;
        }
    }
    if ((code = agree(code, 1)))
        return code;
    int64_t n = (int64_t)n_cand;
    comm_allreduce_i64(world, &n, 1, COMM_MAX);
    for (int64_t i = 0; i < n; i++) {
        char ck[4096] = "";
        if (rank == 0)
            snprintf(ck, sizeof ck, "%s", cand[i]);
        comm_bcast(world, ck, sizeof ck, 0);
        ckpt_meta_t cm;
        ckpt_state_t st;
        code = agree(read_checkpoint(ck, sh, meta, cfg, &cm, &st), 0);
        if (code == FTK_EXIT_VERIFY && is_auto) {
            if (rank == 0)
                ftk_warn("%s is damaged (%s)%s", ck, why, i + 1 < n ? "; trying the one before" : "");
            ckpt_state_free(&st, cfg->num_hidden_layers + 2);
            code = 0;
            damaged++;
            continue;
        }
        if (code) {
            if (rank == 0)
                ftk_error("cannot resume: %s", why);
            code = FTK_EXIT_USAGE;
            ckpt_state_free(&st, cfg->num_hidden_layers + 2);
            break;
        }
        shard_set_state(sh, &st);
        ckpt_state_free(&st, cfg->num_hidden_layers + 2);
        meta->step = cm.step;
        meta->tokens_seen = cm.tokens_seen;
        meta->epoch = cm.epoch;
        meta->rows_consumed = cm.rows_consumed;
        *found = 1;
        if (rank == 0)
            ftk_info("resuming from %s (step %lld of %lld)", ck, (long long)cm.step,
                     (long long)meta->train.total_steps);
        break;
    }
    if (!code && !*found && damaged) {
        if (rank == 0)
            ftk_error("cannot resume: no checkpoint in %s verifies (every one is damaged; see above)", out_dir);
        code = FTK_EXIT_USAGE;
    }
    for (size_t i = 0; i < n_cand; i++)
        free(cand[i]);
    free(cand);
    return code;
}

/* ---- start-up ------------------------------------------------------------------------------ */

/* opts_parse() with only rank 0's --help and messages shown. */
static int parse_args(int argc, char **argv)
{
    int saved_out = -1, saved_err = -1;
    if (rank != 0) {
        fflush(stdout);
        fflush(stderr);
        int nul = open("/dev/null", O_WRONLY);
        saved_out = dup(1);
        saved_err = dup(2);
        if (nul >= 0) {
            dup2(nul, 1);
            dup2(nul, 2);
            close(nul);
        }
    }
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rank != 0) {
        fflush(stdout);
        fflush(stderr);
        if (saved_out >= 0)
            dup2(saved_out, 1), close(saved_out);
        if (saved_err >= 0)
            dup2(saved_err, 2), close(saved_err);
    }
    return rc;
}

/* Every rank must have been given the same arguments: compares a hash of argv. */
static int same_args(int argc, char **argv)
{
    buf_t b = {0};
    for (int i = 1; i < argc; i++)
        if (buf_append(&b, argv[i], strlen(argv[i]) + 1) < 0)
            abort(); /* a few hundred bytes */
    int64_t h = (int64_t)(hash_bytes(b.data ? b.data : "", b.len) >> 1), v[2] = {h, -h};
    buf_free(&b);
    comm_allreduce_i64(world, v, 2, COMM_MAX);
    return v[0] == -v[1];
}

static int check_values(strategy_t *strat)
{
    if (!model_path || !data_path || !out_dir)
        return fail(FTK_EXIT_USAGE, "--model, --data and --out are required (see --help)");
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        return fail(FTK_EXIT_USAGE, "--device %s: need cpu or cuda", device);
    if (!strcmp(device, "cuda") && nranks > 1)
        return fail(FTK_EXIT_USAGE,
                    "--device cuda on %d ranks: GPU ranks need the NCCL communication backend, which this build does "
                    "not have yet; run one process, or --device cpu",
                    nranks);
    if (steps < 0 || epochs < 1 || global_batch < 1 || micro_batch < 1 || warmup < 0 || !(lr > 0) ||
        !(min_lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0) ||
        !(weight_decay >= 0) || !(clip >= 0) || save_every < 0 || keep < 0 || eval_every < 0 || eval_rows < 0 ||
        stop_after < 0 || threads < 0 || group_size < 0 || !(save_minutes >= 0))
        return fail(FTK_EXIT_USAGE, "invalid option value: need --global-batch, --micro-batch >= 1, --lr > 0, betas "
                                    "in [0, 1), --eps > 0, and the counts >= 0 (see --help)");
    if (strcmp(schedule, "cosine") && strcmp(schedule, "linear") && strcmp(schedule, "constant"))
        return fail(FTK_EXIT_USAGE, "--schedule %s: need cosine, linear or constant", schedule);
    if (strategy_parse(strategy_arg, strat) < 0)
        return fail(FTK_EXIT_USAGE, "--strategy %s: need full, grad-op, none or hybrid", strategy_arg);
    if (group_size && *strat != STRAT_HYBRID)
        return fail(FTK_EXIT_USAGE, "--shard-group-size is for --strategy hybrid");
    return 0;
}

/* Rank 0: the run directory exists, holds no run unless resuming, and has no leftovers
 * of checkpoints whose writers died. */
static int prepare_out_dir(void)
{
    if (mkdir(out_dir, 0777) < 0 && errno != EEXIST)
        return fail(FTK_EXIT_FAIL, "%s: %s", out_dir, strerror(errno));
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", out_dir);
    struct stat sb;
    if (!strcmp(resume, "none") && stat(latest, &sb) == 0)
        return fail(FTK_EXIT_USAGE,
                    "%s already holds a run (%s exists): pass --resume auto to continue it, or choose another --out",
                    out_dir, latest);
    int n = ckpt_remove_stale(out_dir);
    if (n > 0)
        ftk_info("removed %d unfinished checkpoint director%s left in %s by a run that died", n, n == 1 ? "y" : "ies",
                 out_dir);
    return 0;
}

/* ---- the run --------------------------------------------------------------------------------- */

#define CHECK(expr)                                                                                                  \
    do {                                                                                                             \
        if ((exit_code = agree((expr), 1)))                                                                          \
            goto out;                                                                                                \
    } while (0)

static int run(int argc, char **argv)
{
    int exit_code = FTK_EXIT_OK, prc = parse_args(argc, argv);
    if (!same_args(argc, argv)) {
        if (rank == 0)
            ftk_error("the %d ranks were started with different arguments; give every rank the same command line",
                      nranks);
        return FTK_EXIT_USAGE;
    }
    if (prc)
        return prc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    if (rank != 0)
        ftk_quiet = 1; /* progress and notes from rank 0 only */
    strategy_t strat = STRAT_FULL;
    if ((exit_code = agree(check_values(&strat), 1)))
        return exit_code;
    if (threads > 0)
        omp_set_num_threads(threads);
    if (h5_init() < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }

    hid_t wf = -1;
    data_t data = {.file = -1};
    model_t *m = NULL;
    shard_t *sh = NULL;
    FILE *mf = NULL;
    int64_t *perm = NULL, *rows = NULL;
    batch_t b = {0};
    model_config_t cfg;
    ckpt_meta_t meta = {0};
    ckpt_train_t tc = {0};
    int64_t R = 0, per_epoch = 0;

    /* Inputs, on every rank. */
    int code = 0;
    if ((wf = weights_open(model_path, &cfg)) < 0)
        code = fail(FTK_EXIT_USAGE, "%s", ftk_err_msg());
    else if (open_data(data_path, &data) < 0)
        code = fail(FTK_EXIT_USAGE, "%s: %s", data_path, ftk_err_msg());
    else if (data.vocab > cfg.vocab_size)
        code = fail(FTK_EXIT_USAGE, "%s: token ids up to %lld, but the model's vocabulary has %lld entries",
                    data_path, (long long)data.vocab, (long long)cfg.vocab_size);
    else if (data.train.n_rows == 0)
        code = fail(FTK_EXIT_USAGE, "%s: no training rows", data_path);
    else if (ckpt_init_hash(wf, &cfg, meta.init_xxh3) < 0)
        code = fail(FTK_EXIT_USAGE, "%s: %s", model_path, ftk_err_msg());
    CHECK(code);
    R = data.train.n_rows;
    per_epoch = (R + global_batch - 1) / global_batch;
    tc = (ckpt_train_t){.lr = lr, .min_lr = min_lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                        .weight_decay = weight_decay, .clip = clip, .warmup = warmup,
                        .total_steps = steps ? steps : epochs * per_epoch, .global_batch = global_batch,
                        .micro_batch = micro_batch, .seed = seed, .decay_norms = decay_norms};
    snprintf(tc.schedule, sizeof tc.schedule, "%s", schedule);
    snprintf(meta.data_file, sizeof meta.data_file, "%s", data_path);
    snprintf(meta.data_set_xxh3, sizeof meta.data_set_xxh3, "%s", data.set_xxh3);
    snprintf(meta.init_file, sizeof meta.init_file, "%s", model_path);
    snprintf(meta.strategy, sizeof meta.strategy, "%s", strategy_name(strat));
    snprintf(meta.precision, sizeof meta.precision, "fp32");
    meta.data_rows = R;
    meta.train = tc;
    meta.world_size = nranks;

    /* The backend before anything is written: a missing GPU leaves no run directory. */
    const backend_t *be = backend_cpu();
    if (!strcmp(device, "cuda")) {
        int local = 0, n_local = 1, n_dev = backend_cuda_devices();
        comm_node_rank(world, &local, &n_local);
        /* one GPU per rank: the node-local rank's, or the only one a launcher left visible */
        be = backend_cuda(n_dev == 1 ? 0 : local);
        CHECK(be ? 0 : fail(FTK_EXIT_USAGE, "--device cuda: %s", ftk_err_msg()));
    }

    CHECK(rank == 0 ? prepare_out_dir() : 0);

    /* The shards and the model over them. */
    sh = shard_new(be, world, strat, group_size, &cfg);
    CHECK(sh ? 0 : fail(FTK_EXIT_USAGE, "%s", ftk_err_msg()));
    meta.shard_count = shard_count(sh);
    int n_units;
    const ckpt_unit_t *units = shard_units(sh, &n_units);
    m = model_new_io(be, &cfg, micro_batch * data.max_len, recompute, units, n_units, shard_io(sh));
    CHECK(m ? 0 : fail(FTK_EXIT_FAIL, "%s", ftk_err_msg()));

    int found = 0;
    if (strcmp(resume, "none") && (exit_code = resume_run(sh, &meta, &cfg, &found)))
        goto out;
    if (!found)
        CHECK(shard_load_weights(sh, wf) < 0 ? fail(FTK_EXIT_USAGE, "%s: %s", model_path, ftk_err_msg()) : 0);

    char metrics_path[4096];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", out_dir);
    code = 0;
    if (rank == 0) {
        if (trim_metrics(metrics_path, meta.step) < 0)
            code = fail(FTK_EXIT_FAIL, "%s", ftk_err_msg());
        else if (!(mf = fopen(metrics_path, "a")))
            code = fail(FTK_EXIT_FAIL, "%s: %s", metrics_path, strerror(errno));
    }
    perm = malloc((size_t)R * sizeof *perm);
    rows = malloc((size_t)global_batch * sizeof *rows);
    if (!code && (!perm || !rows))
        code = fail(FTK_EXIT_FAIL, "out of memory");
    CHECK(code);
    if (meta.step == 0)
        ftk_info("%lld parameters, %lld training rows (%lld steps of %lld rows per epoch), %lld steps on %d rank%s "
                 "(strategy %s, %lld shards)",
                 (long long)model_n_params(&cfg), (long long)R, (long long)per_epoch, (long long)global_batch,
                 (long long)tc.total_steps, nranks, nranks == 1 ? "" : "s", meta.strategy, (long long)meta.shard_count);
    train_order((uint64_t)seed, meta.epoch, R, perm);
    if (meta.step >= tc.total_steps)
        ftk_info("%s: the run is complete (step %lld of %lld); nothing to do", out_dir, (long long)meta.step,
                 (long long)tc.total_steps);
    if (meta.step == 0 && eval_every > 0 && data.val.n_rows > 0) { /* where the run starts from */
        int64_t vt;
        double vl;
        CHECK(evaluate(m, sh, &data, &b, &vl, &vt) < 0 ? fail(FTK_EXIT_FAIL, "validation failed (see above)") : 0);
        if (mf)
            fprintf(mf, "{\"step\": 0, \"val_loss\": %.17g, \"val_tokens\": %lld}\n", vl, (long long)vt);
        ftk_info("step 0: validation loss %.4f (%lld targets)", vl, (long long)vt);
    }
    double t0 = time_now(), last_save = t0;
    int64_t run_steps = 0;
    comm_stats_t *stats = shard_stats(sh);
    while (meta.step < tc.total_steps) {
        double ts = time_now();
        comm_stats_t before = *stats;
        /* The next global batch of the data order; this rank's slice of it. */
        if (meta.rows_consumed >= R) {
            meta.epoch++;
            meta.rows_consumed = 0;
            train_order((uint64_t)seed, meta.epoch, R, perm);
        }
        int64_t k = R - meta.rows_consumed < global_batch ? R - meta.rows_consumed : global_batch;
        memcpy(rows, perm + meta.rows_consumed, (size_t)k * sizeof *rows);
        int64_t n_tgt = 0, tokens = 0;
        for (int64_t i = 0; i < k; i++) {
            n_tgt += train_row_targets(&data.train, rows[i]);
            for (int64_t j = data.train.row_samples[rows[i]]; j < data.train.row_samples[rows[i] + 1]; j++)
                tokens += data.train.sample_lengths[j];
        }
        float scale = 1.0f / (float)(n_tgt > 0 ? n_tgt : 1);
        int64_t lo = k * rank / nranks, hi = k * (rank + 1) / nranks;
        int64_t per = (k + nranks - 1) / nranks, passes = (per + micro_batch - 1) / micro_batch;
        /* loss, stop requested, checkpoint due by the clock, a rank failed */
        double v[4] = {0, stop_signal ? 1 : 0, 0, 0};
        for (int64_t p = 0; p < passes; p++) {
            int64_t r0 = lo + p * micro_batch, kk = hi - r0 < micro_batch ? hi - r0 : micro_batch;
            if (make_batch(&b, &data.train, rows, r0, kk) < 0) {
                ftk_error("rank %d: %s", rank, ftk_err_msg());
                v[3] = 1;
                make_batch(&b, &data.train, rows, 0, 0); /* keep the collectives in step */
            }
            shard_pass_begin(sh, 1, p + 1 == passes);
            v[0] += model_step(m, &b, scale, NULL);
            shard_pass_end(sh);
        }
        v[1] = v[1] || stop_signal;
        v[2] = rank == 0 && save_minutes > 0 && time_now() - last_save >= 60 * save_minutes;
        comm_allreduce_f64(world, v, 4, COMM_SUM);
        if (v[3]) {
            exit_code = FTK_EXIT_FAIL;
            goto out;
        }
        double loss = v[0] / (double)(n_tgt > 0 ? n_tgt : 1);
        int64_t step = meta.step + 1;
        double cur_lr = train_lr(&tc, step);
        double gnorm = shard_step(sh, &tc, step, cur_lr);
        /* A device keeps its first error: stop before a checkpoint could take NaN from it.
         * (The CPU backend cannot fail here; its runs skip the extra agreement.) */
        if (be != backend_cpu())
            CHECK(be->sync() < 0 ? fail(FTK_EXIT_FAIL, "rank %d, step %lld: %s", rank, (long long)step, ftk_err_msg())
                                 : 0);
        meta.step = step;
        meta.rows_consumed += k;
        meta.tokens_seen += tokens;
        run_steps++;
        double now = time_now();
        if (mf) {
            fprintf(mf,
                    "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, \"tokens\": %lld, "
                    "\"tokens_seen\": %lld, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"epoch\": %lld, "
                    "\"ranks\": %d, \"micro_batches\": %lld, \"comm\": {\"allgather_bytes\": %.17g, "
                    "\"reduce_scatter_bytes\": %.17g, \"allreduce_bytes\": %.17g, \"wait_s\": %.4f}}\n",
                    (long long)step, loss, cur_lr, gnorm, (long long)tokens, (long long)meta.tokens_seen,
                    tokens / (now - ts), now - t0, (long long)meta.epoch, nranks, (long long)passes,
                    stats->ag_bytes - before.ag_bytes, stats->rs_bytes - before.rs_bytes,
                    stats->ar_bytes - before.ar_bytes, stats->wait_s - before.wait_s);
            fflush(mf);
        }
        if (!ftk_quiet)
            fprintf(stderr,
                    "ftk-train: step %lld/%lld  loss %.4f  lr %.3g  grad norm %.3g  %.0f tok/s  comm wait %.2f s  "
                    "%.1f s\n",
                    (long long)step, (long long)tc.total_steps, loss, cur_lr, gnorm, tokens / (now - ts),
                    stats->wait_s - before.wait_s, now - t0);
        if (!isfinite(loss)) {
            if (rank == 0)
                ftk_error("step %lld: the loss is %g; stopping without a checkpoint", (long long)step, loss);
            exit_code = FTK_EXIT_FAIL;
            goto out;
        }
        int last = meta.step == tc.total_steps;
        if (eval_every > 0 && data.val.n_rows > 0 && (step % eval_every == 0 || last)) {
            int64_t vt;
            double vl;
            CHECK(evaluate(m, sh, &data, &b, &vl, &vt) < 0 ? fail(FTK_EXIT_FAIL, "validation failed (see above)")
                                                            : 0);
            if (mf) {
                fprintf(mf, "{\"step\": %lld, \"val_loss\": %.17g, \"val_tokens\": %lld}\n", (long long)step, vl,
                        (long long)vt);
                fflush(mf);
            }
            ftk_info("step %lld: validation loss %.4f (%lld targets)", (long long)step, vl, (long long)vt);
        }
        int stopping = v[1] > 0 || (stop_after > 0 && run_steps >= stop_after && !last);
        if (last || stopping || v[2] > 0 || (save_every > 0 && step % save_every == 0)) {
            if ((exit_code = save(sh, &meta, &cfg, wf)))
                goto out;
            last_save = time_now();
            ftk_info("checkpoint %s/step-%08lld written", out_dir, (long long)step);
        }
        if (stopping && !last) {
            ftk_info("%s at step %lld; continue with --resume auto", v[1] > 0 ? "stopped by a signal" : "stopped",
                     (long long)step);
            exit_code = FTK_EXIT_PREEMPTED;
            break;
        }
    }
out:
    if (mf)
        fclose(mf);
    batch_free(&b);
    free(perm);
    free(rows);
    model_free(m);
    shard_free(sh);
    tokens_split_free(&data.train);
    tokens_split_free(&data.val);
    if (data.file >= 0)
        h5_close(data.file);
    if (wf >= 0)
        h5_close(wf);
    return exit_code;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-train");
    /* First, so that a preemption signal during start-up is a request to stop, not death. */
    atomic_install_signal_cleanup();
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    world = comm_init(&argc, &argv);
    if (!world) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    rank = comm_rank(world);
    nranks = comm_size(world);
    int rc = run(argc, argv);
    comm_finalize(world);
    return rc;
}
