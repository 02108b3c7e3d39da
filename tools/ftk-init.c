/* ftk-init — random initial weights for any Llama shape, seeded and reproducible:
 * benchmarks and demos where real weights cannot be downloaded.
 *
 * Initialisation is transformers' LlamaPreTrainedModel._init_weights: every linear and
 * the embedding ~ Normal(0, initializer_range), RMSNorm gains = 1. Each row of each tensor
 * draws from its own xoshiro256** stream seeded from (seed, tensor index, row), so the
 * file is the same whatever the number of threads, and any row can be regenerated alone. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../formats/weights.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/rng.h"
#include "../libcommon/timer.h"

static const char *output, *preset, *config_path, *dtype_opt = "config", *compress = "none", *tokenizer_path;
static int64_t seed = 42;
static int threads, force;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"output", 'o', OPT_STR, &output, "FILE.h5", "weights file to write (required; must not exist unless --force)"},
    {"force", 'f', OPT_FLAG, &force, NULL, "replace an existing output file (once the new one is complete)"},
    {"preset", 'p', OPT_STR, &preset, "NAME", "a named shape: tiny, stories260k, llama-1b, llama2-7b, llama2-13b"},
    {"config", 'c', OPT_STR, &config_path, "config.json", "a Hugging Face config.json instead of a preset"},
    {"seed", 's', OPT_I64, &seed, "S", "random seed", ".."},
    {"dtype", 0, OPT_STR, &dtype_opt, "config|float32|float16|bfloat16",
     "tensor type (config: the config's torch_dtype)"},
    {"compress", 0, OPT_STR, &compress, "none|zstd[:L]", "compress tensors with zstd (HDF5 filter 32015)"},
    {"tokenizer", 't', OPT_STR, &tokenizer_path, "FILE|DIR|W.h5",
     "store this tokenizer in the weights file (tokenizer.model, tokenizer.json or llama2.c's tokenizer.bin; a "
     "folder of tokenizer files, or a weights file)"},
    {"threads", 'j', OPT_INT, &threads, "N", "threads (0: all cores); the output does not depend on it", OPTS_THREADS_RANGE},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-init",
    .usage = "(--preset NAME | --config config.json) [options] -o FILE.h5",
    .summary = "Writes randomly initialised weights: Normal(0, initializer_range) for the embedding and\n"
               "every linear layer, 1 for the RMSNorm gains (transformers' Llama initialisation).\n"
               "The same seed gives the same file on any machine and any number of threads.",
    .epilog = "Presets: tiny (57k parameters, 512-token vocabulary: tests and the demo), stories260k\n"
              "(llama2.c's shape), llama-1b (TinyLlama-1.1B's shape), llama2-7b and llama2-13b (the\n"
              "exact Llama 2 shapes).\n"
              "Exit status: 0 success, 1 I/O failure, 2 bad usage or bad input (nothing written).\n",
    .opts = options,
    .min_pos = 0,
    .max_pos = 0,
};

typedef struct {
    model_config_t cfg;
    dtype_t dt;
    uint64_t seed;
    tokfiles_t tok;
} init_t;

static dtype_t init_dtype(void *ctx, size_t i)
{
    (void)i;
    return ((init_t *)ctx)->dt;
}

/* Normal(0, std) values for one row, from a stream of its own (Box–Muller in double). */
static void normal_row(uint64_t seed, size_t tensor, int64_t row, float std, float *out, int64_t n)
{
    rng_t r;
    rng_seed(&r, seed ^ (0x9E3779B97F4A7C15ull * (tensor + 1)) ^ (0xD1B54A32D192ED03ull * (uint64_t)(row + 1)));
    for (int64_t j = 0; j < n; j += 2) {
        double u1 = (double)((rng_next(&r) >> 11) + 1) * 0x1p-53; /* (0, 1]: log is finite */
        double u2 = (double)(rng_next(&r) >> 11) * 0x1p-53;
        double rad = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        out[j] = (float)(std * rad * cos(a));
        if (j + 1 < n)
            out[j + 1] = (float)(std * rad * sin(a));
    }
}

static const void *init_rows(void *ctx, size_t i, const weights_spec_t *s, dtype_t dt, int64_t row0, int64_t n,
                             void *scratch)
{
    init_t *in = ctx;
    int64_t cols = s->rank == 2 ? s->shape[1] : s->shape[0];
    if (s->is_norm) {
        for (int64_t j = 0; j < cols; j++) {
            float one = 1.0f;
            dtype_convert((char *)scratch + (size_t)j * dtype_size(dt), dt, &one, DT_F32, 1);
        }
        return scratch;
    }
    int failed = 0;
#pragma omp parallel
    {
        float *tmp = dt == DT_F32 ? NULL : malloc((size_t)cols * sizeof *tmp);
        if (dt != DT_F32 && !tmp)
            failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            if (dt == DT_F32) {
                normal_row(in->seed, i, row0 + r, (float)in->cfg.initializer_range, (float *)scratch + r * cols, cols);
            } else if (tmp) {
                normal_row(in->seed, i, row0 + r, (float)in->cfg.initializer_range, tmp, cols);
                dtype_convert((char *)scratch + (size_t)(r * cols) * dtype_size(dt), dt, tmp, DT_F32, (size_t)cols);
            }
        }
        free(tmp);
    }
    if (failed) {
        ftk_err_set("out of memory");
        return NULL;
    }
    return scratch;
}

static int store_tok(void *ctx, hid_t file)
{
    init_t *in = ctx;
    return tokfiles_store(&in->tok, file);
}

/* "70369.6 GB", "230.1 kB": a size in the unit that keeps it readable. */
static const char *size_text(double bytes, char out[32])
{
    const char *unit[] = {"bytes", "kB", "MB", "GB"};
    int u = 0;
    while (u < 3 && bytes >= 1000) {
        bytes /= 1000;
        u++;
    }
    snprintf(out, 32, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return out;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-init");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    init_t in = {.seed = (uint64_t)seed};
    int zstd = 0;
    if (!output || !preset == !config_path) {
        ftk_error("%s", !output ? "--output is required" : "give exactly one of --preset and --config");
        return FTK_EXIT_USAGE;
    }
    if (h5_parse_compress(compress, &zstd) < 0 || threads < 0) {
        ftk_error("invalid value: need --compress none|zstd|zstd:1..22, --threads >= 0");
        return FTK_EXIT_USAGE;
    }
    opts_start_threads(threads); /* a team that cannot be made fails now, before any output */
    if (preset && model_preset(preset, &in.cfg) < 0) {
        ftk_error("--preset: %s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if (config_path) {
        buf_t text = {0};
        int bad = buf_read_small(&text, config_path, BUF_SMALL_MAX, 0) < 0 || hfconfig_parse(text.data, text.len, &in.cfg) < 0;
        buf_free(&text);
        if (bad) {
            ftk_error("%s: %s", config_path, ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
    }
    in.dt = strcmp(dtype_opt, "config") == 0 ? in.cfg.torch_dtype : dtype_parse(dtype_opt);
    if (in.dt == DT_INVALID) {
        ftk_error("--dtype %s: expected config, float32, float16 or bfloat16", dtype_opt);
        return FTK_EXIT_USAGE;
    }
    in.cfg.torch_dtype = in.dt;
    /* stored under the names tokfiles gives them (a llama2.c tokenizer as tokenizer.bin), so
     * every reader takes each for what it is */
    if (tokenizer_path) {
        if (tokfiles_load(tokenizer_path, &in.tok) < 0) {
            ftk_error("--tokenizer %s", ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
        const tokfile_t *enc = tokfiles_encoder(&in.tok);
        tok_t *t = enc ? tok_load_mem(enc->data.data, enc->data.len, enc->name) : NULL;
        if (!t) {
            ftk_error("--tokenizer %s: %s", tokenizer_path, enc ? ftk_err_msg() : "no tokenizer in it");
            tokfiles_free(&in.tok);
            return FTK_EXIT_USAGE;
        }
        int vs = tok_vocab_size(t);
        tok_free(t);
        if (vs > in.cfg.vocab_size) {
            ftk_error("%s: %d tokens do not fit the model's vocab_size %lld", tokenizer_path, vs,
                      (long long)in.cfg.vocab_size);
            tokfiles_free(&in.tok);
            return FTK_EXIT_USAGE;
        }
    }
    if (output_check(output, force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0) {
        ftk_error("%s", ftk_err_msg());
        tokfiles_free(&in.tok);
        return FTK_EXIT_USAGE;
    }
    /* The file's size is known before anything is written: an absurd configuration (a
     * vocabulary of 2^31 is 128 GiB of embeddings at hidden size 16) is refused here rather
     * than filling the disk. The size counted is the uncompressed one (random weights gain
     * little from zstd; with --compress, half of it is required). */
    {
        double need = (double)model_n_params(&in.cfg) * (double)dtype_size(in.dt);
        for (int i = 0; i < in.tok.n; i++)
            need += (double)in.tok.f[i].data.len;
        if (zstd)
            need /= 2;
        char *dir = strdup(output);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash)
            *slash = slash == dir ? (slash[1] = 0, '/') : 0;
        struct statvfs sv;
        if (dir && statvfs(slash ? dir : ".", &sv) == 0 && need > (double)sv.f_bavail * (double)sv.f_frsize) {
            char a[32], b[32];
            ftk_error("%s: %s: the weights need %s (%.3g parameters of %s%s) and %s has %s free; nothing written",
                      output, strerror(ENOSPC), size_text(need, a), (double)model_n_params(&in.cfg),
                      dtype_name(in.dt), zstd ? ", half of it with --compress" : "", slash ? dir : ".",
                      size_text((double)sv.f_bavail * (double)sv.f_frsize, b));
            free(dir);
            tokfiles_free(&in.tok);
            return FTK_EXIT_FAIL;
        }
        free(dir);
    }
    atomic_install_signal_cleanup();
    double t0 = time_now();
    rc = FTK_EXIT_FAIL;
    char source[256];
    snprintf(source, sizeof source, "init:%s seed=%lld", preset ? preset : config_path, (long long)seed);
    weights_source_t ws = {.cfg = &in.cfg,
                           .source = source,
                           .dtype_label = dtype_name(in.dt),
                           .zstd_level = zstd,
                           .ctx = &in,
                           .dtype = init_dtype,
                           .rows = init_rows,
                           .extra = store_tok};
    uint64_t bytes = 0;
    if (weights_write_file(output, force ? OUTPUT_FORCE : 0, &ws, &bytes) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    double dt = time_now() - t0;
    ftk_info("%s: %.2f M parameters (%s), %.1f MB in %.2f s", output, (double)model_n_params(&in.cfg) / 1e6,
             dtype_name(in.dt), (double)bytes / 1e6, dt);
    rc = FTK_EXIT_OK;
done:
    tokfiles_free(&in.tok);
    return rc;
}
