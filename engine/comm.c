/* comm.c — comm.h over MPI (Open MPI from the distribution).
 *
 * A process that no launcher started (no mpirun/srun/PMI variables in its environment)
 * does not initialise MPI at all: it is a world of one whose collectives are copies.
 * That keeps `ftk-train` alone free of MPI's start-up cost and quirks (singleton mode,
 * containers); FTK_MPI=1 forces MPI_Init anyway. A planning world (comm_plan) has a size
 * and a rank but no MPI either: its collectives only account.
 *
 * A world given a device library (comm_enable_device; NCCL) keeps its MPI communicators
 * for control traffic and sends the tensor collectives of each to the library's
 * communicator made beside it (engine/comm_dev.h: the set-up order). */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/fault.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/timer.h"
#include "comm.h"
#include "comm_dev.h"
#include "cuda_load.h"

_Static_assert(sizeof(MPI_Request) <= sizeof(((comm_req_t *)0)->impl), "MPI_Request fits comm_req_t");

/* comm_req_t.active: which library holds the request. A device request's impl holds the
 * device communicator and the library's token, copied in and out (impl is only 4-byte
 * aligned). */
enum { REQ_MPI = 1, REQ_DEV = 2 };
typedef struct {
    void *dc, *token;
} dev_req_t;
_Static_assert(sizeof(dev_req_t) <= sizeof(((comm_req_t *)0)->impl), "a device request fits comm_req_t");

enum { KIND_MPI, KIND_SELF, KIND_PLAN };

struct comm {
    MPI_Comm c;
    int rank, size;
    int self; /* no MPI: KIND_SELF (a world of one) or KIND_PLAN */
    int kind;
    comm_stats_t *stats;
    int level; /* COMM_LEVEL_*: where in stats->coll its collectives count */
    backend_t *be; /* a world of one's collectives copy through it */
    /* device communication (comm_enable_device): the library, its shared state (freed by
     * the communicator that made it: owns_dev), this communicator's device communicator */
    const comm_dev_ops_t *dev;
    void *dev_ctx, *dc;
    int owns_dev;
};

/* The device library of the world (comm_test has only the request to go by). */
static const comm_dev_ops_t *dev_ops;

/* The bf16 sum (created at MPI_Init): each pair of contributions added in fp32, the sum
 * rounded to nearest even. */
static MPI_Op bf16_sum_op = MPI_OP_NULL;
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static int launched(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"};
    const char *force = getenv("FTK_MPI");
    if (force && *force)
        return strcmp(force, "0") != 0;
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i]))
            return 1;
    const char *n = getenv("SLURM_STEP_NUM_TASKS");
    return n && atoi(n) > 1;
}

static comm_t *self_comm(int kind, int size, int rank)
{
    comm_t *w = calloc(1, sizeof *w);
    if (!w) {
        ftk_err_set("out of memory");
        return NULL;
    }
    w->size = size;
    w->rank = rank;
    w->self = 1;
    w->kind = kind;
    return w;
}

comm_t *comm_plan(int size, int rank)
{
    if (size < 1 || rank < 0 || rank >= size) {
        ftk_err_set("internal: a planning world of %d ranks has no rank %d", size, rank);
        return NULL;
    }
    return self_comm(KIND_PLAN, size, rank);
}

static comm_t *wrap(MPI_Comm c)
{
    comm_t *w = calloc(1, sizeof *w);
    if (!w) {
        ftk_err_set("out of memory");
        return NULL;
    }
    w->c = c;
    MPI_Comm_rank(c, &w->rank);
    MPI_Comm_size(c, &w->size);
    return w;
}

comm_t *comm_init(int *argc, char ***argv)
{
    if (!launched())
        return self_comm(KIND_SELF, 1, 0);
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        ftk_err_set("MPI_Init failed");
        return NULL;
    }
    MPI_Op_create(bf16_sum, 1, &bf16_sum_op);
    comm_t *w = wrap(MPI_COMM_WORLD);
    if (w && fault_point("mpi.init") < 0) {
        free(w);
        return NULL;
    }
    return w;
}

/* The world whose library the backend's host waits poll (backend.h wait_hook), or NULL:
 * the hook goes through this, not through its argument, so that it is harmless whichever
 * of the backend and the world is freed first. */
static comm_t *poll_world;

static void dev_wait_hook(void *arg)
{
    (void)arg;
    if (poll_world && poll_world->dev && poll_world->dev->poll)
        poll_world->dev->poll(poll_world->dev_ctx);
}

static void dev_release(comm_t *c)
{
    if (poll_world == c)
        poll_world = NULL;
    if (c->dc)
        c->dev->comm_free(c->dc, 0);
    if (c->owns_dev && c->dev_ctx)
        c->dev->ctx_free(c->dev_ctx);
    c->dc = c->dev_ctx = NULL;
    c->dev = NULL;
}

void comm_finalize(comm_t *world)
{
    int self = !world || world->self;
    if (world)
        dev_release(world);
    free(world);
    if (!self) {
        if (bf16_sum_op != MPI_OP_NULL)
            MPI_Op_free(&bf16_sum_op);
        MPI_Finalize();
    }
}

/* ---- device communication ------------------------------------------------------------ */

/* The MPI tag of the "gave up" messages of a device join (dev_attach): nothing else sends
 * point to point on these communicators. */
enum { TAG_GAVE_UP = 0x6674 };
/* A join's outcome, as dev_attach's agreement code: the highest wins, so that every rank
 * reports the first-hand cause, not a rank that gave up because of it. */
enum { JOIN_OK, JOIN_NOTICED, JOIN_TIMED_OUT, JOIN_FAILED };

/* The highest code of c's ranks; when not 0, msg becomes the message of the lowest rank
 * with that code (comm_agree takes the lowest failing rank's, whatever its code). */
static int agree_cause(comm_t *c, int code, char *msg, size_t cap)
{
    int64_t v = code ? (int64_t)code << 32 | (int64_t)(INT32_MAX - c->rank) : 0;
    comm_allreduce_i64(c, &v, 1, COMM_MAX);
    if (!v)
        return 0;
    comm_bcast(c, msg, cap, INT32_MAX - (int)(v & 0xffffffff));
    msg[cap - 1] = 0;
    return (int)(v >> 32);
}

int comm_join_timeout(double *s)
{
    *s = 300;
    return opts_env_seconds("FTK_NCCL_INIT_TIMEOUT", 0, s);
}

/* Polls the join of c->dc until it is done, it failed, a rank of c says it gave up (one
 * such message is received: *received), or the deadline passes. The join's outcome;
 * msg says why when it is not JOIN_OK. */
static int dev_join_wait(comm_t *c, double timeout, int me, char *msg, size_t cap, int *received)
{
    double t_end = time_now() + timeout;
    for (;;) {
        int r = c->dev->ready(c->dc);
        if (r > 0)
            return JOIN_OK;
        if (r < 0) {
            snprintf(msg, cap, "%s", ftk_err_msg());
            return JOIN_FAILED;
        }
        int flag = 0, who = -1;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_GAVE_UP, c->c, &flag, MPI_STATUS_IGNORE);
        if (flag) {
            MPI_Recv(&who, 1, MPI_INT, MPI_ANY_SOURCE, TAG_GAVE_UP, c->c, MPI_STATUS_IGNORE);
            (*received)++;
            snprintf(msg, cap, "rank %d: %s: stopped waiting for the group to join: rank %d gave up", me,
                     c->dev->name, who);
            return JOIN_NOTICED;
        }
        if (time_now() > t_end) {
            snprintf(msg, cap,
                     "rank %d: %s: the group's %d ranks did not all join within %g s (FTK_NCCL_INIT_TIMEOUT): "
                     "a rank failed before it joined, or is stuck",
                     me, c->dev->name, c->size, timeout);
            return JOIN_TIMED_OUT;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

/* c's device communicator (comm_dev.h, step 2): an id from c's rank 0, sent with rank 0's
 * verdict over MPI; every rank starts its join and waits for it, for a "gave up" from
 * another rank, or for the deadline; a rank that fails first-hand (its join, or the wait's
 * deadline) tells the others, then all agree. -1 on every rank of c when one failed. */
static int dev_attach(comm_t *c)
{
    struct {
        int32_t ok;
        unsigned char id[COMM_DEV_ID_MAX];
        char why[480];
    } m;
    memset(&m, 0, sizeof m);
    if (c->rank == 0) {
        m.ok = c->dev->unique_id(c->dev_ctx, m.id) == 0;
        if (!m.ok)
            snprintf(m.why, sizeof m.why, "%s", ftk_err_msg());
    }
    MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, 0, c->c);
    if (!m.ok) {
        ftk_err_set("%s", m.why);
        return -1;
    }
    char msg[512] = "";
    double timeout;
    int me, code, received = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    c->dc = NULL;
    if (comm_join_timeout(&timeout) < 0) {
        code = JOIN_FAILED;
        snprintf(msg, sizeof msg, "rank %d: %s", me, ftk_err_msg());
    } else if (!(c->dc = c->dev->comm_new(c->dev_ctx, m.id, c->size, c->rank))) {
        code = JOIN_FAILED;
        snprintf(msg, sizeof msg, "%s", ftk_err_msg()); /* the library's messages name the rank */
    } else {
        code = dev_join_wait(c, timeout, me, msg, sizeof msg, &received);
    }
    /* first-hand: the others may be waiting for this rank's join, which will not come */
    MPI_Request *sends = NULL;
    int sent = code >= JOIN_TIMED_OUT && c->size > 1 && (sends = malloc((size_t)(c->size - 1) * sizeof *sends));
    for (int r = 0, k = 0; sent && r < c->size; r++)
        if (r != c->rank)
            MPI_Isend(&me, 1, MPI_INT, r, TAG_GAVE_UP, c->c, &sends[k++]);
    if (!agree_cause(c, code, msg, sizeof msg))
        return 0;
    /* every "gave up" sent to this rank is received before the communicator is used again */
    int64_t senders = sent;
    comm_allreduce_i64(c, &senders, 1, COMM_SUM);
    for (int64_t k = received + sent; k < senders; k++)
        MPI_Recv(&(int){0}, 1, MPI_INT, MPI_ANY_SOURCE, TAG_GAVE_UP, c->c, MPI_STATUS_IGNORE);
    if (sent)
        MPI_Waitall(c->size - 1, sends, MPI_STATUSES_IGNORE);
    free(sends);
    if (c->dc)
        c->dev->comm_free(c->dc, 1);
    c->dc = NULL;
    ftk_err_set("%s", msg);
    return -1;
}

int comm_enable_device(comm_t *c, backend_t *be, const comm_dev_ops_t *ops)
{
    if (c->self) /* one process: its collectives stay copies through the backend */
        return 0;
    if (c->dev) {
        ftk_err_set("internal: %s communication enabled twice on one communicator", c->dev->name);
        return -1;
    }
    /* No library (ops NULL: a build without it, or libnccl.so.2 missing on this node only)
     * takes part in the agreement too, or the ranks that have it would wait for this one. */
    char msg[512] = "";
    void *ctx = ops ? ops->ctx_new(be, c->rank) : NULL;
    if (!ctx)
        snprintf(msg, sizeof msg, "%s", ftk_err_msg());
    int who;
    if (comm_agree(c, ctx ? 0 : 1, msg, sizeof msg, &who)) {
        if (ctx)
            ops->ctx_free(ctx);
        ftk_err_set("%s", msg);
        return -1;
    }
    dev_ops = ops;
    c->dev = ops;
    c->dev_ctx = ctx;
    c->owns_dev = 1;
    c->be = be;
    if (dev_attach(c) < 0) {
        dev_release(c);
        return -1;
    }
    if (ops->poll && be) {
        poll_world = c;
        be->wait_hook = dev_wait_hook;
        be->wait_arg = NULL;
    }
    return 0;
}

int comm_alone(const comm_t *c) { return c->self && c->kind == KIND_SELF; }

int comm_enable_nccl(comm_t *world, backend_t *be)
{
    if (world->self)
        return 0;
    return comm_enable_device(world, be, cuda_load_nccl());
}

int comm_nccl_built(void) { return cuda_load_nccl() != NULL; }

int comm_status(comm_t *c) { return c->dev ? c->dev->status(c->dev_ctx) : 0; }

/* A device collective was queued (rc 0: req holds its token) or refused (-1). */
static int dev_issued(comm_t *c, int rc, void *tok, comm_req_t *req)
{
    if (rc < 0)
        return -1;
    dev_req_t d = {c->dc, tok};
    memcpy(req->impl, &d, sizeof d);
    req->active = REQ_DEV;
    return 0;
}

int comm_rank(const comm_t *c) { return c->rank; }
int comm_size(const comm_t *c) { return c->size; }
void comm_set_stats(comm_t *c, comm_stats_t *s) { c->stats = s; }
void comm_set_level(comm_t *c, int level) { c->level = level >= 0 && level < COMM_N_LEVELS ? level : 0; }

void comm_stats_since(comm_stats_t *d, const comm_stats_t *now, const comm_stats_t *before)
{
    *d = *now;
    d->ag_bytes -= before->ag_bytes;
    d->rs_bytes -= before->rs_bytes;
    d->ar_bytes -= before->ar_bytes;
    d->ag_calls -= before->ag_calls;
    d->rs_calls -= before->rs_calls;
    d->ar_calls -= before->ar_calls;
    d->wait_s -= before->wait_s;
    d->inflight_s -= before->inflight_s;
    d->overlap_s -= before->overlap_s;
    for (int l = 0; l < COMM_N_LEVELS; l++)
        for (int k = 0; k < COMM_N_KINDS; k++) {
            comm_coll_t *x = &d->coll[l][k];
            const comm_coll_t *b = &before->coll[l][k];
            x->calls -= b->calls;
            x->bytes -= b->bytes;
            x->busy_s -= b->busy_s;
            x->wait_s -= b->wait_s;
        }
}

int comm_sim_node_ranks(int *n)
{
    *n = 0;
    const char *v = getenv("FTK_SIM_NODE_RANKS");
    if (!v || !*v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 1 || x > INT_MAX) {
        ftk_err_set("FTK_SIM_NODE_RANKS=%s: need a number of ranks per simulated node, at least 1", v);
        return -1;
    }
    *n = (int)x;
    return 0;
}

/* The real node: MPI's shared-memory domain (a planning world is one node). */
static int real_node_rank(comm_t *c, int *local_rank, int *local_size)
{
    if (c->self) {
        *local_rank = c->rank;
        *local_size = c->size;
        return 0;
    }
    MPI_Comm node;
    if (MPI_Comm_split_type(c->c, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
        ftk_err_set("MPI_Comm_split_type failed");
        return -1;
    }
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    return 0;
}

int comm_node_rank(comm_t *c, int *local_rank, int *local_size)
{
    int n;
    if (comm_sim_node_ranks(&n) < 0)
        return -1;
    if (!n)
        return real_node_rank(c, local_rank, local_size);
    int first = c->rank / n * n;
    *local_rank = c->rank - first;
    *local_size = c->size - first < n ? c->size - first : n;
    return 0;
}

int comm_node_blocks(comm_t *c, int *size)
{
    int lr, ls;
    if (comm_node_rank(c, &lr, &ls) < 0)
        return -1;
    int64_t lo[1] = {ls}, hi[2] = {ls, lr == comm_rank(c) % ls ? 0 : 1};
    if (comm_allreduce_i64(c, lo, 1, COMM_MIN) < 0 || comm_allreduce_i64(c, hi, 2, COMM_MAX) < 0)
        return -1;
    if (lo[0] != hi[0] || hi[1]) {
        int sim = 0;
        comm_sim_node_ranks(&sim);
        ftk_err_set("the nodes%s do not hold equal blocks of consecutive ranks (%lld to %lld ranks per node)",
                    sim ? " (simulated: FTK_SIM_NODE_RANKS)" : "", (long long)lo[0], (long long)hi[0]);
        return -1;
    }
    *size = ls;
    return 0;
}

int comm_node_id(comm_t *c, int *node)
{
    int n;
    *node = 0;
    if (comm_sim_node_ranks(&n) < 0)
        return -1;
    if (n) {
        *node = c->rank / n * n;
        return 0;
    }
    if (c->self) /* one node */
        return 0;
    MPI_Comm shm;
    if (MPI_Comm_split_type(c->c, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &shm) != MPI_SUCCESS) {
        ftk_err_set("MPI_Comm_split_type failed");
        return -1;
    }
    MPI_Allreduce(&c->rank, node, 1, MPI_INT, MPI_MIN, shm);
    MPI_Comm_free(&shm);
    return 0;
}

int comm_node_gpu(comm_t *c, int n_gpus)
{
    int local = 0, n_local = 1;
    /* collective: every rank splits, also one that sees a single GPU; the real node even
     * where nodes are simulated (their ranks share this node's GPUs) */
    if (real_node_rank(c, &local, &n_local) < 0)
        return -1;
    if (n_gpus <= 1)
        return 0;
    if (local >= n_gpus) {
        ftk_err_set("rank %d is rank %d of %d on its node, which has %d GPUs: start at most one rank per GPU, or "
                    "give each rank its GPU (CUDA_VISIBLE_DEVICES)",
                    c->rank, local, n_local, n_gpus);
        return -1;
    }
    return local;
}

comm_t *comm_split(comm_t *c, int color, int key)
{
    if (c->kind == KIND_PLAN) {
        ftk_err_set("internal: comm_split on a planning world (use comm_split_blocks)");
        return NULL;
    }
    if (c->self) {
        comm_t *w = self_comm(KIND_SELF, 1, 0);
        if (w) {
            w->stats = c->stats;
            w->be = c->be;
        }
        return w;
    }
    MPI_Comm n;
    if (MPI_Comm_split(c->c, color, key, &n) != MPI_SUCCESS) {
        ftk_err_set("MPI_Comm_split failed");
        return NULL;
    }
    comm_t *w = wrap(n);
    if (w)
        w->stats = c->stats;
    if (!c->dev)
        return w;
    /* The new group's device communicator; then every rank of c learns whether all of
     * them got one, so that no rank goes on to the next split while another has given up. */
    char msg[512] = "";
    if (w) {
        w->dev = c->dev;
        w->dev_ctx = c->dev_ctx;
        w->be = c->be;
        if (dev_attach(w) < 0)
            snprintf(msg, sizeof msg, "%s", ftk_err_msg());
    } else {
        snprintf(msg, sizeof msg, "rank %d: %s", c->rank, ftk_err_msg());
        MPI_Comm_free(&n);
    }
    int who;
    if (comm_agree(c, w && w->dc ? 0 : 1, msg, sizeof msg, &who)) {
        comm_free(w);
        ftk_err_set("%s", msg);
        return NULL;
    }
    return w;
}

int comm_split_blocks(comm_t *c, int block, comm_t **group, comm_t **cross)
{
    *group = *cross = NULL;
    if (block < 1 || c->size % block) {
        ftk_err_set("internal: blocks of %d ranks do not divide %d", block, c->size);
        return -1;
    }
    if (c->kind == KIND_PLAN) {
        *group = comm_plan(block, c->rank % block);
        *cross = comm_plan(c->size / block, c->rank / block);
        if (*group && *cross) {
            (*group)->stats = (*cross)->stats = c->stats;
            return 0;
        }
    } else if ((*group = comm_split(c, c->rank / block, c->rank)) && (*cross = comm_split(c, c->rank % block, c->rank))) {
        return 0;
    }
    comm_free(*group);
    comm_free(*cross);
    *group = *cross = NULL;
    return -1;
}

void comm_free(comm_t *c)
{
    if (!c)
        return;
    dev_release(c);
    if (!c->self && c->c != MPI_COMM_WORLD)
        MPI_Comm_free(&c->c);
    free(c);
}

static int count_ok(int64_t n)
{
    if (n < 0 || n > INT_MAX) {
        ftk_err_set("internal: a collective of %lld elements (MPI counts stop at %d)", (long long)n, INT_MAX);
        return 0;
    }
    return 1;
}

/* A world of one's collective: a copy through its backend; a planning world moves nothing. */
static void self_copy(comm_t *c, void *dst, const void *src, size_t bytes)
{
    if (c->kind == KIND_PLAN)
        return;
    if (c->be)
        c->be->copy(c->be, dst, src, bytes);
    else
        memmove(dst, src, bytes);
}

void comm_set_backend(comm_t *c, backend_t *be) { c->be = be; }

static int dtype_ok(dtype_t dt)
{
    if (dt != DT_F32 && dt != DT_BF16) {
        ftk_err_set("internal: a collective of %s elements (need float32 or bfloat16)", dtype_name(dt));
        return 0;
    }
    return 1;
}
static MPI_Datatype mpi_type(dtype_t dt) { return dt == DT_F32 ? MPI_FLOAT : MPI_UINT16_T; }
static MPI_Op mpi_sum(dtype_t dt) { return dt == DT_F32 ? MPI_SUM : bf16_sum_op; }

static MPI_Request *req_of(comm_req_t *r) { return (MPI_Request *)(void *)r->impl; }

static void account(comm_t *c, double *bytes, int64_t *calls, double total, double factor, dtype_t dt, int kind)
{
    if (c->stats) {
        double v = factor * (double)(c->size - 1) / (double)c->size * total * (double)dtype_size(dt);
        *bytes += v;
        (*calls)++;
        c->stats->coll[c->level][kind].bytes += v;
        c->stats->coll[c->level][kind].calls++;
    }
}

/* Spans (comm.h "Accounting"): the time since the last mark is in flight when a collective
 * is, and overlapped when moreover the host is not blocked in communication. */
static void span_mark(comm_stats_t *s, double now)
{
    if (s->n_inflight > 0) {
        s->inflight_s += now - s->t_mark;
        if (!s->blocked)
            s->overlap_s += now - s->t_mark;
    }
    s->t_mark = now;
}

/* A collective of c was issued into req (active). */
static void span_begin(comm_t *c, comm_req_t *req, int kind)
{
    req->stats = NULL;
    if (!c->stats || !req->active)
        return;
    double now = time_now();
    span_mark(c->stats, now);
    c->stats->n_inflight++;
    req->stats = c->stats;
    req->kind = kind;
    req->level = c->level;
    req->t0 = now;
}

/* req's collective was seen complete at now. */
static void span_end(comm_req_t *req, double now)
{
    comm_stats_t *s = req->stats;
    if (!s)
        return;
    span_mark(s, now);
    s->n_inflight--;
    s->coll[req->level][req->kind].busy_s += now - req->t0;
    req->stats = NULL;
}

/* The host blocks in a communication call of c from now on (until waited()). */
static double block_start(comm_t *c)
{
    double now = time_now();
    if (c && c->stats) {
        span_mark(c->stats, now);
        c->stats->blocked++;
    }
    return now;
}

int comm_allgather(comm_t *c, const void *part, void *full, int64_t n, dtype_t dt, comm_req_t *req)
{
    if (!dtype_ok(dt) || (!c->dc && !count_ok(n)))
        return -1;
    comm_stats_t dummy, *s = c->stats ? c->stats : &dummy;
    account(c, &s->ag_bytes, &s->ag_calls, (double)n * c->size, 1, dt, COMM_KIND_AG);
    if (c->dc) { /* in place when part sits at its place in full: the library sees it too */
        void *tok = NULL;
        int rc = c->dev->allgather(c->dc, part, full, n, dt, &tok); /* before tok is read */
        rc = dev_issued(c, rc, tok, req);
        span_begin(c, req, COMM_KIND_AG);
        return rc;
    }
    if (c->self) {
        self_copy(c, full, part, (size_t)n * dtype_size(dt));
        return 0;
    }
    /* A part already at its place in full is gathered in place. */
    int in_place = (const char *)part == (const char *)full + (size_t)(c->rank * n) * dtype_size(dt);
    MPI_Iallgather(in_place ? MPI_IN_PLACE : part, (int)n, mpi_type(dt), full, (int)n, mpi_type(dt), c->c,
                   req_of(req));
    req->active = REQ_MPI;
    span_begin(c, req, COMM_KIND_AG);
    return 0;
}

int comm_allgather_bytes(comm_t *c, const void *part, void *full, int64_t bytes, comm_req_t *req)
{
    if (bytes % 2) {
        ftk_err_set("internal: a byte all-gather of %lld bytes (need an even count)", (long long)bytes);
        return -1;
    }
    return comm_allgather(c, part, full, bytes / 2, DT_BF16, req);
}

int comm_reduce_scatter(comm_t *c, const void *full, void *part, int64_t n, dtype_t dt, comm_req_t *req)
{
    if (!dtype_ok(dt) || (!c->dc && !count_ok(n)))
        return -1;
    comm_stats_t dummy, *s = c->stats ? c->stats : &dummy;
    account(c, &s->rs_bytes, &s->rs_calls, (double)n * c->size, 1, dt, COMM_KIND_RS);
    if (c->dc) {
        void *tok = NULL;
        int rc = c->dev->reduce_scatter(c->dc, full, part, n, dt, &tok); /* before tok is read */
        rc = dev_issued(c, rc, tok, req);
        span_begin(c, req, COMM_KIND_RS);
        return rc;
    }
    if (c->self) {
        self_copy(c, part, (const char *)full + (size_t)(c->rank * n) * dtype_size(dt), (size_t)n * dtype_size(dt));
        return 0;
    }
    MPI_Ireduce_scatter_block(full, part, (int)n, mpi_type(dt), mpi_sum(dt), c->c, req_of(req));
    req->active = REQ_MPI;
    span_begin(c, req, COMM_KIND_RS);
    return 0;
}

int comm_allreduce(comm_t *c, void *buf, int64_t n, dtype_t dt, comm_req_t *req)
{
    if (!dtype_ok(dt) || (!c->dc && !count_ok(n)))
        return -1;
    comm_stats_t dummy, *s = c->stats ? c->stats : &dummy;
    account(c, &s->ar_bytes, &s->ar_calls, (double)n, 2, dt, COMM_KIND_AR);
    if (c->dc) {
        void *tok = NULL;
        int rc = c->dev->allreduce(c->dc, buf, n, dt, &tok); /* before tok is read */
        rc = dev_issued(c, rc, tok, req);
        span_begin(c, req, COMM_KIND_AR);
        return rc;
    }
    if (c->self)
        return 0;
    MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), mpi_sum(dt), c->c, req_of(req));
    req->active = REQ_MPI;
    span_begin(c, req, COMM_KIND_AR);
    return 0;
}

static void waited(comm_t *c, double t0)
{
    if (c && c->stats) {
        double now = time_now();
        c->stats->wait_s += now - t0;
        span_mark(c->stats, now);
        c->stats->blocked--;
    }
}

int comm_wait(comm_t *c, comm_req_t *req)
{
    if (!req->active)
        return 0;
    if (req->active == REQ_DEV) { /* the compute stream waits; the host does not */
        dev_req_t d;
        memcpy(&d, req->impl, sizeof d);
        req->active = 0;
        span_end(req, time_now());
        return dev_ops->wait(d.dc, d.token);
    }
    double t0 = block_start(c);
    MPI_Wait(req_of(req), MPI_STATUS_IGNORE);
    req->active = 0;
    double t1 = time_now();
    if (req->stats)
        req->stats->coll[req->level][req->kind].wait_s += t1 - t0;
    span_end(req, t1);
    waited(c, t0);
    return 0;
}

int comm_test(comm_req_t *req, int *done)
{
    int flag = 1;
    if (req->active == REQ_DEV) {
        dev_req_t d;
        memcpy(&d, req->impl, sizeof d);
        int rc = dev_ops->test(d.dc, d.token, &flag);
        if (flag || rc < 0) {
            req->active = 0;
            span_end(req, time_now());
        }
        *done = flag || rc < 0;
        return rc;
    }
    if (req->active) {
        MPI_Test(req_of(req), &flag, MPI_STATUS_IGNORE);
        if (flag) {
            req->active = 0;
            span_end(req, time_now());
        }
    }
    *done = flag;
    return 0;
}

static MPI_Op mpi_op(int op) { return op == COMM_MAX ? MPI_MAX : op == COMM_MIN ? MPI_MIN : MPI_SUM; }

int comm_allreduce_f64(comm_t *c, double *v, int n, int op)
{
    if (c->self)
        return 0;
    double t0 = block_start(c);
    MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, mpi_op(op), c->c);
    waited(c, t0);
    return 0;
}

int comm_allreduce_i64(comm_t *c, int64_t *v, int n, int op)
{
    if (c->self)
        return 0;
    double t0 = block_start(c);
    MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, mpi_op(op), c->c);
    waited(c, t0);
    return 0;
}

int comm_bcast(comm_t *c, void *buf, size_t bytes, int root)
{
    if (c->self)
        return 0;
    if (!count_ok((int64_t)bytes))
        return -1;
    double t0 = block_start(c);
    MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->c);
    waited(c, t0);
    return 0;
}

int comm_gather(comm_t *c, const void *send, void *recv, size_t bytes, int root)
{
    if (c->self) { /* a planning world: every rank's record is this one's */
        for (int i = 0; i < c->size; i++)
            memmove((char *)recv + (size_t)i * bytes, send, bytes);
        return 0;
    }
    if (!count_ok((int64_t)bytes))
        return -1;
    double t0 = block_start(c);
    MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, c->c);
    waited(c, t0);
    return 0;
}

int comm_barrier(comm_t *c)
{
    if (c->self)
        return 0;
    double t0 = block_start(c);
    MPI_Barrier(c->c);
    waited(c, t0);
    return 0;
}

int comm_sendrecv(comm_t *c, const void *send, int64_t sbytes, int dest, void *recv, int64_t rbytes, int src)
{
    if (sbytes < 0 || rbytes < 0 || dest >= c->size || src >= c->size) {
        ftk_err_set("internal: comm_sendrecv of %lld/%lld bytes to %d from %d", (long long)sbytes, (long long)rbytes,
                    dest, src);
        return -1;
    }
    if (c->self) { /* a world of one sends to itself only */
        if (dest >= 0 && src >= 0)
            memmove(recv, send, (size_t)(sbytes < rbytes ? sbytes : rbytes));
        return 0;
    }
    const int64_t piece = (int64_t)1 << 30;
    double t0 = block_start(c);
    for (int64_t off = 0; off < sbytes || off < rbytes; off += piece) {
        int64_t ns = dest < 0 || off >= sbytes ? 0 : sbytes - off < piece ? sbytes - off : piece;
        int64_t nr = src < 0 || off >= rbytes ? 0 : rbytes - off < piece ? rbytes - off : piece;
        MPI_Sendrecv(ns ? (const char *)send + off : NULL, (int)ns, MPI_BYTE, dest < 0 || !ns ? MPI_PROC_NULL : dest,
                     7, nr ? (char *)recv + off : NULL, (int)nr, MPI_BYTE, src < 0 || !nr ? MPI_PROC_NULL : src, 7, c->c,
                     MPI_STATUS_IGNORE);
    }
    waited(c, t0);
    return 0;
}

struct comm_p2p {
    comm_t *c;
    int n;
    MPI_Request r[];
};

comm_p2p_t *comm_p2p_start(comm_t *c, const void *send, int64_t sbytes, int dest, void *recv, int64_t rbytes, int src)
{
    const int64_t piece = (int64_t)1 << 30;
    int64_t ns = dest < 0 ? 0 : (sbytes + piece - 1) / piece, nr = src < 0 ? 0 : (rbytes + piece - 1) / piece;
    comm_p2p_t *p = malloc(sizeof *p + (size_t)(ns + nr) * sizeof(MPI_Request));
    if (!p) {
        ftk_err_set("out of memory");
        return NULL;
    }
    p->c = c;
    p->n = 0;
    if (c->self) {
        if (dest >= 0 && src >= 0)
            memmove(recv, send, (size_t)(sbytes < rbytes ? sbytes : rbytes));
        return p;
    }
    for (int64_t off = 0; off < sbytes && dest >= 0; off += piece)
        MPI_Isend((const char *)send + off, (int)(sbytes - off < piece ? sbytes - off : piece), MPI_BYTE, dest, 8, c->c,
                  &p->r[p->n++]);
    for (int64_t off = 0; off < rbytes && src >= 0; off += piece)
        MPI_Irecv((char *)recv + off, (int)(rbytes - off < piece ? rbytes - off : piece), MPI_BYTE, src, 8, c->c,
                  &p->r[p->n++]);
    return p;
}

int comm_p2p_wait(comm_p2p_t *p)
{
    if (!p)
        return 0;
    if (p->n) {
        double t0 = block_start(p->c);
        MPI_Waitall(p->n, p->r, MPI_STATUSES_IGNORE);
        waited(p->c, t0);
    }
    free(p);
    return 0;
}

int comm_agree(comm_t *c, int code, char *msg, size_t cap, int *who)
{
    return comm_agree_first(c, code, 0, msg, cap, who);
}

int comm_agree_first(comm_t *c, int code, int after_peer, char *msg, size_t cap, int *who)
{
    /* -rank for a first-hand failure, -(size + rank) after a peer's: the maximum is the
     * lowest first-hand rank where there is one */
    int64_t n = c->size, v[2] = {code, code ? -(int64_t)c->rank - (after_peer ? n : 0) : INT64_MIN};
    comm_allreduce_i64(c, v, 2, COMM_MAX);
    *who = 0;
    if (!v[0])
        return 0;
    *who = (int)(-v[1] % n);
    comm_bcast(c, msg, cap, *who);
    msg[cap - 1] = 0;
    return (int)v[0];
}
