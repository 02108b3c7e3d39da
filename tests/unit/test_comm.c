/* The contract of comm.h, one test for every implementation:
 *  - tensor collectives in f32 and bf16: all-gather (and in place), reduce-scatter,
 *    all-reduce, two in flight at once (comm_test polled, comm_wait), the bf16 sum's
 *    rounding (to nearest even of the fp32 sum, on 2 ranks), the accounting;
 *  - comm_split_blocks' mapping (hybrid's shard groups and replicas), and the contract
 *    again inside each group;
 *  - simulated nodes (FTK_SIM_NODE_RANKS) and the per-level, per-kind accounting;
 *  - comm_agree: the highest code, the lowest failing rank's message, on every rank;
 *    comm_agree_first: a first-hand failure's message before those that followed a peer's.
 * Implementations: the world as started (a world of one without a launcher; MPI under
 * mpirun, on the CPU backend); under mpirun also a fake device library behind
 * comm_enable_device (engine/comm_dev.h), host memory over MPI, which checks the set-up
 * order (whose rank draws the id, which ranks join with it, what each passes; a failed id
 * or join fails every rank, none left waiting: a rank that fails before it joins, one that
 * fails after, one later than FTK_NCCL_INIT_TIMEOUT), that the collectives go to the library,
 * and that a failed collective comes back from comm_wait and comm_test; with --nccl, NCCL on
 * the CUDA backend (the GPU of the node-local rank) — exit 77 "skipped (no GPU)" where there
 * is none or too few. Linked with the host emulation (Makefile: tests/emu/bin/test_comm),
 * --nccl runs engine/comm_nccl.c over the emulated NCCL on FTK_EMU_GPUS emulated GPUs.
 *
 *   test_comm [ROOT] [--nccl]       (mpirun -np 1..4 test_comm …: tests/cli/comm.sh)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../engine/comm.h"
#include "../../engine/comm_dev.h"
#include "../../engine/cuda_load.h"
#include "../../libcommon/log.h"
#include "test.h"

static int W, R; /* the world's size and this process's rank in it */

#define N 37 /* odd: no size is a multiple of anything convenient */

/* Small integers: exact in bf16, and so are their sums over 4 ranks. */
static float val(int r, int i) { return (float)((r * 7 + i * 3) % 61 - 30); }

static void put(void *h, dtype_t dt, int64_t i, float v)
{
    if (dt == DT_F32)
        ((float *)h)[i] = v;
    else
        ((uint16_t *)h)[i] = f32_to_bf16(v);
}
static float get(const void *h, dtype_t dt, int64_t i)
{
    return dt == DT_F32 ? ((const float *)h)[i] : bf16_to_f32(((const uint16_t *)h)[i]);
}

/* CHECK, naming the rank and the case; cond is evaluated once. */
#define RCHECK(cond)                                                                                         \
    do {                                                                                                     \
        int ok_ = (cond);                                                                                    \
        if (!ok_)                                                                                            \
            fprintf(stderr, "rank %d (%s, %s): ", R, what, dtype_name(dt));                                  \
        CHECK(ok_ && #cond);                                                                                 \
    } while (0)

/* The tensor collectives of c on be's memory. */
static void contract(comm_t *c, backend_t *be, const char *what)
{
    int p = comm_size(c), r = comm_rank(c);
    comm_stats_t st = {0};
    comm_set_stats(c, &st);
    dtype_t dts[2] = {DT_F32, DT_BF16}, dt = DT_F32;
    for (int k = 0; k < 2; k++) {
        dt = dts[k];
        size_t es = dtype_size(dt), fb = (size_t)p * N * es;
        char *h = malloc(fb), *h2 = malloc(fb);
        void *full = bk_alloc(be, fb, BK_MEM_OTHER, "full"), *part = bk_alloc(be, N * es, BK_MEM_OTHER, "part");
        void *full2 = bk_alloc(be, fb, BK_MEM_OTHER, "full2");
        CHECK(h && h2 && full && part && full2);
        if (!h || !h2 || !full || !part || !full2)
            return;
        comm_req_t q = {0}, q2 = {0};
        int bad;

        /* all-gather */
        for (int i = 0; i < N; i++)
            put(h, dt, i, val(r, i));
        be->upload(be, part, h, N * es);
        RCHECK(comm_allgather(c, part, full, N, dt, &q) == 0);
        RCHECK(comm_wait(c, &q) == 0 && !q.active);
        be->download(be, h, full, fb);
        bad = 0;
        for (int j = 0; j < p * N; j++)
            bad += get(h, dt, j) != val(j / N, j % N);
        RCHECK(bad == 0);
        RCHECK(st.ag_calls == 1 && st.ag_bytes == (double)(p - 1) / p * (N * p) * es);

        /* in place: the own part at its place, the rest garbage */
        for (int j = 0; j < p * N; j++)
            put(h, dt, j, j / N == r ? val(r, j % N) : 999.0f);
        be->upload(be, full, h, fb);
        RCHECK(comm_allgather(c, (char *)full + (size_t)r * N * es, full, N, dt, &q) == 0);
        RCHECK(comm_wait(c, &q) == 0);
        be->download(be, h, full, fb);
        bad = 0;
        for (int j = 0; j < p * N; j++)
            bad += get(h, dt, j) != val(j / N, j % N);
        RCHECK(bad == 0);

        /* reduce-scatter */
        for (int j = 0; j < p * N; j++)
            put(h, dt, j, val(r, j));
        be->upload(be, full, h, fb);
        RCHECK(comm_reduce_scatter(c, full, part, N, dt, &q) == 0);
        RCHECK(comm_wait(c, &q) == 0);
        be->download(be, h, part, N * es);
        bad = 0;
        for (int i = 0; i < N; i++) {
            float want = 0;
            for (int s = 0; s < p; s++)
                want += val(s, r * N + i);
            bad += get(h, dt, i) != want;
        }
        RCHECK(bad == 0);
        RCHECK(st.rs_calls == 1 && st.rs_bytes == (double)(p - 1) / p * (N * p) * es);

        /* all-reduce, and an all-gather in flight beside it: polled, then waited for */
        for (int i = 0; i < N; i++)
            put(h, dt, i, val(r, i));
        be->upload(be, part, h, N * es);
        be->upload(be, full2, h, N * es);
        RCHECK(comm_allgather(c, part, full, N, dt, &q) == 0);
        RCHECK(comm_allreduce(c, full2, N, dt, &q2) == 0);
        /* a few polls (spinning until done would starve oversubscribed ranks), then the wait */
        int done = 0, polls = 0;
        while (!done && polls++ < 100)
            RCHECK(comm_test(&q2, &done) == 0);
        RCHECK(done == !q2.active);
        RCHECK(comm_wait(c, &q2) == 0 && !q2.active);
        RCHECK(comm_test(&q2, &done) == 0 && done); /* an inactive request is done */
        RCHECK(comm_wait(c, &q) == 0);
        be->download(be, h, full2, N * es);
        be->download(be, h2, full, fb);
        bad = 0;
        for (int i = 0; i < N; i++) {
            float want = 0;
            for (int s = 0; s < p; s++)
                want += val(s, i);
            bad += get(h, dt, i) != want;
        }
        for (int j = 0; j < p * N; j++)
            bad += get(h2, dt, j) != val(j / N, j % N);
        RCHECK(bad == 0);
        RCHECK(st.ar_calls == 1 && st.ar_bytes == 2.0 * (p - 1) / p * N * es);
        /* the same figures per kind on the communicator's level (0), every span ended, the
         * overlapped part within the union of the spans, the kinds' waits within the total */
        const comm_coll_t *cl = st.coll[COMM_LEVEL_GROUP];
        RCHECK(cl[COMM_KIND_AG].calls == st.ag_calls && cl[COMM_KIND_AG].bytes == st.ag_bytes &&
               cl[COMM_KIND_RS].calls == st.rs_calls && cl[COMM_KIND_RS].bytes == st.rs_bytes &&
               cl[COMM_KIND_AR].calls == st.ar_calls && cl[COMM_KIND_AR].bytes == st.ar_bytes);
        RCHECK(st.coll[COMM_LEVEL_CROSS][COMM_KIND_AR].calls == 0);
        RCHECK(st.n_inflight == 0 && st.blocked == 0 && st.overlap_s >= 0 && st.overlap_s <= st.inflight_s);
        RCHECK(cl[COMM_KIND_AG].wait_s + cl[COMM_KIND_RS].wait_s + cl[COMM_KIND_AR].wait_s <= st.wait_s);

        /* bf16 sums round the fp32 sum to nearest even: 1 + ¾ ulp → 1 + ulp (truncation
         * would give 1); 1 + ½ ulp → 1 (ties to even). Two ranks: one addition, no order. */
        if (dt == DT_BF16 && p == 2) {
            put(h, dt, 0, r ? 0.75f / 128 : 1.0f);
            put(h, dt, 1, r ? 0.5f / 128 : 1.0f);
            be->upload(be, full2, h, 2 * es);
            RCHECK(comm_allreduce(c, full2, 2, dt, &q) == 0 && comm_wait(c, &q) == 0);
            be->download(be, h, full2, 2 * es);
            RCHECK(get(h, dt, 0) == 1.0f + 1.0f / 128 && get(h, dt, 1) == 1.0f);
        }
        memset(&st, 0, sizeof st);
        bk_free(be, full);
        bk_free(be, full2);
        bk_free(be, part);
        free(h);
        free(h2);
    }
    RCHECK(be->sync(be) == 0);
    RCHECK(comm_status(c) == 0);
    comm_set_stats(c, NULL);
}

/* ---- a fake device library (engine/comm_dev.h): host memory, MPI underneath ---------- */

static struct {
    int ids, joins, colls, waits, tests, polls;
    int fail_id;        /* provoked failures: rank 0's id */
    int fail_join_rank; /* one rank's join, before it joins (the others would wait for it) */
    int fail_ready_rank; /* one rank's join, after all have joined */
    int slow_rank, slow_ms; /* one rank joins late */
    int fail_done;      /* wait and test report a failed collective */
    int early_frees;    /* joins under way freed without abandon: a bug */
    int creator[8], size[8], rank[8]; /* the joins, in order */
    MPI_Comm owed; /* fail_join_rank's group, whose barrier it enters late (fk_pay) */
} fk;
static MPI_Op fk_bf16;

static void fk_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    for (int i = 0; i < *len; i++)
        ((uint16_t *)inout)[i] =
            f32_to_bf16(bf16_to_f32(((uint16_t *)in)[i]) + bf16_to_f32(((uint16_t *)inout)[i]));
}

static void *fk_ctx_new(backend_t *be, int world_rank)
{
    (void)be;
    int *x = malloc(sizeof *x);
    if (x)
        *x = world_rank;
    return x;
}
static void fk_ctx_free(void *x) { free(x); }
static int fk_status(void *x) { return (void)x, 0; }
static int fk_unique_id(void *x, unsigned char id[COMM_DEV_ID_MAX])
{
    if (fk.fail_id) {
        ftk_err_set("rank %d: fake: no id today", *(int *)x);
        return -1;
    }
    fk.ids++;
    memset(id, 0, COMM_DEV_ID_MAX);
    memcpy(id, "fake", 4);
    memcpy(id + 4, x, sizeof(int)); /* who drew it */
    return 0;
}
/* A fake device communicator: an MPI communicator, and the join as a non-blocking
 * barrier over it (done when every rank of the group has started joining, as NCCL's). */
typedef struct {
    MPI_Comm c;
    MPI_Request join;
    int joined;
} fk_comm_t;
#define FK(dc) (((fk_comm_t *)(dc))->c)

/* Splits MPI_COMM_WORLD by the id's creator (every rank of the world joins some group at
 * each set-up this test makes, the failing ones too), then enters the barrier. */
static void *fk_comm_new(void *x, const unsigned char id[COMM_DEV_ID_MAX], int size, int rank)
{
    int creator;
    memcpy(&creator, id + 4, sizeof creator);
    if (memcmp(id, "fake", 4)) {
        ftk_err_set("fake: not an id of mine");
        return NULL;
    }
    fk_comm_t *d = calloc(1, sizeof *d);
    MPI_Comm_split(MPI_COMM_WORLD, creator, rank, &d->c);
    if (fk.joins < 8) {
        fk.creator[fk.joins] = creator;
        fk.size[fk.joins] = size;
        fk.rank[fk.joins] = rank;
    }
    fk.joins++;
    int s, r;
    MPI_Comm_size(d->c, &s);
    MPI_Comm_rank(d->c, &r);
    if (s != size || r != rank || *(int *)x == fk.fail_join_rank) {
        ftk_err_set("rank %d: fake: joined as %d of %d, told %d of %d", *(int *)x, r, s, rank, size);
        fk.owed = d->c;
        free(d);
        return NULL;
    }
    if (*(int *)x == fk.slow_rank)
        nanosleep(&(struct timespec){fk.slow_ms / 1000, fk.slow_ms % 1000 * 1000000L}, NULL);
    MPI_Ibarrier(d->c, &d->join);
    return d;
}
/* The failed joiner enters its group's barrier after the set-up has failed everywhere, so
 * that the others' abandoned joins end (MPI cannot cancel a collective). */
static void fk_pay(void)
{
    if (fk.owed == MPI_COMM_NULL)
        return;
    MPI_Request q;
    MPI_Ibarrier(fk.owed, &q);
    MPI_Wait(&q, MPI_STATUS_IGNORE);
    MPI_Comm_free(&fk.owed);
}
static int fk_ready(void *dc)
{
    fk_comm_t *d = dc;
    if (!d->joined)
        MPI_Test(&d->join, &d->joined, MPI_STATUS_IGNORE);
    if (d->joined && R == fk.fail_ready_rank) {
        ftk_err_set("rank %d: fake: failed after joining", R);
        return -1;
    }
    return d->joined;
}
static void fk_comm_free(void *dc, int abandon)
{
    fk_comm_t *d = dc;
    fk.early_frees += !abandon && !d->joined;
    if (!d->joined) /* ends when the late rank enters (fk_pay) */
        MPI_Wait(&d->join, MPI_STATUS_IGNORE);
    MPI_Comm_free(&d->c);
    free(d);
}
static MPI_Datatype fk_type(dtype_t dt) { return dt == DT_F32 ? MPI_FLOAT : MPI_UINT16_T; }
static MPI_Op fk_sum(dtype_t dt) { return dt == DT_F32 ? MPI_SUM : fk_bf16; }
static int fk_allgather(void *c, const void *part, void *full, int64_t n, dtype_t dt, void **token)
{
    int r;
    MPI_Comm_rank(FK(c), &r);
    int in_place = (const char *)part == (char *)full + (size_t)r * n * dtype_size(dt);
    MPI_Allgather(in_place ? MPI_IN_PLACE : part, (int)n, fk_type(dt), full, (int)n, fk_type(dt), FK(c));
    fk.colls++;
    *token = &fk;
    return 0;
}
static int fk_reduce_scatter(void *c, const void *full, void *part, int64_t n, dtype_t dt, void **token)
{
    MPI_Reduce_scatter_block(full, part, (int)n, fk_type(dt), fk_sum(dt), FK(c));
    fk.colls++;
    *token = &fk;
    return 0;
}
static int fk_allreduce(void *c, void *buf, int64_t n, dtype_t dt, void **token)
{
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, fk_type(dt), fk_sum(dt), FK(c));
    fk.colls++;
    *token = &fk;
    return 0;
}
static int fk_wait(void *c, void *token)
{
    (void)c;
    fk.waits += token == &fk;
    if (fk.fail_done) {
        ftk_err_set("rank %d: fake: the collective failed", R);
        return -1;
    }
    return 0;
}
static int fk_test(void *c, void *token, int *done)
{
    (void)c;
    fk.tests += token == &fk;
    *done = 1;
    if (fk.fail_done) {
        ftk_err_set("rank %d: fake: the collective failed", R);
        return -1;
    }
    return 0;
}
static int fk_poll(void *x)
{
    (void)x;
    fk.polls++;
    return 0;
}
static const comm_dev_ops_t fake_ops = {
    .name = "fake", .ctx_new = fk_ctx_new, .ctx_free = fk_ctx_free, .status = fk_status,
    .unique_id = fk_unique_id, .comm_new = fk_comm_new, .ready = fk_ready, .comm_free = fk_comm_free,
    .allgather = fk_allgather, .reduce_scatter = fk_reduce_scatter, .allreduce = fk_allreduce,
    .wait = fk_wait, .test = fk_test, .poll = fk_poll,
};

/* ---- groups and agreement ------------------------------------------------------------- */

/* comm_node_gpu: the node-local rank's GPU, 0 with one GPU, a refusal naming the counts
 * past the node's GPUs; collective even where the ranks see different counts (a rank that
 * sees one GPU must still take part, or the others would wait in the split forever). */
static void node_gpus(comm_t *w)
{
    int local = -1, n_local = 0, R = comm_rank(w);
    const char *what = "comm_node_gpu";
    dtype_t dt = DT_F32; /* RCHECK names a dtype: none here */
    CHECK(comm_node_rank(w, &local, &n_local) == 0 && local >= 0 && local < n_local && n_local <= comm_size(w));
    RCHECK(comm_node_gpu(w, n_local) == local);
    RCHECK(comm_node_gpu(w, R % 2 ? 1 : n_local + 1) == (R % 2 ? 0 : local)); /* counts that differ */
    if (n_local > 2) { /* several GPUs, one too few (one GPU is taken for a launcher's binding) */
        int g = comm_node_gpu(w, n_local - 1);
        RCHECK(local < n_local - 1 ? g == local : g == -1 && strstr(ftk_err_msg(), "which has") != NULL);
    }
}

/* FTK_SIM_NODE_RANKS: blocks of consecutive ranks are nodes for comm_node_rank and
 * comm_node_id, not for the GPU (comm_node_gpu); a bad value is refused; the level a
 * communicator accounts on (comm_set_level). */
static void sim_nodes(comm_t *w, backend_t *be)
{
    const char *what = "simulated nodes";
    dtype_t dt = DT_F32;
    int local = -1, n_local = 0, real = -1, id = -1;
    RCHECK(comm_node_rank(w, &real, &n_local) == 0);
    setenv("FTK_SIM_NODE_RANKS", "2", 1);
    RCHECK(comm_node_rank(w, &local, &n_local) == 0 && local == R % 2 && n_local == (W - R / 2 * 2 < 2 ? 1 : 2));
    RCHECK(comm_node_id(w, &id) == 0 && id == R / 2 * 2);
    RCHECK(comm_node_gpu(w, 64) == real); /* the real node's (a node of fewer than 64 ranks) */
    setenv("FTK_SIM_NODE_RANKS", "0", 1);
    int n;
    RCHECK(comm_sim_node_ranks(&n) < 0 && strstr(ftk_err_msg(), "FTK_SIM_NODE_RANKS=0") != NULL);
    RCHECK(comm_node_rank(w, &local, &n_local) < 0);
    unsetenv("FTK_SIM_NODE_RANKS");
    RCHECK(comm_sim_node_ranks(&n) == 0 && n == 0);
    RCHECK(comm_node_id(w, &id) == 0 && id >= 0 && id <= R);
    /* a communicator's level */
    comm_stats_t st = {0};
    comm_req_t q = {0};
    float *buf = bk_alloc(be, 4 * sizeof *buf, BK_MEM_OTHER, "buf");
    CHECK(buf != NULL);
    if (!buf)
        return;
    be->zero(be, buf, 4 * sizeof *buf);
    comm_set_stats(w, &st);
    comm_set_level(w, COMM_LEVEL_CROSS);
    RCHECK(comm_allreduce(w, buf, 4, DT_F32, &q) == 0 && comm_wait(w, &q) == 0);
    RCHECK(st.coll[COMM_LEVEL_CROSS][COMM_KIND_AR].calls == 1 && st.coll[COMM_LEVEL_GROUP][COMM_KIND_AR].calls == 0);
    RCHECK(st.coll[COMM_LEVEL_CROSS][COMM_KIND_AR].bytes == st.ar_bytes && st.n_inflight == 0);
    comm_set_level(w, COMM_LEVEL_GROUP);
    comm_set_stats(w, NULL);
    bk_free(be, buf);
}

/* Hybrid's mapping for every block size that divides the world, then the contract inside
 * the groups of one block size (the largest proper one). fake: check the joins too. */
static void groups(comm_t *w, backend_t *be, int fake, const char *what)
{
    dtype_t dt = DT_F32;
    for (int b = 1; b <= W; b++) {
        if (W % b)
            continue;
        comm_t *g, *x;
        int j0 = fk.joins, i0 = fk.ids;
        RCHECK(comm_split_blocks(w, b, &g, &x) == 0);
        if (!g || !x)
            continue;
        RCHECK(comm_size(g) == b && comm_rank(g) == R % b);
        RCHECK(comm_size(x) == W / b && comm_rank(x) == R / b);
        /* who is in my group and in my replica set: a mask of world ranks */
        int64_t mg = (int64_t)1 << R, mx = mg, wg = 0, wx = 0;
        for (int s = 0; s < W; s++) {
            wg |= s / b == R / b ? (int64_t)1 << s : 0;
            wx |= s % b == R % b ? (int64_t)1 << s : 0;
        }
        comm_allreduce_i64(g, &mg, 1, COMM_SUM);
        comm_allreduce_i64(x, &mx, 1, COMM_SUM);
        RCHECK(mg == wg && mx == wx);
        if (fake) { /* the group's id from its first rank, then the replicas' from theirs */
            RCHECK(fk.joins == j0 + 2);
            RCHECK(fk.creator[j0 % 8] == R / b * b && fk.size[j0 % 8] == b && fk.rank[j0 % 8] == R % b);
            RCHECK(fk.creator[(j0 + 1) % 8] == R % b && fk.size[(j0 + 1) % 8] == W / b &&
                   fk.rank[(j0 + 1) % 8] == R / b);
            RCHECK(fk.ids == i0 + (R % b == 0) + (R / b == 0));
            fk.joins = j0 = 0;
        }
        if (b == (W > 2 ? W / 2 : W)) {
            contract(g, be, "group");
            contract(x, be, "replicas");
        }
        comm_free(g);
        comm_free(x);
    }
}

static void agreement(comm_t *w)
{
    char msg[64];
    int who = -1;
    snprintf(msg, sizeof msg, "rank %d says no", R);
    int code = comm_agree(w, R == W - 1 ? 3 : 0, msg, sizeof msg, &who);
    char want[64];
    snprintf(want, sizeof want, "rank %d says no", W - 1);
    CHECK(code == 3 && who == W - 1 && !strcmp(msg, want));
    snprintf(msg, sizeof msg, "rank %d says no", R);
    code = comm_agree(w, R == W - 1 ? 3 : R == W - 2 ? 5 : 0, msg, sizeof msg, &who);
    snprintf(want, sizeof want, "rank %d says no", W > 1 ? W - 2 : 0);
    CHECK(code == (W > 1 ? 5 : 3) && who == (W > 1 ? W - 2 : 0) && !strcmp(msg, want));
    CHECK(comm_agree(w, 0, msg, sizeof msg, &who) == 0);
    /* every rank fails, all but the last only after a peer (comm_status -2): the last one's
     * message; every rank after a peer: the lowest's */
    snprintf(msg, sizeof msg, "rank %d says no", R);
    code = comm_agree_first(w, 1, R != W - 1, msg, sizeof msg, &who);
    snprintf(want, sizeof want, "rank %d says no", W - 1);
    CHECK(code == 1 && who == W - 1 && !strcmp(msg, want));
    snprintf(msg, sizeof msg, "rank %d says no", R);
    code = comm_agree_first(w, 1, 1, msg, sizeof msg, &who);
    CHECK(code == 1 && who == 0 && !strcmp(msg, "rank 0 says no"));
}

/* The fake library: set-up order, dispatch, failures agreed on every rank. */
static void fake(comm_t *world, backend_t *be)
{
    const char *what = "fake";
    dtype_t dt = DT_F32;
    MPI_Op_create(fk_bf16_sum, 1, &fk_bf16);
    /* a failing id at rank 0 and a failing join at the last rank: -1 everywhere, no hang */
    comm_t *d = comm_split(world, 0, R);
    fk.fail_join_rank = fk.fail_ready_rank = fk.slow_rank = -1;
    fk.owed = MPI_COMM_NULL;
    fk.fail_id = 1;
    RCHECK(comm_enable_device(d, be, &fake_ops) < 0 && strstr(ftk_err_msg(), "no id today"));
    comm_free(d);
    fk.fail_id = 0;
    /* the last rank fails before it joins: the others, waiting for it, hear that it gave up
     * (well before the deadline) and every rank reports its message */
    setenv("FTK_NCCL_INIT_TIMEOUT", "60", 1);
    fk.fail_join_rank = W - 1;
    d = comm_split(world, 0, R);
    double t0 = MPI_Wtime();
    RCHECK(comm_enable_device(d, be, &fake_ops) < 0 && strstr(ftk_err_msg(), "fake: joined"));
    RCHECK(MPI_Wtime() - t0 < 20);
    char want[96];
    snprintf(want, sizeof want, "rank %d:", W - 1);
    RCHECK(strstr(ftk_err_msg(), want) == ftk_err_msg());
    fk_pay();
    comm_free(d);
    fk.fail_join_rank = -1;
    /* rank 0's join fails after every rank joined: the others' joined ones are abandoned */
    fk.fail_ready_rank = 0;
    d = comm_split(world, 0, R);
    RCHECK(comm_enable_device(d, be, &fake_ops) < 0 && strstr(ftk_err_msg(), "rank 0: fake: failed after joining"));
    fk.fail_ready_rank = -1;
    /* again on the same communicator, rank 0 late: the others wait for it, undisturbed by
     * the failed set-up's "gave up" messages (each was received before it returned) */
    fk.slow_rank = 0;
    fk.slow_ms = 300;
    RCHECK(comm_enable_device(d, be, &fake_ops) == 0);
    comm_free(d);
    fk.slow_rank = -1;
    /* the last rank is late: the others' deadline passes, and every rank (the late one too)
     * fails with the message of a rank that timed out (not of one that heard it gave up
     * first); one rank alone is never late */
    setenv("FTK_NCCL_INIT_TIMEOUT", "0.3", 1);
    fk.slow_rank = W - 1;
    fk.slow_ms = 1500;
    d = comm_split(world, 0, R);
    int rc = comm_enable_device(d, be, &fake_ops), from = -1;
    snprintf(want, sizeof want, ": fake: the group's %d ranks did not all join within 0.3 s (FTK_NCCL_INIT_TIMEOUT)", W);
    RCHECK(W == 1 ? rc == 0 : rc < 0 && sscanf(ftk_err_msg(), "rank %d:", &from) == 1 && from < W - 1 && strstr(ftk_err_msg(), want));
    comm_free(d);
    fk.slow_rank = -1;
    /* a deadline that is not one */
    setenv("FTK_NCCL_INIT_TIMEOUT", "soon", 1);
    d = comm_split(world, 0, R);
    RCHECK(comm_enable_device(d, be, &fake_ops) < 0 && strstr(ftk_err_msg(), "FTK_NCCL_INIT_TIMEOUT=soon: not a"));
    comm_free(d);
    unsetenv("FTK_NCCL_INIT_TIMEOUT");
    RCHECK(fk.early_frees == 0);
    memset(&fk, 0, sizeof fk);
    fk.fail_join_rank = fk.fail_ready_rank = fk.slow_rank = -1;
    fk.owed = MPI_COMM_NULL;

    d = comm_split(world, 0, R);
    RCHECK(comm_enable_device(d, be, &fake_ops) == 0);
    RCHECK(fk.ids == (R == 0) && fk.joins == 1 && fk.creator[0] == 0 && fk.size[0] == W && fk.rank[0] == R);
    RCHECK(comm_enable_device(d, be, &fake_ops) < 0); /* twice: refused */
    fk.joins = 0;
    contract(d, be, "fake world");
    /* 2 dtypes × (2 gathers, a reduce-scatter, a gather and an all-reduce) + the rounding */
    if (fk.colls != 2 * 5 + (W == 2) || fk.waits + fk.tests != fk.colls)
        fprintf(stderr, "rank %d: fake: %d collectives, %d waits, %d tests\n", R, fk.colls, fk.waits, fk.tests);
    RCHECK(fk.colls == 2 * 5 + (W == 2) && fk.waits + fk.tests == fk.colls && fk.tests == 2);
    groups(d, be, 1, "fake groups");
    agreement(d);
    /* a failed collective: wait and test return -1 with the library's message, and the
     * request is over (nothing to wait for twice) */
    float x[4] = {1, 2, 3, 4};
    comm_req_t q = {0};
    int done = 0;
    fk.fail_done = 1;
    RCHECK(comm_allreduce(d, x, 4, DT_F32, &q) == 0 && comm_wait(d, &q) < 0 && !q.active &&
           strstr(ftk_err_msg(), "fake: the collective failed"));
    RCHECK(comm_allreduce(d, x, 4, DT_F32, &q) == 0 && comm_test(&q, &done) < 0 && done && !q.active);
    fk.fail_done = 0;
    /* the backend's host waits poll the library while its world lives, and not after */
    RCHECK(be->wait_hook != NULL);
    int polls = fk.polls;
    be->wait_hook(be->wait_arg);
    RCHECK(fk.polls == polls + 1);
    comm_free(d);
    be->wait_hook(be->wait_arg);
    RCHECK(fk.polls == polls + 1);
    be->wait_hook = NULL;
    MPI_Op_free(&fk_bf16);
}

int main(int argc, char **argv)
{
    int nccl = 0;
    for (int i = 1; i < argc; i++)
        nccl |= !strcmp(argv[i], "--nccl");
    comm_t *world = comm_init(&argc, &argv);
    if (!world) {
        fprintf(stderr, "test_comm: %s\n", ftk_err_msg());
        return 1;
    }
    W = comm_size(world);
    R = comm_rank(world);
    int mpi = 0;
    MPI_Initialized(&mpi);
    CHECK(comm_alone(world) == !mpi); /* started alone: no MPI; under mpirun, even -np 1: not alone */
    comm_t *pw = comm_plan(1, 0);
    CHECK(pw && !comm_alone(pw)); /* a planning world stands for ranks under a launcher */
    comm_free(pw);
    backend_t *cpu = backend_cpu_new();
    CHECK(cpu != NULL);
    if (!cpu)
        return 1;

    if (R == 0) /* for the log: whether this build and machine could run NCCL */
        printf("NCCL: %s\n", comm_nccl_built() ? "built, libnccl.so.2 loads" : ftk_err_msg());
    contract(world, cpu, "world");
    groups(world, cpu, 0, "groups");
    agreement(world);
    node_gpus(world);
    sim_nodes(world, cpu);
    if (mpi)
        fake(world, cpu);

    int rc = 0;
    if (nccl) {
        /* every rank's GPU, or a skip agreed on by all of them */
        int n_dev = cuda_load_devices();
        int dev = comm_node_gpu(world, n_dev); /* ftk-train's choice of GPU, also its refusal (collective) */
        char dev_why[256];
        snprintf(dev_why, sizeof dev_why, "%s", dev < 0 ? ftk_err_msg() : "");
        char why[512] = "";
        if (!comm_nccl_built())
            snprintf(why, sizeof why, "skipped (%s)", ftk_err_msg());
        else if (n_dev == 0)
            snprintf(why, sizeof why, "skipped (no GPU)");
        else if (dev < 0)
            snprintf(why, sizeof why, "skipped (%s)", dev_why);
        else if (!mpi)
            snprintf(why, sizeof why, "skipped (NCCL needs mpirun: one process is a world of one)");
        int who, skip = comm_agree(world, why[0] ? 77 : 0, why, sizeof why, &who);
        backend_t *gpu = skip ? NULL : cuda_load_backend(dev);
        char msg[512] = "";
        if (!skip && !gpu)
            snprintf(msg, sizeof msg, "rank %d: %s", R, ftk_err_msg());
        if (skip) {
            if (R == 0)
                printf("%s\n", why);
            rc = 77;
        } else if (comm_agree(world, gpu ? 0 : 1, msg, sizeof msg, &who)) {
            fprintf(stderr, "test_comm: %s\n", msg);
            CHECK(0);
        } else {
            comm_t *d = comm_split(world, 0, R);
            int ok = d && comm_enable_nccl(d, gpu) == 0;
            if (!ok)
                fprintf(stderr, "test_comm: rank %d: NCCL: %s\n", R, ftk_err_msg());
            CHECK(ok);
            if (ok) {
                dtype_t dt = DT_F32;
                const char *what = "nccl";
                contract(d, gpu, "nccl world");
                groups(d, gpu, 0, "nccl groups");
                agreement(d);
                RCHECK(comm_status(d) == 0);
            }
            comm_free(d);
        }
        backend_free(gpu);
    }
    backend_free(cpu);
    comm_finalize(world);
    if (R == 0 || test_bad) {
        if (rc == 77 && !test_bad)
            return 77;
        printf("rank %d of %d: ", R, W);
        TEST_END();
    }
    return test_bad ? 1 : rc;
}
