/* shard.h — sharded data parallelism: where each unit's parameters, gradients and AdamW
 * moments live on each rank, and the collectives that move them (docs/design.md
 * "Sharding strategies"). The model asks for units through model_io_t (model.h); this
 * module answers. The optimizer step (clipping, AdamW) runs over the owned slices this module
 * exposes (optim.h).
 *
 * Shard groups. S ranks form a shard group; a unit's flat vector (padded to a multiple of
 * S) is cut into S contiguous slices and group rank r owns slice r: [r·P/S, (r+1)·P/S)
 * — the shard map of formats/checkpoint.h, so a rank's owned state is its shard file.
 *   full     S = world. Before a unit is used its slices are all-gathered into a whole
 *            buffer; the forward pass releases it after use and the backward gathers it
 *            again; its gradient is reduce-scattered right after its backward, into
 *            this rank's gradient slice.
 *   grad-op  S = world. Parameters gathered once per step (at first use) and kept until
 *            the optimizer step; gradients reduce-scattered as in full.
 *   none     Replicated (DDP): every rank holds whole units and runs AdamW on all of
 *            them; gradients accumulate locally over the micro-batches and are
 *            all-reduced (per unit, issued as soon as the last micro-batch's backward
 *            finishes the unit). The checkpoint still cuts units into S = world slices,
 *            one shard file per rank, so ranks write in parallel.
 *   hybrid   full inside groups of S ranks (--shard-group-size, or the ranks of a node);
 *            the groups are replicas: after the step's last micro-batch each gradient
 *            slice is all-reduced across groups. Replica 0 writes the checkpoint.
 *   hpz      full (S = world: the same state, shard files and checkpoints), plus a
 *            secondary copy of the weights sharded within each node group of n ranks
 *            (--node-size, or the ranks of a node; engine/hpz.h): a unit's first gather
 *            after the weights change goes over the world, every later one in training
 *            (the backward's, the later micro-batches') over the node group from the copy;
 *            evaluation passes gather over the world. Same weights as
 *            full, bit for bit; gradients reduce-scattered over the world as in full.
 * Collectives per micro-batch in full/hybrid, counted in communication units (units.h:
 * a block, or a group of consecutive blocks under --units group:M or size:BYTES): every
 * block's unit gathered twice (forward, backward); the embedding once (its backward reads
 * no parameters; a tied embedding is held from the first block to the head, which reads it
 * again); the head unit once (its forward and backward run back to back); one
 * reduce-scatter per unit. grad-op: one gather per unit per step. hpz (--units block
 * only), over a step of M micro-batches: each unit gathered once over the world (level
 * world), then each block 2M − 1 times and the embedding and head M − 1 times over the
 * node group (level node); reduce-scatters as full's. Per rank, with P_b, P_e the padded
 * lengths of the blocks and of the two end units, b the bytes of an element and W, n the
 * world and node sizes (docs/communication.md "hpz"):
 *   world all-gather      (1 − 1/W)·b·(P_b + P_e)
 *   node all-gather       (1 − 1/n)·b·((2M − 1)·P_b + (M − 1)·P_e)
 *   world reduce-scatter  (1 − 1/W)·b_grad·M·(P_b + P_e)
 * The trainer reports what moved (comm.h accounting);
 * tests/ref/dist_equivalence.py checks it against these counts.
 *
 * Overlap: when the model asks for a unit, the all-gather of the next unit in the pass's
 * order is issued before returning (prefetch); reduce-scatters are issued as units finish
 * and completed later — at most two in flight, the oldest completed when a third starts,
 * and all at shard_pass_end() — with comm_test() progressing them at every unit
 * boundary.
 *
 * Precision (precision.h): owned weights and moments are in the mode's state dtype,
 * gradients in its gradient dtype; what is gathered and what the model reads is in its
 * compute dtype. bf16-mixed keeps a bf16 working copy of each owned slice beside the fp32
 * master, refreshed (rounded to nearest even) after every step, and gathers that: half the
 * bytes. bf16-true stores p, m, v and g in bf16, and AdamW rounds its results
 * stochastically (bk_adamw_t, optim.h) unless rounding to nearest was asked for.
 *
 * Memory: whole-unit buffers (gathered units, gradients in flight) come from a pool that
 * shard_reserve() fills before training by replaying a training pass's requests in the
 * order model.h documents, so a pass never allocates and the memory plan (engine/plan.c)
 * sees every buffer. Allocations are counted in the backend's classes (weights,
 * gradients, optimizer state, gathered units).
 *
 * Functions return 0 / a pointer, or -1 / NULL with ftk_err_msg() set.
 */
#ifndef FTK_SHARD_H
#define FTK_SHARD_H
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../kernels/backend.h"
#include "comm.h"
#include "model.h"
#include "precision.h"
#include "shard_load.h"
#include "strategy.h"
#include "units.h"


typedef struct shard shard_t;

/* world: every rank; group_size: ranks per shard group for hybrid, per node group for hpz
 * (0: the ranks of a node); ignored otherwise. Allocates this rank's owned state (zero) on be. */
shard_t *shard_new(backend_t *be, comm_t *world, strategy_t strat, int group_size, const model_config_t *cfg,
                   precision_t prec);
void shard_free(shard_t *s);
/* The unit of communication (units.h; block until called): call once, after shard_new, before
 * shard_reserve. It changes which collectives move the owned slices, never the slices, the
 * shard map or any arithmetic. -1 when the policy does not fit the model (group:M with M
 * above its blocks). A group's owned gradients are one allocation (its blocks' slices side
 * by side), so that the all-reduces — hybrid's across replicas, none's over whole units
 * (DDP's buckets) — also move a group in one collective. */
int shard_set_units(shard_t *s, const units_policy_t *p);
/* Fills the pool with every whole-unit buffer a training pass and an evaluation pass
 * take (call after shard_new, before the first pass; no communication). */
int shard_reserve(shard_t *s);

/* --compress-weights (compress.h: COMPRESS_OFF, COMPRESS_INT8): how the strategies that
 * gather send the weights; --compress-grads (COMPRESS_OFF, COMPRESS_BF16): how full and
 * grad-op reduce-scatter the gradients, with the error-feedback residual (compress.h),
 * whole units of f32 on this rank, allocated here (counted as gradients). Call before
 * shard_reserve(); nothing to do where nothing is gathered (none, one shard). -1 with
 * strategy_check's message where the strategy, the --units policy or the precision does not
 * take them (or no memory). */
int shard_set_compress(shard_t *s, int weights, int grads);
int shard_compress(const shard_t *s);       /* the weights' compression in effect (0: none) */
int shard_compress_grads(const shard_t *s); /* the gradients' (0: none) */
/* --compress-grads: unit's residual (units[unit].padded f32) to and from host memory (the
 * checkpoint's /grad_residual). */
int shard_get_residual(shard_t *s, int unit, float *host);
int shard_set_residual(shard_t *s, int unit, const float *host);

/* Layout facts. */
const ckpt_unit_t *shard_units(const shard_t *s, int *n_units);
int64_t shard_count(const shard_t *s);     /* S: slices per unit */
int64_t shard_index(const shard_t *s);     /* this rank's slice, 0-based */
int shard_writes(const shard_t *s);        /* this rank writes its shard file */
comm_t *shard_group(shard_t *s);           /* the shard group (S ranks) */
comm_t *shard_cross(shard_t *s);           /* hybrid: the replicas of this slice; else NULL */
comm_t *shard_node(shard_t *s);            /* hpz: this rank's node group; else NULL */
const model_io_t *shard_io(shard_t *s);    /* for model_new_io() */
comm_stats_t *shard_stats(shard_t *s);     /* accumulated over the run */
precision_dtypes_t shard_dtypes(const shard_t *s);

/* This rank's owned state of one unit: elements [lo, lo + len) of its flat vector (the whole
 * padded unit under none); p, m, v in the state dtype, g in the gradient dtype, on the
 * backend. The optimizer updates them in place (optim.h); the pointers stay valid until
 * shard_free. */
typedef struct {
    void *p, *m, *v, *g;
    int64_t lo, len;
} shard_slice_t;
shard_slice_t shard_owned(const shard_t *s, int unit);

/* Initial parameters from a weights file: each rank reads only its slices (whole units
 * for none), rounded to the state dtype; each tensor read whole is checked against its
 * checksum. Several threads read; the file is read while the previous unit is uploaded
 * (shard_load.h). *st (may be NULL): what the load took, filled on success. */
int shard_load_weights(shard_t *s, hid_t weights, shard_load_stats_t *st);
/* This rank's slice [r·P/S, (r+1)·P/S) of one unit's array (kind 0 parameters, 1 and 2
 * the AdamW moments) into host memory (padded/S elements of the state dtype): a
 * checkpoint is written one array at a time, never a second copy of the state. */
int shard_get_slice(shard_t *s, int kind, int unit, void *host);
/* Every unit's slices of parameters and moments from host arrays (ckpt_state_t layout,
 * in the state dtype). Under none this gathers whole units from every rank's slice (all
 * ranks call it). */
int shard_set_state(shard_t *s, const ckpt_state_t *st);

/* A pass over one micro-batch: begin (backward: a training pass, else forward only;
 * last: the step's last micro-batch) and end (completes the reduce-scatters). */
void shard_pass_begin(shard_t *s, int backward, int last);
void shard_pass_end(shard_t *s);

/* The optimizer step's sharding side (optim_step calls them in this order, around
 * shard_drop). After the step's last pass: completes the gradient all-reduces (hybrid's
 * across replicas, none's across every rank), so that the owned gradients are the step's. */
void shard_grads_complete(shard_t *s);
/* Σg² of each owned gradient taken by the pass that completes it, instead of a pass of its
 * own (docs/gpu.md "Σg² folded into the reduce-scatter's add"). sq: n_units doubles in
 * the backend's memory, zero at each step's start (the caller keeps it so; shard_set_sumsq
 * keeps the pointer, not ownership). Where the backend has add_sumsq and the step's last
 * pass ends with the add of a reduce-scatter's slice into the owned gradient — full,
 * grad-op and hybrid of one replica with two or more ranks a group — that add also adds
 * Σg[u]² into sq[u], and shard_sumsq_folded(s, u) is 1 until the next training pass or
 * shard_step_done; so it is where shard_set_sumsq_side took it on a second stream. Elsewhere
 * (none across ranks, hybrid's cross-group all-reduce, which writes g after that add; one
 * shard without the side stream) it is 0 and the caller takes Σg² itself. NULL: never
 * folded. */
void shard_set_sumsq(shard_t *s, double *sq);
int shard_sumsq_folded(const shard_t *s, int u);
/* *v (this rank's share of a sum over the owned slices) summed over the shard group, so
 * that every rank holds the sum over whole units; under none nothing to do. Collective. */
void shard_sum_owned(shard_t *s, double *v);
/* Whether shard_sum_owned communicates: 0 where this rank's slices are whole units or its
 * group is itself alone (one GPU, none, a group of one), so the norm is known on the device. */
int shard_sum_needed(const shard_t *s);
/* After the update: refreshes bf16-mixed's working copy; the owned gradients are cleared
 * (first_write off) or marked to be written, not added into, by the next step's first
 * pass. */
void shard_step_done(shard_t *s);
/* on (the default): no memset of the gradients — the step's first pass writes each owned
 * gradient (model_io_t grads_first: the model's first products with beta = 0 where it
 * writes the owned buffer itself, one shard or none; the first reduce-scatter's slice
 * converted into it, not added, where the pass writes whole-unit buffers, which are then
 * zeroed only in their padding). off: every step zeroes the owned gradients and every
 * whole-unit buffer, and the passes add (FTK_STEP's first_write, engine/trainer.c).
 * Call between steps. */
void shard_set_first_write(shard_t *s, int on);
/* on: where the model writes the owned gradient itself and nothing changes it after the
 * step's last pass (one GPU, a group of one; not none or hybrid across ranks, not sharded
 * strategies, which fold Σg² into the reduce-scatter's add instead), each unit's Σg² is
 * taken as soon as that pass is done with the unit, on a stream of its own beside the
 * backward pass of the units before it, instead of a pass after the backward; its sums
 * and its order are sumsq's, so the same bits (FTK_STEP's sumsq_overlap,
 * engine/trainer.h). Call once, after shard_set_sumsq: 0, or -1 with the message when
 * the stream or its events cannot be made. Off by default. */
int shard_set_sumsq_side(shard_t *s, int on);

/* Drops gathered parameters (grad-op keeps them through a step; call after evaluating). */
void shard_drop(shard_t *s);

#endif
