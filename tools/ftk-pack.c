/* ftk-pack — training records (Alpaca, conversations; formats/chat.h) to packed, tokenized HDF5
 * (formats/tokens.h). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/chat.h"
#include "../formats/h5.h"
#include "../formats/tokenizer.h"
#include "../formats/tokens.h"
#include "../libcommon/atomic.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/progress.h"
#include "../libcommon/rng.h"
#include "../libcommon/timer.h"
#include "../libcommon/version.h"

static const char *tokenizer_path, *output, *compress = "none", *template_arg;
static int max_len = 512, mask_prompt = 1, drop_long, pack, shards = 1, threads, json_out;
static int64_t seed = 42, val_count = -1;
static double val_fraction = 0.03865;

static const opt_t options[] = {
    {"tokenizer", 't', OPT_STR, &tokenizer_path, "FILE", "tokenizer.model or tokenizer.json (required)"},
    {"output", 'o', OPT_STR, &output, "FILE", "output .h5 (required; with --shards, the base name)"},
    {"template", 0, OPT_STR, &template_arg, "NAME",
     "alpaca, llama-2-chat or chatml (default: by the first record, alpaca or llama-2-chat)"},
    {"max-len", 0, OPT_INT, &max_len, "N", "longest sample/row in tokens; longer samples are cut"},
    {"drop-long", 0, OPT_FLAG, &drop_long, NULL, "skip samples longer than --max-len instead of cutting them"},
    {"mask-prompt", 0, OPT_FLAG, &mask_prompt, NULL,
     "loss on response (assistant) tokens only (Stanford Alpaca; the default)"},
    {"no-mask-prompt", 0, OPT_FLAG_OFF, &mask_prompt, NULL,
     "loss on every token but the first (LitGPT's Alpaca default)"},
    {"pack", 0, OPT_FLAG, &pack, NULL, "pack several samples into rows of exactly --max-len tokens"},
    {"seed", 0, OPT_I64, &seed, "S", "seed of the shuffle, the validation split and the row order"},
    {"val-count", 0, OPT_I64, &val_count, "N", "samples in the validation split (overrides --val-fraction)"},
    {"val-fraction", 0, OPT_DOUBLE, &val_fraction, "F", "fraction of samples in the validation split (LitGPT's)"},
    {"shards", 0, OPT_INT, &shards, "N", "write N files BASE-00001-of-0000N.h5, rows split between them"},
    {"compress", 0, OPT_STR, &compress, "none|zstd[:L]", "compress datasets with zstd (HDF5 filter 32015)"},
    {"threads", 'j', OPT_INT, &threads, "N", "tokenizer threads (0: all cores)"},
    {"json", 0, OPT_FLAG, &json_out, NULL, "print the summary as JSON on stdout"},
    {0},
};

static const opt_spec_t spec = {
    .tool = "ftk-pack",
    .usage = "--tokenizer FILE [options] INPUT.json -o OUTPUT.h5",
    .summary = "Turns training records (a JSON array or JSON Lines; INPUT may be - for stdin) into tokenized\n"
               "training rows. Records are Alpaca (\"instruction\", optional \"input\", \"output\") or\n"
               "conversations (\"messages\" of {role, content}, or ShareGPT \"conversations\" of {from, value});\n"
               "--template renders them (formats/chat.h): alpaca gives BOS + the Alpaca prompt + the output +\n"
               "EOS, llama-2-chat and chatml the chat formats, with the loss on assistant turns. Records are\n"
               "shuffled with --seed and the first ones form the validation split. The output file's layout is\n"
               "documented in formats/tokens.h; `ftk-info` describes it, `ftk-verify` checks it.",
    .epilog = "Exit status: 0 success, 1 runtime failure, 2 bad usage or bad input (nothing written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = 1,
};

typedef struct {
    int32_t *ids; /* the record rendered by its template, tokenized */
    uint8_t *mask;
    int64_t n_prompt, len, full_len; /* n_prompt: tokens before the first target */
} sample_t;

/* Tokenizes every record (in parallel). Returns 0, or -1 with ftk_err_msg() set. */
static int tokenize_all(const tok_t *tok, const chat_data_t *data, chat_template_t tmpl, sample_t *smp)
{
    int failed = 0;
    progress_t prog;
    progress_start(&prog, "tokenizing", (int64_t)data->n, "records");
    int64_t done = 0;
#pragma omp parallel reduction(| : failed)
    {
        chat_enc_t *enc = chat_enc_new();
        chat_out_t out = {0};
        failed |= enc == NULL;
#pragma omp for schedule(dynamic, 64)
        for (size_t i = 0; i < data->n; i++) {
            if (failed)
                continue;
            if (chat_encode(enc, tok, tmpl, mask_prompt, data->doc, &data->recs[i], i, &out) < 0) {
                failed = 1; /* records were checked: out of memory */
                continue;
            }
            sample_t *s = &smp[i];
            s->n_prompt = 0;
            while (s->n_prompt < (int64_t)out.ids.n && !out.mask[s->n_prompt])
                s->n_prompt++;
            s->full_len = (int64_t)out.ids.n;
            s->len = s->full_len < max_len ? s->full_len : max_len;
            s->ids = malloc((size_t)s->len * sizeof *s->ids);
            s->mask = malloc((size_t)s->len);
            if (!s->ids || !s->mask) {
                failed = 1;
                continue;
            }
            memcpy(s->ids, out.ids.v, (size_t)s->len * sizeof *s->ids);
            memcpy(s->mask, out.mask, (size_t)s->len);
            int64_t d;
#pragma omp atomic capture
            d = ++done;
            if (omp_get_thread_num() == 0)
                progress_update(&prog, d);
        }
        chat_enc_free(enc);
        chat_out_free(&out);
    }
    progress_done(&prog);
    if (failed)
        ftk_err_set("out of memory while tokenizing");
    return failed ? -1 : 0;
}

static char *shard_name(const char *out, int k, int n)
{
    size_t len = strlen(out);
    size_t base = len > 3 && strcmp(out + len - 3, ".h5") == 0 ? len - 3 : len;
    char *s = malloc(base + 32);
    if (s)
        snprintf(s, base + 32, "%.*s-%05d-of-%05d.h5", (int)base, out, k + 1, n);
    return s;
}

typedef struct {
    const char *source, *template_name;
    uint64_t tok_hash, src_hash;
    const tok_t *tok;
    int64_t n_records, n_samples, n_tokens, n_truncated, n_dropped;
    int zstd;
} meta_t;

static int write_meta(hid_t f, const meta_t *m, int k, int n)
{
    char th[17], sh[17];
    hash_hex(m->tok_hash, th);
    hash_hex(m->src_hash, sh);
    return h5_attr_set_str(f, "ftk_version", FTK_VERSION) || h5_attr_set_str(f, "tokenizer_format", tok_format(m->tok)) ||
                   h5_attr_set_str(f, "tokenizer_xxh3", th) ||
                   h5_attr_set_i64(f, "vocab_size", tok_vocab_size(m->tok)) ||
                   h5_attr_set_i64(f, "bos_id", tok_bos_id(m->tok)) || h5_attr_set_i64(f, "eos_id", tok_eos_id(m->tok)) ||
                   h5_attr_set_i64(f, "pad_id", tok_eos_id(m->tok)) ||
                   h5_attr_set_str(f, "template", m->template_name) || h5_attr_set_i64(f, "mask_prompt", mask_prompt) ||
                   h5_attr_set_i64(f, "max_len", max_len) || h5_attr_set_i64(f, "packed", pack) ||
                   h5_attr_set_i64(f, "seed", seed) || h5_attr_set_str(f, "source_name", m->source) ||
                   h5_attr_set_str(f, "source_xxh3", sh) || h5_attr_set_i64(f, "n_records", m->n_records) ||
                   h5_attr_set_i64(f, "n_samples", m->n_samples) || h5_attr_set_i64(f, "n_tokens", m->n_tokens) ||
                   h5_attr_set_i64(f, "n_truncated", m->n_truncated) || h5_attr_set_i64(f, "n_dropped", m->n_dropped) ||
                   h5_attr_set_i64(f, "shard_index", k + 1) || h5_attr_set_i64(f, "shard_count", n)
               ? -1
               : 0;
}

/* Writes every shard under a temporary name, then the set hash, then commits them all;
 * on any failure no output appears. */
static int write_shards(const meta_t *m, const tokens_split_t *train, const tokens_split_t *val, char **names)
{
    atomic_file_t *af = calloc((size_t)shards, sizeof *af);
    uint64_t(*sums)[2 * TOKENS_N_DATASETS] = calloc((size_t)shards, sizeof *sums);
    int rc = -1;
    h5w_opts_t wo = {.zstd_level = m->zstd};
    if (!af || !sums) {
        ftk_err_set("out of memory");
        goto out;
    }
    progress_t prog;
    progress_start(&prog, "writing", shards, "files");
    for (int k = 0; k < shards; k++) {
        if (atomic_begin(&af[k], names[k]) < 0)
            goto out;
        hid_t f = h5_create(af[k].tmp_path, TOKENS_FORMAT, TOKENS_VERSION);
        if (f < 0)
            goto out;
        tokens_split_t tr, va;
        int64_t tr0 = train->n_rows * k / shards, tr1 = train->n_rows * (k + 1) / shards;
        int64_t va0 = val->n_rows * k / shards, va1 = val->n_rows * (k + 1) / shards;
        int e = write_meta(f, m, k, shards);
        if (!e && tokens_slice(train, tr0, tr1, &tr) == 0) {
            e = tokens_write_split(f, "train", &tr, &wo, sums[k]);
            tokens_split_free(&tr);
        } else {
            e = -1;
        }
        if (!e && tokens_slice(val, va0, va1, &va) == 0) {
            e = tokens_write_split(f, "val", &va, &wo, sums[k] + TOKENS_N_DATASETS);
            tokens_split_free(&va);
        } else {
            e = -1;
        }
        if (h5_close(f) < 0 || e) {
            ftk_err_prefix("%s: ", names[k]);
            goto out;
        }
        progress_update(&prog, k + 1);
    }
    progress_done(&prog);
    char sh[17];
    hash_hex(tokens_set_hash((const uint64_t(*)[2 * TOKENS_N_DATASETS])sums, shards), sh);
    for (int k = 0; k < shards; k++) {
        hid_t f = H5Fopen(af[k].tmp_path, H5F_ACC_RDWR, H5P_DEFAULT);
        char why[256];
        int e = 0;
        if (f < 0) {
            ftk_err_set("cannot reopen it: %s", h5_err_reason(why, sizeof why));
            e = -1;
        } else if (h5_attr_set_str(f, "set_xxh3", sh) < 0) {
            H5Fclose(f); /* the attribute's message is the one to keep */
            e = -1;
        } else {
            e = h5_close(f);
        }
        if (e < 0) {
            ftk_err_prefix("%s: cannot finish the file: ", names[k]);
            goto out;
        }
    }
    for (int k = 0; k < shards; k++) {
        if (atomic_commit(&af[k]) < 0)
            goto out;
        /* shards already renamed stay: each is complete and checks on its own */
    }
    rc = 0;
out:
    for (int k = 0; af && k < shards; k++)
        if (af[k].tmp_path) /* begun, not committed */
            atomic_abort(&af[k]);
    free(af);
    free(sums);
    return rc;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-pack");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    int zstd;
    if (!tokenizer_path || !output) {
        ftk_error("%s is required", !tokenizer_path ? "--tokenizer" : "--output");
        return FTK_EXIT_USAGE;
    }
    if (strcmp(output, "-") == 0) {
        ftk_error("HDF5 output needs a real file, not stdout");
        return FTK_EXIT_USAGE;
    }
    if (max_len < 2 || shards < 1 || shards > 99999 || val_fraction < 0 || val_fraction >= 1 || threads < 0 ||
        h5_parse_compress(compress, &zstd) < 0) {
        ftk_error("invalid value: need --max-len >= 2, 1 <= --shards <= 99999, 0 <= --val-fraction < 1, "
                  "--threads >= 0, --compress none|zstd|zstd:1..22");
        return FTK_EXIT_USAGE;
    }
    chat_template_t tmpl = CHAT_ALPACA;
    if (template_arg && chat_template_parse(template_arg, &tmpl) < 0) {
        ftk_error("--template: %s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if (threads > 0)
        omp_set_num_threads(threads);
    atomic_install_signal_cleanup();
    double t0 = time_now();
    const char *input = pos[0];
    const char *in_name = strcmp(input, "-") == 0 ? "<stdin>" : input;

    tok_t *tok = tok_load(tokenizer_path);
    if (!tok) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if (tok_bos_id(tok) < 0 || tok_eos_id(tok) < 0) {
        ftk_error("%s: the tokenizer defines no BOS or EOS token", tokenizer_path);
        tok_free(tok);
        return FTK_EXIT_USAGE;
    }
    meta_t m = {.source = input, .tok = tok, .zstd = zstd};
    buf_t text = {0};
    chat_data_t data = {0};
    sample_t *smp = NULL;
    tokens_sample_t *ts = NULL;
    int64_t *order = NULL;
    tokens_split_t train = {0}, val = {0};
    char **names = NULL;
    rc = FTK_EXIT_USAGE;
    if (hash_file(tokenizer_path, &m.tok_hash) < 0 || buf_read_file(&text, input) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    m.src_hash = hash_bytes(text.data, text.len);
    if (chat_parse(text.data, text.len, &data) < 0) {
        ftk_error("%s: %s", in_name, ftk_err_msg());
        goto done;
    }
    if (!template_arg)
        tmpl = chat_template_detect(&data.recs[0]);
    for (size_t i = 0; i < data.n; i++) /* in order, so the first bad record is named */
        if (chat_check(data.doc, &data.recs[i], i, tmpl) < 0) {
            ftk_error("%s: %s", in_name, ftk_err_msg());
            goto done;
        }
    m.template_name = chat_template_name(tmpl);
    rc = FTK_EXIT_FAIL;
    m.n_records = (int64_t)data.n;
    smp = calloc(data.n, sizeof *smp);
    ts = calloc(data.n, sizeof *ts);
    order = calloc(data.n, sizeof *order);
    if (!smp || !ts || !order || tokenize_all(tok, &data, tmpl, smp) < 0) {
        ftk_error("%s", smp && ts && order ? ftk_err_msg() : "out of memory");
        goto done;
    }
    /* Keep, cut or drop; then shuffle the kept samples and split off validation. */
    size_t n_kept = 0;
    int64_t max_seen = 0, no_target = 0;
    for (size_t i = 0; i < data.n; i++) {
        if (smp[i].full_len > max_len) {
            if (drop_long) {
                m.n_dropped++;
                continue;
            }
            m.n_truncated++;
        }
        if (mask_prompt && smp[i].n_prompt >= smp[i].len)
            no_target++;
        order[n_kept++] = (int64_t)i;
        m.n_tokens += smp[i].len;
        if (smp[i].len > max_seen)
            max_seen = smp[i].len;
    }
    m.n_samples = (int64_t)n_kept;
    if (n_kept == 0) {
        ftk_error("%s: every record is longer than --max-len %d and --drop-long is set: nothing to write", in_name,
                  max_len);
        rc = FTK_EXIT_USAGE;
        goto done;
    }
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    rng_shuffle_i64(&rng, order, n_kept);
    size_t n_val = val_count >= 0 ? (size_t)val_count : (size_t)llround(val_fraction * (double)n_kept);
    if (n_val >= n_kept) {
        ftk_error("the validation split (%zu samples) leaves no training samples out of %zu", n_val, n_kept);
        rc = FTK_EXIT_USAGE;
        goto done;
    }
    for (size_t k = 0; k < n_kept; k++) {
        const sample_t *s = &smp[order[k]];
        ts[k] = (tokens_sample_t){s->ids, s->mask, s->len, order[k]};
    }
    if (tokens_build(ts, n_val, pack, max_len, tok_eos_id(tok), (uint64_t)seed + 1, &val) < 0 ||
        tokens_build(ts + n_val, n_kept - n_val, pack, max_len, tok_eos_id(tok), (uint64_t)seed, &train) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    names = calloc((size_t)shards, sizeof *names);
    for (int k = 0; names && k < shards; k++)
        if (!(names[k] = shards == 1 ? strdup(output) : shard_name(output, k, shards))) {
            ftk_error("out of memory");
            goto done;
        }
    if (!names || write_shards(&m, &train, &val, names) < 0) {
        ftk_error("%s", names ? ftk_err_msg() : "out of memory");
        goto done;
    }
    rc = FTK_EXIT_OK;

    /* Summary. */
    double secs = time_now() - t0;
    double eff = (double)m.n_tokens / (double)((train.n_rows + val.n_rows) * (int64_t)max_len);
    long long bytes = 0;
    for (int k = 0; k < shards; k++) {
        struct stat st;
        if (stat(names[k], &st) == 0)
            bytes += st.st_size;
    }
    if (no_target)
        ftk_warn("%lld samples have no target token left (prompt reaches --max-len)", (long long)no_target);
    ftk_info("%s: %lld records -> %lld samples (train %lld, val %zu), %lld tokens", in_name, (long long)m.n_records,
             (long long)m.n_samples, (long long)(n_kept - n_val), n_val, (long long)m.n_tokens);
    ftk_info("sample length: mean %.1f, max %lld (max-len %d); truncated %lld, dropped %lld",
             (double)m.n_tokens / (double)n_kept, (long long)max_seen, max_len, (long long)m.n_truncated,
             (long long)m.n_dropped);
    ftk_info("%s rows: train %lld, val %lld; %s %.1f%%", pack ? "packed" : "unpacked", (long long)train.n_rows,
             (long long)val.n_rows, pack ? "packing efficiency" : "efficiency if padded to max-len", 100 * eff);
    ftk_info("wrote %s%s (%.1f MB) in %.2f s", names[0], shards > 1 ? " and the other shards" : "",
             (double)bytes / 1e6, secs);
    if (json_out) {
        buf_t j = {0};
        printf("{\"input\": ");
        json_write_string(&j, input, strlen(input));
        printf("%s, \"records\": %lld, \"samples\": %lld, \"train_samples\": %lld, \"val_samples\": %zu, "
               "\"tokens\": %lld, \"mean_len\": %.3f, \"max_len_seen\": %lld, \"max_len\": %d, \"truncated\": %lld, "
               "\"dropped\": %lld, \"packed\": %s, \"train_rows\": %lld, \"val_rows\": %lld, \"efficiency\": %.6f, "
               "\"mask_prompt\": %s, \"outputs\": [",
               j.data, (long long)m.n_records, (long long)m.n_samples, (long long)(n_kept - n_val), n_val,
               (long long)m.n_tokens, (double)m.n_tokens / (double)n_kept, (long long)max_seen, max_len,
               (long long)m.n_truncated, (long long)m.n_dropped, pack ? "true" : "false", (long long)train.n_rows,
               (long long)val.n_rows, eff, mask_prompt ? "true" : "false");
        for (int k = 0; k < shards; k++) {
            j.len = 0;
            json_write_string(&j, names[k], strlen(names[k]));
            printf("%s%s", k ? ", " : "", j.data);
        }
        printf("]}\n");
        buf_free(&j);
    }
done:
    if (names)
        for (int k = 0; k < shards; k++)
            free(names[k]);
    free(names);
    tokens_split_free(&train);
    tokens_split_free(&val);
    if (smp)
        for (size_t i = 0; i < data.n; i++) {
            free(smp[i].ids);
            free(smp[i].mask);
        }
    free(smp);
    free(ts);
    free(order);
    chat_data_free(&data);
    buf_free(&text);
    tok_free(tok);
    return rc;
}
