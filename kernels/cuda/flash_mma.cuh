/* flash_mma.cuh — causal attention inside packed segments on the tensor cores with every
 * accumulator in registers (FlashAttention-2's structure), for bf16 q, k, v with a head
 * dimension that is a multiple of 16 up to 128 (attention.cu builds 64, 80, 96 and 128).
 * flash_attn.cuh's WMMA kernels do the same work with the scores and the running output in
 * shared memory. attention.cu runs these with FTK_CUDA_ATTN=mma; FTK_CUDA_ATTN=flash (the
 * default) and =simple run the others (docs/gpu.md says which path is kept for what).
 *
 * Uses mma_sync.cuh's primitives (ldmatrix, mma.sync m16n8k16, cp.async; their fragment
 * layouts are written out there) and common.cuh's seg_start; attention.cu includes those first.
 * tests/gpu/flash_emu.cc includes this file on the host with emulated primitives and runs
 * the kernels against the CPU backend, so their indexing is checked without a GPU.
 *
 * Work: 4 warps a block, each warp 16 rows of the block's tile, key (or query) tiles
 * streamed through shared memory with cp.async, the next tile's copy in flight while the
 * current one is multiplied (two buffers).
 *  - forward: block (64 queries, head); key tiles of 64 from the segment start of the
 *    block's first query up to its last query. Scores S = Q·Kᵀ and the output O stay in
 *    mma accumulators; the online softmax rescales them in registers (a row's four lanes
 *    agree through two shuffles); P, rounded to bf16, is the A operand of P·V straight from
 *    S's registers. Writes out = O / l and the log-sum-exp (natural log, as the CPU's).
 *  - backward, after D_i = dout_i·out_i (fa::dsum_kernel): a dq pass, block (64 queries,
 *    head), P = exp(S·scale − lse) and dS = P ∘ (dO·Vᵀ − D) in registers, dq += dS·K; and a
 *    dk/dv pass, block (64 keys, key/value head), which visits its group's query heads in
 *    order and the query tiles (32 rows where hd > 64, to bound the accumulators; else 64)
 *    from its first key to the end of its last key's segment, with Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ
 *    in registers: dv += Pᵀ·dO, dk += dSᵀ·Q. Each output is written by one block in a fixed
 *    order: no atomics, the same bits every run.
 *  - masks: query i sees key j when a_i <= j <= i (a_i: the start of i's segment; the dk/dv
 *    pass uses the same condition as j <= i < e_j, e_j the end of j's segment). A tile that
 *    every row of the block sees whole skips the per-element test; in the others each warp
 *    skips the products of the 16-column groups that none of its 16 rows sees (the columns
 *    past the diagonal, those before its rows' segments): their scores are masked anyway,
 *    their probabilities exactly 0, so the results are the same without them.
 * Precision as flash_attn.cuh: P and dS rounded to bf16 before their products; scores, the
 * softmax statistics (in log2 units inside, exp2f) and every accumulator fp32. */

namespace fm {

constexpr int THREADS = 128;
constexpr int BM = 64; /* queries of a forward or dq block: 16 a warp */
constexpr int BN = 64; /* keys of a tile; of a dk/dv block: 16 a warp */
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

template <int HD> struct lay {
    static constexpr int LD = HD + 8; /* shared rows (elements): 16-byte aligned, banks staggered for ldmatrix */
    static constexpr int BQ = HD > 64 ? 32 : 64; /* queries of a dk/dv tile */
    static constexpr size_t rows64 = (size_t)64 * LD * 2;
    static constexpr size_t fwd = 5 * rows64;     /* Q | K V, twice */
    static constexpr size_t dq = 6 * rows64;      /* Q dO | K V, twice */
    static constexpr size_t dkv = 2 * rows64 + 4 * (size_t)BQ * LD * 2 + 4 * (size_t)BQ * 4; /* K V | Q dO, twice | lse D, twice */
};

/* Rows r0 … r0+ROWS-1 of a [*, stride] bf16 matrix (from column 0 of src) into a tile, by
 * cp.async; rows at or past rlim are zeros. src 16-byte aligned, stride a multiple of 8. */
template <int HD, int ROWS>
__device__ __forceinline__ void tile_async(uint16_t *dst, const uint16_t *src, int64_t r0, int64_t rlim, int64_t stride)
{
    constexpr int V = HD / 8, LD = HD + 8;
    for (int e = threadIdx.x; e < ROWS * V; e += THREADS) {
        int r = e / V, c = e % V;
        int in = r0 + r < rlim;
        cp_async16(dst + r * LD + c * 8, src + (in ? (r0 + r) * stride : 0) + c * 8, in ? 16 : 0);
    }
}

/* acc[nb] (16 × 8 tiles, nb < NB) += A · Bᵀ: A the warp's 16 rows at a, B 8·NB rows at b,
 * both HD wide in shared memory (row stride HD + 8); only the 16-column groups plo … phi
 * (tiles 2·plo … 2·phi + 1; the others stay as they are). S = Q·Kᵀ, dP = dO·Vᵀ, Sᵀ = K·Qᵀ,
 * dPᵀ = V·dOᵀ. plo, phi are the same in every lane (ldmatrix and mma are warp-wide). */
template <int HD, int NB>
__device__ __forceinline__ void warp_abt(float (*acc)[4], const uint16_t *a, const uint16_t *b, int plo, int phi)
{
    constexpr int LD = HD + 8;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t af[4];
        ldsm_x4(af, a + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nb = 0; nb < NB; nb += 2) {
            if (nb / 2 < plo || nb / 2 > phi)
                continue;
            uint32_t bf[4]; /* keys nb·8 … +15 of columns kk·16 … +15: b0 b1 of tile nb, then of nb+1 */
            ldsm_x4(bf, b + (nb * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
            mma_bf16(acc[nb], af, bf[0], bf[1]);
            mma_bf16(acc[nb + 1], af, bf[2], bf[3]);
        }
    }
}

/* acc[ob] (16 × 8 tiles, ob < HD/8) += P · B: P the warp's 16 × 8·NK values in accumulator
 * tiles p[NK], rounded to bf16 here; B 8·NK rows × HD row-major in shared memory (row
 * stride HD + 8); only P's 16-column groups plo … phi (the others must be 0). O += P·V,
 * dq += dS·K, dv += Pᵀ·dO, dk += dSᵀ·Q. */
template <int HD, int NK>
__device__ __forceinline__ void warp_pb(float (*acc)[4], const float (*p)[4], const uint16_t *b, int plo, int phi)
{
    constexpr int LD = HD + 8;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < NK / 2; kk++) {
        if (kk < plo || kk > phi)
            continue;
        const uint32_t af[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                                pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int ob = 0; ob < HD / 8; ob += 2) {
            uint32_t bf[4]; /* rows kk·16 … +15 of columns ob·8 … +15, transposed */
            ldsm_x4_t(bf, b + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ob * 8 + (lane >> 4) * 8);
            mma_bf16(acc[ob], af, bf[0], bf[1]);
            mma_bf16(acc[ob + 1], af, bf[2], bf[3]);
        }
    }
}

template <int N> __device__ __forceinline__ void zero_acc(float (*acc)[4])
{
#pragma unroll
    for (int t = 0; t < N; t++)
        acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
}

/* Sum (or max) over the four lanes that hold one accumulator row. */
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* x − base clamped to [lo, hi] (int64 bounds into tile columns). */
__device__ __forceinline__ int tile_col(int64_t x, int64_t base, int lo, int hi)
{
    int64_t c = x - base;
    return c < lo ? lo : c > hi ? hi : (int)c;
}

/* The 16-column groups of a tile of `cols` columns from column c0 that hold a column of
 * [lo, hi]: plo … phi (plo > phi: none). */
__device__ __forceinline__ void col_groups(int64_t lo, int64_t hi, int64_t c0, int cols, int &plo, int &phi)
{
    int64_t a = lo - c0, z = hi - c0;
    if (a > z || z < 0 || a > cols - 1) {
        plo = 1, phi = 0;
        return;
    }
    plo = a < 0 ? 0 : (int)(a / 16);
    phi = z > cols - 1 ? (cols - 1) / 16 : (int)(z / 16);
}

/* Writes a warp's 16 × HD accumulator tiles as bf16 into rows row[0], row[1] (this lane's
 * two) of dst (row stride `stride`), row r times s[r]; rows at or past n left out. */
template <int HD>
__device__ __forceinline__ void store_rows(uint16_t *dst, int64_t stride, const float (*acc)[4], const int64_t *row,
                                           int64_t n, const float *s)
{
    int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++)
        if (row[r] < n) {
            uint16_t *d = dst + row[r] * stride + 2 * t;
#pragma unroll
            for (int ob = 0; ob < HD / 8; ob++)
                *reinterpret_cast<uint32_t *>(d + ob * 8) =
                    pack_bf16(acc[ob][2 * r] * s[r], acc[ob][2 * r + 1] * s[r]);
        }
}

/* The query rows of a forward or dq block: this lane's two (g and g+8 of its warp's 16),
 * their segment starts (INT64_MAX past n: no key visible), the first key any row sees
 * (jbeg), the key tiles from there to the last row (nt), the latest segment start among
 * the block's rows (amax), and the keys any row of this warp sees: wlo … whi (its first
 * row's segment start, its last row before n; wlo > whi: none). */
struct qrows {
    int64_t i0, i1, jbeg, amax, row[2], a[2], wlo, whi;
    int nt;
};
__device__ __forceinline__ qrows query_rows(const int64_t *seg, int64_t n_seg, int64_t n)
{
    qrows b;
    int64_t e;
    b.i0 = (int64_t)blockIdx.x * BM;
    b.i1 = b.i0 + BM < n ? b.i0 + BM : n;
    b.jbeg = seg_start(seg, n_seg, b.i0, &e);
    b.amax = seg_start(seg, n_seg, b.i1 - 1, &e);
    b.nt = (int)((b.i1 - b.jbeg + BN - 1) / BN);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        b.row[r] = b.i0 + (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2) + 8 * r;
        b.a[r] = b.row[r] < n ? seg_start(seg, n_seg, b.row[r], &e) : INT64_MAX;
    }
    int64_t f = b.i0 + (threadIdx.x >> 5) * 16;
    b.wlo = f < n ? seg_start(seg, n_seg, f, &e) : INT64_MAX;
    b.whi = f + 15 < n ? f + 15 : n - 1;
    return b;
}

/* Which columns of key tile j0 row r sees: lo[r] <= c <= hi[r]; all of them (full) when
 * every row of the block sees the whole tile; the 16-column groups the warp's products
 * need: plo … phi (all when full, else those with a column some row of the warp sees). */
struct kmask {
    bool full;
    int lo[2], hi[2], plo, phi;
};
__device__ __forceinline__ kmask key_mask(const qrows &b, int64_t j0)
{
    kmask m;
    m.full = j0 >= b.amax && j0 + BN - 1 <= b.i0;
    if (m.full)
        m.plo = 0, m.phi = BN / 16 - 1;
    else
        col_groups(b.wlo, b.whi, j0, BN, m.plo, m.phi);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        m.lo[r] = tile_col(b.a[r], j0, 0, BN);
        m.hi[r] = tile_col(b.row[r], j0, -1, BN - 1);
    }
    return m;
}

/* Keys j … j+BN-1 of a head (kh, vh: its columns of k and v) into a K/V buffer: K, then V at
 * + BN·(HD+8), by cp.async. */
template <int HD>
__device__ __forceinline__ void kv_async(uint16_t *buf, const uint16_t *kh, const uint16_t *vh, int64_t j, int64_t n,
                                         int64_t ks)
{
    tile_async<HD, BN>(buf, kh, j, n, ks);
    tile_async<HD, BN>(buf + BN * (HD + 8), vh, j, n, ks);
}

/* A step of the key-tile loop of the forward and dq passes: starts the copy of tile it+1 (of
 * nt, from key jbeg + (it+1)·BN) into the other buffer, waits for tile it and returns it:
 * its K, V at + BN·LD. KV holds two buffers of a K and a V tile; kh, vh are the head's
 * columns of k and v. */
template <int HD>
__device__ __forceinline__ const uint16_t *kv_tile(uint16_t *KV, const uint16_t *kh, const uint16_t *vh, int it,
                                                   int nt, int64_t jbeg, int64_t n, int64_t ks)
{
    constexpr int LD = HD + 8;
    if (it + 1 < nt)
        kv_async<HD>(KV + ((it + 1) & 1) * 2 * BN * LD, kh, vh, jbeg + (int64_t)(it + 1) * BN, n, ks);
    cp_async_commit(); /* possibly empty: the wait below is the same every iteration */
    cp_async_wait<1>();
    __syncthreads();
    return KV + (it & 1) * 2 * BN * LD;
}

template <int HD>
__global__ void __launch_bounds__(THREADS) fwd_kernel(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                                      const uint16_t *v, const int64_t *seg, int64_t n_seg,
                                                      int64_t n, int n_head, int n_kv, float scale)
{
    constexpr int LD = HD + 8, NB = BN / 8, NO = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *Qs = (uint16_t *)smem, *KV = Qs + BM * LD; /* buffer b: K at KV + 2b·BN·LD, V after it */
    const qrows b = query_rows(seg, n_seg, n);
    int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t qs = (int64_t)n_head * HD, ks = (int64_t)n_kv * HD;
    const uint16_t *kh = k + (int64_t)(h / (n_head / n_kv)) * HD, *vh = v + (int64_t)(h / (n_head / n_kv)) * HD;
    tile_async<HD, BM>(Qs, q + (int64_t)h * HD, b.i0, n, qs);
    kv_async<HD>(KV, kh, vh, b.jbeg, n, ks);
    cp_async_commit();

    float o[NO][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
    zero_acc<NO>(o);
    const float sl2 = scale * LOG2E;
    for (int it = 0; it < b.nt; it++) {
        int64_t j0 = b.jbeg + (int64_t)it * BN;
        const uint16_t *Kt = kv_tile<HD>(KV, kh, vh, it, b.nt, b.jbeg, n, ks), *Vt = Kt + BN * LD;

        const kmask km = key_mask(b, j0);
        float s[NB][4];
        zero_acc<NB>(s);
        warp_abt<HD, NB>(s, Qs + warp * 16 * LD, Kt, km.plo, km.phi);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int r = c >> 1, col = nb * 8 + 2 * (lane & 3) + (c & 1);
                float x = km.full || (col >= km.lo[r] && col <= km.hi[r]) ? s[nb][c] * sl2 : -INFINITY;
                s[nb][c] = x;
                mx[r] = fmaxf(mx[r], x);
            }
        float corr[2], sum[2] = {0, 0};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mn = fmaxf(m[r], quad_max(mx[r]));
            corr[r] = mn == -INFINITY ? 1.0f : exp2f(m[r] - mn);
            m[r] = mn;
        }
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int r = c >> 1;
                float p = m[r] == -INFINITY ? 0.0f : exp2f(s[nb][c] - m[r]);
                s[nb][c] = p;
                sum[r] += p;
            }
#pragma unroll
        for (int r = 0; r < 2; r++)
            l[r] = l[r] * corr[r] + quad_sum(sum[r]);
#pragma unroll
        for (int ob = 0; ob < NO; ob++) {
            o[ob][0] *= corr[0];
            o[ob][1] *= corr[0];
            o[ob][2] *= corr[1];
            o[ob][3] *= corr[1];
        }
        warp_pb<HD, NB>(o, s, Vt, km.plo, km.phi);
        __syncthreads(); /* this buffer is refilled two tiles on */
    }
    cp_async_wait<0>();
    /* out = O / l; every row before n sees at least its own key: l > 0 */
    const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
    store_rows<HD>(out + (int64_t)h * HD, qs, o, b.row, n, inv);
#pragma unroll
    for (int r = 0; r < 2; r++)
        if (b.row[r] < n && (lane & 3) == 0)
            lse[b.row[r] * n_head + h] = m[r] * LN2 + logf(l[r]);
}

/* dq_i = scale · Σ_j dS_ij k_j, dS_ij = P_ij (dout_i·v_j − D_i), P_ij = exp(scale·q_i·k_j − lse_i). */
template <int HD>
__global__ void __launch_bounds__(THREADS) dq_kernel(uint16_t *dq, const uint16_t *dout, const uint16_t *q,
                                                     const uint16_t *k, const uint16_t *v, const float *lse,
                                                     const float *D, const int64_t *seg, int64_t n_seg, int64_t n,
                                                     int n_head, int n_kv, float scale)
{
    constexpr int LD = HD + 8, NB = BN / 8, NO = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *Qs = (uint16_t *)smem, *Gs = Qs + BM * LD, *KV = Gs + BM * LD;
    const qrows b = query_rows(seg, n_seg, n);
    int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t qs = (int64_t)n_head * HD, ks = (int64_t)n_kv * HD;
    const uint16_t *kh = k + (int64_t)(h / (n_head / n_kv)) * HD, *vh = v + (int64_t)(h / (n_head / n_kv)) * HD;
    float l2[2], d[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l2[r] = b.row[r] < n ? lse[b.row[r] * n_head + h] * LOG2E : 0.0f;
        d[r] = b.row[r] < n ? D[b.row[r] * n_head + h] : 0.0f;
    }
    tile_async<HD, BM>(Qs, q + (int64_t)h * HD, b.i0, n, qs);
    tile_async<HD, BM>(Gs, dout + (int64_t)h * HD, b.i0, n, qs);
    kv_async<HD>(KV, kh, vh, b.jbeg, n, ks);
    cp_async_commit();

    float acc[NO][4];
    zero_acc<NO>(acc);
    const float sl2 = scale * LOG2E;
    for (int it = 0; it < b.nt; it++) {
        int64_t j0 = b.jbeg + (int64_t)it * BN;
        const uint16_t *Kt = kv_tile<HD>(KV, kh, vh, it, b.nt, b.jbeg, n, ks), *Vt = Kt + BN * LD;

        const kmask km = key_mask(b, j0);
        float s[NB][4], dp[NB][4];
        zero_acc<NB>(s);
        zero_acc<NB>(dp);
        warp_abt<HD, NB>(s, Qs + warp * 16 * LD, Kt, km.plo, km.phi);
        warp_abt<HD, NB>(dp, Gs + warp * 16 * LD, Vt, km.plo, km.phi);
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int r = c >> 1, col = nb * 8 + 2 * (lane & 3) + (c & 1);
                float p = km.full || (col >= km.lo[r] && col <= km.hi[r]) ? exp2f(s[nb][c] * sl2 - l2[r]) : 0.0f;
                s[nb][c] = p * (dp[nb][c] - d[r]); /* dS */
            }
        warp_pb<HD, NB>(acc, s, Kt, km.plo, km.phi);
        __syncthreads();
    }
    cp_async_wait<0>();
    const float sc[2] = {scale, scale};
    store_rows<HD>(dq + (int64_t)h * HD, qs, acc, b.row, n, sc);
}

/* dk_j = scale · Σ_{h in group} Σ_i dS_ij q_i, dv_j = Σ_h Σ_i P_ij dout_i, over the queries
 * i that see key j (j <= i < e_j). */
template <int HD>
__global__ void __launch_bounds__(THREADS) dkv_kernel(uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                                      const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                                      const float *lse, const float *D, const int64_t *seg,
                                                      int64_t n_seg, int64_t n, int n_head, int n_kv, float scale)
{
    constexpr int LD = HD + 8, BQ = lay<HD>::BQ, NQ = BQ / 8, NO = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    /* K V | buffer b: Q at QG + 2b·BQ·LD, dO after it | buffer b: lse (log2 units) at ST + 2b·BQ, D after it */
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + BN * LD, *QG = Vs + BN * LD;
    float *ST = (float *)(QG + 4 * BQ * LD);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kh = blockIdx.y, group = n_head / n_kv;
    int64_t j0 = (int64_t)blockIdx.x * BN, j1 = j0 + BN < n ? j0 + BN : n, qs = (int64_t)n_head * HD,
            ks = (int64_t)n_kv * HD, iend, eend;
    seg_start(seg, n_seg, j1 - 1, &iend); /* the last query any key of the block meets, + 1 */
    seg_start(seg, n_seg, j0, &eend);     /* the earliest segment end among the block's keys */
    /* this lane's two key rows and their segment ends (0 past n: no query sees them) */
    int64_t col[2], kend[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        col[r] = j0 + warp * 16 + (lane >> 2) + 8 * r;
        kend[r] = 0;
        if (col[r] < n)
            seg_start(seg, n_seg, col[r], &kend[r]);
    }
    /* the queries any key of this warp meets: wlo … whi (from its first key to its last key's
     * segment end; wlo > whi: none) */
    int64_t wlo = j0 + warp * 16, whi = -1;
    if (wlo < n) {
        int64_t e;
        seg_start(seg, n_seg, wlo + 15 < n ? wlo + 15 : n - 1, &e);
        whi = e - 1;
    }
    int nq = (int)((iend - j0 + BQ - 1) / BQ), total = group * nq;
    /* tile `it`: query head kh·group + it / nq, queries from j0 + (it % nq)·BQ */
    auto fetch = [&](int it) {
        int h = kh * group + it / nq;
        int64_t i0 = j0 + (int64_t)(it % nq) * BQ;
        uint16_t *qg = QG + (it & 1) * 2 * BQ * LD;
        tile_async<HD, BQ>(qg, q + (int64_t)h * HD, i0, n, qs);
        tile_async<HD, BQ>(qg + BQ * LD, dout + (int64_t)h * HD, i0, n, qs);
        float *st = ST + (it & 1) * 2 * BQ;
        for (int r = threadIdx.x; r < BQ; r += THREADS) {
            int64_t i = i0 + r;
            st_shared(&st[r], i < n ? lse[i * n_head + h] * LOG2E : 0.0f);
            st_shared(&st[BQ + r], i < n ? D[i * n_head + h] : 0.0f);
        }
    };
    kv_async<HD>(Ks, k + (int64_t)kh * HD, v + (int64_t)kh * HD, j0, n, ks); /* Vs follows Ks */
    fetch(0);
    cp_async_commit();

    float dka[NO][4], dva[NO][4];
    zero_acc<NO>(dka);
    zero_acc<NO>(dva);
    const float sl2 = scale * LOG2E;
    for (int it = 0; it < total; it++) {
        int64_t i0 = j0 + (int64_t)(it % nq) * BQ;
        if (it + 1 < total)
            fetch(it + 1); /* its buffers were last read in iteration it − 1 */
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint16_t *Qt = QG + (it & 1) * 2 * BQ * LD, *Gt = Qt + BQ * LD;
        const float *lt = ST + (it & 1) * 2 * BQ, *dt = lt + BQ;

        /* every key of the block before every query of the tile, every query before the
         * earliest segment end: nothing masked; else the column groups this warp's keys meet */
        bool full = i0 >= j1 - 1 && i0 + BQ <= eend;
        int plo = 0, phi = NQ / 2 - 1;
        if (!full)
            col_groups(wlo, whi, i0, BQ, plo, phi);
        float st[NQ][4], dpt[NQ][4];
        zero_acc<NQ>(st);
        zero_acc<NQ>(dpt);
        warp_abt<HD, NQ>(st, Ks + warp * 16 * LD, Qt, plo, phi);
        warp_abt<HD, NQ>(dpt, Vs + warp * 16 * LD, Gt, plo, phi);
        int lo[2], hi[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            lo[r] = tile_col(col[r], i0, 0, BQ);
            hi[r] = tile_col(kend[r], i0, 0, BQ);
        }
#pragma unroll
        for (int nb = 0; nb < NQ; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int r = c >> 1, qc = nb * 8 + 2 * (lane & 3) + (c & 1);
                float p = full || (qc >= lo[r] && qc < hi[r]) ? exp2f(st[nb][c] * sl2 - ld_shared(&lt[qc])) : 0.0f;
                st[nb][c] = p;
                dpt[nb][c] = p * (dpt[nb][c] - ld_shared(&dt[qc])); /* dSᵀ */
            }
        warp_pb<HD, NQ>(dva, st, Gt, plo, phi);
        warp_pb<HD, NQ>(dka, dpt, Qt, plo, phi);
        __syncthreads();
    }
    cp_async_wait<0>();
    const float sc[2] = {scale, scale}, one[2] = {1.0f, 1.0f};
    store_rows<HD>(dk + (int64_t)kh * HD, ks, dka, col, n, sc);
    store_rows<HD>(dv + (int64_t)kh * HD, ks, dva, col, n, one);
}

} /* namespace fm */
