#include "tokens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/rng.h"

const char *const tokens_dataset_names[TOKENS_N_DATASETS] = {
    "tokens", "loss_mask", "row_offsets", "row_samples", "sample_starts", "sample_lengths", "sample_record",
};

void tokens_split_free(tokens_split_t *s)
{
    free(s->tokens);
    free(s->loss_mask);
    free(s->row_offsets);
    free(s->row_samples);
    free(s->sample_starts);
    free(s->sample_lengths);
    free(s->sample_record);
    memset(s, 0, sizeof *s);
}

static int alloc_split(tokens_split_t *s, int64_t n_tokens, int64_t n_rows, int64_t n_samples)
{
    memset(s, 0, sizeof *s);
    s->n_tokens = n_tokens;
    s->n_rows = n_rows;
    s->n_samples = n_samples;
    s->tokens = malloc((size_t)n_tokens * sizeof *s->tokens + 1);
    s->loss_mask = malloc((size_t)n_tokens + 1);
    s->row_offsets = malloc((size_t)(n_rows + 1) * sizeof(int64_t));
    s->row_samples = malloc((size_t)(n_rows + 1) * sizeof(int64_t));
    s->sample_starts = malloc((size_t)n_samples * sizeof(int64_t) + 1);
    s->sample_lengths = malloc((size_t)n_samples * sizeof(int64_t) + 1);
    s->sample_record = malloc((size_t)n_samples * sizeof(int64_t) + 1);
    if (!s->tokens || !s->loss_mask || !s->row_offsets || !s->row_samples || !s->sample_starts ||
        !s->sample_lengths || !s->sample_record) {
        tokens_split_free(s);
        ftk_err_set("out of memory");
        return -1;
    }
    return 0;
}

/* Sort key for best-fit decreasing: longer first, then input order. */
static const tokens_sample_t *sort_base;
static int by_len_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    int64_t lx = sort_base[x].len, ly = sort_base[y].len;
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

int tokens_build(const tokens_sample_t *samples, size_t n, int packed, int64_t max_len, int32_t pad_id,
                 uint64_t seed, tokens_split_t *out)
{
    int64_t *row_of = malloc((n + 1) * sizeof *row_of);    /* sample -> row */
    int64_t *order = malloc((n + 1) * sizeof *order);      /* samples in placement order */
    int64_t *row_count = NULL, *row_start = NULL, *row_perm = NULL, *head = NULL, *next = NULL;
    int rc = -1;
    if (!row_of || !order)
        goto oom;
    for (size_t i = 0; i < n; i++)
        order[i] = (int64_t)i;
    int64_t n_rows = 0, n_tokens = 0;
    if (packed) {
        sort_base = samples;
        qsort(order, n, sizeof *order, by_len_desc);
        /* head[r]: a row with exactly r free tokens (a LIFO list through next[]). */
        head = malloc((size_t)(max_len + 1) * sizeof *head);
        next = malloc((n + 1) * sizeof *next);
        int64_t *free_of = malloc((n + 1) * sizeof *free_of);
        if (!head || !next || !free_of) {
            free(free_of);
            goto oom;
        }
        for (int64_t r = 0; r <= max_len; r++)
            head[r] = -1;
        for (size_t k = 0; k < n; k++) {
            const tokens_sample_t *sm = &samples[order[k]];
            if (sm->len < 1 || sm->len > max_len) {
                free(free_of);
                ftk_err_set("sample of record %lld has %lld tokens, outside 1..max_len", (long long)sm->record,
                            (long long)sm->len);
                goto fail;
            }
            int64_t fit = -1;
            for (int64_t r = sm->len; r <= max_len; r++)
                if (head[r] >= 0) {
                    fit = r;
                    break;
                }
            int64_t row;
            if (fit >= 0) {
                row = head[fit];
                head[fit] = next[row];
                free_of[row] = fit - sm->len;
            } else {
                row = n_rows++;
                free_of[row] = max_len - sm->len;
            }
            next[row] = head[free_of[row]];
            head[free_of[row]] = row;
            row_of[order[k]] = row;
        }
        free(free_of);
        n_tokens = n_rows * max_len;
    } else {
        for (size_t i = 0; i < n; i++) {
            row_of[i] = (int64_t)i;
            n_tokens += samples[i].len;
        }
        n_rows = (int64_t)n;
    }
    /* Samples of each row, in placement order. */
    row_count = calloc((size_t)n_rows + 1, sizeof *row_count);
    row_start = calloc((size_t)n_rows + 1, sizeof *row_start);
    row_perm = malloc(((size_t)n_rows + 1) * sizeof *row_perm);
    if (!row_count || !row_start || !row_perm)
        goto oom;
    for (size_t i = 0; i < n; i++)
        row_count[row_of[i]]++;
    for (int64_t r = 0; r < n_rows; r++)
        row_start[r + 1] = row_start[r] + row_count[r];
    int64_t *by_row = malloc((n + 1) * sizeof *by_row), *fill = calloc((size_t)n_rows + 1, sizeof *fill);
    if (!by_row || !fill) {
        free(by_row);
        free(fill);
        goto oom;
    }
    for (size_t k = 0; k < n; k++) {
        int64_t sidx = order[k], r = row_of[sidx];
        by_row[row_start[r] + fill[r]++] = sidx;
    }
    free(fill);
    /* Rows in random order, so that shards and a sequential reader see a mix (packing
     * created them from the longest samples down). */
    for (int64_t r = 0; r < n_rows; r++)
        row_perm[r] = r;
    if (packed) {
        rng_t rng;
        rng_seed(&rng, seed ^ 0x7061636b696e67ull); /* "packing" */
        rng_shuffle_i64(&rng, row_perm, (size_t)n_rows);
    }
    if (alloc_split(out, n_tokens, n_rows, (int64_t)n) < 0) {
        free(by_row);
        goto fail;
    }
    int64_t t = 0, s = 0;
    for (int64_t ri = 0; ri < n_rows; ri++) {
        int64_t r = row_perm[ri];
        out->row_offsets[ri] = t;
        out->row_samples[ri] = s;
        for (int64_t k = row_start[r]; k < row_start[r + 1]; k++) {
            const tokens_sample_t *sm = &samples[by_row[k]];
            memcpy(out->tokens + t, sm->ids, (size_t)sm->len * sizeof *sm->ids);
            memcpy(out->loss_mask + t, sm->mask, (size_t)sm->len);
            out->sample_starts[s] = t;
            out->sample_lengths[s] = sm->len;
            out->sample_record[s] = sm->record;
            t += sm->len;
            s++;
        }
        if (packed) {
            int64_t end = out->row_offsets[ri] + max_len;
            for (; t < end; t++) {
                out->tokens[t] = pad_id;
                out->loss_mask[t] = 0;
            }
        }
    }
    out->row_offsets[n_rows] = t;
    out->row_samples[n_rows] = s;
    free(by_row);
    rc = 0;
    goto fail;
oom:
    ftk_err_set("out of memory");
fail:
    free(row_of);
    free(order);
    free(row_count);
    free(row_start);
    free(row_perm);
    free(head);
    free(next);
    return rc;
}

int tokens_slice(const tokens_split_t *s, int64_t r0, int64_t r1, tokens_split_t *out)
{
    int64_t t0 = s->row_offsets[r0], t1 = s->row_offsets[r1];
    int64_t s0 = s->row_samples[r0], s1 = s->row_samples[r1];
    if (alloc_split(out, t1 - t0, r1 - r0, s1 - s0) < 0)
        return -1;
    memcpy(out->tokens, s->tokens + t0, (size_t)(t1 - t0) * sizeof *out->tokens);
    memcpy(out->loss_mask, s->loss_mask + t0, (size_t)(t1 - t0));
    for (int64_t r = r0; r <= r1; r++) {
        out->row_offsets[r - r0] = s->row_offsets[r] - t0;
        out->row_samples[r - r0] = s->row_samples[r] - s0;
    }
    for (int64_t k = s0; k < s1; k++) {
        out->sample_starts[k - s0] = s->sample_starts[k] - t0;
        out->sample_lengths[k - s0] = s->sample_lengths[k];
        out->sample_record[k - s0] = s->sample_record[k];
    }
    return 0;
}

static int write_1d(hid_t g, const char *name, hid_t type, const void *data, int64_t n, const h5w_opts_t *o,
                    uint64_t *sum)
{
    hsize_t dims[1] = {(hsize_t)n};
    return h5w_write_tensor(g, name, type, 1, dims, data, o, sum);
}

int tokens_write_split(hid_t file, const char *group, const tokens_split_t *s, const h5w_opts_t *o,
                       uint64_t sums[TOKENS_N_DATASETS])
{
    hid_t g = h5_group_create(file, group);
    if (g < 0)
        return -1;
    int64_t n_pad = s->n_tokens;
    for (int64_t k = 0; k < s->n_samples; k++)
        n_pad -= s->sample_lengths[k];
    int rc = write_1d(g, "tokens", H5T_NATIVE_INT32, s->tokens, s->n_tokens, o, &sums[0]) ||
             write_1d(g, "loss_mask", H5T_NATIVE_UINT8, s->loss_mask, s->n_tokens, o, &sums[1]) ||
             write_1d(g, "row_offsets", H5T_NATIVE_INT64, s->row_offsets, s->n_rows + 1, o, &sums[2]) ||
             write_1d(g, "row_samples", H5T_NATIVE_INT64, s->row_samples, s->n_rows + 1, o, &sums[3]) ||
             write_1d(g, "sample_starts", H5T_NATIVE_INT64, s->sample_starts, s->n_samples, o, &sums[4]) ||
             write_1d(g, "sample_lengths", H5T_NATIVE_INT64, s->sample_lengths, s->n_samples, o, &sums[5]) ||
             write_1d(g, "sample_record", H5T_NATIVE_INT64, s->sample_record, s->n_samples, o, &sums[6]) ||
             h5_attr_set_i64(g, "n_rows", s->n_rows) || h5_attr_set_i64(g, "n_samples", s->n_samples) ||
             h5_attr_set_i64(g, "n_tokens", s->n_tokens) || h5_attr_set_i64(g, "n_pad", n_pad)
                 ? -1
                 : 0;
    if (rc < 0)
        ftk_err_prefix("%s: ", group);
    H5Gclose(g);
    return rc;
}

int tokens_read_split(hid_t file, const char *group, tokens_split_t *s)
{
    memset(s, 0, sizeof *s);
    if (H5Lexists(file, group, H5P_DEFAULT) <= 0) {
        ftk_err_set("group %s is missing", group);
        return -1;
    }
    hid_t g = H5Gopen2(file, group, H5P_DEFAULT);
    int64_t nr, ns, nt;
    if (h5_attr_get_i64(g, "n_rows", &nr) < 0 || h5_attr_get_i64(g, "n_samples", &ns) < 0 ||
        h5_attr_get_i64(g, "n_tokens", &nt) < 0) {
        ftk_err_prefix("%s: ", group);
        H5Gclose(g);
        return -1;
    }
    if (nr < 0 || ns < 0 || nt < 0 || nt > ((int64_t)1 << 40) || nr > nt + 1 || ns > nt + 1) {
        ftk_err_set("%s: implausible sizes n_rows=%lld n_samples=%lld n_tokens=%lld", group, (long long)nr,
                    (long long)ns, (long long)nt);
        H5Gclose(g);
        return -1;
    }
    if (alloc_split(s, nt, nr, ns) < 0) {
        H5Gclose(g);
        return -1;
    }
    int rc = h5r_read(g, "tokens", H5T_NATIVE_INT32, s->tokens, (size_t)nt) ||
             h5r_read(g, "loss_mask", H5T_NATIVE_UINT8, s->loss_mask, (size_t)nt) ||
             h5r_read(g, "row_offsets", H5T_NATIVE_INT64, s->row_offsets, (size_t)nr + 1) ||
             h5r_read(g, "row_samples", H5T_NATIVE_INT64, s->row_samples, (size_t)nr + 1) ||
             h5r_read(g, "sample_starts", H5T_NATIVE_INT64, s->sample_starts, (size_t)ns) ||
             h5r_read(g, "sample_lengths", H5T_NATIVE_INT64, s->sample_lengths, (size_t)ns) ||
             h5r_read(g, "sample_record", H5T_NATIVE_INT64, s->sample_record, (size_t)ns)
                 ? -1
                 : 0;
    H5Gclose(g);
    if (rc < 0) {
        ftk_err_prefix("%s: ", group);
        tokens_split_free(s);
    }
    return rc;
}

#define BAD(...)                                                                                             \
    do {                                                                                                     \
        ftk_err_set(__VA_ARGS__);                                                                            \
        return 1;                                                                                            \
    } while (0)

int tokens_check_rows(const tokens_rows_t *v, int64_t vocab_size, int64_t max_len, int packed, int32_t pad_id)
{
    const int64_t R = v->n_rows, r0 = v->first_row;
    const int64_t *off = v->row_offsets, *rs = v->row_samples;
    /* The index first: the content loops below index the arrays through it. */
    for (int64_t i = 0; i < R; i++) {
        int64_t a = off[i], b = off[i + 1], sa = rs[i], sb = rs[i + 1], r = r0 + i;
        if (b < a)
            BAD("row_offsets[%lld] decreases", (long long)r + 1);
        if (sb < sa)
            BAD("row_samples[%lld] decreases", (long long)r + 1);
        if (b - a > max_len)
            BAD("row_offsets: row %lld is %lld tokens long, more than max_len %lld", (long long)r,
                (long long)(b - a), (long long)max_len);
        if (packed && b - a != max_len)
            BAD("row_offsets: packed row %lld is %lld tokens long, not max_len %lld", (long long)r,
                (long long)(b - a), (long long)max_len);
        if (!packed && sb - sa != 1)
            BAD("row_samples: unpacked row %lld holds %lld samples, not 1", (long long)r, (long long)(sb - sa));
        if (sb - sa > b - a) /* every sample has a token: this bounds what a reader allocates */
            BAD("row_samples: row %lld holds %lld samples in %lld tokens", (long long)r, (long long)(sb - sa),
                (long long)(b - a));
    }
    if (!v->tokens)
        return 0;
    const int64_t t0 = off[0], s0 = rs[0];
    for (int64_t i = t0; i < off[R]; i++) {
        if (v->tokens[i - t0] < 0 || v->tokens[i - t0] >= vocab_size)
            BAD("tokens[%lld] = %d is not a token id (vocabulary size %lld)", (long long)i, v->tokens[i - t0],
                (long long)vocab_size);
        if (v->loss_mask[i - t0] > 1)
            BAD("loss_mask[%lld] = %u is neither 0 nor 1", (long long)i, v->loss_mask[i - t0]);
    }
    for (int64_t i = 0; i < R; i++) {
        int64_t b = off[i + 1], r = r0 + i, t = off[i];
        for (int64_t k = rs[i]; k < rs[i + 1]; k++) {
            int64_t start = v->sample_starts[k - s0], len = v->sample_lengths[k - s0];
            if (start != t)
                BAD("sample_starts[%lld] = %lld, but the previous sample of row %lld ends at %lld", (long long)k,
                    (long long)start, (long long)r, (long long)t);
            if (len < 1 || len > b - t)
                BAD("sample_lengths[%lld] = %lld does not fit in row %lld", (long long)k, (long long)len,
                    (long long)r);
            if (v->loss_mask[t - t0])
                BAD("loss_mask[%lld] is 1 on the first token of sample %lld", (long long)t, (long long)k);
            if (v->sample_record[k - s0] < 0)
                BAD("sample_record[%lld] is negative", (long long)k);
            t += len;
        }
        if (!packed && t != b)
            BAD("row_offsets: unpacked row %lld has padding", (long long)r);
        for (; t < b; t++)
            if (v->tokens[t - t0] != pad_id || v->loss_mask[t - t0])
                BAD("tokens[%lld]: padding of row %lld must be pad_id %d with loss_mask 0", (long long)t,
                    (long long)r, pad_id);
    }
    return 0;
}

int tokens_check_split(const tokens_split_t *s, int64_t vocab_size, int64_t max_len, int packed, int32_t pad_id)
{
    const int64_t T = s->n_tokens, R = s->n_rows, S = s->n_samples;
    if (s->row_offsets[0] != 0 || s->row_offsets[R] != T)
        BAD("row_offsets must start at 0 and end at %lld (the number of tokens)", (long long)T);
    if (s->row_samples[0] != 0 || s->row_samples[R] != S)
        BAD("row_samples must start at 0 and end at %lld (the number of samples)", (long long)S);
    tokens_rows_t v = {s->tokens, s->loss_mask, s->row_offsets, s->row_samples, s->sample_starts,
                       s->sample_lengths, s->sample_record, 0, R};
    return tokens_check_rows(&v, vocab_size, max_len, packed, pad_id);
}

uint64_t tokens_set_hash(const uint64_t (*sums)[2 * TOKENS_N_DATASETS], int n_shards)
{
    hash_state_t *h = hash_new();
    if (!h)
        return 0;
    hash_update(h, "ftk-tokens-set", 14);
    for (int i = 0; i < n_shards; i++) {
        int64_t idx = i + 1;
        hash_update(h, &idx, sizeof idx);
        hash_update(h, sums[i], sizeof sums[i]);
    }
    uint64_t v = hash_digest(h);
    hash_free(h);
    return v;
}
