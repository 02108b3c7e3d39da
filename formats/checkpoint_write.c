/* checkpoint_write.c — writing a checkpoint (checkpoint.h): shard files, config.json and the
 * sealed manifest, the commit, `latest` and the keep policy. */
#include "checkpoint.h"
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/path.h"
#include "../libcommon/version.h"
#include "h5.h"
#include "json.h"

/* fclose() releases the stream even when it fails (a full disk shows up at the flush), so
 * it is called exactly once on every path. */
static int write_text(const char *path, const buf_t *b)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    int e = fwrite(b->data, 1, b->len, f) != b->len ? errno : 0;
    if (fclose(f) != 0 && !e)
        e = errno;
    if (e) {
        ftk_err_set("%s: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

typedef struct {
    hid_t dst;
} copy_tok_t;

static int copy_tok(const char *name, const void *data, size_t len, void *ctx)
{
    return weights_put_file(((copy_tok_t *)ctx)->dst, name, data, len) < 0 ? -1 : 0;
}

struct ckpt_shard_writer {
    char *path;
    hid_t f, g;
    const ckpt_unit_t *units;
    int n_units, kind, unit; /* the next array expected */
    int64_t S;
    dtype_t dt;
    int failed, residual; /* residual: /grad_residual follows the three kinds */
};

ckpt_shard_writer_t *ckpt_shard_create(const char *dir, const ckpt_meta_t *meta, const ckpt_unit_t *units,
                                       int n_units, int64_t index)
{
    char name[32], hex[17];
    dtype_t dt = ckpt_state_dtype(meta->precision);
    if (dt == DT_INVALID) {
        ftk_err_set("internal: checkpoint precision \"%s\" (fp32, bf16-mixed or bf16-true)", meta->precision);
        return NULL;
    }
    ckpt_shard_writer_t *w = calloc(1, sizeof *w);
    if (!w) {
        ftk_err_set("out of memory");
        return NULL;
    }
    ckpt_shard_name(name, index, meta->shard_count);
    w->g = -1;
    w->units = units;
    w->n_units = n_units;
    w->S = meta->shard_count;
    w->dt = dt;
    w->residual = meta->compress_grads[0] != 0;
    if (!(w->path = ckpt_join(dir, name)) || ckpt_units_hash(units, n_units, hex) < 0) {
        free(w->path);
        free(w);
        return NULL;
    }
    if ((w->f = h5_create(w->path, CKPT_SHARD_FORMAT, CKPT_VERSION)) < 0) {
        free(w->path);
        free(w);
        return NULL;
    }
    if (h5_attr_set_i64(w->f, "shard_index", index + 1) | h5_attr_set_i64(w->f, "shard_count", meta->shard_count) |
        h5_attr_set_i64(w->f, "step", meta->step) | h5_attr_set_str(w->f, "units_xxh3", hex) |
        h5_attr_set_str(w->f, "ftk_version", FTK_VERSION)) {
        ftk_err_prefix("%s: ", w->path);
        w->failed = 1;
    }
    return w;
}

static int shard_put(ckpt_shard_writer_t *w, int kind, int unit, const void *data);

int ckpt_shard_put(ckpt_shard_writer_t *w, int kind, int unit, const void *data)
{
    if (w->failed)
        return -1;
    int rc = shard_put(w, kind, unit, data);
    if (rc == 0 && fault_point("ckpt.shard-put") < 0) {
        w->failed = 1;
        rc = -1;
    }
    if (rc < 0)
        ftk_err_prefix("%s: ", w->path);
    return rc;
}

static int shard_put(ckpt_shard_writer_t *w, int kind, int unit, const void *data)
{
    if (kind != w->kind || unit != w->unit || kind >= CKPT_KINDS) {
        ftk_err_set("internal: shard array %d/%d written out of order", kind, unit);
        w->failed = 1;
        return -1;
    }
    if (unit == 0 && (w->g = h5_group_create(w->f, ckpt_kind_names[kind])) < 0) {
        w->failed = 1;
        return -1;
    }
    hsize_t dims[1] = {(hsize_t)(w->units[unit].padded / w->S)};
    /* A stream rather than h5w_write_tensor() for the bf16 marker; for float32 the two
     * make the same bytes. */
    h5w_stream_t *s = h5w_open(w->g, w->units[unit].name, weights_h5type(w->dt), 1, dims, NULL);
    if (!s || (w->dt == DT_BF16 && h5_attr_set_str(h5w_dataset(s), "dtype", "bfloat16") < 0))
        w->failed = 1;
    if (s) {
        h5w_append(s, data, dims[0]);
        if (h5w_close(s, NULL) < 0)
            w->failed = 1;
    }
    if (++w->unit == w->n_units) {
        H5Gclose(w->g);
        w->g = -1;
        w->unit = 0;
        w->kind++;
    }
    return w->failed ? -1 : 0;
}

int ckpt_shard_put_residual(ckpt_shard_writer_t *w, int unit, const float *data)
{
    if (w->failed)
        return -1;
    if (!w->residual || w->kind != CKPT_KINDS || unit != w->unit) {
        ftk_err_set("internal: residual %d written out of order", unit);
        w->failed = 1;
        return -1;
    }
    if (unit == 0 && (w->g = h5_group_create(w->f, "grad_residual")) < 0)
        w->failed = 1;
    hsize_t dims[1] = {(hsize_t)w->units[unit].padded};
    if (!w->failed && h5w_write_tensor(w->g, w->units[unit].name, H5T_NATIVE_FLOAT, 1, dims, data, NULL, NULL) < 0)
        w->failed = 1;
    if (++w->unit == w->n_units) {
        if (w->g >= 0)
            H5Gclose(w->g);
        w->g = -1;
        w->unit = 0;
        w->kind++;
    }
    if (w->failed)
        ftk_err_prefix("%s: ", w->path);
    return w->failed ? -1 : 0;
}

/* The first half of finishing: the tokenizer files, then the file closed (w->f = -1);
 * 0, or -1 with the error set (w->failed then). */
static int shard_close(ckpt_shard_writer_t *w, hid_t tok_src)
{
    int rc = w->failed ? -1 : 0;
    if (rc == 0 && w->kind != CKPT_KINDS + w->residual) {
        ftk_err_set("internal: shard file closed before all of its arrays were written");
        rc = -1;
    }
    if (w->g >= 0)
        H5Gclose(w->g);
    w->g = -1;
    if (rc == 0 && tok_src >= 0) {
        hid_t g = h5_group_create(w->f, "tokenizer");
        if (g < 0)
            rc = -1;
        else
            H5Gclose(g);
        copy_tok_t c = {w->f};
        if (rc == 0)
            rc = weights_each_file(tok_src, copy_tok, &c);
        if (rc < 0)
            ftk_err_prefix("%s: ", w->path);
    }
    if (h5_close(w->f) < 0 && rc == 0) {
        ftk_err_prefix("%s: ", w->path);
        rc = -1;
    }
    w->f = -1;
    w->failed |= rc < 0;
    return rc;
}

/* The second half, on a closed file: fsync (unless synced), size and checksum into *sum;
 * releases w. */
static int shard_sync(ckpt_shard_writer_t *w, int synced, ckpt_shard_sum_t *sum)
{
    int rc = w->failed ? -1 : 0;
    struct stat sb;
    if (rc == 0 && ((!synced && fsync_path(w->path) < 0) || hash_file(w->path, &sum->xxh3) < 0))
        rc = -1;
    if (rc == 0 && stat(w->path, &sb) < 0) {
        ftk_err_set("%s: %s", w->path, strerror(errno));
        rc = -1;
    }
    if (rc == 0)
        sum->bytes = (uint64_t)sb.st_size;
    if (rc == 0)
        rc = fault_point("ckpt.shard-done");
    free(w->path);
    free(w);
    return rc ? -1 : 0;
}

int ckpt_shard_finish(ckpt_shard_writer_t *w, hid_t tok_src, ckpt_shard_sum_t *sum)
{
    int rc = shard_close(w, tok_src);
    return shard_sync(w, 0, sum) < 0 || rc < 0 ? -1 : 0;
}

/* Threads that fsync the closed files of ckpt_shard_finish_many() together. */
#define SYNC_THREADS 16
typedef struct {
    ckpt_shard_writer_t **w;
    int64_t n, next;
    pthread_mutex_t mu;
    char (*why)[512]; /* per file: "" synced, else why not */
} sync_job_t;

static void *sync_worker(void *p)
{
    sync_job_t *j = p;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int64_t i = j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->n)
            return NULL;
        if (!j->w[i]->failed && fsync_path(j->w[i]->path) < 0) /* its message is this thread's */
            snprintf(j->why[i], sizeof j->why[i], "%s", ftk_err_msg());
    }
}

int ckpt_shard_finish_many(ckpt_shard_writer_t **w, int64_t n, hid_t tok_src, ckpt_shard_sum_t *sums)
{
    int rc = 0;
    char first[1024] = "";
    for (int64_t i = 0; i < n; i++)
        if (shard_close(w[i], i == 0 ? tok_src : -1) < 0 && !first[0]) {
            snprintf(first, sizeof first, "%s", ftk_err_msg());
            rc = -1;
        }
    /* A flush waits on the device, not the CPU: a few at once take little longer than one. */
    sync_job_t job = {.w = w, .n = n, .why = calloc((size_t)(n > 0 ? n : 1), sizeof *job.why)};
    pthread_t th[SYNC_THREADS];
    int nt = 0, synced = job.why != NULL && pthread_mutex_init(&job.mu, NULL) == 0;
    for (; synced && nt < SYNC_THREADS && nt < n; nt++)
        if (pthread_create(&th[nt], NULL, sync_worker, &job) != 0)
            break;
    if (synced && !nt)
        sync_worker(&job); /* no thread to be had: this one does it */
    for (int t = 0; t < nt; t++)
        pthread_join(th[t], NULL);
    if (synced)
        pthread_mutex_destroy(&job.mu);
    for (int64_t i = 0; i < n; i++) {
        if (synced && job.why[i][0]) {
            if (!first[0])
                snprintf(first, sizeof first, "%s", job.why[i]);
            w[i]->failed = 1;
            rc = -1;
        }
        if (shard_sync(w[i], synced, &sums[i]) < 0 && !first[0]) {
            snprintf(first, sizeof first, "%s", ftk_err_msg());
            rc = -1;
        }
        w[i] = NULL;
    }
    free(job.why);
    if (first[0])
        ftk_err_set("%s", first);
    return rc;
}

static int write_manifest(const char *path, const ckpt_meta_t *meta, const ckpt_unit_t *units, int n_units,
                          uint64_t config_sum, const ckpt_shard_sum_t *sums)
{
    const ckpt_train_t *t = &meta->train;
    buf_t b = {0};
    char h1[17];
    hash_hex(config_sum, h1);
    int rc = buf_printf(&b, "{\n  \"ftk_format\": \"%s\",\n  \"ftk_format_version\": %d,\n  \"ftk_version\": \"%s\",\n",
                     CKPT_FORMAT, CKPT_VERSION, FTK_VERSION);
    rc |= buf_printf(&b, "  \"step\": %lld,\n  \"tokens_seen\": %lld,\n", (long long)meta->step,
                  (long long)meta->tokens_seen);
    rc |= buf_printf(&b, "  \"data\": {\"file\": ");
    rc |= json_write_string(&b, meta->data_file, strlen(meta->data_file));
    rc |= buf_printf(&b, ", \"set_xxh3\": \"%s\", \"n_rows\": %lld, \"epoch\": %lld, \"rows_consumed\": %lld},\n",
                  meta->data_set_xxh3, (long long)meta->data_rows, (long long)meta->epoch,
                  (long long)meta->rows_consumed);
    rc |= buf_printf(&b, "  \"init\": {\"file\": ");
    rc |= json_write_string(&b, meta->init_file, strlen(meta->init_file));
    rc |= buf_printf(&b, ", \"xxh3\": \"%s\"},\n", meta->init_xxh3);
    rc |= buf_printf(&b, "  \"rng\": {\"seed\": %lld},\n", (long long)t->seed);
    rc |= buf_printf(&b,
                  "  \"train\": {\"lr\": %.17g, \"min_lr\": %.17g, \"warmup\": %lld, \"schedule\": \"%s\", "
                  "\"total_steps\": %lld, \"global_batch\": %lld, \"micro_batch\": %lld,\n",
                  t->lr, t->min_lr, (long long)t->warmup, t->schedule, (long long)t->total_steps,
                  (long long)t->global_batch, (long long)t->micro_batch);
    rc |= buf_printf(&b,
                  "            \"beta1\": %.17g, \"beta2\": %.17g, \"eps\": %.17g, \"weight_decay\": %.17g, "
                  "\"decay_norms\": %s, \"clip\": %.17g, \"seed\": %lld, \"rounding\": \"%s\",\n",
                  t->beta1, t->beta2, t->eps, t->weight_decay, t->decay_norms ? "true" : "false", t->clip,
                  (long long)t->seed, t->rounding[0] ? t->rounding : "nearest");
    rc |= buf_printf(&b, "            \"warmup_style\": \"%s\", \"loss_mean\": \"%s\", \"recipe\": \"%s\"},\n",
                     ckpt_warmup_style(t), ckpt_loss_mean(t), ckpt_recipe(t));
    rc |= buf_printf(&b, "  \"precision\": \"%s\",\n  \"strategy\": \"%s\",\n  \"world_size\": %lld,\n",
                  meta->precision, meta->strategy, (long long)meta->world_size);
    rc |= buf_printf(&b, "  \"shard_count\": %lld,\n", (long long)meta->shard_count);
    rc |= buf_printf(&b, "  \"units_policy\": \"%s\",\n", meta->units_policy[0] ? meta->units_policy : "block");
    if (meta->compress_grads[0])
        rc |= buf_printf(&b, "  \"compress_grads\": \"%s\",\n", meta->compress_grads);
    rc |= buf_printf(&b, "  \"config\": {\"file\": \"config.json\", \"xxh3\": \"%s\"},\n  \"units\": ", h1);
    rc |= ckpt_units_json(&b, units, n_units);
    rc |= buf_printf(&b, ",\n  \"shards\": [");
    for (int64_t i = 0; i < meta->shard_count; i++) {
        char name[32], h2[17];
        ckpt_shard_name(name, i, meta->shard_count);
        hash_hex(sums[i].xxh3, h2);
        rc |= buf_printf(&b, "%s\n    {\"file\": \"%s\", \"bytes\": %llu, \"xxh3\": \"%s\"}", i ? "," : "", name,
                         (unsigned long long)sums[i].bytes, h2);
    }
    rc |= buf_printf(&b, "\n  ],\n");
    /* the seal: XXH3-64 of every byte before its own line (checkpoint.h) */
    char seal[17];
    if (rc == 0) {
        hash_hex(hash_bytes(b.data, b.len), seal);
        rc |= buf_printf(&b, "%s%s\"\n}\n", CKPT_SEAL_KEY, seal);
    }
    if (rc == 0)
        rc = write_text(path, &b);
    else
        ftk_err_set("out of memory");
    buf_free(&b);
    return rc ? -1 : 0;
}

/* config.json and manifest.json of a checkpoint (never a manifest readers refuse). */
static int control_files(const char *cpath, const char *mpath, const ckpt_meta_t *meta, const model_config_t *cfg,
                         const ckpt_unit_t *units, int n_units, const ckpt_shard_sum_t *sums)
{
    buf_t cj = {0};
    int rc = cpath && mpath ? 0 : -1;
    if (!cpath || !mpath)
        ftk_err_set("out of memory");
    if (rc == 0 && ckpt_state_dtype(meta->precision) == DT_INVALID) {
        ftk_err_set("internal: checkpoint precision \"%s\" (fp32, bf16-mixed or bf16-true)", meta->precision);
        rc = -1;
    }
    if (rc == 0 && ckpt_check_meta(meta) < 0) {
        ftk_err_prefix("internal: a manifest readers would refuse: ");
        rc = -1;
    }
    if (rc == 0)
        rc = hfconfig_write(&cj, cfg, DT_F32);
    if (rc == 0)
        rc = write_text(cpath, &cj);
    if (rc == 0)
        rc = write_manifest(mpath, meta, units, n_units, hash_bytes(cj.data, cj.len), sums);
    buf_free(&cj);
    return rc;
}

static int step_dir_name(char *out, size_t n, int64_t step)
{
    return snprintf(out, n, "step-%08lld", (long long)step) >= (int)n ? -1 : 0;
}

int ckpt_begin(ckpt_writer_t *w, const char *run_dir, int64_t step)
{
    memset(w, 0, sizeof *w);
    if (step_dir_name(w->name, sizeof w->name, step) < 0) {
        ftk_err_set("internal: step %lld", (long long)step);
        return -1;
    }
    char *final = ckpt_join(run_dir, w->name);
    if (!final || !(w->run_dir = strdup(run_dir))) {
        free(final);
        ftk_err_set("out of memory");
        return -1;
    }
    int rc = atomic_dir_begin(&w->ad, final);
    free(final);
    if (rc < 0) {
        free(w->run_dir);
        w->run_dir = NULL;
        return -1;
    }
    w->dir = w->ad.tmp_path;
    if (fault_point("ckpt.begin") < 0) {
        ckpt_abort(w);
        return -1;
    }
    return 0;
}

void ckpt_abort(ckpt_writer_t *w)
{
    if (w->run_dir)
        atomic_dir_abort(&w->ad);
    free(w->run_dir);
    memset(w, 0, sizeof *w);
}

int ckpt_write_control(const char *dir, const ckpt_meta_t *meta, const model_config_t *cfg, const ckpt_unit_t *units,
                       int n_units, const ckpt_shard_sum_t *sums)
{
    char *cpath = ckpt_join(dir, "config.json"), *mpath = ckpt_join(dir, "manifest.json");
    int rc = control_files(cpath, mpath, meta, cfg, units, n_units, sums);
    free(cpath);
    free(mpath);
    return rc;
}

int ckpt_commit(ckpt_writer_t *w, const ckpt_meta_t *meta, const model_config_t *cfg, const ckpt_unit_t *units,
                int n_units, const ckpt_shard_sum_t *sums, int keep)
{
    char *cpath = atomic_dir_file(&w->ad, "config.json");
    char *mpath = atomic_dir_file(&w->ad, "manifest.json");
    int rc = control_files(cpath, mpath, meta, cfg, units, n_units, sums);
    if (rc == 0)
        rc = fault_point("ckpt.before-rename");
    if (rc == 0)
        rc = atomic_dir_commit(&w->ad, 1);
    char *run_dir = w->run_dir, name[32];
    memcpy(name, w->name, sizeof name);
    w->run_dir = NULL;
    if (rc < 0) {
        atomic_dir_abort(&w->ad);
        free(run_dir);
        return -1;
    }

    /* latest: replaced by rename, after the checkpoint it names is durable. */
    char *latest = ckpt_join(run_dir, "latest");
    atomic_file_t af;
    if (!latest || fault_point("ckpt.before-latest") < 0 || atomic_begin(&af, latest) < 0) {
        free(latest);
        free(run_dir);
        return -1;
    }
    free(latest);
    FILE *f = fopen(af.tmp_path, "w");
    int e = !f ? errno : fprintf(f, "%s\n", name) < 0 ? errno : 0;
    if (f && fclose(f) != 0 && !e)
        e = errno;
    if (e)
        ftk_err_set("%s: %s", af.tmp_path, strerror(e));
    if (e || atomic_commit(&af) < 0) {
        if (e)
            atomic_abort(&af);
        /* The checkpoint itself is complete: readers that find `latest` older take the
         * newest complete step directory (ckpt_find_latest), so this is not damage. */
        ftk_err_prefix("%s is committed, but %s/latest could not be updated (ftk-train --resume auto finds the newest "
                       "checkpoint without it): ",
                       name, run_dir);
        free(run_dir);
        return -1;
    }

    if (keep > 0) {
        size_t n;
        char **v = ckpt_list_steps(run_dir, &n);
        for (size_t i = 0; i < n; i++) {
            if (i + (size_t)keep < n && strcmp(v[i], name) < 0) {
                char *p = ckpt_join(run_dir, v[i]);
                if (p)
                    rm_tree(p);
                free(p);
            }
            free(v[i]);
        }
        free(v);
    }
    free(run_dir);
    (void)fault_point("ckpt.committed"); /* kills and signals only: it is committed */
    return 0;
}
