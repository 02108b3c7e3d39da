/* comm_nccl.c — NCCL behind comm.h's tensor collectives: engine/comm_dev.h's table. Plain C
 * against the CUDA runtime API; built only where nvcc and nccl.h are found (Makefile), into
 * the CUDA library (engine/cuda_lib.h's table, reached through engine/cuda_load.h).
 *
 * One context per world (shared by its groups' communicators):
 *  - the device of the CUDA backend, read from its name ("cuda:N (…)", backend.h), made
 *    current before every CUDA or NCCL call (another instance may have changed it);
 *  - the compute stream: the backend's default stream (stream_native(be, NULL)), the one
 *    the model and the shard engine issue on;
 *  - one communication stream (non-blocking: the legacy default stream does not order it),
 *    on which every communicator of the world queues, so their collectives run in the
 *    order issued, the same on every rank (two streams could each wait for a peer that is
 *    waiting in the other: a deadlock);
 *  - one event, recorded on the compute stream before each collective and waited for by
 *    the communication stream: the collective reads what compute wrote before the call,
 *    and a buffer that compute released before it (the shard engine's pool) is not
 *    overwritten early.
 * A collective's completion is an event of its own (no timing), the request's token:
 * wait() makes the compute stream wait for it and destroys it (CUDA keeps it until the
 * wait is honoured). An event per collective costs microseconds against collectives of
 * megabytes; a pool can come when a profile says so.
 *
 * Errors: every CUDA and NCCL call is checked; a message names the world rank, the call,
 * and NCCL's words (ncclGetErrorString, ncclGetLastError). An asynchronous error (a peer
 * gone, a network failure) is looked for with ncclCommGetAsyncError whenever a request is
 * waited for or tested; then the world's communicators are aborted (ncclCommAbort, all in
 * one NCCL group: abort_world) so that no stream waits for them forever, and the world's
 * context keeps the first message: every later call and status() fail with it. While the
 * host waits for the device (the backend's sync, upload, download), the backend polls and
 * calls nc_poll (backend.h wait_hook, set by comm_enable_device), which looks at every
 * communicator: a peer lost while the compute stream waits for a collective aborts them
 * all, so the wait ends and the step fails instead of blocking until the job's time limit.
 * A failed world's communicators are aborted, not destroyed, when freed.
 *
 * Joining: ncclCommInitRank returns only when every rank of the group has called it, so a
 * rank that failed before (its own error, a bad NCCL setting on its node) would leave the
 * others in it for good. It runs on a thread of its own (the joiner) and comm.c polls
 * nc_ready while it watches for the other ranks' "gave up" and a deadline (comm_dev.h).
 * A join given up on (comm_free with abandon) stays with its thread, which aborts the
 * communicator should it ever complete (unless the program's exit has begun) and frees it;
 * one that never completes is left behind, blocked, for the program's exit (ftk-train
 * exits 1 after a failed set-up).
 * NCCL's own non-blocking mode (config.blocking = 0) is not used: it would make every
 * later collective return ncclInProgress from a thread NCCL starts for it, to be polled.
 *
 * libnccl.so.2 is opened at run time (dlopen), not linked: the tools that link this start
 * on a machine without NCCL (a GPU node lent with the CUDA toolkit alone) and run on one
 * GPU; only an NCCL world needs the library, and comm_nccl_ops() says when it is missing.
 * The function pointers take their types from nccl.h (__typeof__), so the compiler checks
 * every call as if it were linked.
 *
 * NOTHING HERE HAS RUN ON A GPU YET when this was written: tests/gpu/check.sh's nccl-comm
 * and nccl-train steps are its first checks there. Without a GPU it runs over an emulated
 * NCCL (tests/gpu/emu/emu_nccl.c: shared memory between the processes of one machine), in
 * make test's gpu/nccl-emulated: the contract test, 2- and 4-rank training against MPI,
 * the duplicate-GPU refusal and a failed collective's report. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "comm_dev.h"

_Static_assert(sizeof(ncclUniqueId) <= COMM_DEV_ID_MAX, "ncclUniqueId fits comm_dev's id");

/* NCCL's functions, from dlopen (see above); nc.lib: 1 loaded, -1 failed, 0 not tried. */
static struct {
    int lib;
    __typeof__(&ncclGetVersion) GetVersion;
    __typeof__(&ncclGetUniqueId) GetUniqueId;
    __typeof__(&ncclCommInitRank) CommInitRank;
    __typeof__(&ncclCommDestroy) CommDestroy;
    __typeof__(&ncclCommAbort) CommAbort;
    __typeof__(&ncclGroupStart) GroupStart;
    __typeof__(&ncclGroupEnd) GroupEnd;
    __typeof__(&ncclCommGetAsyncError) CommGetAsyncError;
    __typeof__(&ncclGetErrorString) GetErrorString;
    __typeof__(&ncclGetLastError) GetLastError;
    __typeof__(&ncclAllGather) AllGather;
    __typeof__(&ncclReduceScatter) ReduceScatter;
    __typeof__(&ncclAllReduce) AllReduce;
    char why[400];
} nc;

/* Set when the program's exit has begun: an abandoned join that completes then leaves its
 * communicator to the exit (an abort would race with the CUDA runtime's and NCCL's own
 * teardown). */
static atomic_int nc_exiting;
static void nc_at_exit(void) { atomic_store(&nc_exiting, 1); }

static int nccl_load(void)
{
    if (nc.lib)
        return nc.lib;
    nc.lib = -1;
    /* NCCL_COMM_ID gives every id the same root address: the communicators that ftk makes at
     * once (hybrid's groups) would meet at one root. ftk sends each id over MPI instead. */
    const char *cid = getenv("NCCL_COMM_ID");
    if (cid && *cid) {
        snprintf(nc.why, sizeof nc.why,
                 "NCCL_COMM_ID is set (%.100s): ftk sends each communicator's id over MPI; unset it", cid);
        return -1;
    }
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(nc.why, sizeof nc.why, "NCCL is not installed here (%s)", e ? e : "libnccl.so.2 not found");
        return -1;
    }
    struct {
        const char *name;
        void **fn;
    } sym[] = {
        {"ncclGetVersion", (void **)&nc.GetVersion},
        {"ncclGetUniqueId", (void **)&nc.GetUniqueId},
        {"ncclCommInitRank", (void **)&nc.CommInitRank},
        {"ncclCommDestroy", (void **)&nc.CommDestroy},
        {"ncclCommAbort", (void **)&nc.CommAbort},
        {"ncclGroupStart", (void **)&nc.GroupStart},
        {"ncclGroupEnd", (void **)&nc.GroupEnd},
        {"ncclCommGetAsyncError", (void **)&nc.CommGetAsyncError},
        {"ncclGetErrorString", (void **)&nc.GetErrorString},
        {"ncclGetLastError", (void **)&nc.GetLastError},
        {"ncclAllGather", (void **)&nc.AllGather},
        {"ncclReduceScatter", (void **)&nc.ReduceScatter},
        {"ncclAllReduce", (void **)&nc.AllReduce},
    };
    for (size_t i = 0; i < sizeof sym / sizeof *sym; i++)
        if (!(*sym[i].fn = dlsym(h, sym[i].name))) {
            snprintf(nc.why, sizeof nc.why, "libnccl.so.2 lacks %s (too old an NCCL)", sym[i].name);
            return -1;
        }
    /* ncclBfloat16 came with 2.10, ncclGetLastError with 2.13 */
    int v = 0;
    if (nc.GetVersion(&v) != ncclSuccess || v < 21300) {
        snprintf(nc.why, sizeof nc.why, "libnccl.so.2 is NCCL version code %d; ftk needs 2.13 or newer", v);
        return -1;
    }
    atexit(nc_at_exit);
    nc.lib = 1;
    return 1;
}

typedef struct nccl_comm nccl_comm_t;

typedef struct {
    int device, rank; /* rank: this process's rank in the world, for messages */
    cudaStream_t compute, stream;
    cudaEvent_t ready;
    int failed;     /* the first error, kept: why */
    int after_peer; /* ... was a peer's failure (ncclRemoteError): status() -2 */
    char why[512];
    nccl_comm_t **comms; /* the live communicators, for nc_poll */
    int n_comms, cap_comms;
} nccl_ctx_t;

/* A join's progress (nccl_comm_t.state, under .mu; see the top). */
enum { J_JOINING, J_DONE, J_ABANDONED };

struct nccl_comm {
    nccl_ctx_t *x;
    ncclComm_t comm;
    int rank, size, aborted;
    int reaped, listed; /* the joiner's thread joined; the communicator in x->comms */
    /* the join: what the joiner reads, and what it leaves (comm, result, last) */
    pthread_t joiner;
    pthread_mutex_t mu;
    int state, device;
    ncclUniqueId id;
    ncclResult_t result;
    cudaError_t cuda_result; /* selecting the device on the joiner */
};

static int fail(nccl_ctx_t *x, const char *fmt, ...) FTK_PRINTF(2, 3);
static int fail(nccl_ctx_t *x, const char *fmt, ...)
{
    char b[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    ftk_err_set("rank %d: %s", x->rank, b);
    if (!x->failed) {
        x->failed = 1;
        snprintf(x->why, sizeof x->why, "%s", ftk_err_msg());
    }
    return -1;
}

static int cu_ok(nccl_ctx_t *x, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError(); /* a sticky error stays; a transient one is cleared */
    return fail(x, "CUDA device %d: %s: %s", x->device, what, cudaGetErrorString(e));
}

/* Ends d's collectives and the communicator (once): nothing waits for it any more. */
static void abort_comm(nccl_comm_t *d)
{
    if (d->comm && !d->aborted) {
        nc.CommAbort(d->comm);
        d->aborted = 1;
    }
}

/* A failed world: every communicator aborted, d too where it is not one of them (a join
 * that failed). Together, in one NCCL group: an abort sets its communicator's flag, then
 * waits for that communicator's internal stream, which NCCL orders after the shared
 * communication stream; a kernel of another communicator stuck ahead of it there would
 * hold an abort made alone until that one's flag is set too: never. In a group every flag
 * is set first and the waits run at ncclGroupEnd. */
static void abort_world(nccl_ctx_t *x, nccl_comm_t *d)
{
    nc.GroupStart();
    for (int i = 0; i < x->n_comms; i++)
        abort_comm(x->comms[i]);
    if (d)
        abort_comm(d);
    nc.GroupEnd();
}

/* A failed NCCL call: the message; the world's communicators are aborted so that nothing
 * waits on them (nothing after the first error may run: enter()). */
static int nc_fail(nccl_comm_t *d, ncclResult_t r, const char *what)
{
    const char *last = d->comm ? nc.GetLastError(d->comm) : nc.GetLastError(NULL);
    if (!d->x->failed)
        d->x->after_peer = r == ncclRemoteError;
    char group[64] = "";
    if (d->size > 0)
        snprintf(group, sizeof group, " (rank %d of %d in the group)", d->rank, d->size);
    fail(d->x, "NCCL %s%s: %s%s%s%s", what, group, nc.GetErrorString(r), last && *last ? " (" : "",
         last && *last ? last : "", last && *last ? ")" : "");
    abort_world(d->x, d);
    return -1;
}

/* The device current and no error seen on the world; else -1 with the first one. */
static int enter(nccl_ctx_t *x)
{
    if (x->failed) {
        ftk_err_set("%s", x->why);
        return -1;
    }
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess || d != x->device)
        return cu_ok(x, cudaSetDevice(x->device), "selecting the device");
    return 0;
}

/* The asynchronous error of d's communicator, if any (see above). */
static int healthy(nccl_comm_t *d)
{
    if (enter(d->x) < 0)
        return -1;
    ncclResult_t st = ncclSuccess, r = nc.CommGetAsyncError(d->comm, &st);
    if (r != ncclSuccess)
        return nc_fail(d, r, "ncclCommGetAsyncError");
    if (st != ncclSuccess && st != ncclInProgress)
        return nc_fail(d, st, "a collective in flight");
    return 0;
}

static void *nc_ctx_new(backend_t *be, int world_rank)
{
    nccl_ctx_t *x = calloc(1, sizeof *x);
    if (!x) {
        ftk_err_set("rank %d: out of memory", world_rank);
        return NULL;
    }
    x->rank = world_rank;
    x->device = -1;
    if (!be || strcmp(be->name, "cuda") || sscanf(be->device, "cuda:%d", &x->device) != 1) {
        ftk_err_set("rank %d: NCCL needs the cuda backend's memory (this rank's backend: %s)", world_rank,
                    be ? be->device : "none");
        free(x);
        return NULL;
    }
    x->compute = (cudaStream_t)be->stream_native(be, NULL);
    if (cu_ok(x, cudaSetDevice(x->device), "selecting the device") < 0 ||
        cu_ok(x, cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking), "creating the NCCL stream") < 0) {
        free(x);
        return NULL;
    }
    if (cu_ok(x, cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming), "creating an event") < 0) {
        cudaStreamDestroy(x->stream);
        free(x);
        return NULL;
    }
    return x;
}

static void nc_ctx_free(void *ctx)
{
    nccl_ctx_t *x = ctx;
    if (!x)
        return;
    int d = -1;
    if (cudaGetDevice(&d) == cudaSuccess && d != x->device)
        cudaSetDevice(x->device);
    cudaEventDestroy(x->ready);
    cudaStreamDestroy(x->stream); /* what is queued still runs */
    free(x->comms);
    free(x);
}

static int nc_ctx_status(void *ctx)
{
    nccl_ctx_t *x = ctx;
    if (x->failed) {
        ftk_err_set("%s", x->why);
        return x->after_peer ? -2 : -1;
    }
    return 0;
}

static int nc_unique_id(void *ctx, unsigned char id[COMM_DEV_ID_MAX])
{
    nccl_ctx_t *x = ctx;
    nccl_comm_t tmp = {.x = x}; /* no group yet: size 0 */
    ncclUniqueId u;
    if (enter(x) < 0)
        return -1;
    ncclResult_t r = nc.GetUniqueId(&u);
    if (r != ncclSuccess)
        return nc_fail(&tmp, r, "ncclGetUniqueId");
    memset(id, 0, COMM_DEV_ID_MAX);
    memcpy(id, &u, sizeof u);
    return 0;
}

/* The joiner (see the top): touches only d's join fields, never d->x, which the caller
 * may have freed after abandoning d. */
static void *joiner_main(void *arg)
{
    nccl_comm_t *d = arg;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclUnhandledCudaError;
    cudaError_t e = cudaSetDevice(d->device); /* NCCL takes the thread's current device */
    if (e == cudaSuccess)
        r = nc.CommInitRank(&comm, d->size, d->id, d->rank);
    pthread_mutex_lock(&d->mu);
    int abandoned = d->state == J_ABANDONED;
    if (!abandoned) {
        d->comm = r == ncclSuccess ? comm : NULL;
        d->result = r;
        d->cuda_result = e;
        d->state = J_DONE;
    }
    pthread_mutex_unlock(&d->mu);
    if (abandoned) {
        if (r == ncclSuccess && !atomic_load(&nc_exiting))
            nc.CommAbort(comm);
        pthread_mutex_destroy(&d->mu);
        free(d);
    }
    return NULL;
}

static void *nc_comm_new(void *ctx, const unsigned char id[COMM_DEV_ID_MAX], int size, int rank)
{
    nccl_ctx_t *x = ctx;
    nccl_comm_t *d = calloc(1, sizeof *d);
    if (!d) {
        fail(x, "out of memory");
        return NULL;
    }
    *d = (nccl_comm_t){.x = x, .rank = rank, .size = size, .state = J_JOINING, .device = x->device};
    memcpy(&d->id, id, sizeof d->id);
    if (enter(x) < 0) {
        free(d);
        return NULL;
    }
    /* NCCL's blocking join runs its whole set-up on this thread; NCCL gives the threads it
     * starts 8 MiB of stack (2 MiB have crashed it), but this one is ours: the same. */
    pthread_attr_t at;
    int e = pthread_attr_init(&at);
    if (!e) {
        if (!(e = pthread_attr_setstacksize(&at, (size_t)8 << 20)) && !(e = pthread_mutex_init(&d->mu, NULL)) &&
            (e = pthread_create(&d->joiner, &at, joiner_main, d)))
            pthread_mutex_destroy(&d->mu);
        pthread_attr_destroy(&at);
    }
    if (e) {
        fail(x, "starting the NCCL join: %s", strerror(e));
        free(d);
        return NULL;
    }
    return d;
}

static int nc_ready(void *dc)
{
    nccl_comm_t *d = dc;
    nccl_ctx_t *x = d->x;
    if (d->listed)
        return 1;
    pthread_mutex_lock(&d->mu);
    int st = d->state;
    pthread_mutex_unlock(&d->mu);
    if (st == J_JOINING)
        return 0;
    if (!d->reaped)
        pthread_join(d->joiner, NULL); /* it has set J_DONE: its last steps */
    d->reaped = 1;
    if (d->cuda_result != cudaSuccess)
        return cu_ok(x, d->cuda_result, "selecting the device for the NCCL join");
    if (d->result != ncclSuccess) /* NCCL's last error is global: the joiner's, still */
        return nc_fail(d, d->result, "ncclCommInitRank");
    if (x->n_comms == x->cap_comms) {
        int cap = x->cap_comms ? 2 * x->cap_comms : 4;
        nccl_comm_t **p = realloc(x->comms, (size_t)cap * sizeof *p);
        if (!p) {
            abort_comm(d);
            return fail(x, "out of memory");
        }
        x->comms = p;
        x->cap_comms = cap;
    }
    x->comms[x->n_comms++] = d;
    d->listed = 1;
    return 1;
}

static void nc_comm_free(void *dc, int abandon)
{
    nccl_comm_t *d = dc;
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    int joining = d->state == J_JOINING;
    pthread_t t = d->joiner;
    if (joining)
        d->state = J_ABANDONED; /* from here the joiner owns d, and frees it */
    pthread_mutex_unlock(&d->mu);
    if (joining) {
        pthread_detach(t);
        return;
    }
    if (!d->reaped)
        pthread_join(d->joiner, NULL); /* done, not polled since */
    for (int i = 0; d->listed && i < d->x->n_comms; i++)
        if (d->x->comms[i] == d) {
            d->x->comms[i] = d->x->comms[--d->x->n_comms];
            break;
        }
    if (d->comm && !d->aborted) {
        int cur = -1;
        if (cudaGetDevice(&cur) == cudaSuccess && cur != d->x->device)
            cudaSetDevice(d->x->device);
        /* Destroy waits for what is queued on it, which may never finish in a failed world
         * (a peer gone) or a failed set-up: abort that one. */
        if (abandon || d->x->failed)
            abort_comm(d);
        else
            nc.CommDestroy(d->comm);
    }
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static int nccl_type(dtype_t dt, ncclDataType_t *t)
{
    if (dt == DT_F32)
        *t = ncclFloat32;
    else if (dt == DT_BF16)
        *t = ncclBfloat16;
    else
        return -1;
    return 0;
}

/* Before a collective: the communication stream waits for what compute has queued. */
static int before(nccl_comm_t *d, dtype_t dt, ncclDataType_t *t)
{
    if (d->aborted) {
        ftk_err_set("%s", d->x->why);
        return -1;
    }
    if (nccl_type(dt, t) < 0) {
        ftk_err_set("internal: an NCCL collective of %s elements", dtype_name(dt));
        return -1;
    }
    nccl_ctx_t *x = d->x;
    if (enter(x) < 0 || cu_ok(x, cudaEventRecord(x->ready, x->compute), "recording an event on compute") < 0 ||
        cu_ok(x, cudaStreamWaitEvent(x->stream, x->ready, 0), "ordering NCCL after compute") < 0)
        return -1;
    return 0;
}

/* After it: the event that marks its completion, the request's token. */
static int after(nccl_comm_t *d, ncclResult_t r, const char *what, void **token)
{
    *token = NULL;
    if (r != ncclSuccess)
        return nc_fail(d, r, what);
    nccl_ctx_t *x = d->x;
    cudaEvent_t ev;
    if (cu_ok(x, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "creating an event") < 0)
        return -1;
    if (cu_ok(x, cudaEventRecord(ev, x->stream), "recording an event after NCCL") < 0) {
        cudaEventDestroy(ev);
        return -1;
    }
    *token = ev;
    return 0;
}

static int nc_allgather(void *dc, const void *part, void *full, int64_t n, dtype_t dt, void **token)
{
    nccl_comm_t *d = dc;
    ncclDataType_t t;
    *token = NULL;
    if (before(d, dt, &t) < 0)
        return -1;
    /* part == full + rank·n: NCCL gathers in place by itself */
    return after(d, nc.AllGather(part, full, (size_t)n, t, d->comm, d->x->stream), "ncclAllGather", token);
}

static int nc_reduce_scatter(void *dc, const void *full, void *part, int64_t n, dtype_t dt, void **token)
{
    nccl_comm_t *d = dc;
    ncclDataType_t t;
    *token = NULL;
    if (before(d, dt, &t) < 0)
        return -1;
    return after(d, nc.ReduceScatter(full, part, (size_t)n, t, ncclSum, d->comm, d->x->stream),
                 "ncclReduceScatter", token);
}

static int nc_allreduce(void *dc, void *buf, int64_t n, dtype_t dt, void **token)
{
    nccl_comm_t *d = dc;
    ncclDataType_t t;
    *token = NULL;
    if (before(d, dt, &t) < 0)
        return -1;
    return after(d, nc.AllReduce(buf, buf, (size_t)n, t, ncclSum, d->comm, d->x->stream), "ncclAllReduce",
                 token);
}

static int nc_wait(void *dc, void *token)
{
    nccl_comm_t *d = dc;
    cudaEvent_t ev = token;
    if (!ev)
        return 0;
    int rc = healthy(d);
    if (rc == 0)
        rc = cu_ok(d->x, cudaStreamWaitEvent(d->x->compute, ev, 0), "ordering compute after NCCL");
    cudaEventDestroy(ev);
    return rc;
}

static int nc_test(void *dc, void *token, int *done)
{
    nccl_comm_t *d = dc;
    cudaEvent_t ev = token;
    *done = 1;
    if (!ev)
        return 0;
    int rc = healthy(d);
    if (rc == 0) {
        /* "not ready" also stays as the thread's last CUDA error: the CUDA backend, which
         * reads that after each launch, takes it for no error (cuda_internal.cuh last_error). */
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaErrorNotReady) {
            *done = 0;
            return 0;
        }
        rc = cu_ok(d->x, e, "polling an NCCL collective");
    }
    cudaEventDestroy(ev);
    return rc;
}

/* Called while the host waits for the device (comm_dev.h poll): an asynchronous error on any
 * communicator fails the world, and every communicator is then aborted, so that a stream
 * waiting for one of their collectives is released and the wait ends. */
static int nc_poll(void *ctx)
{
    nccl_ctx_t *x = ctx;
    for (int i = 0; i < x->n_comms && !x->failed; i++)
        if (!x->comms[i]->aborted)
            healthy(x->comms[i]);
    if (!x->failed)
        return 0;
    abort_world(x, NULL);
    return -1;
}

static const comm_dev_ops_t nccl_ops = {
    .name = "NCCL",
    .ctx_new = nc_ctx_new,
    .ctx_free = nc_ctx_free,
    .status = nc_ctx_status,
    .unique_id = nc_unique_id,
    .comm_new = nc_comm_new,
    .ready = nc_ready,
    .comm_free = nc_comm_free,
    .allgather = nc_allgather,
    .reduce_scatter = nc_reduce_scatter,
    .allreduce = nc_allreduce,
    .wait = nc_wait,
    .test = nc_test,
    .poll = nc_poll,
};

const comm_dev_ops_t *comm_nccl_ops(void)
{
    if (nccl_load() < 0) {
        ftk_err_set("%s", nc.why);
        return NULL;
    }
    return &nccl_ops;
}
