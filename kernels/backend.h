/* backend.h — the compute backend interface: one table of ops that the model is written
 * against once (engine/model.c). kernels/cpu/ is the reference implementation (fp32,
 * OpenMP, BLAS); every other backend is checked op by op against it.
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
 *    head h / (n_head / n_kv) (grouped-query attention). lse[n, n_head] keeps the softmax
 *    log-sum-exp for the backward pass.
 *  - Backward ops that produce a parameter gradient ADD into it (gradient accumulation
 *    over micro-batches); those that produce an activation gradient say whether they
 *    add or overwrite.
 *  - Pointers come from alloc() of the same backend; host-side arguments (scalars,
 *    segment lists on the host) are marked. Ops do not fail: shapes are the caller's
 *    contract (engine/model.c checks the configuration once). Like a kernel launch, an op
 *    has no error path: the CPU ops that need a few kilobytes of per-thread scratch
 *    (attention rows, the loss's per-row sums) abort if even that cannot be allocated.
 *  - Memory from alloc() may not be host memory: only upload/download move bytes
 *    between the host and it (a CUDA backend's pointers are device pointers).
 *  - Determinism: for a given backend and thread count every op gives the same bits on
 *    every call; the CPU ops also give the same bits for any thread count except matmul,
 *    which is BLAS's. Bit-exact resume depends on this.
 */
#ifndef FTK_BACKEND_H
#define FTK_BACKEND_H
#include <stddef.h>
#include <stdint.h>

typedef struct backend {
    const char *name; /* "cpu", "cuda" */

    /* Memory. alloc returns zeroed memory or NULL (with ftk_err_msg() set). */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    /* Waits for the ops issued so far; 0, or -1 with ftk_err_msg() set when one of them
     * failed since the backend started (a device backend keeps its first error and skips
     * later ops; the CPU backend never fails here). */
    int (*sync)(void);

    /* C[M,N] = alpha·op(A)·op(B) + beta·C, op(X) = X or Xᵀ (ta, tb); A is [M,K] (or [K,M]
     * when ta), B is [K,N] (or [N,K] when tb). A linear layer y = x·Wᵀ is
     * matmul(0, 1, n, out, in, 1, x, W, 0, y). */
    void (*matmul)(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B,
                   float beta, float *C);

    /* out[i] = table[ids[i]]; dtable[ids[i]] += dout[i]. ids is a device array. */
    void (*embed_fwd)(float *out, const int32_t *ids, const float *table, int64_t n, int64_t d);
    void (*embed_bwd)(float *dtable, const int32_t *ids, const float *dout, int64_t n, int64_t d);

    /* dst[i] = src[idx[i]] is embed_fwd; this is its inverse for distinct idx:
     * dst[idx[i]] = src[i] (rows of width d; other rows of dst untouched). */
    void (*rows_scatter)(float *dst, const int32_t *idx, const float *src, int64_t n, int64_t d);

    /* RMSNorm (HF LlamaRMSNorm): out = x / sqrt(mean(x²) + eps) · w; rstd[i] = 1/sqrt(…).
     * Backward: dx += ∂/∂x (adds, so the residual gradient flows through it), dw += ∂/∂w. */
    void (*rmsnorm_fwd)(float *out, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps);
    void (*rmsnorm_bwd)(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                        int64_t n, int64_t d);

    /* Rotary embedding in Hugging Face's convention (rotate_half: element i pairs with
     * i + hd/2), in place on x[n, n_head·hd], angle pos[i]·theta^(-2j/hd). inverse applies
     * the transposed rotation (the backward pass). pos is a device array. */
    void (*rope)(float *x, const int32_t *pos, int64_t n, int n_head, int hd, float theta, int inverse);

    /* Causal attention inside segments, scale 1/sqrt(hd). seg is a HOST array. out and
     * lse are overwritten. Backward overwrites dq, dk, dv. */
    void (*attn_fwd)(float *out, float *lse, const float *q, const float *k, const float *v, const int64_t *seg,
                     int64_t n_seg, int n_head, int n_kv, int hd);
    void (*attn_bwd)(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                     const float *v, const float *out, const float *lse, const int64_t *seg, int64_t n_seg,
                     int n_head, int n_kv, int hd);
    /* Decoding with a cache: the n new queries q[n, …] sit at positions p0 … p0+n-1 of one
     * sequence whose keys/values kc, vc[p0+n, n_kv·hd] are already written; query i sees
     * keys 0 … p0+i. */
    void (*attn_cached)(float *out, const float *q, const float *kc, const float *vc, int64_t n, int64_t p0,
                        int n_head, int n_kv, int hd);

    /* SwiGLU: h = silu(g)·u. Backward overwrites dg, du. */
    void (*swiglu_fwd)(float *h, const float *g, const float *u, int64_t n);
    void (*swiglu_bwd)(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);

    /* Cross-entropy of logits[n, V] against targets with per-row weights (device
     * arrays). Returns Σ weight·loss (a host double). When grad_scale != 0, logits are
     * replaced by their gradient grad_scale·weight·(softmax − onehot). */
    double (*xent)(float *logits, const int32_t *targets, const float *weights, int64_t n, int64_t V,
                   float grad_scale);

    /* y += x; y *= a; Σx² (double, summed in a fixed order). */
    void (*add)(float *y, const float *x, int64_t n);
    void (*scale)(float *y, float a, int64_t n);
    double (*sumsq)(const float *x, int64_t n);

    /* One AdamW step on n elements, exactly torch.optim.AdamW's (decoupled decay):
     * p *= 1 − lr·wd; m = b1·m + (1−b1)·g; v = b2·v + (1−b2)·g²;
     * p −= (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps), with bc1 = 1 − b1^t, bc2 = 1 − b2^t
     * (passed in, computed in double by the caller). g is read only. */
    void (*adamw)(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2, float eps,
                  float wd, double bc1, double bc2);
} backend_t;

/* The CPU backend (kernels/cpu/cpu.c). */
const backend_t *backend_cpu(void);

/* The CUDA backend (kernels/cuda/cuda.cu) on the given device of this process; NULL with
 * ftk_err_msg() set when the build has no CUDA (kernels/none/cuda_none.c), the device is
 * absent, or it cannot start. One device per process. */
const backend_t *backend_cuda(int device);
/* CUDA devices this process sees; 0 without CUDA. */
int backend_cuda_devices(void);

#endif
