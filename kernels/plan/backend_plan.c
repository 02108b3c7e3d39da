/* backend_plan.c — the planning backend (backend.h backend_plan_new): allocations are
 * counted, not made, and no op runs, so the code that allocates can be run dry to learn
 * what a run will take (engine/plan.c) on a machine without the device planned for.
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
/* The ops: nothing runs. Every stub takes its parameters and uses none. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define PLAN_OP(name, kind, params, args, cost) \
    static void plan_##name(backend_t *be, BK_UNPAREN params) {}
BK_OPS(PLAN_OP)
#undef PLAN_OP
#pragma GCC diagnostic pop

/* What the planned device's backend allocates for these shapes (cuDNN's workspace). */
static int plan_attn_prepare(backend_t *be, int64_t max_seg, int64_t max_len, int n_head, int n_kv, int hd,
                             dtype_t dt)
{
    plan_ctx_t *c = be->ctx;
    int64_t ws = bk_cudnn_plan_bytes(c->cuda ? "cuda" : "cpu", dt, max_seg, max_len, n_head, n_kv, hd);
    return ws > 0 && !bk_alloc(be, (size_t)ws, BK_MEM_WORKSPACE, "cuDNN attention workspace") ? -1 : 0;
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
    backend_t *be = bk_instance_ctx_new("plan", cuda ? "plan (cuda)" : "plan (cpu)", sizeof(plan_ctx_t));
    if (!be)
        return NULL;
    plan_ctx_t *c = be->ctx;
    c->next = (uintptr_t)1 << 44;
    c->cuda = cuda;
    const char *vv = getenv("FTK_CUDA_VEC");
    c->vec = !(vv && !strcmp(vv, "0"));
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
#define PLAN_OP(name, kind, params, args, cost) be->name = plan_##name;
    BK_OPS(PLAN_OP)
#undef PLAN_OP
    be->attn_prepare = plan_attn_prepare;
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
