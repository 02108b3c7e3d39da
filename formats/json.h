/* json.h — a strict JSON parser (RFC 8259) that reports line and column.
 *
 * Why our own: ftk's inputs come from users and from the internet (Alpaca data, HF
 * config.json, tokenizer.json, safetensors headers), and every rejection must name the
 * line and column. The parser is strict: invalid UTF-8, unescaped control characters,
 * lone surrogate escapes, duplicate object keys, trailing garbage and nesting deeper than
 * max_depth are errors. Numbers keep their source text so integers above 2^53 can be read
 * exactly (json_get_i64).
 *
 * Ownership: json_parse() returns a document that owns every value (one arena);
 * json_free() releases it. The document keeps a pointer to the input text for
 * json_position(), so the text must outlive the document.
 *
 * Errors: NULL with ftk_err_msg() = "line L, column C: what". Columns count characters
 * (code points) from 1; lines count from 1.
 *
 * Multi mode (opts.multi): the input is a sequence of values separated by whitespace
 * (JSON Lines); the root is then an array of them.
 */
#ifndef FTK_JSON_H
#define FTK_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type_t;

typedef struct json_value json_value_t;
typedef struct json_member json_member_t;

struct json_value {
    json_type_t type;
    size_t off; /* byte offset of the value's first character in the input */
    union {
        int boolean;
        struct {
            const char *raw; /* points into the input */
            size_t raw_len;
            double v;
        } num;
        struct {
            char *s; /* decoded, NUL-terminated; may hold NULs from \u0000 (use len) */
            size_t len;
        } str;
        struct {
            json_value_t *items;
            size_t n;
        } arr;
        struct {
            json_member_t *members;
            size_t n;
        } obj;
    } u;
};

struct json_member {
    char *key;
    size_t key_len;
    size_t key_off; /* byte offset of the key's opening quote */
    json_value_t value;
};

typedef struct {
    int max_depth; /* 0: 256 */
    int multi;     /* JSON Lines: root becomes an array of the top-level values */
    /* Position of text[0] when the text is a piece of a larger input (a record that a
     * streaming reader cut out): errors and json_position() then count from there.
     * 0 means line 1, column 1. */
    unsigned line0, col0;
} json_opts_t;

typedef struct json_doc json_doc_t;

json_doc_t *json_parse(const char *text, size_t len, const json_opts_t *opts, json_value_t **root);
void json_free(json_doc_t *doc);

/* Line and column (both from 1) of a byte offset, e.g. a value's off. */
void json_position(const json_doc_t *doc, size_t off, unsigned *line, unsigned *col);

/* Member of an object by key, or NULL (also when v is not an object). */
json_value_t *json_get(const json_value_t *v, const char *key);

/* Exact integer value: 0, or -1 when v is not a number or not an integer in range. */
int json_get_i64(const json_value_t *v, int64_t *out);

const char *json_type_name(json_type_t t);

#include "../libcommon/buf.h"

/* Appends s[0..len) as a JSON string literal (quotes included). Control characters are
 * escaped; other bytes, UTF-8 included, are copied. Returns 0 or -1 (out of memory). */
int json_write_string(buf_t *out, const char *s, size_t len);

#endif
