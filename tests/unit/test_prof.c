/* test_prof — FTK_PROFILE's wrappers (kernels/prof.h) on the CPU backend:
 *  - a profiled instance computes the same bits as a plain one on every case of the op
 *    table and every fused case (the wrappers change what is timed, nothing else);
 *  - rows: the labels the header promises, calls counted, the work (2·M·N·K, attention's
 *    causal pairs, bytes) exactly; every call timed (host clock);
 *  - the optional entries a backend lacks stay NULL, the ones it has are wrapped, and
 *    backend_free() gives them back (ASan: nothing leaks);
 *  - the table: its heading, the per-op summary, the rows; reset forgets; attaching twice
 *    fails; the planning backend can be profiled too.
 * Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/backend.h"
#include "../../kernels/prof.h"
#include "../../libcommon/log.h"
#include "../ops/ops_table.h"
#include "test.h"

static backend_t *cpu_with(const char *fused)
{
    setenv("FTK_FUSED", fused, 1);
    backend_t *be = backend_cpu_new();
    unsetenv("FTK_FUSED");
    return be;
}

/* row label has `calls` calls and work flops, bytes (exactly: sums of small integers) */
static int row_is(backend_t *be, const char *label, uint64_t calls, double flops, double bytes)
{
    bk_prof_row_t r;
    if (bk_prof_row(be, label, &r) < 0) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        return 0;
    }
    if (r.calls != calls || r.flops != flops || r.bytes != bytes || !(r.secs >= 0)) {
        fprintf(stderr, "%s: %llu calls, %g flops, %g bytes, %g s\n", label, (unsigned long long)r.calls, r.flops,
                r.bytes, r.secs);
        return 0;
    }
    return 1;
}

static void test_same_bits(void)
{
    backend_t *a = cpu_with("all"), *b = cpu_with("all");
    CHECK(a && b && bk_prof_attach(b) == 0);
    int runs = 0, bad = ops_table_differ(a, b, 20261123u, &runs);
    printf("op table and fused cases, profiled against plain: %d runs, %d differ\n", runs, bad);
    CHECK(bad == 0);
    CHECK(runs > 100);
    bk_prof_row_t all;
    CHECK(bk_prof_row(b, NULL, &all) == 0);
    CHECK(all.calls > (uint64_t)runs && all.untimed == 0 && all.secs > 0);
    backend_free(a);
    backend_free(b);
}

static void test_rows(void)
{
    backend_t *be = backend_cpu_new();
    CHECK(be && be->glu_fwd == NULL && be->adamw_multi == NULL);
    void (*plain_matmul)(backend_t *, int, int, int64_t, int64_t, int64_t, float, bk_buf_t, bk_buf_t, float,
                         bk_buf_t) = be->matmul;
    CHECK(bk_prof_attach(be) == 0);
    CHECK(be->matmul != plain_matmul);
    CHECK(be->glu_fwd == NULL && be->adamw_multi == NULL && be->rope_qk == NULL); /* not there: not made up */
    CHECK(bk_prof_attach(be) < 0);                                                 /* once */

    const int64_t M = 8, N = 16, K = 32;
    ops_rng_t rng;
    ops_rng_seed(&rng, 7);
    float *ha = ops_rand(&rng, M * K, 1, 0), *hb = ops_rand(&rng, N * K, 1, 0), *hc = ops_rand(&rng, M * N, 1, 0);
    bk_buf_t A = ops_put(be, DT_BF16, ha, M * K), B = ops_put(be, DT_BF16, hb, N * K),
             C = ops_put(be, DT_F32, hc, M * N);
    be->matmul(be, 0, 1, M, N, K, 1, A, B, 0, C);
    be->matmul(be, 0, 1, M, N, K, 1, A, B, 0, C);
    be->matmul(be, 0, 1, M, N, K, 1, A, B, 1, C);
    be->add(be, C, A, M * N); /* f32 += bf16: 4 + 4 + 2 bytes an element */
    /* attention: segments of 3 and 4 tokens, 2 query heads on 1 key/value head of 16:
     * 6 + 10 causal pairs; 4·16 FLOPs per pair and head forward, 8·16 backward */
    const int64_t n = 7, seg[3] = {0, 3, 7};
    const int nh = 2, nkv = 1, hd = 16;
    float *hq = ops_rand(&rng, n * nh * hd, 1, 0), *hk = ops_rand(&rng, n * nkv * hd, 1, 0);
    bk_buf_t q = ops_put(be, DT_BF16, hq, n * nh * hd), k = ops_put(be, DT_BF16, hk, n * nkv * hd),
             v = ops_put(be, DT_BF16, hk, n * nkv * hd), o = ops_put(be, DT_BF16, hq, n * nh * hd);
    float *lse = bk_alloc(be, (size_t)n * nh * sizeof(float), BK_MEM_OTHER, "lse");
    be->attn_fwd(be, o, lse, q, k, v, seg, 2, nh, nkv, hd);
    be->attn_bwd(be, q, k, v, o, q, k, v, o, lse, seg, 2, nh, nkv, hd);
    CHECK(be->sync(be) == 0);

    CHECK(row_is(be, "matmul NT 8x16x32 bf16 → f32", 2, 2 * 2.0 * M * N * K, 0));
    CHECK(row_is(be, "matmul NT 8x16x32 bf16 += f32", 1, 2.0 * M * N * K, 0));
    CHECK(row_is(be, "add f32 += bf16", 1, 0, 10.0 * M * N));
    CHECK(row_is(be, "attn_fwd bf16 hd16 2/1", 1, 4.0 * 16 * nh * hd, 0));
    CHECK(row_is(be, "attn_bwd bf16 hd16 2/1", 1, 8.0 * 16 * nh * hd, 0));
    bk_prof_row_t r;
    CHECK(bk_prof_row(be, "matmul NN 8x16x32 bf16 → f32", &r) < 0); /* no such call */

    /* the table */
    FILE *f = tmpfile();
    CHECK(f && bk_prof_write(be, f, 2.0) == 0);
    char text[16384];
    size_t len = f ? fread((rewind(f), text), 1, sizeof text - 1, f) : 0;
    text[len] = 0;
    if (f)
        fclose(f);
    CHECK(strstr(text, "Per-op times on cpu (host clock): ") == text);
    CHECK(strstr(text, " s wall (") != NULL);
    CHECK(strstr(text, "By op:\n\n| op | calls | ms | share | µs/call | TFLOP/s | GB/s |\n") != NULL);
    CHECK(strstr(text, "\n| matmul | 3 | ") != NULL);
    CHECK(strstr(text, "By op, shape and dtype:") != NULL);
    CHECK(strstr(text, "\n| matmul NT 8x16x32 bf16 → f32 | 2 | ") != NULL);
    CHECK(strstr(text, "\n| attn_bwd bf16 hd16 2/1 | 1 | ") != NULL);

    bk_prof_reset(be);
    bk_prof_row_t all;
    CHECK(bk_prof_row(be, NULL, &all) == 0 && all.calls == 0);
    CHECK(bk_prof_row(be, "add f32 += bf16", &r) < 0);
    be->scale(be, C, 0.5f, M * N);
    CHECK(row_is(be, "scale f32", 1, 0, 8.0 * M * N));
    free(ha), free(hb), free(hc), free(hq), free(hk);
    backend_free(be); /* with its buffers and the profile */

    /* an instance with every fused op: each wrapped; the planning backend */
    be = cpu_with("all");
    void (*plain_glu)(backend_t *, bk_buf_t, bk_buf_t, int64_t, int64_t) = be ? be->glu_fwd : NULL;
    CHECK(be && plain_glu && bk_prof_attach(be) == 0 && be->glu_fwd && be->glu_fwd != plain_glu &&
          be->adamw_multi && be->add_rmsnorm_fwd && be->qkv_rope && be->rope_qk && be->glu_bwd);
    backend_free(be);
    be = backend_plan_new("cuda");
    CHECK(be && bk_prof_attach(be) == 0);
    backend_free(be);
}

int main(void)
{
    ftk_set_tool("test_prof");
    test_same_bits();
    test_rows();
    TEST_END();
}
