/* ftk-info — describe any ftk HDF5 file: format, metadata, datasets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/checkpoint.h"
#include "../formats/h5.h"
#include "../formats/json.h"
#include "../formats/h5zstd.h"
#include "../formats/tokens.h"
#include "../formats/tokens_set.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/plural.h"

static int json_out;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"json", 0, OPT_FLAG, &json_out, NULL, "print one JSON object per argument on stdout (JSON Lines)"},
    {0},
};
OPTS_TABLE_END

/* --json: the object being built for the current argument. */
static buf_t J;
static int j_first; /* no member written yet at the current nesting */

static void j_key(const char *k)
{
    if (!j_first)
        buf_putc(&J, ',');
    j_first = 0;
    if (k) {
        json_write_string(&J, k, strlen(k));
        buf_putc(&J, ':');
    }
}
static void j_open(const char *k, char c)
{
    j_key(k);
    buf_putc(&J, c);
    j_first = 1;
}
static void j_close(char c)
{
    buf_putc(&J, c);
    j_first = 0;
}
static void j_str(const char *k, const char *v)
{
    j_key(k);
    json_write_string(&J, v, strlen(v));
}
static void j_i64(const char *k, long long v)
{
    j_key(k);
    buf_printf(&J, "%lld", v);
}
static void j_num(const char *k, double v)
{
    j_key(k);
    buf_printf(&J, "%.17g", v);
}
static void j_flush(void)
{
    if (J.len)
        printf("%.*s\n", (int)J.len, J.data);
    J.len = 0;
    j_first = 1;
}

static const opt_spec_t spec = {
    .tool = "ftk-info",
    .usage = "FILE.h5|TOKEN-SET|RUN/|RUN/latest|RUN/step-NNNNNNNN...",
    .summary = "Describes ftk files: format and version, the metadata attributes, and every group and\n"
               "dataset with its shape, type, compression and checksum. Use ftk-verify to check them.\n"
               "A set of token shards (ftk-pack --shards; named by its base name or any of its files) is\n"
               "also described as a whole: the attributes its shards share, the rows, samples and tokens\n"
               "of each split, and which global rows each shard holds. A checkpoint (its directory, a run\n"
               "directory or its `latest`: the checkpoint it names) is described by its manifest: step, data\n"
               "position, initial weights, training options, model, and its shard files.",
    .epilog = "Exit status: 0 success, 2 a file is missing or not an ftk file.\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = -1,
};

static int set_attrs; /* printing a set's shared attributes: not shard_index */

static herr_t print_attr(hid_t loc, const char *name, const H5A_info_t *info, void *indent_p)
{
    (void)info;
    int indent = *(int *)indent_p;
    if (strcmp(name, "ftk_format") == 0 || strcmp(name, "ftk_format_version") == 0 ||
        (set_attrs && strcmp(name, "shard_index") == 0))
        return 0;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    H5T_class_t c = H5Tget_class(t);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    if (json_out) {
        if (c == H5T_STRING) {
            char *v = NULL;
            j_str(name, h5_attr_get_str(loc, name, &v) == 0 ? v : "");
            free(v);
        } else if (n == 1 && c == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_NONE) {
            uint64_t v = 0;
            h5_attr_get_u64(loc, name, &v);
            if (strcmp(name, "xxh3_64") == 0) {
                char hex[17];
                snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
                j_str(name, hex);
            } else {
                j_key(name);
                buf_printf(&J, "%llu", (unsigned long long)v);
            }
        } else if (n == 1 && c == H5T_INTEGER) {
            int64_t v = 0;
            h5_attr_get_i64(loc, name, &v);
            j_i64(name, (long long)v);
        } else if (n == 1 && c == H5T_FLOAT) {
            double v = 0;
            H5Aread(a, H5T_NATIVE_DOUBLE, &v);
            j_num(name, v);
        } else {
            j_str(name, "(array)");
        }
        H5Sclose(sp);
        H5Tclose(t);
        H5Aclose(a);
        return 0;
    }
    printf("%*s%-20s ", indent, "", name);
    if (c == H5T_STRING) {
        char *s = NULL;
        if (h5_attr_get_str(loc, name, &s) == 0)
            printf("\"%s\"\n", s);
        else
            printf("(unreadable string)\n");
        free(s);
    } else if (n == 1 && c == H5T_INTEGER) {
        if (H5Tget_sign(t) == H5T_SGN_NONE) {
            uint64_t v = 0;
            h5_attr_get_u64(loc, name, &v);
            if (strcmp(name, "xxh3_64") == 0)
                printf("%016llx\n", (unsigned long long)v);
            else
                printf("%llu\n", (unsigned long long)v);
        } else {
            int64_t v = 0;
            h5_attr_get_i64(loc, name, &v);
            printf("%lld\n", (long long)v);
        }
    } else if (n == 1 && c == H5T_FLOAT) {
        double v = 0;
        H5Aread(a, H5T_NATIVE_DOUBLE, &v);
        printf("%g\n", v);
    } else {
        printf("(%lld values)\n", (long long)n);
    }
    H5Sclose(sp);
    H5Tclose(t);
    H5Aclose(a);
    return 0;
}

static int name_width = 28;

static herr_t measure(hid_t file, const char *name, const H5O_info_t *info, void *op)
{
    (void)file, (void)op;
    if (info->type == H5O_TYPE_DATASET && (int)strlen(name) > name_width)
        name_width = (int)strlen(name);
    return 0;
}

static herr_t print_object(hid_t file, const char *name, const H5O_info_t *info, void *op)
{
    (void)op;
    if (strcmp(name, ".") == 0)
        return 0;
    int indent = 4;
    if (info->type == H5O_TYPE_GROUP && json_out) {
        j_open(NULL, '{');
        j_str("name", name);
        j_str("kind", "group");
        hid_t g = H5Gopen2(file, name, H5P_DEFAULT);
        j_open("attributes", '{');
        H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, NULL, print_attr, &indent);
        j_close('}');
        H5Gclose(g);
        j_close('}');
        return 0;
    }
    if (info->type == H5O_TYPE_GROUP) {
        printf("  /%s/\n", name);
        hid_t g = H5Gopen2(file, name, H5P_DEFAULT);
        H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, NULL, print_attr, &indent);
        H5Gclose(g);
        return 0;
    }
    if (info->type != H5O_TYPE_DATASET)
        return 0;
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    char type[32];
    h5_type_name(d, type, sizeof type);
    hid_t sp = H5Dget_space(d);
    hsize_t dims[8];
    int rank = H5Sget_simple_extent_ndims(sp);
    char shape[128] = "[";
    if (rank >= 0 && rank <= 8) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        for (int i = 0; i < rank; i++) {
            size_t l = strlen(shape);
            snprintf(shape + l, sizeof shape - l, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
        }
    }
    strncat(shape, "]", sizeof shape - strlen(shape) - 1);
    hid_t dcpl = H5Dget_create_plist(d);
    const char *filter = "";
    for (int i = 0; i < H5Pget_nfilters(dcpl); i++) {
        unsigned flags;
        size_t nelm = 0;
        char fname[64];
        if (H5Pget_filter2(dcpl, (unsigned)i, &flags, &nelm, NULL, sizeof fname, fname, NULL) == H5Z_FILTER_ZSTD)
            filter = "zstd";
        else
            filter = "filtered";
    }
    uint64_t sum = 0;
    int has_sum = H5Aexists(d, "xxh3_64") > 0 && h5_attr_get_u64(d, "xxh3_64", &sum) == 0;
    char sumtxt[40] = "no checksum";
    if (has_sum)
        snprintf(sumtxt, sizeof sumtxt, "xxh3 %016llx", (unsigned long long)sum);
    if (json_out) {
        j_open(NULL, '{');
        j_str("name", name);
        j_str("kind", "dataset");
        j_str("type", type);
        j_open("shape", '[');
        for (int i = 0; rank > 0 && i < rank && i < 8; i++)
            j_i64(NULL, (long long)dims[i]);
        j_close(']');
        j_str("compression", filter[0] ? filter : "none");
        if (has_sum) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
            j_str("xxh3", hex);
        }
        j_close('}');
    } else
        printf("  /%-*s %-9s %-16s %-5s %s\n", name_width, name, type, shape, filter[0] ? filter : "-", sumtxt);
    H5Pclose(dcpl);
    H5Sclose(sp);
    H5Dclose(d);
    return 0;
}

/* The set of token shards path names, as a whole (formats/tokens_set.h). */
static int describe_set(const char *path)
{
    tokens_set_t *s = tokens_set_open(path);
    if (!s) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    const tokens_set_info_t *in = tokens_set_info(s);
    const char *first = tokens_set_shard_path(s, 0);
    if (json_out) {
        j_open(NULL, '{');
        j_str("path", path);
        j_str("format", "tokens-set");
        j_i64("shards", in->n_shards);
        j_str("set_xxh3", in->set_xxh3);
        j_str("tokenizer_xxh3", in->tokenizer_xxh3);
        j_i64("vocab_size", in->vocab_size);
        j_i64("max_len", in->max_len);
        for (int sp = 0; sp < 2; sp++) {
            j_open(tokens_split_names[sp], '{');
            j_i64("rows", in->rows[sp]);
            j_i64("samples", in->samples[sp]);
            j_i64("tokens", in->tokens[sp]);
            j_close('}');
        }
        j_open("files", '[');
        for (int k = 0; k < in->n_shards; k++)
            j_str(NULL, tokens_set_shard_path(s, k));
        j_close(']');
        j_close('}');
        j_flush();
        tokens_set_close(s);
        return FTK_EXIT_OK;
    }
    printf("%.*s: ftk token set of %d shard%s (%s … %s)\n", (int)(strlen(first) - 18), first, in->n_shards,
           plural_s(in->n_shards), first,
           tokens_set_shard_path(s, in->n_shards - 1));
    hid_t f = h5_open(first, TOKENS_FORMAT, TOKENS_VERSION, NULL, NULL);
    if (f >= 0) { /* what every shard shares (tokens_set_open checked it); shard_index differs */
        int indent = 2;
        set_attrs = 1;
        H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, NULL, print_attr, &indent);
        set_attrs = 0;
        h5_close(f);
    }
    for (int sp = 0; sp < 2; sp++)
        printf("  /%-5s %lld row%s, %lld sample%s, %lld token%s (whole set)\n", tokens_split_names[sp],
               (long long)in->rows[sp], plural_s(in->rows[sp]), (long long)in->samples[sp], plural_s(in->samples[sp]),
               (long long)in->tokens[sp], plural_s(in->tokens[sp]));
    printf("shards (global rows):\n");
    int64_t at[2] = {0, 0};
    for (int k = 0; k < in->n_shards; k++) {
        int64_t tr = tokens_set_shard_rows(s, k, TOKENS_TRAIN), va = tokens_set_shard_rows(s, k, TOKENS_VAL);
        printf("  %s  train %lld..%lld, val %lld..%lld\n", tokens_set_shard_path(s, k), (long long)at[0],
               (long long)(at[0] + tr), (long long)at[1], (long long)(at[1] + va));
        at[0] += tr;
        at[1] += va;
    }
    tokens_set_close(s);
    return FTK_EXIT_OK;
}

static void print_model(const model_config_t *c)
{
    if (json_out) {
        j_open("model", '{');
        j_i64("num_hidden_layers", c->num_hidden_layers);
        j_i64("hidden_size", c->hidden_size);
        j_i64("intermediate_size", c->intermediate_size);
        j_i64("num_attention_heads", c->num_attention_heads);
        j_i64("num_key_value_heads", c->num_key_value_heads);
        j_i64("vocab_size", c->vocab_size);
        j_key("tie_word_embeddings");
        buf_printf(&J, "%s", c->tie_word_embeddings ? "true" : "false");
        j_i64("n_params", model_n_params(c));
        j_close('}');
        return;
    }
    printf("model: LlamaForCausalLM, %lld layer%s, hidden %lld, MLP %lld, %lld heads (%lld key/value%s), "
           "vocab %lld, %s embeddings, %.2f M parameters\n",
           (long long)c->num_hidden_layers, plural_s(c->num_hidden_layers), (long long)c->hidden_size,
           (long long)c->intermediate_size, (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
           c->num_key_value_heads < c->num_attention_heads ? ": grouped-query" : "", (long long)c->vocab_size,
           c->tie_word_embeddings ? "tied" : "untied", (double)model_n_params(c) / 1e6);
}

/* A checkpoint, a run directory or its `latest` (formats/checkpoint.h): the manifest. */
static int describe_ckpt(const char *path)
{
    ckpt_manifest_t man;
    char *dir = ckpt_open_path(path, &man);
    if (!dir) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    const ckpt_meta_t *m = &man.meta;
    const ckpt_train_t *t = &m->train;
    if (json_out) {
        j_open(NULL, '{');
        j_str("path", path);
        j_str("checkpoint", dir);
        j_str("format", CKPT_FORMAT);
        j_i64("format_version", CKPT_VERSION);
        j_i64("step", m->step);
        j_i64("total_steps", t->total_steps);
        j_i64("tokens_seen", m->tokens_seen);
        j_open("data", '{');
        j_str("file", m->data_file);
        j_str("set_xxh3", m->data_set_xxh3);
        j_i64("n_rows", m->data_rows);
        j_i64("epoch", m->epoch);
        j_i64("rows_consumed", m->rows_consumed);
        j_close('}');
        j_open("init", '{');
        j_str("file", m->init_file);
        j_str("xxh3", m->init_xxh3);
        j_close('}');
        j_open("train", '{');
        j_num("lr", t->lr);
        j_num("min_lr", t->min_lr);
        j_i64("warmup", t->warmup);
        j_str("schedule", t->schedule);
        j_i64("global_batch", t->global_batch);
        j_i64("micro_batch", t->micro_batch);
        j_num("beta1", t->beta1);
        j_num("beta2", t->beta2);
        j_num("eps", t->eps);
        j_num("weight_decay", t->weight_decay);
        j_num("clip", t->clip);
        j_i64("seed", t->seed);
        j_close('}');
        j_str("precision", m->precision);
        j_str("strategy", m->strategy);
        j_i64("world_size", m->world_size);
        j_i64("shard_count", m->shard_count);
        print_model(&man.cfg);
        j_open("shards", '[');
        for (int64_t i = 0; i < m->shard_count; i++) {
            char name[32], hex[17];
            ckpt_shard_name(name, i, m->shard_count);
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)man.shards[i].xxh3);
            j_open(NULL, '{');
            j_str("file", name);
            j_i64("bytes", (long long)man.shards[i].bytes);
            j_str("xxh3", hex);
            j_close('}');
        }
        j_close(']');
        j_close('}');
        j_flush();
    } else {
        int snap = ckpt_is_snapshot(dir);
        printf("%s: ftk %s, format version %d, step %lld of %lld\n", dir,
               snap ? "memory snapshot (a checkpoint of some shards: ftk-train --memory-snapshot-every)" : "checkpoint",
               CKPT_VERSION, (long long)m->step, (long long)t->total_steps);
        printf("  %-20s %lld\n", "tokens_seen", (long long)m->tokens_seen);
        printf("  %-20s %s (set %s, %lld row%s); epoch %lld, %lld row%s of it done\n", "data", m->data_file,
               m->data_set_xxh3, (long long)m->data_rows, plural_s(m->data_rows), (long long)m->epoch,
               (long long)m->rows_consumed, plural_s(m->rows_consumed));
        printf("  %-20s %s (xxh3 %s)\n", "init", m->init_file, m->init_xxh3);
        printf("  %-20s lr %g, min_lr %g, warmup %lld, schedule %s, global batch %lld, micro batch %lld, betas %g/%g, "
               "eps %g, weight decay %g, clip %g, seed %lld\n",
               "train", t->lr, t->min_lr, (long long)t->warmup, t->schedule, (long long)t->global_batch,
               (long long)t->micro_batch, t->beta1, t->beta2, t->eps, t->weight_decay, t->clip, (long long)t->seed);
        printf("  %-20s %s, strategy %s, %lld rank%s, %lld shard%s\n", "layout", m->precision, m->strategy,
               (long long)m->world_size, plural_s(m->world_size), (long long)m->shard_count,
               plural_s(m->shard_count));
        print_model(&man.cfg);
        printf("shards:\n");
        for (int64_t i = 0; i < m->shard_count; i++) {
            char name[32];
            ckpt_shard_name(name, i, m->shard_count);
            char p[4200], q[4200];
            snprintf(p, sizeof p, "%.4000s/%s", dir, name);
            snprintf(q, sizeof q, "%.*s.raw", (int)strlen(p) - 3, p);
            printf("  %s  %llu bytes  xxh3 %016llx%s\n", name, (unsigned long long)man.shards[i].bytes,
                   (unsigned long long)man.shards[i].xxh3,
                   !snap || !access(p, F_OK) ? "" : !access(q, F_OK) ? "  (here as a partner copy, .raw)" : "  (not here)");
        }
    }
    ckpt_manifest_free(&man);
    free(dir);
    return FTK_EXIT_OK;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-info");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    rc = FTK_EXIT_OK;
    j_first = 1;
    for (int i = 0; i < npos; i++) {
        char *fmt = NULL;
        int64_t ver = 0, count = 0;
        struct stat st;
        const char *base = strrchr(pos[i], '/') ? strrchr(pos[i], '/') + 1 : pos[i];
        if (stat(pos[i], &st) == 0 && (S_ISDIR(st.st_mode) || !strcmp(base, "latest"))) {
            if (i && !json_out)
                printf("\n");
            int r = describe_ckpt(pos[i]);
            rc = r ? r : rc;
            continue;
        }
        if (access(pos[i], F_OK) != 0) { /* a set's base name */
            if (i && !json_out)
                printf("\n");
            int r = describe_set(pos[i]);
            rc = r ? r : rc;
            continue;
        }
        hid_t f = h5_open(pos[i], NULL, 0, &fmt, &ver);
        if (f < 0) {
            ftk_error("%s", ftk_err_msg());
            rc = FTK_EXIT_USAGE;
            continue;
        }
        int indent = 2;
        model_config_t c;
        int is_weights = strcmp(fmt, WEIGHTS_FORMAT) == 0 && weights_read_config(f, &c) == 0;
        if (json_out) {
            j_open(NULL, '{');
            j_str("path", pos[i]);
            j_str("format", fmt);
            j_i64("format_version", (long long)ver);
            j_open("attributes", '{');
            H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, NULL, print_attr, &indent);
            j_close('}');
            if (is_weights)
                print_model(&c);
            j_open("objects", '[');
            H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, print_object, NULL);
            j_close(']');
            j_close('}');
            j_flush();
            free(fmt);
            h5_close(f);
            continue;
        }
        if (i)
            printf("\n");
        printf("%s: ftk %s file, format version %lld\n", pos[i], fmt, (long long)ver);
        H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, NULL, print_attr, &indent);
        if (is_weights)
            print_model(&c);
        printf("objects:\n");
        name_width = 28;
        H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, measure, NULL);
        H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, print_object, NULL);
        int shard = !strcmp(fmt, TOKENS_FORMAT) && h5_attr_get_i64(f, "shard_count", &count) == 0 && count > 1;
        free(fmt);
        h5_close(f);
        if (shard) {
            printf("\n");
            int r = describe_set(pos[i]);
            rc = r ? r : rc;
        }
    }
    buf_free(&J);
    return rc;
}
