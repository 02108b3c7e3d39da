/* ftk-pack — training records (Alpaca, conversations; formats/chat.h) to packed, tokenized
 * HDF5 (formats/tokens.h), as a stream.
 *
 * ## How it streams (issue 17 item 4, issue 19 item 3)
 * The input is read a chunk at a time (formats/records.h): at most CHUNK_RECORDS (1024)
 * records or CHUNK_BYTES (4 MiB) of JSON text, or one record of up to --max-record-bytes
 * (4 MiB; a longer record is an error naming its line and column). The threads parse and
 * tokenize a chunk's records in parallel (encode_record(): one record → ids + mask through
 * its template, formats/chat.h; the template is --template's or the first record's shape's), each
 * into the record's own slot; meanwhile one of them first takes the previous chunk's
 * samples in input order (route_chunk(): counts, validation or training, that split's
 * packer, formats/tokens.h, which writes finished rows to temporary files on disk), then
 * reads the next chunk, then joins the tokenizing. At the end the rows are written into
 * the HDF5 file(s), shard by shard, checksummed while written. Nothing depends on the
 * thread count or on where chunks end, so the same input gives byte-identical files with
 * any --threads (tests/fault/pack_stream.sh).
 *
 * ## Validation split: no look-ahead
 * Record i (0-based, in the input) goes to validation when its key, splitmix64 of the
 * state seed·φ + i, is below --val-fraction · 2^64: about that fraction, decided record by
 * record. --val-count N takes exactly N: the N kept samples of smallest key, which means
 * holding up to N samples in memory until the end (a record pushed out of that set goes
 * to training at once); N is limited to 1e8 and costs N · (5·max_len + 48) bytes at most.
 *
 * ## Row order
 * Rows are written in the order the packer finishes them (formats/tokens.h), not shuffled:
 * ftk-train permutes the rows of every epoch from (seed, epoch) anyway. --shards N splits
 * that one global order into N contiguous ranges, so the rows are the same, in the same
 * order, for any N (tests/ref/pack_vs_python.py checks 1 against 3).
 *
 * ## Memory bound
 * With L = --max-len, T threads, B = the longest record's bytes (≤ --max-record-bytes):
 *   M0 (program, HDF5, the tokenizer: ≈ 20 MB with Llama 2's)
 *   + 1 MiB read buffer + 2 · 8 MiB chunk text (two chunks in flight; each CHUNK_BYTES
 *     plus one record, worst case)
 *   + 2 · 1024 · 5·L   tokenized samples of the two chunks
 *   + 2 · (512 + 256) · 5·L   the two packers' batches and windows
 *   + T · ≈16·B    per thread: the record's parse and the tokenizer's work (measured)
 *   + ≈ 5 MiB      temporary-file and HDF5 write buffers
 *   (+ N · (5·L + 48) with --val-count N)
 * ≈ 55 MB at the defaults (L = 512, 2 threads, records of a few KB) in the worst case,
 * whatever the input size or the number of rows. Measured (max resident, /usr/bin/time,
 * tests/fault/pack_big.sh, make test-slow): 33 MB for 1 GB of generated records
 * (1.34 M records, 262 M tokens, 2 threads), 32 MB for 3 GB of 100 KB records.
 * Disk: the rows once in temporary files next to the output (unlinked at creation), then
 * in the output.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/chat.h"
#include "../formats/json.h"
#include "../formats/records.h"
#include "../formats/h5.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../formats/tokens.h"
#include "../libcommon/atomic.h"
#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/plural.h"
#include "../libcommon/progress.h"
#include "../libcommon/rng.h"
#include "../libcommon/timer.h"
#include "../libcommon/version.h"

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

/* Records are read, tokenized and packed a chunk at a time: at most CHUNK_RECORDS records
 * or CHUNK_BYTES of JSON text (or one record up to --max-record-bytes). */
#define CHUNK_RECORDS 1024
#define CHUNK_BYTES (4u << 20)

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

/* One record's sample. Buffers are kept from chunk to chunk (cap tokens each). */
typedef struct {
    int32_t *ids; /* the record rendered by its template, tokenized, cut to max_len */
    uint8_t *mask;
    int64_t n_prompt, len, full_len, cap; /* n_prompt: tokens before the first target */
    int status; /* 0 ok, 1 bad record (err says why), 2 out of memory */
    char err[600];
} sample_t;

/* Per-thread scratch for encode_record(). */
typedef struct {
    chat_enc_t *enc;
    chat_out_t out;
} scratch_t;

static chat_template_t tmpl = CHAT_ALPACA; /* --template's, or the first record's shape's */

/* THE per-record step: one record (a parsed JSON value, the idx-th of the input, 0-based)
 * → token ids + loss mask through the template (formats/chat.h), cut to max_len, in s.
 * Returns 0, -1 for a bad record (ftk_err_msg() names line, column and record), -2 when
 * out of memory. */
static int encode_record(const tok_t *tok, scratch_t *sc, const json_doc_t *doc, const json_value_t *rec,
                         int64_t idx, sample_t *s)
{
    if (chat_check(doc, rec, (size_t)idx, tmpl) < 0)
        return -1;
    if (chat_encode(sc->enc, tok, tmpl, mask_prompt, doc, rec, (size_t)idx, &sc->out) < 0)
        return -2; /* checked: out of memory */
    const chat_out_t *o = &sc->out;
    s->n_prompt = 0;
    while (s->n_prompt < (int64_t)o->ids.n && !o->mask[s->n_prompt])
        s->n_prompt++;
    s->full_len = (int64_t)o->ids.n;
    s->len = s->full_len < max_len ? s->full_len : max_len;
    memcpy(s->ids, o->ids.v, (size_t)s->len * sizeof *s->ids);
    memcpy(s->mask, o->mask, (size_t)s->len);
    return 0;
}

/* Parses and encodes the n records of a chunk; called by every thread of a parallel
 * region, which share the records out (an orphaned `omp for`). Results land in smp[i] for
 * record i, so what follows sees them in input order whatever the thread count. */
static void tokenize_chunk(const tok_t *tok, scratch_t *scr, const record_span_t *sp, int64_t n, sample_t *smp)
{
#pragma omp for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; i++) {
        scratch_t *sc = &scr[omp_get_thread_num()];
        sample_t *s = &smp[i];
        s->status = 0;
        if (s->cap < max_len) {
            free(s->ids);
            free(s->mask);
            s->ids = malloc((size_t)max_len * sizeof *s->ids);
            s->mask = malloc((size_t)max_len);
            s->cap = s->ids && s->mask ? max_len : 0;
            if (!s->cap) {
                s->status = 2;
                continue;
            }
        }
        json_opts_t o = {.max_depth = 64, .line0 = sp[i].line, .col0 = sp[i].col};
        json_value_t *root;
        json_doc_t *doc = json_parse(sp[i].text, sp[i].len, &o, &root);
        int e = doc ? encode_record(tok, sc, doc, root, sp[i].index, s) : -1;
        if (e < 0) {
            s->status = e == -1 ? 1 : 2;
            snprintf(s->err, sizeof s->err, "%s", e == -1 ? ftk_err_msg() : "out of memory while tokenizing");
        }
        json_free(doc);
    }
}

/* The validation rule: record idx (0-based) goes to validation when its key, a hash of
 * (seed, idx), is below val_fraction·2^64; or, with --val-count N, when its key is among
 * the N smallest of the kept samples (ties: the lower index). The key is splitmix64's
 * output for the state seed·φ + idx (φ = 0x9E3779B97F4A7C15): no look-ahead, the same
 * choice whatever the thread count, the chunking or the shards. */
static uint64_t val_key(int64_t idx)
{
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)idx;
    return rng_splitmix64(&x);
}

/* --val-count N: the N kept samples of smallest key so far, a max-heap on (key, record). */
typedef struct {
    uint64_t key;
    int64_t record, len;
    int32_t *ids;
    uint8_t *mask;
} held_t;

static int held_less(const held_t *a, const held_t *b)
{
    return a->key != b->key ? a->key < b->key : a->record < b->record;
}

static void heap_down(held_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && held_less(&h[m], &h[l]))
            m = l;
        if (r < n && held_less(&h[m], &h[r]))
            m = r;
        if (m == i)
            return;
        held_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_up(held_t *h, size_t i)
{
    while (i && held_less(&h[(i - 1) / 2], &h[i])) {
        held_t t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static int by_record(const void *a, const void *b)
{
    const held_t *x = a, *y = b;
    return x->record < y->record ? -1 : x->record > y->record;
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

/* What the routing thread keeps: counts for the summary, the split decision's state, the
 * two packers. */
typedef struct {
    meta_t *m;
    int64_t n_kept, n_val, max_seen, no_target;
    uint64_t threshold;
    held_t *held;
    size_t n_held;
    tokens_packer_t *train, *val;
    int exit_code; /* when route_chunk() fails */
    char err[700];
} route_t;

/* Takes a tokenized chunk in input order: counts, cut or drop, validation or training,
 * into the split's packer. Returns 0, or -1 with rt->err and rt->exit_code set. */
static int route_chunk(route_t *rt, const char *in_name, const record_span_t *sp, int64_t n, sample_t *smp)
{
    meta_t *m = rt->m;
    for (int64_t i = 0; i < n; i++) {
        sample_t *s = &smp[i];
        if (s->status) {
            snprintf(rt->err, sizeof rt->err, "%s%s%s", s->status == 1 ? in_name : "", s->status == 1 ? ": " : "",
                     s->err);
            rt->exit_code = s->status == 1 ? FTK_EXIT_USAGE : FTK_EXIT_FAIL;
            return -1;
        }
        m->n_records++;
        if (s->full_len > max_len) {
            if (drop_long) {
                m->n_dropped++;
                continue;
            }
            m->n_truncated++;
        }
        if (mask_prompt && s->n_prompt >= s->len)
            rt->no_target++;
        rt->n_kept++;
        m->n_tokens += s->len;
        if (s->len > rt->max_seen)
            rt->max_seen = s->len;
        tokens_sample_t ts = {s->ids, s->mask, s->len, sp[i].index};
        uint64_t key = val_key(sp[i].index);
        int e = 0;
        if (val_count < 0) {
            e = tokens_packer_add(key < rt->threshold ? rt->val : rt->train, &ts);
            rt->n_val += key < rt->threshold;
        } else if (val_count == 0) {
            e = tokens_packer_add(rt->train, &ts);
        } else {
            held_t h = {key, sp[i].index, s->len, NULL, NULL};
            held_t *held = rt->held;
            if (rt->n_held < (size_t)val_count || held_less(&h, &held[0])) {
                if (rt->n_held == (size_t)val_count) { /* the largest key leaves for training */
                    tokens_sample_t out = {held[0].ids, held[0].mask, held[0].len, held[0].record};
                    e = tokens_packer_add(rt->train, &out);
                    free(held[0].ids);
                    free(held[0].mask);
                    held[0] = held[--rt->n_held];
                    heap_down(held, rt->n_held, 0);
                }
                h.ids = malloc((size_t)s->len * sizeof *h.ids);
                h.mask = malloc((size_t)s->len);
                if (!h.ids || !h.mask) {
                    free(h.ids);
                    free(h.mask);
                    ftk_err_set("out of memory");
                    e = -1;
                } else {
                    memcpy(h.ids, s->ids, (size_t)s->len * sizeof *h.ids);
                    memcpy(h.mask, s->mask, (size_t)s->len);
                    held[rt->n_held++] = h;
                    heap_up(held, rt->n_held - 1);
                }
            } else {
                e = tokens_packer_add(rt->train, &ts);
            }
        }
        if (e < 0) {
            snprintf(rt->err, sizeof rt->err, "%s", ftk_err_msg());
            rt->exit_code = FTK_EXIT_FAIL;
            return -1;
        }
    }
    return 0;
}

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
static int write_shards(const meta_t *m, tokens_spill_t *train, tokens_spill_t *val, char **names)
{
    output_t *af = calloc((size_t)shards, sizeof *af);
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
        if (output_begin(&af[k], names[k], force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0)
            goto out;
        hid_t f = h5_create(output_tmp_path(&af[k]), TOKENS_FORMAT, TOKENS_VERSION);
        if (f < 0)
            goto out;
        int64_t tr_n = tokens_spill_rows(train), va_n = tokens_spill_rows(val);
        int64_t tr0 = tr_n * k / shards, tr1 = tr_n * (k + 1) / shards;
        int64_t va0 = va_n * k / shards, va1 = va_n * (k + 1) / shards;
        int e = write_meta(f, m, k, shards);
        if (!e)
            e = tokens_spill_write(train, f, "train", tr0, tr1, &wo, sums[k]);
        if (!e) /* the shard's file half written: a fault test's "during the write" */
            e = fault_point("pack.write");
        if (!e)
            e = tokens_spill_write(val, f, "val", va0, va1, &wo, sums[k] + TOKENS_N_DATASETS);
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
        hid_t f = H5Fopen(output_tmp_path(&af[k]), H5F_ACC_RDWR, H5P_DEFAULT);
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
        if (output_commit(&af[k]) < 0)
            goto out;
        /* shards already renamed stay: each is complete and checks on its own */
    }
    rc = 0;
out:
    for (int k = 0; af && k < shards; k++)
        if (af[k].a.tmp_path) /* begun, not committed */
            output_abort(&af[k]);
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
    if (max_len < 2 || shards < 1 || shards > 99999 || val_fraction < 0 || val_fraction >= 1 || threads < 0 ||
        max_record_bytes < 16 || val_count > 100000000 || h5_parse_compress(compress, &zstd) < 0) {
        ftk_error("invalid value: need --max-len >= 2, 1 <= --shards <= 99999, 0 <= --val-fraction < 1, "
                  "--threads >= 0, --max-record-bytes >= 16, --val-count <= 1e8, --compress none|zstd|zstd:1..22");
        return FTK_EXIT_USAGE;
    }
    if (template_arg && chat_template_parse(template_arg, &tmpl) < 0) {
        ftk_error("--template: %s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    opts_start_threads(threads); /* a team that cannot be made fails now, before any output */
    atomic_install_signal_cleanup();
    double t0 = time_now();
    const char *input = pos[0];
    const char *in_name = strcmp(input, "-") == 0 ? "<stdin>" : input;

    /* A file, a folder or a weights file: its encoder (tokfiles.h), whose bytes' checksum is
     * the same wherever it was read, so ftk-train can compare it with the model's. */
    meta_t m = {0};
    tok_t *tok = tokfiles_load_tok(tokenizer_path, &m.tok_hash);
    if (!tok) {
        ftk_error("--tokenizer %s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if (tok_bos_id(tok) < 0 || tok_eos_id(tok) < 0) {
        ftk_error("%s: the tokenizer defines no BOS or EOS token", tokenizer_path);
        tok_free(tok);
        return FTK_EXIT_USAGE;
    }
    m.source = input;
    m.tok = tok;
    m.zstd = zstd;
    records_t *in = NULL;
    sample_t *smp[2] = {NULL, NULL};
    scratch_t *scr = NULL;
    int n_scr = omp_get_max_threads();
    tokens_spill_t *sp_train = NULL, *sp_val = NULL;
    route_t rt = {.m = &m, .threshold = (uint64_t)ldexp(val_fraction, 64)};
    char **names = NULL, *dir = NULL;
    rc = FTK_EXIT_USAGE;
    /* every output checked before the work: one that may not be written is refused now */
    names = calloc((size_t)shards, sizeof *names);
    for (int k = 0; names && k < shards; k++)
        if (!(names[k] = shards == 1 ? strdup(output) : shard_name(output, k, shards))) {
            ftk_error("out of memory");
            rc = FTK_EXIT_FAIL;
            goto done;
        }
    if (!names) {
        ftk_error("out of memory");
        rc = FTK_EXIT_FAIL;
        goto done;
    }
    for (int k = 0; k < shards; k++)
        if (output_check(names[k], force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0) {
            ftk_error("%s", ftk_err_msg());
            goto done;
        }
    if (!(in = records_open(input, (size_t)max_record_bytes))) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    rc = FTK_EXIT_FAIL;
    /* Temporary rows go next to the output (same file system, and /tmp may be small). */
    dir = strdup(output);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (dir && slash)
        *slash = slash == dir ? (slash[1] = 0, '/') : 0;
    const char *d = !dir ? "." : slash ? dir : ".";
    smp[0] = calloc(CHUNK_RECORDS, sizeof *smp[0]);
    smp[1] = calloc(CHUNK_RECORDS, sizeof *smp[1]);
    scr = calloc((size_t)n_scr, sizeof *scr);
    rt.held = val_count > 0 ? calloc((size_t)val_count, sizeof *rt.held) : NULL;
    if (!dir || !smp[0] || !smp[1] || !scr || (val_count > 0 && !rt.held)) {
        ftk_error("out of memory");
        goto done;
    }
    for (int i = 0; i < n_scr; i++)
        if (!(scr[i].enc = chat_enc_new())) {
            ftk_error("out of memory");
            goto done;
        }
    if (!(sp_train = tokens_spill_new(d)) || !(sp_val = tokens_spill_new(d)) ||
        !(rt.train = tokens_packer_new(pack, max_len, tok_eos_id(tok), sp_train)) ||
        !(rt.val = tokens_packer_new(pack, max_len, tok_eos_id(tok), sp_val))) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    struct stat st_in;
    int64_t in_size = strcmp(input, "-") != 0 && stat(input, &st_in) == 0 ? (int64_t)st_in.st_size : 0;
    progress_t prog;
    progress_start(&prog, "reading", in_size, "bytes");
    /* A pipeline over chunks: while the threads tokenize chunk k, one of them first routes
     * and packs chunk k-1 (in input order) and reads chunk k+1, then joins the others. */
    const record_span_t *sp[2] = {NULL, NULL};
    int64_t n[2] = {0, 0}, got = records_next(in, CHUNK_RECORDS, CHUNK_BYTES, &sp[0]);
    int cur = 0, have_prev = 0, read_failed = got < 0, route_failed = 0;
    char read_err[700] = "";
    if (read_failed)
        snprintf(read_err, sizeof read_err, "%s", ftk_err_msg());
    n[0] = got > 0 ? got : 0;
    /* Without --template, the first record's shape chooses (a record that does not parse
     * chooses nothing: the tokenizing reports it). */
    if (!template_arg && n[0] > 0) {
        json_opts_t o = {.max_depth = 64, .line0 = sp[0][0].line, .col0 = sp[0][0].col};
        json_value_t *root;
        json_doc_t *doc = json_parse(sp[0][0].text, sp[0][0].len, &o, &root);
        if (doc)
            tmpl = chat_template_detect(root);
        json_free(doc);
    }
    m.template_name = chat_template_name(tmpl);
    while (n[cur] > 0 || have_prev) {
        int64_t next = 0;
#pragma omp parallel
        {
#pragma omp single nowait
            {
                if (have_prev && route_chunk(&rt, in_name, sp[1 - cur], n[1 - cur], smp[1 - cur]) < 0)
                    route_failed = 1;
                if (!route_failed && !read_failed && n[cur] > 0) {
                    next = records_next(in, CHUNK_RECORDS, CHUNK_BYTES, &sp[1 - cur]);
                    if (next < 0) {
                        read_failed = 1;
                        snprintf(read_err, sizeof read_err, "%s", ftk_err_msg());
                        next = 0;
                    }
                }
                progress_update(&prog, (int64_t)records_bytes(in));
            }
            /* every thread meets the loop, whatever the routing thread found (a worksharing
             * construct that some threads skip would hang the others) */
            tokenize_chunk(tok, scr, sp[cur], n[cur], smp[cur]);
        }
        fault_point("pack.chunk");
        if (route_failed) {
            progress_done(&prog);
            ftk_error("%s", rt.err);
            rc = rt.exit_code;
            goto done;
        }
        have_prev = n[cur] > 0;
        cur = 1 - cur;
        n[cur] = next;
    }
    progress_done(&prog);
    if (read_failed) { /* after every record before the fault, so errors come in input order */
        ftk_error("%s: %s", in_name, read_err);
        rc = FTK_EXIT_USAGE;
        goto done;
    }
    m.src_hash = records_hash(in);
    m.n_samples = rt.n_kept;
    if (rt.n_kept == 0) {
        ftk_error("%s: every record is longer than --max-len %d and --drop-long is set: nothing to write", in_name,
                  max_len);
        rc = FTK_EXIT_USAGE;
        goto done;
    }
    if (val_count >= 0)
        rt.n_val = (int64_t)rt.n_held;
    if (rt.n_val >= rt.n_kept) {
        ftk_error("the validation split (%lld samples) leaves no training samples out of %lld", (long long)rt.n_val,
                  (long long)rt.n_kept);
        rc = FTK_EXIT_USAGE;
        goto done;
    }
    /* Held validation samples, in input order. */
    if (rt.n_held)
        qsort(rt.held, rt.n_held, sizeof *rt.held, by_record);
    for (size_t k = 0; k < rt.n_held; k++) {
        tokens_sample_t ts = {rt.held[k].ids, rt.held[k].mask, rt.held[k].len, rt.held[k].record};
        if (tokens_packer_add(rt.val, &ts) < 0) {
            ftk_error("%s", ftk_err_msg());
            goto done;
        }
    }
    if (tokens_packer_finish(rt.train) < 0 || tokens_packer_finish(rt.val) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    if (write_shards(&m, sp_train, sp_val, names) < 0) {
        ftk_error("%s", ftk_err_msg());
        goto done;
    }
    rc = FTK_EXIT_OK;

    /* Summary. */
    double secs = time_now() - t0;
    int64_t train_rows = tokens_spill_rows(sp_train), val_rows = tokens_spill_rows(sp_val);
    double eff = (double)m.n_tokens / (double)(tokens_spill_tokens(sp_train) + tokens_spill_tokens(sp_val));
    if (!pack)
        eff = (double)m.n_tokens / (double)((train_rows + val_rows) * (int64_t)max_len);
    long long bytes = 0;
    for (int k = 0; k < shards; k++) {
        struct stat st;
        if (stat(names[k], &st) == 0)
            bytes += st.st_size;
    }
    if (rt.no_target)
        ftk_warn("%lld samples have no target token left (prompt reaches --max-len)", (long long)rt.no_target);
    ftk_info("%s: %lld record%s -> %lld sample%s (train %lld, val %lld), %lld token%s", in_name,
             (long long)m.n_records, plural_s(m.n_records), (long long)m.n_samples, plural_s(m.n_samples),
             (long long)(rt.n_kept - rt.n_val), (long long)rt.n_val, (long long)m.n_tokens, plural_s(m.n_tokens));
    ftk_info("sample length: mean %.1f, max %lld (max-len %d); truncated %lld, dropped %lld",
             (double)m.n_tokens / (double)rt.n_kept, (long long)rt.max_seen, max_len, (long long)m.n_truncated,
             (long long)m.n_dropped);
    ftk_info("%s rows: train %lld, val %lld; %s %.1f%%", pack ? "packed" : "unpacked", (long long)train_rows,
             (long long)val_rows, pack ? "packing efficiency" : "efficiency if padded to max-len", 100 * eff);
    ftk_info("wrote %s%s (%.1f MB) in %.2f s", names[0], shards > 1 ? " and the other shards" : "",
             (double)bytes / 1e6, secs);
    if (json_out) {
        buf_t j = {0};
        printf("{\"input\": ");
        json_write_string(&j, input, strlen(input));
        printf("%s, \"records\": %lld, \"samples\": %lld, \"train_samples\": %lld, \"val_samples\": %lld, "
               "\"tokens\": %lld, \"mean_len\": %.3f, \"max_len_seen\": %lld, \"max_len\": %d, \"truncated\": %lld, "
               "\"dropped\": %lld, \"packed\": %s, \"train_rows\": %lld, \"val_rows\": %lld, \"efficiency\": %.6f, "
               "\"mask_prompt\": %s, \"outputs\": [",
               j.data, (long long)m.n_records, (long long)m.n_samples, (long long)(rt.n_kept - rt.n_val), (long long)rt.n_val,
               (long long)m.n_tokens, (double)m.n_tokens / (double)rt.n_kept, (long long)rt.max_seen, max_len,
               (long long)m.n_truncated, (long long)m.n_dropped, pack ? "true" : "false", (long long)train_rows,
               (long long)val_rows, eff, mask_prompt ? "true" : "false");
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
    free(dir);
    tokens_packer_free(rt.train);
    tokens_packer_free(rt.val);
    tokens_spill_free(sp_train);
    tokens_spill_free(sp_val);
    for (size_t k = 0; rt.held && k < rt.n_held; k++) {
        free(rt.held[k].ids);
        free(rt.held[k].mask);
    }
    free(rt.held);
    for (int b = 0; b < 2; b++) {
        for (int i = 0; smp[b] && i < CHUNK_RECORDS; i++) {
            free(smp[b][i].ids);
            free(smp[b][i].mask);
        }
        free(smp[b]);
    }
    for (int i = 0; scr && i < n_scr; i++) {
        chat_enc_free(scr[i].enc);
        chat_out_free(&scr[i].out);
    }
    free(scr);
    records_close(in);
    tok_free(tok);
    return rc;
}
