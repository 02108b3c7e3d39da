/* attention.cu — the CUDA backend's causal attention inside packed segments: the
 * warp-per-row kernels (FTK_CUDA_ATTN=simple, and what the tensor-core kernels do not take),
 * the dispatch to cuDNN (FTK_CUDA_ATTN=cudnn: attention_cudnn.cu, which hands back what it
 * does not take), to flash_attn.cuh's WMMA kernels and flash_mma.cuh's, and the segment
 * list's upload. */
#include "cuda_internal.cuh"

/* A warp holds a row of hd ≤ 32·ATT_PER_LANE values, lane l owning l, l+32, … */
enum { ATT_PER_LANE = 8, ATT_WARPS = 4 };

template <typename T> __device__ void row_load(float *r, const T *src, int hd, int lane)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        r[t] = c < hd ? ld(src, c) : 0.0f;
    }
}

template <typename T> __device__ float row_dot(const float *r, const T *src, int hd, int lane)
{
    float s = 0;
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            s += r[t] * ld(src, c);
    }
    return warp_sum(s);
}

template <typename T> __device__ void row_axpy(float *acc, float a, const T *src, int hd, int lane)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            acc[t] += a * ld(src, c);
    }
}

template <typename T> __device__ void row_store(T *dst, const float *r, int hd, int lane, float scale)
{
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int c = lane + 32 * t;
        if (c < hd)
            st(dst, c, r[t] * scale);
    }
}

/* One query row against keys k0 … k0+nk-1 (row stride ks), online softmax in fp32;
 * returns the log-sum-exp of the scaled scores and writes the output row. */
template <typename T>
__device__ float attend_warp(const T *q, const T *k, const T *v, int64_t nk, int64_t ks, int hd, float scale, T *o,
                             int lane)
{
    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
    row_load(qr, q, hd, lane);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        acc[t] = 0;
    float m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < nk; j++) {
        float s = row_dot(qr, k + j * ks, hd, lane) * scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn), p = expf(s - mn);
        sum = sum * corr + p;
#pragma unroll
        for (int t = 0; t < ATT_PER_LANE; t++)
            acc[t] *= corr;
        row_axpy(acc, p, v + j * ks, hd, lane);
        m = mn;
    }
    row_store(o, acc, hd, lane, 1.0f / sum);
    return m + logf(sum);
}

/* Training (seg != NULL): query i sees the keys of its segment up to itself, and its
 * log-sum-exp is kept. Decoding (seg == NULL, lse == NULL): query i sits at position
 * p0 + i of one cached sequence and sees keys 0 … p0 + i. */
template <typename T>
__global__ void attn_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, const int64_t *seg,
                                int64_t n_seg, int64_t p0, int64_t n, int n_head, int n_kv, int hd)
{
    int lane = threadIdx.x & 31;
    int64_t i = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    int h = blockIdx.y;
    if (i >= n)
        return;
    int64_t end, a = seg ? seg_start(seg, n_seg, i, &end) : 0, nk = seg ? i - a + 1 : p0 + i + 1;
    int kh = h / (n_head / n_kv);
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float l = attend_warp(q + i * qs + h * hd, k + a * ks + kh * hd, v + a * ks + kh * hd, nk, ks, hd,
                          1.0f / sqrtf((float)hd), out + i * qs + h * hd, lane);
    if (lse && lane == 0)
        lse[i * n_head + h] = l;
}

/* dq_i = scale·Σ_j ds_ij k_j with ds_ij = p_ij (dout_i·v_j − D_i), D_i = dout_i·out_i;
 * also keeps D_i for the key-side kernel. */
template <typename T>
__global__ void attn_bwd_dq_kernel(T *dq, float *dsum, const T *dout, const T *q, const T *k, const T *v,
                                   const T *out, const float *lse, const int64_t *seg, int64_t n_seg, int64_t n,
                                   int n_head, int n_kv, int hd)
{
    int lane = threadIdx.x & 31;
    int64_t i = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    int h = blockIdx.y;
    if (i >= n)
        return;
    int64_t end, a = seg_start(seg, n_seg, i, &end);
    int kh = h / (n_head / n_kv);
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float qr[ATT_PER_LANE], gr[ATT_PER_LANE], acc[ATT_PER_LANE];
    row_load(qr, q + i * qs + h * hd, hd, lane);
    row_load(gr, dout + i * qs + h * hd, hd, lane);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        acc[t] = 0;
    float D = row_dot(gr, out + i * qs + h * hd, hd, lane), l = lse[i * n_head + h];
    if (lane == 0)
        dsum[i * n_head + h] = D;
    for (int64_t j = a; j <= i; j++) {
        const T *kj = k + j * ks + kh * hd, *vj = v + j * ks + kh * hd;
        float p = expf(row_dot(qr, kj, hd, lane) * scale - l);
        float ds = p * (row_dot(gr, vj, hd, lane) - D);
        row_axpy(acc, ds * scale, kj, hd, lane);
    }
    row_store(dq + i * qs + h * hd, acc, hd, lane, 1.0f);
}

/* dk_j = scale·Σ_{h in group} Σ_{i >= j} ds_ij q_i, dv_j = Σ Σ p_ij dout_i. */
template <typename T>
__global__ void attn_bwd_dkv_kernel(T *dk, T *dv, const float *dsum, const T *dout, const T *q, const T *k,
                                    const T *v, const float *lse, const int64_t *seg, int64_t n_seg, int64_t n,
                                    int n_head, int n_kv, int hd)
{
    int lane = threadIdx.x & 31;
    int64_t j = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    int kh = blockIdx.y, group = n_head / n_kv;
    if (j >= n)
        return;
    int64_t end;
    seg_start(seg, n_seg, j, &end);
    int64_t qs = (int64_t)n_head * hd, ks = (int64_t)n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float kr[ATT_PER_LANE], vr[ATT_PER_LANE], dka[ATT_PER_LANE], dva[ATT_PER_LANE];
    row_load(kr, k + j * ks + kh * hd, hd, lane);
    row_load(vr, v + j * ks + kh * hd, hd, lane);
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++)
        dka[t] = dva[t] = 0;
    for (int h = kh * group; h < (kh + 1) * group; h++)
        for (int64_t i = j; i < end; i++) {
            const T *qi = q + i * qs + h * hd, *gi = dout + i * qs + h * hd;
            float p = expf(row_dot(kr, qi, hd, lane) * scale - lse[i * n_head + h]);
            float ds = p * (row_dot(vr, gi, hd, lane) - dsum[i * n_head + h]);
            row_axpy(dva, p, gi, hd, lane);
            row_axpy(dka, ds * scale, qi, hd, lane);
        }
    row_store(dk + j * ks + kh * hd, dka, hd, lane, 1.0f);
    row_store(dv + j * ks + kh * hd, dva, hd, lane, 1.0f);
}

#include "flash_attn.cuh"
#include "mma_sync.cuh"
#include "flash_mma.cuh"
/* both kinds of tensor-core kernel are launched on the same grids */
static_assert(fm::BM == fa::BM && fm::BN == fa::BN, "flash_attn.cuh and flash_mma.cuh tiles");
/* flash_mma.cuh is built for Llama's head dimensions only (each one is 3 kernels × 3
 * targets of build time); the others take the WMMA kernels under FTK_CUDA_ATTN=mma too */
static constexpr bool fm_hd(int hd) { return hd == 64 || hd == 80 || hd == 96 || hd == 128; }

/* The tensor-core kernels (flash_attn.cuh's WMMA ones, or flash_mma.cuh's with
 * FTK_CUDA_ATTN=mma) take bf16 with a head dimension that is a multiple of 16 up to 128 and
 * rows on 16-byte boundaries; anything else, and FTK_CUDA_ATTN=simple, takes the
 * warp-per-row kernels above. */
static int flash_ok(cuda_t *c, dtype_t dt, int hd, std::initializer_list<const void *> bufs)
{
    if (c->attn == ATTN_SIMPLE || dt != DT_BF16 || hd % 16 || hd > 128)
        return 0;
    for (const void *p : bufs)
        if ((uintptr_t)p % 16)
            return 0;
    return 1;
}

/* Calls f with std::integral_constant<int, hd> (hd as checked by flash_ok). */
template <typename F> static void on_hd(int hd, F &&f)
{
    switch (hd) {
    case 16: f(std::integral_constant<int, 16>()); break;
    case 32: f(std::integral_constant<int, 32>()); break;
    case 48: f(std::integral_constant<int, 48>()); break;
    case 64: f(std::integral_constant<int, 64>()); break;
    case 80: f(std::integral_constant<int, 80>()); break;
    case 96: f(std::integral_constant<int, 96>()); break;
    case 112: f(std::integral_constant<int, 112>()); break;
    default: f(std::integral_constant<int, 128>()); break;
    }
}

/* A launch of kernel with more than the default 48 KiB of dynamic shared memory. */
template <typename K> static int smem_ok(cuda_t *c, K kernel, size_t bytes, const char *what)
{
    return ck(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), what) == 0;
}

static int attn_args_ok(cuda_t *c, const char *op, int hd, int n_head, int n_kv)
{
    if (hd > 32 * ATT_PER_LANE || hd % 2 || hd <= 0) {
        note_err(c, op, "head dimension over 256 or odd");
        return 0;
    }
    if (n_kv <= 0 || n_head % n_kv) {
        note_err(c, op, "query heads not a multiple of key/value heads");
        return 0;
    }
    return 1;
}

/* The segment list on the device; after scratch_claim. A model's layers all attend over
 * one micro-batch's segments, so a list equal to the last one is not uploaded again. */
static const int64_t *upload_seg(cuda_t *c, const int64_t *seg, int64_t n_seg)
{
    size_t bytes = (size_t)(n_seg + 1) * sizeof *seg;
    if (c->seg_n == n_seg && !memcmp(c->seg_host, seg, bytes))
        return c->seg;
    c->seg_n = -1;
    /* seg_host is the source of the last upload, which may not have run yet */
    if (ck(c, host_wait(c, NULL, c->seg_ev), "segments") < 0)
        return NULL;
    if (bytes > c->seg_host_cap) {
        cudaFreeHost(c->seg_host);
        c->seg_host = NULL;
        c->seg_host_cap = 0;
        if (ck(c, cudaMallocHost((void **)&c->seg_host, bytes), "segments (pinned host memory)") < 0)
            return NULL;
        c->seg_host_cap = bytes;
    }
    if (!scratch(c, (void **)&c->seg, &c->seg_cap, bytes, "attention segments"))
        return NULL;
    memcpy(c->seg_host, seg, bytes);
    if (ck(c, cudaMemcpyAsync(c->seg, c->seg_host, bytes, cudaMemcpyHostToDevice, c->cur), "segments") < 0 ||
        ck(c, cudaEventRecord(c->seg_ev, c->cur), "segments") < 0)
        return NULL;
    c->seg_n = n_seg;
    return c->seg;
}

void cu_attn_fwd(backend_t *be, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v,
                        const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd)
{
    cuda_t *c = enter(be);
    int64_t n = seg[n_seg];
    if (n == 0 || failed(c) || !attn_args_ok(c, "attn_fwd", hd, n_head, n_kv) ||
        !same_dt(c, "attn_fwd", out.dt, q.dt) || !same_dt(c, "attn_fwd", k.dt, q.dt) ||
        !same_dt(c, "attn_fwd", v.dt, q.dt))
        return;
    scratch_claim(c);
    if (c->attn == ATTN_CUDNN && dnn_attn_fwd(c, out, lse, q, k, v, seg, n_seg, n_head, n_kv, hd) <= 0)
        return;
    const int64_t *ds = upload_seg(c, seg, n_seg);
    if (!ds)
        return;
    float scale = 1.0f / sqrtf((float)hd);
    if (flash_ok(c, q.dt, hd, {out.p, q.p, k.p, v.p})) {
        dim3 grid((unsigned)((n + fa::BM - 1) / fa::BM), (unsigned)n_head);
        on_hd(hd, [&](auto HD) {
            if constexpr (fm_hd(HD)) if (c->attn == ATTN_MMA) {
                size_t sm = fm::lay<HD>::fwd;
                if (smem_ok(c, fm::fwd_kernel<HD>, sm, "attn_fwd (mma)"))
                    fm::fwd_kernel<HD><<<grid, fm::THREADS, sm, c->cur>>>((uint16_t *)out.p, lse, (uint16_t *)q.p,
                                                                          (uint16_t *)k.p, (uint16_t *)v.p, ds, n_seg,
                                                                          n, n_head, n_kv, scale);
                return;
            }
            size_t sm = fa::lay<HD>::fwd;
            if (smem_ok(c, fa::fwd_kernel<HD>, sm, "attn_fwd (flash)"))
                fa::fwd_kernel<HD><<<grid, fa::THREADS, sm, c->cur>>>((uint16_t *)out.p, lse, (uint16_t *)q.p,
                                                                      (uint16_t *)k.p, (uint16_t *)v.p, ds, n_seg, n,
                                                                      n_head, n_kv, scale);
        });
        launched(c, "attn_fwd (flash)");
        return;
    }
    dim3 grid((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    on_dt(q.dt, [&](auto t) {
        attn_fwd_kernel<<<grid, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, out), lse, AS(t, q), AS(t, k), AS(t, v), ds,
                                                             n_seg, 0, n, n_head, n_kv, hd);
    });
    launched(c, "attn_fwd");
}

void cu_attn_bwd(backend_t *be, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k,
                        bk_buf_t v, bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head,
                        int n_kv, int hd)
{
    cuda_t *c = enter(be);
    int64_t n = seg[n_seg];
    const char *op = "attn_bwd";
    if (n == 0 || failed(c) || !attn_args_ok(c, op, hd, n_head, n_kv) || !same_dt(c, op, dq.dt, q.dt) ||
        !same_dt(c, op, dk.dt, q.dt) || !same_dt(c, op, dv.dt, q.dt) || !same_dt(c, op, dout.dt, q.dt) ||
        !same_dt(c, op, k.dt, q.dt) || !same_dt(c, op, v.dt, q.dt) || !same_dt(c, op, out.dt, q.dt))
        return;
    scratch_claim(c);
    if (c->attn == ATTN_CUDNN &&
        dnn_attn_bwd(c, dq, dk, dv, dout, q, k, v, out, lse, seg, n_seg, n_head, n_kv, hd) <= 0)
        return;
    const int64_t *ds = upload_seg(c, seg, n_seg);
    float *dsum = (float *)tmp_for(c, (size_t)n * n_head * sizeof(float));
    if (!ds || !dsum)
        return;
    if (flash_ok(c, q.dt, hd, {dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, out.p})) {
        float scale = 1.0f / sqrtf((float)hd);
        dim3 gq((unsigned)((n + fa::BM - 1) / fa::BM), (unsigned)n_head);
        dim3 gk((unsigned)((n + fa::BN - 1) / fa::BN), (unsigned)n_kv);
        const uint16_t *g = (const uint16_t *)dout.p, *qq = (const uint16_t *)q.p, *kk = (const uint16_t *)k.p,
                       *vv = (const uint16_t *)v.p;
        on_hd(hd, [&](auto HD) {
            size_t sm = fa::lay<HD>::bwd;
            fa::dsum_kernel<HD><<<blocks_for(n * n_head, 8), 256, 0, c->cur>>>(dsum, g, (const uint16_t *)out.p,
                                                                               n * n_head);
            launched(c, "attn_bwd D (flash)");
            if constexpr (fm_hd(HD)) if (c->attn == ATTN_MMA) {
                size_t sq = fm::lay<HD>::dq, skv = fm::lay<HD>::dkv;
                if (smem_ok(c, fm::dq_kernel<HD>, sq, "attn_bwd dq (mma)"))
                    fm::dq_kernel<HD><<<gq, fm::THREADS, sq, c->cur>>>((uint16_t *)dq.p, g, qq, kk, vv, lse, dsum,
                                                                       ds, n_seg, n, n_head, n_kv, scale);
                launched(c, "attn_bwd dq (mma)");
                if (smem_ok(c, fm::dkv_kernel<HD>, skv, "attn_bwd dk dv (mma)"))
                    fm::dkv_kernel<HD><<<gk, fm::THREADS, skv, c->cur>>>((uint16_t *)dk.p, (uint16_t *)dv.p, g, qq,
                                                                         kk, vv, lse, dsum, ds, n_seg, n, n_head,
                                                                         n_kv, scale);
                launched(c, "attn_bwd dk dv (mma)");
                return;
            }
            if (smem_ok(c, fa::dq_kernel<HD>, sm, "attn_bwd dq (flash)"))
                fa::dq_kernel<HD><<<gq, fa::THREADS, sm, c->cur>>>((uint16_t *)dq.p, g, qq, kk, vv, lse, dsum, ds,
                                                                   n_seg, n, n_head, n_kv, scale);
            launched(c, "attn_bwd dq (flash)");
            if (smem_ok(c, fa::dkv_kernel<HD>, sm, "attn_bwd dk dv (flash)"))
                fa::dkv_kernel<HD><<<gk, fa::THREADS, sm, c->cur>>>((uint16_t *)dk.p, (uint16_t *)dv.p, g, qq, kk,
                                                                    vv, lse, dsum, ds, n_seg, n, n_head, n_kv, scale);
            launched(c, "attn_bwd dk dv (flash)");
        });
        return;
    }
    dim3 gq((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    dim3 gk((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_kv);
    on_dt(q.dt, [&](auto t) {
        attn_bwd_dq_kernel<<<gq, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, dq), dsum, AS(t, dout), AS(t, q), AS(t, k),
                                                              AS(t, v), AS(t, out), lse, ds, n_seg, n, n_head, n_kv,
                                                              hd);
        launched(c, "attn_bwd dq");
        attn_bwd_dkv_kernel<<<gk, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, dk), AS(t, dv), dsum, AS(t, dout), AS(t, q),
                                                               AS(t, k), AS(t, v), lse, ds, n_seg, n, n_head, n_kv,
                                                               hd);
        launched(c, "attn_bwd dk dv");
    });
}

void cu_attn_cached(backend_t *be, bk_buf_t out, bk_buf_t q, bk_buf_t kc, bk_buf_t vc, int64_t n, int64_t p0,
                           int n_head, int n_kv, int hd)
{
    cuda_t *c = enter(be);
    const char *op = "attn_cached";
    if (n == 0 || failed(c) || !attn_args_ok(c, op, hd, n_head, n_kv) || !same_dt(c, op, out.dt, q.dt) ||
        !same_dt(c, op, kc.dt, q.dt) || !same_dt(c, op, vc.dt, q.dt))
        return;
    dim3 grid((unsigned)((n + ATT_WARPS - 1) / ATT_WARPS), (unsigned)n_head);
    on_dt(q.dt, [&](auto t) {
        attn_fwd_kernel<<<grid, 32 * ATT_WARPS, 0, c->cur>>>(AS(t, out), NULL, AS(t, q), AS(t, kc), AS(t, vc), NULL,
                                                             0, p0, n, n_head, n_kv, hd);
    });
    launched(c, op);
}
