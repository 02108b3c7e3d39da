/* bgsave.c — the background shard writer and the shard-file write both saves make (bgsave.h). */
#include "bgsave.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../formats/h5.h"
#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/timer.h"

struct bgsave {
    backend_t *be;
    const ckpt_unit_t *units;
    int n_units;
    int64_t S;
    size_t esize;
    int residual;  /* --compress-grads: kind CKPT_KINDS, each unit's residual (padded f32) */
    void *snap;    /* CKPT_KINDS (+ 1) × n_units arrays, in file order */
    size_t *offs;  /* byte offset of array (kind, unit): offs[kind·n_units + unit] */
    size_t bytes;
    /* the write in progress (the thread's until joined) */
    pthread_t thread;
    int running;
    atomic_int done;
    char *dir;
    ckpt_meta_t meta;
    int64_t index;
    hid_t tok_src;
    int rc;
    char err[2048];
    ckpt_shard_sum_t sum;
    double write_s;
    int hash_raw;       /* the thread also hashes the snapshot's bytes into raw_xxh3 */
    uint64_t raw_xxh3;
};

/* The residuals start at a multiple of 16 bytes. */
static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

int64_t bgsave_bytes(const ckpt_unit_t *units, int n_units, int64_t S, dtype_t dt, int residual)
{
    int64_t n = 0, r = 0;
    for (int u = 0; u < n_units; u++) {
        n += units[u].padded / S;
        r += units[u].padded;
    }
    int64_t b = CKPT_KINDS * n * (int64_t)dtype_size(dt);
    return residual ? (int64_t)align16((size_t)b) + r * (int64_t)sizeof(float) : b;
}

int bgsave_supported(void)
{
    hbool_t ts = 0;
    return H5is_library_threadsafe(&ts) >= 0 && ts;
}

bgsave_t *bgsave_new(backend_t *be, const ckpt_unit_t *units, int n_units, int64_t S, dtype_t dt, int residual)
{
    bgsave_t *b = calloc(1, sizeof *b);
    if (!b || !(b->offs = malloc((size_t)((CKPT_KINDS + 1) * n_units) * sizeof *b->offs))) {
        free(b);
        ftk_err_set("out of memory");
        return NULL;
    }
    b->be = be;
    b->units = units;
    b->n_units = n_units;
    b->S = S;
    b->esize = dtype_size(dt);
    size_t off = 0;
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int u = 0; u < n_units; u++) {
            b->offs[k * n_units + u] = off;
            off += (size_t)(units[u].padded / S) * b->esize;
        }
    b->residual = residual;
    if (residual)
        off = align16(off);
    for (int u = 0; residual && u < n_units; u++) {
        b->offs[CKPT_KINDS * n_units + u] = off;
        off += (size_t)units[u].padded * sizeof(float);
    }
    b->bytes = off;
    b->snap = be->host_alloc ? be->host_alloc(be, off ? off : 1) : malloc(off ? off : 1);
    if (!b->snap) {
        ftk_err_set("out of %s memory allocating the checkpoint snapshot for --async-save (%zu bytes; see --plan)",
                    be->host_alloc ? "page-locked host" : "host", off);
        free(b->offs);
        free(b);
        return NULL;
    }
    /* Touched now: an overcommitted machine fails here, at start-up, not at the first
     * checkpoint hours later; and that snapshot does not pay the page faults. (Page-locked
     * memory is resident already.) */
    if (!be->host_alloc)
        memset(b->snap, 0, off);
    atomic_init(&b->done, 1);
    return b;
}

int bgsave_snapshot(bgsave_t *b, shard_t *sh)
{
    if (b->running) {
        ftk_err_set("internal: checkpoint snapshot taken while its write runs");
        return -1;
    }
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int u = 0; u < b->n_units; u++)
            if (shard_get_slice(sh, k, u, (char *)b->snap + b->offs[k * b->n_units + u]) < 0)
                return -1;
    for (int u = 0; b->residual && u < b->n_units; u++)
        if (shard_get_residual(sh, u, (float *)(void *)((char *)b->snap + b->offs[CKPT_KINDS * b->n_units + u])) < 0)
            return -1;
    /* a device keeps its first error: a failed copy must not become a checkpoint */
    return b->be->sync(b->be);
}

int bgsave_write_shard(const char *dir, const ckpt_meta_t *meta, const ckpt_unit_t *units, int n_units, int64_t index,
                       hid_t tok_src, bgsave_array_fn array, void *ctx, ckpt_shard_sum_t *sum)
{
    ckpt_shard_writer_t *w = ckpt_shard_create(dir, meta, units, n_units, index);
    int bad = !w;
    for (int k = 0; k < CKPT_KINDS && !bad; k++)
        for (int u = 0; u < n_units && !bad; u++) {
            const void *a = array(ctx, k, u);
            bad = !a || ckpt_shard_put(w, k, u, a) < 0;
        }
    for (int u = 0; meta->compress_grads[0] && u < n_units && !bad; u++) {
        const void *a = array(ctx, CKPT_KINDS, u); /* the residual (bgsave.h) */
        bad = !a || ckpt_shard_put_residual(w, u, a) < 0;
    }
    if (w && ckpt_shard_finish(w, tok_src, sum) < 0)
        bad = 1;
    return bad ? -1 : 0;
}

/* The writer thread's arrays: the snapshot's. */
static const void *snapshot_array(void *ctx, int kind, int unit)
{
    bgsave_t *b = ctx;
    /* tests/fault/async_kill.sh aims here (FTK_FAULT=bgsave.write:…): a kill, a failure, or
     * a write stretched to overlap the steps that follow */
    if (fault_point("bgsave.write") < 0)
        return NULL;
    return (char *)b->snap + b->offs[kind * b->n_units + unit];
}

static void *writer(void *arg)
{
    bgsave_t *b = arg;
    double t0 = time_now();
    h5_init(); /* this thread's HDF5 error printing off (per thread): ftk's message alone */
    /* Below the training threads: where training runs on the same cores (the CPU backend)
     * the write's hashing and copying should take the cycles training leaves, not half of
     * each step's. On Linux the nice value is per thread. Best effort: a failure changes
     * only the speed. */
    pid_t tid = (pid_t)syscall(SYS_gettid);
    errno = 0;
    int prio = getpriority(PRIO_PROCESS, (id_t)tid);
    if (errno == 0)
        setpriority(PRIO_PROCESS, (id_t)tid, prio + 10 > 19 ? 19 : prio + 10);
    int bad = bgsave_write_shard(b->dir, &b->meta, b->units, b->n_units, b->index, b->tok_src, snapshot_array, b,
                                 &b->sum) < 0;
    if (!bad && b->hash_raw)
        b->raw_xxh3 = hash_bytes(b->snap, b->bytes);
    b->rc = bad ? -1 : 0;
    if (bad) /* ftk_err_msg() is this thread's */
        snprintf(b->err, sizeof b->err, "%s", ftk_err_msg());
    b->write_s = time_now() - t0;
    atomic_store_explicit(&b->done, 1, memory_order_release);
    return NULL;
}

int bgsave_start(bgsave_t *b, const char *dir, const ckpt_meta_t *meta, int64_t index, hid_t tok_src)
{
    if (b->running) {
        ftk_err_set("internal: a second checkpoint write started while one runs");
        return -1;
    }
    free(b->dir);
    if (!(b->dir = strdup(dir))) {
        ftk_err_set("out of memory");
        return -1;
    }
    b->meta = *meta;
    b->index = index;
    b->tok_src = tok_src;
    b->rc = 0;
    b->err[0] = 0;
    memset(&b->sum, 0, sizeof b->sum);
    b->write_s = 0;
    atomic_store(&b->done, 0);
    int e = pthread_create(&b->thread, NULL, writer, b);
    if (e) {
        atomic_store(&b->done, 1);
        ftk_err_set("cannot start the checkpoint writer thread: %s", strerror(e));
        return -1;
    }
    b->running = 1;
    return 0;
}

int bgsave_running(const bgsave_t *b) { return b && b->running; }

void *bgsave_buffer(bgsave_t *b, int64_t *bytes)
{
    *bytes = (int64_t)b->bytes;
    return b->snap;
}

void bgsave_hash_raw(bgsave_t *b, int on) { b->hash_raw = on; }
uint64_t bgsave_raw_hash(const bgsave_t *b) { return b->raw_xxh3; }

int bgsave_done(const bgsave_t *b)
{
    return !b || !b->running || atomic_load_explicit(&((bgsave_t *)b)->done, memory_order_acquire);
}

int bgsave_wait(bgsave_t *b, ckpt_shard_sum_t *sum, double *write_s)
{
    if (!b->running) {
        ftk_err_set("internal: no checkpoint write to wait for");
        return -1;
    }
    pthread_join(b->thread, NULL);
    b->running = 0;
    if (b->rc < 0) {
        ftk_err_set("%s", b->err);
        return -1;
    }
    *sum = b->sum;
    *write_s = b->write_s;
    return 0;
}

void bgsave_free(bgsave_t *b)
{
    if (!b)
        return;
    if (b->running)
        pthread_join(b->thread, NULL);
    if (b->be->host_free)
        b->be->host_free(b->be, b->snap);
    else
        free(b->snap);
    free(b->offs);
    free(b->dir);
    free(b);
}
