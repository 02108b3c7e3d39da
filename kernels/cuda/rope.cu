/* rope.cu — the CUDA backend's rotary embedding: rope, rope_qk (q and k in one launch) and
 * qkv_rope (the fused qkv product split into rotated q, k and v). */
#include "cuda_internal.cuh"

/* The rotation of pair j at position pos, from inv = inv_freq_j. HF: inv_freq_j =
 * 1 / theta^(2j/hd) in float32, angle = pos·inv_freq in float32. The inverse frequencies
 * are computed on the host with the CPU backend's expression (rope_freqs: the same libm
 * powf, so the same floats; the device's powf may differ by an ulp or more, and at
 * position p an ulp of inv_freq moves the angle by p ulps). The angle's cosine and sine
 * come from sincospi in double, rounded to float: that reduction is exact for any angle,
 * where cosf/sinf take a slow path with local memory past |a| = 105615, and the values are
 * the nearest floats nearly always (the CPU's glibc cosf/sinf are too). */
__device__ __forceinline__ void rope_cs(float inv, int32_t pos, int inverse, float *c, float *s)
{
    float a = (float)pos * inv;
    double sd, cd;
    sincospi((double)a * 0.318309886183790671537767526745, &sd, &cd); /* a / pi */
    *c = (float)cd;
    *s = inverse ? -(float)sd : (float)sd;
}

/* The inverse frequencies of a head dimension up to 2·ROPE_MAX_HALF, passed by value. */
enum { ROPE_MAX_HALF = 256 };
typedef struct {
    float v[ROPE_MAX_HALF];
} rope_freq_t;

/* cpu.c cpu_rope's table, same expression, same powf. 0 (and the error kept) when hd is
 * larger than the table. */
static int rope_freqs(cuda_t *c, const char *op, int hd, float theta, rope_freq_t *f)
{
    int half = hd / 2;
    if (half > ROPE_MAX_HALF) {
        note_err(c, op, "head dimension over 512");
        return 0;
    }
    for (int j = 0; j < half; j++)
        f->v[j] = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
    return 1;
}

/* Elements j and j + half of one head's row x, rotated into y (which may be x). Each
 * product and sum rounded on its own (the _rn intrinsics are never contracted into an
 * FMA): the CPU's arithmetic, and the same in every kernel that rotates, whatever ptxas
 * does at each call site. */
template <typename T> __device__ __forceinline__ void rope_to(T *y, const T *x, int j, int half, float c, float s)
{
    float x1 = ld(x, j), x2 = ld(x, j + half);
    st(y, j, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    st(y, j + half, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

template <typename T> __device__ __forceinline__ void rope_rot(T *v, int j, int half, float c, float s)
{
    rope_to(v, v, j, half, c, s);
}

/* A thread per (token, pair), the heads in a loop: the angle is the same for all of them,
 * as in the CPU's loop. */
template <typename T>
__global__ void rope_kernel(T *x, const int32_t *pos, int64_t n, int n_head, int hd, const rope_freq_t f,
                            int inverse)
{
    int half = hd / 2;
    GRID_STRIDE(e, n * half)
    {
        int j = (int)(e % half);
        int64_t i = e / half;
        float c, s;
        rope_cs(f.v[j], pos[i], inverse, &c, &s);
        for (int h = 0; h < n_head; h++)
            rope_rot(x + (i * n_head + h) * hd, j, half, c, s);
    }
}

template <typename TQ, typename TK>
__global__ void rope_qk_kernel(TQ *q, TK *k, const int32_t *pos, int64_t n, int n_head, int n_kv, int hd,
                               const rope_freq_t f, int inverse)
{
    int half = hd / 2;
    GRID_STRIDE(e, n * half)
    {
        int j = (int)(e % half);
        int64_t i = e / half;
        float c, s;
        rope_cs(f.v[j], pos[i], inverse, &c, &s);
        for (int h = 0; h < n_head; h++)
            rope_rot(q + (i * n_head + h) * hd, j, half, c, s);
        for (int h = 0; h < n_kv; h++)
            rope_rot(k + (i * n_kv + h) * hd, j, half, c, s);
    }
}

void cu_rope(backend_t *be, bk_buf_t x, const int32_t *pos, int64_t n, int n_head, int hd, float theta,
                    int inverse)
{
    cuda_t *c = enter(be);
    rope_freq_t f;
    if (n == 0 || hd < 2 || failed(c) || !dt_ok(c, "rope", x.dt) || !rope_freqs(c, "rope", hd, theta, &f))
        return;
    on_dt(x.dt, [&](auto t) {
        rope_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(AS(t, x), pos, n, n_head, hd, f, inverse);
    });
    launched(c, "rope");
}

void cu_rope_qk(backend_t *be, bk_buf_t q, bk_buf_t k, const int32_t *pos, int64_t n, int n_head, int n_kv,
                       int hd, float theta, int inverse)
{
    cuda_t *c = enter(be);
    rope_freq_t f;
    if (n == 0 || hd < 2 || failed(c) || !dt_ok(c, "rope_qk", q.dt) || !dt_ok(c, "rope_qk", k.dt) ||
        !rope_freqs(c, "rope_qk", hd, theta, &f))
        return;
    on_dt(q.dt, [&](auto tq) {
        on_dt(k.dt, [&](auto tk) {
            rope_qk_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(AS(tq, q), AS(tk, k), pos, n, n_head,
                                                                              n_kv, hd, f, inverse);
        });
    });
    launched(c, "rope_qk");
}

/* q, k, v and the fused product qkv[n, Hq + 2·Hk] (backend.h qkv_rope): a thread per (token,
 * pair) as rope_qk_kernel, the same rotation (rope_cs, rope_to) between a source and a
 * destination, then the pair's elements of every v head copied. Threads of a row take
 * consecutive pairs: reads and writes are coalesced within each head. */

template <typename T>
__global__ void qkv_rope_kernel(T *qkv, T *q, T *k, T *v, const int32_t *pos, int64_t n, int n_head, int n_kv, int hd,
                                const rope_freq_t f, int inverse)
{
    int half = hd / 2;
    int64_t Hq = (int64_t)n_head * hd, Hk = (int64_t)n_kv * hd, W = Hq + 2 * Hk;
    GRID_STRIDE(e, n * half)
    {
        int j = (int)(e % half);
        int64_t i = e / half;
        float c, s;
        rope_cs(f.v[j], pos[i], inverse, &c, &s);
        T *row = qkv + i * W, *qi = q + i * Hq, *ki = k + i * Hk, *vi = v + i * Hk, *vr = row + Hq + Hk;
        for (int h = 0; h < n_head; h++)
            if (inverse)
                rope_to(row + h * hd, qi + h * hd, j, half, c, s);
            else
                rope_to(qi + h * hd, row + h * hd, j, half, c, s);
        for (int h = 0; h < n_kv; h++) {
            int64_t o = (int64_t)h * hd;
            if (inverse) {
                rope_to(row + Hq + o, ki + o, j, half, c, s);
                vr[o + j] = vi[o + j];
                vr[o + j + half] = vi[o + j + half];
            } else {
                rope_to(ki + o, row + Hq + o, j, half, c, s);
                vi[o + j] = vr[o + j];
                vi[o + j + half] = vr[o + j + half];
            }
        }
    }
}

void cu_qkv_rope(backend_t *be, bk_buf_t qkv, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int32_t *pos, int64_t n,
                        int n_head, int n_kv, int hd, float theta, int inverse)
{
    cuda_t *c = enter(be);
    const char *op = "qkv_rope";
    rope_freq_t f;
    if (n == 0 || hd < 2 || failed(c) || !same_dt(c, op, qkv.dt, q.dt) || !same_dt(c, op, qkv.dt, k.dt) ||
        !same_dt(c, op, qkv.dt, v.dt) || !rope_freqs(c, op, hd, theta, &f))
        return;
    on_dt(qkv.dt, [&](auto t) {
        qkv_rope_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(AS(t, qkv), AS(t, q), AS(t, k), AS(t, v),
                                                                           pos, n, n_head, n_kv, hd, f, inverse);
    });
    launched(c, op);
}
