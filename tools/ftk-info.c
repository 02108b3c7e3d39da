/* ftk-info — describe any ftk HDF5 file: format, metadata, datasets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/h5.h"
#include "../formats/h5zstd.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"

static const opt_t options[] = {{0}};

static const opt_spec_t spec = {
    .tool = "ftk-info",
    .usage = "FILE.h5...",
    .summary = "Describes ftk files: format and version, the metadata attributes, and every group and\n"
               "dataset with its shape, type, compression and checksum. Use ftk-verify to check them.",
    .epilog = "Exit status: 0 success, 2 a file is missing or not an ftk file.\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = -1,
};

static herr_t print_attr(hid_t loc, const char *name, const H5A_info_t *info, void *indent_p)
{
    (void)info;
    int indent = *(int *)indent_p;
    if (strcmp(name, "ftk_format") == 0 || strcmp(name, "ftk_format_version") == 0)
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
        int64_t ver = 0;
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
        free(fmt);
        h5_close(f);
    }
    return rc;
}
