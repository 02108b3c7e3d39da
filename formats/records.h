/* records.h — reading a JSON array or JSON Lines of records as a stream, in bounded memory.
 *
 * ## Input
 * UTF-8 text (an optional byte order mark at the start), either
 *   - a JSON array of values: `[` value `,` value … `]`, whitespace allowed between, or
 *   - JSON Lines: values one after the other, separated by whitespace (one per line is
 *     the usual form; a record may span lines).
 * The first non-blank character decides: `[` an array, `{` JSON Lines; anything else is an
 * error at that character ("found string", "found byte 0x00": a stream of NULs such as
 * /dev/zero fails at its first byte). Each value is one record. The stream only cuts the
 * input into records; the caller parses each record's text with json_parse() (giving it
 * line0/col0 so that errors keep the input's line and column) and checks what it holds.
 *
 * ## How it cuts
 * A record's extent is found by a byte scan that follows strings, escapes and bracket
 * depth; it stops early at a byte that cannot continue valid JSON (a control character
 * other than whitespace), keeping that byte, so the parser then reports the real error at
 * its real position. The structure between records (`,` `]`, trailing text) is checked
 * here, with the messages the whole-document parser gives ("expected ',' or ']' in array,
 * found '{'", "unexpected 't' after the end of the JSON value").
 *
 * ## Memory
 * A 1 MiB read buffer, plus two chunks (the one returned and the one before it): each at
 * most max_bytes of record text plus one record of at most max_record_bytes. A record longer than max_record_bytes is an error naming its first line and
 * column; nothing beyond max_record_bytes (+1 MiB) is ever held, whatever the input.
 *
 * ## Errors and order
 * Errors are reported in input order: a chunk's records come back before an error found
 * after them; the next call returns -1 with ftk_err_msg() = "line L, column C: what" or
 * "no records" / "empty input: no records". Reading failures (I/O) say so.
 *
 * Ownership: the reader owns the spans and the text they point to; both stay valid until
 * the second records_next() after the one that returned them (so threads can still work
 * on chunk k while chunk k+1 is read), or records_close().
 *
 * ## A whole input in memory
 * records_parse() parses a text already in memory as one JSON document: JSON Lines when
 * its first non-blank character (after an optional byte order mark) is `{`, else one JSON
 * value that must be an array; at least one record, each an object. It fills a
 * records_doc_t whose values point into its JSON document, which keeps a pointer to the
 * caller's text: the text must outlive it; records_doc_free() releases it. Errors: -1
 * with ftk_err_msg() = "line L, column C: record N: what" (N from 1; the caller adds the
 * file name), "line L, column C: what" for the document, "no records", "empty input: no
 * records", or a plain message for out of memory.
 */
#ifndef FTK_RECORDS_H
#define FTK_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

typedef struct {
    const char *text; /* the record's bytes (not NUL-terminated) */
    size_t len;
    unsigned line, col; /* position of text[0] in the input, from 1 (columns in code points) */
    int64_t index;      /* 0-based record number in the input */
} record_span_t;

typedef struct records records_t;

/* Opens path ("-": stdin) for reading. NULL with ftk_err_msg() set when it cannot. */
records_t *records_open(const char *path, size_t max_record_bytes);

/* The next chunk: up to max_records records, stopping once their text reaches max_bytes.
 * Returns the number of records (> 0), 0 at the end of the input, -1 on error. */
int64_t records_next(records_t *r, size_t max_records, size_t max_bytes, const record_span_t **spans);

/* XXH3-64 of every byte read so far: of the whole input once records_next() returned 0. */
uint64_t records_hash(const records_t *r);
/* Bytes read so far. */
uint64_t records_bytes(const records_t *r);

void records_close(records_t *r);

typedef struct {
    json_doc_t *doc;
    const json_value_t *recs; /* n objects */
    size_t n;
} records_doc_t;

/* Parses a JSON array or JSON Lines of objects (at least one). */
int records_parse(const char *text, size_t len, records_doc_t *out);
void records_doc_free(records_doc_t *d);

#endif
