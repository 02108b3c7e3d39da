#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/checkpoint.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/rng.h"

/* Whole units from every shard (padded for the checkpoint's shard count), as float32
 * whatever the checkpoint's precision: the model computes in float32, and a bf16
 * checkpoint widens exactly. */
static int upload_checkpoint(model_t *m, const char *dir, const ckpt_manifest_t *man)
{
    backend_t *be = model_backend(m);
    void **whole = calloc((size_t)man->n_units, sizeof *whole);
    int rc = whole ? 0 : -1;
    for (int i = 0; i < man->n_units && rc == 0; i++)
        if (!(whole[i] = malloc((size_t)man->units[i].padded * sizeof(float))))
            rc = -1;
    if (rc < 0)
        ftk_err_set("out of memory");
    if (rc == 0)
        rc = ckpt_read_params(dir, man, DT_F32, whole);
    for (int i = 0; i < man->n_units && rc == 0; i++)
        be->upload(be, model_unit_param(m, i).p, whole[i], (size_t)man->units[i].length * sizeof(float));
    for (int i = 0; whole && i < man->n_units; i++)
        free(whole[i]);
    free(whole);
    return rc;
}

static int load_checkpoint(backend_t *be, const char *path, model_config_t *cfg, model_t **m, hid_t *tf)
{
    char *dir = ckpt_resolve(path);
    ckpt_manifest_t man;
    if (!dir || ckpt_open(dir, &man) < 0) {
        free(dir);
        return FTK_EXIT_USAGE;
    }
    *cfg = man.cfg;
    int rc = 0;
    if (!(*m = model_new(be, cfg, PREC_FP32, 0, 0, 0)))
        rc = FTK_EXIT_FAIL;
    else if (upload_checkpoint(*m, dir, &man) < 0)
        rc = FTK_EXIT_USAGE;
    else
        *tf = ckpt_open_tokenizer(dir, &man);
    if (rc) {
        model_free(*m);
        *m = NULL;
    }
    ckpt_manifest_free(&man);
    free(dir);
    return rc;
}

int gen_load(backend_t *be, const char *path, model_config_t *cfg, model_t **m, hid_t *tf)
{
    struct stat sb;
    *m = NULL;
    *tf = -1;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return load_checkpoint(be, path, cfg, m, tf);
    if ((*tf = weights_open(path, cfg)) < 0)
        return FTK_EXIT_USAGE;
    if (!(*m = model_new(be, cfg, PREC_FP32, 0, 0, 0)) || model_load_weights(*m, *tf) < 0) {
        ftk_err_prefix("%s: ", path);
        model_free(*m);
        *m = NULL;
        h5_close(*tf);
        *tf = -1;
        return FTK_EXIT_FAIL;
    }
    return 0;
}

typedef struct {
    gen_files_t *f;
    int rank; /* of f->tok in the order of preference */
} pick_t;

static int pick_file(const char *name, const void *data, size_t len, void *ctx)
{
    static const char *order[] = {"tokenizer.model", "tokenizer.json", "tokenizer.bin"};
    pick_t *p = ctx;
    if (!strcmp(name, "generation_config.json")) {
        p->f->has_gen = 1;
        return buf_append(&p->f->gen, data, len);
    }
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, order[i]) || (p->f->tok && p->rank <= i))
            continue;
        tok_t *t = tok_load_mem(data, len, name);
        if (!t)
            return -1;
        tok_free(p->f->tok);
        p->f->tok = t;
        p->rank = i;
    }
    return 0;
}

int gen_stored_files(hid_t tf, gen_files_t *f)
{
    pick_t p = {.f = f};
    *f = (gen_files_t){0};
    if (weights_each_file(tf, pick_file, &p) < 0) {
        gen_files_free(f);
        return -1;
    }
    return 0;
}

void gen_files_free(gen_files_t *f)
{
    tok_free(f->tok);
    buf_free(&f->gen);
    *f = (gen_files_t){0};
}

int gen_prompt(const tok_t *tok, const model_config_t *cfg, const char *text, size_t len, int64_t max_new,
               tok_ids_t *ids, int64_t *ctx)
{
    tok_ws_t *ws = tok_ws_new();
    int rc = !ws || (tok_bos_id(tok) >= 0 && tok_ids_push(ids, tok_bos_id(tok)) < 0) ||
                     tok_encode(tok, ws, text, len, ids) < 0
                 ? FTK_EXIT_FAIL
                 : 0;
    tok_ws_free(ws);
    if (rc)
        return rc;
    if (ids->n == 0) {
        ftk_err_set("empty prompt and the tokenizer has no BOS token to start from");
        return FTK_EXIT_USAGE;
    }
    int64_t n_prompt = (int64_t)ids->n, limit = cfg->max_position_embeddings;
    /* compared, not added: max_new may be 2^63-1 */
    *ctx = max_new > limit - n_prompt ? limit + 1 : n_prompt + max_new;
    if (*ctx > limit) {
        *ctx = limit;
        if (n_prompt >= *ctx) {
            ftk_err_set("the prompt is %zu tokens; the model's context is %lld", ids->n, (long long)limit);
            return FTK_EXIT_USAGE;
        }
    }
    return 0;
}

typedef struct {
    float p;
    int32_t id;
} cand_t;

static int by_prob_desc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    return x->p > y->p ? -1 : x->p < y->p ? 1 : x->id - y->id;
}

/* Greedy, or temperature + nucleus (top-p) sampling; c: scratch for V candidates. */
static int sample(const float *logits, int64_t V, const gen_opts_t *o, rng_t *r, cand_t *c)
{
    int best = 0;
    for (int64_t j = 1; j < V; j++)
        if (logits[j] > logits[best])
            best = (int)j;
    if (o->greedy || o->temperature <= 0)
        return best;
    double sum = 0;
    for (int64_t j = 0; j < V; j++) {
        c[j].p = (float)exp((logits[j] - logits[best]) / o->temperature);
        c[j].id = (int32_t)j;
        sum += c[j].p;
    }
    qsort(c, (size_t)V, sizeof *c, by_prob_desc);
    double cum = 0;
    int64_t keep = V;
    for (int64_t i = 0; i < V; i++) {
        cum += c[i].p / sum;
        if (cum >= o->top_p) {
            keep = i + 1;
            break;
        }
    }
    double u = (double)(rng_next(r) >> 11) * 0x1p-53 * cum, acc = 0;
    for (int64_t i = 0; i < keep; i++) {
        acc += c[i].p / sum;
        if (u < acc)
            return c[i].id;
    }
    return c[keep - 1].id;
}

static int is_byte_token(const tok_t *t, int id)
{
    size_t l;
    const char *s = tok_piece(t, id, &l);
    return s && l == 6 && !strncmp(s, "<0x", 3);
}

static int is_eos(const gen_opts_t *o, int id)
{
    int stop = 0;
    for (int e = 0; e < o->n_eos; e++)
        stop |= id == o->eos[e];
    return stop;
}

/* The decoding in progress: the sequence's text and how much of it is out. */
typedef struct {
    const tok_t *tok;
    buf_t full;
    size_t printed;
    gen_emit_fn emit;
    void *emit_ctx;
} gen_text_t;

/* Hands emit what the whole sequence decodes to beyond what is out already. */
static int emit_new(gen_text_t *g, const tok_ids_t *ids)
{
    g->full.len = 0;
    if (tok_decode(g->tok, ids->v, ids->n, &g->full) < 0)
        return -1;
    if (g->full.len > g->printed) {
        g->emit(g->emit_ctx, g->full.data + g->printed, g->full.len - g->printed);
        g->printed = g->full.len;
    }
    return 0;
}

/* Samples, checks and appends one token after the logits of the sequence so far.
 * Returns 1 when an end-of-sequence id ends generation, else 0 or -1. */
static int next_token(const gen_opts_t *o, int64_t V, const float *logits, rng_t *r, cand_t *cand, gen_text_t *g,
                      tok_ids_t *ids)
{
    int next = sample(logits, V, o, r, cand);
    if (is_eos(o, next) && !o->ignore_eos)
        return 1;
    if (next >= tok_vocab_size(g->tok)) {
        ftk_err_set("the model produced id %d, outside the tokenizer's %d pieces", next, tok_vocab_size(g->tok));
        return -1;
    }
    if (tok_ids_push(ids, next) < 0) {
        ftk_err_set("out of memory");
        return -1;
    }
    /* wait while a run of byte pieces may still be an incomplete UTF-8 character */
    return is_byte_token(g->tok, next) ? 0 : emit_new(g, ids);
}

/* The prompt, then one token at a time while max_new and the context allow. */
static int decode_loop(model_t *m, model_kv_t *kv, int64_t ctx, int64_t V, const gen_opts_t *o, float *logits,
                       cand_t *cand, gen_text_t *g, tok_ids_t *ids)
{
    backend_t *be = model_backend(m);
    rng_t r;
    rng_seed(&r, o->seed);
    int rc = model_decode(m, kv, ids->v, (int64_t)ids->n, 0, logits);
    if (rc == 0)
        rc = be->sync(be);
    int64_t p = (int64_t)ids->n;
    for (int64_t k = 0; rc == 0 && k < o->max_new; k++) {
        int step = next_token(o, V, logits, &r, cand, g, ids);
        if (step)
            return step < 0 ? -1 : 0;
        if (p >= ctx)
            break;
        rc = model_decode(m, kv, ids->v + p, 1, p, logits);
        if (rc == 0)
            rc = be->sync(be);
        p++;
    }
    return rc;
}

int gen_run(model_t *m, const model_config_t *cfg, const tok_t *tok, tok_ids_t *ids, int64_t ctx,
            const gen_opts_t *o, gen_emit_fn emit, void *emit_ctx)
{
    model_kv_t *kv = model_kv_new(m, ctx);
    float *logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    cand_t *cand = malloc((size_t)cfg->vocab_size * sizeof *cand);
    gen_text_t g = {.tok = tok, .emit = emit, .emit_ctx = emit_ctx};
    buf_t base = {0};
    int rc = 0;
    if (!kv || !logits || !cand) {
        ftk_err_set("out of memory");
        rc = -1;
    }
    if (rc == 0)
        rc = tok_decode(tok, ids->v, ids->n, &base);
    g.printed = base.len;
    if (rc == 0)
        rc = decode_loop(m, kv, ctx, cfg->vocab_size, o, logits, cand, &g, ids);
    if (rc == 0) { /* the rest, bytes that completed no character included */
        g.full.len = 0;
        if (tok_decode(tok, ids->v, ids->n, &g.full) == 0 && g.full.len > g.printed)
            emit(emit_ctx, g.full.data + g.printed, g.full.len - g.printed);
    }
    buf_free(&base);
    buf_free(&g.full);
    free(logits);
    free(cand);
    model_kv_free(m, kv);
    return rc;
}
