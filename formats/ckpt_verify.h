/* ckpt_verify.h — a checkpoint, and a run directory, verified whole (ftk-verify's checks).
 *
 * A checkpoint (checkpoint.h): the manifest well formed, sealed or range-checked, and
 * consistent with config.json and the model (ckpt_open); the shard map covering every element
 * of every parameter exactly once, padding a multiple of S less S elements at most; every
 * shard file present, of the recorded size and checksum, holding the index, count, step and
 * shard map the manifest says; every dataset's checksum and type; padding zero; nothing but
 * the unit arrays, in shard 1 the tokenizer files, and with the manifest's compress_grads
 * one residual per unit (ckpt_shard_read_residual: shape, type, checksum and, deep or not,
 * no NaN/Inf); with deep, no NaN/Inf in weights and moments. A run
 * directory: every committed checkpoint, `latest` naming one of them (and the newest), and
 * leftovers of unfinished writes (a warning: not damage).
 *
 * Nothing is printed: each finding is one line (no newline) handed to the report callback as
 * it is found, in the order ftk-verify prints them; after 20 findings in one checkpoint its
 * remaining shards are not read. */
#ifndef FTK_CKPT_VERIFY_H
#define FTK_CKPT_VERIFY_H

#include <stdarg.h>
#include <sys/types.h>

typedef enum {
    CKPT_VERIFY_OK = 0,  /* whole */
    CKPT_VERIFY_DAMAGED, /* a finding (an error line was reported), or not readable as a checkpoint */
    CKPT_VERIFY_REFUSED, /* not a checkpoint or run directory, or a control file ftk never writes */
    CKPT_VERIFY_FAILED,  /* could not verify (out of memory) */
} ckpt_verdict_t;

typedef enum {
    CKPT_REPORT_OK,    /* the checkpoint's summary line: it verifies (compare.h: a line of its report) */
    CKPT_REPORT_WARN,  /* worth saying, not damage */
    CKPT_REPORT_ERROR, /* damage, or why it cannot be verified */
} ckpt_report_t;

/* line is valid only during the call. */
typedef void (*ckpt_report_fn)(void *ctx, ckpt_report_t kind, const char *line);

/* One line formatted whole (a path may be as long as PATH_MAX) and handed to report (NULL:
 * dropped); for the modules that report through it. */
void ckpt_report_vsay(ckpt_report_fn report, void *ctx, ckpt_report_t kind, const char *fmt, va_list ap);

typedef struct {
    int deep;              /* also scan weights and moments for NaN and Inf */
    ckpt_report_fn report; /* NULL: the lines are dropped, only the verdict counts */
    void *ctx;
} ckpt_verify_opts_t;

/* One checkpoint directory (step-NNNNNNNN). */
ckpt_verdict_t ckpt_verify(const char *dir, const ckpt_verify_opts_t *o);

/* A checkpoint directory, RUN/latest (the checkpoint it names), or a run directory (every
 * committed checkpoint, `latest`, leftovers). */
ckpt_verdict_t ckpt_verify_path(const char *path, const ckpt_verify_opts_t *o);

/* Whether path is to be verified as a checkpoint or run directory: a directory, or a
 * regular file named `latest`. */
int ckpt_verify_is_checkpoint(const char *path);

/* What a file that is not a regular file is, in words ("a FIFO", "a symbolic link", …). */
const char *ckpt_verify_file_kind(mode_t m);

#endif
