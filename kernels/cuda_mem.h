/* cuda_mem.h — what the CUDA backend's device memory costs beyond the bytes bk_alloc is
 * asked for: one description, in C, shared by the code that allocates (kernels/cuda), the
 * memory plan (kernels/plan, engine/plan.c) and the host emulation of CUDA
 * (tests/gpu/emu), so that --plan --device cuda counts what a GPU will hold
 * (docs/training.md, "What --plan counts on a GPU").
 *
 * - Granularity. cudaMalloc hands out memory in the driver's 2 MiB pages. As modelled here
 *   (only a GPU confirms it: the driver documents no rule): an allocation of more than
 *   BK_CUDA_SMALL bytes takes whole pages of its own; a smaller one is rounded up to 512
 *   bytes and carved from pages the small allocations share, counted as if packed without
 *   gaps. bk_cuda_mem_add/bk_cuda_mem_total keep that count; bk_alloc keeps it for a
 *   backend with mem_pages set (backend.h), the emulation for every cudaMalloc.
 * - The CUDA context (the runtime's state, the modules of our kernels and cuBLASLt's, the
 *   driver's per-context reserves): BK_CUDA_CONTEXT_BYTES, an estimate the plan adds as a
 *   term of its own. cudaMemGetInfo on a GPU measures it (ftk-train's
 *   mem_device_peak_bytes); the emulation has none.
 * - Scratch: bk_cuda_scratch() sizes the CUDA backend's own buffers (tmp, the segment list,
 *   adamw_multi's block map) for the largest shapes a run gives the ops (bk_reserve_t); the
 *   backend allocates them once, before the first step (backend.h reserve), and the
 *   planning backend counts the same sizes in the same order.
 *
 * Everything here is a pure function of its arguments; nothing allocates.
 */
#ifndef FTK_CUDA_MEM_H
#define FTK_CUDA_MEM_H
#include <stddef.h>
#include <stdint.h>

#define BK_CUDA_PAGE ((int64_t)2 << 20)  /* the driver's page */
#define BK_CUDA_SMALL ((int64_t)1 << 20) /* at most this: carved from shared pages */
#define BK_CUDA_SMALL_ALIGN ((int64_t)512)
/* The context's device memory: an estimate (a few hundred MiB is what CUDA 12-13 contexts
 * take with lazy module loading on Hopper, by the figures commonly reported; not measured
 * by this project yet). */
#define BK_CUDA_CONTEXT_BYTES ((int64_t)512 << 20)

/* Elements of a row block of rmsnorm_bwd's weight-gradient partial sums (rmsnorm.cu), and of
 * an adamw_multi thread block (vectors.cu): the scratch they need follows from them. */
#define BK_CUDA_COL_CHUNKS 64
#define BK_CUDA_ADAMW_CHUNK 4096
/* Elements of a sumsq thread block (vectors.cu): a double of partial sums each. */
#define BK_CUDA_SUMSQ_BLOCK 65536

/* Device memory held by live allocations: whole pages, and the small allocations' bytes. */
typedef struct {
    int64_t large, small;
} bk_cuda_mem_t;

static inline int64_t bk_cuda_round(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* Counts an allocation of bytes (sign +1) or its free (-1). */
static inline void bk_cuda_mem_add(bk_cuda_mem_t *m, int64_t bytes, int sign)
{
    if (bytes > BK_CUDA_SMALL)
        m->large += sign * bk_cuda_round(bytes, BK_CUDA_PAGE);
    else
        m->small += sign * bk_cuda_round(bytes > 0 ? bytes : 1, BK_CUDA_SMALL_ALIGN);
}

/* The device memory the live allocations take. */
static inline int64_t bk_cuda_mem_total(const bk_cuda_mem_t *m)
{
    return m->large + bk_cuda_round(m->small, BK_CUDA_PAGE);
}

/* rmsnorm_bwd's one-pass dx and dw (rmsnorm.cu, 16-byte path): a block sums at least
 * BK_CUDA_NORM_ROWS rows into its own partial row, more where n would make over
 * BK_CUDA_NORM_MAX_CHUNKS partials (fixed by n: the same sums every call); the partials are
 * summed in groups of BK_CUDA_NORM_GROUP, then the groups. Scratch: a float per column of every
 * partial and every group. */
#define BK_CUDA_NORM_ROWS 16
#define BK_CUDA_NORM_MAX_CHUNKS 1024
#define BK_CUDA_NORM_GROUP 16
static inline int64_t bk_cuda_norm_rows(int64_t n)
{
    int64_t r = (n + BK_CUDA_NORM_MAX_CHUNKS - 1) / BK_CUDA_NORM_MAX_CHUNKS;
    return r > BK_CUDA_NORM_ROWS ? r : (int64_t)BK_CUDA_NORM_ROWS;
}
/* The scratch floats for any n up to max_n: at most BK_CUDA_NORM_MAX_CHUNKS partials (the
 * count is not monotone in n above BK_CUDA_NORM_ROWS·BK_CUDA_NORM_MAX_CHUNKS rows). */
static inline int64_t bk_cuda_norm_floats(int64_t max_n, int64_t d)
{
    int64_t chunks = (max_n + BK_CUDA_NORM_ROWS - 1) / BK_CUDA_NORM_ROWS;
    if (chunks > BK_CUDA_NORM_MAX_CHUNKS)
        chunks = BK_CUDA_NORM_MAX_CHUNKS;
    return (chunks + (chunks + BK_CUDA_NORM_GROUP - 1) / BK_CUDA_NORM_GROUP) * d;
}

/* The largest shapes a training run gives the ops (backend.h reserve). */
typedef struct {
    int64_t tokens;      /* tokens of a micro-batch */
    int64_t width;       /* the widest row a norm sees */
    int64_t heads;       /* query heads */
    int64_t adamw_elems; /* elements of one adamw_multi call (the owned parameters) */
    int64_t adamw_segs;  /* its tensor slices */
    int64_t unit_elems;  /* the largest unit's owned gradient (one sumsq beside the backward) */
} bk_reserve_t;

/* The CUDA backend's scratch for r: tmp (every op's partial sums and staging; at least the
 * cuBLASLt workspace's size, which the fp32-operand products and overlapping copies take in
 * blocks of), the segment list (n_seg + 1 offsets, a segment at least a token), adamw_multi's
 * block map (one int32 a thread block; only where the backend runs 8 elements a thread,
 * vec), and the partial sums of a sumsq on a stream of its own (Σg² beside the backward,
 * engine/shard.c). ws_bytes: BK_CUDA_WORKSPACE_BYTES. */
static inline void bk_cuda_scratch(const bk_reserve_t *r, int64_t ws_bytes, int vec, int64_t *tmp, int64_t *seg,
                                   int64_t *map, int64_t *side)
{
    int64_t t = ws_bytes, n = r->tokens > 0 ? r->tokens : 1;
    int64_t need[] = {
        n * (r->heads > 0 ? r->heads : 1) * 4, /* attention backward's D, a float per row and head */
        n * 3 * 4,                             /* embed_bwd's order, start and length per token */
        n * 8,                                 /* xent's partial sums */
        BK_CUDA_COL_CHUNKS * r->width * 4,     /* rmsnorm_bwd's weight-gradient partial sums */
        vec ? bk_cuda_norm_floats(n, r->width) * 4 : 0, /* the same in its one-pass form */
        r->adamw_segs * 128,                   /* adamw_multi's segment table (under 128 bytes a slice) */
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        t = need[i] > t ? need[i] : t;
    *tmp = t;
    *seg = (n + 1) * 8;
    *map = vec && r->adamw_elems > 0 ? (r->adamw_elems / BK_CUDA_ADAMW_CHUNK + r->adamw_segs) * 4 : 0;
    *side = r->unit_elems > 0 ? (r->unit_elems + BK_CUDA_SUMSQ_BLOCK - 1) / BK_CUDA_SUMSQ_BLOCK * 8 : 0;
}

#endif
