/* test_ops — the CPU backend op by op (kernels/cpu/cpu.c against kernels/backend.h):
 *  - every case of the op table (tests/ops/ops_table.h) in every dtype configuration it
 *    lists against its fp32 run on the same inputs, with the bounds of its descriptor;
 *  - every run gives the same bits twice and with 1 and 2 OpenMP threads (fp32 matmul
 *    too: K = 998 is cut differently by OpenBLAS on 1 and 2 threads);
 *  - every op's gradient check (its descriptor's: backward ops against finite differences
 *    of their forward);
 *  - adamw against the header's formula in double, its bf16 rounding (nearest, and
 *    stochastic in both rules: sround.h's bits exactly, unbiased, independent fields,
 *    slicing- and thread-independent);
 *  - convert round trips; add, scale, sumsq in mixed dtypes against the host;
 *  - xent and sumsq add into their device accumulator; adamw_multi = adamw per segment;
 *  - streams and events; bk_alloc() accounting and its error; the planning backend.
 * Prints one summary line per op with the worst error seen. Exit 0 pass, 1 fail. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/backend.h"
#include "../../kernels/sround.h"
#include "../../libcommon/log.h"
#include "../ops/ops_table.h"
#include "test.h"

#ifdef __SANITIZE_ADDRESS__
/* An impossible allocation must come back NULL as it does without the sanitizer (which
 * would otherwise report it and stop). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

static uint64_t SEED = 20261123u; /* FTK_SEED=N runs every check on other inputs */
#define U_BF16 OPS_U_BF16 /* bf16's unit roundoff, 2^-8 (8 bits of significand) */
#define EPS32 OPS_EPS32   /* 2^-24, fp32's */

/* ---- the table: bf16 against fp32, determinism ------------------------------------------- */

/* The bound on ops_compare()'s max_rel (|got − ref| / (|ref| + rms(ref))) between an output of
 * a bf16 configuration and the same output of the fp32 run on the same inputs, and whether
 * it must be exactly f32_to_bf16 of the fp32 run's (one rounding of the same fp32
 * arithmetic): the op's descriptor's (ops_cpu_tol(), tests/ops/ops_defs.c, which says why
 * for each op). */

typedef struct {
    int cases, runs, exact_runs, exact_ok, det_runs, det_ok, scalar_runs, scalar_ok;
    double worst, worst_bound; /* the largest err/bound ratio seen, as err and bound */
    double worst_f32;          /* the largest error of an f32 output against the fp32 run */
    char worst_where[160];
} op_stats_t;

static op_stats_t stats[OP_COUNT];

static void run_or_die(backend_t *be, const ops_case_t *c, ops_cfg_t cfg, uint64_t seed, ops_result_t *r)
{
    if (ops_run(be, c, cfg, seed, 0, r) < 0) {
        fprintf(stderr, "%s: %s\n", OPS_DESC(c->op)->name, ftk_err_msg());
        exit(1);
    }
}

/* Compares run r of configuration cfg with the fp32 run f of the same case. */
static void against_f32(const ops_case_t *c, ops_cfg_t cfg, const ops_result_t *f, const ops_result_t *r)
{
    op_stats_t *s = &stats[c->op];
    char name[128];
    ops_case_name(c, name, sizeof name);
    if (r->has_scalar) { /* sumsq: double sums of the same values in the same order */
        s->scalar_runs++;
        s->scalar_ok += r->scalar == f->scalar;
        CHECK(r->scalar == f->scalar);
        if (r->scalar != f->scalar)
            fprintf(stderr, "  %s [%s]: %.17g vs fp32 %.17g\n", name, ops_cfg_names[cfg], r->scalar, f->scalar);
    }
    for (int i = 0; i < r->n_out; i++) {
        const ops_out_t *o = &r->out[i];
        ops_err_t e = ops_compare(f->out[i].v, o->v, o->n);
        int exact;
        double b = ops_cpu_tol(c, o, &exact);
        int ok = e.nan == 0 && e.max_rel <= b;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  %s [%s] %s: error %.3e at %lld (bound %.3e), %lld NaN\n", name, ops_cfg_names[cfg],
                    o->name, e.max_rel, (long long)e.worst, b, (long long)e.nan);
        if (o->dt == DT_F32 && e.max_rel > s->worst_f32)
            s->worst_f32 = e.max_rel;
        double ratio = b > 0 ? e.max_rel / b : e.max_rel > 0 ? INFINITY : 0;
        double cur = s->worst_bound > 0 ? s->worst / s->worst_bound : 0;
        if (o->dt == DT_BF16 && (ratio > cur || s->worst_bound == 0)) {
            s->worst = e.max_rel;
            s->worst_bound = b;
            snprintf(s->worst_where, sizeof s->worst_where, "%s [%s] %s", name, ops_cfg_names[cfg], o->name);
        }
        if (o->dt == DT_BF16 && exact) {
            int64_t bad = 0;
            for (int64_t j = 0; j < o->n; j++)
                bad += f32_to_bf16(f->out[i].v[j]) != f32_to_bf16(o->v[j]);
            s->exact_runs++;
            s->exact_ok += bad == 0;
            CHECK(bad == 0);
            if (bad)
                fprintf(stderr, "  %s [%s] %s: %lld elements are not the fp32 result rounded\n", name,
                        ops_cfg_names[cfg], o->name, (long long)bad);
        }
    }
}

static void test_table(backend_t *be)
{
    for (int k = 0; k < ops_n_cases(0); k++) {
        const ops_case_t *c = ops_case_at(k);
        uint64_t seed = SEED + 1000003u * (uint64_t)k;
        op_stats_t *s = &stats[c->op];
        char name[128];
        ops_case_name(c, name, sizeof name);
        s->cases++;
        ops_result_t f;
        run_or_die(be, c, OPS_F32, seed, &f);
        for (int cfg = 0; cfg < OPS_NCFG; cfg++) {
            if (!(c->cfgs & OPS_CFG(cfg)))
                continue;
            ops_result_t r, again, one;
            if (cfg == OPS_F32)
                r = f;
            else
                run_or_die(be, c, cfg, seed, &r);
            s->runs++;
            /* every output written (NaN-poisoned before) */
            for (int i = 0; i < r.n_out; i++)
                if (ops_compare(r.out[i].v, r.out[i].v, r.out[i].n).nan) {
                    CHECK(!"an output holds NaN");
                    fprintf(stderr, "  %s [%s] %s: NaN (unwritten?)\n", name, ops_cfg_names[cfg], r.out[i].name);
                }
            if (cfg != OPS_F32)
                against_f32(c, (ops_cfg_t)cfg, &f, &r);
            /* determinism: twice on 2 threads, then on 1 */
            run_or_die(be, c, (ops_cfg_t)cfg, seed, &again);
            omp_set_num_threads(1);
            run_or_die(be, c, (ops_cfg_t)cfg, seed, &one);
            omp_set_num_threads(2);
            int det = ops_same(&r, &again) && ops_same(&r, &one);
            s->det_runs++;
            s->det_ok += det;
            CHECK(det);
            if (!det)
                fprintf(stderr, "  %s [%s]: different bits (second run: %s, 1 thread: %s)\n", name,
                        ops_cfg_names[cfg], ops_same(&r, &again) ? "same" : "DIFFERENT",
                        ops_same(&r, &one) ? "same" : "DIFFERENT");
            ops_result_free(&again);
            ops_result_free(&one);
            if (cfg != OPS_F32)
                ops_result_free(&r);
        }
        ops_result_free(&f);
    }
    printf("bf16 against fp32 on the same inputs (error: max |bf16 - f32| / (|f32| + rms), u = 2^-8):\n");
    for (int op = 0; op < OP_COUNT; op++) {
        op_stats_t *s = &stats[op];
        if (!s->cases)
            continue;
        char line[256];
        int len = snprintf(line, sizeof line, "  %-12s %2d cases %3d runs:", OPS_DESC(op)->name, s->cases, s->runs);
        if (s->worst_bound > 0)
            len += snprintf(line + len, sizeof line - (size_t)len, " bf16 outputs worst %.3f u (bound %.3f u),",
                            s->worst / U_BF16, s->worst_bound / U_BF16);
        if (s->exact_runs)
            len += snprintf(line + len, sizeof line - (size_t)len, " = f32_to_bf16(fp32) %d/%d,", s->exact_ok,
                            s->exact_runs);
        if (s->scalar_runs)
            len += snprintf(line + len, sizeof line - (size_t)len, " scalar identical %d/%d,", s->scalar_ok,
                            s->scalar_runs);
        printf("%s f32 outputs worst %.2e; same bits twice and on 1|2 threads %d/%d\n", line, s->worst_f32,
               s->det_ok, s->det_runs);
        if (s->worst > 0)
            printf("  %-12s   worst at %s\n", "", s->worst_where);
    }
}

/* ---- gradients ---------------------------------------------------------------------------- */

/* Every case whose op's descriptor has a gradient check (tests/ops/ops_defs.c: backward ops
 * against finite differences of their forward in fp32, rope's inverse against its
 * transpose), on one stream of random inputs. */
static ops_grad_t grads[OP_COUNT];
static void test_fd(backend_t *be)
{
    ops_rng_t rng;
    ops_rng_seed(&rng, SEED ^ 0xfd);
    for (int k = 0; k < ops_n_cases(0); k++) {
        const ops_case_t *c = ops_case_at(k);
        if (OPS_DESC(c->op)->grad)
            OPS_DESC(c->op)->grad(be, c, &rng, &grads[c->op]);
    }
    for (int op = 0; op < OP_COUNT; op++)
        CHECK_MANY(grads[op].checks, grads[op].bad);
    printf("backward ops against finite differences of the forward (fp32; error relative to sum |g.e| + "
           "sum |w.y|, bound %.2e):\n",
           OPS_FD_BOUND);
    for (int op = 0; op < OP_COUNT; op++) {
        const ops_desc_t *d = OPS_DESC(op);
        if (!grads[op].cases || d->grad_linear)
            continue;
        printf("  %-12s %2d cases:", d->name, grads[op].cases);
        for (int i = 0; i < 3 && d->grad_names[i]; i++)
            printf(" %s %.2e", d->grad_names[i], grads[op].worst[i]);
        printf("\n");
    }
    for (int op = 0; op < OP_COUNT; op++)
        if (OPS_DESC(op)->grad_linear)
            printf("  %-12s %s: worst %.2e, %s: worst %.2e (bounds 2^-20 = %.2e)\n", OPS_DESC(op)->name,
                   OPS_DESC(op)->grad_names[0], grads[op].worst[0], OPS_DESC(op)->grad_names[1], grads[op].worst[1],
                   1.0 / (1 << 20));
}

/* ---- adamw ----------------------------------------------------------------------------------- */

typedef struct {
    int64_t n;
    float *p, *g, *m, *v;
} adam_in_t;

static adam_in_t adam_inputs(ops_rng_t *rng, int64_t n, int round)
{
    adam_in_t a = {n, ops_rand(rng, n, 1, round), ops_rand(rng, n, 1e-2f, round), ops_rand(rng, n, 1e-3f, round),
                   ops_rand(rng, n, 1e-5f, round)};
    for (int64_t i = 0; i < n; i++)
        a.v[i] = fabsf(a.v[i]);
    return a;
}
static void adam_free(adam_in_t *a) { free(a->p), free(a->g), free(a->m), free(a->v); }

/* Runs adamw on copies of a in dtypes st (p, m, v) and gt (g); results widened into out[3]. */
static void adam_run(backend_t *be, const adam_in_t *a, dtype_t st, dtype_t gt, const bk_adamw_t *h, float *out[3])
{
    int64_t n = a->n;
    float *t[4];
    for (int i = 0; i < 4; i++)
        t[i] = ops_xmalloc((size_t)n * sizeof(float));
    memcpy(t[0], a->p, (size_t)n * 4), memcpy(t[1], a->g, (size_t)n * 4), memcpy(t[2], a->m, (size_t)n * 4),
        memcpy(t[3], a->v, (size_t)n * 4);
    bk_buf_t P = ops_put(be, st, t[0], n), G = ops_put(be, gt, t[1], n), M = ops_put(be, st, t[2], n),
             V = ops_put(be, st, t[3], n);
    be->adamw(be, P, G, M, V, n, h);
    out[0] = ops_get(be, P, n), out[1] = ops_get(be, M, n), out[2] = ops_get(be, V, n);
    for (int i = 0; i < 4; i++)
        free(t[i]);
    bk_free(be, P.p), bk_free(be, G.p), bk_free(be, M.p), bk_free(be, V.p);
}

static bk_adamw_t adam_h(int step, float wd, float gscale)
{
    bk_adamw_t h = {.lr = 1e-3f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .wd = wd, .gscale = gscale,
                    .bc1 = 1.0 - pow(0.9f, step), .bc2 = 1.0 - pow(0.95f, step)};
    return h;
}

/* f32 states against the header's formula evaluated in double from the same fp32
 * hyper-parameters. fp32 evaluation rounds a handful of times per state; each rounding errs
 * by at most 2^-24 of the terms it combines, so the bound is k·2^-24 of the sum of the
 * terms' magnitudes: m = b1·m + (1−b1)·g·gs (4 roundings: k = 4), v (g² and gs: k = 6),
 * p = p·(1−lr·wd) − (lr/bc1)·m/(√v/√bc2 + eps) (the decay, the step, m's error carried
 * through the quotient, √, /, +, −: k = 12). */
static void test_adamw_formula(backend_t *be)
{
    ops_rng_t rng;
    ops_rng_seed(&rng, SEED ^ 0xada);
    const struct {
        int step;
        float wd, gs;
    } set[] = {{1, 0.1f, 1.0f}, {10, 0.0f, 0.5f}, {1000, 0.01f, 0.25f}};
    double worst[3] = {0};
    const double k[3] = {12, 4, 6};
    for (size_t s = 0; s < sizeof set / sizeof *set; s++) {
        adam_in_t a = adam_inputs(&rng, 4099, 0);
        bk_adamw_t h = adam_h(set[s].step, set[s].wd, set[s].gs);
        float *out[3];
        adam_run(be, &a, DT_F32, DT_F32, &h, out);
        for (int64_t i = 0; i < a.n; i++) {
            double b1 = h.b1, b2 = h.b2, lr = h.lr, g = (double)a.g[i] * h.gscale;
            double m = b1 * a.m[i] + (1 - b1) * g, v = b2 * a.v[i] + (1 - b2) * g * g;
            double den = sqrt(v) / sqrt(h.bc2) + h.eps, decay = 1 - lr * h.wd;
            double p = a.p[i] * decay - lr / h.bc1 * m / den;
            double ref[3] = {p, m, v};
            double mag[3] = {fabs(a.p[i] * decay) + lr / h.bc1 * (fabs(b1 * a.m[i]) + fabs((1 - b1) * g)) / den,
                             fabs(b1 * a.m[i]) + fabs((1 - b1) * g), b2 * a.v[i] + (1 - b2) * g * g};
            for (int w = 0; w < 3; w++) {
                double e = fabs(out[w][i] - ref[w]) / (EPS32 * mag[w]);
                worst[w] = e > worst[w] ? e : worst[w];
            }
        }
        for (int w = 0; w < 3; w++)
            free(out[w]);
        adam_free(&a);
    }
    for (int w = 0; w < 3; w++)
        CHECK(worst[w] <= k[w]);
    printf("adamw f32 against the formula in double: worst p %.2f, m %.2f, v %.2f (bounds 12, 4, 6) x 2^-24 of "
           "the terms\n",
           worst[0], worst[1], worst[2]);
}

/* bf16 states, nearest: each state is f32_to_bf16 of the fp32 result on the same inputs
 * (g bf16 or f32). */
/* clip_coef against engine/optim.c's host arithmetic (the trainer's two ways of clipping
 * must give the same bits): slots summed in order, sqrt, division, all in double. */
static void test_clip_coef(backend_t *be)
{
    static const double sq[][3] = {{2.25, 1.75, 0}, {1e-3, 3e-7, 0.5}, {0, 0, 0}, {1e6, 2.5, 1e-9}};
    static const double maxn[] = {1.0, 0.05, 0.0, 3.0, 1e9};
    int same = 1;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) {
            double *d = ops_put_raw(be, sq[i], sizeof sq[i]);
            float *coef = ops_put_raw(be, (float[]){NAN}, sizeof(float)), got;
            be->clip_coef(be, coef, d, 3, maxn[j]);
            be->download(be, &got, coef, sizeof got);
            double total = 0;
            for (int k = 0; k < 3; k++)
                total += sq[i][k];
            double c = maxn[j] / (sqrt(total) + 1e-6);
            float want = maxn[j] > 0 && c < 1.0 ? (float)c : 1.0f;
            same &= !memcmp(&got, &want, sizeof got);
            bk_free(be, d);
            bk_free(be, coef);
        }
    CHECK(same);
    printf("clip_coef = the host's clipping coefficient (20 cases): %s\n", same ? "same bits" : "DIFFERENT");
}

static void test_adamw_nearest(backend_t *be)
{
    ops_rng_t rng;
    ops_rng_seed(&rng, SEED ^ 0xbf16);
    adam_in_t a = adam_inputs(&rng, 3001, 1);
    bk_adamw_t h = adam_h(5, 0.1f, 1.0f);
    int64_t bad = 0;
    for (int gbf = 0; gbf < 2; gbf++) {
        float *ref[3], *out[3];
        adam_run(be, &a, DT_F32, DT_F32, &h, ref);
        adam_run(be, &a, DT_BF16, gbf ? DT_BF16 : DT_F32, &h, out);
        for (int w = 0; w < 3; w++) {
            for (int64_t i = 0; i < a.n; i++)
                bad += f32_to_bf16(ref[w][i]) != f32_to_bf16(out[w][i]) || out[w][i] != ops_round_bf16(out[w][i]);
            free(ref[w]), free(out[w]);
        }
    }
    CHECK(bad == 0);
    printf("adamw bf16 states, nearest: %s f32_to_bf16 of the fp32 result (g f32 and bf16)\n",
           bad ? "NOT" : "exactly");
    adam_free(&a);
}

/* The bf16 values either side of x: truncated toward zero, and the next away from zero. */
static void neighbours(float x, float *lo, float *hi)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    *lo = bf16_to_f32((uint16_t)(u >> 16));
    *hi = bf16_to_f32((uint16_t)((u >> 16) + 1));
}

/* A statistic's distance from its expectation q (a probability) over N draws, in
 * standard errors √(q(1−q)/N). */
static double z_of(double count, double q, double N) { return fabs(count / N - q) / sqrt(q * (1 - q) / N); }

/* Stochastic rounding, in both rules (sround.h: one hash an element cut in three 16-bit
 * fields, and BK_SROUND_HASH3's hash per state): for inputs whose fp32 results x fall
 * between two bf16 neighbours, over 1024 elements (each its own bits) × 16 keys,
 *  - every state is bk_sround_bf16(x, its rule's bits) — the documented rule bit for bit,
 *    so only the two neighbours occur;
 *  - each state rounds away from zero in a fraction within 4 standard errors
 *    (√(f(1−f)/N)) of f, the fraction of an ulp cut: the stored mean is x (unbiased);
 *  - under the one-hash rule, two states of one element (their fields of one hash) round
 *    away together in a fraction within 4 standard errors of f_a·f_b: independent, as
 *    separate hashes were;
 * and the result does not depend on splitting the call or the thread count. */
static void test_adamw_stochastic(backend_t *be)
{
    ops_rng_t rng;
    ops_rng_seed(&rng, SEED ^ 0x5e);
    const int64_t n = 1024;
    const int keys = 16;
    const double N = (double)n * keys;
    for (int rule = BK_SROUND; rule <= BK_SROUND_HASH3; rule++) {
        double worst_z = 0, worst_pair = 0;
        int64_t not_rule = 0, tested = 0, pairs = 0;
        for (int set = 0; set < 4; set++) {
            adam_in_t one = adam_inputs(&rng, 1, 1), a = adam_inputs(&rng, n, 1);
            for (int64_t i = 0; i < n; i++)
                a.p[i] = one.p[0], a.g[i] = one.g[0], a.m[i] = one.m[0], a.v[i] = one.v[0];
            bk_adamw_t h = adam_h(3, 0.1f, 1.0f);
            float *x[3];
            adam_run(be, &one, DT_F32, DT_F32, &h, x);
            double up[3] = {0}, both[3] = {0}; /* away from zero: per state; per pair (p m, p v, m v) */
            h.stochastic = rule;
            for (int k = 0; k < keys; k++) {
                h.key = bk_sround_key(SEED, k, set);
                float *out[3];
                adam_run(be, &a, DT_BF16, DT_BF16, &h, out);
                for (int64_t i = 0; i < n; i++) {
                    int u[3];
                    for (int w = 0; w < 3; w++) {
                        uint32_t r = rule == BK_SROUND ? bk_sround_field(bk_sround_hash(h.key, i), w)
                                                       : bk_sround_bits3(h.key, i, w);
                        float want = bf16_to_f32(bk_sround_bf16(x[w][0], r)), lo, hi;
                        not_rule += memcmp(&out[w][i], &want, 4) != 0;
                        neighbours(x[w][0], &lo, &hi);
                        u[w] = out[w][i] == hi && hi != lo;
                        up[w] += u[w];
                    }
                    both[0] += u[0] && u[1], both[1] += u[0] && u[2], both[2] += u[1] && u[2];
                }
                for (int w = 0; w < 3; w++)
                    free(out[w]);
            }
            double f[3];
            for (int w = 0; w < 3; w++) {
                float lo, hi, xv = x[w][0];
                neighbours(xv, &lo, &hi);
                f[w] = ((double)xv - lo) / ((double)hi - lo);
                if (f[w] <= 0) /* exactly representable: nothing to round */
                    continue;
                double z = z_of(up[w], f[w], N);
                worst_z = z > worst_z ? z : worst_z;
                tested++;
            }
            const int pa[3] = {0, 0, 1}, pb[3] = {1, 2, 2};
            for (int q = 0; q < 3 && rule == BK_SROUND; q++) {
                double fab = f[pa[q]] * f[pb[q]];
                if (fab <= 0)
                    continue;
                double z = z_of(both[q], fab, N);
                worst_pair = z > worst_pair ? z : worst_pair;
                pairs++;
            }
            for (int w = 0; w < 3; w++)
                free(x[w]);
            adam_free(&one);
            adam_free(&a);
        }
        CHECK(not_rule == 0);
        CHECK(tested >= 8 && worst_z <= 4);
        printf("adamw stochastic rounding (%s): %lld states x %d draws, %lld not the rule's bits (bk_sround_bf16 of "
               "the fp32 result), rounded away from zero within %.2f standard errors of the fraction cut (bound 4)\n",
               ops_sround_name(rule), (long long)tested, (int)N, (long long)not_rule, worst_z);
        if (rule == BK_SROUND) {
            CHECK(pairs >= 8 && worst_pair <= 4);
            printf("adamw stochastic rounding (%s): %lld pairs of states of one element (p m, p v, m v) round away "
                   "together within %.2f standard errors of f_a*f_b (bound 4): independent fields\n",
                   ops_sround_name(rule), (long long)pairs, worst_pair);
        }
    }

    /* slicing and threads */
    adam_in_t a = adam_inputs(&rng, 1001, 1);
    bk_adamw_t h = adam_h(7, 0.1f, 1.0f);
    h.stochastic = BK_SROUND;
    h.key = bk_sround_key(SEED, 7, 5);
    h.index0 = 500;
    float *whole[3], *one_thread[3];
    adam_run(be, &a, DT_BF16, DT_BF16, &h, whole);
    omp_set_num_threads(1);
    adam_run(be, &a, DT_BF16, DT_BF16, &h, one_thread);
    omp_set_num_threads(2);
    /* two calls: [0, 400) at index0 500, [400, 1001) at index0 900, on views of one buffer */
    float *t[4] = {a.p, a.g, a.m, a.v};
    bk_buf_t B[4];
    for (int i = 0; i < 4; i++) {
        float *c = ops_xmalloc((size_t)a.n * sizeof *c);
        memcpy(c, t[i], (size_t)a.n * sizeof *c);
        B[i] = ops_put(be, DT_BF16, c, a.n);
        free(c);
    }
    be->adamw(be, B[0], B[1], B[2], B[3], 400, &h);
    bk_adamw_t h2 = h;
    h2.index0 = 900;
    be->adamw(be, bk_at(B[0], 400), bk_at(B[1], 400), bk_at(B[2], 400), bk_at(B[3], 400), a.n - 400, &h2);
    float *split[3] = {ops_get(be, B[0], a.n), ops_get(be, B[2], a.n), ops_get(be, B[3], a.n)};
    int same_split = 1, same_threads = 1;
    for (int w = 0; w < 3; w++) {
        same_split &= !memcmp(whole[w], split[w], (size_t)a.n * sizeof(float));
        same_threads &= !memcmp(whole[w], one_thread[w], (size_t)a.n * sizeof(float));
        free(whole[w]), free(split[w]), free(one_thread[w]);
    }
    for (int i = 0; i < 4; i++)
        bk_free(be, B[i].p);
    CHECK(same_split);
    CHECK(same_threads);
    printf("adamw stochastic rounding: one call and two with index0 offsets %s, 1 and 2 threads %s\n",
           same_split ? "same bits" : "DIFFERENT", same_threads ? "same bits" : "DIFFERENT");
    adam_free(&a);

    /* a rounding that is none of sround.h's is an error (on a fresh instance: errors stick) */
    backend_t *fresh = backend_cpu_new();
    CHECK(fresh != NULL);
    if (fresh) {
        adam_in_t b = adam_inputs(&rng, 8, 1);
        bk_adamw_t hb = adam_h(1, 0.0f, 1.0f);
        hb.stochastic = BK_SROUND_HASH3 + 1;
        float *o[3];
        adam_run(fresh, &b, DT_BF16, DT_BF16, &hb, o);
        int refused = fresh->sync(fresh) < 0 && strstr(ftk_err_msg(), "rounding");
        CHECK(refused);
        printf("adamw with rounding %d: %s\n", hb.stochastic, refused ? ftk_err_msg() : "NOT refused");
        for (int w = 0; w < 3; w++)
            free(o[w]);
        adam_free(&b);
        backend_free(fresh);
    }
}

/* ---- convert, add, scale, sumsq ---------------------------------------------------------------- */

static void test_convert(backend_t *be)
{
    /* f32 -> bf16: random values of every magnitude, ties both ways, specials */
    ops_rng_t rng;
    ops_rng_seed(&rng, SEED ^ 0xc0);
    const int64_t n = 4096;
    uint32_t *bits = ops_xmalloc((size_t)n * sizeof *bits);
    for (int64_t i = 0; i < n; i++)
        bits[i] = (uint32_t)(ops_urand(&rng) * 4294967296.0);
    for (int64_t i = 0; i < 64; i++) /* ties: half an ulp cut, even and odd kept bits */
        bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;
    const uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f7fffffu, 0x00000001u,
                                0x807fffffu, 0x7f7f8000u, 0x3f808000u, 0x3f818000u, 0xffffffffu};
    memcpy(bits + 64, special, sizeof special);
    float *src = (float *)bits;
    uint16_t *got = ops_xmalloc((size_t)n * sizeof *got);
    void *d32 = ops_put_raw(be, src, (size_t)n * 4), *d16 = ops_put_raw(be, got, (size_t)n * 2);
    be->convert(be, bk_buf(d16, DT_BF16), bk_buf(d32, DT_F32), n);
    be->download(be, got, d16, (size_t)n * 2);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int nan_ok = isnan(src[i]) && isnan(bf16_to_f32(got[i]));
        bad += got[i] != f32_to_bf16(src[i]) && !nan_ok;
    }
    CHECK(bad == 0);
    /* back to f32: exactly the widened bf16 */
    float *back = ops_xmalloc((size_t)n * sizeof *back);
    be->convert(be, bk_buf(d32, DT_F32), bk_buf(d16, DT_BF16), n);
    be->download(be, back, d32, (size_t)n * 4);
    int64_t bad2 = 0;
    for (int64_t i = 0; i < n; i++)
        bad2 += memcmp(&back[i], &(float){bf16_to_f32(got[i])}, 4) != 0;
    CHECK(bad2 == 0);
    bk_free(be, d32), bk_free(be, d16);
    free(got), free(back);

    /* every bf16 pattern -> f32 -> bf16: the identity (NaN stays NaN) */
    uint16_t *all = ops_xmalloc(65536 * sizeof *all), *rt = ops_xmalloc(65536 * sizeof *rt);
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    void *a16 = ops_put_raw(be, all, 65536 * 2), *a32 = bk_alloc(be, 65536 * 4, BK_MEM_OTHER, "round trip");
    void *b16 = bk_alloc(be, 65536 * 2, BK_MEM_OTHER, "round trip");
    be->convert(be, bk_buf(a32, DT_F32), bk_buf(a16, DT_BF16), 65536);
    be->convert(be, bk_buf(b16, DT_BF16), bk_buf(a32, DT_F32), 65536);
    be->download(be, rt, b16, 65536 * 2);
    int64_t bad3 = 0;
    for (int i = 0; i < 65536; i++) {
        int nan = isnan(bf16_to_f32(all[i]));
        bad3 += nan ? !isnan(bf16_to_f32(rt[i])) : rt[i] != all[i];
    }
    CHECK(bad3 == 0);
    /* same-dtype converts are copies */
    void *c16 = bk_alloc(be, 65536 * 2, BK_MEM_OTHER, "copy"), *c32 = bk_alloc(be, 65536 * 4, BK_MEM_OTHER, "copy");
    be->convert(be, bk_buf(c16, DT_BF16), bk_buf(a16, DT_BF16), 65536);
    be->convert(be, bk_buf(c32, DT_F32), bk_buf(a32, DT_F32), 65536);
    uint16_t *h16 = ops_xmalloc(65536 * 2);
    uint32_t *h32 = ops_xmalloc(65536 * 4), *w32 = ops_xmalloc(65536 * 4);
    be->download(be, h16, c16, 65536 * 2);
    be->download(be, h32, c32, 65536 * 4);
    be->download(be, w32, a32, 65536 * 4);
    CHECK(!memcmp(h16, all, 65536 * 2));
    CHECK(!memcmp(h32, w32, 65536 * 4));
    printf("convert: f32->bf16 = f32_to_bf16 (ties, specials) %s, ->f32 exact %s, all 65536 bf16 ->f32->bf16 %s, "
           "copies %s\n",
           bad ? "FAIL" : "ok", bad2 ? "FAIL" : "ok", bad3 ? "FAIL" : "ok",
           !memcmp(h16, all, 65536 * 2) && !memcmp(h32, w32, 65536 * 4) ? "ok" : "FAIL");
    bk_free(be, a16), bk_free(be, a32), bk_free(be, b16), bk_free(be, c16), bk_free(be, c32);
    free(all), free(rt), free(h16), free(h32), free(w32), free(bits);
}

/* add and scale compute in fp32 and round once to y's dtype: bit-exact against the host;
 * sumsq sums squares in double (blocks, then their sums): within n·2^-52 relative. */
static void test_pointwise_mixed(backend_t *be)
{
    ops_rng_t rng;
    ops_rng_seed(&rng, SEED ^ 0xadd);
    const int64_t n = 70001;
    const dtype_t dts[2] = {DT_F32, DT_BF16};
    int64_t bad = 0;
    double worst_sq = 0;
    for (int yi = 0; yi < 2; yi++)
        for (int xi = 0; xi < 2; xi++) {
            float *y = ops_rand(&rng, n, 3, 0), *x = ops_rand(&rng, n, 3, 0);
            bk_buf_t Y = ops_put(be, dts[yi], y, n), X = ops_put(be, dts[xi], x, n);
            be->add(be, Y, X, n);
            float *r = ops_get(be, Y, n);
            for (int64_t i = 0; i < n; i++) {
                float want = y[i] + x[i];
                bad += r[i] != (dts[yi] == DT_BF16 ? ops_round_bf16(want) : want);
            }
            be->scale(be, Y, -0.37f, n);
            float *s = ops_get(be, Y, n);
            for (int64_t i = 0; i < n; i++) {
                float want = r[i] * -0.37f;
                bad += s[i] != (dts[yi] == DT_BF16 ? ops_round_bf16(want) : want);
            }
            double ss = 0, want = 0, *acc = ops_put_raw(be, &ss, sizeof ss);
            be->sumsq(be, X, n, acc);
            be->download(be, &ss, acc, sizeof ss);
            bk_free(be, acc);
            for (int64_t i = 0; i < n; i++)
                want += (double)x[i] * x[i];
            double rel = fabs(ss - want) / want;
            worst_sq = rel > worst_sq ? rel : worst_sq;
            CHECK(rel <= (double)n * DBL_EPSILON);
            free(y), free(x), free(r), free(s);
            bk_free(be, Y.p), bk_free(be, X.p);
        }
    CHECK(bad == 0);
    printf("add, scale in the 4 dtype pairs: %lld elements differ from fp32-then-round; sumsq: worst %.2e (bound "
           "n*2^-52 = %.2e)\n",
           (long long)bad, worst_sq, (double)n * DBL_EPSILON);
}

/* ---- accumulating reductions, adamw_multi ------------------------------------------------------ */

/* xent and sumsq ADD into a double in the backend's memory (backend.h): from a non-zero
 * start, twice in a row, the result is start + Σ + Σ with each Σ the sum the op computes
 * from 0 (the one an accumulator starting at 0 receives), added in that order. */
static void test_accumulate(backend_t *be)
{
    ops_rng_t rng;
    ops_rng_seed(&rng, SEED ^ 0xacc);
    const int64_t n = 2 * 65536 + 5, rows = 7, V = 301;
    const double start = 0.3125 + 1e-9; /* not representable with few bits: the adds round */
    float *x = ops_rand(&rng, n, 3, 0), *lg = ops_rand(&rng, rows * V, 8, 0), *w = ops_xmalloc(rows * sizeof *w);
    for (int64_t i = 0; i < rows; i++)
        w[i] = i % 3 == 1 ? 0.0f : i % 3 == 2 ? 0.5f : 1.0f;
    int32_t *t = ops_rand_ids(&rng, rows, V);
    bk_buf_t X = ops_put(be, DT_F32, x, n), XB = ops_put(be, DT_BF16, x, n);
    float *L = ops_put_raw(be, lg, (size_t)(rows * V) * sizeof *lg), *W = ops_put_raw(be, w, rows * sizeof *w);
    int32_t *T = ops_put_raw(be, t, rows * sizeof *t);
    double zero = 0, one_sq = 0, one_xe = 0, got_sq = 0, got_xe = 0, want_sq, want_xe;
    double *a0 = ops_put_raw(be, &zero, sizeof zero), *a1 = ops_put_raw(be, &start, sizeof start);
    /* sumsq: f32, then the same values in bf16 (a second call on other data) */
    be->sumsq(be, X, n, a0);
    be->download(be, &one_sq, a0, sizeof one_sq);
    be->sumsq(be, X, n, a1);
    be->sumsq(be, XB, n, a1);
    be->download(be, &got_sq, a1, sizeof got_sq);
    be->zero(be, a0, sizeof zero);
    be->sumsq(be, XB, n, a0);
    double one_sq_b = 0;
    be->download(be, &one_sq_b, a0, sizeof one_sq_b);
    want_sq = (start + one_sq) + one_sq_b;
    /* xent: the loss only (grad_scale 0 leaves the logits as they were), twice */
    be->zero(be, a0, sizeof zero);
    be->upload(be, a1, &start, sizeof start);
    be->xent(be, L, T, W, rows, V, 0.0f, a0);
    be->download(be, &one_xe, a0, sizeof one_xe);
    be->xent(be, L, T, W, rows, V, 0.0f, a1);
    be->xent(be, L, T, W, rows, V, 0.0f, a1);
    be->download(be, &got_xe, a1, sizeof got_xe);
    want_xe = (start + one_xe) + one_xe;
    CHECK(be->sync(be) == 0);
    int ok_sq = !memcmp(&got_sq, &want_sq, sizeof got_sq) && one_sq > 0 && one_sq_b > 0;
    int ok_xe = !memcmp(&got_xe, &want_xe, sizeof got_xe) && one_xe > 0;
    CHECK(ok_sq);
    CHECK(ok_xe);
    printf("sumsq, xent add into a non-zero accumulator twice: (start + S1) + S2 bit for bit: sumsq %s, xent %s\n",
           ok_sq ? "ok" : "FAIL", ok_xe ? "ok" : "FAIL");
    bk_free(be, X.p), bk_free(be, XB.p), bk_free(be, L), bk_free(be, W), bk_free(be, T), bk_free(be, a0),
        bk_free(be, a1);
    free(x), free(lg), free(w), free(t);
}

/* adamw_multi against adamw segment by segment: the same bits in every dtype
 * configuration the table's adamw runs in, with nearest and both stochastic roundings. */
static void test_adamw_multi(void)
{
    setenv("FTK_FUSED", "adamw_multi", 1); /* off by default on the CPU, like every fused op */
    backend_t *be = backend_cpu_new();
    unsetenv("FTK_FUSED");
    CHECK(be && be->adamw_multi);
    if (!be || !be->adamw_multi)
        return;
    const ops_adamw_cfg_t *cfg = ops_adamw_cfgs;
    int64_t worst = 0;
    for (int k = 0; k < 4; k++)
        for (int sr = BK_ROUND_NEAREST; sr <= BK_SROUND_HASH3; sr++) {
            int64_t d = ops_adamw_multi_diff(be, be, cfg[k].st, cfg[k].gt, sr, 3 + k, SEED ^ (uint64_t)(16 * k + sr));
            if (d != 0)
                printf("  adamw_multi %s %s: %lld bytes differ\n", cfg[k].name, ops_sround_name(sr),
                       (long long)d);
            CHECK(d == 0);
            worst = d > worst || d < 0 ? d : worst;
        }
    printf("adamw_multi = adamw per segment (11 segments: odd lengths, index0 offsets, an empty one, gaps, 8-element "
           "multiples), f32/bf16/mixed/narrow x nearest/stochastic/stochastic3: %s\n",
           worst == 0 ? "same bits" : "DIFFERENT");
    backend_free(be);
}

/* ---- streams, events, memory, the planning backend --------------------------------------- */

static void test_streams(backend_t *be)
{
    bk_stream_t *s = be->stream_new(be);
    bk_event_t *e = be->event_new(be);
    CHECK(s != NULL && e != NULL);
    CHECK(be->stream_native(be, s) == NULL && be->stream_native(be, NULL) == NULL);
    float y[5] = {1, 2, 3, 4, 5}, x[5] = {10, 20, 30, 40, 50}, r[5];
    bk_buf_t Y = bk_buf(ops_put_raw(be, y, sizeof y), DT_F32), X = bk_buf(ops_put_raw(be, x, sizeof x), DT_F32);
    be->set_stream(be, s);
    be->add(be, Y, X, 5);
    be->event_record(be, e);
    be->set_stream(be, NULL);
    be->event_wait(be, e);
    be->add(be, Y, X, 5); /* the second add sees the first: ops have finished when they return */
    CHECK(be->event_sync(be, e) == 0);
    CHECK(be->sync(be) == 0);
    be->download(be, r, Y.p, sizeof r);
    CHECK(r[0] == 21 && r[4] == 105);
    be->event_free(be, e);
    be->stream_free(be, s);
    bk_free(be, Y.p), bk_free(be, X.p);
    printf("streams and events: valid handles, ops in issue order, sync 0\n");
}

static void test_alloc(void)
{
    backend_t *be = backend_cpu_new();
    CHECK(be != NULL);
    if (!be)
        return;
    const bk_mem_t *m = bk_mem(be);
    const int64_t W = (int64_t)BK_CPU_WORKSPACE_BYTES;
    CHECK(m->in_use == W && m->peak == W && m->cls[BK_MEM_WORKSPACE] == W && m->allocs == 1);
    char *a = bk_alloc(be, 1000, BK_MEM_WEIGHTS, "a"), *b = bk_alloc(be, 3000, BK_MEM_GRADS, "b");
    CHECK(a && b);
    int zero = 1;
    for (int i = 0; i < 3000 && b; i++)
        zero &= b[i] == 0;
    CHECK(zero); /* bk_alloc() memory is zeroed */
    CHECK(m->in_use == W + 4000 && m->peak == W + 4000 && m->cls[BK_MEM_WEIGHTS] == 1000 &&
          m->cls[BK_MEM_GRADS] == 3000 && m->allocs == 3);
    bk_free(be, a);
    void *c = bk_alloc(be, 500, BK_MEM_ACTS, "c");
    CHECK(m->in_use == W + 3500 && m->peak == W + 4000 && m->cls[BK_MEM_WEIGHTS] == 0 && m->cls[BK_MEM_ACTS] == 500);
    CHECK(m->at_peak[BK_MEM_WEIGHTS] == 1000 && m->at_peak[BK_MEM_GRADS] == 3000 && m->at_peak[BK_MEM_ACTS] == 0 &&
          m->at_peak[BK_MEM_WORKSPACE] == W);
    void *d = bk_alloc(be, 5000, BK_MEM_OPTIM, "d");
    CHECK(m->peak == W + 8500 && m->at_peak[BK_MEM_OPTIM] == 5000 && m->at_peak[BK_MEM_WEIGHTS] == 0 &&
          m->at_peak[BK_MEM_ACTS] == 500 && m->allocs == 4);
    bk_free(be, NULL); /* a no-op */
    /* impossible: NULL, the message, the accounting unchanged */
    size_t huge = (size_t)1 << 62;
    void *x = bk_alloc(be, huge, BK_MEM_ACTS, "the impossible block");
    char want[128];
    snprintf(want, sizeof want, "out of memory on cpu allocating the impossible block (%zu bytes", huge);
    CHECK(x == NULL && strstr(ftk_err_msg(), want) == ftk_err_msg());
    CHECK(m->in_use == W + 8500 && m->allocs == 4 && m->peak == W + 8500);
    printf("bk_alloc: in_use/peak/per class/at_peak ok; 2^62 bytes: \"%s\"\n", ftk_err_msg());
    (void)c, (void)d;
    backend_free(be); /* frees b, c, d and the workspace: the leak check would see them otherwise */
}

/* cuda_mem.h's page model at its edges, and the scratch sizing's floors. */
static void test_cuda_mem(void)
{
    bk_cuda_mem_t m = {0};
    bk_cuda_mem_add(&m, BK_CUDA_SMALL, 1); /* 1 MiB: a piece of a shared page */
    bk_cuda_mem_add(&m, 0, 1);             /* nothing asked: still a piece */
    CHECK(m.large == 0 && m.small == BK_CUDA_SMALL + BK_CUDA_SMALL_ALIGN && bk_cuda_mem_total(&m) == BK_CUDA_PAGE);
    bk_cuda_mem_add(&m, BK_CUDA_SMALL + 1, 1); /* over 1 MiB: a page of its own */
    bk_cuda_mem_add(&m, 3 * BK_CUDA_PAGE + 1, 1);
    CHECK(m.large == 5 * BK_CUDA_PAGE && bk_cuda_mem_total(&m) == 6 * BK_CUDA_PAGE);
    bk_cuda_mem_add(&m, BK_CUDA_SMALL + 1, -1);
    bk_cuda_mem_add(&m, 3 * BK_CUDA_PAGE + 1, -1);
    bk_cuda_mem_add(&m, BK_CUDA_SMALL, -1);
    bk_cuda_mem_add(&m, 0, -1);
    CHECK(m.large == 0 && m.small == 0 && bk_cuda_mem_total(&m) == 0);
    int64_t tmp, seg, map, side;
    bk_reserve_t r = {.tokens = 4096, .width = 4096, .heads = 32, .adamw_elems = 1 << 20, .adamw_segs = 3};
    bk_cuda_scratch(&r, (int64_t)BK_CUDA_WORKSPACE_BYTES, 1, &tmp, &seg, &map, &side);
    CHECK(tmp == (int64_t)BK_CUDA_WORKSPACE_BYTES && seg == 4097 * 8 && map == (256 + 3) * 4 && side == 0);
    r.unit_elems = BK_CUDA_SUMSQ_BLOCK + 1; /* two blocks of sumsq beside the backward */
    bk_cuda_scratch(&r, (int64_t)BK_CUDA_WORKSPACE_BYTES, 1, &tmp, &seg, &map, &side);
    CHECK(side == 2 * 8);
    r.heads = 4096; /* attention's D (a float per token and head) over the workspace's size */
    bk_cuda_scratch(&r, (int64_t)BK_CUDA_WORKSPACE_BYTES, 0, &tmp, &seg, &map, &side);
    CHECK(tmp == (int64_t)4096 * 4096 * 4 && tmp > (int64_t)BK_CUDA_WORKSPACE_BYTES && map == 0);
}

static void test_plan(void)
{
    const char *dev[2] = {"cpu", "cuda"};
    const size_t ws[2] = {BK_CPU_WORKSPACE_BYTES, BK_CUDA_WORKSPACE_BYTES};
    for (int k = 0; k < 2; k++) {
        backend_t *be = backend_plan_new(dev[k]);
        CHECK(be != NULL);
        if (!be)
            continue;
        const bk_mem_t *m = bk_mem(be);
        CHECK(m->in_use == (int64_t)ws[k] && m->cls[BK_MEM_WORKSPACE] == (int64_t)ws[k]);
        int64_t tb = (int64_t)1 << 40;
        void *p = bk_alloc(be, (size_t)tb, BK_MEM_WEIGHTS, "a terabyte");
        void *q = bk_alloc(be, 1000, BK_MEM_ACTS, "q");
        CHECK(p && q && p != q && m->in_use == (int64_t)ws[k] + tb + 1000 && m->cls[BK_MEM_WEIGHTS] == tb);
        bk_free(be, p);
        CHECK(m->in_use == (int64_t)ws[k] + 1000 && m->peak == (int64_t)ws[k] + tb + 1000);
        /* the device's count: the bytes on the CPU; on cuda the driver's pages (cuda_mem.h):
         * the workspace's whole pages, q a 512-byte piece of a shared page */
        if (k == 0)
            CHECK(m->dev_in_use == m->in_use && m->dev_peak == m->peak);
        else
            CHECK(be->mem_pages && be->reserve && m->dev_in_use == (int64_t)ws[k] + BK_CUDA_PAGE &&
                  m->dev_peak == (int64_t)ws[k] + tb + BK_CUDA_PAGE);
        /* ops do nothing: they would fault on these never-mapped addresses otherwise */
        float host[4] = {1, 2, 3, 4};
        int64_t seg[2] = {0, 4};
        bk_buf_t Q = bk_buf(q, DT_F32), H = bk_buf(q, DT_BF16);
        be->upload(be, q, host, sizeof host);
        be->download(be, host, q, sizeof host);
        CHECK(host[0] == 1 && host[3] == 4);
        be->zero(be, q, 16), be->copy(be, q, q, 16);
        be->convert(be, H, Q, 4);
        be->matmul(be, 0, 1, 300, 300, 300, 1, Q, Q, 0, H);
        be->embed_fwd(be, Q, q, Q, 4, 1), be->embed_bwd(be, Q, q, Q, 4, 1), be->rows_scatter(be, Q, q, Q, 4, 1);
        be->rmsnorm_fwd(be, Q, q, Q, Q, 4, 1, 1e-5f), be->rmsnorm_bwd(be, Q, Q, Q, Q, Q, q, 4, 1);
        be->rope(be, Q, q, 4, 1, 2, 1e4f, 0);
        be->attn_fwd(be, Q, q, Q, Q, Q, seg, 1, 1, 1, 2);
        be->attn_bwd(be, Q, Q, Q, Q, Q, Q, Q, Q, q, seg, 1, 1, 1, 2);
        be->attn_cached(be, Q, Q, Q, Q, 1, 3, 1, 1, 2);
        be->swiglu_fwd(be, Q, Q, Q, 4), be->swiglu_bwd(be, Q, Q, Q, Q, Q, 4);
        be->add(be, Q, Q, 4), be->scale(be, Q, 2, 4);
        /* the fused ops: as the planned device offers them (FTK_FUSED's default) */
        CHECK(!be->glu_fwd == !k && !be->qkv_rope == !k && !be->add_rmsnorm_fwd == !k && !be->rope_qk == !k &&
              !be->adamw_multi == !k);
        if (k) {
            be->rope_qk(be, Q, Q, q, 4, 1, 1, 2, 1e4f, 0);
            be->qkv_rope(be, Q, Q, Q, Q, q, 4, 1, 1, 2, 1e4f, 1);
            be->glu_fwd(be, Q, Q, 4, 1), be->glu_bwd(be, Q, Q, Q, 4, 1);
            be->add_rmsnorm_fwd(be, Q, Q, q, Q, Q, Q, 4, 1, 1e-5f);
        }
        bk_adamw_t h = adam_h(1, 0, 1);
        be->adamw(be, Q, Q, Q, Q, 4, &h);
        be->xent(be, q, q, q, 4, 1, 1, (double *)q), be->sumsq(be, Q, 4, (double *)q);
        bk_adamw_seg_t aseg = {.p = q, .m = q, .v = q, .g = q, .n = 4};
        if (k)
            be->adamw_multi(be, &aseg, 1, DT_F32, DT_F32, &h);
        CHECK(be->sync(be) == 0);
        bk_stream_t *s = be->stream_new(be);
        bk_event_t *e = be->event_new(be);
        CHECK(s && e);
        be->set_stream(be, s), be->event_record(be, e), be->event_wait(be, e);
        CHECK(be->event_sync(be, e) == 0);
        be->event_free(be, e), be->stream_free(be, s);
        backend_free(be);
    }
    CHECK(backend_plan_new("tpu") == NULL && strstr(ftk_err_msg(), "tpu"));
    printf("planning backend (cpu, cuda): creation workspace counted, 1 TiB counted not allocated, ops do nothing\n");
}

/* ---- fused ops against their sequences ------------------------------------------------- */

/* Every case of ops_fused_table in f32 and bf16: the fused op on an instance made with
 * FTK_FUSED=all against its sequence of plain ops on the default instance (which has no
 * fused op): the same bits, every output written. */
static void test_fused_ops(backend_t *be)
{
    CHECK(!be->rope_qk && !be->qkv_rope && !be->glu_fwd && !be->glu_bwd && !be->add_rmsnorm_fwd && !be->add_sumsq);
    setenv("FTK_FUSED", "all", 1);
    backend_t *fb = backend_cpu_new();
    unsetenv("FTK_FUSED");
    CHECK(fb != NULL);
    if (!fb)
        return;
    int runs = 0, differ = 0, missing = 0;
    for (int k = 0; k < ops_fused_len; k++) {
        const ops_fcase_t *c = &ops_fused_table[k];
        char name[160];
        ops_fcase_name(c, name, sizeof name);
        if (!ops_fused_has(fb, c)) {
            missing++;
            fprintf(stderr, "%s: not on the CPU backend\n", name);
            continue;
        }
        for (int b = 0; b < 2; b++) {
            dtype_t dt = b ? DT_BF16 : DT_F32;
            ops_result_t rs, rf;
            int ok = ops_fused_run(be, c, dt, 0, SEED + (uint64_t)k, &rs) == 0 &&
                     ops_fused_run(fb, c, dt, 1, SEED + (uint64_t)k, &rf) == 0;
            CHECK(ok);
            if (!ok)
                continue;
            runs++;
            for (int o = 0; o < rs.n_out; o++) {
                ops_err_t e = ops_compare(rs.out[o].v, rf.out[o].v, rs.out[o].n);
                if (e.differ || e.nan) {
                    differ++;
                    fprintf(stderr, "%s %s: output %s: %lld elements differ from the sequence, %lld NaN\n", name,
                            dtype_name(dt), rs.out[o].name, (long long)e.differ, (long long)e.nan);
                }
            }
            if (rs.has_scalar != rf.has_scalar || memcmp(&rs.scalar, &rf.scalar, sizeof rs.scalar)) {
                differ++;
                fprintf(stderr, "%s %s: the sum %.17g, the sequence's %.17g\n", name, dtype_name(dt), rf.scalar,
                        rs.scalar);
            }
            ops_result_free(&rs);
            ops_result_free(&rf);
        }
    }
    CHECK(differ == 0 && missing == 0);
    CHECK(bk_mem(fb)->allocs == 1);
    backend_free(fb);
    printf("fused ops (rope_qk, qkv_rope, glu_fwd/bwd, add_rmsnorm_fwd, add_sumsq): %d runs (f32, bf16) against their "
           "sequences: "
           "%d with outputs whose bits differ\n",
           runs, differ);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    ftk_set_tool("test_ops");
    if (getenv("FTK_SEED"))
        SEED = strtoull(getenv("FTK_SEED"), NULL, 10);
    printf("seed %llu (FTK_SEED=N for others)\n", (unsigned long long)SEED);
    omp_set_num_threads(2);
    backend_t *be = backend_cpu_new();
    if (!be) {
        fprintf(stderr, "backend_cpu_new: %s\n", ftk_err_msg());
        return 1;
    }
    test_table(be);
    test_fd(be);
    test_adamw_formula(be);
    test_adamw_nearest(be);
    test_clip_coef(be);
    test_adamw_stochastic(be);
    test_convert(be);
    test_pointwise_mixed(be);
    test_accumulate(be);
    test_adamw_multi();
    test_streams(be);
    test_fused_ops(be);
    CHECK(bk_mem(be)->allocs == 1); /* every test freed what it allocated: only the workspace */
    CHECK(be->sync(be) == 0);
    backend_free(be);
    test_alloc();
    test_cuda_mem();
    test_plan();
    TEST_END();
}
