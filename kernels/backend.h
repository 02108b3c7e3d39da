/* backend.h — the compute backend interface, version 2: the one boundary every device
 * crosses. The model (engine/model.c) and the sharding engine (engine/shard.c) are
 * written once against it; kernels/cpu/ is the reference implementation and every other
 * backend is checked op by op against it (tests/ops/, tests/gpu/gpu_ops.c).
 *
 * ## Instances (docs/design.md "Backend interface")
 *
 * A backend is an instance: a table of ops, a device, and the implementation's context.
 * Every op takes the instance first, so several backends live side by side in one
 * process (a CPU backend beside a CUDA one in a test, two CUDA devices, a planning
 * backend beside a real one). backend_*_new() make one; backend_free() ends it.
 *
 * ## Buffers and dtypes
 *
 * Memory comes from bk_alloc() of the same instance and may not be host memory: only
 * upload/download move bytes between the host and it. Ops take buffers as bk_buf_t — a
 * pointer and its element type — so one op serves fp32 and bf16 storage. Each op says
 * which dtypes it takes; a backend may implement more, never fewer than the CPU backend.
 *   DT_F32   IEEE binary32.
 *   DT_BF16  bfloat16 stored as its 16 bits (the top half of a float32).
 * Arithmetic is fp32 whatever the storage: an op widens what it reads (exact), computes
 * in fp32 (double where it says so), and rounds what it stores to nearest, ties to even
 * (libcommon/dtype.h f32_to_bf16) — except adamw, which can round stochastically
 * (bk_adamw_t). Matrix products take bf16 inputs and accumulate in fp32. A result is
 * rounded once per op: an op that adds into a bf16 buffer (beta = 1, the "+=" ops) adds
 * in fp32 and rounds the sum.
 *
 * ## Conventions shared by every op
 *
 *  - Tensors are row-major. Activations are a flat stream of n tokens: x[n, d]. A
 *    micro-batch is not a [B, T] rectangle: its rows are concatenated and cut into
 *    segments (one per sample, plus the padding at the end of a packed row). Attention
 *    stays inside a segment and positions restart at each segment's start, so packed rows
 *    and unpacked rows of different lengths need no padding and no mask tensor.
 *  - Segments: seg[0] = 0 < seg[1] < … < seg[n_seg] = n; segment s is tokens
 *    [seg[s], seg[s+1]).
 *  - Attention layouts: q[n, n_head·hd], k and v[n, n_kv·hd]; query head h reads key/value
 *    head h / (n_head / n_kv) (grouped-query attention). lse[n, n_head] (fp32) keeps the
 *    softmax log-sum-exp for the backward pass.
 *  - Backward ops that produce a parameter gradient ADD into it (gradient accumulation
 *    over micro-batches); those that produce an activation gradient say whether they
 *    add or overwrite.
 *  - Host-side arguments (scalars, segment lists on the host) are marked; everything else
 *    is the backend's memory. When upload returns the host buffer may be reused, and when
 *    download returns it holds the data; download waits for the device, upload need not
 *    (the CUDA backend stages small uploads in pinned memory and queues their copies in
 *    order with the ops: a micro-batch's arrays go up without the host waiting for the
 *    device). No op blocks the host: the reductions (xent's loss, sumsq) add into a double
 *    in the backend's memory, so a step downloads its loss and its Σg² once each, when it
 *    needs them (tests/gpu/host_waits.sh counts the host's waits on the emulated GPU).
 *  - A backend's own limits (the CUDA backend's attention takes head dims up to 256) are
 *    failures like any other: recorded, and reported at sync().
 *  - Ops do not fail: shapes and dtypes are the caller's contract (engine/model.c checks
 *    the configuration once). Like a kernel launch, an op has no error path: a backend
 *    records its first failure (a device error, a dtype the op does not take), skips
 *    the ops after it and reports it at sync(); the CPU ops that need a few kilobytes of
 *    per-thread scratch (attention rows, the loss's per-row sums) abort if even that
 *    cannot be allocated.
 *  - Determinism: for a given backend and thread count every op gives the same bits on
 *    every call; the CPU ops also give the same bits for any thread count (matmul too:
 *    cpu.c cuts a product into tiles fixed by its shape, one single-threaded BLAS call
 *    each). Bit-exact resume, on any -j, depends on this.
 *
 * ## Streams and events
 *
 * Ops are issued on the instance's current stream (set_stream; NULL: its default
 * stream) and run in issue order on it. An event recorded on one stream and waited for by
 * another orders the two without the host waiting: that is how a communication backend
 * (NCCL, on a stream of its own) waits for a unit's gradient and how compute waits for a
 * gathered unit. On the CPU every op has finished when it returns: streams and events are
 * valid handles that do nothing.
 *
 * ## Fused ops
 *
 * Entries under "optional fused ops" may be NULL: the model then runs the unfused
 * sequence each one documents. A backend grows fused kernels one at a time and the op
 * tests compare each with its sequence on the CPU backend.
 *
 * FTK_FUSED, read when an instance is made (bk_fused_select), picks which of them an
 * instance offers, so each fused kernel stays switchable against the simple ops it
 * replaces: "all", "none", or a comma list of rope_qk, qkv_rope, glu (glu_fwd and
 * glu_bwd), add_rmsnorm, adamw_multi, add_sumsq (the names of the ops below); unset or empty: the
 * backend's default, every fused op on CUDA and none on the CPU (the reference runs the sequence, so its numbers stay those of the
 * plain ops; the CPU implements every fused op all the same, so FTK_FUSED=all runs the
 * model's fused path there). An unknown name fails the creation. The planning backend
 * follows the same switch with the default of the device it plans for: what the model
 * allocates depends on which ops are fused.
 *
 * ## Memory accounting and the memory plan
 *
 * bk_alloc() counts what it hands out per class (bk_mem_class_t) and keeps the
 * high-water mark. The planning backend (backend_plan_new) counts the same calls without
 * allocating and runs no op, so a dry run of the code that allocates (engine/plan.c)
 * gives the memory a run will take; on the CPU backend the two are equal (a test). On
 * cuda, bk_alloc also counts in the driver's pages (mem_pages, kernels/cuda_mem.h), the
 * ops' own scratch is allocated up front by reserve (a dry run runs no op), and the plan
 * adds the CUDA context: the emulated device's peak equals the plan less the context
 * (tests/gpu/plan_emu.sh).
 *
 * Ownership and errors: backend_*_new() return an instance or NULL with ftk_err_msg()
 * set; bk_alloc() returns zeroed memory or NULL with "out of memory on DEVICE allocating
 * WHAT (N bytes)". Nothing here exits or aborts except as said above.
 */
#ifndef FTK_BACKEND_H
#define FTK_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "../libcommon/dtype.h"
#include "cuda_mem.h"

/* A buffer (or a view into one) and its element type. */
typedef struct {
    void *p;
    dtype_t dt;
} bk_buf_t;

static inline bk_buf_t bk_buf(void *p, dtype_t dt)
{
    bk_buf_t b = {p, dt};
    return b;
}
/* The view that starts i elements into b. */
static inline bk_buf_t bk_at(bk_buf_t b, int64_t i)
{
    b.p = (char *)b.p + i * (int64_t)dtype_size(b.dt);
    return b;
}

/* What an allocation is for: the memory plan's rows. */
typedef enum {
    BK_MEM_WEIGHTS,   /* owned parameters: fp32/bf16 weights, master weights, bf16 working copy */
    BK_MEM_GRADS,     /* owned gradients and whole-unit gradient buffers in flight */
    BK_MEM_OPTIM,     /* AdamW moments */
    BK_MEM_GATHER,    /* gathered units: the one in use and the prefetched ones */
    BK_MEM_ACTS,      /* activations kept for the backward pass, and their gradients */
    BK_MEM_WORKSPACE, /* the backend's own scratch (product tiles, cuBLASLt workspace) */
    BK_MEM_OTHER,     /* batch inputs, the head's chunk buffers, decoding caches */
    BK_MEM_CLASSES
} bk_mem_class_t;
extern const char *const bk_mem_class_names[BK_MEM_CLASSES];

typedef struct {
    int64_t in_use, peak;               /* bytes */
    int64_t cls[BK_MEM_CLASSES];        /* in use, per class */
    int64_t at_peak[BK_MEM_CLASSES];    /* per class when the peak was reached */
    int64_t allocs;                     /* live allocations */
    /* The device's own count where the backend has mem_pages (else equal to in_use, peak):
     * the bytes with the driver's granularity (cuda_mem.h), in use and at their peak. */
    bk_cuda_mem_t pages;
    int64_t dev_in_use, dev_peak;
    /* Measured where the backend has mem_used (else 0): the most the device had in use
     * (cudaMemGetInfo: every process's memory and the contexts included), read at each new
     * dev_peak and by bk_mem_sample; and, at the first reading (the backend's first
     * allocation), what the device held beside this backend's allocations: this process's
     * CUDA context and other processes' memory (-1: not measured). */
    int64_t used_peak, used_other;
} bk_mem_t;

typedef struct bk_stream bk_stream_t;
typedef struct bk_event bk_event_t;

/* AdamW's per-call settings (torch.optim.AdamW, decoupled decay), element i:
 *   g = grad[i]·gscale;  p *= 1 − lr·wd;  m = b1·m + (1−b1)·g;  v = b2·v + (1−b2)·g²;
 *   p −= (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps)
 * in fp32 from the widened stored values (p's update reads the fp32 m and v, before they
 * are rounded for storage); bc1 = 1 − b1^t, bc2 = 1 − b2^t are computed in double by
 * the caller. gscale carries the gradient clipping coefficient (1: none).
 * Storing p, m, v in bf16 rounds each to nearest even (stochastic = BK_ROUND_NEAREST, 0),
 * or with stochastic = BK_SROUND (1) rounds up with probability equal to the fraction of
 * an ulp that was cut (bk_sround_bf16), from the counter-based hash
 * r = bk_sround_hash(key, index0 + i): bk_sround_field(r, w), w = 0 for p, 1 for m, 2 for
 * v, its three 16-bit fields. The same bits for the same element whatever the rank count,
 * slicing or backend. key = bk_sround_key(seed, step, tensor) (kernels/sround.h).
 * BK_SROUND_HASH3 (2), for comparison: a hash per state, bk_sround_bits3(key, index0 + i, w).
 * Any other value is an error. */
typedef struct {
    float lr, b1, b2, eps, wd, gscale;
    double bc1, bc2;
    int stochastic; /* BK_ROUND_NEAREST, BK_SROUND or BK_SROUND_HASH3 (sround.h) */
    uint64_t key;
    int64_t index0; /* the index in its tensor of element 0 of this call */
    /* Not NULL: the gradient scale is *gscale_dev, one float in the backend's memory read by
     * the op where it runs (clip_coef's result), and gscale is unused: the clipping
     * coefficient needs no host wait. */
    const float *gscale_dev;
} bk_adamw_t;

/* One tensor (slice) of an adamw_multi call: element 0 of p, g, m, v (dtypes given once
 * per call), its length, and the per-tensor fields of bk_adamw_t. */
typedef struct {
    void *p, *m, *v; /* state dtype */
    const void *g;   /* gradient dtype */
    int64_t n, index0;
    uint64_t key;
    float wd;
} bk_adamw_seg_t;

/* ---- the ops: one list ----
 *
 * BK_OPS is every op of the table, once, in the table's order; everything else an op
 * needs outside its kernels is made from it. Adding an op takes four places:
 *   1. an entry here: X(name, kind, (params), (args), (cost)), under the comment that is
 *      its contract;
 *   2. its CPU reference, static void cpu_NAME(backend_t *be, params…), in
 *      kernels/cpu/cpu.c (the CPU backend has every op, fused ones included);
 *   3. its CUDA kernel and void cu_NAME(backend_t *be, params…) in the family's
 *      kernels/cuda/FAMILY.cu;
 *   4. its test: a descriptor in tests/ops/ops_defs.c and its line in OPS_LIST
 *      (tests/ops/ops_table.h).
 * Made from the list: backend_t's members, the CPU and CUDA backends' table fill and
 * cu_NAME's declaration (kernels/cuda/cuda_internal.cuh), the planning backend's stubs
 * (kernels/plan/backend_plan.c: every op does nothing there), the profiler's wrappers
 * (kernels/prof.c) and FTK_FUSED's switches (kernels/backend.c).
 *
 * The columns:
 *   name    the entry of backend_t; the CPU's function is cpu_NAME, CUDA's cu_NAME.
 *   kind    BK_OP: every backend has it. BK_OP_UNTIMED: the same, and the profiler gives
 *           it no row. BK_FUSED("switch"): an optional fused op, NULL where FTK_FUSED does
 *           not select its switch (two ops may share one: "glu").
 *   params  the parameters after backend_t *be. Every op returns void: ops do not fail
 *           (see the conventions above); the entries that can (reserve, attn_prepare)
 *           are declared by hand in backend_t.
 *   args    the parameters' names, in order: what a wrapper passes on.
 *   cost    (flops, bytes, label, label's arguments…): the profiler's row of a call
 *           (kernels/prof.h: its name as a printf format, the work of the call), read in
 *           prof.c over the parameters, where sz(b) is buffer b's element size, dn(t)
 *           dtype t's name, causal_pairs(seg, n_seg) attention's causal (query, key)
 *           pairs of one head, cached_keys(n, p0) attn_cached's, seg_elems(segs, n_segs)
 *           the elements of adamw_multi's segments. () where the kind is BK_OP_UNTIMED.
 */
/* The kinds: (FTK_FUSED switch or 0, whether the profiler times it). */
#define BK_OP (0, 1)
#define BK_OP_UNTIMED (0, 0)
#define BK_FUSED(sw) (sw, 1)
#define BK_KIND_SWITCH(kind) BK_KIND_SWITCH_ kind
#define BK_KIND_SWITCH_(sw, timed) sw
#define BK_KIND_TIMED(kind) BK_KIND_TIMED_ kind
#define BK_KIND_TIMED_(sw, timed) timed
/* (a, b, …) → a, b, …: a parenthesised column where a list is wanted. */
#define BK_UNPAREN(...) __VA_ARGS__

#define BK_OPS(X)                                                                                                    \
    /* dst[i] = src[i] converted (any dtypes; same dtype is a copy). */                                              \
    X(convert, BK_OP, (bk_buf_t dst, bk_buf_t src, int64_t n), (dst, src, n),                                        \
      (0, (double)n * (sz(dst) + sz(src)), "convert %s→%s", dn(src.dt), dn(dst.dt)))                                 \
                                                                                                                     \
    /* C[M,N] = alpha·op(A)·op(B) + beta·C, op(X) = X or Xᵀ (ta, tb); A is [M,K] (or [K,M]                           \
     * when ta), B is [K,N] (or [N,K] when tb). A and B: both f32 or both bf16; C: f32 or                            \
     * bf16; fp32 accumulation, C rounded once. A linear layer y = x·Wᵀ is                                           \
     * matmul(be, 0, 1, n, out, in, 1, x, W, 0, y). */                                                               \
    X(matmul, BK_OP,                                                                                                 \
      (int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, bk_buf_t A, bk_buf_t B, float beta,             \
       bk_buf_t C),                                                                                                  \
      (ta, tb, M, N, K, alpha, A, B, beta, C),                                                                       \
      (2.0 * (double)M * (double)N * (double)K, 0, "matmul %c%c %lldx%lldx%lld %s %s %s", ta ? 'T' : 'N',            \
       tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, dn(A.dt), beta != 0 ? "+=" : "→", dn(C.dt)))        \
                                                                                                                     \
    /* out[i] = table[ids[i]] (out and table of one dtype); dtable[ids[i]] += dout[i]                                \
     * (any dtypes; tokens are added in order, each sum rounded as it is stored). ids is                             \
     * device memory. */                                                                                             \
    X(embed_fwd, BK_OP, (bk_buf_t out, const int32_t *ids, bk_buf_t table, int64_t n, int64_t d),                    \
      (out, ids, table, n, d),                                                                                       \
      (0, 2.0 * (double)n * (double)d * sz(out) + 4.0 * (double)n, "embed_fwd %s", dn(out.dt)))                      \
    X(embed_bwd, BK_OP, (bk_buf_t dtable, const int32_t *ids, bk_buf_t dout, int64_t n, int64_t d),                  \
      (dtable, ids, dout, n, d), (0, 0, "embed_bwd %s += %s", dn(dtable.dt), dn(dout.dt)))                           \
                                                                                                                     \
    /* dst[idx[i]] = src[i]: embed_fwd's inverse for distinct idx (rows of width d, one                              \
     * dtype; other rows of dst untouched). */                                                                       \
    X(rows_scatter, BK_OP, (bk_buf_t dst, const int32_t *idx, bk_buf_t src, int64_t n, int64_t d),                   \
      (dst, idx, src, n, d), (0, 2.0 * (double)n * (double)d * sz(dst), "rows_scatter %s", dn(dst.dt)))              \
                                                                                                                     \
    /* RMSNorm (HF LlamaRMSNorm): out = x / sqrt(mean(x²) + eps) · w; rstd[i] = 1/sqrt(…)                            \
     * (fp32). Backward: dx += ∂/∂x (adds, so the residual gradient flows through it),                               \
     * dw += ∂/∂w. x, w, out, dx, dw, dout: any dtypes each. */                                                      \
    X(rmsnorm_fwd, BK_OP, (bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t w, int64_t n, int64_t d, float eps),      \
      (out, rstd, x, w, n, d, eps),                                                                                  \
      (0, (double)n * (double)d * (sz(x) + sz(out)) + (double)d * sz(w) + 4.0 * (double)n, "rmsnorm_fwd %s→%s",      \
       dn(x.dt), dn(out.dt)))                                                                                        \
    X(rmsnorm_bwd, BK_OP,                                                                                            \
      (bk_buf_t dx, bk_buf_t dw, bk_buf_t dout, bk_buf_t x, bk_buf_t w, const float *rstd, int64_t n, int64_t d),    \
      (dx, dw, dout, x, w, rstd, n, d),                                                                              \
      (0,                                                                                                            \
       (double)n * (double)d * (2 * sz(dx) + sz(dout) + sz(x)) + (double)d * (2 * sz(dw) + sz(w)) +                  \
           4.0 * (double)n,                                                                                          \
       "rmsnorm_bwd %s", dn(dx.dt)))                                                                                 \
                                                                                                                     \
    /* Rotary embedding in Hugging Face's convention (rotate_half: element i pairs with                              \
     * i + hd/2), in place on x[n, n_head·hd] (f32 or bf16), angle pos[i]·theta^(-2j/hd).                            \
     * inverse applies the transposed rotation (the backward pass). pos is device memory. */                         \
    X(rope, BK_OP, (bk_buf_t x, const int32_t *pos, int64_t n, int n_head, int hd, float theta, int inverse),        \
      (x, pos, n, n_head, hd, theta, inverse), (0, 2.0 * (double)n * n_head * hd * sz(x), "rope %s", dn(x.dt)))      \
                                                                                                                     \
    /* Causal attention inside segments, scale 1/sqrt(hd). q, k, v, out (and dq, dk, dv,                             \
     * dout) of one dtype, f32 or bf16; lse fp32. seg is a HOST array. out and lse are                               \
     * overwritten. Backward overwrites dq, dk, dv. backend_t's attn_prepare is told the                             \
     * shapes first. */                                                                                              \
    X(attn_fwd, BK_OP,                                                                                               \
      (bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int64_t *seg, int64_t n_seg, int n_head,  \
       int n_kv, int hd),                                                                                            \
      (out, lse, q, k, v, seg, n_seg, n_head, n_kv, hd),                                                             \
      (4.0 * causal_pairs(seg, n_seg) * n_head * hd, 0, "attn_fwd %s hd%d %d/%d", dn(q.dt), hd, n_head, n_kv))       \
    X(attn_bwd, BK_OP,                                                                                               \
      (bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k, bk_buf_t v, bk_buf_t out,       \
       const float *lse, const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd),                           \
      (dq, dk, dv, dout, q, k, v, out, lse, seg, n_seg, n_head, n_kv, hd),                                           \
      (8.0 * causal_pairs(seg, n_seg) * n_head * hd, 0, "attn_bwd %s hd%d %d/%d", dn(q.dt), hd, n_head, n_kv))       \
    /* Decoding with a cache: the n new queries q[n, …] sit at positions p0 … p0+n-1 of one                          \
     * sequence whose keys/values kc, vc[p0+n, n_kv·hd] are already written; query i sees                            \
     * keys 0 … p0+i. One dtype for out, q, kc, vc. */                                                               \
    X(attn_cached, BK_OP,                                                                                            \
      (bk_buf_t out, bk_buf_t q, bk_buf_t kc, bk_buf_t vc, int64_t n, int64_t p0, int n_head, int n_kv, int hd),     \
      (out, q, kc, vc, n, p0, n_head, n_kv, hd),                                                                     \
      (4.0 * cached_keys(n, p0) * n_head * hd, 0, "attn_cached %s hd%d %d/%d", dn(q.dt), hd, n_head, n_kv))          \
                                                                                                                     \
    /* SwiGLU: h = silu(g)·u. Backward overwrites dg, du. One dtype for all. */                                      \
    X(swiglu_fwd, BK_OP, (bk_buf_t h, bk_buf_t g, bk_buf_t u, int64_t n), (h, g, u, n),                              \
      (0, 3.0 * (double)n * sz(h), "swiglu_fwd %s", dn(h.dt)))                                                       \
    X(swiglu_bwd, BK_OP, (bk_buf_t dg, bk_buf_t du, bk_buf_t dh, bk_buf_t g, bk_buf_t u, int64_t n),                 \
      (dg, du, dh, g, u, n), (0, 5.0 * (double)n * sz(dg), "swiglu_bwd %s", dn(dg.dt)))                              \
                                                                                                                     \
    /* Cross-entropy of fp32 logits[n, V] against targets with per-row weights (device                               \
     * arrays). ADDS Σ weight·loss to *acc, one double in the backend's memory: the rows'                            \
     * losses are summed in row order from 0 and that sum is added, *acc = *acc + Σ, in                              \
     * issue order on the current stream; the host does not wait (a loss is brought back                             \
     * with download, once per step, not once per call). When grad_scale != 0, logits are                            \
     * replaced by their gradient grad_scale·weight·(softmax − onehot). */                                           \
    X(xent, BK_OP,                                                                                                   \
      (float *logits, const int32_t *targets, const float *weights, int64_t n, int64_t V, float grad_scale,          \
       double *acc),                                                                                                 \
      (logits, targets, weights, n, V, grad_scale, acc),                                                             \
      (0, (grad_scale != 0 ? 8.0 : 4.0) * (double)n * (double)V, "xent V=%lld%s", (long long)V,                      \
       grad_scale != 0 ? " with gradient" : ""))                                                                     \
                                                                                                                     \
    /* y += x; y *= a. Any dtypes. sumsq ADDS Σx² to *acc (one double in the backend's                               \
     * memory, as xent: Σx² is summed in double in a fixed order — blocks of 65536                                   \
     * elements, then the blocks' sums, in order on the CPU, by a tree whose shape depends                           \
     * on their count alone on CUDA — and then added to *acc; no host wait). */                                      \
    X(add, BK_OP, (bk_buf_t y, bk_buf_t x, int64_t n), (y, x, n),                                                    \
      (0, (double)n * (2 * sz(y) + sz(x)), "add %s += %s", dn(y.dt), dn(x.dt)))                                      \
    X(scale, BK_OP, (bk_buf_t y, float a, int64_t n), (y, a, n), (0, 2.0 * (double)n * sz(y), "scale %s", dn(y.dt))) \
    X(sumsq, BK_OP, (bk_buf_t x, int64_t n, double *acc), (x, n, acc), (0, (double)n * sz(x), "sumsq %s", dn(x.dt))) \
                                                                                                                     \
    /* torch's clip_grad_norm_ coefficient from n per-unit Σg² slots, on the device (no host                         \
     * wait): norm = sqrt(((0 + sq[0]) + sq[1]) + … + sq[n−1]) in double, c = max_norm /                             \
     * (norm + 1e-6) in double, *coef = (float)c where max_norm > 0 and c < 1, else 1 —                              \
     * the host's arithmetic (engine/optim.c), so the same bits. sq and coef are backend                             \
     * memory; coef is what adamw's gscale_dev points at. The profiler gives it no row. */                           \
    X(clip_coef, BK_OP_UNTIMED, (float *coef, const double *sq, int n, double max_norm), (coef, sq, n, max_norm),    \
      ())                                                                                                            \
                                                                                                                     \
    /* One AdamW step on n elements (bk_adamw_t). p, m, v of one dtype (f32 or bf16); g f32                          \
     * or bf16, read only. */                                                                                        \
    X(adamw, BK_OP, (bk_buf_t p, bk_buf_t g, bk_buf_t m, bk_buf_t v, int64_t n, const bk_adamw_t *h),                \
      (p, g, m, v, n, h), (0, (double)n * (6 * sz(p) + sz(g)), "adamw %s, gradient %s", dn(p.dt), dn(g.dt)))         \
                                                                                                                     \
    /* Block-wise int8 codes (the compressed all-gather, engine/compress.h): x[n] (f32 or                            \
     * bf16) in blocks of `block` elements, the last one possibly shorter. Block b's scale                           \
     * is max|x| over it divided by 127 (fp32), and codes[i] = x[i] / scale rounded to                               \
     * nearest even and clamped to [-127, 127] (0 where the scale is 0; a NaN gives -127).                           \
     * dequant_i8: y[i] = codes[i]·scale[i / block], rounded once to y's dtype (f32 or                               \
     * bf16). codes and scales are backend memory; each division and product is one IEEE                             \
     * fp32 operation, so every backend gives the same bits. */                                                      \
    X(quant_i8, BK_OP, (int8_t *codes, float *scales, bk_buf_t x, int64_t n, int64_t block),                         \
      (codes, scales, x, n, block), (0, (double)n * (sz(x) + 1), "quant_i8 %s", dn(x.dt)))                           \
    X(dequant_i8, BK_OP, (bk_buf_t y, const int8_t *codes, const float *scales, int64_t n, int64_t block),           \
      (y, codes, scales, n, block), (0, (double)n * (sz(y) + 1), "dequant_i8 %s", dn(y.dt)))                         \
                                                                                                                     \
    /* ---- optional fused ops (NULL: the model runs the sequence given) ---- */                                     \
                                                                                                                     \
    /* rope of q (n_head heads) and k (n_kv heads) in one pass:                                                      \
     * = rope(q, pos, n, n_head, …); rope(k, pos, n, n_kv, …). */                                                    \
    X(rope_qk, BK_FUSED("rope_qk"),                                                                                  \
      (bk_buf_t q, bk_buf_t k, const int32_t *pos, int64_t n, int n_head, int n_kv, int hd, float theta,             \
       int inverse),                                                                                                 \
      (q, k, pos, n, n_head, n_kv, hd, theta, inverse),                                                              \
      (0, 2.0 * (double)n * (n_head + n_kv) * hd * sz(q), "rope_qk %s", dn(q.dt)))                                   \
                                                                                                                     \
    /* SwiGLU on the gate and up projections made as one product (FTK_FUSED name "glu"):                             \
     * gu[n, 2F] = x·[Wg; Wu]ᵀ (the two weights are adjacent in a unit), gate in columns                             \
     * [0, F), up in [F, 2F). glu_fwd: h[i, j] = silu(gu[i, j])·gu[i, F + j], h[n, F]                                \
     *   = swiglu_fwd(h, g, u, n·F) with g = gu[:, :F], u = gu[:, F:].                                               \
     * glu_bwd overwrites dgu[n, 2F] with ∂/∂gate in its first F columns and ∂/∂up in the                            \
     * others: = swiglu_bwd(dg, du, dh, g, u, n·F) into those column blocks.                                         \
     * One dtype for all; element by element the arithmetic of swiglu_fwd/bwd. */                                    \
    X(glu_fwd, BK_FUSED("glu"), (bk_buf_t h, bk_buf_t gu, int64_t n, int64_t F), (h, gu, n, F),                      \
      (0, 3.0 * (double)n * (double)F * sz(h), "glu_fwd %s", dn(h.dt)))                                              \
    X(glu_bwd, BK_FUSED("glu"), (bk_buf_t dgu, bk_buf_t dh, bk_buf_t gu, int64_t n, int64_t F), (dgu, dh, gu, n, F), \
      (0, 5.0 * (double)n * (double)F * sz(dgu), "glu_bwd %s", dn(dgu.dt)))                                          \
                                                                                                                     \
    /* q, k, v from one product qkv[n, Hq + 2·Hk] = x·[Wq; Wk; Wv]ᵀ (adjacent in a unit;                             \
     * Hq = n_head·hd, Hk = n_kv·hd), with rope (FTK_FUSED name "qkv_rope"). One dtype for                           \
     * all; pos is device memory.                                                                                    \
     *   inverse = 0 (forward) writes q[n, Hq], k[n, Hk], v[n, Hk] from qkv's column blocks                          \
     *     [0, Hq), [Hq, Hq + Hk), [Hq + Hk, Hq + 2·Hk) and applies rope to q and k:                                 \
     *     = copy the three blocks; rope_qk(q, k, pos, n, n_head, n_kv, hd, theta, 0).                               \
     *   inverse = 1 (backward) writes qkv (then ∂/∂qkv) from q, k, v (then dq, dk, dv):                             \
     *     the inverse rotation of dq and dk, and dv, into those blocks; q, k, v unchanged:                          \
     *     = rope_qk(dq, dk, …, 1) on copies, then the three copies into the blocks.                                 \
     * The model then makes one product each for dxn (K = Hq + 2·Hk) and d[Wq; Wk; Wv]. */                           \
    X(qkv_rope, BK_FUSED("qkv_rope"),                                                                                \
      (bk_buf_t qkv, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int32_t *pos, int64_t n, int n_head, int n_kv,        \
       int hd, float theta, int inverse),                                                                            \
      (qkv, q, k, v, pos, n, n_head, n_kv, hd, theta, inverse),                                                      \
      (0, 2.0 * (double)n * (n_head + 2 * n_kv) * hd * sz(qkv), "qkv_rope %s%s", dn(qkv.dt),                         \
       inverse ? " inverse" : ""))                                                                                   \
                                                                                                                     \
    /* The residual add and the RMSNorm after it (FTK_FUSED name "add_rmsnorm"):                                     \
     *   xsum = x + r (fp32 sum rounded once to xsum's dtype); out = rmsnorm(xsum)·w, rstd as                        \
     *   rmsnorm_fwd = copy(xsum, x); add(xsum, r, n·d); rmsnorm_fwd(out, rstd, xsum, w, …).                         \
     * xsum, x, r of one dtype; out and w any. xsum may be x or r (where it is r, the                                \
     * sequence is add(xsum, x, n·d): the same sum). The model makes the attention output                            \
     * product into a scratch r (beta 0) and then this gives xmid and xn2: in bf16 the                               \
     * product is rounded before the add (as PyTorch does), where the unfused path adds x                            \
     * inside the product (beta 1) and rounds once; it is why this fusion is switchable. */                          \
    X(add_rmsnorm_fwd, BK_FUSED("add_rmsnorm"),                                                                      \
      (bk_buf_t xsum, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t r, bk_buf_t w, int64_t n, int64_t d,           \
       float eps),                                                                                                   \
      (xsum, out, rstd, x, r, w, n, d, eps),                                                                         \
      (0, (double)n * (double)d * (sz(x) + sz(r) + sz(xsum) + sz(out)) + (double)d * sz(w) + 4.0 * (double)n,        \
       "add_rmsnorm_fwd %s→%s", dn(x.dt), dn(out.dt)))                                                               \
                                                                                                                     \
    /* AdamW over many tensors in one call (the optimizer step of every owned slice):                                \
     * = for each s < n_segs: h' = *h with wd, key, index0 taken from segs[s];                                       \
     *   adamw(be, bk_buf(p, state_dt), bk_buf(g, grad_dt), bk_buf(m, state_dt),                                     \
     *         bk_buf(v, state_dt), segs[s].n, &h')                                                                  \
     * with the same bits (the stochastic rounding bits depend on key and index0 + i only).                          \
     * segs is a HOST array, free for reuse when the call returns; the segments must not                             \
     * overlap. h's gscale is the clipping coefficient, applied inside. FTK_FUSED name                               \
     * "adamw_multi"; NULL: the optimizer calls adamw per tensor slice. */                                           \
    X(adamw_multi, BK_FUSED("adamw_multi"),                                                                          \
      (const bk_adamw_seg_t *segs, int n_segs, dtype_t state_dt, dtype_t grad_dt, const bk_adamw_t *h),              \
      (segs, n_segs, state_dt, grad_dt, h),                                                                          \
      (0, seg_elems(segs, n_segs) * (6.0 * (double)dtype_size(state_dt) + (double)dtype_size(grad_dt)),              \
       "adamw_multi %s, gradient %s", dn(state_dt), dn(grad_dt)))                                                    \
                                                                                                                     \
    /* y += x, then Σy² of the sums as stored added to *acc, in one pass (FTK_FUSED name                             \
     * "add_sumsq"): = add(be, y, x, n); sumsq(be, y, n, acc), with the same bits in y and                           \
     * in *acc (sumsq's fixed order: the sum of y is that of sumsq on the result). y and x                           \
     * of the dtypes sumsq and add take. The sharding engine takes Σg² here from the add                             \
     * that completes an owned gradient (engine/shard.c) instead of a pass of its own. */                            \
    X(add_sumsq, BK_FUSED("add_sumsq"), (bk_buf_t y, bk_buf_t x, int64_t n, double *acc), (y, x, n, acc),            \
      (0, (double)n * (2 * sz(y) + sz(x)), "add_sumsq %s += %s", dn(y.dt), dn(x.dt)))

typedef struct backend backend_t;
struct backend {
    const char *name;  /* "cpu", "cuda", "plan" */
    char device[96];   /* for messages: "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)", "plan (cuda)" */
    void *ctx;         /* the implementation's state */
    bk_mem_t mem;      /* accounting of bk_alloc() (read it through bk_mem()) */
    void *alloc_map;   /* bk_alloc()'s record of live allocations */
    void *prof;        /* FTK_PROFILE's per-op times (kernels/prof.h), or NULL */

    /* ---- lifetime and memory (bk_alloc/bk_free/backend_free wrap these) ---- */
    /* Releases the context (backend_free has already freed every live bk_alloc()
     * allocation, the context's own workspaces included, and frees be afterwards). */
    void (*destroy)(backend_t *be);
    /* Raw allocation: NULL when the device has not the memory (bk_alloc words the error).
     * Need not be zeroed. */
    void *(*mem_alloc)(backend_t *be, size_t bytes);
    void (*mem_free)(backend_t *be, void *p);
    /* Optional (NULL: malloc/free): host memory that upload/download move fastest, page-
     * locked on a GPU (cudaHostAlloc), so a checkpoint snapshot copies at the bus's speed.
     * Not counted in bk_mem (it is not the device's). NULL when there is not the memory. */
    void *(*host_alloc)(backend_t *be, size_t bytes);
    void (*host_free)(backend_t *be, void *p);
    /* Optional (NULL: unknown): the bytes bk_alloc could still take now (the GPU's free
     * memory, cudaMemGetInfo; the host's available memory for the CPU), or -1. What
     * --recompute auto plans against (engine/plan.h plan_device_bytes). */
    int64_t (*mem_avail)(backend_t *be);
    /* Optional (NULL: none): where the device's memory is the host's own (the CPU), a host
     * pointer to the bk_alloc() memory p (p itself), so that a loader reads a file straight
     * into it (engine/shard.c) instead of into a buffer it then uploads. */
    void *(*host_ptr)(backend_t *be, void *p);
    /* 1: device memory comes in the CUDA driver's pages (cuda_mem.h): bk_alloc keeps
     * dev_in_use and dev_peak with that granularity (the CUDA backend, and the planning
     * backend for cuda). */
    int mem_pages;
    /* Optional (NULL: not measured): the bytes of the device in use now, by everything on
     * it (cudaMemGetInfo's total − free), or -1. Read at each new high-water mark of
     * bk_alloc and by bk_mem_sample (used_peak). */
    int64_t (*mem_used)(backend_t *be);
    /* Optional (NULL: the backend's ops take no scratch of their own): allocates, once, the
     * scratch the ops need for shapes up to r's, so that no op grows it during a step and a
     * dry run (which runs no op) counts it. 0, or -1 with ftk_err_msg() set (out of
     * memory). The trainer calls it after building the model (engine/trainer.c). */
    int (*reserve)(backend_t *be, const bk_reserve_t *r);
    /* Optional (NULL: nothing to prepare): the attention shapes a run will meet, told once
     * before its first attn_fwd: micro-batches of at most max_seg segments, none longer than
     * max_len tokens, n_head/n_kv heads of hd in dtype dt. A backend that plans per shape
     * (CUDA with FTK_CUDA_ATTN=cudnn) makes its plans for that bound and allocates their
     * workspace here (bk_cudnn_plan_bytes), so that no plan is made and nothing is allocated
     * mid-run; a call beyond the bound still runs (a plan made then, with a warning). 0, or
     * -1 with ftk_err_msg() set (FTK_CUDNN_STRICT=1 and a plan cuDNN refuses). */
    int (*attn_prepare)(backend_t *be, int64_t max_seg, int64_t max_len, int n_head, int n_kv, int hd, dtype_t dt);

    /* Byte moves; copy may overlap (a world of one's collectives copy through it). */
    void (*upload)(backend_t *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(backend_t *be, void *host_dst, const void *src, size_t bytes);
    /* Optional (NULL: download): the copy queued on the current stream without the host
     * waiting; host_dst (memory from host_alloc) holds the data once the next sync() returns.
     * A step's numbers (loss and Σg²) come back this way, so the step's one sync is the
     * only wait (engine/trainer.c). */
    void (*download_async)(backend_t *be, void *host_dst, const void *src, size_t bytes);
    void (*zero)(backend_t *be, void *p, size_t bytes);
    void (*copy)(backend_t *be, void *dst, const void *src, size_t bytes);
    /* Waits for the ops issued so far on every stream; 0, or -1 with ftk_err_msg() set when
     * one of them failed since the instance started (the first error is kept and
     * later ops are skipped). */
    int (*sync)(backend_t *be);

    /* Optional, set by a communication library (engine/comm.c, for NCCL), not by the
     * backend: while the host waits for the device (sync, upload, download, event_sync) a
     * backend whose ops run asynchronously polls and calls wait_hook(wait_arg) every few
     * tens of microseconds, so that a collective that will never finish (a peer gone) is
     * found and aborted rather than the wait blocking forever. NULL: a plain blocking wait.
     * The CPU backend has nothing to wait for and never calls it. */
    void (*wait_hook)(void *arg);
    void *wait_arg;

    /* ---- streams and events (see above) ---- */
    bk_stream_t *(*stream_new)(backend_t *be);   /* NULL with ftk_err_msg() on failure */
    void (*stream_free)(backend_t *be, bk_stream_t *s);
    void (*set_stream)(backend_t *be, bk_stream_t *s); /* NULL: the default stream */
    /* The native handle (cudaStream_t) of s, or of the default stream for NULL, for a
     * communication library; NULL on the CPU. */
    void *(*stream_native)(backend_t *be, bk_stream_t *s);
    bk_event_t *(*event_new)(backend_t *be);     /* NULL with ftk_err_msg() on failure */
    void (*event_free)(backend_t *be, bk_event_t *e);
    void (*event_record)(backend_t *be, bk_event_t *e); /* on the current stream */
    void (*event_wait)(backend_t *be, bk_event_t *e);   /* the current stream waits; the host does not */
    int (*event_sync)(backend_t *be, bk_event_t *e);    /* the host waits; 0 or -1 as sync() */
    /* Optional, for FTK_PROFILE (kernels/prof.h): an event that can also be timed (freed with
     * event_free), and the seconds from a to b once both have completed, or a negative
     * number when that is not known (not recorded, not complete). NULL: the ops have
     * finished when they return and the host's clock times them. */
    bk_event_t *(*timer_new)(backend_t *be);
    double (*timer_elapsed)(backend_t *be, bk_event_t *a, bk_event_t *b);

    /* ---- ops: BK_OPS, above ---- */
#define BK_OP_MEMBER(name, kind, params, args, cost) void (*name)(backend_t *be, BK_UNPAREN params);
    BK_OPS(BK_OP_MEMBER)
#undef BK_OP_MEMBER
};

/* ---- every backend (kernels/backend.c) ---- */

/* Zeroed device memory for `what` (named in the error), counted under cls; NULL with
 * "out of memory on DEVICE allocating WHAT (N bytes)". The zeroing is ordered on the
 * current stream: a buffer first used on another stream waits for an event recorded
 * after the allocation. */
void *bk_alloc(backend_t *be, size_t bytes, bk_mem_class_t cls, const char *what);
void bk_free(backend_t *be, void *p); /* NULL is a no-op */
const bk_mem_t *bk_mem(const backend_t *be);
/* Reads the device's memory in use now into used_peak (backends with mem_used; else a
 * no-op): a caller that may be at a peak bk_alloc did not see (after a step). */
void bk_mem_sample(backend_t *be);
/* Frees what the instance still holds and the instance; NULL is a no-op. */
void backend_free(backend_t *be);

/* For implementations: a new instance with the generic parts set (device and accounting);
 * NULL with ftk_err_msg() set. */
backend_t *bk_instance_new(const char *name, const char *device);
/* The same with be->ctx set to ctx_bytes of zeroed memory (the implementation's context,
 * which its destroy frees); NULL with ftk_err_msg() set. */
backend_t *bk_instance_ctx_new(const char *name, const char *device, size_t ctx_bytes);
/* For implementations, at the end of backend_*_new: clears the optional fused ops that
 * FTK_FUSED (see "Fused ops") does not select; default_all is the backend's default (1:
 * every fused op it implements, 0: none). 0, or -1 with ftk_err_msg() set when FTK_FUSED
 * names something unknown (the caller then frees be and fails). */
int bk_fused_select(backend_t *be, int default_all);
/* For implementations whose ops have finished when they return (the CPU, planning): the
 * stream and event entries as valid handles that do nothing; event_sync is sync(). */
void bk_host_streams(backend_t *be);

/* ---- the backends ---- */

/* The CPU backend (kernels/cpu/cpu.c): OpenMP, BLAS for fp32 products, bf16 products in
 * tiles widened to fp32 (its workspace, BK_CPU_WORKSPACE_BYTES, is allocated at creation
 * and counted). */
backend_t *backend_cpu_new(void);
#define BK_CPU_TILE 256
#define BK_CPU_WORKSPACE_BYTES ((size_t)3 * BK_CPU_TILE * BK_CPU_TILE * sizeof(float))

/* The CUDA backend (kernels/cuda/cuda.cu, built where nvcc is found) on the given device of
 * this process; NULL with ftk_err_msg() set when the device is absent or cannot start. A
 * program that may lack it asks the CUDA library's loader (engine/cuda_load.h), which also
 * answers for a build without CUDA. Its fixed workspace (cuBLASLt) is BK_CUDA_WORKSPACE_BYTES,
 * allocated at creation and counted. */
backend_t *backend_cuda_new(int device);
#define BK_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)
/* The workspace the CUDA backend allocates at attn_prepare for cuDNN's attention
 * (FTK_CUDA_ATTN=cudnn, bf16, hd a multiple of 8 up to 128; 0 where it would not take the
 * shapes, on the CPU, or without FTK_CUDA_ATTN=cudnn): what cuDNN's plans ask for, counted
 * as Hopper's deterministic backward asks (max_seg·n_head·max_len²·2 bytes, the most cuDNN 9
 * asks of the GPUs ftk targets; other GPUs ask less), then the softmax statistics and the
 * backward's Σ dO·O, fp32 [max_seg, n_head, max_len] each, every part rounded up to 256
 * bytes. What the planning backend allocates for it (kernels/plan/backend_plan.c), so
 * that --plan counts it; device is "cpu" or "cuda". */
int64_t bk_cudnn_plan_bytes(const char *device, dtype_t dt, int64_t max_seg, int64_t max_len, int n_head, int n_kv,
                            int hd);
/* The same from the engine's own workspace (engine_ws bytes, what its plans asked). */
int64_t bk_cudnn_ws_bytes(int64_t engine_ws, int64_t max_seg, int64_t max_len, int n_head);
/* Hopper's deterministic backward: max_seg·n_head·max_len²·2 bytes. */
int64_t bk_cudnn_hopper_bwd_ws(int64_t max_seg, int64_t max_len, int n_head);

/* CUDA devices this process sees (kernels/cuda/cuda.cu; through the loader, as above). */
int backend_cuda_devices(void);

/* The device of a tool whose --device was not given (docs/design.md, "Devices"):
 * FTK_DEVICE when set and not empty (*from_env = 1), else "cuda" when gpus (the tool's
 * backend_cuda_devices, or NULL: never cuda) counts one or more, else "cpu". gpus is called
 * only then: counting starts CUDA. The string is static or the environment's. */
const char *backend_default_device(int (*gpus)(void), int *from_env);
/* The devices by index (backend_devices[i]), and the index of name, -1 for none. */
#define BK_N_DEVICES 2
extern const char *const backend_devices[BK_N_DEVICES];
int backend_device_index(const char *name);
/* 0 when name is a device ("cpu", "cuda"); else -1 with ftk_err_msg() set to "--device NAME:
 * need cpu or cuda", " (from FTK_DEVICE)" appended where from_env. */
int backend_check_device(const char *name, int from_env);

/* The planning backend (kernels/plan/backend_plan.c): bk_alloc() on it counts and hands
 * out addresses that must never be dereferenced; every op and byte move does nothing (the
 * reductions add nothing to their accumulator). device is the device planned for, "cpu"
 * or "cuda": the instance makes the creation-time allocations that device's backend
 * makes. */
backend_t *backend_plan_new(const char *device);

#endif
