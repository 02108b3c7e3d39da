/* attention_cudnn.cu — FTK_CUDA_ATTN=cudnn: causal attention inside packed segments through
 * cuDNN's fused attention (cuDNN 9's scaled-dot-product graphs, forward and backward), the
 * kernels PyTorch's own scaled_dot_product_attention runs on Hopper.
 *
 * cuDNN is opened at run time (dlopen), never linked: a machine without it keeps the flash
 * kernels (attention.cu), and the instance says so in one line when it is made. Looked for:
 * FTK_CUDNN_LIB (a path to libcudnn.so.9) when set; else libcudnn.so.9 as the loader finds it
 * (LD_LIBRARY_PATH, this library's run path: the CUDA install's lib64, the system's cache);
 * else PyTorch's wheel (site-packages/nvidia/cudnn/lib) under VIRTUAL_ENV, CONDA_PREFIX, the
 * user's ~/.local and the system's Python folders. Only the backend descriptor API
 * (cudnn_graph.h) is used, through pointers typed by the header's own prototypes.
 *
 * The graphs are the ones NVIDIA's cudnn-frontend builds for its SDPA nodes (the composite
 * forward and backward of node/scaled_dot_product_flash_attention.h, with its padding mask
 * and top-left causal mask), written out in backend descriptors, in the same order of
 * operations (cuDNN recognises the fused pattern by it):
 *  - Layout "THD": each segment of the micro-batch is one cuDNN sequence. Q[b, h, s, d] is
 *    ftk's q[seg[b] + s, h·hd + d]: strides (·, hd, n_head·hd, 1) with a ragged offset per
 *    sequence (seg[b]·n_head·hd elements); K, V, O, dQ, dK, dV alike. seq_len_q = seq_len_kv
 *    = the segment's length, with the padding mask (which ragged offsets require).
 *  - Shapes: one forward and one backward plan a run, made before its first step
 *    (attn_prepare, backend.h): the graph's batch is the most segments a micro-batch can
 *    hold and its sequence length the run's max length (the trainer knows both from the
 *    data); a micro-batch with fewer segments leaves the rest empty (length 0, at the end).
 *    Their workspace is allocated there, once, and the memory plan counts it
 *    (bk_cudnn_plan_bytes). A call beyond that bound (or without attn_prepare: the op
 *    tests, generation) gets a plan for its batch and length rounded up to powers of two
 *    (length at least 64), made then; plans are kept per shape (DNN_PLANS, least recently
 *    used out, the prepared ones never). Every plan made says so in one line.
 *  - Stats: cuDNN's softmax statistics are max + log Σexp of the scaled scores, natural
 *    log: ftk's lse, in another layout ([b, h, s] padded): a kernel moves them to lse[n,
 *    n_head] after the forward and back before the backward.
 *  - Backward: deterministic. dQ straight from dS·K (no fp32 accumulator that thread blocks
 *    add into: the frontend's is_deterministic_algorithm), and engines whose numerical notes
 *    say NONDETERMINISTIC are passed over.
 *  - Grouped-query heads: K and V have n_kv heads; the products broadcast them, and the
 *    backward sums the query heads of a group into dK, dV with reductions (bf16 per head,
 *    as the frontend's graph). Ragged offsets with grouped-query heads need cuDNN 9.6: an
 *    older cuDNN refuses such a plan here, before asking it.
 * Taken here: bf16, head dimensions that are multiples of 8 up to 128, views on 16-byte
 * boundaries; anything else runs on attention.cu's kernels as without cuDNN. Where cuDNN
 * is missing, or a plan is refused (no engine for the shape on this device, an older
 * cuDNN), one line says so, naming the shape, and the instance goes on with the flash
 * kernels. FTK_CUDNN_STRICT=1, read once when the instance opens cuDNN and kept for its
 * life, makes each of these an error instead (recorded, reported by attn_prepare or sync):
 * a run or a benchmark under cuDNN's name never measures the flash kernels.
 *
 * The host emulation (tests/gpu/emu) has no cuDNN: there the instance takes the flash
 * kernels' path, as above. With FTK_EMU_CUDNN=MAJOR.MINOR.PATCH it has a stand-in instead
 * (the end of this file): the version it reports, plans "made" with the workspace Hopper's
 * would ask, refused where FTK_EMU_CUDNN_REFUSE says (fwd, bwd or all), and every call run
 * by the flash kernels; so the host code here (shapes, plans made at the start and when,
 * the workspace and its accounting, strictness, the version guard) runs under the
 * emulator, tests/gpu/cudnn_emu.sh. */
#include "cuda_internal.cuh"

#include <float.h>

#include <array>
#include <vector>

#ifdef __CUDACC__
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <glob.h>
#endif

typedef std::array<int64_t, 4> d4;

/* A graph's shape (the graphs' common inputs: the sequence lengths and ragged offsets, the
 * scale, the masks' -inf, and the score-shaped virtual tensors follow from it). */
struct sdpa_dims {
    int64_t B, H, Hk, S, D;
    d4 sd() const { return d4{B, H, S, S}; }
    d4 ss() const { return d4{H * S * S, S * S, S, 1}; }
    d4 rd() const { return d4{B, H, S, 1}; } /* a value per query row */
    d4 rs() const { return d4{H * S, S, 1, 1}; }
};

/* The tensors' unique ids in the graphs and variant packs; virtual tensors take U_VIRT on. */
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SEQ_Q, U_SEQ_KV, U_OFF_Q, U_OFF_KV, U_SCALE, U_NEGINF1, U_NEGINF2,
    U_NEGINF3, U_ONE, U_DO, U_DQ, U_DK, U_DV, U_SUM, U_VIRT = 100
};

#ifdef __CUDACC__

/* ---- the library ------------------------------------------------------------------------- */

#define DNN_FUNCS(X)                                                                                                \
    X(cudnnGetVersion)                                                                                              \
    X(cudnnGetErrorString)                                                                                          \
    X(cudnnGetLastErrorString)                                                                                      \
    X(cudnnCreate)                                                                                                  \
    X(cudnnDestroy)                                                                                                 \
    X(cudnnSetStream)                                                                                               \
    X(cudnnBackendCreateDescriptor)                                                                                 \
    X(cudnnBackendDestroyDescriptor)                                                                                \
    X(cudnnBackendSetAttribute)                                                                                     \
    X(cudnnBackendGetAttribute)                                                                                     \
    X(cudnnBackendFinalize)                                                                                         \
    X(cudnnBackendExecute)

/* One per process: the functions of the libcudnn.so.9 that opened. */
static struct {
#define X(f) decltype(&::f) f;
    DNN_FUNCS(X)
#undef X
    int tried, ok;
    size_t version;
    char path[400];
    char why[600];
} dnn_lib;

/* Opens path (a file, or a name for the loader); for a file, its folder's sub-libraries
 * first, so that libcudnn.so.9 finds them there whatever the loader's path, and in a wheel
 * (.../nvidia/cudnn/lib/) the NVRTC of the wheels beside it (.../nvidia/<x>/lib/): the
 * fused-attention engines compile their kernels at run time with it, and open it by name. */
static void *dnn_dlopen(const char *path)
{
    const char *slash = strrchr(path, '/'), *wheel = strstr(path, "/nvidia/cudnn/lib/");
    if (wheel) {
        char pat[600];
        snprintf(pat, sizeof pat, "%.*s/nvidia/*/lib/libnvrtc.so.[0-9]*", (int)(wheel - path), path);
        glob_t g;
        if (glob(pat, 0, NULL, &g) == 0) {
            for (size_t j = 0; j < g.gl_pathc; j++)
                if (!strstr(g.gl_pathv[j], "builtins")) /* one NVRTC is enough */
                    if (dlopen(g.gl_pathv[j], RTLD_NOW | RTLD_GLOBAL))
                        break;
            globfree(&g);
        }
    }
    if (slash) {
        static const char *const subs[] = {"libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
                                           "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9"};
        for (const char *s : subs) {
            char p[600];
            snprintf(p, sizeof p, "%.*s/%s", (int)(slash - path), path, s);
            if (access(p, F_OK) == 0)
                dlopen(p, RTLD_NOW | RTLD_GLOBAL); /* a failure shows when libcudnn.so.9 is used */
        }
    }
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

/* 0 with dnn_lib filled, or -1 with dnn_lib.why saying what is missing. */
static int dnn_load(void)
{
    if (dnn_lib.tried)
        return dnn_lib.ok ? 0 : -1;
    dnn_lib.tried = 1;
    void *h = NULL;
    const char *env = getenv("FTK_CUDNN_LIB");
    if (env && *env) {
        if (!(h = dnn_dlopen(env))) {
            const char *e = dlerror();
            snprintf(dnn_lib.why, sizeof dnn_lib.why, "FTK_CUDNN_LIB=%.250s does not load (%.250s)", env, e ? e : "?");
            return -1;
        }
        snprintf(dnn_lib.path, sizeof dnn_lib.path, "%.399s", env);
    }
    if (!h && (h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL)))
        snprintf(dnn_lib.path, sizeof dnn_lib.path, "libcudnn.so.9 (the system's)");
    if (!h) { /* PyTorch's wheel */
        const char *roots[] = {getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX"), getenv("HOME"), "/usr/local", "/usr"};
        const char *tails[] = {"lib/python3*/site-packages", "lib/python3*/site-packages", ".local/lib/python3*/site-packages",
                               "lib/python3*/dist-packages", "lib/python3*/dist-packages"};
        for (int i = 0; i < 5 && !h; i++) {
            if (!roots[i] || !*roots[i])
                continue;
            char pat[700];
            snprintf(pat, sizeof pat, "%s/%s/nvidia/cudnn/lib/libcudnn.so.9", roots[i], tails[i]);
            glob_t g;
            if (glob(pat, 0, NULL, &g) == 0) {
                for (size_t j = 0; j < g.gl_pathc && !h; j++)
                    if ((h = dnn_dlopen(g.gl_pathv[j])))
                        snprintf(dnn_lib.path, sizeof dnn_lib.path, "%.399s", g.gl_pathv[j]);
                globfree(&g);
            }
        }
    }
    if (!h) {
        snprintf(dnn_lib.why, sizeof dnn_lib.why,
                 "libcudnn.so.9 not found (not on the loader's path, not in a PyTorch wheel; FTK_CUDNN_LIB names it)");
        return -1;
    }
#define X(f)                                                                                                        \
    if (!(dnn_lib.f = (decltype(&::f))dlsym(h, #f))) {                                                              \
        snprintf(dnn_lib.why, sizeof dnn_lib.why, "%.400s has no %s (cuDNN older than 9?)", dnn_lib.path, #f);          \
        return -1;                                                                                                  \
    }
    DNN_FUNCS(X)
#undef X
    dnn_lib.version = dnn_lib.cudnnGetVersion();
    if (dnn_lib.version < 90000) {
        snprintf(dnn_lib.why, sizeof dnn_lib.why, "%.400s is cuDNN %zu, older than 9", dnn_lib.path, dnn_lib.version);
        return -1;
    }
    dnn_lib.ok = 1;
    return 0;
}

typedef cudnnBackendDescriptor_t desc_t;

enum { IDX_ALIGN = 64 };

/* Where each array of the sequence table starts (int32 elements), for a graph batch of B. */
static inline int64_t idx_pad(int64_t n) { return (n + IDX_ALIGN - 1) / IDX_ALIGN * IDX_ALIGN; }
static inline int64_t idx_start(int64_t B) { return idx_pad(B); }
static inline int64_t idx_oq(int64_t B) { return idx_start(B) + idx_pad(B + 1); }
static inline int64_t idx_okv(int64_t B) { return idx_oq(B) + idx_pad(B + 1); }
static inline int64_t idx_count(int64_t B) { return idx_okv(B) + idx_pad(B + 1); }



#else /* the host emulation's stand-in (FTK_EMU_CUDNN) */

static struct {
    int tried, ok;
    size_t version;
    char path[64];
    char why[600];
} dnn_lib;

/* 0 with dnn_lib filled where FTK_EMU_CUDNN names a version, else -1 with dnn_lib.why. */
static int dnn_load(void)
{
    if (dnn_lib.tried)
        return dnn_lib.ok ? 0 : -1;
    dnn_lib.tried = 1;
    const char *v = getenv("FTK_EMU_CUDNN");
    unsigned a = 0, b = 0, c = 0;
    if (!v || !*v) {
        snprintf(dnn_lib.why, sizeof dnn_lib.why, "cuDNN is not part of the host emulation");
        return -1;
    }
    if (sscanf(v, "%u.%u.%u", &a, &b, &c) != 3 || a != 9 || b > 99 || c > 99) {
        snprintf(dnn_lib.why, sizeof dnn_lib.why, "FTK_EMU_CUDNN=%.100s: expected a cuDNN 9 version, 9.MINOR.PATCH", v);
        return -1;
    }
    dnn_lib.version = (size_t)a * 10000 + b * 100 + c;
    snprintf(dnn_lib.path, sizeof dnn_lib.path, "the host emulation's stand-in");
    dnn_lib.ok = 1;
    return 0;
}

typedef void *desc_t;

#endif

/* ---- the instance's state ------------------------------------------------------------------ */

/* A finalized execution plan for one shape, and every descriptor it was built from. */
struct dnn_plan {
    int bwd;
    sdpa_dims z;
    desc_t plan;
    std::vector<desc_t> descs;
    int64_t ws; /* the plan's workspace, bytes */
    uint64_t used;
    int prepared; /* made by attn_prepare: never evicted */
};

enum { DNN_PLANS = 32 };

struct dnn_t {
    dnn_plan *plans[DNN_PLANS];
    int n_plans;
    uint64_t tick;
    sdpa_dims prep; /* the bound attn_prepare planned for (B 0: none) */
    int beyond;     /* a call beyond it was warned about */
    int64_t calls, seg_lo, seg_hi; /* calls given a plan, and their segments' range (the summary) */
    void *ws; /* plan workspace | stats [B, H, S] | Σ dO·O [B, H, S] (backward) */
    size_t ws_cap;
#ifdef __CUDACC__
    cudnnHandle_t h;
    /* the sequences on the device, int32: len[B] | start[B + 1] | off_q[B + 1] | off_kv[B + 1],
     * each at a multiple of IDX_ALIGN elements (the tensors say 16-byte aligned), uploaded
     * from pinned idx_host (idx_ev: after that copy) for the segments of the last call
     * (last_seg, with the graph's B and the heads' widths it was made for) */
    int32_t *idx;
    size_t idx_cap;
    int32_t *idx_host;
    size_t idx_host_cap;
    cudaEvent_t idx_ev;
    std::vector<int64_t> last_seg;
    int64_t last_B, last_qw, last_kw;
    /* the by-value scalars, read by cudnnBackendExecute from here */
    float scale, neginf, one;
#endif
};

#ifdef __CUDACC__

static const char *dnn_status(cudnnStatus_t s) { return dnn_lib.cudnnGetErrorString(s); }

/* ---- building graphs ------------------------------------------------------------------------ */


/* Descriptors made, set and finalized in order; the first failure is kept (err) and every
 * later call does nothing, so a graph reads as straight-line code. */
struct gb {
    cudnnHandle_t h;
    std::vector<desc_t> all, ops;
    int64_t next_uid = U_VIRT;
    char err[400] = "";

    void fail(cudnnStatus_t s, const char *what)
    {
        if (err[0])
            return;
        char last[256] = "";
        dnn_lib.cudnnGetLastErrorString(last, sizeof last);
        snprintf(err, sizeof err, "%s: %s%s%.200s", what, dnn_status(s), last[0] ? ": " : "", last);
    }
    desc_t make(cudnnBackendDescriptorType_t t, const char *what)
    {
        if (err[0])
            return NULL;
        desc_t d = NULL;
        cudnnStatus_t s = dnn_lib.cudnnBackendCreateDescriptor(t, &d);
        if (s != CUDNN_STATUS_SUCCESS) {
            fail(s, what);
            return NULL;
        }
        all.push_back(d);
        return d;
    }
    void set(desc_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void *v,
             const char *what)
    {
        if (err[0])
            return;
        cudnnStatus_t s = dnn_lib.cudnnBackendSetAttribute(d, a, t, n, v);
        if (s != CUDNN_STATUS_SUCCESS)
            fail(s, what);
    }
    void setd(desc_t d, cudnnBackendAttributeName_t a, desc_t v, const char *what)
    {
        set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
    }
    void fin(desc_t d, const char *what)
    {
        if (err[0])
            return;
        cudnnStatus_t s = dnn_lib.cudnnBackendFinalize(d);
        if (s != CUDNN_STATUS_SUCCESS)
            fail(s, what);
    }

    desc_t tensor(int64_t uid, cudnnDataType_t dt, d4 dim, d4 str, bool virt, desc_t ragged = NULL,
                  bool by_value = false)
    {
        const char *w = "tensor";
        desc_t d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, w);
        int64_t align = 16;
        set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, w);
        set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.data(), w);
        set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str.data(), w);
        set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, w);
        set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, w);
        if (virt)
            set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, w);
        if (by_value)
            set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, w);
        if (ragged)
            setd(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, ragged, "tensor (ragged offset)");
        fin(d, w);
        return d;
    }
    desc_t virt(cudnnDataType_t dt, d4 dim, d4 str) { return tensor(next_uid++, dt, dim, str, true); }
    desc_t scalar(int64_t uid, cudnnDataType_t dt)
    {
        return tensor(uid, dt, d4{1, 1, 1, 1}, d4{1, 1, 1, 1}, false, NULL, true);
    }

    /* y = mode(x[, b[, t]]), computed in comp */
    void pw(cudnnPointwiseMode_t mode, desc_t x, desc_t b, desc_t t, desc_t y, cudnnDataType_t comp = CUDNN_DATA_FLOAT,
            int64_t axis = -1)
    {
        const char *w = "pointwise";
        desc_t p = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, w);
        set(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, w);
        set(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &comp, w);
        if (axis >= 0)
            set(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, w);
        fin(p, w);
        desc_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, w);
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p, w);
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, w);
        if (b)
            setd(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, w);
        if (t)
            setd(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, w);
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, w);
        fin(op, w);
        ops.push_back(op);
    }
    /* c = a·b, batched over the first two dimensions; m, n, k: the per-sequence sizes */
    void mm(desc_t a, desc_t b, desc_t c, desc_t m, desc_t n, desc_t k, bool pad0 = false)
    {
        const char *w = "matmul";
        desc_t d = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, w);
        cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        set(d, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, w);
        if (pad0) {
            double zero = 0;
            set(d, CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &zero, w);
        }
        fin(d, w);
        desc_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, w);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, w);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, w);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, w);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, d, w);
        if (m)
            setd(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m, w);
        if (n)
            setd(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n, w);
        if (k)
            setd(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k, w);
        fin(op, w);
        ops.push_back(op);
    }
    void red(cudnnReduceTensorOp_t mode, desc_t x, desc_t y)
    {
        const char *w = "reduction";
        desc_t d = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, w);
        cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        set(d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, w);
        set(d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, w);
        fin(d, w);
        desc_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, w);
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, d, w);
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, w);
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, w);
        fin(op, w);
        ops.push_back(op);
    }
    void reshape(desc_t x, desc_t y)
    {
        const char *w = "reshape";
        desc_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, w);
        setd(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, w);
        setd(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, w);
        fin(op, w);
        ops.push_back(op);
    }
};

/* score with the padding mask (rows and columns past the sequence's length: -inf) */
static desc_t padding_mask(gb &g, const sdpa_dims &z, desc_t x, desc_t seq_q, desc_t seq_kv, desc_t neginf)
{
    desc_t ri = g.virt(CUDNN_DATA_INT32, z.sd(), z.ss()), ci = g.virt(CUDNN_DATA_INT32, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, ri, CUDNN_DATA_INT32, 2);
    g.pw(CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, ci, CUDNN_DATA_INT32, 3);
    desc_t rm = g.virt(CUDNN_DATA_BOOLEAN, z.sd(), z.ss()), cm = g.virt(CUDNN_DATA_BOOLEAN, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_CMP_LT, ri, seq_q, NULL, rm, CUDNN_DATA_BOOLEAN);
    g.pw(CUDNN_POINTWISE_CMP_LT, ci, seq_kv, NULL, cm, CUDNN_DATA_BOOLEAN);
    desc_t m = g.virt(CUDNN_DATA_BOOLEAN, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_LOGICAL_AND, rm, cm, NULL, m, CUDNN_DATA_BOOLEAN);
    desc_t y = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_BINARY_SELECT, x, neginf, m, y);
    return y;
}

/* score with the top-left causal mask (column past the row: -inf), the frontend's
 * diagonal band with right bound 0 */
static desc_t causal_mask(gb &g, const sdpa_dims &z, desc_t x, desc_t neginf)
{
    desc_t ri = g.virt(CUDNN_DATA_INT32, z.sd(), z.ss()), ci = g.virt(CUDNN_DATA_INT32, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, ri, CUDNN_DATA_FLOAT, 2);
    g.pw(CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, ci, CUDNN_DATA_FLOAT, 3);
    desc_t m = g.virt(CUDNN_DATA_BOOLEAN, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_CMP_GE, ri, ci, NULL, m, CUDNN_DATA_BOOLEAN);
    desc_t y = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_BINARY_SELECT, x, neginf, m, y);
    return y;
}

/* The graph's ops into an operation graph, the heuristic's engine configurations tried in
 * order (the backward's: deterministic ones only) until one makes a plan. */
static int make_plan(gb &g, dnn_plan *p, int deterministic)
{
    const char *w = "operation graph";
    desc_t og = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, w);
    g.set(og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g.h, w);
    g.set(og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops.size(), g.ops.data(), w);
    g.fin(og, w);
    w = "heuristics";
    desc_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, w);
    g.setd(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og, w);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, w);
    g.fin(heur, w);
    if (g.err[0])
        return -1;
    int64_t n_cfg = 0;
    cudnnStatus_t s = dnn_lib.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n_cfg, NULL);
    if (s != CUDNN_STATUS_SUCCESS) {
        g.fail(s, w);
        return -1;
    }
    if (n_cfg <= 0) {
        snprintf(g.err, sizeof g.err, "no engine takes the attention graph on this device");
        return -1;
    }
    std::vector<desc_t> cfg((size_t)n_cfg);
    for (auto &d : cfg)
        d = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, w);
    if (g.err[0])
        return -1;
    int64_t got = 0;
    s = dnn_lib.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_cfg,
                                         &got, cfg.data());
    if (s != CUDNN_STATUS_SUCCESS) {
        g.fail(s, w);
        return -1;
    }
    char last[300] = "no engine configuration finalizes";
    for (int64_t i = 0; i < got; i++) {
        if (deterministic) {
            desc_t eng = NULL;
            if (dnn_lib.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS)
                continue;
            g.all.push_back(eng);
            int64_t n_eng = 0, n_note = 0;
            cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
            int nondet = 1;
            if (dnn_lib.cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                                 &n_eng, &eng) == CUDNN_STATUS_SUCCESS &&
                dnn_lib.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n_note,
                                                 notes) == CUDNN_STATUS_SUCCESS) {
                nondet = 0;
                for (int64_t j = 0; j < n_note; j++)
                    nondet |= notes[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
            }
            if (nondet) {
                snprintf(last, sizeof last, "no deterministic engine for the backward");
                continue;
            }
        }
        desc_t plan = NULL;
        if (dnn_lib.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
            CUDNN_STATUS_SUCCESS)
            continue;
        g.all.push_back(plan);
        if ((s = dnn_lib.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                                  &g.h)) != CUDNN_STATUS_SUCCESS ||
            (s = dnn_lib.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i])) !=
                CUDNN_STATUS_SUCCESS ||
            (s = dnn_lib.cudnnBackendFinalize(plan)) != CUDNN_STATUS_SUCCESS) {
            char m[256] = "";
            dnn_lib.cudnnGetLastErrorString(m, sizeof m);
            snprintf(last, sizeof last, "execution plan: %s%s%.200s", dnn_status(s), m[0] ? ": " : "", m);
            continue;
        }
        int64_t ws = 0, n_ws = 0;
        if (dnn_lib.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                             &n_ws, &ws) != CUDNN_STATUS_SUCCESS)
            continue;
        p->plan = plan;
        p->ws = ws;
        return 0;
    }
    snprintf(g.err, sizeof g.err, "%s", last);
    return -1;
}

/* The forward: O = softmax(scale·Q·Kᵀ, padded, causal)·V and Stats = max + log Σexp. */
static void fwd_graph(gb &g, const sdpa_dims &z)
{
    int64_t B = z.B, H = z.H, Hk = z.Hk, S = z.S, D = z.D;
    desc_t off_q = g.tensor(U_OFF_Q, CUDNN_DATA_INT32, d4{B + 1, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    desc_t off_kv = g.tensor(U_OFF_KV, CUDNN_DATA_INT32, d4{B + 1, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    desc_t seq_q = g.tensor(U_SEQ_Q, CUDNN_DATA_INT32, d4{B, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    desc_t seq_kv = g.tensor(U_SEQ_KV, CUDNN_DATA_INT32, d4{B, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    desc_t q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, d4{B, H, S, D}, d4{S * H * D, D, H * D, 1}, false, off_q);
    desc_t kt = g.tensor(U_K, CUDNN_DATA_BFLOAT16, d4{B, Hk, D, S}, d4{S * Hk * D, D, 1, Hk * D}, false, off_kv);
    desc_t v = g.tensor(U_V, CUDNN_DATA_BFLOAT16, d4{B, Hk, S, D}, d4{S * Hk * D, D, Hk * D, 1}, false, off_kv);
    desc_t o = g.tensor(U_O, CUDNN_DATA_BFLOAT16, d4{B, H, S, D}, d4{S * H * D, D, H * D, 1}, false, off_q);
    desc_t stats = g.tensor(U_STATS, CUDNN_DATA_FLOAT, z.rd(), z.rs(), false);
    desc_t scale = g.scalar(U_SCALE, CUDNN_DATA_FLOAT);
    desc_t ninf1 = g.scalar(U_NEGINF1, CUDNN_DATA_FLOAT), ninf2 = g.scalar(U_NEGINF2, CUDNN_DATA_FLOAT);

    desc_t s1 = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.mm(q, kt, s1, seq_q, seq_kv, NULL, true);
    desc_t s2 = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_MUL, s1, scale, NULL, s2);
    desc_t s3 = padding_mask(g, z, s2, seq_q, seq_kv, ninf1);
    desc_t s4 = causal_mask(g, z, s3, ninf2);
    /* softmax, keeping its statistics */
    desc_t mx = g.virt(CUDNN_DATA_FLOAT, z.rd(), z.rs());
    g.red(CUDNN_REDUCE_TENSOR_MAX, s4, mx);
    desc_t sub = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_SUB, s4, mx, NULL, sub);
    desc_t ex = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_EXP, sub, NULL, NULL, ex);
    desc_t sum = g.virt(CUDNN_DATA_FLOAT, z.rd(), z.rs());
    g.red(CUDNN_REDUCE_TENSOR_ADD, ex, sum);
    desc_t lg = g.virt(CUDNN_DATA_FLOAT, z.rd(), z.rs());
    g.pw(CUDNN_POINTWISE_LOG, sum, NULL, NULL, lg);
    g.pw(CUDNN_POINTWISE_ADD, mx, lg, NULL, stats);
    desc_t p = g.virt(CUDNN_DATA_BFLOAT16, z.sd(), z.ss()); /* the second product's operand type */
    g.pw(CUDNN_POINTWISE_DIV, ex, sum, NULL, p);
    g.mm(p, v, o, seq_q, NULL, seq_kv);
}

/* The backward: dQ, dK, dV from dO, Q, K, V, O and the forward's Stats. */
static void bwd_graph(gb &g, const sdpa_dims &z)
{
    int64_t B = z.B, H = z.H, Hk = z.Hk, S = z.S, D = z.D;
    desc_t off_q = g.tensor(U_OFF_Q, CUDNN_DATA_INT32, d4{B + 1, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    desc_t off_kv = g.tensor(U_OFF_KV, CUDNN_DATA_INT32, d4{B + 1, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    desc_t seq_q = g.tensor(U_SEQ_Q, CUDNN_DATA_INT32, d4{B, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    desc_t seq_kv = g.tensor(U_SEQ_KV, CUDNN_DATA_INT32, d4{B, 1, 1, 1}, d4{1, 1, 1, 1}, false);
    d4 qd{B, H, S, D}, qs{S * H * D, D, H * D, 1}, kd{B, Hk, S, D}, ks{S * Hk * D, D, Hk * D, 1};
    d4 ktd{B, Hk, D, S}, kts{S * Hk * D, D, 1, Hk * D};
    desc_t q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, qd, qs, false, off_q);
    desc_t kt = g.tensor(U_K, CUDNN_DATA_BFLOAT16, ktd, kts, false, off_kv);
    desc_t vt = g.tensor(U_V, CUDNN_DATA_BFLOAT16, ktd, kts, false, off_kv);
    desc_t o = g.tensor(U_O, CUDNN_DATA_BFLOAT16, qd, qs, false, off_q);
    desc_t dO = g.tensor(U_DO, CUDNN_DATA_BFLOAT16, qd, qs, false, off_q);
    desc_t stats = g.tensor(U_STATS, CUDNN_DATA_FLOAT, z.rd(), z.rs(), false);
    desc_t dq = g.tensor(U_DQ, CUDNN_DATA_BFLOAT16, qd, qs, false, off_q);
    desc_t dk = g.tensor(U_DK, CUDNN_DATA_BFLOAT16, kd, ks, false, off_kv);
    desc_t dv = g.tensor(U_DV, CUDNN_DATA_BFLOAT16, kd, ks, false, off_kv);
    desc_t scale = g.scalar(U_SCALE, CUDNN_DATA_FLOAT), one = g.scalar(U_ONE, CUDNN_DATA_FLOAT);
    desc_t ninf1 = g.scalar(U_NEGINF1, CUDNN_DATA_FLOAT), ninf2 = g.scalar(U_NEGINF2, CUDNN_DATA_FLOAT);
    desc_t sum = g.tensor(U_SUM, CUDNN_DATA_FLOAT, z.rd(), z.rs(), false); /* in the workspace */

    /* Σ dO·O per query row */
    desc_t a = g.virt(CUDNN_DATA_FLOAT, qd, d4{H * S * D, S * D, H * D, 1});
    g.pw(CUDNN_POINTWISE_MUL, dO, o, NULL, a);
    desc_t r = g.virt(CUDNN_DATA_FLOAT, z.rd(), z.rs());
    g.red(CUDNN_REDUCE_TENSOR_ADD, a, r);
    g.pw(CUDNN_POINTWISE_MUL, r, one, NULL, sum);
    /* P = exp(masked scale·Q·Kᵀ − Stats) */
    desc_t s1 = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.mm(q, kt, s1, seq_q, seq_kv, NULL);
    desc_t s2 = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_MUL, s1, scale, NULL, s2);
    desc_t s3 = padding_mask(g, z, s2, seq_q, seq_kv, ninf1);
    desc_t s4 = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_SUB, s3, stats, NULL, s4);
    if (dnn_lib.version < 91000) /* the frontend masks padding a second time there */
        s4 = padding_mask(g, z, s4, seq_q, seq_kv, g.scalar(U_NEGINF3, CUDNN_DATA_FLOAT));
    desc_t s5 = causal_mask(g, z, s4, ninf2);
    desc_t e = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_EXP, s5, NULL, NULL, e);
    d4 td{B, H, S, S}, ts{H * S * S, S * S, 1, S}; /* a score matrix transposed */
    desc_t pt = g.virt(CUDNN_DATA_BFLOAT16, td, ts);
    g.reshape(e, pt);
    /* dV = Pᵀ·dO, summed over a group's query heads */
    if (H == Hk) {
        g.mm(pt, dO, dv, seq_kv, NULL, seq_q);
    } else {
        desc_t full = g.virt(CUDNN_DATA_BFLOAT16, qd, d4{H * S * D, S * D, D, 1});
        g.mm(pt, dO, full, seq_kv, NULL, seq_q);
        g.red(CUDNN_REDUCE_TENSOR_ADD, full, dv);
    }
    /* dS = scale · P ∘ (dO·Vᵀ − Σ dO·O) */
    desc_t dp = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.mm(dO, vt, dp, seq_q, seq_kv, NULL);
    desc_t t1 = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_SUB, dp, sum, NULL, t1);
    desc_t t2 = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_MUL, t1, e, NULL, t2);
    desc_t ds = g.virt(CUDNN_DATA_FLOAT, z.sd(), z.ss());
    g.pw(CUDNN_POINTWISE_MUL, t2, scale, NULL, ds);
    desc_t dst = g.virt(CUDNN_DATA_BFLOAT16, td, ts);
    g.reshape(ds, dst);
    /* dK = dSᵀ·Q, summed over a group's query heads */
    if (H == Hk) {
        g.mm(dst, q, dk, seq_kv, NULL, seq_q);
    } else {
        desc_t full = g.virt(CUDNN_DATA_BFLOAT16, qd, d4{H * S * D, S * D, D, 1});
        g.mm(dst, q, full, seq_kv, NULL, seq_q);
        g.red(CUDNN_REDUCE_TENSOR_ADD, full, dk);
    }
    /* dQ = dS·K, written by the product itself (no accumulator: deterministic) */
    desc_t kr = g.tensor(g.next_uid++, CUDNN_DATA_BFLOAT16, kd, ks, true, off_kv);
    g.reshape(kt, kr);
    g.mm(ds, kr, dq, seq_q, NULL, seq_kv);
}

/* ---- the engine: plans, execution --------------------------------------------------------- */

/* The graph of z made into p (its plan and workspace); -1 with err set when refused. */
static int eng_plan(dnn_t *d, int bwd, const sdpa_dims &z, dnn_plan *p, char *err, size_t n)
{
    gb g;
    g.h = d->h;
    if (bwd)
        bwd_graph(g, z);
    else
        fwd_graph(g, z);
    int rc = g.err[0] ? -1 : make_plan(g, p, bwd);
    p->descs = g.all;
    if (rc < 0)
        snprintf(err, n, "%s", g.err);
    return rc;
}

static void eng_plan_free(dnn_plan *p)
{
    for (desc_t d : p->descs)
        dnn_lib.cudnnBackendDestroyDescriptor(d);
}

/* The sequences' table on the device for seg, padded to B sequences; after scratch_claim. */
static const int32_t *upload_idx(cuda_t *c, const int64_t *seg, int64_t n_seg, int64_t B, int64_t qw, int64_t kw)
{
    dnn_t *d = c->dnn;
    if (d->last_B == B && d->last_qw == qw && d->last_kw == kw && (int64_t)d->last_seg.size() == n_seg + 1 &&
        !memcmp(d->last_seg.data(), seg, (size_t)(n_seg + 1) * sizeof *seg))
        return d->idx;
    d->last_B = -1;
    size_t bytes = (size_t)idx_count(B) * sizeof(int32_t);
    /* idx_host is the source of the last upload, which may not have run yet */
    if (ck(c, host_wait(c, NULL, d->idx_ev), "cuDNN attention: sequences") < 0)
        return NULL;
    if (bytes > d->idx_host_cap) {
        cudaFreeHost(d->idx_host);
        d->idx_host = NULL;
        d->idx_host_cap = 0;
        if (ck(c, cudaMallocHost((void **)&d->idx_host, bytes), "cuDNN attention: sequences (pinned memory)") < 0)
            return NULL;
        d->idx_host_cap = bytes;
    }
    if (!scratch(c, (void **)&d->idx, &d->idx_cap, bytes, "cuDNN attention: sequences"))
        return NULL;
    int32_t *len = d->idx_host, *start = len + idx_start(B), *oq = len + idx_oq(B), *okv = len + idx_okv(B);
    int64_t n = seg[n_seg];
    for (int64_t b = 0; b <= B; b++) {
        int64_t s0 = b < n_seg ? seg[b] : n;
        if (b < B)
            len[b] = (int32_t)(b < n_seg ? seg[b + 1] - seg[b] : 0);
        start[b] = (int32_t)s0;
        oq[b] = (int32_t)(s0 * qw);
        okv[b] = (int32_t)(s0 * kw);
    }
    if (ck(c, cudaMemcpyAsync(d->idx, d->idx_host, bytes, cudaMemcpyHostToDevice, c->cur),
           "cuDNN attention: sequences") < 0 ||
        ck(c, cudaEventRecord(d->idx_ev, c->cur), "cuDNN attention: sequences") < 0)
        return NULL;
    d->last_seg.assign(seg, seg + n_seg + 1);
    d->last_B = B, d->last_qw = qw, d->last_kw = kw;
    return d->idx;
}

/* lse[start[b] + s, h] <-> stats[b, h, s] (padded; to_lse: stats into lse; else lse into
 * stats, the padding zeroed) */
__global__ void dnn_stats_kernel(float *lse, float *stats, const int32_t *len, const int32_t *start, int64_t B,
                                 int64_t H, int64_t S, int to_lse)
{
    GRID_STRIDE(e, B * H * S)
    {
        int64_t s = e % S, bh = e / S, h = bh % H, b = bh / H;
        if (s >= len[b]) {
            if (!to_lse)
                stats[e] = 0;
            continue;
        }
        int64_t i = ((int64_t)start[b] + s) * H + h;
        if (to_lse)
            lse[i] = stats[e];
        else
            stats[e] = lse[i];
    }
}


/* Queues plan p on the sequences of seg (z: p's shape; w: its workspace, stats and sums
 * after it); 0, or -1 after an error kept in c. */
static int eng_run(cuda_t *c, int bwd, dnn_plan *p, const sdpa_dims &z, const int64_t *seg, int64_t n_seg,
                   int n_head, int n_kv, int hd, float *lse, std::initializer_list<std::pair<int64_t, void *>> bufs,
                   char *w, float *stats, float *sum)
{
    dnn_t *d = c->dnn;
    const int32_t *idx = upload_idx(c, seg, n_seg, z.B, (int64_t)n_head * hd, (int64_t)n_kv * hd);
    if (!idx)
        return -1;
    const int32_t *len = idx, *start = idx + idx_start(z.B), *oq = idx + idx_oq(z.B), *okv = idx + idx_okv(z.B);
    unsigned blocks = blocks_for(z.B * z.H * z.S, 256);
    if (bwd) {
        dnn_stats_kernel<<<blocks, 256, 0, c->cur>>>(lse, stats, len, start, z.B, z.H, z.S, 0);
        if (ck(c, last_error(), "cuDNN attention: stats") < 0)
            return -1;
    }
    d->scale = 1.0f / sqrtf((float)hd);
    d->neginf = dnn_lib.version < 91000 ? -FLT_MAX : -INFINITY;
    d->one = 1.0f;
    std::vector<int64_t> uids;
    std::vector<void *> ptrs;
    auto put = [&](int64_t u, const void *v) {
        uids.push_back(u);
        ptrs.push_back((void *)v);
    };
    for (auto &b : bufs)
        put(b.first, b.second);
    put(U_STATS, stats);
    put(U_SEQ_Q, len);
    put(U_SEQ_KV, len);
    put(U_OFF_Q, oq);
    put(U_OFF_KV, okv);
    put(U_SCALE, &d->scale);
    put(U_NEGINF1, &d->neginf);
    put(U_NEGINF2, &d->neginf);
    if (bwd) {
        put(U_ONE, &d->one);
        put(U_SUM, sum);
        if (dnn_lib.version < 91000)
            put(U_NEGINF3, &d->neginf);
    }
    desc_t vp = NULL;
    cudnnStatus_t s = dnn_lib.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    void *wsp = p->ws ? (void *)w : NULL;
    if (s == CUDNN_STATUS_SUCCESS &&
        (s = dnn_lib.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                              (int64_t)uids.size(), uids.data())) == CUDNN_STATUS_SUCCESS &&
        (s = dnn_lib.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                              (int64_t)ptrs.size(), ptrs.data())) == CUDNN_STATUS_SUCCESS &&
        (s = dnn_lib.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                              &wsp)) == CUDNN_STATUS_SUCCESS &&
        (s = dnn_lib.cudnnBackendFinalize(vp)) == CUDNN_STATUS_SUCCESS &&
        (s = dnn_lib.cudnnSetStream(d->h, c->cur)) == CUDNN_STATUS_SUCCESS)
        s = dnn_lib.cudnnBackendExecute(d->h, p->plan, vp);
    if (vp)
        dnn_lib.cudnnBackendDestroyDescriptor(vp);
    if (s != CUDNN_STATUS_SUCCESS) {
        char m[256] = "";
        dnn_lib.cudnnGetLastErrorString(m, sizeof m);
        char b[400];
        snprintf(b, sizeof b, "%s%s%.200s", dnn_status(s), m[0] ? ": " : "", m);
        note_err(c, bwd ? "attn_bwd (cuDNN)" : "attn_fwd (cuDNN)", b);
        return -1;
    }
    if (!bwd) {
        dnn_stats_kernel<<<blocks, 256, 0, c->cur>>>(lse, stats, len, start, z.B, z.H, z.S, 1);
        if (ck(c, last_error(), "cuDNN attention: stats") < 0)
            return -1;
    }
    return 0;
}

/* cuDNN's handle and the sequences' event; -1 with why set. */
static int eng_open(dnn_t *d, char *why, size_t n)
{
    d->last_B = -1;
    cudnnStatus_t s = dnn_lib.cudnnCreate(&d->h);
    if (s != CUDNN_STATUS_SUCCESS || cudaEventCreateWithFlags(&d->idx_ev, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, n, "%.400s: cudnnCreate: %.100s", dnn_lib.path,
                 s != CUDNN_STATUS_SUCCESS ? dnn_status(s) : "event");
        if (s == CUDNN_STATUS_SUCCESS)
            dnn_lib.cudnnDestroy(d->h);
        return -1;
    }
    return 0;
}

static void eng_close(dnn_t *d)
{
    if (d->idx_host)
        cudaFreeHost(d->idx_host);
    if (d->idx_ev)
        cudaEventDestroy(d->idx_ev);
    dnn_lib.cudnnDestroy(d->h);
}

#else /* the host emulation's stand-in */

/* A plan "made" for z: refused where FTK_EMU_CUDNN_REFUSE says (fwd, bwd, all), else with
 * the workspace Hopper's deterministic backward asks (the forward's: none). */
static int eng_plan(dnn_t *, int bwd, const sdpa_dims &z, dnn_plan *p, char *err, size_t n)
{
    const char *r = getenv("FTK_EMU_CUDNN_REFUSE");
    if (r && (!strcmp(r, "all") || !strcmp(r, bwd ? "bwd" : "fwd"))) {
        snprintf(err, n, "no engine takes the attention graph on this device (FTK_EMU_CUDNN_REFUSE=%s)", r);
        return -1;
    }
    p->plan = NULL;
    p->ws = bwd ? bk_cudnn_hopper_bwd_ws(z.B, z.S, (int)z.H) : 0;
    return 0;
}
static void eng_plan_free(dnn_plan *) {}
/* the flash kernels run every call (1: not taken) */
static int eng_run(cuda_t *, int, dnn_plan *, const sdpa_dims &, const int64_t *, int64_t, int, int, int, float *,
                   std::initializer_list<std::pair<int64_t, void *>>, char *, float *, float *)
{
    return 1;
}
static int eng_open(dnn_t *, char *, size_t) { return 0; }
static void eng_close(dnn_t *) {}

#endif

/* ---- what both share: which plans, when, and what a refusal does ---------------------------- */

static void plan_free(dnn_plan *p)
{
    eng_plan_free(p);
    delete p;
}

static int64_t pow2_at_least(int64_t x, int64_t lo)
{
    int64_t p = lo;
    while (p < x)
        p *= 2;
    return p;
}

/* Gives up on cuDNN for this instance: one line, then the flash kernels; with
 * FTK_CUDNN_STRICT=1, as latched by dnn_open (the GPU tests and benchmarks: a fallback would
 * pass or be timed unseen), an error instead. */
static void give_up(cuda_t *c, const char *why)
{
    if (c->dnn_strict) {
        char b[440]; /* c->err's room after its prefix; the shape comes first */
        snprintf(b, sizeof b, "%.430s", why);
        note_err(c, "FTK_CUDA_ATTN=cudnn (FTK_CUDNN_STRICT=1)", b);
        return;
    }
    ftk_warn("FTK_CUDA_ATTN=cudnn: %s; attention runs on the flash kernels", why);
    c->attn = ATTN_FLASH;
}

/* The plan for a shape: kept, or made (NULL with why naming the shape when refused). */
static dnn_plan *plan_for(cuda_t *c, int bwd, const sdpa_dims &z, int prepared, char *why, size_t why_n)
{
    dnn_t *d = c->dnn;
    for (int i = 0; i < d->n_plans; i++) {
        dnn_plan *p = d->plans[i];
        if (p->bwd == bwd && p->z.B == z.B && p->z.S == z.S && p->z.H == z.H && p->z.Hk == z.Hk && p->z.D == z.D) {
            p->used = ++d->tick;
            p->prepared |= prepared;
            return p;
        }
    }
    char shape[200], err[500] = "";
    snprintf(shape, sizeof shape, "the %s plan for B %lld, S %lld, %lld heads, %lld kv heads, head dim %lld",
             bwd ? "backward" : "forward", (long long)z.B, (long long)z.S, (long long)z.H, (long long)z.Hk,
             (long long)z.D);
    dnn_plan *p = new dnn_plan();
    p->bwd = bwd, p->z = z, p->prepared = prepared;
    int rc;
    if (z.Hk != z.H && dnn_lib.version < 90600) {
        snprintf(err, sizeof err,
                 "cuDNN %zu.%zu.%zu takes ragged offsets with grouped-query heads from 9.6 on (%s is older)",
                 dnn_lib.version / 10000, dnn_lib.version / 100 % 100, dnn_lib.version % 100, dnn_lib.path);
        rc = -1;
    } else {
        rc = eng_plan(d, bwd, z, p, err, sizeof err);
    }
    if (rc < 0) {
        snprintf(why, why_n, "cuDNN refuses %s: %s", shape, err);
        plan_free(p);
        return NULL;
    }
    ftk_info("attention: cuDNN made %s (workspace %.1f MB)%s", shape, (double)p->ws / 1e6,
             prepared ? "" : ", on first use");
    if (d->n_plans == DNN_PLANS) { /* the least recently used goes: its launches are queued already */
        int lru = -1;
        for (int i = 0; i < d->n_plans; i++)
            if (!d->plans[i]->prepared && (lru < 0 || d->plans[i]->used < d->plans[lru]->used))
                lru = i;
        plan_free(d->plans[lru]); /* at most 2 of DNN_PLANS are prepared */
        d->plans[lru] = d->plans[--d->n_plans];
    }
    p->used = ++d->tick;
    d->plans[d->n_plans++] = p;
    return p;
}

/* Shape, plan, workspace; 0 when the call was queued, 1 when not taken here (the caller's
 * kernels run it), -1 after an error kept in c. */
static int dnn_run(cuda_t *c, int bwd, const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd, float *lse,
                   std::initializer_list<std::pair<int64_t, void *>> bufs)
{
    dnn_t *d = c->dnn;
    if (hd % 8 || hd > 128) /* the head dimensions every cuDNN 9 takes */
        return 1;
    for (auto &b : bufs)
        if ((uintptr_t)b.second % 16)
            return 1;
    int64_t smax = 0;
    for (int64_t s = 0; s < n_seg; s++)
        smax = seg[s + 1] - seg[s] > smax ? seg[s + 1] - seg[s] : smax;
    if (seg[n_seg] * (int64_t)n_head * hd >= ((int64_t)1 << 31))
        return 1; /* ragged offsets past int32 */
    const sdpa_dims &b = d->prep;
    int in_bound = b.B && n_seg <= b.B && smax <= b.S && b.H == n_head && b.Hk == n_kv && b.D == hd;
    sdpa_dims z = in_bound ? b : sdpa_dims{pow2_at_least(n_seg, 1), n_head, n_kv, pow2_at_least(smax, 64), hd};
    if (b.B && !in_bound && !d->beyond) {
        d->beyond = 1;
        ftk_warn("FTK_CUDA_ATTN=cudnn: a micro-batch of %lld segments, the longest %lld tokens (%d/%d heads of %d), "
                 "is beyond the %lld x %lld planned at the start: a plan is made for it now",
                 (long long)n_seg, (long long)smax, n_head, n_kv, hd, (long long)b.B, (long long)b.S);
    }
    char why[800];
    dnn_plan *p = plan_for(c, bwd, z, 0, why, sizeof why);
    if (!p) {
        give_up(c, why);
        return failed(c) ? -1 : 1;
    }
    d->seg_lo = d->calls && d->seg_lo < n_seg ? d->seg_lo : n_seg;
    d->seg_hi = d->seg_hi > n_seg ? d->seg_hi : n_seg;
    d->calls++;
    size_t ws = ((size_t)p->ws + 255) & ~(size_t)255, rows = (size_t)(z.B * z.H * z.S) * sizeof(float);
    rows = (rows + 255) & ~(size_t)255;
    char *w = (char *)scratch(c, &d->ws, &d->ws_cap, ws + 2 * rows, "cuDNN attention workspace");
    if (!w)
        return -1;
    return eng_run(c, bwd, p, z, seg, n_seg, n_head, n_kv, hd, lse, bufs, w, (float *)(w + ws),
                   (float *)(w + ws + rows));
}

int cu_attn_prepare(backend_t *be, int64_t max_seg, int64_t max_len, int n_head, int n_kv, int hd, dtype_t dt)
{
    cuda_t *c = enter(be);
    dnn_t *d = c->dnn;
    if (!failed(c) && c->attn == ATTN_CUDNN && d && dt == DT_BF16 && hd % 8 == 0 && hd <= 128 && max_seg > 0 &&
        max_len > 0) {
        sdpa_dims z{max_seg, n_head, n_kv, max_len, hd};
        char why[800];
        dnn_plan *f = plan_for(c, 0, z, 1, why, sizeof why), *b = f ? plan_for(c, 1, z, 1, why, sizeof why) : NULL;
        if (!b) {
            give_up(c, why);
        } else {
            int64_t ws = bk_cudnn_ws_bytes(f->ws > b->ws ? f->ws : b->ws, z.B, z.S, (int)z.H);
            if (scratch(c, &d->ws, &d->ws_cap, (size_t)ws, "cuDNN attention workspace"))
                d->prep = z;
        }
    }
    if (failed(c)) {
        ftk_err_set("%s", c->err);
        return -1;
    }
    return 0;
}

void dnn_open(cuda_t *c)
{
    const char *st = getenv("FTK_CUDNN_STRICT");
    c->dnn_strict = st && !strcmp(st, "1");
    if (dnn_load() < 0) {
        give_up(c, dnn_lib.why);
        return;
    }
    dnn_t *d = new dnn_t();
    char why[600];
    if (eng_open(d, why, sizeof why) < 0) {
        delete d;
        give_up(c, why);
        return;
    }
    c->dnn = d;
    ftk_info("attention: cuDNN %zu.%zu.%zu (%s)", dnn_lib.version / 10000, dnn_lib.version / 100 % 100,
             dnn_lib.version % 100, dnn_lib.path);
}

void dnn_close(cuda_t *c)
{
    dnn_t *d = c->dnn;
    if (!d)
        return;
    if (d->calls)
        ftk_info("attention: cuDNN ran %lld calls of %lld to %lld segments on %d plan%s", (long long)d->calls,
                 (long long)d->seg_lo, (long long)d->seg_hi, d->n_plans, d->n_plans == 1 ? "" : "s");
    for (int i = 0; i < d->n_plans; i++)
        plan_free(d->plans[i]);
    eng_close(d);
    delete d; /* idx and ws are bk_alloc'd: backend_free has freed them */
    c->dnn = NULL;
}

int dnn_attn_fwd(cuda_t *c, bk_buf_t out, float *lse, bk_buf_t q, bk_buf_t k, bk_buf_t v, const int64_t *seg,
                 int64_t n_seg, int n_head, int n_kv, int hd)
{
    if (!c->dnn || q.dt != DT_BF16)
        return 1;
    return dnn_run(c, 0, seg, n_seg, n_head, n_kv, hd, lse, {{U_Q, q.p}, {U_K, k.p}, {U_V, v.p}, {U_O, out.p}});
}

int dnn_attn_bwd(cuda_t *c, bk_buf_t dq, bk_buf_t dk, bk_buf_t dv, bk_buf_t dout, bk_buf_t q, bk_buf_t k, bk_buf_t v,
                 bk_buf_t out, const float *lse, const int64_t *seg, int64_t n_seg, int n_head, int n_kv, int hd)
{
    if (!c->dnn || q.dt != DT_BF16)
        return 1;
    return dnn_run(c, 1, seg, n_seg, n_head, n_kv, hd, (float *)lse,
                   {{U_Q, q.p}, {U_K, k.p}, {U_V, v.p}, {U_O, out.p}, {U_DO, dout.p}, {U_DQ, dq.p}, {U_DK, dk.p},
                    {U_DV, dv.p}});
}
