/* compare.h — two ftk files, or two checkpoints, compared value by value (ftk-verify
 * --compare).
 *
 * Two HDF5 files of the same ftk format (h5.h): every dataset of either by its path, its
 * shape, then its values read as doubles (bfloat16 widened by hand), in blocks of about
 * 2^20 values; a dataset in one file only is a difference. Two checkpoints (checkpoint.h,
 * a directory, a run directory or its `latest`): the same model and unit layout (else
 * refused), then the step, tokens seen, data order, data set and initial weights, then
 * every tensor of every kind (param, adam_m, adam_v), each unit read whole whatever the
 * shard counts (every dataset's checksum verified) and widened to float32, so that
 * checkpoints of different precisions compare by value.
 *
 * Two values differ unless equal (two NaN are equal); a difference is outside the
 * tolerances unless |a − b| <= atol + rtol·|b|. Nothing is printed: each line of the
 * report (CKPT_REPORT_OK: one per tensor, "identical (N values)" or its largest absolute
 * and relative differences, then "A vs B: identical | equal within tolerance | DIFFERENT")
 * and each error (CKPT_REPORT_ERROR) goes to the report callback of ckpt_verify.h, no
 * newline, in the order ftk-verify prints them. */
#ifndef FTK_COMPARE_H
#define FTK_COMPARE_H

#include "ckpt_verify.h"

typedef struct {
    double rtol, atol;     /* >= 0 (0 and 0: exact) */
    ckpt_report_fn report; /* NULL: the lines are dropped */
    void *ctx;
} compare_opts_t;

/* a and b: two ftk files, or two checkpoints (ckpt_verify_is_checkpoint()). Returns
 * CKPT_VERIFY_OK (equal within the tolerances), CKPT_VERIFY_DAMAGED (different, or a shard
 * or dataset that cannot be read), CKPT_VERIFY_REFUSED (a path that does not open as an
 * ftk file or checkpoint, two of different kinds or formats, checkpoints of different
 * models) or CKPT_VERIFY_FAILED (out of memory). */
ckpt_verdict_t compare_paths(const char *a, const char *b, const compare_opts_t *o);

#endif
