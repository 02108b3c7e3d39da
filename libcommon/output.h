/* output.h — every output path a user names (-o, --report, FTK_PROFILE, …), by one rule.
 *
 * What is at the path decides how it is written (docs/cli.md "Outputs"):
 *   nothing            a new file: written under a hidden temporary beside it and renamed
 *                      into place when complete (atomic.h); its directory must exist.
 *   a regular file     the same, replacing it, only with OUTPUT_FORCE (a tool's --force):
 *                      else refused, so that no earlier output is lost by accident. Without
 *                      OUTPUT_FORCE the rename never replaces a file that appeared meanwhile.
 *   "-"                standard output, written in place.
 *   a FIFO or a character device (/dev/null, a terminal, /dev/full)
 *                      opened and written in place: never replaced, never truncated, no
 *                      OUTPUT_FORCE needed (a FIFO's open waits for its reader, as a shell's
 *                      redirection does).
 *   a symbolic link    judged by what it names: a FIFO or a device is written through it (a
 *                      link to /proc/self/fd/1 is the process's stdout); a regular file is
 *                      replaced as above, the link kept; a link to nothing is refused.
 *   anything else      a directory, a socket, a block device: refused.
 * OUTPUT_FILE_ONLY (HDF5, which seeks and reopens its file): "-", FIFOs and devices are
 * refused too.
 *
 * A tool calls output_check() on every output path before it does any work, and exits 2
 * when it refuses one (nothing written); output_begin() then output_commit() (or
 * output_abort()) write it when the work is done. Folders (ftk-export-hf) are checked by
 * output_check_dir(). What a tool writes inside its own run directory (RUN/latest,
 * metrics.jsonl, options.yaml: atomic_write_file) is not an output a user names, and is
 * replaced by name without following links.
 *
 * Functions return 0 (or a kind), or -1 with ftk_err_msg() set naming the path.
 */
#ifndef FTK_OUTPUT_H
#define FTK_OUTPUT_H

#include <stddef.h>
#include <stdio.h>

#include "atomic.h"

enum {
    OUTPUT_FORCE = 1,     /* an existing regular file may be replaced */
    OUTPUT_FILE_ONLY = 2, /* a regular file only: no "-", FIFO or device (HDF5) */
};

/* How a path is written. */
typedef enum {
    OUTPUT_NEW = 0,     /* nothing there: a temporary, then a rename that replaces nothing */
    OUTPUT_REPLACE = 1, /* a regular file (OUTPUT_FORCE): a temporary, then a rename over it */
    OUTPUT_IN_PLACE = 2 /* "-", a FIFO, a character device: opened and written where it is */
} output_kind_t;

typedef struct {
    const char *path; /* as the user named it (borrowed), for messages */
    int flags;
    output_kind_t kind;
    FILE *f;         /* output_stream()'s */
    int is_stdout;   /* "-" */
    char *target;    /* a link's regular file, resolved (malloc'd), or NULL */
    atomic_file_t a; /* OUTPUT_NEW, OUTPUT_REPLACE: the temporary */
} output_t;

/* The kind path would be written as, or -1 (refused, or its directory cannot take it). */
int output_check(const char *path, int flags);
/* A folder a tool makes whole (atomic_dir_*): nothing there (OUTPUT_NEW; the parent must
 * exist) or, with OUTPUT_FORCE, a directory (OUTPUT_REPLACE). A link, a file, "-", a FIFO
 * or a device is refused. */
int output_check_dir(const char *path, int flags);

/* Checks path again (output_check) and opens it: a temporary (OUTPUT_NEW, OUTPUT_REPLACE)
 * or the FIFO, device or stdout itself (opened here: a FIFO waits for its reader). */
int output_begin(output_t *o, const char *path, int flags);
/* The stdio stream to write, opened on the first call ("wb"); NULL with the message set. */
FILE *output_stream(output_t *o);
/* Where a writer that opens files by name (HDF5) writes: the temporary (OUTPUT_FILE_ONLY). */
const char *output_tmp_path(const output_t *o);
/* Closes the stream (a write error is reported here), then renames the temporary into
 * place. On failure the temporary is removed; either way o is released. */
int output_commit(output_t *o);
void output_abort(output_t *o);

/* The whole output from memory, through the steps above. */
int output_write(const char *path, int flags, const void *data, size_t len);

#endif
