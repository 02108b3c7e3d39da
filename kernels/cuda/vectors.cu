/* vectors.cu — the CUDA backend's vector ops: add, scale, Σx² (sumsq), the add that also
 * takes Σy² (add_sumsq), and the optimizer (AdamW, one tensor a launch or every segment in
 * one); add_parts, the fixed-tree sum of partial sums that sumsq, add_sumsq and xent share. */
#include "cuda_internal.cuh"

/* ---- sums, add, scale ------------------------------------------------------------------ */

/* y *= a (0·NaN is NaN, as on the CPU). */
template <int K, typename T> __device__ __forceinline__ void mul_at(T *y, float a, int64_t i)
{
    float x[K];
    ldk<K>(y, i, x);
    for (int k = 0; k < K; k++)
        x[k] = x[k] * a;
    stk<K>(y, i, x);
}
template <typename T> __global__ void mul_kernel(T *y, float a, int64_t n, int vec) { ELEMENTWISE(n, vec, mul_at, y, a); }

/* *acc += Σ v[0 … n) taken in order from 0, then added, as the CPU does (FTK_CUDA_VEC=0,
 * for comparison: one thread walks every partial sum, a dependent add and load each). */
__global__ void add_sum_in_order_kernel(double *acc, const double *v, int64_t n)
{
    double t = 0;
    for (int64_t i = 0; i < n; i++)
        t += v[i];
    *acc += t;
}

/* *acc += Σ v[0 … n) by a fixed tree: thread t of SUM_THREADS sums v[t], v[t + SUM_THREADS],
 * … in order, then block_sum (a warp's butterfly, the warps in order) adds the threads'
 * sums. The shape depends on n alone (the launch is always one block of SUM_THREADS), so
 * every call gives the same bits; the loads are independent, where the in-order loop's
 * are a chain (the loss of a chunk is a few thousand rows, a Σx² a few thousand blocks). */
enum { SUM_THREADS = 256 };
__global__ void add_sum_tree_kernel(double *acc, const double *v, int64_t n)
{
    __shared__ double sh[32];
    double t = 0;
    for (int64_t i = threadIdx.x; i < n; i += SUM_THREADS)
        t += v[i];
    t = block_sum(t, sh);
    if (threadIdx.x == 0)
        *acc += t;
}

void add_parts(cuda_t *c, double *acc, const double *part, int64_t n, const char *what)
{
    if (c->vec)
        add_sum_tree_kernel<<<1, SUM_THREADS, 0, c->cur>>>(acc, part, n);
    else
        add_sum_in_order_kernel<<<1, 1, 0, c->cur>>>(acc, part, n);
    launched(c, what);
}

template <int K, typename TY, typename TX> __device__ __forceinline__ void add_at(TY *y, const TX *x, int64_t i)
{
    float a[K], b[K];
    ldk<K>(y, i, a);
    ldk<K>(x, i, b);
    for (int k = 0; k < K; k++)
        a[k] = a[k] + b[k];
    stk<K>(y, i, a);
}
template <typename TY, typename TX> __global__ void add_kernel(TY *y, const TX *x, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, add_at, y, x);
}

/* Σx² in fixed blocks of SUMSQ_BLOCK elements (a thread block each), then add_parts. */
enum { SUMSQ_BLOCK = BK_CUDA_SUMSQ_BLOCK }; /* cuda_mem.h sizes the side stream's scratch from it */
template <int K, typename T> __global__ void sumsq_part_kernel(double *part, const T *x, int64_t n)
{
    __shared__ double sh[32];
    int64_t a = (int64_t)blockIdx.x * SUMSQ_BLOCK, b = a + SUMSQ_BLOCK < n ? a + SUMSQ_BLOCK : n;
    double s = 0;
    /* K consecutive elements a thread (a is a multiple of VEC: whole groups from an aligned
     * x), the last partial group one by one */
    for (int64_t i = a + K * threadIdx.x; i < b; i += K * blockDim.x) {
        float v[K];
        int k1 = i + K <= b ? K : (int)(b - i);
        if (k1 == K)
            ldk<K>(x, i, v);
        else
            for (int k = 0; k < k1; k++)
                v[k] = ld(x, i + k);
        for (int k = 0; k < k1; k++)
            s += (double)v[k] * (double)v[k];
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

/* y += x, and Σy² of the sums as stored, in sumsq_part_kernel's blocks and order: thread t
 * of a block takes the same elements in the same order as there, so with the K that sumsq
 * would take on y (vec_ok of y) the partial sums are sumsq's bit for bit; each sum is
 * add_at's (one fp32 add, rounded once as stored). A square of a widened float is exact in
 * double, so a contracted multiply-add gives the bits of a multiply then an add. */
template <int K, typename TY, typename TX>
__global__ void add_sumsq_part_kernel(double *part, TY *y, const TX *x, int64_t n)
{
    __shared__ double sh[32];
    int64_t a = (int64_t)blockIdx.x * SUMSQ_BLOCK, b = a + SUMSQ_BLOCK < n ? a + SUMSQ_BLOCK : n;
    double s = 0;
    for (int64_t i = a + K * threadIdx.x; i < b; i += K * blockDim.x) {
        float v[K], w[K];
        int k1 = i + K <= b ? K : (int)(b - i);
        if (k1 == K) {
            ldk<K>(y, i, v);
            ldk<K>(x, i, w);
            for (int k = 0; k < K; k++)
                v[k] = v[k] + w[k];
            stk<K>(y, i, v);
        } else {
            for (int k = 0; k < k1; k++) {
                v[k] = ld(y, i + k) + ld(x, i + k);
                st(y, i + k, v[k]);
            }
        }
        for (int k = 0; k < k1; k++) {
            double q = as_stored(y, v[k]);
            s += q * q;
        }
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

/* bk_adamw_t's values as the kernel uses them (fp32, derived on the host as the CPU does). */
typedef struct {
    float b1, b2, omb1, omb2, eps, decay, step, bc2s, gscale;
    const float *gsp; /* bk_adamw_t gscale_dev: read here instead of gscale when not NULL */
    int stochastic;
    uint64_t key;
    int64_t index0;
} adamw_args_t;

/* The 16 random bits of state w (0 p, 1 m, 2 v) of element i: a field of r, the element's
 * one hash (BK_SROUND), or a hash of their own (BK_SROUND_HASH3, for comparison). */
__device__ __forceinline__ uint32_t sround_r(const adamw_args_t &a, int64_t i, uint64_t r, int w)
{
    return a.stochastic == BK_SROUND_HASH3 ? bk_sround_bits3(a.key, a.index0 + i, w) : bk_sround_field(r, w);
}

/* The AdamW store of state w of element i (r as for sround_r). */
__device__ __forceinline__ void st_adamw(float *p, int64_t i, float x, const adamw_args_t &, uint64_t, int) { p[i] = x; }
__device__ __forceinline__ void st_adamw(uint16_t *p, int64_t i, float x, const adamw_args_t &a, uint64_t r, int w)
{
    p[i] = a.stochastic == BK_ROUND_NEAREST ? f32_to_bf16_dev(x) : bk_sround_bf16(x, sround_r(a, i, r, w));
}

/* The stores of K elements of state w from i (stk for a whole group: 16-byte accesses). */
template <int K>
__device__ __forceinline__ void stk_adamw(float *p, int64_t i, const float *x, const adamw_args_t &, const uint64_t *,
                                          int)
{
    stk<K>(p, i, x);
}
template <int K>
__device__ __forceinline__ void stk_adamw(uint16_t *p, int64_t i, const float *x, const adamw_args_t &a,
                                          const uint64_t *r, int w)
{
    if (a.stochastic == BK_ROUND_NEAREST) {
        stk<K>(p, i, x);
    } else if (K == VEC) {
        uint32_t q[4];
        for (int k = 0; k < 4; k++) {
            uint32_t lo = bk_sround_bf16(x[2 * k], sround_r(a, i + 2 * k, r[2 * k], w));
            uint32_t hi = bk_sround_bf16(x[2 * k + 1], sround_r(a, i + 2 * k + 1, r[2 * k + 1], w));
            q[k] = lo | hi << 16;
        }
        *(uint4 *)(p + i) = make_uint4(q[0], q[1], q[2], q[3]);
    } else {
        for (int k = 0; k < K; k++)
            st_adamw(p, i + k, x[k], a, r[k], w);
    }
}

/* backend.h's formula operation by operation, rounded as written (no FMA contraction),
 * for elements i … i+K-1 (8 with 16-byte accesses, or 1): the one body of adamw_kernel
 * and adamw_multi_kernel. p's update reads the fp32 m and v before they are stored. */
template <int K, typename TP, typename TG>
__device__ __forceinline__ void adamw_at(TP *p, const TG *g_, TP *m, TP *v, const adamw_args_t &a, int64_t i)
{
    float P[K], G[K], M[K], W[K];
    ldk<K>(p, i, P);
    ldk<K>(g_, i, G);
    ldk<K>(m, i, M);
    ldk<K>(v, i, W);
    const float gs = a.gsp ? *a.gsp : a.gscale;
    for (int k = 0; k < K; k++) {
        float gi = __fmul_rn(G[k], gs);
        M[k] = __fadd_rn(__fmul_rn(a.b1, M[k]), __fmul_rn(a.omb1, gi));
        W[k] = __fadd_rn(__fmul_rn(a.b2, W[k]), __fmul_rn(__fmul_rn(a.omb2, gi), gi));
        float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(W[k]), a.bc2s), a.eps);
        P[k] = __fsub_rn(__fmul_rn(P[k], a.decay), __fdiv_rn(__fmul_rn(a.step, M[k]), den));
    }
    /* one hash an element for its three stores (unused, and so not computed, in fp32) */
    uint64_t R[K];
    for (int k = 0; k < K; k++)
        R[k] = a.stochastic == BK_SROUND ? bk_sround_hash(a.key, a.index0 + i + k) : 0;
    stk_adamw<K>(p, i, P, a, R, 0);
    stk_adamw<K>(m, i, M, a, R, 1);
    stk_adamw<K>(v, i, W, a, R, 2);
}

/* R: the rounding, a.stochastic as a constant (on_rounding) */
template <int R, typename TP, typename TG>
__global__ void adamw_kernel(TP *p, const TG *g_, TP *m, TP *v, int64_t n, adamw_args_t a, int vec)
{
    a.stochastic = R;
    ELEMENTWISE(n, vec, adamw_at, p, g_, m, v, a);
}

/* Calls f with h's rounding as a constant, to be the kernel's R: each instance's loop is
 * compiled for one rule (a loop that tested the rule at each store would be a few
 * instructions an element longer, and its three-hash path would not be the code it
 * replaced, which is what it is kept to time). fp32 states have nothing to round. */
template <typename TP, typename F> static inline void on_rounding(int r, F &&f)
{
    if constexpr (sizeof(TP) == sizeof(float))
        f(std::integral_constant<int, BK_ROUND_NEAREST>());
    else if (r == BK_SROUND)
        f(std::integral_constant<int, BK_SROUND>());
    else if (r == BK_SROUND_HASH3)
        f(std::integral_constant<int, BK_SROUND_HASH3>());
    else
        f(std::integral_constant<int, BK_ROUND_NEAREST>());
}

/* One segment of adamw_multi as the kernel reads it: the per-tensor arguments (decay
 * derived on the host as cu_adamw does) and the first thread block that works on it. */
typedef struct {
    void *p, *m, *v;
    const void *g;
    int64_t n, index0, block0;
    uint64_t key;
    float decay;
    /* 0 … VEC − 1: p, m, v and g + head all 16-byte aligned, so the elements from head on
     * go 8 a thread (16-byte accesses) and the head's one by one; −1: one by one (no such
     * head, or FTK_CUDA_VEC=0) */
    int head;
} adamw_seg_dev_t;
/* elements per thread block; cuda_mem.h sizes the block map and the table from these */
enum { ADAMW_MULTI_CHUNK = BK_CUDA_ADAMW_CHUNK };
static_assert(sizeof(adamw_seg_dev_t) <= 128, "bk_cuda_scratch counts 128 bytes a segment");

/* Block b works on elements [(b − block0)·CHUNK, +CHUNK) of segment map[b] (the block map,
 * made on the host once for the layout); without a map, of the segment whose block0 is the
 * largest not above b (a binary search of the table: block0 grows with the segment). */
template <int R, typename TP, typename TG>
__global__ void adamw_multi_kernel(TP *, const TG *, const adamw_seg_dev_t *segs, const int32_t *map, int n_segs,
                                   adamw_args_t a)
{
    a.stochastic = R;
    int64_t b = blockIdx.x;
    int lo = 0;
    if (map) {
        lo = map[b];
    } else {
        int hi = n_segs - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (segs[mid].block0 <= b)
                lo = mid;
            else
                hi = mid - 1;
        }
    }
    const adamw_seg_dev_t &s = segs[lo];
    a.decay = s.decay;
    a.key = s.key;
    a.index0 = s.index0;
    int64_t i0 = (b - s.block0) * ADAMW_MULTI_CHUNK, i1 = i0 + ADAMW_MULTI_CHUNK < s.n ? i0 + ADAMW_MULTI_CHUNK : s.n;
    TP *p = (TP *)s.p, *m = (TP *)s.m, *v = (TP *)s.v;
    const TG *g_ = (const TG *)s.g;
    if (s.head < 0) {
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
            adamw_at<1>(p, g_, m, v, a, i);
        return;
    }
    /* i0 is a multiple of CHUNK, so of VEC: the aligned groups start at i0 + head; the
     * elements before them and after the last whole one go one by one */
    int64_t v0 = i0 + s.head < i1 ? i0 + s.head : i1, ng = (i1 - v0) / VEC, v1 = v0 + ng * VEC;
    for (int64_t i = i0 + threadIdx.x; i < v0; i += blockDim.x)
        adamw_at<1>(p, g_, m, v, a, i);
    for (int64_t j = threadIdx.x; j < ng; j += blockDim.x)
        adamw_at<VEC>(p, g_, m, v, a, v0 + j * VEC);
    for (int64_t i = v1 + threadIdx.x; i < i1; i += blockDim.x)
        adamw_at<1>(p, g_, m, v, a, i);
}

void cu_add(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "add", y.dt) || !dt_ok(c, "add", x.dt))
        return;
    on_dt(y.dt, [&](auto ty) {
        on_dt(x.dt, [&](auto tx) {
            int v = vec_ok(c, {y.p, x.p});
            add_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(ty, y), AS(tx, x), n, v);
        });
    });
    launched(c, "add");
}

void cu_scale(backend_t *be, bk_buf_t y, float a, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "scale", y.dt))
        return;
    int v = vec_ok(c, {y.p});
    on_dt(y.dt, [&](auto t) { mul_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(t, y), a, n, v); });
    launched(c, "scale");
}

void cu_sumsq(backend_t *be, bk_buf_t x, int64_t n, double *acc)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "sumsq", x.dt))
        return;
    int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double *part;
    if (c->cur != c->def) {
        part = (double *)scratch(c, &c->side_part, &c->side_part_cap, (size_t)nb * sizeof(double),
                                 "sumsq's partial sums (side stream)");
    } else {
        scratch_claim(c);
        part = (double *)tmp_for(c, (size_t)nb * sizeof(double));
    }
    if (!part)
        return;
    on_dt(x.dt, [&](auto t) {
        on_vec(vec_ok(c, {x.p}), [&](auto K) {
            sumsq_part_kernel<decltype(K)::value><<<(unsigned)nb, 256, 0, c->cur>>>(part, AS(t, x), n);
        });
    });
    launched(c, "sumsq");
    add_parts(c, acc, part, nb, "sumsq sum");
}

void cu_add_sumsq(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n, double *acc)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "add_sumsq", y.dt) || !dt_ok(c, "add_sumsq", x.dt))
        return;
    /* sumsq's bits follow y's alignment alone; an x that cannot take y's 16-byte path (a
     * view at an odd offset) runs the two ops */
    int vy = vec_ok(c, {y.p});
    if (vy && !vec_ok(c, {x.p})) {
        cu_add(be, y, x, n);
        cu_sumsq(be, y, n, acc);
        return;
    }
    int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    scratch_claim(c);
    double *part = (double *)tmp_for(c, (size_t)nb * sizeof(double));
    if (!part)
        return;
    on_dt(y.dt, [&](auto ty) {
        on_dt(x.dt, [&](auto tx) {
            on_vec(vy, [&](auto K) {
                add_sumsq_part_kernel<decltype(K)::value>
                    <<<(unsigned)nb, 256, 0, c->cur>>>(part, AS(ty, y), AS(tx, x), n);
            });
        });
    });
    launched(c, "add_sumsq");
    add_parts(c, acc, part, nb, "add_sumsq sum");
}

/* h's rounding is one of sround.h's (the error kept otherwise). */
static int rounding_ok(cuda_t *c, const char *op, const bk_adamw_t *h)
{
    if (h->stochastic == BK_ROUND_NEAREST || h->stochastic == BK_SROUND || h->stochastic == BK_SROUND_HASH3)
        return 1;
    note_err(c, op, "rounding unknown");
    return 0;
}

static adamw_args_t adamw_args_of(const bk_adamw_t *h)
{
    adamw_args_t a;
    a.b1 = h->b1;
    a.b2 = h->b2;
    a.omb1 = 1.0f - h->b1;
    a.omb2 = 1.0f - h->b2;
    a.eps = h->eps;
    a.decay = 1.0f - h->lr * h->wd;
    a.step = (float)(h->lr / h->bc1);
    a.bc2s = (float)sqrt(h->bc2);
    a.gscale = h->gscale;
    a.gsp = h->gscale_dev;
    a.stochastic = h->stochastic;
    a.key = h->key;
    a.index0 = h->index0;
    return a;
}

/* One thread: the host's sum in unit order, then clip.h's coefficient (double, correctly
 * rounded on the device: the same bits as engine/optim.c's). */
__global__ void clip_coef_kernel(float *coef, const double *sq, int n, double max_norm)
{
    double total = 0;
    for (int i = 0; i < n; i++)
        total += sq[i];
    *coef = bk_clip_coef(total, max_norm);
}

void cu_clip_coef(backend_t *be, float *coef, const double *sq, int n, double max_norm)
{
    cuda_t *c = enter(be);
    if (failed(c))
        return;
    clip_coef_kernel<<<1, 1, 0, c->cur>>>(coef, sq, n, max_norm);
    launched(c, "clip_coef");
}

void cu_adamw(backend_t *be, bk_buf_t p, bk_buf_t g_, bk_buf_t m, bk_buf_t v, int64_t n, const bk_adamw_t *h)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !same_dt(c, "adamw", m.dt, p.dt) || !same_dt(c, "adamw", v.dt, p.dt) ||
        !dt_ok(c, "adamw", g_.dt) || !rounding_ok(c, "adamw", h))
        return;
    adamw_args_t a = adamw_args_of(h);
    on_dt(p.dt, [&](auto tp) {
        on_dt(g_.dt, [&](auto tg) {
            int vec = vec_ok(c, {p.p, g_.p, m.p, v.p});
            on_rounding<std::remove_pointer_t<decltype(tp)>>(a.stochastic, [&](auto R) {
                adamw_kernel<decltype(R)::value><<<ew_blocks(n, vec), 256, 0, c->cur>>>(
                    AS(tp, p), AS(tg, g_), AS(tp, m), AS(tp, v), n, a, vec);
            });
        });
    });
    launched(c, "adamw");
}

/* The elements before p, m, v and g are all 16-byte aligned (0 … VEC − 1), or −1 when no
 * such count exists or the 8-element path is off. */
static int adamw_head(const cuda_t *c, const bk_adamw_seg_t *sg, size_t ssz, size_t gsz)
{
    if (!c->vec)
        return -1;
    for (int h = 0; h < VEC; h++)
        if (((uintptr_t)sg->p + h * ssz) % 16 == 0 && ((uintptr_t)sg->m + h * ssz) % 16 == 0 &&
            ((uintptr_t)sg->v + h * ssz) % 16 == 0 && ((uintptr_t)sg->g + h * gsz) % 16 == 0)
            return h;
    return -1;
}

/* One launch for every segment: the table goes up through pinned staging (upload_seg's
 * pattern: the host waits only for the previous table's copy) into tmp. The block map goes
 * up the same way, into its own buffer, when the layout is not the last call's. */
void cu_adamw_multi(backend_t *be, const bk_adamw_seg_t *segs, int n_segs, dtype_t sdt, dtype_t gdt,
                    const bk_adamw_t *h)
{
    cuda_t *c = enter(be);
    if (n_segs <= 0 || failed(c) || !dt_ok(c, "adamw_multi", sdt) || !dt_ok(c, "adamw_multi", gdt) ||
        !rounding_ok(c, "adamw_multi", h))
        return;
    /* the layout: the kept segments (blocks > 0: block0 must grow strictly for the search)
     * and their blocks, against the map's */
    int k = 0, same = 1;
    int64_t blocks = 0;
    for (int s = 0; s < n_segs; s++) {
        if (segs[s].n <= 0)
            continue;
        int64_t nb = (segs[s].n + ADAMW_MULTI_CHUNK - 1) / ADAMW_MULTI_CHUNK;
        same = same && k < c->am_layout_n && c->am_layout[k] == nb;
        blocks += nb;
        k++;
    }
    same = same && k == c->am_layout_n;
    if (k == 0)
        return;
    if (blocks > 0x7fffffff) {
        note_err(c, "adamw_multi", "more than 2^31 - 1 thread blocks");
        return;
    }
    int use_map = c->vec, new_map = use_map && !same;
    size_t tbytes = ((size_t)k * sizeof(adamw_seg_dev_t) + 15) / 16 * 16;
    size_t mbytes = (size_t)blocks * sizeof(int32_t), bytes = tbytes + (new_map ? mbytes : 0);
    if (ck(c, host_wait(c, NULL, c->am_ev), "adamw_multi table") < 0)
        return;
    if (bytes > c->am_host_cap) {
        cudaFreeHost(c->am_host);
        c->am_host = NULL;
        c->am_host_cap = 0;
        if (ck(c, cudaMallocHost(&c->am_host, bytes), "adamw_multi table (pinned host memory)") < 0)
            return;
        c->am_host_cap = bytes;
    }
    adamw_seg_dev_t *t = (adamw_seg_dev_t *)c->am_host;
    int32_t *map_host = (int32_t *)((char *)c->am_host + tbytes);
    size_t ssz = dtype_size(sdt), gsz = dtype_size(gdt);
    k = 0;
    blocks = 0;
    for (int s = 0; s < n_segs; s++) {
        if (segs[s].n <= 0)
            continue;
        int64_t nb = (segs[s].n + ADAMW_MULTI_CHUNK - 1) / ADAMW_MULTI_CHUNK;
        t[k].p = segs[s].p;
        t[k].m = segs[s].m;
        t[k].v = segs[s].v;
        t[k].g = segs[s].g;
        t[k].n = segs[s].n;
        t[k].index0 = segs[s].index0;
        t[k].block0 = blocks;
        t[k].key = segs[s].key;
        t[k].decay = 1.0f - h->lr * segs[s].wd; /* as adamw_args_of */
        t[k].head = adamw_head(c, &segs[s], ssz, gsz);
        if (new_map)
            for (int64_t j = 0; j < nb; j++)
                map_host[blocks + j] = k;
        blocks += nb;
        k++;
    }
    scratch_claim(c);
    if (new_map) {
        /* the layout is forgotten until the new map is up: a failure leaves none valid */
        c->am_layout_n = 0;
        int64_t *l = (int64_t *)realloc(c->am_layout, (size_t)k * sizeof *l);
        if (!l) {
            note_err(c, "adamw_multi", "out of memory (block map layout)");
            return;
        }
        c->am_layout = l;
        /* scratch_claim ordered this stream after every earlier adamw_multi (each used tmp),
         * so no launch still reads the old map when the copy overwrites it */
        if (!scratch(c, &c->am_map, &c->am_map_cap, mbytes, "adamw_multi block map") ||
            ck(c, cudaMemcpyAsync(c->am_map, map_host, mbytes, cudaMemcpyHostToDevice, c->cur),
               "adamw_multi block map") < 0)
            return;
        for (int j = 0; j < k; j++)
            l[j] = (j + 1 < k ? t[j + 1].block0 : blocks) - t[j].block0;
        c->am_layout_n = k;
    }
    adamw_seg_dev_t *dt = (adamw_seg_dev_t *)tmp_for(c, (size_t)k * sizeof *t);
    if (!dt)
        return;
    if (ck(c, cudaMemcpyAsync(dt, t, (size_t)k * sizeof *t, cudaMemcpyHostToDevice, c->cur), "adamw_multi table") <
            0 ||
        ck(c, cudaEventRecord(c->am_ev, c->cur), "adamw_multi table") < 0)
        return;
    adamw_args_t a = adamw_args_of(h);
    const int32_t *map = use_map ? (const int32_t *)c->am_map : NULL;
    on_dt(sdt, [&](auto tp) {
        on_dt(gdt, [&](auto tg) {
            on_rounding<std::remove_pointer_t<decltype(tp)>>(a.stochastic, [&](auto R) {
                adamw_multi_kernel<decltype(R)::value><<<(unsigned)blocks, 256, 0, c->cur>>>(tp, tg, dt, map, k, a);
            });
        });
    });
    launched(c, "adamw_multi");
}

/* ---- int8 codes in blocks (backend.h quant_i8, dequant_i8) ------------------------------- */

/* One warp a block of codes: the lanes' maxima (fmaxf skips NaN, as the CPU's loop does; max
 * is exact, so the order does not matter), then one IEEE division per element. */
template <typename T>
__global__ void quant_i8_kernel(int8_t *codes, float *scales, const T *x, int64_t n, int64_t block, int64_t nb)
{
    int lane = threadIdx.x & 31;
    int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < nb; b += warps) {
        int64_t a = b * block, e = a + block < n ? a + block : n;
        float amax = 0.0f;
        for (int64_t i = a + lane; i < e; i += 32)
            amax = fmaxf(amax, fabsf(ld(x, i)));
        amax = warp_max(amax);
        float sc = __fdiv_rn(amax, 127.0f);
        if (lane == 0)
            scales[b] = sc;
        for (int64_t i = a + lane; i < e; i += 32) {
            float q = sc > 0.0f ? rintf(__fdiv_rn(ld(x, i), sc)) : 0.0f;
            codes[i] = (int8_t)fminf(fmaxf(q, -127.0f), 127.0f);
        }
    }
}

template <typename T>
__global__ void dequant_i8_kernel(T *y, const int8_t *codes, const float *scales, int64_t n, int64_t block)
{
    GRID_STRIDE(i, n) st(y, i, __fmul_rn((float)codes[i], scales[i / block]));
}

void cu_quant_i8(backend_t *be, int8_t *codes, float *scales, bk_buf_t x, int64_t n, int64_t block)
{
    cuda_t *c = enter(be);
    if (n <= 0 || block <= 0 || failed(c) || !dt_ok(c, "quant_i8", x.dt))
        return;
    int64_t nb = (n + block - 1) / block;
    on_dt(x.dt, [&](auto t) {
        quant_i8_kernel<<<blocks_for(nb * 32, 256), 256, 0, c->cur>>>(codes, scales, AS(t, x), n, block, nb);
    });
    launched(c, "quant_i8");
}

void cu_dequant_i8(backend_t *be, bk_buf_t y, const int8_t *codes, const float *scales, int64_t n, int64_t block)
{
    cuda_t *c = enter(be);
    if (n <= 0 || block <= 0 || failed(c) || !dt_ok(c, "dequant_i8", y.dt))
        return;
    on_dt(y.dt, [&](auto t) {
        dequant_i8_kernel<<<blocks_for(n, 256), 256, 0, c->cur>>>(AS(t, y), codes, scales, n, block);
    });
    launched(c, "dequant_i8");
}
