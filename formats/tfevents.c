/* tfevents.c — TensorBoard event files (tfevents.h).
 *
 * Why our own CRC-32C and protobuf bytes: none of the chosen libraries computes
 * CRC-32C (zlib's crc32 is another polynomial), and the three messages written here are
 * a few fixed fields; a protobuf library would be a dependency for 40 lines. */
#include "tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "protobuf.h"

struct tfevents {
    FILE *f;
    char *path, *dir; /* dir: when tfevents_open made it, else NULL */
    int failed;
};

/* An event file is a few hundred bytes a step, as metrics.jsonl is: 1 GiB is millions of
 * steps, and the bound a file read back whole (tfevents_trim) must have. */
#define TFEVENTS_MAX_BYTES ((size_t)1 << 30)

uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* reflected 0x1EDC6F41; idempotent, so a race only repeats the work */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint32_t masked(const void *p, size_t n)
{
    uint32_t c = crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static int varint(buf_t *b, uint64_t v)
{
    do {
        unsigned char c = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (buf_putc(b, (char)(v ? c | 0x80 : c)) < 0)
            return -1;
    } while (v);
    return 0;
}

static int put_le(buf_t *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        if (buf_putc(b, (char)(v >> (8 * i))) < 0)
            return -1;
    return 0;
}

static int record(tfevents_t *t, const buf_t *data)
{
    buf_t r = {0};
    int rc = put_le(&r, data->len, 8);
    rc = rc || put_le(&r, masked(r.data, 8), 4) || buf_append(&r, data->data, data->len) ||
         put_le(&r, masked(data->data, data->len), 4);
    if (!rc && (fwrite(r.data, 1, r.len, t->f) != r.len || fflush(t->f) != 0)) {
        ftk_err_set("%s: %s", t->path, strerror(errno));
        t->failed = 1;
        rc = -1;
    }
    buf_free(&r);
    return rc ? -1 : 0;
}

/* Event header: wall_time (field 1, fixed64) and step (field 2, varint) */
static int event_head(buf_t *e, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    return buf_putc(e, 0x09) || put_le(e, bits, 8) || buf_putc(e, 0x10) || varint(e, (uint64_t)step) ? -1 : 0;
}

tfevents_t *tfevents_open(const char *dir, int64_t first_step)
{
    int made_dir = mkdir(dir, 0777) == 0;
    if (!made_dir && errno != EEXIST) {
        ftk_err_set("%s: %s", dir, strerror(errno));
        return NULL;
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tfevents_t *t = calloc(1, sizeof *t);
    buf_t p = {0};
    if (!t || (made_dir && !(t->dir = strdup(dir))) ||
        buf_printf(&p, "%s/events.out.tfevents.%lld.%s.%ld", dir, (long long)ts.tv_sec, host, (long)getpid()) < 0) {
        if (t)
            free(t->dir);
        free(t);
        buf_free(&p);
        if (made_dir)
            rmdir(dir);
        ftk_err_set("out of memory");
        return NULL;
    }
    t->path = p.data;
    if (!(t->f = fopen(t->path, "wbx"))) { /* not ours to remove, whatever is there */
        ftk_err_set("%s: %s", t->path, strerror(errno));
        if (t->dir)
            rmdir(t->dir);
        free(t->path);
        free(t->dir);
        free(t);
        return NULL;
    }
    buf_t e = {0}, s = {0};
    static const char version[] = "brain.Event:2";
    double wall = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    int rc = event_head(&e, wall, 0) || buf_putc(&e, 0x1a) || varint(&e, sizeof version - 1) ||
             buf_append(&e, version, sizeof version - 1);
    /* SessionLog { status = 1: START } as session_log = 7 */
    if (first_step >= 0)
        rc = rc || event_head(&s, wall, first_step) || buf_append(&s, "\x3a\x02\x08\x01", 4);
    if (rc)
        ftk_err_set("out of memory");
    rc = rc || record(t, &e) || (first_step >= 0 && record(t, &s));
    buf_free(&e);
    buf_free(&s);
    if (rc) { /* a file without even its header is no file: nothing left behind */
        tfevents_discard(t);
        return NULL;
    }
    return t;
}

int tfevents_scalar(tfevents_t *t, const char *tag, int64_t step, double wall_time, float value)
{
    buf_t val = {0}, sum = {0}, e = {0};
    size_t tl = strlen(tag);
    uint32_t bits;
    memcpy(&bits, &value, 4);
    /* Value { tag = 1 (bytes); simple_value = 2 (fixed32) } */
    int rc = buf_putc(&val, 0x0a) || varint(&val, tl) || buf_append(&val, tag, tl) || buf_putc(&val, 0x15) ||
             put_le(&val, bits, 4);
    /* Summary { value = 1 (message) } */
    rc = rc || buf_putc(&sum, 0x0a) || varint(&sum, val.len) || buf_append(&sum, val.data, val.len);
    /* Event { ...; summary = 5 (message) } */
    rc = rc || event_head(&e, wall_time, step) || buf_putc(&e, 0x2a) || varint(&e, sum.len) ||
         buf_append(&e, sum.data, sum.len);
    if (rc)
        ftk_err_set("out of memory");
    rc = rc || record(t, &e);
    buf_free(&val);
    buf_free(&sum);
    buf_free(&e);
    return rc ? -1 : 0;
}

/* The fields of an Event that trimming needs: its step (0 when absent, as protobuf's
 * default) and whether it is a file_version record. 0, or -1 when the bytes are not a
 * protobuf message. */
static int event_fields(const unsigned char *p, size_t n, int64_t *step, int *version)
{
    *step = 0;
    *version = 0;
    pb_t b = {p, p + n}, sub;
    while (b.p < b.end) {
        uint64_t field, v;
        int wt;
        if (pb_field(&b, &field, &wt, &v, &sub) < 0)
            return -1;
        if (field == 2 && wt == 0)
            *step = (int64_t)v;
        if (field == 3 && wt == 2)
            *version = 1;
    }
    return 0;
}

static uint64_t get_le(const char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | (unsigned char)p[i];
    return v;
}

/* One event file, as tfevents_trim() says. */
static int trim_file(const char *path, int64_t step)
{
    buf_t in = {0}, out = {0};
    if (buf_read_small(&in, path, TFEVENTS_MAX_BYTES, BUF_NOFOLLOW) < 0) {
        int e = errno;
        buf_free(&in);
        /* a link, a directory, a FIFO, gone since the listing: not an event file written here */
        return e == ELOOP || e == EINVAL || e == ENOENT ? 0 : -1;
    }
    int changed = 0, kept = 0, rc = 0;
    for (size_t i = 0; i < in.len && rc == 0;) {
        size_t left = in.len - i;
        const char *r = in.data + i;
        uint64_t len = left >= 16 ? get_le(r, 8) : 0;
        /* a torn or damaged record: what follows cannot be framed, and no reader reads past it */
        if (left < 16 || get_le(r + 8, 4) != masked(r, 8) || len > left - 16 ||
            get_le(r + 12 + len, 4) != masked(r + 12, (size_t)len)) {
            changed = 1;
            break;
        }
        int64_t st;
        int version;
        int parsed = event_fields((const unsigned char *)r + 12, (size_t)len, &st, &version) == 0;
        i += 16 + (size_t)len;
        if (parsed && !version && st > step) {
            changed = 1;
            continue;
        }
        kept += !(parsed && version);
        rc = buf_append(&out, r, 16 + (size_t)len);
    }
    if (rc == 0 && changed && !kept && unlink(path) < 0) {
        ftk_err_set("%s: %s", path, strerror(errno));
        rc = -1;
    } else if (rc == 0 && changed && kept)
        rc = atomic_write_file(path, out.data, out.len);
    buf_free(&in);
    buf_free(&out);
    return rc;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int tfevents_trim(const char *dir, int64_t step)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        ftk_err_set("%s: %s", dir, strerror(errno));
        return -1;
    }
    /* the names first: the directory changes under the walk (each file replaced by rename) */
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20))
            continue;
        if (n == cap) {
            char **q = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
            if (!q) {
                rc = -1;
                break;
            }
            names = q;
        }
        buf_t p = {0};
        if (buf_printf(&p, "%s/%s", dir, e->d_name) < 0)
            rc = -1;
        else
            names[n++] = p.data;
    }
    closedir(d);
    if (rc < 0)
        ftk_err_set("out of memory");
    if (n)
        qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0)
            rc = trim_file(names[i], step);
        free(names[i]);
    }
    free(names);
    return rc;
}

int tfevents_close(tfevents_t *t)
{
    if (!t)
        return 0;
    int rc = t->failed ? -1 : 0;
    if (rc) /* reported when it happened; said again for a caller that reports it here */
        ftk_err_set("%s: a write failed: the records after it are missing", t->path);
    if (t->f && fclose(t->f) != 0 && !rc) {
        ftk_err_set("%s: %s", t->path, strerror(errno));
        rc = -1;
    }
    free(t->path);
    free(t->dir);
    free(t);
    return rc;
}

int tfevents_discard(tfevents_t *t)
{
    if (!t)
        return 0;
    int rc = 0;
    if (t->f)
        fclose(t->f);
    t->f = NULL;
    t->failed = 0;
    if (unlink(t->path) < 0 && errno != ENOENT) {
        ftk_err_set("%s: %s", t->path, strerror(errno));
        rc = -1;
    }
    if (t->dir)
        rmdir(t->dir); /* only when empty: another writer's files stay */
    tfevents_close(t);
    return rc;
}
