/* hpz.c — hpz's node groups and secondary copy (hpz.h). */
#include "hpz.h"

#include <stdlib.h>

#include "../libcommon/log.h"

struct hpz {
    backend_t *be;
    comm_t *node, *cross; /* cross: the ranks with the same node index (comm_split_blocks's) */
    int n, j;             /* ranks per node group; this rank's index in it */
    dtype_t dt;
    int n_units;
    int64_t *part;        /* elements of each unit's node slice: padded / n */
    void **copy;          /* the secondary copy: slice j of every unit */
    unsigned char *fresh; /* copy[u] holds the current weights */
    unsigned char *world; /* a world gather of u is in flight: its completion fills copy[u] */
    int training;         /* the current pass trains (hpz_pass) */
};

hpz_t *hpz_new(backend_t *be, comm_t *world, int n, comm_stats_t *stats, const ckpt_unit_t *units, int n_units,
               dtype_t dt)
{
    hpz_t *h = calloc(1, sizeof *h);
    if (!h) {
        ftk_err_set("out of memory");
        return NULL;
    }
    h->be = be;
    h->n = n;
    h->j = comm_rank(world) % n;
    h->dt = dt;
    h->n_units = n_units;
    if (comm_split_blocks(world, n, &h->node, &h->cross) < 0) {
        hpz_free(h);
        return NULL;
    }
    comm_set_stats(h->node, stats);
    comm_set_backend(h->node, be);
    comm_set_level(h->node, COMM_LEVEL_NODE);
    h->part = calloc((size_t)n_units, sizeof *h->part);
    h->copy = calloc((size_t)n_units, sizeof *h->copy);
    h->fresh = calloc((size_t)n_units, 1);
    h->world = calloc((size_t)n_units, 1);
    if (!h->part || !h->copy || !h->fresh || !h->world) {
        hpz_free(h);
        ftk_err_set("out of memory");
        return NULL;
    }
    for (int u = 0; u < n_units; u++) {
        h->part[u] = units[u].padded / n;
        if (!(h->copy[u] = bk_alloc(be, (size_t)h->part[u] * dtype_size(dt), BK_MEM_WEIGHTS,
                                    "hpz's secondary copy"))) {
            hpz_free(h);
            return NULL;
        }
    }
    return h;
}

void hpz_free(hpz_t *h)
{
    if (!h)
        return;
    for (int u = 0; h->copy && u < h->n_units; u++)
        if (h->copy[u])
            bk_free(h->be, h->copy[u]);
    free(h->copy);
    free(h->part);
    free(h->fresh);
    free(h->world);
    comm_free(h->node);
    comm_free(h->cross);
    free(h);
}

comm_t *hpz_node(hpz_t *h) { return h->node; }

int hpz_gather(hpz_t *h, int u, void *full, comm_req_t *req)
{
    if (!h->training)
        return 0;
    if (!h->fresh[u]) {
        h->world[u] = 1;
        return 0;
    }
    comm_allgather(h->node, h->copy[u], full, h->part[u], h->dt, req);
    return 1;
}

void hpz_gathered(hpz_t *h, int u, const void *full)
{
    if (!h->world[u])
        return;
    size_t bytes = (size_t)h->part[u] * dtype_size(h->dt);
    h->be->copy(h->be, h->copy[u], (const char *)full + (size_t)h->j * bytes, bytes);
    h->world[u] = 0;
    h->fresh[u] = 1;
}

void hpz_pass(hpz_t *h, int training) { h->training = training; }

void hpz_stale(hpz_t *h)
{
    for (int u = 0; u < h->n_units; u++)
        h->fresh[u] = h->world[u] = 0;
}
