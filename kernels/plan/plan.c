/* plan.c — the planning backend (backend.h backend_plan_new): allocations are counted,
 * not made, and no op runs, so the code that allocates can be run dry to learn what a
 * run will take (engine/plan.c) on a machine without the device planned for.
 *
 * Addresses handed out are distinct, 256-byte aligned and never mapped: an op or byte
 * move on them does nothing here, and nothing else may dereference backend memory
 * (backend.h: only upload/download move bytes to and from the host). */
#include <stdlib.h>
#include <string.h>

#include "../../libcommon/log.h"
#include "../backend.h"

typedef struct {
    uintptr_t next; /* the next address to hand out */
    int cuda;       /* planning for the CUDA backend */
    int vec;        /* planning for cuda: FTK_CUDA_VEC as the CUDA backend reads it */
} plan_ctx_t;

static void *plan_mem_alloc(backend_t *be, size_t bytes)
{
    plan_ctx_t *c = be->ctx;
    void *p = (void *)c->next;
    c->next += ((bytes + 255) & ~(uintptr_t)255) + 256;
    return p;
}
static void plan_mem_free(backend_t *be, void *p)
{
    (void)be;
    (void)p;
}
static void plan_move(backend_t *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    (void)dst;
    (void)src;
    (void)bytes;
}
static void plan_zero(backend_t *be, void *p, size_t bytes)
{
    (void)be;
    (void)p;
    (void)bytes;
}
static int plan_sync(backend_t *be)
{
    (void)be;
    return 0;
}
/* The ops: nothing runs. */
static void plan_convert(backend_t *be, bk_buf_t d, bk_buf_t s, int64_t n) { (void)be, (void)d, (void)s, (void)n; }
static void plan_matmul(backend_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, bk_buf_t A,
                        bk_buf_t B, float beta, bk_buf_t C)
{
    (void)be, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)B, (void)beta, (void)C;
}
static void plan_embed(backend_t *be, bk_buf_t a, const int32_t *ids, bk_buf_t b, int64_t n, int64_t d)
{
    (void)be, (void)a, (void)ids, (void)b, (void)n, (void)d;
}
static void plan_rmsnorm_fwd(backend_t *be, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t w, int64_t n, int64_t d,
                             float eps)
{
    (void)be, (void)out, (void)rstd, (void)x, (void)w, (void)n, (void)d, (void)eps;
}
static void plan_rmsnorm_bwd(backend_t *be, bk_buf_t dx, bk_buf_t dw, bk_buf_t dout, bk_buf_t x, bk_buf_t w,
                             const float *rstd, int64_t n, int64_t d)
{
    (void)be, (void)dx, (void)dw, (void)dout, (void)x, (void)w, (void)rstd, (void)n, (void)d;
}
static void plan_rope(backend_t *be, bk_buf_t x, const int32_t *pos, int64_t n, int n_head, int hd, float theta,
                      int inverse)
{
    (void)be, (void)x, (void)pos, (void)n, (void)n_head, (void)hd, (void)theta, (void)inverse;
}
static void plan_attn_fwd(backend_t *be, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v,
                          const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd)
{
    (void)be, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)seg, (void)n_seg, (void)n_head, (void)n_kv,
        (void)hd;
}
static void plan_attn_bwd(backend_t *be, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k,
                          bk_buf_t v, bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head,
                          int n_kv, int hd)
{
    (void)be, (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)seg,
        (void)n_seg, (void)n_head, (void)n_kv, (void)hd;
}
static void plan_attn_cached(backend_t *be, bk_buf_t out, bk_buf_t q, bk_buf_t kc, bk_buf_t vc, int64_t n, int64_t p0,
                             int n_head, int n_kv, int hd)
{
    (void)be, (void)out, (void)q, (void)kc, (void)vc, (void)n, (void)p0, (void)n_head, (void)n_kv, (void)hd;
}
/* What the planned device's backend allocates for these shapes (cuDNN's workspace). */
static int plan_attn_prepare(backend_t *be, int64_t max_seg, int64_t max_len, int n_head, int n_kv, int hd,
                             dtype_t dt)
{
    plan_ctx_t *c = be->ctx;
    int64_t ws = bk_cudnn_plan_bytes(c->cuda ? "cuda" : "cpu", dt, max_seg, max_len, n_head, n_kv, hd);
    return ws > 0 && !bk_alloc(be, (size_t)ws, BK_MEM_WORKSPACE, "cuDNN attention workspace") ? -1 : 0;
}
static void plan_swiglu_fwd(backend_t *be, bk_buf_t h, bk_buf_t g, bk_buf_t u, int64_t n)
{
    (void)be, (void)h, (void)g, (void)u, (void)n;
}
static void plan_swiglu_bwd(backend_t *be, bk_buf_t dg, bk_buf_t du, bk_buf_t dh, bk_buf_t g, bk_buf_t u, int64_t n)
{
    (void)be, (void)dg, (void)du, (void)dh, (void)g, (void)u, (void)n;
}
static void plan_xent(backend_t *be, float *logits, const int32_t *t, const float *w, int64_t n, int64_t V, float gs,
                      double *acc)
{
    (void)be, (void)logits, (void)t, (void)w, (void)n, (void)V, (void)gs, (void)acc;
}
static void plan_add(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n) { (void)be, (void)y, (void)x, (void)n; }
static void plan_scale(backend_t *be, bk_buf_t y, float a, int64_t n) { (void)be, (void)y, (void)a, (void)n; }
static void plan_sumsq(backend_t *be, bk_buf_t x, int64_t n, double *acc) { (void)be, (void)x, (void)n, (void)acc; }
static void plan_clip_coef(backend_t *be, float *coef, const double *sq, int n, double max_norm)
{
    (void)be, (void)coef, (void)sq, (void)n, (void)max_norm;
}
static void plan_adamw(backend_t *be, bk_buf_t p, bk_buf_t g, bk_buf_t m, bk_buf_t v, int64_t n, const bk_adamw_t *h)
{
    (void)be, (void)p, (void)g, (void)m, (void)v, (void)n, (void)h;
}

static void plan_quant_i8(backend_t *be, int8_t *codes, float *scales, bk_buf_t x, int64_t n, int64_t block)
{
    (void)be, (void)codes, (void)scales, (void)x, (void)n, (void)block;
}
static void plan_dequant_i8(backend_t *be, bk_buf_t y, const int8_t *codes, const float *scales, int64_t n,
                            int64_t block)
{
    (void)be, (void)y, (void)codes, (void)scales, (void)n, (void)block;
}

/* The optional fused ops: present as on the planned device (FTK_FUSED), since the model's
 * allocations depend on which are fused. */
static void plan_rope_qk(backend_t *be, bk_buf_t q, bk_buf_t k, const int32_t *pos, int64_t n, int n_head, int n_kv,
                         int hd, float theta, int inverse)
{
    (void)be, (void)q, (void)k, (void)pos, (void)n, (void)n_head, (void)n_kv, (void)hd, (void)theta, (void)inverse;
}
static void plan_glu_fwd(backend_t *be, bk_buf_t h, bk_buf_t gu, int64_t n, int64_t F)
{
    (void)be, (void)h, (void)gu, (void)n, (void)F;
}
static void plan_glu_bwd(backend_t *be, bk_buf_t dgu, bk_buf_t dh, bk_buf_t gu, int64_t n, int64_t F)
{
    (void)be, (void)dgu, (void)dh, (void)gu, (void)n, (void)F;
}
static void plan_qkv_rope(backend_t *be, bk_buf_t qkv, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int32_t *pos,
                          int64_t n, int n_head, int n_kv, int hd, float theta, int inverse)
{
    (void)be, (void)qkv, (void)q, (void)k, (void)v, (void)pos, (void)n, (void)n_head, (void)n_kv, (void)hd,
        (void)theta, (void)inverse;
}
static void plan_add_rmsnorm_fwd(backend_t *be, bk_buf_t xsum, bk_buf_t out, float *rstd, bk_buf_t x, bk_buf_t r,
                                 bk_buf_t w, int64_t n, int64_t d, float eps)
{
    (void)be, (void)xsum, (void)out, (void)rstd, (void)x, (void)r, (void)w, (void)n, (void)d, (void)eps;
}
static void plan_adamw_multi(backend_t *be, const bk_adamw_seg_t *segs, int n_segs, dtype_t sdt, dtype_t gdt,
                             const bk_adamw_t *h)
{
    (void)be, (void)segs, (void)n_segs, (void)sdt, (void)gdt, (void)h;
}

static void plan_add_sumsq(backend_t *be, bk_buf_t y, bk_buf_t x, int64_t n, double *acc)
{
    (void)be, (void)y, (void)x, (void)n, (void)acc;
}

/* Planning for cuda: the CUDA backend's reserve (cuda.cu cu_reserve) counted — the same
 * sizes (bk_cuda_scratch), names, class and order, on an instance whose scratch is empty
 * as the CUDA backend's is when the trainer reserves. */
static int plan_reserve_cuda(backend_t *be, const bk_reserve_t *r)
{
    plan_ctx_t *c = be->ctx;
    int64_t b[4];
    static const char *const what[4] = {"CUDA scratch", "attention segments", "adamw_multi block map",
                                        "sumsq's partial sums (side stream)"};
    bk_cuda_scratch(r, (int64_t)BK_CUDA_WORKSPACE_BYTES, c->vec, &b[0], &b[1], &b[2], &b[3]);
    for (int i = 0; i < 4; i++)
        if (b[i] > 0 && !bk_alloc(be, (size_t)b[i], BK_MEM_WORKSPACE, what[i]))
            return -1;
    return 0;
}

static void plan_destroy(backend_t *be) { free(be->ctx); }

backend_t *backend_plan_new(const char *device)
{
    int cuda = !strcmp(device, "cuda");
    if (!cuda && strcmp(device, "cpu")) {
        ftk_err_set("cannot plan for device %s: need cpu or cuda", device);
        return NULL;
    }
    backend_t *be = bk_instance_new("plan", cuda ? "plan (cuda)" : "plan (cpu)");
    plan_ctx_t *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(c);
        backend_free(be);
        if (be)
            ftk_err_set("out of memory");
        return NULL;
    }
    c->next = (uintptr_t)1 << 44;
    c->cuda = cuda;
    const char *vv = getenv("FTK_CUDA_VEC");
    c->vec = !(vv && !strcmp(vv, "0"));
    be->ctx = c;
    if (cuda) { /* what the CUDA backend's device memory costs beyond its allocations (cuda_mem.h) */
        be->mem_pages = 1;
        be->reserve = plan_reserve_cuda;
    }
    be->destroy = plan_destroy;
    be->mem_alloc = plan_mem_alloc;
    be->mem_free = plan_mem_free;
    be->upload = be->download = be->copy = plan_move;
    be->zero = plan_zero;
    be->sync = plan_sync;
    bk_host_streams(be);
    be->convert = plan_convert;
    be->matmul = plan_matmul;
    be->embed_fwd = be->embed_bwd = be->rows_scatter = plan_embed;
    be->rmsnorm_fwd = plan_rmsnorm_fwd;
    be->rmsnorm_bwd = plan_rmsnorm_bwd;
    be->rope = plan_rope;
    be->attn_fwd = plan_attn_fwd;
    be->attn_bwd = plan_attn_bwd;
    be->attn_cached = plan_attn_cached;
    be->attn_prepare = plan_attn_prepare;
    be->swiglu_fwd = plan_swiglu_fwd;
    be->swiglu_bwd = plan_swiglu_bwd;
    be->xent = plan_xent;
    be->add = plan_add;
    be->scale = plan_scale;
    be->sumsq = plan_sumsq;
    be->clip_coef = plan_clip_coef;
    be->adamw = plan_adamw;
    be->quant_i8 = plan_quant_i8;
    be->dequant_i8 = plan_dequant_i8;
    be->rope_qk = plan_rope_qk;
    be->glu_fwd = plan_glu_fwd;
    be->glu_bwd = plan_glu_bwd;
    be->qkv_rope = plan_qkv_rope;
    be->add_rmsnorm_fwd = plan_add_rmsnorm_fwd;
    be->adamw_multi = plan_adamw_multi;
    be->add_sumsq = plan_add_sumsq;
    /* What the planned device's backend allocates when it starts, and the fused ops it
     * offers. */
    if (!bk_alloc(be, cuda ? BK_CUDA_WORKSPACE_BYTES : BK_CPU_WORKSPACE_BYTES, BK_MEM_WORKSPACE,
                  cuda ? "cuBLASLt workspace" : "the bf16 product tiles") ||
        bk_fused_select(be, cuda) < 0) {
        backend_free(be);
        return NULL;
    }
    return be;
}
