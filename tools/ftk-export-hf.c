/* ftk-export-hf — an ftk weights file to a Hugging Face LlamaForCausalLM folder that
 * transformers' from_pretrained loads unchanged: config.json, safetensors shards with
 * model.safetensors.index.json, and the tokenizer files the weights file carries. The
 * folder appears complete under its name or not at all (atomic_dir_*). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/ckpt_verify.h"
#include "../formats/hf_folder.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../formats/weights.h"
#include "../libcommon/atomic.h"
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
    return hf_write_file(p->ad, name, data, len);
}

static int put_tokenizers(hid_t wf, atomic_dir_t *ad, const tokfiles_t *given, int *n_tok)
{
    put_tok_t p = {.ad = ad, .given = given};
    if (weights_each_file(wf, put_tokenizer, &p) < 0)
        return -1;
    for (int i = 0; given && i < given->n; i++)
        if (hf_write_file(ad, given->f[i].name, given->f[i].data.data, given->f[i].data.len) < 0)
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

/* The options' values: 0, or an exit code with the message printed. */
static int check_options(dtype_t *want, uint64_t *shard_limit)
{
    if (!output) {
        ftk_error("--output is required");
        return FTK_EXIT_USAGE;
    }
    if (strcmp(dtype_opt, "keep") != 0 && (*want = dtype_parse(dtype_opt)) == DT_INVALID) {
        ftk_error("--dtype %s: expected keep, float32, float16 or bfloat16", dtype_opt);
        return FTK_EXIT_USAGE;
    }
    if (opts_parse_size(max_shard, shard_limit) < 0 || *shard_limit == 0) {
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
    return 0;
}

/* The folder, complete under its name or not at all: 0, or an exit code with the message
 * printed. */
static int export(hf_export_t *ex, hid_t wf, const tokfiles_t *given, int *n_tok)
{
    atomic_dir_t ad = {0};
    if (atomic_dir_begin(&ad, output) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    progress_t prog;
    progress_start(&prog, "exporting", (int64_t)(ex->total >> 20), "MiB");
    if (hf_export_shards(ex, &ad, &prog) < 0) {
        ftk_error("%s", ftk_err_msg());
        progress_done(&prog);
        atomic_dir_abort(&ad);
        return FTK_EXIT_FAIL;
    }
    progress_done(&prog);
    if (hf_export_config(ex, &ad) < 0 || put_tokenizers(wf, &ad, given, n_tok) < 0) {
        ftk_error("%s", ftk_err_msg());
        atomic_dir_abort(&ad);
        return FTK_EXIT_FAIL;
    }
    if (atomic_dir_commit(&ad, force) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    return 0;
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
    if ((rc = check_options(&want, &shard_limit)) != 0)
        return rc;
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
    hf_export_t ex;
    rc = FTK_EXIT_USAGE;
    if (hf_export_plan(&ex, wf, pos[0], &cfg, want, shard_limit) < 0)
        ftk_error("%s", ftk_err_msg());
    else if (ex.n_shards > 99999)
        ftk_error("--max-shard-size %s gives %zu shards; at most 99999", max_shard, ex.n_shards);
    else
        rc = export(&ex, wf, tokenizer_opt ? &given : NULL, &n_tok);
    if (rc == 0) {
        if (!n_tok)
            ftk_warn("%s holds no tokenizer, so %s has none and transformers' AutoTokenizer cannot load it; "
                     "give one with --tokenizer FILE|DIR",
                     pos[0], output);
        double dt = time_now() - t0;
        ftk_info("%s: %zu tensors in %zu file%s, %.1f MB in %.2f s (%.0f MB/s)", output, ex.n, ex.n_shards,
                 ex.n_shards == 1 ? "" : "s", (double)ex.total / 1e6, dt,
                 dt > 0 ? (double)ex.total / 1e6 / dt : 0.0);
    }
    H5Fclose(wf);
    hf_export_free(&ex);
    tokfiles_free(&given);
    return rc;
}
