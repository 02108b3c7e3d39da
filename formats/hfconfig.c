#include "hfconfig.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "json.h"

void model_config_defaults(model_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 32000;
    c->max_position_embeddings = 2048;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->initializer_range = 0.02;
    c->bos_token_id = 1;
    c->eos_token_id = 2;
    c->torch_dtype = DT_F32;
}

int model_config_check(const model_config_t *c)
{
    const struct {
        const char *name;
        int64_t v;
    } pos[] = {{"hidden_size", c->hidden_size},
               {"intermediate_size", c->intermediate_size},
               {"num_hidden_layers", c->num_hidden_layers},
               {"num_attention_heads", c->num_attention_heads},
               {"num_key_value_heads", c->num_key_value_heads},
               {"vocab_size", c->vocab_size},
               {"max_position_embeddings", c->max_position_embeddings}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0 || pos[i].v > (INT64_C(1) << 31)) {
            ftk_err_set("%s: %lld is not a size in [1, 2^31]", pos[i].name, (long long)pos[i].v);
            return -1;
        }
    if (c->hidden_size % c->num_attention_heads) {
        ftk_err_set("hidden_size %lld is not a multiple of num_attention_heads %lld", (long long)c->hidden_size,
                    (long long)c->num_attention_heads);
        return -1;
    }
    if (c->num_attention_heads % c->num_key_value_heads) {
        ftk_err_set("num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                    (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
        return -1;
    }
    if (model_head_dim(c) % 2) {
        ftk_err_set("head dimension %lld is odd; rotary embeddings need pairs", (long long)model_head_dim(c));
        return -1;
    }
    if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0) || !(c->initializer_range >= 0) ||
        !isfinite(c->rope_theta) || !isfinite(c->initializer_range)) {
        ftk_err_set("rms_norm_eps, rope_theta must be positive and initializer_range non-negative");
        return -1;
    }
    if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size) {
        ftk_err_set("bos_token_id/eos_token_id outside the vocabulary of %lld", (long long)c->vocab_size);
        return -1;
    }
    return 0;
}

int64_t model_n_params(const model_config_t *c)
{
    int64_t h = c->hidden_size, hd = model_head_dim(c), kv = c->num_key_value_heads * hd;
    int64_t layer = 2 * h + h * h /* q */ + 2 * kv * h + h * h /* o */ + 3 * h * c->intermediate_size;
    return c->vocab_size * h * (c->tie_word_embeddings ? 1 : 2) + c->num_hidden_layers * layer + h;
}

/* ---------------------------------------------------------------- parsing */

typedef struct {
    json_doc_t *doc;
} ctx_t;

static int fail_at(ctx_t *x, const json_value_t *v, const char *field, const char *what)
{
    unsigned line = 0, col = 0;
    json_position(x->doc, v->off, &line, &col);
    ftk_err_set("line %u, column %u: %s: %s", line, col, field, what);
    return -1;
}

static int get_int(ctx_t *x, const json_value_t *root, const char *field, int64_t *out, int required)
{
    const json_value_t *v = json_get(root, field);
    if (!v) {
        if (required) {
            ftk_err_set("%s: missing (required)", field);
            return -1;
        }
        return 0;
    }
    if (json_get_i64(v, out) < 0)
        return fail_at(x, v, field, "not an integer");
    return 0;
}

static int get_num(ctx_t *x, const json_value_t *root, const char *field, double *out)
{
    const json_value_t *v = json_get(root, field);
    if (!v)
        return 0;
    if (v->type != JSON_NUMBER)
        return fail_at(x, v, field, "not a number");
    *out = v->u.num.v;
    return 0;
}

static int get_bool(ctx_t *x, const json_value_t *root, const char *field, int *out)
{
    const json_value_t *v = json_get(root, field);
    if (!v)
        return 0;
    if (v->type != JSON_BOOL)
        return fail_at(x, v, field, "not true or false");
    *out = v->u.boolean;
    return 0;
}

/* A token id: an integer, null (none), or a list holding one id. */
static int get_token(ctx_t *x, const json_value_t *root, const char *field, int64_t *out)
{
    const json_value_t *v = json_get(root, field);
    if (!v)
        return 0;
    if (v->type == JSON_NULL) {
        *out = -1;
        return 0;
    }
    if (v->type == JSON_ARRAY) {
        if (v->u.arr.n != 1)
            return fail_at(x, v, field, "several ids are not supported (one end-of-sequence id is)");
        v = &v->u.arr.items[0];
    }
    if (json_get_i64(v, out) < 0 || *out < 0)
        return fail_at(x, v, field, "not a token id");
    return 0;
}

static int str_is(const json_value_t *v, const char *s)
{
    return v && v->type == JSON_STRING && strlen(s) == v->u.str.len && strcmp(v->u.str.s, s) == 0;
}

int hfconfig_parse(const char *text, size_t len, model_config_t *c)
{
    model_config_defaults(c);
    json_value_t *root = NULL;
    json_opts_t jo = {.max_depth = 64};
    ctx_t x = {json_parse(text, len, &jo, &root)};
    if (!x.doc)
        return -1;
    int rc = -1;
    const json_value_t *v;
    if (root->type != JSON_OBJECT) {
        fail_at(&x, root, "config", "not a JSON object");
        goto out;
    }
    if ((v = json_get(root, "model_type")) && !str_is(v, "llama")) {
        fail_at(&x, v, "model_type", "only \"llama\" is supported");
        goto out;
    }
    if ((v = json_get(root, "architectures")) &&
        !(v->type == JSON_ARRAY && v->u.arr.n == 1 && str_is(&v->u.arr.items[0], "LlamaForCausalLM"))) {
        fail_at(&x, v, "architectures", "only [\"LlamaForCausalLM\"] is supported");
        goto out;
    }
    if ((v = json_get(root, "rope_scaling")) && v->type != JSON_NULL) {
        fail_at(&x, v, "rope_scaling", "rotary scaling is not supported (must be null)");
        goto out;
    }
    if ((v = json_get(root, "hidden_act")) && !str_is(v, "silu")) {
        fail_at(&x, v, "hidden_act", "only \"silu\" is supported");
        goto out;
    }
    static const char *biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        int b = 0;
        if (get_bool(&x, root, biases[i], &b) < 0)
            goto out;
        if (b) {
            fail_at(&x, json_get(root, biases[i]), biases[i], "biases are not supported (must be false)");
            goto out;
        }
    }
    if (get_int(&x, root, "hidden_size", &c->hidden_size, 1) < 0 ||
        get_int(&x, root, "intermediate_size", &c->intermediate_size, 1) < 0 ||
        get_int(&x, root, "num_hidden_layers", &c->num_hidden_layers, 1) < 0 ||
        get_int(&x, root, "num_attention_heads", &c->num_attention_heads, 1) < 0)
        goto out;
    c->num_key_value_heads = c->num_attention_heads;
    if (get_int(&x, root, "num_key_value_heads", &c->num_key_value_heads, 0) < 0 ||
        get_int(&x, root, "vocab_size", &c->vocab_size, 0) < 0 ||
        get_int(&x, root, "max_position_embeddings", &c->max_position_embeddings, 0) < 0 ||
        get_num(&x, root, "rms_norm_eps", &c->rms_norm_eps) < 0 || get_num(&x, root, "rope_theta", &c->rope_theta) < 0 ||
        get_num(&x, root, "initializer_range", &c->initializer_range) < 0 ||
        get_bool(&x, root, "tie_word_embeddings", &c->tie_word_embeddings) < 0 ||
        get_token(&x, root, "bos_token_id", &c->bos_token_id) < 0 ||
        get_token(&x, root, "eos_token_id", &c->eos_token_id) < 0)
        goto out;
    if ((v = json_get(root, "torch_dtype")) && v->type != JSON_NULL) {
        c->torch_dtype = v->type == JSON_STRING ? dtype_parse(v->u.str.s) : DT_INVALID;
        if (c->torch_dtype == DT_INVALID) {
            fail_at(&x, v, "torch_dtype", "not float32, float16 or bfloat16");
            goto out;
        }
    }
    if ((v = json_get(root, "head_dim")) && v->type != JSON_NULL) {
        int64_t hd = 0;
        if (json_get_i64(v, &hd) < 0 || c->num_attention_heads <= 0 ||
            hd * c->num_attention_heads != c->hidden_size) {
            fail_at(&x, v, "head_dim", "must equal hidden_size / num_attention_heads");
            goto out;
        }
    }
    rc = model_config_check(c);
out:
    json_free(x.doc);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int hfconfig_generation_eos(const model_config_t *c, const char *gen_json, size_t len, int64_t *ids, int max, int *n,
                            int *from_gen)
{
    *n = 0;
    if (from_gen)
        *from_gen = 0;
    json_doc_t *doc = NULL;
    json_value_t *root = NULL;
    const json_value_t *v = NULL;
    if (gen_json) {
        json_opts_t jo = {.max_depth = 64};
        if (!(doc = json_parse(gen_json, len, &jo, &root))) {
            ftk_err_prefix("generation_config.json: ");
            return -1;
        }
        if (root->type != JSON_OBJECT) {
            ftk_err_set("generation_config.json: not a JSON object");
            json_free(doc);
            return -1;
        }
        v = json_get(root, "eos_token_id");
    }
    int rc = 0;
    if (gen_json && from_gen)
        *from_gen = 1;
    if (!gen_json) {
        if (c->eos_token_id >= 0 && max > 0)
            ids[(*n)++] = c->eos_token_id;
    } else if (v && v->type != JSON_NULL) { /* absent or null there: no end-of-sequence id at all */
        size_t k = v->type == JSON_ARRAY ? v->u.arr.n : 1;
        for (size_t i = 0; i < k && rc == 0; i++) {
            const json_value_t *e = v->type == JSON_ARRAY ? &v->u.arr.items[i] : v;
            int64_t id;
            if (json_get_i64(e, &id) < 0 || id < 0) {
                ftk_err_set("generation_config.json: eos_token_id: not a token id or a list of them");
                rc = -1;
            } else if (*n < max) {
                ids[(*n)++] = id;
            }
        }
    }
    json_free(doc);
    if (rc < 0) {
        *n = 0;
        return -1;
    }
    qsort(ids, (size_t)*n, sizeof *ids, cmp_i64);
    int m = 0;
    for (int i = 0; i < *n; i++)
        if (m == 0 || ids[m - 1] != ids[i])
            ids[m++] = ids[i];
    *n = m;
    return 0;
}

void hfconfig_ids_str(const int64_t *ids, int n, char *out, size_t size)
{
    if (n == 1) {
        snprintf(out, size, "%lld", (long long)ids[0]);
        return;
    }
    size_t k = (size_t)snprintf(out, size, n ? "[" : "none");
    for (int i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(out + k, size - k, "%s%lld", i ? ", " : "", (long long)ids[i]);
    if (n && k < size)
        snprintf(out + k, size - k, "]");
}

int hfconfig_eos_disagree(const int64_t *ids, int n, int from_gen, int64_t tok_eos, char *msg, size_t size)
{
    if ((n == 1 && ids[0] == tok_eos) || (n == 0 && tok_eos < 0))
        return 0;
    char a[128];
    hfconfig_ids_str(ids, n, a, sizeof a);
    if (n == 0) {
        snprintf(msg, size,
                 "generation stops at no end-of-sequence id (%s has no eos_token_id, and transformers' generate() "
                 "then runs to the length limit), but the tokenizer's EOS is %lld; ftk-generate follows transformers",
                 from_gen ? "generation_config.json" : "config.json", (long long)tok_eos);
        return 1;
    }
    snprintf(msg, size,
             "generation stops at %s (eos_token_id of %s, as transformers' generate() does), but the tokenizer's EOS "
             "is %lld; ftk-generate follows transformers",
             a, from_gen ? "generation_config.json" : "config.json", (long long)tok_eos);
    return 1;
}

/* ---------------------------------------------------------------- writing */

/* Shortest text that reads back as the same double ("1e-05", "10000.0"). */
static void fmt_double(char *out, size_t n, double v)
{
    if (v == (double)(int64_t)v && fabs(v) < 1e15) {
        snprintf(out, n, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            break;
    }
    if (!strpbrk(out, ".eEn")) /* keep it a float in JSON readers that care (Python) */
        snprintf(out + strlen(out), n - strlen(out), ".0");
}

static int token_field(buf_t *b, const char *name, int64_t id)
{
    return id < 0 ? buf_printf(b, "  \"%s\": null,\n", name) : buf_printf(b, "  \"%s\": %lld,\n", name, (long long)id);
}

int hfconfig_write(buf_t *out, const model_config_t *c, dtype_t dt)
{
    char eps[40], theta[40], init[40];
    fmt_double(eps, sizeof eps, c->rms_norm_eps);
    fmt_double(theta, sizeof theta, c->rope_theta);
    fmt_double(init, sizeof init, c->initializer_range);
    int rc = buf_printf(out, "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n");
    rc |= buf_printf(out, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n");
    rc |= token_field(out, "bos_token_id", c->bos_token_id);
    rc |= token_field(out, "eos_token_id", c->eos_token_id);
    rc |= buf_printf(out, "  \"head_dim\": %lld,\n", (long long)model_head_dim(c));
    rc |= buf_printf(out, "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %lld,\n", (long long)c->hidden_size);
    rc |= buf_printf(out, "  \"initializer_range\": %s,\n", init);
    rc |= buf_printf(out, "  \"intermediate_size\": %lld,\n", (long long)c->intermediate_size);
    rc |= buf_printf(out, "  \"max_position_embeddings\": %lld,\n", (long long)c->max_position_embeddings);
    rc |= buf_printf(out, "  \"mlp_bias\": false,\n  \"model_type\": \"llama\",\n");
    rc |= buf_printf(out, "  \"num_attention_heads\": %lld,\n", (long long)c->num_attention_heads);
    rc |= buf_printf(out, "  \"num_hidden_layers\": %lld,\n", (long long)c->num_hidden_layers);
    rc |= buf_printf(out, "  \"num_key_value_heads\": %lld,\n", (long long)c->num_key_value_heads);
    rc |= buf_printf(out, "  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": %s,\n  \"rope_scaling\": null,\n", eps);
    rc |= buf_printf(out, "  \"rope_theta\": %s,\n", theta);
    rc |= buf_printf(out, "  \"tie_word_embeddings\": %s,\n", c->tie_word_embeddings ? "true" : "false");
    rc |= buf_printf(out, "  \"torch_dtype\": \"%s\",\n", dtype_name(dt));
    rc |= buf_printf(out, "  \"use_cache\": true,\n  \"vocab_size\": %lld\n}\n", (long long)c->vocab_size);
    if (rc)
        ftk_err_set("out of memory");
    return rc ? -1 : 0;
}

/* ---------------------------------------------------------------- presets */

static const struct {
    const char *name;
    int64_t hidden, inter, layers, heads, kv, vocab, max_pos;
    double eps;
    int tied;
    dtype_t dt;
} presets[] = {
    {"tiny", 32, 96, 2, 4, 2, 512, 512, 1e-5, 0, DT_F32},
    {"stories260k", 64, 172, 5, 8, 4, 512, 512, 1e-5, 1, DT_F32},
    {"llama-1b", 2048, 5632, 22, 32, 4, 32000, 2048, 1e-5, 0, DT_BF16},
    {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, 1e-5, 0, DT_F16},
    {"llama2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, 1e-5, 0, DT_F16},
};

int model_preset(const char *name, model_config_t *c)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0)
            continue;
        model_config_defaults(c);
        c->hidden_size = presets[i].hidden;
        c->intermediate_size = presets[i].inter;
        c->num_hidden_layers = presets[i].layers;
        c->num_attention_heads = presets[i].heads;
        c->num_key_value_heads = presets[i].kv;
        c->vocab_size = presets[i].vocab;
        c->max_position_embeddings = presets[i].max_pos;
        c->rms_norm_eps = presets[i].eps;
        c->tie_word_embeddings = presets[i].tied;
        c->torch_dtype = presets[i].dt;
        return 0;
    }
    ftk_err_set("unknown preset \"%s\" (known: %s)", name, model_preset_names());
    return -1;
}

const char *model_preset_names(void) { return "tiny, stories260k, llama-1b, llama2-7b, llama2-13b"; }
