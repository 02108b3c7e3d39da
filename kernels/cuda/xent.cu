/* xent.cu — the CUDA backend's cross-entropy: the loss of each row and its gradient in
 * place of the logits, the rows' losses summed on the device (add_parts). */
#include "cuda_internal.cuh"

/* A block per row, the CPU's arithmetic: max in float, Σexp in double. */
__global__ void xent_kernel(float *logits, double *row_loss, const int32_t *targets, const float *weights, int64_t V,
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
        if (grad_scale != 0.0f)
            for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
                x[j] = 0;
        return;
    }
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        m = fmaxf(m, x[j]);
    m = block_max(m, shf);
    double s = 0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        s += exp((double)(x[j] - m));
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
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        /* rounded as the CPU's two statements (a contracted FMA would round once) */
        x[j] = j == t ? __fsub_rn(__fmul_rn(c, (float)exp((double)x[j] - lse)), c)
                      : __fmul_rn(c, (float)exp((double)x[j] - lse));
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
    xent_kernel<<<(unsigned)n, 256, 0, c->cur>>>(logits, part, targets, weights, V, grad_scale);
    launched(c, "xent");
    add_parts(c, acc, part, n, "xent sum");
}
