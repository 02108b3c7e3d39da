/* flash_emu.cc — flash_mma.cuh's attention kernels run on the host, against the CPU backend,
 * so that their indexing (fragment layouts, masks, tiles, buffers) is checked on machines
 * without a GPU. The kernel source is the one the CUDA backend compiles; only the CUDA
 * surface it uses is emulated here:
 *  - a thread block is 128 fibers (ucontext) on one OS thread, switched at every barrier:
 *    __syncthreads waits for all 128, __syncwarp and every warp-wide primitive for the 32
 *    lanes of a warp (a barrier that can never complete — divergence, a lane that returned —
 *    fails the run: "deadlock");
 *  - ldmatrix, mma.sync m16n8k16 and the shuffles exchange the lanes' registers through the
 *    warp, element by element as mma_sync.cuh's specification says (PTX ISA); mma sums its
 *    16 products in fp32 in order (the tensor cores' order differs: last bits);
 *  - cp.async lands when its thread waits for its group (cp.async.wait_group), not before;
 *    shared memory starts as 0xff bytes (bf16 NaN) in every block, and every shared access
 *    (the primitives, st_shared/ld_shared) is checked against the launch's size and its
 *    alignment, and for races, as compute-sanitizer's racecheck would on a GPU: a 4-byte
 *    word read before anything wrote it, or while a cp.async into it is in flight, or
 *    written by another warp since the last __syncthreads (no barrier orders the two);
 *    a word written (a store, a cp.async issued) that another warp read since the last
 *    barrier, or that another write has not finished with. Within a warp, program order.
 * The backend is the CPU one with attn_fwd/attn_bwd replaced by the emulated kernels, run
 * through tests/ops (ops_run) beside the plain CPU backend: the bf16 attention cases of the
 * op table that the CUDA backend would give these kernels (16-byte aligned, head dims
 * multiples of 16), and cases of its own with segments longer than a tile (the unmasked
 * path) and GQA. Bounds as tests/gpu/gpu_ops.c's for the tensor-core kernels.
 * Exit 0 pass, 1 fail. */
#include <ucontext.h>

#include <functional>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../../formats/dtype.h"
#include "../../kernels/backend.h"
#include "../../libcommon/log.h"
#include "../ops/ops_table.h"
}

/* ---- the CUDA surface ------------------------------------------------------------------ */

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__
#define __align__(n)

struct emu_dim3 {
    unsigned x, y, z;
};

static inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

namespace emu {
enum { THREADS = 128, WARPS = THREADS / 32, STACK = 256 << 10 };
enum { RUN, AT_WARP, AT_BLOCK, DONE };
struct fiber {
    ucontext_t ctx;
    emu_dim3 tid;
    int state, parity;
    char *stack;
};
static fiber fib[THREADS];
static ucontext_t sched;
static int cur;
static emu_dim3 block;
static std::function<void()> *body;
static char fault[256]; /* the first failure, "" when none */
static const unsigned char *smem_base;
static size_t smem_size;

/* The race check's state of each 4-byte shared word in this block: the barriers passed so
 * far (epoch), who last wrote a word and in which epoch (wr_thread -1: never), a cp.async
 * in flight into it (pend_thread, -1: none), which warp read it in which epoch (rd_warp
 * MULTI: more than one). */
enum { MULTI = -2, WORDS = (227 << 10) / 4 };
struct word {
    int32_t wr_thread, pend_thread, rd_warp;
    uint32_t wr_epoch, rd_epoch;
};
static word shadow[WORDS];
static uint32_t epoch;
/* each thread's cp.async copies not yet landed: group = the commits before it was issued */
struct pending {
    unsigned char *dst;
    const unsigned char *src;
    int bytes, group;
};
static pending pend[THREADS][64];
static int n_pend[THREADS], commits[THREADS];

/* Two exchange areas a warp, used in turn: a lane writes one only after the barrier that
 * ended every lane's reads of it (the one of the primitive before). */
struct xch {
    uint32_t u[32][6];
    float f[32];
    const uint16_t *p[32];
};
static xch X[WARPS][2];

static void failf(const char *what)
{
    if (!fault[0])
        snprintf(fault, sizeof fault, "block (%u, %u) thread %d: %s", block.x, block.y, cur, what);
}
static void wait(int kind)
{
    fib[cur].state = kind;
    swapcontext(&fib[cur].ctx, &sched);
}
static xch &slot()
{
    xch &x = X[cur >> 5][fib[cur].parity];
    fib[cur].parity ^= 1;
    return x;
}
/* Whether an access of `bytes` (4 or 16) at p is inside the launch's shared memory and
 * aligned to its size; a failure is recorded (and the race check skips the access). */
static bool check_smem(const void *p, size_t bytes, const char *what)
{
    const unsigned char *c = (const unsigned char *)p;
    if (c < smem_base || c + bytes > smem_base + smem_size)
        failf(what), fprintf(stderr, "%s: address outside the block's shared memory\n", what);
    else if ((uintptr_t)p % bytes)
        failf(what), fprintf(stderr, "%s: address not %zu-byte aligned\n", what, bytes);
    else
        return true;
    return false;
}
static void entry() { (*body)(), fib[cur].state = DONE; }

static void hazard(size_t word, const char *what, int other)
{
    char m[200];
    snprintf(m, sizeof m, "race at shared byte %zu: %s (thread %d)", 4 * word, what, other);
    failf(m);
}
static size_t word_of(const void *p) { return (size_t)((const unsigned char *)p - smem_base) / 4; }

/* The current thread's warp reads bytes at p (within the block's shared memory). */
static void smem_read(const void *p, size_t bytes)
{
    int w = cur >> 5;
    for (size_t i = word_of(p), e = i + bytes / 4; i < e; i++) {
        word &x = shadow[i];
        if (x.pend_thread >= 0)
            hazard(i, "read while a cp.async into it is in flight", x.pend_thread);
        else if (x.wr_thread < 0)
            hazard(i, "read before anything wrote it", cur);
        else if (x.wr_epoch == epoch && x.wr_thread >> 5 != w)
            hazard(i, "read after another warp's write with no barrier between", x.wr_thread);
        if (x.rd_epoch != epoch)
            x.rd_epoch = epoch, x.rd_warp = w;
        else if (x.rd_warp != w)
            x.rd_warp = MULTI;
    }
}
/* The current thread is about to write (or start a cp.async into) bytes at p. */
static void smem_write(const void *p, size_t bytes)
{
    int w = cur >> 5;
    for (size_t i = word_of(p), e = i + bytes / 4; i < e; i++) {
        const word &x = shadow[i];
        if (x.rd_epoch == epoch && x.rd_warp != w)
            hazard(i, "written while another warp may still read it (no barrier since its read)", cur);
        if (x.pend_thread >= 0)
            hazard(i, "written while a cp.async into it is in flight", x.pend_thread);
        else if (x.wr_thread >= 0 && x.wr_epoch == epoch && x.wr_thread >> 5 != w)
            hazard(i, "written by two warps with no barrier between", x.wr_thread);
    }
}
static void smem_written(const void *p, size_t bytes)
{
    for (size_t i = word_of(p), e = i + bytes / 4; i < e; i++)
        shadow[i].wr_thread = cur, shadow[i].wr_epoch = epoch, shadow[i].pend_thread = -1;
}
/* A new block: no word written or read, no copy in flight. */
static void smem_reset()
{
    for (size_t i = 0; i < smem_size / 4; i++)
        shadow[i] = word{-1, -1, -1, UINT32_MAX, UINT32_MAX};
    epoch = 0;
    memset(n_pend, 0, sizeof n_pend);
    memset(commits, 0, sizeof commits);
}

/* Runs f as one block's 128 threads; -1 on a deadlock. */
static int run_block(std::function<void()> &f)
{
    body = &f;
    for (int t = 0; t < THREADS; t++) {
        fiber *b = &fib[t];
        if (!b->stack && !(b->stack = (char *)malloc(STACK))) {
            snprintf(fault, sizeof fault, "out of memory");
            return -1;
        }
        b->tid = {(unsigned)t, 0, 0};
        b->state = RUN;
        b->parity = 0;
        getcontext(&b->ctx);
        b->ctx.uc_stack.ss_sp = b->stack;
        b->ctx.uc_stack.ss_size = STACK;
        b->ctx.uc_link = &sched;
        makecontext(&b->ctx, entry, 0);
    }
    for (;;) {
        for (int t = 0; t < THREADS; t++)
            if (fib[t].state == RUN) {
                cur = t;
                swapcontext(&sched, &fib[t].ctx);
            }
        int done = 0, at_block = 0, released = 0;
        for (int w = 0; w < WARPS; w++) {
            int at = 0;
            for (int l = 0; l < 32; l++)
                at += fib[w * 32 + l].state == AT_WARP;
            if (at == 32)
                for (int l = 0; l < 32; l++)
                    fib[w * 32 + l].state = RUN, released = 1;
        }
        for (int t = 0; t < THREADS; t++)
            done += fib[t].state == DONE, at_block += fib[t].state == AT_BLOCK;
        if (done == THREADS)
            return 0;
        if (at_block == THREADS) {
            epoch++;
            for (int t = 0; t < THREADS; t++)
                fib[t].state = RUN, released = 1;
        }
        if (!released) {
            snprintf(fault, sizeof fault, "block (%u, %u): deadlock (%d threads returned, %d at __syncthreads)",
                     block.x, block.y, done, at_block);
            return -1;
        }
    }
}

/* Every block of the grid, one after the other, each with fresh shared memory. */
static int launch(emu_dim3 grid, size_t smem_bytes, const std::function<void()> &kernel);
} /* namespace emu */

#define threadIdx (emu::fib[emu::cur].tid)
#define blockIdx (emu::block)
static inline void __syncthreads() { emu::wait(emu::AT_BLOCK); }
static inline float __shfl_xor_sync(unsigned, float v, int mask)
{
    emu::xch &x = emu::slot();
    int lane = emu::cur & 31;
    x.f[lane] = v;
    emu::wait(emu::AT_WARP);
    return x.f[lane ^ mask];
}

#include "../../kernels/cuda/common.cuh"

/* mma_sync.cuh's primitives, from its specification */
namespace fm {
alignas(128) unsigned char smem[227 << 10]; /* the kernels' extern __shared__ smem[] */

static inline void ldsm(uint32_t r[4], const uint16_t *p, bool trans)
{
    if (emu::check_smem(p, 16, trans ? "ldmatrix.trans" : "ldmatrix"))
        emu::smem_read(p, 16);
    emu::xch &x = emu::slot();
    int lane = emu::cur & 31, g = lane >> 2, t = lane & 3;
    x.p[lane] = p;
    emu::wait(emu::AT_WARP);
    for (int i = 0; i < 4; i++)
        r[i] = trans ? x.p[8 * i + 2 * t][g] | (uint32_t)x.p[8 * i + 2 * t + 1][g] << 16
                     : x.p[8 * i + g][2 * t] | (uint32_t)x.p[8 * i + g][2 * t + 1] << 16;
}
static inline void ldsm_x4(uint32_t r[4], const uint16_t *p) { ldsm(r, p, false); }
static inline void ldsm_x4_t(uint32_t r[4], const uint16_t *p) { ldsm(r, p, true); }

/* element `half` (0: the low 16 bits) of a register holding two bf16 */
static inline float bf16_half(uint32_t reg, int half) { return bf16_to_f32((uint16_t)(reg >> (16 * half))); }

static long mma_count; /* warp-wide mma.sync issued: the work the kernels do */

static inline void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    mma_count += (emu::cur & 31) == 0;
    emu::xch &x = emu::slot();
    int lane = emu::cur & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++)
        x.u[lane][i] = a[i];
    x.u[lane][4] = b0;
    x.u[lane][5] = b1;
    emu::wait(emu::AT_WARP);
    for (int c = 0; c < 4; c++) {
        int row = g + 8 * (c >> 1), col = 2 * t + (c & 1);
        float s = 0;
        for (int k = 0; k < 16; k++) {
            /* A(row, k): lane (row % 8)·4 + (k % 8)/2, register row/8 + 2·(k/8); B(k, col):
             * lane col·4 + (k % 8)/2, register b0 or b1 by k/8; element k % 2 of the pair */
            float av = bf16_half(x.u[(row & 7) * 4 + ((k & 7) >> 1)][(row >> 3) + 2 * (k >> 3)], k & 1);
            float bv = bf16_half(x.u[col * 4 + ((k & 7) >> 1)][4 + (k >> 3)], k & 1);
            s += av * bv;
        }
        d[c] += s;
    }
}

static inline uint32_t pack_bf16(float lo, float hi)
{
    return f32_to_bf16_dev(lo) | (uint32_t)f32_to_bf16_dev(hi) << 16;
}

/* Issued now, landing at this thread's cp_async_wait that covers its group. */
static inline void cp_async16(void *dst, const void *src, int bytes)
{
    if ((uintptr_t)src % 16)
        emu::failf("cp.async: source not 16-byte aligned");
    int t = emu::cur;
    if (!emu::check_smem(dst, 16, "cp.async"))
        return;
    if (emu::n_pend[t] == 64) {
        emu::failf("more than 64 cp.async in flight in one thread (the emulator's limit)");
        return;
    }
    emu::smem_write(dst, 16);
    emu::pend[t][emu::n_pend[t]++] = {(unsigned char *)dst, (const unsigned char *)src, bytes, emu::commits[t]};
    for (size_t i = emu::word_of(dst), e = i + 4; i < e; i++)
        emu::shadow[i].pend_thread = t;
}
static inline void cp_async_commit() { emu::commits[emu::cur]++; }
/* The copies of every group but the N newest committed ones land. */
template <int N> static inline void cp_async_wait()
{
    int t = emu::cur, k = 0;
    for (int i = 0; i < emu::n_pend[t]; i++) {
        emu::pending c = emu::pend[t][i];
        if (c.group < emu::commits[t] - N) {
            if (c.bytes == 16)
                memcpy(c.dst, c.src, 16);
            else
                memset(c.dst, 0, 16);
            emu::smem_written(c.dst, 16);
        } else {
            emu::pend[t][k++] = c;
        }
    }
    emu::n_pend[t] = k;
}

static inline void st_shared(float *p, float v)
{
    if (!emu::check_smem(p, 4, "st.shared"))
        return;
    emu::smem_write(p, 4);
    *p = v;
    emu::smem_written(p, 4);
}
static inline float ld_shared(const float *p)
{
    if (emu::check_smem(p, 4, "ld.shared"))
        emu::smem_read(p, 4);
    return *p;
}
} /* namespace fm */

#include "../../kernels/cuda/flash_mma.cuh"

int emu::launch(emu_dim3 grid, size_t smem_bytes, const std::function<void()> &kernel)
{
    if (smem_bytes > sizeof fm::smem) {
        snprintf(fault, sizeof fault, "%zu bytes of shared memory: over the 227 KiB a block may have", smem_bytes);
        return -1;
    }
    smem_base = fm::smem;
    smem_size = smem_bytes;
    std::function<void()> f = kernel;
    for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) {
            block = {x, y, 0};
            memset(fm::smem, 0xff, smem_bytes);
            smem_reset();
            if (run_block(f) < 0 || fault[0])
                return -1;
        }
    return 0;
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
    emu_dim3 grid = {(unsigned)((n + fm::BM - 1) / fm::BM), (unsigned)n_head, 1};
    on_hd(hd, [&](auto HD) {
        return emu::launch(grid, fm::lay<HD>::fwd, [&] {
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
    emu_dim3 gq = {(unsigned)((n + fm::BM - 1) / fm::BM), (unsigned)n_head, 1};
    emu_dim3 gk = {(unsigned)((n + fm::BN - 1) / fm::BN), (unsigned)n_kv, 1};
    const uint16_t *qq = (const uint16_t *)q.p, *kk = (const uint16_t *)k.p, *vv = (const uint16_t *)v.p;
    on_hd(hd, [&](auto HD) {
        if (emu::launch(gq, fm::lay<HD>::dq, [&] {
                fm::dq_kernel<HD>((uint16_t *)dq.p, g, qq, kk, vv, lse, D, seg, n_seg, n, n_head, n_kv, scale);
            }) < 0)
            return -1;
        return emu::launch(gk, fm::lay<HD>::dkv, [&] {
            fm::dkv_kernel<HD>((uint16_t *)dk.p, (uint16_t *)dv.p, g, qq, kk, vv, lse, D, seg, n_seg, n, n_head,
                               n_kv, scale);
        });
    });
    free(D);
    kernel_runs++;
}

/* ---- the cases --------------------------------------------------------------------------- */

#define U_BF16 (1.0 / 256)
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

/* gpu_ops.c's bound for the tensor-core kernels' outputs: the op's fp32 bound, a bf16
 * rounding of the result, 4u for P and dS rounded to bf16 (bf16 outputs measured against
 * their row's rms) */
static double bound(const ops_case_t *c, const ops_out_t *o)
{
    double b = c->op == OP_ATTN_BWD ? 3e-4 : 1e-5;
    if (o->dt == DT_BF16)
        b += 2 * U_BF16 * o->rounds + 4 * U_BF16;
    return b;
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
    for (int k = 0; k < ops_table_len + n_own; k++) {
        const ops_case_t *c = k < ops_table_len ? &ops_table[k] : &own[k - ops_table_len];
        /* what the CUDA backend gives these kernels (flash_ok): bf16, 16-byte rows */
        if ((c->op != OP_ATTN_FWD && c->op != OP_ATTN_BWD) || !(c->cfgs & OPS_CFG(OPS_BF16)) || c->offset ||
            c->hd % 16)
            continue;
        run_case(C, E, c, seed + (uint64_t)k);
    }
    printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
    backend_free(E);
    backend_free(C);
    return failures ? 1 : 0;
}
