/* Unit tests of formats/tokens_set: a split written as one file and as 4 shards (one of
 * them without validation rows) reads back, row for row, as the split itself: any rows,
 * in any order, runs across shard boundaries, repeats; the set's totals and checksum;
 * the streaming check over any range; a row index that lies refused at open. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../formats/h5.h"
#include "../../formats/tokens.h"
#include "../../formats/tokens_set.h"
#include "../../libcommon/hash.h"
#include "../../libcommon/log.h"
#include "../../libcommon/rng.h"
#include "test.h"

#define MAX_LEN 24
#define VOCAB 50

/* n samples of 2..MAX_LEN tokens, packed into rows of MAX_LEN. */
static int make_split(int n, uint64_t seed, tokens_split_t *out)
{
    static int32_t ids[200 * MAX_LEN];
    static uint8_t mask[200 * MAX_LEN];
    tokens_sample_t sm[200];
    rng_t g;
    rng_seed(&g, seed);
    for (int k = 0; k < n; k++) {
        int64_t len = 2 + (int64_t)(rng_next(&g) % (MAX_LEN - 1));
        for (int64_t j = 0; j < len; j++) {
            ids[k * MAX_LEN + j] = j == 0 ? 1 : 3 + (int32_t)(rng_next(&g) % (VOCAB - 3));
            mask[k * MAX_LEN + j] = j > 0;
        }
        sm[k] = (tokens_sample_t){ids + k * MAX_LEN, mask + k * MAX_LEN, len, k};
    }
    return tokens_build(sm, (size_t)n, 1, MAX_LEN, 2, seed, out);
}

/* tr and va as n files (base.h5, or base-0000k-of-0000n.h5 with contiguous row ranges, the
 * validation rows all in the last shard when val_last). Returns 0 or -1. */
static int write_set(const char *base, int n, const tokens_split_t *tr, const tokens_split_t *va, int val_last)
{
    uint64_t sums[8][2 * TOKENS_N_DATASETS];
    char path[8][1200];
    h5w_opts_t wo = {0};
    int rc = 0;
    for (int k = 0; k < n && !rc; k++) {
        if (n == 1)
            snprintf(path[k], sizeof path[k], "%s.h5", base);
        else
            snprintf(path[k], sizeof path[k], "%s-%05d-of-%05d.h5", base, k + 1, n);
        tokens_split_t a, b;
        int64_t v0 = val_last ? (k == n - 1 ? 0 : va->n_rows) : va->n_rows * k / n;
        int64_t v1 = val_last ? va->n_rows : va->n_rows * (k + 1) / n;
        hid_t f = h5_create(path[k], TOKENS_FORMAT, TOKENS_VERSION);
        rc = f < 0 || tokens_slice(tr, tr->n_rows * k / n, tr->n_rows * (k + 1) / n, &a) < 0 ? -1 : 0;
        if (!rc && tokens_slice(va, v0, v1, &b) < 0) {
            tokens_split_free(&a);
            rc = -1;
        }
        if (!rc) {
            rc = h5_attr_set_i64(f, "vocab_size", VOCAB) || h5_attr_set_i64(f, "pad_id", 2) ||
                         h5_attr_set_i64(f, "max_len", MAX_LEN) || h5_attr_set_i64(f, "packed", 1) ||
                         h5_attr_set_str(f, "tokenizer_xxh3", "0123456789abcdef") ||
                         h5_attr_set_i64(f, "shard_index", k + 1) || h5_attr_set_i64(f, "shard_count", n) ||
                         tokens_write_split(f, "train", &a, &wo, sums[k]) ||
                         tokens_write_split(f, "val", &b, &wo, sums[k] + TOKENS_N_DATASETS)
                     ? -1
                     : 0;
            tokens_split_free(&a);
            tokens_split_free(&b);
        }
        if (f >= 0 && h5_close(f) < 0)
            rc = -1;
    }
    char hex[17];
    hash_hex(tokens_set_hash((const uint64_t(*)[2 * TOKENS_N_DATASETS])sums, n), hex);
    for (int k = 0; k < n && !rc; k++) {
        hid_t f = H5Fopen(path[k], H5F_ACC_RDWR, H5P_DEFAULT);
        rc = f < 0 || h5_attr_set_str(f, "set_xxh3", hex) < 0 || h5_close(f) < 0 ? -1 : 0;
    }
    return rc;
}

/* Row rows[i] of s is row i of got, token for token, sample for sample. */
static int same_rows(const tokens_split_t *s, const int64_t *rows, int64_t k, const tokens_split_t *got)
{
    if (got->n_rows != k || got->row_offsets[0] != 0 || got->row_samples[0] != 0)
        return 0;
    for (int64_t i = 0; i < k; i++) {
        int64_t r = rows[i], t0 = s->row_offsets[r], n = s->row_offsets[r + 1] - t0;
        int64_t s0 = s->row_samples[r], ns = s->row_samples[r + 1] - s0;
        int64_t g0 = got->row_offsets[i], h0 = got->row_samples[i];
        if (got->row_offsets[i + 1] - g0 != n || got->row_samples[i + 1] - h0 != ns ||
            memcmp(got->tokens + g0, s->tokens + t0, (size_t)n * sizeof *s->tokens) ||
            memcmp(got->loss_mask + g0, s->loss_mask + t0, (size_t)n))
            return 0;
        for (int64_t j = 0; j < ns; j++)
            if (got->sample_starts[h0 + j] - g0 != s->sample_starts[s0 + j] - t0 ||
                got->sample_lengths[h0 + j] != s->sample_lengths[s0 + j] ||
                got->sample_record[h0 + j] != s->sample_record[s0 + j])
                return 0;
    }
    return got->row_offsets[k] == got->n_tokens && got->row_samples[k] == got->n_samples;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char work[600], base1[700], base4[700], one[800];
    snprintf(work, sizeof work, "%s/build/test-work", dir);
    mkdir(work, 0755);
    snprintf(base1, sizeof base1, "%s/set-one", work);
    snprintf(base4, sizeof base4, "%s/set-four", work);
    snprintf(one, sizeof one, "%s.h5", base1);
    tokens_split_t tr, va;
    CHECK(make_split(150, 5, &tr) == 0 && make_split(9, 6, &va) == 0);
    CHECK(tr.n_rows > 40 && va.n_rows > 2);
    CHECK(write_set(base1, 1, &tr, &va, 0) == 0 && write_set(base4, 4, &tr, &va, 1) == 0);

    tokens_set_t *s1 = tokens_set_open(one), *s4 = tokens_set_open(base4);
    CHECK(s1 && s4);
    if (!s1 || !s4) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        TEST_END();
    }
    const tokens_set_info_t *i1 = tokens_set_info(s1), *i4 = tokens_set_info(s4);
    CHECK(i1->n_shards == 1 && i4->n_shards == 4);
    CHECK(i4->rows[0] == tr.n_rows && i4->rows[1] == va.n_rows && i4->tokens[0] == tr.n_tokens &&
          i4->samples[0] == tr.n_samples && i4->max_len == MAX_LEN && i4->vocab_size == VOCAB);
    CHECK(strcmp(i1->set_xxh3, i4->set_xxh3) != 0); /* the same rows, another set */
    CHECK(tokens_set_shard_rows(s4, 0, TOKENS_VAL) == 0 && tokens_set_shard_rows(s4, 3, TOKENS_VAL) == va.n_rows);

    /* The most segments k rows make into a micro-batch: the k rows with the most samples,
     * each with its padding (packed), whichever shards hold them. */
    {
        int64_t pad = i1->packed == 1, cnt[300], n = tr.n_rows;
        CHECK(n <= 300);
        for (int64_t r = 0; r < n; r++)
            cnt[r] = tr.row_samples[r + 1] - tr.row_samples[r] + pad;
        for (int64_t a = 0; a < n; a++) /* descending */
            for (int64_t b = a + 1; b < n; b++)
                if (cnt[b] > cnt[a]) {
                    int64_t t = cnt[a];
                    cnt[a] = cnt[b], cnt[b] = t;
                }
        CHECK(cnt[0] > cnt[n - 1]); /* rows of different counts */
        const int64_t ks[] = {1, 2, 5, n, n + 7};
        for (int j = 0; j < 5; j++) {
            int64_t want = 0;
            for (int64_t r = 0; r < ks[j] && r < n; r++)
                want += cnt[r];
            CHECK(tokens_set_max_segments(s1, TOKENS_TRAIN, ks[j]) == want);
            CHECK(tokens_set_max_segments(s4, TOKENS_TRAIN, ks[j]) == want);
        }
        CHECK(tokens_set_max_segments(s4, TOKENS_VAL, 1) >= 1 + pad);
    }

    /* Rows in many orders: every row in turn, runs across shard boundaries, reversed,
     * repeated, random; from each set, the same as the split's. */
    int64_t R = tr.n_rows, rows[300];
    int64_t k = 0;
    for (int64_t r = 0; r < R; r++)
        rows[k++] = r;
    for (int64_t r = R - 1; r >= 0 && k < 300; r -= 3)
        rows[k++] = r;
    rows[k++] = R / 4;
    rows[k++] = R / 4;
    rng_t g;
    rng_seed(&g, 9);
    while (k < 300)
        rows[k++] = (int64_t)(rng_next(&g) % (uint64_t)R);
    tokens_set_t *sets[2] = {s1, s4};
    for (int i = 0; i < 2; i++) {
        tokens_split_t got;
        CHECK(tokens_set_read(sets[i], TOKENS_TRAIN, rows, k, &got) == 0 && same_rows(&tr, rows, k, &got));
        tokens_split_free(&got);
        for (int64_t a = 0; a + 7 <= k; a += 7) { /* batches of 7, as a trainer reads them */
            CHECK(tokens_set_read(sets[i], TOKENS_TRAIN, rows + a, 7, &got) == 0 && same_rows(&tr, rows + a, 7, &got));
            tokens_split_free(&got);
        }
        int64_t vr[3] = {va.n_rows - 1, 0, 1};
        CHECK(tokens_set_read(sets[i], TOKENS_VAL, vr, 3, &got) == 0 && same_rows(&va, vr, 3, &got));
        tokens_split_free(&got);
        CHECK(tokens_set_read(sets[i], TOKENS_TRAIN, rows, 0, &got) == 0 && got.n_rows == 0);
        tokens_split_free(&got);
        int64_t bad = R;
        CHECK(tokens_set_read(sets[i], TOKENS_TRAIN, &bad, 1, &got) < 0 && strstr(ftk_err_msg(), "asked for"));
        CHECK(tokens_set_check(sets[i], TOKENS_TRAIN, 0, R) == 0 && tokens_set_check(sets[i], TOKENS_VAL, 0, va.n_rows) == 0);
        CHECK(tokens_set_check(sets[i], TOKENS_TRAIN, R / 3, R / 3 + 5) == 0);
    }
    tokens_set_close(s1);
    tokens_set_close(s4);

    /* A row index that lies is refused at open, naming the shard and the element. */
    char shard[800];
    snprintf(shard, sizeof shard, "%s-00002-of-00004.h5", base4);
    hid_t f = H5Fopen(shard, H5F_ACC_RDWR, H5P_DEFAULT);
    int64_t off[3];
    CHECK(f >= 0 && h5r_read_rows(f, "train/row_offsets", H5T_NATIVE_INT64, 0, 3, off) == 0);
    hid_t d = H5Dopen2(f, "train/row_offsets", H5P_DEFAULT);
    hsize_t start = 1, count = 1;
    hid_t fs = H5Dget_space(d), ms = H5Screate_simple(1, &count, NULL);
    int64_t lie = off[2] + 1; /* row 0 longer than max_len, row 1 of -1 tokens */
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL);
    CHECK(H5Dwrite(d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, &lie) >= 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    h5_close(f);
    CHECK(!tokens_set_open(base4) && strstr(ftk_err_msg(), "set-four-00002-of-00004.h5: /train/row_offsets"));

    /* Removing a shard leaves a set that is not whole. */
    unlink(shard);
    char **names;
    int n;
    CHECK(tokens_set_files(base4, &names, &n) == -1 && strstr(ftk_err_msg(), "shard 2 of 4 is missing"));
    snprintf(shard, sizeof shard, "%s/nothing", work);
    CHECK(tokens_set_files(shard, &names, &n) == -2);
    for (int k2 = 1; k2 <= 4; k2++) {
        snprintf(shard, sizeof shard, "%s-%05d-of-00004.h5", base4, k2);
        unlink(shard);
    }
    unlink(one);
    tokens_split_free(&tr);
    tokens_split_free(&va);
    TEST_END();
}
