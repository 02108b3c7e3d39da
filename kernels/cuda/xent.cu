/* xent.cu — the CUDA backend's cross-entropy: the loss of each row and its gradient in
 * place of the logits, the rows' losses summed on the device (add_parts). */
#include "cuda_internal.cuh"

/* A block per row, the CPU's arithmetic: max in float, Σexp in double. A thread takes K
 * consecutive logits at a time: K = VEC (two 16-byte accesses) where V is a multiple of
 * VEC and the logits are 16-byte aligned, in blocks of XENT_VEC_THREADS; else one, in
 * blocks of 256 (the first kernel, also with FTK_CUDA_VEC=0). The max and every element's
 * gradient are the same on both paths; Σexp is partitioned otherwise, so a row's loss may
 * differ in its last bits between them (deterministic on each; gpu_ops holds both to the
 * CPU's loss within 1e-12). 1024 threads: 64 registers, no spills, on sm_90 (one block
 * an SM); 512 spilled under their bound, and without one it took 78. */
enum { XENT_VEC_THREADS = 1024 };

template <int K>
__global__ void __launch_bounds__(K == 1 ? 256 : XENT_VEC_THREADS)
    xent_kernel(float *logits, double *row_loss, const int32_t *targets, const float *weights, int64_t V,
                float grad_scale)
{
    __shared__ float shf[32];
    __shared__ double shd[32];
    int64_t i = blockIdx.x;
    float *x = logits + i * V;
    float w = weights[i];
    if (w == 0.0f) {
        if (threadIdx.x == 0)
            row_loss[i] = 0;
        if (grad_scale != 0.0f) {
            float z[K] = {0};
            for (int64_t j = K * threadIdx.x; j < V; j += K * blockDim.x)
                stk<K>(x, j, z);
        }
        return;
    }
    float m = -INFINITY;
    for (int64_t j = K * threadIdx.x; j < V; j += K * blockDim.x) {
        float a[K];
        ldk<K>(x, j, a);
        for (int k = 0; k < K; k++)
            m = fmaxf(m, a[k]);
    }
    m = block_max(m, shf);
    double s = 0;
    for (int64_t j = K * threadIdx.x; j < V; j += K * blockDim.x) {
        float a[K];
        ldk<K>(x, j, a);
        for (int k = 0; k < K; k++)
            s += exp((double)(a[k] - m));
    }
    s = block_sum(s, shd);
    double lse = m + log(s);
    int32_t t = targets[i];
    float xt = x[t];
    if (threadIdx.x == 0)
        row_loss[i] = (double)w * (lse - xt);
    if (grad_scale == 0.0f)
        return;
    __syncthreads(); /* every thread has read x[t] */
    float c = grad_scale * w;
    for (int64_t j = K * threadIdx.x; j < V; j += K * blockDim.x) {
        float a[K];
        ldk<K>(x, j, a);
        for (int k = 0; k < K; k++)
            /* rounded as the CPU's two statements (a contracted FMA would round once) */
            a[k] = j + k == t ? __fsub_rn(__fmul_rn(c, (float)exp((double)a[k] - lse)), c)
                              : __fmul_rn(c, (float)exp((double)a[k] - lse));
        stk<K>(x, j, a);
    }
}

void cu_xent(backend_t *be, float *logits, const int32_t *targets, const float *weights, int64_t n, int64_t V,
                    float grad_scale, double *acc)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c))
        return;
    scratch_claim(c);
    double *part = (double *)tmp_for(c, (size_t)n * sizeof(double));
    if (!part)
        return;
    on_vec(V % VEC == 0 && vec_ok(c, {logits}), [&](auto K) {
        constexpr int k = decltype(K)::value;
        xent_kernel<k><<<(unsigned)n, k == 1 ? 256 : XENT_VEC_THREADS, 0, c->cur>>>(logits, part, targets, weights, V,
                                                                                   grad_scale);
    });
    launched(c, "xent");
    add_parts(c, acc, part, n, "xent sum");
}
