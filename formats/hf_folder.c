#include "hf_folder.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../libcommon/fault.h"
#include "../libcommon/log.h"
#include "json.h"

char *hf_folder_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int hf_folder_has(const char *dir, const char *name)
{
    char *p = hf_folder_path(dir, name);
    int yes = p && exists(p);
    free(p);
    return yes;
}

/* ---------------------------------------------------------------- reading */

static int plain_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Shard file names from model.safetensors.index.json, in first-seen order. */
static int read_index(const char *path, char ***names, size_t *n)
{
    buf_t b = {0};
    json_value_t *root = NULL;
    json_doc_t *doc = NULL;
    int rc = -1;
    *names = NULL;
    *n = 0;
    if (buf_read_small(&b, path, BUF_SMALL_MAX, 0) < 0)
        goto out;
    json_opts_t jo = {.max_depth = 8};
    if (!(doc = json_parse(b.data, b.len, &jo, &root)))
        goto out;
    const json_value_t *map = json_get(root, "weight_map");
    if (!map || map->type != JSON_OBJECT) {
        ftk_err_set("no \"weight_map\" object");
        goto out;
    }
    *names = calloc(map->u.obj.n + 1, sizeof **names);
    if (!*names) {
        ftk_err_set("out of memory");
        goto out;
    }
    for (size_t i = 0; i < map->u.obj.n; i++) {
        const json_member_t *m = &map->u.obj.members[i];
        if (m->value.type != JSON_STRING || !plain_name(m->value.u.str.s) || strlen(m->value.u.str.s) != m->value.u.str.len) {
            unsigned l, c;
            json_position(doc, m->value.off, &l, &c);
            ftk_err_set("line %u, column %u: tensor \"%.200s\": file name must be a plain file name in the folder", l, c,
                        m->key);
            goto out;
        }
        size_t k = 0;
        while (k < *n && strcmp((*names)[k], m->value.u.str.s) != 0)
            k++;
        if (k == *n && !((*names)[(*n)++] = strdup(m->value.u.str.s)))
            goto out;
    }
    rc = 0;
out:
    json_free(doc);
    buf_free(&b);
    return rc;
}

/* The names of the folder's safetensors files: the index's, else model.safetensors. */
static int shard_names(const char *dir, char ***names, size_t *n)
{
    char *index_path = hf_folder_path(dir, "model.safetensors.index.json"), *single_path = hf_folder_path(dir, "model.safetensors");
    int rc = -1;
    *names = NULL;
    *n = 0;
    if (!index_path || !single_path) {
        ftk_err_set("out of memory");
    } else if (exists(index_path)) {
        if ((rc = read_index(index_path, names, n)) < 0)
            ftk_err_prefix("%s: ", index_path);
    } else if (exists(single_path)) {
        if ((*names = calloc(2, sizeof **names)) && ((*names)[0] = strdup("model.safetensors"))) {
            *n = 1;
            rc = 0;
        } else {
            ftk_err_set("out of memory");
        }
    } else {
        ftk_err_set("%s: no model.safetensors or model.safetensors.index.json (pytorch_model.bin is not read: "
                    "pickle files can run code; convert it to safetensors first)",
                    dir);
    }
    free(index_path);
    free(single_path);
    return rc;
}

static int is_ignored_buffer(const char *name)
{
    /* Old checkpoints saved the rotary inverse frequencies: recomputed from rope_theta. */
    const char *suffix = ".self_attn.rotary_emb.inv_freq";
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0 && strncmp(name, "model.layers.", 13) == 0;
}

/* Tensor st of file path against parameter i: its type and shape. */
static int check_tensor(const model_config_t *cfg, size_t i, const st_tensor_t *st, const char *path)
{
    weights_spec_t s;
    weights_tensor_spec(cfg, i, &s);
    if (st->dt == DT_INVALID) {
        ftk_err_set("%s: tensor \"%s\": dtype %s is not F32, F16 or BF16", path, st->name, st->dtype);
        return -1;
    }
    if (st->rank != s.rank || st->shape[0] != s.shape[0] || (s.rank == 2 && st->shape[1] != s.shape[1])) {
        char got[64] = "", want[64];
        for (int d = 0, k = 0; d < st->rank && k < 60; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", d ? ", " : "", (long long)st->shape[d]);
        if (s.rank == 2)
            snprintf(want, sizeof want, "%lld, %lld", (long long)s.shape[0], (long long)s.shape[1]);
        else
            snprintf(want, sizeof want, "%lld", (long long)s.shape[0]);
        ftk_err_set("%s: tensor \"%s\" has shape [%s], config.json implies [%s]", path, st->name, got, want);
        return -1;
    }
    return 0;
}

/* Matches every tensor of every file to the parameter list. */
static int match_tensors(hf_import_t *im)
{
    size_t n = weights_n_tensors(&im->cfg);
    im->src = calloc(n, sizeof *im->src);
    im->src_file = calloc(n, sizeof *im->src_file);
    if (!im->src || !im->src_file) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (size_t f = 0; f < im->n_files; f++) {
        const st_file_t *sf = &im->files[f];
        for (size_t t = 0; t < sf->h.n; t++) {
            const st_tensor_t *st = &sf->h.tensors[t];
            long i = weights_find(&im->cfg, st->name);
            if (i < 0) {
                if (is_ignored_buffer(st->name))
                    continue;
                if (im->cfg.tie_word_embeddings && strcmp(st->name, "lm_head.weight") == 0) {
                    if (im->tied_head_skipped)
                        im->tied_head_skipped(sf->path);
                    continue;
                }
                ftk_err_set("%s: tensor \"%.200s\" is not a parameter of this LlamaForCausalLM config", sf->path,
                            st->name);
                return -1;
            }
            if (im->src[i]) {
                ftk_err_set("%s: tensor \"%s\" also appears in %s", sf->path, st->name, im->files[im->src_file[i]].path);
                return -1;
            }
            if (check_tensor(&im->cfg, (size_t)i, st, sf->path) < 0)
                return -1;
            im->src[i] = st;
            im->src_file[i] = f;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!im->src[i]) {
            weights_spec_t s;
            weights_tensor_spec(&im->cfg, i, &s);
            ftk_err_set("%s: tensor \"%s\" is missing", im->dir, s.name);
            return -1;
        }
    return 0;
}

int hf_import_open(hf_import_t *im)
{
    char **names;
    size_t n_names;
    if (shard_names(im->dir, &names, &n_names) < 0)
        goto fail;
    im->files = calloc(n_names, sizeof *im->files);
    if (!im->files) {
        ftk_err_set("out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n_names; i++) {
        char *p = hf_folder_path(im->dir, names[i]);
        int ok = p && st_open(&im->files[i], p) == 0;
        free(p);
        if (!ok)
            goto fail;
        im->n_files++;
    }
    for (size_t i = 0; i < n_names; i++)
        free(names[i]);
    free(names);
    return match_tensors(im);
fail:
    for (size_t i = 0; names && i < n_names; i++)
        free(names[i]);
    free(names);
    return -1;
}

static dtype_t src_dtype(void *ctx, size_t i)
{
    const hf_import_t *im = ctx;
    return im->want != DT_INVALID ? im->want : im->src[i]->dt;
}

dtype_t hf_import_common_dtype(const hf_import_t *im)
{
    size_t n = weights_n_tensors(&im->cfg);
    dtype_t common = src_dtype((void *)im, 0);
    for (size_t i = 1; i < n; i++)
        if (src_dtype((void *)im, i) != common)
            common = DT_INVALID;
    return common;
}

/* Drops the mapped pages of a block already written, so that resident memory stays about
 * one block whatever the model's size (the pages stay in the page cache; without this the
 * whole input would count in the process's RSS). */
static void release(const uint8_t *p, size_t n)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
    if (p && b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

static const void *src_rows(void *ctx, size_t i, const weights_spec_t *s, dtype_t dt, int64_t row0, int64_t n,
                            void *scratch)
{
    hf_import_t *im = ctx;
    const st_tensor_t *t = im->src[i];
    size_t cols = (size_t)(s->rank == 2 ? s->shape[1] : s->shape[0]);
    const uint8_t *p = (const uint8_t *)st_data(&im->files[im->src_file[i]], t) + (size_t)row0 * cols * t->elem_size;
    release(im->done_p, im->done_n);
    im->done_p = p;
    im->done_n = (size_t)n * cols * t->elem_size;
    if (t->dt == dt)
        return p;
    dtype_convert(scratch, dt, p, t->dt, (size_t)n * cols);
    return scratch;
}

static int store_tokenizer(void *ctx, hid_t file)
{
    hf_import_t *im = ctx;
    if (tokfiles_store(&im->tok, file) < 0)
        return -1;
    char *p = hf_folder_path(im->dir, "generation_config.json"); /* the model's, not the tokenizer's */
    buf_t b = {0};
    int rc = 0;
    if (p && exists(p))
        rc = buf_read_file(&b, p) < 0 || weights_put_file(file, "generation_config.json", b.data ? b.data : "", b.len) < 0
                 ? -1
                 : 0;
    buf_free(&b);
    free(p);
    return rc;
}

void hf_import_source(hf_import_t *im, weights_source_t *ws)
{
    ws->ctx = im;
    ws->dtype = src_dtype;
    ws->rows = src_rows;
    ws->extra = store_tokenizer;
}

void hf_import_close(hf_import_t *im)
{
    for (size_t i = 0; i < im->n_files; i++)
        st_close(&im->files[i]);
    free(im->files);
    free(im->src);
    free(im->src_file);
    tokfiles_free(&im->tok);
    im->files = NULL;
    im->src = NULL;
    im->src_file = NULL;
    im->n_files = 0;
}

/* ---------------------------------------------------------------- writing */

static int write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, f) != n) {
        ftk_err_set("%s: write: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int hf_write_file(atomic_dir_t *ad, const char *name, const void *data, size_t len)
{
    char *p = atomic_dir_file(ad, name);
    if (!p)
        return -1;
    FILE *f = fopen(p, "wb");
    if (!f) {
        ftk_err_set("%s: %s", p, strerror(errno));
        return -1;
    }
    int rc = write_all(f, data, len, p);
    if (fclose(f) != 0 && rc == 0) {
        ftk_err_set("%s: close: %s", p, strerror(errno));
        rc = -1;
    }
    return rc;
}

int hf_export_plan(hf_export_t *ex, hid_t wf, const char *path, const model_config_t *cfg, dtype_t want,
                   uint64_t shard_limit)
{
    *ex = (hf_export_t){.wf = wf, .path = path, .cfg = cfg, .n = weights_n_tensors(cfg), .common = DT_INVALID};
    hf_export_item_t *it = ex->it = calloc(ex->n, sizeof *ex->it);
    uint64_t cur = 0;
    if (!it) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (size_t i = 0; i < ex->n; i++) {
        weights_tensor_spec(cfg, i, &it[i].s);
        if ((it[i].stored = weights_tensor_dtype(wf, it[i].s.name)) == DT_INVALID) {
            ftk_err_prefix("%s: ", path);
            return -1;
        }
        it[i].out = want != DT_INVALID ? want : it[i].stored;
        it[i].bytes = (uint64_t)it[i].s.shape[0] * (uint64_t)(it[i].s.rank == 2 ? it[i].s.shape[1] : 1) *
                      dtype_size(it[i].out);
        if (i == 0 || (cur > 0 && cur + it[i].bytes > shard_limit)) {
            ex->n_shards++;
            cur = 0;
        }
        cur += it[i].bytes;
        it[i].shard = ex->n_shards - 1;
        ex->total += it[i].bytes;
        ex->common = i == 0 ? it[i].out : ex->common == it[i].out ? ex->common : DT_INVALID;
    }
    return 0;
}

/* The export's staging: a block of rows in the output type and scratch for the stored. */
typedef struct {
    void *buf, *scratch;
    size_t block;
    uint64_t done; /* bytes of tensor data written */
    progress_t *prog;
} hf_blocks_t;

/* Tensor i's rows to f, block by block. */
static int write_tensor(hf_export_t *ex, size_t i, FILE *f, const char *path, hf_blocks_t *b)
{
    const hf_export_item_t *it = &ex->it[i];
    const weights_spec_t *s = &it->s;
    int64_t rows = s->rank == 2 ? s->shape[0] : 1, cols = s->rank == 2 ? s->shape[1] : s->shape[0];
    size_t in_row = (size_t)cols * dtype_size(it->stored), out_row = (size_t)cols * dtype_size(it->out);
    size_t widest = in_row > out_row ? in_row : out_row;
    int64_t per = widest ? (int64_t)(b->block / widest) : rows;
    int wrc = 0;
    if (per < 1) {
        ftk_err_set("%s: a row of %zu bytes is larger than the %zu-byte block", s->name, widest, b->block);
        return -1;
    }
    for (int64_t r = 0; r < rows && wrc == 0; r += per) {
        int64_t k = rows - r < per ? rows - r : per;
        if (weights_read_rows(ex->wf, s->name, it->out, r, k, b->buf, b->scratch) < 0) {
            ftk_err_prefix("%s: ", ex->path);
            return -1;
        }
        wrc = write_all(f, b->buf, (size_t)k * out_row, path);
        if (wrc == 0)
            wrc = fault_point("weights.write");
        b->done += (uint64_t)k * out_row;
        progress_update(b->prog, (int64_t)(b->done >> 20));
    }
    return wrc;
}

/* The header of the shard named name, tensors [i0, i1), into hdr (*hrc: 0, or -1 with
 * the message set), and their lines of the index. Returns -1 only when out of memory. */
static int shard_header(hf_export_t *ex, size_t i0, size_t i1, const char *name, buf_t *hdr, int *hrc)
{
    st_entry_t *e = calloc(i1 - i0, sizeof *e);
    char tmp[256];
    if (!e) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (size_t i = i0; i < i1; i++) {
        const hf_export_item_t *it = &ex->it[i];
        e[i - i0] = (st_entry_t){it->s.name, it->out, it->s.rank, it->s.shape};
        snprintf(tmp, sizeof tmp, "%s\n    \"%s\": \"%s\"", i ? "," : "", it->s.name, name);
        buf_append(&ex->index, tmp, strlen(tmp));
    }
    hdr->len = 0;
    *hrc = st_build_header(hdr, e, i1 - i0, NULL);
    free(e);
    return 0;
}

/* Shard sh, tensors [i0, i1): its header, then their rows. */
static int write_shard(hf_export_t *ex, atomic_dir_t *ad, size_t sh, size_t i0, size_t i1, buf_t *hdr,
                       hf_blocks_t *b)
{
    char name[64];
    if (ex->n_shards == 1)
        snprintf(name, sizeof name, "model.safetensors");
    else
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", sh + 1, ex->n_shards);
    int hrc;
    if (shard_header(ex, i0, i1, name, hdr, &hrc) < 0)
        return -1;
    char *path = atomic_dir_file(ad, name);
    FILE *f = path && hrc == 0 ? fopen(path, "wb") : NULL;
    if (!f) {
        if (hrc < 0)
            ftk_err_prefix("%s: ", path ? path : name);
        else
            ftk_err_set("%s: %s", path ? path : name, strerror(errno));
        return -1;
    }
    setvbuf(f, NULL, _IOFBF, 4u << 20);
    int wrc = write_all(f, hdr->data, hdr->len, path);
    for (size_t i = i0; i < i1 && wrc == 0; i++)
        wrc = write_tensor(ex, i, f, path, b);
    if (fclose(f) != 0 && wrc == 0) {
        ftk_err_set("%s: close: %s", path, strerror(errno));
        wrc = -1;
    }
    return wrc;
}

int hf_export_shards(hf_export_t *ex, atomic_dir_t *ad, progress_t *prog)
{
    hf_blocks_t b = {.block = 32u << 20, .prog = prog};
    buf_t hdr = {0};
    int rc = 0;
    if (!(b.buf = malloc(b.block)) || !(b.scratch = malloc(b.block))) {
        ftk_err_set("out of memory");
        rc = -1;
    }
    char tmp[256];
    ex->index.len = 0;
    buf_append(&ex->index, "{\n  \"metadata\": {\n    \"total_size\": ", 36);
    snprintf(tmp, sizeof tmp, "%llu\n  },\n  \"weight_map\": {", (unsigned long long)ex->total);
    buf_append(&ex->index, tmp, strlen(tmp));
    for (size_t sh = 0, i0 = 0; sh < ex->n_shards && rc == 0; sh++) {
        size_t i1 = i0;
        while (i1 < ex->n && ex->it[i1].shard == sh)
            i1++;
        rc = write_shard(ex, ad, sh, i0, i1, &hdr, &b);
        i0 = i1;
    }
    buf_append(&ex->index, "\n  }\n}\n", 7);
    free(b.buf);
    free(b.scratch);
    buf_free(&hdr);
    return rc;
}

int hf_export_config(hf_export_t *ex, atomic_dir_t *ad)
{
    buf_t text = {0};
    int rc = hfconfig_write(&text, ex->cfg, ex->common != DT_INVALID ? ex->common : ex->cfg->torch_dtype) < 0 ||
                     hf_write_file(ad, "config.json", text.data, text.len) < 0 ||
                     (ex->n_shards > 1 && hf_write_file(ad, "model.safetensors.index.json", ex->index.data,
                                                        ex->index.len) < 0)
                 ? -1
                 : 0;
    buf_free(&text);
    return rc;
}

void hf_export_free(hf_export_t *ex)
{
    free(ex->it);
    buf_free(&ex->index);
    ex->it = NULL;
}
