/* model.c — the Llama forward and backward passes over the backend ops (model.h). */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"

/* ---- the model ------------------------------------------------------------------------- */

typedef struct {
    bk_buf_t ln1, wq, wk, wv, wo, ln2, wg, wu, wd;
} layer_w_t;

/* What a block's forward pass keeps for its backward pass (activation dtype; rstd and lse
 * fp32). With the fused glu, gu[n, 2F] (gate and up side by side, one product) takes the
 * place of g and u. */
typedef struct {
    bk_buf_t xn1, q, k, v, att, xmid, xn2, g, u, gu, h;
    float *rstd1, *rstd2, *lse;
} acts_t;

struct model {
    backend_t *be;
    model_config_t c;
    precision_dtypes_t dt;
    int64_t D, F, H, KV, hd, V, L, Hq, Hk;
    int training, recompute;
    /* Fused paths (backend.h "Fused ops"), decided once at creation from the backend's
     * optional ops: what is allocated depends on them. */
    int glu, fqkv, addnorm;
    int64_t cap;        /* tokens per call */
    int64_t head_chunk; /* target rows per head chunk */
    ckpt_unit_t *units;
    int n_units;
    model_io_t io;      /* where the units' parameters and gradients live */
    void **w, **g;      /* per unit, when the model owns them (model_new) */
    /* device inputs */
    int32_t *d_ids, *d_pos, *d_tgt_at, *d_tgt;
    float *d_tgt_w;
    double *d_loss; /* Σ weight·loss of the passes since the last model_loss_take() */
    double *own_loss; /* the model's own accumulator (d_loss unless model_set_loss_acc) */
    /* activations */
    bk_buf_t *x; /* L+1 block inputs (x[L]: the last block's output) */
    acts_t *a;   /* L of them, or 1 shared when recomputing */
    bk_buf_t xnf, xc, dxc, dxnf, dlog;
    float *rstdf, *logits; /* fp32 logits of a head chunk; dlog: their gradient in the activation dtype */
    bk_buf_t dx, dxn, dh, dg, du, dgu, datt, dq, dk, dv, trash;
    bk_buf_t qkv; /* fused qkv_rope: the [n, Hq + 2·Hk] product, and its gradient in the backward */
    void **allocs;
    size_t n_allocs, cap_allocs;
};

static void *m_alloc(model_t *m, int64_t n, dtype_t dt, bk_mem_class_t cls, const char *what)
{
    if (m->n_allocs == m->cap_allocs) {
        size_t c = m->cap_allocs ? 2 * m->cap_allocs : 64;
        void **p = realloc(m->allocs, c * sizeof *p);
        if (!p) {
            ftk_err_set("out of memory");
            return NULL;
        }
        m->allocs = p;
        m->cap_allocs = c;
    }
    void *p = bk_alloc(m->be, (size_t)(n > 0 ? n : 1) * dtype_size(dt), cls, what);
    if (p)
        m->allocs[m->n_allocs++] = p;
    return p;
}
/* An activation buffer of n elements. */
static int act_alloc(model_t *m, bk_buf_t *b, int64_t n, bk_mem_class_t cls, const char *what)
{
    b->dt = m->dt.act;
    return (b->p = m_alloc(m, n, b->dt, cls, what)) ? 0 : -1;
}

backend_t *model_backend(const model_t *m) { return m->be; }
precision_dtypes_t model_dtypes(const model_t *m) { return m->dt; }

const ckpt_unit_t *model_units(const model_t *m, int *n_units)
{
    *n_units = m->n_units;
    return m->units;
}
bk_buf_t model_unit_param(model_t *m, int u) { return bk_buf(m->w ? m->w[u] : NULL, m->dt.compute); }
bk_buf_t model_unit_grad(model_t *m, int u) { return bk_buf(m->g ? m->g[u] : NULL, m->dt.grad); }

static int find_tensor(const model_t *m, const char *name, int *unit, int *t)
{
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_tensors; i++)
            if (!strcmp(m->units[u].t[i].name, name)) {
                *unit = u;
                *t = i;
                return 0;
            }
    return -1;
}

/* A block's tensors inside its unit vector (unit 1 + l) of dtype dt. */
static layer_w_t layer_view(const model_t *m, void *base, dtype_t dt, int64_t l)
{
    const ckpt_tensor_t *t = m->units[1 + l].t;
    bk_buf_t b = bk_buf(base, dt);
    layer_w_t w = {bk_at(b, t[0].offset), bk_at(b, t[1].offset), bk_at(b, t[2].offset),
                   bk_at(b, t[3].offset), bk_at(b, t[4].offset), bk_at(b, t[5].offset),
                   bk_at(b, t[6].offset), bk_at(b, t[7].offset), bk_at(b, t[8].offset)};
    return w;
}

/* The final norm and the head matrix: in the head unit, or the embedding when tied. */
static void head_view(const model_t *m, void *hbase, void *ebase, dtype_t dt, bk_buf_t *normf, bk_buf_t *head)
{
    const ckpt_unit_t *hu = &m->units[m->n_units - 1];
    *normf = bk_at(bk_buf(hbase, dt), hu->t[0].offset);
    *head = hu->n_tensors > 1 ? bk_at(bk_buf(hbase, dt), hu->t[1].offset)
                              : bk_at(bk_buf(ebase, dt), m->units[0].t[0].offset);
}

static int tied(const model_t *m) { return m->units[m->n_units - 1].n_tensors == 1; }

/* The io of a model that owns its units. */
static void *own_params(void *ctx, int u) { return ((model_t *)ctx)->w[u]; }
static void *own_grads(void *ctx, int u) { return ((model_t *)ctx)->g[u]; }
static void own_nothing(void *ctx, int u)
{
    (void)ctx;
    (void)u;
}

/* Whether tensor b of every block unit starts where tensor a ends. */
static int adjacent(const model_t *m, int a, int b)
{
    for (int64_t l = 0; l < m->L; l++) {
        const ckpt_tensor_t *t = m->units[1 + l].t;
        if (t[a].offset + t[a].numel != t[b].offset)
            return 0;
    }
    return 1;
}

/* norms: NULL, or the buffers of the norms' and SwiGLU's outputs to share (--recompute
 * norms recomputes them in each block's backward pass). */
static int alloc_acts(model_t *m, acts_t *a, const acts_t *norms)
{
    int64_t n = m->cap;
    if (norms) {
        a->xn1 = norms->xn1, a->xn2 = norms->xn2, a->h = norms->h;
        a->rstd1 = norms->rstd1, a->rstd2 = norms->rstd2;
        bk_buf_t *f[] = {&a->q, &a->k, &a->v, &a->att, &a->xmid, &a->g, &a->u};
        int64_t sz[] = {n * m->Hq, n * m->Hk, n * m->Hk, n * m->Hq, n * m->D, n * m->F, n * m->F};
        size_t nf = sizeof sz / sizeof *sz - (m->glu ? 2 : 0);
        for (size_t i = 0; i < nf; i++)
            if (act_alloc(m, f[i], sz[i], BK_MEM_ACTS, "activations") < 0)
                return -1;
        if (m->glu && act_alloc(m, &a->gu, 2 * n * m->F, BK_MEM_ACTS, "activations") < 0)
            return -1;
        return (a->lse = m_alloc(m, n * m->H, DT_F32, BK_MEM_ACTS, "activations")) ? 0 : -1;
    }
    bk_buf_t *f[] = {&a->xn1, &a->q, &a->k, &a->v, &a->att, &a->xmid, &a->xn2, &a->h, &a->g, &a->u};
    int64_t sz[] = {n * m->D, n * m->Hq, n * m->Hk, n * m->Hk, n * m->Hq, n * m->D, n * m->D,
                    n * m->F, n * m->F, n * m->F};
    size_t nf = sizeof sz / sizeof *sz - (m->glu ? 2 : 0);
    for (size_t i = 0; i < nf; i++)
        if (act_alloc(m, f[i], sz[i], BK_MEM_ACTS, "activations") < 0)
            return -1;
    if (m->glu && act_alloc(m, &a->gu, 2 * n * m->F, BK_MEM_ACTS, "activations") < 0)
        return -1;
    if (!(a->rstd1 = m_alloc(m, n, DT_F32, BK_MEM_ACTS, "activations")) ||
        !(a->rstd2 = m_alloc(m, n, DT_F32, BK_MEM_ACTS, "activations")) ||
        !(a->lse = m_alloc(m, n * m->H, DT_F32, BK_MEM_ACTS, "activations")))
        return -1;
    return 0;
}

/* The model's widths, its token capacity and its head's chunk, from c. */
static void set_shape(model_t *m, const model_config_t *c, int training, int64_t max_tokens, int recompute)
{
    m->D = c->hidden_size;
    m->F = c->intermediate_size;
    m->H = c->num_attention_heads;
    m->KV = c->num_key_value_heads;
    m->hd = model_head_dim(c);
    m->V = c->vocab_size;
    m->L = c->num_hidden_layers;
    m->Hq = m->H * m->hd;
    m->Hk = m->KV * m->hd;
    m->training = training;
    m->recompute = recompute;
    m->cap = max_tokens > 0 ? max_tokens : 1;
    /* ~32 MiB of fp32 logits per chunk in whole 128-row tiles (the products' tiles: a
     * ragged chunk would run a partial tile every time), at least one tile, at most the
     * capacity rounded up to a tile. */
    m->head_chunk = (32 << 20) / (4 * m->V) / 128 * 128;
    if (m->head_chunk < 128)
        m->head_chunk = 128;
    if (m->head_chunk > (m->cap + 127) / 128 * 128)
        m->head_chunk = (m->cap + 127) / 128 * 128;
}

/* The units: the caller's with their io, or (io == NULL) the model's own, padded for one
 * shard, with their weights and (training) gradients. -1 with a message. */
static int take_units(model_t *m, const ckpt_unit_t *units, int n_units, const model_io_t *io)
{
    if (io) {
        m->n_units = n_units;
        if (!(m->units = malloc((size_t)n_units * sizeof *units))) {
            ftk_err_set("out of memory");
            return -1;
        }
        memcpy(m->units, units, (size_t)n_units * sizeof *units);
        m->io = *io;
        return 0;
    }
    if (ckpt_units(&m->c, 1, &m->units, &m->n_units) < 0)
        return -1;
    m->io = (model_io_t){m, own_params, own_nothing, own_grads, own_nothing, NULL};
    m->w = calloc((size_t)m->n_units, sizeof *m->w);
    m->g = m->training ? calloc((size_t)m->n_units, sizeof *m->g) : NULL;
    if (!m->w || (m->training && !m->g)) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int u = 0; u < m->n_units; u++)
        if (!(m->w[u] = m_alloc(m, m->units[u].padded, m->dt.compute, BK_MEM_WEIGHTS, "weights")) ||
            (m->training && !(m->g[u] = m_alloc(m, m->units[u].padded, m->dt.grad, BK_MEM_GRADS, "gradients"))))
            return -1;
    return 0;
}

/* The blocks' inputs and what their forward passes keep, as the recompute level shares it. */
static int alloc_forward(model_t *m)
{
    for (int64_t l = 0; l <= m->L; l++)
        if (act_alloc(m, &m->x[l], m->cap * m->D, BK_MEM_ACTS, "activations") < 0)
            return -1;
    for (int64_t l = 0; l < m->L; l++) {
        if (l == 0 || m->recompute == MODEL_RECOMPUTE_NONE) {
            if (alloc_acts(m, &m->a[l], NULL) < 0)
                return -1;
        } else if (m->recompute == MODEL_RECOMPUTE_NORMS) {
            if (alloc_acts(m, &m->a[l], &m->a[0]) < 0)
                return -1;
        } else {
            m->a[l] = m->a[0];
        }
    }
    return 0;
}

/* What a training pass needs beyond the weights: the batch's inputs, the loss
 * accumulator, the activations, the backward pass's gradients and the head's chunk. */
static int alloc_training(model_t *m)
{
    int64_t n = m->cap;
    if (!(m->d_ids = m_alloc(m, n, DT_F32, BK_MEM_OTHER, "batch inputs")) ||
        !(m->d_pos = m_alloc(m, n, DT_F32, BK_MEM_OTHER, "batch inputs")) ||
        !(m->d_tgt_at = m_alloc(m, n, DT_F32, BK_MEM_OTHER, "batch inputs")) ||
        !(m->d_tgt = m_alloc(m, n, DT_F32, BK_MEM_OTHER, "batch inputs")) ||
        !(m->d_tgt_w = m_alloc(m, n, DT_F32, BK_MEM_OTHER, "batch inputs")) ||
        !(m->d_loss = m->own_loss = m_alloc(m, sizeof(double) / sizeof(float), DT_F32, BK_MEM_OTHER,
                                            "the loss accumulator")))
        return -1;
    if (alloc_forward(m) < 0)
        return -1;
    int64_t hc = m->head_chunk;
    bk_buf_t *f[] = {&m->xnf, &m->dxnf, &m->dx, &m->dxn, &m->dh, &m->datt, &m->dq, &m->dk, &m->dv, &m->trash,
                     &m->dg, &m->du};
    int64_t sz[] = {n * m->D, n * m->D, n * m->D, n * m->D, n * m->F, n * m->Hq, n * m->Hq, n * m->Hk, n * m->Hk,
                    n * m->D, n * m->F, n * m->F};
    size_t nf = sizeof sz / sizeof *sz - (m->glu ? 2 : 0);
    for (size_t i = 0; i < nf; i++)
        if (act_alloc(m, f[i], sz[i], BK_MEM_ACTS, "activations") < 0)
            return -1;
    if (m->glu && act_alloc(m, &m->dgu, 2 * n * m->F, BK_MEM_ACTS, "activations") < 0)
        return -1;
    if (m->fqkv && act_alloc(m, &m->qkv, n * (m->Hq + 2 * m->Hk), BK_MEM_ACTS, "activations") < 0)
        return -1;
    if (!(m->rstdf = m_alloc(m, n, DT_F32, BK_MEM_ACTS, "activations")) ||
        act_alloc(m, &m->xc, hc * m->D, BK_MEM_OTHER, "the head's chunk") < 0 ||
        act_alloc(m, &m->dxc, hc * m->D, BK_MEM_OTHER, "the head's chunk") < 0 ||
        !(m->logits = m_alloc(m, hc * m->V, DT_F32, BK_MEM_OTHER, "the head's logits chunk")))
        return -1;
    /* fp32: the loss gradient is used where it was computed. */
    if (m->dt.act == DT_F32)
        m->dlog = bk_buf(m->logits, DT_F32);
    else if (act_alloc(m, &m->dlog, hc * m->V, BK_MEM_OTHER, "the head's logits chunk") < 0)
        return -1;
    return 0;
}

/* io == NULL: the model owns its units (padded for one shard); otherwise units come
 * from the caller and the parameters and gradients through io. */
static model_t *model_create(backend_t *be, const model_config_t *c, precision_t prec, int training,
                             int64_t max_tokens, int recompute, const ckpt_unit_t *units, int n_units,
                             const model_io_t *io)
{
    if (model_config_check(c) < 0)
        return NULL;
    model_t *m = calloc(1, sizeof *m);
    if (!m) {
        ftk_err_set("out of memory");
        return NULL;
    }
    m->be = be;
    m->c = *c;
    m->dt = precision_dtypes(prec);
    /* Products multiply activations by weights, and the backend takes one dtype for both
     * operands: every mode stores its activations in the dtype its ops read weights in. */
    if (m->dt.act != m->dt.compute) {
        ftk_err_set("internal: precision %s has activations of another dtype than its weights", precision_name(prec));
        free(m);
        return NULL;
    }
    set_shape(m, c, training, max_tokens, recompute);
    if (take_units(m, units, n_units, io) < 0)
        goto fail;
    /* [Wg; Wu] is one [2F, D] matrix when the two are adjacent in the unit (they are in
     * ckpt_units' layout; checked, not assumed). */
    m->glu = be->glu_fwd && be->glu_bwd && adjacent(m, 6, 7);
    m->fqkv = be->qkv_rope && adjacent(m, 1, 2) && adjacent(m, 2, 3); /* [Wq; Wk; Wv] likewise */
    m->addnorm = be->add_rmsnorm_fwd != NULL;
    m->x = calloc((size_t)m->L + 1, sizeof *m->x);
    m->a = calloc((size_t)m->L, sizeof *m->a);
    if (!m->x || !m->a) {
        ftk_err_set("out of memory");
        goto fail;
    }
    if (training && alloc_training(m) < 0)
        goto fail;
    return m;
fail:
    model_free(m);
    return NULL;
}

model_t *model_new(backend_t *be, const model_config_t *c, precision_t prec, int training, int64_t max_tokens,
                   int recompute)
{
    return model_create(be, c, prec, training, max_tokens, recompute, NULL, 0, NULL);
}

model_t *model_new_io(backend_t *be, const model_config_t *c, precision_t prec, int64_t max_tokens, int recompute,
                      const ckpt_unit_t *units, int n_units, const model_io_t *io)
{
    return model_create(be, c, prec, 1, max_tokens, recompute, units, n_units, io);
}

void model_free(model_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_allocs; i++)
        bk_free(m->be, m->allocs[i]);
    free(m->allocs);
    free(m->units);
    free(m->w);
    free(m->g);
    free(m->x);
    free(m->a);
    free(m);
}

int model_load_weights(model_t *m, hid_t file)
{
    if (!m->w) {
        ftk_err_set("internal: model_load_weights on a model whose units live elsewhere");
        return -1;
    }
    size_t nt = weights_n_tensors(&m->c);
    int64_t most = 0;
    for (size_t i = 0; i < nt; i++) {
        weights_spec_t s;
        weights_tensor_spec(&m->c, i, &s);
        int64_t e = s.shape[0] * (s.rank == 2 ? s.shape[1] : 1);
        most = e > most ? e : most;
    }
    float *host = malloc((size_t)most * sizeof *host);
    uint16_t *scratch = malloc((size_t)most * sizeof *scratch);
    int rc = host && scratch ? 0 : -1;
    if (rc < 0)
        ftk_err_set("out of memory");
    size_t es = dtype_size(m->dt.compute);
    for (size_t i = 0; i < nt && rc == 0; i++) {
        weights_spec_t s;
        weights_tensor_spec(&m->c, i, &s);
        int u, t;
        if (find_tensor(m, s.name, &u, &t) < 0) {
            ftk_err_set("%s: not in the model's units", s.name);
            rc = -1;
            break;
        }
        dtype_t dt = weights_tensor_dtype(file, s.name);
        if (dt == DT_INVALID || weights_read_rows(file, s.name, DT_F32, 0, s.shape[0], host,
                                                  dt == DT_F32 ? NULL : scratch) < 0) {
            rc = -1;
            break;
        }
        int64_t ne = m->units[u].t[t].numel;
        const void *src = host;
        if (m->dt.compute != DT_F32) { /* narrowed in place: host's first half */
            dtype_convert(scratch, m->dt.compute, host, DT_F32, (size_t)ne);
            src = scratch;
        }
        m->be->upload(m->be, (char *)m->w[u] + (size_t)m->units[u].t[t].offset * es, src, (size_t)ne * es);
    }
    free(host);
    free(scratch);
    return rc;
}

void model_zero_grad(model_t *m)
{
    for (int u = 0; m->g && u < m->n_units; u++)
        m->be->zero(m->be, m->g[u], (size_t)m->units[u].padded * dtype_size(m->dt.grad));
}

/* ---- forward and backward of one block --------------------------------------------------- */

static void block_fwd(model_t *m, const layer_w_t *w, int64_t n, const int64_t *seg, int64_t n_seg, bk_buf_t x,
                      acts_t *a, bk_buf_t y)
{
    backend_t *be = m->be;
    float eps = (float)m->c.rms_norm_eps, theta = (float)m->c.rope_theta;
    be->rmsnorm_fwd(be, a->xn1, a->rstd1, x, w->ln1, n, m->D, eps);
    if (m->fqkv) { /* [Wq; Wk; Wv]: one product, then split with rope */
        be->matmul(be, 0, 1, n, m->Hq + 2 * m->Hk, m->D, 1, a->xn1, w->wq, 0, m->qkv);
        be->qkv_rope(be, m->qkv, a->q, a->k, a->v, m->d_pos, n, (int)m->H, (int)m->KV, (int)m->hd, theta, 0);
    } else {
        be->matmul(be, 0, 1, n, m->Hq, m->D, 1, a->xn1, w->wq, 0, a->q);
        be->matmul(be, 0, 1, n, m->Hk, m->D, 1, a->xn1, w->wk, 0, a->k);
        be->matmul(be, 0, 1, n, m->Hk, m->D, 1, a->xn1, w->wv, 0, a->v);
        if (be->rope_qk) {
            be->rope_qk(be, a->q, a->k, m->d_pos, n, (int)m->H, (int)m->KV, (int)m->hd, theta, 0);
        } else {
            be->rope(be, a->q, m->d_pos, n, (int)m->H, (int)m->hd, theta, 0);
            be->rope(be, a->k, m->d_pos, n, (int)m->KV, (int)m->hd, theta, 0);
        }
    }
    be->attn_fwd(be, a->att, a->lse, a->q, a->k, a->v, seg, n_seg, (int)m->H, (int)m->KV, (int)m->hd);
    if (m->addnorm) {
        /* The output product alone into dxn (free until the backward, also when the forward
         * is recomputed inside it), then xmid = x + r and its norm in one pass. In bf16 the
         * product is rounded before the add (PyTorch's order); the other branch adds x
         * inside the product (beta 1) and rounds once. */
        be->matmul(be, 0, 1, n, m->D, m->Hq, 1, a->att, w->wo, 0, m->dxn);
        be->add_rmsnorm_fwd(be, a->xmid, a->xn2, a->rstd2, x, m->dxn, w->ln2, n, m->D, eps);
    } else {
        be->copy(be, a->xmid.p, x.p, (size_t)(n * m->D) * dtype_size(x.dt));
        be->matmul(be, 0, 1, n, m->D, m->Hq, 1, a->att, w->wo, 1, a->xmid);
        be->rmsnorm_fwd(be, a->xn2, a->rstd2, a->xmid, w->ln2, n, m->D, eps);
    }
    if (m->glu) { /* [Wg; Wu]: one product */
        be->matmul(be, 0, 1, n, 2 * m->F, m->D, 1, a->xn2, w->wg, 0, a->gu);
        be->glu_fwd(be, a->h, a->gu, n, m->F);
    } else {
        be->matmul(be, 0, 1, n, m->F, m->D, 1, a->xn2, w->wg, 0, a->g);
        be->matmul(be, 0, 1, n, m->F, m->D, 1, a->xn2, w->wu, 0, a->u);
        be->swiglu_fwd(be, a->h, a->g, a->u, n * m->F);
    }
    be->copy(be, y.p, a->xmid.p, (size_t)(n * m->D) * dtype_size(y.dt));
    be->matmul(be, 0, 1, n, m->D, m->F, 1, a->h, w->wd, 1, y);
}

/* The unit's gradient buffer is to be written, not added into (model_io_t grads_first). */
static int grads_first(const model_t *m, int u)
{
    return m->io.grads_first && m->io.grads_first(m->io.ctx, u);
}

/* Zeroes n elements of a gradient that the pass adds into without writing it first (a norm
 * weight's, the embedding table's scatter-add). */
static void zero_vec(model_t *m, bk_buf_t b, int64_t n)
{
    m->be->zero(m->be, b.p, (size_t)n * dtype_size(b.dt));
}

/* dx: on entry ∂loss/∂(block output), on return ∂loss/∂(block input). first: the pass
 * writes dw (beta 0, norms zeroed first) instead of adding into it. */
static void block_bwd(model_t *m, int64_t l, const layer_w_t *w, const layer_w_t *dw, int64_t n, const int64_t *seg,
                      int64_t n_seg, bk_buf_t dx, int first)
{
    backend_t *be = m->be;
    acts_t *a = &m->a[l];
    float theta = (float)m->c.rope_theta;
    float eps = (float)m->c.rms_norm_eps;
    float gb = first ? 0.0f : 1.0f; /* beta of the weight-gradient products */
    if (first) {
        zero_vec(m, dw->ln1, m->D);
        zero_vec(m, dw->ln2, m->D);
    }
    if (m->recompute == MODEL_RECOMPUTE_BLOCK) {
        block_fwd(m, w, n, seg, n_seg, m->x[l], a, m->trash);
    } else if (m->recompute == MODEL_RECOMPUTE_NORMS) {
        /* block_fwd's norms and SwiGLU again, from what it kept: add_rmsnorm_fwd's xn2 is
         * by definition rmsnorm_fwd of the rounded xmid (backend.h), so the same bits. */
        be->rmsnorm_fwd(be, a->xn1, a->rstd1, m->x[l], w->ln1, n, m->D, eps);
        be->rmsnorm_fwd(be, a->xn2, a->rstd2, a->xmid, w->ln2, n, m->D, eps);
        if (m->glu)
            be->glu_fwd(be, a->h, a->gu, n, m->F);
        else
            be->swiglu_fwd(be, a->h, a->g, a->u, n * m->F);
    }
    /* dx is the gradient of the block output, then of xmid, then of the block input: each
     * part reads it (the products) before its RMSNorm backward adds into it, which is the
     * residual path's sum with no copy. */
    /* MLP */
    be->matmul(be, 0, 0, n, m->F, m->D, 1, dx, w->wd, 0, m->dh);
    be->matmul(be, 1, 0, m->D, m->F, n, 1, dx, a->h, gb, dw->wd);
    if (m->glu) { /* K = 2F: one product for dxn, one for d[Wg; Wu] */
        be->glu_bwd(be, m->dgu, m->dh, a->gu, n, m->F);
        be->matmul(be, 0, 0, n, m->D, 2 * m->F, 1, m->dgu, w->wg, 0, m->dxn);
        be->matmul(be, 1, 0, 2 * m->F, m->D, n, 1, m->dgu, a->xn2, gb, dw->wg);
    } else {
        be->swiglu_bwd(be, m->dg, m->du, m->dh, a->g, a->u, n * m->F);
        be->matmul(be, 0, 0, n, m->D, m->F, 1, m->dg, w->wg, 0, m->dxn);
        be->matmul(be, 0, 0, n, m->D, m->F, 1, m->du, w->wu, 1, m->dxn);
        be->matmul(be, 1, 0, m->F, m->D, n, 1, m->dg, a->xn2, gb, dw->wg);
        be->matmul(be, 1, 0, m->F, m->D, n, 1, m->du, a->xn2, gb, dw->wu);
    }
    be->rmsnorm_bwd(be, dx, dw->ln2, m->dxn, a->xmid, w->ln2, a->rstd2, n, m->D);
    /* attention: dx is now ∂loss/∂xmid */
    be->matmul(be, 0, 0, n, m->Hq, m->D, 1, dx, w->wo, 0, m->datt);
    be->matmul(be, 1, 0, m->D, m->Hq, n, 1, dx, a->att, gb, dw->wo);
    be->attn_bwd(be, m->dq, m->dk, m->dv, m->datt, a->q, a->k, a->v, a->att, a->lse, seg, n_seg, (int)m->H,
                 (int)m->KV, (int)m->hd);
    if (m->fqkv) { /* dqkv, then K = Hq + 2·Hk: one product for dxn, one for d[Wq; Wk; Wv] */
        int64_t W = m->Hq + 2 * m->Hk;
        be->qkv_rope(be, m->qkv, m->dq, m->dk, m->dv, m->d_pos, n, (int)m->H, (int)m->KV, (int)m->hd, theta, 1);
        be->matmul(be, 0, 0, n, m->D, W, 1, m->qkv, w->wq, 0, m->dxn);
        be->matmul(be, 1, 0, W, m->D, n, 1, m->qkv, a->xn1, gb, dw->wq);
    } else {
        if (be->rope_qk) {
            be->rope_qk(be, m->dq, m->dk, m->d_pos, n, (int)m->H, (int)m->KV, (int)m->hd, theta, 1);
        } else {
            be->rope(be, m->dq, m->d_pos, n, (int)m->H, (int)m->hd, theta, 1);
            be->rope(be, m->dk, m->d_pos, n, (int)m->KV, (int)m->hd, theta, 1);
        }
        be->matmul(be, 0, 0, n, m->D, m->Hq, 1, m->dq, w->wq, 0, m->dxn);
        be->matmul(be, 0, 0, n, m->D, m->Hk, 1, m->dk, w->wk, 1, m->dxn);
        be->matmul(be, 0, 0, n, m->D, m->Hk, 1, m->dv, w->wv, 1, m->dxn);
        be->matmul(be, 1, 0, m->Hq, m->D, n, 1, m->dq, a->xn1, gb, dw->wq);
        be->matmul(be, 1, 0, m->Hk, m->D, n, 1, m->dk, a->xn1, gb, dw->wk);
        be->matmul(be, 1, 0, m->Hk, m->D, n, 1, m->dv, a->xn1, gb, dw->wv);
    }
    be->rmsnorm_bwd(be, dx, dw->ln1, m->dxn, m->x[l], w->ln1, a->rstd1, n, m->D);
}

int model_pass(model_t *m, const batch_t *b, float grad_scale, float *logits)
{
    backend_t *be = m->be;
    const model_io_t *io = &m->io;
    dtype_t wdt = m->dt.compute, gdt = m->dt.grad;
    int64_t n = b->n;
    int train = grad_scale != 0.0f && !logits;
    int H = m->n_units - 1, tie = tied(m);
    if (n > m->cap || !m->d_ids) {
        ftk_err_set("internal: a batch of %lld tokens for a model sized for %lld", (long long)n, (long long)m->cap);
        return -1;
    }
    be->upload(be, m->d_ids, b->ids, (size_t)n * sizeof(int32_t));
    be->upload(be, m->d_pos, b->pos, (size_t)n * sizeof(int32_t));
    be->upload(be, m->d_tgt_at, b->tgt_at, (size_t)b->n_tgt * sizeof(int32_t));
    be->upload(be, m->d_tgt, b->tgt, (size_t)b->n_tgt * sizeof(int32_t));
    be->upload(be, m->d_tgt_w, b->tgt_w, (size_t)b->n_tgt * sizeof(float));

    /* Units are asked for in the order of use and released as soon as the pass is done
     * with them (model.h: model_io_t). */
    bk_buf_t emb = bk_at(bk_buf(io->params(io->ctx, 0), wdt), m->units[0].t[0].offset);
    be->embed_fwd(be, m->x[0], m->d_ids, emb, n, m->D);
    if (!tie)
        io->release(io->ctx, 0);
    for (int64_t l = 0; l < m->L; l++) {
        layer_w_t w = layer_view(m, io->params(io->ctx, 1 + (int)l), wdt, l);
        block_fwd(m, &w, n, b->seg, b->n_seg, m->x[l], &m->a[l], m->x[l + 1]);
        io->release(io->ctx, 1 + (int)l);
    }
    bk_buf_t normf, head, dnormf = {0}, dhead = {0};
    void *hp = io->params(io->ctx, H);
    head_view(m, hp, tie ? io->params(io->ctx, 0) : NULL, wdt, &normf, &head);
    be->rmsnorm_fwd(be, m->xnf, m->rstdf, m->x[m->L], normf, n, m->D, (float)m->c.rms_norm_eps);

    bk_buf_t lg = bk_buf(m->logits, DT_F32);
    if (logits) {
        for (int64_t r0 = 0; r0 < n; r0 += m->head_chunk) {
            int64_t c = n - r0 < m->head_chunk ? n - r0 : m->head_chunk;
            be->matmul(be, 0, 1, c, m->V, m->D, 1, bk_at(m->xnf, r0 * m->D), head, 0, lg);
            be->download(be, logits + r0 * m->V, m->logits, (size_t)(c * m->V) * sizeof(float));
        }
    }
    /* The head on target rows only, a chunk at a time: gather, logits, loss and its
     * gradient in place, then back through the head. Its forward and backward run here
     * back to back, so the head unit is asked for once per pass. The chunks' losses add
     * into the device accumulator: nothing here waits for the device. */
    int first_h = 0, first_e = 0; /* the head's gradient, the embedding's: written, not added */
    if (train) {
        head_view(m, io->grads(io->ctx, H), tie ? io->grads(io->ctx, 0) : NULL, gdt, &dnormf, &dhead);
        first_h = grads_first(m, H);
        first_e = tie ? grads_first(m, 0) : 0;
        be->zero(be, m->dxnf.p, (size_t)(n * m->D) * dtype_size(m->dxnf.dt));
        if (first_h)
            zero_vec(m, dnormf, m->D);
        if ((tie ? first_e : first_h) && b->n_tgt == 0) /* no chunk writes the head matrix */
            zero_vec(m, dhead, m->V * m->D);
    }
    for (int64_t r0 = 0; r0 < b->n_tgt; r0 += m->head_chunk) {
        int64_t c = b->n_tgt - r0 < m->head_chunk ? b->n_tgt - r0 : m->head_chunk;
        be->embed_fwd(be, m->xc, m->d_tgt_at + r0, m->xnf, c, m->D);
        be->matmul(be, 0, 1, c, m->V, m->D, 1, m->xc, head, 0, lg);
        be->xent(be, m->logits, m->d_tgt + r0, m->d_tgt_w + r0, c, m->V, train ? grad_scale : 0.0f, m->d_loss);
        if (train) {
            if (m->dlog.p != m->logits)
                be->convert(be, m->dlog, lg, c * m->V);
            be->matmul(be, 0, 0, c, m->D, m->V, 1, m->dlog, head, 0, m->dxc);
            be->rows_scatter(be, m->dxnf, m->d_tgt_at + r0, m->dxc, c, m->D);
            int w0 = r0 == 0 && (tie ? first_e : first_h); /* the first chunk writes */
            be->matmul(be, 1, 0, m->V, m->D, c, 1, m->dlog, m->xc, w0 ? 0.0f : 1.0f, dhead);
        }
    }
    if (train) {
        be->zero(be, m->dx.p, (size_t)(n * m->D) * dtype_size(m->dx.dt));
        be->rmsnorm_bwd(be, m->dx, dnormf, m->dxnf, m->x[m->L], normf, m->rstdf, n, m->D);
    }
    io->release(io->ctx, H);
    if (tie)
        io->release(io->ctx, 0);
    if (!train)
        return 0;
    io->grads_done(io->ctx, H);

    for (int64_t l = m->L - 1; l >= 0; l--) {
        layer_w_t w = layer_view(m, io->params(io->ctx, 1 + (int)l), wdt, l);
        layer_w_t dw = layer_view(m, io->grads(io->ctx, 1 + (int)l), gdt, l);
        block_bwd(m, l, &w, &dw, n, b->seg, b->n_seg, m->dx, grads_first(m, 1 + (int)l));
        io->release(io->ctx, 1 + (int)l);
        io->grads_done(io->ctx, 1 + (int)l);
    }
    /* The embedding's backward reads only the ids: its parameters are not needed. */
    bk_buf_t demb = bk_at(bk_buf(io->grads(io->ctx, 0), gdt), m->units[0].t[0].offset);
    if (!tie && grads_first(m, 0)) /* a scatter-add: the rows no token names must be zero */
        zero_vec(m, demb, m->V * m->D);
    be->embed_bwd(be, demb, m->d_ids, m->dx, n, m->D);
    io->grads_done(io->ctx, 0);
    return 0;
}

double model_loss_take(model_t *m)
{
    if (!m->d_loss)
        return NAN;
    /* NaN stays when a failed backend skips the download (its error is kept for sync()). */
    double loss = NAN;
    m->be->download(m->be, &loss, m->d_loss, sizeof loss);
    m->be->zero(m->be, m->d_loss, sizeof loss);
    return loss;
}

void model_set_loss_acc(model_t *m, double *acc) { m->d_loss = acc ? acc : m->own_loss; }

double model_step(model_t *m, const batch_t *b, float grad_scale, float *logits)
{
    return model_pass(m, b, grad_scale, logits) < 0 ? NAN : model_loss_take(m);
}

/* ---- decoding with a cache ----------------------------------------------------------------- */

struct model_kv {
    int64_t ctx;
    bk_buf_t *k, *v; /* per layer [ctx, Hk] */
    bk_buf_t x, xn, q, kn, vn, att, g, u, h;
    float *rstd, *logits;
    int32_t *ids, *pos;
    void **allocs;
    size_t n_allocs;
};

static void *kv_alloc(model_t *m, model_kv_t *kv, int64_t n, dtype_t dt)
{
    void *p = bk_alloc(m->be, (size_t)(n > 0 ? n : 1) * dtype_size(dt), BK_MEM_OTHER, "the decoding cache");
    if (p)
        kv->allocs[kv->n_allocs++] = p;
    return p;
}
static int kv_act(model_t *m, model_kv_t *kv, bk_buf_t *b, int64_t n)
{
    b->dt = m->dt.act;
    return (b->p = kv_alloc(m, kv, n, b->dt)) ? 0 : -1;
}

model_kv_t *model_kv_new(model_t *m, int64_t ctx)
{
    if (!m->w) {
        ftk_err_set("internal: decoding needs a model that owns its parameters");
        return NULL;
    }
    model_kv_t *kv = calloc(1, sizeof *kv);
    if (!kv) {
        ftk_err_set("out of memory");
        return NULL;
    }
    kv->ctx = ctx;
    kv->k = calloc((size_t)m->L, sizeof *kv->k);
    kv->v = calloc((size_t)m->L, sizeof *kv->v);
    kv->allocs = calloc((size_t)(2 * m->L + 16), sizeof *kv->allocs);
    if (!kv->k || !kv->v || !kv->allocs) {
        ftk_err_set("out of memory");
        goto fail;
    }
    for (int64_t l = 0; l < m->L; l++)
        if (kv_act(m, kv, &kv->k[l], ctx * m->Hk) < 0 || kv_act(m, kv, &kv->v[l], ctx * m->Hk) < 0)
            goto fail;
    bk_buf_t *f[] = {&kv->x, &kv->xn, &kv->q, &kv->kn, &kv->vn, &kv->att, &kv->g, &kv->u, &kv->h};
    int64_t sz[] = {ctx * m->D, ctx * m->D, ctx * m->Hq, ctx * m->Hk, ctx * m->Hk, ctx * m->Hq,
                    ctx * m->F, ctx * m->F, ctx * m->F};
    for (size_t i = 0; i < sizeof sz / sizeof *sz; i++)
        if (kv_act(m, kv, f[i], sz[i]) < 0)
            goto fail;
    if (!(kv->rstd = kv_alloc(m, kv, ctx, DT_F32)) || !(kv->logits = kv_alloc(m, kv, m->V, DT_F32)) ||
        !(kv->ids = kv_alloc(m, kv, ctx, DT_F32)) || !(kv->pos = kv_alloc(m, kv, ctx, DT_F32)))
        goto fail;
    return kv;
fail:
    model_kv_free(m, kv);
    return NULL;
}

void model_kv_free(model_t *m, model_kv_t *kv)
{
    if (!kv)
        return;
    for (size_t i = 0; i < kv->n_allocs; i++)
        bk_free(m->be, kv->allocs[i]);
    free(kv->allocs);
    free(kv->k);
    free(kv->v);
    free(kv);
}

int model_decode(model_t *m, model_kv_t *kv, const int32_t *ids, int64_t n, int64_t p0, float *logits)
{
    if (n < 1 || p0 + n > kv->ctx) {
        ftk_err_set("context of %lld tokens exceeded", (long long)kv->ctx);
        return -1;
    }
    backend_t *be = m->be;
    dtype_t wdt = m->dt.compute;
    float eps = (float)m->c.rms_norm_eps, theta = (float)m->c.rope_theta;
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)(p0 + i);
    be->upload(be, kv->ids, ids, (size_t)n * sizeof *ids);
    be->upload(be, kv->pos, pos, (size_t)n * sizeof *pos);
    free(pos);
    bk_buf_t normf, head;
    head_view(m, m->w[m->n_units - 1], m->w[0], wdt, &normf, &head);
    be->embed_fwd(be, kv->x, kv->ids, bk_at(bk_buf(m->w[0], wdt), m->units[0].t[0].offset), n, m->D);
    for (int64_t l = 0; l < m->L; l++) {
        layer_w_t wl = layer_view(m, m->w[1 + l], wdt, l), *w = &wl;
        bk_buf_t kc = bk_at(kv->k[l], p0 * m->Hk), vc = bk_at(kv->v[l], p0 * m->Hk);
        be->rmsnorm_fwd(be, kv->xn, kv->rstd, kv->x, w->ln1, n, m->D, eps);
        be->matmul(be, 0, 1, n, m->Hq, m->D, 1, kv->xn, w->wq, 0, kv->q);
        be->matmul(be, 0, 1, n, m->Hk, m->D, 1, kv->xn, w->wk, 0, kc);
        be->matmul(be, 0, 1, n, m->Hk, m->D, 1, kv->xn, w->wv, 0, vc);
        be->rope(be, kv->q, kv->pos, n, (int)m->H, (int)m->hd, theta, 0);
        be->rope(be, kc, kv->pos, n, (int)m->KV, (int)m->hd, theta, 0);
        be->attn_cached(be, kv->att, kv->q, kv->k[l], kv->v[l], n, p0, (int)m->H, (int)m->KV, (int)m->hd);
        be->matmul(be, 0, 1, n, m->D, m->Hq, 1, kv->att, w->wo, 1, kv->x);
        be->rmsnorm_fwd(be, kv->xn, kv->rstd, kv->x, w->ln2, n, m->D, eps);
        be->matmul(be, 0, 1, n, m->F, m->D, 1, kv->xn, w->wg, 0, kv->g);
        be->matmul(be, 0, 1, n, m->F, m->D, 1, kv->xn, w->wu, 0, kv->u);
        be->swiglu_fwd(be, kv->h, kv->g, kv->u, n * m->F);
        be->matmul(be, 0, 1, n, m->D, m->F, 1, kv->h, w->wd, 1, kv->x);
    }
    bk_buf_t last = bk_at(kv->x, (n - 1) * m->D);
    be->rmsnorm_fwd(be, kv->xn, kv->rstd, last, normf, 1, m->D, eps);
    be->matmul(be, 0, 1, 1, m->V, m->D, 1, kv->xn, head, 0, bk_buf(kv->logits, DT_F32));
    be->download(be, logits, kv->logits, (size_t)m->V * sizeof(float));
    return be->sync(be);
}
