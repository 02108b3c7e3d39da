/* ftk-import-llama2c — Karpathy's llama2.c checkpoint (and its tokenizer.bin) to an ftk
 * weights file in Hugging Face's conventions.
 *
 * llama2.c's legacy format (export.py "legacy_export", what run.c reads):
 *   7 × int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
 *              (vocab_size < 0: the classifier is stored separately, else it is shared
 *              with the token embedding)
 *   float32, each tensor [out, in] row-major, all layers of one kind together:
 *     token_embedding [vocab, dim]; rms_att [L, dim]; wq [L, dim, dim];
 *     wk [L, kv_dim, dim]; wv [L, kv_dim, dim]; wo [L, dim, dim]; rms_ffn [L, dim];
 *     w1 [L, hidden, dim]; w2 [L, dim, hidden]; w3 [L, hidden, dim]; rms_final [dim];
 *     freq_cis_real, freq_cis_imag [seq_len, head_size/2] (ignored: recomputed);
 *     wcls [vocab, dim] when not shared.
 * Mapping: w1 → mlp.gate_proj, w3 → mlp.up_proj, w2 → mlp.down_proj. llama2.c rotates
 * adjacent pairs (Meta's layout); Hugging Face rotates the two halves of each head, so
 * q and k rows are permuted per head exactly as transformers' convert_llama_weights_to_hf
 * does: HF row i < hd/2 is Meta row 2i, HF row hd/2 + i is Meta row 2i + 1.
 * rms_norm_eps is 1e-5 and rope_theta 10000, llama2.c's constants.
 *
 * tokenizer.bin: int32 max_token_length, then per token: float32 score, int32 length,
 * bytes. Validated (vocab_size entries, lengths in range, nothing left over) and stored
 * byte for byte as /tokenizer/tokenizer.bin. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/weights.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/timer.h"

static const char *output, *tokenizer_path, *dtype_opt = "float32", *compress = "none";
static int force;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"output", 'o', OPT_STR, &output, "FILE.h5", "weights file to write (required; must not exist unless --force)"},
    {"force", 'f', OPT_FLAG, &force, NULL, "replace an existing output file (once the new one is complete)"},
    {"tokenizer", 't', OPT_STR, &tokenizer_path, "tokenizer.bin", "llama2.c tokenizer to store with the weights"},
    {"dtype", 0, OPT_STR, &dtype_opt, "float32|float16|bfloat16", "tensor type (llama2.c stores float32)"},
    {"compress", 0, OPT_STR, &compress, "none|zstd[:L]", "compress tensors with zstd (HDF5 filter 32015)"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-import-llama2c",
    .usage = "[options] MODEL.bin -o FILE.h5",
    .summary = "Converts a llama2.c checkpoint (legacy format: 7-int header, float32 weights, shared or\n"
               "separate classifier, grouped-query attention) to an ftk weights file with Hugging Face\n"
               "names and rotary layout (q/k rows permuted per head as HF's conversion does).",
    .epilog = "Exit status: 0 success, 1 I/O failure, 2 bad usage or bad input (nothing written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = 1,
};

enum { K_EMB, K_ATT_NORM, K_WQ, K_WK, K_WV, K_WO, K_FFN_NORM, K_W1, K_W2, K_W3, K_FINAL, K_FREQ, K_WCLS, K_N };

typedef struct {
    model_config_t cfg;
    dtype_t dt;
    const uint8_t *map;
    size_t size;
    uint64_t off[K_N];   /* byte offset of each kind's first tensor */
    uint64_t per[K_N];   /* floats per layer (or in total for the unlayered kinds) */
    buf_t tok;
} l2c_t;

static dtype_t l2c_dtype(void *ctx, size_t i)
{
    (void)i;
    return ((l2c_t *)ctx)->dt;
}

/* The llama2.c kind and layer of canonical tensor i. */
static void kind_of(const l2c_t *x, size_t i, int *kind, int64_t *layer)
{
    static const int layer_kinds[9] = {K_ATT_NORM, K_WQ, K_WK, K_WV, K_WO, K_FFN_NORM, K_W1, K_W3, K_W2};
    size_t nl = (size_t)x->cfg.num_hidden_layers * 9;
    *layer = 0;
    if (i == 0)
        *kind = K_EMB;
    else if (i == 1 + nl)
        *kind = K_FINAL;
    else if (i == 2 + nl)
        *kind = K_WCLS;
    else {
        *layer = (int64_t)((i - 1) / 9);
        *kind = layer_kinds[(i - 1) % 9];
    }
}

static const void *l2c_rows(void *ctx, size_t i, const weights_spec_t *s, dtype_t dt, int64_t row0, int64_t n,
                            void *scratch)
{
    l2c_t *x = ctx;
    int kind;
    int64_t layer;
    kind_of(x, i, &kind, &layer);
    int64_t cols = s->rank == 2 ? s->shape[1] : s->shape[0];
    const float *base = (const float *)(x->map + x->off[kind]) + (uint64_t)layer * x->per[kind];
    if (kind != K_WQ && kind != K_WK) {
        const float *p = base + (uint64_t)row0 * (uint64_t)cols;
        if (dt == DT_F32)
            return p;
        dtype_convert(scratch, dt, p, DT_F32, (size_t)(n * cols));
        return scratch;
    }
    int64_t hd = model_head_dim(&x->cfg), half = hd / 2;
    for (int64_t r = 0; r < n; r++) {
        int64_t hf = row0 + r, head = hf / hd, j = hf % hd;
        int64_t meta = head * hd + (j < half ? 2 * j : 2 * (j - half) + 1);
        dtype_convert((char *)scratch + (size_t)(r * cols) * dtype_size(dt), dt, base + meta * cols, DT_F32,
                      (size_t)cols);
    }
    return scratch;
}

static int store_tok(void *ctx, hid_t file)
{
    l2c_t *x = ctx;
    return x->tok.len ? weights_put_file(file, "tokenizer.bin", x->tok.data, x->tok.len) : 0;
}

static int read_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* Validates the header and the file's size; fills cfg and the offsets. */
static int parse_model(l2c_t *x, const char *path)
{
    if (x->size >= 4 && memcmp(x->map, "ak42", 4) == 0) {
        ftk_err_set("%s: a llama2.c \"ak42\" (version 1/2) export; only the legacy format is read "
                    "(export it with llama2.c's export.py --version 0)", path);
        return -1;
    }
    if (x->size < 28) {
        ftk_err_set("%s: %zu bytes, too short for llama2.c's 28-byte header", path, x->size);
        return -1;
    }
    int32_t h[7];
    for (int i = 0; i < 7; i++)
        h[i] = read_i32(x->map + 4 * i);
    model_config_t *c = &x->cfg;
    model_config_defaults(c);
    c->hidden_size = h[0];
    c->intermediate_size = h[1];
    c->num_hidden_layers = h[2];
    c->num_attention_heads = h[3];
    c->num_key_value_heads = h[4];
    c->vocab_size = h[5] < 0 ? -(int64_t)h[5] : h[5];
    c->tie_word_embeddings = h[5] > 0;
    c->max_position_embeddings = h[6];
    c->rms_norm_eps = 1e-5;
    c->torch_dtype = DT_F32;
    if (model_config_check(c) < 0) {
        ftk_err_prefix("%s: header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, vocab %d, seq_len %d): ",
                       path, h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
        return -1;
    }
    /* Sizes: every factor is < 2^31 and checked above, so 128-bit products cannot overflow. */
    unsigned __int128 L = (unsigned __int128)c->num_hidden_layers, d = (unsigned __int128)c->hidden_size,
                      f = (unsigned __int128)c->intermediate_size, v = (unsigned __int128)c->vocab_size,
                      kv = (unsigned __int128)(c->num_key_value_heads * model_head_dim(c)),
                      sl = (unsigned __int128)c->max_position_embeddings, hd = (unsigned __int128)model_head_dim(c);
    unsigned __int128 count[K_N] = {v * d, L * d, L * d * d, L * kv * d, L * kv * d, L * d * d, L * d,
                                    L * f * d, L * d * f, L * f * d, d, sl * hd, c->tie_word_embeddings ? 0 : v * d};
    unsigned __int128 per[K_N] = {v * d, d, d * d, kv * d, kv * d, d * d, d, f * d, d * f, f * d, d, 0, v * d};
    unsigned __int128 pos = 28;
    for (int k = 0; k < K_N; k++) {
        x->off[k] = (uint64_t)(pos > UINT64_MAX ? UINT64_MAX : pos);
        x->per[k] = (uint64_t)per[k];
        pos += 4 * count[k];
    }
    if (pos != (unsigned __int128)x->size) {
        ftk_err_set("%s: the header describes %.0f bytes, the file has %zu (truncated, or not a llama2.c legacy "
                    "checkpoint)", path, (double)pos, x->size);
        return -1;
    }
    return 0;
}

static int check_tokenizer(const buf_t *b, int64_t vocab, const char *path)
{
    const uint8_t *p = (const uint8_t *)b->data, *end = p + b->len;
    if (b->len < 4) {
        ftk_err_set("%s: too short for a llama2.c tokenizer", path);
        return -1;
    }
    int32_t max_len = read_i32(p);
    p += 4;
    if (max_len <= 0 || max_len > 65536) {
        ftk_err_set("%s: max_token_length %d out of range", path, max_len);
        return -1;
    }
    for (int64_t i = 0; i < vocab; i++) {
        if (end - p < 8) {
            ftk_err_set("%s: ends at token %lld of %lld", path, (long long)i, (long long)vocab);
            return -1;
        }
        int32_t len = read_i32(p + 4);
        p += 8;
        if (len < 0 || len > max_len || end - p < len) {
            ftk_err_set("%s: token %lld: length %d invalid (max_token_length %d, %td bytes left)", path, (long long)i,
                        len, max_len, end - p);
            return -1;
        }
        p += len;
    }
    if (p != end) {
        ftk_err_set("%s: %td bytes after the %lld tokens the model's vocab_size implies", path, end - p, (long long)vocab);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-import-llama2c");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    l2c_t x = {.dt = dtype_parse(dtype_opt)};
    int zstd = 0;
    if (!output) {
        ftk_error("--output is required");
        return FTK_EXIT_USAGE;
    }
    if (x.dt == DT_INVALID || h5_parse_compress(compress, &zstd) < 0) {
        ftk_error("invalid value: need --dtype float32|float16|bfloat16, --compress none|zstd|zstd:1..22");
        return FTK_EXIT_USAGE;
    }
    if (output_check(output, force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    const char *in = pos[0];
    int fd = open(in, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        ftk_error("%s: %s", in, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return FTK_EXIT_USAGE;
    }
    x.size = (size_t)st.st_size;
    x.map = x.size ? mmap(NULL, x.size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (x.map == MAP_FAILED) {
        ftk_error("%s: mmap: %s", in, strerror(errno));
        return FTK_EXIT_FAIL;
    }
    rc = FTK_EXIT_USAGE;
    if (parse_model(&x, in) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    if (tokenizer_path && (buf_read_file(&x.tok, tokenizer_path) < 0 ||
                           check_tokenizer(&x.tok, x.cfg.vocab_size, tokenizer_path) < 0)) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    x.cfg.torch_dtype = x.dt;
    atomic_install_signal_cleanup();
    double t0 = time_now();
    rc = FTK_EXIT_FAIL;
    char source[512];
    snprintf(source, sizeof source, "llama2c:%s", in);
    weights_source_t ws = {.cfg = &x.cfg,
                           .source = source,
                           .dtype_label = dtype_name(x.dt),
                           .zstd_level = zstd,
                           .ctx = &x,
                           .dtype = l2c_dtype,
                           .rows = l2c_rows,
                           .extra = store_tok};
    uint64_t bytes = 0;
    if (weights_write_file(output, force ? OUTPUT_FORCE : 0, &ws, &bytes) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    ftk_info("%s: %lld layers, %.3f M parameters (%s classifier), %.1f MB in %.2f s", output,
             (long long)x.cfg.num_hidden_layers, (double)model_n_params(&x.cfg) / 1e6,
             x.cfg.tie_word_embeddings ? "shared" : "separate", (double)bytes / 1e6, time_now() - t0);
    rc = FTK_EXIT_OK;
done:
    if (x.map)
        munmap((void *)x.map, x.size);
    buf_free(&x.tok);
    return rc;
}
