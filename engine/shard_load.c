/* shard_load.c — a rank's slices of the initial weights into the backend (shard_load.h).
 *
 * The work is a list of items, one per tensor part a unit's owned range holds, claimed in
 * turn by reading threads (omp_get_max_threads(), at least 2 and at most LOAD_READERS_MAX:
 * ftk-train's -j; each tensor is one item, as its checksum is one sequential hash).
 * Contiguous tensors are read with pread straight into their destination, in 1 MiB
 * pieces, each hashed while it is still in the cache: a tensor read whole is checked
 * against the dataset's xxh3_64 (a damaged file fails the load). Other tensors
 * (compressed, another layout) go through HDF5. Where the backend's memory is the host's
 * (backend.h host_ptr: the CPU) the destination is that memory and the items are every
 * unit's, all at once; else the readers fill unit u + 1 into one host buffer (page-locked
 * on a GPU) while unit u is uploaded from the other (double buffering: the file is read
 * while the bus moves the last unit; the uploading thread then reads beside them). Only
 * the readers call HDF5 while the load runs, and HDF5 only for a tensor's metadata and
 * the tensors pread cannot read: one thread at a time (a mutex). Within a unit the
 * largest tensors go first, so that the readers finish it together.
 *
 * Without host_ptr (a GPU) the host side is two buffers of the largest slice in the
 * state's dtype (page-locked where the backend has it, so the upload runs at the bus's
 * speed), and each reading thread has one read buffer of its largest converted read, all
 * reused for every unit. Whole rows stored in the state's dtype (a bf16 file for
 * bf16-true, the whole model on one GPU) are read straight into place; anything else is
 * read in the file's dtype and converted once into place (libcommon/dtype.h: bf16 → f32 is
 * exact, and a direct narrowing rounds as a way through f32 would, so the bits do not
 * depend on the path). Widening every tensor to fp32 in fresh buffers and narrowing it
 * again makes ~4 new copies of each unit, whose first-touch page faults dominate: a
 * 13.5 GB 7B file took ~55 s to load that way on the H200 machine.
 */
#include "shard_load.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../formats/weights.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/timer.h"

static size_t sbytes(const shard_load_t *s, int64_t n) { return (size_t)n * dtype_size(s->state); }

/* The part [*a, *b) of tensor t inside the element range [lo, hi) of its unit; 0 when empty. */
static int overlap(const ckpt_tensor_t *t, int64_t lo, int64_t hi, int64_t *a, int64_t *b)
{
    *a = t->offset > lo ? t->offset : lo;
    *b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
    return *a < *b;
}

/* *buf with room for need bytes (what it held is not kept); -1 with a message without memory. */
static int read_room(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    free(*buf);
    *cap = 0;
    if (!(*buf = malloc(need))) {
        ftk_err_set("out of memory: %zu bytes of host memory for loading the weights", need);
        return -1;
    }
    *cap = need;
    return 0;
}

enum { LOAD_PIECE = 1 << 20, LOAD_READERS_MAX = 8 };

static pthread_mutex_t load_h5 = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    const ckpt_tensor_t *t;
    int64_t a, b; /* the tensor's elements [a, b) (unit offsets) */
    char *dst;    /* where element a goes */
} load_item_t;

typedef struct load_job load_job_t;

typedef struct {
    load_job_t *job;
    char *rd; /* conversion scratch, grown on demand */
    size_t rd_cap;
    int64_t bytes; /* file bytes read */
    double cpu;    /* CPU seconds in load_read */
} load_reader_t;

struct load_job {
    const shard_load_t *s;
    hid_t weights;
    load_item_t *items; /* this round's */
    int n_items, cap_items;
    atomic_int next, failed;
    pthread_mutex_t err_lock;
    char err[1024]; /* the first failure's message (ftk_err_msg is a thread's own) */
    load_reader_t r[LOAD_READERS_MAX + 1]; /* r[0]: the calling thread's */
    int n_readers; /* the CPU: threads and the caller; a GPU: threads (the caller joins after its upload) */
    pthread_t th[LOAD_READERS_MAX + 1];
    int started[LOAD_READERS_MAX + 1];
};

/* n bytes at off of fd into dst, in pieces, each hashed into h (may be NULL). */
static int pread_all(int fd, int64_t off, char *dst, size_t n, hash_state_t *h, const char *name)
{
    for (size_t done = 0; done < n;) {
        size_t want = n - done < LOAD_PIECE ? n - done : LOAD_PIECE, got = 0;
        while (got < want) {
            ssize_t r = pread(fd, dst + done + got, want - got, (off_t)(off + (int64_t)(done + got)));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                ftk_err_set("tensor %s: %s", name, r < 0 ? strerror(errno) : "the file ends early (truncated)");
                return -1;
            }
            got += (size_t)r;
        }
        if (h)
            hash_update(h, dst + done, want);
        done += want;
    }
    return 0;
}

/* Tensor t's elements [a, b) into dst in the state dtype. */
static int load_tensor(load_reader_t *f, const ckpt_tensor_t *t, int64_t a, int64_t b, char *dst)
{
    const shard_load_t *s = f->job->s;
    hid_t weights = f->job->weights;
    int fd, has_sum = 0;
    int64_t off;
    uint64_t sum = 0;
    pthread_mutex_lock(&load_h5);
    dtype_t dt = weights_tensor_dtype(weights, t->name);
    int raw = dt == DT_INVALID ? -1 : weights_tensor_raw(weights, t->name, &fd, &off, &sum, &has_sum);
    pthread_mutex_unlock(&load_h5);
    if (raw < 0)
        return -1;
    size_t fs = dtype_size(dt);
    if (raw) {
        int whole = a == t->offset && b == t->offset + t->numel && has_sum, same = dt == s->state;
        hash_state_t *h = whole ? hash_new() : NULL;
        if (whole && !h) {
            ftk_err_set("out of memory");
            return -1;
        }
        size_t n = (size_t)(b - a) * fs;
        int64_t at = off + (a - t->offset) * (int64_t)fs;
        int rc = 0;
        if (same)
            rc = pread_all(fd, at, dst, n, h, t->name);
        else /* a piece at a time through a piece of scratch, converted while it is in the cache */
            for (size_t done = 0; done < n && rc == 0; done += LOAD_PIECE) {
                size_t k = n - done < LOAD_PIECE ? n - done : LOAD_PIECE;
                if ((rc = read_room(&f->rd, &f->rd_cap, k)) == 0 &&
                    (rc = pread_all(fd, at + (int64_t)done, f->rd, k, h, t->name)) == 0)
                    dtype_convert(dst + done / fs * dtype_size(s->state), s->state, f->rd, dt, k / fs);
            }
        if (rc == 0 && h && hash_digest(h) != sum) {
            ftk_err_set("tensor %s: checksum mismatch (xxh3_64 %016llx stored, %016llx read): the weights file is "
                        "damaged",
                        t->name, (unsigned long long)sum, (unsigned long long)hash_digest(h));
            rc = -1;
        }
        hash_free(h);
        f->bytes += rc == 0 ? (int64_t)n : 0;
        return rc;
    }
    /* Rows of the tensor covering [a, b) (weights_read_rows: a 1-D tensor is one row). */
    int64_t w = t->rank == 2 ? t->shape[1] : t->numel, r0 = (a - t->offset) / w, r1 = (b - t->offset - 1) / w + 1;
    size_t need = (size_t)((r1 - r0) * w) * fs;
    int whole = (a - t->offset) % w == 0 && (b - t->offset) % w == 0, rc;
    f->bytes += (int64_t)need;
    pthread_mutex_lock(&load_h5);
    if (whole && dt == s->state)
        rc = weights_read_rows(weights, t->name, dt, r0, r1 - r0, dst, NULL);
    else if ((rc = read_room(&f->rd, &f->rd_cap, need)) == 0 &&
             (rc = weights_read_rows(weights, t->name, dt, r0, r1 - r0, f->rd, NULL)) == 0)
        dtype_convert(dst, s->state, f->rd + (size_t)(a - t->offset - r0 * w) * fs, dt, (size_t)(b - a));
    pthread_mutex_unlock(&load_h5);
    return rc;
}

/* Claims and reads the round's items until none is left or a reader failed. */
static void *load_read(void *arg)
{
    load_reader_t *f = arg;
    load_job_t *j = f->job;
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_items || atomic_load(&j->failed))
            break;
        load_item_t *it = &j->items[i];
        if (load_tensor(f, it->t, it->a, it->b, it->dst) < 0) {
            pthread_mutex_lock(&j->err_lock);
            if (!atomic_load(&j->failed))
                snprintf(j->err, sizeof j->err, "%s", ftk_err_msg());
            atomic_store(&j->failed, 1);
            pthread_mutex_unlock(&j->err_lock);
        }
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    f->cpu += (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    return NULL;
}

static int item_larger(const void *x, const void *y)
{
    int64_t a = ((const load_item_t *)x)->b - ((const load_item_t *)x)->a;
    int64_t b = ((const load_item_t *)y)->b - ((const load_item_t *)y)->a;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* Appends unit u's items, its owned slice going to dst, and zeroes its padding past its
 * tensors there. -1 without memory. */
static int load_add_unit(load_job_t *j, int u, char *dst)
{
    const shard_load_t *s = j->s;
    size_t es = dtype_size(s->state);
    const ckpt_unit_t *x = &s->units[u];
    int64_t lo = s->lo[u], hi = lo + s->len[u];
    if (hi > x->length) {
        int64_t z = x->length > lo ? x->length : lo;
        memset(dst + (size_t)(z - lo) * es, 0, (size_t)(hi - z) * es);
    }
    int first = j->n_items;
    for (int k = 0; k < x->n_tensors; k++) {
        int64_t a, b;
        if (!overlap(&x->t[k], lo, hi, &a, &b))
            continue;
        if (j->n_items == j->cap_items) {
            int cap = j->cap_items ? 2 * j->cap_items : 64;
            load_item_t *n = realloc(j->items, (size_t)cap * sizeof *n);
            if (!n) {
                ftk_err_set("out of memory");
                return -1;
            }
            j->items = n, j->cap_items = cap;
        }
        j->items[j->n_items++] = (load_item_t){&x->t[k], a, b, dst + (size_t)(a - lo) * es};
    }
    qsort(j->items + first, (size_t)(j->n_items - first), sizeof *j->items, item_larger);
    return 0;
}

/* Starts the round's reading threads, r[1 .. n]; a thread that cannot be started leaves
 * its share to the others and to the calling thread (load_join). */
static void load_start(load_job_t *j, int n)
{
    atomic_store(&j->next, 0);
    for (int i = 1; i <= n; i++)
        j->started[i] = pthread_create(&j->th[i], NULL, load_read, &j->r[i]) == 0;
}

/* Finishes the round, the calling thread reading what is left beside the threads: 0, or
 * -1 with the first failure's message. */
static int load_join(load_job_t *j)
{
    load_read(&j->r[0]);
    for (int i = 1; i <= LOAD_READERS_MAX; i++)
        if (j->started[i]) {
            pthread_join(j->th[i], NULL);
            j->started[i] = 0;
        }
    j->n_items = 0;
    if (atomic_load(&j->failed)) {
        ftk_err_set("%s", j->err);
        return -1;
    }
    return 0;
}

int shard_load_read(const shard_load_t *s, shard_load_stats_t *st)
{
    backend_t *be = s->be;
    load_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        ftk_err_set("out of memory");
        return -1;
    }
    j->s = s, j->weights = s->weights;
    pthread_mutex_init(&j->err_lock, NULL);
    int n = omp_get_max_threads();
    j->n_readers = n < 2 ? 2 : n > LOAD_READERS_MAX ? LOAD_READERS_MAX : n;
    for (int i = 0; i <= LOAD_READERS_MAX; i++)
        j->r[i].job = j;
    char *host[2] = {NULL, NULL};
    int pinned = be->host_alloc != NULL, rc = 0;
    double upload_s = 0, wait_s = 0;
    if (be->host_ptr) {
        for (int u = 0; u < s->n_units && rc == 0; u++)
            rc = load_add_unit(j, u, be->host_ptr(be, s->dst[u]));
        if (rc == 0) {
            load_start(j, j->n_readers - 1);
            rc = load_join(j);
        }
    } else {
        size_t most = 1;
        for (int u = 0; u < s->n_units; u++)
            most = sbytes(s, s->len[u]) > most ? sbytes(s, s->len[u]) : most;
        for (int i = 0; i < 2 && rc == 0; i++)
            if (!(host[i] = pinned ? be->host_alloc(be, most) : malloc(most))) {
                ftk_err_set("out of memory: 2 x %zu bytes of host memory for loading the weights", most);
                rc = -1;
            }
        if (rc == 0 && s->n_units > 0 && (rc = load_add_unit(j, 0, host[0])) == 0) {
            load_start(j, j->n_readers - 1);
            rc = load_join(j);
        }
        for (int u = 0; u < s->n_units && rc == 0; u++) {
            /* unit u is in host[u % 2]: the readers fill the other with unit u + 1 while u
             * goes up, and this thread joins them once it is up */
            int more = u + 1 < s->n_units;
            if (more && (rc = load_add_unit(j, u + 1, host[(u + 1) % 2])) < 0)
                break;
            if (more)
                load_start(j, j->n_readers);
            double t0 = time_now();
            be->upload(be, s->dst[u], host[u % 2], sbytes(s, s->len[u]));
            double t1 = time_now();
            if (more)
                rc = load_join(j);
            upload_s += t1 - t0, wait_s += time_now() - t1;
        }
    }
    shard_load_stats_t got = {.readers = j->n_readers, .upload_s = upload_s, .wait_s = wait_s};
    for (int i = 0; i <= LOAD_READERS_MAX; i++) {
        got.bytes += j->r[i].bytes;
        got.read_cpu += j->r[i].cpu;
        free(j->r[i].rd);
    }
    if (rc == 0 && st)
        *st = got;
    for (int i = 0; i < 2; i++) {
        if (pinned && host[i])
            be->host_free(be, host[i]);
        else
            free(host[i]);
    }
    free(j->items);
    pthread_mutex_destroy(&j->err_lock);
    free(j);
    return rc;
}

