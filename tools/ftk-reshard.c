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
    ckpt_manifest_t man;
    char *dir = ckpt_open_path(pos[0], &man);
    if (!dir) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }

    /* The new layout. */
    ckpt_meta_t meta = man.meta;
    if (meta.compress_grads[0]) { /* residuals are whole units per rank: no slice of them is another layout's */
        ftk_warn("%s: the ranks' --compress-grads residuals are not carried over (the resumed run starts them at zero)",
                 dir);
        meta.compress_grads[0] = 0;
    }
    strategy_t strat;
    if (strategy_parse(strategy_opt ? strategy_opt : man.meta.strategy, &strat) < 0) {
        ftk_error("--strategy %s: expected full, grad-op, none, hybrid or hpz", strategy_opt ? strategy_opt : man.meta.strategy);
        goto usage;
    }
    strategy_use_t use = strategy_use(strat);
    use.group_size = group_size;
    if (strategy_check(&use) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto usage;
    }
    int64_t S2 = ranks;
    if (strategy_traits(strat)->replicas) {
        int64_t g = group_size ? group_size : !strcmp(man.meta.strategy, "hybrid") ? man.meta.shard_count : 0;
        if (g < 1 || ranks % g) {
            ftk_error("hybrid on %lld ranks: %s", (long long)ranks,
                      g < 1 ? "give --shard-group-size (the input is not hybrid)"
                            : "--shard-group-size must divide --ranks");
            goto usage;
        }
        S2 = g;
    }
    snprintf(meta.strategy, sizeof meta.strategy, "%s", strategy_name(strat));
    meta.world_size = ranks;
    meta.shard_count = S2;
    precision_t prec;
    if (precision_opt && precision_parse(precision_opt, &prec) < 0) {
        ftk_error("--precision %s: expected fp32, bf16-mixed or bf16-true", precision_opt);
        goto usage;
    }
    if (precision_opt)
        snprintf(meta.precision, sizeof meta.precision, "%s", precision_name(prec));
    if (units_opt) {
        int uk;
        int64_t ua;
        if (ckpt_units_policy_parse(units_opt, &uk, &ua) < 0) {
            ftk_error("--units %s: %s", units_opt, ftk_err_msg());
            goto usage;
        }
        if (uk == CKPT_UNITS_GROUP && ua > man.n_units - 2) {
            ftk_error("--units %s: the model has %d block%s", units_opt, man.n_units - 2, man.n_units == 3 ? "" : "s");
            goto usage;
        }
        ckpt_units_policy_name(uk, ua, meta.units_policy);
    }
    /* Each unit is read as the output's type: ckpt_read_unit converts (exactly when widening). */
    dtype_t dt2 = ckpt_state_dtype(meta.precision);
    size_t es = dtype_size(dt2);
    ckpt_unit_t *units2 = NULL;
    int n2;
    if (ckpt_units(&man.cfg, S2, &units2, &n2) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto fail_early;
    }
    char *run = run_dir_of(output, meta.step);
    if (!run) {
        free(units2);
        goto usage;
    }
    atomic_install_signal_cleanup();
    int made_run = 0, lock_fd = -1;
    char *lock_path = NULL;
    double t0 = time_now();
    int64_t S = man.meta.shard_count;
    int64_t B = S2 < RESHARD_BATCH ? S2 : RESHARD_BATCH;
    ckpt_shard_cache_t *in = ckpt_shard_cache_new(dir, &man, RESHARD_OPEN_IN);
    ckpt_shard_writer_t **out = calloc((size_t)B, sizeof *out);
    ckpt_shard_sum_t *sums = calloc((size_t)S2, sizeof *sums);
    int64_t maxpad = 0;
    for (int u = 0; u < man.n_units; u++) {
        maxpad = man.units[u].padded > maxpad ? man.units[u].padded : maxpad;
        maxpad = units2[u].padded > maxpad ? units2[u].padded : maxpad;
    }
    char *buf = malloc((size_t)maxpad * es);
    if (!in || !out || !sums || !buf) {
        ftk_error("out of memory");
        rc = FTK_EXIT_FAIL;
        goto done;
    }

    /* Verify before trusting: every input file's checksum, size and attributes, one file
     * open at a time (then every dataset's checksum where it is read whole, its padding). */
    progress_t p;
    uint64_t in_bytes = 0;
    for (int64_t i = 0; i < S; i++)
        in_bytes += man.shards[i].bytes;
    progress_start(&p, "verifying", (int64_t)in_bytes, "bytes");
    uint64_t seen = 0;
    for (int64_t i = 0; i < S; i++) {
        hid_t f = ckpt_shard_open(dir, &man, i, 1);
        if (f < 0) {
            progress_done(&p);
            ftk_error("%s", ftk_err_msg());
            rc = FTK_EXIT_USAGE;
            goto done;
        }
        h5_close(f);
        seen += man.shards[i].bytes;
        progress_update(&p, (int64_t)seen);
    }
    progress_done(&p);

    ckpt_writer_t w;
    struct stat sb;
    if (stat(run, &sb) < 0) { /* only now: a refused input leaves nothing */
        if (mkdir(run, 0777) < 0) {
            ftk_error("%s: %s", run, strerror(errno));
            rc = FTK_EXIT_FAIL;
            goto done;
        }
        made_run = 1; /* removed again on failure or a signal, unless a checkpoint got into it */
        atomic_register_dir(run);
        if ((lock_path = malloc(strlen(run) + 8))) { /* the lock file goes with it */
            sprintf(lock_path, "%s/.lock", run);
            atomic_register_file(lock_path);
        }
    }
    /* One writer per run directory, as ftk-train: a trainer of this run must neither
     * write beside us nor take our temporary for a dead writer's and remove it. */
    lock_fd = ckpt_lock_run(run);
    if (lock_fd == -2) {
        ftk_warn("%s; going on without the lock: make sure no ftk-train writes to %s", ftk_err_msg(), run);
    } else if (lock_fd < 0) {
        ftk_error("%s", ftk_err_msg());
        rc = lock_fd == -1 || lock_fd == -4 ? FTK_EXIT_USAGE : FTK_EXIT_FAIL;
        if (lock_fd == -1 && made_run) { /* another writer holds it: its run now, even if our mkdir made it */
            atomic_unregister_dir(run);
            if (lock_path)
                atomic_unregister_file(lock_path);
            made_run = 0;
        }
        goto done;
    }
    if (ckpt_begin(&w, run, meta.step) < 0) {
        ftk_error("%s", ftk_err_msg());
        rc = FTK_EXIT_FAIL;
        goto done;
    }
    rc = FTK_EXIT_FAIL;
    /* The new shards in batches of B files [j0, j0 + nb): each unit of each array is read
     * for the batch's slices only, so every input element is still read once in all. */
    progress_start(&p, "resharding", (int64_t)CKPT_KINDS * man.n_units * ((S2 + B - 1) / B), "arrays");
    uint64_t out_bytes = 0;
    int64_t done_arrays = 0;
    for (int64_t j0 = 0; j0 < S2; j0 += B) {
        int64_t nb = S2 - j0 < B ? S2 - j0 : B;
        for (int64_t j = 0; j < nb; j++)
            if (!(out[j] = ckpt_shard_create(w.dir, &meta, units2, n2, j0 + j))) {
                progress_done(&p);
                ftk_error("%s", ftk_err_msg());
                goto abort;
            }
        for (int k = 0; k < CKPT_KINDS; k++) {
            for (int u = 0; u < man.n_units; u++) {
                int64_t part = units2[u].padded / S2, old = man.units[u].padded;
                int64_t a = j0 * part, b = (j0 + nb) * part, last = j0 + nb == S2;
                /* The batch's elements that the input holds; the last batch also reads the
                 * old padding past the new one, to check that it is zero. */
                int64_t end = last && old > b ? old : b < old ? b : old;
                if (end > a && ckpt_read_range(in, k, u, a, end - a, dt2, buf) < 0) {
                    progress_done(&p);
                    ftk_error("%s: %s", dir, ftk_err_msg());
                    rc = FTK_EXIT_USAGE;
                    goto abort;
                }
                /* Elements past the old padding (a larger new padding) are zero. */
                if (b > old)
                    memset(buf + (size_t)((old > a ? old : a) - a) * es, 0, (size_t)(b - (old > a ? old : a)) * es);
                for (int64_t j = 0; j < nb; j++)
                    if (ckpt_shard_put(out[j], k, u, buf + (size_t)(j * part) * es) < 0) {
                        progress_done(&p);
                        ftk_error("%s", ftk_err_msg());
                        goto abort;
                    }
                progress_update(&p, ++done_arrays);
            }
        }
        hid_t tok = j0 == 0 ? ckpt_shard_cache_get(in, 0) : -1;
        if ((j0 == 0 && tok < 0) || ckpt_shard_finish_many(out, nb, tok, sums + j0) < 0) {
            progress_done(&p);
            ftk_error("%s", ftk_err_msg());
            goto abort; /* releases out[] where the tokenizer could not be had */
        }
        for (int64_t j = 0; j < nb; j++)
            out_bytes += sums[j0 + j].bytes;
    }
    progress_done(&p);
    if (carry_history(dir, run, meta.step) < 0) {
        ftk_error("%s", ftk_err_msg());
        carried_done(1);
        goto abort;
    }
    char *final_name = strdup(w.name);
    if (ckpt_commit(&w, &meta, &man.cfg, units2, n2, sums, 0) < 0) {
        ftk_error("%s", ftk_err_msg());
        /* committed all the same when only `latest` failed: the history stays with it */
        char committed[8192];
        struct stat csb;
        snprintf(committed, sizeof committed, "%s/%s", run, final_name ? final_name : "");
        carried_done(!final_name || stat(committed, &csb) != 0);
        free(final_name);
        goto done;
    }
    carried_done(0);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t big = 0;
    for (int u = 0; u < man.n_units; u++)
        big = man.units[u].length > big ? man.units[u].length : big;
    double secs = time_now() - t0;
    ftk_info("%s/%s: step %lld, %lld shard%s (%s, %lld rank%s, %s) -> %lld (%s, %lld rank%s, %s); %.1f MB read, "
             "%.1f MB written in %.2f s; peak memory %.1f MB (largest unit %.1f MB)",
             run, final_name ? final_name : "", (long long)meta.step, (long long)S, S == 1 ? "" : "s",
             man.meta.strategy, (long long)man.meta.world_size, man.meta.world_size == 1 ? "" : "s",
             man.meta.precision, (long long)S2, meta.strategy, (long long)ranks, ranks == 1 ? "" : "s",
             meta.precision, (double)in_bytes / 1e6, (double)out_bytes / 1e6, secs, (double)ru.ru_maxrss / 1e3,
             (double)big * (double)es / 1e6);
    free(final_name);
    rc = FTK_EXIT_OK;
    goto done;
abort:
    for (int64_t j = 0; j < B; j++)
        if (out[j]) {
            ckpt_shard_sum_t dummy;
            ckpt_shard_finish(out[j], -1, &dummy);
            out[j] = NULL;
        }
    ckpt_abort(&w);
done:
    if (made_run) {
        atomic_unregister_dir(run);
        if (lock_path)
            atomic_unregister_file(lock_path);
        /* only when nothing but our lock is left: a committed checkpoint whose `latest`
         * failed stays (the lock file is removed while it is held, as ftk-train does) */
        if (rc != FTK_EXIT_OK && lock_path) {
            int only_lock = 1;
            DIR *d = opendir(run);
            struct dirent *e;
            while (d && (e = readdir(d)))
                only_lock &= !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".lock");
            if (d)
                closedir(d);
            if (d && only_lock)
                unlink(lock_path);
        }
        if (rc != FTK_EXIT_OK)
            rmdir(run);
    }
    if (lock_fd >= 0)
        close(lock_fd);
    free(lock_path);
    ckpt_shard_cache_free(in);
    free(out);
    free(sums);
    free(buf);
    free(units2);
    free(run);
    ckpt_manifest_free(&man);
    free(dir);
    return rc;
usage:
    ckpt_manifest_free(&man);
    free(dir);
    return FTK_EXIT_USAGE;
fail_early:
    ckpt_manifest_free(&man);
    free(dir);
    return FTK_EXIT_FAIL;
}
