#include "buf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

const char *buf_file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
           : S_ISREG(m)  ? "a regular file"
                         : "not a regular file";
}

int buf_read_small(buf_t *b, const char *path, size_t max, int flags)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | (flags & BUF_NOFOLLOW ? O_NOFOLLOW : 0));
    if (fd < 0) {
        int e = errno;
        struct stat sb;
        /* O_NOFOLLOW fails with ELOOP on a link (EMLINK on some BSDs): say it plainly */
        if ((flags & BUF_NOFOLLOW) && (e == ELOOP || e == EMLINK) && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
            ftk_err_set("%s: a symbolic link, refused (ftk writes this file itself, never as a link)", path);
            e = ELOOP;
        } else {
            ftk_err_set("%s: %s", path, strerror(e));
        }
        errno = e;
        return -1;
    }
    struct stat sb;
    int e = 0;
    if (fstat(fd, &sb) < 0) {
        e = errno;
        ftk_err_set("%s: %s", path, strerror(e));
    } else if (!S_ISREG(sb.st_mode)) {
        e = EINVAL;
        ftk_err_set("%s: %s, not a regular file: refused", path, buf_file_kind(sb.st_mode));
    } else if ((uint64_t)sb.st_size > max) {
        e = EFBIG;
        ftk_err_set("%s: %lld bytes, more than the %zu this file may have: refused", path, (long long)sb.st_size,
                    max);
    }
    /* the size may change under us: read at most max + 1 bytes whatever fstat said */
    size_t got = 0;
    while (!e) {
        if (buf_reserve(b, 1 << 12) < 0) {
            e = ENOMEM;
            break;
        }
        size_t room = b->cap - b->len - 1, left = max + 1 - got;
        ssize_t n = read(fd, b->data + b->len, room < left ? room : left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            e = errno;
            ftk_err_set("%s: read error: %s", path, strerror(e));
            break;
        }
        if (n == 0)
            break;
        b->len += (size_t)n;
        got += (size_t)n;
        b->data[b->len] = 0;
        if (got > max) {
            e = EFBIG;
            ftk_err_set("%s: more than the %zu bytes this file may have: refused", path, max);
        }
    }
    close(fd);
    if (!e && !b->data && buf_reserve(b, 0) == 0)
        b->data[0] = 0;
    errno = e;
    return e ? -1 : 0;
}
