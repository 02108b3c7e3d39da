/* comm_dev.h — the device communication library behind comm.h's tensor collectives (NCCL,
 * engine/comm_nccl.c), as a table of functions: for comm.c, the library itself and the
 * tests; the rest of the program sees only comm.h.
 *
 * A table, because comm.c owns the set-up order (the part that can go wrong without a
 * GPU in sight) and a test puts a fake library behind it on CPUs (tests/unit/test_comm.c):
 *   1. comm_enable_device(world, be, ops): ctx_new(be) once, the state every communicator
 *      of the world shares (the backend's device, one communication stream);
 *   2. per MPI communicator — the world, then each group split from it, in the order the
 *      ranks split (comm_split, comm_split_blocks: group first, then cross) — rank 0 of
 *      the communicator calls unique_id(); the id goes to the others with rank 0's status
 *      over that communicator's MPI_Bcast (a failure there fails every rank rather than
 *      leaving them waiting in init); every rank calls comm_new(id, size, rank) with its
 *      rank in the MPI communicator, which starts the join and returns, and polls ready()
 *      until it has joined. The join completes only when every rank of the group has
 *      joined, so a rank that fails (or never gets there) would leave the others waiting
 *      forever: while they poll, they also watch MPI for a "gave up" message from any rank
 *      of the group, which a rank that fails sends to all the others, and a deadline
 *      (FTK_NCCL_INIT_TIMEOUT seconds, default 300); either ends the wait. An MPI agreement
 *      on the outcome then makes every rank return the same verdict, with the message of
 *      the rank that failed first-hand (not of those that gave up because of it), and the
 *      gave-up messages are all received before it returns.
 *
 * Collectives take device memory and are queued on the device in the order of the calls:
 * each hands back a token (an event) that wait() makes the compute stream wait for and
 * test() polls; neither blocks the host. A world has one library (comm.c keeps the
 * table of the world that enabled one last).
 *
 * Threads: the one that calls comm.h. Errors: -1 or NULL with ftk_err_msg() set, naming
 * the rank; nothing here exits.
 */
#ifndef FTK_COMM_DEV_H
#define FTK_COMM_DEV_H
#include <stdint.h>

#include "comm.h"

#define COMM_DEV_ID_MAX 128 /* the bytes of a unique id: ncclUniqueId's size */

typedef struct {
    const char *name; /* for messages: "NCCL" */
    /* The world's shared state on be's device; world_rank names this process in messages. */
    void *(*ctx_new)(backend_t *be, int world_rank);
    void (*ctx_free)(void *ctx); /* after every communicator of ctx is freed */
    /* 0, or -1 with the first error any communicator of ctx met (kept: comm_status); -2 when
     * that error is a peer's failure (NCCL's ncclRemoteError). */
    int (*status)(void *ctx);
    int (*unique_id)(void *ctx, unsigned char id[COMM_DEV_ID_MAX]);
    /* Starts joining the group of the size ranks given the same id (rank: this one's) and
     * returns at once: the device communicator, joined or still joining; NULL on failure. */
    void *(*comm_new)(void *ctx, const unsigned char id[COMM_DEV_ID_MAX], int size, int rank);
    /* 1 joined, 0 still joining, -1 the join failed (message). Never blocks for long. */
    int (*ready)(void *dc);
    /* abandon: the set-up failed (here or on another rank): nothing may wait for the peers,
     * and a join still under way is given up (its resources may outlive the call: the
     * program is expected to end). */
    void (*comm_free)(void *dc, int abandon);
    /* As comm.h's, on device buffers; *token is what wait and test take (may be NULL). */
    int (*allgather)(void *dc, const void *part, void *full, int64_t n, dtype_t dt, void **token);
    int (*reduce_scatter)(void *dc, const void *full, void *part, int64_t n, dtype_t dt, void **token);
    int (*allreduce)(void *dc, void *buf, int64_t n, dtype_t dt, void **token);
    /* The compute stream waits for the collective of token (the host does not); releases it. */
    int (*wait)(void *dc, void *token);
    /* *done = 1 when the collective has finished on the device; then token is released. */
    int (*test)(void *dc, void *token, int *done);
    /* Optional: looks for an asynchronous error on every communicator of ctx; on one, aborts
     * them all (their collectives end, so no stream waits for them forever) and keeps the
     * message (status). 0, or -1. comm_enable_device makes the backend call it while the
     * host waits for the device (backend.h wait_hook). */
    int (*poll)(void *ctx);
} comm_dev_ops_t;

/* NCCL's table (engine/comm_nccl.c, which defines it only where nccl.h is found), or NULL
 * with ftk_err_msg() saying why libnccl.so.2 does not load. Callers outside the CUDA
 * library reach it through engine/cuda_load.h (cuda_load_nccl), which answers for a build
 * without it. */
const comm_dev_ops_t *comm_nccl_ops(void);

/* comm_enable_nccl() with any library (see above). */
int comm_enable_device(comm_t *world, backend_t *be, const comm_dev_ops_t *ops);

#endif
