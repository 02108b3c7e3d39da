/* alpaca.h — Alpaca instruction data: reading and the prompt template.
 *
 * ## Input
 * A JSON array of records, or JSON Lines (one record per line), UTF-8. A record is an
 * object with
 *   "instruction"  string, required
 *   "input"        string, optional (absent, null or "" select the template without input)
 *   "output"       string, required
 * Other members are ignored. Anything else (malformed JSON, invalid UTF-8, a missing or
 * non-string field, no records at all) is an error naming the record (1-based), its line
 * and column.
 *
 * ## Template
 * Word for word as Stanford Alpaca (train.py, PROMPT_DICT) and LitGPT (prompts.py, Alpaca):
 *
 *   with input:    "Below is an instruction that describes a task, paired with an input that
 *                   provides further context. Write a response that appropriately completes
 *                   the request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}
 *                   \n\n### Response:\n"
 *   without input: "Below is an instruction that describes a task. Write a response that
 *                   appropriately completes the request.\n\n### Instruction:\n{instruction}
 *                   \n\n### Response:\n"
 * (single lines in the code; wrapped here). The response is the output, unchanged.
 *
 * Ownership: alpaca_parse() fills an alpaca_t whose strings point into its JSON document
 * and the caller's text; the text must outlive it; alpaca_free() releases it. Errors: -1
 * with ftk_err_msg() = "line L, column C: record N: what" (the caller adds the file name).
 */
#ifndef FTK_ALPACA_H
#define FTK_ALPACA_H

#include <stddef.h>

#include "../libcommon/buf.h"
#include "json.h"

typedef struct {
    const char *instruction, *input, *output;
    size_t instruction_len, input_len, output_len;
} alpaca_rec_t;

typedef struct {
    json_doc_t *doc;
    alpaca_rec_t *recs;
    size_t n;
} alpaca_t;

int alpaca_parse(const char *text, size_t len, alpaca_t *out);
/* One record: r (a parsed value of doc, the idx-th record, 0-based) checked and its
 * fields pointed at (they live in doc). Errors as for alpaca_parse(). This is what a
 * streaming reader (formats/records.h) calls per record. */
int alpaca_record(const json_doc_t *doc, const json_value_t *r, size_t idx, alpaca_rec_t *a);
void alpaca_free(alpaca_t *a);

/* The fields of one parsed record (index from 0, for messages); the strings point into
 * the document. Returns 0 or -1 with the message above. */
int alpaca_record(const json_doc_t *doc, const json_value_t *rec, size_t index, alpaca_rec_t *out);

/* Appends the prompt (template filled with the record) to out. Returns 0 or -1 (OOM). */
int alpaca_prompt(const alpaca_rec_t *r, buf_t *out);

extern const char alpaca_template_name[]; /* "alpaca" */

#endif
