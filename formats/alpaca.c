#include "alpaca.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "records.h"

const char alpaca_template_name[] = "alpaca";

static const char prompt_input_a[] =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n";
static const char prompt_input_b[] = "\n\n### Input:\n";
static const char prompt_noinput_a[] =
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n";
static const char prompt_tail[] = "\n\n### Response:\n";

int alpaca_prompt(const alpaca_rec_t *r, buf_t *out)
{
    if (r->input_len) {
        return buf_append(out, prompt_input_a, sizeof prompt_input_a - 1) ||
                       buf_append(out, r->instruction, r->instruction_len) ||
                       buf_append(out, prompt_input_b, sizeof prompt_input_b - 1) ||
                       buf_append(out, r->input, r->input_len) ||
                       buf_append(out, prompt_tail, sizeof prompt_tail - 1)
                   ? -1
                   : 0;
    }
    return buf_append(out, prompt_noinput_a, sizeof prompt_noinput_a - 1) ||
                   buf_append(out, r->instruction, r->instruction_len) ||
                   buf_append(out, prompt_tail, sizeof prompt_tail - 1)
               ? -1
               : 0;
}

static int record_error(const json_doc_t *doc, size_t off, size_t idx, const char *fmt, const char *field)
{
    unsigned line, col;
    json_position(doc, off, &line, &col);
    char what[256];
    snprintf(what, sizeof what, fmt, field);
    ftk_err_set("line %u, column %u: record %zu: %s", line, col, idx + 1, what);
    return -1;
}

static int get_field(const json_doc_t *doc, const json_value_t *rec, size_t idx, const char *key, int required,
                     const char **s, size_t *len)
{
    const json_value_t *v = json_get(rec, key);
    *s = "";
    *len = 0;
    if (!v || (!required && v->type == JSON_NULL)) {
        if (required)
            return record_error(doc, rec->off, idx, "required field \"%s\" is missing", key);
        return 0;
    }
    if (v->type != JSON_STRING) {
        char m[128];
        snprintf(m, sizeof m, "field \"%%s\" must be a string, not %s", json_type_name(v->type));
        return record_error(doc, v->off, idx, m, key);
    }
    *s = v->u.str.s;
    *len = v->u.str.len;
    return 0;
}

int alpaca_record(const json_doc_t *doc, const json_value_t *r, size_t k, alpaca_rec_t *a)
{
    if (r->type != JSON_OBJECT) {
        char m[96];
        snprintf(m, sizeof m, "expected an object, found %s%%s", json_type_name(r->type));
        return record_error(doc, r->off, k, m, "");
    }
    return get_field(doc, r, k, "instruction", 1, &a->instruction, &a->instruction_len) < 0 ||
                   get_field(doc, r, k, "input", 0, &a->input, &a->input_len) < 0 ||
                   get_field(doc, r, k, "output", 1, &a->output, &a->output_len) < 0
               ? -1
               : 0;
}

int alpaca_parse(const char *text, size_t len, alpaca_t *out)
{
    memset(out, 0, sizeof *out);
    records_doc_t d;
    if (records_parse(text, len, &d) < 0)
        return -1;
    out->doc = d.doc;
    out->recs = calloc(d.n, sizeof *out->recs);
    if (!out->recs) {
        ftk_err_set("out of memory");
        alpaca_free(out);
        return -1;
    }
    for (size_t k = 0; k < d.n; k++) {
        if (alpaca_record(d.doc, &d.recs[k], k, &out->recs[k]) < 0) {
            alpaca_free(out);
            return -1;
        }
        out->n++;
    }
    return 0;
}

void alpaca_free(alpaca_t *a)
{
    json_free(a->doc);
    free(a->recs);
    memset(a, 0, sizeof *a);
}
