/* ftk-info — describe any ftk HDF5 file: format, metadata, datasets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../formats/h5.h"
#include "../formats/h5zstd.h"
#include "../formats/tokens.h"
#include "../formats/tokens_set.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"

static const opt_t options[] = {{0}};

static const opt_spec_t spec = {
    .tool = "ftk-info",
    .usage = "FILE.h5|TOKEN-SET...",
    .summary = "Describes ftk files: format and version, the metadata attributes, and every group and\n"
               "dataset with its shape, type, compression and checksum. Use ftk-verify to check them.\n"
               "A set of token shards (ftk-pack --shards; named by its base name or any of its files) is\n"
               "also described as a whole: the attributes its shards share, the rows, samples and tokens\n"
               "of each split, and which global rows each shard holds.",
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
    printf("%.*s: ftk token set of %d shards (%s … %s)\n", (int)(strlen(first) - 18), first, in->n_shards, first,
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
        printf("  /%-5s %lld rows, %lld samples, %lld tokens (whole set)\n", tokens_split_names[sp],
               (long long)in->rows[sp], (long long)in->samples[sp], (long long)in->tokens[sp]);
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

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-info");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    rc = FTK_EXIT_OK;
    for (int i = 0; i < npos; i++) {
        char *fmt = NULL;
        int64_t ver = 0, count = 0;
        if (access(pos[i], F_OK) != 0) { /* a set's base name */
            if (i)
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
        if (i)
            printf("\n");
        printf("%s: ftk %s file, format version %lld\n", pos[i], fmt, (long long)ver);
        int indent = 2;
        H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, NULL, print_attr, &indent);
        model_config_t c;
        if (strcmp(fmt, WEIGHTS_FORMAT) == 0 && weights_read_config(f, &c) == 0)
            printf("model: LlamaForCausalLM, %lld layers, hidden %lld, MLP %lld, %lld heads (%lld key/value%s), "
                   "vocab %lld, %s embeddings, %.2f M parameters\n",
                   (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.intermediate_size,
                   (long long)c.num_attention_heads, (long long)c.num_key_value_heads,
                   c.num_key_value_heads < c.num_attention_heads ? ": grouped-query" : "", (long long)c.vocab_size,
                   c.tie_word_embeddings ? "tied" : "untied", (double)model_n_params(&c) / 1e6);
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
    return rc;
}
