/* gpu_opbench.c — the CUDA backend's ops at Llama-2-7B's shapes (8 rows of 512 tokens):
 * each memory-bound op's achieved bandwidth as a fraction of a device-to-device copy
 * measured in the same run, attention's and the matrix products' TFLOP/s.
 *
 * Bytes are the fewest an op must move (each input read once, each output written
 * once); time is the median of 9 timed batches of repetitions after a warm-up, measured on
 * the host around the batch and a sync() (the ops are asynchronous on one stream).
 * Random inputs, never zeros. Run by `make bench` where a GPU is present; exit 77 without. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/backend.h"
#include "../../libcommon/log.h"
#include "../../libcommon/timer.h"

static const backend_t *G;
static double copy_bw;

static void *dev_rnd(int64_t n, float scale)
{
    float *h = malloc((size_t)n * sizeof *h);
    uint64_t s = 0x2545f4914f6cdd1dULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        h[i] = (float)(((double)(s >> 11) / 9007199254740992.0 * 2 - 1) * scale);
    }
    void *d = G->alloc((size_t)n * sizeof *h);
    if (!d) {
        fprintf(stderr, "gpu_opbench: %s\n", ftk_err_msg());
        exit(1);
    }
    G->upload(d, h, (size_t)n * sizeof *h);
    free(h);
    return d;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of one call of op(ctx). */
typedef void (*op_fn)(void *ctx);
static double time_op(op_fn op, void *ctx)
{
    int reps = 1;
    op(ctx);
    G->sync();
    for (;;) { /* batches of at least 20 ms */
        double t0 = time_now();
        for (int i = 0; i < reps; i++)
            op(ctx);
        G->sync();
        if (time_now() - t0 > 0.02 || reps >= 1 << 14)
            break;
        reps *= 2;
    }
    double t[9];
    for (int k = 0; k < 9; k++) {
        double t0 = time_now();
        for (int i = 0; i < reps; i++)
            op(ctx);
        G->sync();
        t[k] = (time_now() - t0) / reps;
    }
    qsort(t, 9, sizeof *t, cmp_d);
    return t[4];
}

static void row_bw(const char *name, double s, double bytes)
{
    double bw = bytes / s;
    printf("%-28s %9.3f ms %8.0f GB/s %6.1f%% of copy\n", name, s * 1e3, bw / 1e9, 100 * bw / copy_bw);
}

static void row_flops(const char *name, double s, double flops)
{
    printf("%-28s %9.3f ms %8.1f TFLOP/s\n", name, s * 1e3, flops / s / 1e12);
}

/* ---- the ops at the benchmark's shapes ---- */
enum { N = 4096, D = 4096, F = 11008, H = 32, HD = 128, V = 32000, XC = 256 };
static const int64_t seg[] = {0, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096};
static struct {
    float *a, *b, *c, *x, *y, *w, *r, *q, *k, *v, *o, *lse, *dq, *dk, *dv, *p, *m, *vv, *logits, *wts;
    int32_t *ids, *pos, *tgt;
} t;

static void op_copy(void *c) { G->copy(t.b, t.a, (size_t)N * F * 4); (void)c; }
static void op_embed(void *c) { G->embed_fwd(t.y, t.ids, t.w, N, D); (void)c; }
static void op_rms_fwd(void *c) { G->rmsnorm_fwd(t.y, t.r, t.x, t.w, N, D, 1e-5f); (void)c; }
static void op_rms_bwd(void *c) { G->rmsnorm_bwd(t.y, t.c, t.x, t.x, t.w, t.r, N, D); (void)c; }
static void op_rope(void *c) { G->rope(t.q, t.pos, N, H, HD, 10000.0f, 0); (void)c; }
static void op_swiglu_fwd(void *c) { G->swiglu_fwd(t.c, t.a, t.b, (int64_t)N * F); (void)c; }
static void op_swiglu_bwd(void *c) { G->swiglu_bwd(t.c, t.p, t.a, t.b, t.a, (int64_t)N * F); (void)c; }
static void op_add(void *c) { G->add(t.b, t.a, (int64_t)N * F); (void)c; }
static void op_sumsq(void *c) { G->sumsq(t.a, (int64_t)N * F); (void)c; }
static void op_adamw(void *c)
{
    G->adamw(t.a, t.b, t.p, t.vv, (int64_t)N * F, 1e-5f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5, 0.3);
    (void)c;
}
static void op_xent(void *c) { G->xent(t.logits, t.tgt, t.wts, XC, V, 1.0f); (void)c; }
static void op_attn_fwd(void *c) { G->attn_fwd(t.o, t.lse, t.q, t.k, t.v, seg, 8, H, H, HD); (void)c; }
static void op_attn_bwd(void *c)
{
    G->attn_bwd(t.dq, t.dk, t.dv, t.o, t.q, t.k, t.v, t.o, t.lse, seg, 8, H, H, HD);
    (void)c;
}
static void op_mm_up(void *c) { G->matmul(0, 1, N, F, D, 1, t.x, t.a, 0, t.b); (void)c; }
static void op_mm_wgrad(void *c) { G->matmul(1, 0, F, D, N, 1, t.b, t.x, 1, t.a); (void)c; }

int main(void)
{
    ftk_set_tool("gpu_opbench");
    if (backend_cuda_devices() == 0) {
        printf("skipped (no GPU)\n");
        return 77;
    }
    if (!(G = backend_cuda(0))) {
        fprintf(stderr, "gpu_opbench: %s\n", ftk_err_msg());
        return 1;
    }
    int64_t nf = (int64_t)N * F, nd = (int64_t)N * D;
    t.a = dev_rnd(nf, 1);
    t.b = dev_rnd(nf, 1);
    t.c = dev_rnd(nf, 1);
    t.p = dev_rnd(nf, 1e-3f);
    t.vv = dev_rnd(nf, 1e-6f); /* squares are positive: |x| enough for AdamW's sqrt */
    t.x = dev_rnd(nd, 1);
    t.y = dev_rnd(nd, 1);
    t.w = dev_rnd((int64_t)V * D, 1); /* embedding table; its first D: norm weights */
    t.r = dev_rnd(N, 1);
    t.q = dev_rnd((int64_t)N * H * HD, 1);
    t.k = dev_rnd((int64_t)N * H * HD, 1);
    t.v = dev_rnd((int64_t)N * H * HD, 1);
    t.o = dev_rnd((int64_t)N * H * HD, 1);
    t.lse = dev_rnd((int64_t)N * H, 1);
    t.dq = dev_rnd((int64_t)N * H * HD, 1);
    t.dk = dev_rnd((int64_t)N * H * HD, 1);
    t.dv = dev_rnd((int64_t)N * H * HD, 1);
    t.logits = dev_rnd((int64_t)XC * V, 4);
    t.wts = dev_rnd(XC, 1);
    int32_t *h = malloc((size_t)N * sizeof *h);
    for (int i = 0; i < N; i++)
        h[i] = (i * 7919) % V;
    t.ids = G->alloc(N * 4);
    t.tgt = G->alloc(N * 4);
    G->upload(t.ids, h, N * 4);
    G->upload(t.tgt, h, XC * 4);
    for (int i = 0; i < N; i++)
        h[i] = i % 512;
    t.pos = G->alloc(N * 4);
    G->upload(t.pos, h, N * 4);
    free(h);
    float ones[XC];
    for (int i = 0; i < XC; i++)
        ones[i] = 1;
    G->upload(t.wts, ones, sizeof ones);
    G->attn_fwd(t.o, t.lse, t.q, t.k, t.v, seg, 8, H, H, HD); /* a consistent lse for the backward */
    if (G->sync() < 0) {
        fprintf(stderr, "gpu_opbench: %s\n", ftk_err_msg());
        return 1;
    }

    printf("CUDA ops at Llama-2-7B shapes: %d tokens (8 rows of 512), D %d, F %d, %d heads of %d, V %d\n", N, D, F,
           H, HD, V);
    double s = time_op(op_copy, NULL);
    copy_bw = 2.0 * nf * 4 / s;
    row_bw("device-to-device copy", s, 2.0 * nf * 4);
    row_bw("embed_fwd", time_op(op_embed, NULL), 2.0 * nd * 4);
    row_bw("rmsnorm_fwd", time_op(op_rms_fwd, NULL), 2.0 * nd * 4);
    row_bw("rmsnorm_bwd (dx and dw)", time_op(op_rms_bwd, NULL), 4.0 * nd * 4);
    row_bw("rope (q)", time_op(op_rope, NULL), 2.0 * N * H * HD * 4);
    row_bw("swiglu_fwd", time_op(op_swiglu_fwd, NULL), 3.0 * nf * 4);
    row_bw("swiglu_bwd", time_op(op_swiglu_bwd, NULL), 5.0 * nf * 4);
    row_bw("add", time_op(op_add, NULL), 3.0 * nf * 4);
    row_bw("sumsq", time_op(op_sumsq, NULL), 1.0 * nf * 4);
    row_bw("adamw", time_op(op_adamw, NULL), 7.0 * nf * 4);
    row_bw("xent (256 rows, gradient)", time_op(op_xent, NULL), 2.0 * XC * V * 4);
    /* causal pairs: 8 rows of 512: 8·512·513/2 per head */
    double pairs = 8.0 * 512 * 513 / 2 * H;
    row_flops("attn_fwd (4·pairs·hd)", time_op(op_attn_fwd, NULL), 4 * pairs * HD);
    row_flops("attn_bwd (8·pairs·hd)", time_op(op_attn_bwd, NULL), 8 * pairs * HD);
    row_flops("matmul x·Wᵀ [4096x11008x4096]", time_op(op_mm_up, NULL), 2.0 * N * F * D);
    row_flops("matmul dW += dyᵀ·x", time_op(op_mm_wgrad, NULL), 2.0 * N * F * D);
    if (G->sync() < 0) {
        fprintf(stderr, "gpu_opbench: %s\n", ftk_err_msg());
        return 1;
    }
    return 0;
}
