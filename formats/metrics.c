/* metrics.c — metrics.jsonl into series (metrics.h). */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "json.h"

/* A metrics file is a few hundred bytes a step: 1 GiB is millions of steps. */
#define METRICS_MAX_BYTES (1LL << 30)

static double num(const json_value_t *o, const char *key)
{
    const json_value_t *v = json_get(o, key);
    return v && v->type == JSON_NUMBER ? v->u.num.v : NAN;
}

static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 64;
    void *q = realloc(*p, c * size);
    if (!q) {
        ftk_err_set("out of memory");
        return -1;
    }
    *p = q;
    *cap = c;
    return 0;
}

/* A record's step: its "step" as a number, NaN when it has none or one no int64_t holds
 * (a forged 1e300 is no step, not undefined behaviour in a cast). */
static double record_step(const json_value_t *o)
{
    double s = num(o, "step");
    return s >= -0x1p63 && s < 0x1p63 ? s : NAN;
}

/* One line of a metrics file, as both the reader and the trimming see it: the bytes
 * [s, s + n) (the newline excluded), whether the newline ends it (a last line without one
 * is a torn write), and its JSON (doc and root: owned, json_free(doc); NULL for an empty
 * line and for one that does not parse, which sets bad and ftk_err_msg()). */
typedef struct {
    const char *s;
    size_t n;
    int complete, bad;
    json_doc_t *doc;
    json_value_t *root;
} mline_t;

/* The line at *pos of text (line: its number, for messages), *pos moved past it; 0 at
 * the end. Each line is parsed alone: the whole pass is linear in the file's size. */
static int next_line(const buf_t *text, size_t *pos, unsigned line, mline_t *l)
{
    memset(l, 0, sizeof *l);
    if (!text->data || *pos >= text->len)
        return 0;
    l->s = text->data + *pos;
    const char *nl = memchr(l->s, '\n', text->len - *pos);
    l->n = nl ? (size_t)(nl - l->s) : text->len - *pos;
    l->complete = nl != NULL;
    *pos += l->n + (nl ? 1 : 0);
    json_opts_t jo = {.line0 = line};
    if (l->n && !(l->doc = json_parse(l->s, l->n, &jo, &l->root)))
        l->bad = 1;
    return 1;
}

int metrics_read(const char *path, metrics_t *m)
{
    memset(m, 0, sizeof *m);
    struct stat sb;
    if (stat(path, &sb) < 0) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    buf_t name = {0}, text = {0};
    if (buf_printf(&name, "%s%s", path, S_ISDIR(sb.st_mode) ? "/metrics.jsonl" : "") < 0)
        return -1;
    struct stat fb;
    if (stat(name.data, &fb) < 0 || !S_ISREG(fb.st_mode)) {
        ftk_err_set("%s: %s", name.data, errno ? strerror(errno) : "not a regular file");
        buf_free(&name);
        return -1;
    }
    if (fb.st_size > METRICS_MAX_BYTES) {
        ftk_err_set("%s: %lld bytes: larger than a metrics file can be (1 GiB)", name.data, (long long)fb.st_size);
        buf_free(&name);
        return -1;
    }
    if (buf_read_file(&text, name.data) < 0) {
        buf_free(&name);
        return -1;
    }
    m->name = strdup(path);
    size_t cs = 0, ce = 0, pos = 0;
    int rc = m->name ? 0 : -1;
    mline_t l;
    for (unsigned line = 1; rc == 0 && next_line(&text, &pos, line, &l); line++) {
        if (l.bad) {
            /* the last line of a run killed while writing it: the history up to there */
            if (!l.complete)
                break;
            ftk_err_prefix("%s: ", name.data);
            rc = -1;
            break;
        }
        const json_value_t *o = l.root;
        if (o && o->type == JSON_OBJECT) {
            const json_value_t *k = json_get(o, "kind");
            const char *kind = k && k->type == JSON_STRING ? k->u.str.s
                               : json_get(o, "loss")       ? "step"
                               : json_get(o, "val_loss")   ? "eval"
                                                           : "";
            double step = record_step(o);
            if (isnan(step))
                ;
            else if (!strcmp(kind, "step")) {
                if ((rc = grow((void **)&m->steps, &cs, m->n_steps, sizeof *m->steps)) == 0)
                    m->steps[m->n_steps++] = (metrics_step_t){(int64_t)step, num(o, "loss"), num(o, "lr"),
                                                              num(o, "grad_norm"), num(o, "tokens_per_s"),
                                                              num(o, "elapsed_s")};
            } else if (!strcmp(kind, "eval")) {
                if ((rc = grow((void **)&m->evals, &ce, m->n_evals, sizeof *m->evals)) == 0)
                    m->evals[m->n_evals++] = (metrics_eval_t){(int64_t)step, num(o, "val_loss")};
            }
        }
        json_free(l.doc);
    }
    if (rc == 0 && !m->n_steps && !m->n_evals) {
        ftk_err_set("%s: no step or evaluation records", name.data);
        rc = -1;
    }
    buf_free(&text);
    buf_free(&name);
    if (rc < 0 && !m->name)
        ftk_err_set("out of memory");
    if (rc < 0)
        metrics_free(m);
    return rc;
}

void metrics_free(metrics_t *m)
{
    free(m->name);
    free(m->steps);
    free(m->evals);
    memset(m, 0, sizeof *m);
}

int metrics_trim(buf_t *out, const buf_t *in, int64_t step, double *elapsed0)
{
    if (elapsed0)
        *elapsed0 = 0;
    size_t pos = 0;
    mline_t l;
    for (unsigned line = 1; next_line(in, &pos, line, &l); line++) {
        double st = l.root ? num(l.root, "step") : NAN;
        int keep = l.complete && !(st > (double)step);
        int rc = keep ? buf_append(out, l.s, l.n + 1) : 0;
        double el = keep && l.root ? num(l.root, "elapsed_s") : NAN;
        if (elapsed0 && isfinite(el))
            *elapsed0 = el;
        json_free(l.doc);
        if (rc < 0)
            return -1;
    }
    return 0;
}
