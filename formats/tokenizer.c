#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/utf8.h"
#include "json.h"

enum { PT_NORMAL = 1, PT_UNKNOWN = 2, PT_CONTROL = 3, PT_USER_DEFINED = 4, PT_UNUSED = 5, PT_BYTE = 6 };

#define SPACE_SYM "\xE2\x96\x81" /* U+2581 "▁" */
#define MAX_TEXT (1u << 30)

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

typedef struct {
    int32_t id; /* symbol id, or -1 for a character that is no piece */
    int32_t prev, next;
    uint32_t start, len; /* bytes in the normalized text; len 0 = merged away */
} sym_t;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t len; /* len of left + right when pushed; a changed symbol invalidates it */
    int32_t merged;
} cand_t;

/* Per-workspace cache of word segments -> ids (cleared when full). */
typedef struct {
    uint64_t h;
    uint32_t key_off, key_len, ids_off, ids_n;
} cache_ent_t;
#define CACHE_SLOTS (1u << 15)
#define CACHE_MAX_WORD 64

struct tok_ws {
    cache_ent_t *cache;
    uint32_t cache_used;
    char *ckeys;
    size_t ckeys_len, ckeys_cap;
    int32_t *cids;
    size_t cids_len, cids_cap;
    const tok_t *cache_owner;
    char *norm;
    size_t norm_cap;
    sym_t *sym;
    size_t sym_cap;
    cand_t *heap;
    size_t heap_n, heap_cap;
};

/* ---------------------------------------------------------------- vectors */

int tok_ids_push(tok_ids_t *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) {
            ftk_err_set("out of memory");
            return -1;
        }
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

void tok_ids_free(tok_ids_t *ids)
{
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *n = realloc(*p, c * elem);
    if (!n) {
        ftk_err_set("out of memory");
        return -1;
    }
    *p = n;
    *cap = c;
    return 0;
}

/* ---------------------------------------------------------------- tables */

static size_t str_hash(const char *s, size_t n) { return (size_t)hash_bytes(s, n); }

static const char *piece_str(const tok_t *t, int id) { return t->pool + t->pieces[id].off; }

static int map_find(const tok_t *t, const char *s, size_t n)
{
    size_t mask = t->map_cap - 1, h = str_hash(s, n) & mask;
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

/* Inserts id under its piece string unless the string is already there. */
static void map_insert(tok_t *t, int id)
{
    const piece_t *p = &t->pieces[id];
    size_t mask = t->map_cap - 1, h = str_hash(t->pool + p->off, p->len) & mask;
    while (t->map[h]) {
        const piece_t *q = &t->pieces[t->map[h] - 1];
        if (q->len == p->len && memcmp(t->pool + q->off, t->pool + p->off, p->len) == 0)
            return;
        h = (h + 1) & mask;
    }
    t->map[h] = (uint32_t)id + 1;
}

static size_t pair_slot(const tok_t *t, uint64_t key)
{
    /* splitmix64's finalizer: both ids reach every bit of the slot index */
    key ^= key >> 30;
    key *= 0xBF58476D1CE4E5B9ull;
    key ^= key >> 27;
    key *= 0x94D049BB133111EBull;
    key ^= key >> 31;
    return (size_t)key & (t->pair_cap - 1);
}

static const pair_t *pair_find(const tok_t *t, int32_t l, int32_t r)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t mask = t->pair_cap - 1, h = pair_slot(t, key);
    for (;;) {
        const pair_t *e = &t->pairs[h];
        if (e->merged < 0)
            return NULL;
        if (e->key == key)
            return e;
        h = (h + 1) & mask;
    }
}

static int pair_insert(tok_t *t, int32_t l, int32_t r, float score, int32_t merged)
{
    if ((t->n_pairs + 1) * 2 > t->pair_cap) {
        size_t ncap = t->pair_cap * 2;
        pair_t *old = t->pairs;
        size_t ocap = t->pair_cap;
        t->pairs = malloc(ncap * sizeof *t->pairs);
        if (!t->pairs) {
            t->pairs = old;
            ftk_err_set("out of memory");
            return -1;
        }
        t->pair_cap = ncap;
        for (size_t i = 0; i < ncap; i++)
            t->pairs[i] = (pair_t){0, 0, -1};
        t->n_pairs = 0;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].merged >= 0)
                pair_insert(t, (int32_t)(old[i].key >> 32), (int32_t)(uint32_t)old[i].key, old[i].score,
                            old[i].merged);
        free(old);
    }
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t mask = t->pair_cap - 1, h = pair_slot(t, key);
    while (t->pairs[h].merged >= 0) {
        if (t->pairs[h].key == key) {
            /* the same pair twice (tokenizer.json): the first, higher-priority one stays */
            return 0;
        }
        h = (h + 1) & mask;
    }
    t->pairs[h] = (pair_t){key, score, merged};
    t->n_pairs++;
    return 0;
}

static int add_piece(tok_t *t, const char *s, size_t n, float score, int type)
{
    if (n > 0xFFFF) {
        ftk_err_set("piece %d is %zu bytes long", t->n_sym, n);
        return -1;
    }
    if (grow((void **)&t->pool, &t->pool_cap, t->pool_len + n + 1, 1) < 0 ||
        grow((void **)&t->pieces, &t->pieces_cap, (size_t)t->n_sym + 1, sizeof *t->pieces) < 0)
        return -1;
    memcpy(t->pool + t->pool_len, s, n);
    t->pool[t->pool_len + n] = 0;
    t->pieces[t->n_sym] = (piece_t){(uint32_t)t->pool_len, (uint32_t)n, score, (uint8_t)type};
    t->pool_len += n + 1;
    t->n_sym++;
    return 0;
}

static int is_byte_piece(const char *s, size_t n, int *value)
{
    /* "<0xAB>" */
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return 0;
        v = v * 16 + d;
    }
    *value = v;
    return 1;
}

/* Builds the lookup tables once the pieces (ids 0..n_vocab-1) are known. `mergeable`
 * says which types text can turn into (SentencePiece: NORMAL only, as USER_DEFINED and
 * UNUSED are refused; tokenizer.json: every vocabulary entry). With derive_pairs, every
 * split of a mergeable piece into two symbols becomes a merge with the piece's score
 * (SentencePiece BPE); otherwise the caller adds the merges (tokenizer.json). */
static int build_tables(tok_t *t, int derive_pairs)
{
    t->map_cap = 64;
    while (t->map_cap < (size_t)t->n_vocab * 4 + 1024)
        t->map_cap *= 2;
    t->map = calloc(t->map_cap, sizeof *t->map);
    if (!t->map) {
        ftk_err_set("out of memory");
        return -1;
    }
    t->pair_cap = 1024;
    t->pairs = malloc(t->pair_cap * sizeof *t->pairs);
    if (!t->pairs) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (size_t i = 0; i < t->pair_cap; i++)
        t->pairs[i] = (pair_t){0, 0, -1};
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = -1;
    for (int i = 0; i < t->n_vocab; i++) {
        piece_t *p = &t->pieces[i];
        int b;
        if (p->type == PT_BYTE && is_byte_piece(piece_str(t, i), p->len, &b)) {
            if (t->byte_id[b] < 0)
                t->byte_id[b] = i;
            continue;
        }
        if (p->type == PT_NORMAL)
            map_insert(t, i);
    }
    /* Characters inside pieces that are not pieces themselves still take part in merges
     * (SentencePiece looks up concatenations, not ids): give them virtual ids. */
    int n_real = t->n_vocab;
    for (int i = 0; i < n_real; i++) {
        if (t->pieces[i].type != PT_NORMAL)
            continue;
        uint32_t off = t->pieces[i].off, len = t->pieces[i].len;
        for (uint32_t k = 0; k < len;) {
            uint32_t cp;
            int l = utf8_decode((const unsigned char *)t->pool + off + k, len - k, &cp);
            if (!l)
                l = 1;
            if (map_find(t, t->pool + off + k, (size_t)l) < 0) {
                char ch[4];
                memcpy(ch, t->pool + off + k, (size_t)l);
                if (add_piece(t, ch, (size_t)l, 0, PT_NORMAL) < 0)
                    return -1;
                off = t->pieces[i].off; /* pool may have moved; offsets did not */
                map_insert(t, t->n_sym - 1);
            }
            k += (uint32_t)l;
        }
    }
    if (derive_pairs) {
        for (int i = 0; i < n_real; i++) {
            const piece_t *p = &t->pieces[i];
            if (p->type != PT_NORMAL)
                continue;
            const char *s = piece_str(t, i);
            for (uint32_t k = 0; k < p->len;) {
                uint32_t cp;
                int l = utf8_decode((const unsigned char *)s + k, p->len - k, &cp);
                k += l ? (uint32_t)l : 1;
                if (k >= p->len)
                    break;
                int a = map_find(t, s, k), b = map_find(t, s + k, p->len - k);
                if (a >= 0 && b >= 0 && pair_insert(t, a, b, p->score, i) < 0)
                    return -1;
                s = piece_str(t, i);
            }
        }
    }
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        t->ascii_sym[c] = map_find(t, &ch, 1);
    }
    t->space_sym = map_find(t, SPACE_SYM, 3);
    t->split_words = t->escape_ws && !t->ignore_merges;
    for (int i = 0; i < n_real && t->split_words; i++) {
        const char *s = piece_str(t, i);
        uint32_t len = t->pieces[i].len;
        if (t->pieces[i].type != PT_NORMAL)
            continue;
        for (uint32_t k = 1; k + 3 <= len; k++)
            if (memcmp(s + k, SPACE_SYM, 3) == 0 && !(k >= 3 && memcmp(s + k - 3, SPACE_SYM, 3) == 0)) {
                t->split_words = 0;
                break;
            }
    }
    return 0;
}

static tok_t *tok_new(const char *format)
{
    tok_t *t = calloc(1, sizeof *t);
    if (!t) {
        ftk_err_set("out of memory");
        return NULL;
    }
    t->format = format;
    t->bos = t->eos = t->unk = -1;
    t->add_dummy_prefix = t->remove_extra_ws = t->escape_ws = 1;
    strcpy(t->unk_surface, " \xE2\x81\x87 ");
    return t;
}

void tok_free(tok_t *t)
{
    if (!t)
        return;
    free(t->pieces);
    free(t->pool);
    free(t->map);
    free(t->pairs);
    free(t);
}

/* ---------------------------------------------------------------- protobuf */

typedef struct {
    const unsigned char *p, *end;
} pb_t;

static int pb_varint(pb_t *b, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end)
            return -1;
        unsigned char c = *b->p++;
        x |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Reads one field header and value. For wire type 2, *sub is the payload. */
static int pb_field(pb_t *b, uint32_t *field, int *wt, uint64_t *v, pb_t *sub)
{
    uint64_t key;
    if (pb_varint(b, &key) < 0)
        return -1;
    *field = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0:
        return pb_varint(b, v);
    case 1:
        if (b->end - b->p < 8)
            return -1;
        memcpy(v, b->p, 8);
        b->p += 8;
        return 0;
    case 2:
        if (pb_varint(b, v) < 0 || *v > (uint64_t)(b->end - b->p))
            return -1;
        sub->p = b->p;
        sub->end = b->p + *v;
        b->p += *v;
        return 0;
    case 5: {
        uint32_t x;
        if (b->end - b->p < 4)
            return -1;
        memcpy(&x, b->p, 4);
        b->p += 4;
        *v = x;
        return 0;
    }
    default:
        return -1;
    }
}

static tok_t *load_sentencepiece(const char *data, size_t len, const char *name)
{
    tok_t *t = tok_new("sentencepiece");
    if (!t)
        return NULL;
    pb_t b = {(const unsigned char *)data, (const unsigned char *)data + len};
    int model_type = 1, suffix = 0; /* proto2 default: UNIGRAM */
    int unk_id = 0, bos_id = 1, eos_id = 2;
    char norm_name[64] = "";
    size_t charsmap_len = 0;
    while (b.p < b.end) {
        uint32_t f;
        int wt;
        uint64_t v;
        pb_t sub;
        if (pb_field(&b, &f, &wt, &v, &sub) < 0)
            goto bad;
        if (f == 1 && wt == 2) {
            const char *s = "";
            size_t sl = 0;
            float score = 0;
            int type = PT_NORMAL;
            while (sub.p < sub.end) {
                uint32_t g;
                int w2;
                uint64_t x;
                pb_t s2;
                if (pb_field(&sub, &g, &w2, &x, &s2) < 0)
                    goto bad;
                if (g == 1 && w2 == 2) {
                    s = (const char *)s2.p;
                    sl = (size_t)(s2.end - s2.p);
                } else if (g == 2 && w2 == 5) {
                    uint32_t u = (uint32_t)x;
                    memcpy(&score, &u, 4);
                } else if (g == 3 && w2 == 0) {
                    type = (int)x;
                }
            }
            if (type == PT_USER_DEFINED || type == PT_UNUSED) {
                ftk_err_set("%s: piece %d ('%.*s') is %s, which ftk does not support", name, t->n_sym,
                            (int)(sl > 40 ? 40 : sl), s, type == PT_UNUSED ? "UNUSED" : "USER_DEFINED");
                goto fail;
            }
            if (type < PT_NORMAL || type > PT_BYTE) {
                ftk_err_set("%s: piece %d has unknown type %d", name, t->n_sym, type);
                goto fail;
            }
            if (add_piece(t, s, sl, score, type) < 0)
                goto fail;
        } else if (f == 2 && wt == 2) {
            while (sub.p < sub.end) {
                uint32_t g;
                int w2;
                uint64_t x;
                pb_t s2;
                if (pb_field(&sub, &g, &w2, &x, &s2) < 0)
                    goto bad;
                if (w2 == 0) {
                    if (g == 3)
                        model_type = (int)x;
                    else if (g == 24)
                        suffix = x != 0;
                    else if (g == 35)
                        t->byte_fallback = x != 0;
                    else if (g == 40)
                        unk_id = (int32_t)x;
                    else if (g == 41)
                        bos_id = (int32_t)x;
                    else if (g == 42)
                        eos_id = (int32_t)x;
                } else if (w2 == 2 && g == 44) {
                    size_t n = (size_t)(s2.end - s2.p);
                    if (n >= sizeof t->unk_surface)
                        n = sizeof t->unk_surface - 1;
                    memcpy(t->unk_surface, s2.p, n);
                    t->unk_surface[n] = 0;
                }
            }
        } else if (f == 3 && wt == 2) {
            while (sub.p < sub.end) {
                uint32_t g;
                int w2;
                uint64_t x;
                pb_t s2;
                if (pb_field(&sub, &g, &w2, &x, &s2) < 0)
                    goto bad;
                if (g == 1 && w2 == 2) {
                    size_t n = (size_t)(s2.end - s2.p);
                    if (n >= sizeof norm_name)
                        n = sizeof norm_name - 1;
                    memcpy(norm_name, s2.p, n);
                    norm_name[n] = 0;
                } else if (g == 2 && w2 == 2) {
                    charsmap_len = (size_t)(s2.end - s2.p);
                } else if (w2 == 0 && g == 3) {
                    t->add_dummy_prefix = x != 0;
                } else if (w2 == 0 && g == 4) {
                    t->remove_extra_ws = x != 0;
                } else if (w2 == 0 && g == 5) {
                    t->escape_ws = x != 0;
                }
            }
        }
    }
    t->n_vocab = t->n_sym;
    if (t->n_vocab == 0) {
        ftk_err_set("%s: no pieces: not a SentencePiece model", name);
        goto fail;
    }
    if (model_type != 2) {
        ftk_err_set("%s: model_type %d (%s) is not supported; ftk reads BPE SentencePiece models (Llama)", name,
                    model_type, model_type == 1 ? "UNIGRAM" : model_type == 3 ? "WORD" : "CHAR");
        goto fail;
    }
    if (suffix) {
        ftk_err_set("%s: treat_whitespace_as_suffix is not supported", name);
        goto fail;
    }
    if (charsmap_len) {
        ftk_err_set("%s: normalization '%s' is not supported; ftk implements identity normalization (Llama 2)",
                    name, norm_name[0] ? norm_name : "?");
        goto fail;
    }
    t->unk = unk_id >= 0 && unk_id < t->n_vocab ? unk_id : -1;
    t->bos = bos_id >= 0 && bos_id < t->n_vocab ? bos_id : -1;
    t->eos = eos_id >= 0 && eos_id < t->n_vocab ? eos_id : -1;
    if (build_tables(t, 1) < 0)
        goto fail;
    if (t->byte_fallback)
        for (int i = 0; i < 256; i++)
            if (t->byte_id[i] < 0) {
                ftk_err_set("%s: byte_fallback is on but piece <0x%02X> is missing", name, i);
                goto fail;
            }
    return t;
bad:
    ftk_err_set("%s: malformed protobuf: not a SentencePiece model", name);
fail:
    tok_free(t);
    return NULL;
}

/* ---------------------------------------------------------------- llama2.c tokenizer.bin */

/* llama2.c's export of a SentencePiece BPE model: int32 max_token_length, then per id
 * float32 score, int32 length, that many bytes; "▁" written as ' ', BOS/EOS written as
 * "\n<s>\n" / "\n</s>\n". Read back into the SentencePiece model it came from: identity
 * normalization with the dummy prefix, no whitespace removal (run.c's encoder), byte
 * fallback when all 256 <0xXX> pieces are there. */
static tok_t *load_llama2c(const char *data, size_t len, const char *name)
{
    tok_t *t = tok_new("llama2.c");
    char *tmp = NULL;
    if (!t)
        return NULL;
    size_t p = 4;
    if (len < 4)
        goto bad;
    while (p < len) {
        float score;
        int32_t n;
        if (len - p < 8)
            goto bad;
        memcpy(&score, data + p, 4);
        memcpy(&n, data + p + 4, 4);
        p += 8;
        if (n < 0 || (size_t)n > len - p)
            goto bad;
        const char *s = data + p;
        p += (size_t)n;
        int id = t->n_sym, type = PT_NORMAL, v;
        if (id == 0)
            type = PT_UNKNOWN;
        else if ((id == 1 && n == 5 && !memcmp(s, "\n<s>\n", 5)) || (id == 2 && n == 6 && !memcmp(s, "\n</s>\n", 6))) {
            type = PT_CONTROL;
            s = id == 1 ? "<s>" : "</s>";
            n = id == 1 ? 3 : 4;
        } else if (is_byte_piece(s, (size_t)n, &v))
            type = PT_BYTE;
        char *q = realloc(tmp, (size_t)n * 3 + 1);
        if (!q) {
            ftk_err_set("out of memory");
            goto fail;
        }
        tmp = q;
        size_t k = 0;
        for (int32_t i = 0; i < n; i++) {
            if (s[i] == ' ' && type == PT_NORMAL) {
                memcpy(tmp + k, "\xE2\x96\x81", 3);
                k += 3;
            } else {
                tmp[k++] = s[i];
            }
        }
        if (add_piece(t, tmp, k, score, type) < 0)
            goto fail;
    }
    free(tmp);
    tmp = NULL;
    t->n_vocab = t->n_sym;
    if (t->n_vocab < 3)
        goto bad;
    t->unk = 0;
    t->bos = 1;
    t->eos = 2;
    t->remove_extra_ws = 0;
    if (build_tables(t, 1) < 0)
        goto fail;
    t->byte_fallback = 1;
    for (int i = 0; i < 256; i++)
        if (t->byte_id[i] < 0)
            t->byte_fallback = 0;
    return t;
bad:
    ftk_err_set("%s: not a llama2.c tokenizer.bin (truncated or malformed entry near byte %zu)", name, p);
fail:
    free(tmp);
    tok_free(t);
    return NULL;
}

/* ---------------------------------------------------------------- tokenizer.json */

static int json_is(const json_value_t *v, const char *s)
{
    return v && v->type == JSON_STRING && strcmp(v->u.str.s, s) == 0;
}

static int check_normalizer(tok_t *t, const json_value_t *n, const char *where)
{
    if (!n || n->type == JSON_NULL)
        return 0;
    const json_value_t *type = json_get(n, "type");
    if (json_is(type, "Sequence")) {
        const json_value_t *list = json_get(n, "normalizers");
        if (!list || list->type != JSON_ARRAY) {
            ftk_err_set("%s.normalizers: expected an array", where);
            return -1;
        }
        for (size_t i = 0; i < list->u.arr.n; i++) {
            char w[128];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
            if (check_normalizer(t, &list->u.arr.items[i], w) < 0)
                return -1;
        }
        return 0;
    }
    if (json_is(type, "Prepend") && json_is(json_get(n, "prepend"), SPACE_SYM)) {
        t->add_dummy_prefix = 1;
        return 0;
    }
    if (json_is(type, "Replace")) {
        const json_value_t *pat = json_get(json_get(n, "pattern"), "String");
        if (json_is(pat, " ") && json_is(json_get(n, "content"), SPACE_SYM)) {
            t->escape_ws = 1;
            return 0;
        }
    }
    ftk_err_set("%s: normalizer of type %s is not supported (ftk reads SentencePiece-style BPE: Prepend and "
                "Replace of \" \" by \"\xE2\x96\x81\")",
                where, type && type->type == JSON_STRING ? type->u.str.s : "?");
    return -1;
}

static int check_pre_tokenizer(tok_t *t, const json_value_t *n)
{
    if (!n || n->type == JSON_NULL)
        return 0;
    const json_value_t *type = json_get(n, "type");
    if (json_is(type, "Metaspace") && json_is(json_get(n, "replacement"), SPACE_SYM)) {
        const json_value_t *split = json_get(n, "split");
        if (split && !(split->type == JSON_BOOL && !split->u.boolean)) {
            ftk_err_set("pre_tokenizer: Metaspace with split=true is not supported");
            return -1;
        }
        const json_value_t *scheme = json_get(n, "prepend_scheme"), *aps = json_get(n, "add_prefix_space");
        t->escape_ws = 1;
        if (json_is(scheme, "never") || (aps && aps->type == JSON_BOOL && !aps->u.boolean))
            t->add_dummy_prefix = 0;
        else
            t->add_dummy_prefix = 1;
        return 0;
    }
    ftk_err_set("pre_tokenizer: type %s is not supported (ftk reads SentencePiece-style BPE tokenizers)",
                type && type->type == JSON_STRING ? type->u.str.s : "?");
    return -1;
}

/* Ids of a merge's left and right tokens and of their concatenation (-1 where a string
 * is no token); *joined is scratch space for the concatenation. Returns -1 on OOM. */
static int merge_ids(const tok_t *t, const char *a, size_t al, const char *b, size_t bl, char **joined,
                     size_t *jcap, int *l, int *r, int *mm)
{
    if (grow((void **)joined, jcap, al + bl + 1, 1) < 0)
        return -1;
    memcpy(*joined, a, al);
    memcpy(*joined + al, b, bl);
    *l = map_find(t, a, al);
    *r = map_find(t, b, bl);
    *mm = map_find(t, *joined, al + bl);
    return 0;
}

static tok_t *load_tokenizer_json(const char *data, size_t len, const char *name)
{
    json_value_t *root;
    json_doc_t *doc = json_parse(data, len, NULL, &root);
    if (!doc) {
        ftk_err_prefix("%s: ", name);
        return NULL;
    }
    tok_t *t = tok_new("tokenizer.json");
    if (!t)
        goto fail_doc;
    t->add_dummy_prefix = t->remove_extra_ws = t->escape_ws = 0;
    const json_value_t *model = json_get(root, "model");
    if (!model || model->type != JSON_OBJECT) {
        ftk_err_set("%s: no \"model\" object: not a tokenizer.json", name);
        goto fail;
    }
    const json_value_t *mt = json_get(model, "type");
    if (!json_is(mt, "BPE")) {
        ftk_err_set("%s: model.type %s is not supported; ftk reads BPE tokenizers", name,
                    mt && mt->type == JSON_STRING ? mt->u.str.s : "(missing)");
        goto fail;
    }
    static const char *must_be_empty[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_value_t *v = json_get(model, must_be_empty[i]);
        if (v && v->type != JSON_NULL && !(v->type == JSON_STRING && v->u.str.len == 0)) {
            ftk_err_set("%s: model.%s is not supported", name, must_be_empty[i]);
            goto fail;
        }
    }
    const json_value_t *dropout = json_get(model, "dropout");
    if (dropout && dropout->type == JSON_NUMBER && dropout->u.num.v != 0) {
        ftk_err_set("%s: model.dropout is not supported (training-time BPE dropout)", name);
        goto fail;
    }
    const json_value_t *bf = json_get(model, "byte_fallback"), *fu = json_get(model, "fuse_unk"),
                       *im = json_get(model, "ignore_merges");
    t->byte_fallback = bf && bf->type == JSON_BOOL && bf->u.boolean;
    t->fuse_unk = fu && fu->type == JSON_BOOL && fu->u.boolean;
    t->ignore_merges = im && im->type == JSON_BOOL && im->u.boolean;
    if (check_normalizer(t, json_get(root, "normalizer"), "normalizer") < 0 ||
        check_pre_tokenizer(t, json_get(root, "pre_tokenizer")) < 0) {
        ftk_err_prefix("%s: ", name);
        goto fail;
    }

    /* Vocabulary: ids must be exactly 0..n-1. Added tokens may extend it. */
    const json_value_t *vocab = json_get(model, "vocab"), *added = json_get(root, "added_tokens");
    if (!vocab || vocab->type != JSON_OBJECT) {
        ftk_err_set("%s: model.vocab: expected an object", name);
        goto fail;
    }
    size_t nv = vocab->u.obj.n, na = added && added->type == JSON_ARRAY ? added->u.arr.n : 0;
    int64_t max_id = -1;
    for (size_t i = 0; i < nv; i++) {
        int64_t id;
        if (json_get_i64(&vocab->u.obj.members[i].value, &id) < 0 || id < 0 || id > 10000000) {
            ftk_err_set("%s: model.vocab[\"%s\"]: expected an id between 0 and 10^7", name,
                        vocab->u.obj.members[i].key);
            goto fail;
        }
        if (id > max_id)
            max_id = id;
    }
    for (size_t i = 0; i < na; i++) {
        int64_t id;
        if (json_get_i64(json_get(&added->u.arr.items[i], "id"), &id) < 0 || id < 0 || id > 10000000 ||
            !json_get(&added->u.arr.items[i], "content") ||
            json_get(&added->u.arr.items[i], "content")->type != JSON_STRING) {
            ftk_err_set("%s: added_tokens[%zu]: expected \"id\" and \"content\"", name, i);
            goto fail;
        }
        if (id > max_id)
            max_id = id;
    }
    int n = (int)(max_id + 1);
    const char **strs = calloc((size_t)(n > 0 ? n : 1), sizeof *strs);
    size_t *lens = calloc((size_t)(n > 0 ? n : 1), sizeof *lens);
    uint8_t *types = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!strs || !lens || !types) {
        free(strs);
        free(lens);
        free(types);
        ftk_err_set("out of memory");
        goto fail;
    }
    int bad_id = -1;
    for (size_t i = 0; i < nv; i++) {
        int64_t id;
        json_get_i64(&vocab->u.obj.members[i].value, &id);
        if (strs[id] && bad_id < 0)
            bad_id = (int)id;
        strs[id] = vocab->u.obj.members[i].key;
        lens[id] = vocab->u.obj.members[i].key_len;
        int bv;
        types[id] = t->byte_fallback && is_byte_piece(strs[id], lens[id], &bv) ? PT_BYTE : PT_NORMAL;
    }
    for (size_t i = 0; i < na; i++) {
        const json_value_t *a = &added->u.arr.items[i];
        int64_t id;
        json_get_i64(json_get(a, "id"), &id);
        const json_value_t *c = json_get(a, "content"), *sp = json_get(a, "special");
        if (strs[id] && (lens[id] != c->u.str.len || memcmp(strs[id], c->u.str.s, lens[id]) != 0) && bad_id < 0)
            bad_id = (int)id;
        strs[id] = c->u.str.s;
        lens[id] = c->u.str.len;
        if (sp && sp->type == JSON_BOOL && sp->u.boolean)
            types[id] = PT_CONTROL;
        if (strcmp(c->u.str.s, "<s>") == 0)
            t->bos = (int)id;
        else if (strcmp(c->u.str.s, "</s>") == 0)
            t->eos = (int)id;
    }
    for (int i = 0; i < n && bad_id < 0; i++)
        if (!strs[i])
            bad_id = i;
    if (bad_id >= 0) {
        ftk_err_set("%s: vocabulary id %d is missing or given twice; ids must be 0..%d, once each", name, bad_id,
                    n - 1);
        free(strs);
        free(lens);
        free(types);
        goto fail;
    }
    const json_value_t *unk = json_get(model, "unk_token");
    for (int i = 0; i < n; i++) {
        if (unk && unk->type == JSON_STRING && lens[i] == unk->u.str.len && memcmp(strs[i], unk->u.str.s, lens[i]) == 0) {
            t->unk = i;
            types[i] = PT_UNKNOWN;
        }
        if (add_piece(t, strs[i], lens[i], 0, types[i]) < 0) {
            free(strs);
            free(lens);
            free(types);
            goto fail;
        }
    }
    free(strs);
    free(lens);
    free(types);
    t->n_vocab = n;
    if (build_tables(t, 0) < 0)
        goto fail;

    const json_value_t *merges = json_get(model, "merges");
    if (!merges || merges->type != JSON_ARRAY) {
        ftk_err_set("%s: model.merges: expected an array", name);
        goto fail;
    }
    char *joined = NULL;
    size_t jcap = 0;
    for (size_t i = 0; i < merges->u.arr.n; i++) {
        const json_value_t *m = &merges->u.arr.items[i];
        const char *a, *b;
        size_t al, bl;
        int l = -1, r = -1, mm = -1;
        if (m->type == JSON_STRING) {
            /* "left right". Some converted files hold pieces that contain a space (U+00A0
             * turned into U+0020), making the split ambiguous: take the first space at which
             * both halves and their concatenation are tokens. */
            a = m->u.str.s;
            for (const char *sp = memchr(a, ' ', m->u.str.len); sp; sp = memchr(sp + 1, ' ', m->u.str.len - (size_t)(sp + 1 - a))) {
                al = (size_t)(sp - a);
                b = sp + 1;
                bl = m->u.str.len - al - 1;
                if (merge_ids(t, a, al, b, bl, &joined, &jcap, &l, &r, &mm) < 0) {
                    free(joined);
                    goto fail;
                }
                if (l >= 0 && r >= 0 && mm >= 0)
                    break;
                if (sp + 1 >= a + m->u.str.len)
                    break;
            }
        } else if (m->type == JSON_ARRAY && m->u.arr.n == 2 && m->u.arr.items[0].type == JSON_STRING &&
                   m->u.arr.items[1].type == JSON_STRING) {
            a = m->u.arr.items[0].u.str.s;
            al = m->u.arr.items[0].u.str.len;
            b = m->u.arr.items[1].u.str.s;
            bl = m->u.arr.items[1].u.str.len;
            if (merge_ids(t, a, al, b, bl, &joined, &jcap, &l, &r, &mm) < 0) {
                free(joined);
                goto fail;
            }
        } else {
            ftk_err_set("%s: model.merges[%zu]: expected a string or a pair of strings", name, i);
            free(joined);
            goto fail;
        }
        if (l < 0 || r < 0 || mm < 0 || mm >= t->n_vocab) {
            ftk_err_set("%s: model.merges[%zu]: a token of this merge is missing from the vocabulary", name, i);
            free(joined);
            goto fail;
        }
        if (pair_insert(t, l, r, -(float)i, mm) < 0) {
            free(joined);
            goto fail;
        }
    }
    free(joined);
    if (t->byte_fallback)
        for (int i = 0; i < 256; i++)
            if (t->byte_id[i] < 0) {
                ftk_err_set("%s: byte_fallback is on but token <0x%02X> is missing", name, i);
                goto fail;
            }
    json_free(doc);
    return t;
fail:
    tok_free(t);
fail_doc:
    json_free(doc);
    return NULL;
}

/* ---------------------------------------------------------------- loading */

tok_t *tok_load_mem(const char *data, size_t len, const char *name)
{
    size_t i = 0;
    if (len >= 3 && memcmp(data, "\xEF\xBB\xBF", 3) == 0)
        i = 3;
    while (i < len && (data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t'))
        i++;
    if (i < len && data[i] == '{')
        return load_tokenizer_json(data, len, name);
    size_t nl = strlen(name);
    if (nl >= 4 && !strcmp(name + nl - 4, ".bin"))
        return load_llama2c(data, len, name);
    return load_sentencepiece(data, len, name);
}

tok_t *tok_load(const char *path)
{
    buf_t b = {0};
    if (buf_read_file(&b, path) < 0)
        return NULL;
    if (b.len == 0) {
        ftk_err_set("%s: empty file, not a tokenizer", path);
        buf_free(&b);
        return NULL;
    }
    tok_t *t = tok_load_mem(b.data, b.len, path);
    buf_free(&b);
    return t;
}

int tok_vocab_size(const tok_t *t) { return t->n_vocab; }
int tok_bos_id(const tok_t *t) { return t->bos; }
int tok_eos_id(const tok_t *t) { return t->eos; }
int tok_unk_id(const tok_t *t) { return t->unk; }
const char *tok_format(const tok_t *t) { return t->format; }

const char *tok_piece(const tok_t *t, int id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    *len = t->pieces[id].len;
    return piece_str(t, id);
}

/* ---------------------------------------------------------------- encoding */

tok_ws_t *tok_ws_new(void)
{
    tok_ws_t *ws = calloc(1, sizeof *ws);
    if (!ws)
        ftk_err_set("out of memory");
    return ws;
}

void tok_ws_free(tok_ws_t *ws)
{
    if (!ws)
        return;
    free(ws->norm);
    free(ws->sym);
    free(ws->heap);
    free(ws->cache);
    free(ws->ckeys);
    free(ws->cids);
    free(ws);
}

static inline int cand_better(const cand_t *a, const cand_t *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(tok_ws_t *ws, cand_t c)
{
    size_t i = ws->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_better(&c, &ws->heap[parent]))
            break;
        ws->heap[i] = ws->heap[parent];
        i = parent;
    }
    ws->heap[i] = c;
}

static cand_t heap_pop(tok_ws_t *ws)
{
    cand_t top = ws->heap[0], last = ws->heap[--ws->heap_n];
    size_t i = 0, n = ws->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const cand_t *bc = &last;
        if (l < n && cand_better(&ws->heap[l], bc)) {
            best = l;
            bc = &ws->heap[l];
        }
        if (l + 1 < n && cand_better(&ws->heap[l + 1], bc))
            best = l + 1;
        if (best == i)
            break;
        ws->heap[i] = ws->heap[best];
        i = best;
    }
    if (n)
        ws->heap[i] = last;
    return top;
}

static inline void try_pair(const tok_t *t, tok_ws_t *ws, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const sym_t *a = &ws->sym[l], *b = &ws->sym[r];
    if (a->id < 0 || b->id < 0)
        return;
    const pair_t *p = pair_find(t, a->id, b->id);
    if (!p)
        return;
    heap_push(ws, (cand_t){p->score, l, r, a->len + b->len, p->merged});
}

static int emit_symbol(const tok_t *t, const tok_ws_t *ws, const sym_t *s, tok_ids_t *ids, int *prev_unk)
{
    if (s->id >= 0 && s->id < t->n_vocab) {
        *prev_unk = 0;
        return tok_ids_push(ids, s->id);
    }
    if (t->byte_fallback) {
        *prev_unk = 0;
        for (uint32_t k = 0; k < s->len; k++)
            if (tok_ids_push(ids, t->byte_id[(unsigned char)ws->norm[s->start + k]]) < 0)
                return -1;
        return 0;
    }
    if (t->fuse_unk && *prev_unk)
        return 0;
    *prev_unk = 1;
    return tok_ids_push(ids, t->unk >= 0 ? t->unk : 0);
}

/* Merges symbols [a, b) (their prev/next links closed at the ends) and appends the ids. */
static int merge_range(const tok_t *t, tok_ws_t *ws, int32_t a, int32_t b, tok_ids_t *ids)
{
    sym_t *sym = ws->sym;
    sym[a].prev = -1;
    sym[b - 1].next = -1;
    ws->heap_n = 0;
    for (int32_t k = a; k + 1 < b; k++)
        try_pair(t, ws, k, k + 1);
    while (ws->heap_n) {
        cand_t c = heap_pop(ws);
        sym_t *l = &sym[c.left], *r = &sym[c.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != c.len)
            continue; /* stale: one side was merged since */
        l->len += r->len;
        l->id = c.merged;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = c.left;
        r->len = 0;
        try_pair(t, ws, l->prev, c.left);
        try_pair(t, ws, c.left, l->next);
    }
    int prev_unk = 0;
    for (int32_t k = a; k >= 0; k = sym[k].next)
        if (emit_symbol(t, ws, &sym[k], ids, &prev_unk) < 0)
            return -1;
    return 0;
}

/* One word segment [a, b): from the cache, or merged and remembered. */
static int encode_word(const tok_t *t, tok_ws_t *ws, int32_t a, int32_t b, tok_ids_t *ids)
{
    const char *key = ws->norm + ws->sym[a].start;
    uint32_t klen = ws->sym[b - 1].start + ws->sym[b - 1].len - ws->sym[a].start;
    if (klen > CACHE_MAX_WORD || (!t->byte_fallback && t->fuse_unk))
        return merge_range(t, ws, a, b, ids);
    if (!ws->cache || ws->cache_owner != t || ws->cache_used * 2 >= CACHE_SLOTS) {
        if (!ws->cache && !(ws->cache = malloc(CACHE_SLOTS * sizeof *ws->cache))) {
            ftk_err_set("out of memory");
            return -1;
        }
        memset(ws->cache, 0, CACHE_SLOTS * sizeof *ws->cache);
        ws->cache_used = 0;
        ws->ckeys_len = ws->cids_len = 0;
        ws->cache_owner = t;
    }
    uint64_t h = hash_bytes(key, klen) | 1; /* 0 marks an empty slot */
    size_t slot = (size_t)h & (CACHE_SLOTS - 1);
    for (;; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
        cache_ent_t *e = &ws->cache[slot];
        if (e->h == 0)
            break;
        if (e->h == h && e->key_len == klen && memcmp(ws->ckeys + e->key_off, key, klen) == 0) {
            for (uint32_t i = 0; i < e->ids_n; i++)
                if (tok_ids_push(ids, ws->cids[e->ids_off + i]) < 0)
                    return -1;
            return 0;
        }
    }
    size_t before = ids->n;
    if (merge_range(t, ws, a, b, ids) < 0)
        return -1;
    size_t n = ids->n - before;
    if (grow((void **)&ws->ckeys, &ws->ckeys_cap, ws->ckeys_len + klen, 1) < 0 ||
        grow((void **)&ws->cids, &ws->cids_cap, ws->cids_len + n, sizeof *ws->cids) < 0)
        return -1;
    /* key bytes are copied after merging: the normalized text does not change meanwhile */
    memcpy(ws->ckeys + ws->ckeys_len, key, klen);
    memcpy(ws->cids + ws->cids_len, ids->v + before, n * sizeof *ws->cids);
    ws->cache[slot] = (cache_ent_t){h, (uint32_t)ws->ckeys_len, klen, (uint32_t)ws->cids_len, (uint32_t)n};
    ws->ckeys_len += klen;
    ws->cids_len += n;
    ws->cache_used++;
    return 0;
}

int tok_encode(const tok_t *t, tok_ws_t *ws, const char *text, size_t len, tok_ids_t *ids)
{
    if (len == 0)
        return 0;
    if (len > MAX_TEXT) {
        ftk_err_set("text of %zu bytes is too long to tokenize (limit 1 GiB)", len);
        return -1;
    }
    /* Worst case: every byte becomes a 3-byte symbol (▁ or U+FFFD), plus the prefix. */
    size_t need = 3 * len + 4;
    if (grow((void **)&ws->norm, &ws->norm_cap, need, 1) < 0 ||
        grow((void **)&ws->sym, &ws->sym_cap, len + 2, sizeof(sym_t)) < 0 ||
        grow((void **)&ws->heap, &ws->heap_cap, 2 * len + 4, sizeof(cand_t)) < 0)
        return -1;

    const unsigned char *u = (const unsigned char *)text;
    size_t i = 0, o = 0;
    int32_t ns = 0;
    char *norm = ws->norm;
    sym_t *sym = ws->sym;
    if (t->remove_extra_ws) {
        while (i < len && u[i] == ' ')
            i++;
        if (i == len)
            return 0;
    }
#define PUSH_SYM(ID, START, LEN)                                                                         \
    do {                                                                                                 \
        sym[ns] = (sym_t){(ID), ns - 1, ns + 1, (uint32_t)(START), (uint32_t)(LEN)};                   \
        ns++;                                                                                            \
    } while (0)
    if (t->add_dummy_prefix) {
        memcpy(norm, SPACE_SYM, 3);
        PUSH_SYM(t->space_sym, 0, 3);
        o = 3;
    }
    int prev_space = t->remove_extra_ws;
    while (i < len) {
        unsigned c = u[i];
        if (c == ' ') {
            i++;
            if (prev_space && t->remove_extra_ws)
                continue;
            prev_space = 1;
            if (t->escape_ws) {
                memcpy(norm + o, SPACE_SYM, 3);
                PUSH_SYM(t->space_sym, o, 3);
                o += 3;
            } else {
                norm[o] = ' ';
                PUSH_SYM(t->ascii_sym[' '], o, 1);
                o += 1;
            }
            continue;
        }
        prev_space = 0;
        if (c < 0x80) {
            norm[o] = (char)c;
            PUSH_SYM(t->ascii_sym[c], o, 1);
            o++;
            i++;
            continue;
        }
        uint32_t cp;
        int l = utf8_decode(u + i, len - i, &cp);
        const char *src = text + i;
        if (!l) { /* invalid byte: U+FFFD, consuming one byte */
            src = "\xEF\xBF\xBD";
            l = 3;
            i += 1;
        } else {
            i += (size_t)l;
        }
        memcpy(norm + o, src, (size_t)l);
        PUSH_SYM(map_find(t, src, (size_t)l), o, l);
        o += (size_t)l;
    }
#undef PUSH_SYM
    if (t->remove_extra_ws) { /* trailing space symbols */
        while (ns > 0 && sym[ns - 1].len == (t->escape_ws ? 3u : 1u) &&
               memcmp(norm + sym[ns - 1].start, t->escape_ws ? SPACE_SYM : " ", sym[ns - 1].len) == 0)
            ns--;
    }
    if (ns == 0)
        return 0;
    sym[ns - 1].next = -1;

    if (t->ignore_merges) {
        int whole = map_find(t, norm, sym[ns - 1].start + sym[ns - 1].len);
        if (whole >= 0 && whole < t->n_vocab)
            return tok_ids_push(ids, whole);
    }

    if (!t->split_words)
        return merge_range(t, ws, 0, ns, ids);
    for (int32_t a = 0; a < ns;) {
        int32_t b = a + 1;
        while (b < ns && !(sym[b].id == t->space_sym && t->space_sym >= 0 && sym[b - 1].id != t->space_sym))
            b++;
        if (encode_word(t, ws, a, b, ids) < 0)
            return -1;
        a = b;
    }
    return 0;
}

/* ---------------------------------------------------------------- decoding */

static int flush_bytes(buf_t *out, const unsigned char *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_decode(b + i, n - i, &cp);
        if (l) {
            if (buf_append(out, b + i, (size_t)l) < 0)
                return -1;
            i += (size_t)l;
        } else {
            if (buf_append(out, "\xEF\xBF\xBD", 3) < 0)
                return -1;
            i++;
        }
    }
    return 0;
}

int tok_decode(const tok_t *t, const int32_t *ids, size_t n, buf_t *out)
{
    unsigned char bytes[256];
    size_t nb = 0;
    int first = 1; /* no visible piece yet: the next one loses its dummy-prefix "▁" */
    if (buf_reserve(out, 0) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            ftk_err_set("id %d at position %zu is out of range (vocabulary size %d)", id, i, t->n_vocab);
            return -1;
        }
        const piece_t *p = &t->pieces[id];
        if (p->type == PT_BYTE) {
            int v = 0;
            is_byte_piece(piece_str(t, id), p->len, &v);
            if (nb == sizeof bytes) {
                if (flush_bytes(out, bytes, nb) < 0)
                    return -1;
                nb = 0;
            }
            bytes[nb++] = (unsigned char)v;
            first = 0;
            continue;
        }
        if (nb) {
            if (flush_bytes(out, bytes, nb) < 0)
                return -1;
            nb = 0;
        }
        if (p->type == PT_CONTROL)
            continue;
        if (p->type == PT_UNKNOWN) {
            if (buf_append(out, t->unk_surface, strlen(t->unk_surface)) < 0)
                return -1;
            first = 0;
            continue;
        }
        const char *s = piece_str(t, id);
        size_t l = p->len;
        if (first && (t->add_dummy_prefix || t->remove_extra_ws) && l >= 3 && memcmp(s, SPACE_SYM, 3) == 0) {
            s += 3;
            l -= 3;
        }
        first = 0;
        while (l) {
            if (t->escape_ws && l >= 3 && memcmp(s, SPACE_SYM, 3) == 0) {
                if (buf_putc(out, ' ') < 0)
                    return -1;
                s += 3;
                l -= 3;
            } else {
                if (buf_putc(out, *s) < 0)
                    return -1;
                s++;
                l--;
            }
        }
    }
    return nb ? flush_bytes(out, bytes, nb) : 0;
}
