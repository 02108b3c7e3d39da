/* pack.h — training records (Alpaca, conversations; chat.h) to packed, tokenized token
 * files (tokens.h), as a stream: the work of ftk-pack, whose options name the fields of
 * pack_opts_t.
 *
 * ## How it streams
 * The input is read a chunk at a time (records.h): at most PACK_CHUNK_RECORDS (1024)
 * records or PACK_CHUNK_BYTES (4 MiB) of JSON text, or one record of up to
 * max_record_bytes (a longer record is an error naming its line and column). The threads
 * parse and tokenize a chunk's records in parallel (one record → ids + mask through its
 * template, chat.h; the template is the caller's or the first record's shape's), each into
 * the record's own slot; meanwhile one of them first takes the previous chunk's samples in
 * input order (counts, validation or training, that split's packer, tokens.h, which
 * writes finished rows to temporary files on disk), then reads the next chunk, then joins
 * the tokenizing. At the end the rows are written into the HDF5 file(s), shard by shard,
 * checksummed while written. Nothing depends on the thread count or on where chunks end,
 * so the same input gives byte-identical files with any number of threads
 * (tests/fault/pack_stream.sh).
 *
 * ## Validation split: no look-ahead
 * Record i (0-based, in the input) goes to validation when its key, splitmix64 of the
 * state seed·φ + i (φ = 0x9E3779B97F4A7C15), is below val_fraction · 2^64: about that
 * fraction, decided record by record. val_count N ≥ 0 takes exactly N: the N kept samples
 * of smallest key (ties: the lower index), which means holding up to N samples in memory
 * until the end (a record pushed out of that set goes to training at once); N costs
 * N · (5·max_len + 48) bytes at most. The same choice whatever the thread count, the
 * chunking or the shards.
 *
 * ## Row order
 * Rows are written in the order the packer finishes them (tokens.h), not shuffled:
 * ftk-train permutes the rows of every epoch from (seed, epoch) anyway. shards N splits
 * that one global order into N contiguous ranges, so the rows are the same, in the same
 * order, for any N (tests/ref/pack_vs_python.py checks 1 against 3).
 *
 * ## Memory bound
 * With L = max_len, T threads, B = the longest record's bytes (≤ max_record_bytes):
 *   M0 (program, HDF5, the tokenizer: ≈ 20 MB with Llama 2's)
 *   + 1 MiB read buffer + 2 · 8 MiB chunk text (two chunks in flight; each
 *     PACK_CHUNK_BYTES plus one record, worst case)
 *   + 2 · 1024 · 5·L   tokenized samples of the two chunks
 *   + 2 · (512 + 256) · 5·L   the two packers' batches and windows
 *   + T · ≈16·B    per thread: the record's parse and the tokenizer's work (measured)
 *   + ≈ 5 MiB      temporary-file and HDF5 write buffers
 *   (+ N · (5·L + 48) with val_count N)
 * ≈ 55 MB at ftk-pack's defaults (L = 512, 2 threads, records of a few KB) in the worst
 * case, whatever the input size or the number of rows. Measured (max resident,
 * /usr/bin/time, tests/fault/pack_big.sh, make test-slow): 33 MB for 1 GB of generated
 * records (1.34 M records, 262 M tokens, 2 threads), 32 MB for 3 GB of 100 KB records.
 * Disk: the rows once in temporary files next to the output (unlinked at creation), then
 * in the output.
 *
 * ## Use and returns
 * pack_open() checks every output and opens the input, before any work; pack_read()
 * reads, tokenizes and routes every record; the caller may then refuse what
 * pack_stats() shows (no samples, no training samples) before pack_write() writes the
 * files, which appear under their final names only when all are complete (output.h).
 * A progress line (progress.h) is drawn while reading and while writing. Functions return
 * 0, or -1 with ftk_err_msg() set (a runtime failure: I/O, out of memory), or one of the
 * PACK_BAD_* codes below for input the caller should refuse (nothing written).
 */
#ifndef FTK_PACK_H
#define FTK_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "tokenizer.h"

#define PACK_CHUNK_RECORDS 1024
#define PACK_CHUNK_BYTES (4u << 20)

enum {
    /* pack_open(): an output may not be written, or the input cannot be opened;
     * ftk_err_msg() is the whole message. */
    PACK_REFUSED = -2,
    /* pack_read(): a record is bad; ftk_err_msg() is the whole message, the input's name,
     * the line, the column and the record included. */
    PACK_BAD_RECORD = -3,
    /* pack_read(): the input stops being records (records.h); ftk_err_msg() gives the line
     * and column, without the input's name. */
    PACK_BAD_STREAM = -4,
};

typedef struct {
    const char *input;      /* a path, or "-" for stdin (borrowed, as every string here) */
    const char *input_name; /* the input in messages */
    const char *output;     /* the .h5 file, or with shards > 1 the base name (pack_output_name) */
    const tok_t *tok;       /* defines BOS and EOS; borrowed until pack_free() */
    uint64_t tok_hash;      /* XXH3-64 of the tokenizer file's bytes (tokfiles.h) */
    int detect_template;    /* 1: the first record's shape chooses; 0: tmpl */
    chat_template_t tmpl;
    int max_len;            /* ≥ 2 */
    int mask_prompt, drop_long, pack, force;
    int shards;             /* 1..99999 */
    int zstd;               /* h5w_opts_t's zstd_level */
    int64_t seed;
    int64_t val_count;      /* ≥ 0: exactly that many validation samples; < 0: val_fraction */
    double val_fraction;    /* [0, 1) */
    size_t max_record_bytes;
} pack_opts_t;

typedef struct {
    int64_t n_records;          /* read */
    int64_t n_samples;          /* kept: n_records - n_dropped */
    int64_t n_val;              /* of the kept, in the validation split */
    int64_t n_tokens;           /* of the kept samples, after cutting */
    int64_t n_truncated, n_dropped;
    int64_t max_len_seen;       /* the longest kept sample, after cutting */
    int64_t no_target;          /* with mask_prompt: kept samples whose prompt reaches max_len */
    int64_t train_rows, val_rows; /* pack_write()'s */
    int64_t row_tokens;         /* pack_write()'s: tokens of every row, padding included */
} pack_stats_t;

typedef struct pack pack_t;

/* Names every output, checks each (output_check()), opens the input and makes the
 * buffers, the temporary files and the packers. 0 with *out set, -1, or
 * PACK_REFUSED; *out is NULL on failure. */
int pack_open(const pack_opts_t *o, pack_t **out);
/* Reads, tokenizes and routes every record. 0, -1, PACK_BAD_RECORD or PACK_BAD_STREAM
 * (errors come in input order: a bad stream is reported once every record before it
 * was taken). */
int pack_read(pack_t *p);
/* What pack_read() found (and pack_write() wrote); valid until pack_free(). */
const pack_stats_t *pack_stats(const pack_t *p);
/* Writes the files: each under a temporary name, then the set hash into each, then
 * commits them all. 0 or -1; on failure no output appears (shards already renamed stay:
 * each is complete and checks on its own). */
int pack_write(pack_t *p);
/* Output k (0-based) of o->shards: o->output, or BASE-0000k-of-0000N.h5 (BASE: output
 * without ".h5"). */
const char *pack_output_name(const pack_t *p, int k);
void pack_free(pack_t *p);

#endif
