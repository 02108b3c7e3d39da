#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/output.h"
#include "../libcommon/fault.h"
#include "../libcommon/log.h"
#include "../libcommon/progress.h"

/* Per layer, in canonical order. */
static const char *layer_names[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight",        "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight",       "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",   "mlp.up_proj.weight",             "mlp.down_proj.weight",
};
#define N_LAYER_TENSORS 9

size_t weights_n_tensors(const model_config_t *c)
{
    return 1 + (size_t)c->num_hidden_layers * N_LAYER_TENSORS + 1 + (c->tie_word_embeddings ? 0 : 1);
}

void weights_tensor_spec(const model_config_t *c, size_t i, weights_spec_t *o)
{
    int64_t h = c->hidden_size, hd = model_head_dim(c), q = c->num_attention_heads * hd,
            kv = c->num_key_value_heads * hd, f = c->intermediate_size;
    size_t n_layer = (size_t)c->num_hidden_layers * N_LAYER_TENSORS;
    memset(o, 0, sizeof *o);
    o->rank = 2;
    if (i == 0) {
        snprintf(o->name, sizeof o->name, "model.embed_tokens.weight");
        o->shape[0] = c->vocab_size, o->shape[1] = h;
        return;
    }
    if (i == 1 + n_layer) {
        snprintf(o->name, sizeof o->name, "model.norm.weight");
        o->rank = 1, o->shape[0] = h, o->is_norm = 1;
        return;
    }
    if (i == 2 + n_layer) {
        snprintf(o->name, sizeof o->name, "lm_head.weight");
        o->shape[0] = c->vocab_size, o->shape[1] = h;
        return;
    }
    size_t l = (i - 1) / N_LAYER_TENSORS, k = (i - 1) % N_LAYER_TENSORS;
    snprintf(o->name, sizeof o->name, "model.layers.%zu.%s", l, layer_names[k]);
    static const int rows[N_LAYER_TENSORS] = {0, 1, 2, 2, 3, 0, 4, 4, 3}, cols[N_LAYER_TENSORS] = {0, 3, 3, 3, 1, 0, 3, 3, 4};
    int64_t dim_of[5] = {h, q, kv, h, f};
    if (k == 0 || k == 5) {
        o->rank = 1, o->shape[0] = h, o->is_norm = 1;
        return;
    }
    o->shape[0] = dim_of[rows[k]];
    o->shape[1] = dim_of[cols[k]];
}

long weights_find(const model_config_t *c, const char *name)
{
    /* Layer tensors are found by parsing the index, so the search stays O(1) per name. */
    unsigned long l;
    int off = 0;
    if (sscanf(name, "model.layers.%lu.%n", &l, &off) == 1 && off > 0 && l < (unsigned long)c->num_hidden_layers) {
        char canon[WEIGHTS_NAME_MAX];
        snprintf(canon, sizeof canon, "model.layers.%lu.", l);
        if (strncmp(name, canon, strlen(canon)) != 0) /* "model.layers.01." is not a name */
            return -1;
        for (int k = 0; k < N_LAYER_TENSORS; k++)
            if (strcmp(name + off, layer_names[k]) == 0)
                return (long)(1 + l * N_LAYER_TENSORS + (unsigned long)k);
        return -1;
    }
    size_t n_layer = (size_t)c->num_hidden_layers * N_LAYER_TENSORS;
    if (strcmp(name, "model.embed_tokens.weight") == 0)
        return 0;
    if (strcmp(name, "model.norm.weight") == 0)
        return (long)(1 + n_layer);
    if (!c->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)
        return (long)(2 + n_layer);
    return -1;
}

static int write_config(hid_t g, const model_config_t *c)
{
    const struct {
        const char *name;
        int64_t v;
    } ints[] = {{"hidden_size", c->hidden_size},
                {"intermediate_size", c->intermediate_size},
                {"num_hidden_layers", c->num_hidden_layers},
                {"num_attention_heads", c->num_attention_heads},
                {"num_key_value_heads", c->num_key_value_heads},
                {"vocab_size", c->vocab_size},
                {"max_position_embeddings", c->max_position_embeddings},
                {"tie_word_embeddings", c->tie_word_embeddings},
                {"bos_token_id", c->bos_token_id},
                {"eos_token_id", c->eos_token_id}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (h5_attr_set_i64(g, ints[i].name, ints[i].v) < 0)
            return -1;
    if (h5_attr_set_f64(g, "rms_norm_eps", c->rms_norm_eps) < 0 || h5_attr_set_f64(g, "rope_theta", c->rope_theta) < 0 ||
        h5_attr_set_f64(g, "initializer_range", c->initializer_range) < 0 ||
        h5_attr_set_str(g, "torch_dtype", dtype_name(c->torch_dtype)) < 0)
        return -1;
    return 0;
}

hid_t weights_create(const char *path, const model_config_t *c, const char *dtype_label, const char *source)
{
    hid_t f = h5_create(path, WEIGHTS_FORMAT, WEIGHTS_VERSION);
    if (f < 0)
        return f;
    hid_t g = -1;
    int ok = h5_attr_set_str(f, "dtype", dtype_label) == 0 && h5_attr_set_i64(f, "n_params", model_n_params(c)) == 0 &&
             h5_attr_set_str(f, "source", source) == 0 && (g = h5_group_create(f, "config")) >= 0 &&
             write_config(g, c) == 0;
    if (g >= 0)
        H5Gclose(g);
    for (int i = 0; ok && i < 2; i++) {
        hid_t x = h5_group_create(f, i ? "tokenizer" : "tensors");
        ok = x >= 0;
        if (ok)
            H5Gclose(x);
    }
    if (!ok) {
        ftk_err_prefix("%s: ", path);
        H5Fclose(f);
        return H5I_INVALID_HID;
    }
    return f;
}

static int attr_f64(hid_t g, const char *name, double *v)
{
    hid_t a = H5Aexists(g, name) > 0 ? H5Aopen(g, name, H5P_DEFAULT) : -1;
    int rc = a >= 0 && H5Aread(a, H5T_NATIVE_DOUBLE, v) >= 0 ? 0 : -1;
    if (a >= 0)
        H5Aclose(a);
    if (rc < 0)
        ftk_err_set("/config: attribute %s is missing or not a number", name);
    return rc;
}

int weights_read_config(hid_t file, model_config_t *c)
{
    model_config_defaults(c);
    if (H5Lexists(file, "config", H5P_DEFAULT) <= 0) {
        ftk_err_set("no /config group");
        return -1;
    }
    hid_t g = H5Gopen2(file, "config", H5P_DEFAULT);
    int64_t tie = 0;
    char *dt = NULL;
    int rc = -1;
    if (h5_attr_get_i64(g, "hidden_size", &c->hidden_size) == 0 &&
        h5_attr_get_i64(g, "intermediate_size", &c->intermediate_size) == 0 &&
        h5_attr_get_i64(g, "num_hidden_layers", &c->num_hidden_layers) == 0 &&
        h5_attr_get_i64(g, "num_attention_heads", &c->num_attention_heads) == 0 &&
        h5_attr_get_i64(g, "num_key_value_heads", &c->num_key_value_heads) == 0 &&
        h5_attr_get_i64(g, "vocab_size", &c->vocab_size) == 0 &&
        h5_attr_get_i64(g, "max_position_embeddings", &c->max_position_embeddings) == 0 &&
        h5_attr_get_i64(g, "tie_word_embeddings", &tie) == 0 && h5_attr_get_i64(g, "bos_token_id", &c->bos_token_id) == 0 &&
        h5_attr_get_i64(g, "eos_token_id", &c->eos_token_id) == 0 && attr_f64(g, "rms_norm_eps", &c->rms_norm_eps) == 0 &&
        attr_f64(g, "rope_theta", &c->rope_theta) == 0 && attr_f64(g, "initializer_range", &c->initializer_range) == 0 &&
        h5_attr_get_str(g, "torch_dtype", &dt) == 0) {
        c->tie_word_embeddings = tie != 0;
        c->torch_dtype = dtype_parse(dt);
        rc = c->torch_dtype == DT_INVALID ? (ftk_err_set("/config: torch_dtype \"%s\" unknown", dt), -1) : 0;
    } else {
        ftk_err_prefix("/config: ");
    }
    free(dt);
    H5Gclose(g);
    if (rc == 0 && model_config_check(c) < 0) {
        ftk_err_prefix("/config: ");
        rc = -1;
    }
    return rc;
}

/* The dataset path of a parameter: "tensors/NAME". */
static void tensor_path(char *out, size_t n, const char *name) { snprintf(out, n, "tensors/%s", name); }

int weights_check_tensors(hid_t file, const model_config_t *c)
{
    size_t n = weights_n_tensors(c);
    for (size_t i = 0; i < n; i++) {
        weights_spec_t s;
        weights_tensor_spec(c, i, &s);
        if (weights_tensor_dtype(file, s.name) == DT_INVALID)
            return -1;
        char path[WEIGHTS_NAME_MAX + 16];
        tensor_path(path, sizeof path, s.name);
        hsize_t dims[8];
        int rank = h5r_shape(file, path, dims);
        if (rank < 0)
            return -1;
        int same = rank == s.rank && (int64_t)dims[0] == s.shape[0] && (rank == 1 || (int64_t)dims[1] == s.shape[1]);
        if (!same) {
            char got[96] = "", want[64];
            for (int k = 0; k < rank && k < 8; k++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", k ? ", " : "",
                         (unsigned long long)dims[k]);
            if (s.rank == 1)
                snprintf(want, sizeof want, "%lld", (long long)s.shape[0]);
            else
                snprintf(want, sizeof want, "%lld, %lld", (long long)s.shape[0], (long long)s.shape[1]);
            ftk_err_set("tensor %s has shape [%s]; the file's /config needs [%s]", s.name, got, want);
            return -1;
        }
    }
    return 0;
}

hid_t weights_open(const char *path, model_config_t *c)
{
    hid_t f = h5_open(path, WEIGHTS_FORMAT, WEIGHTS_VERSION, NULL, NULL);
    if (f < 0)
        return f;
    if (weights_read_config(f, c) < 0 || weights_check_tensors(f, c) < 0) {
        ftk_err_prefix("%s: ", path);
        H5Fclose(f);
        return H5I_INVALID_HID;
    }
    return f;
}

hid_t weights_h5type(dtype_t dt)
{
    return dt == DT_F32 ? H5T_NATIVE_FLOAT : dt == DT_F16 ? h5_f16_type() : H5T_NATIVE_UINT16;
}

h5w_stream_t *weights_tensor_begin(hid_t file, const weights_spec_t *s, dtype_t dt, int zstd_level)
{
    char path[WEIGHTS_NAME_MAX + 16];
    tensor_path(path, sizeof path, s->name);
    hsize_t dims[2] = {(hsize_t)s->shape[0], (hsize_t)s->shape[1]};
    h5w_opts_t o = {.zstd_level = zstd_level};
    h5w_stream_t *w = h5w_open(file, path, weights_h5type(dt), s->rank, dims, &o);
    if (w && dt == DT_BF16 && h5_attr_set_str(h5w_dataset(w), "dtype", "bfloat16") < 0) {
        h5w_close(w, NULL);
        return NULL;
    }
    return w;
}

dtype_t weights_tensor_dtype(hid_t file, const char *name)
{
    char path[WEIGHTS_NAME_MAX + 16];
    tensor_path(path, sizeof path, name);
    if (H5Lexists(file, "tensors", H5P_DEFAULT) <= 0 || H5Lexists(file, path, H5P_DEFAULT) <= 0) {
        ftk_err_set("tensor %s is missing", name);
        return DT_INVALID;
    }
    hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("tensor %s: cannot open", name);
        return DT_INVALID;
    }
    char tn[32];
    h5_type_name(d, tn, sizeof tn);
    H5Dclose(d);
    dtype_t dt = dtype_parse(tn);
    if (dt == DT_INVALID)
        ftk_err_set("tensor %s: stored as %s, not float32/float16/bfloat16", name, tn);
    return dt;
}

int weights_read_rows(hid_t file, const char *name, dtype_t dt, int64_t row0, int64_t n, void *out, void *scratch)
{
    char path[WEIGHTS_NAME_MAX + 16];
    tensor_path(path, sizeof path, name);
    dtype_t st = weights_tensor_dtype(file, name);
    if (st == DT_INVALID)
        return -1;
    hsize_t dims[8];
    int rank = h5r_shape(file, path, dims);
    if (rank < 1 || rank > 2)
        return -1;
    hsize_t cols = rank == 2 ? dims[1] : dims[0];
    if (rank == 1) /* one row: the whole vector */
        n = n > 0 ? 1 : 0, row0 = row0 > 0 ? 1 : 0;
    hsize_t nr = rank == 1 ? (hsize_t)n * dims[0] : (hsize_t)n;
    void *dst = st == dt ? out : scratch;
    if (h5r_read_rows(file, path, weights_h5type(st), rank == 1 ? 0 : (hsize_t)row0, nr, dst) < 0)
        return -1;
    if (st != dt)
        dtype_convert(out, dt, scratch, st, (size_t)((hsize_t)n * cols));
    return 0;
}

int weights_tensor_raw(hid_t file, const char *name, int *fd, int64_t *offset, uint64_t *xxh3, int *has_sum)
{
    dtype_t st = weights_tensor_dtype(file, name);
    if (st == DT_INVALID)
        return -1;
    char path[WEIGHTS_NAME_MAX + 16];
    tensor_path(path, sizeof path, name);
    hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("tensor %s: cannot open", name);
        return -1;
    }
    int raw = 0;
    hid_t dcpl = H5Dget_create_plist(d), ft = H5Dget_type(d), fs = H5Dget_space(d);
    haddr_t at = H5Dget_offset(d);
    hssize_t n = fs >= 0 ? H5Sget_simple_extent_npoints(fs) : -1;
    void *handle = NULL;
    if (dcpl >= 0 && ft >= 0 && n >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 &&
        at != HADDR_UNDEF && H5Tequal(ft, weights_h5type(st)) > 0 &&
        H5Dget_storage_size(d) == (hsize_t)n * dtype_size(st) && H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) >= 0 &&
        handle) {
        hid_t fapl = H5Fget_access_plist(file);
        raw = fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2; /* its handle is an int descriptor */
        if (fapl >= 0)
            H5Pclose(fapl);
    }
    if (raw) {
        *fd = *(int *)handle;
        *offset = (int64_t)at;
        *has_sum = H5Aexists(d, "xxh3_64") > 0 && h5_attr_get_u64(d, "xxh3_64", xxh3) == 0;
    }
    if (fs >= 0)
        H5Sclose(fs);
    if (ft >= 0)
        H5Tclose(ft);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    H5Dclose(d);
    return raw;
}

int weights_put_file(hid_t file, const char *name, const void *data, size_t len)
{
    char path[256];
    if (strchr(name, '/') || snprintf(path, sizeof path, "tokenizer/%s", name) >= (int)sizeof path) {
        ftk_err_set("tokenizer file name %s is not a plain file name", name);
        return -1;
    }
    hsize_t dims[1] = {len};
    return h5w_write_tensor(file, path, H5T_NATIVE_UINT8, 1, dims, data, NULL, NULL);
}

typedef struct {
    char **names;
    size_t n, cap;
} names_t;

static herr_t collect_name(hid_t g, const char *name, const H5L_info_t *info, void *op)
{
    (void)g, (void)info;
    names_t *l = op;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        char **p = realloc(l->names, cap * sizeof *p);
        if (!p)
            return -1;
        l->names = p, l->cap = cap;
    }
    return (l->names[l->n++] = strdup(name)) ? 0 : -1;
}

int weights_each_file(hid_t file, int (*fn)(const char *name, const void *data, size_t len, void *ctx), void *ctx)
{
    if (H5Lexists(file, "tokenizer", H5P_DEFAULT) <= 0)
        return 0;
    hid_t g = H5Gopen2(file, "tokenizer", H5P_DEFAULT);
    names_t l = {0};
    int rc = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, collect_name, &l) < 0 ? -1 : 0;
    if (rc < 0)
        ftk_err_set("/tokenizer: cannot list");
    for (size_t i = 0; i < l.n && rc == 0; i++) {
        hsize_t dims[8];
        if (h5r_shape(g, l.names[i], dims) != 1) {
            ftk_err_set("/tokenizer/%s is not a byte string", l.names[i]);
            rc = -1;
            break;
        }
        uint8_t *data = malloc((size_t)dims[0] + 1);
        if (!data || h5r_read(g, l.names[i], H5T_NATIVE_UINT8, data, (size_t)dims[0]) < 0) {
            if (!data)
                ftk_err_set("out of memory");
            rc = -1;
        } else {
            rc = fn(l.names[i], data, (size_t)dims[0], ctx);
        }
        free(data);
    }
    for (size_t i = 0; i < l.n; i++)
        free(l.names[i]);
    free(l.names);
    H5Gclose(g);
    return rc;
}

static int write_file(const char *path, const weights_source_t *src, uint64_t *bytes)
{
    const model_config_t *c = src->cfg;
    size_t n = weights_n_tensors(c);
    uint64_t total = 0, done = 0;
    weights_spec_t s;
    for (size_t i = 0; i < n; i++) {
        weights_tensor_spec(c, i, &s);
        total += (uint64_t)s.shape[0] * (uint64_t)(s.rank == 2 ? s.shape[1] : 1) * dtype_size(src->dtype(src->ctx, i));
    }
    hid_t f = weights_create(path, c, src->dtype_label, src->source);
    if (f < 0)
        return -1;
    const size_t block_bytes = 32u << 20;
    void *scratch = NULL;
    size_t scratch_size = 0;
    progress_t prog;
    progress_start(&prog, "writing", (int64_t)(total >> 20), "MiB");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        weights_tensor_spec(c, i, &s);
        dtype_t dt = src->dtype(src->ctx, i);
        int64_t rows = s.rank == 2 ? s.shape[0] : 1, cols = s.rank == 2 ? s.shape[1] : s.shape[0];
        size_t row_bytes = (size_t)cols * dtype_size(dt);
        int64_t per = row_bytes ? (int64_t)(block_bytes / row_bytes) : rows;
        if (per < 1)
            per = 1;
        if (per > rows)
            per = rows;
        if ((size_t)per * row_bytes > scratch_size) {
            free(scratch);
            scratch_size = (size_t)per * row_bytes;
            if (!(scratch = malloc(scratch_size))) {
                ftk_err_set("out of memory (%zu bytes)", scratch_size);
                rc = -1;
                break;
            }
        }
        h5w_stream_t *w = weights_tensor_begin(f, &s, dt, src->zstd_level);
        if (!w) {
            rc = -1;
            break;
        }
        for (int64_t r = 0; r < rows && rc == 0; r += per) {
            int64_t k = rows - r < per ? rows - r : per;
            const void *p = src->rows(src->ctx, i, &s, dt, r, k, scratch);
            /* A 1-D tensor is written as one block of shape[0] "rows" of one element. */
            if (!p || h5w_append(w, p, (hsize_t)(s.rank == 2 ? k : cols)) < 0 || fault_point("weights.write") < 0)
                rc = -1;
            done += (uint64_t)k * row_bytes;
            progress_update(&prog, (int64_t)(done >> 20));
        }
        if (h5w_close(w, NULL) < 0)
            rc = -1;
        if (rc < 0)
            ftk_err_prefix("%s: ", s.name);
    }
    progress_done(&prog);
    free(scratch);
    if (rc == 0 && src->extra)
        rc = src->extra(src->ctx, f);
    if (h5_close(f) < 0)
        rc = -1;
    if (bytes)
        *bytes = done;
    return rc;
}

int weights_write_file(const char *path, int flags, const weights_source_t *src, uint64_t *bytes)
{
    output_t out;
    if (output_begin(&out, path, flags | OUTPUT_FILE_ONLY) < 0)
        return -1;
    if (write_file(output_tmp_path(&out), src, bytes) < 0) {
        ftk_err_prefix("%s: ", path);
        output_abort(&out);
        return -1;
    }
    return output_commit(&out);
}
