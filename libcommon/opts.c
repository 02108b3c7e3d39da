#include "opts.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "version.h"

int ftk_progress_force = 0;

static int want_help, want_version;

/* The options every tool has; appended after the tool's own in --help. */
static const opt_t common_opts[] = {
    {"quiet", 'q', OPT_FLAG, &ftk_quiet, NULL, "print only errors"},
    {"progress", 0, OPT_FLAG, &ftk_progress_force, NULL,
     "show progress even when stderr is not a terminal"},
    {"help", 'h', OPT_FLAG, &want_help, NULL, "show this help and exit"},
    {"version", 0, OPT_FLAG, &want_version, NULL, "show the version and exit"},
    {0},
};

static void print_default(const opt_t *o)
{
    switch (o->kind) {
    case OPT_INT:
        printf(" (default: %d)", *(int *)o->dest);
        break;
    case OPT_I64:
        printf(" (default: %" PRId64 ")", *(int64_t *)o->dest);
        break;
    case OPT_DOUBLE:
        printf(" (default: %g)", *(double *)o->dest);
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

static const opt_t *find_long(const opt_t *t, const char *name, size_t len)
{
    for (; t->kind != OPT_END; t++)
        if (strlen(t->name) == len && strncmp(t->name, name, len) == 0)
            return t;
    return NULL;
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

static int set_value(const opt_spec_t *spec, const opt_t *o, const char *optname, const char *val)
{
    char *end;
    errno = 0;
    switch (o->kind) {
    case OPT_INT:
    case OPT_I64: {
        long long v = strtoll(val, &end, 10);
        if (end == val || *end || errno == ERANGE || (o->kind == OPT_INT && (v > INT_MAX || v < INT_MIN))) {
            char m[256];
            snprintf(m, sizeof m, "option --%s expects an integer, got '%%s'", optname);
            return usage_error(spec, m, val);
        }
        if (o->kind == OPT_INT)
            *(int *)o->dest = (int)v;
        else
            *(int64_t *)o->dest = v;
        return 0;
    }
    case OPT_DOUBLE: {
        double v = strtod(val, &end);
        if (end == val || *end || errno == ERANGE) {
            char m[256];
            snprintf(m, sizeof m, "option --%s expects a number, got '%%s'", optname);
            return usage_error(spec, m, val);
        }
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

int opts_parse(const opt_spec_t *spec, int argc, char **argv, int *npos, char ***pos)
{
    static char **positional;
    free(positional);
    positional = calloc((size_t)argc + 1, sizeof *positional);
    if (!positional)
        return usage_error(spec, "%s", "out of memory");
    int np = 0, only_pos = 0;
    want_help = want_version = 0;

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
            o = find_long(spec->opts, a + 2, len);
            if (!o)
                o = find_long(common_opts, a + 2, len);
            if (!o)
                return usage_error(spec, "unknown option '%s'", a);
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
        if (set_value(spec, o, name, val) < 0)
            return -1;
    }
    if (want_help) {
        opts_help(spec);
        return 1;
    }
    if (want_version) {
        printf("%s %s\n", spec->tool, FTK_VERSION);
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
