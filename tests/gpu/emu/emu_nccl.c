/* emu_nccl.c — libnccl.so.2 for the host emulation of CUDA (tests/gpu/emu): the part of
 * NCCL's API that engine/comm_nccl.c calls (declared by NCCL's own nccl.h), between the
 * processes of one machine through shared memory. comm_nccl.c then runs as written (its
 * dlopen, the joiner thread, the events, the aborts) under `mpirun -np N` of the emulated
 * tools (Makefile: tests/emu/bin), which find this library before any other (their run
 * path, $ORIGIN/../lib). None of NCCL's algorithms is emulated: what is checked is the caller.
 *
 * A communicator is a POSIX shared-memory segment named after its unique id: a header (the
 * ranks' pids, devices and states, a barrier) and one staging slot per rank. A collective
 * runs to its end when called, as every emulated kernel does (emulated streams are in order
 * already): chunk by chunk, every rank copies its share into its slot, a barrier, every
 * rank reads what it needs from all slots (sums in rank order: the same bits on every
 * rank), a barrier. So a collective blocks its caller until every rank has called it, where
 * NCCL's would return at once: ranks must issue collectives in the same order (they must on
 * a GPU too, or the streams hang).
 *
 * Checked as NCCL does:
 *  - ncclCommInitRank returns when every rank of the group has called it (a rank that
 *    never comes leaves the others waiting: comm_nccl.c's joiner must deal with that);
 *  - two ranks of a group on one device: ncclInvalidUsage, "Duplicate GPU detected" (the
 *    device: the calling thread's current one in the emulated runtime, read through the
 *    executable's exported emu_c_cudaGetDevice; without it, not checked);
 *  - sizes, ranks, the unique id, buffers; types ncclFloat32 and ncclBfloat16 and the op
 *    ncclSum alone (what ftk uses; anything else is ncclInvalidArgument, said so);
 *  - a peer gone (its communicator aborted or destroyed, or its process dead) while a rank
 *    waits for it in a collective: ncclRemoteError, as an asynchronous error
 *    (ncclCommGetAsyncError), as a closed connection gives on a real network;
 *  - FTK_EMU_NCCL_FAIL=R:K, for tests: on the process of world rank R (OMPI_COMM_WORLD_RANK
 *    or PMIX_RANK), the K-th collective (counted from 1 over all its communicators) does
 *    not take part and ends in ncclSystemError, asynchronously; its peers then see it gone
 *    once it aborts. R:init: its first ncclCommInitRank fails at once, without joining, and
 *    leaves the group's other ranks waiting in theirs.
 * Sums of bf16: each contribution added in fp32 to the sum so far, which is rounded to bf16
 * (nearest even) after each addition, as NCCL's ring does at each hop. NCCL_DEBUG=WARN or
 * INFO prints each error to stderr. A segment's name is removed once every rank has joined,
 * or at the exit of a process whose join never completed (nothing is left in /dev/shm). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../../libcommon/dtype.h" /* bf16_to_f32, f32_to_bf16 */

#define EXPORT __attribute__((visibility("default")))
#ifndef EMU_NCCL_SLOT /* bytes each rank stages per round (-D to try chunking on small buffers) */
#define EMU_NCCL_SLOT (256 << 10)
#endif
#define SLOT ((size_t)EMU_NCCL_SLOT)
#define MAGIC "ftk-emu-nccl:"

enum { R_NONE, R_JOINED, R_GONE };

typedef struct {
    _Atomic int pid, device, state;
    int pad[13]; /* a cache line each */
} rank_t;

typedef struct {
    _Atomic int nranks, joined, arrived;
    _Atomic unsigned gen;
    int pad[12];
    rank_t r[];
} hdr_t;

struct ncclComm {
    hdr_t *h;
    unsigned char *slots; /* n slots of SLOT bytes */
    size_t map_bytes;
    int n, rank;
    ncclResult_t async; /* the asynchronous error, kept */
};

static char last_err[512];
static pthread_mutex_t last_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int group_depth;
static atomic_long n_ops; /* collectives called by this process (FTK_EMU_NCCL_FAIL) */

static ncclResult_t err(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t err(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&last_mu);
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
    const char *dbg = getenv("NCCL_DEBUG");
    if (dbg && (!strcasecmp(dbg, "WARN") || !strcasecmp(dbg, "INFO")))
        fprintf(stderr, "%d [emulated NCCL] NCCL WARN %s\n", (int)getpid(), last_err);
    pthread_mutex_unlock(&last_mu);
    return r;
}

static size_t hdr_bytes(int n) { return (sizeof(hdr_t) + (size_t)n * sizeof(rank_t) + 4095) / 4096 * 4096; }

static void shm_name(const ncclUniqueId *id, char *name, size_t cap)
{
    snprintf(name, cap, "/ftk-emu-nccl-%.32s", id->internal + strlen(MAGIC));
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return err(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    unsigned char r[16];
    if (!id)
        return err(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return err(ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
    memset(id, 0, sizeof *id);
    int k = snprintf(id->internal, sizeof id->internal, MAGIC);
    for (int i = 0; i < 16; i++)
        k += snprintf(id->internal + k, sizeof id->internal - (size_t)k, "%02x", r[i]);
    return ncclSuccess;
}

/* The calling thread's device in the emulated runtime, -1 where the program has none. */
static int current_device(void)
{
    int (*get)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "emu_c_cudaGetDevice");
    int d = -1;
    if (!get || get(&d) != 0)
        return -1;
    return d;
}

static int process_dead(int pid)
{
    char p[64], b[256];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return errno == ENOENT;
    size_t k = fread(b, 1, sizeof b - 1, f);
    fclose(f);
    b[k] = 0;
    const char *e = strrchr(b, ')');
    return e && e[1] == ' ' && (e[2] == 'Z' || e[2] == 'X');
}

static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* The names of the segments this process is joining: removed at its exit should a join
 * never complete (a peer that never came; the joiner thread is then still waiting). */
static char pending[16][64];
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pending_once = PTHREAD_ONCE_INIT;
static void pending_unlink(void)
{
    pthread_mutex_lock(&pending_mu);
    for (int i = 0; i < 16; i++)
        if (pending[i][0])
            shm_unlink(pending[i]);
    pthread_mutex_unlock(&pending_mu);
}
static void pending_init(void) { atexit(pending_unlink); }
/* name added (add) or removed from the list */
static void pending_set(const char *name, int add)
{
    pthread_once(&pending_once, pending_init);
    pthread_mutex_lock(&pending_mu);
    for (int i = 0; i < 16; i++)
        if (add ? !pending[i][0] : !strcmp(pending[i], name)) {
            snprintf(pending[i], sizeof pending[i], "%s", add ? name : "");
            break;
        }
    pthread_mutex_unlock(&pending_mu);
}

/* FTK_EMU_NCCL_FAIL (see the top), read once: this process's K (0: its first join), or -1 */
static int fail_k = -1;
static pthread_once_t fail_once = PTHREAD_ONCE_INIT;
static void fail_parse(void)
{
    const char *v = getenv("FTK_EMU_NCCL_FAIL"), *me = getenv("OMPI_COMM_WORLD_RANK");
    if (!me)
        me = getenv("PMIX_RANK");
    int r = -1, k = -1;
    char w[8] = "";
    if (!v || !me || (sscanf(v, "%d:%d", &r, &k) != 2 && (sscanf(v, "%d:%7s", &r, w) != 2 || strcmp(w, "init"))))
        return;
    if (r == atoi(me))
        fail_k = w[0] ? 0 : k > 0 ? k : -1;
}

/* 1 where this join (init) or this collective is the one FTK_EMU_NCCL_FAIL names */
static int fail_here(int init)
{
    static atomic_int joins;
    pthread_once(&fail_once, fail_parse);
    if (init)
        return fail_k == 0 && atomic_fetch_add(&joins, 1) == 0;
    return fail_k > 0 && atomic_fetch_add(&n_ops, 1) + 1 == fail_k;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    if (!out)
        return err(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return err(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    if (strncmp(id.internal, MAGIC, strlen(MAGIC)))
        return err(ncclInvalidArgument, "ncclCommInitRank: not a unique id of this (emulated) NCCL");
    if (fail_here(1)) /* before it joins: the others wait for it */
        return err(ncclSystemError, "ncclCommInitRank: FTK_EMU_NCCL_FAIL: rank %d of %d fails before it joins", rank,
                   nranks);
    int dev = current_device();
    char name[64];
    shm_name(&id, name, sizeof name);
    size_t bytes = hdr_bytes(nranks) + (size_t)nranks * SLOT;
    pending_set(name, 1);
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return err(ncclSystemError, "ncclCommInitRank: shm_open %s: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || ((size_t)st.st_size < bytes && ftruncate(fd, (off_t)bytes) < 0)) {
        close(fd);
        return err(ncclSystemError, "ncclCommInitRank: sizing %s: %s", name, strerror(errno));
    }
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return err(ncclSystemError, "ncclCommInitRank: mmap %s: %s", name, strerror(errno));
    hdr_t *h = m;
    ncclResult_t r = ncclSuccess;
    int want = 0, none = 0;
    if (!atomic_compare_exchange_strong(&h->nranks, &want, nranks) && want != nranks)
        r = err(ncclInvalidUsage, "ncclCommInitRank: rank %d says %d ranks, another rank said %d", rank, nranks, want);
    else if (!atomic_compare_exchange_strong(&h->r[rank].pid, &none, (int)getpid()))
        r = err(ncclInvalidUsage, "ncclCommInitRank: rank %d joined twice (pids %d and %d)", rank, none,
                (int)getpid());
    if (r != ncclSuccess) {
        munmap(m, bytes);
        return r;
    }
    atomic_store(&h->r[rank].device, dev);
    atomic_store(&h->r[rank].state, R_JOINED);
    atomic_fetch_add(&h->joined, 1);
    while (atomic_load(&h->joined) < nranks) /* every rank: until then NCCL does not return */
        pause_us(200);
    shm_unlink(name); /* mapped by all: the name is no longer needed (ENOENT after the first) */
    pending_set(name, 0);
    for (int q = 0; q < nranks && dev >= 0; q++)
        if (q != rank && atomic_load(&h->r[q].device) == dev) {
            r = err(ncclInvalidUsage, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d (emulated)",
                    rank < q ? rank : q, rank < q ? q : rank, dev);
            break;
        }
    struct ncclComm *c = r == ncclSuccess ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        atomic_store(&h->r[rank].state, R_GONE);
        munmap(m, bytes);
        return r != ncclSuccess ? r : err(ncclSystemError, "ncclCommInitRank: out of memory");
    }
    *c = (struct ncclComm){.h = h, .slots = (unsigned char *)m + hdr_bytes(nranks), .map_bytes = bytes,
                           .n = nranks, .rank = rank};
    *out = c;
    return ncclSuccess;
}

static void leave(ncclComm_t c)
{
    atomic_store(&c->h->r[c->rank].state, R_GONE);
    munmap(c->h, c->map_bytes);
    free(c);
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return err(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    leave(c);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (c)
        leave(c);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return err(ncclInvalidUsage, "ncclGroupEnd: not in a group");
    group_depth--;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st)
{
    if (!c || !st)
        return err(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    *st = c->async;
    return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EXPORT const char *ncclGetLastError(ncclComm_t c)
{
    (void)c; /* NCCL's last error is the process's */
    return last_err;
}

/* The first peer gone (communicator left, process dead), or -1. */
static int peer_gone(ncclComm_t c)
{
    for (int q = 0; q < c->n; q++)
        if (q != c->rank &&
            (atomic_load(&c->h->r[q].state) == R_GONE || process_dead(atomic_load(&c->h->r[q].pid))))
            return q;
    return -1;
}

/* Every rank of c here; -1 (c->async set) when a peer is gone first. */
static int barrier(ncclComm_t c)
{
    hdr_t *h = c->h;
    unsigned g = atomic_load(&h->gen);
    if (atomic_fetch_add(&h->arrived, 1) == c->n - 1) {
        atomic_store(&h->arrived, 0);
        atomic_fetch_add(&h->gen, 1);
        return 0;
    }
    for (long i = 1; atomic_load(&h->gen) == g; i++) {
        int q;
        if (i % 256 == 0 && (q = peer_gone(c)) >= 0) {
            if (atomic_load(&h->gen) != g) /* it left after the barrier completed */
                return 0;
            c->async = err(ncclRemoteError, "rank %d of %d: peer rank %d is gone (its communicator left, or its process ended)",
                           c->rank, c->n, q);
            return -1;
        }
        if (i < 64)
            sched_yield();
        else
            pause_us(100);
    }
    return 0;
}

/* The checks every collective makes (op: -1 for none); ncclSuccess to go on. */
static ncclResult_t precheck(const char *what, const void *s, const void *r, size_t n, ncclDataType_t t, int op,
                             ncclComm_t c, size_t *esz)
{
    if (!c)
        return err(ncclInvalidArgument, "%s: comm is NULL", what);
    if (c->async != ncclSuccess)
        return err(c->async, "%s: the communicator has failed: %s", what, ncclGetErrorString(c->async));
    if (t == ncclFloat32)
        *esz = 4;
    else if (t == ncclBfloat16)
        *esz = 2;
    else
        return err(ncclInvalidArgument, "%s: data type %d (this emulation takes ncclFloat32 and ncclBfloat16)", what,
                   (int)t);
    if (op >= 0 && op != ncclSum)
        return err(ncclInvalidArgument, "%s: op %d (this emulation takes ncclSum)", what, op);
    if (n && (!s || !r))
        return err(ncclInvalidArgument, "%s: a NULL buffer", what);
    if (fail_here(0))
        c->async = err(ncclSystemError, "%s: FTK_EMU_NCCL_FAIL: rank %d of %d fails here", what, c->rank, c->n);
    return ncclSuccess;
}

/* dst[i] = Σ_q src_q[i] (q in rank order), src_q = slot q + at */
static void sum_slots(ncclComm_t c, size_t at, void *dst, size_t len, size_t esz)
{
    for (size_t i = 0; i < len; i++) {
        if (esz == 4) {
            float a = 0;
            for (int q = 0; q < c->n; q++) {
                float x;
                memcpy(&x, c->slots + (size_t)q * SLOT + at + 4 * i, 4);
                a = q ? a + x : x;
            }
            memcpy((unsigned char *)dst + 4 * i, &a, 4);
        } else {
            uint16_t a = 0, x;
            for (int q = 0; q < c->n; q++) {
                memcpy(&x, c->slots + (size_t)q * SLOT + at + 2 * i, 2);
                a = q ? f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(x)) : x;
            }
            memcpy((unsigned char *)dst + 2 * i, &a, 2);
        }
    }
}

enum { ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE };

/* One collective of n elements a rank (see the top): staged chunk by chunk through the
 * slots. A peer gone is an asynchronous error: the call itself succeeds. */
static ncclResult_t collective(int kind, const char *what, const void *send, void *recv, size_t n, ncclDataType_t t,
                               int op, ncclComm_t c)
{
    size_t esz = 0;
    ncclResult_t r = precheck(what, send, recv, n, t, op, c, &esz);
    if (r != ncclSuccess || c->async != ncclSuccess)
        return r;
    /* a reduce-scatter's slot holds the chunk of every destination rank */
    size_t chunk = SLOT / esz / (kind == REDUCE_SCATTER ? (size_t)c->n : 1);
    const unsigned char *in = send;
    unsigned char *out = recv, *mine = c->slots + (size_t)c->rank * SLOT;
    for (size_t off = 0; off < n; off += chunk) {
        size_t len = n - off < chunk ? n - off : chunk, bytes = len * esz;
        if (kind == REDUCE_SCATTER)
            for (int q = 0; q < c->n; q++)
                memcpy(mine + (size_t)q * chunk * esz, in + ((size_t)q * n + off) * esz, bytes);
        else
            memcpy(mine, in + off * esz, bytes);
        if (barrier(c) < 0)
            return ncclSuccess;
        if (kind == ALL_GATHER)
            for (int q = 0; q < c->n; q++)
                memcpy(out + ((size_t)q * n + off) * esz, c->slots + (size_t)q * SLOT, bytes);
        else
            sum_slots(c, kind == REDUCE_SCATTER ? (size_t)c->rank * chunk * esz : 0, out + off * esz, len, esz);
        if (barrier(c) < 0)
            return ncclSuccess;
    }
    return ncclSuccess;
}

EXPORT ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, ncclDataType_t t, ncclComm_t c,
                                  cudaStream_t s)
{
    (void)s; /* the emulated streams are in order: the collective runs now */
    return collective(ALL_GATHER, "ncclAllGather", send, recv, n, t, -1, c);
}

EXPORT ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                      ncclComm_t c, cudaStream_t s)
{
    (void)s;
    return collective(REDUCE_SCATTER, "ncclReduceScatter", send, recv, n, t, (int)op, c);
}

EXPORT ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                  ncclComm_t c, cudaStream_t s)
{
    (void)s;
    return collective(ALL_REDUCE, "ncclAllReduce", send, recv, n, t, (int)op, c);
}
