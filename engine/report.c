/* report.c — where a training step's time and bytes went (report.h). */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "../libcommon/output.h"
#include "compress.h"

/* Sums over steps of this rank's figures. */
typedef struct {
    double steps, loop_s, compute_s, host_s, wait_s, overlap_s, inflight_s, tokens, micro;
    comm_coll_t coll[COMM_N_LEVELS][COMM_N_KINDS];
    double formula[COMM_N_LEVELS][COMM_N_KINDS];
} acc_t;

struct report {
    strategy_t strat;
    int world, S, n_levels, nodes, sim;
    int lv[COMM_N_LEVELS]; /* the strategy's levels (COMM_LEVEL_*), n_levels of them */
    int node_size;         /* hpz: ranks per node group */
    int cw; /* the weights are gathered compressed (compress.h) */
    int level_ranks[COMM_N_LEVELS];
    char locality[COMM_N_LEVELS][32];
    size_t b[COMM_N_KINDS]; /* bytes per element moved by each kind */
    int64_t *length;        /* units' unpadded lengths */
    int n_units;
    int64_t global_batch, micro_batch;
    char *header;
    int64_t first_step, last_step;
    acc_t all, first; /* every step counted; the first alone */
};

static const char *const kind_names[COMM_N_KINDS] = {"all_gather", "reduce_scatter", "all_reduce"};
static const char *const kind_titles[COMM_N_KINDS] = {"all-gather", "reduce-scatter", "all-reduce"};

const char *report_kind_name(int kind) { return kind >= 0 && kind < COMM_N_KINDS ? kind_names[kind] : "?"; }
int report_levels(const report_t *r) { return r->n_levels; }
const char *report_level_name(const report_t *r, int level)
{
    if (r->n_levels == 1)
        return "world";
    return strategy_traits(r->strat)->levels[level != COMM_LEVEL_GROUP];
}

/* Where c's ranks are: one node, one node each, or both kinds of link. *nodes: how many
 * nodes c spans. Collective over c. */
static int locality(comm_t *c, int node, char *out, size_t cap, int *nodes)
{
    int n = comm_size(c);
    int *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) {
        ftk_err_set("out of memory");
        return -1;
    }
    if (comm_gather(c, &node, ids, sizeof node, 0) < 0 || comm_bcast(c, ids, (size_t)n * sizeof *ids, 0) < 0) {
        free(ids);
        return -1;
    }
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = ids[j] == ids[i];
        distinct += !seen;
    }
    free(ids);
    *nodes = distinct;
    snprintf(out, cap, "%s", distinct == 1 ? "intra-node" : distinct == n ? "inter-node" : "intra- and inter-node");
    return 0;
}

report_t *report_new(comm_t *world, shard_t *sh, strategy_t strat, precision_t prec, const ckpt_train_t *train,
                     const char *header)
{
    report_t *r = calloc(1, sizeof *r);
    if (!r || !(r->header = strdup(header ? header : ""))) {
        free(r);
        ftk_err_set("out of memory");
        return NULL;
    }
    r->strat = strat;
    r->world = comm_size(world);
    r->S = (int)shard_count(sh);
    r->cw = shard_compress(sh);
    r->global_batch = train->global_batch;
    r->micro_batch = train->micro_batch;
    r->first_step = -1;
    precision_dtypes_t dt = precision_dtypes(prec);
    r->b[COMM_KIND_AG] = dtype_size(dt.compute);
    r->b[COMM_KIND_RS] = r->b[COMM_KIND_AR] = dtype_size(dt.grad);
    if (shard_compress_grads(sh)) /* compress.h: reduce-scattered in bf16 */
        r->b[COMM_KIND_RS] = 2;
    const ckpt_unit_t *u = shard_units(sh, &r->n_units);
    if (!(r->length = malloc((size_t)r->n_units * sizeof *r->length))) {
        report_free(r);
        ftk_err_set("out of memory");
        return NULL;
    }
    for (int i = 0; i < r->n_units; i++)
        r->length[i] = u[i].length;
    comm_t *cross = shard_cross(sh), *node_group = shard_node(sh);
    comm_t *levels[COMM_N_LEVELS] = {world, cross, node_group};
    r->n_levels = 1;
    r->lv[0] = COMM_LEVEL_GROUP;
    if (cross) {
        levels[COMM_LEVEL_GROUP] = shard_group(sh);
        r->lv[r->n_levels++] = COMM_LEVEL_CROSS;
    } else if (node_group) {
        r->node_size = comm_size(node_group);
        r->lv[r->n_levels++] = COMM_LEVEL_NODE;
    }
    int node, spans;
    if (comm_sim_node_ranks(&r->sim) < 0 || comm_node_id(world, &node) < 0 ||
        locality(world, node, r->locality[0], sizeof r->locality[0], &r->nodes) < 0) {
        report_free(r);
        return NULL;
    }
    for (int i = 0; i < r->n_levels; i++) {
        int l = r->lv[i];
        r->level_ranks[l] = comm_size(levels[l]);
        if (locality(levels[l], node, r->locality[l], sizeof r->locality[l], &spans) < 0) {
            report_free(r);
            return NULL;
        }
    }
    return r;
}

void report_free(report_t *r)
{
    if (!r)
        return;
    free(r->length);
    free(r->header);
    free(r);
}

void report_formula(const report_t *r, int ranks, int64_t micro, double v[COMM_N_LEVELS][COMM_N_KINDS])
{
    memset(v, 0, sizeof(double) * COMM_N_LEVELS * COMM_N_KINDS);
    const strategy_traits_t *t = strategy_traits(r->strat);
    int S = t->replicas ? r->S : ranks, G = ranks / (S > 0 ? S : 1);
    if (S < 1 || G < 1)
        return;
    /* the units padded to S shards, as ckpt_units pads them */
    double sum = 0, blocks = 0, ends = 0;
    double g_sum = 0, g_blocks = 0, g_ends = 0; /* the bytes a gather of each moves in all (compress.h) */
    for (int u = 0; u < r->n_units; u++) {
        int64_t pu = (r->length[u] + S - 1) / S * S;
        double p = (double)pu, g = r->cw ? (double)S * (double)compress_part_bytes(pu / S)
                                         : p * (double)r->b[COMM_KIND_AG];
        sum += p;
        g_sum += g;
        if (u == 0 || u == r->n_units - 1) {
            ends += p;
            g_ends += g;
        } else {
            blocks += p;
            g_blocks += g;
        }
    }
    double f = (double)(S - 1) / S, M = (double)micro;
    const size_t *b = r->b;
    if (!t->shards) { /* replicated: each unit all-reduced once */
        v[0][COMM_KIND_AR] = 2 * f * (double)b[COMM_KIND_AR] * sum;
        return;
    }
    v[0][COMM_KIND_RS] = f * (double)b[COMM_KIND_RS] * M * sum; /* each unit once per pass */
    if (t->node_copy) {
        /* each unit's first gather of the step over the world, the others over the node group */
        int n = r->node_size > 0 ? r->node_size : 1;
        if (M > 0) {
            v[0][COMM_KIND_AG] = f * (double)b[COMM_KIND_AG] * sum;
            v[COMM_LEVEL_NODE][COMM_KIND_AG] =
                (double)(n - 1) / n * (double)b[COMM_KIND_AG] * ((2 * M - 1) * blocks + (M - 1) * ends);
        }
    } else if (t->releases) { /* each block gathered for its forward and its backward, the ends once */
        v[0][COMM_KIND_AG] = f * M * (2 * g_blocks + g_ends);
    } else { /* each unit gathered once per step */
        v[0][COMM_KIND_AG] = f * g_sum;
    }
    if (t->replicas) /* each slice across the replicas once per step */
        v[COMM_LEVEL_CROSS][COMM_KIND_AR] = 2 * (double)(G - 1) / G * (double)b[COMM_KIND_AR] * sum / S;
}

static void acc_add(acc_t *a, const trainer_step_t *st, double loop_s, double formula[COMM_N_LEVELS][COMM_N_KINDS])
{
    a->steps++;
    a->loop_s += loop_s;
    a->compute_s += st->compute_s;
    a->host_s += loop_s - st->compute_s - st->comm.wait_s;
    a->wait_s += st->comm.wait_s;
    a->overlap_s += st->comm.overlap_s;
    a->inflight_s += st->comm.inflight_s;
    a->tokens += (double)st->tokens;
    a->micro += (double)st->micro_batches;
    for (int l = 0; l < COMM_N_LEVELS; l++)
        for (int k = 0; k < COMM_N_KINDS; k++) {
            comm_coll_t *x = &a->coll[l][k];
            const comm_coll_t *y = &st->comm.coll[l][k];
            x->calls += y->calls;
            x->bytes += y->bytes;
            x->busy_s += y->busy_s;
            x->wait_s += y->wait_s;
            a->formula[l][k] += formula[l][k];
        }
}

int report_step(report_t *r, const trainer_step_t *st, double loop_s, buf_t *out)
{
    double v[COMM_N_LEVELS][COMM_N_KINDS];
    report_formula(r, r->world, st->micro_batches, v);
    if (loop_s < st->step_s)
        loop_s = st->step_s;
    if (r->first_step < 0) {
        r->first_step = st->step;
        acc_add(&r->first, st, loop_s, v);
    }
    r->last_step = st->step;
    acc_add(&r->all, st, loop_s, v);
    if (!out)
        return 0;
    int rc = buf_printf(out,
                        ", \"split\": {\"step_s\": %.6f, \"compute_s\": %.6f, \"exposed_comm_s\": %.6f, "
                        "\"overlapped_comm_s\": %.6f, \"host_s\": %.6f, \"comm_inflight_s\": %.6f}, \"collectives\": [",
                        loop_s, st->compute_s, st->comm.wait_s, st->comm.overlap_s,
                        loop_s - st->compute_s - st->comm.wait_s, st->comm.inflight_s);
    for (int i = 0; i < r->n_levels; i++)
        for (int k = 0, l = r->lv[i]; k < COMM_N_KINDS; k++) {
            const comm_coll_t *x = &st->comm.coll[l][k];
            rc |= buf_printf(out,
                             "%s{\"level\": \"%s\", \"kind\": \"%s\", \"calls\": %lld, \"bytes\": %.17g, "
                             "\"formula_bytes\": %.17g, \"seconds\": %.6f, \"wait_s\": %.6f}",
                             i + k ? ", " : "", report_level_name(r, l), kind_names[k], (long long)x->calls, x->bytes,
                             v[l][k], x->busy_s, x->wait_s);
        }
    rc |= buf_printf(out, "]");
    return rc ? -1 : 0;
}

/* ---- the run's report ---------------------------------------------------------------------- */

/* The figures reduced over the ranks: per-step means of this rank's sums, in this order. */
enum { F_LOOP, F_COMPUTE, F_HOST, F_WAIT, F_OVERLAP, F_INFLIGHT, F_TOKENS, F_MICRO, F_COLL };
#define F_PER_COLL 5 /* calls, bytes, busy, wait, formula */
#define N_FIG (F_COLL + COMM_N_LEVELS * COMM_N_KINDS * F_PER_COLL)

static void figures(const acc_t *a, const acc_t *skip, double *f)
{
    double n = a->steps - (skip ? skip->steps : 0);
    const double z = 0;
#define D(field) ((a->field - (skip ? skip->field : z)) / (n > 0 ? n : 1))
    f[F_LOOP] = D(loop_s);
    f[F_COMPUTE] = D(compute_s);
    f[F_HOST] = D(host_s);
    f[F_WAIT] = D(wait_s);
    f[F_OVERLAP] = D(overlap_s);
    f[F_INFLIGHT] = D(inflight_s);
    f[F_TOKENS] = D(tokens);
    f[F_MICRO] = D(micro);
    for (int l = 0; l < COMM_N_LEVELS; l++)
        for (int k = 0; k < COMM_N_KINDS; k++) {
            double *x = f + F_COLL + (l * COMM_N_KINDS + k) * F_PER_COLL;
            x[0] = D(coll[l][k].calls);
            x[1] = D(coll[l][k].bytes);
            x[2] = D(coll[l][k].busy_s);
            x[3] = D(coll[l][k].wait_s);
            x[4] = D(formula[l][k]);
        }
#undef D
}

static const double *coll_fig(const double *f, int l, int k) { return f + F_COLL + (l * COMM_N_KINDS + k) * F_PER_COLL; }

static void bytes_text(double b, char *out, size_t cap)
{
    if (b >= 1e9)
        snprintf(out, cap, "%.3f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(out, cap, "%.3f MB", b / 1e6);
    else if (b >= 1e3)
        snprintf(out, cap, "%.3f kB", b / 1e3);
    else
        snprintf(out, cap, "%.0f B", b);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The projection (report.h): the step on n ranks from the measured split on W.
 *  - the global batch is fixed (the data order does not depend on the ranks), so each rank
 *    computes ceil(G/n) rows: compute scales with the rows per rank;
 *  - each collective's exposed seconds scale with its analytical bytes per rank at n ranks
 *    (bandwidths and the share hidden behind compute stay as measured); the scalar
 *    traffic's wait stays as measured;
 *  - host time stays as measured.
 * *comm is NAN when a collective that n ranks need moved nothing here (no bandwidth seen). */
static void project(const report_t *r, const double *mean, int n, double *comp, double *comm, int64_t *micro)
{
    int64_t rows_w = ceil_div(r->global_batch, r->world), rows_n = ceil_div(r->global_batch, n);
    *micro = ceil_div(rows_n, r->micro_batch);
    *comp = mean[F_COMPUTE] * (double)rows_n / (double)rows_w;
    double vn[COMM_N_LEVELS][COMM_N_KINDS], vw[COMM_N_LEVELS][COMM_N_KINDS];
    report_formula(r, n, *micro, vn);
    report_formula(r, r->world, ceil_div(rows_w, r->micro_batch), vw);
    double coll_wait = 0, c = 0;
    for (int l = 0; l < COMM_N_LEVELS; l++)
        for (int k = 0; k < COMM_N_KINDS; k++) {
            double w = coll_fig(mean, l, k)[3];
            coll_wait += w;
            if (vw[l][k] > 0)
                c += w * vn[l][k] / vw[l][k];
            else if (vn[l][k] > 0)
                c = NAN;
        }
    double control = mean[F_WAIT] - coll_wait;
    *comm = c + (control > 0 ? control : 0);
}

/* The title, the run's ranks, levels and steps. */
static void md_head(const report_t *r, int n_steps, FILE *f)
{
    fprintf(f, "# Communication and time report\n\n%s\n\n", r->header);
    fprintf(f, "- Ranks: %d on %d node%s; strategy %s, %d shard%s per unit\n", r->world, r->nodes,
            r->nodes == 1 ? "" : "s", strategy_name(r->strat), r->S, r->S == 1 ? "" : "s");
    if (r->sim)
        fprintf(f, "- Nodes are simulated: groups of %d consecutive ranks count as nodes (FTK_SIM_NODE_RANKS); "
                   "every \"node\" shares this machine's memory, so inter-node figures are shared-memory ones.\n",
                r->sim);
    for (int i = 0, l; i < r->n_levels && (l = r->lv[i], 1); i++)
        fprintf(f, "- Level `%s`: %d rank%s, %s\n", report_level_name(r, l), r->level_ranks[l],
                r->level_ranks[l] == 1 ? "" : "s", r->locality[l]);
    if (r->first.steps > 0 && r->all.steps > r->first.steps)
        fprintf(f, "- Steps %lld to %lld of this process (%d counted: step %lld, the first, warms up and is left "
                   "out). Figures are means per step.\n",
                (long long)r->first_step, (long long)r->last_step, n_steps, (long long)r->first_step);
    else
        fprintf(f, "- Step %lld: the only step of this process (its first: it includes the warm-up).\n",
                (long long)r->first_step);
}

/* The step's parts, which add up to it, and the communication beside them. */
static void md_time(const double *mean, const double *mx, FILE *f)
{
    double step = mean[F_LOOP] > 0 ? mean[F_LOOP] : 1;
    fprintf(f, "\n## Time per step\n\n");
    fprintf(f, "| part | seconds (mean over ranks) | share of the step | slowest rank (s) |\n|---|---:|---:|---:|\n");
    struct {
        const char *name;
        int fig;
    } parts[] = {{"compute", F_COMPUTE}, {"exposed communication", F_WAIT}, {"host", F_HOST}};
    double sum = 0;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        sum += mean[parts[i].fig];
        fprintf(f, "| %s | %.6f | %.1f%% | %.6f |\n", parts[i].name, mean[parts[i].fig],
                100 * mean[parts[i].fig] / step, mx[parts[i].fig]);
    }
    fprintf(f, "| **step** (the sum) | %.6f | 100.0%% | %.6f |\n", mean[F_LOOP], mx[F_LOOP]);
    fprintf(f, "| overlapped communication (hidden under compute, not added) | %.6f | %.1f%% | %.6f |\n",
            mean[F_OVERLAP], 100 * mean[F_OVERLAP] / step, mx[F_OVERLAP]);
    fprintf(f, "| communication in flight (union of the spans) | %.6f | %.1f%% | %.6f |\n\n", mean[F_INFLIGHT],
            100 * mean[F_INFLIGHT] / step, mx[F_INFLIGHT]);
    fprintf(f,
            "compute + exposed communication + host = %.6f s against a step of %.6f s (they add up by "
            "construction: host is the loop's time outside compute and waits; each part is measured on every "
            "rank, the step's timers tile it). Compute: the passes, the loss, the optimizer step and the backend's "
            "sync, less the waits inside them. Exposed communication: seconds blocked in communication calls "
            "(tensor collectives and the scalar all-reduces). Overlapped: a collective in flight while the host "
            "was not blocked — on MPI ranks MPI moves data only inside MPI calls, so a span runs from the issue to "
            "the completion this rank saw: an upper bound of the transfer.\n",
            sum, mean[F_LOOP]);
}

/* Each level's collectives, measured beside the analytical volumes, and the scalar traffic. */
static void md_collectives(const report_t *r, const double *mean, FILE *f)
{
    fprintf(f, "\n## Collectives per step\n\n");
    fprintf(f, "| level | ranks | where | collective | calls | bytes measured | bytes analytical | measured / "
               "analytical | seconds in flight | seconds exposed | bus bandwidth |\n"
               "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    double coll_wait = 0;
    int rows = 0;
    for (int i = 0; i < r->n_levels; i++)
        for (int k = 0, l = r->lv[i]; k < COMM_N_KINDS; k++) {
            const double *x = coll_fig(mean, l, k);
            coll_wait += x[3];
            if (x[0] == 0 && x[1] == 0 && x[4] == 0) /* a kind this level does not use */
                continue;
            rows++;
            char bm[32], ba[32], ratio[32], bw[32];
            bytes_text(x[1], bm, sizeof bm);
            bytes_text(x[4], ba, sizeof ba);
            if (x[4] > 0)
                snprintf(ratio, sizeof ratio, "%.6f", x[1] / x[4]);
            else
                snprintf(ratio, sizeof ratio, "%s", x[1] > 0 ? "∞" : "–");
            if (x[1] > 0 && x[2] > 0) {
                bytes_text(x[1] / x[2], bw, sizeof bw - 2);
                strcat(bw, "/s");
            } else
                snprintf(bw, sizeof bw, "–");
            fprintf(f, "| %s | %d | %s | %s | %.1f | %s | %s | %s | %.6f | %.6f | %s |\n", report_level_name(r, l),
                    r->level_ranks[l], r->locality[l], kind_titles[k], x[0], bm, ba, ratio, x[2], x[3], bw);
        }
    if (!rows)
        fprintf(f, "| %s | %d | %s | none | 0 | 0 B | 0 B | – | 0 | 0 | – |\n\nNo tensor collective: one shard "
                   "group of one rank reads and updates its units in place.\n",
                report_level_name(r, 0), r->level_ranks[0], r->locality[0]);
    double control = mean[F_WAIT] - coll_wait;
    fprintf(f,
            "\nScalar traffic (the batch's counts, the loss and flags, the gradient norm): %.6f s exposed per step, "
            "not counted as volume.\n\n",
            control > 0 ? control : 0);
    fprintf(f,
            "Analytical volumes per rank (docs/design.md \"Volumes\"): an all-gather or a reduce-scatter of N "
            "elements of b bytes over p ranks moves (1 − 1/p)·N·b, an all-reduce 2·(1 − 1/p)·N·b; over a step, "
            "with M = %.2f micro-batch passes per rank and the units padded to the shard count: full/hybrid "
            "gather each block twice and the embedding and head once per pass, grad-op each unit once per step; "
            "every strategy but none reduce-scatters each unit once per pass; none all-reduces each unit once; "
            "hybrid all-reduces each rank's slices across the replicas; hpz gathers each unit once per step over "
            "the world and its other gathers (each block 2M − 1 times, the embedding and head M − 1 times) over the "
            "node group. b: %zu bytes for the gathers, %zu for "
            "the reductions (the precision mode's%s). Bus bandwidth: measured bytes / seconds in flight (the ring "
            "algorithm's per-rank bytes, as nccl-tests' busbw counts them; a lower bound where spans are upper "
            "bounds).\n",
            mean[F_MICRO], r->b[COMM_KIND_AG], r->b[COMM_KIND_RS],
            r->cw ? "; --compress-weights int8: a gathered unit of P elements moves S parts of int8 codes and an fp32 "
                    "scale per 256 of them, each part rounded up to 16 bytes, in place of P·b"
                  : "");
}

/* The ranks of the groups a strategy keeps on other rank counts (hybrid's shard groups, hpz's
 * node groups); 0: none. */
static int kept_group(const report_t *r)
{
    const strategy_traits_t *t = strategy_traits(r->strat);
    return t->replicas ? r->S : t->node_copy ? r->node_size : 0;
}

/* The projection's rank counts: the kept group (or one rank) times powers of two, up to the
 * global batch's rows, and the measured count where it falls among them. */
static int projected_counts(const report_t *r, int counts[40])
{
    int unit = kept_group(r) ? kept_group(r) : 1, n_counts = 0;
    int64_t top = r->global_batch > r->world ? r->global_batch : r->world;
    for (int64_t g = 1; g * unit <= top && n_counts < 38; g *= 2) {
        int n = (int)(g * unit);
        if (r->world < n && (n_counts == 0 || counts[n_counts - 1] < r->world))
            counts[n_counts++] = r->world;
        counts[n_counts++] = n;
    }
    if (n_counts == 0 || counts[n_counts - 1] < r->world)
        counts[n_counts++] = r->world;
    return n_counts;
}

/* The step projected on other rank counts (project), under the model it states. */
static void md_projection(const report_t *r, const double *mean, FILE *f)
{
    fprintf(f, "\n## Projected step time on other rank counts (a projection, not a measurement)\n\n");
    fprintf(f,
            "Model, from the split measured on %d rank(s): the global batch (%lld rows) is fixed, so each of n ranks "
            "computes ceil(%lld/n) rows and compute scales with them; each collective's exposed seconds scale with "
            "its analytical bytes per rank on n ranks (bandwidths and the share hidden behind compute as measured); "
            "the scalar traffic's wait and host time stay as measured. Speedup is the study's "
            "(t_compute(%d) + t_comm(%d)) / (t_compute(n) + t_comm(n)), host time left out; the step adds it. "
            "Where ranks share this machine's cores, the measured compute already includes their contention.\n\n",
            r->world, (long long)r->global_batch, (long long)r->global_batch, r->world, r->world);
    const strategy_traits_t *t = strategy_traits(r->strat);
    int kept = kept_group(r);
    if (kept)
        fprintf(f, "%s keeps its %s of %d ranks: n/%d %s.\n\n", t->name, t->groups, kept, kept, t->copies);
    fprintf(f, "| ranks | micro-batches per rank | compute (s) | communication, exposed (s) | host (s) | step (s) | "
               "speedup | tokens/s |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int counts[40], n_counts = projected_counts(r, counts);
    double base = mean[F_COMPUTE] + mean[F_WAIT];
    int missing = 0;
    for (int i = 0; i < n_counts; i++) {
        int m = counts[i], measured = m == r->world;
        double comp, comm;
        int64_t micro;
        project(r, mean, m, &comp, &comm, &micro);
        if (measured)
            comm = mean[F_WAIT];
        if (isnan(comm)) {
            missing = 1;
            fprintf(f, "| %d | %lld | %.6f | n/a | %.6f | n/a | n/a | n/a |\n", m, (long long)micro, comp, mean[F_HOST]);
            continue;
        }
        double st = comp + comm + mean[F_HOST];
        fprintf(f, "| %d%s | %lld | %.6f | %.6f | %.6f | %.6f | %.2f | %.0f |\n", m, measured ? " (measured)" : "",
                (long long)micro, comp, comm, mean[F_HOST], st, comp + comm > 0 ? base / (comp + comm) : 0,
                st > 0 ? mean[F_TOKENS] / st : 0);
    }
    if (missing)
        fprintf(f, "\nn/a: a collective those ranks need moved nothing here (no bandwidth to scale), e.g. the "
                   "replicas' all-reduce of hybrid measured with one replica.\n");
}

static int write_md(const report_t *r, const double *mean, const double *mx, int n_steps, FILE *f)
{
    md_head(r, n_steps, f);
    md_time(mean, mx, f);
    md_collectives(r, mean, f);
    md_projection(r, mean, f);
    return ferror(f) ? -1 : 0;
}

int report_write(report_t *r, comm_t *world, const char *path)
{
    const acc_t *skip = r->first.steps > 0 && r->all.steps > r->first.steps ? &r->first : NULL;
    int n_steps = (int)(r->all.steps - (skip ? skip->steps : 0));
    double mean[N_FIG], mx[N_FIG];
    figures(&r->all, skip, mean);
    memcpy(mx, mean, sizeof mx);
    if (comm_allreduce_f64(world, mean, N_FIG, COMM_SUM) < 0 || comm_allreduce_f64(world, mx, N_FIG, COMM_MAX) < 0)
        return -1;
    for (int i = 0; i < N_FIG; i++)
        mean[i] /= comm_size(world);
    if (comm_rank(world) != 0)
        return 0;
    if (r->all.steps == 0)
        return 1;
    /* each start of a run writes its report: an existing file is replaced (output.h) */
    output_t o;
    if (output_begin(&o, path, OUTPUT_FORCE) < 0) {
        ftk_err_prefix("--report ");
        return -1;
    }
    errno = 0;
    FILE *f = output_stream(&o);
    if (!f || write_md(r, mean, mx, n_steps, f) < 0) {
        if (f)
            ftk_err_set("%s: %s", path, strerror(errno ? errno : EIO));
        ftk_err_prefix("--report ");
        output_abort(&o);
        return -1;
    }
    if (output_commit(&o) < 0) {
        ftk_err_prefix("--report ");
        return -1;
    }
    return 0;
}
