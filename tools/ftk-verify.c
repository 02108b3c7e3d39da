/* ftk-verify — prove an ftk file whole: every checksum recomputed, every invariant of
 * its format checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../formats/h5.h"
#include "../formats/tokens.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"

static int deep;

static const opt_t options[] = {
    {"deep", 0, OPT_FLAG, &deep, NULL, "also scan weights for NaN and Inf values"},
    {0},
};

static const opt_spec_t spec = {
    .tool = "ftk-verify",
    .usage = "FILE.h5...",
    .summary = "Recomputes the XXH3-64 checksum of every dataset of each ftk file and compares it with\n"
               "the one stored when it was written, then checks the invariants of the file's format\n"
               "(for token files: ids inside the vocabulary, row and sample boundaries consistent,\n"
               "loss masks well formed, counts matching; for weights files: a valid config, every\n"
               "parameter present with the shape it implies, nothing else; with --deep no NaN/Inf).\n"
               "Prints one OK line per whole file.",
    .epilog = "Exit status: 0 every file whole, 2 a file is missing or unreadable as a path,\n"
              "3 a file is damaged (the message names the file, the dataset and what differs).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = -1,
};

typedef struct {
    const char *path;
    int n, bad;
} verify_ctx_t;

static int check_dataset(hid_t file, const char *name, void *p)
{
    verify_ctx_t *c = p;
    uint64_t stored, computed;
    int has;
    int r = h5_verify_dataset(file, name, &stored, &computed, &has);
    c->n++;
    if (r < 0) {
        ftk_error("%s: %s", c->path, ftk_err_msg());
        c->bad++;
    } else if (r > 0 && !has) {
        ftk_error("%s: dataset %s: no xxh3_64 checksum attribute", c->path, name);
        c->bad++;
    } else if (r > 0) {
        ftk_error("%s: dataset %s: checksum mismatch (stored %016llx, computed %016llx)", c->path, name,
                  (unsigned long long)stored, (unsigned long long)computed);
        c->bad++;
    }
    return 0;
}

static int check_tokens(const char *path, hid_t f)
{
    int64_t vocab, max_len, packed, pad, n_samples, n_tokens;
    if (h5_attr_get_i64(f, "vocab_size", &vocab) < 0 || h5_attr_get_i64(f, "max_len", &max_len) < 0 ||
        h5_attr_get_i64(f, "packed", &packed) < 0 || h5_attr_get_i64(f, "pad_id", &pad) < 0 ||
        h5_attr_get_i64(f, "n_samples", &n_samples) < 0 || h5_attr_get_i64(f, "n_tokens", &n_tokens) < 0) {
        ftk_error("%s: root: %s", path, ftk_err_msg());
        return 1;
    }
    static const char *groups[] = {"train", "val"};
    for (int g = 0; g < 2; g++) {
        tokens_split_t s;
        if (tokens_read_split(f, groups[g], &s) < 0) {
            ftk_error("%s: %s", path, ftk_err_msg());
            return 1;
        }
        int r = tokens_check_split(&s, vocab, max_len, (int)packed, (int32_t)pad);
        tokens_split_free(&s);
        if (r) {
            ftk_error("%s: /%s: %s", path, groups[g], ftk_err_msg());
            return 1;
        }
    }
    return 0;
}

static int check_weights(const char *path, hid_t f)
{
    model_config_t c;
    if (weights_read_config(f, &c) < 0) {
        ftk_error("%s: %s", path, ftk_err_msg());
        return 1;
    }
    size_t n = weights_n_tensors(&c);
    int bad = 0;
    H5G_info_t gi;
    hid_t g = H5Lexists(f, "tensors", H5P_DEFAULT) > 0 ? H5Gopen2(f, "tensors", H5P_DEFAULT) : -1;
    if (g < 0 || H5Gget_info(g, &gi) < 0) {
        ftk_error("%s: no /tensors group", path);
        if (g >= 0)
            H5Gclose(g);
        return 1;
    }
    H5Gclose(g);
    if (gi.nlinks != n) {
        ftk_error("%s: /tensors holds %llu tensors, the config implies %zu", path, (unsigned long long)gi.nlinks, n);
        bad++;
    }
    void *block = NULL;
    size_t block_cap = 0;
    const size_t block_bytes = 16u << 20;
    for (size_t i = 0; i < n && bad < 10; i++) {
        weights_spec_t s;
        weights_tensor_spec(&c, i, &s);
        char p[WEIGHTS_NAME_MAX + 16];
        snprintf(p, sizeof p, "tensors/%s", s.name);
        hsize_t dims[8];
        dtype_t dt = weights_tensor_dtype(f, s.name);
        int rank = dt == DT_INVALID ? -1 : h5r_shape(f, p, dims);
        if (rank < 0) {
            ftk_error("%s: %s", path, ftk_err_msg());
            bad++;
            continue;
        }
        if (rank != s.rank || (int64_t)dims[0] != s.shape[0] || (rank == 2 && (int64_t)dims[1] != s.shape[1])) {
            ftk_error("%s: tensor %s: shape does not match the config", path, s.name);
            bad++;
            continue;
        }
        if (!deep)
            continue;
        int64_t rows = s.rank == 2 ? s.shape[0] : 1, cols = s.rank == 2 ? s.shape[1] : s.shape[0];
        size_t row_bytes = (size_t)cols * dtype_size(dt);
        int64_t per = row_bytes >= block_bytes ? 1 : (int64_t)(block_bytes / row_bytes);
        if ((size_t)per * row_bytes > block_cap) { /* one row may exceed the usual block */
            free(block);
            block_cap = (size_t)per * row_bytes;
            if (!(block = malloc(block_cap))) {
                ftk_error("out of memory");
                return bad + 1;
            }
        }
        uint64_t nan = 0, inf = 0;
        for (int64_t r = 0; r < rows; r += per) {
            int64_t k = rows - r < per ? rows - r : per;
            if (weights_read_rows(f, s.name, dt, r, k, block, NULL) < 0) {
                ftk_error("%s: %s", path, ftk_err_msg());
                bad++;
                break;
            }
            dtype_count_nonfinite(block, dt, (size_t)(k * cols), &nan, &inf);
        }
        if (nan || inf) {
            ftk_error("%s: tensor %s: %llu NaN and %llu infinite values", path, s.name, (unsigned long long)nan,
                      (unsigned long long)inf);
            bad++;
        }
    }
    free(block);
    return bad;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-verify");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    rc = FTK_EXIT_OK;
    for (int i = 0; i < npos; i++) {
        const char *path = pos[i];
        if (access(path, R_OK) != 0) {
            ftk_error("%s: cannot read it", path);
            rc = FTK_EXIT_USAGE;
            continue;
        }
        char *fmt = NULL;
        int64_t ver = 0;
        hid_t f = h5_open(path, NULL, 0, &fmt, &ver);
        if (f < 0) {
            ftk_error("%s", ftk_err_msg());
            if (rc == FTK_EXIT_OK)
                rc = FTK_EXIT_VERIFY;
            continue;
        }
        verify_ctx_t c = {.path = path};
        if (h5_each_dataset(f, check_dataset, &c) < 0) {
            ftk_error("%s: %s", path, ftk_err_msg());
            c.bad++;
        }
        const char *what = "checksums";
        if (strcmp(fmt, TOKENS_FORMAT) == 0) {
            if (ver > TOKENS_VERSION) {
                ftk_error("%s: tokens format version %lld is newer than this ftk knows (%d)", path, (long long)ver,
                          TOKENS_VERSION);
                c.bad++;
            } else if (!c.bad) {
                c.bad += check_tokens(path, f);
                what = "checksums and token-file invariants";
            }
        } else if (strcmp(fmt, WEIGHTS_FORMAT) == 0) {
            if (ver > WEIGHTS_VERSION) {
                ftk_error("%s: weights format version %lld is newer than this ftk knows (%d)", path, (long long)ver,
                          WEIGHTS_VERSION);
                c.bad++;
            } else if (!c.bad) {
                c.bad += check_weights(path, f);
                what = deep ? "checksums, shapes and values (no NaN/Inf)" : "checksums and shapes";
            }
        } else {
            ftk_warn("%s: format \"%s\" is not known to this ftk: checksums only", path, fmt);
        }
        h5_close(f);
        if (c.bad) {
            if (rc == FTK_EXIT_OK)
                rc = FTK_EXIT_VERIFY;
        } else {
            printf("%s: OK (%s v%lld, %d datasets; %s verified)\n", path, fmt, (long long)ver, c.n, what);
        }
        free(fmt);
    }
    return rc;
}
