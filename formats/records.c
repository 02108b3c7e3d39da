#include "records.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"

#define READ_BLOCK (1u << 20)

enum { START, ARRAY_FIRST, ARRAY_NEXT, LINES, AFTER, DONE };

struct records {
    int fd, own_fd;
    unsigned char *in;
    size_t in_len, in_pos;
    int eof;
    uint64_t bytes;
    hash_state_t *hash;
    unsigned line, col; /* position of in[in_pos] */
    int state;
    size_t max_rec;
    char *text; /* the chunk's record text */
    size_t text_len, text_cap;
    record_span_t *spans;
    size_t spans_cap;
    /* the previous chunk's, left intact for one more call (a reader may be one chunk ahead
     * of the threads that tokenize) */
    char *text2;
    size_t text2_cap;
    record_span_t *spans2;
    size_t spans2_cap;
    int64_t n_records;
    char err[600]; /* an error found after the records of the current chunk */
    int pending, failed;
};

records_t *records_open(const char *path, size_t max_record_bytes)
{
    records_t *r = calloc(1, sizeof *r);
    if (!r || !(r->in = malloc(READ_BLOCK)) || !(r->hash = hash_new())) {
        if (r) {
            free(r->in);
            free(r);
        }
        ftk_err_set("out of memory");
        return NULL;
    }
    if (strcmp(path, "-") == 0) {
        r->fd = 0;
    } else {
        r->fd = open(path, O_RDONLY);
        r->own_fd = 1;
        if (r->fd < 0) {
            ftk_err_set("%s: %s", path, strerror(errno));
            hash_free(r->hash);
            free(r->in);
            free(r);
            return NULL;
        }
    }
    r->line = r->col = 1;
    r->max_rec = max_record_bytes;
    return r;
}

void records_close(records_t *r)
{
    if (!r)
        return;
    if (r->own_fd)
        close(r->fd);
    hash_free(r->hash);
    free(r->in);
    free(r->text);
    free(r->spans);
    free(r->text2);
    free(r->spans2);
    free(r);
}

uint64_t records_hash(const records_t *r) { return hash_digest(r->hash); }
uint64_t records_bytes(const records_t *r) { return r->bytes; }

/* The next byte, or -1 at the end of the input (or -2 on a read error, message set). */
static int peek(records_t *r)
{
    if (r->in_pos < r->in_len)
        return r->in[r->in_pos];
    if (r->eof)
        return -1;
    ssize_t n;
    do
        n = read(r->fd, r->in, READ_BLOCK);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        snprintf(r->err, sizeof r->err, "read failed: %s", strerror(errno));
        r->eof = 1;
        return -2;
    }
    if (n == 0) {
        r->eof = 1;
        return -1;
    }
    hash_update(r->hash, r->in, (size_t)n);
    r->bytes += (uint64_t)n;
    r->in_len = (size_t)n;
    r->in_pos = 0;
    return r->in[0];
}

static void advance(records_t *r, int c)
{
    r->in_pos++;
    if (c == '\n') {
        r->line++;
        r->col = 1;
    } else if ((c & 0xC0) != 0x80) {
        r->col++;
    }
}

static int is_ws(int c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static int skip_ws(records_t *r)
{
    int c;
    while ((c = peek(r)) >= 0 && is_ws(c))
        advance(r, c);
    return c;
}

static void describe(int c, char buf[32])
{
    if (c < 0)
        snprintf(buf, 32, "end of input");
    else if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 32, "'%c'", c);
    else
        snprintf(buf, 32, "byte 0x%02x", c);
}

/* Records an error at the current position (to be returned after the chunk's records). */
static void fail_here(records_t *r, const char *what, int c)
{
    char d[32];
    describe(c, d);
    snprintf(r->err, sizeof r->err, "line %u, column %u: %s%s", r->line, r->col, what, c == -3 ? "" : d);
    r->pending = 1;
}

static int text_put(records_t *r, int c)
{
    if (r->text_len == r->text_cap) {
        size_t cap = r->text_cap ? r->text_cap * 2 : (1u << 16);
        char *t = realloc(r->text, cap);
        if (!t)
            return -1;
        r->text = t;
        r->text_cap = cap;
    }
    r->text[r->text_len++] = (char)c;
    return 0;
}

static int scalar_char(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '+' ||
           c == '.';
}

/* Cuts one record starting at the current (non-blank) byte into the text buffer.
 * Returns 0, or -1 with r->err set (pending). */
static int scan_value(records_t *r)
{
    size_t start = r->text_len;
    unsigned line = r->line, col = r->col;
    int64_t depth = 0;
    int in_str = 0, esc = 0, c = peek(r);
    if (c == '{' || c == '[' || c == '"') {
        /* The hot loop of reading: a block of input at a time, positions kept in locals,
         * the bytes copied once per block. */
        unsigned ln = r->line, cl = r->col;
        for (int done = 0; !done;) {
            if ((c = peek(r)) < 0) {
                if (c == -2) {
                    r->pending = 1;
                    return -1;
                }
                break; /* end of input inside the value: the parser says where */
            }
            size_t room = r->max_rec - (r->text_len - start);
            if (room == 0) {
                snprintf(r->err, sizeof r->err,
                         "line %u, column %u: record %lld is longer than %zu bytes (--max-record-bytes)", line, col,
                         (long long)r->n_records + 1, r->max_rec);
                r->pending = 1;
                return -1;
            }
            const unsigned char *b = r->in + r->in_pos, *p = b;
            const unsigned char *e = b + (r->in_len - r->in_pos < room ? r->in_len - r->in_pos : room);
            while (p < e) {
                c = *p++;
                if (c == '\n') {
                    ln++;
                    cl = 1;
                } else if ((c & 0xC0) != 0x80) {
                    cl++;
                }
                if (in_str) {
                    if (esc)
                        esc = 0;
                    else if (c == '\\')
                        esc = 1;
                    else if (c == '"' && (in_str = 0, depth == 0))
                        done = 1;
                    else if (c < 0x20)
                        done = 1; /* cannot be valid here: the parser names it */
                } else if (c == '"') {
                    in_str = 1;
                } else if (c == '{' || c == '[') {
                    depth++;
                } else if (c == '}' || c == ']') {
                    done = --depth <= 0;
                } else if (c < 0x20 && !is_ws(c)) {
                    done = 1;
                }
                if (done)
                    break;
            }
            size_t n = (size_t)(p - b);
            if (r->text_len + n > r->text_cap) {
                size_t cap = r->text_cap ? r->text_cap : (1u << 16);
                while (cap < r->text_len + n)
                    cap *= 2;
                char *t = realloc(r->text, cap);
                if (!t)
                    goto oom;
                r->text = t;
                r->text_cap = cap;
            }
            memcpy(r->text + r->text_len, b, n);
            r->text_len += n;
            r->in_pos += n;
            r->line = ln;
            r->col = cl;
        }
    } else if (c >= 0 && scalar_char(c)) {
        while ((c = peek(r)) >= 0 && scalar_char(c) && r->text_len - start < 64) {
            advance(r, c);
            if (text_put(r, c) < 0)
                goto oom;
        }
    } else {
        fail_here(r, "unexpected ", c);
        size_t l = strlen(r->err);
        snprintf(r->err + l, sizeof r->err - l, ", a value was expected");
        return -1;
    }
    r->n_records++;
    return 0;
oom:
    snprintf(r->err, sizeof r->err, "out of memory");
    r->pending = 1;
    return -1;
}

/* The chunk returned last becomes the one before (its text and spans stay valid until the
 * next call, records.h); the older one's buffers are reused. 0, or -1 (out of memory). */
static int swap_chunks(records_t *r, size_t max_records)
{
    char *t = r->text;
    r->text = r->text2;
    r->text2 = t;
    size_t c2 = r->text_cap;
    r->text_cap = r->text2_cap;
    r->text2_cap = c2;
    record_span_t *s2 = r->spans;
    r->spans = r->spans2;
    r->spans2 = s2;
    c2 = r->spans_cap;
    r->spans_cap = r->spans2_cap;
    r->spans2_cap = c2;
    if (r->spans_cap < max_records) {
        record_span_t *s = realloc(r->spans, max_records * sizeof *s);
        if (!s) {
            ftk_err_set("out of memory");
            return -1;
        }
        r->spans = s;
        r->spans_cap = max_records;
    }
    r->text_len = 0;
    return 0;
}

/* The first non-blank character decides the input's form (records.h). 0, or -1 with the
 * error pending. */
static int read_start(records_t *r)
{
    int c = peek(r);
    if (c == 0xEF) { /* a byte order mark */
        static const unsigned char bom[3] = {0xEF, 0xBB, 0xBF};
        for (int i = 0; i < 3 && (c = peek(r)) == bom[i]; i++)
            r->in_pos++;
    }
    c = skip_ws(r);
    if (c == -1) {
        snprintf(r->err, sizeof r->err, "empty input: no records");
        r->pending = 1;
        return -1;
    }
    if (c == '[') {
        advance(r, c);
        r->state = ARRAY_FIRST;
    } else if (c == '{') {
        r->state = LINES;
    } else {
        const char *t = c == '"'                              ? "string"
                        : c == '-' || (c >= '0' && c <= '9') ? "number"
                        : c == 't' || c == 'f'               ? "boolean"
                        : c == 'n'                           ? "null"
                                                             : NULL;
        char d[32];
        describe(c, d);
        snprintf(r->err, sizeof r->err, "line %u, column %u: expected an array of records or JSON Lines, found %s",
                 r->line, r->col, t ? t : d);
        r->pending = 1;
        return -1;
    }
    return 0;
}

/* What read_between() found before the next record. */
enum { BETWEEN_VALUE, BETWEEN_AGAIN, BETWEEN_STOP };

/* The structure before the next record (`,` `]`, the end, trailing text):
 * BETWEEN_VALUE when a record starts at the current byte, BETWEEN_AGAIN when the state
 * changed and the input must be looked at again, BETWEEN_STOP at the end of the input or
 * at an error (then pending). */
static int read_between(records_t *r)
{
    int c = skip_ws(r);
    if (c == -2) {
        r->pending = 1;
        return BETWEEN_STOP;
    }
    if (r->state == ARRAY_FIRST && c == ']') {
        advance(r, c);
        if (r->n_records == 0) {
            snprintf(r->err, sizeof r->err, "no records");
            r->pending = 1;
            return BETWEEN_STOP;
        }
        r->state = AFTER;
        return BETWEEN_AGAIN;
    }
    if (r->state == ARRAY_NEXT) {
        if (c == ',') {
            advance(r, c);
            if ((c = skip_ws(r)) == -2) {
                r->pending = 1;
                return BETWEEN_STOP;
            }
        } else if (c == ']') {
            advance(r, c);
            r->state = AFTER;
            return BETWEEN_AGAIN;
        } else {
            fail_here(r, "expected ',' or ']' in array, found ", c);
            return BETWEEN_STOP;
        }
    }
    if (r->state == AFTER) {
        if (c >= 0) {
            fail_here(r, "unexpected ", c);
            size_t l = strlen(r->err);
            snprintf(r->err + l, sizeof r->err - l, " after the end of the JSON value");
            return BETWEEN_STOP;
        }
        r->state = DONE;
        return BETWEEN_STOP;
    }
    if (r->state == LINES && c == -1) {
        r->state = DONE;
        return BETWEEN_STOP;
    }
    if (c == -1 && (r->state == ARRAY_FIRST || r->state == ARRAY_NEXT)) {
        /* what the whole-document parser says of an array cut short */
        fail_here(r, "unexpected end of input, a value was expected", -3);
        return BETWEEN_STOP;
    }
    return BETWEEN_VALUE;
}

int64_t records_next(records_t *r, size_t max_records, size_t max_bytes, const record_span_t **spans)
{
    if (r->pending || r->failed) {
        r->pending = 0;
        r->failed = 1;
        ftk_err_set("%s", r->err);
        return -1;
    }
    if (swap_chunks(r, max_records) < 0)
        return -1;
    size_t n = 0;
    while (n < max_records && r->text_len < max_bytes && r->state != DONE) {
        if (r->state == START) {
            if (read_start(r) < 0)
                break;
            continue;
        }
        int step = read_between(r);
        if (step == BETWEEN_STOP)
            break;
        if (step == BETWEEN_AGAIN)
            continue;
        size_t off = r->text_len;
        unsigned line = r->line, col = r->col;
        if (scan_value(r) < 0)
            break;
        r->spans[n] = (record_span_t){NULL, r->text_len - off, line, col, r->n_records - 1};
        r->spans[n].text = (const char *)(uintptr_t)off; /* an offset until the buffer stops moving */
        n++;
        if (r->state == ARRAY_FIRST)
            r->state = ARRAY_NEXT;
    }
    for (size_t k = 0; k < n; k++)
        r->spans[k].text = r->text + (size_t)(uintptr_t)r->spans[k].text;
    *spans = r->spans;
    if (n == 0 && r->pending)
        return records_next(r, max_records, max_bytes, spans);
    return (int64_t)n;
}

/* ---------------------------------------------------------------- a whole input */

int records_parse(const char *text, size_t len, records_doc_t *out)
{
    memset(out, 0, sizeof *out);
    size_t i = 0;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        i = 3;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
        i++;
    if (i == len) {
        ftk_err_set("empty input: no records");
        return -1;
    }
    json_opts_t o = {.max_depth = 64, .multi = text[i] == '{'};
    json_value_t *root;
    out->doc = json_parse(text, len, &o, &root);
    if (!out->doc)
        return -1;
    if (root->type != JSON_ARRAY) {
        unsigned line, col;
        json_position(out->doc, root->off, &line, &col);
        ftk_err_set("line %u, column %u: expected an array of records or JSON Lines, found %s", line, col,
                    json_type_name(root->type));
        records_doc_free(out);
        return -1;
    }
    if (root->u.arr.n == 0) {
        ftk_err_set("no records");
        records_doc_free(out);
        return -1;
    }
    for (size_t k = 0; k < root->u.arr.n; k++)
        if (root->u.arr.items[k].type != JSON_OBJECT) {
            unsigned line, col;
            json_position(out->doc, root->u.arr.items[k].off, &line, &col);
            ftk_err_set("line %u, column %u: record %zu: expected an object, found %s", line, col, k + 1,
                        json_type_name(root->u.arr.items[k].type));
            records_doc_free(out);
            return -1;
        }
    out->recs = root->u.arr.items;
    out->n = root->u.arr.n;
    return 0;
}

void records_doc_free(records_doc_t *d)
{
    json_free(d->doc);
    memset(d, 0, sizeof *d);
}
