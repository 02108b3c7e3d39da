#include "opts.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "version.h"

int ftk_progress_force = 0;

static int want_help, want_version;

/* The options every tool has; appended after the tool's own in --help. */
OPTS_TABLE_BEGIN
static const opt_t common_opts[] = {
    {"quiet", 'q', OPT_FLAG, &ftk_quiet, NULL, "print only errors"},
    {"progress", 0, OPT_FLAG, &ftk_progress_force, NULL,
     "show progress even when stderr is not a terminal"},
    {"help", 'h', OPT_FLAG, &want_help, NULL, "show this help and exit"},
    {"version", 0, OPT_FLAG, &want_version, NULL, "show the version and exit"},
    {0},
};
OPTS_TABLE_END

static int is_number(const opt_t *o) { return o->kind == OPT_INT || o->kind == OPT_I64 || o->kind == OPT_DOUBLE; }

/* A range string, parsed (opts.h): the bounds both as integers (exact up to 2^63-1) and as
 * doubles. */
typedef struct {
    int has_lo, has_hi, lo_open, hi_open;
    long long ilo, ihi;
    double dlo, dhi;
} range_t;

/* One bound, the whole of [s, e): 0, or -1 when it is no number. */
static int bound_parse(const char *s, const char *e, long long *i, double *d, int is_int)
{
    char tmp[64], *end;
    size_t n = (size_t)(e - s);
    if (n == 0 || n >= sizeof tmp)
        return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    errno = 0;
    if (is_int) {
        *i = strtoll(tmp, &end, 10);
        *d = (double)*i;
    } else {
        *d = strtod(tmp, &end);
        *i = 0;
    }
    return *end || errno || !isfinite(*d) ? -1 : 0;
}

static int range_get(const char *r, int is_int, range_t *out)
{
    memset(out, 0, sizeof *out);
    const char *dots = r ? strstr(r, "..") : NULL;
    if (!dots)
        return -1;
    const char *lo_end = dots, *hi_start = dots + 2;
    if (lo_end > r && lo_end[-1] == '<')
        out->lo_open = 1, lo_end--;
    if (*hi_start == '<')
        out->hi_open = 1, hi_start++;
    out->has_lo = lo_end > r;
    out->has_hi = *hi_start != 0;
    if ((out->lo_open && !out->has_lo) || (out->hi_open && !out->has_hi) || (is_int && (out->lo_open || out->hi_open)))
        return -1;
    if (out->has_lo && bound_parse(r, lo_end, &out->ilo, &out->dlo, is_int) < 0)
        return -1;
    if (out->has_hi && bound_parse(hi_start, hi_start + strlen(hi_start), &out->ihi, &out->dhi, is_int) < 0)
        return -1;
    if (out->has_lo && out->has_hi && (is_int ? out->ilo > out->ihi : !(out->dlo <= out->dhi)))
        return -1;
    return 0;
}

int opts_range_parse(const char *range, double *lo, int *lo_open, double *hi, int *hi_open)
{
    range_t r;
    if (range_get(range, 0, &r) < 0)
        return -1;
    *lo = r.has_lo ? r.dlo : -HUGE_VAL;
    *hi = r.has_hi ? r.dhi : HUGE_VAL;
    *lo_open = r.lo_open;
    *hi_open = r.hi_open;
    return 0;
}

/* The range in words for --help and messages: "0..1024", ">= 1", "[0, 1)", "any integer". */
static void range_text(const opt_t *o, char *out, size_t n)
{
    range_t r;
    int is_int = o->kind != OPT_DOUBLE;
    if (range_get(o->range, is_int, &r) < 0) {
        snprintf(out, n, "(no range)");
        return;
    }
    char lo[48], hi[48];
    if (is_int) {
        snprintf(lo, sizeof lo, "%lld", r.ilo);
        snprintf(hi, sizeof hi, "%lld", r.ihi);
    } else {
        snprintf(lo, sizeof lo, "%g", r.dlo);
        snprintf(hi, sizeof hi, "%g", r.dhi);
    }
    if (r.has_lo && r.has_hi) {
        if (is_int)
            snprintf(out, n, "%s..%s", lo, hi);
        else
            snprintf(out, n, "%c%s, %s%c", r.lo_open ? '(' : '[', lo, hi, r.hi_open ? ')' : ']');
    } else if (r.has_lo) {
        snprintf(out, n, "%s %s", r.lo_open ? ">" : ">=", lo);
    } else if (r.has_hi) {
        snprintf(out, n, "%s %s", r.hi_open ? "<" : "<=", hi);
    } else {
        snprintf(out, n, "%s", is_int ? "any integer" : "any finite number");
    }
}

static void print_default(const opt_t *o)
{
    char r[128];
    if (is_number(o))
        range_text(o, r, sizeof r);
    switch (o->kind) {
    case OPT_INT:
        printf(" (default: %d; range %s)", *(int *)o->dest, r);
        break;
    case OPT_I64:
        printf(" (default: %" PRId64 "; range %s)", *(int64_t *)o->dest, r);
        break;
    case OPT_DOUBLE:
        printf(" (default: %g; range %s)", *(double *)o->dest, r);
        break;
    case OPT_STR:
        if (*(const char **)o->dest)
            printf(" (default: %s)", *(const char **)o->dest);
        break;
    default:
        break;
    }
}

static void print_opts(const opt_t *t)
{
    for (; t->kind != OPT_END; t++) {
        char left[64];
        int n;
        if (t->short_name)
            n = snprintf(left, sizeof left, "  -%c, --%s", t->short_name, t->name);
        else
            n = snprintf(left, sizeof left, "      --%s", t->name);
        if (t->metavar && n > 0 && (size_t)n < sizeof left)
            snprintf(left + n, sizeof left - (size_t)n, " %s", t->metavar);
        if (strlen(left) > 28)
            printf("%s\n%30s", left, "");
        else
            printf("%-30s", left);
        printf("%s", t->help);
        print_default(t);
        printf("\n");
    }
}

void opts_help(const opt_spec_t *spec)
{
    printf("Usage: %s %s\n\n%s\n\nOptions:\n", spec->tool, spec->usage, spec->summary);
    print_opts(spec->opts);
    print_opts(common_opts);
    if (spec->epilog)
        printf("\n%s", spec->epilog);
    printf("\n");
}

/* Whether s[0..len) names the long option `name`, '_' read as '-' (opts.h). */
static int long_eq(const char *name, const char *s, size_t len)
{
    size_t i = 0;
    for (; i < len; i++)
        if (!name[i] || name[i] != (s[i] == '_' ? '-' : s[i]))
            return 0;
    return name[i] == 0;
}

int opts_long_is(const char *arg, const char *name)
{
    if (strncmp(arg, "--", 2))
        return 0;
    arg += 2;
    size_t len = strcspn(arg, "=");
    return long_eq(name, arg, len);
}

const opt_t *opts_find_long(const opt_t *t, const char *name, size_t len)
{
    for (; t->kind != OPT_END; t++)
        if (long_eq(t->name, name, len))
            return t;
    return NULL;
}

/* ---- "did you mean" ---------------------------------------------------------------------------- */

#define SUGGEST_MAX_LEN 64 /* a longer unknown name gets no suggestion */

static char fold(char c) { return c == '_' ? '-' : (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

/* The edit distance of a[0..n) and b (insertions, deletions, substitutions and swaps of
 * neighbours: the optimal string alignment), case and '_' folded; SIZE_MAX when either is
 * longer than SUGGEST_MAX_LEN. */
static size_t edit_distance(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b);
    if (n > SUGGEST_MAX_LEN || m > SUGGEST_MAX_LEN)
        return SIZE_MAX;
    size_t d[SUGGEST_MAX_LEN + 1][SUGGEST_MAX_LEN + 1];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t cost = fold(a[i - 1]) != fold(b[j - 1]), v = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]) &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

/* Whether a[0..n) and b are the same `-`-separated words in another order (--lr-min for
 * --min-lr), case and '_' folded. */
static int same_words(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b);
    if (n != m || n > SUGGEST_MAX_LEN)
        return 0;
    int used[SUGGEST_MAX_LEN] = {0}; /* by the start of a word of b: matched already */
    for (size_t i = 0; i < n;) {
        size_t wl = 0;
        while (i + wl < n && fold(a[i + wl]) != '-')
            wl++;
        int found = 0;
        for (size_t j = 0; j < m && !found;) {
            size_t bl = strcspn(b + j, "-");
            if (!used[j] && bl == wl) {
                size_t k = 0;
                while (k < wl && fold(a[i + k]) == b[j + k])
                    k++;
                if (k == wl)
                    found = used[j] = 1;
            }
            j += bl + 1;
        }
        if (!found)
            return 0;
        i += wl + 1;
    }
    return 1;
}

/* How near the unknown a[0..n) is to the option name b, least first: 0 the same words in
 * another order; 1 when one is the other's start (--micro, --warmup-steps); else 1 + the
 * edit distance; SIZE_MAX when too far to suggest (more than 1 edit in a name of up to 4
 * letters, 2 up to 8, 3 beyond). */
static size_t nearness(const char *a, size_t n, const char *b)
{
    if (same_words(a, n, b))
        return 0;
    size_t m = strlen(b), k = n < m ? n : m, i = 0;
    while (i < k && fold(a[i]) == fold(b[i]))
        i++;
    if (i == k && k >= 2 && (n <= m || fold(a[m]) == '-'))
        return 1;
    size_t d = edit_distance(a, n, b), cap = n <= 4 ? 1 : n <= 8 ? 2 : 3;
    return d <= cap ? d + 1 : SIZE_MAX;
}

void opts_suggest(const opt_t *const *tables, const char *name, size_t len, char *out, size_t n)
{
    const char *best[3];
    int nb = 0;
    size_t bd = SIZE_MAX;
    out[0] = 0;
    for (int t = 0; tables[t]; t++)
        for (const opt_t *o = tables[t]; o->kind != OPT_END; o++) {
            size_t d = nearness(name, len, o->name);
            if (d == SIZE_MAX || d > bd)
                continue;
            if (d < bd)
                bd = d, nb = 0;
            if (nb < 3)
                best[nb++] = o->name;
            else
                nb = 4; /* too many alike: no suggestion */
        }
    if (nb == 0 || nb > 3)
        return;
    size_t used = (size_t)snprintf(out, n, "did you mean ");
    for (int i = 0; i < nb && used < n; i++)
        used += (size_t)snprintf(out + used, n - used, "%s'--%s'", i == 0 ? "" : i == nb - 1 ? " or " : ", ", best[i]);
    if (used < n)
        snprintf(out + used, n - used, "?");
}

static const opt_t *find_short(const opt_t *t, char c)
{
    for (; t->kind != OPT_END; t++)
        if (t->short_name == c)
            return t;
    return NULL;
}

/* Whether w is one of the |-separated words of list (brackets around it ignored). */
static int is_word_of(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; p && n;) {
        p += strspn(p, "[=|");
        size_t len = strcspn(p, "|]");
        if (len == n && !strncmp(p, w, n))
            return 1;
        p = p[len] ? p + len + 1 : NULL;
    }
    return 0;
}

static int usage_error(const opt_spec_t *spec, const char *fmt, const char *arg)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    fprintf(stderr, "%s: error: %s\n", spec->tool, msg);
    fprintf(stderr, "Try '%s --help' for more information.\n", spec->tool);
    return -1;
}

/* "option --NAME: 'VAL' is not RANGE-TEXT" (kind: "an integer" or "a number"). */
static int range_error(const opt_spec_t *spec, const opt_t *o, const char *val, const char *why)
{
    char r[128], m[512];
    range_text(o, r, sizeof r);
    snprintf(m, sizeof m, "option --%s: '%%s' %s; need %s%s %s", o->name, why,
             o->kind == OPT_DOUBLE ? "a number" : "an integer", r[0] == '[' || r[0] == '(' ? " in" : "", r);
    return usage_error(spec, m, val);
}

static int set_value(const opt_spec_t *spec, const opt_t *o, const char *val)
{
    char *end;
    range_t r;
    errno = 0;
    switch (o->kind) {
    case OPT_INT:
    case OPT_I64: {
        long long v = strtoll(val, &end, 10);
        int overflow = errno == ERANGE; /* before range_get's own strtoll */
        if (end == val || *end)
            return range_error(spec, o, val, "is not an integer");
        range_get(o->range, 1, &r); /* checked by opts_parse */
        long long lo = o->kind == OPT_INT ? INT_MIN : LLONG_MIN, hi = o->kind == OPT_INT ? INT_MAX : LLONG_MAX;
        if (r.has_lo && r.ilo > lo)
            lo = r.ilo;
        if (r.has_hi && r.ihi < hi)
            hi = r.ihi;
        if (overflow || v < lo || v > hi)
            return range_error(spec, o, val, "is out of range");
        if (o->kind == OPT_INT)
            *(int *)o->dest = (int)v;
        else
            *(int64_t *)o->dest = v;
        return 0;
    }
    case OPT_DOUBLE: {
        double v = strtod(val, &end);
        /* ERANGE: beyond a double's range, or below its smallest normal (a denormal or 0) */
        int overflow = errno == ERANGE && fabs(v) >= 1;
        if (end == val || *end)
            return range_error(spec, o, val, "is not a number");
        range_get(o->range, 0, &r);
        if (!isfinite(v) || overflow || (r.has_lo && (r.lo_open ? !(v > r.dlo) : !(v >= r.dlo))) ||
            (r.has_hi && (r.hi_open ? !(v < r.dhi) : !(v <= r.dhi))))
            return range_error(spec, o, val, "is out of range");
        *(double *)o->dest = v;
        return 0;
    }
    case OPT_STR:
    case OPT_STR_OPT:
        *(const char **)o->dest = val;
        return 0;
    default:
        return -1;
    }
}

/* Every numeric option has a range that parses (opts.h): a table that breaks the rule
 * makes every command line of the tool fail, in the first test that runs it. (A default
 * may lie outside: 0 for "not given" where the user must give 1 or more.) */
static int check_table(const opt_spec_t *spec)
{
    range_t r;
    for (const opt_t *o = spec->opts; o->kind != OPT_END; o++)
        if (is_number(o) && range_get(o->range, o->kind != OPT_DOUBLE, &r) < 0) {
            char m[256];
            snprintf(m, sizeof m, "internal error: option --%s has no valid range in the option table (%%s)", o->name);
            return usage_error(spec, m, o->range ? o->range : "none");
        }
    return 0;
}

static void list_options(const opt_spec_t *spec)
{
    static const char *const kinds[] = {"end", "flag", "flag", "int", "i64", "double", "str", "str"};
    for (const opt_t *o = spec->opts; o->kind != OPT_END; o++) {
        char sn[2] = {o->short_name, 0};
        printf("%s\t%s\t%s\t%s\n", o->name, o->short_name ? sn : "-", kinds[o->kind],
               is_number(o) && o->range ? o->range : "");
    }
}

int opts_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0 || (a && b > INT64_MAX / a))
        return -1;
    *out = a * b;
    return 0;
}

void opts_start_threads(int n)
{
    if (n > 0)
        omp_set_num_threads(n);
    int team = 0;
#pragma omp parallel
    {
#pragma omp atomic
        team++;
    }
    (void)team;
}

int opts_parse(const opt_spec_t *spec, int argc, char **argv, int *npos, char ***pos)
{
    static char **positional;
    free(positional);
    positional = calloc((size_t)argc + 1, sizeof *positional);
    if (!positional)
        return usage_error(spec, "%s", "out of memory");
    int np = 0, only_pos = 0;
    want_help = want_version = 0;
    if (check_table(spec) < 0)
        return -1;
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--list-options")) {
            list_options(spec);
            return 1;
        }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == 0) {
            positional[np++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        const opt_t *o;
        const char *val = NULL;
        char name[128];
        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            o = opts_find_long(spec->opts, a + 2, len);
            if (!o)
                o = opts_find_long(common_opts, a + 2, len);
            if (!o) {
                const opt_t *const tables[] = {spec->opts, common_opts, NULL};
                char hint[256], m[512];
                opts_suggest(tables, a + 2, len, hint, sizeof hint);
                /* hint holds only the table's names: no '%' */
                snprintf(m, sizeof m, "unknown option '%%s'%s%s", hint[0] ? "; " : "", hint);
                return usage_error(spec, m, a);
            }
            snprintf(name, sizeof name, "%s", o->name);
            if (eq) {
                if (o->kind == OPT_FLAG || o->kind == OPT_FLAG_OFF)
                    return usage_error(spec, "option '%s' takes no value", a);
                val = eq + 1;
            }
        } else {
            o = find_short(spec->opts, a[1]);
            if (!o)
                o = find_short(common_opts, a[1]);
            if (!o)
                return usage_error(spec, "unknown option '%s'", a);
            snprintf(name, sizeof name, "%s", o->name);
            if (a[2]) {
                if (o->kind == OPT_FLAG || o->kind == OPT_FLAG_OFF)
                    return usage_error(spec, "option '%s' takes no value", a);
                val = a + 2;
            }
        }
        if (o->kind == OPT_FLAG) {
            *(int *)o->dest = 1;
            continue;
        }
        if (o->kind == OPT_FLAG_OFF) {
            *(int *)o->dest = 0;
            continue;
        }
        if (!val && o->kind == OPT_STR_OPT) {
            val = i + 1 < argc && is_word_of(o->metavar, argv[i + 1]) ? argv[++i] : "";
        }
        if (!val) {
            if (i + 1 >= argc) {
                char m[256];
                snprintf(m, sizeof m, "option --%s needs a value (%s)%%s", name, o->metavar ? o->metavar : "");
                return usage_error(spec, m, "");
            }
            val = argv[++i];
        }
        if (set_value(spec, o, val) < 0)
            return -1;
    }
    if (want_help) {
        opts_help(spec);
        return 1;
    }
    if (want_version) {
        ftk_version_print(stdout, spec->tool);
        return 1;
    }
    if (np < spec->min_pos)
        return usage_error(spec, "%s", spec->min_pos == 1 ? "missing input argument" : "missing arguments");
    if (spec->max_pos >= 0 && np > spec->max_pos)
        return usage_error(spec, "unexpected argument '%s'", positional[spec->max_pos]);
    *npos = np;
    *pos = positional;
    return 0;
}

int opts_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0))
        return -1;
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1},          {"B", 1},          {"KB", 1e3},          {"MB", 1e6},
                 {"GB", 1e9},      {"TB", 1e12},      {"KiB", 1024.0},      {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b > 1.8e19)
                return -1;
            *out = (uint64_t)b;
            return 0;
        }
    return -1;
}

int opts_env_seconds(const char *name, int zero_ok, double *out)
{
    const char *e = getenv(name);
    if (!e || !*e)
        return 0;
    char *end;
    errno = 0;
    double v = strtod(e, &end);
    if (end == e || *end || errno || !(zero_ok ? v >= 0 : v > 0) || v > 1e7) {
        ftk_err_set("%s=%s: not a number of seconds %s", name, e, zero_ok ? "(0: off)" : "above 0");
        return -1;
    }
    *out = v;
    return 0;
}
