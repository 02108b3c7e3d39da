/* loader.c — the data order and the targets' weights (loader.h). */
#include "loader.h"

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
