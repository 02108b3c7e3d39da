#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "json.h"
#include "protobuf.h"
#include "tokenizer_internal.h"

static int sp_malformed(const char *name)
{
    ftk_err_set("%s: malformed protobuf: not a SentencePiece model", name);
    return -1;
}

/* Every piece of a model is there: byte fallback has somewhere to go for each byte
 * (what: "piece" or "token", as the format names them). */
static int check_byte_pieces(const tok_t *t, const char *name, const char *what)
{
    if (t->byte_fallback)
        for (int i = 0; i < 256; i++)
            if (t->byte_id[i] < 0) {
                ftk_err_set("%s: byte_fallback is on but %s <0x%02X> is missing", name, what, i);
                return -1;
            }
    return 0;
}

/* One field of a message: its number, wire type, and value (varint or fixed) or bytes. */
typedef struct {
    uint64_t num;
    int wt;
    uint64_t v;
    pb_t sub;
} sp_field_t;

/* The next field of b into f: 1, 0 at the end, or -1 with the message set. */
static int sp_next(pb_t *b, sp_field_t *f, const char *name)
{
    if (b->p >= b->end)
        return 0;
    return pb_field(b, &f->num, &f->wt, &f->v, &f->sub) < 0 ? sp_malformed(name) : 1;
}

/* ModelProto's fields outside the pieces that decide how text is read. */
typedef struct {
    int model_type, suffix; /* TrainerSpec.model_type, treat_whitespace_as_suffix */
    int unk_id, bos_id, eos_id;
    char norm_name[64];  /* NormalizerSpec.name */
    size_t charsmap_len; /* NormalizerSpec.precompiled_charsmap */
} sp_spec_t;

/* The readers of ModelProto's fields return 0, or -1 with the message set. */

/* One SentencePiece (field 1): its text, score and type, added to t. */
static int sp_read_piece(tok_t *t, pb_t sub, const char *name)
{
    const char *s = "";
    size_t sl = 0;
    float score = 0;
    int type = PT_NORMAL, more;
    sp_field_t g;
    while ((more = sp_next(&sub, &g, name)) > 0) {
        if (g.num == 1 && g.wt == 2) {
            s = (const char *)g.sub.p;
            sl = (size_t)(g.sub.end - g.sub.p);
        } else if (g.num == 2 && g.wt == 5) {
            uint32_t u = (uint32_t)g.v;
            memcpy(&score, &u, 4);
        } else if (g.num == 3 && g.wt == 0) {
            type = (int)g.v;
        }
    }
    if (more < 0)
        return -1;
    if (type == PT_USER_DEFINED || type == PT_UNUSED) {
        ftk_err_set("%s: piece %d ('%.*s') is %s, which ftk does not support", name, t->n_sym,
                    (int)(sl > 40 ? 40 : sl), s, type == PT_UNUSED ? "UNUSED" : "USER_DEFINED");
        return -1;
    }
    if (type < PT_NORMAL || type > PT_BYTE) {
        ftk_err_set("%s: piece %d has unknown type %d", name, t->n_sym, type);
        return -1;
    }
    return tok_add_piece(t, s, sl, score, type);
}

/* TrainerSpec (field 2). */
static int sp_read_trainer_spec(tok_t *t, pb_t sub, sp_spec_t *sp, const char *name)
{
    sp_field_t g;
    int more;
    while ((more = sp_next(&sub, &g, name)) > 0) {
        if (g.wt == 0) {
            if (g.num == 3)
                sp->model_type = (int)g.v;
            else if (g.num == 24)
                sp->suffix = g.v != 0;
            else if (g.num == 35)
                t->byte_fallback = g.v != 0;
            else if (g.num == 40)
                sp->unk_id = (int32_t)g.v;
            else if (g.num == 41)
                sp->bos_id = (int32_t)g.v;
            else if (g.num == 42)
                sp->eos_id = (int32_t)g.v;
        } else if (g.wt == 2 && g.num == 44) {
            size_t n = (size_t)(g.sub.end - g.sub.p);
            if (n >= sizeof t->unk_surface)
                n = sizeof t->unk_surface - 1;
            memcpy(t->unk_surface, g.sub.p, n);
            t->unk_surface[n] = 0;
        }
    }
    return more;
}

/* NormalizerSpec (field 3). */
static int sp_read_normalizer(tok_t *t, pb_t sub, sp_spec_t *sp, const char *name)
{
    sp_field_t g;
    int more;
    while ((more = sp_next(&sub, &g, name)) > 0) {
        if (g.num == 1 && g.wt == 2) {
            size_t n = (size_t)(g.sub.end - g.sub.p);
            if (n >= sizeof sp->norm_name)
                n = sizeof sp->norm_name - 1;
            memcpy(sp->norm_name, g.sub.p, n);
            sp->norm_name[n] = 0;
        } else if (g.num == 2 && g.wt == 2) {
            sp->charsmap_len = (size_t)(g.sub.end - g.sub.p);
        } else if (g.wt == 0 && g.num == 3) {
            t->add_dummy_prefix = g.v != 0;
        } else if (g.wt == 0 && g.num == 4) {
            t->remove_extra_ws = g.v != 0;
        } else if (g.wt == 0 && g.num == 5) {
            t->escape_ws = g.v != 0;
        }
    }
    return more;
}

/* Refuses what ftk does not implement (only BPE with identity normalization, Llama's),
 * then takes the special ids that name a piece. */
static int sp_check_spec(tok_t *t, const sp_spec_t *sp, const char *name)
{
    if (t->n_vocab == 0) {
        ftk_err_set("%s: no pieces: not a SentencePiece model", name);
        return -1;
    }
    if (sp->model_type != 2) {
        ftk_err_set("%s: model_type %d (%s) is not supported; ftk reads BPE SentencePiece models (Llama)", name,
                    sp->model_type, sp->model_type == 1 ? "UNIGRAM" : sp->model_type == 3 ? "WORD" : "CHAR");
        return -1;
    }
    if (sp->suffix) {
        ftk_err_set("%s: treat_whitespace_as_suffix is not supported", name);
        return -1;
    }
    if (sp->charsmap_len) {
        ftk_err_set("%s: normalization '%s' is not supported; ftk implements identity normalization (Llama 2)",
                    name, sp->norm_name[0] ? sp->norm_name : "?");
        return -1;
    }
    t->unk = sp->unk_id >= 0 && sp->unk_id < t->n_vocab ? sp->unk_id : -1;
    t->bos = sp->bos_id >= 0 && sp->bos_id < t->n_vocab ? sp->bos_id : -1;
    t->eos = sp->eos_id >= 0 && sp->eos_id < t->n_vocab ? sp->eos_id : -1;
    return 0;
}

static tok_t *load_sentencepiece(const char *data, size_t len, const char *name)
{
    tok_t *t = tok_new("sentencepiece");
    if (!t)
        return NULL;
    pb_t b = {(const unsigned char *)data, (const unsigned char *)data + len};
    /* proto2 defaults: UNIGRAM, and the ids of a model trained without options */
    sp_spec_t sp = {.model_type = 1, .unk_id = 0, .bos_id = 1, .eos_id = 2};
    sp_field_t f;
    int more;
    while ((more = sp_next(&b, &f, name)) > 0) {
        int rc = 0;
        if (f.num == 1 && f.wt == 2)
            rc = sp_read_piece(t, f.sub, name);
        else if (f.num == 2 && f.wt == 2)
            rc = sp_read_trainer_spec(t, f.sub, &sp, name);
        else if (f.num == 3 && f.wt == 2)
            rc = sp_read_normalizer(t, f.sub, &sp, name);
        if (rc < 0)
            goto fail;
    }
    if (more < 0)
        goto fail;
    t->n_vocab = t->n_sym;
    if (sp_check_spec(t, &sp, name) < 0 || tok_build_tables(t, 1) < 0 || check_byte_pieces(t, name, "piece") < 0)
        goto fail;
    return t;
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
        } else if (tok_is_byte_piece(s, (size_t)n, &v))
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
        if (tok_add_piece(t, tmp, k, score, type) < 0)
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
    if (tok_build_tables(t, 1) < 0)
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
    if (tok_grow((void **)joined, jcap, al + bl + 1, 1) < 0)
        return -1;
    memcpy(*joined, a, al);
    memcpy(*joined + al, b, bl);
    *l = tok_map_find(t, a, al);
    *r = tok_map_find(t, b, bl);
    *mm = tok_map_find(t, *joined, al + bl);
    return 0;
}

/* model: a BPE without the options ftk does not implement; takes its flags. */
static int json_check_model(tok_t *t, const json_value_t *model, const char *name)
{
    const json_value_t *mt = json_get(model, "type");
    if (!json_is(mt, "BPE")) {
        ftk_err_set("%s: model.type %s is not supported; ftk reads BPE tokenizers", name,
                    mt && mt->type == JSON_STRING ? mt->u.str.s : "(missing)");
        return -1;
    }
    static const char *must_be_empty[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_value_t *v = json_get(model, must_be_empty[i]);
        if (v && v->type != JSON_NULL && !(v->type == JSON_STRING && v->u.str.len == 0)) {
            ftk_err_set("%s: model.%s is not supported", name, must_be_empty[i]);
            return -1;
        }
    }
    const json_value_t *dropout = json_get(model, "dropout");
    if (dropout && dropout->type == JSON_NUMBER && dropout->u.num.v != 0) {
        ftk_err_set("%s: model.dropout is not supported (training-time BPE dropout)", name);
        return -1;
    }
    const json_value_t *bf = json_get(model, "byte_fallback"), *fu = json_get(model, "fuse_unk"),
                       *im = json_get(model, "ignore_merges");
    t->byte_fallback = bf && bf->type == JSON_BOOL && bf->u.boolean;
    t->fuse_unk = fu && fu->type == JSON_BOOL && fu->u.boolean;
    t->ignore_merges = im && im->type == JSON_BOOL && im->u.boolean;
    return 0;
}

/* The vocabulary's size: one more than the largest id of model.vocab and added_tokens
 * (na of them), each checked to be an id. */
static int json_vocab_size(const json_value_t *vocab, const json_value_t *added, size_t na, const char *name,
                           int *n)
{
    int64_t max_id = -1;
    for (size_t i = 0; i < vocab->u.obj.n; i++) {
        int64_t id;
        if (json_get_i64(&vocab->u.obj.members[i].value, &id) < 0 || id < 0 || id > 10000000) {
            ftk_err_set("%s: model.vocab[\"%s\"]: expected an id between 0 and 10^7", name,
                        vocab->u.obj.members[i].key);
            return -1;
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
            return -1;
        }
        if (id > max_id)
            max_id = id;
    }
    *n = (int)(max_id + 1);
    return 0;
}

/* The pieces by id, before they go into the tokenizer. */
typedef struct {
    const char **strs;
    size_t *lens;
    uint8_t *types;
} json_pieces_t;

/* Places model.vocab's and added_tokens' strings at their ids (checked by
 * json_vocab_size); an added token marked special is a control piece, and <s> and </s>
 * are BOS and EOS. Returns the first id given twice (differently, for an added token)
 * or missing, or -1 when every id 0..n-1 has one string. */
static int json_place_pieces(tok_t *t, const json_value_t *vocab, const json_value_t *added, size_t na, int n,
                             json_pieces_t *p)
{
    int bad_id = -1;
    for (size_t i = 0; i < vocab->u.obj.n; i++) {
        int64_t id;
        json_get_i64(&vocab->u.obj.members[i].value, &id);
        if (p->strs[id] && bad_id < 0)
            bad_id = (int)id;
        p->strs[id] = vocab->u.obj.members[i].key;
        p->lens[id] = vocab->u.obj.members[i].key_len;
        int bv;
        p->types[id] = t->byte_fallback && tok_is_byte_piece(p->strs[id], p->lens[id], &bv) ? PT_BYTE : PT_NORMAL;
    }
    for (size_t i = 0; i < na; i++) {
        const json_value_t *a = &added->u.arr.items[i];
        int64_t id;
        json_get_i64(json_get(a, "id"), &id);
        const json_value_t *c = json_get(a, "content"), *sp = json_get(a, "special");
        if (p->strs[id] && (p->lens[id] != c->u.str.len || memcmp(p->strs[id], c->u.str.s, p->lens[id]) != 0) &&
            bad_id < 0)
            bad_id = (int)id;
        p->strs[id] = c->u.str.s;
        p->lens[id] = c->u.str.len;
        if (sp && sp->type == JSON_BOOL && sp->u.boolean)
            p->types[id] = PT_CONTROL;
        if (strcmp(c->u.str.s, "<s>") == 0)
            t->bos = (int)id;
        else if (strcmp(c->u.str.s, "</s>") == 0)
            t->eos = (int)id;
    }
    for (int i = 0; i < n && bad_id < 0; i++)
        if (!p->strs[i])
            bad_id = i;
    return bad_id;
}

/* The vocabulary: model.vocab's ids must be exactly 0..n-1; added tokens may extend it.
 * The piece equal to model.unk_token is the unknown piece. */
static int json_read_vocab(tok_t *t, const json_value_t *root, const json_value_t *model, const char *name)
{
    const json_value_t *vocab = json_get(model, "vocab"), *added = json_get(root, "added_tokens");
    if (!vocab || vocab->type != JSON_OBJECT) {
        ftk_err_set("%s: model.vocab: expected an object", name);
        return -1;
    }
    size_t na = added && added->type == JSON_ARRAY ? added->u.arr.n : 0;
    int n;
    if (json_vocab_size(vocab, added, na, name, &n) < 0)
        return -1;
    json_pieces_t p = {calloc((size_t)(n > 0 ? n : 1), sizeof *p.strs), calloc((size_t)(n > 0 ? n : 1), sizeof *p.lens),
                       calloc((size_t)(n > 0 ? n : 1), 1)};
    int rc = 0;
    if (!p.strs || !p.lens || !p.types) {
        ftk_err_set("out of memory");
        rc = -1;
    }
    int bad_id = rc == 0 ? json_place_pieces(t, vocab, added, na, n, &p) : -1;
    if (bad_id >= 0) {
        ftk_err_set("%s: vocabulary id %d is missing or given twice; ids must be 0..%d, once each", name, bad_id,
                    n - 1);
        rc = -1;
    }
    const json_value_t *unk = json_get(model, "unk_token");
    for (int i = 0; i < n && rc == 0; i++) {
        if (unk && unk->type == JSON_STRING && p.lens[i] == unk->u.str.len &&
            memcmp(p.strs[i], unk->u.str.s, p.lens[i]) == 0) {
            t->unk = i;
            p.types[i] = PT_UNKNOWN;
        }
        rc = tok_add_piece(t, p.strs[i], p.lens[i], 0, p.types[i]);
    }
    free(p.strs);
    free(p.lens);
    free(p.types);
    if (rc == 0)
        t->n_vocab = n;
    return rc;
}

/* The ids of a merge given as one string "left right" (*l, *r, *mm as merge_ids; -1 for
 * a string without a space). Some converted files hold pieces that contain a space
 * (U+00A0 turned into U+0020), making the split ambiguous: the first space at which both
 * halves and their concatenation are tokens is taken. */
static int merge_split(const tok_t *t, const json_value_t *m, char **joined, size_t *jcap, int *l, int *r, int *mm)
{
    const char *a = m->u.str.s;
    for (const char *sp = memchr(a, ' ', m->u.str.len); sp; sp = memchr(sp + 1, ' ', m->u.str.len - (size_t)(sp + 1 - a))) {
        size_t al = (size_t)(sp - a);
        if (merge_ids(t, a, al, sp + 1, m->u.str.len - al - 1, joined, jcap, l, r, mm) < 0)
            return -1;
        if (*l >= 0 && *r >= 0 && *mm >= 0)
            break;
        if (sp + 1 >= a + m->u.str.len)
            break;
    }
    return 0;
}

/* model.merges, in priority order: each a string "left right" or a pair of strings. */
static int json_read_merges(tok_t *t, const json_value_t *model, const char *name)
{
    const json_value_t *merges = json_get(model, "merges");
    if (!merges || merges->type != JSON_ARRAY) {
        ftk_err_set("%s: model.merges: expected an array", name);
        return -1;
    }
    char *joined = NULL;
    size_t jcap = 0;
    int rc = 0;
    for (size_t i = 0; i < merges->u.arr.n && rc == 0; i++) {
        const json_value_t *m = &merges->u.arr.items[i];
        int l = -1, r = -1, mm = -1;
        if (m->type == JSON_STRING) {
            rc = merge_split(t, m, &joined, &jcap, &l, &r, &mm);
        } else if (m->type == JSON_ARRAY && m->u.arr.n == 2 && m->u.arr.items[0].type == JSON_STRING &&
                   m->u.arr.items[1].type == JSON_STRING) {
            const json_value_t *a = &m->u.arr.items[0], *b = &m->u.arr.items[1];
            rc = merge_ids(t, a->u.str.s, a->u.str.len, b->u.str.s, b->u.str.len, &joined, &jcap, &l, &r, &mm);
        } else {
            ftk_err_set("%s: model.merges[%zu]: expected a string or a pair of strings", name, i);
            rc = -1;
        }
        if (rc == 0 && (l < 0 || r < 0 || mm < 0 || mm >= t->n_vocab)) {
            ftk_err_set("%s: model.merges[%zu]: a token of this merge is missing from the vocabulary", name, i);
            rc = -1;
        }
        if (rc == 0)
            rc = tok_pair_insert(t, l, r, -(float)i, mm);
    }
    free(joined);
    return rc;
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
    if (json_check_model(t, model, name) < 0)
        goto fail;
    if (check_normalizer(t, json_get(root, "normalizer"), "normalizer") < 0 ||
        check_pre_tokenizer(t, json_get(root, "pre_tokenizer")) < 0) {
        ftk_err_prefix("%s: ", name);
        goto fail;
    }
    if (json_read_vocab(t, root, model, name) < 0 || tok_build_tables(t, 0) < 0 ||
        json_read_merges(t, model, name) < 0 || check_byte_pieces(t, name, "token") < 0)
        goto fail;
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
