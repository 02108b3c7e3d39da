/* ftk-generate — sample text from weights or a checkpoint, with the tokenizer stored in
 * the file (tokenizer.model, tokenizer.json or llama2.c's tokenizer.bin), streaming the
 * text as it is produced. Decoding keeps a key/value cache (model_decode). */
#include <stdio.h>
#include <string.h>

#include "../engine/cuda_load.h"
#include "../engine/generate.h"
#include "../formats/alpaca.h"
#include "../formats/hfconfig.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"

static const char *model_path, *prompt = "", *device, *tokenizer_opt; /* NULL: FTK_DEVICE, else cuda with a GPU */
static int alpaca, greedy, threads, ignore_eos;
static double temperature = 0.8, top_p = 0.95;
static int64_t seed = 42, max_new = 256;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"model", 'm', OPT_STR, &model_path, "W.h5|DIR", "weights file, checkpoint directory or run directory (its latest)"},
    {"tokenizer", 0, OPT_STR, &tokenizer_opt, "FILE|DIR|W.h5",
     "the tokenizer to use in place of the one stored with the model (a file, a folder, or a weights file)"},
    {"prompt", 'p', OPT_STR, &prompt, "TEXT", "text to continue (empty: start from BOS alone)"},
    {"alpaca", 0, OPT_FLAG, &alpaca, NULL, "wrap the prompt in the Alpaca template, as ftk-pack does for training"},
    {"greedy", 0, OPT_FLAG, &greedy, NULL, "always take the most likely token (same as --temperature 0)"},
    {"temperature", 't', OPT_DOUBLE, &temperature, "T", "sampling temperature (0: greedy)", "0.."},
    {"top-p", 0, OPT_DOUBLE, &top_p, "P", "nucleus sampling: the smallest set of tokens with probability >= P", "0<..1"},
    {"seed", 's', OPT_I64, &seed, "S", "sampling seed", ".."},
    {"max-new", 'n', OPT_I64, &max_new, "N", "tokens to generate at most", "0.."},
    {"ignore-eos", 0, OPT_FLAG, &ignore_eos, NULL, "go on after the end-of-sequence token"},
    {"threads", 'j', OPT_INT, &threads, "N", "threads (0: all cores)", OPTS_THREADS_RANGE},
    {"device", 0, OPT_STR, &device, "cpu|cuda",
     "compute backend (cuda: GPU 0). Default: $FTK_DEVICE, else cuda where a GPU is visible, else cpu"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-generate",
    .usage = "--model W.h5|RUN/|RUN/step-NNNNNNNN [--prompt TEXT] [--alpaca] [--greedy | -t T --top-p P -s S]",
    .summary = "Generates text with a model: BOS + the prompt's tokens, then up to --max-new tokens, stopping at\n"
               "the end-of-sequence token as transformers' generate() does: generation_config.json's eos_token_id\n"
               "when ftk-import-hf found that file, else config.json's; not the tokenizer's. The generated text\n"
               "(not the prompt) goes to stdout as it is made.",
    .epilog = "Exit status: 0 success, 1 runtime failure, 2 bad usage or input.\n",
    .opts = options,
    .min_pos = 0,
    .max_pos = 0,
};

/* The tokenizer: --tokenizer's, else the one stored with the model; and the stored
 * generation_config.json, which stays the model's whatever the tokenizer. */
static int choose_tokenizer(hid_t tf, gen_files_t *f)
{
    if (tf < 0 || gen_stored_files(tf, f) < 0) {
        ftk_error("%s: %s", model_path, tf < 0 ? "no tokenizer stored in it" : ftk_err_msg());
        return -1;
    }
    if (tokenizer_opt) {
        tokfiles_t given;
        tok_free(f->tok);
        f->tok = NULL;
        if (tokfiles_load(tokenizer_opt, &given) < 0) {
            ftk_error("--tokenizer %s", ftk_err_msg());
            return -1;
        }
        const tokfile_t *enc = tokfiles_encoder(&given);
        f->tok = tok_load_mem(enc->data.data, enc->data.len, enc->name);
        tokfiles_free(&given);
        if (!f->tok) {
            ftk_error("--tokenizer %s: %s", tokenizer_opt, ftk_err_msg());
            return -1;
        }
    } else if (!f->tok) {
        ftk_error("%s: no tokenizer stored in it; give one with --tokenizer FILE|DIR", model_path);
        return -1;
    }
    return 0;
}

/* The backend --device names; 0 or an exit code. */
static int open_backend(backend_t **be)
{
    int from_env = 0;
    if (!device)
        device = backend_default_device(cuda_load_devices, &from_env);
    if (backend_check_device(device, from_env) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    *be = strcmp(device, "cuda") ? backend_cpu_new() : cuda_load_backend(0);
    if (!*be) {
        ftk_error("--device cuda: %s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    return 0;
}

/* The text to continue: the prompt, in the Alpaca template with --alpaca. */
static int prompt_text(buf_t *text)
{
    if (alpaca) {
        alpaca_rec_t r = {.instruction = prompt, .instruction_len = strlen(prompt), .input = "", .output = ""};
        return alpaca_prompt(&r, text);
    }
    return buf_append(text, prompt, strlen(prompt));
}

static void emit_stdout(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-generate");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    if (!model_path) {
        ftk_error("--model is required (see --help)");
        return FTK_EXIT_USAGE;
    }
    if (max_new < 0 || temperature < 0 || !(top_p > 0 && top_p <= 1) || threads < 0) {
        ftk_error("invalid value: need --max-new >= 0, --temperature >= 0, --top-p in (0, 1]");
        return FTK_EXIT_USAGE;
    }
    opts_start_threads(threads); /* a team that cannot be made fails now, before any output */
    if (h5_init() < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    /* static: reachable until exit on every error path (LeakSanitizer) */
    static backend_t *be;
    if ((rc = open_backend(&be)) != 0)
        return rc;
    model_config_t cfg;
    model_t *m;
    hid_t tf;
    if ((rc = gen_load(be, model_path, &cfg, &m, &tf)) != 0) {
        ftk_error("%s", ftk_err_msg());
        return rc;
    }
    gen_files_t files = {0};
    if (choose_tokenizer(tf, &files) < 0) {
        gen_files_free(&files);
        if (tf >= 0)
            h5_close(tf);
        model_free(m);
        backend_free(be);
        return FTK_EXIT_USAGE;
    }
    h5_close(tf);
    tok_t *tok = files.tok;
    /* transformers' rule, not the tokenizer's EOS (hfconfig.h) */
    static int64_t eos[4096]; /* a list longer than this is cut (transformers' are a few ids) */
    int n_eos = 0;
    if (hfconfig_generation_eos(&cfg, files.has_gen ? (files.gen.data ? files.gen.data : "") : NULL, files.gen.len,
                                eos, 4096, &n_eos, NULL) < 0) {
        ftk_error("%s: %s", model_path, ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    buf_free(&files.gen);
    if (tok_vocab_size(tok) > cfg.vocab_size) {
        ftk_error("%s: the tokenizer has %d pieces but the model only %lld", model_path, tok_vocab_size(tok),
                  (long long)cfg.vocab_size);
        return FTK_EXIT_USAGE;
    }
    buf_t text = {0};
    if (prompt_text(&text) < 0) {
        ftk_error("out of memory");
        return FTK_EXIT_FAIL;
    }
    tok_ids_t ids = {0};
    int64_t ctx;
    if ((rc = gen_prompt(tok, &cfg, text.data ? text.data : "", text.len, max_new, &ids, &ctx)) != 0) {
        ftk_error("%s", ftk_err_msg());
        return rc;
    }
    gen_opts_t o = {.greedy = greedy,
                    .temperature = temperature,
                    .top_p = top_p,
                    .seed = (uint64_t)seed,
                    .max_new = max_new,
                    .eos = eos,
                    .n_eos = n_eos,
                    .ignore_eos = ignore_eos};
    if (gen_run(m, &cfg, tok, &ids, ctx, &o, emit_stdout, NULL) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    printf("\n");
    buf_free(&text);
    tok_ids_free(&ids);
    tok_free(tok);
    model_free(m);
    backend_free(be);
    return FTK_EXIT_OK;
}
