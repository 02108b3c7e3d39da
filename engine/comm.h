/* comm.h — the communication interface of the distributed trainer: a group of ranks and
 * the collectives that sharded data parallelism needs (docs/design.md "Sharding
 * strategies").
 *
 * Implementation: MPI (comm.c). Started without mpirun/srun (no launcher in the
 * environment), a process is a world of one without initialising MPI, and every
 * collective is a copy through the backend the world was given (comm_set_backend).
 * GPU ranks put NCCL behind the tensor collectives (comm_enable_nccl, below); control
 * traffic (scalars, broadcast of paths, agreement) stays on MPI. comm_plan() makes a pretend world for the memory
 * plan (engine/plan.c): N ranks of which this process plays one, whose collectives move
 * nothing but are accounted as if they had.
 *
 * Tensor collectives take f32 or bf16 buffers (dtype_t). Sums of bf16 add each pair of
 * contributions in fp32 and round the sum to nearest even (over MPI: a user-defined
 * reduction op), as NCCL's bf16 sum does; the order of the additions is the library's.
 * They are non-blocking: they return at once with a request; comm_wait() completes it.
 * MPI progresses non-blocking collectives inside MPI calls, so the trainer calls
 * comm_test() on what is in flight whenever it passes a unit boundary.
 *
 * NCCL (comm_enable_nccl; engine/comm_nccl.c, built where nvcc and nccl.h are found, the
 * library opened at run time): every
 * MPI communicator of the world — the world and each group split from it afterwards —
 * gets an NCCL communicator, made from a unique id that the communicator's rank 0 draws
 * and broadcasts over MPI (engine/comm_dev.h gives the order). Tensor collectives then
 * take the backend's device memory and never block the host: each is queued on one
 * communication stream (shared by the world's communicators, so their collectives run in
 * the order issued on every rank) after an event recorded on the compute stream (the
 * backend's default stream), so it reads what compute wrote before the call; comm_wait()
 * makes the compute stream wait for an event recorded after it; comm_test() polls that
 * event. bf16 buffers are gathered in bf16 and summed with ncclBfloat16 (fp32 adds, as
 * above); f32 in f32: the dtype is the caller's (the precision modes choose it). NCCL
 * errors come back as -1 with a message naming the rank (a failed communicator is
 * aborted so that nothing waits on it); counts are not limited to INT_MAX there.
 *
 * Accounting (comm_stats_t): every tensor collective adds the bytes it moves per rank in
 * the ring algorithm's terms: all-gather and reduce-scatter of a vector of N elements of
 * b bytes over p ranks: (1 − 1/p)·N·b; all-reduce: 2·(1 − 1/p)·N·b. Waiting (comm_wait
 * and the blocking calls) adds to wait_s. Scalar calls (a few doubles) are not counted as
 * volume. The same figures are also kept per kind and per level (coll[level][kind]: the
 * communicator's comm_set_level, 0 unless set), with each collective's span: from its
 * issue to its completion as this rank sees it (comm_wait, or comm_test finding it done;
 * MPI moves data only inside MPI calls, so the span is an upper bound of the transfer),
 * and the seconds blocked in comm_wait on it. inflight_s is the union of the spans of the
 * collectives sharing a comm_stats_t; overlap_s the part of it in which the host was not
 * blocked in a communication call: communication hidden behind compute. On NCCL ranks the
 * host does not wait for a collective (comm_wait queues a stream wait), so the spans end at
 * comm_wait and the waits are the compute stream's, invisible here.
 *
 * Simulated nodes (tests of the hierarchical strategies on one machine): with
 * FTK_SIM_NODE_RANKS=N, comm_node_rank and comm_node_id see blocks of N consecutive ranks
 * of the communicator as nodes (the last block may be smaller), and hybrid's default shard
 * group is such a block. The GPU of a rank (comm_node_gpu) still follows the real node.
 *
 * Ownership: comm_init() and comm_plan() return the world; comm_split() and
 * comm_split_blocks() return new groups, freed with comm_free() before comm_finalize().
 * Functions return 0, or -1 with ftk_err_msg() set; MPI itself aborts the job on a
 * communication failure (its default error handler).
 */
#ifndef FTK_COMM_H
#define FTK_COMM_H
#include <stddef.h>
#include <stdint.h>

#include "../kernels/backend.h"

typedef struct comm comm_t;

/* The kinds of tensor collective and the levels they are accounted on (coll[level][kind]). */
enum { COMM_KIND_AG, COMM_KIND_RS, COMM_KIND_AR, COMM_N_KINDS };
/* Levels: the shard group (the world but under hybrid); across groups (hybrid's replicas);
 * within a node group (hpz's gathers from its secondary copy, engine/hpz.h). */
enum { COMM_LEVEL_GROUP, COMM_LEVEL_CROSS, COMM_LEVEL_NODE, COMM_N_LEVELS };

/* One kind of collective on one level (see above). */
typedef struct {
    int64_t calls;
    double bytes;  /* per-rank volume */
    double busy_s; /* Σ over the calls of issue → completion */
    double wait_s; /* blocked in comm_wait on them */
} comm_coll_t;

typedef struct {
    double ag_bytes, rs_bytes, ar_bytes; /* per-rank volume (see above) */
    int64_t ag_calls, rs_calls, ar_calls;
    double wait_s; /* seconds blocked in communication */
    comm_coll_t coll[COMM_N_LEVELS][COMM_N_KINDS];
    double inflight_s, overlap_s; /* see above */
    int n_inflight, blocked;      /* bookkeeping of the two (comm.c) */
    double t_mark;
} comm_stats_t;

/* *d = now − before, figure by figure (the bookkeeping is now's). */
void comm_stats_since(comm_stats_t *d, const comm_stats_t *now, const comm_stats_t *before);

/* A request of a non-blocking collective; zero-initialised means "none". */
typedef struct {
    int active;
    unsigned char impl[16];
    comm_stats_t *stats; /* where its span is accounted (NULL: nowhere) */
    int kind, level;
    double t0;
} comm_req_t;

/* MPI_Init (thread level FUNNELED) and the world. */
comm_t *comm_init(int *argc, char ***argv);
/* A pretend world of `size` ranks in which this process is rank `rank` (see above). */
comm_t *comm_plan(int size, int rank);
void comm_finalize(comm_t *world);

int comm_rank(const comm_t *c);
int comm_size(const comm_t *c);
/* 1 for a process started without a launcher (a world of one, no MPI), else 0. */
int comm_alone(const comm_t *c);
/* Ranks sharing this rank's node (MPI_Comm_split_type SHARED, or simulated nodes: see
 * above): index and count. */
int comm_node_rank(comm_t *c, int *local_rank, int *local_size);
/* The ranks per node where the nodes hold equal blocks of consecutive ranks of c (the
 * groups of hybrid and hpz are such blocks): 0 and *size, or -1 with the message saying the
 * nodes do not (and how many ranks they hold). Collective over c. */
int comm_node_blocks(comm_t *c, int *size);
/* This rank's node as the lowest rank of c on it (collective over c). */
int comm_node_id(comm_t *c, int *node);
/* FTK_SIM_NODE_RANKS: 0 and *n (0 when unset or empty: real nodes), or -1 with the message
 * naming the variable when it is not a count of ranks >= 1 (a tool may check it first). */
int comm_sim_node_ranks(int *n);
/* The GPU of this rank among the n_gpus the process sees (docs/design.md, "Devices"): its
 * node-local rank's; 0 where a launcher left it one GPU (or none: the backend then says
 * so). -1 with ftk_err_msg() where the node has more ranks than its n_gpus > 1 GPUs.
 * Collective over c (comm_node_rank), whatever n_gpus each rank passes. */
int comm_node_gpu(comm_t *c, int n_gpus);
/* Ranks with the same color form a group, ordered by key. */
comm_t *comm_split(comm_t *c, int color, int key);
/* Blocks of `block` consecutive ranks form *group; the ranks with the same index in their
 * blocks form *cross (hybrid sharding's shard groups and replicas). block divides the
 * size. */
int comm_split_blocks(comm_t *c, int block, comm_t **group, comm_t **cross);
void comm_free(comm_t *c);
/* Where the tensor collectives of c account (may be shared by several groups). */
void comm_set_stats(comm_t *c, comm_stats_t *s);
/* The level (COMM_LEVEL_*) c's collectives are accounted on; groups split from c start at 0. */
void comm_set_level(comm_t *c, int level);
/* Makes the tensor collectives of world, and of every group split from it afterwards, go
 * through NCCL on be's device (be: a CUDA backend; see above). Collective over world; every
 * rank returns 0, or -1 with the same verdict (the message names the failing rank and
 * NCCL's words). A world without MPI (one process, or a planning world) is left as it is:
 * its collectives are copies through the backend. -1 in a build without NCCL. */
int comm_enable_nccl(comm_t *world, backend_t *be);
/* 1 when this build has NCCL and libnccl.so.2 loads (comm_enable_nccl can work); else 0,
 * with ftk_err_msg() saying why. */
int comm_nccl_built(void);
/* How long comm_enable_nccl and the splits after it wait for every rank of a group to join
 * its NCCL communicator: FTK_NCCL_INIT_TIMEOUT seconds, default 300 (engine/comm_dev.h says
 * how the wait ends early). 0, or -1 with the message when the variable is not a number of
 * seconds above 0 (a tool may check it before the set-up, to call it a usage error). */
int comm_join_timeout(double *seconds);
/* 0, or -1 with the message when a device collective of c's world has failed since
 * comm_enable_nccl (the first error is kept; comm_wait and comm_test return it too, but
 * the shard engine completes requests without an error path: the trainer asks here once
 * a step, after the backend's sync); -2 when that first error is a peer's failure seen
 * from here (NCCL's ncclRemoteError), so that the rank that failed first-hand is the one
 * to report (comm_agree_first). Always 0 without a device library. */
int comm_status(comm_t *c);
/* The backend whose memory the tensor collectives see: a world of one copies through it
 * (without one, memmove). MPI ranks need host memory (the CPU backend's). */
void comm_set_backend(comm_t *c, backend_t *be);

/* full[p·n] = the n-element parts of every rank, in rank order; a part that already sits
 * at its place in full (part == full + rank·n) is gathered in place. */
int comm_allgather(comm_t *c, const void *part, void *full, int64_t n, dtype_t dt, comm_req_t *req);
/* comm_allgather of `bytes` bytes a rank (an even count) whatever they hold (the compressed
 * gather's packed parts, engine/compress.h): a gather does no arithmetic, so they travel as
 * 16-bit elements, bit for bit over MPI and NCCL alike, accounted as their bytes. */
int comm_allgather_bytes(comm_t *c, const void *part, void *full, int64_t bytes, comm_req_t *req);
/* part[n] = Σ over ranks of their full[rank·n … rank·n + n). */
int comm_reduce_scatter(comm_t *c, const void *full, void *part, int64_t n, dtype_t dt, comm_req_t *req);
/* buf[n] = Σ over ranks, in place. */
int comm_allreduce(comm_t *c, void *buf, int64_t n, dtype_t dt, comm_req_t *req);
int comm_wait(comm_t *c, comm_req_t *req);
/* *done = 1 when the request has completed (it is then inactive). */
int comm_test(comm_req_t *req, int *done);

/* Blocking control traffic. op: COMM_SUM, COMM_MAX, COMM_MIN. */
enum { COMM_SUM, COMM_MAX, COMM_MIN };
int comm_allreduce_f64(comm_t *c, double *v, int n, int op);
int comm_allreduce_i64(comm_t *c, int64_t *v, int n, int op);
int comm_bcast(comm_t *c, void *buf, size_t bytes, int root);
/* recv (root only) = the bytes-sized records of every rank, in rank order. */
int comm_gather(comm_t *c, const void *send, void *recv, size_t bytes, int root);
int comm_barrier(comm_t *c);
/* Point to point, host memory, blocking: sends sbytes of send to rank dest and receives
 * rbytes into recv from rank src, at once (MPI_Sendrecv, in pieces of at most 1 GiB: no
 * count limit); dest or src -1: that side is skipped. Both sides must agree on the sizes
 * (send them first). Not accounted as a collective's volume (memory snapshots, engine/snapshot.h). */
int comm_sendrecv(comm_t *c, const void *send, int64_t sbytes, int dest, void *recv, int64_t rbytes, int src);
/* comm_sendrecv started and left to run (MPI_Isend/MPI_Irecv): MPI moves it inside the
 * other calls that follow (the next step's collectives); comm_p2p_wait() completes it and
 * frees the handle. Both buffers stay untouched until then. NULL when out of memory. */
typedef struct comm_p2p comm_p2p_t;
comm_p2p_t *comm_p2p_start(comm_t *c, const void *send, int64_t sbytes, int dest, void *recv, int64_t rbytes, int src);
int comm_p2p_wait(comm_p2p_t *p); /* NULL: nothing */

/* Every rank calls it with its status (0 or an exit code) and, when failing, its message
 * in msg. Returns the highest code of all ranks; when that is not 0, msg holds the
 * message of the lowest failing rank on every rank and *who that rank. No rank is left
 * waiting in a collective: this is how start-up, checkpoints and resume fail together. */
int comm_agree(comm_t *c, int code, char *msg, size_t cap, int *who);
/* comm_agree where a rank's failure may only follow another's (after_peer: comm_status -2):
 * msg is the lowest failing rank's among those that failed first-hand, when there is one. */
int comm_agree_first(comm_t *c, int code, int after_peer, char *msg, size_t cap, int *who);

#endif
