/* ftk-reshard — a checkpoint of S shards rewritten as S' shards (another number of ranks,
 * or another strategy), streaming one unit at a time. */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "../engine/precision.h"
#include "../engine/strategy.h"
#include "../formats/checkpoint.h"
#include "../formats/metrics.h"
#include "../formats/rundir.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/progress.h"
#include "../libcommon/timer.h"

static const char *output, *strategy_opt, *precision_opt, *units_opt;
static int64_t ranks, group_size;
static int force;

/* Files open at once, whatever the shard counts: output shards written together (one batch)
 * and input shards kept open while they are read (a cache of the most recently used). */
#define RESHARD_BATCH 16
#define RESHARD_OPEN_IN 16

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"output", 'o', OPT_STR, &output, "DIR",
     "the new checkpoint: RUN/step-NNNNNNNN, or a run directory RUN (the step is the input's)"},
    {"ranks", 'n', OPT_I64, &ranks, "N",
     "ranks the checkpoint is for (required; at most 99999: shard files are numbered with five digits)",
     "1..99999"},
    {"strategy", 0, OPT_STR, &strategy_opt, "S", "full | grad-op | none | hybrid | hpz (default: the input's)"},
    {"shard-group-size", 0, OPT_I64, &group_size, "G",
     "hybrid: ranks per shard group, the shard count (default: the input's, if hybrid)", "0..99999"},
    {"precision", 0, OPT_STR, &precision_opt, "P",
     "fp32 | bf16-mixed | bf16-true: convert the checkpoint to this precision mode (default: the input's)"},
    {"units", 0, OPT_STR, &units_opt, "U",
     "block | group:M | size:BYTES: the unit of communication recorded for the resumed run (default: the "
     "input's; ftk-train --units overrides it; the arrays are the same under every policy)"},
    {"force", 'f', OPT_FLAG, &force, NULL, "replace an existing checkpoint at the output"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-reshard",
    .usage = "CHECKPOINT -o OUT --ranks N [--strategy S] [--shard-group-size G] [--precision P]",
    .summary = "Rewrites a training checkpoint (a step-NNNNNNNN directory, a run directory or its\n"
               "`latest` file) for another number of ranks or another sharding strategy: master\n"
               "weights, both AdamW moments, step, data-order state, seed and schedule carried over,\n"
               "new shard files, checksums and manifest. Every input shard's checksum is verified\n"
               "before it is used (and every dataset's where it is read whole). Streams one unit (a\n"
               "transformer block, the embedding or the head) of one array at a time and writes the\n"
               "new shards 16 files at a time, keeping at most 16 input files open, so memory stays\n"
               "near the largest unit's size and open files under 40 whatever the model and the rank\n"
               "counts (99999 ranks of a tiny model: 34 MB; the time grows with the number of files).\n"
               "Writes under a hidden name, fsyncs, renames, then points RUN/latest at the new\n"
               "checkpoint, like ftk-train.\n"
               "The shard count is N (hybrid: G, one replica group's). ftk-train --resume also\n"
               "reshards on load; this tool is for moving a checkpoint between machines or layouts.\n"
               "It takes the output run directory's lock (RUN/.lock) as ftk-train does, so that\n"
               "neither writes into a run the other is writing (exit 2 while another holds it).\n"
               "--precision converts between precision modes on the way (at any shard count, the\n"
               "same one included): fp32 <-> bf16-mixed rewrites only the manifest's precision (both\n"
               "store float32 weights and moments, the same arrays); to bf16-true narrows the weights\n"
               "and both moments to bfloat16, rounding to nearest even (what PyTorch's .to() does);\n"
               "from bf16-true widens them to float32 exactly, so bf16-true -> fp32 -> bf16-true gives\n"
               "back the same bytes.",
    .epilog = "Exit status: 0 written; 1 runtime failure (I/O, memory); 2 bad usage or a damaged or\n"
              "unreadable input (the message names the file and dataset; nothing is written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = 1,
};

/* RUN/step-NNNNNNNN or RUN: the run directory (checked, not yet created), or NULL with
 * the error printed. */
static char *run_dir_of(const char *out, int64_t step)
{
    char *a = strdup(out), *b = strdup(out), want[32];
    if (!a || !b) {
        free(a);
        free(b);
        ftk_error("out of memory");
        return NULL;
    }
    size_t n = strlen(a);
    while (n > 1 && a[n - 1] == '/')
        a[--n] = 0, b[n] = 0;
    const char *base = basename(b);
    snprintf(want, sizeof want, "step-%08lld", (long long)step);
    char *run;
    if (!strncmp(base, "step-", 5) && strlen(base) == 13 && strspn(base + 5, "0123456789") == 8) {
        if (strcmp(base, want)) {
            ftk_error("-o %s: the checkpoint is of step %lld, so its directory is %s", out, (long long)step, want);
            free(a);
            free(b);
            return NULL;
        }
        run = strdup(dirname(a));
    } else {
        run = strdup(a);
    }
    free(a);
    free(b);
    if (!run) {
        ftk_error("out of memory");
        return NULL;
    }
    struct stat sb;
    if (stat(run, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        ftk_error("%s: not a directory", run);
        free(run);
        return NULL;
    }
    char *final = malloc(strlen(run) + 32);
    if (final) {
        sprintf(final, "%s/%s", run, want);
        if (stat(final, &sb) == 0 && !force) {
            ftk_error("%s exists (use --force to replace it)", final);
            free(final);
            free(run);
            return NULL;
        }
        free(final);
    }
    return run;
}

/* The run's history goes with its checkpoint into a new run directory: metrics.jsonl's
 * records up to the checkpoint's step (so elapsed_s and the curves continue there) and the
 * kept options (options.yaml: `ftk-train -o NEW --resume auto` needs nothing else). Only
 * where the new run has none of its own. Written before the checkpoint is committed: a
 * failure (a full disk) fails the reshard, and carried[] (paths, malloc'd; NULL where
 * nothing was written) says what to remove then. Returns 0 or -1 with ftk_err_msg() set. */
static char *carried[2];
static int carry_history(const char *ckpt_dir, const char *run, int64_t step)
{
    char *c = strdup(ckpt_dir);
    if (!c) {
        ftk_err_set("out of memory");
        return -1;
    }
    char src_run[4096], src[4200], dst[4200];
    snprintf(src_run, sizeof src_run, "%s", dirname(c));
    free(c);
    char *a = realpath(src_run, NULL), *b = realpath(run, NULL);
    int same = a && b && !strcmp(a, b);
    free(a);
    free(b);
    if (same)
        return 0;
    static const char *const names[] = {"metrics.jsonl", "options.yaml"};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", src_run, names[i]);
        snprintf(dst, sizeof dst, "%s/%s", run, names[i]);
        struct stat sb;
        if (stat(dst, &sb) == 0 || stat(src, &sb) != 0)
            continue;
        buf_t in = {0}, out = {0};
        int rc = buf_read_small(&in, src, (size_t)1 << 30, BUF_NOFOLLOW);
        if (rc == 0)
            rc = i == 0 ? metrics_trim(&out, &in, step, NULL) : buf_append(&out, in.data, in.len);
        if (rc == 0 && (rc = atomic_write_file(dst, out.data, out.len)) == 0)
            carried[i] = strdup(dst);
        buf_free(&in);
        buf_free(&out);
        if (rc < 0) {
            ftk_err_prefix("the run's history (%s): ", names[i]);
            return -1;
        }
    }
    return 0;
}

/* A failed reshard leaves none of the history it carried (remove); else it is kept. */
static void carried_done(int remove)
{
    for (int i = 0; i < 2; i++) {
        if (carried[i] && remove)
            unlink(carried[i]);
        free(carried[i]);
        carried[i] = NULL;
    }
}

/* One reshard: the input checkpoint, the new layout, the output run directory and what
 * writing it holds. */
typedef struct {
    ckpt_manifest_t man; /* the input's */
    char *dir;           /* the input checkpoint's directory */
    ckpt_meta_t meta;    /* the output's */
    int64_t S2;          /* its shard count */
    dtype_t dt2;         /* its arrays' type */
    size_t es;
    ckpt_unit_t *units2;
    int n2;
    char *run; /* the output's run directory */
    int made_run, lock_fd;
    char *lock_path; /* registered for the signal handler while made_run */
    int64_t B;       /* output shards written together */
    ckpt_shard_cache_t *in;
    ckpt_shard_writer_t **out;
    ckpt_shard_sum_t *sums;
    char *buf;
    uint64_t in_bytes, out_bytes;
    ckpt_writer_t w;
} reshard_t;

/* The new layout from the options and the input's: strategy, shard count, precision and
 * units policy into r->meta and r->S2. 0, or FTK_EXIT_USAGE with the error printed. */
static int new_layout(reshard_t *r)
{
    const ckpt_meta_t *in = &r->man.meta;
    ckpt_meta_t *meta = &r->meta;
    *meta = *in;
    if (meta->compress_grads[0]) { /* residuals are whole units per rank: no slice of them is another layout's */
        ftk_warn("%s: the ranks' --compress-grads residuals are not carried over (the resumed run starts them at zero)",
                 r->dir);
        meta->compress_grads[0] = 0;
    }
    strategy_t strat;
    if (strategy_parse(strategy_opt ? strategy_opt : in->strategy, &strat) < 0) {
        ftk_error("--strategy %s: expected full, grad-op, none, hybrid or hpz", strategy_opt ? strategy_opt : in->strategy);
        return FTK_EXIT_USAGE;
    }
    strategy_use_t use = strategy_use(strat);
    use.group_size = group_size;
    if (strategy_check(&use) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    r->S2 = ranks;
    if (strategy_traits(strat)->replicas) {
        int64_t g = group_size ? group_size : !strcmp(in->strategy, "hybrid") ? in->shard_count : 0;
        if (g < 1 || ranks % g) {
            ftk_error("hybrid on %lld ranks: %s", (long long)ranks,
                      g < 1 ? "give --shard-group-size (the input is not hybrid)"
                            : "--shard-group-size must divide --ranks");
            return FTK_EXIT_USAGE;
        }
        r->S2 = g;
    }
    snprintf(meta->strategy, sizeof meta->strategy, "%s", strategy_name(strat));
    meta->world_size = ranks;
    meta->shard_count = r->S2;
    precision_t prec;
    if (precision_opt && precision_parse(precision_opt, &prec) < 0) {
        ftk_error("--precision %s: expected fp32, bf16-mixed or bf16-true", precision_opt);
        return FTK_EXIT_USAGE;
    }
    if (precision_opt)
        snprintf(meta->precision, sizeof meta->precision, "%s", precision_name(prec));
    if (units_opt) {
        int uk, n_units = r->man.n_units;
        int64_t ua;
        if (ckpt_units_policy_parse(units_opt, &uk, &ua) < 0) {
            ftk_error("--units %s: %s", units_opt, ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
        if (uk == CKPT_UNITS_GROUP && ua > n_units - 2) {
            ftk_error("--units %s: the model has %d block%s", units_opt, n_units - 2, n_units == 3 ? "" : "s");
            return FTK_EXIT_USAGE;
        }
        ckpt_units_policy_name(uk, ua, meta->units_policy);
    }
    /* Each unit is read as the output's type: ckpt_read_range converts (exactly when widening). */
    r->dt2 = ckpt_state_dtype(meta->precision);
    r->es = dtype_size(r->dt2);
    return 0;
}

/* The input cache, the output writers and sums, one buffer for the largest unit of either
 * layout. 0, or FTK_EXIT_FAIL with the error printed. */
static int alloc_buffers(reshard_t *r)
{
    r->B = r->S2 < RESHARD_BATCH ? r->S2 : RESHARD_BATCH;
    r->in = ckpt_shard_cache_new(r->dir, &r->man, RESHARD_OPEN_IN);
    r->out = calloc((size_t)r->B, sizeof *r->out);
    r->sums = calloc((size_t)r->S2, sizeof *r->sums);
    int64_t maxpad = 0;
    for (int u = 0; u < r->man.n_units; u++) {
        maxpad = r->man.units[u].padded > maxpad ? r->man.units[u].padded : maxpad;
        maxpad = r->units2[u].padded > maxpad ? r->units2[u].padded : maxpad;
    }
    r->buf = malloc((size_t)maxpad * r->es);
    if (!r->in || !r->out || !r->sums || !r->buf) {
        ftk_error("out of memory");
        return FTK_EXIT_FAIL;
    }
    return 0;
}

/* Verify before trusting: every input file's checksum, size and attributes, one file open
 * at a time (then every dataset's checksum where it is read whole, its padding). 0, or
 * FTK_EXIT_USAGE with the error printed. */
static int verify_input(reshard_t *r)
{
    progress_t p;
    int64_t S = r->man.meta.shard_count;
    for (int64_t i = 0; i < S; i++)
        r->in_bytes += r->man.shards[i].bytes;
    progress_start(&p, "verifying", (int64_t)r->in_bytes, "bytes");
    uint64_t seen = 0;
    for (int64_t i = 0; i < S; i++) {
        hid_t f = ckpt_shard_open(r->dir, &r->man, i, 1);
        if (f < 0) {
            progress_done(&p);
            ftk_error("%s", ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
        h5_close(f);
        seen += r->man.shards[i].bytes;
        progress_update(&p, (int64_t)seen);
    }
    progress_done(&p);
    return 0;
}

/* The output run directory made where it is missing (only now: a refused input leaves
 * nothing) and its lock taken, as ftk-train takes it: a trainer of this run must neither
 * write beside us nor take our temporary for a dead writer's and remove it. 0, or an exit
 * status with the error printed. */
static int take_run_dir(reshard_t *r)
{
    struct stat sb;
    if (stat(r->run, &sb) < 0) {
        if (mkdir(r->run, 0777) < 0) {
            ftk_error("%s: %s", r->run, strerror(errno));
            return FTK_EXIT_FAIL;
        }
        r->made_run = 1; /* removed again on failure or a signal, unless a checkpoint got into it */
        atomic_register_dir(r->run);
        if ((r->lock_path = rundir_lock_path(r->run))) /* the lock file goes with it */
            atomic_register_file(r->lock_path);
    }
    int made = r->made_run;
    r->lock_fd = rundir_claim(r->run, &r->made_run);
    if (r->lock_fd == RUNDIR_NO_LOCKS) {
        ftk_warn("%s; going on without the lock: make sure no ftk-train writes to %s", ftk_err_msg(), r->run);
        return 0;
    }
    if (r->lock_fd >= 0)
        return 0;
    ftk_error("%s", ftk_err_msg());
    if (made && !r->made_run) { /* the other writer's run now, even if our mkdir made it */
        atomic_unregister_dir(r->run);
        if (r->lock_path)
            atomic_unregister_file(r->lock_path);
    }
    return r->lock_fd == RUNDIR_BUSY || r->lock_fd == RUNDIR_REFUSED ? FTK_EXIT_USAGE : FTK_EXIT_FAIL;
}

/* The new shards [j0, j0 + nb) written whole: each unit of each array is read for the
 * batch's slices only (ckpt_read_reslice), so every input element is read once in all.
 * 0, or an exit status with the error printed (the caller releases the writers). */
static int write_batch(reshard_t *r, int64_t j0, int64_t nb, progress_t *p, int64_t *done_arrays)
{
    for (int64_t j = 0; j < nb; j++)
        if (!(r->out[j] = ckpt_shard_create(r->w.dir, &r->meta, r->units2, r->n2, j0 + j))) {
            progress_done(p);
            ftk_error("%s", ftk_err_msg());
            return FTK_EXIT_FAIL;
        }
    for (int k = 0; k < CKPT_KINDS; k++) {
        for (int u = 0; u < r->man.n_units; u++) {
            int64_t part = r->units2[u].padded / r->S2;
            if (ckpt_read_reslice(r->in, k, u, j0 * part, (j0 + nb) * part, j0 + nb == r->S2, r->dt2, r->buf) < 0) {
                progress_done(p);
                ftk_error("%s: %s", r->dir, ftk_err_msg());
                return FTK_EXIT_USAGE;
            }
            for (int64_t j = 0; j < nb; j++)
                if (ckpt_shard_put(r->out[j], k, u, r->buf + (size_t)(j * part) * r->es) < 0) {
                    progress_done(p);
                    ftk_error("%s", ftk_err_msg());
                    return FTK_EXIT_FAIL;
                }
            progress_update(p, ++*done_arrays);
        }
    }
    hid_t tok = j0 == 0 ? ckpt_shard_cache_get(r->in, 0) : -1;
    if ((j0 == 0 && tok < 0) || ckpt_shard_finish_many(r->out, nb, tok, r->sums + j0) < 0) {
        progress_done(p);
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL; /* the caller releases out[] where the tokenizer could not be had */
    }
    for (int64_t j = 0; j < nb; j++)
        r->out_bytes += r->sums[j0 + j].bytes;
    return 0;
}

/* Every new shard, in batches of B files. */
static int write_shards(reshard_t *r)
{
    progress_t p;
    progress_start(&p, "resharding", (int64_t)CKPT_KINDS * r->man.n_units * ((r->S2 + r->B - 1) / r->B), "arrays");
    int64_t done_arrays = 0;
    for (int64_t j0 = 0; j0 < r->S2; j0 += r->B) {
        int rc = write_batch(r, j0, r->S2 - j0 < r->B ? r->S2 - j0 : r->B, &p, &done_arrays);
        if (rc)
            return rc;
    }
    progress_done(&p);
    return 0;
}

/* The writers of a failed batch released, the hidden directory removed. */
static void abort_shards(reshard_t *r)
{
    for (int64_t j = 0; j < r->B; j++)
        if (r->out[j]) {
            ckpt_shard_sum_t dummy;
            ckpt_shard_finish(r->out[j], -1, &dummy);
            r->out[j] = NULL;
        }
    ckpt_abort(&r->w);
}

/* The run's history, then the manifest and `latest`: 0, FTK_EXIT_FAIL with the writer
 * still to abort (abort_shards), or -1 when the commit itself failed (nothing left to
 * abort). *final_name: the checkpoint's name (malloc'd, or NULL). */
static int commit(reshard_t *r, char **final_name)
{
    *final_name = NULL;
    if (carry_history(r->dir, r->run, r->meta.step) < 0) {
        ftk_error("%s", ftk_err_msg());
        carried_done(1);
        return FTK_EXIT_FAIL;
    }
    *final_name = strdup(r->w.name);
    if (ckpt_commit(&r->w, &r->meta, &r->man.cfg, r->units2, r->n2, r->sums, 0) < 0) {
        ftk_error("%s", ftk_err_msg());
        /* committed all the same when only `latest` failed: the history stays with it */
        char committed[8192];
        struct stat csb;
        snprintf(committed, sizeof committed, "%s/%s", r->run, *final_name ? *final_name : "");
        carried_done(!*final_name || stat(committed, &csb) != 0);
        return -1;
    }
    carried_done(0);
    return 0;
}

static void report(const reshard_t *r, const char *final_name, double t0)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t big = 0, S = r->man.meta.shard_count;
    for (int u = 0; u < r->man.n_units; u++)
        big = r->man.units[u].length > big ? r->man.units[u].length : big;
    double secs = time_now() - t0;
    const ckpt_meta_t *a = &r->man.meta, *b = &r->meta;
    ftk_info("%s/%s: step %lld, %lld shard%s (%s, %lld rank%s, %s) -> %lld (%s, %lld rank%s, %s); %.1f MB read, "
             "%.1f MB written in %.2f s; peak memory %.1f MB (largest unit %.1f MB)",
             r->run, final_name ? final_name : "", (long long)b->step, (long long)S, S == 1 ? "" : "s", a->strategy,
             (long long)a->world_size, a->world_size == 1 ? "" : "s", a->precision, (long long)r->S2, b->strategy,
             (long long)ranks, ranks == 1 ? "" : "s", b->precision, (double)r->in_bytes / 1e6,
             (double)r->out_bytes / 1e6, secs, (double)ru.ru_maxrss / 1e3, (double)big * (double)r->es / 1e6);
}

/* Everything released; a run directory we made is removed again after a failure, only
 * when nothing but our lock is left: a committed checkpoint whose `latest` failed stays
 * (the lock file is removed while it is held, as ftk-train does). */
static void release(reshard_t *r, int rc)
{
    if (r->made_run) {
        atomic_unregister_dir(r->run);
        if (r->lock_path)
            atomic_unregister_file(r->lock_path);
        if (rc != FTK_EXIT_OK)
            rundir_remove_bare(r->run);
    }
    if (r->lock_fd >= 0)
        close(r->lock_fd);
    free(r->lock_path);
    ckpt_shard_cache_free(r->in);
    free(r->out);
    free(r->sums);
    free(r->buf);
    free(r->units2);
    free(r->run);
}

/* Writes the new checkpoint once the input is verified and the run directory is ours. */
static int reshard(reshard_t *r, double t0)
{
    int rc;
    if ((rc = alloc_buffers(r)) || (rc = verify_input(r)) || (rc = take_run_dir(r)))
        return rc;
    if (ckpt_begin(&r->w, r->run, r->meta.step) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    char *final_name = NULL;
    if (!(rc = write_shards(r)) && (rc = commit(r, &final_name)) < 0) {
        free(final_name);
        return FTK_EXIT_FAIL;
    }
    if (rc) {
        abort_shards(r);
        return rc;
    }
    report(r, final_name, t0);
    free(final_name);
    return FTK_EXIT_OK;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-reshard");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    if (!output || ranks < 1 || ranks > 99999 || group_size < 0) {
        ftk_error("%s", !output ? "--output is required" : "need --ranks 1..99999 (and --shard-group-size >= 1)");
        return FTK_EXIT_USAGE;
    }
    reshard_t r = {.lock_fd = -1};
    if (!(r.dir = ckpt_open_path(pos[0], &r.man))) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if ((rc = new_layout(&r)) == 0 && ckpt_units(&r.man.cfg, r.S2, &r.units2, &r.n2) < 0) {
        ftk_error("%s", ftk_err_msg());
        rc = FTK_EXIT_FAIL;
    }
    if (rc == 0 && !(r.run = run_dir_of(output, r.meta.step)))
        rc = FTK_EXIT_USAGE;
    if (rc == 0) {
        atomic_install_signal_cleanup();
        rc = reshard(&r, time_now());
    }
    release(&r, rc);
    ckpt_manifest_free(&r.man);
    free(r.dir);
    return rc;
}
