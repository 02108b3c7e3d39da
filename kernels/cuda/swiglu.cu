/* swiglu.cu — the CUDA backend's SwiGLU, on separate gate and up buffers (swiglu) and on one
 * [n, 2F] product (glu): the same element arithmetic. */
#include "cuda_internal.cuh"

/* The element arithmetic of swiglu and glu, shared: h = silu(g)·u and its derivatives. */
__device__ __forceinline__ float swiglu_h(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ void swiglu_d(float d, float g, float u, float *dg, float *du)
{
    float sg = 1.0f / (1.0f + expf(-g));
    *du = d * g * sg;
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
}

/* SwiGLU of elements i … i+K-1: gate at g_ + ig, up at u + iu, output at h + i. */
template <int K, typename T>
__device__ __forceinline__ void swiglu_fwd_at(T *h, const T *g_, const T *u, int64_t ig, int64_t iu, int64_t i)
{
    float a[K], b[K];
    ldk<K>(g_, ig, a);
    ldk<K>(u, iu, b);
    for (int k = 0; k < K; k++)
        a[k] = swiglu_h(a[k], b[k]);
    stk<K>(h, i, a);
}
template <int K, typename T>
__device__ __forceinline__ void swiglu_bwd_at(T *dg, T *du, const T *dh, const T *g_, const T *u, int64_t ig,
                                              int64_t iu, int64_t i)
{
    float a[K], b[K], d[K], x[K], y[K];
    ldk<K>(g_, ig, a);
    ldk<K>(u, iu, b);
    ldk<K>(dh, i, d);
    for (int k = 0; k < K; k++)
        swiglu_d(d[k], a[k], b[k], &x[k], &y[k]);
    stk<K>(du, iu, y);
    stk<K>(dg, ig, x);
}
template <int K, typename T> __device__ __forceinline__ void swiglu_fwd_el(T *h, const T *g_, const T *u, int64_t i)
{
    swiglu_fwd_at<K>(h, g_, u, i, i, i);
}
template <int K, typename T>
__device__ __forceinline__ void swiglu_bwd_el(T *dg, T *du, const T *dh, const T *g_, const T *u, int64_t i)
{
    swiglu_bwd_at<K>(dg, du, dh, g_, u, i, i, i);
}

template <typename T> __global__ void swiglu_fwd_kernel(T *h, const T *g_, const T *u, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, swiglu_fwd_el, h, g_, u);
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dg, T *du, const T *dh, const T *g_, const T *u, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, swiglu_bwd_el, dg, du, dh, g_, u);
}

void cu_swiglu_fwd(backend_t *be, bk_buf_t h, bk_buf_t g_, bk_buf_t u, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !same_dt(c, "swiglu_fwd", h.dt, g_.dt) || !same_dt(c, "swiglu_fwd", u.dt, g_.dt))
        return;
    on_dt(h.dt, [&](auto t) {
        int v = vec_ok(c, {h.p, g_.p, u.p});
        swiglu_fwd_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(t, h), AS(t, g_), AS(t, u), n, v);
    });
    launched(c, "swiglu_fwd");
}

void cu_swiglu_bwd(backend_t *be, bk_buf_t dg, bk_buf_t du, bk_buf_t dh, bk_buf_t g_, bk_buf_t u, int64_t n)
{
    cuda_t *c = enter(be);
    const char *op = "swiglu_bwd";
    if (n == 0 || failed(c) || !same_dt(c, op, dg.dt, g_.dt) || !same_dt(c, op, du.dt, g_.dt) ||
        !same_dt(c, op, dh.dt, g_.dt) || !same_dt(c, op, u.dt, g_.dt))
        return;
    on_dt(g_.dt, [&](auto t) {
        int v = vec_ok(c, {dg.p, du.p, dh.p, g_.p, u.p});
        swiglu_bwd_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(t, dg), AS(t, du), AS(t, dh), AS(t, g_),
                                                               AS(t, u), n, v);
    });
    launched(c, op);
}

/* SwiGLU on one [n, 2F] product (backend.h glu_fwd/bwd): swiglu's element functions, so the
 * bits of the swiglu sequence on the same device. Output element e = i·F + j reads gate
 * i·2F + j and up i·2F + F + j; a group of VEC outputs stays in one row when F is a
 * multiple of VEC (the only case given the 8-element path). */
template <int K, typename T> __device__ __forceinline__ void glu_fwd_el(T *h, const T *gu, int64_t F, int64_t e)
{
    int64_t g = e + e / F * F;
    swiglu_fwd_at<K>(h, gu, gu, g, g + F, e);
}
template <int K, typename T>
__device__ __forceinline__ void glu_bwd_el(T *dgu, const T *dh, const T *gu, int64_t F, int64_t e)
{
    int64_t g = e + e / F * F;
    swiglu_bwd_at<K>(dgu, dgu, dh, gu, gu, g, g + F, e);
}

template <typename T> __global__ void glu_fwd_kernel(T *h, const T *gu, int64_t n, int64_t F, int vec)
{
    ELEMENTWISE(n * F, vec, glu_fwd_el, h, gu, F);
}

template <typename T> __global__ void glu_bwd_kernel(T *dgu, const T *dh, const T *gu, int64_t n, int64_t F, int vec)
{
    ELEMENTWISE(n * F, vec, glu_bwd_el, dgu, dh, gu, F);
}

void cu_glu_fwd(backend_t *be, bk_buf_t h, bk_buf_t gu, int64_t n, int64_t F)
{
    cuda_t *c = enter(be);
    if (n * F == 0 || failed(c) || !same_dt(c, "glu_fwd", h.dt, gu.dt))
        return;
    on_dt(h.dt, [&](auto t) {
        int v = F % VEC == 0 && vec_ok(c, {h.p, gu.p});
        glu_fwd_kernel<<<ew_blocks(n * F, v), 256, 0, c->cur>>>(AS(t, h), AS(t, gu), n, F, v);
    });
    launched(c, "glu_fwd");
}

void cu_glu_bwd(backend_t *be, bk_buf_t dgu, bk_buf_t dh, bk_buf_t gu, int64_t n, int64_t F)
{
    cuda_t *c = enter(be);
    const char *op = "glu_bwd";
    if (n * F == 0 || failed(c) || !same_dt(c, op, dgu.dt, gu.dt) || !same_dt(c, op, dh.dt, gu.dt))
        return;
    on_dt(gu.dt, [&](auto t) {
        int v = F % VEC == 0 && vec_ok(c, {dgu.p, dh.p, gu.p});
        glu_bwd_kernel<<<ew_blocks(n * F, v), 256, 0, c->cur>>>(AS(t, dgu), AS(t, dh), AS(t, gu), n, F, v);
    });
    launched(c, op);
}
