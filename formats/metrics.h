/* metrics.h — reading a run's metrics.jsonl (written by ftk-train) into series.
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
 *   {"kind": "warning", "step": S, "message": "…", "time": ...}   (stderr failed by step S)
 *
 * Lines written before records had a "kind" are told apart by their keys ("loss",
 * "val_loss", "checkpoint"). Unknown kinds and keys are skipped, so newer files read.
 *
 * metrics_read() returns 0 and fills *m (owned; metrics_free() releases it), or -1 with
 * ftk_err_msg() naming the file and, for a malformed line, its line and column.
 */
#ifndef FTK_METRICS_H
#define FTK_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "../libcommon/buf.h"

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

#endif
