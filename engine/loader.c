/* loader.c — the data order, the targets' weights and the micro-batches (loader.h). */
#include "loader.h"

#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "../libcommon/rng.h"

void loader_order(uint64_t seed, int64_t epoch, int64_t n, int64_t *perm)
{
    rng_t r;
    rng_seed(&r, seed ^ (0xA0761D6478BD642Full * (uint64_t)(epoch + 1)));
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    rng_shuffle_i64(&r, perm, (size_t)n);
}

int64_t loader_row_targets(const tokens_split_t *s, int64_t r)
{
    int64_t c = 0;
    for (int64_t t = s->row_offsets[r]; t < s->row_offsets[r + 1]; t++)
        c += s->loss_mask[t];
    return c;
}

void loader_micro_weights(const double *n, int64_t J, float *w)
{
    for (int64_t j = 0; j < J; j++)
        w[j] = n[j] > 0 ? (float)(1.0 / ((double)J * n[j])) : 0.0f;
}

/* ---- batches --------------------------------------------------------------------------- */

/* Grows k arrays that share one capacity (in elements) to hold need elements, doubling.
 * An array grown before a failure is merely larger than *cap: still consistent. */
static int grow_all(void **arrays[], const size_t sizes[], int k, int64_t *cap, int64_t need)
{
    if (need <= *cap)
        return 0;
    int64_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    for (int i = 0; i < k; i++) {
        void *q = realloc(*arrays[i], (size_t)c * sizes[i]);
        if (!q) {
            ftk_err_set("out of memory");
            return -1;
        }
        *arrays[i] = q;
    }
    *cap = c;
    return 0;
}

static int batch_reserve(batch_t *b, int64_t n, int64_t n_seg)
{
    void **tok[] = {(void **)&b->ids, (void **)&b->pos, (void **)&b->tgt_at, (void **)&b->tgt, (void **)&b->tgt_w};
    const size_t tok_sizes[] = {sizeof *b->ids, sizeof *b->pos, sizeof *b->tgt_at, sizeof *b->tgt, sizeof *b->tgt_w};
    void **seg[] = {(void **)&b->seg};
    const size_t seg_sizes[] = {sizeof *b->seg};
    return grow_all(tok, tok_sizes, 5, &b->cap, n) < 0 || grow_all(seg, seg_sizes, 1, &b->cap_seg, n_seg + 1) < 0
               ? -1
               : 0;
}

static int batch_segment(batch_t *b, const tokens_split_t *s, int64_t t0, int64_t len, int with_targets)
{
    if (batch_reserve(b, b->n + len, b->n_seg + 1) < 0)
        return -1;
    if (b->n_seg == 0)
        b->seg[0] = 0;
    for (int64_t i = 0; i < len; i++) {
        b->ids[b->n + i] = s->tokens[t0 + i];
        b->pos[b->n + i] = (int32_t)i;
        if (with_targets && i + 1 < len && s->loss_mask[t0 + i + 1]) {
            b->tgt_at[b->n_tgt] = (int32_t)(b->n + i);
            b->tgt[b->n_tgt] = s->tokens[t0 + i + 1];
            b->tgt_w[b->n_tgt] = 1.0f;
            b->n_tgt++;
        }
    }
    b->n += len;
    b->seg[++b->n_seg] = b->n;
    return 0;
}

int batch_add_rows(batch_t *b, const tokens_split_t *s, const int64_t *rows, int64_t n_rows)
{
    for (int64_t k = 0; k < n_rows; k++) {
        int64_t r = rows[k], end = s->row_offsets[r + 1], t = s->row_offsets[r];
        for (int64_t j = s->row_samples[r]; j < s->row_samples[r + 1]; j++) {
            if (batch_segment(b, s, s->sample_starts[j], s->sample_lengths[j], 1) < 0)
                return -1;
            t = s->sample_starts[j] + s->sample_lengths[j];
        }
        if (t < end && batch_segment(b, s, t, end - t, 0) < 0)
            return -1;
    }
    return 0;
}

int batch_add_idle(batch_t *b)
{
    if (batch_reserve(b, b->n + 1, b->n_seg + 1) < 0)
        return -1;
    if (b->n_seg == 0)
        b->seg[0] = 0;
    b->ids[b->n] = 0;
    b->pos[b->n] = 0;
    b->n++;
    b->seg[++b->n_seg] = b->n;
    return 0;
}

void batch_clear(batch_t *b)
{
    b->n = b->n_seg = b->n_tgt = 0;
}

void batch_free(batch_t *b)
{
    free(b->ids);
    free(b->pos);
    free(b->seg);
    free(b->tgt_at);
    free(b->tgt);
    free(b->tgt_w);
    memset(b, 0, sizeof *b);
}
