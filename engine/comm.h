/* comm.h — the communication interface of the distributed trainer: a group of ranks and
 * the collectives that sharded data parallelism needs (DESIGN.md "Sharding strategies").
 *
 * Implementation: MPI (comm_mpi.c). Started without mpirun/srun (no launcher in the
 * environment), a process is a world of one without initialising MPI, and every
 * collective is a copy. The CUDA issue adds NCCL behind the tensor
 * collectives (all-gather, reduce-scatter, all-reduce of float32); control traffic
 * (scalars, broadcast of paths, agreement) stays on MPI.
 *
 * Tensor collectives are non-blocking: they return at once with a request; comm_wait()
 * completes it. MPI progresses non-blocking collectives inside MPI calls, so the trainer
 * calls comm_test() on what is in flight whenever it passes a unit boundary.
 *
 * Accounting (comm_stats_t): every tensor collective adds the bytes it moves per rank in
 * the ring algorithm's terms (DESIGN.md): all-gather and reduce-scatter of a vector of N
 * floats over p ranks: (1 − 1/p)·N·4; all-reduce: 2·(1 − 1/p)·N·4. Waiting (comm_wait and
 * the blocking calls) adds to wait_s. Scalar calls (a few doubles) are not counted as
 * volume.
 *
 * Ownership: comm_init() returns the world; comm_split() returns new groups, freed with
 * comm_free() before comm_finalize(). Functions return 0, or -1 with ftk_err_msg() set;
 * MPI itself aborts the job on a communication failure (its default error handler).
 */
#ifndef FTK_COMM_H
#define FTK_COMM_H
#include <stddef.h>
#include <stdint.h>

typedef struct comm comm_t;

typedef struct {
    double ag_bytes, rs_bytes, ar_bytes; /* per-rank volume (see above) */
    int64_t ag_calls, rs_calls, ar_calls;
    double wait_s; /* seconds blocked in communication */
} comm_stats_t;

/* A request of a non-blocking collective; zero-initialised means "none". */
typedef struct {
    int active;
    unsigned char impl[16];
} comm_req_t;

/* MPI_Init (thread level FUNNELED) and the world. */
comm_t *comm_init(int *argc, char ***argv);
void comm_finalize(comm_t *world);

int comm_rank(const comm_t *c);
int comm_size(const comm_t *c);
/* Ranks sharing this rank's node (MPI_Comm_split_type SHARED): index and count. */
int comm_node_rank(comm_t *c, int *local_rank, int *local_size);
/* Ranks with the same color form a group, ordered by key. */
comm_t *comm_split(comm_t *c, int color, int key);
void comm_free(comm_t *c);
/* Where the tensor collectives of c account (may be shared by several groups). */
void comm_set_stats(comm_t *c, comm_stats_t *s);
/* How a world of one copies in its tensor collectives (default memmove): a backend whose
 * memory is not the host's passes its copy. MPI ranks ignore it (MPI reads host memory). */
void comm_set_copy(comm_t *c, void (*copy)(void *dst, const void *src, size_t bytes));

/* full[p·n] = the n-element parts of every rank, in rank order. */
int comm_allgather(comm_t *c, const float *part, float *full, int64_t n, comm_req_t *req);
/* part[n] = Σ over ranks of their full[rank·n … rank·n + n). */
int comm_reduce_scatter(comm_t *c, const float *full, float *part, int64_t n, comm_req_t *req);
/* buf[n] = Σ over ranks, in place. */
int comm_allreduce(comm_t *c, float *buf, int64_t n, comm_req_t *req);
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

#endif
