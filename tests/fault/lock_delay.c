/* lock_delay.so: an LD_PRELOAD shim for tests/fault/lock.sh that widens the windows of the
 * run-directory lock (formats/checkpoint.c ckpt_lock_run) so that the races between two
 * ftk-train started together happen on demand instead of once in a while:
 *   FTK_TEST_LOCK_DELAY_MS  sleep before each fcntl(F_SETLK) (after mkdir and open)
 *   FTK_TEST_LOCK_HOLD_MS   sleep after each fcntl(F_SETLK) that took the lock
 * Everything else is the real call; the locks are real. Test-only: not part of ftk. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

static void nap(const char *var)
{
    const char *s = getenv(var);
    long ms = s ? atol(s) : 0;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) < 0)
        ;
}

int fcntl(int fd, int cmd, ...)
{
    static int (*real)(int, int, ...);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fcntl");
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *); /* every fcntl argument fits a pointer's register */
    va_end(ap);
    if (cmd != F_SETLK)
        return real(fd, cmd, arg);
    nap("FTK_TEST_LOCK_DELAY_MS");
    int r = real(fd, cmd, arg);
    if (r == 0)
        nap("FTK_TEST_LOCK_HOLD_MS");
    return r;
}
