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
    size_t cs = 0, ce = 0;
    int rc = m->name ? 0 : -1;
    const char *p = text.data ? text.data : "", *end = p + text.len;
    for (unsigned line = 1; p < end && rc == 0; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        json_value_t *o;
        json_opts_t jo = {.line0 = line};
        json_doc_t *doc = len ? json_parse(p, len, &jo, &o) : NULL;
        if (len && !doc) {
            /* the last line of a run killed while writing it: the history up to there */
            if (!nl)
                break;
            ftk_err_prefix("%s: ", name.data);
            rc = -1;
            break;
        }
        p += len + (nl ? 1 : 0);
        if (!doc)
            continue;
        if (o->type == JSON_OBJECT) {
            const json_value_t *k = json_get(o, "kind");
            const char *kind = k && k->type == JSON_STRING ? k->u.str.s
                               : json_get(o, "loss")       ? "step"
                               : json_get(o, "val_loss")   ? "eval"
                                                           : "";
            double step = num(o, "step");
            if (!isfinite(step))
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
        json_free(doc);
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
    for (size_t i = 0; i < in->len;) {
        const char *line = in->data + i;
        const char *nl = memchr(line, '\n', in->len - i);
        size_t e = nl ? (size_t)(nl - in->data) + 1 : in->len;
        const char *s = strstr(line, "\"step\": ");
        long long st = s && s < in->data + e ? atoll(s + 8) : 0;
        if (nl && st <= step) {
            if (buf_append(out, line, e - i) < 0)
                return -1;
            const char *el = strstr(line, "\"elapsed_s\": ");
            if (elapsed0 && el && el < in->data + e)
                *elapsed0 = atof(el + 13);
        }
        i = e;
    }
    return 0;
}
