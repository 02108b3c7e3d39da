/* rundir.c — a run directory's one writer (rundir.h). */
#include "rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/path.h"

char *rundir_lock_path(const char *run_dir)
{
    size_t l = strlen(run_dir) + sizeof "/" RUNDIR_LOCK;
    char *p = malloc(l);
    if (p)
        snprintf(p, l, "%.*s/%s", path_dir_len(run_dir), run_dir, RUNDIR_LOCK);
    return p;
}

int rundir_lock(const char *run_dir)
{
    char *p = rundir_lock_path(run_dir);
    if (!p) {
        ftk_err_set("out of memory");
        return RUNDIR_ERROR;
    }
    int fd, tries = 0;
again:
    /* Never through a link (a link planted at .lock would have the truncation and the
     * write below land in its target), never blocking on a FIFO, only a regular file. */
    fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0666);
    struct stat fs;
    if (fd < 0) {
        int e = errno;
        struct stat ls;
        if (e == ENOENT && tries)
            ftk_err_set("%s was removed while this %s started (another one started on it at the same time "
                        "and failed): start again",
                        run_dir, ftk_tool());
        else if ((e == ELOOP || e == EMLINK) && lstat(p, &ls) == 0 && S_ISLNK(ls.st_mode)) {
            ftk_err_set("%s: a symbolic link, refused (the run's lock file is a regular file ftk creates; remove the "
                        "link)",
                        p);
            free(p);
            return RUNDIR_REFUSED;
        } else
            ftk_err_set("%s: %s", p, strerror(e));
        free(p);
        return e == EISDIR || e == ENXIO ? RUNDIR_REFUSED : RUNDIR_ERROR;
    }
    int st = fstat(fd, &fs);
    if (st < 0 || !S_ISREG(fs.st_mode)) {
        ftk_err_set("%s: %s", p, st < 0 ? strerror(errno) : "not a regular file (a FIFO, device or socket): refused");
        close(fd);
        free(p);
        return st < 0 ? RUNDIR_ERROR : RUNDIR_REFUSED;
    }
    struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    int locked = fcntl(fd, F_SETLK, &l) == 0;
    if (locked) {
        /* A writer that made the directory and failed removes it, lock file included, while
         * holding the lock: a lock won on that unlinked file guards nothing, so the file
         * must still be the one at the path. */
        struct stat a, b;
        if (fstat(fd, &a) < 0 || stat(p, &b) < 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
            close(fd);
            if (++tries < 10)
                goto again;
            ftk_err_set("%s: the lock file keeps being replaced", p);
            free(p);
            return RUNDIR_ERROR;
        }
    } else {
        int e = errno;
        if (e == EACCES || e == EAGAIN) {
            char who[256] = "";
            ssize_t k = pread(fd, who, sizeof who - 1, 0);
            who[k > 0 ? k : 0] = 0;
            who[strcspn(who, "\n")] = 0;
            char host[200] = "?", tool[64] = "ftk-train"; /* a lock file without the tool: ftk-train's */
            long pid = 0;
            int got = sscanf(who, "%199s %ld %63s", host, &pid, tool);
            if (got >= 2)
                ftk_err_set("%s is in use by another %s (host %s, process %ld; %s is locked): one writer per "
                            "run directory",
                            run_dir, tool, host, pid, p);
            else
                ftk_err_set("%s is in use by another ftk writer (%s is locked): one writer per run directory", run_dir,
                            p);
            close(fd);
            free(p);
            return RUNDIR_BUSY;
        }
        ftk_err_set("%s: cannot lock: %s", p, strerror(e));
        close(fd);
        free(p);
        return e == ENOLCK || e == ENOSYS || e == EOPNOTSUPP ? RUNDIR_NO_LOCKS : RUNDIR_ERROR;
    }
    char host[200] = "?", line[256];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    int len = snprintf(line, sizeof line, "%s %ld %s\n", host, (long)getpid(), ftk_tool());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        ftk_err_set("%s: %s", p, strerror(errno));
        close(fd);
        free(p);
        return RUNDIR_ERROR;
    }
    free(p);
    return fd;
}

int rundir_claim(const char *run_dir, int *made)
{
    int fd = rundir_lock(run_dir);
    if (fd == RUNDIR_BUSY)
        *made = 0;
    return fd;
}

int rundir_holds_only_lock(const char *run_dir)
{
    DIR *d = opendir(run_dir);
    if (!d)
        return 0;
    struct dirent *e;
    int only = 1;
    while (only && (e = readdir(d)))
        only = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, RUNDIR_LOCK);
    closedir(d);
    return only;
}

void rundir_remove_bare(const char *run_dir)
{
    char *p = rundir_lock_path(run_dir);
    if (p && rundir_holds_only_lock(run_dir))
        unlink(p);
    free(p);
    rmdir(run_dir);
}

int rundir_lock_held(const char *run_dir)
{
    char *p = rundir_lock_path(run_dir);
    if (!p)
        return -1;
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    free(p);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    int rc = fcntl(fd, F_GETLK, &fl) < 0 ? -1 : fl.l_type != F_UNLCK;
    close(fd);
    return rc;
}

int rundir_run_id(const char *run_dir, char out[17], int create)
{
    char p[4200];
    snprintf(p, sizeof p, "%.*s/.run-id", path_dir_len(run_dir), run_dir);
    buf_t b = {0};
    if (buf_read_small(&b, p, 64, BUF_NOFOLLOW) == 0) {
        int ok = b.len == 17 && ((char *)b.data)[16] == '\n';
        for (size_t i = 0; ok && i < 16; i++)
            ok = strchr("0123456789abcdef", ((char *)b.data)[i]) != NULL && ((char *)b.data)[i];
        if (ok)
            memcpy(out, b.data, 16), out[16] = 0;
        buf_free(&b);
        if (!ok)
            ftk_err_set("%s: not a run identity (16 lowercase hex digits and a newline)", p);
        return ok ? 0 : -1;
    }
    if (errno != ENOENT) {
        buf_free(&b);
        return -1;
    }
    buf_free(&b);
    if (!create)
        return 1;
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        ftk_err_set("getrandom: %s", strerror(errno));
        return -1;
    }
    char text[18];
    snprintf(text, sizeof text, "%016llx\n", (unsigned long long)v);
    if (atomic_write_file(p, text, 17) < 0)
        return -1;
    memcpy(out, text, 16), out[16] = 0;
    return 0;
}
