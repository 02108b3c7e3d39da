/* matmul.cu — the CUDA backend's matrix products, through cuBLASLt (cuda.cu's header says
 * which compute types), with a plan per shape kept in the instance. */
#include "cuda_internal.cuh"

/* Row-major C[M,N] = op(A)·op(B) is column-major Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLAS gets B
 * as its first operand. */

/* C = beta·C of a product with K = 0: beta = 0 overwrites, as BLAS does. */
template <typename T> __global__ void scale_c_kernel(T *y, float a, int64_t n)
{
    GRID_STRIDE(i, n) st(y, i, a == 0.0f ? 0.0f : ld(y, i) * a);
}

void plan_release(plan_t *p)
{
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc)
        cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* Model tensors sit at offsets inside unit vectors, so pointers are not all 256-byte
 * aligned (cuBLASLt's default assumption): the heuristic is told the real alignment. */
static uint32_t align_of(const void *a, const void *b, const void *c)
{
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    uint32_t al = 256;
    while (al > 2 && (x & (al - 1)))
        al >>= 1;
    return al;
}

static cudaDataType_t cuda_type(dtype_t dt) { return dt == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* lda: A's leading dimension, M or K unless a product is cut into row blocks. */
static plan_t *plan_for(cuda_t *c, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int beta0,
                        uint32_t align, dtype_t dab, dtype_t dc)
{
    for (int i = 0; i < c->n_plans; i++) {
        plan_t *p = &c->plans[i];
        if (p->valid && p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda &&
            p->beta0 == beta0 && p->align == align && p->dab == dab && p->dc == dc)
            return p;
    }
    plan_t *p; /* more shapes than a model uses: replace the oldest */
    if (c->n_plans < MAX_PLANS)
        p = &c->plans[c->n_plans++];
    else {
        p = &c->plans[c->evict];
        c->evict = (c->evict + 1) % MAX_PLANS;
    }
    plan_release(p);
    p->ta = ta;
    p->tb = tb;
    p->M = M;
    p->N = N;
    p->K = K;
    p->lda = lda;
    p->beta0 = beta0;
    p->align = align;
    p->dab = dab;
    p->dc = dc;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t ct = dab == DT_BF16 ? CUBLAS_COMPUTE_32F : c->f32_compute;
    cudaDataType_t tab = cuda_type(dab), tc = cuda_type(dc);
    if (ck_lt(c, cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F), "matmul descriptor") < 0 ||
        ck_lt(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA") <
            0 ||
        ck_lt(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB") <
            0 ||
        /* first operand: B, stored [N,K] when tb (ld K) else [K,N] (ld N), column-major view */
        ck_lt(c, cublasLtMatrixLayoutCreate(&p->la, tab, tb ? K : N, tb ? N : K, tb ? K : N), "layout B") < 0 ||
        ck_lt(c, cublasLtMatrixLayoutCreate(&p->lb, tab, ta ? M : K, ta ? K : M, lda), "layout A") < 0 ||
        ck_lt(c, cublasLtMatrixLayoutCreate(&p->lc, tc, N, M, N), "layout C") < 0) {
        plan_release(p);
        return NULL;
    }
    cublasLtMatmulPreference_t pref;
    if (ck_lt(c, cublasLtMatmulPreferenceCreate(&pref), "preference") < 0) {
        plan_release(p);
        return NULL;
    }
    size_t ws_bytes = BK_CUDA_WORKSPACE_BYTES;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
    const cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublasLtMatmulPreferenceSetAttribute(pref, al[i], &align, sizeof align);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (ck_lt(c, s, "algorithm heuristic") < 0) {
        plan_release(p);
        return NULL;
    }
    if (!found) {
        note_err(c, "matmul", "cuBLASLt has no algorithm for this shape");
        plan_release(p);
        return NULL;
    }
    p->algo = h.algo;
    p->valid = 1;
    return p;
}

/* One cuBLASLt call; after scratch_claim (the workspace). */
static void gemm(cuda_t *c, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, float alpha, const void *A,
                 const void *B, float beta, void *C, dtype_t dab, dtype_t dc)
{
    plan_t *p = plan_for(c, ta, tb, M, N, K, lda, beta == 0.0f, align_of(A, B, C), dab, dc);
    if (p)
        ck_lt(c,
              cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc, &p->algo, c->ws,
                             BK_CUDA_WORKSPACE_BYTES, c->cur),
              "matmul");
}

/* c[i] = t[i] + beta·c[i], the bf16 result of an fp32 product made in t. */
template <typename T> __global__ void add_product_kernel(T *c, const float *t, float beta, int64_t n)
{
    GRID_STRIDE(i, n) st(c, i, beta == 0.0f ? t[i] : t[i] + beta * ld(c, i));
}

void cu_matmul(backend_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, bk_buf_t A,
                      bk_buf_t B, float beta, bk_buf_t C)
{
    cuda_t *c = enter(be);
    if (M == 0 || N == 0 || failed(c) || !dt_ok(c, "matmul", A.dt) || !dt_ok(c, "matmul", C.dt))
        return;
    if (A.dt != B.dt) {
        note_err(c, "matmul", "A and B of different dtypes");
        return;
    }
    if (K == 0) { /* cuBLASLt wants k >= 1; C = beta·C */
        on_dt(C.dt,
              [&](auto tc) { scale_c_kernel<<<blocks_for(M * N, 256), 256, 0, c->cur>>>(AS(tc, C), beta, M * N); });
        launched(c, "matmul (k = 0)");
        return;
    }
    scratch_claim(c);
    if (A.dt == DT_BF16 || C.dt == DT_F32) {
        gemm(c, ta, tb, M, N, K, ta ? M : K, alpha, A.p, B.p, beta, C.p, A.dt, C.dt);
        return;
    }
    /* fp32 operands into bf16: cuBLASLt has no such type combination, so the product is
     * made in fp32 rows of scratch (blocks of at most the workspace's size) and added into
     * C, rounded once. */
    int64_t rows = (int64_t)(BK_CUDA_WORKSPACE_BYTES / sizeof(float)) / N;
    rows = rows < 1 ? 1 : rows > M ? M : rows;
    float *t = (float *)tmp_for(c, (size_t)rows * N * sizeof(float));
    if (!t)
        return;
    for (int64_t m0 = 0; m0 < M && !failed(c); m0 += rows) {
        int64_t mr = M - m0 < rows ? M - m0 : rows;
        const float *a = (const float *)A.p + (ta ? m0 : m0 * K);
        gemm(c, ta, tb, mr, N, K, ta ? M : K, alpha, a, B.p, 0.0f, t, DT_F32, DT_F32);
        add_product_kernel<<<blocks_for(mr * N, 256), 256, 0, c->cur>>>((uint16_t *)C.p + m0 * N, t, beta, mr * N);
        launched(c, "matmul (bf16 result)");
    }
}
