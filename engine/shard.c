/* shard.c — sharded data parallelism over comm.h (shard.h). */
#include "shard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/weights.h"
#include "../libcommon/log.h"

enum { ABSENT, IN_FLIGHT, RESIDENT };

typedef struct {
    float *p;
    int64_t n;
} pooled_t;

struct shard {
    const backend_t *be;
    strategy_t strat;
    comm_t *world, *group, *cross; /* group == world except for hybrid; cross: hybrid only */
    int S, r, replica;
    ckpt_unit_t *units;
    int n_units, tied;
    int64_t *lo, *len; /* owned range of each unit */
    float **p, **m, **v, **g;
    /* whole-unit buffers of the current pass */
    float **full, **gbuf, **rsbuf;
    int *ag_state;
    comm_req_t *ag, *rs, *ar;
    /* the order in which the pass asks for parameters (prefetch) */
    int *sched, n_sched, pos, last_pass;
    pooled_t *pool;
    int n_pool, cap_pool;
    model_io_t io;
    comm_stats_t stats;
};

/* ---- the pool of whole-unit buffers ----------------------------------------------------- */

static float *pool_get(shard_t *s, int64_t n)
{
    for (int i = 0; i < s->n_pool; i++)
        if (s->pool[i].n == n) {
            float *p = s->pool[i].p;
            s->pool[i] = s->pool[--s->n_pool];
            return p;
        }
    float *p = s->be->alloc((size_t)n * sizeof(float));
    if (!p)
        abort(); /* like a backend op: no error path inside a pass (shard.h) */
    return p;
}

static void pool_put(shard_t *s, float *p, int64_t n)
{
    if (s->n_pool == s->cap_pool) {
        int c = s->cap_pool ? 2 * s->cap_pool : 16;
        pooled_t *q = realloc(s->pool, (size_t)c * sizeof *q);
        if (!q) {
            s->be->free(p);
            return;
        }
        s->pool = q;
        s->cap_pool = c;
    }
    s->pool[s->n_pool++] = (pooled_t){p, n};
}

/* ---- gathering parameters, scattering gradients ----------------------------------------- */

static int sharded(const shard_t *s) { return s->strat != STRAT_NONE; }

static void gather_start(shard_t *s, int u)
{
    if (s->ag_state[u] != ABSENT)
        return;
    s->full[u] = pool_get(s, s->units[u].padded);
    comm_allgather(s->group, s->p[u], s->full[u], s->len[u], &s->ag[u]);
    s->ag_state[u] = IN_FLIGHT;
}

static void drop_unit(shard_t *s, int u)
{
    if (s->ag_state[u] == IN_FLIGHT)
        comm_wait(s->group, &s->ag[u]);
    if (s->ag_state[u] != ABSENT)
        pool_put(s, s->full[u], s->units[u].padded);
    s->full[u] = NULL;
    s->ag_state[u] = ABSENT;
}

static void rs_finish(shard_t *s, int u)
{
    comm_wait(s->group, &s->rs[u]);
    s->be->add(s->g[u], s->rsbuf[u], s->len[u]);
    pool_put(s, s->gbuf[u], s->units[u].padded);
    pool_put(s, s->rsbuf[u], s->len[u]);
    s->gbuf[u] = s->rsbuf[u] = NULL;
}

/* Lets MPI move what is in flight; finishes reduce-scatters that are done. */
static void progress(shard_t *s)
{
    for (int u = 0; u < s->n_units; u++) {
        int done;
        if (s->ag[u].active)
            comm_test(&s->ag[u], &done);
        if (s->rs[u].active) {
            comm_test(&s->rs[u], &done);
            if (done)
                rs_finish(s, u);
        }
    }
}

static float *io_params(void *ctx, int u)
{
    shard_t *s = ctx;
    if (!sharded(s))
        return s->p[u];
    progress(s);
    gather_start(s, u);
    if (s->ag_state[u] == IN_FLIGHT) {
        comm_wait(s->group, &s->ag[u]);
        s->ag_state[u] = RESIDENT;
    }
    for (int i = s->pos + 1; i < s->n_sched; i++)
        if (s->sched[i] == u) {
            s->pos = i;
            if (i + 1 < s->n_sched)
                gather_start(s, s->sched[i + 1]);
            break;
        }
    return s->full[u];
}

static void io_release(void *ctx, int u)
{
    shard_t *s = ctx;
    if (s->strat == STRAT_FULL || s->strat == STRAT_HYBRID)
        drop_unit(s, u);
}

static float *io_grads(void *ctx, int u)
{
    shard_t *s = ctx;
    if (!sharded(s))
        return s->g[u];
    if (!s->gbuf[u]) {
        s->gbuf[u] = pool_get(s, s->units[u].padded);
        s->be->zero(s->gbuf[u], (size_t)s->units[u].padded * sizeof(float));
    }
    return s->gbuf[u];
}

static void io_grads_done(void *ctx, int u)
{
    shard_t *s = ctx;
    if (!sharded(s)) {
        if (s->last_pass)
            comm_allreduce(s->world, s->g[u], s->units[u].padded, &s->ar[u]);
        return;
    }
    s->rsbuf[u] = pool_get(s, s->len[u]);
    comm_reduce_scatter(s->group, s->gbuf[u], s->rsbuf[u], s->len[u], &s->rs[u]);
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
}

void shard_pass_end(shard_t *s)
{
    for (int u = 0; u < s->n_units; u++) {
        if (s->gbuf[u])
            rs_finish(s, u);
        if (s->strat == STRAT_FULL || s->strat == STRAT_HYBRID)
            drop_unit(s, u);
    }
}

void shard_drop(shard_t *s)
{
    for (int u = 0; sharded(s) && u < s->n_units; u++)
        drop_unit(s, u);
}

/* ---- set-up ------------------------------------------------------------------------------ */

static int set_groups(shard_t *s, int group_size)
{
    int W = comm_size(s->world), rank = comm_rank(s->world);
    s->group = s->world;
    s->S = W;
    s->r = rank;
    s->replica = 0;
    if (s->strat != STRAT_HYBRID)
        return 0;
    if (group_size <= 0) {
        int lr, ls;
        if (comm_node_rank(s->world, &lr, &ls) < 0)
            return -1;
        /* Groups are blocks of consecutive ranks; the node's ranks must form one. */
        int64_t v[2] = {ls, lr == rank % ls ? 0 : 1}, mx[2] = {ls, v[1]};
        comm_allreduce_i64(s->world, v, 1, COMM_MIN);
        comm_allreduce_i64(s->world, mx, 2, COMM_MAX);
        if (v[0] != mx[0] || mx[1]) {
            ftk_err_set("--strategy hybrid: the nodes do not hold equal blocks of consecutive ranks (%lld to %lld "
                        "ranks per node); pass --shard-group-size",
                        (long long)v[0], (long long)mx[0]);
            return -1;
        }
        group_size = ls;
    }
    if (W % group_size) {
        ftk_err_set("--shard-group-size %d does not divide the %d ranks", group_size, W);
        return -1;
    }
    s->S = group_size;
    s->r = rank % group_size;
    s->replica = rank / group_size;
    if (!(s->group = comm_split(s->world, s->replica, rank)) || !(s->cross = comm_split(s->world, s->r, rank)))
        return -1;
    return 0;
}

shard_t *shard_new(const backend_t *be, comm_t *world, strategy_t strat, int group_size, const model_config_t *cfg)
{
    shard_t *s = calloc(1, sizeof *s);
    if (!s) {
        ftk_err_set("out of memory");
        return NULL;
    }
    s->be = be;
    s->strat = strat;
    s->world = world;
    if (set_groups(s, group_size) < 0 || ckpt_units(cfg, s->S, &s->units, &s->n_units) < 0)
        goto fail;
    comm_set_stats(s->world, &s->stats);
    comm_set_stats(s->group, &s->stats);
    comm_set_copy(s->world, be->copy);
    comm_set_copy(s->group, be->copy);
    if (s->cross) {
        comm_set_stats(s->cross, &s->stats);
        comm_set_copy(s->cross, be->copy);
    }
    int n = s->n_units;
    s->tied = s->units[n - 1].n_tensors == 1;
    s->lo = calloc((size_t)n, sizeof *s->lo);
    s->len = calloc((size_t)n, sizeof *s->len);
    float ***arrays[] = {&s->p, &s->m, &s->v, &s->g, &s->full, &s->gbuf, &s->rsbuf};
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++)
        if (!(*arrays[i] = calloc((size_t)n, sizeof(float *))))
            goto oom;
    s->ag_state = calloc((size_t)n, sizeof *s->ag_state);
    s->ag = calloc((size_t)n, sizeof *s->ag);
    s->rs = calloc((size_t)n, sizeof *s->rs);
    s->ar = calloc((size_t)n, sizeof *s->ar);
    s->sched = calloc((size_t)(2 * n + 2), sizeof *s->sched);
    if (!s->lo || !s->len || !s->ag_state || !s->ag || !s->rs || !s->ar || !s->sched)
        goto oom;
    for (int u = 0; u < n; u++) {
        int64_t part = s->units[u].padded / s->S;
        s->lo[u] = sharded(s) ? s->r * part : 0;
        s->len[u] = sharded(s) ? part : s->units[u].padded;
        size_t bytes = (size_t)s->len[u] * sizeof(float);
        if (!(s->p[u] = be->alloc(bytes)) || !(s->m[u] = be->alloc(bytes)) || !(s->v[u] = be->alloc(bytes)) ||
            !(s->g[u] = be->alloc(bytes)))
            goto fail;
    }
    s->io = (model_io_t){s, io_params, io_release, io_grads, io_grads_done};
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
    for (int u = 0; u < s->n_units; u++) {
        if (s->ag && s->ag_state) {
            if (s->ag[u].active)
                comm_wait(s->group, &s->ag[u]);
            if (s->ar[u].active)
                comm_wait(s->world, &s->ar[u]);
            if (s->rs[u].active)
                comm_wait(s->group, &s->rs[u]);
        }
        float **a[] = {s->p, s->m, s->v, s->g, s->full, s->gbuf, s->rsbuf};
        for (size_t i = 0; i < sizeof a / sizeof *a; i++)
            if (a[i] && a[i][u])
                s->be->free(a[i][u]);
    }
    for (int i = 0; i < s->n_pool; i++)
        s->be->free(s->pool[i].p);
    free(s->pool);
    float **a[] = {s->p, s->m, s->v, s->g, s->full, s->gbuf, s->rsbuf};
    for (size_t i = 0; i < sizeof a / sizeof *a; i++)
        free(a[i]);
    free(s->lo);
    free(s->len);
    free(s->ag_state);
    free(s->ag);
    free(s->rs);
    free(s->ar);
    free(s->sched);
    free(s->units);
    if (s->group != s->world)
        comm_free(s->group);
    comm_free(s->cross);
    free(s);
}

const ckpt_unit_t *shard_units(const shard_t *s, int *n_units)
{
    *n_units = s->n_units;
    return s->units;
}
int64_t shard_count(const shard_t *s) { return s->S; }
int64_t shard_index(const shard_t *s) { return s->r; }
int shard_writes(const shard_t *s) { return s->replica == 0; }
comm_t *shard_group(shard_t *s) { return s->group; }
const model_io_t *shard_io(shard_t *s) { return &s->io; }
comm_stats_t *shard_stats(shard_t *s) { return &s->stats; }

/* ---- state -------------------------------------------------------------------------------- */

int shard_load_weights(shard_t *s, hid_t weights)
{
    int rc = 0;
    for (int u = 0; u < s->n_units && rc == 0; u++) {
        const ckpt_unit_t *x = &s->units[u];
        int64_t lo = s->lo[u], hi = lo + s->len[u];
        float *host = calloc((size_t)s->len[u], sizeof *host);
        if (!host) {
            ftk_err_set("out of memory");
            return -1;
        }
        for (int k = 0; k < x->n_tensors && rc == 0; k++) {
            const ckpt_tensor_t *t = &x->t[k];
            int64_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
            if (a >= b)
                continue;
            /* Rows of the tensor covering [a, b), then the overlap out of them. */
            /* (weights_read_rows: a 1-D tensor is one row) */
            int64_t w = t->rank == 2 ? t->shape[1] : t->numel, r0 = (a - t->offset) / w, r1 = (b - t->offset - 1) / w + 1;
            float *rows = malloc((size_t)((r1 - r0) * w) * sizeof *rows);
            uint16_t *scratch = malloc((size_t)((r1 - r0) * w) * sizeof *scratch);
            dtype_t dt = weights_tensor_dtype(weights, t->name);
            if (!rows || !scratch) {
                ftk_err_set("out of memory");
                rc = -1;
            } else if (dt == DT_INVALID ||
                       weights_read_rows(weights, t->name, DT_F32, r0, r1 - r0, rows, dt == DT_F32 ? NULL : scratch) < 0) {
                rc = -1;
            } else {
                memcpy(host + (a - lo), rows + (a - t->offset - r0 * w), (size_t)(b - a) * sizeof *host);
            }
            free(rows);
            free(scratch);
        }
        if (rc == 0)
            s->be->upload(s->p[u], host, (size_t)s->len[u] * sizeof *host);
        free(host);
    }
    return rc;
}

/* The slice a checkpoint holds: the owned range, or slice r of a whole unit (none). */
static int64_t slice_at(const shard_t *s, int u) { return sharded(s) ? 0 : (s->units[u].padded / s->S) * s->r; }

int shard_get_slice(shard_t *s, int kind, int unit, float *host)
{
    float **src[3] = {s->p, s->m, s->v};
    s->be->download(host, src[kind][unit] + slice_at(s, unit), (size_t)(s->units[unit].padded / s->S) * sizeof(float));
    return 0;
}

int shard_set_state(shard_t *s, const ckpt_state_t *st)
{
    if (st->dt != DT_F32) {
        ftk_err_set("internal: shard state of %s (the engine holds float32)", dtype_name(st->dt));
        return -1;
    }
    void **src[3] = {st->param, st->m, st->v};
    float **dst[3] = {s->p, s->m, s->v};
    for (int u = 0; u < s->n_units; u++) {
        int64_t part = s->units[u].padded / s->S;
        for (int k = 0; k < 3; k++) {
            if (sharded(s)) {
                s->be->upload(dst[k][u], src[k][u], (size_t)part * sizeof(float));
                continue;
            }
            /* none: every rank read its slice; the whole unit is every rank's slice. */
            float *tmp = pool_get(s, part);
            comm_req_t req = {0};
            s->be->upload(tmp, src[k][u], (size_t)part * sizeof(float));
            comm_allgather(s->world, tmp, dst[k][u], part, &req);
            comm_wait(s->world, &req);
            pool_put(s, tmp, part);
        }
    }
    return 0;
}

/* ---- the optimizer step -------------------------------------------------------------------- */

double shard_step(shard_t *s, const ckpt_train_t *t, int64_t step, double lr)
{
    const backend_t *be = s->be;
    int n = s->n_units;
    /* Gradients complete on every rank: the replicas' slices (hybrid) or whole units
     * (none) summed across ranks. */
    if (s->strat == STRAT_HYBRID && comm_size(s->cross) > 1)
        for (int u = 0; u < n; u++)
            comm_allreduce(s->cross, s->g[u], s->len[u], &s->ar[u]);
    for (int u = 0; u < n; u++)
        comm_wait(s->strat == STRAT_HYBRID ? s->cross : s->world, &s->ar[u]);
    /* torch: total = ‖(‖g_1‖, …, ‖g_k‖)‖; coef = max / (total + 1e-6), clamped to 1. */
    double sq = 0;
    for (int u = 0; u < n; u++)
        sq += be->sumsq(s->g[u], s->len[u]);
    if (sharded(s))
        comm_allreduce_f64(s->group, &sq, 1, COMM_SUM);
    double norm = sqrt(sq);
    if (t->clip > 0) {
        double coef = t->clip / (norm + 1e-6);
        if (coef < 1.0)
            for (int u = 0; u < n; u++)
                be->scale(s->g[u], (float)coef, s->len[u]);
    }
    shard_drop(s); /* nothing may still read or gather the slices AdamW updates */
    double bc1 = 1.0 - pow(t->beta1, (double)step), bc2 = 1.0 - pow(t->beta2, (double)step);
    for (int u = 0; u < n; u++) {
        int64_t lo = s->lo[u], hi = lo + s->len[u];
        for (int k = 0; k < s->units[u].n_tensors; k++) {
            const ckpt_tensor_t *x = &s->units[u].t[k];
            int64_t a = x->offset > lo ? x->offset : lo, b = x->offset + x->numel < hi ? x->offset + x->numel : hi;
            if (a >= b)
                continue;
            float wd = x->is_norm && !t->decay_norms ? 0.0f : (float)t->weight_decay;
            int64_t o = a - lo;
            be->adamw(s->p[u] + o, s->g[u] + o, s->m[u] + o, s->v[u] + o, b - a, (float)lr, (float)t->beta1,
                      (float)t->beta2, (float)t->eps, wd, bc1, bc2);
        }
        be->zero(s->g[u], (size_t)s->len[u] * sizeof(float));
    }
    return norm;
}
