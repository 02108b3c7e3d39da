#include "tokens.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/rng.h"

const char *const tokens_dataset_names[TOKENS_N_DATASETS] = {
    "tokens", "loss_mask", "row_offsets", "row_samples", "sample_starts", "sample_lengths", "sample_record",
};

hid_t tokens_dataset_type(int j)
{
    return j == 0 ? H5T_NATIVE_INT32 : j == 1 ? H5T_NATIVE_UINT8 : H5T_NATIVE_INT64;
}


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

int tokens_split_alloc(tokens_split_t *s, int64_t n_tokens, int64_t n_rows, int64_t n_samples)
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

/* Best-fit decreasing: order is sorted longest first (then input order), and each sample
 * in that order goes into the row with the least room that fits it (the row last given
 * that room on ties), or a new row; row_of[i] is sample i's row. 0 with *n_rows set, or -1
 * with the message set. */
static int place_best_fit(const tokens_sample_t *samples, size_t n, int64_t max_len, int64_t *order,
                          int64_t *row_of, int64_t *n_rows)
{
    sort_base = samples;
    qsort(order, n, sizeof *order, by_len_desc);
    /* head[r]: a row with exactly r free tokens (a LIFO list through next[]). */
    int64_t *head = malloc((size_t)(max_len + 1) * sizeof *head);
    int64_t *next = malloc((n + 1) * sizeof *next);
    int64_t *free_of = malloc((n + 1) * sizeof *free_of);
    int64_t rows = 0;
    int rc = -1;
    if (!head || !next || !free_of) {
        ftk_err_set("out of memory");
        goto out;
    }
    for (int64_t r = 0; r <= max_len; r++)
        head[r] = -1;
    for (size_t k = 0; k < n; k++) {
        const tokens_sample_t *sm = &samples[order[k]];
        if (sm->len < 1 || sm->len > max_len) {
            ftk_err_set("sample of record %lld has %lld tokens, outside 1..max_len", (long long)sm->record,
                        (long long)sm->len);
            goto out;
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
            row = rows++;
            free_of[row] = max_len - sm->len;
        }
        next[row] = head[free_of[row]];
        head[free_of[row]] = row;
        row_of[order[k]] = row;
    }
    *n_rows = rows;
    rc = 0;
out:
    free(head);
    free(next);
    free(free_of);
    return rc;
}

/* The samples of each row, in placement order: row r holds by_row[row_start[r] ..
 * row_start[r + 1]) (row_start: n_rows + 1 entries, zeroed). 0, or -1 (out of memory). */
static int group_rows(const int64_t *order, const int64_t *row_of, size_t n, int64_t n_rows, int64_t *row_start,
                      int64_t *by_row)
{
    int64_t *fill = calloc((size_t)n_rows + 1, sizeof *fill);
    if (!fill) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        fill[row_of[i]]++;
    for (int64_t r = 0; r < n_rows; r++)
        row_start[r + 1] = row_start[r] + fill[r];
    memset(fill, 0, ((size_t)n_rows + 1) * sizeof *fill);
    for (size_t k = 0; k < n; k++) {
        int64_t sidx = order[k], r = row_of[sidx];
        by_row[row_start[r] + fill[r]++] = sidx;
    }
    free(fill);
    return 0;
}

/* Where build_rows() takes the rows from. */
typedef struct {
    const tokens_sample_t *samples;
    const int64_t *row_start, *by_row; /* group_rows()'s */
    const int64_t *row_perm;           /* row ri of the split is row row_perm[ri] */
    int64_t n_rows, max_len;
    int packed;
    int32_t pad_id;
} rows_src_t;

/* Copies the rows into out (allocated for them), packed rows padded to max_len. */
static void build_rows(const rows_src_t *src, tokens_split_t *out)
{
    int64_t t = 0, s = 0;
    for (int64_t ri = 0; ri < src->n_rows; ri++) {
        int64_t r = src->row_perm[ri];
        out->row_offsets[ri] = t;
        out->row_samples[ri] = s;
        for (int64_t k = src->row_start[r]; k < src->row_start[r + 1]; k++) {
            const tokens_sample_t *sm = &src->samples[src->by_row[k]];
            memcpy(out->tokens + t, sm->ids, (size_t)sm->len * sizeof *sm->ids);
            memcpy(out->loss_mask + t, sm->mask, (size_t)sm->len);
            out->sample_starts[s] = t;
            out->sample_lengths[s] = sm->len;
            out->sample_record[s] = sm->record;
            t += sm->len;
            s++;
        }
        if (src->packed) {
            int64_t end = out->row_offsets[ri] + src->max_len;
            for (; t < end; t++) {
                out->tokens[t] = src->pad_id;
                out->loss_mask[t] = 0;
            }
        }
    }
    out->row_offsets[src->n_rows] = t;
    out->row_samples[src->n_rows] = s;
}

int tokens_build(const tokens_sample_t *samples, size_t n, int packed, int64_t max_len, int32_t pad_id,
                 uint64_t seed, tokens_split_t *out)
{
    int64_t *row_of = malloc((n + 1) * sizeof *row_of); /* sample -> row */
    int64_t *order = malloc((n + 1) * sizeof *order);   /* samples in placement order */
    int64_t *row_start = NULL, *row_perm = NULL, *by_row = NULL;
    int rc = -1;
    if (!row_of || !order) {
        ftk_err_set("out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (int64_t)i;
    int64_t n_rows = 0, n_tokens = 0;
    if (packed) {
        if (place_best_fit(samples, n, max_len, order, row_of, &n_rows) < 0)
            goto out;
        n_tokens = n_rows * max_len;
    } else {
        for (size_t i = 0; i < n; i++) {
            row_of[i] = (int64_t)i;
            n_tokens += samples[i].len;
        }
        n_rows = (int64_t)n;
    }
    row_start = calloc((size_t)n_rows + 1, sizeof *row_start);
    row_perm = malloc(((size_t)n_rows + 1) * sizeof *row_perm);
    by_row = malloc((n + 1) * sizeof *by_row);
    if (!row_start || !row_perm || !by_row) {
        ftk_err_set("out of memory");
        goto out;
    }
    if (group_rows(order, row_of, n, n_rows, row_start, by_row) < 0)
        goto out;
    /* Rows in random order, so that shards and a sequential reader see a mix (packing
     * created them from the longest samples down). */
    for (int64_t r = 0; r < n_rows; r++)
        row_perm[r] = r;
    if (packed) {
        rng_t rng;
        rng_seed(&rng, seed ^ 0x7061636b696e67ull); /* "packing" */
        rng_shuffle_i64(&rng, row_perm, (size_t)n_rows);
    }
    if (tokens_split_alloc(out, n_tokens, n_rows, (int64_t)n) < 0)
        goto out;
    const rows_src_t src = {samples, row_start, by_row, row_perm, n_rows, max_len, packed, pad_id};
    build_rows(&src, out);
    rc = 0;
out:
    free(row_of);
    free(order);
    free(row_start);
    free(row_perm);
    free(by_row);
    return rc;
}

int tokens_slice(const tokens_split_t *s, int64_t r0, int64_t r1, tokens_split_t *out)
{
    int64_t t0 = s->row_offsets[r0], t1 = s->row_offsets[r1];
    int64_t s0 = s->row_samples[r0], s1 = s->row_samples[r1];
    if (tokens_split_alloc(out, t1 - t0, r1 - r0, s1 - s0) < 0)
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
    for (int j = 0; j < TOKENS_N_DATASETS; j++)
        if (h5r_check_type(g, tokens_dataset_names[j], tokens_dataset_type(j)) < 0) {
            ftk_err_prefix("%s: ", group);
            H5Gclose(g);
            return -1;
        }
    if (tokens_split_alloc(s, nt, nr, ns) < 0) {
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

/* ---------------------------------------------------------------- streaming build */

/* A spill is one split's rows on disk, in emission order, in four anonymous files
 * (created in the output's directory and unlinked at once, so nothing is left behind
 * whatever happens): tokens (int32, padding included), masks (uint8), one (n_samples,
 * row_len) pair of int64 per row, and one (length, record) pair of int64 per sample. */
enum { SP_TOK, SP_MASK, SP_ROW, SP_SMP, SP_N };
#define SP_BUF (1u << 18)

struct tokens_spill {
    FILE *f[SP_N];
    char *wbuf[SP_N];
    int64_t n_rows, n_tokens, n_samples;
    /* read side: the next row and the file offsets where it starts */
    int64_t next_row;
    off_t pos[SP_N];
    int failed;
};

void tokens_spill_free(tokens_spill_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < SP_N; i++) {
        if (s->f[i])
            fclose(s->f[i]);
        free(s->wbuf[i]);
    }
    free(s);
}

tokens_spill_t *tokens_spill_new(const char *dir)
{
    tokens_spill_t *s = calloc(1, sizeof *s);
    if (!s) {
        ftk_err_set("out of memory");
        return NULL;
    }
    size_t dl = strlen(dir);
    char *path = malloc(dl + 32);
    for (int i = 0; path && i < SP_N; i++) {
        snprintf(path, dl + 32, "%s/.ftk-pack-spill-XXXXXX", dir);
        int fd = mkstemp(path);
        if (fd < 0) {
            ftk_err_set("%s: cannot create a temporary file: %s", dir, strerror(errno));
            free(path);
            tokens_spill_free(s);
            return NULL;
        }
        unlink(path);
        s->f[i] = fdopen(fd, "w+b");
        s->wbuf[i] = malloc(SP_BUF);
        if (!s->f[i] || !s->wbuf[i]) {
            if (!s->f[i])
                close(fd);
            break;
        }
        setvbuf(s->f[i], s->wbuf[i], _IOFBF, SP_BUF);
    }
    if (!path || !s->f[SP_N - 1] || !s->wbuf[SP_N - 1]) {
        ftk_err_set("out of memory");
        free(path);
        tokens_spill_free(s);
        return NULL;
    }
    free(path);
    return s;
}

int64_t tokens_spill_rows(const tokens_spill_t *s) { return s->n_rows; }
int64_t tokens_spill_tokens(const tokens_spill_t *s) { return s->n_tokens; }

static int spill_put(tokens_spill_t *s, int i, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, s->f[i]) != n) {
        s->failed = 1;
        return -1;
    }
    return 0;
}

int tokens_spill_row(tokens_spill_t *s, const int32_t *ids, const uint8_t *mask, int64_t used, int64_t row_len,
                     int n, const int64_t *lens, const int64_t *records, int32_t pad)
{
    static const uint8_t zeros[256];
    int32_t pads[256];
    for (int k = 0; k < 256; k++)
        pads[k] = pad;
    int64_t head[2] = {n, row_len};
    int rc = spill_put(s, SP_TOK, ids, (size_t)used * sizeof *ids) | spill_put(s, SP_MASK, mask, (size_t)used) |
             spill_put(s, SP_ROW, head, sizeof head);
    for (int64_t t = used; t < row_len && !rc; t += 256) {
        size_t m = (size_t)(row_len - t < 256 ? row_len - t : 256);
        rc = spill_put(s, SP_TOK, pads, m * sizeof *pads) | spill_put(s, SP_MASK, zeros, m);
    }
    for (int k = 0; k < n && !rc; k++) {
        int64_t p[2] = {lens[k], records[k]};
        rc = spill_put(s, SP_SMP, p, sizeof p);
    }
    if (rc) {
        ftk_err_set("cannot write a temporary file: %s (disk full?)", strerror(errno));
        return -1;
    }
    s->n_rows++;
    s->n_tokens += row_len;
    s->n_samples += n;
    return 0;
}

/* A sequential reader over one spill file (pread, so the files' stdio state is left alone). */
typedef struct {
    int fd;
    off_t *pos;
    char buf[1 << 16];
    size_t len, at;
} spill_rd_t;

static int rd_get(spill_rd_t *r, void *out, size_t n)
{
    char *o = out;
    while (n) {
        if (r->at == r->len) {
            ssize_t k = pread(r->fd, r->buf, sizeof r->buf, *r->pos);
            if (k <= 0) {
                ftk_err_set("cannot read back a temporary file: %s", k < 0 ? strerror(errno) : "too short");
                return -1;
            }
            *r->pos += k;
            r->len = (size_t)k;
            r->at = 0;
        }
        size_t m = r->len - r->at < n ? r->len - r->at : n;
        memcpy(o, r->buf + r->at, m);
        r->at += m;
        o += m;
        n -= m;
    }
    return 0;
}

/* Puts back what a reader read ahead, so the next reader starts where this one stopped. */
static void rd_done(spill_rd_t *r) { *r->pos -= (off_t)(r->len - r->at); }

#define WBLK 65536 /* elements per append */

typedef struct {
    h5w_stream_t *st;
    int64_t *v;
    size_t n;
} i64_out_t;

static int out_put(i64_out_t *o, int64_t x)
{
    o->v[o->n++] = x;
    if (o->n == WBLK) {
        o->n = 0;
        return h5w_append(o->st, o->v, WBLK);
    }
    return 0;
}

/* The sizes of the R rows from the spill's read position: their samples and tokens, from
 * the rows' heads (read without moving that position). */
static int spill_sizes(const tokens_spill_t *s, spill_rd_t *rd, int64_t R, int64_t *S, int64_t *T)
{
    off_t row_pos = s->pos[SP_ROW];
    *rd = (spill_rd_t){.fd = fileno(s->f[SP_ROW]), .pos = &row_pos};
    int rc = 0;
    for (int64_t r = 0; r < R && !rc; r++) {
        int64_t h[2];
        if (!(rc = rd_get(rd, h, sizeof h))) {
            *S += h[0];
            *T += h[1];
        }
    }
    rd->pos = NULL; /* row_pos ends here */
    return rc;
}

/* The T tokens and masks of the rows: a straight copy, through blk (WBLK int32s). */
static int copy_tokens(tokens_spill_t *s, spill_rd_t *rd, void *blk, int64_t T, h5w_stream_t *tok,
                       h5w_stream_t *msk)
{
    for (int k = 0; k < 2; k++) {
        *rd = (spill_rd_t){.fd = fileno(s->f[k == 0 ? SP_TOK : SP_MASK]), .pos = &s->pos[k == 0 ? SP_TOK : SP_MASK]};
        size_t es = k == 0 ? sizeof(int32_t) : 1;
        for (int64_t i = 0; i < T; i += WBLK) {
            size_t m = (size_t)(T - i < WBLK ? T - i : WBLK);
            if (rd_get(rd, blk, m * es) < 0 || h5w_append(k == 0 ? tok : msk, blk, m) < 0)
                return -1;
        }
        rd_done(rd);
    }
    return 0;
}

/* The five int64 datasets of the R rows (layout order, from row_offsets): offsets from
 * the rows' heads and the samples' (length, record) pairs; *n_pad: the rows' padding. */
static int write_index(tokens_spill_t *s, spill_rd_t *rd, int64_t R, i64_out_t out[5], int64_t *n_pad)
{
    spill_rd_t *rs = malloc(sizeof *rs);
    if (!rs) {
        ftk_err_set("out of memory");
        return -1;
    }
    *rd = (spill_rd_t){.fd = fileno(s->f[SP_ROW]), .pos = &s->pos[SP_ROW]};
    *rs = (spill_rd_t){.fd = fileno(s->f[SP_SMP]), .pos = &s->pos[SP_SMP]};
    int64_t t = 0, n_s = 0;
    int e = 0;
    for (int64_t r = 0; r < R && !e; r++) {
        int64_t h[2], used = 0;
        e = rd_get(rd, h, sizeof h) < 0 || out_put(&out[0], t) < 0 || out_put(&out[1], n_s) < 0;
        for (int64_t k = 0; k < h[0] && !e; k++) {
            int64_t p[2];
            e = rd_get(rs, p, sizeof p) < 0 || out_put(&out[2], t + used) < 0 || out_put(&out[3], p[0]) < 0 ||
                out_put(&out[4], p[1]) < 0;
            used += p[0];
        }
        *n_pad += h[1] - used;
        t += h[1];
        n_s += h[0];
    }
    if (!e)
        e = out_put(&out[0], t) < 0 || out_put(&out[1], n_s) < 0;
    rd_done(rd);
    rd_done(rs);
    free(rs);
    for (int i = 0; i < 5 && !e; i++)
        if (out[i].n && h5w_append(out[i].st, out[i].v, out[i].n) < 0)
            e = 1;
    return e ? -1 : 0;
}

int tokens_spill_write(tokens_spill_t *s, hid_t file, const char *group, int64_t r0, int64_t r1,
                       const h5w_opts_t *o, uint64_t sums[TOKENS_N_DATASETS])
{
    if (r0 != s->next_row || r1 < r0 || r1 > s->n_rows) {
        ftk_err_set("%s: rows %lld..%lld asked out of order", group, (long long)r0, (long long)r1);
        return -1;
    }
    for (int i = 0; i < SP_N; i++)
        if (fflush(s->f[i]) != 0) {
            ftk_err_set("cannot write a temporary file: %s (disk full?)", strerror(errno));
            return -1;
        }
    int64_t T = 0, S = 0, R = r1 - r0, n_pad = 0;
    spill_rd_t *rd = malloc(sizeof *rd);
    void *blk = malloc(WBLK * sizeof(int32_t));
    i64_out_t out[5] = {{0}};
    h5w_stream_t *tok = NULL, *msk = NULL;
    hid_t g = -1;
    int rc = -1;
    if (!rd || !blk)
        goto oom;
    if (spill_sizes(s, rd, R, &S, &T) < 0 || (g = h5_group_create(file, group)) < 0)
        goto fail;
    hsize_t dT = (hsize_t)T, dR = (hsize_t)R + 1, dS = (hsize_t)S;
    static const char *const names64[5] = {"row_offsets", "row_samples", "sample_starts", "sample_lengths",
                                           "sample_record"};
    tok = h5w_open(g, "tokens", H5T_NATIVE_INT32, 1, &dT, o);
    msk = h5w_open(g, "loss_mask", H5T_NATIVE_UINT8, 1, &dT, o);
    if (!tok || !msk)
        goto fail;
    for (int i = 0; i < 5; i++) {
        out[i].st = h5w_open(g, names64[i], H5T_NATIVE_INT64, 1, i < 2 ? &dR : &dS, o);
        out[i].v = malloc(WBLK * sizeof(int64_t));
        if (!out[i].st)
            goto fail;
        if (!out[i].v)
            goto oom;
    }
    if (copy_tokens(s, rd, blk, T, tok, msk) < 0 || write_index(s, rd, R, out, &n_pad) < 0)
        goto fail;
    s->next_row = r1;
    rc = h5w_close(tok, &sums[0]) | h5w_close(msk, &sums[1]);
    tok = msk = NULL;
    for (int i = 0; i < 5; i++) {
        rc |= h5w_close(out[i].st, &sums[2 + i]);
        out[i].st = NULL;
    }
    if (rc == 0 && (h5_attr_set_i64(g, "n_rows", R) || h5_attr_set_i64(g, "n_samples", S) ||
                    h5_attr_set_i64(g, "n_tokens", T) || h5_attr_set_i64(g, "n_pad", n_pad)))
        rc = -1;
    goto fail;
oom:
    ftk_err_set("out of memory");
fail:
    if (tok)
        h5w_close(tok, NULL);
    if (msk)
        h5w_close(msk, NULL);
    for (int i = 0; i < 5; i++) {
        if (out[i].st)
            h5w_close(out[i].st, NULL);
        free(out[i].v);
    }
    if (g >= 0)
        H5Gclose(g);
    if (rc < 0)
        ftk_err_prefix("%s: ", group);
    free(rd);
    free(blk);
    return rc;
}

/* The packer: samples come in a stream; each batch of TOKENS_PACK_BATCH is sorted by
 * length (longest first, then arrival order) and placed best-fit into a window of at most
 * TOKENS_PACK_WINDOW open rows (the row with the least room that fits, the earliest opened
 * on ties). A row that is full leaves the window at once; when nothing fits and the window
 * is full, the fullest open row (least room, earliest opened on ties) leaves to make
 * room. Rows are written in the order they leave; at the end, the open rows leave in the
 * order they were opened. Unpacked: one row per sample, in arrival order. */
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    int64_t used;
    int n, cap;
    int64_t *lens, *records; /* cap entries, grown on demand */
} open_row_t;

typedef struct {
    int64_t off, len, record, seq;
} pending_t;

struct tokens_packer {
    int packed;
    int64_t max_len;
    int32_t pad;
    tokens_spill_t *out;
    int32_t *ids; /* the batch's samples, back to back */
    uint8_t *mask;
    int64_t n_tok;
    pending_t *b;
    size_t nb;
    open_row_t *rows; /* the window, in opening order */
    int n_open;
};

void tokens_packer_free(tokens_packer_t *p)
{
    if (!p)
        return;
    for (int i = 0; p->rows && i < TOKENS_PACK_WINDOW; i++) {
        free(p->rows[i].ids);
        free(p->rows[i].mask);
        free(p->rows[i].lens);
        free(p->rows[i].records);
    }
    free(p->rows);
    free(p->ids);
    free(p->mask);
    free(p->b);
    free(p);
}

tokens_packer_t *tokens_packer_new(int packed, int64_t max_len, int32_t pad_id, tokens_spill_t *out)
{
    tokens_packer_t *p = calloc(1, sizeof *p);
    if (!p)
        goto oom;
    *p = (tokens_packer_t){.packed = packed, .max_len = max_len, .pad = pad_id, .out = out};
    if (!packed)
        return p;
    size_t bt = (size_t)TOKENS_PACK_BATCH * (size_t)max_len;
    p->ids = malloc(bt * sizeof *p->ids);
    p->mask = malloc(bt);
    p->b = malloc(TOKENS_PACK_BATCH * sizeof *p->b);
    p->rows = calloc(TOKENS_PACK_WINDOW, sizeof *p->rows);
    if (!p->ids || !p->mask || !p->b || !p->rows)
        goto oom;
    for (int i = 0; i < TOKENS_PACK_WINDOW; i++) {
        open_row_t *r = &p->rows[i];
        r->ids = malloc((size_t)max_len * sizeof *r->ids);
        r->mask = malloc((size_t)max_len);
        if (!r->ids || !r->mask)
            goto oom;
    }
    return p;
oom:
    tokens_packer_free(p);
    ftk_err_set("out of memory");
    return NULL;
}

/* Row i leaves the window (written out); the others keep their order. */
static int leave(tokens_packer_t *p, int i)
{
    open_row_t r = p->rows[i];
    if (tokens_spill_row(p->out, r.ids, r.mask, r.used, p->max_len, r.n, r.lens, r.records, p->pad) < 0)
        return -1;
    memmove(&p->rows[i], &p->rows[i + 1], (size_t)(p->n_open - i - 1) * sizeof *p->rows);
    r.used = 0;
    r.n = 0;
    p->rows[--p->n_open] = r; /* its buffers, for reuse */
    return 0;
}

static int by_len_then_seq(const void *a, const void *b)
{
    const pending_t *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int place_batch(tokens_packer_t *p)
{
    qsort(p->b, p->nb, sizeof *p->b, by_len_then_seq);
    for (size_t k = 0; k < p->nb; k++) {
        const pending_t *s = &p->b[k];
        int best = -1;
        for (int i = 0; i < p->n_open; i++) {
            int64_t room = p->max_len - p->rows[i].used;
            if (room >= s->len && (best < 0 || room < p->max_len - p->rows[best].used))
                best = i;
        }
        if (best < 0) {
            if (p->n_open == TOKENS_PACK_WINDOW) {
                int full = 0;
                for (int i = 1; i < p->n_open; i++)
                    if (p->rows[i].used > p->rows[full].used)
                        full = i;
                if (leave(p, full) < 0)
                    return -1;
            }
            best = p->n_open++;
        }
        open_row_t *r = &p->rows[best];
        if (r->n == r->cap) {
            int cap = r->cap ? 2 * r->cap : 16;
            int64_t *l = realloc(r->lens, (size_t)cap * sizeof *l);
            if (l)
                r->lens = l;
            int64_t *rec = l ? realloc(r->records, (size_t)cap * sizeof *rec) : NULL;
            if (!rec) {
                ftk_err_set("out of memory");
                return -1;
            }
            r->records = rec;
            r->cap = cap;
        }
        memcpy(r->ids + r->used, p->ids + s->off, (size_t)s->len * sizeof *r->ids);
        memcpy(r->mask + r->used, p->mask + s->off, (size_t)s->len);
        r->lens[r->n] = s->len;
        r->records[r->n++] = s->record;
        r->used += s->len;
        if (r->used == p->max_len && leave(p, best) < 0)
            return -1;
    }
    p->nb = 0;
    p->n_tok = 0;
    return 0;
}

int tokens_packer_add(tokens_packer_t *p, const tokens_sample_t *s)
{
    if (s->len < 1 || s->len > p->max_len) {
        ftk_err_set("sample of record %lld has %lld tokens, outside 1..max_len", (long long)s->record,
                    (long long)s->len);
        return -1;
    }
    if (!p->packed)
        return tokens_spill_row(p->out, s->ids, s->mask, s->len, s->len, 1, &s->len, &s->record, p->pad);
    memcpy(p->ids + p->n_tok, s->ids, (size_t)s->len * sizeof *s->ids);
    memcpy(p->mask + p->n_tok, s->mask, (size_t)s->len);
    p->b[p->nb] = (pending_t){p->n_tok, s->len, s->record, (int64_t)p->nb};
    p->n_tok += s->len;
    if (++p->nb == TOKENS_PACK_BATCH)
        return place_batch(p);
    return 0;
}

int tokens_packer_finish(tokens_packer_t *p)
{
    if (!p->packed)
        return 0;
    if (place_batch(p) < 0)
        return -1;
    while (p->n_open)
        if (leave(p, 0) < 0)
            return -1;
    return 0;
}
