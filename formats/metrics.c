/* metrics.c — metrics.jsonl into series, and its writer (metrics.h). */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../libcommon/atomic.h"
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

/* ---- the writer ---------------------------------------------------------------------------- */

void metrics_writer_init(metrics_writer_t *w, const char *path)
{
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s", path);
}

int metrics_trim_file(const char *path, int64_t step, double *elapsed0)
{
    buf_t in = {0}, out = {0};
    *elapsed0 = 0;
    /* a regular file of the run (a FIFO would stall the resume, /dev/zero fill memory):
     * 1 GiB is a million steps' lines */
    if (buf_read_small(&in, path, (size_t)1 << 30, BUF_NOFOLLOW) < 0) {
        int e = errno;
        buf_free(&in);
        errno = e;
        return e == ENOENT ? 0 : -1; /* ENOENT: none yet */
    }
    int rc = metrics_trim(&out, &in, step, elapsed0);
    if (rc == 0)
        rc = atomic_write_file(path, out.data, out.len);
    buf_free(&in);
    buf_free(&out);
    return rc < 0 ? -1 : 1;
}

int metrics_writer_open(metrics_writer_t *w, int64_t step, const char *events_dir, double *elapsed0, int *refused)
{
    int r = 0;
    /* The event files are trimmed like metrics.jsonl when there is a history to continue;
     * a new run leaves the directory's files as they are (its START record, which has
     * TensorBoard drop what it shows from that step on, is omitted too). */
    int history = metrics_trim_file(w->path, step, elapsed0);
    if (history < 0)
        w->err_sink = METRICS_SINK_FILE, r = errno == ELOOP || errno == EINVAL || errno == EFBIG;
    else if (!(w->f = fopen(w->path, "a")))
        w->err_sink = METRICS_SINK_FILE, ftk_err_set("%s: %s", w->path, strerror(errno));
    else if (events_dir && history && tfevents_trim(events_dir, step) < 0)
        w->err_sink = METRICS_SINK_EVENTS, r = errno == EFBIG;
    else if (events_dir && !(w->tb = tfevents_open(events_dir, history ? step + 1 : -1)))
        w->err_sink = METRICS_SINK_EVENTS;
    if (refused)
        *refused = r;
    return w->err_sink ? -1 : 0;
}

void metrics_writer_fail(metrics_writer_t *w, int e)
{
    if (!w->err[0])
        snprintf(w->err, sizeof w->err, "%s: %s", w->path, strerror(e ? e : EIO)), w->err_sink = METRICS_SINK_FILE;
}

/* The wall-clock time of a record, ISO 8601 UTC to the millisecond */
static const char *iso_now(char out[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
    return out;
}

static void tb_scalar(metrics_writer_t *w, const char *tag, int64_t step, double v)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (w->tb && tfevents_scalar(w->tb, tag, step, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, (float)v) < 0 &&
        !w->err[0])
        snprintf(w->err, sizeof w->err, "%s", ftk_err_msg()), w->err_sink = METRICS_SINK_EVENTS;
}

static void flush(metrics_writer_t *w)
{
    if (fflush(w->f) != 0 || ferror(w->f))
        metrics_writer_fail(w, errno);
}

void metrics_write_step(metrics_writer_t *w, const metrics_step_rec_t *r, const char *extra)
{
    if (!w->f)
        return;
    char now[32], dev[192] = "";
    if (r->device_mem)
        snprintf(dev, sizeof dev,
                 ", \"mem_device_peak_bytes\": %lld, \"mem_device_used_bytes\": %lld, \"mem_device_other_bytes\": %lld",
                 (long long)r->mem_device_peak, (long long)r->mem_device_used, (long long)r->mem_device_other);
    fprintf(w->f,
            "{\"kind\": \"step\", \"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
            "\"tokens\": %lld, \"tokens_seen\": %lld, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"time\": \"%s\", "
            "\"epoch\": %lld, \"ranks\": %d, \"micro_batches\": %lld, \"comm\": {\"allgather_bytes\": %.17g, "
            "\"reduce_scatter_bytes\": %.17g, \"allreduce_bytes\": %.17g, \"wait_s\": %.4f}%s%s, "
            "\"mem_peak_bytes\": %lld}\n",
            (long long)r->step, r->loss, r->lr, r->grad_norm, (long long)r->tokens, (long long)r->tokens_seen,
            r->tokens_per_s, r->elapsed_s, iso_now(now), (long long)r->epoch, r->ranks, (long long)r->micro_batches,
            r->allgather_bytes, r->reduce_scatter_bytes, r->allreduce_bytes, r->wait_s, extra ? extra : "", dev,
            (long long)r->mem_peak);
    flush(w);
    tb_scalar(w, "train/loss", r->step, r->loss);
    tb_scalar(w, "train/learning_rate", r->step, r->lr);
    tb_scalar(w, "train/grad_norm", r->step, r->grad_norm);
    tb_scalar(w, "train/tokens_per_s", r->step, r->tokens_per_s);
}

void metrics_write_eval(metrics_writer_t *w, int64_t step, double val_loss, int64_t val_tokens)
{
    if (!w->f)
        return;
    char now[32];
    fprintf(w->f, "{\"kind\": \"eval\", \"step\": %lld, \"val_loss\": %.17g, \"val_tokens\": %lld, \"time\": \"%s\"}\n",
            (long long)step, val_loss, (long long)val_tokens, iso_now(now));
    flush(w);
    tb_scalar(w, "eval/val_loss", step, val_loss);
}

void metrics_write_checkpoint(metrics_writer_t *w, const metrics_ckpt_rec_t *r)
{
    if (!w->f)
        return;
    char now[32];
    fprintf(w->f,
            "{\"kind\": \"checkpoint\", \"step\": %lld, \"checkpoint\": \"step-%08lld\", \"async\": %s, "
            "\"stall_s\": %.4f, \"write_s\": %.4f, \"bytes\": %lld, \"time\": \"%s\"}\n",
            (long long)r->step, (long long)r->step, r->async ? "true" : "false", r->stall_s, r->write_s,
            (long long)r->bytes, iso_now(now));
    fflush(w->f);
}

void metrics_write_snapshot(metrics_writer_t *w, int64_t step, double seconds, double wait_s, int64_t bytes)
{
    if (!w->f)
        return;
    char now[32];
    fprintf(w->f,
            "{\"kind\": \"memory_snapshot\", \"step\": %lld, \"seconds\": %.4f, \"wait_s\": %.4f, \"bytes\": %lld, "
            "\"time\": \"%s\"}\n",
            (long long)step, seconds, wait_s, (long long)bytes, iso_now(now));
    fflush(w->f);
}

void metrics_write_extend(metrics_writer_t *w, int64_t step, const char *changed)
{
    if (!w->f)
        return;
    char now[32];
    fprintf(w->f, "{\"kind\": \"extend\", \"step\": %lld, \"changed\": ", (long long)step);
    buf_t j = {0};
    json_write_string(&j, changed, strlen(changed));
    fprintf(w->f, "%s, \"bit_exact\": false, \"time\": \"%s\"}\n", j.data ? j.data : "\"\"", iso_now(now));
    buf_free(&j);
    flush(w);
}

void metrics_write_stderr_lost(metrics_writer_t *w, int64_t step)
{
    int e = ftk_stderr_errno();
    if (!w->f || !e || w->stderr_said)
        return;
    w->stderr_said = 1;
    char now[32], text[256];
    buf_t j = {0};
    snprintf(text, sizeof text, "standard error failed by this step (%s): its messages are lost; the metrics go on",
             strerror(e));
    json_write_string(&j, text, strlen(text));
    fprintf(w->f, "{\"kind\": \"warning\", \"step\": %lld, \"message\": %s, \"time\": \"%s\"}\n", (long long)step,
            j.data ? j.data : "\"\"", iso_now(now));
    buf_free(&j);
    flush(w);
}

void metrics_writer_close(metrics_writer_t *w)
{
    if (w->f)
        fclose(w->f);
    w->f = NULL;
}

int metrics_writer_close_events(metrics_writer_t *w, int discard)
{
    int rc = discard ? tfevents_discard(w->tb) : tfevents_close(w->tb);
    w->tb = NULL;
    return rc;
}
