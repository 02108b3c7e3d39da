#include "atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"

#define MAX_PENDING 1024
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

/* Temporary directories, removed after the files in them (rmdir is async-signal-safe);
 * pending_empty[i]: empty it first (a temporary directory of atomic_dir_begin(), whose
 * files other code may have made without registering them: checkpoint shards). */
#define MAX_PENDING_DIRS 16
static char *volatile pending_dirs[MAX_PENDING_DIRS];
static volatile int pending_empty[MAX_PENDING_DIRS];

/* Unlinks the plain entries of dir, with system calls only (the handler may not allocate:
 * no opendir/nftw). Subdirectories stay, and so does dir then. */
static void empty_dir_signal_safe(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[4096];
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *e = (void *)(buf + off);
            if (strcmp(e->name, ".") && strcmp(e->name, ".."))
                unlinkat(fd, e->name, 0);
            off += e->reclen;
        }
    }
    close(fd);
}

static void on_signal(int sig)
{
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i])
            unlink(pending[i]);
    /* newest first: a temporary directory before the directory made to hold it */
    for (int i = MAX_PENDING_DIRS - 1; i >= 0; i--)
        if (pending_dirs[i]) {
            if (pending_empty[i])
                empty_dir_signal_safe(pending_dirs[i]);
            rmdir(pending_dirs[i]);
        }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void pending_dir_add(char *path, int empty)
{
    for (int i = 0; i < MAX_PENDING_DIRS; i++)
        if (!pending_dirs[i]) {
            pending_empty[i] = empty;
            pending_dirs[i] = path;
            return;
        }
}

void atomic_register_dir(char *path) { pending_dir_add(path, 0); }

void atomic_unregister_dir(const char *path)
{
    for (int i = 0; i < MAX_PENDING_DIRS; i++)
        if (pending_dirs[i] == path)
            pending_dirs[i] = NULL;
}

void atomic_register_file(char *path) { pending_add(path); }
void atomic_unregister_file(const char *path) { pending_remove(path); }

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
    if (fault_point("atomic.begin") < 0) {
        atomic_abort(a);
        return -1;
    }
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

/* ---------------------------------------------------------------- directories */

#include <ftw.h>
#include <sys/stat.h>

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int rm_tree(const char *path)
{
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) < 0 && errno != ENOENT) {
        ftk_err_set("%s: cannot remove: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int atomic_dir_begin(atomic_dir_t *a, const char *final_path)
{
    memset(a, 0, sizeof *a);
    atomic_file_t f;
    if (atomic_begin(&f, final_path) < 0)
        return -1;
    pending_remove(f.tmp_path); /* a directory: listed below instead */
    a->final_path = f.final_path;
    a->tmp_path = f.tmp_path;
    rm_tree(a->tmp_path); /* a leftover of an earlier process with the same pid */
    if (mkdir(a->tmp_path, 0777) < 0) {
        ftk_err_set("%s: mkdir: %s", a->tmp_path, strerror(errno));
        free(a->tmp_path);
        free(a->final_path);
        return -1;
    }
    pending_dir_add(a->tmp_path, 1);
    return 0;
}

char *atomic_dir_file(atomic_dir_t *a, const char *name)
{
    size_t n = strlen(a->tmp_path) + strlen(name) + 2;
    char *p = malloc(n);
    char **files = realloc(a->files, (a->n_files + 1) * sizeof *files);
    if (!p || !files) {
        free(p);
        if (files)
            a->files = files;
        ftk_err_set("out of memory");
        return NULL;
    }
    snprintf(p, n, "%s/%s", a->tmp_path, name);
    a->files = files;
    a->files[a->n_files++] = p;
    pending_add(p);
    return p;
}

static void atomic_dir_free(atomic_dir_t *a)
{
    for (size_t i = 0; i < a->n_files; i++) {
        pending_remove(a->files[i]);
        free(a->files[i]);
    }
    atomic_unregister_dir(a->tmp_path);
    free(a->files);
    free(a->tmp_path);
    free(a->final_path);
    memset(a, 0, sizeof *a);
}

int atomic_dir_commit(atomic_dir_t *a, int replace)
{
    for (size_t i = 0; i < a->n_files; i++)
        if (fsync_path(a->files[i]) < 0)
            goto fail;
    if (fsync_path(a->tmp_path) < 0)
        goto fail;
    struct stat st;
    char *old = NULL;
    if (lstat(a->final_path, &st) == 0) {
        if (!replace) {
            ftk_err_set("%s: exists (use --force to replace it)", a->final_path);
            goto fail;
        }
        size_t n = strlen(a->tmp_path) + 8;
        old = malloc(n);
        if (!old) {
            ftk_err_set("out of memory");
            goto fail;
        }
        snprintf(old, n, "%s.old", a->tmp_path);
        rm_tree(old);
        if (rename(a->final_path, old) < 0) {
            ftk_err_set("%s: rename: %s", a->final_path, strerror(errno));
            free(old);
            goto fail;
        }
    }
    if (rename(a->tmp_path, a->final_path) < 0) {
        ftk_err_set("%s: rename: %s", a->final_path, strerror(errno));
        if (old)
            rename(old, a->final_path);
        free(old);
        goto fail;
    }
    int rc = old ? rm_tree(old) : 0;
    free(old);
    char *d = strdup(a->final_path);
    if (d && fsync_path(dirname(d)) < 0)
        rc = -1;
    free(d);
    atomic_dir_free(a);
    return rc;
fail:
    atomic_dir_abort(a);
    return -1;
}

void atomic_dir_abort(atomic_dir_t *a)
{
    if (a->tmp_path)
        rm_tree(a->tmp_path);
    atomic_dir_free(a);
}
