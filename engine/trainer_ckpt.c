/* trainer_ckpt.c — the trainer's checkpoints: save, asynchronous save, resume (trainer.h);
 * the rest of the trainer is trainer.c. */
#include "trainer_state.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../formats/h5.h"
#include "../libcommon/fault.h"
#include "../libcommon/path.h"
#include "../libcommon/plural.h"
#include "../libcommon/timer.h"
#include "loader.h"

static int same_config(const model_config_t *a, const model_config_t *b)
{
    return a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
           a->num_hidden_layers == b->num_hidden_layers && a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->vocab_size == b->vocab_size &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->rms_norm_eps == b->rms_norm_eps &&
           a->rope_theta == b->rope_theta;
}

/* The options that define the run must be the checkpoint's; with extend, those of the
 * schedule (the steps, the learning rates, the warmup, the decay) may change, each change
 * written into changed (a resumed run is then no longer bit-exact with an uninterrupted
 * one, so the tool says it). */
static int check_resume_options(const ckpt_meta_t *cm, const ckpt_meta_t *meta, int extend, char *changed,
                                size_t n_changed)
{
    const ckpt_train_t *c = &cm->train, *t = &meta->train;
    changed[0] = 0;
#define MAY(field, opt)                                                                                              \
    if (extend && c->field != t->field) {                                                                            \
        size_t used = strlen(changed);                                                                               \
        snprintf(changed + used, n_changed - used, "%s--%s %g -> %g", used ? ", " : "", opt, (double)c->field,       \
                 (double)t->field);                                                                                  \
    }
    MAY(lr, "lr")
    MAY(min_lr, "min-lr")
    MAY(warmup, "warmup")
    MAY(total_steps, "steps")
#undef MAY
    if (extend && strcmp(c->schedule, t->schedule)) {
        size_t used = strlen(changed);
        snprintf(changed + used, n_changed - used, "%s--schedule %s -> %s", used ? ", " : "", c->schedule,
                 t->schedule);
    }
    if (extend && t->total_steps < cm->step) {
        ftk_err_set("--extend: --steps %lld is before the checkpoint's step %lld", (long long)t->total_steps,
                    (long long)cm->step);
        return -1;
    }
    /* what --extend may change, the refusal says how */
    static const char how[] = ", or add --extend to change the schedule (the run is then no longer bit-exact with an "
                              "uninterrupted one)";
#define SAME_OR(field, opt, hint)                                                                                    \
    if (c->field != t->field) {                                                                                      \
        ftk_err_set("--%s differs from the checkpoint's (%g there, %g here); resume with the same options%s", opt,   \
                    (double)c->field, (double)t->field, hint);                                                       \
        return -1;                                                                                                   \
    }
#define SAME(field, opt) SAME_OR(field, opt, "")
    if (!extend) {
        SAME_OR(lr, "lr", how)
        SAME_OR(min_lr, "min-lr", how)
        SAME_OR(warmup, "warmup", how)
        SAME_OR(total_steps, "steps/--epochs (total steps)", how)
    }
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
#undef SAME_OR
    if (!extend && strcmp(c->schedule, t->schedule)) {
        ftk_err_set("--schedule differs from the checkpoint's (%s there, %s here); resume with the same options%s",
                    c->schedule, t->schedule, how);
        return -1;
    }
    /* the recipe first: a change of it explains the pieces' */
    const char *(*const get[3])(const ckpt_train_t *) = {ckpt_recipe, ckpt_warmup_style, ckpt_loss_mean};
    static const char *const opt[3] = {"recipe", "warmup-style", "loss-mean"};
    for (int i = 0; i < 3; i++)
        if (strcmp(get[i](c), get[i](t))) {
            ftk_err_set("--%s differs from the checkpoint's (%s there, %s here); resume with the same options", opt[i],
                        get[i](c), get[i](t));
            return -1;
        }
    if (strcmp(cm->precision, meta->precision)) {
        ftk_err_set("--precision differs from the checkpoint's (%s there, %s here); resume with the same "
                    "--precision, or convert the checkpoint first (ftk-reshard --precision %s)",
                    cm->precision, meta->precision, meta->precision);
        return -1;
    }
    /* The state is valid for either rounding: a change is allowed (not bit for bit), and said. */
    if (strcmp(meta->precision, "bf16-true") == 0 && strcmp(c->rounding, t->rounding))
        ftk_warn("the checkpoint's steps rounded to %s, this run rounds %s (--rounding)", c->rounding, t->rounding);
    return 0;
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

static void push_report(trainer_t *t, int64_t step, int async, double stall_s, double write_s, int64_t bytes)
{
    if (t->n_reports < (int)(sizeof t->reports / sizeof *t->reports))
        t->reports[t->n_reports++] = (trainer_ckpt_t){step, async, stall_s, write_s, bytes};
}

int trainer_ckpt_reports(trainer_t *t, trainer_ckpt_t *out, int max)
{
    int n = t->n_reports < max ? t->n_reports : max;
    memcpy(out, t->reports, (size_t)n * sizeof *out);
    memmove(t->reports, t->reports + n, (size_t)(t->n_reports - n) * sizeof *out);
    t->n_reports -= n;
    return n;
}

/* Rank 0 makes the hidden directory of the checkpoint of `step`; every rank learns its
 * name (agreed). */
static int save_settle(trainer_t *t);

/* Every rank: settles the checkpoint in flight (steps stay in order; its wait is its own
 * stall), then rank 0 makes the hidden directory of this step's checkpoint, whose path
 * every rank gets in dir. *t0: when this checkpoint's own time began. Agreed. */
static int save_begin(trainer_t *t, ckpt_writer_t *w, char dir[4096], double *t0)
{
    int code = save_settle(t);
    if (code)
        return code;
    *t0 = time_now();
    int64_t step = t->meta.step;
    dir[0] = 0;
    memset(w, 0, sizeof *w);
    if (t->rank == 0) {
        if (ckpt_begin(w, t->o.out_dir, step) < 0)
            code = fail(t, FTK_EXIT_FAIL, "checkpoint at step %lld: %s", (long long)step, ftk_err_msg());
        else
            snprintf(dir, 4096, "%s", w->dir);
    }
    if ((code = agree(t, code)))
        return code;
    comm_bcast(t->world, dir, 4096, 0);
    return 0;
}

/* Every rank with its shard's report (a failed one has why set): rank 0 collects them
 * (the writers are ranks 0 … S−1, replica 0) and commits — manifest, rename, latest,
 * --keep — or removes the directory if any rank failed. deferred (the background path,
 * every report known to be good): nothing more is waited for; a failed commit is kept
 * on rank 0 and reported at the next step (pend.commit_code). Else agreed. rep gets the
 * write time (the slowest writer's) and the bytes of every shard. */
static int save_commit(trainer_t *t, ckpt_writer_t *w, const ckpt_meta_t *meta, shard_report_t me, int deferred,
                       trainer_ckpt_t *rep)
{
    int n_units;
    const ckpt_unit_t *units = shard_units(t->sh, &n_units);
    shard_report_t *all = t->rank == 0 ? calloc((size_t)t->nranks, sizeof *all) : NULL;
    if (t->rank == 0 && !all)
        abort(); /* a few bytes per rank */
    comm_gather(t->world, &me, all, sizeof me, 0);
    int code = (int)me.code;
    memset(rep, 0, sizeof *rep);
    if (t->rank == 0) {
        ckpt_shard_sum_t *sums = calloc((size_t)meta->shard_count, sizeof *sums);
        for (int64_t i = 0; i < meta->shard_count && sums; i++) {
            sums[i].bytes = all[i].bytes;
            sums[i].xxh3 = all[i].xxh3;
            code = all[i].code > code ? (int)all[i].code : code;
            rep->bytes += (int64_t)all[i].bytes;
            rep->write_s = all[i].write_s > rep->write_s ? all[i].write_s : rep->write_s;
        }
        if (!sums)
            code = fail(t, FTK_EXIT_FAIL, "out of memory");
        char step_dir[4200];
        snprintf(step_dir, sizeof step_dir, "%.*s/%s", path_dir_len(t->o.out_dir), t->o.out_dir, w->name);
        struct stat sb;
        if (code)
            ckpt_abort(w);
        else if (ckpt_commit(w, meta, &t->cfg, units, n_units, sums, (int)t->o.keep) < 0)
            code = fail(t, FTK_EXIT_FAIL, "checkpoint at step %lld: %s", (long long)meta->step, ftk_err_msg());
        /* committed, even when `latest` could not follow: the run is resumable from it */
        if (stat(step_dir, &sb) == 0)
            t->committed = 1;
        free(sums);
        free(all);
    }
    if (!deferred)
        return agree(t, code);
    if (code) {
        t->pend.commit_code = code;
        snprintf(t->pend.commit_why, sizeof t->pend.commit_why, "%s", t->why);
    }
    return 0;
}

/* The background write in flight, joined on this rank: its report. */
shard_report_t trainer_join_write(trainer_t *t)
{
    shard_report_t me = {0, 0, 0, 0};
    if (bgsave_running(t->bg)) {
        ckpt_shard_sum_t sum = {0, 0};
        if (bgsave_wait(t->bg, &sum, &me.write_s) < 0)
            me.code = fail(t, FTK_EXIT_FAIL, "checkpoint at step %lld (background write): %s",
                           (long long)t->pend.meta.step, ftk_err_msg());
        me.bytes = sum.bytes;
        me.xxh3 = sum.xxh3;
        t->pend.me = me;
        t->pend.joined = 1;
    }
    return t->pend.joined ? t->pend.me : me;
}

/* Settles the asynchronous checkpoint (every rank calls it): waits for the write in
 * flight on every rank and commits it, or removes it if a write failed; reports a commit
 * that failed at a step boundary. The wait counts as that checkpoint's stall. Agreed. */
static int save_settle(trainer_t *t)
{
    pending_t *p = &t->pend;
    int code = 0;
    if (p->active) {
        double t0 = time_now();
        shard_report_t me = trainer_join_write(t);
        trainer_ckpt_t rep;
        code = save_commit(t, &p->w, &p->meta, me, 0, &rep);
        p->stall_s += time_now() - t0;
        if (!code)
            push_report(t, p->meta.step, 1, p->stall_s, rep.write_s, rep.bytes);
        p->active = 0;
        p->joined = 0;
        if (code)
            return code;
    }
    if (p->commit_code)
        code = fail(t, p->commit_code, "%s", p->commit_why);
    p->commit_code = 0;
    return agree(t, code);
}

/* At a step boundary, after the step's all-reduce: running is the number of ranks whose
 * write is still under way, failed whether one failed (or a commit did). Every rank sees
 * the same two numbers, so every rank takes the same branch: nothing, the commit of a
 * checkpoint every rank has written (rank 0 commits; nobody waits for it), or — rare —
 * the agreed failure. */
int trainer_save_poll(trainer_t *t, int running, int failed)
{
    pending_t *p = &t->pend;
    if (failed)
        return save_settle(t); /* fails, with the lowest failing rank's message */
    if (!p->active || running)
        return 0;
    double t0 = time_now();
    shard_report_t me = trainer_join_write(t); /* done: does not block */
    trainer_ckpt_t rep;
    save_commit(t, &p->w, &p->meta, me, 1, &rep);
    p->stall_s += time_now() - t0;
    if (!p->commit_code)
        push_report(t, p->meta.step, 1, p->stall_s, rep.write_s, rep.bytes);
    p->active = 0;
    p->joined = 0;
    return 0;
}

/* The synchronous save's arrays: each slice downloaded into the one buffer in turn. */
typedef struct {
    shard_t *sh;
    void *buf;
} slice_src_t;

static const void *slice_array(void *ctx, int kind, int unit)
{
    slice_src_t *c = ctx;
    if (kind == CKPT_KINDS)
        return shard_get_residual(c->sh, unit, c->buf) < 0 ? NULL : c->buf;
    return shard_get_slice(c->sh, kind, unit, c->buf) < 0 ? NULL : c->buf;
}

/* A buffer for the largest array a shard file holds (malloc'd; NULL when out of memory). */
static void *slice_buffer(const trainer_t *t)
{
    int n_units;
    const ckpt_unit_t *units = shard_units(t->sh, &n_units);
    int64_t S = t->meta.shard_count, most = 0;
    for (int u = 0; u < n_units; u++)
        most = units[u].padded / S > most ? units[u].padded / S : most;
    size_t room = (size_t)most * dtype_size(ckpt_state_dtype(t->meta.precision));
    for (int u = 0; t->meta.compress_grads[0] && u < n_units; u++) /* residuals: whole units of f32 */
        room = (size_t)units[u].padded * sizeof(float) > room ? (size_t)units[u].padded * sizeof(float) : room;
    return malloc(room);
}

int trainer_save(trainer_t *t)
{
    const ckpt_meta_t *meta = &t->meta;
    ckpt_writer_t w;
    char dir[4096];
    double t0;
    int code = save_begin(t, &w, dir, &t0);
    if (code)
        return code;

    int n_units;
    const ckpt_unit_t *units = shard_units(t->sh, &n_units);
    shard_report_t me = {0, 0, 0, 0};
    if (shard_writes(t->sh)) {
        /* One array at a time through one unit-sized buffer: saving never doubles the
         * memory of the state. */
        double tw = time_now();
        ckpt_shard_sum_t sum = {0, 0};
        int64_t idx = shard_index(t->sh);
        void *buf = slice_buffer(t);
        slice_src_t src = {t->sh, buf};
        int bad = 1;
        if (!buf)
            ftk_err_set("out of memory");
        else
            bad = bgsave_write_shard(dir, meta, units, n_units, idx, idx == 0 ? t->wf : -1, slice_array, &src,
                                     &sum) < 0;
        if (bad)
            me.code = fail(t, FTK_EXIT_FAIL, "checkpoint at step %lld: %s", (long long)meta->step, ftk_err_msg());
        free(buf);
        me.bytes = sum.bytes;
        me.xxh3 = sum.xxh3;
        me.write_s = time_now() - tw;
    }
    trainer_ckpt_t rep;
    if (!(code = save_commit(t, &w, meta, me, 0, &rep)))
        push_report(t, meta->step, 0, time_now() - t0, rep.write_s, rep.bytes);
    return code;
}

int trainer_save_async(trainer_t *t)
{
    if (!t->async)
        return trainer_save(t);
    /* At most one checkpoint in flight: the previous one's write is waited for in
     * save_begin (its stall) and committed before this one starts. */
    const ckpt_meta_t *meta = &t->meta;
    ckpt_writer_t w;
    char dir[4096];
    double t0;
    int code = save_begin(t, &w, dir, &t0);
    if (code)
        return code;
    int rc = 0;
    int64_t idx = shard_index(t->sh);
    if (t->bg && (bgsave_snapshot(t->bg, t->sh) < 0 || bgsave_start(t->bg, dir, meta, idx, idx == 0 ? t->wf : -1) < 0))
        rc = fail(t, FTK_EXIT_FAIL, "checkpoint at step %lld: %s", (long long)meta->step, ftk_err_msg());
    if ((code = agree(t, rc))) {
        shard_report_t me = trainer_join_write(t); /* a write another rank could not start */
        (void)me;
        t->pend.joined = 0;
        if (t->rank == 0)
            ckpt_abort(&w);
        return code;
    }
    t->pend = (pending_t){.active = 1, .w = w, .meta = *meta, .stall_s = time_now() - t0};
    return 0;
}

/* ---- memory snapshots ------------------------------------------------------------------ */

int trainer_snapshots(const trainer_t *t) { return t->snap != NULL; }

/* Every rank: the snapshots end (a failure said, or the run's end), their memory freed. */
static void end_snapshots(trainer_t *t)
{
    if (snapshot_drop(t->snap) < 0 && t->rank == 0)
        ftk_warn("memory snapshots: %s", ftk_err_msg());
    snapshot_free(t->snap);
    t->snap = NULL;
}

/* Every rank with its snapshot call's result: a failure said, and the snapshots ended. */
static void snapshot_agree(trainer_t *t, int rc, int64_t step)
{
    if (!agree(t, rc < 0 ? fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg()) : 0))
        return;
    if (t->rank == 0)
        ftk_warn("memory snapshot of step %lld failed (%s); going on without memory snapshots (the checkpoints on "
                 "disk are kept as before)",
                 (long long)step, ftk_err_msg());
    end_snapshots(t);
}

int trainer_snapshot(trainer_t *t, snapshot_cost_t *cost)
{
    memset(cost, 0, sizeof *cost);
    if (!t->snap)
        return 0;
    int rc = snapshot_take(t->snap, &t->meta, t->wf, cost);
    /* the commit inside the step counts as this snapshot's too */
    cost->seconds += t->snap_poll.seconds;
    cost->wait_s += t->snap_poll.wait_s;
    memset(&t->snap_poll, 0, sizeof t->snap_poll);
    snapshot_agree(t, rc, t->meta.step);
    return 0;
}

void trainer_snapshot_poll(trainer_t *t)
{
    if (!t->snap)
        return;
    snapshot_cost_t c;
    int rc = snapshot_poll(t->snap, &c);
    t->snap_poll.seconds += c.seconds;
    t->snap_poll.wait_s += c.wait_s;
    snapshot_agree(t, rc, t->meta.step);
}

void trainer_drop_snapshots(trainer_t *t)
{
    if (t->snap)
        end_snapshots(t);
}

/* This rank's part of a checkpoint (every rank calls it): the manifest checked against
 * this run, then its shard read and verified into *st — or, when the checkpoint has
 * another shard count, its new slices read from the old shards. Returns 0 (agreed),
 * FTK_EXIT_VERIFY (damaged: another checkpoint may do) or FTK_EXIT_USAGE (not this
 * run's), with why set (not agreed). */
static int read_checkpoint(trainer_t *t, const char *ck, int some, ckpt_meta_t *cm, ckpt_state_t *st)
{
    const ckpt_meta_t *meta = &t->meta;
    ckpt_manifest_t man;
    int code = 0;
    memset(st, 0, sizeof *st);
    memset(cm, 0, sizeof *cm);
    if ((some ? ckpt_open_some(ck, &man) : ckpt_open(ck, &man)) < 0)
        code = fail(t, FTK_EXIT_VERIFY, "%s", ftk_err_msg());
    else
        *cm = man.meta;
    if (!code && !man.sealed && t->rank == 0)
        ftk_warn("%s/manifest.json has no manifest_xxh3 (written by an older ftk): its values are range-checked, "
                 "not checksummed",
                 ck);
    if ((code = agree(t, code))) {
        ckpt_manifest_free(&man); /* opened here if another rank failed (ckpt_open clears it on failure) */
        return code;
    }
    if (!same_config(&man.cfg, &t->cfg) || strcmp(cm->init_xxh3, meta->init_xxh3))
        code = fail(t, FTK_EXIT_USAGE, "%s is a checkpoint of a run started from other weights (%s) than %s", ck,
                    cm->init_file, t->o.model_path);
    else if (strcmp(cm->data_set_xxh3, meta->data_set_xxh3) || cm->data_rows != meta->data_rows)
        code = fail(t, FTK_EXIT_USAGE, "%s was trained on other data (set %s, %lld rows) than %s (set %s, %lld rows)",
                    ck, cm->data_set_xxh3, (long long)cm->data_rows, t->o.data_path, meta->data_set_xxh3,
                    (long long)meta->data_rows);
    else if (check_resume_options(cm, meta, t->o.extend, t->extended, sizeof t->extended) < 0)
        code = fail(t, FTK_EXIT_USAGE, "%s", ftk_err_msg());
    else if (cm->shard_count == meta->shard_count) {
        if (ckpt_read_shard(ck, &man, shard_index(t->sh), 0, st) < 0)
            code = fail(t, FTK_EXIT_VERIFY, "%s", ftk_err_msg());
    } else {
        /* Reshard on load: every old shard file is checksummed by one rank (round robin),
         * then each rank reads only the element ranges overlapping its new slices. */
        for (int64_t i = t->rank; i < cm->shard_count && !code; i += t->nranks) {
            hid_t f = ckpt_shard_open(ck, &man, i, 1);
            if (f < 0)
                code = fail(t, FTK_EXIT_VERIFY, "%s", ftk_err_msg());
            else
                h5_close(f);
        }
        code = agree(t, code);
        if (!code && ckpt_read_resliced(ck, &man, meta->shard_count, shard_index(t->sh), 0, st) < 0)
            code = fail(t, FTK_EXIT_VERIFY, "%s", ftk_err_msg());
        if (!code)
            ftk_info("%s: %lld shard%s (%lld rank%s, strategy %s) resliced on load into %lld (%d rank%s, strategy %s)",
                     ck, (long long)cm->shard_count, plural_s(cm->shard_count), (long long)cm->world_size,
                     plural_s(cm->world_size), cm->strategy, (long long)meta->shard_count, t->nranks,
                     plural_s(t->nranks), meta->strategy);
    }
    if (!code && t->rank == 0 && strcmp(cm->units_policy, meta->units_policy)) /* same arrays: nothing to convert */
        ftk_info("%s: written under --units %s, resumed under --units %s", ck, cm->units_policy, meta->units_policy);
    ckpt_manifest_free(&man);
    return code;
}

/* --compress-grads: each rank's error-feedback residuals from its own shard file, where the
 * checkpoint has them and the layout is the same (shard count and strategy: full and
 * grad-op write one shard per rank); else the run starts them at zero, and says so. */
static int resume_residuals(trainer_t *t, const char *ck, int some, const ckpt_meta_t *cm)
{
    int mine = shard_compress_grads(t->sh) != 0, theirs = cm->compress_grads[0] != 0;
    if (!mine && !theirs)
        return 0;
    if (!mine || !theirs || cm->shard_count != t->meta.shard_count || strcmp(cm->strategy, t->meta.strategy)) {
        if (t->rank == 0)
            ftk_warn("%s: %s; the gradients' error-feedback residuals start at zero (not bit for bit with an "
                     "uninterrupted run)",
                     ck, !theirs ? "the checkpoint holds no --compress-grads residuals"
                         : !mine ? "this run does not --compress-grads: the checkpoint's residuals are dropped"
                                 : "another shard count or strategy: the checkpoint's residuals are dropped");
        return 0;
    }
    ckpt_manifest_t man;
    int rc = some ? ckpt_open_some(ck, &man) : ckpt_open(ck, &man);
    hid_t f = rc < 0 ? -1 : ckpt_shard_open(ck, &man, shard_index(t->sh), 0);
    int n_units;
    const ckpt_unit_t *units = shard_units(t->sh, &n_units);
    int64_t most = 0;
    for (int u = 0; u < n_units; u++)
        most = units[u].padded > most ? units[u].padded : most;
    float *buf = f < 0 ? NULL : malloc((size_t)most * sizeof *buf);
    rc = f < 0 ? -1 : !buf ? (ftk_err_set("out of memory"), -1) : 0;
    for (int u = 0; rc == 0 && u < n_units; u++)
        if ((rc = ckpt_shard_read_residual(f, &man, u, buf)) == 0)
            rc = shard_set_residual(t->sh, u, buf);
    free(buf);
    if (f >= 0)
        h5_close(f);
    if (man.units || man.shards)
        ckpt_manifest_free(&man);
    return rc < 0 ? fail(t, FTK_EXIT_FAIL, "%s: %s", ck, ftk_err_msg()) : 0;
}

/* Reads checkpoint ck (some: a memory snapshot, which holds some shard files; ck is this
 * rank's) into the shards and the run's position. 0; read_checkpoint's codes (agreed); or
 * FTK_EXIT_FAIL where the state could not be set (agreed). */
static int load_checkpoint(trainer_t *t, const char *ck, int some)
{
    ckpt_meta_t *meta = &t->meta, cm;
    ckpt_state_t st;
    int n_units = t->cfg.num_hidden_layers + 2;
    int code = agree(t, read_checkpoint(t, ck, some, &cm, &st));
    if (code) {
        ckpt_state_free(&st, n_units);
        return code;
    }
    int rc = shard_set_state(t->sh, &st) < 0 ? fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg()) : 0;
    ckpt_state_free(&st, n_units);
    if (!rc)
        rc = resume_residuals(t, ck, some, &cm);
    if ((code = agree(t, rc)))
        return FTK_EXIT_FAIL;
    meta->step = cm.step;
    meta->tokens_seen = cm.tokens_seen;
    meta->epoch = cm.epoch;
    meta->rows_consumed = cm.rows_consumed;
    return 0;
}

/* --resume auto with memory snapshots: the newest complete one at least as new as the newest
 * checkpoint on disk (disk_step), read as a checkpoint; where there is none, or it does not
 * verify, the disk is used and that is said. Snapshots of other steps are removed. */
static void resume_memory(trainer_t *t, int64_t disk_step, int *found)
{
    int64_t k = -1, seen = -1, damaged = 0, bytes = 0;
    char dir[4096];
    double t0 = time_now();
    int rc = snapshot_find(t->snap, disk_step, t->wf, &k, &seen, &damaged, dir, &bytes);
    int code = agree(t, rc < 0 ? fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg()) : 0);
    const char *from = disk_step >= 0 ? "resuming from disk" : "starting from the initial weights (no checkpoint on disk)";
    if (damaged && t->rank == 0)
        ftk_warn("%lld memory snapshot%s or partner cop%s unreadable (a manifest refused, or a copy's header or size "
                 "wrong): passed over",
                 (long long)damaged, plural_s(damaged), damaged == 1 ? "y" : "ies");
    if (!code && k >= 0 && !(code = load_checkpoint(t, dir, 1))) {
        *found = 1;
        int64_t all = bytes;
        comm_allreduce_i64(t->world, &all, 1, COMM_SUM);
        ftk_info("resuming from the memory snapshot of step %lld of %lld (%.2f s; %.1f MB received from partner "
                 "nodes)",
                 (long long)k, (long long)t->meta.train.total_steps, time_now() - t0, (double)all / 1e6);
    } else if (code) {
        if (t->rank == 0)
            ftk_warn("the memory snapshot of step %lld cannot be used (%s); %s", (long long)k, ftk_err_msg(), from);
    } else if (seen >= 0)
        ftk_info("no complete memory snapshot %s (the newest held: step %lld); %s",
                 seen < disk_step ? "as new as the newest checkpoint" : "on the nodes", (long long)seen, from);
    snapshot_settle(t->snap, *found ? k : -1);
}

/* Settles on one checkpoint for every rank and loads it; *found = 0 when there is none. */
static int resume_from(trainer_t *t, int *found)
{
    char **cand = NULL;
    size_t n_cand = 0;
    int code = 0, damaged = 0, is_auto = !strcmp(t->o.resume, "auto");
    *found = 0;
    if (t->rank == 0) {
        if (is_auto) {
            cand = ckpt_list(t->o.out_dir, &n_cand);
        } else {
            char *c = ckpt_resolve(t->o.resume);
            if (!c)
                code = fail(t, FTK_EXIT_USAGE, "--resume: %s", ftk_err_msg());
            else if (!(cand = malloc(sizeof *cand))) {
                free(c);
                code = fail(t, FTK_EXIT_FAIL, "out of memory");
            } else
                cand[n_cand++] = c;
        }
    }
    if ((code = agree(t, code)))
        return code;
    int64_t n[2] = {(int64_t)n_cand, n_cand ? ckpt_step_name(cand[0]) : -1};
    comm_allreduce_i64(t->world, n, 2, COMM_MAX);
    if (t->snap && is_auto)
        resume_memory(t, n[1], found);
    for (int64_t i = 0; i < n[0] && !*found; i++) {
        char ck[4096] = "";
        if (t->rank == 0)
            snprintf(ck, sizeof ck, "%s", cand[i]);
        comm_bcast(t->world, ck, sizeof ck, 0);
        code = load_checkpoint(t, ck, 0);
        if (code == FTK_EXIT_VERIFY && is_auto) {
            ftk_warn("%s is damaged (%s)%s", ck, t->why, i + 1 < n[0] ? "; trying the one before" : "");
            code = 0;
            damaged++;
            continue;
        }
        if (code && code != FTK_EXIT_FAIL) {
            char m[sizeof t->why];
            snprintf(m, sizeof m, "%s", ftk_err_msg());
            ftk_err_set("cannot resume: %s", m);
            code = FTK_EXIT_USAGE;
        }
        if (code)
            break;
        *found = 1;
        ftk_info("resuming from %s (step %lld of %lld)", ck, (long long)t->meta.step,
                 (long long)t->meta.train.total_steps);
    }
    if (!code && !*found && damaged) {
        ftk_err_set("cannot resume: no checkpoint in %s verifies (every one is damaged; see above)", t->o.out_dir);
        code = FTK_EXIT_USAGE;
    }
    for (size_t i = 0; i < n_cand; i++)
        free(cand[i]);
    free(cand);
    return code;
}

int trainer_resume(trainer_t *t)
{
    int found = 0, code;
    if (t->snap && strcmp(t->o.resume, "auto"))
        snapshot_settle(t->snap, -1); /* another start than the snapshots' newest: not this run's */
    if (strcmp(t->o.resume, "none") && (code = resume_from(t, &found)))
        return code;
    if (!found) {
        double t0 = time_now();
        shard_load_stats_t st = {0};
        int rc = shard_load_weights(t->sh, t->wf, &st) < 0 ? -1 : t->be->sync(t->be);
        double dt = time_now() - t0;
        if ((code = agree(t, rc < 0 ? fail(t, FTK_EXIT_USAGE, "%s: %s", t->o.model_path, ftk_err_msg()) : 0)))
            return code;
        /* A 7B file is 13.5 GB: say how long it took (rank 0's part, before the ranks
         * agreed), and where the time went: the readers' CPU time (against the wall time:
         * how busy they were) and, where the weights go up to a device, the uploads and the
         * time after them until the next unit was read (the slower side of the two). */
        if (t->rank == 0) {
            char up[128] = "";
            if (!t->be->host_ptr)
                snprintf(up, sizeof up, "; uploads %.2f s, then reading %.2f s", st.upload_s,
                         st.wait_s);
            ftk_info("%s: weights loaded in %.2f s: %.2f GB read, %.2f GB/s (%d reading threads, %.2f s of CPU%s)",
                     t->o.model_path, dt, (double)st.bytes / 1e9, (double)st.bytes / 1e9 / (dt > 0 ? dt : 1e-9),
                     st.readers, st.read_cpu, up);
        }
        if ((code = agree(t, fault_point("train.weights-loaded") < 0 ? fail(t, FTK_EXIT_FAIL, "%s", ftk_err_msg()) : 0)))
            return code;
    }
    loader_order((uint64_t)t->meta.train.seed, t->meta.epoch, t->R, t->perm);
    return 0;
}
