/* tokens.h — ftk's token data file: what ftk-pack writes and ftk-train reads.
 *
 * ## Layout (ftk_format "tokens", ftk_format_version 1)
 *
 * Root attributes (besides ftk_format / ftk_format_version):
 *   ftk_version        string  ftk release that wrote the file
 *   tokenizer_format   string  "sentencepiece" | "tokenizer.json"
 *   tokenizer_xxh3     string  XXH3-64 (16 hex digits) of the tokenizer file's bytes
 *   vocab_size, bos_id, eos_id, pad_id   int64   (pad_id fills packed rows; never a target)
 *   template           string  "alpaca", "llama-2-chat" or "chatml": how records became
 *                              samples (formats/chat.h gives each word for word)
 *   mask_prompt        int64   1: only response (assistant) tokens (and EOS) are targets
 *   max_len            int64   longest row, in tokens
 *   packed             int64   1: rows are exactly max_len, several samples each
 *   seed               int64   seed of the validation split (formats/pack.h: record i is
 *                              in it when a hash of (seed, i) says so)
 *   source_name        string  input file name as given ("-" for stdin)
 *   source_xxh3        string  XXH3-64 of the input file's bytes
 *   n_records          int64   records read from the input (whole set, all shards)
 *   n_samples          int64   samples written (n_records - n_dropped)
 *   n_tokens           int64   real tokens written, no padding (whole set)
 *   n_truncated        int64   samples cut to max_len
 *   n_dropped          int64   samples skipped by --drop-long
 *   shard_index        int64   1-based index of this file in its set
 *   shard_count        int64   number of files in the set
 *   set_xxh3           string  XXH3-64 identifying the whole set: of every shard's index and
 *                              dataset checksums (tokens_set_hash()); equal in all shards
 *
 * Groups /train and /val (the validation split; present, possibly empty), each with:
 *   tokens          int32  [T]    the rows back to back, padding included
 *   loss_mask       uint8  [T]    1 where the token is a target: the loss of predicting it
 *                                 from the tokens before it in its sample counts
 *   row_offsets     int64  [R+1]  row r is tokens[row_offsets[r] : row_offsets[r+1]]
 *   row_samples     int64  [R+1]  row r holds samples row_samples[r] .. row_samples[r+1]-1
 *   sample_starts   int64  [S]    sample s is tokens[sample_starts[s] : + sample_lengths[s]]
 *   sample_lengths  int64  [S]
 *   sample_record   int64  [S]    the sample's record index in the input (0-based)
 * and group attributes n_rows, n_samples, n_tokens (T) and n_pad (padding tokens).
 *
 * Invariants (tokens_check_split(), run by ftk-verify): offsets start at 0, never
 * decrease and end at T (R for row_samples); the samples of a row follow each other from
 * the row's first token, in order, each at least 1 token long; the rest of the row is
 * padding: pad_id with mask 0;
 * the first token of every sample has mask 0 (nothing precedes it); ids are in
 * [0, vocab_size); masks are 0 or 1; packed rows are exactly max_len long, unpacked rows
 * hold one sample of at most max_len tokens.
 *
 * A sample is one record rendered by the template and tokenized (formats/chat.h), cut to
 * max_len: for alpaca BOS + tokens(prompt) + tokens(output) + EOS, prompt and output
 * tokenized separately (as LitGPT does, so the mask boundary is exact); for the chat
 * templates the tokens transformers' apply_chat_template gives, targets on assistant turns.
 * Training keeps attention inside a sample and restarts positions at each sample start.
 *
 * Row order: the order in which the packer (below, "Streaming build") finishes rows; not
 * shuffled, since ftk-train permutes the rows of each epoch from (seed, epoch). Unpacked
 * rows are in input order. Files written before the streaming packer had shuffled rows;
 * readers must not rely on either.
 *
 * Sharded sets (ftk-pack --shards N) are named BASE-00001-of-0000N.h5; shard k (0-based) of
 * N holds the rows [R·k/N, R·(k+1)/N) of each split's global order (R rows), so the rows
 * and their order are the same whatever N. Readers take the set as a whole (tokens_set.h):
 * global rows in shard order, so that a set trains like the file.
 *
 * Storage: every dataset is contiguous (or chunked by about 1 MiB when compressed), written
 * with its final size known: the streaming build keeps rows in temporary files until the
 * end, then writes each shard in one pass.
 */
#ifndef FTK_TOKENS_H
#define FTK_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "h5.h"

#define TOKENS_FORMAT "tokens"
#define TOKENS_VERSION 1

typedef struct {
    int32_t *tokens;
    uint8_t *loss_mask;
    int64_t n_tokens;
    int64_t *row_offsets, *row_samples; /* n_rows + 1 each */
    int64_t n_rows;
    int64_t *sample_starts, *sample_lengths, *sample_record; /* n_samples each */
    int64_t n_samples;
} tokens_split_t;

/* One tokenized sample, as the builder receives it (already cut to max_len). */
typedef struct {
    const int32_t *ids;
    const uint8_t *mask;
    int64_t len;
    int64_t record;
} tokens_sample_t;

/* Builds a split from samples in memory (tests build small files with it; ftk-pack uses
 * the streaming build below). packed: best-fit-decreasing bin packing into rows of
 * exactly max_len (padded with pad_id), rows then shuffled with seed; otherwise one row
 * per sample, in the given order. Returns 0, or -1 (out of memory). */
int tokens_build(const tokens_sample_t *samples, size_t n, int packed, int64_t max_len, int32_t pad_id,
                 uint64_t seed, tokens_split_t *out);

/* ---- Streaming build (what ftk-pack uses): bounded memory whatever the input size ----
 *
 * A spill holds one split's rows on disk as they are produced (anonymous temporary files
 * in `dir`, unlinked at creation: nothing is left behind, whatever happens); once all rows
 * are there, tokens_spill_write() writes rows [r0, r1) as a group of an HDF5 file,
 * streaming (checksums computed while writing). Calls to it must come in row order with
 * consecutive ranges (the spill is read once, front to back): that is how ftk-pack writes
 * shard k of N with the rows [R·k/N, R·(k+1)/N), so the global row order is the same
 * for any --shards. Memory: about 2 MiB, whatever the number of rows.
 *
 * The packer (packed): samples arrive in a stream; each batch of TOKENS_PACK_BATCH is
 * sorted by length (longest first, then arrival order) and placed best-fit into a window
 * of at most TOKENS_PACK_WINDOW open rows (the open row with the least room that fits,
 * the earliest opened on ties); a row that becomes full leaves the window at once; when
 * nothing fits and the window is full, the fullest open row (the earliest opened on ties)
 * leaves. Rows are written in the order they leave the window; at the end the open rows
 * leave in the order they were opened. The row order is therefore a function of the
 * sample sequence alone. Memory: (BATCH + WINDOW) · max_len · 5 bytes, plus 16 bytes per
 * sample of an open row. Unpacked: one row per sample, in arrival order, nothing held.
 * On the shared Alpaca subsets (max_len 512, one split) this leaves 1.28–1.58 % padding,
 * against 1.06–1.94 % for best-fit-decreasing over the whole split (tokens_build(), the
 * former packer) and 3.28–4.23 % for first-fit in input order
 * (tests/bench/pack_efficiency.py; docs/design.md, "Packing that streams"). */
#define TOKENS_PACK_BATCH 512
#define TOKENS_PACK_WINDOW 256

typedef struct tokens_spill tokens_spill_t;
tokens_spill_t *tokens_spill_new(const char *dir);
/* Appends a row: used tokens of ids/mask, then padding (pad_id, mask 0) up to row_len; its
 * n samples have the given lengths and record indices. */
int tokens_spill_row(tokens_spill_t *s, const int32_t *ids, const uint8_t *mask, int64_t used, int64_t row_len,
                     int n, const int64_t *lens, const int64_t *records, int32_t pad);
int64_t tokens_spill_rows(const tokens_spill_t *s);
int64_t tokens_spill_tokens(const tokens_spill_t *s);
int tokens_spill_write(tokens_spill_t *s, hid_t file, const char *group, int64_t r0, int64_t r1,
                       const h5w_opts_t *o, uint64_t sums[7]);
void tokens_spill_free(tokens_spill_t *s);

typedef struct tokens_packer tokens_packer_t;
tokens_packer_t *tokens_packer_new(int packed, int64_t max_len, int32_t pad_id, tokens_spill_t *out);
/* Copies the sample (the caller may reuse its buffers at once). */
int tokens_packer_add(tokens_packer_t *p, const tokens_sample_t *s);
/* Places what is pending and writes every open row. */
int tokens_packer_finish(tokens_packer_t *p);
void tokens_packer_free(tokens_packer_t *p);

/* Rows [r0, r1) of s as a split of its own (offsets rebased). */
int tokens_slice(const tokens_split_t *s, int64_t r0, int64_t r1, tokens_split_t *out);

#define TOKENS_N_DATASETS 7

/* Writes group `group` with its datasets and attributes. Checksums of the datasets, in
 * the order of the layout above, go to sums (for the set hash). */
int tokens_write_split(hid_t file, const char *group, const tokens_split_t *s, const h5w_opts_t *o,
                       uint64_t sums[TOKENS_N_DATASETS]);
int tokens_read_split(hid_t file, const char *group, tokens_split_t *s);
/* Zeroes s and allocates its arrays for the given sizes (contents uninitialised, counts
 * set); 0, or -1 with "out of memory" (s then empty). */
int tokens_split_alloc(tokens_split_t *s, int64_t n_tokens, int64_t n_rows, int64_t n_samples);
void tokens_split_free(tokens_split_t *s);

/* Checks the invariants above. Returns 0 when they hold, 1 when not (ftk_err_msg()
 * names the dataset and the first offending element). */
int tokens_check_split(const tokens_split_t *s, int64_t vocab_size, int64_t max_len, int packed, int32_t pad_id);

/* Rows [first_row, first_row + n_rows) of a split, read from its file in part
 * (tokens_set.h): row_offsets and row_samples hold entries first_row .. first_row + n_rows,
 * in the file's numbering; tokens and loss_mask hold the file's tokens from
 * row_offsets[0] to row_offsets[n_rows], the sample_* arrays its samples from
 * row_samples[0] to row_samples[n_rows]. tokens NULL: the index alone is checked. */
typedef struct {
    const int32_t *tokens;
    const uint8_t *loss_mask;
    const int64_t *row_offsets, *row_samples;
    const int64_t *sample_starts, *sample_lengths, *sample_record;
    int64_t first_row, n_rows;
} tokens_rows_t;

/* The invariants above that concern those rows (where the split starts and ends is the
 * caller's to check): 0, or 1 with ftk_err_msg() naming the dataset and the first
 * offending element by its index in the file. The caller guarantees that the arrays hold
 * what the index says (row_offsets[n_rows] - row_offsets[0] tokens, …) once the index
 * itself has passed (the index is checked before anything is read through it). */
int tokens_check_rows(const tokens_rows_t *v, int64_t vocab_size, int64_t max_len, int packed, int32_t pad_id);

/* The set hash from each shard's dataset checksums: sums[shard][split * TOKENS_N_DATASETS + k]
 * (split 0 = train, 1 = val). */
uint64_t tokens_set_hash(const uint64_t (*sums)[2 * TOKENS_N_DATASETS], int n_shards);

/* Dataset names of a split, in layout order. */
extern const char *const tokens_dataset_names[TOKENS_N_DATASETS];
/* The memory type of dataset j (layout order): the type the layout gives it, which readers
 * check the file's against (h5r_check_type). */
hid_t tokens_dataset_type(int j);

#endif
