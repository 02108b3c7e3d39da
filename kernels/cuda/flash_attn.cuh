/* flash_attn.cuh — causal attention inside packed segments on the tensor cores, in the
 * FlashAttention-2 style, for bf16 q, k, v with head dimension a multiple of 16 up to 128
 * (Llama's 64, 80, 96, 128). Included by attention.cu, which picks these kernels or the simple
 * warp-per-row ones (FTK_CUDA_ATTN=simple) and checks the arguments; both are kept so the
 * fast one can always be compared with the plain one (docs/design.md, "CUDA backend").
 *
 * Tiles of 64 queries × 64 keys, 4 warps of 16 query (or key) rows each; WMMA bf16
 * 16×16×16 products with fp32 accumulation; scores, probabilities and the running output
 * staged in shared memory so each warp can rescale its own rows (the online softmax).
 *  - forward: block (query tile, head); key tiles from the segment start of the tile's
 *    first query up to its last query; the mask a_i <= j <= i per element (a tile may
 *    straddle segments); writes out and the log-sum-exp.
 *  - backward: D_i = dout_i·out_i first (fa_dsum_kernel); then a dq pass, block (query
 *    tile, head), and a dk/dv pass, block (key tile, key/value head), which visits its
 *    group's query heads in order and the query tiles from its first key to the end of
 *    its last key's segment. Every output is written by one block in a fixed order: no
 *    atomics, the same bits every run.
 * Precision: probabilities (P) and dS are rounded to bf16 before their products (as
 * FlashAttention does); scores, the softmax statistics and every accumulator are fp32.
 * gpu_ops allows one extra bf16 rounding for it. */
#include <cuda_bf16.h>
#include <mma.h>

namespace fa {

using namespace nvcuda;
typedef __nv_bfloat16 bf;

constexpr int BM = 64, BN = 64, THREADS = 128;
constexpr int LDS = BN + 4; /* fp32 score rows (floats); the padding staggers banks */
constexpr int LDP = BN + 8; /* bf16 probability rows (elements) */

template <int HD> struct lay {
    static constexpr int LDH = HD + 8; /* bf16 q/k/v rows */
    static constexpr int LDO = HD + 4; /* fp32 output rows */
    static constexpr size_t tile = (size_t)BM * LDH * 2, scores = (size_t)BM * LDS * 4, probs = (size_t)BM * LDP * 2;
    static constexpr size_t out = (size_t)BM * LDO * 4;
    /* forward: Q K V | S | O | P | m l | a */
    static constexpr size_t fwd = 3 * tile + scores + out + probs + 2 * BM * 4 + BM * 8;
    /* backward passes: 4 tiles | S dP (also the fp32 staging of the result) | dS (and P) | 2 row stats | a */
    static constexpr size_t st2 = 2 * scores > out ? 2 * scores : out;
    static constexpr size_t bwd = 4 * tile + st2 + 2 * probs + 2 * BM * 4 + BM * 8;
};

/* rows r0 … r0+63 of a [*, stride] bf16 matrix (from column 0 of src) into a tile; rows at
 * or past rlim are zeros. 16-byte accesses: HD % 16 == 0 and src 16-byte aligned. */
template <int HD> __device__ void load_tile(uint16_t *dst, const uint16_t *src, int64_t r0, int64_t rlim, int64_t stride)
{
    constexpr int V = HD / 8, LDH = lay<HD>::LDH;
    for (int e = threadIdx.x; e < BM * V; e += THREADS) {
        int r = e / V, c = e % V;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r0 + r < rlim)
            x = reinterpret_cast<const uint4 *>(src + (r0 + r) * stride)[c];
        reinterpret_cast<uint4 *>(dst + r * LDH)[c] = x;
    }
}

/* acc[t] (16 × 16 each, t < N/16) = A[16 × K] · B where B(k, n) = Bt[n][k] (the rows of a
 * tile as columns): scores Q·Kᵀ. */
template <int K, int N>
__device__ void mma_abt(wmma::fragment<wmma::accumulator, 16, 16, 16, float> *acc, const uint16_t *A, int lda,
                        const uint16_t *Bt, int ldb)
{
#pragma unroll
    for (int t = 0; t < N / 16; t++)
        wmma::fill_fragment(acc[t], 0.0f);
#pragma unroll
    for (int kk = 0; kk < K; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major> a;
        wmma::load_matrix_sync(a, (const bf *)A + kk, lda);
#pragma unroll
        for (int t = 0; t < N / 16; t++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::col_major> b;
            wmma::load_matrix_sync(b, (const bf *)Bt + t * 16 * ldb + kk, ldb);
            wmma::mma_sync(acc[t], a, b, acc[t]);
        }
    }
}

/* acc[t] += A[16 × 64] · B[64 × HD] (B row-major): P·V, dS·K, Pᵀ·dO, dSᵀ·Q. KU: the steps
 * along the 64 unrolled (all, unless a kernel is short of registers); each acc[t] takes the
 * same products in the same order whatever KU. */
template <int HD, int KU = BN / 16>
__device__ void mma_ab(wmma::fragment<wmma::accumulator, 16, 16, 16, float> *acc, const uint16_t *A, int lda,
                       const uint16_t *B, int ldb)
{
#pragma unroll KU
    for (int kk = 0; kk < BN; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major> a;
        wmma::load_matrix_sync(a, (const bf *)A + kk, lda);
#pragma unroll
        for (int t = 0; t < HD / 16; t++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::row_major> b;
            wmma::load_matrix_sync(b, (const bf *)B + kk * ldb + t * 16, ldb);
            wmma::mma_sync(acc[t], a, b, acc[t]);
        }
    }
}

template <int N>
__device__ void store_rows(float *dst, int ld, wmma::fragment<wmma::accumulator, 16, 16, 16, float> *acc)
{
#pragma unroll
    for (int t = 0; t < N / 16; t++)
        wmma::store_matrix_sync(dst + t * 16, acc[t], ld, wmma::mem_row_major);
}

/* Writes a warp's 16 rows × HD of staged fp32 values, times s, as bf16 rows of dst. */
template <int HD>
__device__ void write_rows(uint16_t *dst, int64_t stride, const float *stage, int64_t r0, int64_t rlim, float s)
{
    constexpr int LDO = lay<HD>::LDO;
    int lane = threadIdx.x & 31;
    for (int e = lane; e < 16 * HD; e += 32) {
        int r = e / HD, c = e % HD;
        if (r0 + r < rlim)
            dst[(r0 + r) * stride + c] = f32_to_bf16_dev(stage[r * LDO + c] * s);
    }
}

template <int HD>
__global__ void __launch_bounds__(THREADS) fwd_kernel(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                                      const uint16_t *v, const int64_t *seg, int64_t n_seg,
                                                      int64_t n, int n_head, int n_kv, float scale)
{
    typedef lay<HD> L;
    constexpr int LDH = L::LDH, LDO = L::LDO;
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *Qs = (uint16_t *)smem, *Ks = Qs + BM * LDH, *Vs = Ks + BN * LDH;
    float *S = (float *)(Vs + BN * LDH), *O = S + BM * LDS;
    uint16_t *P = (uint16_t *)(O + BM * LDO);
    float *mrow = (float *)(P + BM * LDP), *lrow = mrow + BM;
    int64_t *arow = (int64_t *)(lrow + BM);

    int64_t i0 = (int64_t)blockIdx.x * BM, i1 = min(i0 + BM, n);
    int h = blockIdx.y, kh = h / (n_head / n_kv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t qs = (int64_t)n_head * HD, ks = (int64_t)n_kv * HD;
    for (int r = threadIdx.x; r < BM; r += THREADS) {
        int64_t e;
        arow[r] = i0 + r < n ? seg_start(seg, n_seg, i0 + r, &e) : INT64_MAX; /* past n: every key masked */
        mrow[r] = -INFINITY;
        lrow[r] = 0;
    }
    for (int e = threadIdx.x; e < BM * LDO; e += THREADS)
        O[e] = 0;
    load_tile<HD>(Qs, q + h * HD, i0, n, qs);
    __syncthreads();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[HD / 16 > BN / 16 ? HD / 16 : BN / 16];
    for (int64_t j0 = arow[0]; j0 < i1; j0 += BN) {
        load_tile<HD>(Ks, k + kh * HD, j0, n, ks);
        load_tile<HD>(Vs, v + kh * HD, j0, n, ks);
        __syncthreads();
        mma_abt<HD, BN>(acc, Qs + warp * 16 * LDH, LDH, Ks, LDH);
        store_rows<BN>(S + warp * 16 * LDS, LDS, acc);
        __syncwarp();
        { /* online softmax: two lanes a row, 32 columns each */
            int r = warp * 16 + (lane >> 1), c0 = (lane & 1) * 32;
            int64_t i = i0 + r, a = arow[r];
            float *srow = S + r * LDS, mx = -INFINITY;
            for (int c = c0; c < c0 + 32; c++) {
                float s = (j0 + c >= a && j0 + c <= i) ? srow[c] * scale : -INFINITY;
                srow[c] = s;
                mx = fmaxf(mx, s);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float mold = mrow[r], mnew = fmaxf(mold, mx), sum = 0;
            float corr = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
            for (int c = c0; c < c0 + 32; c++) {
                float p = mnew == -INFINITY ? 0.0f : expf(srow[c] - mnew);
                P[r * LDP + c] = f32_to_bf16_dev(p);
                sum += p;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            float *orow = O + r * LDO;
            for (int c = (lane & 1) * (HD / 2); c < (lane & 1) * (HD / 2) + HD / 2; c++)
                orow[c] *= corr;
            __syncwarp();
            if (!(lane & 1)) {
                mrow[r] = mnew;
                lrow[r] = lrow[r] * corr + sum;
            }
        }
        __syncwarp();
#pragma unroll
        for (int t = 0; t < HD / 16; t++)
            wmma::load_matrix_sync(acc[t], O + warp * 16 * LDO + t * 16, LDO, wmma::mem_row_major);
        mma_ab<HD>(acc, P + warp * 16 * LDP, LDP, Vs, LDH);
        store_rows<HD>(O + warp * 16 * LDO, LDO, acc);
        __syncthreads(); /* K, V are overwritten next */
    }
    int64_t r0 = i0 + warp * 16;
    int lane_row = lane & 15;
    if (lane < 16 && r0 + lane_row < n) {
        int r = warp * 16 + lane_row;
        lse[(r0 + lane_row) * n_head + h] = mrow[r] + logf(lrow[r]);
    }
    /* out = O / l, row by row */
    for (int e = lane; e < 16 * HD; e += 32) {
        int r = e / HD, c = e % HD;
        if (r0 + r < n)
            out[(r0 + r) * qs + h * HD + c] =
                f32_to_bf16_dev(O[(warp * 16 + r) * LDO + c] * (1.0f / lrow[warp * 16 + r]));
    }
}

/* D[r] = dout_r · out_r for each (token, head) row r of HD elements (rows are contiguous:
 * [n, n_head·HD] is [n·n_head, HD]). A warp a row. */
template <int HD> __global__ void dsum_kernel(float *D, const uint16_t *dout, const uint16_t *out, int64_t rows)
{
    int lane = threadIdx.x & 31, w = blockDim.x >> 5;
    for (int64_t r = (int64_t)blockIdx.x * w + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * w) {
        float s = 0;
        for (int c = lane; c < HD; c += 32)
            s += ld(dout, r * HD + c) * ld(out, r * HD + c);
        s = warp_sum(s);
        if (!lane)
            D[r] = s;
    }
}

/* What both backward passes read of query rows i0 … i0+63 of head h: q and dout tiles,
 * and per row its segment start (INT64_MAX past n: every key masked), log-sum-exp and D.
 * The caller synchronises before use. */
template <int HD>
__device__ void query_tile(uint16_t *Qs, uint16_t *Gs, int64_t *arow, float *lrow, float *drow, const uint16_t *q,
                           const uint16_t *dout, const float *lse, const float *D, const int64_t *seg, int64_t n_seg,
                           int64_t i0, int64_t n, int n_head, int h)
{
    int64_t qs = (int64_t)n_head * HD;
    for (int r = threadIdx.x; r < BM; r += THREADS) {
        int64_t e, i = i0 + r;
        arow[r] = i < n ? seg_start(seg, n_seg, i, &e) : INT64_MAX;
        lrow[r] = i < n ? lse[i * n_head + h] : 0;
        drow[r] = i < n ? D[i * n_head + h] : 0;
    }
    load_tile<HD>(Qs, q + h * HD, i0, n, qs);
    load_tile<HD>(Gs, dout + h * HD, i0, n, qs);
}

/* dq_i = scale · Σ_j dS_ij k_j, dS_ij = P_ij (dout_i·v_j − D_i), P_ij = exp(scale·q_i·k_j − lse_i). */
template <int HD>
__global__ void __launch_bounds__(THREADS) dq_kernel(uint16_t *dq, const uint16_t *dout, const uint16_t *q,
                                                     const uint16_t *k, const uint16_t *v, const float *lse,
                                                     const float *D, const int64_t *seg, int64_t n_seg, int64_t n,
                                                     int n_head, int n_kv, float scale)
{
    typedef lay<HD> L;
    constexpr int LDH = L::LDH, LDO = L::LDO;
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *Qs = (uint16_t *)smem, *Gs = Qs + BM * LDH, *Ks = Gs + BM * LDH, *Vs = Ks + BN * LDH;
    float *S = (float *)(Vs + BN * LDH), *dP = S + BM * LDS; /* with S: the staging of dq at the end */
    uint16_t *dS = (uint16_t *)((unsigned char *)S + L::st2);
    float *lrow = (float *)(dS + 2 * BM * LDP), *drow = lrow + BM;
    int64_t *arow = (int64_t *)(drow + BM);

    int64_t i0 = (int64_t)blockIdx.x * BM, i1 = min(i0 + BM, n);
    int h = blockIdx.y, kh = h / (n_head / n_kv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t qs = (int64_t)n_head * HD, ks = (int64_t)n_kv * HD;
    query_tile<HD>(Qs, Gs, arow, lrow, drow, q, dout, lse, D, seg, n_seg, i0, n, n_head, h);
    __syncthreads();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[HD / 16], s[BN / 16];
#pragma unroll
    for (int t = 0; t < HD / 16; t++)
        wmma::fill_fragment(acc[t], 0.0f);
    for (int64_t j0 = arow[0]; j0 < i1; j0 += BN) {
        load_tile<HD>(Ks, k + kh * HD, j0, n, ks);
        load_tile<HD>(Vs, v + kh * HD, j0, n, ks);
        __syncthreads();
        mma_abt<HD, BN>(s, Qs + warp * 16 * LDH, LDH, Ks, LDH);
        store_rows<BN>(S + warp * 16 * LDS, LDS, s);
        mma_abt<HD, BN>(s, Gs + warp * 16 * LDH, LDH, Vs, LDH);
        store_rows<BN>(dP + warp * 16 * LDS, LDS, s);
        __syncwarp();
        {
            int r = warp * 16 + (lane >> 1), c0 = (lane & 1) * 32;
            int64_t i = i0 + r, a = arow[r];
            for (int c = c0; c < c0 + 32; c++) {
                float p = (j0 + c >= a && j0 + c <= i) ? expf(S[r * LDS + c] * scale - lrow[r]) : 0.0f;
                dS[r * LDP + c] = f32_to_bf16_dev(p * (dP[r * LDS + c] - drow[r]));
            }
        }
        __syncwarp();
        mma_ab<HD>(acc, dS + warp * 16 * LDP, LDP, Ks, LDH);
        __syncthreads();
    }
    float *stage = S + warp * 16 * LDO; /* S and dP together hold BM × LDO floats */
    store_rows<HD>(stage, LDO, acc);
    __syncwarp();
    write_rows<HD>(dq + h * HD, qs, stage, i0 + warp * 16, n, scale);
}

/* dk_j = scale · Σ_{h in group} Σ_i dS_ij q_i, dv_j = Σ_h Σ_i P_ij dout_i, over the queries
 * i that see key j (j <= i < the end of j's segment). */
template <int HD>
__global__ void __launch_bounds__(THREADS) dkv_kernel(uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                                      const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                                      const float *lse, const float *D, const int64_t *seg,
                                                      int64_t n_seg, int64_t n, int n_head, int n_kv, float scale)
{
    typedef lay<HD> L;
    constexpr int LDH = L::LDH, LDO = L::LDO;
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + BN * LDH, *Qs = Vs + BN * LDH, *Gs = Qs + BM * LDH;
    float *St = (float *)(Gs + BM * LDH), *dPt = St + BN * LDS;
    uint16_t *Pt = (uint16_t *)((unsigned char *)St + L::st2), *dSt = Pt + BN * LDP;
    float *lrow = (float *)(dSt + BN * LDP), *drow = lrow + BM;
    int64_t *arow = (int64_t *)(drow + BM);

    int64_t j0 = (int64_t)blockIdx.x * BN, j1 = min(j0 + BN, n), iend;
    seg_start(seg, n_seg, j1 - 1, &iend);
    int kh = blockIdx.y, group = n_head / n_kv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t ks = (int64_t)n_kv * HD;
    load_tile<HD>(Ks, k + kh * HD, j0, n, ks);
    load_tile<HD>(Vs, v + kh * HD, j0, n, ks);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dka[HD / 16], dva[HD / 16], s[BM / 16];
    /* At HD = 128 the dk and dv accumulators alone are 128 registers a thread: with the
     * products below unrolled whole, ptxas spilled (sm_90: 32 bytes of spill stores, 60 of
     * loads, at its 255 registers; sm_80: 12 and 20). One step of 16 at a time: none (252
     * registers on sm_90, 255 on sm_80; ptxas of CUDA 13.0). The smaller head dimensions keep
     * the whole unroll; of them, 16 on sm_90 and 32 on sm_80 spill 4 bytes, ptxas's choice far
     * below the register limit (not Llama's head dimensions; -Xptxas -warn-spills names them). */
    constexpr int KU = HD > 112 ? 1 : BN / 16;
#pragma unroll
    for (int t = 0; t < HD / 16; t++) {
        wmma::fill_fragment(dka[t], 0.0f);
        wmma::fill_fragment(dva[t], 0.0f);
    }
    for (int h = kh * group; h < (kh + 1) * group; h++)
        for (int64_t i0 = j0; i0 < iend; i0 += BM) {
            query_tile<HD>(Qs, Gs, arow, lrow, drow, q, dout, lse, D, seg, n_seg, i0, n, n_head, h);
            __syncthreads();
            mma_abt<HD, BM>(s, Ks + warp * 16 * LDH, LDH, Qs, LDH);
            store_rows<BM>(St + warp * 16 * LDS, LDS, s);
            mma_abt<HD, BM>(s, Vs + warp * 16 * LDH, LDH, Gs, LDH);
            store_rows<BM>(dPt + warp * 16 * LDS, LDS, s);
            __syncwarp();
            { /* two lanes a key row, 32 query columns each */
                int r = warp * 16 + (lane >> 1), c0 = (lane & 1) * 32;
                int64_t j = j0 + r;
                for (int c = c0; c < c0 + 32; c++) {
                    int64_t i = i0 + c;
                    float p = (j < n && arow[c] <= j && j <= i) ? expf(St[r * LDS + c] * scale - lrow[c]) : 0.0f;
                    Pt[r * LDP + c] = f32_to_bf16_dev(p);
                    dSt[r * LDP + c] = f32_to_bf16_dev(p * (dPt[r * LDS + c] - drow[c]));
                }
            }
            __syncwarp();
            mma_ab<HD, KU>(dva, Pt + warp * 16 * LDP, LDP, Gs, LDH);
            mma_ab<HD, KU>(dka, dSt + warp * 16 * LDP, LDP, Qs, LDH);
            __syncthreads();
        }
    float *stage = St + warp * 16 * LDO;
    store_rows<HD>(stage, LDO, dka);
    __syncwarp();
    write_rows<HD>(dk + kh * HD, ks, stage, j0 + warp * 16, n, scale);
    __syncwarp();
    store_rows<HD>(stage, LDO, dva);
    __syncwarp();
    write_rows<HD>(dv + kh * HD, ks, stage, j0 + warp * 16, n, 1.0f);
}

} /* namespace fa */
