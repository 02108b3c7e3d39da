/* ftk-merge — a training checkpoint reassembled into one weights file (weights.h): the
 * trained parameters under Hugging Face's names, ready for ftk-export-hf and ftk-generate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../formats/checkpoint.h"
#include "../formats/json.h"
#include "../formats/tokfiles.h"
#include "../libcommon/atomic.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/plural.h"
#include "../libcommon/timer.h"

static const char *output, *dtype_opt = "float32", *compress = "none";
static int with_optimizer;
static const char *tokenizer_opt;
static int json_out, force;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"output", 'o', OPT_STR, &output, "FILE.h5", "the weights file to write (must not exist unless --force)"},
    {"force", 'f', OPT_FLAG, &force, NULL, "replace an existing output file (once the new one is complete)"},
    {"dtype", 0, OPT_STR, &dtype_opt, "float32|bfloat16|float16",
     "type of the stored parameters (narrower than the checkpoint's: rounded to nearest even)"},
    {"with-optimizer", 0, OPT_FLAG, &with_optimizer, NULL,
     "also store both AdamW moments (float32, a bf16 checkpoint's widened) under /optimizer"},
    {"compress", 0, OPT_STR, &compress, "none|zstd|zstd:L", "zstd-compress the tensors (HDF5 filter 32015)"},
    {"tokenizer", 't', OPT_STR, &tokenizer_opt, "FILE|DIR|W.h5",
     "store this tokenizer in place of the checkpoint's (a file, a folder of tokenizer files, or a weights file)"},
    {"json", 0, OPT_FLAG, &json_out, NULL, "print a summary as JSON on stdout"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-merge",
    .usage = "CHECKPOINT -o FILE.h5 [--dtype bfloat16] [--with-optimizer] [--tokenizer FILE|DIR] [--json] [--force]",
    .summary = "Reassembles a training checkpoint (a step-NNNNNNNN directory, a run directory or its\n"
               "`latest` file), whatever its shard count, into one ftk weights file: every parameter\n"
               "under its Hugging Face name and shape, in the chosen type, the tokenizer files\n"
               "carried along; ready for ftk-export-hf, ftk-generate or another ftk-train. Every\n"
               "shard's file checksum and every dataset's is verified first; one unit is held in\n"
               "memory at a time. With --with-optimizer the file also holds /optimizer/adam_m/NAME\n"
               "and /optimizer/adam_v/NAME (float32, the parameter's shape) and the step (weights.h).\n"
               "Any precision: fp32 and bf16-mixed checkpoints hold float32 (master) weights, bf16-true\n"
               "ones bfloat16, which --dtype float32 widens exactly and --dtype bfloat16 copies as\n"
               "they are; float16 is rounded once, from the stored values.",
    .epilog = "Exit status: 0 written; 1 runtime failure; 2 bad usage or a damaged or unreadable\n"
              "checkpoint (the message names the file and dataset; nothing is written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = 1,
};

typedef struct {
    const ckpt_manifest_t *man;
    const hid_t *files;
    dtype_t dt;
    int *unit_of, *tensor_of; /* canonical tensor index -> (unit, tensor in unit) */
    int cur_unit, damaged;
    void *buf; /* the current unit's parameters in dt, or moments in float32 (largest padded size) */
} merge_t;

static dtype_t merge_dtype(void *ctx, size_t i)
{
    (void)i;
    return ((merge_t *)ctx)->dt;
}

static const void *merge_rows(void *ctx, size_t i, const weights_spec_t *s, dtype_t dt, int64_t row0, int64_t n,
                              void *scratch)
{
    merge_t *m = ctx;
    int u = m->unit_of[i];
    (void)n;
    (void)scratch;
    /* The unit read as dt: converted from the stored type once, so bf16 -> f16 rounds once */
    if (u != m->cur_unit) {
        if (ckpt_read_unit(m->files, m->man, 0, u, dt, m->buf) < 0) {
            m->damaged = 1;
            return NULL;
        }
        m->cur_unit = u;
    }
    const ckpt_tensor_t *t = &m->man->units[u].t[m->tensor_of[i]];
    int64_t cols = s->rank == 2 ? s->shape[1] : s->shape[0];
    return (const char *)m->buf + (size_t)(t->offset + row0 * cols) * dtype_size(dt);
}

typedef struct {
    hid_t dst;
    const tokfiles_t *given; /* --tokenizer's files: they replace the checkpoint's */
    int n_tok;               /* tokenizer files stored */
} tok_copy_t;

static int put_tok(const char *name, const void *data, size_t len, void *ctx)
{
    tok_copy_t *tc = ctx;
    if (tc->given && tokfiles_is_tokenizer_name(name))
        return 0;
    tc->n_tok += tokfiles_is_tokenizer_name(name);
    return weights_put_file(tc->dst, name, data, len) < 0 ? -1 : 0;
}

static tokfiles_t given_tok;
static int n_tok_stored;

/* The tokenizer files, then (with --with-optimizer) the moments, tensor by tensor. */
static int merge_extra(void *ctx, hid_t file)
{
    merge_t *m = ctx;
    tok_copy_t tc = {file, tokenizer_opt ? &given_tok : NULL, 0};
    if (weights_each_file(m->files[0], put_tok, &tc) < 0)
        return -1;
    if (tc.given) {
        if (tokfiles_store(&given_tok, file) < 0)
            return -1;
        tc.n_tok += given_tok.n;
    }
    n_tok_stored = tc.n_tok;
    if (!with_optimizer)
        return 0;
    hid_t g = h5_group_create(file, "optimizer");
    if (g < 0)
        return -1;
    int rc = h5_attr_set_i64(g, "step", m->man->meta.step) | h5_attr_set_f64(g, "beta1", m->man->meta.train.beta1) |
             h5_attr_set_f64(g, "beta2", m->man->meta.train.beta2) | h5_attr_set_f64(g, "eps", m->man->meta.train.eps);
    for (int k = 1; k < CKPT_KINDS && rc == 0; k++) {
        hid_t gk = h5_group_create(g, ckpt_kind_names[k]);
        if (gk < 0) {
            rc = -1;
            break;
        }
        for (int u = 0; u < m->man->n_units && rc == 0; u++) {
            if (ckpt_read_unit(m->files, m->man, k, u, DT_F32, m->buf) < 0) {
                m->damaged = 1;
                rc = -1;
                break;
            }
            m->cur_unit = -1;
            const ckpt_unit_t *x = &m->man->units[u];
            for (int i = 0; i < x->n_tensors && rc == 0; i++) {
                const ckpt_tensor_t *t = &x->t[i];
                hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
                rc = h5w_write_tensor(gk, t->name, H5T_NATIVE_FLOAT, t->rank, dims, (float *)m->buf + t->offset,
                                      NULL, NULL);
            }
        }
        H5Gclose(gk);
    }
    H5Gclose(g);
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-merge");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    int zstd = 0;
    dtype_t dt = dtype_parse(dtype_opt);
    if (!output || dt == DT_INVALID || h5_parse_compress(compress, &zstd) < 0) {
        ftk_error("%s", !output ? "--output is required"
                                : "invalid value: need --dtype float32|bfloat16|float16, --compress none|zstd|zstd:L");
        return FTK_EXIT_USAGE;
    }
    if (output_check(output, force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    ckpt_manifest_t man;
    char *dir = ckpt_open_path(pos[0], &man);
    if (!dir) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if (tokenizer_opt && tokfiles_load(tokenizer_opt, &given_tok) < 0) {
        ftk_error("--tokenizer %s", ftk_err_msg());
        ckpt_manifest_free(&man);
        free(dir);
        return FTK_EXIT_USAGE;
    }
    double t0 = time_now();
    int64_t S = man.meta.shard_count, maxpad = 0;
    size_t nt = weights_n_tensors(&man.cfg);
    merge_t m = {.man = &man, .dt = dt, .cur_unit = -1};
    hid_t *files = NULL;
    m.unit_of = calloc(nt, sizeof *m.unit_of);
    m.tensor_of = calloc(nt, sizeof *m.tensor_of);
    for (int u = 0; u < man.n_units; u++)
        maxpad = man.units[u].padded > maxpad ? man.units[u].padded : maxpad;
    m.buf = malloc((size_t)maxpad * sizeof(float));
    rc = FTK_EXIT_FAIL;
    if (!m.unit_of || !m.tensor_of || !m.buf) {
        ftk_error("out of memory");
        goto done;
    }
    for (size_t i = 0, u = 0, k = 0; i < nt; i++, k++) { /* units hold the tensors in canonical order */
        while ((int)k == man.units[u].n_tensors)
            u++, k = 0;
        m.unit_of[i] = (int)u;
        m.tensor_of[i] = (int)k;
    }
    if (!(files = ckpt_open_shards(dir, &man, 1)) || ckpt_check_padding(files, &man) < 0) {
        ftk_error("%s%s%s", files ? dir : "", files ? ": " : "", ftk_err_msg());
        rc = FTK_EXIT_USAGE;
        goto done;
    }
    m.files = files;
    model_config_t cfg = man.cfg;
    cfg.torch_dtype = dt;
    char source[4200];
    snprintf(source, sizeof source, "ftk-merge of %s (step %lld, %lld shard%s)", dir, (long long)man.meta.step,
             (long long)S, plural_s(S));
    weights_source_t ws = {.cfg = &cfg,
                           .source = source,
                           .dtype_label = dtype_name(dt),
                           .zstd_level = zstd,
                           .ctx = &m,
                           .dtype = merge_dtype,
                           .rows = merge_rows,
                           .extra = merge_extra};
    atomic_install_signal_cleanup();
    uint64_t bytes = 0;
    if (weights_write_file(output, force ? OUTPUT_FORCE : 0, &ws, &bytes) < 0) {
        ftk_error("%s%s%s", m.damaged ? dir : "", m.damaged ? ": " : "", ftk_err_msg());
        rc = m.damaged ? FTK_EXIT_USAGE : FTK_EXIT_FAIL;
        goto done;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    ftk_info("%s: %.2f M parameters (%s) of step %lld from %lld shard%s (precision %s)%s, %.1f MB in %.2f s; peak "
             "memory %.1f MB",
             output, (double)model_n_params(&cfg) / 1e6, dtype_name(dt), (long long)man.meta.step, (long long)S,
             S == 1 ? "" : "s", man.meta.precision, with_optimizer ? ", with both AdamW moments" : "", (double)bytes / 1e6,
             time_now() - t0, (double)ru.ru_maxrss / 1e3);
    if (!n_tok_stored)
        ftk_warn("%s carries no tokenizer, so %s holds none; give one with --tokenizer FILE|DIR", dir, output);
    if (json_out) {
        buf_t j = {0};
        buf_printf(&j, "{\"checkpoint\": ");
        json_write_string(&j, dir, strlen(dir));
        buf_printf(&j, ", \"output\": ");
        json_write_string(&j, output, strlen(output));
        buf_printf(&j,
                   ", \"step\": %lld, \"shards\": %lld, \"precision\": \"%s\", \"dtype\": \"%s\", \"n_params\": %lld, "
                   "\"with_optimizer\": %s, \"tokenizer_files\": %d, \"bytes\": %llu, \"seconds\": %.3f}",
                   (long long)man.meta.step, (long long)S, man.meta.precision, dtype_name(dt),
                   (long long)model_n_params(&cfg), with_optimizer ? "true" : "false", n_tok_stored,
                   (unsigned long long)bytes, time_now() - t0);
        printf("%s\n", j.data);
        buf_free(&j);
    }
    rc = FTK_EXIT_OK;
done:
    ckpt_close_shards(files, &man);
    free(m.unit_of);
    free(m.tensor_of);
    free(m.buf);
    ckpt_manifest_free(&man);
    free(dir);
    tokfiles_free(&given_tok);
    return rc;
}
