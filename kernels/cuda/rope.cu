/* rope.cu — the CUDA backend's rotary embedding: rope, rope_qk (q and k in one launch) and
 * qkv_rope (the fused qkv product split into rotated q, k and v), each with 16-byte
 * accesses where the head dimension and alignment allow, one pair a thread otherwise. */
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
__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float s, float *y1, float *y2)
{
    *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

template <typename T> __device__ __forceinline__ void rope_to(T *y, const T *x, int j, int half, float c, float s)
{
    float y1, y2;
    rope_pair(ld(x, j), ld(x, j + half), c, s, &y1, &y2);
    st(y, j, y1);
    st(y, j + half, y2);
}

template <typename T> __device__ __forceinline__ void rope_rot(T *v, int j, int half, float c, float s)
{
    rope_to(v, v, j, half, c, s);
}

/* ---- 16-byte accesses ----------------------------------------------------------------------
 * The one-pair kernels (rope_kernel, rope_qk_kernel, qkv_rope_kernel, after this section)
 * give a thread one (token, pair) and walk every head with 2-byte accesses in bf16 (issue
 * 42's review estimated ~30-45% of a device copy). Where every buffer is 16-byte aligned
 * and half = hd/2 is a multiple of VEC (hd % 16 == 0: 64, 80, 96, 128), a thread takes VEC
 * consecutive pairs j … j + VEC of ROPE_HEADS heads of one token: one 16-byte access per
 * half-row per head (two in fp32), every head's loads issued before the first store (the
 * compiler cannot move a load above a store it cannot prove apart, so a loop over heads
 * would keep one head in flight). Threads of a token take consecutive groups, so a warp
 * covers whole half-rows. An element's rotation is rope_pair with rope_cs's angle on both
 * paths: the same bits. FTK_CUDA_VEC=0, other head dimensions and views off 16 bytes take
 * the one-pair kernels (rope_vec_ok). */
enum { ROPE_HEADS = 4 };

static inline int rope_vec_ok(const cuda_t *c, int hd, std::initializer_list<const void *> bufs)
{
    return hd % (2 * VEC) == 0 && vec_ok(c, bufs);
}

/* Chunks of ROPE_HEADS heads in nh heads. */
__host__ __device__ __forceinline__ int rope_chunks(int nh) { return (nh + ROPE_HEADS - 1) / ROPE_HEADS; }

/* VEC elements of type T as the 16-byte words that hold them (rope_w<T>::n words), loaded
 * and kept raw: a bf16 group held until its rotation takes 4 registers, not 8 floats. */
template <typename T> struct rope_w {
    enum { n = VEC * (int)sizeof(T) / 16 };
};
template <typename T> __device__ __forceinline__ void rope_ld(const T *p, uint4 *w)
{
#pragma unroll
    for (int k = 0; k < rope_w<T>::n; k++)
        w[k] = ((const uint4 *)p)[k];
}
template <typename T> __device__ __forceinline__ void rope_st(T *p, const uint4 *w)
{
#pragma unroll
    for (int k = 0; k < rope_w<T>::n; k++)
        ((uint4 *)p)[k] = w[k];
}
/* The words' elements widened to float, as ldk<VEC> would have read them. */
__device__ __forceinline__ void rope_unpack(const float *, const uint4 *w, float *x)
{
#pragma unroll
    for (int k = 0; k < 2; k++) {
        x[4 * k] = __uint_as_float(w[k].x), x[4 * k + 1] = __uint_as_float(w[k].y);
        x[4 * k + 2] = __uint_as_float(w[k].z), x[4 * k + 3] = __uint_as_float(w[k].w);
    }
}
__device__ __forceinline__ void rope_unpack(const uint16_t *, const uint4 *w, float *x)
{
    uint32_t v[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
#pragma unroll
    for (int k = 0; k < 4; k++) { /* little-endian: element 2k is the low half */
        x[2 * k] = __uint_as_float(v[k] << 16);
        x[2 * k + 1] = __uint_as_float(v[k] & 0xffff0000u);
    }
}

/* x rounded into the words of VEC elements of p's type, as stk<VEC> would have stored it. */
__device__ __forceinline__ void rope_pack(const float *, const float *x, uint4 *w)
{
#pragma unroll
    for (int k = 0; k < 2; k++)
        w[k] = make_uint4(__float_as_uint(x[4 * k]), __float_as_uint(x[4 * k + 1]), __float_as_uint(x[4 * k + 2]),
                          __float_as_uint(x[4 * k + 3]));
}
__device__ __forceinline__ void rope_pack(const uint16_t *, const float *x, uint4 *w)
{
    uint32_t v[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        v[k] = (uint32_t)f32_to_bf16_dev(x[2 * k]) | (uint32_t)f32_to_bf16_dev(x[2 * k + 1]) << 16;
    w[0] = make_uint4(v[0], v[1], v[2], v[3]);
}

/* Pairs j … j + VEC of heads h0 … h0 + ROPE_HEADS (those below nh) of one token, loaded
 * from x's row, every load issued before any is used: a, the first halves; b, the second. */
template <typename T>
__device__ __forceinline__ void heads_ld(const T *x, int h0, int nh, int hd, int j, int half,
                                         uint4 (&a)[ROPE_HEADS][rope_w<T>::n], uint4 (&b)[ROPE_HEADS][rope_w<T>::n])
{
#pragma unroll
    for (int u = 0; u < ROPE_HEADS; u++)
        if (h0 + u < nh) {
            const T *r = x + (int64_t)(h0 + u) * hd;
            rope_ld(r + j, a[u]);
            rope_ld(r + j + half, b[u]);
        }
}

/* Pairs j … j + VEC of heads h0 … h0 + ROPE_HEADS (those below nh) of one token, rotated
 * from x's row into y's (which may be x's); c, s: the VEC pairs' cosines and sines. */
template <typename TD, typename TS>
__device__ __forceinline__ void rope_heads(TD *y, const TS *x, int h0, int nh, int hd, int j, int half, const float *c,
                                           const float *s)
{
    uint4 a[ROPE_HEADS][rope_w<TS>::n], b[ROPE_HEADS][rope_w<TS>::n];
    heads_ld(x, h0, nh, hd, j, half, a, b);
#pragma unroll
    for (int u = 0; u < ROPE_HEADS; u++)
        if (h0 + u < nh) {
            float x1[VEC], x2[VEC];
            rope_unpack(x, a[u], x1);
            rope_unpack(x, b[u], x2);
#pragma unroll
            for (int k = 0; k < VEC; k++)
                rope_pair(x1[k], x2[k], c[k], s[k], &x1[k], &x2[k]);
            /* stored as whole words: through stk, nvcc 13 made rope_qk's 16-byte stores
             * four 4-byte ones */
            uint4 w1[rope_w<TD>::n], w2[rope_w<TD>::n];
            rope_pack(y, x1, w1);
            rope_pack(y, x2, w2);
            TD *r = y + (int64_t)(h0 + u) * hd;
            rope_st(r + j, w1);
            rope_st(r + j + half, w2);
        }
}

/* The same elements copied as they are (qkv_rope's v). */
template <typename T>
__device__ __forceinline__ void copy_heads(T *y, const T *x, int h0, int nh, int hd, int j, int half)
{
    uint4 a[ROPE_HEADS][rope_w<T>::n], b[ROPE_HEADS][rope_w<T>::n];
    heads_ld(x, h0, nh, hd, j, half, a, b);
#pragma unroll
    for (int u = 0; u < ROPE_HEADS; u++)
        if (h0 + u < nh) {
            T *r = y + (int64_t)(h0 + u) * hd;
            rope_st(r + j, a[u]);
            rope_st(r + j + half, b[u]);
        }
}

/* A block per token (grid-stride over the tokens): the token's cosines and sines first,
 * one thread per pair into shared memory (as many angles as the one-pair kernels compute:
 * each thread computing its own 8 for each of its heads' chunks would take ~350 fp64
 * instructions a thread, several times the rest), then the token's work items, item
 * e = chunk·G + g: chunk of ROPE_HEADS heads, group g of VEC pairs (G = half / VEC).
 * Consecutive threads take consecutive groups of a chunk: a warp covers whole half-rows. */
template <typename F>
__device__ __forceinline__ void rope_token(const rope_freq_t &f, int32_t p, int half, int inverse, int items, F &&item)
{
    __shared__ float cs[2][ROPE_MAX_HALF];
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        rope_cs(f.v[j], p, inverse, &cs[0][j], &cs[1][j]);
    __syncthreads();
    for (int e = threadIdx.x; e < items; e += blockDim.x) {
        /* into registers before the first store (read through a pointer, nvcc read them
         * from shared memory again after every global store) */
        int j = e % (half / VEC) * VEC;
        float c[VEC], s[VEC];
        for (int k = 0; k < VEC; k++)
            c[k] = cs[0][j + k], s[k] = cs[1][j + k];
        item(e, j, (const float *)c, (const float *)s);
    }
    __syncthreads(); /* cs is rewritten for the next token */
}

/* q's nq heads and k's nk (0: rope alone) of n tokens in place; chunks: q's, then k's. */
template <typename TQ, typename TK>
__global__ void rope_qk_vec_kernel(TQ *q, TK *k, const int32_t *pos, int64_t n, int nq, int nk, int hd,
                                   const rope_freq_t f, int inverse)
{
    int half = hd / 2, G = half / VEC, cq = rope_chunks(nq), C = cq + rope_chunks(nk);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x)
        rope_token(f, pos[i], half, inverse, C * G, [&](int e, int j, const float *c, const float *s) {
            int ch = e / G;
            if (ch < cq) {
                TQ *r = q + i * nq * hd;
                rope_heads(r, (const TQ *)r, ch * ROPE_HEADS, nq, hd, j, half, c, s);
            } else {
                TK *r = k + i * nk * hd;
                rope_heads(r, (const TK *)r, (ch - cq) * ROPE_HEADS, nk, hd, j, half, c, s);
            }
        });
}

/* qkv_rope (below) as rope_qk_vec_kernel: q's chunks, k's, then v's (copied). */
template <typename T>
__global__ void qkv_rope_vec_kernel(T *qkv, T *q, T *k, T *v, const int32_t *pos, int64_t n, int nq, int nk, int hd,
                                    const rope_freq_t f, int inverse)
{
    int half = hd / 2, G = half / VEC, cq = rope_chunks(nq), ck = rope_chunks(nk), C = cq + 2 * ck;
    int64_t Hq = (int64_t)nq * hd, Hk = (int64_t)nk * hd, W = Hq + 2 * Hk;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x)
        rope_token(f, pos[i], half, inverse, C * G, [&](int e, int j, const float *c, const float *s) {
            int ch = e / G;
            T *row = qkv + i * W;
            if (ch >= cq + ck) {
                T *vr = row + Hq + Hk, *vi = v + i * Hk;
                int h0 = (ch - cq - ck) * ROPE_HEADS;
                if (inverse)
                    copy_heads(vr, (const T *)vi, h0, nk, hd, j, half);
                else
                    copy_heads(vi, (const T *)vr, h0, nk, hd, j, half);
                return;
            }
            T *mine = ch < cq ? q + i * Hq : k + i * Hk, *packed = ch < cq ? row : row + Hq;
            int h0 = (ch < cq ? ch : ch - cq) * ROPE_HEADS, nh = ch < cq ? nq : nk;
            if (inverse)
                rope_heads(packed, (const T *)mine, h0, nh, hd, j, half, c, s);
            else
                rope_heads(mine, (const T *)packed, h0, nh, hd, j, half, c, s);
        });
}

/* The vector kernels' launch over n tokens with C chunks a token: a block a token, a
 * thread an item up to 256 (7B's rope_qk: 128; ~105-111 registers a thread in bf16 on
 * sm_90, so blocks this small keep several on an SM), at least a warp. */
static inline dim3 rope_vec_blocks(int64_t n) { return dim3((unsigned)(n < (1 << 24) ? n : (1 << 24))); }
static inline unsigned rope_vec_threads(int C, int hd)
{
    int items = C * (hd / 2 / VEC), t = (items + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t > 256 ? 256 : t);
}

/* The one-pair kernels (FTK_CUDA_VEC=0, and the shapes and views the section above does
 * not take): a thread per (token, pair), the heads in a loop: the angle is the same for
 * all of them, as in the CPU's loop. */
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
        if (rope_vec_ok(c, hd, {x.p}))
            rope_qk_vec_kernel<<<rope_vec_blocks(n), rope_vec_threads(rope_chunks(n_head), hd), 0, c->cur>>>(
                AS(t, x), AS(t, x), pos, n, n_head, 0, hd, f, inverse);
        else
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
            if (rope_vec_ok(c, hd, {q.p, k.p}))
                rope_qk_vec_kernel<<<rope_vec_blocks(n), rope_vec_threads(rope_chunks(n_head) + rope_chunks(n_kv), hd),
                                     0, c->cur>>>(AS(tq, q), AS(tk, k), pos, n, n_head, n_kv, hd, f, inverse);
            else
                rope_qk_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(AS(tq, q), AS(tk, k), pos, n,
                                                                                  n_head, n_kv, hd, f, inverse);
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
        if (rope_vec_ok(c, hd, {qkv.p, q.p, k.p, v.p}))
            qkv_rope_vec_kernel<<<rope_vec_blocks(n), rope_vec_threads(rope_chunks(n_head) + 2 * rope_chunks(n_kv), hd),
                                  0, c->cur>>>(AS(t, qkv), AS(t, q), AS(t, k), AS(t, v), pos, n, n_head, n_kv, hd, f,
                                            inverse);
        else
            qkv_rope_kernel<<<blocks_for(n * (hd / 2), 256), 256, 0, c->cur>>>(
                AS(t, qkv), AS(t, q), AS(t, k), AS(t, v), pos, n, n_head, n_kv, hd, f, inverse);
    });
    launched(c, op);
}
