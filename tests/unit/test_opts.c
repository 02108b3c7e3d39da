/* test_opts.c — the checked number parser of libcommon/opts.h: ranges at their edges, open
 * ends, the types' own limits, overflow, NaN and infinities, and tables that break the
 * rules (a numeric option without a range, a range that does not parse); long names with
 * `_` for `-`, and the "did you mean" of an unknown long option. */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../libcommon/opts.h"
#include "test.h"

static int n_int;
static int64_t n_i64;
static double n_dbl;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"int", 0, OPT_INT, &n_int, "N", "an int", "0..1024"},
    {"i64", 0, OPT_I64, &n_i64, "N", "an int64, any", ".."},
    {"frac", 0, OPT_DOUBLE, &n_dbl, "F", "a fraction", "0..<1"},
    {"global-batch", 0, OPT_I64, &n_i64, "G", "two words", "1.."},
    {"micro-batch", 0, OPT_I64, &n_i64, "B", "two words", "1.."},
    {"min-lr", 0, OPT_DOUBLE, &n_dbl, "LR", "two words", "0.."},
    {"eval-every", 0, OPT_INT, &n_int, "K", "two words", "0.."},
    {"eval-rows", 0, OPT_INT, &n_int, "N", "two words", "0.."},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {.tool = "test_opts", .usage = "", .summary = "", .opts = options, .max_pos = -1};

/* Parses one option=value; 0 accepted, -1 refused. stderr goes to /dev/null meanwhile. */
static int parse(const opt_spec_t *sp, const char *name, const char *value)
{
    char arg[256];
    snprintf(arg, sizeof arg, "--%s=%s", name, value);
    char *argv[] = {"test_opts", arg, NULL};
    int npos;
    char **pos;
    fflush(stderr);
    int saved = dup(2), nul = open("/dev/null", O_WRONLY);
    dup2(nul, 2);
    int rc = opts_parse(sp, 2, argv, &npos, &pos);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(nul);
    return rc;
}

int main(void)
{
    /* ints: both ends inclusive, the type's limit, not a number, overflow */
    CHECK(parse(&spec, "int", "0") == 0 && n_int == 0);
    CHECK(parse(&spec, "int", "1024") == 0 && n_int == 1024);
    CHECK(parse(&spec, "int", "1025") < 0 && n_int == 1024);
    CHECK(parse(&spec, "int", "-1") < 0);
    CHECK(parse(&spec, "int", "2147483648") < 0);
    CHECK(parse(&spec, "int", "nan") < 0 && parse(&spec, "int", "1.5") < 0 && parse(&spec, "int", "") < 0);
    CHECK(parse(&spec, "int", "12x") < 0);
    /* int64: its whole range, nothing past it */
    CHECK(parse(&spec, "i64", "9223372036854775807") == 0 && n_i64 == INT64_MAX);
    CHECK(parse(&spec, "i64", "-9223372036854775808") == 0 && n_i64 == INT64_MIN);
    CHECK(parse(&spec, "i64", "9223372036854775808") < 0 && n_i64 == INT64_MIN);
    CHECK(parse(&spec, "i64", "-9223372036854775809") < 0);
    /* doubles: a closed and an open end, NaN, infinities, overflow; a denormal is a number */
    CHECK(parse(&spec, "frac", "0") == 0 && n_dbl == 0);
    CHECK(parse(&spec, "frac", "0.999999") == 0 && n_dbl == 0.999999);
    CHECK(parse(&spec, "frac", "1") < 0 && parse(&spec, "frac", "-1e-300") < 0);
    CHECK(parse(&spec, "frac", "nan") < 0 && parse(&spec, "frac", "inf") < 0 && parse(&spec, "frac", "-inf") < 0);
    CHECK(parse(&spec, "frac", "1e999") < 0 && parse(&spec, "frac", "0x1p-1") == 0 && n_dbl == 0.5);
    CHECK(parse(&spec, "frac", "1e-320") == 0 && n_dbl > 0);

    /* opts_range_parse */
    double lo, hi;
    int lo_open, hi_open;
    CHECK(opts_range_parse("0<..1", &lo, &lo_open, &hi, &hi_open) == 0 && lo == 0 && lo_open && hi == 1 && !hi_open);
    CHECK(opts_range_parse("..", &lo, &lo_open, &hi, &hi_open) == 0 && isinf(lo) && isinf(hi));
    CHECK(opts_range_parse("1", &lo, &lo_open, &hi, &hi_open) < 0);
    CHECK(opts_range_parse("2..1", &lo, &lo_open, &hi, &hi_open) < 0);
    CHECK(opts_range_parse("<..1", &lo, &lo_open, &hi, &hi_open) < 0);

    /* products */
    int64_t p;
    CHECK(opts_mul_i64(3037000499, 3037000499, &p) == 0 && p == 9223372030926249001);
    CHECK(opts_mul_i64(INT64_MAX, 2, &p) < 0 && opts_mul_i64(-1, 2, &p) < 0);
    CHECK(opts_mul_i64(0, INT64_MAX, &p) == 0 && p == 0);

    /* tables that break the rules: every command line refused */
    static int bad_int = 5;
    OPTS_TABLE_BEGIN
    static const opt_t no_range[] = {{"n", 0, OPT_INT, &bad_int, "N", "no range"}, {0}};
    static const opt_t bad_range[] = {{"n", 0, OPT_INT, &bad_int, "N", "an open end on an int", "0..<4"}, {0}};
    OPTS_TABLE_END
    opt_spec_t s1 = spec, s2 = spec;
    s1.opts = no_range;
    s2.opts = bad_range;
    CHECK(parse(&s1, "n", "1") < 0 && bad_int == 5);
    CHECK(parse(&s2, "n", "1") < 0 && bad_int == 5);

    /* `_` reads as `-` in a long name (YAML's keys take either), nowhere else */
    CHECK(parse(&spec, "global_batch", "7") == 0 && n_i64 == 7);
    CHECK(parse(&spec, "micro_batch", "3") == 0 && n_i64 == 3);
    CHECK(parse(&spec, "global_batch_", "7") < 0 && parse(&spec, "globalbatch", "7") < 0);
    CHECK(opts_long_is("--min_lr=1", "min-lr") && opts_long_is("--min-lr", "min-lr") && !opts_long_is("--min-lrx", "min-lr"));
    CHECK(!opts_long_is("-min-lr", "min-lr") && !opts_long_is("--min", "min-lr"));

    /* did you mean: the same words reordered, a start, then the fewest edits; none when far or many */
    const opt_t *const tables[] = {options, NULL};
    char h[256];
    struct {
        const char *typed, *hint;
    } cases[] = {
        {"micro-bach", "did you mean '--micro-batch'?"},
        {"micro_bach", "did you mean '--micro-batch'?"},
        {"globalbatch", "did you mean '--global-batch'?"},
        {"Global-Batch", "did you mean '--global-batch'?"},
        {"lr-min", "did you mean '--min-lr'?"},
        {"batch-global", "did you mean '--global-batch'?"},
        {"micro", "did you mean '--micro-batch'?"},
        {"eval", "did you mean '--eval-every' or '--eval-rows'?"},
        {"frac-part", "did you mean '--frac'?"},
        {"itn", "did you mean '--int'?"},
        {"x", ""},
        {"batch", ""},
        {"completely-unrelated", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        opts_suggest(tables, cases[i].typed, strlen(cases[i].typed), h, sizeof h);
        if (strcmp(h, cases[i].hint))
            fprintf(stderr, "  --%s: got \"%s\", want \"%s\"\n", cases[i].typed, h, cases[i].hint);
        CHECK(strcmp(h, cases[i].hint) == 0);
    }
    /* the name's length up to its '=': --micro-bach=4 */
    opts_suggest(tables, "micro-bach=4", 10, h, sizeof h);
    CHECK(strcmp(h, "did you mean '--micro-batch'?") == 0);
    /* a name longer than the distance's table: no suggestion, no overrun */
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    opts_suggest(tables, longname, strlen(longname), h, sizeof h);
    CHECK(h[0] == 0);
    TEST_END();
}
