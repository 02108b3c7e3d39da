/* Unit tests of formats/records (the streaming record reader) and the streaming packer of
 * formats/tokens: records and their positions do not depend on how the input is chunked;
 * errors come after the records before them; the packer's rows keep every sample once. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../formats/records.h"
#include "../../formats/tokens.h"
#include "../../libcommon/log.h"
#include "test.h"

static char path[600];

static void put(const char *text)
{
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

/* Reads the whole input with chunks of max_records; the records' texts and positions go to
 * out as "index line:col text\n"; the error (if any) after them. Returns the record count. */
static int64_t read_all(size_t max_records, size_t max_bytes, size_t max_rec, char *out, size_t cap)
{
    records_t *r = records_open(path, max_rec);
    const record_span_t *sp;
    int64_t n, total = 0;
    size_t len = 0;
    out[0] = 0;
    while ((n = records_next(r, max_records, max_bytes, &sp)) > 0) {
        for (int64_t i = 0; i < n; i++)
            len += (size_t)snprintf(out + len, cap - len, "%lld %u:%u %.*s\n", (long long)sp[i].index, sp[i].line,
                                    sp[i].col, (int)sp[i].len, sp[i].text);
        total += n;
    }
    if (n < 0)
        snprintf(out + len, cap - len, "error: %s", ftk_err_msg());
    records_close(r);
    return total;
}

static void test_chunking(void)
{
    static const char *inputs[] = {
        "[{\"a\": \"x]\\\"\"},\n {\"b\": [1, {\"c\": 2}]},\n\t{\"é\": \"ü\"}, 3]",
        "{\"a\": 1}\n{\"b\": \"}\"}\n\n  {\"c\": [\n]}\n",
        "\xEF\xBB\xBF[{\"a\": 1}, {\"b\": 2}]  \n",
    };
    static const int64_t counts[] = {4, 3, 2};
    for (int k = 0; k < 3; k++) {
        char one[4096], many[4096], tiny[4096];
        put(inputs[k]);
        CHECK(read_all(1, 1 << 20, 1 << 20, one, sizeof one) == counts[k]);
        CHECK(read_all(1000, 1 << 20, 1 << 20, many, sizeof many) == counts[k]);
        CHECK(read_all(1000, 1, 1 << 20, tiny, sizeof tiny) == counts[k]); /* byte limit: one per chunk */
        CHECK(strcmp(one, many) == 0 && strcmp(one, tiny) == 0);
        CHECK(strstr(one, "error") == NULL);
    }
    put(inputs[0]);
    char out[4096];
    read_all(2, 1 << 20, 1 << 20, out, sizeof out);
    CHECK(strstr(out, "1 2:2 {\"b\": [1, {\"c\": 2}]}\n") != NULL);
    CHECK(strstr(out, "2 3:2 {\"é\": \"ü\"}\n") != NULL);
    CHECK(strstr(out, "0 1:2 {\"a\": \"x]\\\"\"}\n") != NULL);
}

static void test_errors(void)
{
    char out[4096];
    put("[{\"a\": 1}, {\"b\": 2} {\"c\": 3}]");
    CHECK(read_all(1, 1 << 20, 1 << 20, out, sizeof out) == 2); /* the records before the fault first */
    CHECK(strstr(out, "error: line 1, column 21: expected ',' or ']' in array, found '{'") != NULL);
    put("[{\"a\": 1}] x");
    CHECK(read_all(10, 1 << 20, 1 << 20, out, sizeof out) == 1);
    CHECK(strstr(out, "error: line 1, column 12: unexpected 'x' after the end of the JSON value") != NULL);
    put("{\"a\": \"0123456789012345678901234567890123456789\"}");
    CHECK(read_all(10, 1 << 20, 32, out, sizeof out) == 0);
    CHECK(strstr(out, "error: line 1, column 1: record 1 is longer than 32 bytes") != NULL);
    put("");
    CHECK(read_all(10, 1 << 20, 32, out, sizeof out) == 0 && strstr(out, "empty input: no records"));
    put(" [ ] ");
    CHECK(read_all(10, 1 << 20, 32, out, sizeof out) == 0 && strstr(out, "error: no records"));
    put("\n\n  \"text\"");
    CHECK(read_all(10, 1 << 20, 32, out, sizeof out) == 0 &&
          strstr(out, "line 3, column 3: expected an array of records or JSON Lines, found string"));
    /* a control character ends the record's text (kept), for the parser to name */
    put("[{\"a\": \"x\001y\"}]");
    CHECK(read_all(10, 1 << 20, 1 << 20, out, sizeof out) == 1 && strstr(out, "0 1:2 {\"a\": \"x\001\n"));
}

static void test_packer(const char *work)
{
    tokens_spill_t *sp = tokens_spill_new(work);
    tokens_packer_t *pk = tokens_packer_new(1, 8, 0, sp);
    CHECK(sp && pk);
    if (!sp || !pk)
        return;
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t mask[8] = {0, 1, 1, 1, 1, 1, 1, 1};
    int64_t lens[] = {3, 5, 8, 2, 6, 1, 7, 4, 4, 2};
    int64_t total = 0;
    for (int i = 0; i < 10; i++) {
        tokens_sample_t s = {ids, mask, lens[i], i};
        CHECK(tokens_packer_add(pk, &s) == 0);
        total += lens[i];
    }
    tokens_sample_t bad = {ids, mask, 9, 10};
    CHECK(tokens_packer_add(pk, &bad) < 0); /* longer than max_len */
    CHECK(tokens_packer_finish(pk) == 0);
    /* 42 tokens in rows of 8: best-fit-decreasing needs 6 rows, so must this (one batch) */
    CHECK(tokens_spill_rows(sp) == 6 && tokens_spill_tokens(sp) == 48);
    char file[600];
    snprintf(file, sizeof file, "%s/packer.h5", work);
    hid_t f = h5_create(file, TOKENS_FORMAT, TOKENS_VERSION);
    uint64_t sums[2][TOKENS_N_DATASETS];
    CHECK(tokens_spill_write(sp, f, "a", 0, 4, NULL, sums[0]) == 0);
    CHECK(tokens_spill_write(sp, f, "a2", 2, 6, NULL, sums[1]) < 0); /* out of order */
    CHECK(tokens_spill_write(sp, f, "b", 4, 6, NULL, sums[1]) == 0);
    tokens_split_t a, b;
    CHECK(tokens_read_split(f, "a", &a) == 0 && tokens_read_split(f, "b", &b) == 0);
    CHECK(tokens_check_split(&a, 16, 8, 1, 0) == 0 && tokens_check_split(&b, 16, 8, 1, 0) == 0);
    int seen[10] = {0}, n = 0;
    for (int64_t k = 0; k < a.n_samples; k++, n++)
        seen[a.sample_record[k]]++;
    for (int64_t k = 0; k < b.n_samples; k++, n++)
        seen[b.sample_record[k]]++;
    CHECK(n == 10);
    for (int i = 0; i < 10; i++)
        CHECK(seen[i] == 1);
    CHECK(a.row_offsets[4] == 32 && b.row_offsets[2] == 16 && a.sample_lengths[0] == 8); /* the 8 fills a row */
    tokens_split_free(&a);
    tokens_split_free(&b);
    h5_close(f);
    remove(file);
    tokens_packer_free(pk);
    tokens_spill_free(sp);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char work[512];
    snprintf(work, sizeof work, "%s/build/test-work", dir);
    mkdir(work, 0755);
    snprintf(path, sizeof path, "%s/records.json", work);
    test_chunking();
    test_errors();
    test_packer(work);
    remove(path);
    TEST_END();
}
