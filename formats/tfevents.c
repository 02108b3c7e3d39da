/* tfevents.c — TensorBoard event files (tfevents.h).
 *
 * Why our own CRC-32C and protobuf bytes: none of the chosen libraries computes
 * CRC-32C (zlib's crc32 is another polynomial), and the three messages written here are
 * a few fixed fields; a protobuf library would be a dependency for 40 lines. */
#include "tfevents.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../libcommon/buf.h"
#include "../libcommon/log.h"

struct tfevents {
    FILE *f;
    char *path;
    int failed;
};

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

tfevents_t *tfevents_open(const char *dir)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) {
        ftk_err_set("%s: %s", dir, strerror(errno));
        return NULL;
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tfevents_t *t = calloc(1, sizeof *t);
    buf_t p = {0};
    if (!t || buf_printf(&p, "%s/events.out.tfevents.%lld.%s.%ld", dir, (long long)ts.tv_sec, host,
                         (long)getpid()) < 0) {
        free(t);
        buf_free(&p);
        ftk_err_set("out of memory");
        return NULL;
    }
    t->path = p.data;
    if (!(t->f = fopen(t->path, "wbx"))) {
        ftk_err_set("%s: %s", t->path, strerror(errno));
        free(t->path);
        free(t);
        return NULL;
    }
    buf_t e = {0};
    static const char version[] = "brain.Event:2";
    int rc = event_head(&e, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, 0) || buf_putc(&e, 0x1a) ||
             varint(&e, sizeof version - 1) || buf_append(&e, version, sizeof version - 1);
    rc = rc || record(t, &e);
    buf_free(&e);
    if (rc) {
        tfevents_close(t);
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

int tfevents_close(tfevents_t *t)
{
    if (!t)
        return 0;
    int rc = t->failed ? -1 : 0;
    if (t->f && fclose(t->f) != 0 && !rc) {
        ftk_err_set("%s: %s", t->path, strerror(errno));
        rc = -1;
    }
    free(t->path);
    free(t);
    return rc;
}
