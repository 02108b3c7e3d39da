/* ops_impl.h — what the op descriptors (ops_defs.c) are written with, inside tests/ops:
 * the context of one run of a case (its backend, the inputs' generator, what to free) with
 * helpers that keep what they allocate until the run ends, and the finite-difference
 * machinery of the gradient checks (ops_grad.c). Not for the programs: they see
 * ops_table.h only. Helpers exit(1) with a message when memory runs out (test code). */
#ifndef FTK_OPS_IMPL_H
#define FTK_OPS_IMPL_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_table.h"

/* One run: the backend, the inputs' generator, and what to free at the end. */
struct ops_ctx {
    backend_t *be;
    ops_rng_t rng;
    int full;
    int64_t off; /* the case's offset */
    void *dev[16], *host[16];
    int n_dev, n_host;
    ops_result_t *r;
};

static inline void *keep_host(ops_ctx_t *R, void *p)
{
    R->host[R->n_host++] = p;
    return p;
}
static inline void *keep_dev(ops_ctx_t *R, void *p)
{
    R->dev[R->n_dev++] = p;
    return p;
}
/* Random host values (bf16 ones unless full), freed with the run. */
static inline float *hrand(ops_ctx_t *R, int64_t n, float scale)
{
    return keep_host(R, ops_rand(&R->rng, n, scale, !R->full));
}
static inline float *hzeros(ops_ctx_t *R, int64_t n)
{
    float *p = keep_host(R, ops_xmalloc((size_t)n * sizeof *p));
    memset(p, 0, (size_t)n * sizeof *p);
    return p;
}
/* host's n values on the device in dt (host rounded to dt in place), R->off elements into
 * their allocation. */
static inline bk_buf_t put(ops_ctx_t *R, dtype_t dt, float *host, int64_t n)
{
    float *h = ops_xmalloc((size_t)(n + R->off) * sizeof *h);
    for (int64_t i = 0; i < R->off; i++)
        h[i] = NAN;
    memcpy(h + R->off, host, (size_t)n * sizeof *h);
    bk_buf_t b = ops_put(R->be, dt, h, n + R->off);
    memcpy(host, h + R->off, (size_t)n * sizeof *h);
    free(h);
    keep_dev(R, b.p);
    return bk_at(b, R->off);
}
static inline bk_buf_t poisoned(ops_ctx_t *R, dtype_t dt, int64_t n)
{
    bk_buf_t b = ops_nan(R->be, dt, n + R->off);
    keep_dev(R, b.p);
    return bk_at(b, R->off);
}
static inline void *put_raw(ops_ctx_t *R, const void *host, size_t bytes)
{
    return keep_dev(R, ops_put_raw(R->be, host, bytes));
}

static inline void output(ops_ctx_t *R, const char *name, bk_buf_t b, int64_t n, int rounds)
{
    ops_out_t *o = &R->r->out[R->r->n_out++];
    o->name = name;
    o->v = ops_get(R->be, b, n);
    o->n = n;
    o->dt = b.dt;
    o->rounds = rounds;
}

/* The inputs' dtype and the accumulator's (ops_table.h). */
static inline dtype_t in_dt(ops_cfg_t cfg) { return cfg == OPS_BF16 || cfg == OPS_MIXED ? DT_BF16 : DT_F32; }
static inline dtype_t acc_dt(ops_cfg_t cfg) { return cfg == OPS_BF16 || cfg == OPS_NARROW ? DT_BF16 : DT_F32; }

/* ---- gradient checks by finite differences (ops_grad.c) -------------------------------- */

/* Each backward op against central differences of its forward, in fp32 on the CPU backend:
 * the scalar L = Σ w·y over the forward's output (the loss itself for xent) is evaluated
 * in double at x ± h·e for a random direction e of each input in turn, and the derivative
 * (L(x+he) − L(x−he)) / 2h at h = 2^-7 and 2^-8 is Richardson-extrapolated (truncation
 * O(h^4), below 2^-28 here). The directions take bf16 values in ±[0.5, 1), so x ± h·e is
 * exact in fp32 for the bf16-valued inputs. The error against the analytic Σ g·e is taken
 * relative to S + T: S = Σ|g·e| (the size of the derivative's terms), T = Σ|w·y| (of L's).
 * What remains is the forward's fp32 rounding divided by the step: outputs within k·2^-24
 * of their terms make |ΔL| ≤ k·2^-24·T, and (4·d(h/2) − d(h))/3 amplifies ΔL by at most
 * 3/h = 384, so the error is at most k·2.3e-5. The bound OPS_FD_BOUND = 2^-12 allows k = 10.
 * A wrong gradient, even in one segment or one head of many, errs by a fraction of S. */
typedef struct ops_fd ops_fd_t;
struct ops_fd {
    backend_t *be;
    const ops_case_t *c;
    int n_in;
    const char *in_name[3];
    float *x[3]; /* the inputs, host */
    int64_t len[3];
    float *e[3];       /* a direction for each */
    float *w;          /* the weights of the outputs in L */
    int32_t *ids;      /* embed's ids, xent's targets */
    double (*loss)(ops_fd_t *f, float *const *x); /* L at inputs x; sets T */
    double T;          /* Σ|w·y| of the last evaluation: the size of L's terms */
    float *scratch[3]; /* x + t·e */
};

/* Σ w·y, and Σ|w·y| into f->T. */
double ops_fd_wdot(ops_fd_t *f, const float *y, int64_t n);
/* Checks the gradients g[i] of every input against finite differences along f->e[i], into
 * gs (a failure is also told on stderr). */
void ops_fd_check(ops_fd_t *f, float *const *g, ops_grad_t *gs);
/* Input i of f: len values of scale sc, and a direction. */
void ops_fd_input(ops_fd_t *f, ops_rng_t *rng, const char *name, int64_t len, float sc);
void ops_fd_free(ops_fd_t *f);
/* n floats on be in a new f32 buffer (exits when the backend has no memory). */
bk_buf_t ops_fd_up(backend_t *be, const float *x, int64_t n);

#endif
