/* snapshot.c — memory snapshots (snapshot.h). */
#include "snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/rundir.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/path.h"
#include "../libcommon/timer.h"

#define KEEP 2               /* complete snapshots a rank directory keeps */
#define PIECE (64LL << 20)   /* a partner copy moves in pieces of this many bytes */
#define FIELDS 4             /* what a rank reports per snapshot it holds: step, shard, step, shard */

/* The snapshot in flight: started at one step boundary, committed inside the next step
 * (snapshot_poll) or at the next snapshot. */
typedef struct {
    int active, rc;     /* rc: this rank's start failed (the commit drops it everywhere) */
    ckpt_meta_t meta;
    atomic_dir_t ad;    /* its directory being written (tmp_path NULL: this rank holds nothing) */
    comm_p2p_t *p2p;    /* the partner transfers */
    void *map;          /* the partner copy's file, mapped (header, then the bytes) */
    size_t map_len;
    int map_fd;
    void *drop;         /* where a partner's bytes go when they cannot be kept */
} pend_t;

struct snapshot {
    comm_t *world;
    shard_t *sh;
    const model_config_t *cfg;
    const ckpt_unit_t *units;
    int n_units;
    bgsave_t *bg;        /* this rank's host snapshot and its writer thread (writers) */
    int64_t copy_bytes;  /* a shard's snapshot bytes (bgsave_bytes: the same for every shard) */
    pend_t pend;
    int rank, nranks;
    int64_t S, idx;
    int writer;          /* this rank writes its shard into its node's memory */
    int send_to, recv_from; /* partner copies: -1 none */
    int node_lowest;     /* the lowest rank of its node */
    int64_t all_copies;  /* files every rank writes and sends a snapshot, together */
    int64_t *sums_v;     /* the commit's exchange: 5 a rank */
    ckpt_shard_sum_t *sums; /* a shard's sums, for the manifest */
    int64_t *idx_of;     /* every rank's shard */
    int *node_of;        /* every rank's node */
    char run_root[4200], rank_dir[4300];
};

static int mkdir_private(const char *path)
{
    if (mkdir(path, 0700) == 0 || errno == EEXIST) {
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == getuid())
            return 0;
        ftk_err_set("%s: not a directory of this user", path);
        return -1;
    }
    ftk_err_set("%s: %s", path, strerror(errno));
    return -1;
}

/* The steps of the complete snapshots in dir, newest first (at most max); how many. */
static int list_steps(const char *dir, int64_t *steps, int max)
{
    size_t n;
    char **v = ckpt_list_steps(dir, &n);
    int k = 0;
    for (size_t i = n; i-- > 0;) {
        if (k < max)
            steps[k++] = ckpt_step_name(v[i]);
        free(v[i]);
    }
    free(v);
    return k;
}

/* Removes every entry of dir named for a step (complete or being written) but keep. */
static void remove_steps(const char *dir, const int64_t *keep, int n_keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        int tmp = nm[0] == '.' && !strncmp(nm + 1, "step-", 5);
        int64_t k = tmp ? -2 : ckpt_step_name(nm);
        if (k == -1)
            continue;
        int kept = 0;
        for (int i = 0; i < n_keep; i++)
            kept |= keep[i] == k;
        char p[4600];
        snprintf(p, sizeof p, "%.4300s/%.255s", dir, nm);
        if (!kept)
            rm_tree(p);
    }
    closedir(d);
}

static void stale_sweep(const char *user_root, const char *own_id);
static void pend_end(snapshot_t *s, int rc);

/* Who writes and who sends where (snapshot.h "Who holds what") for rank `rank` of n, from
 * every rank's shard and node (all: 2 a rank); rpn: ranks per node where the nodes are equal
 * blocks, else 0. *send_to, *recv_from: -1 for none. */
static int roles(int rank, int n, const int64_t *all, int rpn, int *send_to, int *recv_from)
{
    int writer = 1; /* the lowest rank of its node holding its shard */
    for (int q = 0; q < rank; q++)
        if (all[2 * q] == all[2 * rank] && all[2 * q + 1] == all[2 * rank + 1])
            writer = 0;
    *send_to = *recv_from = -1;
    for (int dir = 0; rpn > 0 && rpn < n && dir < 2; dir++) {
        int q = dir == 0 ? rank : (rank - rpn + n) % n; /* the sender: me, or the one I keep a copy for */
        int w = 1, elsewhere = 0;
        for (int r = 0; r < n; r++) {
            int same = all[2 * r] == all[2 * q];
            w &= !(r < q && same && all[2 * r + 1] == all[2 * q + 1]);
            elsewhere |= same && all[2 * r + 1] != all[2 * q + 1];
        }
        if (w && !elsewhere && dir == 0)
            *send_to = (rank + rpn) % n;
        else if (w && !elsewhere)
            *recv_from = q;
    }
    return writer;
}

snapshot_t *snapshot_new(comm_t *world, backend_t *be, shard_t *sh, const model_config_t *cfg,
                         const snapshot_where_t *where)
{
    snapshot_t *s = calloc(1, sizeof *s);
    int n = comm_size(world), rank = comm_rank(world), rpn = 0, sim = 0, node = 0;
    int64_t *all = calloc((size_t)n * 2, sizeof *all);
    int blocks = comm_node_blocks(world, &rpn); /* collective: made before any failure */
    int lowest;
    comm_node_id(world, &lowest);
    if (all) {
        all[2 * rank] = shard_index(sh);
        all[2 * rank + 1] = blocks == 0 ? rank / rpn : lowest;
    }
    int64_t ok = all && s ? 1 : 0;
    comm_allreduce_i64(world, &ok, 1, COMM_MIN);
    if (ok)
        comm_allreduce_i64(world, all, 2 * n, COMM_SUM);
    if (!ok) {
        free(all);
        free(s);
        ftk_err_set("out of memory");
        return NULL;
    }
    s->world = world, s->sh = sh, s->cfg = cfg, s->rank = rank, s->nranks = n;
    s->S = shard_count(sh), s->idx = shard_index(sh);
    s->units = shard_units(sh, &s->n_units);
    s->pend.map_fd = -1;
    node = (int)all[2 * rank + 1];
    s->node_lowest = lowest == rank;
    s->writer = roles(rank, n, all, blocks == 0 ? rpn : 0, &s->send_to, &s->recv_from);
    /* what every rank writes and sends a snapshot (the same bytes for every shard) */
    for (int q = 0; q < n; q++) {
        int to, from, w = roles(q, n, all, blocks == 0 ? rpn : 0, &to, &from);
        s->all_copies += w + (to >= 0);
    }
    s->sums_v = calloc((size_t)n * 5, sizeof *s->sums_v);
    s->sums = calloc((size_t)s->S, sizeof *s->sums);
    s->idx_of = malloc((size_t)n * sizeof *s->idx_of);
    s->node_of = malloc((size_t)n * sizeof *s->node_of);
    for (int q = 0; q < n && s->idx_of && s->node_of; q++)
        s->idx_of[q] = all[2 * q], s->node_of[q] = (int)all[2 * q + 1];
    free(all);
    int rc = s->idx_of && s->node_of && s->sums_v && s->sums ? 0 : (ftk_err_set("out of memory"), -1);
    char node_dir[4096];
    if (comm_sim_node_ranks(&sim) == 0 && sim > 0)
        snprintf(node_dir, sizeof node_dir, "%.*s/node-%d", path_dir_len(where->mem_dir), where->mem_dir, node);
    else
        snprintf(node_dir, sizeof node_dir, "%.*s", path_dir_len(where->mem_dir), where->mem_dir);
    char user_root[4120];
    snprintf(user_root, sizeof user_root, "%s/ftk-%u", node_dir, (unsigned)getuid());
    snprintf(s->run_root, sizeof s->run_root, "%s/%.16s", user_root, where->run_id);
    snprintf(s->rank_dir, sizeof s->rank_dir, "%s/rank-%05d", s->run_root, rank);
    dtype_t dt = shard_dtypes(sh).state;
    int residual = shard_compress_grads(sh) != 0;
    s->copy_bytes = bgsave_bytes(s->units, s->n_units, s->S, dt, residual);
    if (rc == 0 && (s->writer || s->recv_from >= 0) &&
        !(s->bg = bgsave_new(be, s->units, s->n_units, s->S, dt, residual)))
        rc = -1;
    if (s->bg)
        bgsave_hash_raw(s->bg, 1);
    if (rc == 0 && mkdir(where->mem_dir, 0700) < 0 && errno != EEXIST) {
        ftk_err_set("--memory-dir %s: %s", where->mem_dir, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && sim > 0 && mkdir(node_dir, 0700) < 0 && errno != EEXIST) {
        ftk_err_set("--memory-dir %s: %s", node_dir, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && (mkdir_private(user_root) < 0 || mkdir_private(s->run_root) < 0))
        rc = -1;
    if (rc == 0 && s->node_lowest) {
        char *abs = realpath(where->run_dir, NULL), p[4300];
        snprintf(p, sizeof p, "%s/run", s->run_root);
        buf_t b = {0};
        if (!abs || buf_printf(&b, "%s\n", abs) < 0 || atomic_write_file(p, b.data, b.len) < 0) {
            if (!abs)
                ftk_err_set("%s: %s", where->run_dir, strerror(errno));
            rc = -1;
        }
        buf_free(&b);
        free(abs);
        if (rc == 0)
            stale_sweep(user_root, where->run_id);
    }
    if (rc < 0) {
        ftk_err_prefix("memory snapshots: ");
        snapshot_free(s);
        return NULL;
    }
    return s;
}

void snapshot_free(snapshot_t *s)
{
    if (!s)
        return;
    if (s->pend.active)
        pend_end(s, -1);
    bgsave_free(s->bg);
    free(s->sums_v);
    free(s->sums);
    free(s->idx_of);
    free(s->node_of);
    free(s);
}

/* ---- taking one ------------------------------------------------------------------------ */

#define COPY_HEADER 4096 /* a partner copy's header; its bytes follow, page-aligned for mmap */

/* "shard-00002-of-00004.raw": the partner copy of shard index 1 of 4. */
static void copy_name(char out[32], int64_t index, int64_t count)
{
    ckpt_shard_name(out, index, count);
    memcpy(out + strlen(out) - 3, ".raw", 5);
}

static void copy_header(char *h, int64_t step, int64_t index, int64_t count, int64_t bytes, uint64_t xxh3)
{
    memset(h, 0, COPY_HEADER);
    snprintf(h, COPY_HEADER, "ftk memory snapshot copy 1\nstep %lld\nshard %lld\nof %lld\nbytes %lld\nxxh3 %016llx\n",
             (long long)step, (long long)index, (long long)count, (long long)bytes, (unsigned long long)xxh3);
}

/* The partner's bytes land in a file of the node's memory, mapped: no copy after MPI's. */
static int map_copy(pend_t *p, const char *path, int64_t bytes)
{
    p->map_len = COPY_HEADER + (size_t)bytes;
    p->map_fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (p->map_fd < 0 || ftruncate(p->map_fd, (off_t)p->map_len) < 0 ||
        (p->map = mmap(NULL, p->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, p->map_fd, 0)) == MAP_FAILED) {
        ftk_err_set("%s: %s", path, strerror(errno));
        p->map = NULL;
        return -1;
    }
    return 0;
}

static void unmap_copy(pend_t *p)
{
    free(p->drop);
    p->drop = NULL;
    if (p->map)
        munmap(p->map, p->map_len);
    if (p->map_fd >= 0)
        close(p->map_fd);
    p->map = NULL;
    p->map_fd = -1;
}

/* Ends the snapshot in flight whatever became of it: transfers completed, the writer joined;
 * rc < 0 removes it. */
static void pend_end(snapshot_t *s, int rc)
{
    pend_t *p = &s->pend;
    comm_p2p_wait(p->p2p);
    p->p2p = NULL;
    if (bgsave_running(s->bg)) {
        ckpt_shard_sum_t sum;
        double w;
        bgsave_wait(s->bg, &sum, &w);
    }
    unmap_copy(p);
    if (rc < 0 && p->ad.tmp_path)
        atomic_dir_abort(&p->ad);
    p->active = 0;
}

/* Commits the snapshot in flight (every rank, when one is: they all started it): waits for
 * its transfers and its writer, exchanges every rank's sums, writes the manifest and renames
 * the directory into place; older ones beyond KEEP are removed. */
static int pend_commit(snapshot_t *s, double *wait_s)
{
    pend_t *p = &s->pend;
    int n = s->nranks, rc = p->rc;
    double t0 = time_now();
    comm_p2p_wait(p->p2p);
    p->p2p = NULL;
    ckpt_shard_sum_t sum = {0, 0};
    uint64_t raw = 0;
    if (bgsave_running(s->bg)) {
        double w;
        if (bgsave_wait(s->bg, &sum, &w) < 0)
            rc = -1;
        raw = bgsave_raw_hash(s->bg);
    }
    *wait_s = time_now() - t0;
    /* every rank's: its file's bytes and checksum, its snapshot's raw checksum, a failure, its shard */
    int64_t *v = s->sums_v, fail_all = 0, *m = v + 5 * s->rank;
    ckpt_shard_sum_t *sums = s->sums;
    memset(v, 0, (size_t)n * 5 * sizeof *v);
    memset(sums, 0, (size_t)s->S * sizeof *sums);
    m[0] = (int64_t)sum.bytes, m[1] = (int64_t)sum.xxh3, m[2] = (int64_t)raw, m[3] = rc < 0;
    m[4] = s->writer ? s->idx + 1 : 0;
    comm_allreduce_i64(s->world, v, 5 * n, COMM_SUM);
    for (int q = n - 1; q >= 0; q--) { /* a shard's sums: its lowest writer's */
        fail_all |= v[5 * q + 3];
        if (v[5 * q + 4])
            sums[v[5 * q + 4] - 1] = (ckpt_shard_sum_t){(uint64_t)v[5 * q], (uint64_t)v[5 * q + 1]};
    }
    if (p->map && !fail_all) /* the sender's raw checksum, known only now */
        copy_header(p->map, p->meta.step, s->idx_of[s->recv_from], s->S, (int64_t)(p->map_len - COPY_HEADER),
                    (uint64_t)v[5 * s->recv_from + 2]);
    unmap_copy(p);
    if (rc == 0 && !fail_all && p->ad.tmp_path) {
        if (s->writer)
            sums[s->idx] = sum;
        if (fault_point("snapshot.done") < 0 ||
            ckpt_write_control(p->ad.tmp_path, &p->meta, s->cfg, s->units, s->n_units, sums) < 0 ||
            atomic_dir_commit(&p->ad, 1) < 0)
            rc = -1;
        else {
            int64_t keep[KEEP];
            int k = list_steps(s->rank_dir, keep, KEEP);
            remove_steps(s->rank_dir, keep, k);
        }
    }
    if ((rc < 0 || fail_all) && p->ad.tmp_path)
        atomic_dir_abort(&p->ad);
    p->active = 0;
    return rc;
}

int snapshot_poll(snapshot_t *s, snapshot_cost_t *cost)
{
    memset(cost, 0, sizeof *cost);
    if (!s->pend.active)
        return 0;
    double t0 = time_now();
    int rc = pend_commit(s, &cost->wait_s);
    cost->seconds = time_now() - t0;
    return rc;
}

/* Starts the snapshot of meta's step: this rank's state copied into its host snapshot (what
 * the loop waits for), its shard file written by a thread, its bytes sent to the partner
 * and the partner's received, both left to run. */
static int pend_start(snapshot_t *s, const ckpt_meta_t *meta, hid_t tok_src, snapshot_cost_t *cost)
{
    pend_t *p = &s->pend;
    memset(&p->ad, 0, sizeof p->ad);
    p->meta = *meta;
    p->rc = 0;
    p->active = 1;
    char final[4400];
    snprintf(final, sizeof final, "%s/step-%08lld", s->rank_dir, (long long)meta->step);
    int holds = s->writer || s->recv_from >= 0, rc = 0;
    if (holds && (mkdir_private(s->rank_dir) < 0 || atomic_dir_begin(&p->ad, final) < 0))
        rc = -1;
    int64_t bytes = 0;
    void *buf = s->bg ? bgsave_buffer(s->bg, &bytes) : NULL;
    if (rc == 0 && s->writer &&
        (fault_point("snapshot.copy") < 0 || bgsave_snapshot(s->bg, s->sh) < 0 ||
         bgsave_start(s->bg, p->ad.tmp_path, meta, s->idx, s->idx == 0 ? tok_src : -1) < 0))
        rc = -1;
    /* a failed sender sends all the same (what its snapshot holds): the commit's exchange of
     * failures drops the snapshot everywhere, and no message is left unmatched */
    char copy[4500] = "", name[32];
    if (s->recv_from >= 0 && p->ad.tmp_path) {
        copy_name(name, s->idx_of[s->recv_from], s->S);
        snprintf(copy, sizeof copy, "%s/%s", p->ad.tmp_path, name);
        if (map_copy(p, copy, s->copy_bytes) < 0)
            rc = -1;
    }
    if (s->send_to >= 0 && fault_point("snapshot.send") < 0)
        rc = -1;
    void *drop = NULL;
    if (s->recv_from >= 0 && !p->map && !(drop = malloc((size_t)s->copy_bytes)))
        rc = -1;
    p->drop = drop;
    p->p2p = comm_p2p_start(s->world, buf, s->send_to >= 0 ? bytes : 0, s->send_to,
                            p->map ? (char *)p->map + COPY_HEADER : drop, s->recv_from >= 0 ? s->copy_bytes : 0,
                            s->recv_from);
    if (!p->p2p)
        rc = -1;
    cost->bytes_all = s->all_copies * s->copy_bytes;
    p->rc = rc;
    return rc;
}

int snapshot_take(snapshot_t *s, const ckpt_meta_t *meta, hid_t tok_src, snapshot_cost_t *cost)
{
    double t0 = time_now();
    memset(cost, 0, sizeof *cost);
    int rc = 0;
    if (s->pend.active)
        rc = pend_commit(s, &cost->wait_s);
    if (pend_start(s, meta, tok_src, cost) < 0)
        rc = -1;
    cost->seconds = time_now() - t0;
    return rc;
}

/* ---- reading one back -------------------------------------------------------------------- */

/* A partner copy's header, checked against the snapshot it is in: 0 with its checksum. */
static int read_copy_header(const char *path, int64_t step, int64_t index, int64_t count, int64_t bytes,
                            uint64_t *xxh3)
{
    char h[COPY_HEADER + 1];
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    ssize_t got = fd < 0 ? -1 : read(fd, h, COPY_HEADER);
    int ok = fd >= 0 && fstat(fd, &sb) == 0 && got == COPY_HEADER && (int64_t)sb.st_size == COPY_HEADER + bytes;
    if (fd >= 0)
        close(fd);
    h[COPY_HEADER] = 0;
    long long st, ix, of, by;
    unsigned long long x;
    ok = ok && sscanf(h, "ftk memory snapshot copy 1\nstep %lld\nshard %lld\nof %lld\nbytes %lld\nxxh3 %16llx\n", &st,
                      &ix, &of, &by, &x) == 5;
    if (!ok || st != step || ix != index || of != count || by != bytes) {
        ftk_err_set("%s: not the partner copy of shard %lld of step %lld (header or size)", path, (long long)index + 1,
                    (long long)step);
        return -1;
    }
    *xxh3 = x;
    return 0;
}

/* What this rank's directory holds: up to FIELDS (step, shard) pairs, each + 1 (0: none; the
 * shard negative for a partner copy not yet a shard file), from its KEEP newest complete
 * snapshots of this world and shard count. */
static int held(const snapshot_t *s, int64_t *out)
{
    int64_t steps[KEEP];
    int k = list_steps(s->rank_dir, steps, KEEP), m = 0, damaged = 0;
    for (int i = 0; i < k && m < FIELDS; i++) {
        char dir[4400];
        snprintf(dir, sizeof dir, "%s/step-%08lld", s->rank_dir, (long long)steps[i]);
        ckpt_manifest_t man;
        if (ckpt_open_some(dir, &man) < 0) { /* damaged: the restart does without it */
            damaged++;
            continue;
        }
        if (man.meta.step == steps[i] && man.meta.world_size == s->nranks && man.meta.shard_count == s->S)
            for (int64_t j = 0; j < s->S && m < FIELDS; j++) {
                char name[32], p[4500];
                struct stat sb;
                uint64_t x;
                ckpt_shard_name(name, j, s->S);
                snprintf(p, sizeof p, "%s/%s", dir, name);
                int kind = stat(p, &sb) == 0 ? 1 : 0;
                copy_name(name, j, s->S);
                snprintf(p, sizeof p, "%s/%s", dir, name);
                if (!kind && lstat(p, &sb) == 0) {
                    if (read_copy_header(p, steps[i], j, s->S, s->copy_bytes, &x) == 0)
                        kind = -1;
                    else
                        damaged++;
                }
                if (kind) {
                    out[2 * m] = steps[i] + 1;
                    out[2 * m + 1] = kind * (j + 1);
                    m++;
                }
            }
        ckpt_manifest_free(&man);
    }
    return damaged;
}

/* A partner copy made the shard file it stands for, beside it in dir: its bytes checked
 * against its header, written as the sender wrote it (same arrays, same writer: the same
 * bytes), and that file checked against the manifest's checksum. */
static int convert_copy(snapshot_t *s, const char *dir, int64_t j, hid_t tok_src)
{
    char name[32], p[4500];
    copy_name(name, j, s->S);
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ckpt_manifest_t man;
    if (ckpt_open_some(dir, &man) < 0)
        return -1;
    uint64_t want;
    int64_t bytes;
    int rc = read_copy_header(p, man.meta.step, j, s->S, s->copy_bytes, &want);
    void *buf = rc == 0 ? bgsave_buffer(s->bg, &bytes) : NULL;
    FILE *f = buf ? fopen(p, "rb") : NULL;
    if (rc == 0 && (!f || fseek(f, COPY_HEADER, SEEK_SET) < 0 || fread(buf, 1, (size_t)bytes, f) != (size_t)bytes)) {
        ftk_err_set("%s: %s", p, f ? "short read" : strerror(errno));
        rc = -1;
    }
    if (f)
        fclose(f);
    if (rc == 0 && hash_bytes(buf, (size_t)bytes) != want) {
        ftk_err_set("%s: checksum differs from its header's", p);
        rc = -1;
    }
    ckpt_shard_sum_t sum;
    double w;
    if (rc == 0 && (bgsave_start(s->bg, dir, &man.meta, j, j == 0 ? tok_src : -1) < 0 || bgsave_wait(s->bg, &sum, &w) < 0))
        rc = -1;
    if (rc == 0 && (sum.bytes != man.shards[j].bytes || sum.xxh3 != man.shards[j].xxh3)) {
        ftk_err_set("%s: the shard file made from it differs from the manifest's checksum", p);
        rc = -1;
    }
    ckpt_manifest_free(&man);
    return rc;
}

/* The lowest rank holding shard j of step k (on node `node`, or anywhere: -1), or -1; *raw:
 * it holds a partner copy, not the shard file (a rank with both is taken for the file). */
static int holder(const snapshot_t *s, const int64_t *all, int64_t k, int64_t j, int node, int *raw)
{
    int found = -1;
    for (int pass = 0; pass < 2 && found < 0; pass++)
        for (int q = 0; q < s->nranks && found < 0; q++)
            for (int f = 0; f < FIELDS; f++)
                if (all[2 * FIELDS * q + 2 * f] == k + 1 && all[2 * FIELDS * q + 2 * f + 1] == (pass ? -1 : 1) * (j + 1) &&
                    (node < 0 || s->node_of[q] == node)) {
                    found = q;
                    *raw = pass;
                    break;
                }
    return found;
}

/* Sends the file at path (sbytes; 0: none) to rank dest, fault point "snapshot.fetch" before
 * each piece, and receives rbytes from rank src into out (NULL: received and dropped), in
 * pieces; both sides make every call whatever fails, so that no partner waits and no message
 * is left unmatched. */
static int exchange(comm_t *c, int dest, const char *path, int64_t sbytes, int src, const char *out, int64_t rbytes)
{
    int rc = 0;
    FILE *in = sbytes > 0 ? fopen(path, "rb") : NULL, *o = rbytes > 0 && out ? fopen(out, "wb") : NULL;
    if ((sbytes > 0 && !in) || (rbytes > 0 && out && !o)) {
        ftk_err_set("%s: %s", !in && sbytes > 0 ? path : out, strerror(errno));
        rc = -1;
    }
    char *sb = sbytes > 0 ? malloc(PIECE) : NULL, *rb = rbytes > 0 ? malloc(PIECE) : NULL;
    if ((sbytes > 0 && !sb) || (rbytes > 0 && !rb)) {
        ftk_err_set("out of memory");
        rc = -1;
    }
    for (int64_t off = 0; off < sbytes || off < rbytes; off += PIECE) {
        int64_t ns = off < sbytes ? (sbytes - off < PIECE ? sbytes - off : PIECE) : 0;
        int64_t nr = off < rbytes ? (rbytes - off < PIECE ? rbytes - off : PIECE) : 0;
        if (ns && rc == 0 && (fault_point("snapshot.fetch") < 0 || fread(sb, 1, (size_t)ns, in) != (size_t)ns)) {
            ftk_err_set("%s: short read", path);
            rc = -1;
        }
        comm_sendrecv(c, sb, ns, ns ? dest : -1, rb, nr, nr ? src : -1);
        if (nr && o && rc == 0 && fwrite(rb, 1, (size_t)nr, o) != (size_t)nr) {
            ftk_err_set("%s: %s", out, strerror(errno));
            rc = -1;
        }
    }
    if (o && fclose(o) != 0 && rc == 0) {
        ftk_err_set("%s: %s", out, strerror(errno));
        rc = -1;
    }
    if (in)
        fclose(in);
    free(sb);
    free(rb);
    return rc;
}

/* Rank q, whose node holds no copy of its shard, receives the snapshot's three files from
 * rank h into its own directory (every rank calls it; only the two act). */
static int fetch(snapshot_t *s, int q, int h, int64_t k, int64_t *bytes)
{
    static const char *const files[3] = {"manifest.json", "config.json", NULL};
    char src[4400], name[32];
    snprintf(src, sizeof src, "%.4000s/rank-%05d/step-%08lld", s->run_root, h, (long long)k);
    ckpt_shard_name(name, s->idx_of[q], s->S);
    atomic_dir_t ad;
    memset(&ad, 0, sizeof ad);
    int rc = 0;
    if (s->rank == q) {
        char final[4400];
        snprintf(final, sizeof final, "%s/step-%08lld", s->rank_dir, (long long)k);
        if (mkdir_private(s->rank_dir) < 0 || atomic_dir_begin(&ad, final) < 0)
            rc = -1;
    }
    for (int f = 0; f < 3; f++) {
        const char *nm = files[f] ? files[f] : name;
        char p[4500], out[4500] = "";
        snprintf(p, sizeof p, "%s/%s", src, nm);
        int64_t size = 0;
        if (s->rank == h) {
            struct stat sb;
            size = stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
        }
        comm_sendrecv(s->world, &size, sizeof size, s->rank == h ? q : -1, &size, sizeof size, s->rank == q ? h : -1);
        if (size < 0) {
            if (s->rank == q && rc == 0)
                ftk_err_set("rank %d cannot read its copy of %s", h, nm);
            rc = s->rank == q ? -1 : rc;
            continue;
        }
        if (s->rank == q && rc == 0)
            snprintf(out, sizeof out, "%s/%s", ad.tmp_path, nm);
        if (exchange(s->world, s->rank == h ? q : -1, p, s->rank == h ? size : 0,
                     s->rank == q ? h : -1, out[0] ? out : NULL, s->rank == q ? size : 0) < 0)
            rc = -1;
        if (s->rank == q)
            *bytes += size;
    }
    if (s->rank == q) {
        if (rc == 0 && atomic_dir_commit(&ad, 1) < 0)
            rc = -1;
        else if (rc < 0 && ad.tmp_path)
            atomic_dir_abort(&ad);
    }
    return rc;
}

int snapshot_find(snapshot_t *s, int64_t min_step, hid_t tok_src, int64_t *step, int64_t *seen, int64_t *damaged,
                  char dir[4096], int64_t *bytes)
{
    int n = s->nranks, rc = 0;
    *step = *seen = -1;
    *bytes = *damaged = 0;
    dir[0] = 0;
    int64_t *all = calloc((size_t)n * 2 * FIELDS, sizeof *all), ok = all != NULL;
    comm_allreduce_i64(s->world, &ok, 1, COMM_MIN);
    if (!ok) {
        free(all);
        ftk_err_set("out of memory");
        return -1;
    }
    int64_t bad = held(s, all + 2 * FIELDS * s->rank);
    comm_allreduce_i64(s->world, all, 2 * FIELDS * n, COMM_SUM);
    comm_allreduce_i64(s->world, &bad, 1, COMM_SUM);
    *damaged = bad;
    /* the newest step whose every shard is held somewhere */
    int64_t best = -1;
    int raw;
    for (int i = 0; i < 2 * FIELDS * n; i += 2) {
        int64_t k = all[i] - 1, whole = k > best;
        *seen = k > *seen ? k : *seen;
        for (int64_t j = 0; whole && j < s->S; j++)
            whole = holder(s, all, k, j, -1, &raw) >= 0;
        if (whole)
            best = k;
    }
    if (best < 0 || best < min_step) {
        free(all);
        return 0;
    }
    /* every rank reads its shard from its node, made from a partner copy where that is what
     * the node holds, or else receives it, in rank order */
    for (int q = 0; q < n; q++) {
        int64_t j = s->idx_of[q];
        int here = holder(s, all, best, j, s->node_of[q], &raw), h = here >= 0 ? here : holder(s, all, best, j, -1, &raw);
        char hdir[4400];
        snprintf(hdir, sizeof hdir, "%.4000s/rank-%05d/step-%08lld", s->run_root, h, (long long)best);
        if (raw) {
            if (s->rank == h && (!s->bg ? (ftk_err_set("internal: no snapshot buffer"), -1) : convert_copy(s, hdir, j, tok_src)) < 0)
                rc = -1;
            for (int f = 0; f < FIELDS; f++) /* a file now, on every rank's books */
                if (all[2 * FIELDS * h + 2 * f] == best + 1 && all[2 * FIELDS * h + 2 * f + 1] == -(j + 1))
                    all[2 * FIELDS * h + 2 * f + 1] = j + 1;
        }
        if (here >= 0) {
            if (q == s->rank)
                snprintf(dir, 4096, "%.4000s", hdir);
            continue;
        }
        if (fetch(s, q, h, best, bytes) < 0)
            rc = -1;
        if (q == s->rank)
            snprintf(dir, 4096, "%.4000s/step-%08lld", s->rank_dir, (long long)best);
    }
    free(all);
    *step = best;
    return rc;
}

int snapshot_settle(snapshot_t *s, int64_t step)
{
    comm_barrier(s->world); /* every rank has read what it needed from its node */
    remove_steps(s->rank_dir, &step, step >= 0);
    return 0;
}

int snapshot_drop(snapshot_t *s)
{
    if (s->pend.active)
        pend_end(s, -1);
    comm_barrier(s->world);
    if (s->node_lowest && rm_tree(s->run_root) < 0)
        return -1;
    return 0;
}

/* ---- stale snapshots ------------------------------------------------------------------- */

/* The newest step of a run folder's snapshots (any rank's), or -1. */
static int64_t newest_snapshot(const char *run_root)
{
    DIR *d = opendir(run_root);
    int64_t best = -1;
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "rank-", 5))
            continue;
        char p[4600];
        int64_t k[1];
        snprintf(p, sizeof p, "%.4300s/%.255s", run_root, e->d_name);
        if (list_steps(p, k, 1) && k[0] > best)
            best = k[0];
    }
    closedir(d);
    return best;
}

/* Whether the run folder run_root (named id) is a gone run's (snapshot.h "Stale snapshots"). */
static int is_stale(const char *run_root, const char *id)
{
    char p[4600];
    buf_t b = {0};
    snprintf(p, sizeof p, "%s/run", run_root);
    if (buf_read_small(&b, p, 8192, BUF_NOFOLLOW) < 0 || b.len < 2 || ((char *)b.data)[b.len - 1] != '\n') {
        buf_free(&b);
        return 0; /* being made, or not ours to judge */
    }
    char run[8192], rid[17];
    snprintf(run, sizeof run, "%.*s", (int)b.len - 1, (const char *)b.data);
    buf_free(&b);
    if (rundir_run_id(run, rid, 0) != 0 || strcmp(rid, id))
        return 1; /* the run directory is gone, or holds another run */
    if (rundir_lock_held(run) != 0)
        return 0; /* live (or cannot be told) */
    size_t nc = 0;
    char **ck = ckpt_list(run, &nc);
    int64_t disk = nc > 0 ? ckpt_step_name(ck[0]) : -1;
    for (size_t i = 0; i < nc; i++)
        free(ck[i]);
    free(ck);
    return disk >= 0 && disk >= newest_snapshot(run_root);
}

static void stale_sweep(const char *user_root, const char *own_id)
{
    DIR *d = opendir(user_root);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strlen(e->d_name) != 16 || strspn(e->d_name, "0123456789abcdef") != 16 || !strcmp(e->d_name, own_id))
            continue;
        char p[4300];
        snprintf(p, sizeof p, "%.4200s/%.16s", user_root, e->d_name);
        if (is_stale(p, e->d_name)) {
            ftk_info("memory snapshots of a finished run removed: %s", p);
            rm_tree(p);
        }
    }
    closedir(d);
}
