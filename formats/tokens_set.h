/* tokens_set.h — reading token data (tokens.h) as a set: one file of `ftk-pack`, or the
 * shards of one `ftk-pack --shards N`, seen as one sequence of rows per split, read a few
 * rows at a time.
 *
 * ## Naming a set
 * A path is, in this order:
 *   - a tokens file with shard_count 1: the set of that one file;
 *   - a tokens file BASE-0000i-of-0000N.h5 (shard_count N > 1): the set of the N files
 *     BASE-00001-of-0000N.h5 … BASE-0000N-of-0000N.h5 (the same directory);
 *   - a path that is no file: BASE (with or without ".h5", as given to ftk-pack -o) when
 *     files BASE-?????-of-0000N.h5 exist for exactly one N.
 * Refused, naming the file: a shard missing; an extra one (BASE-0000k-of-0000N.h5 with k
 * outside 1..N); a shard whose attributes say another index or count than its name; a
 * shard of another pack (another tokenizer_xxh3, vocab_size, bos/eos/pad id, template,
 * mask_prompt, max_len, packed, or set_xxh3 than shard 1); shards whose datasets are not
 * the ones the set checksum was made from (set_xxh3 recomputed from every shard's dataset
 * checksum attributes, tokens_set_hash()); a base naming several sets (several N).
 *
 * ## Rows
 * Global row g of a split is row g - first(k) of shard k, where first(k) counts the rows
 * of that split in shards 1..k-1: the order ftk-pack wrote them in. A 1-file pack and an
 * N-shard pack of the same records (same options) have the same global rows in the same
 * order; they differ only in set_xxh3.
 *
 * ## Memory (the bound)
 * Held from open to close: per shard, its file name and, per split, row_offsets and
 * row_samples (the row index: 16 bytes per row of the set, both splits); no token, mask
 * or sample array. At most TOKENS_SET_OPEN_MAX shard files are open at a time (least
 * recently used closed first), each with the 5 datasets a row read touches per split;
 * in a compressed set, HDF5 caches at most one 1 MiB chunk of each sample array (6 MiB
 * per open file, 48 MiB at most; none for tokens and masks, whose random rows would not
 * hit it; an uncompressed set has no chunk cache). tokens_set_read() allocates exactly
 * the rows asked for; tokens_set_check() reads blocks of about TOKENS_SET_BLOCK_TOKENS
 * tokens (5 MiB).
 * Cost (page cache, a busy 2-core machine): a random row of 512 tokens, 27 µs in a
 * 1k-record Alpaca pack (1.1 ms with --compress zstd: a chunk of tokens and one of masks
 * decompressed per row), 160 µs in a 3 GB set; tokens_set_check() over a 3 GB set
 * (1.17 M rows, 600 M tokens): 2.0 s, in 36 MB of RSS for the whole process.
 *
 * ## Trust
 * tokens_set_open() checks each shard's attributes and its row index (offsets start at 0,
 * never decrease, end at the dataset lengths; rows no longer than max_len, …) before
 * anything is read through it. The contents (ids in the vocabulary, masks, samples inside
 * their rows, padding) are checked by tokens_set_check() (a streaming pass over rows, in
 * blocks) and again by tokens_set_read() on every row it returns: a file changed after
 * open cannot put an id past the vocabulary into a batch.
 *
 * Functions return 0 / a pointer, or -1 / NULL with ftk_err_msg() naming the file (and the
 * dataset and the first offending element, by its index in that file).
 */
#ifndef FTK_TOKENS_SET_H
#define FTK_TOKENS_SET_H

#include <stdint.h>

#include "tokens.h"

#define TOKENS_SET_OPEN_MAX 8
#define TOKENS_SET_BLOCK_TOKENS ((int64_t)1 << 20)

enum { TOKENS_TRAIN = 0, TOKENS_VAL = 1 };
extern const char *const tokens_split_names[2]; /* "train", "val" */

typedef struct tokens_set tokens_set_t;

/* What the set's files agree on, and its totals. */
typedef struct {
    int n_shards;
    int64_t vocab_size, max_len, pad_id, packed;
    int64_t mask_prompt; /* 1: targets are the responses only; 0: every token; -1: not recorded */
    char set_xxh3[17], tokenizer_xxh3[17];
    int64_t rows[2], tokens[2], samples[2]; /* per split, whole set */
} tokens_set_info_t;

/* The files of the set that path names (above), in shard order: *names is a malloc'd
 * array of *n malloc'd strings (tokens_set_free_names). Checks names and the index and
 * count attributes only. Returns 0, -1 (a set that is not whole or not well named), or
 * -2 when path is no file and no set has that base name. */
int tokens_set_files(const char *path, char ***names, int *n);
void tokens_set_free_names(char **names, int n);

/* Opens the set that path names and checks it (Naming, Trust above). */
tokens_set_t *tokens_set_open(const char *path);
void tokens_set_close(tokens_set_t *s);

const tokens_set_info_t *tokens_set_info(const tokens_set_t *s);
const char *tokens_set_shard_path(const tokens_set_t *s, int k);  /* k: 0-based */
int64_t tokens_set_shard_rows(const tokens_set_t *s, int k, int split);

/* The most segments k rows of split can make into one micro-batch (engine/loader.h
 * batch_add_rows: a segment per sample, and a packed row's padding), from the row index;
 * at least 1 (a pass with no rows has one segment). */
int64_t tokens_set_max_segments(const tokens_set_t *s, int split, int64_t k);

/* Checks the contents of global rows [r0, r1) of split (a streaming pass, blocks of
 * about TOKENS_SET_BLOCK_TOKENS tokens). Returns 0, 1 when an invariant does not hold,
 * -1 when a read failed; ftk_err_msg() names the shard file, the dataset and the element. */
int tokens_set_check(tokens_set_t *s, int split, int64_t r0, int64_t r1);

/* Global rows rows[0..k) of split, in that order, as a split of their own in *out (offsets
 * rebased; freed with tokens_split_free), every row checked. Consecutive rows of one shard
 * are read together. */
int tokens_set_read(tokens_set_t *s, int split, const int64_t *rows, int64_t k, tokens_split_t *out);

#endif
