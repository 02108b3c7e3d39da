#include "output.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "log.h"

/* The directory that will hold path's temporary exists and takes new files: checked now,
 * so that a tool refuses before its work rather than failing after it. */
static int dir_takes(const char *path, const char *shown)
{
    char *d = strdup(path);
    if (!d) {
        ftk_err_set("out of memory");
        return -1;
    }
    const char *dir = dirname(d);
    struct stat st;
    int rc = -1;
    if (stat(dir, &st) < 0) /* what open(2) would say, before any work */
        ftk_err_set("%s: %s", shown, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        ftk_err_set("%s: %s", shown, strerror(ENOTDIR));
    else if (access(dir, W_OK | X_OK) != 0)
        ftk_err_set("%s: cannot write in %s: %s", shown, dir, strerror(errno));
    else
        rc = 0;
    free(d);
    return rc;
}

/* lstat(path): 1 with *st when something is there; OUTPUT_NEW when nothing is and its
 * directory takes a new file; -1 with the message. */
static int what_is_there(const char *path, struct stat *st)
{
    if (lstat(path, st) == 0)
        return 1;
    if (errno != ENOENT) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    return dir_takes(path, path) < 0 ? -1 : OUTPUT_NEW;
}

int output_check(const char *path, int flags)
{
    if (!path || !*path) {
        ftk_err_set("an empty output name");
        return -1;
    }
    if (!strcmp(path, "-")) {
        if (flags & OUTPUT_FILE_ONLY) {
            ftk_err_set("-: this output is HDF5, which needs a regular file, not standard output");
            return -1;
        }
        return OUTPUT_IN_PLACE;
    }
    if (path[strlen(path) - 1] == '/') {
        ftk_err_set("%s: a folder's name: name a file", path);
        return -1;
    }
    struct stat st;
    int r = what_is_there(path, &st);
    if (r != 1)
        return r;
    int link = S_ISLNK(st.st_mode);
    if (link && stat(path, &st) < 0) {
        if (errno == ENOENT)
            ftk_err_set("%s: a symbolic link to nothing: refused (name the file itself)", path);
        else
            ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode)) {
        char *target = link ? realpath(path, NULL) : NULL;
        if (link && !target) {
            ftk_err_set("%s: %s", path, strerror(errno));
            return -1;
        }
        if (!(flags & OUTPUT_FORCE)) {
            if (link)
                ftk_err_set("%s: a link to %s, which exists (use --force to replace it)", path, target);
            else
                ftk_err_set("%s: exists (use --force to replace it)", path);
            free(target);
            return -1;
        }
        int rc = dir_takes(target ? target : path, path);
        free(target);
        return rc < 0 ? -1 : OUTPUT_REPLACE;
    }
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        if (flags & OUTPUT_FILE_ONLY) {
            ftk_err_set("%s: %s%s; this output is HDF5, which needs a regular file", path, link ? "a link to " : "",
                        buf_file_kind(st.st_mode));
            return -1;
        }
        if (access(path, W_OK) != 0) {
            ftk_err_set("%s: %s", path, strerror(errno));
            return -1;
        }
        return OUTPUT_IN_PLACE;
    }
    ftk_err_set("%s: %s%s: refused (an output is a file, a FIFO, a character device or -)", path,
                link ? "a link to " : "", buf_file_kind(st.st_mode));
    return -1;
}

int output_check_dir(const char *path, int flags)
{
    if (!path || !*path || !strcmp(path, "-")) {
        ftk_err_set("%s: a folder is written here: name one", path && *path ? path : "an empty name");
        return -1;
    }
    struct stat st;
    int r = what_is_there(path, &st);
    if (r != 1)
        return r;
    if (!S_ISDIR(st.st_mode)) {
        ftk_err_set("%s: exists and is not a directory (%s); --force replaces only a directory (an earlier export)",
                    path, buf_file_kind(st.st_mode));
        return -1;
    }
    if (!(flags & OUTPUT_FORCE)) {
        ftk_err_set("%s: exists (use --force to replace it)", path);
        return -1;
    }
    return dir_takes(path, path) < 0 ? -1 : OUTPUT_REPLACE;
}

static void output_release(output_t *o)
{
    free(o->target);
    o->target = NULL;
    o->f = NULL;
}

int output_begin(output_t *o, const char *path, int flags)
{
    memset(o, 0, sizeof *o);
    o->path = path;
    o->flags = flags;
    int k = output_check(path, flags);
    if (k < 0)
        return -1;
    o->kind = (output_kind_t)k;
    if (o->kind == OUTPUT_IN_PLACE) {
        if (!strcmp(path, "-")) {
            o->is_stdout = 1;
            o->f = stdout;
            return 0;
        }
        /* no O_CREAT: what is opened is what was checked, or nothing */
        int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
            ftk_err_set("%s: %s", path, strerror(errno));
            if (fd >= 0)
                close(fd);
            return -1;
        }
        if (!S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
            ftk_err_set("%s: changed while it was being opened (now %s): refused", path, buf_file_kind(st.st_mode));
            close(fd);
            return -1;
        }
        if (!(o->f = fdopen(fd, "wb"))) {
            ftk_err_set("%s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        return 0;
    }
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && !(o->target = realpath(path, NULL))) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    if (atomic_begin(&o->a, o->target ? o->target : path) < 0) {
        output_release(o);
        return -1;
    }
    return 0;
}

FILE *output_stream(output_t *o)
{
    if (!o->f && o->kind != OUTPUT_IN_PLACE && !(o->f = fopen(o->a.tmp_path, "wb")))
        ftk_err_set("%s: %s", o->path, strerror(errno));
    return o->f;
}

const char *output_tmp_path(const output_t *o) { return o->kind == OUTPUT_IN_PLACE ? NULL : o->a.tmp_path; }

int output_commit(output_t *o)
{
    if (o->f) {
        int bad = ferror(o->f), e = bad ? errno : 0; /* an earlier write's reason */
        if ((o->is_stdout ? fflush(o->f) : fclose(o->f)) != 0 && !bad)
            bad = 1, e = errno;
        o->f = NULL;
        if (bad) {
            ftk_err_set("%s: write: %s", o->is_stdout ? "standard output" : o->path, strerror(e ? e : EIO));
            output_abort(o);
            return -1;
        }
    }
    int rc = 0;
    if (o->kind != OUTPUT_IN_PLACE)
        rc = o->flags & OUTPUT_FORCE ? atomic_commit(&o->a) : atomic_commit_new(&o->a);
    output_release(o);
    return rc;
}

void output_abort(output_t *o)
{
    if (o->f && !o->is_stdout)
        fclose(o->f);
    o->f = NULL;
    if (o->kind != OUTPUT_IN_PLACE && o->a.tmp_path)
        atomic_abort(&o->a);
    output_release(o);
}

int output_write(const char *path, int flags, const void *data, size_t len)
{
    output_t o;
    if (output_begin(&o, path, flags) < 0)
        return -1;
    FILE *f = output_stream(&o);
    if (!f) {
        output_abort(&o);
        return -1;
    }
    if (len && fwrite(data, 1, len, f) != len) {
        ftk_err_set("%s: write: %s", o.is_stdout ? "standard output" : path, strerror(errno ? errno : EIO));
        output_abort(&o);
        return -1;
    }
    return output_commit(&o);
}
