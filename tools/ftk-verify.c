/* ftk-verify — prove an ftk file whole: every checksum recomputed, every invariant of
 * its format checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../formats/h5.h"
#include "../formats/tokens.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"

static const opt_t options[] = {{0}};

static const opt_spec_t spec = {
    .tool = "ftk-verify",
    .usage = "FILE.h5...",
    .summary = "Recomputes the XXH3-64 checksum of every dataset of each ftk file and compares it with\n"
               "the one stored when it was written, then checks the invariants of the file's format\n"
               "(for token files: ids inside the vocabulary, row and sample boundaries consistent,\n"
               "loss masks well formed, counts matching). Prints one OK line per whole file.",
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
