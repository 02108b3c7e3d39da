/* ftk-export-hf — an ftk weights file to a Hugging Face LlamaForCausalLM folder that
 * transformers' from_pretrained loads unchanged: config.json, safetensors shards with
 * model.safetensors.index.json, and the tokenizer files the weights file carries. The
 * folder appears complete under its name or not at all (atomic_dir_*). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/ckpt_verify.h"
#include "../formats/json.h"
#include "../formats/safetensors.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../formats/weights.h"
#include "../libcommon/atomic.h"
#include "../libcommon/fault.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/progress.h"
#include "../libcommon/timer.h"

static const char *output, *dtype_opt = "keep", *max_shard = "5GB", *tokenizer_opt;
static int force;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"output", 'o', OPT_STR, &output, "DIR", "folder to write (required; must not exist unless --force)"},
    {"dtype", 0, OPT_STR, &dtype_opt, "keep|float32|float16|bfloat16",
     "write tensors in this type (keep: as stored; narrowing rounds to nearest even)"},
    {"max-shard-size", 0, OPT_STR, &max_shard, "SIZE",
     "largest safetensors file (5GB = 5*10^9 bytes, 2GiB = 2*2^30); one file when everything fits"},
    {"force", 'f', OPT_FLAG, &force, NULL,
     "replace an existing output folder (after the new one is complete; only an empty folder or one with a "
     "config.json, a model folder)"},
    {"tokenizer", 't', OPT_STR, &tokenizer_opt, "FILE|DIR|W.h5",
     "write this tokenizer in place of the one stored in FILE.h5 (a folder of tokenizer files, one file, or a "
     "weights file)"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-export-hf",
    .usage = "[options] FILE.h5 -o DIR",
    .summary = "Writes an ftk weights file as a Hugging Face folder: config.json, model.safetensors (or\n"
               "model-00001-of-0000N.safetensors shards and model.safetensors.index.json, as transformers\n"
               "names them) and the tokenizer files stored in the weights file (or --tokenizer's; a folder\n"
               "without a tokenizer is warned about: AutoTokenizer cannot load it). Tensors keep their\n"
               "names and bytes: an import followed by an export with the same dtype is bit-identical.",
    .epilog = "Exit status: 0 success, 1 I/O failure, 2 bad usage or bad input (nothing written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = 1,
};

typedef struct {
    weights_spec_t s;
    dtype_t stored, out;
    uint64_t bytes;
    size_t shard;
} item_t;

static int write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, f) != n) {
        ftk_err_set("%s: write: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int write_text_file(atomic_dir_t *ad, const char *name, const void *data, size_t len)
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

typedef struct {
    atomic_dir_t *ad;
    const tokfiles_t *given; /* --tokenizer's files, which replace the stored ones */
    int n_tok;               /* tokenizer files written */
} put_tok_t;

static int put_tokenizer(const char *name, const void *data, size_t len, void *ctx)
{
    put_tok_t *p = ctx;
    if (p->given && tokfiles_is_tokenizer_name(name))
        return 0;
    p->n_tok += tokfiles_is_tokenizer_name(name) && strcmp(name, "tokenizer_config.json") &&
                strcmp(name, "special_tokens_map.json");
    return write_text_file(p->ad, name, data, len);
}

static int put_tokenizers(hid_t wf, atomic_dir_t *ad, const tokfiles_t *given, int *n_tok)
{
    put_tok_t p = {.ad = ad, .given = given};
    if (weights_each_file(wf, put_tokenizer, &p) < 0)
        return -1;
    for (int i = 0; given && i < given->n; i++)
        if (write_text_file(ad, given->f[i].name, given->f[i].data.data, given->f[i].data.len) < 0)
            return -1;
    *n_tok = p.n_tok + (given ? 1 : 0);
    return 0;
}

/* The stored generation_config.json and the tokenizer ftk-generate would pick
 * (tokenizer.model, then tokenizer.json): where generation stops, against its EOS. */
typedef struct {
    buf_t gen;
    int has_gen, tok_rank;
    int64_t tok_eos;
    const char *tok_name;
} eos_check_t;

static int eos_collect(const char *name, const void *data, size_t len, void *ctx)
{
    eos_check_t *e = ctx;
    if (!strcmp(name, "generation_config.json")) {
        e->has_gen = 1;
        return buf_append(&e->gen, data, len);
    }
    int rank = !strcmp(name, "tokenizer.model") ? 0 : !strcmp(name, "tokenizer.json") ? 1 : 2;
    if (rank < e->tok_rank) {
        tok_t *t = tok_load_mem(data, len, name);
        if (t) { /* an unreadable tokenizer is not this check's to report */
            e->tok_eos = tok_eos_id(t);
            e->tok_rank = rank;
            e->tok_name = rank ? "tokenizer.json" : "tokenizer.model";
            tok_free(t);
        }
    }
    return 0;
}

static void warn_eos(hid_t wf, const char *path, const model_config_t *cfg)
{
    eos_check_t e = {.tok_rank = 2, .tok_eos = -1};
    int64_t eos[16];
    int n = 0, from_gen = 0;
    char msg[512];
    if (weights_each_file(wf, eos_collect, &e) == 0 && e.tok_name &&
        hfconfig_generation_eos(cfg, e.has_gen ? (e.gen.data ? e.gen.data : "") : NULL, e.gen.len, eos, 16, &n,
                                &from_gen) == 0 &&
        hfconfig_eos_disagree(eos, n, from_gen, e.tok_eos, msg, sizeof msg))
        ftk_warn("%s: %s (%s)", path, msg, e.tok_name);
    buf_free(&e.gen);
}

/* An empty folder, or one holding config.json (an earlier export, a model folder). */
static int model_folder(const char *dir)
{
    char *p = malloc(strlen(dir) + 16);
    struct stat st;
    int yes = p && (sprintf(p, "%s/config.json", dir), lstat(p, &st) == 0);
    free(p);
    DIR *d = yes ? NULL : opendir(dir);
    struct dirent *e;
    if (d) {
        yes = 1;
        while (yes && (e = readdir(d)))
            yes = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
        closedir(d);
    }
    return yes;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-export-hf");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    dtype_t want = DT_INVALID;
    uint64_t shard_limit = 0;
    if (!output) {
        ftk_error("--output is required");
        return FTK_EXIT_USAGE;
    }
    if (strcmp(dtype_opt, "keep") != 0 && (want = dtype_parse(dtype_opt)) == DT_INVALID) {
        ftk_error("--dtype %s: expected keep, float32, float16 or bfloat16", dtype_opt);
        return FTK_EXIT_USAGE;
    }
    if (opts_parse_size(max_shard, &shard_limit) < 0 || shard_limit == 0) {
        ftk_error("--max-shard-size %s: expected a size such as 5GB, 500MB or 2GiB", max_shard);
        return FTK_EXIT_USAGE;
    }
    /* --force replaces an earlier export (a model folder), never a file, a link, or a folder of
     * something else that happens to be there */
    int kind = output_check_dir(output, force ? OUTPUT_FORCE : 0);
    if (kind < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if (kind == OUTPUT_REPLACE && !model_folder(output)) {
        ftk_error("%s: holds files but no config.json: not a model folder, so --force does not replace it", output);
        return FTK_EXIT_USAGE;
    }
    if (ckpt_verify_is_checkpoint(pos[0])) { /* a directory, or RUN/latest */
        ftk_error("%s: a checkpoint or run directory, not a weights file; merge it into one first: "
                  "ftk-merge %s -o W.h5, then ftk-export-hf W.h5 -o %s",
                  pos[0], pos[0], output);
        return FTK_EXIT_USAGE;
    }
    tokfiles_t given = {0};
    if (tokenizer_opt && tokfiles_load(tokenizer_opt, &given) < 0) {
        ftk_error("--tokenizer %s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    atomic_install_signal_cleanup();
    double t0 = time_now();
    model_config_t cfg;
    hid_t wf = weights_open(pos[0], &cfg);
    if (wf < 0) {
        ftk_error("%s", ftk_err_msg());
        tokfiles_free(&given);
        return FTK_EXIT_USAGE;
    }
    warn_eos(wf, pos[0], &cfg);
    int n_tok = 0;
    rc = FTK_EXIT_USAGE;
    size_t n = weights_n_tensors(&cfg), n_shards = 0;
    item_t *it = calloc(n, sizeof *it);
    atomic_dir_t ad = {0};
    int dir_open = 0;
    void *buf = NULL, *scratch = NULL;
    buf_t hdr = {0}, text = {0};
    uint64_t total = 0, done = 0, cur = 0;
    dtype_t common = DT_INVALID;
    if (!it)
        goto fail;
    /* Plan: types, sizes, and shards filled greedily in canonical order (a shard exceeds
     * the limit only when one tensor alone does, as transformers does). */
    for (size_t i = 0; i < n; i++) {
        weights_tensor_spec(&cfg, i, &it[i].s);
        if ((it[i].stored = weights_tensor_dtype(wf, it[i].s.name)) == DT_INVALID) {
            ftk_error("%s: %s", pos[0], ftk_err_msg());
            goto fail;
        }
        it[i].out = want != DT_INVALID ? want : it[i].stored;
        it[i].bytes = (uint64_t)it[i].s.shape[0] * (uint64_t)(it[i].s.rank == 2 ? it[i].s.shape[1] : 1) *
                      dtype_size(it[i].out);
        if (i == 0 || (cur > 0 && cur + it[i].bytes > shard_limit)) {
            n_shards++;
            cur = 0;
        }
        cur += it[i].bytes;
        it[i].shard = n_shards - 1;
        total += it[i].bytes;
        common = i == 0 ? it[i].out : common == it[i].out ? common : DT_INVALID;
    }
    if (n_shards > 99999) {
        ftk_error("--max-shard-size %s gives %zu shards; at most 99999", max_shard, n_shards);
        goto fail;
    }
    rc = FTK_EXIT_FAIL;
    if (atomic_dir_begin(&ad, output) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto fail;
    }
    dir_open = 1;
    const size_t block = 32u << 20;
    if (!(buf = malloc(block)) || !(scratch = malloc(block))) {
        ftk_error("out of memory");
        goto fail;
    }
    progress_t prog;
    progress_start(&prog, "exporting", (int64_t)(total >> 20), "MiB");
    buf_t index = {0};
    buf_append(&index, "{\n  \"metadata\": {\n    \"total_size\": ", 36);
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%llu\n  },\n  \"weight_map\": {", (unsigned long long)total);
    buf_append(&index, tmp, strlen(tmp));
    for (size_t sh = 0, i0 = 0; sh < n_shards; sh++) {
        size_t i1 = i0;
        while (i1 < n && it[i1].shard == sh)
            i1++;
        char name[64];
        if (n_shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", sh + 1, n_shards);
        st_entry_t *e = calloc(i1 - i0, sizeof *e);
        if (!e) {
            ftk_error("out of memory");
            goto fail_prog;
        }
        for (size_t i = i0; i < i1; i++) {
            e[i - i0] = (st_entry_t){it[i].s.name, it[i].out, it[i].s.rank, it[i].s.shape};
            snprintf(tmp, sizeof tmp, "%s\n    \"%s\": \"%s\"", i ? "," : "", it[i].s.name, name);
            buf_append(&index, tmp, strlen(tmp));
        }
        hdr.len = 0;
        int hrc = st_build_header(&hdr, e, i1 - i0, NULL);
        free(e);
        char *path = atomic_dir_file(&ad, name);
        FILE *f = path && hrc == 0 ? fopen(path, "wb") : NULL;
        if (!f) {
            ftk_error("%s: %s", path ? path : name, hrc < 0 ? ftk_err_msg() : strerror(errno));
            goto fail_prog;
        }
        setvbuf(f, NULL, _IOFBF, 4u << 20);
        int wrc = write_all(f, hdr.data, hdr.len, path);
        for (size_t i = i0; i < i1 && wrc == 0; i++) {
            const weights_spec_t *s = &it[i].s;
            int64_t rows = s->rank == 2 ? s->shape[0] : 1, cols = s->rank == 2 ? s->shape[1] : s->shape[0];
            size_t in_row = (size_t)cols * dtype_size(it[i].stored), out_row = (size_t)cols * dtype_size(it[i].out);
            size_t widest = in_row > out_row ? in_row : out_row;
            int64_t per = widest ? (int64_t)(block / widest) : rows;
            if (per < 1) {
                ftk_err_set("%s: a row of %zu bytes is larger than the %zu-byte block", s->name, widest, block);
                wrc = -1;
            }
            for (int64_t r = 0; r < rows && wrc == 0; r += per) {
                int64_t k = rows - r < per ? rows - r : per;
                if (weights_read_rows(wf, s->name, it[i].out, r, k, buf, scratch) < 0) {
                    ftk_err_prefix("%s: ", pos[0]);
                    wrc = -1;
                    break;
                }
                wrc = write_all(f, buf, (size_t)k * out_row, path);
                if (wrc == 0)
                    wrc = fault_point("weights.write");
                done += (uint64_t)k * out_row;
                progress_update(&prog, (int64_t)(done >> 20));
            }
        }
        if (fclose(f) != 0 && wrc == 0) {
            ftk_err_set("%s: close: %s", path, strerror(errno));
            wrc = -1;
        }
        if (wrc < 0) {
            ftk_error("%s", ftk_err_msg());
            goto fail_prog;
        }
        i0 = i1;
    }
    progress_done(&prog);
    buf_append(&index, "\n  }\n}\n", 7);
    if (hfconfig_write(&text, &cfg, common != DT_INVALID ? common : cfg.torch_dtype) < 0 ||
        write_text_file(&ad, "config.json", text.data, text.len) < 0 ||
        (n_shards > 1 && write_text_file(&ad, "model.safetensors.index.json", index.data, index.len) < 0) ||
        put_tokenizers(wf, &ad, tokenizer_opt ? &given : NULL, &n_tok) < 0) {
        ftk_error("%s", ftk_err_msg());
        buf_free(&index);
        goto fail;
    }
    buf_free(&index);
    if (atomic_dir_commit(&ad, force) < 0) {
        dir_open = 0;
        ftk_error("%s", ftk_err_msg());
        goto fail;
    }
    dir_open = 0;
    if (!n_tok)
        ftk_warn("%s holds no tokenizer, so %s has none and transformers' AutoTokenizer cannot load it; "
                 "give one with --tokenizer FILE|DIR",
                 pos[0], output);
    double dt = time_now() - t0;
    ftk_info("%s: %zu tensors in %zu file%s, %.1f MB in %.2f s (%.0f MB/s)", output, n, n_shards,
             n_shards == 1 ? "" : "s", (double)total / 1e6, dt, dt > 0 ? (double)total / 1e6 / dt : 0.0);
    rc = FTK_EXIT_OK;
    goto fail;
fail_prog:
    progress_done(&prog);
    buf_free(&index);
fail:
    if (dir_open)
        atomic_dir_abort(&ad);
    H5Fclose(wf);
    free(it);
    free(buf);
    free(scratch);
    buf_free(&hdr);
    buf_free(&text);
    tokfiles_free(&given);
    return rc;
}
