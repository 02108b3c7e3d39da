/* comm_mpi.c — comm.h over MPI (Open MPI from the distribution).
 *
 * A process that no launcher started (no mpirun/srun/PMI variables in its environment)
 * does not initialise MPI at all: it is a world of one whose collectives are copies.
 * That keeps `ftk-train` alone free of MPI's start-up cost and quirks (singleton mode,
 * containers); FTK_MPI=1 forces MPI_Init anyway. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "../libcommon/timer.h"
#include "comm.h"

_Static_assert(sizeof(MPI_Request) <= sizeof(((comm_req_t *)0)->impl), "MPI_Request fits comm_req_t");

struct comm {
    MPI_Comm c;
    int rank, size;
    int self; /* a world of one without MPI */
    comm_stats_t *stats;
    void (*copy)(void *dst, const void *src, size_t bytes); /* a world of one's collectives */
};

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

static comm_t *self_comm(void)
{
    comm_t *w = calloc(1, sizeof *w);
    if (!w) {
        ftk_err_set("out of memory");
        return NULL;
    }
    w->size = 1;
    w->self = 1;
    return w;
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
        return self_comm();
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        ftk_err_set("MPI_Init failed");
        return NULL;
    }
    return wrap(MPI_COMM_WORLD);
}

void comm_finalize(comm_t *world)
{
    int self = !world || world->self;
    free(world);
    if (!self)
        MPI_Finalize();
}

int comm_rank(const comm_t *c) { return c->rank; }
int comm_size(const comm_t *c) { return c->size; }
void comm_set_stats(comm_t *c, comm_stats_t *s) { c->stats = s; }

int comm_node_rank(comm_t *c, int *local_rank, int *local_size)
{
    if (c->self) {
        *local_rank = 0;
        *local_size = 1;
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

comm_t *comm_split(comm_t *c, int color, int key)
{
    if (c->self) {
        comm_t *w = self_comm();
        if (w) {
            w->stats = c->stats;
            w->copy = c->copy;
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
    return w;
}

void comm_free(comm_t *c)
{
    if (!c)
        return;
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

static void self_copy(comm_t *c, void *dst, const void *src, size_t bytes)
{
    if (c->copy)
        c->copy(dst, src, bytes);
    else
        memmove(dst, src, bytes);
}

void comm_set_copy(comm_t *c, void (*copy)(void *dst, const void *src, size_t bytes)) { c->copy = copy; }

static MPI_Request *req_of(comm_req_t *r) { return (MPI_Request *)(void *)r->impl; }

static void account(comm_t *c, double *bytes, int64_t *calls, double total, double factor)
{
    if (c->stats) {
        *bytes += factor * (double)(c->size - 1) / (double)c->size * total * sizeof(float);
        (*calls)++;
    }
}

int comm_allgather(comm_t *c, const float *part, float *full, int64_t n, comm_req_t *req)
{
    if (!count_ok(n))
        return -1;
    comm_stats_t dummy, *s = c->stats ? c->stats : &dummy;
    account(c, &s->ag_bytes, &s->ag_calls, (double)n * c->size, 1);
    if (c->self) {
        self_copy(c, full, part, (size_t)n * sizeof *full);
        return 0;
    }
    MPI_Iallgather(part, (int)n, MPI_FLOAT, full, (int)n, MPI_FLOAT, c->c, req_of(req));
    req->active = 1;
    return 0;
}

int comm_reduce_scatter(comm_t *c, const float *full, float *part, int64_t n, comm_req_t *req)
{
    if (!count_ok(n))
        return -1;
    comm_stats_t dummy, *s = c->stats ? c->stats : &dummy;
    account(c, &s->rs_bytes, &s->rs_calls, (double)n * c->size, 1);
    if (c->self) {
        self_copy(c, part, full, (size_t)n * sizeof *part);
        return 0;
    }
    MPI_Ireduce_scatter_block(full, part, (int)n, MPI_FLOAT, MPI_SUM, c->c, req_of(req));
    req->active = 1;
    return 0;
}

int comm_allreduce(comm_t *c, float *buf, int64_t n, comm_req_t *req)
{
    if (!count_ok(n))
        return -1;
    comm_stats_t dummy, *s = c->stats ? c->stats : &dummy;
    account(c, &s->ar_bytes, &s->ar_calls, (double)n, 2);
    if (c->self)
        return 0;
    MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->c, req_of(req));
    req->active = 1;
    return 0;
}

static void waited(comm_t *c, double t0)
{
    if (c && c->stats)
        c->stats->wait_s += time_now() - t0;
}

int comm_wait(comm_t *c, comm_req_t *req)
{
    if (!req->active)
        return 0;
    double t0 = time_now();
    MPI_Wait(req_of(req), MPI_STATUS_IGNORE);
    req->active = 0;
    waited(c, t0);
    return 0;
}

int comm_test(comm_req_t *req, int *done)
{
    int flag = 1;
    if (req->active) {
        MPI_Test(req_of(req), &flag, MPI_STATUS_IGNORE);
        if (flag)
            req->active = 0;
    }
    *done = flag;
    return 0;
}

static MPI_Op mpi_op(int op) { return op == COMM_MAX ? MPI_MAX : op == COMM_MIN ? MPI_MIN : MPI_SUM; }

int comm_allreduce_f64(comm_t *c, double *v, int n, int op)
{
    if (c->self)
        return 0;
    double t0 = time_now();
    MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, mpi_op(op), c->c);
    waited(c, t0);
    return 0;
}

int comm_allreduce_i64(comm_t *c, int64_t *v, int n, int op)
{
    if (c->self)
        return 0;
    double t0 = time_now();
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
    double t0 = time_now();
    MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->c);
    waited(c, t0);
    return 0;
}

int comm_gather(comm_t *c, const void *send, void *recv, size_t bytes, int root)
{
    if (c->self) {
        memmove(recv, send, bytes);
        return 0;
    }
    if (!count_ok((int64_t)bytes))
        return -1;
    double t0 = time_now();
    MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, c->c);
    waited(c, t0);
    return 0;
}

int comm_barrier(comm_t *c)
{
    if (c->self)
        return 0;
    double t0 = time_now();
    MPI_Barrier(c->c);
    waited(c, t0);
    return 0;
}
