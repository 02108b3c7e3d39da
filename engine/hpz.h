/* hpz.h — the secondary copy of the hierarchical strategy, --strategy hpz (ZeRO++'s hpZ;
 * engine/shard.h, docs/communication.md "hpz").
 *
 * hpz shards parameters, gradients and moments over the world exactly as full (S = world:
 * the same shard files, so its checkpoints are full's). Beside that, each node group — n
 * consecutive ranks of the world (the launcher's node, FTK_SIM_NODE_RANKS's simulated one,
 * or --node-size n) — holds a secondary copy of the weights in the compute dtype: node rank j
 * keeps slice j of n of every unit, [j·P/n, (j+1)·P/n) of its padded flat vector (P is a
 * multiple of the world size, so of n). The first gather of a unit after the weights change
 * goes over the world, as full's does, and each rank keeps its node slice of what arrived;
 * every later gather of the unit in training passes, until the weights change again (the
 * step's backward, the later micro-batches' forwards), is an all-gather of the secondary copy
 * over the node group: intra-node links only. Evaluation passes (forward only) gather over
 * the world as full's do and leave the copy alone, so that a training step's bytes per
 * level are the formula's (shard.h) whatever the evaluation schedule. What it gathers are the bytes
 * the world gather delivered, so the model reads the same weights as under full, bit for bit.
 *
 * The decision (world or node) is taken when a gather is issued and the copy is taken when
 * a world gather is completed, both at fixed points of the pass's schedule, so every rank
 * issues the same collectives in the same order.
 *
 * Memory: the secondary copy is P/n elements of the compute dtype per unit, allocated once
 * (backend class weights), so the memory plan (engine/plan.c) counts it exactly.
 *
 * Accounting: the node group's collectives count on COMM_LEVEL_NODE (comm.h).
 *
 * Functions return a pointer / 0, or NULL / -1 with ftk_err_msg() set.
 */
#ifndef FTK_HPZ_H
#define FTK_HPZ_H
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../kernels/backend.h"
#include "comm.h"

typedef struct hpz hpz_t;

/* The node groups of n ranks (comm_split_blocks; their collectives account on stats at
 * COMM_LEVEL_NODE and copy through be) and the secondary copy of the units (padded to a
 * multiple of n) in dtype dt on be, marked stale. Collective over world. */
hpz_t *hpz_new(backend_t *be, comm_t *world, int n, comm_stats_t *stats, const ckpt_unit_t *units, int n_units,
               dtype_t dt);
void hpz_free(hpz_t *h);

comm_t *hpz_node(hpz_t *h); /* this rank's node group */

/* Issues the gather of unit u into full (its padded length in dt) from the secondary copy
 * over the node group when the copy holds the current weights of u: 1 (req in flight, or
 * done), or 0: the caller gathers over the world and calls hpz_gathered when it completes. */
int hpz_gather(hpz_t *h, int u, void *full, comm_req_t *req);
/* A world gather of unit u into full has completed: the node slice is kept (a device copy
 * queued after it). Nothing when the gather was the node group's. */
void hpz_gathered(hpz_t *h, int u, const void *full);
/* The weights have changed (a step, a load, a resume): every unit's copy is stale. */
void hpz_stale(hpz_t *h);
/* The next pass trains (1) or evaluates (0: the copy is neither read nor filled). */
void hpz_pass(hpz_t *h, int training);

#endif
