/* snapshot.h — memory snapshots: every N steps each rank's training state in its node's
 * memory and in a partner's on another node, and the restart that reads it back
 * (docs/checkpoints.md "Memory snapshots"). A lost node then costs the steps since the last
 * snapshot, not those since the last checkpoint on disk, which stays the durable copy.
 *
 * ## In memory
 *
 * A node's memory folder M is ftk-train --memory-dir (default $FTK_MEMORY_DIR, else
 * /dev/shm: a tmpfs, which outlives the process but not the node); on simulated nodes
 * (FTK_SIM_NODE_RANKS) node I's is M/node-I, so that a test removes one node's memory.
 *
 *   M/ftk-UID/RUNID/              one run (UID: the user's; RUNID: RUN/.run-id, 16 hex
 *                                 digits drawn when the run directory was made)
 *     run                         the run directory's absolute path, then a newline
 *     rank-RRRRR/                 written by world rank R alone (directories mode 0700)
 *       step-NNNNNNNN/            a complete snapshot of step N: a checkpoint directory
 *                                 (formats/checkpoint.h: manifest.json, config.json) that
 *                                 holds only some shards: rank R's own shard file, and the
 *                                 copy it keeps for its partner as it came, "shard-…-of-….raw"
 *       .step-NNNNNNNN.tmp.PID/   one being written, renamed into place when complete
 *
 * A partner copy (".raw") is a 4096-byte header — the text "ftk memory snapshot copy 1\n",
 * "step N\n", "shard J\n" (0-based), "of S\n", "bytes B\n", "xxh3 HEX\n", zero-padded —
 * then the B bytes of the sender's host snapshot (engine/bgsave.h: its arrays in file order),
 * HEX their XXH3-64. A restart that needs it writes the shard file from it (the writer and the
 * arrays of the sender: the same bytes), checked against the manifest's checksum.
 *
 * Each rank directory keeps its two newest complete snapshots (double buffering: a rank
 * killed while writing leaves the one before whole, and the restart takes the newest step
 * that every shard has somewhere). Files are the checkpoint's: every array checksummed, each
 * shard file's XXH3-64 in the manifest, the manifest sealed.
 *
 * **Overlapped** (snapshot_take, snapshot_poll). At the step boundary the loop waits only for
 * the copy of this rank's state into its host snapshot (bgsave.h: page-locked on a GPU); a
 * thread writes and checksums its shard file from it, and MPI sends its bytes to the partner
 * and receives the partner's straight into the mapped copy file, both while the next step
 * runs. Inside that step, after its passes (snapshot_poll), every rank waits for what is left
 * of both, the ranks exchange their checksums and each renames its directory into place: a
 * step's snapshot is complete before the next step ends, so a lost node costs at most the
 * step it was in and the one before.
 *
 * **Who holds what.** Rank q's shard (shard_index; replicas of hybrid hold the same one)
 * is written into its node's memory by the lowest rank of the node holding that shard.
 * Its partner is rank q + n (n: ranks per node, the launcher's or FTK_SIM_NODE_RANKS's),
 * modulo the world: one node on, which keeps a copy of its bytes. Where a rank on another
 * node already holds the same shard (hybrid's replicas, none's), that is the copy and
 * nothing is sent. One node (or nodes of unequal sizes): no partner copies; a snapshot then
 * survives a process's death but not the node's.
 *
 * **Restart** (snapshot_find): every rank lists what its own rank directory holds; the ranks
 * agree on the newest step of which every shard is held by some rank; a rank whose shard
 * is not on its node receives the files (manifest, config, shard) from the lowest rank that
 * holds it. The caller reads the snapshot as a checkpoint (every checksum verified).
 *
 * **Stale snapshots.** A normal end removes the run's snapshots (snapshot_drop). At the start
 * of a run the lowest rank of each node removes those of runs that are gone: whose run
 * directory is missing or holds another .run-id, or whose writer is dead (its run
 * directory's lock free) and whose newest disk checkpoint is as new as their newest
 * snapshot. A dead run with snapshots newer than its disk checkpoint keeps them (its
 * restart needs them).
 *
 * Fault points (libcommon/fault.h): "snapshot.copy" (a rank starts copying its state),
 * "snapshot.send" (its bytes are about to be sent to the partner), "bgsave.write" (the
 * thread writes one array), "snapshot.done" (a rank is about to rename its snapshot into
 * place), "snapshot.fetch" (before each piece of a file sent to a restarting rank).
 *
 * Every function is collective over the world given to snapshot_new. They return 0, or -1
 * with ftk_err_msg() set on the rank that failed (others return 0: the caller agrees, as
 * the trainer does for everything, trainer.h).
 */
#ifndef FTK_SNAPSHOT_H
#define FTK_SNAPSHOT_H
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "bgsave.h"
#include "comm.h"
#include "../kernels/backend.h"
#include "shard.h"

typedef struct snapshot snapshot_t;

/* The folder of this process's node for a --memory-dir (a simulated node's below it) and the
 * run's folder: what snapshot_new makes. */
typedef struct {
    const char *mem_dir; /* --memory-dir */
    const char *run_dir; /* the run directory (its absolute path is written into `run`) */
    const char *run_id;  /* 16 hex digits (RUN/.run-id) */
} snapshot_where_t;

/* The roles of every rank (collective), the host snapshot of writers and receivers
 * (bgsave_new on be: page-locked on a GPU), the run's folder made (rank directories on first
 * use), and stale snapshots removed (the lowest rank of each node). cfg (the model, for the
 * manifests) and sh must outlive it. NULL on failure (this rank's; the collective calls are
 * all made first). */
snapshot_t *snapshot_new(comm_t *world, backend_t *be, shard_t *sh, const model_config_t *cfg,
                         const snapshot_where_t *where);
/* Ends a snapshot in flight uncommitted (its transfers waited for: every rank frees together). */
void snapshot_free(snapshot_t *s);

/* What a call cost this rank: seconds (the whole call: what the loop waited), of which
 * wait_s waiting for the snapshot in flight; bytes_all: what every rank writes into its
 * node's memory and sends, together (the same on every rank, known without asking). */
typedef struct snapshot_cost {
    double seconds, wait_s;
    int64_t bytes_all;
} snapshot_cost_t;

/* Commits the snapshot in flight, if any, then starts the one of meta's step (above); shard
 * 1 carries tok_src's tokenizer files. Where any rank failed, no rank commits. */
int snapshot_take(snapshot_t *s, const ckpt_meta_t *meta, hid_t tok_src, snapshot_cost_t *cost);
/* Commits the snapshot in flight, if any (inside the step after it was started). */
int snapshot_poll(snapshot_t *s, snapshot_cost_t *cost);

/* The newest step of which every shard is held by some rank, when it is at least min_step:
 * *step, and in dir the snapshot directory on this rank's node that holds this rank's shard
 * file (made from a partner copy, or received into its own rank directory, where the node had
 * none). *step = -1 (dir "") when there is none, or it is older than min_step, or the world
 * or shard count differ; *seen: the newest step any rank holds a snapshot of (-1: none);
 * *damaged: the snapshots or partner copies the ranks passed over as unreadable (a manifest
 * refused, a copy's header or size wrong). *bytes: what this rank received. tok_src: as for
 * snapshot_take. */
int snapshot_find(snapshot_t *s, int64_t min_step, hid_t tok_src, int64_t *step, int64_t *seen, int64_t *damaged,
                  char dir[4096], int64_t *bytes);

/* After a restart from step (or -1: from disk), every rank's snapshots of other steps are
 * removed (a dead run's later steps are not this run's). */
int snapshot_settle(snapshot_t *s, int64_t step);

/* Removes the run's snapshots on every node (a normal end; a disk checkpoint as new). */
int snapshot_drop(snapshot_t *s);

#endif
