/* Unit tests of libcommon and formats: JSON parser, HDF5 conventions (checksums, zstd),
 * token-file builder and invariant checker, RNG, atomic files, metrics.jsonl and
 * TensorBoard trimming, the SVG plot's ticks and text. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../formats/h5.h"
#include "../../formats/json.h"
#include "../../formats/metrics.h"
#include "../../formats/tfevents.h"
#include "../../formats/tokens.h"
#include "../../libcommon/atomic.h"
#include "../../libcommon/buf.h"
#include "../../libcommon/hash.h"
#include "../../libcommon/log.h"
#include "../../libcommon/plot.h"
#include "../../libcommon/rng.h"
#include "../../libcommon/utf8.h"
#include "test.h"

static int parse_ok(const char *s)
{
    json_value_t *v;
    json_doc_t *d = json_parse(s, strlen(s), NULL, &v);
    json_free(d);
    return d != NULL;
}

static int parse_err(const char *s, const char *want)
{
    json_value_t *v;
    json_doc_t *d = json_parse(s, strlen(s), NULL, &v);
    if (d) {
        json_free(d);
        return 0;
    }
    if (strstr(ftk_err_msg(), want))
        return 1;
    fprintf(stderr, "got error \"%s\", wanted \"%s\"\n", ftk_err_msg(), want);
    return 0;
}

static void test_json(void)
{
    CHECK(parse_ok("{\"a\": [1, 2.5e3, -0, true, false, null, \"x\\u00e9\\ud83d\\ude00\"]}"));
    CHECK(parse_err("{\"a\": 1,}", "line 1, column 9: expected a string key"));
    CHECK(parse_err("[1,\n 2,\n 03]", "line 3, column 3"));
    CHECK(parse_err("\"\\ud800\"", "lone high surrogate"));
    CHECK(parse_err("\"a\xff\"", "invalid UTF-8"));
    CHECK(parse_err("\"\xc0\xaf\"", "invalid UTF-8")); /* overlong '/' */
    CHECK(parse_err("{\"k\": 1, \"k\": 2}", "duplicate key"));
    CHECK(parse_err("[1] x", "after the end"));
    CHECK(parse_err("", "unexpected end of input"));
    json_value_t *v;
    const char *s = "{\"big\": 9007199254740993, \"neg\": -9223372036854775808, \"f\": 1.5, \"s\": \"a\\u0000b\"}";
    json_doc_t *d = json_parse(s, strlen(s), NULL, &v);
    int64_t x = 0;
    CHECK(d && json_get_i64(json_get(v, "big"), &x) == 0 && x == 9007199254740993LL);
    CHECK(d && json_get_i64(json_get(v, "neg"), &x) == 0 && x == INT64_MIN);
    CHECK(d && json_get_i64(json_get(v, "f"), &x) < 0);
    CHECK(d && json_get(v, "s")->u.str.len == 3);
    json_free(d);
    /* multi (JSON Lines) */
    json_opts_t o = {.multi = 1};
    s = "{\"a\":1}\n{\"a\":2}\n\n{\"a\":3}\n";
    d = json_parse(s, strlen(s), &o, &v);
    CHECK(d && v->type == JSON_ARRAY && v->u.arr.n == 3);
    json_free(d);
    /* a deep document is refused, not a stack overflow */
    char *deep = malloc(200001);
    memset(deep, '[', 100000);
    memset(deep + 100000, ']', 100000);
    deep[200000] = 0;
    CHECK(parse_err(deep, "nesting deeper"));
    free(deep);
    buf_t b = {0};
    json_write_string(&b, "q\"\\\n\x01\xc3\xa9", 7);
    CHECK(strcmp(b.data, "\"q\\\"\\\\\\n\\u0001\xc3\xa9\"") == 0);
    buf_free(&b);
}

static void test_h5(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/unit.h5", dir);
    int32_t data[1000];
    for (int i = 0; i < 1000; i++)
        data[i] = i * 7 - 300;
    hid_t f = h5_create(path, "unit-test", 2);
    CHECK(f >= 0);
    hsize_t dims[2] = {100, 10};
    h5w_opts_t z = {.zstd_level = 3};
    uint64_t sum_plain = 0, sum_z = 0;
    CHECK(h5w_write_tensor(f, "plain", H5T_NATIVE_INT32, 2, dims, data, NULL, &sum_plain) == 0);
    CHECK(h5w_write_tensor(f, "zstd", H5T_NATIVE_INT32, 2, dims, data, &z, &sum_z) == 0);
    CHECK(sum_plain == hash_bytes(data, sizeof data) && sum_z == sum_plain);
    /* a stream must be given every row */
    h5w_stream_t *s = h5w_open(f, "short", H5T_NATIVE_INT32, 2, dims, NULL);
    CHECK(s && h5w_append(s, data, 50) == 0 && h5w_close(s, NULL) < 0);
    /* contiguous datasets larger than one H5Dwrite's piece (4 MiB: formats/h5.c), in
     * pieces and rows that do not divide them: every element in place, the same sum */
    enum { BIG = (4 << 20) / 4 * 2 + 3, ROW = 300001 }; /* 1-D: 3 pieces; 2-D: pieces of 3 rows */
    float *big = malloc(BIG * sizeof *big), *got = malloc(BIG * sizeof *got);
    CHECK(big && got);
    if (big && got) {
        for (int i = 0; i < BIG; i++)
            big[i] = (float)(i % 8191) - 4000.0f;
        hsize_t d1[1] = {BIG}, d2[2] = {BIG / ROW, ROW};
        uint64_t s1 = 0, s2 = 0;
        CHECK(h5w_write_tensor(f, "big", H5T_NATIVE_FLOAT, 1, d1, big, NULL, &s1) == 0);
        s = h5w_open(f, "rows", H5T_NATIVE_FLOAT, 2, d2, NULL);
        CHECK(s && h5w_append(s, big, 1) == 0 && h5w_append(s, big + ROW, d2[0] - 1) == 0 && h5w_close(s, &s2) == 0);
        CHECK(s1 == hash_bytes(big, BIG * sizeof *big) && s2 == hash_bytes(big, d2[0] * ROW * sizeof *big));
        CHECK(h5r_read(f, "big", H5T_NATIVE_FLOAT, got, BIG) == 0 && !memcmp(got, big, BIG * sizeof *big));
        CHECK(h5r_read(f, "rows", H5T_NATIVE_FLOAT, got, d2[0] * ROW) == 0 &&
              !memcmp(got, big, d2[0] * ROW * sizeof *big));
    }
    free(big);
    free(got);
    CHECK(h5_attr_set_str(f, "note", "h\xc3\xa9llo") == 0);
    CHECK(h5_close(f) == 0);

    char *fmt = NULL;
    int64_t ver = 0;
    f = h5_open(path, "unit-test", 2, &fmt, &ver);
    CHECK(f >= 0 && strcmp(fmt, "unit-test") == 0 && ver == 2);
    free(fmt);
    int32_t back[1000];
    CHECK(h5r_read(f, "zstd", H5T_NATIVE_INT32, back, 1000) == 0 && memcmp(back, data, sizeof data) == 0);
    uint64_t st, co;
    int has;
    CHECK(h5_verify_dataset(f, "zstd", &st, &co, &has) == 0 && has && st == co);
    char *note = NULL;
    CHECK(h5_attr_get_str(f, "note", &note) == 0 && strcmp(note, "h\xc3\xa9llo") == 0);
    free(note);
    h5_close(f);
    CHECK(h5_open(path, "unit-test", 1, NULL, NULL) < 0 && strstr(ftk_err_msg(), "newer than this ftk"));
    CHECK(h5_open(path, "tokens", 1, NULL, NULL) < 0 && strstr(ftk_err_msg(), "\"tokens\" expected"));
    unlink(path);
}

static void test_tokens(void)
{
    int32_t a[] = {1, 5, 6, 7, 2}, b[] = {1, 8, 2}, c[] = {1, 9, 9, 9, 9, 2};
    uint8_t ma[] = {0, 0, 1, 1, 1}, mb[] = {0, 1, 1}, mc[] = {0, 0, 0, 1, 1, 1};
    tokens_sample_t sm[] = {{a, ma, 5, 0}, {b, mb, 3, 1}, {c, mc, 6, 2}};
    tokens_split_t s;
    CHECK(tokens_build(sm, 3, 1, 8, 0, 42, &s) == 0);
    CHECK(s.n_rows == 2 && s.n_tokens == 16 && s.n_samples == 3); /* {6}, {5, 3} */
    CHECK(tokens_check_split(&s, 10, 8, 1, 0) == 0);
    s.tokens[3] = 10; /* out of vocabulary */
    CHECK(tokens_check_split(&s, 10, 8, 1, 0) == 1 && strstr(ftk_err_msg(), "is not a token id"));
    s.tokens[3] = 9;
    uint8_t first = s.loss_mask[s.sample_starts[1]];
    s.loss_mask[s.sample_starts[1]] = 1;
    CHECK(tokens_check_split(&s, 10, 8, 1, 0) == 1 && strstr(ftk_err_msg(), "first token"));
    s.loss_mask[s.sample_starts[1]] = first;
    s.sample_lengths[0] += 10;
    CHECK(tokens_check_split(&s, 10, 8, 1, 0) == 1 && strstr(ftk_err_msg(), "does not fit"));
    tokens_split_free(&s);
    CHECK(tokens_build(sm, 3, 0, 8, 0, 42, &s) == 0);
    CHECK(s.n_rows == 3 && s.n_tokens == 14 && tokens_check_split(&s, 10, 8, 0, 0) == 0);
    tokens_split_t sl;
    CHECK(tokens_slice(&s, 1, 3, &sl) == 0 && sl.n_rows == 2 && sl.row_offsets[0] == 0 &&
          tokens_check_split(&sl, 10, 8, 0, 0) == 0);
    tokens_split_free(&sl);
    tokens_split_free(&s);
    CHECK(tokens_build(sm, 3, 1, 4, 0, 42, &s) < 0); /* a sample longer than max_len */
}

static void test_rng(void)
{
    rng_t r1, r2;
    rng_seed(&r1, 7);
    rng_seed(&r2, 7);
    int same = 1;
    for (int i = 0; i < 100; i++)
        same &= rng_next(&r1) == rng_next(&r2);
    CHECK(same);
    /* Pinned value, computed independently (Python, from the xoshiro256** and splitmix64
     * definitions): the same seed gives the same stream on every machine. */
    rng_seed(&r1, 42);
    CHECK(rng_next(&r1) == 0x15780b2e0c2ec716ull);
    int64_t v[10];
    for (int i = 0; i < 10; i++)
        v[i] = i;
    rng_shuffle_i64(&r1, v, 10);
    int64_t sum = 0;
    for (int i = 0; i < 10; i++)
        sum += v[i];
    CHECK(sum == 45);
}

static void test_atomic(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/atomic.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("old", f);
    fclose(f);
    atomic_file_t a;
    CHECK(atomic_begin(&a, path) == 0);
    f = fopen(a.tmp_path, "w");
    fputs("new", f);
    fclose(f);
    atomic_abort(&a);
    char buf[8] = {0};
    f = fopen(path, "r");
    CHECK(f && fread(buf, 1, 7, f) == 3 && strcmp(buf, "old") == 0);
    fclose(f);
    CHECK(atomic_begin(&a, path) == 0);
    f = fopen(a.tmp_path, "w");
    fputs("new", f);
    fclose(f);
    CHECK(atomic_commit(&a) == 0);
    f = fopen(path, "r");
    CHECK(f && fread(buf, 1, 7, f) == 3 && strcmp(buf, "new") == 0);
    fclose(f);
    unlink(path);
}

/* metrics_trim parses the records: any JSON spelling of "step", only the record's own */
static void test_metrics_trim(void)
{
    static const char in[] = "{\"kind\": \"eval\", \"step\": 0, \"val_loss\": 2}\n"
                             "{\"kind\":\"step\",\"step\":4,\"elapsed_s\":1.5}\n"
                             "{\"kind\":\"step\",\"step\":5,\"elapsed_s\":2.5}\n"
                             "{ \"step\" : 4.0e0 , \"kind\" : \"checkpoint\" }\n"
                             "{\"kind\": \"note\", \"x\": {\"step\": 99}}\n"
                             "not json, \"step\": 1\n"
                             "\n"
                             "{\"step\": 1e300}\n"
                             "{\"kind\": \"step\", \"step\": 3}"; /* torn: no newline */
    buf_t b = {0}, out = {0};
    buf_append(&b, in, sizeof in - 1);
    double el = -1;
    CHECK(metrics_trim(&out, &b, 4, &el) == 0);
    static const char want[] = "{\"kind\": \"eval\", \"step\": 0, \"val_loss\": 2}\n"
                               "{\"kind\":\"step\",\"step\":4,\"elapsed_s\":1.5}\n"
                               "{ \"step\" : 4.0e0 , \"kind\" : \"checkpoint\" }\n"
                               "{\"kind\": \"note\", \"x\": {\"step\": 99}}\n"
                               "not json, \"step\": 1\n"
                               "\n";
    CHECK(out.len == sizeof want - 1 && memcmp(out.data, want, out.len) == 0);
    CHECK(el == 1.5);
    out.len = 0;
    CHECK(metrics_trim(&out, &b, -1, &el) == 0); /* a restart from step 0: no record with a step */
    static const char want0[] = "{\"kind\": \"note\", \"x\": {\"step\": 99}}\nnot json, \"step\": 1\n\n";
    CHECK(out.len == sizeof want0 - 1 && memcmp(out.data, want0, out.len) == 0 && el == 0);
    buf_free(&b);
    buf_free(&out);
}

/* The records of an event file: their steps in order, -1 for a file_version one; the
 * count, or -1 when the framing or a CRC is wrong. */
static int read_events(const char *path, int64_t *steps, int max)
{
    buf_t b = {0};
    if (buf_read_file(&b, path) < 0)
        return -1;
    int n = 0;
    size_t i = 0;
    const unsigned char *u = (const unsigned char *)b.data;
    while (i < b.len && n < max) {
        uint64_t len = 0;
        uint32_t c1 = 0, c2 = 0;
        if (b.len - i < 16)
            break;
        for (int k = 7; k >= 0; k--)
            len = len << 8 | u[i + k];
        for (int k = 3; k >= 0; k--)
            c1 = c1 << 8 | u[i + 8 + k];
        if (len > b.len - i - 16)
            break;
        for (int k = 3; k >= 0; k--)
            c2 = c2 << 8 | u[i + 12 + len + k];
        uint32_t m1 = crc32c(0, u + i, 8), m2 = crc32c(0, u + i + 12, len);
        m1 = ((m1 >> 15) | (m1 << 17)) + 0xa282ead8u, m2 = ((m2 >> 15) | (m2 << 17)) + 0xa282ead8u;
        if (c1 != m1 || c2 != m2)
            break;
        /* Event: fixed64 wall_time (0x09), varint step (0x10), then the rest */
        const unsigned char *e = u + i + 12;
        int64_t st = 0;
        if (len >= 10 && e[0] == 0x09 && e[9] == 0x10) {
            size_t j = 10;
            for (int sh = 0; j < len; sh += 7) {
                st |= (int64_t)(e[j] & 0x7f) << sh;
                if (!(e[j++] & 0x80))
                    break;
            }
            if (j < len && e[j] == 0x1a)
                st = -1;
        }
        steps[n++] = st;
        i += 16 + len;
    }
    int whole = i == b.len;
    buf_free(&b);
    return whole ? n : -1;
}

static void test_tfevents(const char *work)
{
    char dir[1100], path[1200], link[1200];
    snprintf(dir, sizeof dir, "%s/tfevents.%ld", work, (long)getpid());
    rm_tree(dir);
    tfevents_t *t = tfevents_open(dir, -1); /* a new run: no START record */
    CHECK(t != NULL);
    if (!t) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        return;
    }
    for (int s = 1; s <= 6; s++)
        CHECK(tfevents_scalar(t, "train/loss", s, 1.0, (float)s) == 0);
    CHECK(tfevents_close(t) == 0);
    /* its name, and a torn record after the last one (a kill -9 in a write) */
    char *name = NULL;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20))
            name = strdup(e->d_name);
    if (d)
        closedir(d);
    CHECK(name != NULL);
    snprintf(path, sizeof path, "%s/%s", dir, name ? name : "");
    FILE *f = fopen(path, "ab");
    CHECK(f && fwrite("\x30\0\0\0\0\0\0\0\1\2", 1, 10, f) == 10);
    if (f)
        fclose(f);
    int64_t st[16];
    CHECK(read_events(path, st, 16) == -1); /* torn */
    /* a link in the directory is not trimmed (not a file written here) */
    snprintf(link, sizeof link, "%s/events.out.tfevents.link", dir);
    CHECK(symlink(path, link) == 0);
    CHECK(tfevents_trim(dir, 4) == 0);
    CHECK(read_events(path, st, 16) == 5 && st[0] == -1 && st[1] == 1 && st[4] == 4);
    CHECK(tfevents_trim(dir, 4) == 0 && read_events(path, st, 16) == 5); /* nothing more to do */
    struct stat sb;
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    unlink(link);
    /* a process continuing the history: its START record at the first step it writes
     * (the first file renamed: a name is unique per second and process) */
    snprintf(link, sizeof link, "%s/events.out.tfevents.0.first", dir);
    CHECK(rename(path, link) == 0);
    t = tfevents_open(dir, 5);
    CHECK(t != NULL && tfevents_scalar(t, "train/loss", 5, 2.0, 5.0f) == 0);
    CHECK(tfevents_close(t) == 0);
    CHECK(read_events(link, st, 16) == 5);
    /* a restart from step 0: every record with a step goes; a file left with its version
     * record alone goes with them */
    CHECK(tfevents_trim(dir, -1) == 0);
    int left = 0;
    d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        left += e->d_name[0] != '.';
    if (d)
        closedir(d);
    CHECK(left == 0);
    CHECK(tfevents_trim("/nonexistent/tb", 3) == 0);
    /* a directory that cannot be made: nothing made, the error names it */
    snprintf(path, sizeof path, "%s/no/such", dir);
    CHECK(tfevents_open(path, 0) == NULL && strstr(ftk_err_msg(), path));
    /* tfevents_discard removes the file, and the directory it made */
    snprintf(path, sizeof path, "%s/new", dir);
    t = tfevents_open(path, 0);
    CHECK(t != NULL && tfevents_discard(t) == 0 && stat(path, &sb) < 0);
    free(name);
    rm_tree(dir);
}

/* plot_svg: ticks where a tick step is below the spacing of doubles (the loop once never
 * ended), ranges wider than a double, and names that are not text. The alarm turns a hang
 * into a failure. */
static void test_plot(void)
{
    double xs[][2] = {{1, 2}, {1e17, 1e17 + 16}, {1, 1e300}, {5, 5}, {1e17, 1e17}};
    double ys[][2] = {{1e17, 1.0000000000000002e17}, {1, 2}, {-1e308, 1e308}, {0, 5e-324}, {3, 3}};
    alarm(60);
    for (size_t c = 0; c < sizeof xs / sizeof *xs; c++) {
        plot_series_t s = {xs[c], ys[c], 2, 0, 0, 0};
        plot_panel_t p = {"loss", "step", &s, 1, NULL};
        const char *names[] = {"run\001\033<&\"\377\342\202"};
        buf_t b = {0};
        CHECK(plot_svg(&b, &p, 1, 1, names, 1, "T\002\357\277\276\300\257") == 0);
        CHECK(b.len < 16384 && !strstr(b.data, "nan") && !strstr(b.data, "inf"));
        /* well-formed text: valid UTF-8, no C0 control but \n, no U+FFFE */
        CHECK(utf8_check(b.data, b.len) == b.len && !strstr(b.data, "\357\277\276"));
        int ctl = 0;
        for (size_t i = 0; i < b.len; i++)
            ctl += (unsigned char)b.data[i] < 0x20 && b.data[i] != '\n';
        CHECK(ctl == 0 && strstr(b.data, "run\342\220\201\342\220\233&lt;&amp;&quot;\357\277\275"));
        if (c == 0)
            CHECK(strstr(b.data, ">1e+17<") && strstr(b.data, ">1.0000000000000002e+17<"));
        buf_free(&b);
    }
    alarm(0);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char work[512];
    snprintf(work, sizeof work, "%s/build/test-work", dir);
    mkdir(work, 0755);
    test_json();
    test_h5(work);
    test_tokens();
    test_rng();
    test_atomic(work);
    test_metrics_trim();
    test_tfevents(work);
    test_plot();
    TEST_END();
}
