/* buf.h — a growable byte buffer and whole-file reading.
 *
 * Functions return 0, or -1 with ftk_err_msg() set (out of memory, I/O error). The buffer
 * owns data; buf_free() releases it and leaves an empty buffer. data is always
 * NUL-terminated past len once anything was appended, so text can be used as a C string.
 */
#ifndef FTK_BUF_H
#define FTK_BUF_H

#include <stddef.h>
#include <sys/types.h>

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

int buf_reserve(buf_t *b, size_t extra);
int buf_append(buf_t *b, const void *p, size_t n);
int buf_putc(buf_t *b, char c);
/* Appends printf-formatted text of any length. */
int buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_free(buf_t *b);

/* Reads a whole file, or stdin when path is "-", into b (appending). */
int buf_read_file(buf_t *b, const char *path);

/* Reads a small file a tool trusts for its shape — a control file (RUN/latest, a lock),
 * a manifest, a config — into b (appending), refusing what could hang or exhaust the
 * process: the file is opened non-blocking (a FIFO cannot stall the open) and must be a
 * regular file (fstat after the open: FIFOs, devices, sockets and directories are refused)
 * of at most max bytes. With BUF_NOFOLLOW a symbolic link at path is refused too (for
 * control files, whose links ftk never writes). Returns 0, or -1 with ftk_err_msg()
 * naming path and saying why, and errno set: ENOENT (no such file), ELOOP (a symbolic
 * link, BUF_NOFOLLOW), EINVAL (not a regular file), EFBIG (larger than max), another
 * (I/O, memory). */
#define BUF_NOFOLLOW 1
#define BUF_SMALL_MAX ((size_t)16 << 20) /* the usual bound: 16 MiB */
int buf_read_small(buf_t *b, const char *path, size_t max, int flags);

/* What kind of file st_mode says, for messages: "a regular file", "a FIFO", "a character
 * device", "a directory", … (static text). */
const char *buf_file_kind(mode_t m);

#endif
