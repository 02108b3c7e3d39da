/* report.h — where a training step's time and bytes went (docs/communication.md): the
 * figures ftk-train adds to each step line of metrics.jsonl, and the run's report that
 * `ftk-train --report FILE.md` writes at the end.
 *
 * The step is split into parts that add up to it: compute (the passes, the loss, the
 * optimizer step, the backend's sync: trainer_step_t.compute_s), exposed communication
 * (seconds blocked in communication: comm.wait_s) and host work (the rest of the loop's
 * time: reading the batch, bookkeeping, metrics, checkpoint commits). Overlapped
 * communication (comm.overlap_s: a collective in flight while the host computed) is
 * reported beside them: it is hidden under compute, not added to the step.
 *
 * Per collective kind and level (comm.h "Accounting"; the levels are the strategy's: one
 * level, "world", for full, grad-op and none; "shard_group" and "replicas" for hybrid;
 * "world" and "node" for hpz):
 * calls, the bytes this rank moved, the analytical bytes (docs/design.md "Volumes"),
 * seconds in flight, seconds blocked, and the achieved bus bandwidth (bytes / seconds in
 * flight: the ring algorithm's per-rank bytes, as nccl-tests' busbw counts them). Each
 * level says where its ranks are (intra-node, inter-node, or both), from comm_node_id
 * (FTK_SIM_NODE_RANKS simulates nodes).
 *
 * The run's report ends with a projection of the step time on other rank counts from the
 * measured split, under a model it states (report.c: report_project).
 *
 * Functions return 0 / a pointer, or -1 / NULL with ftk_err_msg() set. report_new and
 * report_write are collective over the world.
 */
#ifndef FTK_REPORT_H
#define FTK_REPORT_H
#include <stdint.h>

#include "../libcommon/buf.h"
#include "comm.h"
#include "precision.h"
#include "shard.h"
#include "strategy.h"
#include "trainer.h"

typedef struct report report_t;

/* The run's facts for the report: the shards (their layout and groups), strategy,
 * precision and the batch sizes (train); header: one line of Markdown naming the run
 * (copied). Collective over world (where the levels' ranks are). */
report_t *report_new(comm_t *world, shard_t *sh, strategy_t strat, precision_t prec, const ckpt_train_t *train,
                     const char *header);
void report_free(report_t *r);

/* Levels of the strategy (1 or 2) and their names (level: COMM_LEVEL_*). */
int report_levels(const report_t *r);
const char *report_level_name(const report_t *r, int level);
const char *report_kind_name(int kind); /* "all_gather", "reduce_scatter", "all_reduce" */

/* The analytical bytes per rank of one step on `ranks` ranks with `micro` micro-batch
 * passes per rank (docs/design.md "Volumes", the units padded to the shard count those
 * ranks would have). hybrid keeps its shard group size, hpz its node group size: ranks is
 * a multiple of it. */
void report_formula(const report_t *r, int ranks, int64_t micro, double v[COMM_N_LEVELS][COMM_N_KINDS]);

/* Counts a step: st from trainer_step, loop_s the loop's wall time for it (>= st->step_s:
 * the metrics and checkpoint bookkeeping around trainer_step are host time too). Appends
 * the step's figures as JSON members to out (", \"split\": {…}, \"collectives\": […]").
 * out may be NULL (ranks that write no metrics). */
int report_step(report_t *r, const trainer_step_t *st, double loop_s, buf_t *out);

/* The run's report over the steps counted (means per step; the first step of the process
 * left out as warm-up when there are more): every rank calls it; rank 0 writes path
 * (output.h: a file replaced atomically, a FIFO or a device written in place, - stdout).
 * Returns 0; 1 when no step was counted (nothing written; every rank says
 * so); -1 with the message (writing it: rank 0). */
int report_write(report_t *r, comm_t *world, const char *path);

#endif
