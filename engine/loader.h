/* loader.h — the data order of ftk-train's loop: which rows a step visits, how its
 * targets are weighed, and the micro-batches built from the rows read (batch_*; the row
 * reads themselves are formats/tokens_set.h's).
 *
 * Data order (docs/design.md "Data order"): the rows of an epoch are visited in the permutation
 * loader_order(seed, epoch); a global batch is the next global_batch rows of it (the last
 * batch of an epoch may be shorter), whatever the number of processes. The data state
 * is therefore (epoch, rows consumed) and nothing else.
 *
 * Loss normalisation (loss_mean "global", the default): the loss of a step is Σ loss over
 * the global batch's targets divided by their number, so it does not depend on how the
 * batch is cut into micro-batches or spread over ranks; each micro-batch's backward pass
 * is scaled by 1/(targets in the global batch) and the gradients simply add up.
 * loss_mean "micro" (LitGPT's): the mean over the step's J micro-batches of each one's
 * token mean, where micro-batch j is rows [j·micro_batch, (j+1)·micro_batch) of the global
 * batch in the data order — not a rank's pass — so the loss depends on the micro-batch
 * size but not on the number of ranks: every target of micro-batch j weighs
 * 1/(J·targets of j) (loader_micro_weights), whichever rank holds its row.
 */
#ifndef FTK_LOADER_H
#define FTK_LOADER_H
#include <stdint.h>

#include "../formats/tokens.h"

/* perm[0..n) = the order of rows 0..n-1 in epoch `epoch`. */
void loader_order(uint64_t seed, int64_t epoch, int64_t n, int64_t *perm);

/* Loss targets in row r (= Σ loss_mask over its tokens: a sample's first token is never
 * a target and padding never is). */
int64_t loader_row_targets(const tokens_split_t *s, int64_t r);

/* loss_mean "micro": the weight of each target of micro-batch j, w[j] = 1/(J·n[j]) for the
 * J micro-batches with n[j] targets each (0 where n[j] is 0: no target to weigh). */
void loader_micro_weights(const double *n, int64_t J, float *w);

/* A micro-batch: rows of a token file laid end to end (host arrays). */
typedef struct {
    int64_t n;       /* tokens */
    int32_t *ids;    /* [n] */
    int32_t *pos;    /* [n] position inside the token's segment */
    int64_t n_seg;
    int64_t *seg;    /* [n_seg + 1] segment starts (backend.h) */
    int64_t n_tgt;   /* positions that have a target */
    int32_t *tgt_at; /* [n_tgt] those positions */
    int32_t *tgt;    /* [n_tgt] the token to predict there */
    float *tgt_w;    /* [n_tgt] its weight (the loss mask: 1) */
    int64_t cap, cap_seg;
} batch_t;

/* Appends rows[0..n_rows) of split s to b (which starts zeroed; batch_clear() empties it):
 * each sample is a segment with positions from 0; a packed row's padding is one more
 * segment without targets. Position i predicts token i+1 of the same sample when that
 * token's loss_mask is 1. */
int batch_add_rows(batch_t *b, const tokens_split_t *s, const int64_t *rows, int64_t n_rows);
/* Appends one token (id 0) without a target: the pass of a rank that has no rows left in
 * a global batch still takes part in the collectives and adds exactly zero gradient. */
int batch_add_idle(batch_t *b);
void batch_clear(batch_t *b);
void batch_free(batch_t *b);

#endif
