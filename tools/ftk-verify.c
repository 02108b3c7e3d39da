/* ftk-verify — prove an ftk file whole: every checksum recomputed, every invariant of
 * its format checked. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/checkpoint.h"
#include "../formats/ckpt_verify.h"
#include "../formats/h5.h"
#include "../formats/json.h"
#include "../formats/tokens.h"
#include "../formats/tokens_set.h"
#include "../formats/weights.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"

static int deep;
static const char *compare_mode;
static double cmp_rtol, cmp_atol;
static int json_out;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"deep", 0, OPT_FLAG, &deep, NULL, "also scan weights and checkpoint arrays for NaN and Inf values"},
    {"compare", 0, OPT_FLAG, &compare_mode, NULL,
     "compare two ftk files (or two checkpoints) of the same kind value by value instead"},
    {"rtol", 0, OPT_DOUBLE, &cmp_rtol, "R", "--compare: relative tolerance, |a-b| <= atol + rtol*|b| (0: exact)", "0.."},
    {"atol", 0, OPT_DOUBLE, &cmp_atol, "A", "--compare: absolute tolerance", "0.."},
    {"json", 0, OPT_FLAG, &json_out, NULL,
     "print one JSON object per path (--compare: one in all) on stdout: path, ok, exit status, report lines"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-verify",
    .usage = "FILE.h5|TOKEN-SET|CHECKPOINT|RUN...   or   --compare A B",
    .summary = "Recomputes the XXH3-64 checksum of every dataset of each ftk file and compares it with\n"
               "the one stored when it was written, then checks the invariants of the file's format\n"
               "(for token files: ids inside the vocabulary, row and sample boundaries consistent,\n"
               "loss masks well formed, counts matching; for weights files: a valid config, every\n"
               "parameter present with the shape it implies, nothing else; with --deep no NaN/Inf).\n"
               "A set of token shards (ftk-pack --shards; its base name or any of its files) is checked\n"
               "as a whole: every shard's checksums, then the shards' names, indices and count, the\n"
               "attributes they share, the set checksum and every row; one OK line per shard and one\n"
               "for the set.\n"
               "A checkpoint (a step-NNNNNNNN directory or RUN/latest): the manifest well formed and\n"
               "consistent with config.json and the model; every shard file present, of the recorded\n"
               "size and checksum, holding the shard index, count, step and shard map the manifest\n"
               "says; every dataset's checksum; the shard map covering every element of every\n"
               "parameter exactly once, padding zero; --deep: no NaN/Inf in weights or moments. A\n"
               "run with --compress-grads: one gradient residual per unit in every shard, each of the\n"
               "unit's padded length, float32, checksummed and with no NaN/Inf (--deep or not). Every\n"
               "precision: each dataset of the type the manifest's precision implies (float32, or\n"
               "bfloat16 for bf16-true), checked on its stored bytes. A run directory: every\n"
               "committed checkpoint, `latest`, and leftovers of unfinished writes.\n"
               "Prints one OK line per whole file or checkpoint.\n"
               "--compare A B: the same datasets (or, for checkpoints, the same step, data state and\n"
               "every unit's weights and moments, whatever the shard counts) compared value by value;\n"
               "one line per tensor: identical, or the largest absolute and relative difference.\n"
               "Checkpoints of different precisions compare by value, each widened to float32 (a\n"
               "bf16-true checkpoint against its fp32 origin differs by bf16 rounding: --rtol 2^-8).",
    .epilog = "Exit status: 0 every file whole (--compare: equal within the tolerances), 2 a path is\n"
              "missing or not an ftk file or checkpoint, 3 damaged or different (the message names\n"
              "the file, the dataset and what differs; a set of shards with one missing, extra or\n"
              "foreign is damaged).\n",
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

/* The token-file invariants of the set path names (one file, or every shard): its row
 * index at open, then every row in a streaming pass (bounded memory: tokens_set.h). */
static int check_tokens(const char *path, int64_t *rows)
{
    tokens_set_t *s = tokens_set_open(path);
    if (!s) {
        ftk_error("%s", ftk_err_msg());
        return 1;
    }
    const tokens_set_info_t *in = tokens_set_info(s);
    for (int sp = 0; sp < 2; sp++) {
        if (tokens_set_check(s, sp, 0, in->rows[sp])) {
            ftk_error("%s", ftk_err_msg());
            tokens_set_close(s);
            return 1;
        }
        if (rows)
            rows[sp] = in->rows[sp];
    }
    tokens_set_close(s);
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

/* Whether a file that does not open as an ftk file is a damaged one (3) rather than not
 * one at all (2: a JSON file, an HDF5 file of another program): it begins as HDF5 does
 * but HDF5 cannot open it (truncated, its superblock broken). */
static int damaged_hdf5(const char *path)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *fp = fopen(path, "rb");
    int has_sig = fp && fread(head, 1, 8, fp) == 8 && !memcmp(head, sig, 8);
    if (fp)
        fclose(fp);
    if (!has_sig)
        return 0;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return 1;
    H5Fclose(f);
    return 0;
}

/* One ftk HDF5 file: FTK_EXIT_OK, FTK_EXIT_USAGE or FTK_EXIT_VERIFY. */
static int verify_file(const char *path)
{
    int rc = FTK_EXIT_OK;
    if (access(path, R_OK) != 0) {
        ftk_error("%s: cannot read it", path);
        return FTK_EXIT_USAGE;
    }
    char *fmt = NULL;
    int64_t ver = 0;
    hid_t f = h5_open(path, NULL, 0, &fmt, &ver);
    if (f < 0) {
        ftk_error("%s", ftk_err_msg());
        return damaged_hdf5(path) ? FTK_EXIT_VERIFY : FTK_EXIT_USAGE;
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
            int64_t count = 0;
            if (h5_attr_get_i64(f, "shard_count", &count) < 0) {
                ftk_error("%s: %s", path, ftk_err_msg());
                c.bad++;
            } else if (count == 1) {
                c.bad += check_tokens(path, NULL);
                what = "checksums and token-file invariants";
            } else {
                what = "checksums"; /* a shard: its set is checked as a whole (verify_token_set) */
            }
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
    } else if (strcmp(fmt, CKPT_SHARD_FORMAT) == 0) {
        what = "checksums; it is one shard: give its checkpoint directory for the rest";
    } else {
        ftk_warn("%s: format \"%s\" is not known to this ftk: checksums only", path, fmt);
    }
    h5_close(f);
    if (c.bad) {
        rc = FTK_EXIT_VERIFY;
    } else {
        printf("%s: OK (%s v%lld, %d datasets; %s verified)\n", path, fmt, (long long)ver, c.n, what);
    }
    free(fmt);
    return rc;
}

/* The shard count of a tokens file, 0 for anything else. */
static int64_t tokens_shard_count(const char *path)
{
    char *fmt = NULL;
    int64_t n = 0;
    hid_t f = h5_open(path, NULL, 0, &fmt, NULL);
    if (f < 0)
        return 0;
    if (strcmp(fmt, TOKENS_FORMAT) || h5_attr_get_i64(f, "shard_count", &n) < 0)
        n = 0;
    free(fmt);
    h5_close(f);
    return n;
}

/* A set of token shards (its base name or any of its files; tokens_set.h): every shard's
 * checksums, then the set as a whole: names, indices and count, the attributes they must
 * share, the set checksum, and the token-file invariants of every row. A set named again
 * (by another of its files) is not checked twice. */
static int verify_token_set(const char *path)
{
    static char **done;
    static int n_done;
    char **names;
    int n, r = tokens_set_files(path, &names, &n);
    if (r) {
        ftk_error("%s", ftk_err_msg());
        return r == -2 ? FTK_EXIT_USAGE : FTK_EXIT_VERIFY;
    }
    for (int i = 0; i < n_done; i++)
        if (!strcmp(done[i], names[0])) {
            tokens_set_free_names(names, n);
            return FTK_EXIT_OK;
        }
    char **grown = realloc(done, (size_t)(n_done + 1) * sizeof *done);
    if (grown && (grown[n_done] = strdup(names[0]))) /* kept to the end of the process */
        done = grown, n_done++;
    else if (grown)
        done = grown;
    int rc = FTK_EXIT_OK;
    for (int k = 0; k < n; k++) {
        int rk = verify_file(names[k]);
        if (rk && rc != FTK_EXIT_USAGE)
            rc = rk;
    }
    int64_t rows[2];
    size_t bl = strlen(names[0]) - 18; /* the base: BASE-00001-of-NNNNN.h5 */
    if (rc == FTK_EXIT_OK && check_tokens(path, rows))
        rc = FTK_EXIT_VERIFY;
    if (rc == FTK_EXIT_OK)
        printf("%.*s: OK (token set of %d shards, %lld train and %lld val rows; shard names, indices and count, shared "
               "attributes, set checksum and token-file invariants verified)\n",
               (int)bl, names[0], n, (long long)rows[0], (long long)rows[1]);
    tokens_set_free_names(names, n);
    return rc;
}

/* ---- checkpoints (ckpt_verify.h) ------------------------------------------------------------ */

static void print_line(void *ctx, ckpt_report_t kind, const char *line)
{
    (void)ctx;
    if (kind == CKPT_REPORT_ERROR)
        ftk_error("%s", line);
    else if (kind == CKPT_REPORT_WARN)
        ftk_warn("%s", line);
    else
        printf("%s\n", line);
}

/* A checkpoint directory, RUN/latest, or a run directory. */
static int verify_path_ckpt(const char *path)
{
    ckpt_verify_opts_t o = {.deep = deep, .report = print_line};
    switch (ckpt_verify_path(path, &o)) {
    case CKPT_VERIFY_OK:
        return FTK_EXIT_OK;
    case CKPT_VERIFY_REFUSED:
        return FTK_EXIT_USAGE;
    case CKPT_VERIFY_FAILED:
        return FTK_EXIT_FAIL;
    default:
        return FTK_EXIT_VERIFY;
    }
}

/* ---- --compare ------------------------------------------------------------------------------ */

typedef struct {
    double max_abs, max_rel;
    uint64_t n, differ, over;
} diff_t;

static void diff_one(diff_t *d, double x, double y)
{
    d->n++;
    if (x == y || (isnan(x) && isnan(y)))
        return;
    d->differ++;
    double ad = fabs(x - y), rel = y != 0 ? ad / fabs(y) : INFINITY;
    if (isnan(ad))
        ad = rel = INFINITY;
    d->max_abs = ad > d->max_abs ? ad : d->max_abs;
    d->max_rel = rel > d->max_rel ? rel : d->max_rel;
    if (!(ad <= cmp_atol + cmp_rtol * fabs(y)))
        d->over++;
}

static uint64_t values_differing; /* over every tensor compared */

/* One line for a tensor; returns 1 when it is outside the tolerances. */
static int diff_report(const char *what, const diff_t *d)
{
    values_differing += d->differ;
    if (!d->differ)
        printf("%s: identical (%llu values)\n", what, (unsigned long long)d->n);
    else
        printf("%s: %llu of %llu values differ; max abs difference %.3g, max relative %.3g%s\n", what,
               (unsigned long long)d->differ, (unsigned long long)d->n, d->max_abs, d->max_rel,
               d->over ? "" : " (within tolerance)");
    return d->over ? 1 : 0;
}

static int compare_ckpt(const char *pa, const char *pb)
{
    ckpt_manifest_t ma = {0}, mb = {0};
    char *da = ckpt_open_path(pa, &ma), *db = da ? ckpt_open_path(pb, &mb) : NULL;
    int rc = FTK_EXIT_USAGE, diff = 0;
    hid_t *fa = NULL, *fb = NULL;
    float *ba = NULL, *bb = NULL;
    if (!da || !db) {
        ftk_error("%s", ftk_err_msg());
        goto out;
    }
    if (ma.n_units != mb.n_units || model_n_params(&ma.cfg) != model_n_params(&mb.cfg)) {
        ftk_error("%s and %s are checkpoints of different models", da, db);
        goto out;
    }
    for (int u = 0; u < ma.n_units; u++)
        if (ma.units[u].length != mb.units[u].length || ma.units[u].n_tensors != mb.units[u].n_tensors) {
            ftk_error("%s and %s are checkpoints of different models (unit %s)", da, db, ma.units[u].name);
            goto out;
        }
    const ckpt_meta_t *a = &ma.meta, *b = &mb.meta;
    const char *names[] = {"step", "tokens_seen", "data.epoch", "data.rows_consumed"};
    int64_t va[] = {a->step, a->tokens_seen, a->epoch, a->rows_consumed},
            vb[] = {b->step, b->tokens_seen, b->epoch, b->rows_consumed};
    for (int i = 0; i < 4; i++)
        if (va[i] != vb[i]) {
            printf("%s: %lld vs %lld\n", names[i], (long long)va[i], (long long)vb[i]);
            diff++;
        }
    if (strcmp(a->data_set_xxh3, b->data_set_xxh3) || strcmp(a->init_xxh3, b->init_xxh3)) {
        printf("data set or initial weights differ (%s/%s vs %s/%s)\n", a->data_set_xxh3, a->init_xxh3,
               b->data_set_xxh3, b->init_xxh3);
        diff++;
    }
    if (strcmp(a->precision, b->precision))
        printf("precision: %s is %s, %s is %s; compared by value, each widened to float32\n", da, a->precision, db,
               b->precision);
    int64_t maxpad = 0;
    for (int u = 0; u < ma.n_units; u++) {
        maxpad = ma.units[u].padded > maxpad ? ma.units[u].padded : maxpad;
        maxpad = mb.units[u].padded > maxpad ? mb.units[u].padded : maxpad;
    }
    ba = malloc((size_t)maxpad * sizeof *ba);
    bb = malloc((size_t)maxpad * sizeof *bb);
    if (!ba || !bb) {
        ftk_error("out of memory");
        rc = FTK_EXIT_FAIL;
        goto out;
    }
    if (!(fa = ckpt_open_shards(da, &ma, 1)) || !(fb = ckpt_open_shards(db, &mb, 1))) {
        ftk_error("%s", ftk_err_msg());
        rc = FTK_EXIT_VERIFY;
        goto out;
    }
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int u = 0; u < ma.n_units; u++) {
            if (ckpt_read_unit(fa, &ma, k, u, DT_F32, ba) < 0 || ckpt_read_unit(fb, &mb, k, u, DT_F32, bb) < 0) {
                ftk_error("%s", ftk_err_msg());
                rc = FTK_EXIT_VERIFY;
                goto out;
            }
            const ckpt_unit_t *x = &ma.units[u];
            for (int i = 0; i < x->n_tensors; i++) {
                diff_t d = {0};
                for (int64_t e = x->t[i].offset; e < x->t[i].offset + x->t[i].numel; e++)
                    diff_one(&d, ba[e], bb[e]);
                char what[160];
                snprintf(what, sizeof what, "%s %s", ckpt_kind_names[k], x->t[i].name);
                diff += diff_report(what, &d);
            }
        }
    printf("%s vs %s: %s\n", da, db, diff ? "DIFFERENT" : values_differing ? "equal within tolerance" : "identical");
    rc = diff ? FTK_EXIT_VERIFY : FTK_EXIT_OK;
out:
    ckpt_close_shards(fa, &ma);
    ckpt_close_shards(fb, &mb);
    free(ba);
    free(bb);
    ckpt_manifest_free(&ma);
    ckpt_manifest_free(&mb);
    free(da);
    free(db);
    return rc;
}

typedef struct {
    hid_t b;
    const char *pa, *pb;
    int diff, failed;
} cmp_ctx_t;

/* Reads rows [r0, r0+n) of a dataset as doubles (bfloat16 converted by hand). */
static int read_rows_d(hid_t f, const char *path, int bf16, hsize_t r0, hsize_t n, size_t per_row, double *out)
{
    if (!bf16)
        return h5r_read_rows(f, path, H5T_NATIVE_DOUBLE, r0, n, out);
    uint16_t *tmp = (uint16_t *)out; /* converted backwards in place: 2 bytes -> 8 */
    if (h5r_read_rows(f, path, H5T_NATIVE_UINT16, r0, n, tmp) < 0)
        return -1;
    for (size_t i = (size_t)n * per_row; i-- > 0;)
        out[i] = bf16_to_f32(tmp[i]);
    return 0;
}

static int is_bf16(hid_t f, const char *path)
{
    char tn[32];
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (d < 0)
        return 0;
    h5_type_name(d, tn, sizeof tn);
    H5Dclose(d);
    return !strcmp(tn, "bfloat16");
}

static int compare_dataset(hid_t fa, const char *path, void *p)
{
    cmp_ctx_t *c = p;
    hsize_t da[8], db[8];
    int ra = h5r_shape(fa, path, da), rb = H5Lexists(c->b, path + (path[0] == '/'), H5P_DEFAULT) > 0
                                                ? h5r_shape(c->b, path, db)
                                                : -2;
    if (rb == -2) {
        printf("%s: only in %s\n", path, c->pa);
        c->diff++;
        return 0;
    }
    int same = ra == rb && ra >= 0;
    for (int i = 0; same && i < ra; i++)
        same = da[i] == db[i];
    if (!same) {
        printf("%s: shapes differ\n", path);
        c->diff++;
        return 0;
    }
    if (ra == 0) { /* a scalar */
        double x, y;
        if (h5r_read(fa, path, H5T_NATIVE_DOUBLE, &x, 1) < 0 || h5r_read(c->b, path, H5T_NATIVE_DOUBLE, &y, 1) < 0) {
            ftk_error("%s", ftk_err_msg());
            c->failed = 1;
            return 1;
        }
        diff_t d = {0};
        diff_one(&d, x, y);
        c->diff += diff_report(path, &d);
        return 0;
    }
    size_t per_row = 1;
    for (int i = 1; i < ra; i++)
        per_row *= da[i];
    hsize_t block = per_row >= (1u << 20) ? 1 : (hsize_t)((1u << 20) / (per_row ? per_row : 1));
    double *x = malloc(block * per_row * sizeof *x + 1), *y = malloc(block * per_row * sizeof *y + 1);
    int bfa = is_bf16(fa, path), bfb = is_bf16(c->b, path);
    diff_t d = {0};
    for (hsize_t r = 0; x && y && r < da[0]; r += block) {
        hsize_t n = da[0] - r < block ? da[0] - r : block;
        if (read_rows_d(fa, path, bfa, r, n, per_row, x) < 0 || read_rows_d(c->b, path, bfb, r, n, per_row, y) < 0) {
            ftk_error("%s: %s", path, ftk_err_msg());
            c->failed = 1;
            break;
        }
        for (size_t i = 0; i < (size_t)n * per_row; i++)
            diff_one(&d, x[i], y[i]);
    }
    if (!x || !y) {
        ftk_error("out of memory");
        c->failed = 1;
    }
    free(x);
    free(y);
    if (c->failed)
        return 1;
    c->diff += diff_report(path, &d);
    return 0;
}

static int only_in_b(hid_t fb, const char *path, void *p)
{
    cmp_ctx_t *c = p; /* here c->b is file A */
    if (H5Lexists(c->b, path + (path[0] == '/'), H5P_DEFAULT) <= 0) {
        printf("%s: only in %s\n", path, c->pb);
        c->diff++;
    }
    (void)fb;
    return 0;
}

static int compare_files(const char *pa, const char *pb)
{
    char *fmta = NULL, *fmtb = NULL;
    hid_t a = h5_open(pa, NULL, 0, &fmta, NULL), b = a >= 0 ? h5_open(pb, NULL, 0, &fmtb, NULL) : -1;
    int rc = FTK_EXIT_USAGE;
    if (a < 0 || b < 0) {
        ftk_error("%s", ftk_err_msg());
    } else if (strcmp(fmta, fmtb)) {
        ftk_error("%s is a %s file, %s a %s file: --compare needs two of the same kind", pa, fmta, pb, fmtb);
    } else {
        cmp_ctx_t c = {.b = b, .pa = pa, .pb = pb};
        if (h5_each_dataset(a, compare_dataset, &c) < 0 || c.failed) {
            if (!c.failed)
                ftk_error("%s: %s", pa, ftk_err_msg());
            rc = FTK_EXIT_VERIFY;
        } else {
            cmp_ctx_t c2 = {.b = a, .pa = pa, .pb = pb};
            h5_each_dataset(b, only_in_b, &c2);
            c.diff += c2.diff;
            printf("%s vs %s: %s\n", pa, pb, c.diff ? "DIFFERENT" : values_differing ? "equal within tolerance" : "identical");
            rc = c.diff ? FTK_EXIT_VERIFY : FTK_EXIT_OK;
        }
    }
    if (a >= 0)
        h5_close(a);
    if (b >= 0)
        h5_close(b);
    free(fmta);
    free(fmtb);
    return rc;
}

/* Neither a regular file nor a directory (a FIFO would stall the open, a device be read
 * forever): said, naming it. */
static int special(const char *p)
{
    struct stat sb;
    if (stat(p, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode)) {
        ftk_error("%s: %s, not an ftk file or checkpoint", p, ckpt_verify_file_kind(sb.st_mode));
        return 1;
    }
    return 0;
}

static int compare(const char *a, const char *b)
{
    if (special(a) || special(b))
        return FTK_EXIT_USAGE;
    int ca = ckpt_verify_is_checkpoint(a), cb = ckpt_verify_is_checkpoint(b);
    if (ca != cb) {
        ftk_error("%s and %s are not of the same kind (a checkpoint and a file)", a, b);
        return FTK_EXIT_USAGE;
    }
    return ca ? compare_ckpt(a, b) : compare_files(a, b);
}

/* --json: the text report goes to a temporary file instead of stdout; after each path it is
 * read back into that path's JSON object, written to the real stdout (json_fp). Messages on
 * stderr stay where they are. */
static FILE *json_fp;

static int json_begin(void)
{
    fflush(stdout);
    int fd = dup(STDOUT_FILENO);
    FILE *t = tmpfile();
    if (fd < 0 || !t || !(json_fp = fdopen(fd, "w")) || dup2(fileno(t), STDOUT_FILENO) < 0) {
        ftk_error("--json: cannot redirect the report: %s", strerror(errno));
        return -1;
    }
    fclose(t); /* fd 1 keeps the file */
    return 0;
}

static void json_item(const char *a, const char *b, int r)
{
    buf_t j = {0}, rep = {0};
    char chunk[4096];
    ssize_t k;
    fflush(stdout);
    lseek(STDOUT_FILENO, 0, SEEK_SET);
    while ((k = read(STDOUT_FILENO, chunk, sizeof chunk)) > 0)
        buf_append(&rep, chunk, (size_t)k);
    if (ftruncate(STDOUT_FILENO, 0) != 0 || lseek(STDOUT_FILENO, 0, SEEK_SET) != 0)
        ftk_warn("--json: cannot reuse the report file: %s", strerror(errno));
    buf_printf(&j, "{\"%s\": ", b ? "a" : "path");
    json_write_string(&j, a, strlen(a));
    if (b) {
        buf_printf(&j, ", \"b\": ");
        json_write_string(&j, b, strlen(b));
    }
    buf_printf(&j, ", \"ok\": %s, \"exit\": %d, \"report\": [", r ? "false" : "true", r);
    for (size_t i = 0, n = 0; i < rep.len; n++) {
        const char *nl = memchr(rep.data + i, '\n', rep.len - i);
        size_t e = nl ? (size_t)(nl - rep.data) : rep.len;
        if (n)
            buf_printf(&j, ", ");
        json_write_string(&j, rep.data + i, e - i);
        i = e + 1;
    }
    buf_printf(&j, "]}\n");
    fwrite(j.data, 1, j.len, json_fp);
    fflush(json_fp);
    buf_free(&j);
    buf_free(&rep);
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-verify");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    if (compare_mode) {
        if (npos != 2 || !(cmp_rtol >= 0) || !(cmp_atol >= 0)) {
            ftk_error("--compare takes two paths (and --rtol, --atol >= 0)");
            return FTK_EXIT_USAGE;
        }
        if (json_out && json_begin() < 0)
            return FTK_EXIT_FAIL;
        rc = compare(pos[0], pos[1]);
        if (json_out)
            json_item(pos[0], pos[1], rc);
        return rc;
    }
    if (json_out && json_begin() < 0)
        return FTK_EXIT_FAIL;
    rc = FTK_EXIT_OK;
    for (int i = 0; i < npos; i++) {
        if (special(pos[i])) {
            rc = FTK_EXIT_USAGE;
            continue;
        }
        int r = ckpt_verify_is_checkpoint(pos[i])                             ? verify_path_ckpt(pos[i])
                : access(pos[i], F_OK) != 0 || tokens_shard_count(pos[i]) > 1 ? verify_token_set(pos[i])
                                                                              : verify_file(pos[i]);
        if (json_out)
            json_item(pos[i], NULL, r);
        if (r == FTK_EXIT_USAGE || (r && rc == FTK_EXIT_OK))
            rc = r;
    }
    return rc;
}
