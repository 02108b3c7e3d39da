#include "buf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

int buf_reserve(buf_t *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > ((size_t)-1) / 2) {
            ftk_err_set("out of memory");
            return -1;
        }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) {
        ftk_err_set("out of memory (%zu bytes)", cap);
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

int buf_printf(buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(b, (size_t)n) < 0) {
        if (n < 0)
            ftk_err_set("internal: bad format");
        return -1;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int buf_append(buf_t *b, const void *p, size_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

int buf_putc(buf_t *b, char c) { return buf_append(b, &c, 1); }

void buf_free(buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int buf_read_file(buf_t *b, const char *path)
{
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (;;) {
        if (buf_reserve(b, 1 << 16) < 0) {
            rc = -1;
            break;
        }
        size_t n = fread(b->data + b->len, 1, b->cap - b->len - 1, f);
        b->len += n;
        b->data[b->len] = 0;
        if (n == 0) {
            if (ferror(f)) {
                ftk_err_set("%s: read error: %s", is_stdin ? "<stdin>" : path, strerror(errno));
                rc = -1;
            }
            break;
        }
    }
    if (!is_stdin)
        fclose(f);
    if (rc == 0 && !b->data && buf_reserve(b, 0) == 0)
        b->data[0] = 0;
    return rc;
}
