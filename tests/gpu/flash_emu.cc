/* flash_emu.cc — flash_mma.cuh's attention kernels run on the host, against the CPU backend,
 * so that their indexing (fragment layouts, masks, tiles, buffers) is checked on machines
 * without a GPU. The kernel source is the one the CUDA backend compiles, made plain C++ by
 * tests/gpu/emu/launches.pl; tests/gpu/emu/emu.h runs a block as 128 fibers and checks
 * every shared-memory access of the kernels' primitives (emu_mma_sync.h: bounds,
 * alignment, races as compute-sanitizer's racecheck would find them).
 * gpu_ops on the emulation of the whole backend (the Makefile's gpu_ops_emu) runs these
 * kernels on the op table too; this test adds segments longer than a tile (the unmasked
 * path), GQA, a packed row of 512 as ftk-pack makes them, and counts the mma.sync issued.
 * The backend is the CPU one with attn_fwd/attn_bwd replaced by the emulated kernels, run
 * through tests/ops (ops_run) beside the plain CPU backend: the bf16 attention cases of the
 * op table that the CUDA backend would give these kernels (16-byte aligned, head dims
 * multiples of 16), and cases of its own. Bounds as tests/gpu/gpu_ops.c's for the
 * tensor-core kernels.
 * Exit 0 pass, 1 fail. */
#include "emu_mma_sync.h"

#include <type_traits>

extern "C" {
#include "../../libcommon/dtype.h"
#include "../../kernels/backend.h"
#include "../../libcommon/log.h"
#include "../ops/ops_table.h"
}

#include "flash_mma.cuh" /* launches.pl's copy (the build's tests/emu) */

/* Every block of the grid, 128 threads each; -1 with emu::fault set on a failure. */
static int launch(const char *name, dim3 grid, size_t smem, const std::function<void()> &kernel)
{
    int rc = emu::run_grid(name, grid, dim3(fm::THREADS), smem, kernel);
    if (rc == -2)
        snprintf(emu::fault, sizeof emu::fault, "%s", emu::refused);
    return rc < 0 ? -1 : 0;
}

/* ---- the emulated backend ops ---------------------------------------------------------- */

/* Calls f with std::integral_constant<int, hd> for Llama's head dimensions. */
template <typename F> static int on_hd(int hd, F &&f)
{
    switch (hd) {
    case 64: return f(std::integral_constant<int, 64>());
    case 80: return f(std::integral_constant<int, 80>());
    case 96: return f(std::integral_constant<int, 96>());
    case 128: return f(std::integral_constant<int, 128>());
    }
    snprintf(emu::fault, sizeof emu::fault, "head dimension %d not emulated", hd);
    return -1;
}

static int kernel_runs;

static void emu_attn_fwd(backend_t *, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int64_t *seg,
                         int64_t n_seg, int n_head, int n_kv, int hd)
{
    int64_t n = seg[n_seg];
    float scale = 1.0f / sqrtf((float)hd);
    dim3 grid = {(unsigned)((n + fm::BM - 1) / fm::BM), (unsigned)n_head, 1};
    on_hd(hd, [&](auto HD) {
        return launch("fm::fwd_kernel", grid, fm::lay<HD>::fwd, [&] {
            fm::fwd_kernel<HD>((uint16_t *)out.p, lse, (const uint16_t *)q.p, (const uint16_t *)k.p,
                               (const uint16_t *)v.p, seg, n_seg, n, n_head, n_kv, scale);
        });
    });
    kernel_runs++;
}

static void emu_attn_bwd(backend_t *, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k,
                         bk_buf_t v, bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head,
                         int n_kv, int hd)
{
    int64_t n = seg[n_seg], rows = n * n_head;
    float scale = 1.0f / sqrtf((float)hd);
    /* D = dout·out per (token, head) row (fa::dsum_kernel on the GPU) */
    float *D = (float *)ops_xmalloc((size_t)rows * sizeof *D);
    const uint16_t *g = (const uint16_t *)dout.p, *o = (const uint16_t *)out.p;
    for (int64_t r = 0; r < rows; r++) {
        float s = 0;
        for (int c = 0; c < hd; c++)
            s += bf16_to_f32(g[r * hd + c]) * bf16_to_f32(o[r * hd + c]);
        D[r] = s;
    }
    dim3 gq = {(unsigned)((n + fm::BM - 1) / fm::BM), (unsigned)n_head, 1};
    dim3 gk = {(unsigned)((n + fm::BN - 1) / fm::BN), (unsigned)n_kv, 1};
    const uint16_t *qq = (const uint16_t *)q.p, *kk = (const uint16_t *)k.p, *vv = (const uint16_t *)v.p;
    on_hd(hd, [&](auto HD) {
        if (launch("fm::dq_kernel", gq, fm::lay<HD>::dq, [&] {
                fm::dq_kernel<HD>((uint16_t *)dq.p, g, qq, kk, vv, lse, D, seg, n_seg, n, n_head, n_kv, scale);
            }) < 0)
            return -1;
        return launch("fm::dkv_kernel", gk, fm::lay<HD>::dkv, [&] {
            fm::dkv_kernel<HD>((uint16_t *)dk.p, (uint16_t *)dv.p, g, qq, kk, vv, lse, D, seg, n_seg, n, n_head,
                               n_kv, scale);
        });
    });
    free(D);
    kernel_runs++;
}

/* ---- the cases --------------------------------------------------------------------------- */

/* segments longer than a 64-row tile (whole tiles unmasked) beside one-token ones */
static const int64_t seg_330[] = {0, 1, 200, 201, 330};
static const int64_t seg_260[] = {0, 130, 131, 260};
/* a packed row of 512 as ftk-pack makes them from Alpaca (samples of 40–187 tokens, the
 * padding last); the segment from 303 (≡ 15 mod 16) puts a warp's last row alone at the
 * start of a 16-column group of its key tiles: the per-warp skipping's edge */
static const int64_t seg_512[] = {0, 187, 263, 303, 455, 497, 512};
static ops_case_t attn_case(ops_op_t op, int n_head, int n_kv, int hd, const int64_t *seg, int64_t n_seg)
{
    ops_case_t c;
    memset(&c, 0, sizeof c);
    c.op = op, c.cfgs = OPS_CFG(OPS_BF16), c.n_head = n_head, c.n_kv = n_kv, c.hd = hd, c.seg = seg, c.n_seg = n_seg;
    return c;
}
static const ops_case_t own[] = {
    attn_case(OP_ATTN_FWD, 4, 2, 64, seg_330, 4),
    attn_case(OP_ATTN_BWD, 4, 2, 64, seg_330, 4),
    attn_case(OP_ATTN_FWD, 2, 1, 128, seg_260, 3),
    attn_case(OP_ATTN_BWD, 2, 1, 128, seg_260, 3),
    attn_case(OP_ATTN_FWD, 2, 2, 128, seg_512, 6),
    attn_case(OP_ATTN_BWD, 2, 2, 128, seg_512, 6),
};

static int failures;

/* gpu_ops.c's bound for the tensor-core kernels' outputs (the op's descriptor's): the op's
 * fp32 bound, a bf16 rounding of the result, 4u for P and dS rounded to bf16 (bf16 outputs
 * measured against their row's rms) */
static double bound(const ops_case_t *c, const ops_out_t *o)
{
    return ops_gpu_tol(c, OPS_BF16, o, 1, ops_flash_rows(c, o));
}

static void run_case(backend_t *C, backend_t *E, const ops_case_t *c, uint64_t seed)
{
    char name[128];
    ops_case_name(c, name, sizeof name);
    ops_result_t rc, re;
    if (ops_run(C, c, OPS_BF16, seed, 1, &rc) < 0) {
        printf("FAIL %s on the CPU: %s\n", name, ftk_err_msg());
        failures++;
        return;
    }
    int runs = kernel_runs;
    long mma0 = fm::mma_count;
    emu::fault[0] = 0;
    if (ops_run(E, c, OPS_BF16, seed, 1, &re) < 0 || emu::fault[0] || kernel_runs == runs) {
        printf("FAIL %s emulated: %s\n", name, emu::fault[0] ? emu::fault : "the kernels did not run");
        failures++;
        ops_result_free(&rc);
        return;
    }
    printf("     %s: %ld mma.sync (m16n8k16, per warp)\n", name, fm::mma_count - mma0);
    for (int i = 0; i < rc.n_out; i++) {
        const ops_out_t *o = &rc.out[i];
        ops_err_t e = o->dt == DT_BF16 ? ops_compare_rows(o->v, re.out[i].v, o->n, c->hd)
                                       : ops_compare(o->v, re.out[i].v, o->n);
        double b = bound(c, o);
        int ok = e.nan == 0 && e.max_rel <= b;
        printf("%-4s %s %s: error %.3e at %lld (bound %.1e)%s\n", ok ? "ok" : "FAIL", name, o->name, e.max_rel,
               (long long)e.worst, b, e.nan ? ", NaN or unwritten elements" : "");
        failures += !ok;
    }
    ops_result_free(&rc);
    ops_result_free(&re);
}

int main(void)
{
    const char *s = getenv("FTK_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : 20261123;
    backend_t *C = backend_cpu_new(), *E = C ? backend_cpu_new() : NULL;
    if (!E) {
        printf("FAIL: %s\n", ftk_err_msg());
        return 1;
    }
    E->attn_fwd = emu_attn_fwd;
    E->attn_bwd = emu_attn_bwd;
    printf("seed %llu (FTK_SEED): flash_mma.cuh emulated on the host against the CPU backend, bf16\n",
           (unsigned long long)seed);
    int n_own = (int)(sizeof own / sizeof *own);
    int n_table = ops_n_cases(0);
    for (int k = 0; k < n_table + n_own; k++) {
        const ops_case_t *c = k < n_table ? ops_case_at(k) : &own[k - n_table];
        /* what the CUDA backend gives these kernels (flash_ok): bf16, 16-byte rows */
        if (!OPS_DESC(c->op)->flash || !(c->cfgs & OPS_CFG(OPS_BF16)) || c->offset || c->hd % 16)
            continue;
        run_case(C, E, c, seed + (uint64_t)k);
    }
    printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
    backend_free(E);
    backend_free(C);
    return failures ? 1 : 0;
}
