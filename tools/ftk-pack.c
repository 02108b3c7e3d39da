/* ftk-pack — training records (Alpaca, conversations; formats/chat.h) to packed, tokenized
 * HDF5 (formats/tokens.h), as a stream. The work, its validation split, its row order and
 * its memory bound are formats/pack.h's; the tool keeps the options, the messages, the
 * summary and the exit codes.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/chat.h"
#include "../formats/json.h"
#include "../formats/h5.h"
#include "../formats/pack.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../libcommon/atomic.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/plural.h"
#include "../libcommon/timer.h"

static const char *tokenizer_path, *output, *compress = "none", *template_arg;
static int max_len = 512, mask_prompt = 1, drop_long, pack, shards = 1, threads, json_out, force;
static int64_t seed = 42, val_count = -1, max_record_bytes = 4 << 20;
static double val_fraction = 0.03865;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"tokenizer", 't', OPT_STR, &tokenizer_path, "FILE|DIR|W.h5",
     "tokenizer.model or tokenizer.json, a folder holding one, or a weights file that stores one (required)"},
    {"output", 'o', OPT_STR, &output, "FILE", "output .h5 (required; with --shards, the base name; must not exist unless --force)"},
    {"force", 'f', OPT_FLAG, &force, NULL, "replace existing output files (once the new ones are complete)"},
    {"template", 0, OPT_STR, &template_arg, "NAME",
     "alpaca, llama-2-chat or chatml (default: by the first record, alpaca or llama-2-chat)"},
    {"max-len", 0, OPT_INT, &max_len, "N", "longest sample/row in tokens; longer samples are cut", "2..1048576"},
    {"drop-long", 0, OPT_FLAG, &drop_long, NULL, "skip samples longer than --max-len instead of cutting them"},
    {"mask-prompt", 0, OPT_FLAG, &mask_prompt, NULL,
     "loss on response (assistant) tokens only (Stanford Alpaca; the default)"},
    {"no-mask-prompt", 0, OPT_FLAG_OFF, &mask_prompt, NULL,
     "loss on every token but the first (LitGPT's Alpaca default)"},
    {"pack", 0, OPT_FLAG, &pack, NULL, "pack several samples into rows of exactly --max-len tokens"},
    {"seed", 0, OPT_I64, &seed, "S", "seed of the validation split (a hash of seed and record index)", ".."},
    {"val-count", 0, OPT_I64, &val_count, "N", "exactly N validation samples, held in memory (overrides --val-fraction)", "-1..100000000"},
    {"val-fraction", 0, OPT_DOUBLE, &val_fraction, "F", "fraction of records for validation, drawn record by record (LitGPT's)", "0..<1"},
    {"shards", 0, OPT_INT, &shards, "N", "write N files BASE-00001-of-0000N.h5, rows split between them", "1..99999"},
    {"compress", 0, OPT_STR, &compress, "none|zstd[:L]", "compress datasets with zstd (HDF5 filter 32015)"},
    {"threads", 'j', OPT_INT, &threads, "N", "tokenizer threads (0: all cores)", OPTS_THREADS_RANGE},
    {"max-record-bytes", 0, OPT_I64, &max_record_bytes, "N",
     "longest record, in bytes of JSON text; a longer one is an error naming its line", "16..1073741824"},
    {"json", 0, OPT_FLAG, &json_out, NULL, "print the summary as JSON on stdout"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-pack",
    .usage = "--tokenizer FILE|DIR|W.h5 [options] INPUT.json -o OUTPUT.h5",
    .summary = "Turns training records (a JSON array or JSON Lines; INPUT may be - for stdin) into tokenized\n"
               "training rows. Records are Alpaca (\"instruction\", optional \"input\", \"output\") or\n"
               "conversations (\"messages\" of {role, content}, or ShareGPT \"conversations\" of {from, value});\n"
               "--template renders them (formats/chat.h): alpaca gives BOS + the Alpaca prompt + the output +\n"
               "EOS, llama-2-chat and chatml the chat formats, with the loss on assistant turns. The input is\n"
               "read as a stream in bounded memory (under 60 MB at the defaults, whatever its size); a record goes\n"
               "to the validation split when a hash of (--seed, its index) says so. Rows are written in\n"
               "packing order (ftk-train shuffles them per epoch). The output file's layout is\n"
               "documented in formats/tokens.h; `ftk-info` describes it, `ftk-verify` checks it.",
    .epilog = "Exit status: 0 success, 1 runtime failure, 2 bad usage or bad input (nothing written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = 1,
};


/* The values opts_parse() cannot check alone; 0, or -1 after the message. */
static int check_values(int *zstd, chat_template_t *tmpl)
{
    if (!tokenizer_path || !output) {
        ftk_error("%s is required", !tokenizer_path ? "--tokenizer" : "--output");
        return -1;
    }
    if (max_len < 2 || shards < 1 || shards > 99999 || val_fraction < 0 || val_fraction >= 1 || threads < 0 ||
        max_record_bytes < 16 || val_count > 100000000 || h5_parse_compress(compress, zstd) < 0) {
        ftk_error("invalid value: need --max-len >= 2, 1 <= --shards <= 99999, 0 <= --val-fraction < 1, "
                  "--threads >= 0, --max-record-bytes >= 16, --val-count <= 1e8, --compress none|zstd|zstd:1..22");
        return -1;
    }
    if (template_arg && chat_template_parse(template_arg, tmpl) < 0) {
        ftk_error("--template: %s", ftk_err_msg());
        return -1;
    }
    return 0;
}

/* A file, a folder or a weights file: its encoder (tokfiles.h), whose bytes' checksum is
 * the same wherever it was read, so ftk-train can compare it with the model's. NULL after
 * the message. */
static tok_t *load_tokenizer(uint64_t *hash)
{
    tok_t *tok = tokfiles_load_tok(tokenizer_path, hash);
    if (!tok) {
        ftk_error("--tokenizer %s", ftk_err_msg());
        return NULL;
    }
    if (tok_bos_id(tok) < 0 || tok_eos_id(tok) < 0) {
        ftk_error("%s: the tokenizer defines no BOS or EOS token", tokenizer_path);
        tok_free(tok);
        return NULL;
    }
    return tok;
}

/* The message of a failed pack_*() call; the exit status. */
static int pack_failed(int e, const char *in_name)
{
    if (e == PACK_BAD_STREAM)
        ftk_error("%s: %s", in_name, ftk_err_msg());
    else
        ftk_error("%s", ftk_err_msg());
    return e == -1 ? FTK_EXIT_FAIL : FTK_EXIT_USAGE;
}

/* What pack_read() found that leaves nothing to write; the exit status, 0 when there is
 * something. */
static int refuse_split(const pack_stats_t *st, const char *in_name)
{
    if (st->n_samples == 0) {
        ftk_error("%s: every record is longer than --max-len %d and --drop-long is set: nothing to write", in_name,
                  max_len);
        return FTK_EXIT_USAGE;
    }
    if (st->n_val >= st->n_samples) {
        ftk_error("the validation split (%lld samples) leaves no training samples out of %lld", (long long)st->n_val,
                  (long long)st->n_samples);
        return FTK_EXIT_USAGE;
    }
    return 0;
}

static void print_json(const pack_t *p, const char *input, double eff)
{
    const pack_stats_t *st = pack_stats(p);
    buf_t j = {0};
    printf("{\"input\": ");
    json_write_string(&j, input, strlen(input));
    printf("%s, \"records\": %lld, \"samples\": %lld, \"train_samples\": %lld, \"val_samples\": %lld, "
           "\"tokens\": %lld, \"mean_len\": %.3f, \"max_len_seen\": %lld, \"max_len\": %d, \"truncated\": %lld, "
           "\"dropped\": %lld, \"packed\": %s, \"train_rows\": %lld, \"val_rows\": %lld, \"efficiency\": %.6f, "
           "\"mask_prompt\": %s, \"outputs\": [",
           j.data, (long long)st->n_records, (long long)st->n_samples, (long long)(st->n_samples - st->n_val),
           (long long)st->n_val, (long long)st->n_tokens, (double)st->n_tokens / (double)st->n_samples,
           (long long)st->max_len_seen, max_len, (long long)st->n_truncated, (long long)st->n_dropped,
           pack ? "true" : "false", (long long)st->train_rows, (long long)st->val_rows, eff,
           mask_prompt ? "true" : "false");
    for (int k = 0; k < shards; k++) {
        const char *name = pack_output_name(p, k);
        j.len = 0;
        json_write_string(&j, name, strlen(name));
        printf("%s%s", k ? ", " : "", j.data);
    }
    printf("]}\n");
    buf_free(&j);
}

static void print_summary(const pack_t *p, const char *input, const char *in_name, double secs)
{
    const pack_stats_t *st = pack_stats(p);
    double eff = (double)st->n_tokens / (double)st->row_tokens;
    if (!pack)
        eff = (double)st->n_tokens / (double)((st->train_rows + st->val_rows) * (int64_t)max_len);
    long long bytes = 0;
    for (int k = 0; k < shards; k++) {
        struct stat sb;
        if (stat(pack_output_name(p, k), &sb) == 0)
            bytes += sb.st_size;
    }
    if (st->no_target)
        ftk_warn("%lld samples have no target token left (prompt reaches --max-len)", (long long)st->no_target);
    ftk_info("%s: %lld record%s -> %lld sample%s (train %lld, val %lld), %lld token%s", in_name,
             (long long)st->n_records, plural_s(st->n_records), (long long)st->n_samples, plural_s(st->n_samples),
             (long long)(st->n_samples - st->n_val), (long long)st->n_val, (long long)st->n_tokens,
             plural_s(st->n_tokens));
    ftk_info("sample length: mean %.1f, max %lld (max-len %d); truncated %lld, dropped %lld",
             (double)st->n_tokens / (double)st->n_samples, (long long)st->max_len_seen, max_len,
             (long long)st->n_truncated, (long long)st->n_dropped);
    ftk_info("%s rows: train %lld, val %lld; %s %.1f%%", pack ? "packed" : "unpacked", (long long)st->train_rows,
             (long long)st->val_rows, pack ? "packing efficiency" : "efficiency if padded to max-len", 100 * eff);
    ftk_info("wrote %s%s (%.1f MB) in %.2f s", pack_output_name(p, 0), shards > 1 ? " and the other shards" : "",
             (double)bytes / 1e6, secs);
    if (json_out)
        print_json(p, input, eff);
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
    chat_template_t tmpl = CHAT_ALPACA;
    if (check_values(&zstd, &tmpl) < 0)
        return FTK_EXIT_USAGE;
    opts_start_threads(threads); /* a team that cannot be made fails now, before any output */
    atomic_install_signal_cleanup();
    double t0 = time_now();
    const char *input = pos[0];
    const char *in_name = strcmp(input, "-") == 0 ? "<stdin>" : input;
    uint64_t tok_hash;
    tok_t *tok = load_tokenizer(&tok_hash);
    if (!tok)
        return FTK_EXIT_USAGE;
    const pack_opts_t po = {
        .input = input,
        .input_name = in_name,
        .output = output,
        .tok = tok,
        .tok_hash = tok_hash,
        .detect_template = !template_arg,
        .tmpl = tmpl,
        .max_len = max_len,
        .mask_prompt = mask_prompt,
        .drop_long = drop_long,
        .pack = pack,
        .force = force,
        .shards = shards,
        .zstd = zstd,
        .seed = seed,
        .val_count = val_count,
        .val_fraction = val_fraction,
        .max_record_bytes = (size_t)max_record_bytes,
    };
    pack_t *p = NULL;
    int e = pack_open(&po, &p);
    if (!e)
        e = pack_read(p);
    if (!e && !(rc = refuse_split(pack_stats(p), in_name)))
        e = pack_write(p);
    if (e)
        rc = pack_failed(e, in_name);
    else if (!rc)
        print_summary(p, input, in_name, time_now() - t0);
    pack_free(p);
    tok_free(tok);
    return rc;
}
