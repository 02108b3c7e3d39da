/* ftk-import-hf — a Hugging Face Llama folder (config.json + safetensors) to an ftk
 * weights file. Every input is validated before anything is written (safetensors.h lists
 * the checks), so a bad download fails with exit 2 and no output. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/json.h"
#include "../formats/safetensors.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../formats/weights.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/timer.h"

static const char *output, *dtype_opt = "keep", *compress = "none", *tokenizer_opt;
static int force;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"output", 'o', OPT_STR, &output, "FILE.h5", "weights file to write (required; must not exist unless --force)"},
    {"force", 'f', OPT_FLAG, &force, NULL, "replace an existing output file (once the new one is complete)"},
    {"dtype", 0, OPT_STR, &dtype_opt, "keep|float32|float16|bfloat16",
     "store tensors in this type (keep: as in the safetensors files; narrowing rounds to nearest even)"},
    {"compress", 0, OPT_STR, &compress, "none|zstd[:L]", "compress tensors with zstd (HDF5 filter 32015)"},
    {"tokenizer", 't', OPT_STR, &tokenizer_opt, "FILE|DIR|W.h5",
     "the tokenizer to store, in place of the folder's (a folder of tokenizer files, one file, or a weights file)"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-import-hf",
    .usage = "[options] HF_DIR -o FILE.h5",
    .summary = "Converts a Hugging Face LlamaForCausalLM folder to an ftk weights file: config.json, the\n"
               "weights (model.safetensors, or shards listed in model.safetensors.index.json; F32, F16\n"
               "or BF16), and the tokenizer files found there (tokenizer.model, tokenizer.json,\n"
               "tokenizer_config.json, special_tokens_map.json) and generation_config.json, which travel\n"
               "inside the .h5 (--tokenizer takes them from elsewhere; a folder without any is warned about).\n"
               "Warns when generation would not stop at the tokenizer's EOS (transformers' rule:\n"
               "generation_config.json's eos_token_id, else config.json's).\n"
               "Tensor names and layouts stay Hugging Face's, so the same dtype round-trips bit for bit.\n"
               "pytorch_model.bin is not read (pickle files can run code); convert it to safetensors.",
    .epilog = "Refused with exit 2, naming the field or tensor: other architectures, rope_scaling,\n"
              "attention/MLP biases, malformed or inconsistent safetensors files, missing or misshapen\n"
              "tensors, unexpected tensors.\n"
              "Exit status: 0 success, 1 I/O failure, 2 bad usage or bad input (nothing written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = 1,
};


typedef struct {
    model_config_t cfg;
    st_file_t *files;
    size_t n_files;
    const st_tensor_t **src; /* per canonical tensor */
    size_t *src_file;
    dtype_t want; /* DT_INVALID: keep */
    const char *dir;
    const uint8_t *done_p; /* the block handed out last: released at the next call */
    size_t done_n;
    tokfiles_t tok; /* the tokenizer files to store (none: n == 0) */
} import_t;

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

static char *join(const char *dir, const char *name)
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

static int is_ignored_buffer(const char *name)
{
    /* Old checkpoints saved the rotary inverse frequencies: recomputed from rope_theta. */
    const char *suffix = ".self_attn.rotary_emb.inv_freq";
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0 && strncmp(name, "model.layers.", 13) == 0;
}

/* Matches every tensor of every file to the parameter list; exit-2 errors. */
static int match_tensors(import_t *im)
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
                    ftk_warn("%s: lm_head.weight ignored: config.json ties it to the embedding", sf->path);
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
            weights_spec_t s;
            weights_tensor_spec(&im->cfg, (size_t)i, &s);
            if (st->dt == DT_INVALID) {
                ftk_err_set("%s: tensor \"%s\": dtype %s is not F32, F16 or BF16", sf->path, st->name, st->dtype);
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
                ftk_err_set("%s: tensor \"%s\" has shape [%s], config.json implies [%s]", sf->path, st->name, got, want);
                return -1;
            }
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

static dtype_t src_dtype(void *ctx, size_t i)
{
    import_t *im = ctx;
    return im->want != DT_INVALID ? im->want : im->src[i]->dt;
}

static const void *src_rows(void *ctx, size_t i, const weights_spec_t *s, dtype_t dt, int64_t row0, int64_t n,
                            void *scratch)
{
    import_t *im = ctx;
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

/* Warns when generation (transformers' rule, hfconfig.h: generation_config.json, then
 * config.json) would stop elsewhere than at the tokenizer's EOS; a generation_config.json that cannot
 * be read is bad input, and so is a tokenizer larger than the model's vocabulary. Returns 0 or -1
 * (message set). */
static int check_eos(const char *dir, const model_config_t *cfg, const tokfiles_t *tk, const char *tk_src)
{
    char *gp = join(dir, "generation_config.json");
    buf_t g = {0};
    int has_gen = gp && exists(gp);
    int rc = has_gen && buf_read_small(&g, gp, BUF_SMALL_MAX, 0) < 0 ? -1 : 0;
    int64_t eos[16];
    int n = 0, from_gen = 0;
    if (rc == 0 &&
        hfconfig_generation_eos(cfg, has_gen ? (g.data ? g.data : "") : NULL, g.len, eos, 16, &n, &from_gen) < 0) {
        ftk_err_prefix("%s/", dir);
        rc = -1;
    }
    buf_free(&g);
    free(gp);
    const tokfile_t *enc = tokfiles_encoder(tk); /* the one ftk-generate picks */
    tok_t *t = rc == 0 && enc ? tok_load_mem(enc->data.data, enc->data.len, enc->name) : NULL;
    char msg[512];
    if (rc == 0 && enc && !t && tokenizer_opt) {
        ftk_err_prefix("--tokenizer %s: ", tk_src);
        rc = -1;
    } else if (rc == 0 && enc && !t) { /* stored as found, as always: the stages that use it say so */
        ftk_warn("%s", ftk_err_msg());
    } else if (t && tok_vocab_size(t) > cfg->vocab_size && tokenizer_opt) {
        ftk_err_set("--tokenizer %s: the tokenizer (%s) has %d pieces but config.json's vocab_size is %lld", tk_src,
                    enc->name, tok_vocab_size(t), (long long)cfg->vocab_size);
        rc = -1;
    } else if (t && hfconfig_eos_disagree(eos, n, from_gen, tok_eos_id(t), msg, sizeof msg))
        ftk_warn("%s: %s (%s)", dir, msg, enc->name);
    tok_free(t);
    return rc;
}

static int store_tokenizer(void *ctx, hid_t file)
{
    import_t *im = ctx;
    for (int i = 0; i < im->tok.n; i++)
        if (weights_put_file(file, im->tok.f[i].name, im->tok.f[i].data.data, im->tok.f[i].data.len) < 0)
            return -1;
    char *p = join(im->dir, "generation_config.json"); /* the model's, not the tokenizer's */
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

/* The tokenizer files: --tokenizer's, else the folder's (none: im->tok.n == 0; main warns
 * once the file is written, since every later stage would then need --tokenizer). */
static int find_tokenizer(import_t *im)
{
    if (tokenizer_opt)
        return tokfiles_load(tokenizer_opt, &im->tok);
    int found = 0;
    for (int i = 0; i < 3 && !found; i++) {
        char *p = join(im->dir, tokfiles_names[i]);
        found = p && exists(p);
        free(p);
    }
    return found ? tokfiles_load(im->dir, &im->tok) : 0;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-import-hf");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    int zstd = 0;
    import_t im = {.dir = pos[0], .want = DT_INVALID};
    if (!output) {
        ftk_error("--output is required");
        return FTK_EXIT_USAGE;
    }
    if (strcmp(dtype_opt, "keep") != 0 && (im.want = dtype_parse(dtype_opt)) == DT_INVALID) {
        ftk_error("--dtype %s: expected keep, float32, float16 or bfloat16", dtype_opt);
        return FTK_EXIT_USAGE;
    }
    if (h5_parse_compress(compress, &zstd) < 0) {
        ftk_error("--compress %s: expected none, zstd or zstd:1..22", compress);
        return FTK_EXIT_USAGE;
    }
    if (output_check(output, force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    struct stat dst;
    if (stat(im.dir, &dst) < 0) {
        ftk_error("%s: %s", im.dir, strerror(errno));
        return FTK_EXIT_USAGE;
    }
    if (!S_ISDIR(dst.st_mode)) {
        ftk_error("%s: not a folder: ftk-import-hf reads a Hugging Face model folder (config.json beside "
                  "model.safetensors or its shards); give the folder that holds it",
                  im.dir);
        return FTK_EXIT_USAGE;
    }
    atomic_install_signal_cleanup();
    double t0 = time_now();
    rc = FTK_EXIT_USAGE;
    char *cfg_path = join(im.dir, "config.json"), *index_path = join(im.dir, "model.safetensors.index.json");
    char *single_path = join(im.dir, "model.safetensors");
    char **names = NULL;
    size_t n_names = 0;
    buf_t text = {0};
    if (!cfg_path || !index_path || !single_path)
        goto done;
    if (buf_read_small(&text, cfg_path, BUF_SMALL_MAX, 0) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    if (hfconfig_parse(text.data, text.len, &im.cfg) < 0) {
        ftk_error("%s: %s", cfg_path, ftk_err_msg());
        goto done;
    }
    if (find_tokenizer(&im) < 0) {
        ftk_error("%s%s", tokenizer_opt ? "--tokenizer " : "", ftk_err_msg());
        goto done;
    }
    if (check_eos(im.dir, &im.cfg, &im.tok, tokenizer_opt ? tokenizer_opt : im.dir) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    if (exists(index_path)) {
        if (read_index(index_path, &names, &n_names) < 0) {
            ftk_error("%s: %s", index_path, ftk_err_msg());
            goto done;
        }
    } else if (exists(single_path)) {
        names = calloc(2, sizeof *names);
        if (!names || !(names[0] = strdup("model.safetensors")))
            goto done;
        n_names = 1;
    } else {
        ftk_error("%s: no model.safetensors or model.safetensors.index.json (pytorch_model.bin is not read: "
                  "pickle files can run code; convert it to safetensors first)",
                  im.dir);
        goto done;
    }
    im.files = calloc(n_names, sizeof *im.files);
    if (!im.files)
        goto done;
    for (size_t i = 0; i < n_names; i++) {
        char *p = join(im.dir, names[i]);
        int ok = p && st_open(&im.files[i], p) == 0;
        free(p);
        if (!ok) {
            ftk_error("%s", ftk_err_msg());
            goto done;
        }
        im.n_files++;
    }
    if (match_tensors(&im) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    /* The root dtype attribute: the one type, or "mixed". */
    size_t n = weights_n_tensors(&im.cfg);
    dtype_t common = src_dtype(&im, 0);
    for (size_t i = 1; i < n; i++)
        if (src_dtype(&im, i) != common)
            common = DT_INVALID;
    im.cfg.torch_dtype = common != DT_INVALID ? common : im.cfg.torch_dtype;

    rc = FTK_EXIT_FAIL;
    char source[512];
    snprintf(source, sizeof source, "hf:%s", im.dir);
    weights_source_t ws = {.cfg = &im.cfg,
                           .source = source,
                           .dtype_label = common != DT_INVALID ? dtype_name(common) : "mixed",
                           .zstd_level = zstd,
                           .ctx = &im,
                           .dtype = src_dtype,
                           .rows = src_rows,
                           .extra = store_tokenizer};
    uint64_t bytes = 0;
    if (weights_write_file(output, force ? OUTPUT_FORCE : 0, &ws, &bytes) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    if (!im.tok.n)
        ftk_warn("%s: no tokenizer (tokenizer.model, tokenizer.json): %s carries none, so ftk-pack, ftk-generate "
                 "and ftk-export-hf will each need --tokenizer; give it here once with --tokenizer FILE|DIR",
                 im.dir, output);
    double dt = time_now() - t0;
    ftk_info("%s: %lld layers, %.2f M parameters, %zu tensors, %.1f MB in %.2f s (%.0f MB/s)", output,
             (long long)im.cfg.num_hidden_layers, (double)model_n_params(&im.cfg) / 1e6, n, (double)bytes / 1e6, dt,
             dt > 0 ? (double)bytes / 1e6 / dt : 0.0);
    rc = FTK_EXIT_OK;
done:
    for (size_t i = 0; i < im.n_files; i++)
        st_close(&im.files[i]);
    for (size_t i = 0; names && i < n_names; i++)
        free(names[i]);
    free(names);
    free(im.files);
    free(im.src);
    free(im.src_file);
    tokfiles_free(&im.tok);
    free(cfg_path);
    free(index_path);
    free(single_path);
    buf_free(&text);
    return rc;
}
