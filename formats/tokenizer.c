#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/utf8.h"
#include "tokenizer_internal.h"

#define MAX_TEXT (1u << 30)

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

int tok_grow(void **p, size_t *cap, size_t need, size_t elem)
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

/* Inserts id under its piece string unless the string is already there. */
static void map_insert(tok_t *t, int id)
{
    const piece_t *p = &t->pieces[id];
    size_t mask = t->map_cap - 1, h = tok_str_hash(t->pool + p->off, p->len) & mask;
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

int tok_pair_insert(tok_t *t, int32_t l, int32_t r, float score, int32_t merged)
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
                tok_pair_insert(t, (int32_t)(old[i].key >> 32), (int32_t)(uint32_t)old[i].key, old[i].score,
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

int tok_add_piece(tok_t *t, const char *s, size_t n, float score, int type)
{
    if (n > 0xFFFF) {
        ftk_err_set("piece %d is %zu bytes long", t->n_sym, n);
        return -1;
    }
    if (tok_grow((void **)&t->pool, &t->pool_cap, t->pool_len + n + 1, 1) < 0 ||
        tok_grow((void **)&t->pieces, &t->pieces_cap, (size_t)t->n_sym + 1, sizeof *t->pieces) < 0)
        return -1;
    memcpy(t->pool + t->pool_len, s, n);
    t->pool[t->pool_len + n] = 0;
    t->pieces[t->n_sym] = (piece_t){(uint32_t)t->pool_len, (uint32_t)n, score, (uint8_t)type};
    t->pool_len += n + 1;
    t->n_sym++;
    return 0;
}

int tok_is_byte_piece(const char *s, size_t n, int *value)
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
int tok_build_tables(tok_t *t, int derive_pairs)
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
        if (p->type == PT_BYTE && tok_is_byte_piece(tok_piece_str(t, i), p->len, &b)) {
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
            if (tok_map_find(t, t->pool + off + k, (size_t)l) < 0) {
                char ch[4];
                memcpy(ch, t->pool + off + k, (size_t)l);
                if (tok_add_piece(t, ch, (size_t)l, 0, PT_NORMAL) < 0)
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
            const char *s = tok_piece_str(t, i);
            for (uint32_t k = 0; k < p->len;) {
                uint32_t cp;
                int l = utf8_decode((const unsigned char *)s + k, p->len - k, &cp);
                k += l ? (uint32_t)l : 1;
                if (k >= p->len)
                    break;
                int a = tok_map_find(t, s, k), b = tok_map_find(t, s + k, p->len - k);
                if (a >= 0 && b >= 0 && tok_pair_insert(t, a, b, p->score, i) < 0)
                    return -1;
                s = tok_piece_str(t, i);
            }
        }
    }
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        t->ascii_sym[c] = tok_map_find(t, &ch, 1);
    }
    t->space_sym = tok_map_find(t, SPACE_SYM, 3);
    t->split_words = t->escape_ws && !t->ignore_merges;
    for (int i = 0; i < n_real && t->split_words; i++) {
        const char *s = tok_piece_str(t, i);
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

tok_t *tok_new(const char *format)
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
    return tok_piece_str(t, id);
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
    if (tok_grow((void **)&ws->ckeys, &ws->ckeys_cap, ws->ckeys_len + klen, 1) < 0 ||
        tok_grow((void **)&ws->cids, &ws->cids_cap, ws->cids_len + n, sizeof *ws->cids) < 0)
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
    if (tok_grow((void **)&ws->norm, &ws->norm_cap, need, 1) < 0 ||
        tok_grow((void **)&ws->sym, &ws->sym_cap, len + 2, sizeof(sym_t)) < 0 ||
        tok_grow((void **)&ws->heap, &ws->heap_cap, 2 * len + 4, sizeof(cand_t)) < 0)
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
        PUSH_SYM(tok_map_find(t, src, (size_t)l), o, l);
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
        int whole = tok_map_find(t, norm, sym[ns - 1].start + sym[ns - 1].len);
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
            tok_is_byte_piece(tok_piece_str(t, id), p->len, &v);
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
        const char *s = tok_piece_str(t, id);
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
