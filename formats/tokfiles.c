#include "tokfiles.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "h5.h"
#include "tokenizer.h"
#include "weights.h"

const char *const tokfiles_names[TOKFILES_MAX] = {"tokenizer.model", "tokenizer.json", "tokenizer.bin",
                                                  "tokenizer_config.json", "special_tokens_map.json"};

int tokfiles_is_tokenizer_name(const char *name)
{
    for (int i = 0; i < TOKFILES_MAX; i++)
        if (!strcmp(name, tokfiles_names[i]))
            return 1;
    return 0;
}

static const char *canonical(const char *name)
{
    for (int i = 0; i < TOKFILES_MAX; i++)
        if (!strcmp(name, tokfiles_names[i]))
            return tokfiles_names[i];
    return NULL;
}

const tokfile_t *tokfiles_get(const tokfiles_t *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->f[i].name, name))
            return &t->f[i];
    return NULL;
}

const tokfile_t *tokfiles_encoder(const tokfiles_t *t)
{
    for (int i = 0; i < 3; i++) {
        const tokfile_t *f = tokfiles_get(t, tokfiles_names[i]);
        if (f)
            return f;
    }
    return NULL;
}

void tokfiles_free(tokfiles_t *t)
{
    for (int i = 0; i < t->n; i++)
        buf_free(&t->f[i].data);
    t->n = 0;
}

int tokfiles_store(const tokfiles_t *t, hid_t file)
{
    for (int i = 0; i < t->n; i++)
        if (weights_put_file(file, t->f[i].name, t->f[i].data.data, t->f[i].data.len) < 0)
            return -1;
    return 0;
}

int tokfiles_list(const tokfiles_t *t, buf_t *b)
{
    if (!t->n)
        return buf_printf(b, "none");
    for (int i = 0; i < t->n; i++)
        if (buf_printf(b, "%s%s", i ? ", " : "", t->f[i].name) < 0)
            return -1;
    return 0;
}

static int add(tokfiles_t *t, const char *name, const void *data, size_t len)
{
    const char *c = canonical(name);
    if (!c || tokfiles_get(t, c))
        return 0;
    tokfile_t *f = &t->f[t->n];
    memset(f, 0, sizeof *f);
    f->name = c;
    if (buf_append(&f->data, data, len) < 0 || buf_reserve(&f->data, 1) < 0) {
        buf_free(&f->data);
        return -1;
    }
    f->data.data[len] = 0;
    t->n++;
    return 0;
}

static int add_stored(const char *name, const void *data, size_t len, void *ctx)
{
    return add(ctx, name, data, len);
}

static int from_dir(const char *dir, tokfiles_t *t)
{
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    for (int i = 0; i < TOKFILES_MAX; i++) {
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%.*s/%s", (int)dl, dir, tokfiles_names[i]);
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        buf_t b = {0};
        if (buf_read_file(&b, p) < 0 || add(t, tokfiles_names[i], b.data ? b.data : "", b.len) < 0) {
            buf_free(&b);
            return -1;
        }
        buf_free(&b);
    }
    return 0;
}

static int from_weights(const char *path, tokfiles_t *t)
{
    hid_t f = h5_open(path, WEIGHTS_FORMAT, WEIGHTS_VERSION, NULL, NULL);
    if (f < 0)
        return -1;
    int rc = weights_each_file(f, add_stored, t);
    if (rc < 0)
        ftk_err_prefix("%s: ", path);
    h5_close(f);
    return rc;
}

static int from_file(const char *path, tokfiles_t *t)
{
    buf_t b = {0};
    if (buf_read_file(&b, path) < 0)
        return -1;
    if (b.len == 0) {
        ftk_err_set("%s: empty file, not a tokenizer", path);
        buf_free(&b);
        return -1;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const char *name = canonical(base);
    size_t i = 0, bl = strlen(base);
    while (i < b.len && strchr(" \t\r\n", b.data[i]))
        i++;
    if (!name)
        name = (i < b.len && b.data[i] == '{') || (b.len >= 3 && !memcmp(b.data, "\xEF\xBB\xBF", 3)) ? "tokenizer.json"
               : bl >= 4 && !strcmp(base + bl - 4, ".bin")                                          ? "tokenizer.bin"
                                                                                                    : "tokenizer.model";
    int rc = add(t, name, b.data, b.len);
    buf_free(&b);
    return rc;
}

int tokfiles_load(const char *path, tokfiles_t *out)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) != 0) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    int rc;
    if (S_ISDIR(st.st_mode))
        rc = from_dir(path, out);
    else if (h5_init() == 0 && H5Fis_hdf5(path) > 0)
        rc = from_weights(path, out);
    else
        return from_file(path, out);
    if (rc == 0 && !tokfiles_encoder(out)) {
        ftk_err_set("%s: no tokenizer in it (tokenizer.model, tokenizer.json or tokenizer.bin)", path);
        rc = -1;
    }
    if (rc < 0)
        tokfiles_free(out);
    return rc;
}

tok_t *tokfiles_load_tok(const char *path, uint64_t *hash)
{
    tokfiles_t t;
    if (tokfiles_load(path, &t) < 0)
        return NULL;
    const tokfile_t *enc = tokfiles_encoder(&t);
    struct stat st;
    /* one file: its messages name it (and a name ending in .bin is llama2.c's, as tok_load) */
    int one = stat(path, &st) == 0 && S_ISREG(st.st_mode) && !(h5_init() == 0 && H5Fis_hdf5(path) > 0);
    tok_t *tok = NULL;
    if (!enc)
        ftk_err_set("%s: no tokenizer in it (tokenizer.model, tokenizer.json or tokenizer.bin)", path);
    else if (!(tok = tok_load_mem(enc->data.data, enc->data.len, one ? path : enc->name)) && !one)
        ftk_err_prefix("%s: ", path);
    if (tok && hash)
        *hash = hash_bytes(enc->data.data, enc->data.len);
    tokfiles_free(&t);
    return tok;
}
