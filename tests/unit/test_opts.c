/* test_opts.c — the checked number parser of libcommon/opts.h: ranges at their edges, open
 * ends, the types' own limits, overflow, NaN and infinities, and tables that break the
 * rules (a numeric option without a range, a range that does not parse). */
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
    TEST_END();
}
