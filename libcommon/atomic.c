#include "atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define MAX_PENDING 64
/* Paths the signal handler unlinks: plain arrays, so the handler touches no allocator. */
static char *volatile pending[MAX_PENDING];

static void pending_add(char *p)
{
    for (int i = 0; i < MAX_PENDING; i++)
        if (!pending[i]) {
            pending[i] = p;
            return;
        }
}

static void pending_remove(const char *p)
{
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i] == p)
            pending[i] = NULL;
}

static void on_signal(int sig)
{
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i])
            unlink(pending[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

void atomic_install_signal_cleanup(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = fsync(fd);
    /* Some filesystems refuse fsync on directories; the rename is still atomic there. */
    if (rc < 0 && (errno == EINVAL || errno == EBADF))
        rc = 0;
    int e = errno;
    close(fd);
    if (rc < 0) {
        ftk_err_set("%s: fsync: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

int atomic_begin(atomic_file_t *a, const char *final_path)
{
    a->final_path = strdup(final_path);
    char *d = strdup(final_path), *b = strdup(final_path);
    if (!a->final_path || !d || !b) {
        free(a->final_path);
        free(d);
        free(b);
        ftk_err_set("out of memory");
        return -1;
    }
    const char *dir = dirname(d), *base = basename(b);
    size_t n = strlen(dir) + strlen(base) + 48;
    a->tmp_path = malloc(n);
    if (a->tmp_path)
        snprintf(a->tmp_path, n, "%s/.%s.tmp.%ld", dir, base, (long)getpid());
    free(d);
    free(b);
    if (!a->tmp_path) {
        free(a->final_path);
        ftk_err_set("out of memory");
        return -1;
    }
    unlink(a->tmp_path); /* a leftover of an earlier process with the same pid */
    pending_add(a->tmp_path);
    return 0;
}

static void atomic_free(atomic_file_t *a)
{
    pending_remove(a->tmp_path);
    free(a->tmp_path);
    free(a->final_path);
    a->tmp_path = a->final_path = NULL;
}

int atomic_commit(atomic_file_t *a)
{
    if (fsync_path(a->tmp_path) < 0) {
        atomic_abort(a);
        return -1;
    }
    if (rename(a->tmp_path, a->final_path) < 0) {
        ftk_err_set("%s: rename: %s", a->final_path, strerror(errno));
        atomic_abort(a);
        return -1;
    }
    char *d = strdup(a->final_path);
    int rc = d ? fsync_path(dirname(d)) : 0;
    free(d);
    atomic_free(a);
    return rc;
}

void atomic_abort(atomic_file_t *a)
{
    if (a->tmp_path)
        unlink(a->tmp_path);
    atomic_free(a);
}
