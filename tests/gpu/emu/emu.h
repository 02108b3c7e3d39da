/* emu.h — CUDA kernels run on the host: a thread block as fibers on one OS thread, the
 * blocks of a grid one after the other. With it the kernel sources the CUDA backend
 * compiles run here, on machines without a GPU, against the CPU backend
 * (tests/gpu/flash_emu.cc: flash_mma.cuh's kernels; with emu_runtime.h and launches.pl
 * the whole backend, kernels/cuda's files: emu.mk's gpu_ops_emu and tests/emu/bin).
 *
 * What is emulated, and how strictly:
 *  - a block of up to 1024 threads (x fastest) is that many fibers, each running until it
 *    reaches a barrier: __syncthreads waits for every thread of the block, __syncwarp and
 *    every warp-wide primitive for the lanes of its warp. A barrier that can never
 *    complete (divergence; a thread that returned while others wait) fails the launch:
 *    "deadlock". Between barriers a fiber runs alone, in program order, so a thread that
 *    reads what another wrote without a barrier between them reads stale data here;
 *  - shuffles (__shfl_xor_sync) exchange values through the warp;
 *  - dynamic shared memory (extern __shared__) is one buffer, filled with 0xff bytes
 *    (bf16 NaN) at every block; the accesses made through emu_mma_sync.h's primitives
 *    (ldmatrix, cp.async, st_shared/ld_shared) are checked against the launch's size, their
 *    alignment, and for races as compute-sanitizer's racecheck would (see smem_read);
 *    static __shared__ arrays are function statics (one block runs at a time; unchecked,
 *    and a block sees what the block before it left there, where a GPU's is undefined);
 *  - everything else is plain host C++: global memory is host memory; a 16-byte vector
 *    access that is not 16-byte aligned faults as on the GPU (the vector types are
 *    16-byte aligned, so the compiler moves them with aligned instructions), and a fault
 *    is reported with the kernel, block and thread (exit 3).
 * The first failure is kept in emu::fault ("" when none). Not emulated: global-memory
 * races, concurrency between streams (every launch runs to its end when issued), the
 * hardware's rounding of expf and of tensor-core sums (last bits). */
#pragma once
#include <setjmp.h>
#include <signal.h>
#include <ucontext.h>

#include <functional>
#include <type_traits>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "../../../libcommon/dtype.h" /* bf16_to_f32, f32_to_bf16 */
}

/* ---- the CUDA surface ------------------------------------------------------------------ */

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

static inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* round to nearest, never contracted: this file is built with -ffp-contract=off */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> static inline T max(T a, T b) { return a < b ? b : a; }
/* sin(πx) and cos(πx); x reduced modulo 2 first (exact), as the device's reduction is */
static inline void sincospi(double x, double *s, double *c)
{
    double r = fmod(x, 2.0);
    *s = sin(M_PI * r);
    *c = cos(M_PI * r);
}

namespace emu {
enum { MAX_THREADS = 1024, MAX_WARPS = MAX_THREADS / 32, STACK = 256 << 10, SMEM = 227 << 10 };
enum { RUN, AT_WARP, AT_BLOCK, DONE };
struct fiber {
    void *sp;        /* x86-64: its stack pointer where it stopped */
    ucontext_t uc;   /* elsewhere: only to enter it the first time */
    jmp_buf jb;      /* elsewhere: where it stopped */
    dim3 tid;
    int state, parity;
    char *stack;
};
static fiber fib[MAX_THREADS];
static int cur, n_threads, n_made;
static dim3 block, block_dim, grid_dim;
static const char *kernel_name = "";
static std::function<void()> *body;
static char fault[512]; /* the first failure, "" when none */
alignas(128) static unsigned char dyn_smem[SMEM];
static size_t smem_size;

/* The race check's state of each 4-byte word of dynamic shared memory in this block: the
 * barriers passed so far (epoch), who last wrote a word and in which epoch (wr_thread -1:
 * never), a cp.async in flight into it (pend_thread, -1: none), which warp read it in
 * which epoch (rd_warp MULTI: more than one). */
enum { MULTI = -2, WORDS = SMEM / 4 };
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
enum { MAX_PEND = 64 };
static pending pend[MAX_THREADS][MAX_PEND];
static int n_pend[MAX_THREADS], commits[MAX_THREADS];

/* Two exchange areas a warp, used in turn: a lane writes one only after the barrier that
 * ended every lane's reads of it (the one of the primitive before). */
struct xch {
    uint32_t u[32][6];
    double d[32];
    const uint16_t *p[32];
    float a[256], b[256]; /* WMMA's operand tiles (include/mma.h) */
};
static xch X[MAX_WARPS][2];

static void failf(const char *what)
{
    if (!fault[0])
        snprintf(fault, sizeof fault, "%s, block (%u, %u, %u) thread %d: %s", kernel_name, block.x, block.y,
                 block.z, cur, what);
}

/* ---- fibers ------------------------------------------------------------------------------- */

/* Every fiber runs the block's body as thread `cur`, again and again, going back to the
 * scheduler in between. On x86-64 a switch saves the callee-saved registers on the stack
 * it leaves (emu_switch, below); elsewhere a fiber is entered once through its ucontext
 * and later switches are _setjmp/_longjmp (swapcontext makes two system calls a switch). */
#if defined(__x86_64__)
extern "C" void emu_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n");
static void *sched_sp;
static void fiber_main()
{
    for (;;) {
        (*body)();
        fib[cur].state = DONE;
        emu_switch(&fib[cur].sp, sched_sp);
    }
}
static int make_fiber(int t)
{
    fiber *f = &fib[t];
    if (!(f->stack = (char *)malloc(STACK)))
        return -1;
    /* as if emu_switch had left it: six registers, then fiber_main as the return address,
     * then a (never used) return address of its own, so that fiber_main starts with the
     * stack aligned as after a call */
    void **top = (void **)(((uintptr_t)f->stack + STACK) & ~(uintptr_t)15);
    top[-1] = NULL;
    top[-2] = (void *)fiber_main;
    for (int i = 3; i <= 8; i++)
        top[-i] = NULL;
    f->sp = top - 8;
    return 0;
}
static void resume(int t)
{
    cur = t;
    emu_switch(&sched_sp, fib[t].sp);
}
static void wait(int kind)
{
    fiber *f = &fib[cur];
    f->state = kind;
    emu_switch(&f->sp, sched_sp);
}
#else
static jmp_buf sched;
static int making; /* the fiber make_fiber enters */
static void fiber_main()
{
    int t = making;
    for (;;) {
        if (!_setjmp(fib[t].jb))
            _longjmp(sched, 1);
        (*body)();
        fib[t].state = DONE;
    }
}
static int make_fiber(int t)
{
    fiber *f = &fib[t];
    if (!(f->stack = (char *)malloc(STACK)))
        return -1;
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, fiber_main, 0);
    making = t;
    ucontext_t here;
    if (!_setjmp(sched))
        swapcontext(&here, &f->uc);
    return 0;
}
static void resume(int t)
{
    cur = t;
    if (!_setjmp(sched))
        _longjmp(fib[t].jb, 1);
}
static void wait(int kind)
{
    int t = cur;
    fib[t].state = kind;
    if (!_setjmp(fib[t].jb))
        _longjmp(sched, 1);
}
#endif
static xch &slot()
{
    xch &x = X[cur >> 5][fib[cur].parity];
    fib[cur].parity ^= 1;
    return x;
}

/* ---- dynamic shared memory checks ------------------------------------------------------ */

/* Whether an access of `bytes` (4 or 16) at p is inside the launch's shared memory and
 * aligned to its size; a failure is recorded (and the race check skips the access). */
static bool check_smem(const void *p, size_t bytes, const char *what)
{
    const unsigned char *c = (const unsigned char *)p;
    char m[160];
    if (c < dyn_smem || c + bytes > dyn_smem + smem_size)
        snprintf(m, sizeof m, "%s: address outside the block's shared memory", what);
    else if ((uintptr_t)p % bytes)
        snprintf(m, sizeof m, "%s: address not %zu-byte aligned", what, bytes);
    else
        return true;
    failf(m);
    return false;
}
static void hazard(size_t word, const char *what, int other)
{
    char m[200];
    snprintf(m, sizeof m, "race at shared byte %zu: %s (thread %d)", 4 * word, what, other);
    failf(m);
}
static size_t word_of(const void *p) { return (size_t)((const unsigned char *)p - dyn_smem) / 4; }

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
    memset(dyn_smem, 0xff, smem_size);
    for (size_t i = 0; i < smem_size / 4; i++)
        shadow[i] = word{-1, -1, -1, UINT32_MAX, UINT32_MAX};
    epoch = 0;
    memset(n_pend, 0, sizeof(int) * (size_t)n_threads);
    memset(commits, 0, sizeof(int) * (size_t)n_threads);
}

/* ---- blocks and grids --------------------------------------------------------------------- */

/* A fault in a kernel (a misaligned vector access, an address out of bounds) ends the
 * process with the kernel, block and thread it happened in. */
static void on_signal(int sig)
{
    char m[600];
    int n = snprintf(m, sizeof m, "emulated kernel %s, block (%u, %u, %u) thread %d: %s (a misaligned 16-byte access "
                     "or an address out of bounds)\n", kernel_name, block.x, block.y, block.z, cur, strsignal(sig));
    if (n > 0 && write(2, m, (size_t)n < sizeof m ? (size_t)n : sizeof m - 1) < 0)
        _exit(3);
    _exit(3);
}

/* Runs the body as one block of n_threads threads; -1 on a deadlock. */
static int run_block()
{
    for (int t = 0; t < n_threads; t++) {
        fiber *f = &fib[t];
        f->tid = dim3((unsigned)t % block_dim.x, (unsigned)t / block_dim.x % block_dim.y,
                      (unsigned)t / (block_dim.x * block_dim.y));
        f->state = RUN;
        f->parity = 0;
    }
    for (;;) {
        for (int t = 0; t < n_threads; t++)
            if (fib[t].state == RUN)
                resume(t);
        int done = 0, at_block = 0, released = 0;
        for (int w = 0; w * 32 < n_threads; w++) {
            int at = 0, lanes = n_threads - w * 32 < 32 ? n_threads - w * 32 : 32;
            for (int l = 0; l < lanes; l++)
                at += fib[w * 32 + l].state == AT_WARP;
            if (at == lanes)
                for (int l = 0; l < lanes; l++)
                    fib[w * 32 + l].state = RUN, released = 1;
        }
        for (int t = 0; t < n_threads; t++)
            done += fib[t].state == DONE, at_block += fib[t].state == AT_BLOCK;
        if (done == n_threads)
            return 0;
        if (at_block == n_threads) {
            epoch++;
            for (int t = 0; t < n_threads; t++)
                fib[t].state = RUN, released = 1;
        }
        if (!released) {
            char m[120];
            snprintf(m, sizeof m, "deadlock (%d threads returned, %d at __syncthreads, the others at a warp barrier)",
                     done, at_block);
            failf(m);
            return -1;
        }
    }
}

/* Every block of the grid, one after the other, each with fresh shared memory. -1 with
 * fault set when a block fails; -2 with refused set, and nothing run, for a configuration
 * the GPU refuses (its launch fails; the context lives on). */
static char refused[256];
static int run_grid(const char *name, dim3 g, dim3 b, size_t smem, const std::function<void()> &kernel)
{
    long threads = (long)b.x * b.y * b.z;
    if (threads < 1 || threads > MAX_THREADS || b.z > 64 || g.x < 1 || g.y < 1 || g.z < 1 || g.x > 0x7fffffffu ||
        g.y > 65535 || g.z > 65535) {
        snprintf(refused, sizeof refused, "%s: launch configuration the GPU refuses: grid (%u, %u, %u), block (%u, %u, %u)",
                 name, g.x, g.y, g.z, b.x, b.y, b.z);
        return -2;
    }
    if (smem > SMEM) {
        snprintf(refused, sizeof refused, "%s: %zu bytes of dynamic shared memory, over the 227 KiB a block may have",
                 name, smem);
        return -2;
    }
    kernel_name = name;
    block = dim3(0, 0, 0);
    cur = 0;
    static bool handlers;
    if (!handlers) {
        signal(SIGSEGV, on_signal);
        signal(SIGBUS, on_signal);
        handlers = true;
    }
    for (; n_made < threads; n_made++)
        if (make_fiber(n_made) < 0) {
            failf("out of memory for fiber stacks");
            return -1;
        }
    n_threads = (int)threads;
    block_dim = b;
    grid_dim = g;
    smem_size = smem;
    static std::function<void()> f; /* the fibers' body (a launch runs to its end before the next) */
    f = kernel;
    body = &f;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                block = dim3(x, y, z);
                smem_reset();
                if (run_block() < 0 || fault[0])
                    return -1;
            }
    return 0;
}
} /* namespace emu */

#define threadIdx (emu::fib[emu::cur].tid)
#define blockIdx (emu::block)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
static inline void __syncthreads() { emu::wait(emu::AT_BLOCK); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu::wait(emu::AT_WARP); }
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int mask)
{
    static_assert(sizeof(T) <= sizeof(double), "a shuffle of up to 8 bytes");
    emu::xch &x = emu::slot();
    int lane = emu::cur & 31;
    memcpy(&x.d[lane], &v, sizeof v);
    emu::wait(emu::AT_WARP);
    T r;
    memcpy(&r, &x.d[lane ^ mask], sizeof r);
    return r;
}
