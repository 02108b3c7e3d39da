#include "chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "alpaca.h"

static const char *const template_names[] = {"alpaca", "llama-2-chat", "chatml"};

const char *chat_template_name(chat_template_t t)
{
    return template_names[t];
}

int chat_template_parse(const char *name, chat_template_t *t)
{
    for (int k = 0; k < 3; k++)
        if (strcmp(name, template_names[k]) == 0) {
            *t = (chat_template_t)k;
            return 0;
        }
    ftk_err_set("unknown template \"%s\" (alpaca, llama-2-chat or chatml)", name);
    return -1;
}

chat_template_t chat_template_detect(const json_value_t *rec)
{
    return json_get(rec, "messages") || json_get(rec, "conversations") ? CHAT_LLAMA2 : CHAT_ALPACA;
}

/* ---- reading ---- */

static int rec_error(const json_doc_t *doc, size_t off, size_t idx, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int rec_error(const json_doc_t *doc, size_t off, size_t idx, const char *fmt, ...)
{
    unsigned line, col;
    json_position(doc, off, &line, &col);
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ftk_err_set("line %u, column %u: record %zu: %s", line, col, idx + 1, what);
    return -1;
}

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };
static const char *const role_names[] = {"system", "user", "assistant"};

typedef struct {
    int role;
    const char *s;
    size_t len;
    size_t off; /* the message object's offset, for errors */
} turn_t;

struct chat_enc {
    tok_ws_t *ws;
    turn_t *turns;
    size_t cap;
    buf_t text, tmp;
    tok_ids_t ids, prefix;
    size_t *spans; /* target spans of the current piece: [s0, e0, s1, e1, …) byte offsets */
    size_t n_spans, spans_cap;
};

chat_enc_t *chat_enc_new(void)
{
    chat_enc_t *e = calloc(1, sizeof *e);
    if (e && !(e->ws = tok_ws_new())) {
        free(e);
        e = NULL;
    }
    if (!e)
        ftk_err_set("out of memory");
    return e;
}

void chat_enc_free(chat_enc_t *e)
{
    if (!e)
        return;
    tok_ws_free(e->ws);
    free(e->turns);
    buf_free(&e->text);
    buf_free(&e->tmp);
    tok_ids_free(&e->ids);
    tok_ids_free(&e->prefix);
    free(e->spans);
    free(e);
}

void chat_out_free(chat_out_t *o)
{
    tok_ids_free(&o->ids);
    free(o->mask);
    memset(o, 0, sizeof *o);
}

/* Reads a conversation record into turns (grown in *turns / *cap; *n set). Checks roles,
 * content, order for template t, and that an assistant turn exists. */
static int read_turns(const json_doc_t *doc, const json_value_t *rec, size_t idx, chat_template_t t, turn_t **turns,
                      size_t *cap, size_t *n)
{
    const json_value_t *msgs = json_get(rec, "messages"), *conv = json_get(rec, "conversations");
    if (msgs && conv)
        return rec_error(doc, rec->off, idx, "has both \"messages\" and \"conversations\"");
    const json_value_t *list = msgs ? msgs : conv;
    const char *lname = msgs ? "messages" : "conversations";
    const char *rkey = msgs ? "role" : "from", *ckey = msgs ? "content" : "value";
    if (!list) {
        if (json_get(rec, "instruction"))
            return rec_error(doc, rec->off, idx,
                             "an Alpaca record, but template %s needs \"messages\" or \"conversations\"",
                             chat_template_name(t));
        return rec_error(doc, rec->off, idx, "required field \"messages\" or \"conversations\" is missing");
    }
    if (list->type != JSON_ARRAY)
        return rec_error(doc, list->off, idx, "field \"%s\" must be an array, not %s", lname,
                         json_type_name(list->type));
    if (list->u.arr.n == 0)
        return rec_error(doc, list->off, idx, "\"%s\" is empty", lname);
    if (list->u.arr.n > *cap) {
        turn_t *p = realloc(*turns, list->u.arr.n * sizeof *p);
        if (!p) {
            ftk_err_set("out of memory");
            return -1;
        }
        *turns = p;
        *cap = list->u.arr.n;
    }
    int has_assistant = 0;
    size_t first = 0; /* llama-2-chat: index of the first non-system turn */
    for (size_t k = 0; k < list->u.arr.n; k++) {
        const json_value_t *m = &list->u.arr.items[k];
        if (m->type != JSON_OBJECT)
            return rec_error(doc, m->off, idx, "%s[%zu]: expected an object, found %s", lname, k,
                             json_type_name(m->type));
        const json_value_t *r = json_get(m, rkey), *c = json_get(m, ckey);
        if (!r || !c)
            return rec_error(doc, m->off, idx, "%s[%zu]: required field \"%s\" is missing", lname, k, !r ? rkey : ckey);
        if (r->type != JSON_STRING)
            return rec_error(doc, r->off, idx, "%s[%zu]: field \"%s\" must be a string, not %s", lname, k, rkey,
                             json_type_name(r->type));
        if (c->type != JSON_STRING)
            return rec_error(doc, c->off, idx, "%s[%zu]: field \"%s\" must be a string, not %s", lname, k, ckey,
                             json_type_name(c->type));
        const char *rs = r->u.str.s;
        int role = -1;
        if (strcmp(rs, "system") == 0)
            role = ROLE_SYSTEM;
        else if (strcmp(rs, "user") == 0 || (conv && strcmp(rs, "human") == 0))
            role = ROLE_USER;
        else if (strcmp(rs, "assistant") == 0 || (conv && strcmp(rs, "gpt") == 0))
            role = ROLE_ASSISTANT;
        if (role < 0 || strlen(rs) != r->u.str.len)
            return rec_error(doc, r->off, idx, "%s[%zu]: unknown role \"%.40s\" (%s)", lname, k, rs,
                             msgs ? "system, user or assistant" : "system, human or gpt");
        if (t == CHAT_LLAMA2) {
            if (role == ROLE_SYSTEM && k == 0) {
                first = 1;
            } else if (role == ROLE_SYSTEM) {
                return rec_error(doc, r->off, idx, "%s[%zu]: a system message may only come first (template %s)",
                                 lname, k, chat_template_name(t));
            } else if (role != ((k - first) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT)) {
                return rec_error(doc, r->off, idx,
                                 "%s[%zu]: roles must alternate user/assistant/user/assistant/… (template %s): "
                                 "found %s, expected %s",
                                 lname, k, chat_template_name(t), role_names[role],
                                 role_names[(k - first) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT]);
            }
        }
        has_assistant |= role == ROLE_ASSISTANT;
        (*turns)[k] = (turn_t){role, c->u.str.s, c->u.str.len, m->off};
    }
    if (!has_assistant)
        return rec_error(doc, list->off, idx, "no assistant turn: nothing to learn");
    *n = list->u.arr.n;
    return 0;
}

int chat_check(const json_doc_t *doc, const json_value_t *rec, size_t index, chat_template_t t)
{
    if (t == CHAT_ALPACA) {
        if (json_get(rec, "messages") || json_get(rec, "conversations"))
            return rec_error(doc, rec->off, index, "a conversation, but template alpaca needs \"instruction\" and \"output\"");
        alpaca_rec_t a;
        return alpaca_record(doc, rec, index, &a);
    }
    turn_t *turns = NULL;
    size_t cap = 0, n;
    int rc = read_turns(doc, rec, index, t, &turns, &cap, &n);
    free(turns);
    return rc;
}

/* ---- Python's str.strip() ---- */

/* Python's str.isspace(): Unicode White_Space plus U+001C..U+001F. */
static int py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decodes the character at s[i] (valid UTF-8, as the JSON parser guarantees). */
static uint32_t utf8_at(const unsigned char *s, size_t i, size_t *n)
{
    unsigned char b = s[i];
    if (b < 0x80) {
        *n = 1;
        return b;
    }
    if (b < 0xE0) {
        *n = 2;
        return (uint32_t)(b & 0x1F) << 6 | (s[i + 1] & 0x3F);
    }
    if (b < 0xF0) {
        *n = 3;
        return (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
    }
    *n = 4;
    return (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 | (uint32_t)(s[i + 2] & 0x3F) << 6 |
           (s[i + 3] & 0x3F);
}

static void py_strip(const char *s, size_t len, size_t *a, size_t *b)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, j = len, n;
    while (i < j && py_space(utf8_at(u, i, &n)))
        i += n;
    while (j > i) {
        size_t k = j - 1;
        while (k > i && (u[k] & 0xC0) == 0x80)
            k--;
        if (!py_space(utf8_at(u, k, &n)))
            break;
        j = k;
    }
    *a = i;
    *b = j;
}

/* ---- encoding ---- */

static int out_push(chat_out_t *o, int32_t id, uint8_t m)
{
    if (tok_ids_push(&o->ids, id) < 0)
        return -1;
    if (o->ids.n > o->mask_cap) {
        size_t c = o->ids.cap > o->mask_cap * 2 ? o->ids.cap : o->mask_cap * 2 + 64;
        uint8_t *p = realloc(o->mask, c);
        if (!p) {
            ftk_err_set("out of memory");
            return -1;
        }
        o->mask = p;
        o->mask_cap = c;
    }
    o->mask[o->ids.n - 1] = m;
    return 0;
}

static int span_add(chat_enc_t *e, size_t s, size_t end)
{
    if (e->n_spans + 2 > e->spans_cap) {
        size_t c = e->spans_cap * 2 + 8;
        size_t *p = realloc(e->spans, c * sizeof *p);
        if (!p) {
            ftk_err_set("out of memory");
            return -1;
        }
        e->spans = p;
        e->spans_cap = c;
    }
    e->spans[e->n_spans++] = s;
    e->spans[e->n_spans++] = end;
    return 0;
}

/* "<0xAB>": a byte piece, one byte of text (the tokenizer reads pieces the same way). */
static int byte_piece(const char *p, size_t n)
{
    static const char hex[] = "0123456789ABCDEFabcdef";
    return n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && p[3] && p[4] && strchr(hex, p[3]) &&
           strchr(hex, p[4]);
}

/* The number of tokens of ids (the encoding of text) that lie wholly before byte b, found
 * by encoding text[0..b): where the two encodings part, the token there crosses b.
 * *cross = 1 when a token crosses b. */
static int tokens_before(chat_enc_t *e, const tok_t *tok, const char *text, size_t b, const tok_ids_t *ids,
                         size_t *k, int *cross)
{
    e->prefix.n = 0;
    if (tok_encode(tok, e->ws, text, b, &e->prefix) < 0)
        return -1;
    size_t i = 0;
    while (i < e->prefix.n && i < ids->n && e->prefix.v[i] == ids->v[i])
        i++;
    *k = i;
    *cross = i < e->prefix.n;
    return 0;
}

/* Encodes text[0..len) as one piece (what transformers does between special tokens) and
 * appends its ids to o; a token is a target (with mask_prompt) when it overlaps one of
 * the spans in e->spans (byte offsets in text). */
static int encode_piece(chat_enc_t *e, const tok_t *tok, const char *text, size_t len, int mask_prompt, chat_out_t *o)
{
    tok_ids_t *ids = &e->ids;
    ids->n = 0;
    if (tok_encode(tok, e->ws, text, len, ids) < 0)
        return -1;
    size_t base = o->ids.n;
    for (size_t k = 0; k < ids->n; k++)
        if (out_push(o, ids->v[k], !mask_prompt && base + k > 0) < 0)
            return -1;
    if (!mask_prompt || e->n_spans == 0)
        return 0;
    uint8_t *m = o->mask + base;
    /* Token offsets in the normalized text ("▁" + text with ' ' as "▁"): piece lengths,
     * a byte piece counting one byte. */
    size_t spaces = 0, norm = 0;
    for (size_t i = 0; i < len; i++)
        spaces += text[i] == ' ';
    int exact = 1;
    for (size_t k = 0; k < ids->n && exact; k++) {
        size_t pl = 0;
        const char *p = tok_piece(tok, ids->v[k], &pl);
        exact = p && ids->v[k] != tok_unk_id(tok);
        norm += p && byte_piece(p, pl) ? 1 : pl;
    }
    size_t dummy = norm - (len + 2 * spaces);
    if (!exact || (dummy != 0 && dummy != 3)) {
        /* Offsets do not add up: place each boundary by encoding the text before it. */
        for (size_t s = 0; s < e->n_spans; s += 2) {
            size_t k0, k1;
            int c0, c1;
            if (tokens_before(e, tok, text, e->spans[s], ids, &k0, &c0) < 0 ||
                tokens_before(e, tok, text, e->spans[s + 1], ids, &k1, &c1) < 0)
                return -1;
            for (size_t k = k0; k < k1 + (size_t)c1 && k < ids->n; k++)
                m[k] = 1;
        }
        return 0;
    }
    /* Walk tokens and spans together, both in normalized offsets. */
    size_t pos = 0, si = 0, sp_before = 0, ti = 0; /* ti: text bytes scanned for spaces */
    size_t ns = 0, ne = 0;
    int have = 0;
    for (size_t k = 0; k < ids->n; k++) {
        size_t pl;
        const char *p = tok_piece(tok, ids->v[k], &pl);
        size_t a = pos, b = pos + (byte_piece(p, pl) ? 1 : pl);
        pos = b;
        for (;;) {
            if (!have) {
                if (si >= e->n_spans)
                    break;
                /* normalized offset of text byte x: dummy + x + 2 * (spaces before x) */
                size_t x = e->spans[si];
                for (; ti < x; ti++)
                    sp_before += text[ti] == ' ';
                ns = dummy + x + 2 * sp_before;
                x = e->spans[si + 1];
                for (; ti < x; ti++)
                    sp_before += text[ti] == ' ';
                ne = dummy + x + 2 * sp_before;
                have = 1;
                si += 2;
            }
            if (ns >= ne || ne <= a) { /* empty, or wholly before this token: next span */
                have = 0;
                continue;
            }
            break;
        }
        if (have && a < ne && b > ns)
            m[k] = 1;
    }
    return 0;
}

static int push_special(chat_out_t *o, int32_t id, int target, int mask_prompt)
{
    return out_push(o, id, mask_prompt ? (uint8_t)target : o->ids.n > 0);
}

static int encode_alpaca(chat_enc_t *e, const tok_t *tok, int mask_prompt, const json_doc_t *doc,
                         const json_value_t *rec, size_t index, chat_out_t *o)
{
    alpaca_rec_t a;
    if (chat_check(doc, rec, index, CHAT_ALPACA) < 0 || alpaca_record(doc, rec, index, &a) < 0)
        return -1;
    e->text.len = 0;
    if (alpaca_prompt(&a, &e->text) < 0 || push_special(o, tok_bos_id(tok), 0, mask_prompt) < 0)
        return -1;
    /* prompt and output tokenized separately (LitGPT, Stanford Alpaca): no spans needed */
    e->n_spans = 0;
    if (encode_piece(e, tok, e->text.data, e->text.len, mask_prompt, o) < 0)
        return -1;
    size_t np = o->ids.n;
    if (encode_piece(e, tok, a.output, a.output_len, mask_prompt, o) < 0 ||
        push_special(o, tok_eos_id(tok), 1, mask_prompt) < 0)
        return -1;
    if (mask_prompt)
        memset(o->mask + np, 1, o->ids.n - np);
    return 0;
}

static int append_stripped(buf_t *b, const char *s, size_t len)
{
    size_t i, j;
    py_strip(s, len, &i, &j);
    return buf_append(b, s + i, j - i);
}

static int encode_llama2(chat_enc_t *e, const tok_t *tok, int mask_prompt, const turn_t *t, size_t n,
                         chat_out_t *o)
{
    size_t k = 0;
    const turn_t *sys = NULL;
    if (n && t[0].role == ROLE_SYSTEM)
        sys = &t[k++];
    for (; k < n; k += 2) {
        /* t[k] is a user turn, t[k+1] (if any) its answer */
        buf_t *x = &e->text;
        x->len = 0;
        e->n_spans = 0;
        if (buf_append(x, "[INST] ", 7) < 0)
            return -1;
        if (sys && k == 1) {
            /* the system block joins the first user text before the strip (the template's) */
            buf_t *y = &e->tmp;
            y->len = 0;
            if (buf_append(y, "<<SYS>>\n", 8) < 0 || buf_append(y, sys->s, sys->len) < 0 ||
                buf_append(y, "\n<</SYS>>\n\n", 11) < 0 || buf_append(y, t[k].s, t[k].len) < 0 ||
                append_stripped(x, y->data, y->len) < 0)
                return -1;
        } else if (append_stripped(x, t[k].s, t[k].len) < 0) {
            return -1;
        }
        if (buf_append(x, " [/INST]", 8) < 0)
            return -1;
        int answered = k + 1 < n;
        if (answered) {
            size_t s0 = x->len;
            if (buf_putc(x, ' ') < 0 || append_stripped(x, t[k + 1].s, t[k + 1].len) < 0 || buf_putc(x, ' ') < 0 ||
                span_add(e, s0, x->len) < 0)
                return -1;
        }
        if (push_special(o, tok_bos_id(tok), 0, mask_prompt) < 0 ||
            encode_piece(e, tok, x->data, x->len, mask_prompt, o) < 0 ||
            (answered && push_special(o, tok_eos_id(tok), 1, mask_prompt) < 0))
            return -1;
    }
    return 0;
}

static int encode_chatml(chat_enc_t *e, const tok_t *tok, int mask_prompt, const turn_t *t, size_t n, chat_out_t *o)
{
    buf_t *x = &e->text;
    x->len = 0;
    e->n_spans = 0;
    for (size_t k = 0; k < n; k++) {
        if (buf_append(x, "<|im_start|>", 12) < 0 || buf_append(x, role_names[t[k].role], strlen(role_names[t[k].role])) < 0 ||
            buf_putc(x, '\n') < 0)
            return -1;
        size_t s0 = x->len;
        if (buf_append(x, t[k].s, t[k].len) < 0 || buf_append(x, "<|im_end|>", 10) < 0 ||
            (t[k].role == ROLE_ASSISTANT && span_add(e, s0, x->len) < 0) || buf_putc(x, '\n') < 0)
            return -1;
    }
    return push_special(o, tok_bos_id(tok), 0, mask_prompt) < 0 || encode_piece(e, tok, x->data, x->len, mask_prompt, o) < 0
               ? -1
               : 0;
}

int chat_encode(chat_enc_t *e, const tok_t *tok, chat_template_t t, int mask_prompt, const json_doc_t *doc,
                const json_value_t *rec, size_t index, chat_out_t *out)
{
    out->ids.n = 0;
    if (t == CHAT_ALPACA)
        return encode_alpaca(e, tok, mask_prompt, doc, rec, index, out);
    size_t n;
    if (read_turns(doc, rec, index, t, &e->turns, &e->cap, &n) < 0)
        return -1;
    return t == CHAT_LLAMA2 ? encode_llama2(e, tok, mask_prompt, e->turns, n, out)
                            : encode_chatml(e, tok, mask_prompt, e->turns, n, out);
}
