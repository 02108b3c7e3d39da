/* ftk-import-hf — a Hugging Face Llama folder (config.json + safetensors) to an ftk
 * weights file. Every input is validated before anything is written (safetensors.h lists
 * the checks), so a bad download fails with exit 2 and no output. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/hf_folder.h"
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


/* Warns when generation (transformers' rule, hfconfig.h: generation_config.json, then
 * config.json) would stop elsewhere than at the tokenizer's EOS; a generation_config.json that cannot
 * be read is bad input, and so is a tokenizer larger than the model's vocabulary. Returns 0 or -1
 * (message set). */
static int check_eos(const char *dir, const model_config_t *cfg, const tokfiles_t *tk, const char *tk_src)
{
    char *gp = hf_folder_path(dir, "generation_config.json");
    buf_t g = {0};
    int has_gen = gp && hf_folder_has(dir, "generation_config.json");
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

/* The tokenizer files: --tokenizer's, else the folder's (none: im->tok.n == 0; main warns
 * once the file is written, since every later stage would then need --tokenizer). */
static int find_tokenizer(hf_import_t *im)
{
    if (tokenizer_opt)
        return tokfiles_load(tokenizer_opt, &im->tok);
    int found = 0;
    for (int i = 0; i < 3 && !found; i++)
        found = hf_folder_has(im->dir, tokfiles_names[i]);
    return found ? tokfiles_load(im->dir, &im->tok) : 0;
}

static void warn_tied_head(const char *path)
{
    ftk_warn("%s: lm_head.weight ignored: config.json ties it to the embedding", path);
}

/* The options' values and the input folder: 0, or an exit code with the message printed. */
static int check_options(const char *dir, dtype_t *want, int *zstd)
{
    if (!output) {
        ftk_error("--output is required");
        return FTK_EXIT_USAGE;
    }
    if (strcmp(dtype_opt, "keep") != 0 && (*want = dtype_parse(dtype_opt)) == DT_INVALID) {
        ftk_error("--dtype %s: expected keep, float32, float16 or bfloat16", dtype_opt);
        return FTK_EXIT_USAGE;
    }
    if (h5_parse_compress(compress, zstd) < 0) {
        ftk_error("--compress %s: expected none, zstd or zstd:1..22", compress);
        return FTK_EXIT_USAGE;
    }
    if (output_check(output, force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    struct stat dst;
    if (stat(dir, &dst) < 0) {
        ftk_error("%s: %s", dir, strerror(errno));
        return FTK_EXIT_USAGE;
    }
    if (!S_ISDIR(dst.st_mode)) {
        ftk_error("%s: not a folder: ftk-import-hf reads a Hugging Face model folder (config.json beside "
                  "model.safetensors or its shards); give the folder that holds it",
                  dir);
        return FTK_EXIT_USAGE;
    }
    return 0;
}

/* config.json, the tokenizer and the weights files, all checked: 0 or -1 with the message
 * printed. */
static int read_folder(hf_import_t *im)
{
    char *cfg_path = hf_folder_path(im->dir, "config.json");
    buf_t text = {0};
    int rc = -1;
    if (!cfg_path)
        goto done;
    if (buf_read_small(&text, cfg_path, BUF_SMALL_MAX, 0) < 0)
        ftk_error("%s", ftk_err_msg());
    else if (hfconfig_parse(text.data, text.len, &im->cfg) < 0)
        ftk_error("%s: %s", cfg_path, ftk_err_msg());
    else if (find_tokenizer(im) < 0)
        ftk_error("%s%s", tokenizer_opt ? "--tokenizer " : "", ftk_err_msg());
    else if (check_eos(im->dir, &im->cfg, &im->tok, tokenizer_opt ? tokenizer_opt : im->dir) < 0 ||
             hf_import_open(im) < 0)
        ftk_error("%s", ftk_err_msg());
    else
        rc = 0;
done:
    free(cfg_path);
    buf_free(&text);
    return rc;
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
    hf_import_t im = {.dir = pos[0], .want = DT_INVALID, .tied_head_skipped = warn_tied_head};
    if ((rc = check_options(im.dir, &im.want, &zstd)) != 0)
        return rc;
    atomic_install_signal_cleanup();
    double t0 = time_now();
    if (read_folder(&im) < 0) {
        hf_import_close(&im);
        return FTK_EXIT_USAGE;
    }
    /* The root dtype attribute: the one type, or "mixed". */
    size_t n = weights_n_tensors(&im.cfg);
    dtype_t common = hf_import_common_dtype(&im);
    im.cfg.torch_dtype = common != DT_INVALID ? common : im.cfg.torch_dtype;
    char source[512];
    snprintf(source, sizeof source, "hf:%s", im.dir);
    weights_source_t ws = {.cfg = &im.cfg,
                           .source = source,
                           .dtype_label = common != DT_INVALID ? dtype_name(common) : "mixed",
                           .zstd_level = zstd};
    hf_import_source(&im, &ws);
    uint64_t bytes = 0;
    if (weights_write_file(output, force ? OUTPUT_FORCE : 0, &ws, &bytes) < 0) {
        ftk_error("%s", ftk_err_msg());
        hf_import_close(&im);
        return FTK_EXIT_FAIL;
    }
    if (!im.tok.n)
        ftk_warn("%s: no tokenizer (tokenizer.model, tokenizer.json): %s carries none, so ftk-pack, ftk-generate "
                 "and ftk-export-hf will each need --tokenizer; give it here once with --tokenizer FILE|DIR",
                 im.dir, output);
    double dt = time_now() - t0;
    ftk_info("%s: %lld layers, %.2f M parameters, %zu tensors, %.1f MB in %.2f s (%.0f MB/s)", output,
             (long long)im.cfg.num_hidden_layers, (double)model_n_params(&im.cfg) / 1e6, n, (double)bytes / 1e6, dt,
             dt > 0 ? (double)bytes / 1e6 / dt : 0.0);
    hf_import_close(&im);
    return FTK_EXIT_OK;
}
