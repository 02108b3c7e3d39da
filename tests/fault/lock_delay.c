/* lock_delay.so: an LD_PRELOAD shim for tests/fault/lock.sh that holds ftk-train at the
 * run-directory lock (formats/rundir.c rundir_lock) until the test lets it go, so
 * that the races between two ftk-train started together happen in a chosen order:
 *   FTK_TEST_LOCK_BEFORE=F  before each fcntl(F_SETLK) (after mkdir and open): create
 *                           F.waiting, then wait until F exists
 *   FTK_TEST_LOCK_AFTER=F   the same after each fcntl(F_SETLK) that took the lock
 * (60 s at most each). Everything else is the real call; the locks are real. Test-only:
 * not part of ftk. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void hold(const char *var)
{
    const char *f = getenv(var);
    if (!f)
        return;
    char w[4096];
    snprintf(w, sizeof w, "%s.waiting", f);
    FILE *m = fopen(w, "w");
    if (m)
        fclose(m);
    struct timespec ts = {0, 10000000L};
    for (int i = 0; i < 6000 && access(f, F_OK) != 0; i++)
        nanosleep(&ts, NULL);
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
    hold("FTK_TEST_LOCK_BEFORE");
    int r = real(fd, cmd, arg);
    if (r == 0)
        hold("FTK_TEST_LOCK_AFTER");
    return r;
}
