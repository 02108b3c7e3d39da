/* cuda.cu — the CUDA backend (kernels/backend.h, version 2): every op on the GPU in fp32
 * and bf16 storage, matrix products on the tensor cores through cuBLASLt.
 *
 * Products: fp32 operands in bf16 with fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF;
 * FTK_CUDA_MATMUL=fp32 for exact fp32, for checks, or =tf32 for TF32, for the benchmark),
 * read when an instance is made; bf16 operands with fp32 accumulation (CUBLAS_COMPUTE_32F)
 * into an fp32 or bf16 result.
 *
 * Design, kept the same as the CPU reference where that decides the result:
 *  - Storage: kernels are templates over each buffer's element type, float or uint16_t
 *    (bf16's bits). They widen what they read (exact), compute in fp32 and round each
 *    stored value once to nearest even with the bit arithmetic of libcommon/dtype.h
 *    f32_to_bf16 (the hardware conversion makes a different NaN), so a bf16 result is
 *    the CPU's wherever the fp32 value is.
 *  - Determinism (backend.h): no atomics. Reductions over rows (RMSNorm's dw, the loss,
 *    Σx²) sum fixed partitions and then the partial sums in a fixed order (dw's in order;
 *    the loss's and Σx²'s by a tree whose shape depends on their count alone, add_parts,
 *    in order with FTK_CUDA_VEC=0); the embedding's backward gives each thread a column
 *    and walks the tokens in order, like the CPU.
 *  - Attention, bf16 with a head dimension that is a multiple of 16 up to 128: on the
 *    tensor cores in 64 × 64 tiles (flash_attn.cuh's WMMA kernels; with FTK_CUDA_ATTN=mma
 *    flash_mma.cuh's, accumulators in registers, not yet run on a GPU; both round
 *    probabilities and dS to bf16 before their products, as FlashAttention does).
 *    With FTK_CUDA_ATTN=cudnn, bf16 attention goes to cuDNN's fused attention where cuDNN
 *    loads and takes the shape (attention_cudnn.cu: plans made at attn_prepare; the flash
 *    kernels, with one line saying why, where not; FTK_CUDNN_STRICT=1: an error).
 *    Otherwise, and with FTK_CUDA_ATTN=simple: one warp per (query row, head), keys visited in order with an
 *    online softmax in fp32, probabilities never rounded; its backward recomputes them
 *    from the saved log-sum-exp, one warp per query row for dq and one per key row for dk
 *    and dv (a key/value head sums its query heads in order). Neither uses atomics.
 *  - Memory-bound elementwise ops (convert, scale, add, swiglu, glu, the embedding's
 *    gather, rows_scatter, AdamW) take 8 elements a thread with 16-byte accesses where
 *    every operand is 16-byte aligned (ELEMENTWISE), one element otherwise and with
 *    FTK_CUDA_VEC=0; the same arithmetic on both paths. The row reductions (RMSNorm,
 *    Σx²'s blocks, the loss's rows where V % 8 == 0) take 8 consecutive elements a thread
 *    on the same condition: a sum is then partitioned otherwise (deterministic, not the
 *    one-element path's bits); RMSNorm's dw is then summed in the dx pass, 8 columns a
 *    thread, its partials over blocks of rows in two fixed levels. Rope (hd % 16 == 0)
 *    takes 8 pairs of 4 heads a thread: the one-pair kernels' operations, so their bits. The
 *    embedding's gradient sums each table row over its own tokens (a block per distinct
 *    id; FTK_CUDA_VEC=0: a thread per column walking all tokens): the same additions in
 *    the same order either way.
 *  - AdamW is written without contractions (__fmul_rn …): its fp32 arithmetic is the
 *    CPU's operation for operation, so nearest and stochastic rounding give the CPU's bits;
 *    so are rope's rotation (then every kernel that rotates has the same bits, whatever
 *    ptxas would contract at each call site) and xent's gradient.
 *  - Instances: all state lives in cuda_t (be->ctx); every entry point makes the
 *    instance's device current, so instances on several devices share a thread.
 *  - Streams: every kernel, product and copy goes to the current stream; upload and
 *    download wait for it (the host buffer is free, or filled, when they return).
 *  - Ops have no error path (backend.h): the first CUDA error is kept, later ops are
 *    skipped, and sync() reports it.
 * The ops live in one file per family (cuda_internal.cuh lists them, with what they
 * share); this file makes the instance and fills its op table.
 */
#include "cuda_internal.cuh"

/* ---- the instance ---------------------------------------------------------------------------- */

/* Frees what the instance made but memory: backend_free has already freed every live
 * bk_alloc() allocation, the workspace and scratch included (backend.h). Also after a
 * creation that stopped half-way. */
static void cu_destroy(backend_t *be)
{
    cuda_t *c = (cuda_t *)be->ctx;
    if (!c)
        return;
    enter(be);
    /* the streams' work may still use the plans */
    if (c->def)
        cudaStreamSynchronize(c->def);
    for (bk_stream *s = c->streams; s; s = s->next)
        cudaStreamSynchronize(s->s);
    for (int i = 0; i < c->n_plans; i++)
        plan_release(&c->plans[i]);
    dnn_close(c);
    if (c->seg_host)
        cudaFreeHost(c->seg_host);
    if (c->am_host)
        cudaFreeHost(c->am_host);
    free(c->am_layout);
    for (int i = 0; i < UP_SLOTS; i++) {
        if (c->up[i].p)
            cudaFreeHost(c->up[i].p);
        if (c->up[i].ev)
            cudaEventDestroy(c->up[i].ev);
    }
    while (c->events) {
        bk_event *e = c->events;
        c->events = e->next;
        cudaEventDestroy(e->e);
        free(e);
    }
    while (c->streams) {
        bk_stream *s = c->streams;
        c->streams = s->next;
        cudaStreamDestroy(s->s);
        free(s);
    }
    if (c->scr_ev)
        cudaEventDestroy(c->scr_ev);
    if (c->seg_ev)
        cudaEventDestroy(c->seg_ev);
    if (c->am_ev)
        cudaEventDestroy(c->am_ev);
    if (c->def)
        cudaStreamDestroy(c->def);
    if (c->lt)
        cublasLtDestroy(c->lt);
    cudaGetLastError();
    free(c);
    be->ctx = NULL;
}

/* Fails the creation of be: the message survives backend_free. */
static backend_t *fail_new(backend_t *be, const char *msg)
{
    char m[512];
    snprintf(m, sizeof m, "%s", msg);
    backend_free(be);
    ftk_err_set("%s", m);
    return NULL;
}

/* What an instance reads from the environment when it is made (cuda_t's fields of the
 * same names). */
typedef struct {
    cublasComputeType_t f32_compute; /* FTK_CUDA_MATMUL */
    int attn;                        /* FTK_CUDA_ATTN */
    int vec;                         /* FTK_CUDA_VEC */
} cu_settings_t;

/* Reads them: 0, or -1 with ftk_err_msg() set for a value not understood. */
static int cu_settings(cu_settings_t *c)
{
    const char *mm = getenv("FTK_CUDA_MATMUL");
    c->f32_compute = CUBLAS_COMPUTE_32F_FAST_16BF;
    if (mm && !strcmp(mm, "fp32"))
        c->f32_compute = CUBLAS_COMPUTE_32F;
    else if (mm && !strcmp(mm, "tf32"))
        c->f32_compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    else if (mm && *mm) {
        ftk_err_set("FTK_CUDA_MATMUL=%s: expected fp32 or tf32", mm);
        return -1;
    }
    const char *at = getenv("FTK_CUDA_ATTN");
    if (at && *at && strcmp(at, "flash") && strcmp(at, "mma") && strcmp(at, "simple") && strcmp(at, "cudnn")) {
        ftk_err_set("FTK_CUDA_ATTN=%s: expected flash, mma, simple or cudnn", at);
        return -1;
    }
    c->attn = at && !strcmp(at, "simple") ? ATTN_SIMPLE
              : at && !strcmp(at, "mma")  ? ATTN_MMA
              : at && !strcmp(at, "cudnn") ? ATTN_CUDNN
                                           : ATTN_FLASH;
    const char *vv = getenv("FTK_CUDA_VEC");
    if (vv && *vv && strcmp(vv, "0") && strcmp(vv, "1")) {
        ftk_err_set("FTK_CUDA_VEC=%s: expected 1 (8 elements a thread where aligned) or 0", vv);
        return -1;
    }
    c->vec = !(vv && !strcmp(vv, "0"));
    return 0;
}

/* Makes device current and names it for messages: "cuda:N (NAME)". 0, or -1 with
 * ftk_err_msg() set (no CUDA device, not that one, or it cannot be used). */
static int cu_open_device(int device, char name[96])
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        ftk_err_set("no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return -1;
    }
    if (device < 0 || device >= count) {
        ftk_err_set("CUDA device %d asked for, %d present", device, count);
        return -1;
    }
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        cudaGetLastError();
        ftk_err_set("CUDA device %d: %s", device, cudaGetErrorString(e));
        return -1;
    }
    snprintf(name, 96, "cuda:%d (%.72s)", device, prop.name);
    return 0;
}

/* The table: the instance's entries, then every op of backend.h's list (BK_OPS). */
static void cu_fill_table(backend_t *be)
{
    be->destroy = cu_destroy;
    be->mem_avail = cu_mem_avail;
    be->mem_used = cu_mem_used;
    be->mem_pages = 1;
    be->reserve = cu_reserve;
    be->attn_prepare = cu_attn_prepare;
    be->mem_alloc = cu_mem_alloc;
    be->mem_free = cu_mem_free;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->download_async = cu_download_async;
    be->zero = cu_zero;
    be->copy = cu_copy;
    be->sync = cu_sync;
    be->stream_new = cu_stream_new;
    be->stream_free = cu_stream_free;
    be->set_stream = cu_set_stream;
    be->stream_native = cu_stream_native;
    be->event_new = cu_event_new;
    be->event_free = cu_event_free;
    be->event_record = cu_event_record;
    be->event_wait = cu_event_wait;
    be->event_sync = cu_event_sync;
    be->timer_new = cu_timer_new;
    be->timer_elapsed = cu_timer_elapsed;
#define CU_OP(name, kind, params, args, cost) be->name = cu_##name;
    BK_OPS(CU_OP)
#undef CU_OP
}

/* What an instance starts with: its default stream and events, cuBLASLt and its
 * workspace, cuDNN where asked for, the fused ops FTK_FUSED selects. be, or NULL with
 * ftk_err_msg() set and be freed. */
static backend_t *cu_start(backend_t *be, cuda_t *c, int device)
{
    char m[256];
    cudaError_t e;
    if ((e = cudaStreamCreateWithFlags(&c->def, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->scr_ev, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->seg_ev, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->am_ev, cudaEventDisableTiming)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(m, sizeof m, "CUDA device %d: %s", device, cudaGetErrorString(e));
        return fail_new(be, m);
    }
    c->cur = c->scr_owner = c->def;
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        c->lt = NULL;
        snprintf(m, sizeof m, "CUDA device %d: cuBLASLt could not start", device);
        return fail_new(be, m);
    }
    if (!(c->ws = bk_alloc(be, BK_CUDA_WORKSPACE_BYTES, BK_MEM_WORKSPACE, "cuBLASLt workspace")))
        return fail_new(be, ftk_err_msg());
    if (cu_sync(be) < 0) /* the workspace's zeroing, or anything else that failed */
        return fail_new(be, ftk_err_msg());
    if (c->attn == ATTN_CUDNN) {
        dnn_open(c); /* or one line, and the flash kernels */
        if (failed(c))
            return fail_new(be, c->err);
    }
    if (bk_fused_select(be, 1) < 0) /* every fused op unless FTK_FUSED says otherwise */
        return fail_new(be, ftk_err_msg());
    return be;
}

extern "C" backend_t *backend_cuda_new(int device)
{
    cu_settings_t settings;
    char name[96];
    if (cu_settings(&settings) < 0 || cu_open_device(device, name) < 0)
        return NULL;
    backend_t *be = bk_instance_new("cuda", name);
    if (!be)
        return NULL;
    cuda_t *c = (cuda_t *)calloc(1, sizeof *c);
    if (!c)
        return fail_new(be, "out of memory");
    be->ctx = c;
    c->be = be;
    c->device = device;
    c->seg_n = -1;
    c->f32_compute = settings.f32_compute;
    c->attn = settings.attn;
    c->vec = settings.vec;
    cu_fill_table(be);
    return cu_start(be, c, device);
}

extern "C" int backend_cuda_devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
