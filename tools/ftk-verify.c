/* ftk-verify — prove an ftk file whole: every checksum recomputed, every invariant of
 * its format checked. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/checkpoint.h"
#include "../formats/ckpt_verify.h"
#include "../formats/compare.h"
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

/* ---- checkpoints (ckpt_verify.h) and --compare (compare.h) ---------------------------------- */

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

static int exit_status(ckpt_verdict_t v)
{
    switch (v) {
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

/* A checkpoint directory, RUN/latest, or a run directory. */
static int verify_path_ckpt(const char *path)
{
    ckpt_verify_opts_t o = {.deep = deep, .report = print_line};
    return exit_status(ckpt_verify_path(path, &o));
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

/* --compare (compare.h). */
static int compare(const char *a, const char *b)
{
    if (special(a) || special(b))
        return FTK_EXIT_USAGE;
    compare_opts_t o = {.rtol = cmp_rtol, .atol = cmp_atol, .report = print_line};
    return exit_status(compare_paths(a, b, &o));
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
