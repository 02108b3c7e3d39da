/* shard.c — sharded data parallelism over comm.h (shard.h). */
#include "shard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/sround.h"
#include "../libcommon/log.h"
#include "hpz.h"
#include "units.h"
#include "compress.h"

enum { ABSENT, IN_FLIGHT, RESIDENT };
#define RS_IN_FLIGHT 2 /* reduce-scatters in flight at most (shard.h "Overlap") */

typedef struct {
    void *p;
    size_t bytes;
    bk_mem_class_t cls;
} pooled_t;

struct shard {
    backend_t *be;
    strategy_t strat;
    const strategy_traits_t *t; /* strat's */
    precision_t prec;
    units_policy_t policy; /* shard_set_units' */
    precision_dtypes_t dt;
    comm_t *world, *group, *cross; /* group == world except for hybrid; cross: hybrid only */
    int S, r, replica;
    int node_size; /* hpz: ranks per node group */
    ckpt_unit_t *units;
    int n_units, tied;
    int64_t *lo, *len; /* owned range of each unit */
    void **p, **m, **v, **g; /* owned state (state dtype) and gradient (gradient dtype) */
    void **w;                /* bf16-mixed: the working copy of p in the compute dtype */
    /* whole-unit buffers of the current pass */
    void **full, **gbuf, **rsbuf;
    int cw;    /* --compress-weights (compress.h) */
    void **pk; /* a compressed gather's packed parts, held from its issue to its completion */
    int cg;    /* --compress-grads (compress.h) */
    void **e;  /* its residual: whole units, f32, kept from step to step */
    void **q;  /* a unit's gradient in bf16 while its reduce-scatter is in flight */
    int *ag_state;
    comm_req_t *ag, *rs, *ar;
    int rs_fifo[RS_IN_FLIGHT], rs_n; /* units whose reduce-scatter is in flight, oldest first */
    /* the order in which the pass asks for parameters (prefetch) */
    int *sched, n_sched, pos, last_pass;
    /* communication units (units.h): a group's gather and reduce-scatter live at its first
     * storage unit's index (ag_state, ag, rs, rs_fifo); full and gbuf of its blocks point
     * into one buffer of the group, held at the first's index */
    units_map_t cu;
    void **stage, **rsstage; /* a group's [rank][block][slice] buffers, in flight */
    int *gdone;              /* a group's blocks whose gradient is done in this pass */
    pooled_t *pool;
    int n_pool, cap_pool;
    int reserving, failed; /* shard_reserve(): no communication; a buffer could not be had */
    double *sq;            /* shard_set_sumsq: a Σg² slot per unit (backend memory), or NULL */
    int *folded;           /* sq[u] holds Σg[u]² of the gradient as it is (shard_sumsq_folded) */
    int first_write;       /* shard_set_first_write: gradients written by the step's first pass */
    /* shard_set_sumsq_side: Σg² of a finished unit on a stream of its own */
    bk_stream_t *side;
    bk_event_t *ev_done, *ev_side; /* the unit's gradient is done (compute stream); the side's last sumsq */
    int side_used;                 /* a sumsq is queued on side since the last join */
    int *gfresh;           /* the owned gradient of u holds nothing of this step yet */
    model_io_t io;
    comm_stats_t stats;
    hpz_t *hpz; /* hpz: the node groups' secondary copy (hpz.h); else NULL */
};

static size_t cbytes(const shard_t *s, int64_t n) { return (size_t)n * dtype_size(s->dt.compute); }
static size_t gbytes(const shard_t *s, int64_t n) { return (size_t)n * dtype_size(s->dt.grad); }
static size_t sbytes(const shard_t *s, int64_t n) { return (size_t)n * dtype_size(s->dt.state); }
/* what the reduce-scatters move and return: bf16 under --compress-grads bf16 */
static dtype_t rs_dt(const shard_t *s) { return s->cg ? DT_BF16 : s->dt.grad; }
static size_t rsbytes(const shard_t *s, int64_t n) { return (size_t)n * dtype_size(rs_dt(s)); }

/* ---- the pool of whole-unit buffers ----------------------------------------------------- */

static void *pool_get(shard_t *s, size_t bytes, bk_mem_class_t cls, const char *what)
{
    for (int i = 0; i < s->n_pool; i++)
        if (s->pool[i].bytes == bytes && s->pool[i].cls == cls) {
            void *p = s->pool[i].p;
            s->pool[i] = s->pool[--s->n_pool];
            return p;
        }
    void *p = bk_alloc(s->be, bytes, cls, what);
    if (!p && !s->reserving) {
        /* shard_reserve() took every buffer a pass needs: this is a bug, and the other
         * ranks' collectives could not complete anyway. */
        ftk_error("internal: a pass needed a buffer shard_reserve() did not take: %s", ftk_err_msg());
        abort();
    }
    if (!p)
        s->failed = 1;
    return p;
}

static void pool_put(shard_t *s, void *p, size_t bytes, bk_mem_class_t cls)
{
    if (!p)
        return;
    if (s->n_pool == s->cap_pool) {
        int c = s->cap_pool ? 2 * s->cap_pool : 16;
        pooled_t *q = realloc(s->pool, (size_t)c * sizeof *q);
        if (!q) {
            bk_free(s->be, p);
            return;
        }
        s->pool = q;
        s->cap_pool = c;
    }
    s->pool[s->n_pool++] = (pooled_t){p, bytes, cls};
}

/* ---- gathering parameters, scattering gradients ----------------------------------------- */

static int sharded(const shard_t *s) { return s->t->shards; }

/* The model reads and accumulates into the owned buffers themselves: under none, and with
 * one shard (a shard group of one rank, whose slice is the whole unit), where a gather
 * would only copy the unit and a reduce-scatter its gradient (at 7B on one GPU: 27 GB of
 * copies per micro-batch and 4.4 GB of buffers). hybrid's cross-group all-reduce still
 * runs in shard_grads_complete. */
static int direct(const shard_t *s) { return !sharded(s) || s->S == 1; }

/* The owned slice the model's dtype reads: the working copy, or the weights themselves. */
static void *readable(const shard_t *s, int u) { return s->w ? s->w[u] : s->p[u]; }

static int cu_first(const shard_t *s, int u) { return s->cu.first[s->cu.of[u]]; }
static int cu_count(const shard_t *s, int u) { return s->cu.count[s->cu.of[u]]; }

/* Completes unit u's gather in flight: a compressed one is unpacked into the unit; hpz
 * keeps its node slice of a world gather. */
static void gather_wait(shard_t *s, int u)
{
    comm_wait(s->group, &s->ag[u]);
    if (s->pk[u]) {
        if (!s->reserving)
            compress_unpack(s->be, bk_buf(s->full[u], s->dt.compute), s->pk[u], s->len[u], s->S);
        pool_put(s, s->pk[u], (size_t)compress_part_bytes(s->len[u]) * (size_t)s->S, BK_MEM_GATHER);
        s->pk[u] = NULL;
    }
    if (s->hpz)
        hpz_gathered(s->hpz, u, s->full[u]);
    s->ag_state[u] = RESIDENT;
}

/* A group's gather: its blocks' owned slices side by side at this rank's place in the
 * staging buffer, gathered in place; gather_finish() lays the blocks out. */
static void group_gather_start(shard_t *s, int f, int n)
{
    int64_t part = s->len[f];
    s->stage[f] = pool_get(s, cbytes(s, n * s->units[f].padded), BK_MEM_GATHER, "a gathered unit group (staging)");
    if (!s->reserving && s->stage[f]) {
        char *mine = (char *)s->stage[f] + cbytes(s, n * part * s->r);
        for (int k = 0; k < n; k++)
            s->be->copy(s->be, mine + cbytes(s, k * part), readable(s, f + k), cbytes(s, part));
        comm_allgather(s->group, mine, s->stage[f], n * part, s->dt.compute, &s->ag[f]);
    }
    s->ag_state[f] = IN_FLIGHT;
}

static void gather_finish(shard_t *s, int u)
{
    int f = cu_first(s, u), n = cu_count(s, u);
    if (n == 1)
        gather_wait(s, f);
    else if (!s->reserving)
        comm_wait(s->group, &s->ag[f]);
    if (n > 1) {
        size_t bytes = cbytes(s, n * s->units[f].padded);
        char *whole = pool_get(s, bytes, BK_MEM_GATHER, "a gathered unit group");
        if (!s->reserving)
            units_interleave(s->be, whole, s->stage[f], n, s->S, cbytes(s, s->len[f]), 1);
        pool_put(s, s->stage[f], bytes, BK_MEM_GATHER);
        s->stage[f] = NULL;
        for (int k = 0; k < n; k++)
            s->full[f + k] = whole ? whole + cbytes(s, k * s->units[f].padded) : NULL;
    }
    s->ag_state[f] = RESIDENT;
}

static void gather_start(shard_t *s, int u)
{
    int f = cu_first(s, u), n = cu_count(s, u);
    if (s->ag_state[f] != ABSENT)
        return;
    if (n > 1) {
        group_gather_start(s, f, n);
        return;
    }
    s->full[u] = pool_get(s, cbytes(s, s->units[u].padded), BK_MEM_GATHER, "a gathered unit");
    if (s->cw) {
        size_t pb = (size_t)compress_part_bytes(s->len[u]);
        s->pk[u] = pool_get(s, pb * (size_t)s->S, BK_MEM_GATHER, "a compressed gathered unit");
        s->ag_state[u] = IN_FLIGHT;
        if (s->reserving)
            return;
        char *mine = (char *)s->pk[u] + pb * (size_t)s->r;
        compress_pack(s->be, mine, bk_buf(readable(s, u), s->dt.compute), s->len[u]);
        comm_allgather_bytes(s->group, mine, s->pk[u], (int64_t)pb, &s->ag[u]);
        return;
    }
    if (s->reserving) {
        s->ag_state[u] = RESIDENT;
        return;
    }
    if (!s->hpz || !hpz_gather(s->hpz, u, s->full[u], &s->ag[u]))
        comm_allgather(s->group, readable(s, u), s->full[u], s->len[u], s->dt.compute, &s->ag[u]);
    s->ag_state[u] = IN_FLIGHT;
}

static void drop_unit(shard_t *s, int u)
{
    int f = cu_first(s, u), n = cu_count(s, u);
    u = f;
    if (n > 1) {
        size_t bytes = cbytes(s, n * s->units[f].padded);
        if (s->ag_state[f] == IN_FLIGHT) {
            if (!s->reserving)
                comm_wait(s->group, &s->ag[f]);
            pool_put(s, s->stage[f], bytes, BK_MEM_GATHER);
            s->stage[f] = NULL;
        } else if (s->ag_state[f] == RESIDENT)
            pool_put(s, s->full[f], bytes, BK_MEM_GATHER);
        for (int k = 0; k < n; k++)
            s->full[f + k] = NULL;
        s->ag_state[f] = ABSENT;
        return;
    }
    if (s->ag_state[u] == IN_FLIGHT)
        gather_wait(s, u);
    if (s->ag_state[u] != ABSENT)
        pool_put(s, s->full[u], cbytes(s, s->units[u].padded), BK_MEM_GATHER);
    s->full[u] = NULL;
    s->ag_state[u] = ABSENT;
}

/* Whether the add of the step's last reduce-scatter leaves the owned gradient final: not
 * where hybrid's replicas all-reduce it afterwards (shard_grads_complete). */
static int fold_ok(const shard_t *s)
{
    return s->sq && s->be->add_sumsq && !direct(s) && !(s->t->replicas && comm_size(s->cross) > 1);
}

/* The owned gradient of unit u gets a reduce-scatter's slice: added, or written where it
 * holds nothing of the step yet (the same values: 0 + x rounded once is x converted), on
 * the step's last pass with Σg² of the result where it can be folded. */
static void owned_take(shard_t *s, int u, bk_buf_t part, int64_t n)
{
    bk_buf_t g = bk_buf(s->g[u], s->dt.grad);
    int fold = s->last_pass && fold_ok(s);
    if (s->first_write && s->gfresh[u]) {
        s->be->convert(s->be, g, part, n);
        if (fold)
            s->be->sumsq(s->be, g, n, &s->sq[u]);
    } else if (fold) {
        s->be->add_sumsq(s->be, g, part, n, &s->sq[u]);
    } else {
        s->be->add(s->be, g, part, n);
    }
    s->gfresh[u] = 0;
    s->folded[u] = s->folded[u] || fold;
}

/* Completes the oldest reduce-scatter in flight: its slice is added to the owned gradient
 * (on the step's last pass, with Σg² of the sum where it can be folded). */
static void rs_finish_oldest(shard_t *s)
{
    int u = s->rs_fifo[0];
    for (int i = 1; i < s->rs_n; i++)
        s->rs_fifo[i - 1] = s->rs_fifo[i];
    s->rs_n--;
    int n = cu_count(s, u);
    if (n > 1) {
        if (!s->reserving) {
            comm_wait(s->group, &s->rs[u]);
            for (int k = 0; k < n; k++)
                owned_take(s, u + k, bk_buf((char *)s->rsbuf[u] + gbytes(s, k * s->len[u]), s->dt.grad),
                           s->len[u]);
        }
        pool_put(s, s->rsstage[u], gbytes(s, n * s->units[u].padded), BK_MEM_GRADS);
        pool_put(s, s->rsbuf[u], gbytes(s, n * s->len[u]), BK_MEM_GRADS);
        s->rsstage[u] = s->rsbuf[u] = NULL;
        return;
    }
    if (!s->reserving) {
        comm_wait(s->group, &s->rs[u]);
        owned_take(s, u, bk_buf(s->rsbuf[u], rs_dt(s)), s->len[u]);
    }
    pool_put(s, s->gbuf[u], gbytes(s, s->units[u].padded), BK_MEM_GRADS);
    pool_put(s, s->rsbuf[u], rsbytes(s, s->len[u]), BK_MEM_GRADS);
    pool_put(s, s->q[u], rsbytes(s, s->units[u].padded), BK_MEM_GRADS);
    s->gbuf[u] = s->rsbuf[u] = s->q[u] = NULL;
}

/* Lets MPI move what is in flight (completion itself happens at fixed points, so that the
 * buffers a pass holds do not depend on timing). */
static void progress(shard_t *s)
{
    if (s->reserving)
        return;
    for (int u = 0; u < s->n_units; u++) {
        int done;
        if (s->ag[u].active)
            comm_test(&s->ag[u], &done);
        if (s->rs[u].active)
            comm_test(&s->rs[u], &done);
    }
}

static void *io_params(void *ctx, int u)
{
    shard_t *s = ctx;
    if (direct(s))
        return readable(s, u);
    progress(s);
    gather_start(s, u);
    if (s->ag_state[cu_first(s, u)] == IN_FLIGHT)
        gather_finish(s, u);
    for (int i = s->pos + 1; i < s->n_sched; i++)
        if (s->sched[i] == u) {
            s->pos = i;
            /* the next communication unit the pass asks for */
            int j = i + 1;
            while (j < s->n_sched && s->cu.of[s->sched[j]] == s->cu.of[u])
                j++;
            if (j < s->n_sched)
                gather_start(s, s->sched[j]);
            break;
        }
    return s->full[u];
}

static void io_release(void *ctx, int u)
{
    shard_t *s = ctx;
    /* a group stays while the pass's next request is one of its blocks */
    if (cu_count(s, u) > 1 && s->pos + 1 < s->n_sched && s->cu.of[s->sched[s->pos + 1]] == s->cu.of[u])
        return;
    if (!direct(s) && s->t->releases)
        drop_unit(s, u);
}

/* Clears a whole-unit gradient buffer from the pool before the pass writes into it: all
 * of it where the pass adds, its padding alone where the pass writes (first_write). */
static void gbuf_clear(shard_t *s, int u, char *buf)
{
    if (s->reserving || !buf)
        return;
    int64_t end = 0;
    for (int k = 0; s->first_write && k < s->units[u].n_tensors; k++)
        if (s->units[u].t[k].offset + s->units[u].t[k].numel > end)
            end = s->units[u].t[k].offset + s->units[u].t[k].numel;
    if (end < s->units[u].padded)
        s->be->zero(s->be, buf + gbytes(s, end), gbytes(s, s->units[u].padded - end));
}

static void *io_grads(void *ctx, int u)
{
    shard_t *s = ctx;
    if (direct(s))
        return s->g[u];
    int f = cu_first(s, u), n = cu_count(s, u);
    if (n > 1 && !s->gbuf[u]) {
        size_t bytes = gbytes(s, n * s->units[f].padded);
        char *whole = pool_get(s, bytes, BK_MEM_GRADS, "a unit group's gradient");
        for (int k = 0; k < n; k++) {
            s->gbuf[f + k] = whole ? whole + gbytes(s, k * s->units[f].padded) : NULL;
            gbuf_clear(s, f + k, s->gbuf[f + k]);
        }
    }
    if (!s->gbuf[u]) {
        s->gbuf[u] = pool_get(s, gbytes(s, s->units[u].padded), BK_MEM_GRADS, "a unit's gradient");
        gbuf_clear(s, u, s->gbuf[u]);
    }
    return s->gbuf[u];
}

/* A whole-unit buffer from the pool is new to every pass; the owned gradient the model
 * writes itself (direct) is new until the step's first pass is done with it. */
static int io_grads_first(void *ctx, int u)
{
    shard_t *s = ctx;
    return s->first_write && (!direct(s) || s->gfresh[u]);
}

/* Where the model writes the owned gradient itself and nothing writes it after the step's
 * last pass (one shard: not none's or hybrid's all-reduces across ranks). */
static int side_ok(const shard_t *s)
{
    return s->side && s->sq && direct(s) && !(!sharded(s) && comm_size(s->world) > 1) &&
           !(s->cross && comm_size(s->cross) > 1);
}

static void io_grads_done(void *ctx, int u)
{
    shard_t *s = ctx;
    if (direct(s))
        s->gfresh[u] = 0;
    if (s->last_pass && !s->reserving && side_ok(s)) {
        /* the unit's gradient is final: its Σg² on the side stream, beside the backward
         * pass of the units before it (shard_grads_complete joins it) */
        backend_t *be = s->be;
        be->event_record(be, s->ev_done);
        be->set_stream(be, s->side);
        be->event_wait(be, s->ev_done);
        be->sumsq(be, bk_buf(s->g[u], s->dt.grad), s->len[u], &s->sq[u]);
        be->event_record(be, s->ev_side);
        be->set_stream(be, NULL);
        s->folded[u] = 1;
        s->side_used = 1;
    }
    if (!sharded(s)) { /* a group's whole units lie side by side: one all-reduce when all are done */
        int f = cu_first(s, u), n = cu_count(s, u);
        if (n > 1 && ++s->gdone[f] < n)
            return;
        s->gdone[f] = 0;
        if (s->last_pass && !s->reserving)
            comm_allreduce(s->world, s->g[f], n * s->units[f].padded, s->dt.grad, &s->ar[f]);
        return;
    }
    if (direct(s)) /* one shard: the gradient is already in the owned slice */
        return;
    int f = cu_first(s, u), n = cu_count(s, u);
    if (n > 1) {
        if (++s->gdone[f] < n) {
            progress(s);
            return;
        }
        s->gdone[f] = 0;
        if (s->rs_n == RS_IN_FLIGHT)
            rs_finish_oldest(s);
        size_t bytes = gbytes(s, n * s->units[f].padded);
        s->rsstage[f] = pool_get(s, bytes, BK_MEM_GRADS, "a unit group's gradient (staging)");
        if (!s->reserving)
            units_interleave(s->be, s->rsstage[f], s->gbuf[f], n, s->S, gbytes(s, s->len[f]), 0);
        pool_put(s, s->gbuf[f], bytes, BK_MEM_GRADS);
        for (int k = 0; k < n; k++)
            s->gbuf[f + k] = NULL;
        s->rsbuf[f] = pool_get(s, gbytes(s, n * s->len[f]), BK_MEM_GRADS, "a unit group's gradient slices");
        if (!s->reserving)
            comm_reduce_scatter(s->group, s->rsstage[f], s->rsbuf[f], n * s->len[f], s->dt.grad, &s->rs[f]);
        s->rs_fifo[s->rs_n++] = f;
        progress(s);
        return;
    }
    if (s->rs_n == RS_IN_FLIGHT)
        rs_finish_oldest(s);
    s->rsbuf[u] = pool_get(s, rsbytes(s, s->len[u]), BK_MEM_GRADS, "a unit's gradient slice");
    const void *send = s->gbuf[u];
    if (s->cg) { /* the bf16 gradient with the residual fed back; the f32 one is done with */
        s->q[u] = pool_get(s, rsbytes(s, s->units[u].padded), BK_MEM_GRADS, "a unit's bf16 gradient");
        if (!s->reserving)
            compress_feedback(s->be, s->q[u], s->e[u], s->gbuf[u], s->units[u].padded);
        pool_put(s, s->gbuf[u], gbytes(s, s->units[u].padded), BK_MEM_GRADS);
        s->gbuf[u] = NULL;
        send = s->q[u];
    }
    if (!s->reserving)
        comm_reduce_scatter(s->group, send, s->rsbuf[u], s->len[u], rs_dt(s), &s->rs[u]);
    s->rs_fifo[s->rs_n++] = u;
    progress(s);
}

void shard_pass_begin(shard_t *s, int backward, int last)
{
    int L = s->n_units - 2, k = 0;
    s->sched[k++] = 0;
    for (int l = 1; l <= L; l++)
        s->sched[k++] = l;
    s->sched[k++] = L + 1;
    if (s->tied)
        s->sched[k++] = 0;
    for (int l = L; backward && l >= 1; l--)
        s->sched[k++] = l;
    s->n_sched = k;
    s->pos = -1;
    s->last_pass = last;
    if (s->hpz)
        hpz_pass(s->hpz, backward);
    if (backward) /* the gradients change: what was folded no longer holds */
        memset(s->folded, 0, (size_t)s->n_units * sizeof *s->folded);
}

void shard_pass_end(shard_t *s)
{
    while (s->rs_n)
        rs_finish_oldest(s);
    for (int u = 0; u < s->n_units; u++)
        if (s->t->releases)
            drop_unit(s, u);
}

void shard_drop(shard_t *s)
{
    for (int u = 0; sharded(s) && u < s->n_units; u++)
        drop_unit(s, u);
}

/* A training pass's requests in model.h's order (model_io_t), without communication:
 * what the pool must hold. A forward-only pass asks for a subset. */
int shard_reserve(shard_t *s)
{
    if (!sharded(s))
        return 0;
    const model_io_t *io = &s->io;
    int H = s->n_units - 1, L = s->n_units - 2;
    s->reserving = 1;
    s->failed = 0;
    shard_pass_begin(s, 1, 1);
    io->params(s, 0);
    if (!s->tied)
        io->release(s, 0);
    for (int l = 1; l <= L; l++) {
        io->params(s, l);
        io->release(s, l);
    }
    io->params(s, H);
    if (s->tied)
        io->params(s, 0);
    io->grads(s, H);
    if (s->tied)
        io->grads(s, 0);
    io->release(s, H);
    if (s->tied)
        io->release(s, 0);
    io->grads_done(s, H);
    for (int l = L; l >= 1; l--) {
        io->params(s, l);
        io->grads(s, l);
        io->release(s, l);
        io->grads_done(s, l);
    }
    io->grads(s, 0);
    io->grads_done(s, 0);
    shard_pass_end(s);
    shard_drop(s);
    s->reserving = 0;
    return s->failed ? -1 : 0;
}

/* ---- set-up ------------------------------------------------------------------------------ */

/* The groups of group_size ranks (0: a node's) the strategy's group option sizes: the shard
 * groups of replicas, or hpz's node groups (S = world). Collective over the world. */
static int set_groups(shard_t *s, int group_size)
{
    int W = comm_size(s->world), rank = comm_rank(s->world);
    s->group = s->world;
    s->S = W;
    s->r = rank;
    s->replica = 0;
    const char *option = s->t->group_option;
    if (!option)
        return 0;
    if (group_size <= 0 && comm_node_blocks(s->world, &group_size) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", ftk_err_msg());
        ftk_err_set("--strategy %s: %s; pass %s", s->t->name, why, option);
        return -1;
    }
    if (W % group_size) {
        ftk_err_set("%s %d does not divide the %d ranks", option, group_size, W);
        return -1;
    }
    if (s->t->node_copy) {
        s->node_size = group_size;
        return 0;
    }
    s->S = group_size;
    s->r = rank % group_size;
    s->replica = rank / group_size;
    return comm_split_blocks(s->world, group_size, &s->group, &s->cross);
}

shard_t *shard_new(backend_t *be, comm_t *world, strategy_t strat, int group_size, const model_config_t *cfg,
                   precision_t prec)
{
    shard_t *s = calloc(1, sizeof *s);
    if (!s) {
        ftk_err_set("out of memory");
        return NULL;
    }
    s->be = be;
    s->strat = strat;
    s->t = strategy_traits(strat);
    s->prec = prec;
    s->policy = (units_policy_t){CKPT_UNITS_BLOCK, 1};
    s->world = world;
    s->dt = precision_dtypes(prec);
    if (set_groups(s, group_size) < 0 || ckpt_units(cfg, s->S, &s->units, &s->n_units) < 0)
        goto fail;
    comm_t *comms[3] = {s->world, s->group, s->cross};
    for (int i = 0; i < 3; i++)
        if (comms[i]) {
            comm_set_stats(comms[i], &s->stats);
            comm_set_backend(comms[i], be);
        }
    if (s->cross)
        comm_set_level(s->cross, COMM_LEVEL_CROSS);
    int n = s->n_units;
    s->tied = s->units[n - 1].n_tensors == 1;
    s->lo = calloc((size_t)n, sizeof *s->lo);
    s->len = calloc((size_t)n, sizeof *s->len);
    void ***arrays[] = {&s->p, &s->m, &s->v, &s->g, &s->full, &s->gbuf, &s->rsbuf, &s->stage, &s->rsstage,
                        &s->pk, &s->e, &s->q};
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++)
        if (!(*arrays[i] = calloc((size_t)n, sizeof(void *))))
            goto oom;
    if (s->dt.compute != s->dt.state && !(s->w = calloc((size_t)n, sizeof(void *))))
        goto oom;
    s->ag_state = calloc((size_t)n, sizeof *s->ag_state);
    s->ag = calloc((size_t)n, sizeof *s->ag);
    s->rs = calloc((size_t)n, sizeof *s->rs);
    s->ar = calloc((size_t)n, sizeof *s->ar);
    s->sched = calloc((size_t)(2 * n + 2), sizeof *s->sched);
    s->folded = calloc((size_t)n, sizeof *s->folded);
    s->gdone = calloc((size_t)n, sizeof *s->gdone);
    s->gfresh = calloc((size_t)n, sizeof *s->gfresh);
    if (!s->lo || !s->len || !s->ag_state || !s->ag || !s->rs || !s->ar || !s->sched || !s->folded || !s->gdone ||
        !s->gfresh)
        goto oom;
    s->first_write = 1;
    for (int u = 0; u < n; u++)
        s->gfresh[u] = 1;
    if (units_map(&s->policy, s->units, n, dtype_size(s->dt.compute), s->S, &s->cu) < 0)
        goto fail;
    for (int u = 0; u < n; u++) {
        int64_t part = s->units[u].padded / s->S;
        s->lo[u] = sharded(s) ? s->r * part : 0;
        s->len[u] = sharded(s) ? part : s->units[u].padded;
        if (!(s->p[u] = bk_alloc(be, sbytes(s, s->len[u]), BK_MEM_WEIGHTS, s->w ? "master weights" : "weights")) ||
            !(s->m[u] = bk_alloc(be, sbytes(s, s->len[u]), BK_MEM_OPTIM, "AdamW moments")) ||
            !(s->v[u] = bk_alloc(be, sbytes(s, s->len[u]), BK_MEM_OPTIM, "AdamW moments")) ||
            !(s->g[u] = bk_alloc(be, gbytes(s, s->len[u]), BK_MEM_GRADS, "gradients")) ||
            (s->w && !(s->w[u] = bk_alloc(be, cbytes(s, s->len[u]), BK_MEM_WEIGHTS, "the bf16 working copy"))))
            goto fail;
    }
    if (s->t->node_copy && !direct(s) &&
        !(s->hpz = hpz_new(be, world, s->node_size, &s->stats, s->units, n, s->dt.compute)))
        goto fail;
    s->io = (model_io_t){s, io_params, io_release, io_grads, io_grads_done, io_grads_first};
    return s;
oom:
    ftk_err_set("out of memory");
fail:
    shard_free(s);
    return NULL;
}

void shard_free(shard_t *s)
{
    if (!s)
        return;
    void **all[] = {s->p, s->m, s->v, s->g, s->w, s->full, s->gbuf, s->rsbuf, s->stage, s->rsstage, s->pk, s->e, s->q};
    for (int u = 0; s->cu.of && u < s->n_units; u++) /* a group's blocks point into its first's buffer */
        if (u != cu_first(s, u) && s->full && s->gbuf && s->g)
            s->full[u] = s->gbuf[u] = s->g[u] = NULL;
    for (int u = 0; u < s->n_units; u++) {
        if (s->ag && s->ag_state) {
            if (s->ag[u].active)
                comm_wait(s->group, &s->ag[u]);
            if (s->ar[u].active)
                comm_wait(s->world, &s->ar[u]);
            if (s->rs[u].active)
                comm_wait(s->group, &s->rs[u]);
        }
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (all[i] && all[i][u])
                bk_free(s->be, all[i][u]);
    }
    for (int i = 0; i < s->n_pool; i++)
        bk_free(s->be, s->pool[i].p);
    free(s->pool);
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    free(s->lo);
    free(s->len);
    free(s->ag_state);
    free(s->ag);
    free(s->rs);
    free(s->ar);
    free(s->sched);
    free(s->folded);
    free(s->gfresh);
    if (s->ev_done)
        s->be->event_free(s->be, s->ev_done);
    if (s->ev_side)
        s->be->event_free(s->be, s->ev_side);
    if (s->side)
        s->be->stream_free(s->be, s->side);
    free(s->gdone);
    units_map_free(&s->cu);
    free(s->units);
    hpz_free(s->hpz);
    if (s->group != s->world)
        comm_free(s->group);
    comm_free(s->cross);
    if (s->world) /* the world outlives the shards (a failed build agrees over it): not into freed stats */
        comm_set_stats(s->world, NULL);
    free(s);
}

int shard_set_units(shard_t *s, const units_policy_t *p)
{
    units_map_t m;
    if (units_map(p, s->units, s->n_units, dtype_size(s->dt.compute), s->S, &m) < 0)
        return -1;
    units_map_free(&s->cu);
    s->cu = m;
    s->policy = *p;
    /* A group's owned gradients side by side, so that an all-reduce (hybrid's across
     * replicas, none's) moves the group in one collective. Freed before allocated: the
     * peak does not move, and nothing is in them yet. */
    for (int c = 0; c < m.n; c++) {
        int f = m.first[c], n = m.count[c];
        if (n == 1)
            continue;
        for (int k = 0; k < n; k++) {
            bk_free(s->be, s->g[f + k]);
            s->g[f + k] = NULL;
        }
        char *whole = bk_alloc(s->be, gbytes(s, n * s->len[f]), BK_MEM_GRADS, "gradients");
        if (!whole)
            return -1;
        for (int k = 0; k < n; k++)
            s->g[f + k] = whole + gbytes(s, k * s->len[f]);
    }
    return 0;
}


int shard_set_compress(shard_t *s, int weights, int grads)
{
    int gathers = sharded(s) && !direct(s);
    strategy_use_t use = strategy_use(s->strat);
    use.units = &s->policy;
    use.compress_weights = weights;
    use.compress_grads = grads;
    use.precision = s->prec;
    if (strategy_check(&use) < 0)
        return -1;
    s->cw = gathers ? weights : 0;
    s->cg = gathers ? grads : 0;
    for (int u = 0; s->cg && u < s->n_units; u++)
        if (!(s->e[u] = bk_alloc(s->be, (size_t)s->units[u].padded * sizeof(float), BK_MEM_GRADS,
                                 "the gradients' error-feedback residual")))
            return -1;
    return 0;
}
int shard_compress(const shard_t *s) { return s->cw; }

int shard_get_residual(shard_t *s, int unit, float *host)
{
    if (!s->cg) {
        ftk_err_set("internal: no --compress-grads residual");
        return -1;
    }
    s->be->download(s->be, host, s->e[unit], (size_t)s->units[unit].padded * sizeof(float));
    return 0;
}

int shard_set_residual(shard_t *s, int unit, const float *host)
{
    if (!s->cg) {
        ftk_err_set("internal: no --compress-grads residual");
        return -1;
    }
    s->be->upload(s->be, s->e[unit], host, (size_t)s->units[unit].padded * sizeof(float));
    return 0;
}
int shard_compress_grads(const shard_t *s) { return s->cg; }

const ckpt_unit_t *shard_units(const shard_t *s, int *n_units)
{
    *n_units = s->n_units;
    return s->units;
}
int64_t shard_count(const shard_t *s) { return s->S; }
int64_t shard_index(const shard_t *s) { return s->r; }
int shard_writes(const shard_t *s) { return s->replica == 0; }
comm_t *shard_group(shard_t *s) { return s->group; }
comm_t *shard_cross(shard_t *s) { return s->cross; }
comm_t *shard_node(shard_t *s) { return s->hpz ? hpz_node(s->hpz) : NULL; }
const model_io_t *shard_io(shard_t *s) { return &s->io; }
comm_stats_t *shard_stats(shard_t *s) { return &s->stats; }
precision_dtypes_t shard_dtypes(const shard_t *s) { return s->dt; }

shard_slice_t shard_owned(const shard_t *s, int u)
{
    return (shard_slice_t){s->p[u], s->m[u], s->v[u], s->g[u], s->lo[u], s->len[u]};
}

/* ---- state -------------------------------------------------------------------------------- */

/* bf16-mixed: the working copy of every owned slice, rounded from the master. */
static void refresh_working_copy(shard_t *s)
{
    if (s->hpz) /* every caller has changed the weights */
        hpz_stale(s->hpz);
    for (int u = 0; s->w && u < s->n_units; u++)
        s->be->convert(s->be, bk_buf(s->w[u], s->dt.compute), bk_buf(s->p[u], s->dt.state), s->len[u]);
}

int shard_load_weights(shard_t *s, hid_t weights, shard_load_stats_t *st)
{
    shard_load_t l = {.be = s->be, .weights = weights, .state = s->dt.state, .units = s->units,
                      .n_units = s->n_units, .lo = s->lo, .len = s->len, .dst = s->p};
    if (shard_load_read(&l, st) < 0)
        return -1;
    refresh_working_copy(s);
    return 0;
}

/* The slice a checkpoint holds: the owned range, or slice r of a whole unit (none). */
static int64_t slice_at(const shard_t *s, int u) { return sharded(s) ? 0 : (s->units[u].padded / s->S) * s->r; }

int shard_get_slice(shard_t *s, int kind, int unit, void *host)
{
    void **src[3] = {s->p, s->m, s->v};
    s->be->download(s->be, host, (char *)src[kind][unit] + sbytes(s, slice_at(s, unit)),
                    sbytes(s, s->units[unit].padded / s->S));
    return 0;
}

int shard_set_state(shard_t *s, const ckpt_state_t *st)
{
    if (st->dt != s->dt.state) {
        ftk_err_set("internal: a checkpoint state of %s for a run that stores %s", dtype_name(st->dt),
                    dtype_name(s->dt.state));
        return -1;
    }
    void **src[3] = {st->param, st->m, st->v};
    void **dst[3] = {s->p, s->m, s->v};
    int rc = 0;
    for (int u = 0; u < s->n_units; u++) {
        int64_t part = s->units[u].padded / s->S;
        for (int k = 0; k < 3; k++) {
            if (sharded(s)) {
                s->be->upload(s->be, dst[k][u], src[k][u], sbytes(s, part));
                continue;
            }
            /* none: every rank read its slice; the whole unit is every rank's slice. The slice
             * goes to its place in the unit and is gathered in place: no extra buffer, so a
             * resumed run takes no more memory than the plan. */
            void *mine = (char *)dst[k][u] + sbytes(s, part * s->r);
            comm_req_t req = {0};
            s->be->upload(s->be, mine, src[k][u], sbytes(s, part));
            if (comm_allgather(s->world, mine, dst[k][u], part, s->dt.state, &req) < 0)
                rc = -1;
            comm_wait(s->world, &req);
        }
    }
    refresh_working_copy(s);
    return rc;
}

/* ---- around the optimizer step ------------------------------------------------------------ */

void shard_grads_complete(shard_t *s)
{
    int n = s->n_units;
    if (s->side_used) { /* Σg² taken beside the backward pass: done before the norm is read */
        s->be->event_wait(s->be, s->ev_side);
        s->side_used = 0;
    }
    /* Gradients complete on every rank: the replicas' slices (hybrid) or whole units
     * (none) summed across ranks. */
    if (s->t->replicas && comm_size(s->cross) > 1)
        for (int c = 0; c < s->cu.n; c++) /* per communication unit: a group's slices lie side by side */
            comm_allreduce(s->cross, s->g[s->cu.first[c]], s->cu.count[c] * s->len[s->cu.first[c]], s->dt.grad,
                           &s->ar[s->cu.first[c]]);
    for (int u = 0; u < n; u++)
        comm_wait(s->t->replicas ? s->cross : s->world, &s->ar[u]);
}

void shard_set_sumsq(shard_t *s, double *sq) { s->sq = sq; }
int shard_sumsq_folded(const shard_t *s, int u) { return s->folded[u]; }

int shard_sum_needed(const shard_t *s) { return sharded(s) && comm_size(s->group) > 1; }

void shard_sum_owned(shard_t *s, double *v)
{
    if (sharded(s))
        comm_allreduce_f64(s->group, v, 1, COMM_SUM);
}

void shard_step_done(shard_t *s)
{
    for (int u = 0; u < s->n_units; u++) {
        if (!s->first_write)
            s->be->zero(s->be, s->g[u], gbytes(s, s->len[u]));
        s->gfresh[u] = 1; /* never read as it is: the next step's first pass writes it */
        s->folded[u] = 0;
    }
    refresh_working_copy(s);
}

int shard_set_sumsq_side(shard_t *s, int on)
{
    backend_t *be = s->be;
    if (!on || s->side)
        return 0;
    if (!(s->side = be->stream_new(be)) || !(s->ev_done = be->event_new(be)) || !(s->ev_side = be->event_new(be)))
        return -1;
    return 0;
}

void shard_set_first_write(shard_t *s, int on)
{
    s->first_write = on;
    for (int u = 0; u < s->n_units; u++)
        s->gfresh[u] = 1;
}
