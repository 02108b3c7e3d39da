/* metrics.h — a run's metrics.jsonl: written record by record (ftk-train), read into series.
 *
 * The file (one JSON object a line, appended as the run goes; a resumed run first trims
 * the records after its checkpoint's step, and a run that starts again from step 0
 * without a checkpoint every record with a step, so the file always reads as one
 * history):
 *
 *   {"kind": "step", "step": S, "loss": L, "lr": LR, "grad_norm": G, "tokens": N,
 *    "tokens_seen": N, "tokens_per_s": R, "elapsed_s": E, "epoch": EP, "ranks": P,
 *    "micro_batches": M, "comm": {...}, "mem_peak_bytes": B, "time": "ISO-8601 UTC"}
 *   {"kind": "eval", "step": S, "val_loss": L, "val_tokens": N, "time": ...}
 *   {"kind": "checkpoint", "step": S, "checkpoint": "step-…", "async": B, "stall_s": …, ...}
 *   {"kind": "memory_snapshot", "step": S, "seconds": T, "wait_s": W, "bytes": B, "time": ...}
 *                  (engine/snapshot.h: T the seconds the loop waited for it, the slowest
 *                  rank's; W the longest wait of a rank for the write and the transfer still
 *                  running when the next step's passes ended; B every rank's bytes written
 *                  and sent together)
 *   {"kind": "warning", "step": S, "message": "…", "time": ...}   (stderr failed by step S)
 *
 * Lines written before records had a "kind" are told apart by their keys ("loss",
 * "val_loss", "checkpoint"). Unknown kinds and keys are skipped, so newer files read.
 *
 * metrics_read() returns 0 and fills *m (owned; metrics_free() releases it), or -1 with
 * ftk_err_msg() naming the file and, for a malformed line, its line and column.
 *
 * The writer (metrics_writer_t, one process of a run: ftk-train's rank 0) appends the
 * records above, each flushed as it is written, and the same scalars to TensorBoard event
 * files (tfevents.h) when it has them. A record's write error is not returned by its call
 * but kept, the first one only (metrics_writer_t.err): the caller stops the run at a
 * point all its ranks agree on rather than lose the metrics silently.
 */
#ifndef FTK_METRICS_H
#define FTK_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../libcommon/buf.h"
#include "tfevents.h"

typedef struct {
    int64_t step;
    double loss, lr, grad_norm, tokens_per_s, elapsed_s;
} metrics_step_t;

typedef struct {
    int64_t step;
    double val_loss;
} metrics_eval_t;

typedef struct {
    char *name; /* the run's name as given (directory or file) */
    metrics_step_t *steps;
    size_t n_steps;
    metrics_eval_t *evals;
    size_t n_evals;
} metrics_t;

/* The lines of a metrics file `in` (in.len bytes) that a history up to `step` keeps,
 * appended to *out: each line is parsed as metrics_read() parses it, and a complete line
 * is kept unless it is a record whose "step" (a number, in whatever JSON spelling) is
 * greater than step. A line that is not a record with a step (no "step", a malformed
 * line) is kept as it is; a last line without its newline, a torn write, is not. Linear
 * in in.len. *elapsed0 (may be NULL): the last kept record's elapsed_s (0 without one),
 * where a resumed run's clock continues. Returns 0, or -1 out of memory. */
int metrics_trim(buf_t *out, const buf_t *in, int64_t step, double *elapsed0);

/* path: a run directory (its metrics.jsonl) or a metrics file. */
int metrics_read(const char *path, metrics_t *m);
void metrics_free(metrics_t *m);

/* Where a writer's error is: its metrics file or its event files. */
enum { METRICS_SINK_FILE = 1, METRICS_SINK_EVENTS = 2 };

/* A writer: zeroed and given its path by metrics_writer_init() (every process that may
 * record an error: err names the path), opened by metrics_writer_open() (the one that
 * writes). The record functions do nothing while f is NULL. */
typedef struct {
    FILE *f;           /* the metrics file, appended; NULL: not open */
    tfevents_t *tb;    /* the event files (owned), or NULL */
    char path[4096];   /* the metrics file */
    char err[4096 + 256]; /* the first write error ("" while none) */
    int err_sink;      /* METRICS_SINK_*: where err happened (0 while none) */
    int stderr_said;   /* metrics_write_stderr_lost() wrote its warning */
} metrics_writer_t;

/* One step's record. */
typedef struct {
    int64_t step, tokens, tokens_seen, epoch, micro_batches;
    double loss, lr, grad_norm, tokens_per_s, elapsed_s;
    int ranks;
    double allgather_bytes, reduce_scatter_bytes, allreduce_bytes, wait_s; /* this rank's in the step */
    int64_t mem_peak; /* the backend's high-water mark so far */
    /* device_mem: the device's figures below are written (a backend that allocates in the
     * driver's pages); their values 0 or -1 where not measured */
    int device_mem;
    int64_t mem_device_peak, mem_device_used, mem_device_other;
} metrics_step_rec_t;

/* One committed checkpoint's record. */
typedef struct {
    int64_t step, bytes;
    int async;
    double stall_s, write_s;
} metrics_ckpt_rec_t;

void metrics_writer_init(metrics_writer_t *w, const char *path);

/* Keeps the records of steps <= step of the metrics file at path (a resumed run rewrites
 * what came after; step < 0: none with a step). The file must be a regular file, not a
 * link, and at most 1 GiB. *elapsed0: the run's elapsed_s at that step (the last kept
 * record's; 0 without one), from which a resumed run's clock continues. Returns 1 (the run
 * had a history), 0 (no file: a new run) or -1 with ftk_err_msg() and errno set (ELOOP,
 * EINVAL, EFBIG: the file is not one a run writes). */
int metrics_trim_file(const char *path, int64_t step, double *elapsed0);

/* Opens the writer's file for appending after trimming it to step (metrics_trim_file),
 * and with events_dir (NULL: none) its event files: a run with a history has them trimmed
 * to step as well and its new file says it continues at step + 1; a new run leaves the
 * directory's files as they are. Returns 0, or -1 with ftk_err_msg() set and err_sink
 * saying which failed; *refused (may be NULL) is then 1 where the input is not one a run
 * writes (a link, not a regular file, too large), 0 for a failure. */
int metrics_writer_open(metrics_writer_t *w, int64_t step, const char *events_dir, double *elapsed0, int *refused);

/* Records err (an errno; 0: EIO) against the metrics file, unless an error is kept already. */
void metrics_writer_fail(metrics_writer_t *w, int e);

/* The records. extra (may be NULL): JSON members (", \"key\": …") inserted after "comm". */
void metrics_write_step(metrics_writer_t *w, const metrics_step_rec_t *r, const char *extra);
void metrics_write_eval(metrics_writer_t *w, int64_t step, double val_loss, int64_t val_tokens);
/* Flushed without keeping its error (the next record's flush finds it). */
void metrics_write_checkpoint(metrics_writer_t *w, const metrics_ckpt_rec_t *r);
void metrics_write_snapshot(metrics_writer_t *w, int64_t step, double seconds, double wait_s, int64_t bytes);
/* A run continued with other settings: changed says which, bit_exact false. */
void metrics_write_extend(metrics_writer_t *w, int64_t step, const char *changed);
/* Once, when stderr stopped taking messages (log.h ftk_stderr_errno(); its pipe's reader
 * gone, a closed ssh session's terminal): a warning record saying from which step on the
 * messages are lost. Nothing while stderr works. */
void metrics_write_stderr_lost(metrics_writer_t *w, int64_t step);

/* Closes the metrics file (its error ignored: every record was flushed and checked). */
void metrics_writer_close(metrics_writer_t *w);
/* Closes the event files, or removes them (discard: a run that leaves nothing behind).
 * Returns 0, or -1 with ftk_err_msg() set. */
int metrics_writer_close_events(metrics_writer_t *w, int discard);

#endif
