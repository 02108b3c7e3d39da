/* tokenizer_internal.h — what the tokenizer's loaders (tokenizer_load.c: SentencePiece
 * model, tokenizer.json, llama2.c tokenizer.bin) and its codec (tokenizer.c: tables, BPE
 * encoding, decoding) share: the model struct and the functions that build it. Not API
 * (that is tokenizer.h): only formats/tokenizer*.c include it.
 *
 * A loader makes a model with tok_new() (SentencePiece defaults: no BOS/EOS/UNK, dummy
 * prefix, whitespace removal and escaping on), appends the pieces with tok_add_piece() so
 * that piece k has id k, sets n_vocab and the fields its format gives, calls
 * tok_build_tables() and then, when the format lists its merges (tokenizer.json), adds
 * them with tok_pair_insert(). On failure it releases the model with tok_free().
 * Functions returning int give 0, or -1 with ftk_err_msg() set; tok_new() gives NULL.
 */
#ifndef FTK_TOKENIZER_INTERNAL_H
#define FTK_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../libcommon/hash.h"
#include "tokenizer.h"

enum { PT_NORMAL = 1, PT_UNKNOWN = 2, PT_CONTROL = 3, PT_USER_DEFINED = 4, PT_UNUSED = 5, PT_BYTE = 6 };

#define SPACE_SYM "\xE2\x96\x81" /* U+2581 "▁" */

typedef struct {
    uint32_t off, len; /* in pool */
    float score;
    uint8_t type;
} piece_t;

typedef struct {
    uint64_t key; /* left << 32 | right; 0 = empty (pairs of ids 0,0 never merge) */
    float score;  /* higher merges first */
    int32_t merged;
} pair_t;

struct tok {
    const char *format;
    int n_vocab;   /* real ids: 0..n_vocab-1 */
    int n_sym;     /* plus "virtual" characters that occur inside pieces but are not pieces */
    piece_t *pieces;
    size_t pieces_cap;
    char *pool;
    size_t pool_len, pool_cap;
    /* piece string -> symbol id, for the pieces that text may turn into */
    uint32_t *map; /* id + 1; 0 = empty */
    size_t map_cap;
    pair_t *pairs;
    size_t pair_cap, n_pairs;
    int32_t ascii_sym[128]; /* -1: not a piece */
    int32_t space_sym;
    int32_t byte_id[256]; /* -1: none */
    int byte_fallback, fuse_unk, ignore_merges;
    /* No piece has "▁" right after another character: a merge never crosses the point
     * before a "▁" that follows a non-"▁" symbol, so such word segments can be merged
     * independently, and cached. */
    int split_words;
    int bos, eos, unk;
    int add_dummy_prefix, remove_extra_ws, escape_ws;
    char unk_surface[64];
};

static inline size_t tok_str_hash(const char *s, size_t n) { return (size_t)hash_bytes(s, n); }

static inline const char *tok_piece_str(const tok_t *t, int id) { return t->pool + t->pieces[id].off; }

static inline int tok_map_find(const tok_t *t, const char *s, size_t n)
{
    size_t mask = t->map_cap - 1, h = tok_str_hash(s, n) & mask;
    for (;;) {
        uint32_t v = t->map[h];
        if (!v)
            return -1;
        const piece_t *p = &t->pieces[v - 1];
        if (p->len == n && memcmp(t->pool + p->off, s, n) == 0)
            return (int)(v - 1);
        h = (h + 1) & mask;
    }
}

/* Grows *p (of *cap elements of elem bytes) to hold at least need elements. */
int tok_grow(void **p, size_t *cap, size_t need, size_t elem);

tok_t *tok_new(const char *format);
/* Appends a piece (id t->n_sym); s is copied. Pieces are at most 0xFFFF bytes. */
int tok_add_piece(tok_t *t, const char *s, size_t n, float score, int type);
/* 1 when s[0..n) is a byte piece "<0xAB>" (*value = 0xAB), else 0. */
int tok_is_byte_piece(const char *s, size_t n, int *value);
/* Builds the lookup tables once the pieces (ids 0..n_vocab-1) are known; with
 * derive_pairs the merges come from the pieces (SentencePiece BPE). */
int tok_build_tables(tok_t *t, int derive_pairs);
/* Adds the merge l + r -> merged; higher scores merge first; a pair already present keeps
 * its first entry. */
int tok_pair_insert(tok_t *t, int32_t l, int32_t r, float score, int32_t merged);

#endif
