/* ops_table.h — the backend ops (kernels/backend.h) as test cases, one descriptor per op
 * (ops_desc_t: its cases, how it runs, its bounds, its gradient check) registered in
 * OPS_LIST, read by tests/unit/test_ops.c (the CPU backend: bf16 paths against fp32 ones,
 * determinism, gradients), tests/unit/test_prof.c (profiled against plain),
 * tests/gpu/gpu_ops.c (the CUDA backend against the CPU one), tests/gpu/flash_emu.cc and
 * tests/gpu/gpu_opbench.c (the ops' bandwidth at Llama's shapes).
 * In the manner of ggml's test-backend-ops: a case is an op and a shape; ops_run() makes
 * its inputs on the host from a seed, uploads them, runs the op on the backend it is given
 * and downloads every output widened to float. The same seed gives the same inputs on
 * every backend and in every dtype configuration, so two runs can be compared element by
 * element.
 *
 * Shapes are chosen to break kernels, not to be realistic: token counts that are not a
 * multiple of 4, one-token segments and several segments per batch, head dims 64/80/96/128,
 * grouped-query heads (n_head / n_kv = 4 and 2), ragged widths (d = 100, 1000), matrix
 * products with M, N, K above 256 and not multiples of it (the CPU's bf16 tiles are 256)
 * in every transposition, beta 0 and 1. They are small enough that the whole table runs
 * in seconds on one core, also under AddressSanitizer.
 *
 * Dtype configurations (ops_cfg_t). Which buffers are bf16 in each, per op:
 *   OPS_F32     every buffer f32: the reference the others are compared with.
 *   OPS_BF16    every buffer the op lets be bf16 is bf16 (bf16-true).
 *   OPS_MIXED   bf16 inputs into an f32 accumulator (bf16-mixed's gradients):
 *               matmul A, B bf16, C f32; embed_bwd dout bf16, dtable f32; rmsnorm_bwd
 *               dx, dout, x, w bf16, dw f32; add y f32 += x bf16; convert bf16 -> f32;
 *               adamw p, m, v f32 with g bf16.
 *   OPS_NARROW  f32 inputs into a bf16 result: matmul A, B f32, C bf16; embed_bwd dout
 *               f32, dtable bf16; rmsnorm_bwd dx, dout, x, w f32, dw bf16; add y bf16 +=
 *               x f32; convert f32 -> bf16; adamw p, m, v bf16 with g f32.
 * rstd and lse are f32 always, and xent takes f32 logits only.
 *
 * Inputs: uniform random values, rounded to bf16 unless `full` is set (then f32 buffers
 * get arbitrary f32 values), so that the f32 and the bf16 paths see the same numbers.
 * Inputs that must be consistent with each other are computed on the host in double from
 * the values as stored: rmsnorm_bwd's rstd, attn_bwd's out and lse. Outputs that an op
 * overwrites start as NaN, so an element it forgets to write is caught.
 *
 * Helpers here exit(1) with a message when memory runs out (they are test code). */
#ifndef FTK_OPS_TABLE_H
#define FTK_OPS_TABLE_H
#include <stdint.h>

#include "../../kernels/backend.h"

/* The registry: one line per op, X(ENUM, name), in the order the programs report them.
 * Each name has its descriptor desc_<name> (ops_desc_t, below) in ops_defs.c, its cases
 * included; adding an op is that descriptor and a line here. */
#define OPS_LIST(X)                                                                                           \
    X(CONVERT, convert)                                                                                       \
    X(MATMUL, matmul)                                                                                         \
    X(EMBED_FWD, embed_fwd)                                                                                   \
    X(EMBED_BWD, embed_bwd)                                                                                   \
    X(ROWS_SCATTER, rows_scatter)                                                                             \
    X(RMSNORM_FWD, rmsnorm_fwd)                                                                               \
    X(RMSNORM_BWD, rmsnorm_bwd)                                                                               \
    X(ROPE, rope)                                                                                             \
    X(ATTN_FWD, attn_fwd)                                                                                     \
    X(ATTN_BWD, attn_bwd)                                                                                     \
    X(ATTN_CACHED, attn_cached)                                                                               \
    X(SWIGLU_FWD, swiglu_fwd)                                                                                 \
    X(SWIGLU_BWD, swiglu_bwd)                                                                                 \
    X(XENT, xent)                                                                                             \
    X(ADD, add)                                                                                               \
    X(SCALE, scale)                                                                                           \
    X(SUMSQ, sumsq)                                                                                           \
    X(QUANT_I8, quant_i8)                                                                                     \
    X(ADAMW, adamw)

typedef enum {
#define OPS_ENUM(e, name) OP_##e,
    OPS_LIST(OPS_ENUM)
#undef OPS_ENUM
    OP_COUNT
} ops_op_t;

typedef enum { OPS_F32, OPS_BF16, OPS_MIXED, OPS_NARROW, OPS_NCFG } ops_cfg_t;
extern const char *const ops_cfg_names[OPS_NCFG];
#define OPS_CFG(c) (1u << (c))

/* One case: the op and the fields of the shape it uses (the rest stay 0). */
typedef struct {
    ops_op_t op;
    unsigned cfgs;          /* OPS_CFG() bits: the dtype configurations it runs in */
    int64_t n, d;           /* tokens (elements for pointwise ops), row width */
    int64_t M, N, K;        /* matmul */
    int ta, tb;
    float alpha, beta;      /* matmul; alpha is scale's factor too */
    int64_t V;              /* rows of an embedding table / rows_scatter's dst; xent's vocabulary */
    int n_head, n_kv, hd;   /* rope (n_head heads of hd), attention */
    const int64_t *seg;     /* attn_fwd/bwd: n_seg + 1 segment starts, seg[n_seg] = n */
    int64_t n_seg;
    int64_t p0;             /* attn_cached: cached positions before the n new queries */
    float theta;            /* rope */
    int inverse;
    int32_t pos_step;       /* rope: pos[i] = (i * pos_step) % 4096 (0: i) */
    float grad_scale;       /* xent (0: loss only, logits untouched) */
    int step, stochastic;   /* adamw: optimizer step t, bk_adamw_t's rounding of bf16 states */
    float wd, gscale;       /* adamw: weight decay, gradient scale (0 means 1) */
    float clip;             /* adamw: not 0, the scale is clip_coef's on the device (gscale_dev)
                             * from Σg² slots summing to 4, max_norm clip (below 0: max_norm 0,
                             * off); the coefficient is an output too */
    int64_t index0;         /* adamw */
    int64_t offset;         /* every buffer a view this many elements into its allocation, as
                             * tensors inside a unit are: pointers only 2- or 4-byte aligned */
} ops_case_t;

/* The op table: every descriptor's cases, in the registry's order (k < ops_n_cases(0)),
 * then with large set every descriptor's larger ones. */
int ops_n_cases(int large);
const ops_case_t *ops_case_at(int k);

/* A case's name with its shape, e.g. "matmul 300x260x270 ta=1 tb=0 beta=1". */
void ops_case_name(const ops_case_t *c, char *out, size_t size);

#define OPS_MAX_OUT 4
typedef struct {
    const char *name; /* "C", "dq", … */
    float *v;         /* n values, widened from dt */
    int64_t n;
    dtype_t dt;       /* the dtype the op stored them in */
    int rounds;       /* how often the op may round an element to dt (embed_bwd: once per add) */
} ops_out_t;

typedef struct {
    int n_out;
    ops_out_t out[OPS_MAX_OUT];
    int has_scalar; /* xent's loss, sumsq (what they added to a zeroed accumulator) */
    double scalar;
} ops_result_t;

/* Runs case c in configuration cfg (which c must list) on be: 0, or -1 with ftk_err_msg()
 * set when be->sync() reports a failure (r is then freed). */
int ops_run(backend_t *be, const ops_case_t *c, ops_cfg_t cfg, uint64_t seed, int full, ops_result_t *r);
void ops_result_free(ops_result_t *r);

/* ---- fused ops: each against its unfused sequence ------------------------------------- */

/* The optional fused ops of backend.h, each run two ways on the same inputs: as the fused op
 * (the backend must have it) and as the sequence of plain ops it documents. On the CPU the
 * two give the same bits (tests/unit/test_ops.c); on CUDA the fused op is compared with the
 * CPU's sequence and with its own device's (tests/gpu/gpu_ops.c). Shapes as above: token
 * counts not a multiple of 4 and one-token batches, head dims 64/80/96/128 with grouped
 * queries, ragged widths (F = 1000, 250, 1; d = 1000, 100), Llama's (F = 11008; d = 4096,
 * 5120), inputs misaligned against the outputs. add_sumsq's result has its scalar (the
 * accumulator, from a non-zero start) beside y. */
typedef enum { FU_ROPE_QK, FU_QKV_ROPE, FU_GLU_FWD, FU_GLU_BWD, FU_ADD_RMSNORM, FU_ADD_SUMSQ, FU_COUNT } ops_fop_t;
extern const char *const ops_fop_names[FU_COUNT];
typedef struct {
    ops_fop_t op;
    int64_t n, d;         /* tokens; F (glu), D (add_rmsnorm) */
    int n_head, n_kv, hd; /* rope_qk, qkv_rope */
    float theta;
    int inverse;
    int32_t pos_step;     /* pos[i] = (i * pos_step) % 4096 (0: i) */
    int64_t offset;       /* add_rmsnorm: x and r views this many elements into their allocations;
                           * add_sumsq: x's (and y's where alias) */
    int alias;            /* add_rmsnorm: xsum is 1 x, 2 r (fused and sequence alike); add_sumsq: 1 y
                           * at offset too */
} ops_fcase_t;
extern const ops_fcase_t ops_fused_table[];
extern const int ops_fused_len;
void ops_fcase_name(const ops_fcase_t *c, char *out, size_t size);
/* Runs case c in dtype dt (f32 or bf16 for every buffer but rstd) on be, fused or as the
 * sequence; inputs from seed alone. 0, or -1 with ftk_err_msg() when be->sync() fails. */
int ops_fused_run(backend_t *be, const ops_fcase_t *c, dtype_t dt, int fused, uint64_t seed, ops_result_t *r);
/* Whether be has the fused op of case c. */
int ops_fused_has(const backend_t *be, const ops_fcase_t *c);

/* ---- two backends that must agree bit for bit ------------------------------------------ */

/* Whether two results hold the same bits. */
int ops_same(const ops_result_t *a, const ops_result_t *b);
/* Every case of the op table in every configuration it lists, and every fused case in f32
 * and bf16 that both have the fused op for, on a and on b from the same inputs (seed): how
 * many runs differ in any bit (*runs: how many there were), or -1 with ftk_err_msg() when a
 * backend failed. For one device with and without FTK_PROFILE's wrappers (kernels/prof.h). */
int ops_table_differ(backend_t *a, backend_t *b, uint64_t seed, int *runs);

/* ---- comparing two runs --------------------------------------------------------------- */

typedef struct {
    double max_rel;  /* max_i |got − ref| / (|ref_i| + rms(ref)) */
    double norm_rel; /* ‖got − ref‖ / ‖ref‖ (‖got − ref‖ when ref is 0) */
    int64_t nan;     /* elements that are NaN in either (unwritten outputs) */
    int64_t worst;   /* where max_rel is reached */
    int64_t differ;  /* elements whose bits differ */
} ops_err_t;
ops_err_t ops_compare(const float *ref, const float *got, int64_t n);
/* The same with each element measured against the rms of its own row of `row` elements
 * (|ref_i| + rms(ref's row)): for outputs whose rows differ in scale by much more than the
 * error, such as attention's near a segment start (few keys: large values). */
ops_err_t ops_compare_rows(const float *ref, const float *got, int64_t n, int64_t row);

/* ---- helpers for the programs' own checks -------------------------------------------- */

typedef struct {
    uint64_t s;
} ops_rng_t;
void ops_rng_seed(ops_rng_t *r, uint64_t seed);
double ops_urand(ops_rng_t *r); /* [0, 1) */
/* n uniform values in (-scale, scale), rounded to bf16 when round_bf16 (malloc'd). */
float *ops_rand(ops_rng_t *r, int64_t n, float scale, int round_bf16);
int32_t *ops_rand_ids(ops_rng_t *r, int64_t n, int64_t range);
void *ops_xmalloc(size_t bytes); /* exits on failure */

/* A new buffer of n elements of dt on be holding host[0..n) rounded to dt; host is
 * rounded in place, so it holds what the backend holds. */
bk_buf_t ops_put(backend_t *be, dtype_t dt, float *host, int64_t n);
/* A new buffer of n elements of dt on be, every one NaN. */
bk_buf_t ops_nan(backend_t *be, dtype_t dt, int64_t n);
/* Device memory holding a copy of host bytes (ids, positions, weights). */
void *ops_put_raw(backend_t *be, const void *host, size_t bytes);
/* b's n elements, widened to float (malloc'd). */
float *ops_get(backend_t *be, bk_buf_t b, int64_t n);
/* x rounded to nearest even bf16 and widened back. */
float ops_round_bf16(float x);

/* adamw_multi on be against adamw segment by segment on ref (ref may be be) over one
 * fixed layout of segments in one buffer (odd lengths, index0 offsets, an empty segment,
 * gaps no segment covers), the inputs made from seed, states in st and gradients in gt,
 * with bk_adamw_t's rounding `stochastic` (sround.h) at optimizer steps `step` and
 * `step` + 1, called back to back (nothing waited for between them). Returns
 * the bytes of p, m, v (whole buffers, gaps included) that differ, or -1 when a backend
 * reported a failure (ftk_err_msg()). */
int64_t ops_adamw_multi_diff(backend_t *ref, backend_t *be, dtype_t st, dtype_t gt, int stochastic, int step,
                             uint64_t seed);
/* bk_adamw_t's rounding `stochastic` in words: "nearest", "stochastic", "stochastic3". */
const char *ops_sround_name(int stochastic);
/* The dtype configurations adamw runs in (states, gradients): f32, bf16, mixed, narrow. */
typedef struct {
    dtype_t st, gt;
    const char *name;
} ops_adamw_cfg_t;
extern const ops_adamw_cfg_t ops_adamw_cfgs[4];

/* ---- one descriptor per op ------------------------------------------------------------- */

/* Everything the programs know about an op: its cases, how to run one, how to name it, its
 * tolerances on the CPU (test_ops: bf16 against fp32) and on CUDA (gpu_ops, flash_emu:
 * against the CPU), its gradient check, its benchmark rows. ops_defs.c holds one per op, each beside its run
 * function, with the reasons for its bounds; OPS_LIST registers it. */
typedef struct ops_ctx ops_ctx_t; /* one run of a case (ops_impl.h) */

/* The benchmark's buffers (tests/gpu/gpu_opbench.c), one set per storage dtype dt at its
 * shapes (Llama-2-7B's: N tokens, width D, MLP width F, H heads of HD): a, b, c, m, v
 * [N, F] (v positive: a second moment), x, y [N, D], w [V, D] (an embedding table; its
 * first D a norm's weights), q, k, vv, o, dq, dk, dv [N, H·HD]; rstd [N]; ids and pos [N],
 * ids_rep one token in 7 the same id; acc one double. Random values, never zeros. */
typedef struct {
    backend_t *be;
    dtype_t dt;
    int64_t N, D, F, H, HD;
    bk_buf_t a, b, c, m, v, x, y, w, q, k, vv, o, dq, dk, dv;
    float *lse, *rstd;
    const int32_t *ids, *ids_rep, *pos;
    double *acc;
    bk_adamw_t h;
} ops_bench_t;

/* A row of the benchmark: the op on s, timed in each storage dtype; its bandwidth counts
 * the fewest elements it must move: elems × (N·D, N·F or N·H·HD). vec0: the row's label
 * when timed again with one element a thread (FTK_CUDA_VEC=0, bf16), or NULL. */
typedef enum { OPS_PER_ND, OPS_PER_NF, OPS_PER_NQ } ops_per_t;
typedef struct {
    const char *label;
    void (*call)(const ops_bench_t *s);
    double elems;
    ops_per_t per;
    const char *vec0;
} ops_perf_t;
/* The elements row p moves on s. */
double ops_perf_elems(const ops_perf_t *p, const ops_bench_t *s);

/* What the gradient checks of an op found, summed over its cases. */
typedef struct {
    int cases;       /* cases checked */
    int checks, bad; /* checks made; how many exceeded their bound */
    double worst[3]; /* the largest error of each gradient (grad_linear: of each property) */
} ops_grad_t;

typedef struct {
    const char *name;
    /* Its cases (ops_case_t: shapes chosen as the top of this file says), and larger ones
     * that only gpu_ops runs (not with FTK_GPU_OPS_QUICK): many blocks, long rows. */
    const ops_case_t *cases, *large;
    int n_cases, n_large;
    /* Makes the inputs from R's generator, runs the op on R's backend, hands the outputs
     * back (ops_impl.h: put(), poisoned(), output()). */
    void (*run)(ops_ctx_t *R, const ops_case_t *c, ops_cfg_t cfg);
    /* The shape in ops_case_name() after the name, e.g. "n=77 V=13 d=100"; NULL: "n=N". */
    void (*shape)(const ops_case_t *c, char *out, size_t size);
    /* CPU: the bound on ops_compare()'s max_rel between output o of a bf16 configuration and
     * the same output of the fp32 run on the same inputs; *exact set when o must be exactly
     * f32_to_bf16 of the fp32 run's. NULL: ops_cpu_tol_rounded(). */
    double (*cpu_tol)(const ops_case_t *c, const ops_out_t *o, int *exact);
    /* CUDA against the CPU: the bound on max_rel for the fp32 arithmetic of an output;
     * 0 means the CPU's bits (and no allowance for bf16 roundings). gpu_tol_fn, when set,
     * decides instead (mm_exact: FTK_CUDA_MATMUL=fp32, f32 products not made in bf16). */
    double gpu_tol;
    double (*gpu_tol_fn)(const ops_case_t *c, ops_cfg_t cfg, const ops_out_t *o, int mm_exact);
    /* attention the tensor-core kernels compute in bf16: those outputs are measured row by
     * row (rows of hd, ops_compare_rows) with more allowance (gpu_ops, flash_emu) */
    int flash;
    /* Whether case c computes a gradient: gpu_ops runs those twice for the same bits. */
    int (*backward)(const ops_case_t *c);
    /* The CPU check of the gradient, in fp32, added into g (ops_grad.c: finite differences
     * of the forward, bound OPS_FD_BOUND); NULL: none. grad_names: the gradients' names, or
     * with grad_linear, the two properties of a linear op checked instead. */
    void (*grad)(backend_t *be, const ops_case_t *c, ops_rng_t *rng, ops_grad_t *g);
    const char *grad_names[3];
    int grad_linear;
    /* Its rows in the benchmark (gpu_opbench), at the benchmark's shapes; none: n_perf 0. */
    const ops_perf_t *perf;
    int n_perf;
} ops_desc_t;

extern const ops_desc_t *const ops_descs[OP_COUNT];
#define OPS_DESC(op) (ops_descs[(op)])

/* bf16's unit roundoff (rounding to nearest errs by at most 2^-8 of the value) and fp32's */
#define OPS_U_BF16 (1.0 / 256)
#define OPS_EPS32 (1.0 / 16777216)
/* The bound of the finite-difference checks (ops_impl.h says why). */
#define OPS_FD_BOUND (1.0 / 4096)
/* The default cpu_tol: o is the fp32 result rounded o->rounds times (exact when once). */
double ops_cpu_tol_rounded(const ops_case_t *c, const ops_out_t *o, int *exact);
/* The CPU bound of output o of case c (its descriptor's cpu_tol) and whether it is exact. */
double ops_cpu_tol(const ops_case_t *c, const ops_out_t *o, int *exact);
/* The CUDA bound of output o of case c in cfg: the descriptor's fp32 bound, a ulp (2u) per
 * rounding of a bf16 output, 4u more where flash_rows (ops_desc_t.flash). */
double ops_gpu_tol(const ops_case_t *c, ops_cfg_t cfg, const ops_out_t *o, int mm_exact, int flash_rows);
/* Whether o is measured row by row when bf16 attention runs on the tensor cores. */
int ops_flash_rows(const ops_case_t *c, const ops_out_t *o);

#endif
