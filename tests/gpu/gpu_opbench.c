/* gpu_opbench.c — the CUDA backend's ops at Llama-2-7B's shapes (8 rows of 512 tokens):
 * each memory-bound op's achieved bandwidth as a fraction of a device-to-device copy
 * measured in the same run, in fp32 and, where the op has one, bf16 storage; attention's
 * and the matrix products' TFLOP/s, the products with bf16 operands, and with fp32
 * operands in bf16 (the default), TF32 and exact fp32 (FTK_CUDA_MATMUL, one backend
 * instance each).
 *
 * Bytes are the fewest an op must move (each input read once, each output written
 * once); time is the median of 9 timed batches of repetitions after a warm-up, measured on
 * the host around the batch and a sync() (the ops are asynchronous on one stream).
 * Each op's rows are its descriptor's (tests/ops/ops_defs.c: the call and the elements it
 * moves), then the fused ops (FTK_FUSED) get rows of their own where the instance has them.
 * Random inputs, never zeros. Run by `make bench` where a GPU is present; exit 77 without.
 * Built with -DOPBENCH_SMALL (Makefile: gpu_opbench_emu, over the host emulation of CUDA,
 * tests/gpu/emu) it runs every row at small shapes: a run of the harness itself, whose
 * figures mean nothing but must all be positive and finite (make test). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/backend.h"
#include "../../kernels/sround.h"
#include "../../libcommon/log.h"
#include "../../libcommon/timer.h"
#include "../ops/ops_table.h"

static double copy_bw;

static void fail(void)
{
    fprintf(stderr, "gpu_opbench: %s\n", ftk_err_msg());
    exit(1);
}

/* n random values in [-scale, scale] of type dt on be; in [0, -scale] for a negative scale
 * (AdamW's second moment: a square). */
static bk_buf_t dev_rnd(backend_t *be, int64_t n, float scale, dtype_t dt)
{
    size_t es = dtype_size(dt);
    float *h = malloc((size_t)n * sizeof *h);
    uint16_t *hb = dt == DT_BF16 ? malloc((size_t)n * sizeof *hb) : NULL;
    if (!h || (dt == DT_BF16 && !hb)) {
        ftk_err_set("out of host memory");
        fail();
    }
    uint64_t s = 0x2545f4914f6cdd1dULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        h[i] = (float)(scale < 0 ? -u * scale : (u * 2 - 1) * scale);
    }
    for (int64_t i = 0; hb && i < n; i++)
        hb[i] = f32_to_bf16(h[i]);
    void *d = bk_alloc(be, (size_t)n * es, BK_MEM_OTHER, "benchmark input");
    if (!d)
        fail();
    be->upload(be, d, hb ? (const void *)hb : (const void *)h, (size_t)n * es);
    free(hb);
    free(h);
    return bk_buf(d, dt);
}

static void *dev_alloc(backend_t *be, size_t bytes)
{
    void *d = bk_alloc(be, bytes, BK_MEM_OTHER, "benchmark input");
    if (!d)
        fail();
    return d;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of one call of op(ctx) on be. */
typedef void (*op_fn)(void *ctx);
static double time_op(backend_t *be, op_fn op, void *ctx)
{
    int reps = 1;
    op(ctx);
    if (be->sync(be) < 0)
        fail();
    for (;;) { /* batches of at least 20 ms */
        double t0 = time_now();
        for (int i = 0; i < reps; i++)
            op(ctx);
        be->sync(be);
        if (time_now() - t0 > 0.02 || reps >= 1 << 14)
            break;
        reps *= 2;
    }
    double t[9];
    for (int k = 0; k < 9; k++) {
        double t0 = time_now();
        for (int i = 0; i < reps; i++)
            op(ctx);
        be->sync(be);
        t[k] = (time_now() - t0) / reps;
    }
    if (be->sync(be) < 0)
        fail();
    qsort(t, 9, sizeof *t, cmp_d);
    return t[4];
}

static void row_bw(const char *name, double s, double bytes)
{
    double bw = bytes / s;
    printf("%-40s %9.3f ms %8.0f GB/s %6.1f%% of copy\n", name, s * 1e3, bw / 1e9, 100 * bw / copy_bw);
}

static void row_flops(const char *name, double s, double flops)
{
    printf("%-40s %9.3f ms %8.1f TFLOP/s\n", name, s * 1e3, flops / s / 1e12);
}

/* ---- the ops at the benchmark's shapes ---- */
#ifndef OPBENCH_SMALL
enum { ROWS = 8, LEN = 512, D = 4096, F = 11008, H = 32, HD = 128, V = 32000, XC = 256 };
#else
enum { ROWS = 2, LEN = 64, D = 128, F = 352, H = 2, HD = 64, V = 512, XC = 64 };
#endif
enum { N = ROWS * LEN };
static const int64_t nf = (int64_t)N * F, nd = (int64_t)N * D, nq = (int64_t)N * H * HD;
static int64_t seg[ROWS + 1]; /* the rows' starts, and N */

/* The buffers of one storage dtype (tests/ops's ops_bench_t); a and b are also the weight
 * [F, D] and its product. */
typedef ops_bench_t set_t;

static set_t S[2]; /* fp32, bf16 storage; on one instance */
static float *rstd, *logits, *wts;
static double *acc; /* what sumsq and xent add into */
/* adamw_multi over the same nf elements as adamw, cut into AM_SEGS tensors of unequal
 * lengths (per storage dtype) */
enum { AM_SEGS = 9 };
static bk_adamw_seg_t am_segs[2][AM_SEGS];
static int32_t *ids, *pos, *tgt;
static int32_t *ids_rep; /* one token in 7 the same id, as padding or "the" would be */
static bk_buf_t dw32; /* an fp32 gradient [F, D] for the bf16 weight-gradient product */

/* fp32 operands on the instances made with FTK_CUDA_MATMUL=tf32 and =fp32 */
typedef struct {
    backend_t *be;
    bk_buf_t x, w, y;
} mm_t;

static void op_copy(void *c)
{
    set_t *s = c;
    s->be->copy(s->be, s->b.p, s->a.p, (size_t)nf * 4);
}
static void op_to_bf16(void *c)
{
    (void)c;
    S[0].be->convert(S[0].be, S[1].b, S[0].a, nf);
}
static void op_to_f32(void *c)
{
    (void)c;
    S[0].be->convert(S[0].be, S[0].b, S[1].a, nf);
}
static void op_rope_qk(void *c)
{
    set_t *s = c;
    s->be->rope_qk(s->be, s->q, s->k, pos, N, H, H, HD, 10000.0f, 0);
}
/* The fused ops (FTK_FUSED) on buffers of their own, per storage dtype: gate/up side by
 * side [N, 2F] and its gradient, the q/k/v product [N, 3·H·HD]. */
static bk_buf_t gu2[2], dgu2[2], qkv2[2];
static void op_glu_fwd(void *c)
{
    set_t *s = c;
    s->be->glu_fwd(s->be, s->c, gu2[s->dt == DT_BF16], N, F);
}
static void op_glu_bwd(void *c)
{
    set_t *s = c;
    s->be->glu_bwd(s->be, dgu2[s->dt == DT_BF16], s->a, gu2[s->dt == DT_BF16], N, F);
}
static void op_qkv_rope(void *c)
{
    set_t *s = c;
    s->be->qkv_rope(s->be, qkv2[s->dt == DT_BF16], s->q, s->k, s->vv, pos, N, H, H, HD, 10000.0f, 0);
}
static void op_qkv_rope_inv(void *c)
{
    set_t *s = c;
    s->be->qkv_rope(s->be, qkv2[s->dt == DT_BF16], s->dq, s->dk, s->dv, pos, N, H, H, HD, 10000.0f, 1);
}
static void op_add_rms(void *c)
{
    set_t *s = c;
    s->be->add_rmsnorm_fwd(s->be, s->y, s->dq, rstd, s->x, s->o, s->w, N, D, 1e-5f);
}
static void op_adamw_multi(void *c)
{
    set_t *s = c;
    s->be->adamw_multi(s->be, am_segs[s == &S[1]], AM_SEGS, s->dt, s->dt, &s->h);
}
/* the bf16 segments on any instance (the FTK_CUDA_VEC=0 one below) */
static void op_adamw_multi_bf16(void *c)
{
    set_t *s = c;
    s->be->adamw_multi(s->be, am_segs[1], AM_SEGS, DT_BF16, DT_BF16, &s->h);
}
/* Σg² as a step takes it: a sumsq per unit into one double (SQ_UNITS units over the nf
 * elements of a, ragged), each unit's partial sums summed on the device (add_parts) */
enum { SQ_UNITS = 34 };
static void op_sumsq_units(void *c)
{
    set_t *s = c;
    for (int u = 0; u < SQ_UNITS; u++) {
        int64_t a = nf * u / SQ_UNITS, b = nf * (u + 1) / SQ_UNITS;
        s->be->sumsq(s->be, bk_at(s->a, a), b - a, acc);
    }
}
/* The owned gradient's last add with its Σg² (add_sumsq), and the two passes it replaces */
static void op_add_sumsq(void *c)
{
    set_t *s = c;
    s->be->add_sumsq(s->be, s->b, s->a, nf, acc);
}
static void op_add_then_sumsq(void *c)
{
    set_t *s = c;
    s->be->add(s->be, s->b, s->a, nf);
    s->be->sumsq(s->be, s->b, nf, acc);
}
static void op_xent(void *c)
{
    set_t *s = c;
    s->be->xent(s->be, logits, tgt, wts, XC, V, 1.0f, acc);
}
static void op_attn_fwd(void *c)
{
    set_t *s = c;
    s->be->attn_fwd(s->be, s->o, s->lse, s->q, s->k, s->vv, seg, ROWS, H, H, HD);
}
static void op_attn_bwd(void *c)
{
    set_t *s = c;
    s->be->attn_bwd(s->be, s->dq, s->dk, s->dv, s->o, s->q, s->k, s->vv, s->o, s->lse, seg, ROWS, H, H, HD);
}
/* x·Wᵀ [N, D]·[F, D]ᵀ: the MLP's up projection; C of the operands' dtype */
static void op_mm_up(void *c)
{
    set_t *s = c;
    s->be->matmul(s->be, 0, 1, N, F, D, 1, s->x, s->a, 0, s->b);
}
static void op_mm_up_fp32(void *c)
{
    mm_t *t = c;
    t->be->matmul(t->be, 0, 1, N, F, D, 1, t->x, t->w, 0, t->y);
}
/* dW += dyᵀ·x [F, N]·[N, D]: into fp32 (the gradient of fp32 and bf16-mixed) */
static void op_mm_wgrad(void *c)
{
    set_t *s = c;
    s->be->matmul(s->be, 1, 0, F, D, N, 1, s->b, s->x, 1, s->dt == DT_F32 ? s->a : dw32);
}

static void fill(set_t *s, backend_t *be, dtype_t dt)
{
    s->be = be;
    s->dt = dt;
    s->N = N, s->D = D, s->F = F, s->H = H, s->HD = HD;
    s->a = dev_rnd(be, nf, 1, dt);
    s->b = dev_rnd(be, nf, 1, dt);
    s->c = dev_rnd(be, nf, 1, dt);
    s->m = dev_rnd(be, nf, 1e-3f, dt);
    s->v = dev_rnd(be, nf, -1e-6f, dt); /* a second moment: positive */
    s->x = dev_rnd(be, nd, 1, dt);
    s->y = dev_rnd(be, nd, 1, dt);
    s->w = dev_rnd(be, (int64_t)V * D, 1, dt); /* embedding table; its first D: norm weights */
    s->q = dev_rnd(be, nq, 1, dt);
    s->k = dev_rnd(be, nq, 1, dt);
    s->vv = dev_rnd(be, nq, 1, dt);
    s->o = dev_rnd(be, nq, 1, dt);
    s->dq = dev_rnd(be, nq, 1, dt);
    s->dk = dev_rnd(be, nq, 1, dt);
    s->dv = dev_rnd(be, nq, 1, dt);
    s->lse = dev_rnd(be, (int64_t)N * H, 1, DT_F32).p;
    bk_adamw_t h = {.lr = 1e-5f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .wd = 0.1f, .gscale = 1.0f,
                    .bc1 = 0.5, .bc2 = 0.3, .key = 0x5eed};
    s->h = h;
    /* a consistent lse for the backward */
    be->attn_fwd(be, s->o, s->lse, s->q, s->k, s->vv, seg, ROWS, H, H, HD);
}

/* An instance whose fp32 products use FTK_CUDA_MATMUL=mode. */
/* A second CUDA instance made with var=val (the backend reads its switches at creation),
 * or NULL with ftk_err_msg() saying why. */
static backend_t *instance_with_or_null(const char *var, const char *val)
{
    setenv(var, val, 1);
    backend_t *be = backend_cuda_new(0);
    unsetenv(var);
    return be;
}

static backend_t *instance_with(const char *var, const char *val)
{
    backend_t *be = instance_with_or_null(var, val);
    if (!be)
        fail();
    return be;
}

static void mm_instance(mm_t *t, const char *mode)
{
    t->be = instance_with("FTK_CUDA_MATMUL", mode);
    t->x = dev_rnd(t->be, nd, 1, DT_F32);
    t->w = dev_rnd(t->be, nf, 1, DT_F32);
    t->y = dev_rnd(t->be, nf, 1, DT_F32);
}

static const char *const dt_label[2] = {"fp32", "bf16"};

/* One row per storage dtype: name, the op, and the elements it must move. */
static void rows_bw(const char *name, op_fn op, double elems)
{
    for (int k = 0; k < 2; k++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s", name, dt_label[k]);
        row_bw(label, time_op(S[k].be, op, &S[k]), elems * (double)dtype_size(S[k].dt));
    }
}

/* An op's rows from its descriptor, timed on s. */
typedef struct {
    const ops_perf_t *p;
    set_t *s;
} perf_ctx_t;
static void perf_call(void *c)
{
    perf_ctx_t *x = c;
    x->p->call(x->s);
}
static double time_perf(const ops_perf_t *p, set_t *s)
{
    perf_ctx_t x = {p, s};
    return time_op(s->be, perf_call, &x);
}
static double perf_bytes(const ops_perf_t *p, const set_t *s) { return ops_perf_elems(p, s) * (double)dtype_size(s->dt); }

int main(void)
{
    ftk_set_tool("gpu_opbench");
    for (int r = 0; r <= ROWS; r++)
        seg[r] = (int64_t)r * LEN;
    if (backend_cuda_devices() == 0) {
        printf("skipped (no GPU)\n");
        return 77;
    }
    unsetenv("FTK_CUDA_MATMUL"); /* the first instance's fp32 products: the default, bf16 */
    backend_t *G = backend_cuda_new(0);
    if (!G)
        fail();
    fill(&S[0], G, DT_F32);
    fill(&S[1], G, DT_BF16);
    dw32 = dev_rnd(G, nf, 1, DT_F32);
    rstd = dev_rnd(G, N, 1, DT_F32).p;
    logits = dev_rnd(G, (int64_t)XC * V, 4, DT_F32).p;
    wts = dev_alloc(G, XC * sizeof(float));
    acc = dev_alloc(G, sizeof(double));
    for (int k = 0; k < 2; k++) {
        size_t es = dtype_size(S[k].dt);
        for (int j = 0; j < AM_SEGS; j++) { /* ragged cuts: (nf·j/AM_SEGS) + 37·j */
            int64_t a = nf * j / AM_SEGS + (j ? 37 * j : 0), b = j + 1 < AM_SEGS ? nf * (j + 1) / AM_SEGS + 37 * (j + 1) : nf;
            am_segs[k][j] = (bk_adamw_seg_t){.p = (char *)S[k].a.p + a * es, .m = (char *)S[k].m.p + a * es,
                                             .v = (char *)S[k].v.p + a * es, .g = (char *)S[k].b.p + a * es,
                                             .n = b - a, .index0 = a, .key = 0x5eed, .wd = 0.1f};
        }
    }
    int32_t *h = malloc((size_t)N * sizeof *h);
    if (!h) {
        ftk_err_set("out of host memory");
        fail();
    }
    for (int i = 0; i < N; i++)
        h[i] = (i * 7919) % V;
    ids = dev_alloc(G, N * 4);
    tgt = dev_alloc(G, N * 4);
    G->upload(G, ids, h, N * 4);
    G->upload(G, tgt, h, XC * 4);
    for (int i = 0; i < N; i++)
        h[i] = i % 7 ? (i * 7919) % V : 2;
    ids_rep = dev_alloc(G, N * 4);
    G->upload(G, ids_rep, h, N * 4);
    for (int i = 0; i < N; i++)
        h[i] = i % LEN;
    pos = dev_alloc(G, N * 4);
    G->upload(G, pos, h, N * 4);
    free(h);
    for (int k = 0; k < 2; k++)
        S[k].ids = ids, S[k].ids_rep = ids_rep, S[k].pos = pos, S[k].rstd = rstd, S[k].acc = acc;
    float ones[XC];
    for (int i = 0; i < XC; i++)
        ones[i] = 1;
    G->upload(G, wts, ones, sizeof ones);
    for (int k = 0; k < 2; k++) {
        gu2[k] = dev_rnd(G, 2 * nf, 4, S[k].dt);
        dgu2[k] = dev_rnd(G, 2 * nf, 1, S[k].dt);
        qkv2[k] = dev_rnd(G, 3 * nq, 1, S[k].dt);
    }
    mm_t tf32, fp32;
    mm_instance(&tf32, "tf32");
    mm_instance(&fp32, "fp32");
    if (G->sync(G) < 0)
        fail();

    printf("CUDA ops on %s at %s shapes: %d tokens (%d rows of %d), D %d, F %d, %d heads of %d, V %d\n", G->device,
           D == 4096 ? "Llama-2-7B" : "small (a run of the harness)", N, ROWS, LEN, D, F, H, HD, V);
    double s = time_op(G, op_copy, &S[0]);
    copy_bw = 2.0 * nf * 4 / s;
    row_bw("device-to-device copy", s, 2.0 * nf * 4);
    row_bw("convert fp32 -> bf16", time_op(G, op_to_bf16, NULL), 6.0 * nf);
    row_bw("convert bf16 -> fp32", time_op(G, op_to_f32, NULL), 6.0 * nf);
    for (int op = 0; op < OP_COUNT; op++)
        for (int r = 0; r < OPS_DESC(op)->n_perf; r++) {
            const ops_perf_t *p = &OPS_DESC(op)->perf[r];
            for (int k = 0; k < 2; k++) {
                char label[64];
                snprintf(label, sizeof label, "%s %s", p->label, dt_label[k]);
                row_bw(label, time_perf(p, &S[k]), perf_bytes(p, &S[k]));
            }
        }
    rows_bw("rope_qk (q and k)", op_rope_qk, 4.0 * nq);
    /* the fused ops, when this instance has them (FTK_FUSED): each against the plain ops
     * it replaces above (glu: swiglu; qkv_rope: three copies and rope_qk; add_rmsnorm: a
     * copy, add and rmsnorm_fwd) */
    if (G->glu_fwd) {
        rows_bw("glu_fwd (fused)", op_glu_fwd, 3.0 * nf);
        rows_bw("glu_bwd (fused)", op_glu_bwd, 5.0 * nf);
    }
    if (G->qkv_rope) {
        rows_bw("qkv_rope split (fused)", op_qkv_rope, 6.0 * nq);
        rows_bw("qkv_rope pack, inverse (fused)", op_qkv_rope_inv, 6.0 * nq);
    }
    if (G->add_rmsnorm_fwd)
        rows_bw("add_rmsnorm_fwd (fused)", op_add_rms, 4.0 * nd);
    if (G->adamw_multi)
        rows_bw("adamw_multi (9 tensors, nearest)", op_adamw_multi, 7.0 * nf);
    rows_bw("sumsq of 34 units", op_sumsq_units, 1.0 * nf); /* a step's Σg² */
    /* Σg² folded into the reduce-scatter's add (FTK_FUSED add_sumsq), and the add and the
     * sumsq pass it replaces: both rows count the 3 elements the add must move */
    if (G->add_sumsq)
        rows_bw("add_sumsq (fused)", op_add_sumsq, 3.0 * nf);
    rows_bw("add, then sumsq of the sum", op_add_then_sumsq, 3.0 * nf);
    const ops_perf_t *adamw = &OPS_DESC(OP_ADAMW)->perf[0];
    S[1].h.stochastic = BK_SROUND;
    row_bw("adamw (stochastic) bf16", time_perf(adamw, &S[1]), perf_bytes(adamw, &S[1]));
    /* the rule before 2026-11-28, a hash per stored state: what one hash an element saved */
    S[1].h.stochastic = BK_SROUND_HASH3;
    row_bw("adamw (stochastic, 3 hashes) bf16", time_perf(adamw, &S[1]), perf_bytes(adamw, &S[1]));
    if (G->adamw_multi) { /* the step's optimizer call in bf16-true, in both rules */
        S[1].h.stochastic = BK_SROUND;
        row_bw("adamw_multi (9 tensors, stochastic) bf16", time_op(S[1].be, op_adamw_multi, &S[1]), 7.0 * nf * 2);
        S[1].h.stochastic = BK_SROUND_HASH3;
        row_bw("adamw_multi (9 tensors, 3 hashes) bf16", time_op(S[1].be, op_adamw_multi, &S[1]), 7.0 * nf * 2);
    }
    S[1].h.stochastic = BK_SROUND;
    char xent_label[64];
    snprintf(xent_label, sizeof xent_label, "xent (%d rows, gradient) fp32", XC);
    row_bw(xent_label, time_op(G, op_xent, &S[0]), 2.0 * XC * V * 4);
    /* causal pairs: ROWS rows of LEN: ROWS·LEN·(LEN + 1)/2 per head */
    double pairs = (double)ROWS * LEN * (LEN + 1) / 2 * H, mm = 2.0 * N * F * D;
    /* bf16 attention on the tensor cores (the default WMMA kernels, flash_mma.cuh's with
     * FTK_CUDA_ATTN=mma, cuDNN's fused attention with FTK_CUDA_ATTN=cudnn where it loads)
     * and with the simple kernels, which fp32 always takes; the other instances use the
     * first one's buffers (one device) */
    set_t simple = S[1], mma = S[1], dnn = S[1];
    simple.be = instance_with("FTK_CUDA_ATTN", "simple");
    mma.be = instance_with("FTK_CUDA_ATTN", "mma");
    /* no row under its name for the flash kernels it would fall back to: strict, latched by
     * the instance, and its plans made (or refused) here, before any timing */
    setenv("FTK_CUDNN_STRICT", "1", 1);
    dnn.be = instance_with_or_null("FTK_CUDA_ATTN", "cudnn");
    unsetenv("FTK_CUDNN_STRICT");
    if (dnn.be && dnn.be->attn_prepare(dnn.be, ROWS, LEN, H, H, HD, DT_BF16) < 0) {
        backend_free(dnn.be);
        dnn.be = NULL;
    }
    if (!dnn.be)
        printf("attn bf16 cudnn: not measured (%s)\n", ftk_err_msg());
    const set_t *att[5] = {&S[1], &mma, &dnn, &simple, &S[0]};
    const char *att_label[5] = {"bf16 flash (default)", "bf16 mma", "bf16 cudnn", "bf16 simple", "fp32 simple"};
    for (int k = 0; k < 5; k++) {
        if (!att[k]->be)
            continue;
        char label[64];
        snprintf(label, sizeof label, "attn_fwd %s", att_label[k]);
        row_flops(label, time_op(att[k]->be, op_attn_fwd, (void *)att[k]), 4 * pairs * HD);
        snprintf(label, sizeof label, "attn_bwd %s", att_label[k]);
        row_flops(label, time_op(att[k]->be, op_attn_bwd, (void *)att[k]), 8 * pairs * HD);
    }
    backend_free(simple.be);
    backend_free(mma.be);
    backend_free(dnn.be);
    /* the one-element kernels (FTK_CUDA_VEC=0), bf16, beside the 8-element rows above */
    set_t one = S[1];
    one.be = instance_with("FTK_CUDA_VEC", "0");
    one.h.stochastic = 0;
    for (int op = 0; op < OP_COUNT; op++)
        for (int r = 0; r < OPS_DESC(op)->n_perf; r++) {
            const ops_perf_t *p = &OPS_DESC(op)->perf[r];
            if (p->vec0)
                row_bw(p->vec0, time_perf(p, &one), perf_bytes(p, &one));
        }
    /* the 16-byte kernels against the one-pair, one-element ones they replaced: the
     * fused rope (the model's), and the loss (fp32 logits) */
    row_bw("rope_qk (q and k) bf16, one pair a thread", time_op(one.be, op_rope_qk, &one), 4.0 * nq * 2);
    if (one.be->qkv_rope)
        row_bw("qkv_rope split (fused) bf16, one pair a thread", time_op(one.be, op_qkv_rope, &one), 6.0 * nq * 2);
    snprintf(xent_label, sizeof xent_label, "xent (%d rows, gradient) fp32, one a thread", XC);
    row_bw(xent_label, time_op(one.be, op_xent, &one), 2.0 * XC * V * 4);
    /* and the slower paths kept for comparison: adamw_multi's binary search per block (no block map,
     * one element a thread) and the partial sums added in order by one thread */
    if (one.be->adamw_multi)
        row_bw("adamw_multi bf16, one a thread, search", time_op(one.be, op_adamw_multi_bf16, &one), 14.0 * nf);
    row_bw("sumsq of 34 units bf16, in-order sums", time_op(one.be, op_sumsq_units, &one), 2.0 * nf);
    backend_free(one.be);
    char mm_label[64];
    snprintf(mm_label, sizeof mm_label, "matmul x·Wᵀ [%dx%dx%d] bf16", N, F, D);
    row_flops(mm_label, time_op(G, op_mm_up, &S[1]), mm);
    row_flops("matmul x·Wᵀ fp32 in bf16 (default)", time_op(G, op_mm_up, &S[0]), mm);
    row_flops("matmul x·Wᵀ fp32 in TF32", time_op(tf32.be, op_mm_up_fp32, &tf32), mm);
    row_flops("matmul x·Wᵀ fp32 exact", time_op(fp32.be, op_mm_up_fp32, &fp32), mm);
    row_flops("matmul dW += dyᵀ·x bf16 into fp32", time_op(G, op_mm_wgrad, &S[1]), mm);
    row_flops("matmul dW += dyᵀ·x fp32 in bf16", time_op(G, op_mm_wgrad, &S[0]), mm);
    if (G->sync(G) < 0)
        fail();
    backend_free(fp32.be);
    backend_free(tf32.be);
    backend_free(G);
    return 0;
}
