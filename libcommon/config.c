/* config.c — options from YAML (config.h), through libyaml's event parser. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "log.h"

/* A config is a few hundred bytes; this bounds what a wrong path (a device, a model) costs. */
#define CONFIG_MAX_BYTES (1 << 20)

typedef struct {
    const char *path;
    const opt_t *opts;
    const config_alias_t *aliases;
    config_args_t *out;
    yaml_parser_t p;
} loader_t;

static int push(char ***v, int *n, const char *s)
{
    char **q = realloc(*v, (size_t)(*n + 1) * sizeof **v);
    char *d = q ? strdup(s) : NULL;
    if (q)
        *v = q;
    if (!d) {
        ftk_err_set("out of memory");
        return -1;
    }
    (*v)[(*n)++] = d;
    return 0;
}

static int at(const loader_t *L, yaml_mark_t m, const char *fmt, const char *a, const char *b)
{
    char what[512];
    snprintf(what, sizeof what, fmt, a, b);
    ftk_err_set("%s: line %zu, column %zu: %s", L->path, m.line + 1, m.column + 1, what);
    return -1;
}

static int next(loader_t *L, yaml_event_t *e)
{
    if (!yaml_parser_parse(&L->p, e)) {
        ftk_err_set("%s: line %zu, column %zu: %s", L->path, L->p.problem_mark.line + 1,
                    L->p.problem_mark.column + 1, L->p.problem ? L->p.problem : "malformed YAML");
        return -1;
    }
    return 0;
}

/* The option a key names: long names with '_' read as '-'. */
static const opt_t *find_opt(const opt_t *t, const char *key)
{
    char name[128];
    size_t n = strlen(key);
    if (n >= sizeof name)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        name[i] = key[i] == '_' ? '-' : key[i];
    for (; t->kind != OPT_END; t++)
        if (!strcmp(t->name, name))
            return t;
    return NULL;
}

static int is_true(const char *v) { return !strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "yes"); }
static int is_false(const char *v) { return !strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "no"); }

/* One option set to a scalar. */
static int set_opt(loader_t *L, const opt_t *o, const char *key, const char *val, yaml_mark_t m)
{
    char word[160];
    snprintf(word, sizeof word, "--%s", o->name);
    if (o->kind == OPT_FLAG || o->kind == OPT_FLAG_OFF) {
        if (!is_true(val) && !is_false(val))
            return at(L, m, "%s: a flag: true or false, not \"%s\"", key, val);
        /* a flag's twin (--no-x) is an option of its own; false leaves the default */
        if (is_true(val) == (o->kind == OPT_FLAG))
            return push(&L->out->words, &L->out->n_words, word);
        return 0;
    }
    if (o->kind == OPT_STR_OPT && (is_true(val) || is_false(val))) /* the option alone, or not */
        return is_true(val) ? push(&L->out->words, &L->out->n_words, word) : 0;
    if (!*val || !strcmp(val, "null") || !strcmp(val, "~"))
        return at(L, m, "%s: no value%s", key, "");
    return push(&L->out->words, &L->out->n_words, word) || push(&L->out->words, &L->out->n_words, val) ? -1 : 0;
}

static const config_alias_t *find_alias(const loader_t *L, const char *path)
{
    for (const config_alias_t *a = L->aliases; a && a->key; a++)
        if (!strcmp(a->key, path))
            return a;
    return NULL;
}

/* An alias's translated value (value_map), or NULL where the map has none. */
static const char *mapped(const config_alias_t *a, const char *val, char *buf, size_t n)
{
    if (!a->value_map)
        return val;
    const char *p = a->value_map;
    size_t vl = strlen(val);
    while (*p) {
        const char *eq = strchr(p, '='), *bar = strchr(p, '|');
        if (!bar)
            bar = p + strlen(p);
        if (eq && eq < bar && (size_t)(eq - p) == vl && !strncmp(p, val, vl)) {
            snprintf(buf, n, "%.*s", (int)(bar - eq - 1), eq + 1);
            return buf;
        }
        p = *bar ? bar + 1 : bar;
    }
    return NULL;
}

/* The scalar (or sequence of scalars) at path, for an alias. */
static int alias_values(loader_t *L, const config_alias_t *a, const char *path, char **vals, int n_vals,
                        yaml_mark_t m)
{
    if (a->action == CONFIG_REFUSE)
        return at(L, m, "%s: %s", path, a->options);
    if (a->action == CONFIG_IGNORE) {
        char note[1024];
        snprintf(note, sizeof note, "%s: line %zu, column %zu: %s: ignored (%s)", L->path, m.line + 1, m.column + 1,
                 path, a->options);
        return push(&L->out->notes, &L->out->n_notes, note);
    }
    if (!*a->options) { /* a value that must be one of value_map's, and sets nothing */
        char buf[128];
        if (n_vals != 1 || !mapped(a, vals[0], buf, sizeof buf))
            return at(L, m, "%s: \"%s\" is not a value ftk has an equivalent of", path, n_vals ? vals[0] : "");
        return 0;
    }
    char names[256];
    snprintf(names, sizeof names, "%s", a->options);
    char *save = NULL;
    int i = 0;
    for (char *tok = strtok_r(names, " ", &save); tok; tok = strtok_r(NULL, " ", &save), i++) {
        if (i >= n_vals)
            return at(L, m, "%s: expected %s values", path, a->options);
        const opt_t *o = find_opt(L->opts, tok);
        if (!o)
            return at(L, m, "internal: %s maps to an unknown option %s", path, tok);
        char buf[128];
        const char *v = mapped(a, vals[i], buf, sizeof buf);
        if (!v)
            return at(L, m, "%s: \"%s\" is not a value ftk has an equivalent of", path, vals[i]);
        if (set_opt(L, o, path, v, m) < 0)
            return -1;
    }
    if (i != n_vals)
        return at(L, m, "%s: expected %s values", path, a->options);
    return 0;
}

static int load_mapping(loader_t *L, const char *prefix);

/* The value after key (the key's mark: m): a scalar, a sequence of scalars, or a mapping. */
static int load_value(loader_t *L, const char *path, yaml_mark_t m)
{
    yaml_event_t e;
    if (next(L, &e) < 0)
        return -1;
    int rc = 0;
    if (e.type == YAML_MAPPING_START_EVENT) {
        yaml_event_delete(&e);
        const config_alias_t *a = find_alias(L, path);
        if (a && a->action == CONFIG_IGNORE) { /* a whole section ignored */
            if ((rc = alias_values(L, a, path, NULL, 0, m)) == 0) {
                int depth = 1; /* skip it */
                while (depth > 0 && rc == 0 && next(L, &e) == 0) {
                    depth += e.type == YAML_MAPPING_START_EVENT || e.type == YAML_SEQUENCE_START_EVENT;
                    depth -= e.type == YAML_MAPPING_END_EVENT || e.type == YAML_SEQUENCE_END_EVENT;
                    yaml_event_delete(&e);
                }
            }
            return rc;
        }
        return load_mapping(L, path);
    }
    if (e.type == YAML_SCALAR_EVENT) {
        char *v = (char *)e.data.scalar.value;
        const config_alias_t *a = find_alias(L, path);
        const opt_t *o = strchr(path, '.') ? NULL : find_opt(L->opts, path);
        char buf[128];
        /* an alias that takes this value first (LitGPT's precision "32-true"), then the
         * tool's own option of that name (ftk's "fp32", ftk's scalar `data` where LitGPT
         * has a section), then what the alias says of the key */
        if (a && a->action == CONFIG_OPTION && *a->options && mapped(a, v, buf, sizeof buf))
            rc = alias_values(L, a, path, &v, 1, m);
        else if (o)
            rc = set_opt(L, o, path, v, m);
        else if (a)
            rc = alias_values(L, a, path, &v, 1, m);
        else
            rc = at(L, m, "%s: not an option of this tool%s", path, " (see --help; - and _ are the same)");
        yaml_event_delete(&e);
        return rc;
    }
    if (e.type == YAML_SEQUENCE_START_EVENT) {
        yaml_event_delete(&e);
        char *vals[8];
        int n = 0;
        while (rc == 0 && next(L, &e) == 0) {
            if (e.type == YAML_SEQUENCE_END_EVENT) {
                yaml_event_delete(&e);
                break;
            }
            if (e.type != YAML_SCALAR_EVENT || n == 8)
                rc = at(L, e.start_mark, "%s: a list of values%s", path, "");
            else if (!(vals[n++] = strdup((char *)e.data.scalar.value)))
                rc = -1, n--, ftk_err_set("out of memory");
            yaml_event_delete(&e);
        }
        const config_alias_t *a = find_alias(L, path);
        if (rc == 0)
            rc = a ? alias_values(L, a, path, vals, n, m)
                   : at(L, m, "%s: a list is not a value of this option%s", path, "");
        for (int i = 0; i < n; i++)
            free(vals[i]);
        return rc;
    }
    rc = at(L, e.start_mark, "%s: unexpected YAML here%s", path, "");
    yaml_event_delete(&e);
    return rc;
}

/* The pairs of a mapping whose start was read, until its end. */
static int load_mapping(loader_t *L, const char *prefix)
{
    for (;;) {
        yaml_event_t e;
        if (next(L, &e) < 0)
            return -1;
        if (e.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&e);
            return 0;
        }
        if (e.type != YAML_SCALAR_EVENT) {
            at(L, e.start_mark, "a key (a name) was expected%s%s", "", "");
            yaml_event_delete(&e);
            return -1;
        }
        char path[256];
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", (char *)e.data.scalar.value);
        yaml_mark_t m = e.start_mark;
        yaml_event_delete(&e);
        if (n < 0 || n >= (int)sizeof path)
            return at(L, m, "a key nested too deep%s%s", "", "");
        if (load_value(L, path, m) < 0)
            return -1;
    }
}

int config_load(const char *path, const opt_t *opts, const config_alias_t *aliases, config_args_t *out)
{
    memset(out, 0, sizeof *out);
    /* a regular file of bounded size: not a FIFO (whose open would wait for a writer), not
     * /dev/zero, not a directory */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size > CONFIG_MAX_BYTES) {
        ftk_err_set("%s: not a configuration file (a regular file of at most 1 MiB)", path);
        close(fd);
        return -1;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        ftk_err_set("%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    loader_t L = {path, opts, aliases, out, {0}};
    if (!yaml_parser_initialize(&L.p)) {
        fclose(f);
        ftk_err_set("out of memory");
        return -1;
    }
    yaml_parser_set_input_file(&L.p, f);
    yaml_event_t e;
    int rc = 0, seen = 0;
    while (rc == 0 && (rc = next(&L, &e)) == 0) {
        yaml_event_type_t t = e.type;
        yaml_mark_t m = e.start_mark;
        yaml_event_delete(&e);
        if (t == YAML_STREAM_END_EVENT)
            break;
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_START_EVENT || t == YAML_DOCUMENT_END_EVENT)
            continue;
        if (t == YAML_MAPPING_START_EVENT && !seen) {
            seen = 1;
            rc = load_mapping(&L, "");
        } else
            rc = at(&L, m, "expected one mapping of option names to values%s%s", "", "");
    }
    yaml_parser_delete(&L.p);
    fclose(f);
    if (rc < 0)
        config_args_free(out);
    return rc < 0 ? -1 : 0;
}

void config_args_free(config_args_t *a)
{
    for (int i = 0; i < a->n_words; i++)
        free(a->words[i]);
    for (int i = 0; i < a->n_notes; i++)
        free(a->notes[i]);
    free(a->words);
    free(a->notes);
    memset(a, 0, sizeof *a);
}

/* A string as a YAML double-quoted scalar. */
static int quoted(buf_t *b, const char *s)
{
    int rc = buf_putc(b, '"');
    for (; *s && !rc; s++)
        rc = *s == '"' || *s == '\\' ? buf_printf(b, "\\%c", *s)
             : (unsigned char)*s < 0x20 ? buf_printf(b, "\\x%02x", (unsigned char)*s)
                                        : buf_putc(b, *s);
    return rc || buf_putc(b, '"');
}

int config_write(buf_t *out, const opt_t *opts, const char *const *skip, const char *header)
{
    int rc = header ? buf_printf(out, "%s", header) : 0;
    for (const opt_t *o = opts; o->kind != OPT_END && !rc; o++) {
        int skipped = 0;
        for (const char *const *s = skip; s && *s && !skipped; s++)
            skipped = !strcmp(*s, o->name);
        if (skipped)
            continue;
        switch (o->kind) {
        case OPT_FLAG:
            rc = buf_printf(out, "%s: %s\n", o->name, *(int *)o->dest ? "true" : "false");
            break;
        case OPT_FLAG_OFF: /* the twin of a flag that the table already wrote */
            break;
        case OPT_INT:
            rc = buf_printf(out, "%s: %d\n", o->name, *(int *)o->dest);
            break;
        case OPT_I64:
            rc = buf_printf(out, "%s: %" PRId64 "\n", o->name, *(int64_t *)o->dest);
            break;
        case OPT_DOUBLE:
            rc = buf_printf(out, "%s: %.17g\n", o->name, *(double *)o->dest);
            break;
        case OPT_STR:
            if (*(const char **)o->dest)
                rc = buf_printf(out, "%s: ", o->name) || quoted(out, *(const char **)o->dest) || buf_putc(out, '\n');
            break;
        case OPT_STR_OPT: /* "": given alone */
            if (*(const char **)o->dest && !**(const char **)o->dest)
                rc = buf_printf(out, "%s: true\n", o->name);
            else if (*(const char **)o->dest)
                rc = buf_printf(out, "%s: ", o->name) || quoted(out, *(const char **)o->dest) || buf_putc(out, '\n');
            break;
        default:
            break;
        }
    }
    if (rc)
        ftk_err_set("out of memory");
    return rc ? -1 : 0;
}
