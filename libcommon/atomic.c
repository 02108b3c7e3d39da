#include "atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "path.h"

/* What the signal handler removes: temporary files, and directories (removed after the
 * files in them). No fixed number: each is a node of a list that only grows. A node is
 * made outside the handler and put at the head with one atomic store of a node whose
 * fields are already set; leaving, a temporary clears its node's path (one atomic store)
 * and the node waits on a free list (touched by the mutators only, under a mutex) for the
 * next temporary. Nodes are never freed nor unlinked, so the handler, on any thread at any
 * instant, walks a list that is whole and sees each path either set or cleared; memory is
 * a node per temporary alive at once, at most. */
typedef struct pending {
    _Atomic(char *) path;
    _Atomic int empty;     /* a directory: unlink its plain entries first */
    int is_dir;            /* fixed when the node is made */
    struct pending *next;  /* fixed when the node is made (the list) */
    struct pending *free_next;
} pending_t;

static _Atomic(pending_t *) pending_files, pending_dirs;
static pending_t *free_files, *free_dirs;
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;

/* Registers path; NULL when out of memory (ftk_err_msg() set). */
static pending_t *pending_put(char *path, int is_dir, int empty)
{
    pthread_mutex_lock(&pending_mu);
    pending_t **fl = is_dir ? &free_dirs : &free_files, *n = *fl;
    if (n) {
        *fl = n->free_next;
    } else if ((n = calloc(1, sizeof *n))) {
        n->is_dir = is_dir;
        _Atomic(pending_t *) *head = is_dir ? &pending_dirs : &pending_files;
        n->next = atomic_load(head);
        atomic_store(head, n);
    }
    if (n) {
        atomic_store(&n->empty, empty);
        atomic_store(&n->path, path);
    }
    pthread_mutex_unlock(&pending_mu);
    if (!n)
        ftk_err_set("out of memory");
    return n;
}

static void pending_clear(pending_t *n)
{
    pthread_mutex_lock(&pending_mu);
    atomic_store(&n->path, NULL);
    pending_t **fl = n->is_dir ? &free_dirs : &free_files;
    n->free_next = *fl;
    *fl = n;
    pthread_mutex_unlock(&pending_mu);
}

/* The node holding path (a search: directories are few). */
static pending_t *pending_find(_Atomic(pending_t *) *head, const char *path)
{
    for (pending_t *n = atomic_load(head); n; n = n->next)
        if (atomic_load(&n->path) == path)
            return n;
    return NULL;
}

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
    for (pending_t *n = atomic_load(&pending_files); n; n = n->next) {
        char *p = atomic_load(&n->path);
        if (p)
            unlink(p);
    }
    for (pending_t *n = atomic_load(&pending_dirs); n; n = n->next) {
        char *p = atomic_load(&n->path);
        if (p) {
            if (atomic_load(&n->empty))
                empty_dir_signal_safe(p);
            rmdir(p);
        }
    }
    /* A directory made to hold a temporary one (ftk-reshard's new run) is empty only once
     * that one is gone, and a reused node does not keep the list's order: rmdir again
     * while that removes something. */
    for (int again = 1; again;) {
        again = 0;
        for (pending_t *n = atomic_load(&pending_dirs); n; n = n->next) {
            char *p = atomic_load(&n->path);
            if (p && rmdir(p) == 0)
                again = 1;
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void atomic_register_dir(char *path) { pending_put(path, 1, 0); }

void atomic_unregister_dir(const char *path)
{
    pending_t *n = pending_find(&pending_dirs, path);
    if (n)
        pending_clear(n);
}

void atomic_register_file(char *path) { pending_put(path, 0, 0); }

void atomic_unregister_file(const char *path)
{
    pending_t *n = pending_find(&pending_files, path);
    if (n)
        pending_clear(n);
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
    a->pending_ = NULL;
    a->tmp_path = NULL;
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
    if (!(a->pending_ = pending_put(a->tmp_path, 0, 0))) {
        free(a->tmp_path);
        free(a->final_path);
        a->tmp_path = a->final_path = NULL;
        return -1;
    }
    if (fault_point("atomic.begin") < 0) {
        atomic_abort(a);
        return -1;
    }
    return 0;
}

static void atomic_free(atomic_file_t *a)
{
    if (a->pending_)
        pending_clear(a->pending_);
    a->pending_ = NULL;
    free(a->tmp_path);
    free(a->final_path);
    a->tmp_path = a->final_path = NULL;
}

/* atomic_commit() (replace) and atomic_commit_new() (never replace): the file synced, put
 * at its final name, the directory synced. */
static int commit(atomic_file_t *a, int replace)
{
    if (fsync_path(a->tmp_path) < 0) {
        atomic_abort(a);
        return -1;
    }
    int e;
    if (replace)
        e = rename(a->tmp_path, a->final_path) == 0 ? 0 : errno;
    else if ((e = link(a->tmp_path, a->final_path) == 0 ? 0 : errno) && e != EEXIST) {
        struct stat st; /* no hard links here (some FUSE and network file systems) */
        e = lstat(a->final_path, &st) == 0 ? EEXIST : rename(a->tmp_path, a->final_path) == 0 ? 0 : errno;
    }
    if (e) {
        if (e == EEXIST && !replace)
            ftk_err_set("%s: exists (use --force to replace it)", a->final_path);
        else
            ftk_err_set("%s: rename: %s", a->final_path, strerror(e));
        atomic_abort(a);
        errno = e;
        return -1;
    }
    if (!replace)
        unlink(a->tmp_path); /* the link's other name; gone already after a rename */
    char *d = strdup(a->final_path);
    int rc = d ? fsync_path(dirname(d)) : 0;
    free(d);
    atomic_free(a);
    return rc;
}

int atomic_commit(atomic_file_t *a) { return commit(a, 1); }
int atomic_commit_new(atomic_file_t *a) { return commit(a, 0); }

void atomic_abort(atomic_file_t *a)
{
    if (a->tmp_path)
        unlink(a->tmp_path);
    atomic_free(a);
}

int atomic_write_file(const char *final_path, const void *data, size_t len)
{
    atomic_file_t a;
    if (atomic_begin(&a, final_path) < 0)
        return -1;
    FILE *f = fopen(a.tmp_path, "wb");
    int e = !f ? errno : len && fwrite(data, 1, len, f) != len ? errno : 0;
    if (f && fclose(f) != 0 && !e)
        e = errno;
    if (e) {
        ftk_err_set("%s: %s", final_path, strerror(e));
        atomic_abort(&a);
        return -1;
    }
    return atomic_commit(&a);
}

/* ---------------------------------------------------------------- directories */

#include <ftw.h>

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
    pending_clear(f.pending_); /* a directory: listed below instead */
    a->final_path = f.final_path;
    a->tmp_path = f.tmp_path;
    rm_tree(a->tmp_path); /* a leftover of an earlier process with the same pid */
    /* registered before it exists: a signal at any instant finds it */
    pending_t *n = pending_put(a->tmp_path, 1, 1);
    if (n && mkdir(a->tmp_path, 0777) < 0) {
        ftk_err_set("%s: mkdir: %s", a->tmp_path, strerror(errno));
        pending_clear(n);
        n = NULL;
    }
    if (!n) {
        free(a->tmp_path);
        free(a->final_path);
        return -1;
    }
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
    return p; /* the signal handler empties the whole directory: no registration */
}

static void atomic_dir_free(atomic_dir_t *a)
{
    for (size_t i = 0; i < a->n_files; i++)
        free(a->files[i]);
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

int mkdir_parents(const char *path, int *made)
{
    *made = 0;
    char *p = strdup(path);
    if (!p) {
        ftk_err_set("out of memory");
        return -1;
    }
    char *end = p + path_dir_len(p); /* the last component's end, then its start */
    while (end > p && end[-1] != '/')
        end--;
    int rc = 0;
    for (char *s = p + 1; s < end && rc == 0; s++) {
        if (*s != '/' || s[-1] == '/')
            continue;
        *s = 0;
        if (mkdir(p, 0777) == 0)
            ++*made;
        else if (errno != EEXIST)
            rc = -1, ftk_err_set("%s: cannot make this directory: %s", p, strerror(errno));
        *s = '/';
    }
    if (rc < 0) {
        rmdir_parents(path, *made);
        *made = 0;
    }
    free(p);
    return rc;
}

void rmdir_parents(const char *path, int n)
{
    char *p = strdup(path);
    for (int i = 0; p && i < n; i++) {
        p[path_dir_len(p)] = 0;
        char *slash = strrchr(p, '/');
        if (!slash || slash == p)
            break;
        *slash = 0;
        if (rmdir(p) < 0)
            break;
    }
    free(p);
}
