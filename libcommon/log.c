#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ftk_quiet = 0;
static atomic_int stderr_errno; /* the first failed message's errno (0: none failed) */
static volatile sig_atomic_t stderr_unstalled; /* O_NONBLOCK set on fd 2 by ftk_stderr_unstall() */
static const char *tool_name = "ftk";
static _Thread_local char err_buf[2048];

void ftk_set_tool(const char *name) { tool_name = name; }
const char *ftk_tool(void) { return tool_name; }

static void vmsg(const char *kind, const char *fmt, va_list ap)
{
    int saved = errno; /* a caller may report, then look at errno */
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    int n;
    /* EINTR: a signal came while the pipe was full; once ftk_stderr_unstall() ran (the
     * signal's handler), the next try cannot wait (EAGAIN), and before, it waits again */
    for (int tries = 0;; tries++) {
        errno = 0;
        n = kind ? fprintf(stderr, "%s: %s: %s\n", tool_name, kind, line) : fprintf(stderr, "%s: %s\n", tool_name, line);
        if (n >= 0 || errno != EINTR || tries == 3)
            break;
        clearerr(stderr);
    }
    if (n < 0) {
        int e = errno ? errno : EIO, none = 0;
        atomic_compare_exchange_strong(&stderr_errno, &none, e);
        clearerr(stderr);
    }
    errno = saved;
}

int ftk_stderr_errno(void) { return atomic_load(&stderr_errno); }

void ftk_stderr_unstall(void)
{
    int saved = errno; /* a signal handler's */
    struct stat sb;
    int fl = fcntl(2, F_GETFL);
    if (!stderr_unstalled && fl >= 0 && !(fl & O_NONBLOCK) && fstat(2, &sb) == 0 && S_ISFIFO(sb.st_mode) &&
        fcntl(2, F_SETFL, fl | O_NONBLOCK) == 0)
        stderr_unstalled = 1;
    errno = saved;
}

void ftk_stderr_restore(void)
{
    int fl = fcntl(2, F_GETFL);
    if (stderr_unstalled && fl >= 0)
        fcntl(2, F_SETFL, fl & ~O_NONBLOCK);
    stderr_unstalled = 0;
}

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
