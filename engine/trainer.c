/* trainer.c — the training job (trainer.h): inputs, its building (build.h), the step, evaluation; its
 * checkpoints (save, asynchronous save, resume) are trainer_ckpt.c. */
#include "trainer_state.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/h5.h"
#include "../formats/rundir.h"
#include "../formats/tokens.h"
#include "../formats/tokens_set.h"
#include "../formats/weights.h"
#include "../libcommon/atomic.h"
#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/path.h"
#include "../libcommon/plural.h"
#include "../libcommon/timer.h"
#include "bgsave.h"
#include "loader.h"
#include "plan.h"
#include "schedule.h"

/* ---- inputs ------------------------------------------------------------------------------- */

static int open_data(const char *path, data_t *d)
{
    memset(d, 0, sizeof *d);
    if (!(d->set = tokens_set_open(path)))
        return -1;
    const tokens_set_info_t *in = tokens_set_info(d->set);
    d->max_len = in->max_len;
    d->vocab = in->vocab_size;
    d->rows[TOKENS_TRAIN] = in->rows[TOKENS_TRAIN];
    d->rows[TOKENS_VAL] = in->rows[TOKENS_VAL];
    d->mask_prompt = in->mask_prompt;
    d->packed = in->packed;
    snprintf(d->set_xxh3, sizeof d->set_xxh3, "%s", in->set_xxh3);
    return 0;
}

/* Data packed with another tokenizer than the model's trains without a complaint and
 * teaches the model nonsense: its ids name other pieces. Both files record the tokenizer
 * (tokens.h: tokenizer_xxh3, the encoder file's checksum; weights.h: /tokenizer), so they
 * are compared; a model that holds no tokenizer cannot be checked (rank 0 warns). Returns
 * 0, or FTK_EXIT_USAGE with the message in t->why. */
typedef struct {
    const char *want;
    int match, n;
    char have[256];
} tok_cmp_t;

static int cmp_tok(const char *name, const void *data, size_t len, void *ctx)
{
    tok_cmp_t *c = ctx;
    if (strcmp(name, "tokenizer.model") && strcmp(name, "tokenizer.json") && strcmp(name, "tokenizer.bin"))
        return 0;
    char hex[17];
    hash_hex(hash_bytes(data, len), hex);
    c->match |= !strcmp(hex, c->want);
    size_t k = strlen(c->have);
    snprintf(c->have + k, sizeof c->have - k, "%s%s (xxh3 %s)", c->n++ ? ", " : "", name, hex);
    return 0;
}

static int check_tokenizer(trainer_t *t)
{
    const trainer_opts_t *o = &t->o;
    tok_cmp_t c = {.want = tokens_set_info(t->data.set)->tokenizer_xxh3};
    /* A resumed run was checked at its start; its checkpoint ties it to those weights and
     * that data (init and data checksums, compared on resume with messages of their own). */
    if (!strcmp(o->resume, "auto")) {
        size_t n = 0;
        char **l = ckpt_list(o->out_dir, &n);
        for (size_t i = 0; l && i < n; i++)
            free(l[i]);
        free(l);
        if (n)
            return 0;
    } else if (strcmp(o->resume, "none")) {
        return 0;
    }
    if (weights_each_file(t->wf, cmp_tok, &c) < 0)
        return fail(t, FTK_EXIT_USAGE, "%s: %s", o->model_path, ftk_err_msg());
    if (c.match)
        return 0;
    if (!c.n) {
        if (t->rank == 0)
            ftk_warn("%s holds no tokenizer: cannot check that %s was packed with the model's (its tokenizer: "
                     "xxh3 %s); ftk-import-hf --tokenizer stores one",
                     o->model_path, o->data_path, c.want);
        return 0;
    }
    if (o->allow_other_tokenizer) {
        if (t->rank == 0)
            ftk_warn("%s was packed with the tokenizer of xxh3 %s, not %s's %s: training anyway "
                     "(--allow-other-tokenizer)",
                     o->data_path, c.want, o->model_path, c.have);
        return 0;
    }
    return fail(t, FTK_EXIT_USAGE,
                "%s was packed with another tokenizer than the model's: its tokenizer_xxh3 is %s, %s holds %s; "
                "the token ids would mean other pieces. Pack the data with `ftk-pack -t %s`, or pass "
                "--allow-other-tokenizer if the two tokenizers give the same ids",
                o->data_path, c.want, o->model_path, c.have, o->model_path);
}

/* The set is untrusted even when its checksums hold: an id past the vocabulary or an
 * offset past the tokens would reach the embedding and the batch builder. The row index
 * was checked at open; here the contents, in one streaming pass over the set shared by
 * the ranks (each reads 1/nranks of it); every row is checked again when a step reads it. */
static int check_data(trainer_t *t)
{
    for (int sp = 0; sp < 2; sp++) {
        int64_t R = t->data.rows[sp];
        if (tokens_set_check(t->data.set, sp, R * t->rank / t->nranks, R * (t->rank + 1) / t->nranks))
            return -1;
    }
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

/* loss_mean "micro": make_batch's batch of the split's rows r0 .. r0 + k - 1, which are
 * rows g0 .. g0 + k - 1 of the global batch, each row's targets weighted by its
 * micro-batch's w[g / mb] (loader.h). */
static int make_micro_batch(batch_t *b, const tokens_split_t *s, int64_t r0, int64_t k, int64_t g0, int64_t mb,
                            const float *w)
{
    batch_clear(b);
    if (k <= 0)
        return batch_add_idle(b);
    for (int64_t i = 0; i < k; i++) {
        int64_t row = r0 + i, n0 = b->n_tgt;
        if (batch_add_rows(b, s, &row, 1) < 0)
            return -1;
        for (int64_t j = n0; j < b->n_tgt; j++)
            b->tgt_w[j] = w[(g0 + i) / mb];
    }
    return 0;
}

/* Memory snapshots where asked for: the run's identity (rank 0 reads RUN/.run-id, or draws
 * it), the roles and folders (snapshot_new). A node whose memory cannot take them is said,
 * and the run goes on without (every rank: agreed). */
static void open_snapshots(trainer_t *t)
{
    if (t->o.snapshot_every <= 0)
        return;
    int rc = t->rank == 0 && rundir_run_id(t->o.out_dir, t->run_id, 1) < 0 ? -1 : 0;
    if (agree(t, rc < 0 ? fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg()) : 0)) {
        if (t->rank == 0)
            ftk_warn("memory snapshots off: %s", ftk_err_msg());
        return;
    }
    comm_bcast(t->world, t->run_id, sizeof t->run_id, 0);
    snapshot_where_t where = {t->o.memory_dir, t->o.out_dir, t->run_id};
    t->snap = snapshot_new(t->world, t->be, t->sh, &t->cfg, &where);
    if (agree(t, t->snap ? 0 : fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg()))) {
        if (t->rank == 0)
            ftk_warn("memory snapshots off: %s", ftk_err_msg());
        snapshot_free(t->snap);
        t->snap = NULL;
    }
}

/* Rank 0: the run directory exists, holds no run unless resuming, and has no leftovers
 * of checkpoints whose writers died. */
static int prepare_out_dir(trainer_t *t)
{
    const char *out = t->o.out_dir;
    /* missing parents made, as LitGPT makes its nested out_dir */
    if (mkdir_parents(out, &t->made_parents) < 0)
        return fail(t, FTK_EXIT_FAIL, "--out %s: %s", out, ftk_err_msg());
    if (mkdir(out, 0777) == 0)
        t->made_dir = 1;
    else if (errno != EEXIST) {
        int e = errno;
        rmdir_parents(out, t->made_parents);
        t->made_parents = 0;
        return fail(t, FTK_EXIT_FAIL, "--out %s: %s", out, strerror(e));
    }
    /* one writer per run directory, for the life of the job; only then may temporaries
     * be taken for a dead run's */
    int fd = rundir_claim(out, &t->made_dir);
    if (fd == RUNDIR_BUSY) {
        t->made_parents = 0; /* the other writer's, as the directory is */
        return fail(t, FTK_EXIT_USAGE, "%s", ftk_err_msg());
    }
    if (fd == RUNDIR_NO_LOCKS)
        ftk_warn("%s; going on without the lock: make sure no other ftk-train writes to %s", ftk_err_msg(), out);
    else if (fd == RUNDIR_REFUSED) /* .lock is a link, FIFO, …: bad input, and nothing was written through it */
        return fail(t, FTK_EXIT_USAGE, "%s", ftk_err_msg());
    else if (fd < 0)
        return fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg());
    t->lock_fd = fd;
    /* Our mkdir made it, but another writer started at the same moment may have locked it
     * first and run to its end meanwhile: then what it holds is that writer's, and a
     * failure of ours (the run exists) must leave it. */
    if (t->made_dir && !rundir_holds_only_lock(out))
        t->made_dir = t->made_parents = 0;
    char latest[4096];
    snprintf(latest, sizeof latest, "%.*s/latest", path_dir_len(out), out);
    struct stat sb;
    if (!strcmp(t->o.resume, "none") && stat(latest, &sb) == 0)
        return fail(t, FTK_EXIT_USAGE,
                    "%s already holds a run (%s exists): pass --resume auto to continue it, or choose another --out",
                    out, latest);
    /* `latest` may be missing where writing it failed after its checkpoint was committed */
    size_t n_ck;
    char **ck = strcmp(t->o.resume, "none") ? NULL : ckpt_list(out, &n_ck);
    if (ck) {
        for (size_t i = 0; i < n_ck; i++)
            free(ck[i]);
        free(ck);
        if (n_ck)
            return fail(t, FTK_EXIT_USAGE,
                        "%s already holds a run (committed checkpoints): pass --resume auto to continue it, or "
                        "choose another --out",
                        out);
    }
    int n = ckpt_remove_stale(out);
    if (n > 0)
        ftk_info("removed %d unfinished checkpoint director%s left in %s by a run that died", n, n == 1 ? "y" : "ies",
                 out);
    return 0;
}

/* ---- building ----------------------------------------------------------------------------- */

int64_t trainer_attn_max_seg(const tokens_set_t *data, int64_t micro_batch)
{
    int64_t tr = tokens_set_max_segments(data, TOKENS_TRAIN, micro_batch);
    int64_t val = tokens_set_max_segments(data, TOKENS_VAL, micro_batch);
    return val > tr ? val : tr;
}

build_opts_t trainer_build_opts(const trainer_opts_t *o)
{
    return (build_opts_t){.strategy = o->strategy,
                          .group_size = o->group_size,
                          .units = o->units,
                          .compress_weights = o->compress_weights,
                          .compress_grads = o->compress_grads,
                          .precision = o->precision,
                          .stochastic = o->stochastic,
                          .recompute = o->recompute,
                          .micro_batch = o->train.micro_batch,
                          .attn_max_seg = o->attn_max_seg};
}

/* --recompute auto: this rank's plan at each level against its device's memory (plan.h
 * plan_recompute_auto); rank 0 says what it chose. */
static int pick_recompute(trainer_t *t)
{
    plan_opts_t p = {.cfg = t->cfg, .o = trainer_build_opts(&t->o), .max_len = t->data.max_len,
                     .ranks = t->nranks, .device = t->be->name};
    int64_t budget;
    plan_t pl;
    if (plan_recompute_auto(&p, t->rank, t->be, t->o.device_bytes, &pl, &budget))
        return fail(t, FTK_EXIT_USAGE, "%s", ftk_err_msg());
    t->o.recompute = pl.recompute;
    if (t->rank == 0)
        ftk_info("--recompute auto: %s (plan %.2f GB of %.2f GB; none %.2f, norms %.2f, block %.2f GB)",
                 plan_recompute_name(pl.recompute), (double)pl.total / 1e9, (double)budget / 1e9,
                 (double)pl.peak[MODEL_RECOMPUTE_NONE] / 1e9, (double)pl.peak[MODEL_RECOMPUTE_NORMS] / 1e9,
                 (double)pl.peak[MODEL_RECOMPUTE_BLOCK] / 1e9);
    return 0;
}

#define CHECK(expr)                                                                                                  \
    do {                                                                                                             \
        if ((*code = agree(t, (expr))))                                                                              \
            goto fail;                                                                                               \
    } while (0)

trainer_t *trainer_new(comm_t *world, backend_t *be, const trainer_opts_t *o, int *code)
{
    trainer_t *t = calloc(1, sizeof *t);
    int c = t ? 0 : FTK_EXIT_FAIL;
    /* Even a failed calloc must take part in the agreement: the other ranks wait for it. */
    if (!t) {
        char msg[64] = "out of memory";
        int who;
        *code = comm_agree(world, c, msg, sizeof msg, &who);
        ftk_err_set("%s", msg);
        return NULL;
    }
    t->world = world;
    t->rank = comm_rank(world);
    t->nranks = comm_size(world);
    t->be = be;
    t->o = *o;
    t->wf = -1;
    t->lock_fd = -1;
    ckpt_meta_t *meta = &t->meta;

    if ((t->wf = weights_open(o->model_path, &t->cfg)) < 0)
        c = fail(t, FTK_EXIT_USAGE, "%s", ftk_err_msg());
    else if (open_data(o->data_path, &t->data) < 0 || check_data(t) < 0)
        c = fail(t, FTK_EXIT_USAGE, "%s", ftk_err_msg()); /* it names the file */
    else if (t->data.vocab > t->cfg.vocab_size)
        c = fail(t, FTK_EXIT_USAGE, "%s: token ids up to %lld, but the model's vocabulary has %lld entries",
                 o->data_path, (long long)t->data.vocab, (long long)t->cfg.vocab_size);
    else if (t->data.rows[TOKENS_TRAIN] == 0)
        c = fail(t, FTK_EXIT_USAGE, "%s: no training rows", o->data_path);
    else if (check_tokenizer(t))
        c = FTK_EXIT_USAGE;
    else if (ckpt_init_hash(t->wf, &t->cfg, meta->init_xxh3) < 0)
        c = fail(t, FTK_EXIT_USAGE, "%s: %s", o->model_path, ftk_err_msg());
    CHECK(c);
    /* LitGPT's Alpaca: one sample per row, padded to the micro-batch's longest, every
     * token but the first a target. Other data trains, but not LitGPT's step for step. */
    if (t->rank == 0 && !strcmp(ckpt_recipe(&o->train), "litgpt")) {
        if (t->data.mask_prompt == 1)
            ftk_warn("--recipe litgpt: %s was packed with --mask-prompt: LitGPT's Alpaca has the prompt's tokens as "
                     "targets too (ftk-pack --no-mask-prompt)",
                     o->data_path);
        if (t->data.packed == 1)
            ftk_warn("--recipe litgpt: %s holds packed rows (ftk-pack --pack): LitGPT trains one sample per row, so "
                     "its micro-batches hold other samples",
                     o->data_path);
    }
    t->R = t->data.rows[TOKENS_TRAIN];
    /* Products of options, checked (a global batch or --epochs of 2^63-1 overflowed) */
    t->per_epoch = t->R / o->train.global_batch + (t->R % o->train.global_batch != 0);
    meta->train = o->train;
    int64_t pass_tokens;
    if (!meta->train.total_steps && opts_mul_i64(o->epochs, t->per_epoch, &meta->train.total_steps) < 0)
        c = fail(t, FTK_EXIT_USAGE, "--epochs %lld of %lld steps each: more steps than a counter holds",
                 (long long)o->epochs, (long long)t->per_epoch);
    else if (build_pass_tokens(o->train.micro_batch, t->data.max_len, &pass_tokens) < 0)
        c = fail(t, FTK_EXIT_USAGE, "%s: %s", o->data_path, ftk_err_msg());
    CHECK(c);
    snprintf(meta->train.rounding, sizeof meta->train.rounding, "%s",
             o->precision == PREC_BF16_TRUE && o->stochastic ? "stochastic" : "nearest");
    snprintf(meta->data_file, sizeof meta->data_file, "%s", o->data_path);
    snprintf(meta->data_set_xxh3, sizeof meta->data_set_xxh3, "%s", t->data.set_xxh3);
    snprintf(meta->init_file, sizeof meta->init_file, "%s", o->model_path);
    snprintf(meta->strategy, sizeof meta->strategy, "%s", strategy_name(o->strategy));
    snprintf(meta->precision, sizeof meta->precision, "%s", precision_name(o->precision));
    units_name(&o->units, meta->units_policy);
    meta->data_rows = t->R;
    meta->world_size = t->nranks;
    /* for the attention's plans (and their memory in --recompute auto's plan) */
    t->o.attn_max_seg = trainer_attn_max_seg(t->data.set, o->train.micro_batch);

    CHECK(t->rank == 0 ? prepare_out_dir(t) : 0);
    CHECK(o->recompute == PLAN_RECOMPUTE_AUTO ? pick_recompute(t) : 0);
    build_opts_t bo = trainer_build_opts(&t->o);
    c = build_job(be, world, &t->cfg, &bo, pass_tokens, &t->sh, &t->opt, &t->m);
    CHECK(c ? fail(t, c, "%s: %s", o->model_path, ftk_err_msg()) : 0);
    build_step_opts(&t->step_opts); /* build_job has checked it */
    meta->shard_count = shard_count(t->sh);
    if (shard_compress_grads(t->sh))
        snprintf(meta->compress_grads, sizeof meta->compress_grads, "bf16");
    if (o->async_save) {
        /* Same library on every rank: the answer is the same everywhere. */
        t->async = bgsave_supported();
        if (!t->async)
            ftk_warn("--async-save: this HDF5 library is not thread-safe; checkpoints are written synchronously");
        int n_units;
        const ckpt_unit_t *units = shard_units(t->sh, &n_units);
        if (t->async && shard_writes(t->sh) &&
            !(t->bg = bgsave_new(be, units, n_units, meta->shard_count, ckpt_state_dtype(meta->precision),
                                  shard_compress_grads(t->sh))))
            c = fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg());
        CHECK(c);
    }
    open_snapshots(t);
    t->perm = malloc((size_t)t->R * sizeof *t->perm);
    /* a batch holds at most the epoch's rows */
    t->rows = malloc((size_t)(o->train.global_batch < t->R ? o->train.global_batch : t->R) * sizeof *t->rows);
    CHECK(!t->perm || !t->rows ? fail(t, FTK_EXIT_FAIL, "out of memory") : 0);
    if (!strcmp(ckpt_loss_mean(&o->train), "micro")) {
        int64_t J = (o->train.global_batch + o->train.micro_batch - 1) / o->train.micro_batch;
        t->micro_n = malloc((size_t)(3 + J) * sizeof *t->micro_n);
        t->micro_w = malloc((size_t)J * sizeof *t->micro_w);
        CHECK(!t->micro_n || !t->micro_w ? fail(t, FTK_EXIT_FAIL, "out of memory") : 0);
    }
    return t;
fail:
    trainer_discard_new_run(t);
    trainer_free(t);
    return NULL;
}

int trainer_discard_new_run(trainer_t *t)
{
    if (t && t->rank == 0 && t->made_dir && !t->committed) {
        rm_tree(t->o.out_dir); /* a failure to remove it changes nothing about the failure reported */
        rmdir_parents(t->o.out_dir, t->made_parents);
        t->made_dir = t->made_parents = 0;
        return 1;
    }
    return 0;
}
#undef CHECK

void trainer_free(trainer_t *t)
{
    if (!t)
        return;
    /* A write still in flight (a failed step or save on the way out) is waited for — it
     * reads the snapshot and the weights file — and never committed: rank 0 removes its
     * directory, and `latest` stays on the previous checkpoint. */
    bgsave_free(t->bg);
    snapshot_free(t->snap);
    if (t->pend.active && t->rank == 0)
        ckpt_abort(&t->pend.w);
    batch_free(&t->b);
    if (t->lock_fd >= 0)
        close(t->lock_fd);
    free(t->perm);
    free(t->rows);
    free(t->micro_n);
    free(t->micro_w);
    model_free(t->m);
    optim_free(t->opt);
    shard_free(t->sh);
    tokens_split_free(&t->data.step);
    tokens_split_free(&t->data.next);
    tokens_split_free(&t->data.eval);
    tokens_set_close(t->data.set);
    if (t->wf >= 0)
        h5_close(t->wf);
    free(t);
}

const ckpt_meta_t *trainer_meta(const trainer_t *t) { return &t->meta; }
const char *trainer_extended(const trainer_t *t) { return t->extended; }
int trainer_done(const trainer_t *t) { return t->meta.step >= t->meta.train.total_steps; }
int64_t trainer_steps_per_epoch(const trainer_t *t) { return t->per_epoch; }
int64_t trainer_rows(const trainer_t *t) { return t->R; }
int64_t trainer_val_rows(const trainer_t *t) { return t->data.rows[TOKENS_VAL]; }
int64_t trainer_n_params(const trainer_t *t) { return model_n_params(&t->cfg); }
const bk_mem_t *trainer_memory(const trainer_t *t) { return bk_mem(t->be); }
shard_t *trainer_shard(trainer_t *t) { return t->sh; }

/* ---- training ------------------------------------------------------------------------------- */

/* Rows r0 .. r0 + k - 1 of the validation split into val (k <= 0: none). */
static int read_val_rows(trainer_t *t, int64_t r0, int64_t k, tokens_split_t *val)
{
    tokens_split_free(val);
    if (k <= 0)
        return 0;
    int64_t *v = malloc((size_t)k * sizeof *v);
    if (!v) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int64_t i = 0; i < k; i++)
        v[i] = r0 + i;
    int rc = tokens_set_read(t->data.set, TOKENS_VAL, v, k, val);
    free(v);
    return rc;
}

/* loss_mean "micro": the validation loss is the mean of the token means of micro-batches
 * j = rows [j·mb, (j+1)·mb) of the rows evaluated (LitGPT's validate), whatever the ranks:
 * each rank first reads its rows to count their targets per micro-batch (one all-reduce),
 * then the passes weigh each target 1/(J·targets of its micro-batch), as a step does. */
int trainer_evaluate(trainer_t *t, double *loss, int64_t *n_tgt)
{
    tokens_split_t *val = &t->data.eval;
    int64_t mb = t->meta.train.micro_batch, er = t->o.eval_rows, n_val = t->data.rows[TOKENS_VAL];
    int64_t rows = er > 0 && er < n_val ? er : n_val;
    int64_t lo = rows * t->rank / t->nranks, hi = rows * (t->rank + 1) / t->nranks;
    int64_t per = (rows + t->nranks - 1) / t->nranks, passes = (per + mb - 1) / mb;
    double v[3] = {0, 0, 0}; /* loss, targets, errors */
    double lost = 0;          /* NaN when a pass could not run */
    char err[1024] = "";
    int micro = t->micro_n != NULL;
    int64_t J = micro ? (rows + mb - 1) / mb : 0;
    double *cnt = NULL; /* an error, then the targets of each micro-batch */
    float *w = NULL;
    if (micro) {
        cnt = calloc((size_t)(J + 1), sizeof *cnt);
        w = malloc((size_t)(J > 0 ? J : 1) * sizeof *w);
        if (!cnt || !w) {
            free(cnt);
            free(w);
            return agree(t, fail(t, FTK_EXIT_FAIL, "validation: out of memory"));
        }
        for (int64_t p = 0; p < passes && !cnt[0]; p++) {
            int64_t r0 = lo + p * mb, k = hi - r0 < mb ? hi - r0 : mb;
            if (read_val_rows(t, r0, k, val) < 0) {
                snprintf(err, sizeof err, "%s", ftk_err_msg());
                cnt[0] = 1;
            }
            for (int64_t i = 0; !cnt[0] && i < val->n_rows; i++)
                cnt[1 + (r0 + i) / mb] += (double)loader_row_targets(val, i);
        }
        comm_allreduce_f64(t->world, cnt, (int)(J + 1), COMM_SUM);
        if (cnt[0]) {
            free(cnt);
            free(w);
            return agree(t, fail(t, FTK_EXIT_FAIL, "validation failed: %s", err[0] ? err : "on another rank"));
        }
        loader_micro_weights(cnt + 1, J, w);
    }
    for (int64_t p = 0; p < passes; p++) {
        int64_t r0 = lo + p * mb, k = hi - r0 < mb ? hi - r0 : mb;
        int bad = read_val_rows(t, r0, k, val) < 0;
        if (bad || (micro ? make_micro_batch(&t->b, val, 0, k, r0, mb, w) : make_batch(&t->b, val, NULL, 0, k)) < 0) {
            snprintf(err, sizeof err, "%s", ftk_err_msg());
            v[2] = 1;
            make_batch(&t->b, val, NULL, 0, 0); /* keep the collectives in step */
        }
        shard_pass_begin(t->sh, 0, 0);
        if (model_pass(t->m, &t->b, 0.0f, NULL) < 0)
            lost = NAN;
        shard_pass_end(t->sh);
        v[1] += (double)t->b.n_tgt;
    }
    shard_drop(t->sh);
    free(cnt);
    free(w);
    /* The passes' losses stayed on the device: one download for all of them. */
    v[0] = model_loss_take(t->m) + lost;
    comm_allreduce_f64(t->world, v, 3, COMM_SUM);
    *n_tgt = (int64_t)v[1];
    *loss = !v[1] ? NAN : micro ? v[0] : v[0] / v[1];
    return agree(t, v[2] ? fail(t, FTK_EXIT_FAIL, "validation failed: %s", err[0] ? err : "on another rank") : 0);
}

/* FTK_STEP's prefetch: the rows of the step after this one (which consumes k) into
 * data.next, while the device works. Not past the epoch's end (the next order is made at
 * the next step) nor after a failed read (the next step reads its rows itself and says
 * why): the data order is the same either way. */
static void prefetch(trainer_t *t, int64_t k)
{
    const ckpt_meta_t *meta = &t->meta;
    int64_t at = meta->rows_consumed + k, G = meta->train.global_batch;
    t->data.next_ok = 0;
    if (at >= t->R)
        return;
    int64_t kn = t->R - at < G ? t->R - at : G;
    int64_t lo = kn * t->rank / t->nranks, hi = kn * (t->rank + 1) / t->nranks;
    tokens_split_free(&t->data.next);
    if (tokens_set_read(t->data.set, TOKENS_TRAIN, t->perm + at + lo, hi - lo, &t->data.next) < 0)
        return;
    t->data.next_ok = 1;
    t->data.next_epoch = meta->epoch;
    t->data.next_at = at;
}

/* Ends a phase of trainer_step at now: its time less the waits in it goes to *acc. */
static void step_phase(const comm_stats_t *s, double *t, double *w, double *acc)
{
    double now = time_now();
    *acc += (now - *t) - (s->wait_s - *w);
    *t = now;
    *w = s->wait_s;
}

/* This rank's part of one global batch: k rows of the data order (t->rows), this rank's
 * [lo, hi) of them, in passes micro-batches. */
typedef struct {
    int64_t k, lo, hi, passes;
} step_rows_t;

/* The next global batch of the data order, a new epoch's order once the last is used up. */
static step_rows_t step_rows(trainer_t *t)
{
    ckpt_meta_t *meta = &t->meta;
    const ckpt_train_t *tc = &meta->train;
    int64_t G = tc->global_batch, mb = tc->micro_batch;
    if (meta->rows_consumed >= t->R) {
        meta->epoch++;
        meta->rows_consumed = 0;
        loader_order((uint64_t)tc->seed, meta->epoch, t->R, t->perm);
    }
    step_rows_t r = {.k = t->R - meta->rows_consumed < G ? t->R - meta->rows_consumed : G};
    memcpy(t->rows, t->perm + meta->rows_consumed, (size_t)r.k * sizeof *t->rows);
    r.lo = r.k * t->rank / t->nranks, r.hi = r.k * (t->rank + 1) / t->nranks;
    int64_t per = (r.k + t->nranks - 1) / t->nranks;
    r.passes = (per + mb - 1) / mb;
    return r;
}

/* This rank's rows of the batch, read once (or taken from the prefetch), and the batch's
 * counts summed over every rank (exact: integers) into c: targets, tokens, whether a rank
 * could not read its rows, then (loss_mean "micro") the targets of each of the J
 * micro-batches, which rows of several ranks may share. A failed read leaves its message
 * in err. */
static void step_count(trainer_t *t, const step_rows_t *r, double *c, int64_t J, char *err, size_t n_err)
{
    tokens_split_t *tr = &t->data.step;
    const ckpt_meta_t *meta = &t->meta;
    int64_t mb = meta->train.micro_batch;
    memset(c, 0, (size_t)(3 + J) * sizeof *c);
    if (t->data.next_ok && t->data.next_epoch == meta->epoch && t->data.next_at == meta->rows_consumed) {
        tokens_split_t read = t->data.next; /* read during the previous step (prefetch) */
        t->data.next = *tr;
        *tr = read;
        tokens_split_free(&t->data.next);
    } else {
        tokens_split_free(tr);
        if (tokens_set_read(t->data.set, TOKENS_TRAIN, t->rows + r->lo, r->hi - r->lo, tr) < 0) {
            snprintf(err, n_err, "%s", ftk_err_msg());
            c[2] = 1;
        }
    }
    t->data.next_ok = 0;
    for (int64_t i = 0; i < tr->n_rows; i++) {
        int64_t n = loader_row_targets(tr, i);
        c[0] += (double)n;
        if (t->micro_n)
            c[3 + (r->lo + i) / mb] += (double)n;
        for (int64_t j = tr->row_samples[i]; j < tr->row_samples[i + 1]; j++)
            c[1] += (double)tr->sample_lengths[j];
    }
    comm_allreduce_f64(t->world, c, (int)(3 + J), COMM_SUM);
}

/* The forward and backward passes over this rank's micro-batches, each target's loss
 * scaled by scale. A batch that cannot be built runs as an idle pass (the collectives stay
 * in step) and sets *bad, its message in err. Returns 0, or NaN when a pass could not run. */
static double step_passes(trainer_t *t, const step_rows_t *r, float scale, double *bad, char *err, size_t n_err)
{
    tokens_split_t *tr = &t->data.step;
    int64_t mb = t->meta.train.micro_batch;
    int micro = t->micro_n != NULL;
    double lost = 0;
    for (int64_t p = 0; p < r->passes; p++) {
        int64_t r0 = r->lo + p * mb, kk = r->hi - r0 < mb ? r->hi - r0 : mb;
        if ((micro ? make_micro_batch(&t->b, tr, r0 - r->lo, kk, r0, mb, t->micro_w)
                   : make_batch(&t->b, tr, NULL, r0 - r->lo, kk)) < 0) {
            snprintf(err, n_err, "%s", ftk_err_msg());
            *bad = 1;
            make_batch(&t->b, tr, NULL, 0, 0); /* keep the collectives in step */
        }
        shard_pass_begin(t->sh, 1, p + 1 == r->passes);
        if (model_pass(t->m, &t->b, scale, NULL) < 0)
            lost = NAN;
        shard_pass_end(t->sh);
    }
    return lost;
}

int trainer_step(trainer_t *t, const volatile sig_atomic_t *stop, int clock_due, trainer_step_t *out)
{
    ckpt_meta_t *meta = &t->meta;
    const ckpt_train_t *tc = &meta->train;
    comm_stats_t *stats = shard_stats(t->sh), before = *stats;
    /* where the step's time goes (trainer_step_t): phases of host work and of compute,
     * each less the communication waits inside it */
    double ph_t = time_now(), ph_w = stats->wait_s, ph[2] = {0, 0}, t_start = ph_t; /* ph: host, compute */
    step_rows_t r = step_rows(t);
    /* The batch's targets scale every backward pass. */
    int micro = t->micro_n != NULL;
    int64_t J = micro ? (r.k + tc->micro_batch - 1) / tc->micro_batch : 0;
    double c3[3], *c = micro ? t->micro_n : c3;
    char err[1024] = "";
    step_count(t, &r, c, J, err, sizeof err);
    if (c[2])
        return agree(t, err[0] ? fail(t, FTK_EXIT_FAIL, "step %lld: %s", (long long)meta->step + 1, err) : 0);
    int64_t n_tgt = (int64_t)c[0], tokens = (int64_t)c[1];
    float scale = 1.0f / (float)(n_tgt > 0 ? n_tgt : 1);
    if (micro) {
        loader_micro_weights(c + 3, J, t->micro_w);
        scale = 1.0f; /* the targets' weights hold the normalisation */
    }
    step_phase(stats, &ph_t, &ph_w, &ph[0]);
    /* loss, stop requested, checkpoint due by the clock, a rank failed, ranks whose
     * checkpoint write is under way, a checkpoint write or commit failed */
    double v[6] = {0, stop && *stop ? 1 : 0, t->rank == 0 && clock_due, 0, 0, 0};
    double lost = step_passes(t, &r, scale, &v[3], err, sizeof err);
    step_phase(stats, &ph_t, &ph_w, &ph[1]);
    trainer_snapshot_poll(t); /* the memory snapshot of the step before, which ran beside the passes */
    int64_t step = meta->step + 1;
    double lr = schedule_lr(tc, step);
    /* The optimizer queued behind the passes (with the device's clipping: all of it), then
     * the next step's rows read while the device works, then the step's one wait. */
    optim_queue(t->opt, tc, step, lr);
    if ((t->step_opts & BUILD_STEP_PREFETCH) && step < tc->total_steps)
        prefetch(t, r.k);
    step_phase(stats, &ph_t, &ph_w, &ph[0]);
    /* A device (and NCCL, comm_status) keeps its first error: stop before a checkpoint could
     * take NaN from it. */
    int cs = 0, bad = t->be->sync(t->be) < 0 || (cs = comm_status(t->world)) < 0;
    /* The micro-batches' losses stayed on the device (no host wait inside the step's
     * passes) and came back with Σg²: one running sum over every chunk of every
     * micro-batch. With the host's clipping (ranks that sum Σg²), AdamW is queued now and
     * waited for again. */
    double lsum;
    double gnorm = optim_finish(t->opt, tc, step, lr, &lsum);
    if (!bad && !optim_device_clip(t->opt))
        bad = t->be->sync(t->be) < 0 || (cs = comm_status(t->world)) < 0;
    step_phase(stats, &ph_t, &ph_w, &ph[1]);
    v[0] = lsum + lost;
    v[1] = v[1] || (stop && *stop);
    /* The background write, learned at no cost: this all-reduce happens every step. */
    if (t->pend.active && !bgsave_done(t->bg))
        v[4] = 1;
    else if (t->pend.active && trainer_join_write(t).code)
        v[5] = 1;
    v[5] = v[5] || (t->rank == 0 && t->pend.commit_code);
    comm_allreduce_f64(t->world, v, 6, COMM_SUM);
    if (v[3])
        return agree(t, fail(t, FTK_EXIT_FAIL, "step %lld: %s", (long long)meta->step + 1,
                             err[0] ? err : "a batch could not be built on another rank"));
    double loss = micro ? v[0] : v[0] / (double)(n_tgt > 0 ? n_tgt : 1);
    step_phase(stats, &ph_t, &ph_w, &ph[0]);
    int code = agree_first(t, bad ? fail(t, FTK_EXIT_FAIL, "step %lld: %s", (long long)step, ftk_err_msg()) : 0,
                           cs == -2);
    if (code)
        return code;
    /* At the step boundary: commit the background checkpoint every rank has written. */
    if ((code = trainer_save_poll(t, v[4] > 0, v[5] > 0)))
        return code;
    meta->step = step;
    meta->rows_consumed += r.k;
    meta->tokens_seen += tokens;
    *out = (trainer_step_t){.step = step, .total_steps = tc->total_steps, .loss = loss, .lr = lr,
                            .grad_norm = gnorm, .tokens = tokens, .tokens_seen = meta->tokens_seen,
                            .epoch = meta->epoch, .micro_batches = r.passes, .stop = v[1] > 0, .save_due = v[2] > 0};
    comm_stats_since(&out->comm, stats, &before);
    step_phase(stats, &ph_t, &ph_w, &ph[0]);
    out->host_s = ph[0];
    out->compute_s = ph[1];
    out->step_s = ph_t - t_start;
    if (!isfinite(loss)) {
        ftk_err_set("step %lld: the loss is %g; stopping without a checkpoint", (long long)step, loss);
        return FTK_EXIT_FAIL;
    }
    return 0;
}
