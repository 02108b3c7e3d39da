/* ftk-generate — sample text from weights or a checkpoint, with the tokenizer stored in
 * the file (tokenizer.model, tokenizer.json or llama2.c's tokenizer.bin), streaming the
 * text as it is produced. Decoding keeps a key/value cache (model_decode). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../engine/cuda_load.h"
#include "../engine/model.h"
#include "../formats/alpaca.h"
#include "../formats/checkpoint.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/rng.h"

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

typedef struct {
    tok_t *tok;
    int rank;
    buf_t gen; /* generation_config.json when stored */
    int has_gen;
} tok_pick_t;

/* Prefers tokenizer.model, then tokenizer.json, then llama2.c's tokenizer.bin; keeps
 * generation_config.json (where generation stops). */
static int pick_tok(const char *name, const void *data, size_t len, void *ctx)
{
    static const char *order[] = {"tokenizer.model", "tokenizer.json", "tokenizer.bin"};
    tok_pick_t *p = ctx;
    if (!strcmp(name, "generation_config.json")) {
        p->has_gen = 1;
        return buf_append(&p->gen, data, len);
    }
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, order[i]) || (p->tok && p->rank <= i))
            continue;
        tok_t *t = tok_load_mem(data, len, name);
        if (!t)
            return -1;
        tok_free(p->tok);
        p->tok = t;
        p->rank = i;
    }
    return 0;
}

typedef struct {
    float p;
    int32_t id;
} cand_t;

static int by_prob_desc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    return x->p > y->p ? -1 : x->p < y->p ? 1 : x->id - y->id;
}

/* Greedy, or temperature + nucleus (top-p) sampling. */
static int sample(const float *logits, int64_t V, rng_t *r, cand_t *c)
{
    int best = 0;
    for (int64_t j = 1; j < V; j++)
        if (logits[j] > logits[best])
            best = (int)j;
    if (greedy || temperature <= 0)
        return best;
    double sum = 0;
    for (int64_t j = 0; j < V; j++) {
        c[j].p = (float)exp((logits[j] - logits[best]) / temperature);
        c[j].id = (int32_t)j;
        sum += c[j].p;
    }
    qsort(c, (size_t)V, sizeof *c, by_prob_desc);
    double cum = 0;
    int64_t keep = V;
    for (int64_t i = 0; i < V; i++) {
        cum += c[i].p / sum;
        if (cum >= top_p) {
            keep = i + 1;
            break;
        }
    }
    double u = (double)(rng_next(r) >> 11) * 0x1p-53 * cum, acc = 0;
    for (int64_t i = 0; i < keep; i++) {
        acc += c[i].p / sum;
        if (u < acc)
            return c[i].id;
    }
    return c[keep - 1].id;
}

static int is_byte_token(const tok_t *t, int id)
{
    size_t l;
    const char *s = tok_piece(t, id, &l);
    return s && l == 6 && !strncmp(s, "<0x", 3);
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
    int from_env = 0;
    if (!device)
        device = backend_default_device(cuda_load_devices, &from_env);
    if (backend_check_device(device, from_env) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    /* static: reachable until exit on every error path (LeakSanitizer) */
    static backend_t *be;
    be = strcmp(device, "cuda") ? backend_cpu_new() : cuda_load_backend(0);
    if (!be) {
        ftk_error("--device cuda: %s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    model_config_t cfg;
    model_t *m = NULL;
    hid_t tf = -1;
    struct stat sb;
    if (stat(model_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char *dir = ckpt_resolve(model_path);
        ckpt_manifest_t man;
        if (!dir || ckpt_open(dir, &man) < 0) {
            ftk_error("%s", ftk_err_msg());
            free(dir);
            return FTK_EXIT_USAGE;
        }
        cfg = man.cfg;
        if (!(m = model_new(be, &cfg, PREC_FP32, 0, 0, 0))) {
            ftk_error("%s", ftk_err_msg());
            return FTK_EXIT_FAIL;
        }
        /* Whole units from every shard (padded for the checkpoint's shard count), as float32
         * whatever the checkpoint's precision: the model computes in float32, and a bf16
         * checkpoint widens exactly. */
        void **whole = calloc((size_t)man.n_units, sizeof *whole);
        int rc = whole ? 0 : -1;
        for (int i = 0; i < man.n_units && rc == 0; i++)
            if (!(whole[i] = malloc((size_t)man.units[i].padded * sizeof(float))))
                rc = -1;
        if (rc < 0)
            ftk_err_set("out of memory");
        if (rc == 0)
            rc = ckpt_read_params(dir, &man, DT_F32, whole);
        for (int i = 0; i < man.n_units && rc == 0; i++)
            be->upload(be, model_unit_param(m, i).p, whole[i], (size_t)man.units[i].length * sizeof(float));
        for (int i = 0; whole && i < man.n_units; i++)
            free(whole[i]);
        free(whole);
        if (rc < 0) {
            ftk_error("%s", ftk_err_msg());
            ckpt_manifest_free(&man);
            free(dir);
            return FTK_EXIT_USAGE;
        }
        tf = ckpt_open_tokenizer(dir, &man);
        ckpt_manifest_free(&man);
        free(dir);
    } else {
        if ((tf = weights_open(model_path, &cfg)) < 0) {
            ftk_error("%s", ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
        if (!(m = model_new(be, &cfg, PREC_FP32, 0, 0, 0)) || model_load_weights(m, tf) < 0) {
            ftk_error("%s: %s", model_path, ftk_err_msg());
            return FTK_EXIT_FAIL;
        }
    }
    tok_pick_t pick = {0};
    int bad = 0;
    if (tf < 0 || weights_each_file(tf, pick_tok, &pick) < 0) {
        ftk_error("%s: %s", model_path, tf < 0 ? "no tokenizer stored in it" : ftk_err_msg());
        bad = 1;
    } else if (tokenizer_opt) { /* in place of the stored one; generation_config.json stays the model's */
        tokfiles_t given;
        tok_free(pick.tok);
        pick.tok = NULL;
        if (tokfiles_load(tokenizer_opt, &given) < 0) {
            ftk_error("--tokenizer %s", ftk_err_msg());
            bad = 1;
        } else {
            const tokfile_t *enc = tokfiles_encoder(&given);
            pick.tok = tok_load_mem(enc->data.data, enc->data.len, enc->name);
            tokfiles_free(&given);
            if (!pick.tok) {
                ftk_error("--tokenizer %s: %s", tokenizer_opt, ftk_err_msg());
                bad = 1;
            }
        }
    } else if (!pick.tok) {
        ftk_error("%s: no tokenizer stored in it; give one with --tokenizer FILE|DIR", model_path);
        bad = 1;
    }
    if (bad) {
        tok_free(pick.tok);
        buf_free(&pick.gen);
        if (tf >= 0)
            h5_close(tf);
        model_free(m);
        backend_free(be);
        return FTK_EXIT_USAGE;
    }
    h5_close(tf);
    tok_t *tok = pick.tok;
    /* transformers' rule, not the tokenizer's EOS (hfconfig.h) */
    static int64_t eos[4096]; /* a list longer than this is cut (transformers' are a few ids) */
    int n_eos = 0;
    if (hfconfig_generation_eos(&cfg, pick.has_gen ? (pick.gen.data ? pick.gen.data : "") : NULL, pick.gen.len, eos,
                                4096, &n_eos, NULL) < 0) {
        ftk_error("%s: %s", model_path, ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    buf_free(&pick.gen);
    if (tok_vocab_size(tok) > cfg.vocab_size) {
        ftk_error("%s: the tokenizer has %d pieces but the model only %lld", model_path, tok_vocab_size(tok),
                  (long long)cfg.vocab_size);
        return FTK_EXIT_USAGE;
    }

    buf_t text = {0};
    if (alpaca) {
        alpaca_rec_t r = {.instruction = prompt, .instruction_len = strlen(prompt), .input = "", .output = ""};
        if (alpaca_prompt(&r, &text) < 0) {
            ftk_error("out of memory");
            return FTK_EXIT_FAIL;
        }
    } else if (buf_append(&text, prompt, strlen(prompt)) < 0) {
        ftk_error("out of memory");
        return FTK_EXIT_FAIL;
    }
    tok_ids_t ids = {0};
    tok_ws_t *ws = tok_ws_new();
    if (!ws || (tok_bos_id(tok) >= 0 && tok_ids_push(&ids, tok_bos_id(tok)) < 0) ||
        tok_encode(tok, ws, text.data ? text.data : "", text.len, &ids) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    if (ids.n == 0) {
        ftk_error("empty prompt and the tokenizer has no BOS token to start from");
        return FTK_EXIT_USAGE;
    }
    size_t n_prompt = ids.n;
    /* the prompt and --max-new, at most the model's context (compared, not added: -n 2^63-1
     * overflowed) */
    int64_t ctx = max_new > cfg.max_position_embeddings - (int64_t)n_prompt ? cfg.max_position_embeddings + 1
                                                                             : (int64_t)n_prompt + max_new;
    if (ctx > cfg.max_position_embeddings) {
        ctx = cfg.max_position_embeddings;
        if ((int64_t)n_prompt >= ctx) {
            ftk_error("the prompt is %zu tokens; the model's context is %lld", n_prompt,
                      (long long)cfg.max_position_embeddings);
            return FTK_EXIT_USAGE;
        }
    }
    model_kv_t *kv = model_kv_new(m, ctx);
    float *logits = malloc((size_t)cfg.vocab_size * sizeof *logits);
    cand_t *cand = malloc((size_t)cfg.vocab_size * sizeof *cand);
    if (!kv || !logits || !cand) {
        ftk_error("out of memory");
        return FTK_EXIT_FAIL;
    }
    rng_t r;
    rng_seed(&r, (uint64_t)seed);
    buf_t base = {0}, full = {0};
    if (tok_decode(tok, ids.v, ids.n, &base) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    size_t printed = base.len;
    int64_t p = 0;
    rc = model_decode(m, kv, ids.v, (int64_t)ids.n, 0, logits);
    if (rc == 0)
        rc = be->sync(be);
    p = (int64_t)ids.n;
    for (int64_t k = 0; rc == 0 && k < max_new; k++) {
        int next = sample(logits, cfg.vocab_size, &r, cand);
        int stop = 0;
        for (int e = 0; e < n_eos; e++)
            stop |= next == eos[e];
        if (stop && !ignore_eos)
            break;
        if (next >= tok_vocab_size(tok)) {
            ftk_error("the model produced id %d, outside the tokenizer's %d pieces", next, tok_vocab_size(tok));
            return FTK_EXIT_FAIL;
        }
        if (tok_ids_push(&ids, next) < 0) {
            ftk_error("out of memory");
            return FTK_EXIT_FAIL;
        }
        /* Print what the whole sequence decodes to beyond what is out already; wait while
         * a run of byte pieces may still be an incomplete UTF-8 character. */
        if (!is_byte_token(tok, next)) {
            full.len = 0;
            if (tok_decode(tok, ids.v, ids.n, &full) < 0) {
                ftk_error("%s", ftk_err_msg());
                return FTK_EXIT_FAIL;
            }
            if (full.len > printed) {
                fwrite(full.data + printed, 1, full.len - printed, stdout);
                fflush(stdout);
                printed = full.len;
            }
        }
        if (p >= ctx)
            break;
        rc = model_decode(m, kv, ids.v + p, 1, p, logits);
        if (rc == 0)
            rc = be->sync(be);
        p++;
    }
    if (rc < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    full.len = 0;
    if (tok_decode(tok, ids.v, ids.n, &full) == 0 && full.len > printed)
        fwrite(full.data + printed, 1, full.len - printed, stdout);
    printf("\n");
    buf_free(&base);
    buf_free(&full);
    buf_free(&text);
    free(logits);
    free(cand);
    tok_ids_free(&ids);
    tok_ws_free(ws);
    tok_free(tok);
    model_kv_free(m, kv);
    model_free(m);
    backend_free(be);
    return FTK_EXIT_OK;
}
