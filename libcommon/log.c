#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

int ftk_quiet = 0;
static atomic_int stderr_errno; /* the first failed message's errno (0: none failed) */
static const char *tool_name = "ftk";
static _Thread_local char err_buf[2048];

void ftk_set_tool(const char *name) { tool_name = name; }
const char *ftk_tool(void) { return tool_name; }

static void vmsg(const char *kind, const char *fmt, va_list ap)
{
    int saved = errno; /* a caller may report, then look at errno */
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    errno = 0;
    int n = kind ? fprintf(stderr, "%s: %s: %s\n", tool_name, kind, line)
                 : fprintf(stderr, "%s: %s\n", tool_name, line);
    if (n < 0) {
        int e = errno ? errno : EIO, none = 0;
        atomic_compare_exchange_strong(&stderr_errno, &none, e);
        clearerr(stderr);
    }
    errno = saved;
}

int ftk_stderr_errno(void) { return atomic_load(&stderr_errno); }

void ftk_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg("error", fmt, ap);
    va_end(ap);
}

void ftk_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg("warning", fmt, ap);
    va_end(ap);
}

void ftk_info(const char *fmt, ...)
{
    if (ftk_quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vmsg(NULL, fmt, ap);
    va_end(ap);
}

void ftk_err_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
}

void ftk_err_prefix(const char *fmt, ...)
{
    char old[sizeof err_buf];
    memcpy(old, err_buf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof err_buf)
        snprintf(err_buf + n, sizeof err_buf - (size_t)n, "%s", old);
}

const char *ftk_err_msg(void) { return err_buf[0] ? err_buf : "unknown error"; }
