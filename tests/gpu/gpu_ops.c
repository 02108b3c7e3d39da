/* gpu_ops.c — every op of the CUDA backend against the CPU reference, then a whole
 * training step (loss, every gradient, the weights after AdamW) on a small model.
 *
 * Fresh random inputs each run (seed printed; FTK_SEED=N repeats one), outputs poisoned
 * with NaN before each op so an element it forgot to write fails, error measured as
 * ‖gpu − cpu‖ / ‖cpu‖. Bounds: fp32 arithmetic that differs only in order and libm
 * (1e-5 … 1e-4); the matrix products and everything after them in bf16 (default,
 * CUBLAS_COMPUTE_32F_FAST_16BF: 1e-2) or fp32 (FTK_CUDA_MATMUL=fp32: 1e-5). Also checks
 * that the ops meant to be deterministic give the same bits twice.
 *
 * Exit 0 pass, 1 fail, 77 "skipped (no GPU)". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../engine/model.h"
#include "../../kernels/backend.h"
#include "../../libcommon/log.h"

static const backend_t *C, *G;
static int failures, exact;
static uint64_t rng_state;

static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float *rnd(int64_t n, float scale)
{
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((2 * urand() - 1) * scale);
    return p;
}

/* The same host data on both backends. */
typedef struct {
    void *c, *g;
    size_t bytes;
} pair_t;

static pair_t both(const void *host, size_t bytes)
{
    pair_t p = {C->alloc(bytes), G->alloc(bytes), bytes};
    if (!p.c || !p.g) {
        fprintf(stderr, "allocation of %zu bytes failed: %s\n", bytes, ftk_err_msg());
        exit(1);
    }
    if (host) {
        C->upload(p.c, host, bytes);
        G->upload(p.g, host, bytes);
    }
    return p;
}

static pair_t both_rnd(int64_t n, float scale)
{
    float *h = rnd(n, scale);
    pair_t p = both(h, (size_t)n * sizeof(float));
    free(h);
    return p;
}

/* Outputs start as NaN on the GPU (and on the CPU, which must write them too). */
static pair_t both_nan(int64_t n)
{
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    for (int64_t i = 0; i < n; i++)
        h[i] = NAN;
    pair_t p = both(h, (size_t)n * sizeof(float));
    free(h);
    return p;
}

static void release(pair_t *p)
{
    C->free(p->c);
    G->free(p->g);
}

/* ‖g − c‖ / ‖c‖ over n floats; NaN anywhere fails. */
static double compare(const char *what, const pair_t *p, int64_t n, double tol)
{
    float *hc = malloc((size_t)(n ? n : 1) * sizeof *hc), *hg = malloc((size_t)(n ? n : 1) * sizeof *hg);
    C->download(hc, p->c, (size_t)n * sizeof(float));
    G->download(hg, p->g, (size_t)n * sizeof(float));
    double num = 0, den = 0;
    int64_t nan = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(hg[i]) || isnan(hc[i])) {
            nan++;
            continue;
        }
        double d = (double)hg[i] - hc[i];
        num += d * d;
        den += (double)hc[i] * hc[i];
    }
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = nan == 0 && err <= tol;
    printf("%-4s %-34s rel err %.3e (bound %.0e)%s\n", ok ? "ok" : "FAIL", what, err, tol,
           nan ? "  NaN or unwritten elements" : "");
    if (!ok)
        failures++;
    free(hc);
    free(hg);
    return err;
}

static void compare_scalar(const char *what, double c, double g, double tol)
{
    double err = fabs(g - c) / (fabs(c) > 0 ? fabs(c) : 1);
    int ok = !isnan(g) && err <= tol;
    printf("%-4s %-34s %.10g vs %.10g, rel err %.3e (bound %.0e)\n", ok ? "ok" : "FAIL", what, g, c, err, tol);
    if (!ok)
        failures++;
}

static void same_bits(const char *what, const void *a_dev, const void *b_dev, size_t bytes)
{
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    G->download(a, a_dev, bytes);
    G->download(b, b_dev, bytes);
    int ok = memcmp(a, b, bytes) == 0;
    printf("%-4s %-34s %s\n", ok ? "ok" : "FAIL", what, ok ? "same bits on a second run" : "DIFFERENT bits");
    if (!ok)
        failures++;
    free(a);
    free(b);
}

static int32_t *ids_rnd(int64_t n, int64_t range)
{
    int32_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (int32_t)(urand() * (double)range);
    return p;
}

/* ---- op tests ------------------------------------------------------------------------- */

static void test_matmul(void)
{
    double tol = exact ? 1e-5 : 1e-2;
    const int64_t M = 300, N = 520, K = 260;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++) {
                pair_t A = both_rnd(M * K, 1), B = both_rnd(K * N, 1);
                pair_t Cm = beta ? both_rnd(M * N, 1) : both_nan(M * N);
                C->matmul(ta, tb, M, N, K, 0.5f, A.c, B.c, (float)beta, Cm.c);
                G->matmul(ta, tb, M, N, K, 0.5f, A.g, B.g, (float)beta, Cm.g);
                char name[64];
                snprintf(name, sizeof name, "matmul ta=%d tb=%d beta=%d", ta, tb, beta);
                compare(name, &Cm, M * N, tol);
                release(&A);
                release(&B);
                release(&Cm);
            }
    /* tensors at float offsets inside unit vectors: pointers only 4-byte aligned */
    pair_t A = both_rnd(M * K + 1, 1), B = both_rnd(K * N + 3, 1), Cm = both_rnd(M * N + 2, 1);
    C->matmul(0, 1, M, N - 1, K, 1, (float *)A.c + 1, (float *)B.c + 3, 1, (float *)Cm.c + 2);
    G->matmul(0, 1, M, N - 1, K, 1, (float *)A.g + 1, (float *)B.g + 3, 1, (float *)Cm.g + 2);
    compare("matmul, misaligned pointers", &Cm, M * N + 2, tol);
    release(&A);
    release(&B);
    release(&Cm);
}

static void test_embed(void)
{
    const int64_t n = 700, d = 384, V = 50; /* few ids: many repeats in the backward */
    int32_t *ids = ids_rnd(n, V);
    pair_t I = both(ids, (size_t)n * 4), T = both_rnd(V * d, 1), O = both_nan(n * d);
    C->embed_fwd(O.c, I.c, T.c, n, d);
    G->embed_fwd(O.g, I.g, T.g, n, d);
    compare("embed_fwd", &O, n * d, 0);
    pair_t D = both_rnd(n * d, 1), DT = both_rnd(V * d, 1);
    C->embed_bwd(DT.c, I.c, D.c, n, d);
    G->embed_bwd(DT.g, I.g, D.g, n, d);
    compare("embed_bwd (adds, repeated ids)", &DT, V * d, 1e-6);
    /* rows_scatter: distinct indices */
    int32_t *perm = malloc((size_t)V * sizeof *perm);
    for (int i = 0; i < V; i++)
        perm[i] = i;
    for (int i = V - 1; i > 0; i--) {
        int j = (int)(urand() * (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    pair_t P = both(perm, (size_t)30 * 4), S = both_rnd(30 * d, 1), DS = both_rnd(V * d, 1);
    C->rows_scatter(DS.c, P.c, S.c, 30, d);
    G->rows_scatter(DS.g, P.g, S.g, 30, d);
    compare("rows_scatter", &DS, V * d, 0);
    free(ids);
    free(perm);
    release(&I);
    release(&T);
    release(&O);
    release(&D);
    release(&DT);
    release(&P);
    release(&S);
    release(&DS);
}

static void test_rmsnorm(void)
{
    const int64_t n = 513, d = 1000;
    pair_t X = both_rnd(n * d, 2), W = both_rnd(d, 1), O = both_nan(n * d), R = both_nan(n);
    C->rmsnorm_fwd(O.c, R.c, X.c, W.c, n, d, 1e-5f);
    G->rmsnorm_fwd(O.g, R.g, X.g, W.g, n, d, 1e-5f);
    compare("rmsnorm_fwd out", &O, n * d, 1e-5);
    compare("rmsnorm_fwd rstd", &R, n, 1e-5);
    pair_t DO = both_rnd(n * d, 1), DX = both_rnd(n * d, 1), DW = both_rnd(d, 1);
    C->rmsnorm_bwd(DX.c, DW.c, DO.c, X.c, W.c, R.c, n, d);
    G->rmsnorm_bwd(DX.g, DW.g, DO.g, X.g, W.g, R.g, n, d);
    compare("rmsnorm_bwd dx (adds)", &DX, n * d, 1e-5);
    compare("rmsnorm_bwd dw (adds)", &DW, d, 1e-4);
    release(&X);
    release(&W);
    release(&O);
    release(&R);
    release(&DO);
    release(&DX);
    release(&DW);
}

static void test_rope(void)
{
    const int64_t n = 600;
    const int H = 6, hd = 128;
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)(i % 512);
    pair_t P = both(pos, (size_t)n * 4), X = both_rnd(n * H * hd, 1);
    for (int inv = 0; inv < 2; inv++) {
        C->rope(X.c, P.c, n, H, hd, 10000.0f, inv);
        G->rope(X.g, P.g, n, H, hd, 10000.0f, inv);
        compare(inv ? "rope inverse" : "rope", &X, n * H * hd, 1e-5);
    }
    free(pos);
    release(&P);
    release(&X);
}

static void test_attention(int H, int KV, int hd)
{
    /* a packed row: samples of 100, 250 and 161 tokens, then a second row of one 513 */
    int64_t seg[] = {0, 100, 350, 511, 1024}, n_seg = 4, n = seg[n_seg];
    int64_t qn = n * H * hd, kn = n * KV * hd;
    char name[96];
    pair_t Q = both_rnd(qn, 1), K = both_rnd(kn, 1), V = both_rnd(kn, 1), O = both_nan(qn), L = both_nan(n * H);
    C->attn_fwd(O.c, L.c, Q.c, K.c, V.c, seg, n_seg, H, KV, hd);
    G->attn_fwd(O.g, L.g, Q.g, K.g, V.g, seg, n_seg, H, KV, hd);
    snprintf(name, sizeof name, "attn_fwd out (H=%d KV=%d hd=%d)", H, KV, hd);
    compare(name, &O, qn, 1e-5);
    compare("attn_fwd lse", &L, n * H, 1e-5);
    pair_t DO = both_rnd(qn, 1), DQ = both_nan(qn), DK = both_nan(kn), DV = both_nan(kn);
    /* the backward from the CPU's forward on both, so only the backward is compared */
    float *h = malloc((size_t)qn * sizeof *h);
    C->download(h, O.c, (size_t)qn * 4);
    G->upload(O.g, h, (size_t)qn * 4);
    C->download(h, L.c, (size_t)n * H * 4);
    G->upload(L.g, h, (size_t)n * H * 4);
    free(h);
    C->attn_bwd(DQ.c, DK.c, DV.c, DO.c, Q.c, K.c, V.c, O.c, L.c, seg, n_seg, H, KV, hd);
    G->attn_bwd(DQ.g, DK.g, DV.g, DO.g, Q.g, K.g, V.g, O.g, L.g, seg, n_seg, H, KV, hd);
    compare("attn_bwd dq", &DQ, qn, 1e-4);
    compare("attn_bwd dk", &DK, kn, 1e-4);
    compare("attn_bwd dv", &DV, kn, 1e-4);
    void *dk2 = G->alloc((size_t)kn * 4), *dq2 = G->alloc((size_t)qn * 4), *dv2 = G->alloc((size_t)kn * 4);
    G->attn_bwd(dq2, dk2, dv2, DO.g, Q.g, K.g, V.g, O.g, L.g, seg, n_seg, H, KV, hd);
    same_bits("attn_bwd dk", DK.g, dk2, (size_t)kn * 4);
    G->free(dk2);
    G->free(dq2);
    G->free(dv2);
    /* decoding: 5 new queries after 300 cached positions */
    int64_t p0 = 300, nq = 5;
    pair_t CQ = both_rnd(nq * H * hd, 1), CO = both_nan(nq * H * hd);
    C->attn_cached(CO.c, CQ.c, K.c, V.c, nq, p0, H, KV, hd);
    G->attn_cached(CO.g, CQ.g, K.g, V.g, nq, p0, H, KV, hd);
    compare("attn_cached", &CO, nq * H * hd, 1e-5);
    pair_t *all[] = {&Q, &K, &V, &O, &L, &DO, &DQ, &DK, &DV, &CQ, &CO};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        release(all[i]);
}

static void test_pointwise(void)
{
    const int64_t n = 1 << 20;
    pair_t Gt = both_rnd(n, 4), U = both_rnd(n, 2), Hh = both_nan(n);
    C->swiglu_fwd(Hh.c, Gt.c, U.c, n);
    G->swiglu_fwd(Hh.g, Gt.g, U.g, n);
    compare("swiglu_fwd", &Hh, n, 1e-6);
    pair_t DH = both_rnd(n, 1), DG = both_nan(n), DU = both_nan(n);
    C->swiglu_bwd(DG.c, DU.c, DH.c, Gt.c, U.c, n);
    G->swiglu_bwd(DG.g, DU.g, DH.g, Gt.g, U.g, n);
    compare("swiglu_bwd dg", &DG, n, 1e-6);
    compare("swiglu_bwd du", &DU, n, 1e-6);
    C->add(U.c, Gt.c, n);
    G->add(U.g, Gt.g, n);
    compare("add", &U, n, 0);
    C->scale(U.c, 0.37f, n);
    G->scale(U.g, 0.37f, n);
    compare("scale", &U, n, 0);
    const int64_t big = 5000017; /* several blocks and a ragged end */
    pair_t X = both_rnd(big, 3);
    compare_scalar("sumsq", C->sumsq(X.c, big), G->sumsq(X.g, big), 1e-12);
    double a = G->sumsq(X.g, big), b = G->sumsq(X.g, big);
    printf("%-4s %-34s %s\n", a == b ? "ok" : "FAIL", "sumsq", a == b ? "same bits on a second run" : "DIFFERENT");
    failures += a != b;
    pair_t P = both_rnd(big, 1), Gr = both_rnd(big, 1e-2f), M = both_rnd(big, 1e-3f);
    float *hv = rnd(big, 1e-5f);
    for (int64_t i = 0; i < big; i++)
        hv[i] = fabsf(hv[i]);
    pair_t Vv = both(hv, (size_t)big * 4);
    free(hv);
    C->adamw(P.c, Gr.c, M.c, Vv.c, big, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1 - pow(0.9, 7), 1 - pow(0.95, 7));
    G->adamw(P.g, Gr.g, M.g, Vv.g, big, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1 - pow(0.9, 7), 1 - pow(0.95, 7));
    compare("adamw p", &P, big, 1e-6);
    compare("adamw m", &M, big, 1e-6);
    compare("adamw v", &Vv, big, 1e-6);
    pair_t *all[] = {&Gt, &U, &Hh, &DH, &DG, &DU, &X, &P, &Gr, &M, &Vv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        release(all[i]);
}

static void test_xent(void)
{
    const int64_t n = 96, V = 32000;
    int32_t *t = ids_rnd(n, V);
    float *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++)
        w[i] = i % 7 == 3 ? 0.0f : 1.0f; /* masked rows */
    pair_t T = both(t, (size_t)n * 4), W = both(w, (size_t)n * 4), X = both_rnd(n * V, 8);
    compare_scalar("xent loss (no gradient)", C->xent(X.c, T.c, W.c, n, V, 0), G->xent(X.g, T.g, W.g, n, V, 0), 1e-6);
    compare("xent leaves logits alone", &X, n * V, 0);
    compare_scalar("xent loss", C->xent(X.c, T.c, W.c, n, V, 0.25f), G->xent(X.g, T.g, W.g, n, V, 0.25f), 1e-6);
    compare("xent gradient in place", &X, n * V, 1e-5);
    free(t);
    free(w);
    release(&T);
    release(&W);
    release(&X);
}

/* ---- a whole training step on a small model --------------------------------------------- */

static void test_step(void)
{
    model_config_t c;
    model_config_defaults(&c);
    c.hidden_size = 256;
    c.intermediate_size = 688;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.vocab_size = 1000;
    c.max_position_embeddings = 512;
    int64_t n = 600;
    model_t *mc = model_new(C, &c, 1, n, 0), *mg = model_new(G, &c, 1, n, 1 /* recompute on the GPU */);
    if (!mc || !mg) {
        printf("FAIL model_new: %s\n", ftk_err_msg());
        failures++;
        return;
    }
    int nu;
    const ckpt_unit_t *units = model_units(mc, &nu);
    for (int u = 0; u < nu; u++) {
        float *h = rnd(units[u].padded, 0.05f);
        for (int i = 0; i < units[u].n_tensors; i++)
            if (units[u].t[i].is_norm)
                for (int64_t j = 0; j < units[u].t[i].numel; j++)
                    h[units[u].t[i].offset + j] = 1.0f + 0.1f * h[units[u].t[i].offset + j];
        for (int64_t j = units[u].length; j < units[u].padded; j++)
            h[j] = 0;
        C->upload(model_unit_param(mc, u), h, (size_t)units[u].padded * 4);
        G->upload(model_unit_param(mg, u), h, (size_t)units[u].padded * 4);
        free(h);
    }
    /* two samples of 230 and 300 tokens and 70 of padding */
    batch_t b = {0};
    int64_t seg[] = {0, 230, 530, 600};
    b.n = n;
    b.n_seg = 3;
    b.seg = seg;
    b.ids = ids_rnd(n, c.vocab_size);
    b.pos = malloc((size_t)n * 4);
    b.tgt_at = malloc((size_t)n * 4);
    b.tgt = malloc((size_t)n * 4);
    b.tgt_w = malloc((size_t)n * 4);
    for (int s = 0; s < 3; s++)
        for (int64_t i = seg[s]; i < seg[s + 1]; i++) {
            b.pos[i] = (int32_t)(i - seg[s]);
            if (s < 2 && i + 1 < seg[s + 1] && i - seg[s] > 20) { /* prompt tokens carry no loss */
                b.tgt_at[b.n_tgt] = (int32_t)i;
                b.tgt[b.n_tgt] = b.ids[i + 1];
                b.tgt_w[b.n_tgt] = 1;
                b.n_tgt++;
            }
        }
    double tol = exact ? 1e-4 : 3e-2;
    model_zero_grad(mc);
    model_zero_grad(mg);
    double lc = model_step(mc, &b, 1.0f / (float)b.n_tgt, NULL), lg = model_step(mg, &b, 1.0f / (float)b.n_tgt, NULL);
    compare_scalar("step: loss", lc, lg, exact ? 1e-5 : 1e-2);
    for (int u = 0; u < nu; u++) {
        char name[64];
        pair_t gp = {model_unit_grad(mc, u), model_unit_grad(mg, u), 0};
        snprintf(name, sizeof name, "step: gradient of unit %d", u);
        compare(name, &gp, units[u].padded, tol);
    }
    for (int u = 0; u < nu; u++) {
        int64_t len = units[u].padded;
        pair_t M = both(NULL, (size_t)len * 4), V = both(NULL, (size_t)len * 4);
        C->adamw(model_unit_param(mc, u), model_unit_grad(mc, u), M.c, V.c, len, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                 0.1, 0.05);
        G->adamw(model_unit_param(mg, u), model_unit_grad(mg, u), M.g, V.g, len, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                 0.1, 0.05);
        char name[64];
        pair_t wp = {model_unit_param(mc, u), model_unit_param(mg, u), 0};
        snprintf(name, sizeof name, "step: weights after AdamW, unit %d", u);
        /* Adam's first step moves every weight by about lr·sign(g): where bf16 products flip
         * the sign of a tiny gradient, that weight differs by 2·lr (a few % of the weights'
         * norm in all); fp32 products leave only reordering differences */
        compare(name, &wp, len, exact ? 1e-5 : 3e-2);
        release(&M);
        release(&V);
    }
    double l2 = model_step(mg, &b, 0, NULL), l1 = model_step(mc, &b, 0, NULL);
    compare_scalar("step: loss after the update", l1, l2, exact ? 1e-5 : 1e-2);
    free(b.ids);
    free(b.pos);
    free(b.tgt_at);
    free(b.tgt);
    free(b.tgt_w);
    model_free(mc);
    model_free(mg);
}

int main(void)
{
    ftk_set_tool("gpu_ops");
    if (backend_cuda_devices() == 0) {
        printf("skipped (no GPU)\n");
        return 77;
    }
    C = backend_cpu();
    if (!(G = backend_cuda(0))) {
        printf("FAIL: %s\n", ftk_err_msg());
        return 1;
    }
    const char *mm = getenv("FTK_CUDA_MATMUL"), *seed = getenv("FTK_SEED");
    exact = mm && !strcmp(mm, "fp32");
    rng_state = seed ? strtoull(seed, NULL, 10) : 0x9e3779b97f4a7c15ULL ^ ((uint64_t)time(NULL) << 20 ^ (uint64_t)getpid());
    if (!rng_state)
        rng_state = 1;
    printf("seed %llu, matrix products in %s\n", (unsigned long long)rng_state, exact ? "fp32" : "bf16 (fp32 accumulate)");
    test_matmul();
    test_embed();
    test_rmsnorm();
    test_rope();
    test_attention(8, 2, 64);
    test_attention(4, 4, 128);
    test_pointwise();
    test_xent();
    test_step();
    if (G->sync() < 0) {
        printf("FAIL: %s\n", ftk_err_msg());
        failures++;
    }
    printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
