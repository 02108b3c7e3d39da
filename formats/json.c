#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/utf8.h"

typedef struct block {
    struct block *next;
    size_t used, cap;
    max_align_t data[];
} block_t;

struct json_doc {
    const char *text;
    size_t len;
    unsigned line0, col0; /* position of text[0] */
    block_t *blocks;
};

typedef struct {
    json_doc_t *doc;
    const char *s;
    size_t n, pos;
    int max_depth;
    /* Scratch stacks: children of open containers, copied into the arena on close. */
    json_value_t *vs;
    size_t vs_n, vs_cap;
    json_member_t *ms;
    size_t ms_n, ms_cap;
    char *sb; /* string decoding buffer */
    size_t sb_cap;
    int failed;
} parser_t;

static void *arena_alloc(json_doc_t *d, size_t size)
{
    size = (size + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    block_t *b = d->blocks;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > (1u << 16) ? size : (1u << 16);
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = d->blocks;
        d->blocks = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += size;
    return p;
}

void json_position(const json_doc_t *doc, size_t off, unsigned *line, unsigned *col)
{
    unsigned l = doc->line0, c = doc->col0;
    if (off > doc->len)
        off = doc->len;
    for (size_t i = 0; i < off; i++) {
        unsigned char ch = (unsigned char)doc->text[i];
        if (ch == '\n') {
            l++;
            c = 1;
        } else if ((ch & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static void fail_at(parser_t *p, size_t off, const char *fmt, ...) FTK_PRINTF(3, 4);
static void fail_at(parser_t *p, size_t off, const char *fmt, ...)
{
    if (p->failed)
        return;
    p->failed = 1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    json_position(p->doc, off, &line, &col);
    ftk_err_set("line %u, column %u: %s", line, col, msg);
}

static void oom(parser_t *p) { fail_at(p, p->pos, "out of memory"); }

static void skip_ws(parser_t *p)
{
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            p->pos++;
        else
            break;
    }
}

static const char *describe(parser_t *p, char buf[32])
{
    if (p->pos >= p->n)
        return "end of input";
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 32, "'%c'", c);
    else
        snprintf(buf, 32, "byte 0x%02x", c);
    return buf;
}

static int parse_value(parser_t *p, json_value_t *out, int depth);

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int read_hex4(parser_t *p, size_t at, uint32_t *v)
{
    if (at + 4 > p->n) {
        fail_at(p, at, "truncated \\u escape");
        return -1;
    }
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[at + (size_t)i]);
        if (h < 0) {
            fail_at(p, at + (size_t)i, "invalid hex digit in \\u escape");
            return -1;
        }
        x = x * 16 + (uint32_t)h;
    }
    *v = x;
    return 0;
}

/* Parses the string at p->pos (at the opening quote) into the arena. */
static int parse_string(parser_t *p, char **out, size_t *out_len)
{
    size_t start = p->pos;
    p->pos++; /* opening quote */
    size_t len = 0;
    for (;;) {
        if (p->pos >= p->n) {
            fail_at(p, start, "unterminated string");
            return -1;
        }
        if (len + 4 >= p->sb_cap) {
            size_t cap = p->sb_cap ? p->sb_cap * 2 : 256;
            char *nb = realloc(p->sb, cap);
            if (!nb) {
                oom(p);
                return -1;
            }
            p->sb = nb;
            p->sb_cap = cap;
        }
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            fail_at(p, p->pos, "control character 0x%02x in string (must be escaped)", c);
            return -1;
        }
        if (c >= 0x80) {
            uint32_t cp;
            int l = utf8_decode((const unsigned char *)p->s + p->pos, p->n - p->pos, &cp);
            if (!l) {
                fail_at(p, p->pos, "invalid UTF-8 (byte 0x%02x)", c);
                return -1;
            }
            memcpy(p->sb + len, p->s + p->pos, (size_t)l);
            len += (size_t)l;
            p->pos += (size_t)l;
            continue;
        }
        if (c != '\\') {
            p->sb[len++] = (char)c;
            p->pos++;
            continue;
        }
        size_t esc = p->pos;
        if (p->pos + 1 >= p->n) {
            fail_at(p, start, "unterminated string");
            return -1;
        }
        char e = p->s[p->pos + 1];
        p->pos += 2;
        switch (e) {
        case '"': p->sb[len++] = '"'; break;
        case '\\': p->sb[len++] = '\\'; break;
        case '/': p->sb[len++] = '/'; break;
        case 'b': p->sb[len++] = '\b'; break;
        case 'f': p->sb[len++] = '\f'; break;
        case 'n': p->sb[len++] = '\n'; break;
        case 'r': p->sb[len++] = '\r'; break;
        case 't': p->sb[len++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (read_hex4(p, p->pos, &cp) < 0)
                return -1;
            p->pos += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail_at(p, esc, "lone low surrogate \\u%04X", cp);
                return -1;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->pos + 1 >= p->n || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    fail_at(p, esc, "lone high surrogate \\u%04X", cp);
                    return -1;
                }
                if (read_hex4(p, p->pos + 2, &lo) < 0)
                    return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail_at(p, esc, "high surrogate \\u%04X not followed by a low one", cp);
                    return -1;
                }
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            len += (size_t)utf8_encode(cp, p->sb + len);
            break;
        }
        default:
            fail_at(p, esc, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
            return -1;
        }
    }
    char *s = arena_alloc(p->doc, len + 1);
    if (!s) {
        oom(p);
        return -1;
    }
    memcpy(s, p->sb, len);
    s[len] = 0;
    *out = s;
    *out_len = len;
    return 0;
}

static int parse_number(parser_t *p, json_value_t *out)
{
    size_t start = p->pos, i = p->pos;
    const char *s = p->s;
    if (i < p->n && s[i] == '-')
        i++;
    if (i < p->n && s[i] == '0') {
        i++;
    } else if (i < p->n && s[i] >= '1' && s[i] <= '9') {
        while (i < p->n && s[i] >= '0' && s[i] <= '9')
            i++;
    } else {
        fail_at(p, i, "invalid number");
        return -1;
    }
    if (i < p->n && s[i] == '.') {
        i++;
        if (i >= p->n || s[i] < '0' || s[i] > '9') {
            fail_at(p, i, "invalid number: digit expected after '.'");
            return -1;
        }
        while (i < p->n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < p->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= p->n || s[i] < '0' || s[i] > '9') {
            fail_at(p, i, "invalid number: digit expected in exponent");
            return -1;
        }
        while (i < p->n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    char tmp[64];
    size_t len = i - start;
    out->type = JSON_NUMBER;
    out->u.num.raw = s + start;
    out->u.num.raw_len = len;
    if (len < sizeof tmp) {
        memcpy(tmp, s + start, len);
        tmp[len] = 0;
        out->u.num.v = strtod(tmp, NULL);
    } else {
        char *t = strndup(s + start, len);
        if (!t) {
            oom(p);
            return -1;
        }
        out->u.num.v = strtod(t, NULL);
        free(t);
    }
    p->pos = i;
    return 0;
}

static int literal(parser_t *p, const char *word, size_t wl)
{
    if (p->n - p->pos >= wl && memcmp(p->s + p->pos, word, wl) == 0) {
        p->pos += wl;
        return 0;
    }
    char b[32];
    fail_at(p, p->pos, "unexpected %s", describe(p, b));
    return -1;
}

static int push_value(parser_t *p, const json_value_t *v)
{
    if (p->vs_n == p->vs_cap) {
        size_t cap = p->vs_cap ? p->vs_cap * 2 : 64;
        json_value_t *n = realloc(p->vs, cap * sizeof *n);
        if (!n) {
            oom(p);
            return -1;
        }
        p->vs = n;
        p->vs_cap = cap;
    }
    p->vs[p->vs_n++] = *v;
    return 0;
}

static int push_member(parser_t *p, const json_member_t *m)
{
    if (p->ms_n == p->ms_cap) {
        size_t cap = p->ms_cap ? p->ms_cap * 2 : 64;
        json_member_t *n = realloc(p->ms, cap * sizeof *n);
        if (!n) {
            oom(p);
            return -1;
        }
        p->ms = n;
        p->ms_cap = cap;
    }
    p->ms[p->ms_n++] = *m;
    return 0;
}

static int parse_array(parser_t *p, json_value_t *out, int depth)
{
    size_t base = p->vs_n;
    p->pos++; /* '[' */
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            json_value_t v;
            if (parse_value(p, &v, depth + 1) < 0 || push_value(p, &v) < 0)
                return -1;
            skip_ws(p);
            if (p->pos < p->n && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->n && p->s[p->pos] == ']') {
                p->pos++;
                break;
            }
            char b[32];
            fail_at(p, p->pos, "expected ',' or ']' in array, found %s", describe(p, b));
            return -1;
        }
    }
    size_t n = p->vs_n - base;
    out->type = JSON_ARRAY;
    out->u.arr.n = n;
    out->u.arr.items = NULL;
    if (n) {
        out->u.arr.items = arena_alloc(p->doc, n * sizeof(json_value_t));
        if (!out->u.arr.items) {
            oom(p);
            return -1;
        }
        memcpy(out->u.arr.items, p->vs + base, n * sizeof(json_value_t));
    }
    p->vs_n = base;
    return 0;
}

/* Duplicate keys: a linear scan for small objects, a hash set for large ones (a
 * tokenizer.json vocabulary has tens of thousands of keys). Returns the index of the
 * first repeated member, or -1. */
static long find_duplicate(const json_member_t *m, size_t n)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (m[i].key_len == m[j].key_len && memcmp(m[i].key, m[j].key, m[i].key_len) == 0)
                    return (long)i;
        return -1;
    }
    size_t cap = 64;
    while (cap < 2 * n)
        cap *= 2;
    size_t *slots = calloc(cap, sizeof *slots); /* index+1, 0 = empty */
    if (!slots)
        return -1;
    long dup = -1;
    for (size_t i = 0; i < n && dup < 0; i++) {
        size_t h = (size_t)hash_bytes(m[i].key, m[i].key_len) & (cap - 1);
        while (slots[h]) {
            const json_member_t *o = &m[slots[h] - 1];
            if (o->key_len == m[i].key_len && memcmp(o->key, m[i].key, o->key_len) == 0) {
                dup = (long)i;
                break;
            }
            h = (h + 1) & (cap - 1);
        }
        if (dup < 0)
            slots[h] = i + 1;
    }
    free(slots);
    return dup;
}

static int parse_object(parser_t *p, json_value_t *out, int depth)
{
    size_t base = p->ms_n;
    p->pos++; /* '{' */
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            json_member_t m;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != '"') {
                char b[32];
                fail_at(p, p->pos, "expected a string key in object, found %s", describe(p, b));
                return -1;
            }
            size_t key_off = p->pos;
            if (parse_string(p, &m.key, &m.key_len) < 0)
                return -1;
            m.key_off = key_off;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':') {
                char b[32];
                fail_at(p, p->pos, "expected ':' after object key, found %s", describe(p, b));
                return -1;
            }
            p->pos++;
            if (parse_value(p, &m.value, depth + 1) < 0 || push_member(p, &m) < 0)
                return -1;
            skip_ws(p);
            if (p->pos < p->n && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->n && p->s[p->pos] == '}') {
                p->pos++;
                break;
            }
            char b[32];
            fail_at(p, p->pos, "expected ',' or '}' in object, found %s", describe(p, b));
            return -1;
        }
    }
    size_t n = p->ms_n - base;
    long dup = n ? find_duplicate(p->ms + base, n) : -1; /* p->ms is NULL before the first member */
    if (dup >= 0) {
        const json_member_t *d = &p->ms[base + (size_t)dup];
        fail_at(p, d->key_off, "duplicate key \"%.*s\"", (int)(d->key_len > 64 ? 64 : d->key_len), d->key);
        return -1;
    }
    out->type = JSON_OBJECT;
    out->u.obj.n = n;
    out->u.obj.members = NULL;
    if (n) {
        out->u.obj.members = arena_alloc(p->doc, n * sizeof(json_member_t));
        if (!out->u.obj.members) {
            oom(p);
            return -1;
        }
        memcpy(out->u.obj.members, p->ms + base, n * sizeof(json_member_t));
    }
    p->ms_n = base;
    return 0;
}

static int parse_value(parser_t *p, json_value_t *out, int depth)
{
    skip_ws(p);
    out->off = p->pos;
    if (depth > p->max_depth) {
        fail_at(p, p->pos, "nesting deeper than %d levels", p->max_depth);
        return -1;
    }
    if (p->pos >= p->n) {
        fail_at(p, p->pos, "unexpected end of input, a value was expected");
        return -1;
    }
    switch (p->s[p->pos]) {
    case '{':
        return parse_object(p, out, depth);
    case '[':
        return parse_array(p, out, depth);
    case '"':
        out->type = JSON_STRING;
        return parse_string(p, &out->u.str.s, &out->u.str.len);
    case 't':
        out->type = JSON_BOOL;
        out->u.boolean = 1;
        return literal(p, "true", 4);
    case 'f':
        out->type = JSON_BOOL;
        out->u.boolean = 0;
        return literal(p, "false", 5);
    case 'n':
        out->type = JSON_NULL;
        return literal(p, "null", 4);
    default:
        if (p->s[p->pos] == '-' || (p->s[p->pos] >= '0' && p->s[p->pos] <= '9'))
            return parse_number(p, out);
        char b[32];
        fail_at(p, p->pos, "unexpected %s, a value was expected", describe(p, b));
        return -1;
    }
}

json_doc_t *json_parse(const char *text, size_t len, const json_opts_t *opts, json_value_t **root)
{
    json_doc_t *doc = calloc(1, sizeof *doc);
    if (!doc) {
        ftk_err_set("out of memory");
        return NULL;
    }
    doc->text = text;
    doc->len = len;
    doc->line0 = opts && opts->line0 ? opts->line0 : 1;
    doc->col0 = opts && opts->col0 ? opts->col0 : 1;
    parser_t p = {.doc = doc, .s = text, .n = len};
    p.max_depth = opts && opts->max_depth > 0 ? opts->max_depth : 256;
    int multi = opts && opts->multi;
    /* A UTF-8 byte order mark is tolerated at the very start. */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        p.pos = 3;
    json_value_t *r = arena_alloc(doc, sizeof *r);
    int rc = -1;
    if (!r) {
        oom(&p);
    } else if (!multi) {
        rc = parse_value(&p, r, 0);
        if (rc == 0) {
            skip_ws(&p);
            if (p.pos < p.n) {
                char b[32];
                fail_at(&p, p.pos, "unexpected %s after the end of the JSON value", describe(&p, b));
                rc = -1;
            }
        }
    } else {
        skip_ws(&p);
        r->off = p.pos;
        rc = 0;
        while (rc == 0 && p.pos < p.n) {
            json_value_t v;
            rc = parse_value(&p, &v, 1);
            if (rc == 0)
                rc = push_value(&p, &v);
            skip_ws(&p);
        }
        if (rc == 0) {
            r->type = JSON_ARRAY;
            r->u.arr.n = p.vs_n;
            r->u.arr.items = p.vs_n ? arena_alloc(doc, p.vs_n * sizeof(json_value_t)) : NULL;
            if (p.vs_n && !r->u.arr.items) {
                oom(&p);
                rc = -1;
            } else if (p.vs_n) {
                memcpy(r->u.arr.items, p.vs, p.vs_n * sizeof(json_value_t));
            }
        }
    }
    free(p.vs);
    free(p.ms);
    free(p.sb);
    if (rc < 0) {
        json_free(doc);
        return NULL;
    }
    *root = r;
    return doc;
}

void json_free(json_doc_t *doc)
{
    if (!doc)
        return;
    block_t *b = doc->blocks;
    while (b) {
        block_t *n = b->next;
        free(b);
        b = n;
    }
    free(doc);
}

json_value_t *json_get(const json_value_t *v, const char *key)
{
    if (!v || v->type != JSON_OBJECT)
        return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < v->u.obj.n; i++) {
        json_member_t *m = &v->u.obj.members[i];
        if (m->key_len == kl && memcmp(m->key, key, kl) == 0)
            return &m->value;
    }
    return NULL;
}

int json_get_i64(const json_value_t *v, int64_t *out)
{
    if (!v || v->type != JSON_NUMBER)
        return -1;
    const char *s = v->u.num.raw;
    size_t n = v->u.num.raw_len, i = 0;
    int neg = 0;
    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    if (i == n)
        return -1;
    uint64_t x = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1; /* fraction or exponent: not an exact integer literal */
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    if (!neg && x > (uint64_t)INT64_MAX)
        return -1;
    if (neg && x > (uint64_t)INT64_MAX + 1)
        return -1;
    *out = neg ? (int64_t)(0 - x) : (int64_t)x;
    return 0;
}

const char *json_type_name(json_type_t t)
{
    static const char *names[] = {"null", "boolean", "number", "string", "array", "object"};
    return (unsigned)t < 6 ? names[t] : "?";
}

int json_write_string(buf_t *out, const char *s, size_t len)
{
    if (buf_putc(out, '"') < 0)
        return -1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20 || c == 0x7f) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            }
        }
        if (esc ? buf_append(out, esc, strlen(esc)) < 0 : buf_putc(out, (char)c) < 0)
            return -1;
    }
    return buf_putc(out, '"');
}
