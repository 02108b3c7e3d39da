/* config.c — options from YAML (config.h), through libyaml's event parser. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "log.h"
#include "path.h"

/* A config is a few hundred bytes; this bounds what a wrong path (a device, a model) costs. */
#define CONFIG_MAX_BYTES ((size_t)1 << 20)

typedef struct {
    const char *path;
    const config_spec_t *s;
    config_args_t *out;
    const buf_t *text;
    yaml_parser_t p;
    int dialect; /* a key that only the alias table knows was read */
    struct set_s {
        const void *dest; /* an option and its --no- twin share it */
        const char *name;
        yaml_mark_t m;
    } *set;
    int n_set;
    struct key_s {
        char *key; /* - for _ */
        yaml_mark_t m;
    } *keys;
    int n_keys;
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

static int control(const loader_t *L) { return L->s->flags & CONFIG_CONTROL; }

static int at(const loader_t *L, yaml_mark_t m, const char *fmt, ...) FTK_PRINTF(3, 4);
static int at(const loader_t *L, yaml_mark_t m, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ftk_err_set("%s: line %zu, column %zu: %s", L->path, m.line + 1, m.column + 1, what);
    return -1;
}

/* The option a key names: long names with '_' read as '-', as on the command line. */
static const opt_t *find_opt(const opt_t *t, const char *key) { return opts_find_long(t, key, strlen(key)); }

static int listed(const char *const *list, const char *name)
{
    for (; list && *list; list++)
        if (!strcmp(*list, name))
            return 1;
    return 0;
}

/* Text of the file as a message shows it: printable ASCII (others as '?'), at most 60
 * bytes. A control file's text is never shown: a key is named by the option it matches
 * (a name of the tool's, not of the file's) or as "this key", a value as "". */
static const char *shown(const loader_t *L, const char *s, int is_key, char *buf, size_t n)
{
    if (control(L)) {
        const opt_t *o = is_key ? find_opt(L->s->opts, s) : NULL;
        snprintf(buf, n, "%s", o ? o->name : is_key ? "this key" : "");
        return buf;
    }
    size_t i = 0;
    for (; s[i] && i + 4 < n && i < 60; i++)
        buf[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    if (s[i])
        buf[i++] = '.', buf[i++] = '.', buf[i++] = '.';
    buf[i] = 0;
    return buf;
}
#define KEY(s) shown(L, (s), 1, (char[80]){0}, 80)
#define VAL(s) shown(L, (s), 0, (char[80]){0}, 80)

/* libyaml's problem, where it found it: its words are its own (which token it expected),
 * never the file's. A reader error (bytes that are not UTF-8, control characters) has an
 * offset, not a mark. */
static int next(loader_t *L, yaml_event_t *e)
{
    if (yaml_parser_parse(&L->p, e))
        return 0;
    yaml_mark_t m = L->p.problem_mark;
    if (L->p.error == YAML_READER_ERROR) {
        memset(&m, 0, sizeof m);
        for (size_t i = 0; i < L->p.problem_offset && i < L->text->len; i++)
            if (L->text->data[i] == '\n')
                m.line++, m.column = 0;
            else
                m.column++;
    }
    const char *ctx = L->p.context;
    return at(L, m, "%s%s%s%s", L->p.problem ? L->p.problem : "malformed YAML", ctx ? " (" : "", ctx ? ctx : "",
              ctx ? ")" : "");
}

static int is_true(const char *v) { return !strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "yes"); }
static int is_false(const char *v) { return !strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "no"); }

/* YAML's null: a plain scalar that is empty, ~ or null ("" quoted is an empty string). */
static int is_null(const yaml_event_t *e)
{
    const char *v = (const char *)e->data.scalar.value;
    return e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL"));
}

/* A path option of spec->inside, relative to spec->within (or absolute) and staying in it
 * (config.h): the word to give (within/val, or val) into buf. The checks are on the path's
 * text and, for the part that exists, on where it resolves: a link inside the directory
 * may not lead out. */
static int inside(loader_t *L, const opt_t *o, const char *val, yaml_mark_t m, char *buf, size_t n)
{
    const char *w = L->s->within;
    int bad = 0;
    for (const char *p = val; *p && !bad; p += strcspn(p, "/"), p += *p == '/')
        bad = p[0] == '.' && p[1] == '.' && (p[2] == '/' || !p[2]);
    char wr[PATH_MAX], r[PATH_MAX];
    char probe[PATH_MAX];
    int len = val[0] == '/' ? snprintf(buf, n, "%s", val) : snprintf(buf, n, "%.*s/%s", path_dir_len(w), w, val);
    if (!bad && (len >= (int)n || strlen(buf) >= sizeof probe))
        return at(L, m, "%s: a path too long", KEY(o->name));
    if (!bad && !realpath(w, wr))
        return at(L, m, "%s: %s: %s", KEY(o->name), w, strerror(errno));
    if (!bad) {
        memcpy(probe, buf, strlen(buf) + 1);
        /* the longest part that exists, resolved (what is left after it has no link and no ..) */
        while (!realpath(probe, r)) {
            char *slash = strrchr(probe, '/');
            if ((errno != ENOENT && errno != ENOTDIR) || !slash)
                return at(L, m, "%s: %s", KEY(o->name), strerror(errno));
            slash[slash == probe] = 0; /* "/a" is left as "/" */
        }
        bad = path_under(r, wr) < 0;
    }
    if (bad)
        return at(L, m,
                  "%s: a path that leaves the directory %s (outside it, with .., or through a symbolic link): the "
                  "directory's options may only name paths inside it; give --%s on the command line to write "
                  "elsewhere",
                  KEY(o->name), w, o->name);
    return 0;
}

/* One option set to a scalar: refused if the spec skips it, if another key set it already,
 * if its value is not one it can take. */
static int set_opt(loader_t *L, const opt_t *o, const char *key, const char *val, yaml_mark_t m)
{
    if (listed(L->s->skip, o->name))
        return at(L, m, "%s: %s", KEY(key), L->s->skip_why ? L->s->skip_why : "not allowed in this file");
    for (int i = 0; i < L->n_set; i++)
        if (L->set[i].dest == o->dest)
            return at(L, m, "%s: sets --%s, which line %zu, column %zu set already", KEY(key), L->set[i].name,
                      L->set[i].m.line + 1, L->set[i].m.column + 1);
    struct set_s *q = realloc(L->set, (size_t)(L->n_set + 1) * sizeof *q);
    if (!q) {
        ftk_err_set("out of memory");
        return -1;
    }
    L->set = q;
    L->set[L->n_set++] = (struct set_s){o->dest, o->name, m};
    char word[160], where[PATH_MAX + 8];
    snprintf(word, sizeof word, "--%s", o->name);
    if (o->kind == OPT_FLAG || o->kind == OPT_FLAG_OFF) {
        if (!is_true(val) && !is_false(val))
            return control(L) ? at(L, m, "%s: a flag: true or false", KEY(key))
                              : at(L, m, "%s: a flag: true or false, not \"%s\"", KEY(key), VAL(val));
        /* a flag's twin (--no-x) is an option of its own; false leaves the default */
        if (is_true(val) == (o->kind == OPT_FLAG))
            return push(&L->out->words, &L->out->n_words, word);
        return 0;
    }
    if (o->kind == OPT_STR_OPT && (is_true(val) || is_false(val))) /* the option alone, or not */
        return is_true(val) ? push(&L->out->words, &L->out->n_words, word) : 0;
    if (!*val || !strcmp(val, "null") || !strcmp(val, "~"))
        return at(L, m, "%s: no value", KEY(key));
    if (listed(L->s->inside, o->name)) {
        if (inside(L, o, val, m, where, sizeof where) < 0)
            return -1;
        val = where;
    }
    return push(&L->out->words, &L->out->n_words, word) || push(&L->out->words, &L->out->n_words, val) ? -1 : 0;
}

static const config_alias_t *find_alias(const loader_t *L, const char *path)
{
    for (const config_alias_t *a = L->s->aliases; a && a->key; a++)
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

static int note(loader_t *L, yaml_mark_t m, const char *path, const char *what)
{
    char text[1024];
    if (m.line || m.column || m.index)
        snprintf(text, sizeof text, "%s: line %zu, column %zu: %s: %s", L->path, m.line + 1, m.column + 1, path,
                 what);
    else
        snprintf(text, sizeof text, "%s: %s: %s", L->path, path, what);
    return push(&L->out->notes, &L->out->n_notes, text);
}

/* The scalar (or sequence of scalars) at path, for an alias; n_vals -1: a null. */
static int alias_values(loader_t *L, const config_alias_t *a, const char *path, char **vals, int n_vals,
                        yaml_mark_t m)
{
    char why[512];
    if (a->action == CONFIG_IGNORE) {
        snprintf(why, sizeof why, "ignored (%s)", a->options);
        return note(L, m, path, why);
    }
    if (n_vals < 0 && (a->action == CONFIG_REFUSE ? a->null_value != NULL : a->null_value && !*a->null_value))
        return 0; /* the default, which asks for nothing */
    if (a->action == CONFIG_REFUSE)
        return at(L, m, "%s: %s", path, a->options);
    if (n_vals < 0 && !a->null_value)
        return at(L, m, "%s: no value (null), and %s's default for it is none ftk can take: give one", path,
                  L->s->dialect ? L->s->dialect : "the file's program");
    char *nv = (char *)a->null_value;
    if (n_vals < 0)
        vals = &nv, n_vals = 1;
    if (!*a->options) { /* a value that must be one of value_map's, and sets nothing */
        char buf[128];
        if (n_vals != 1 || !mapped(a, vals[0], buf, sizeof buf))
            return at(L, m, "%s: \"%s\" is not a value ftk has an equivalent of", path, n_vals ? VAL(vals[0]) : "");
        return 0;
    }
    char names[256];
    snprintf(names, sizeof names, "%s", a->options);
    char *save = NULL;
    int i = 0;
    for (char *tok = strtok_r(names, " ", &save); tok; tok = strtok_r(NULL, " ", &save), i++) {
        if (i >= n_vals)
            return at(L, m, "%s: expected %s values", path, a->options);
        const opt_t *o = find_opt(L->s->opts, tok);
        if (!o)
            return at(L, m, "internal: %s maps to an unknown option %s", path, tok);
        char buf[128];
        const char *v = mapped(a, vals[i], buf, sizeof buf);
        if (!v)
            return at(L, m, "%s: \"%s\" is not a value ftk has an equivalent of", path, VAL(vals[i]));
        if (set_opt(L, o, path, v, m) < 0)
            return -1;
    }
    if (i != n_vals)
        return at(L, m, "%s: expected %s values", path, a->options);
    return 0;
}

static int load_mapping(loader_t *L, const char *prefix, int depth);

/* The value after key (the key's mark: m): a scalar, a sequence of scalars, or a mapping
 * (depth: the mapping's that holds the key, from 1). */
static int load_value(loader_t *L, const char *path, yaml_mark_t m, int depth)
{
    yaml_event_t e;
    if (next(L, &e) < 0)
        return -1;
    int rc = 0;
    if (e.type == YAML_MAPPING_START_EVENT) {
        yaml_mark_t vm = e.start_mark;
        yaml_event_delete(&e);
        const config_alias_t *a = find_alias(L, path);
        if (a && a->action == CONFIG_IGNORE) { /* a whole section ignored */
            if ((rc = alias_values(L, a, path, NULL, 0, m)) == 0) {
                int d = 1; /* skip it: a loop, however deep it goes */
                while (d > 0 && rc == 0 && (rc = next(L, &e)) == 0) {
                    d += e.type == YAML_MAPPING_START_EVENT || e.type == YAML_SEQUENCE_START_EVENT;
                    d -= e.type == YAML_MAPPING_END_EVENT || e.type == YAML_SEQUENCE_END_EVENT;
                    yaml_event_delete(&e);
                }
            }
            return rc;
        }
        if (depth >= CONFIG_MAX_DEPTH)
            return at(L, vm, "mappings nested deeper than %d levels", CONFIG_MAX_DEPTH);
        return load_mapping(L, path, depth + 1);
    }
    if (e.type == YAML_SCALAR_EVENT) {
        char *v = (char *)e.data.scalar.value;
        const config_alias_t *a = find_alias(L, path);
        const opt_t *o = strchr(path, '.') ? NULL : find_opt(L->s->opts, path);
        char buf[128];
        /* a null: what the alias says it means; then an alias that takes this value (LitGPT's
         * precision "32-true"), then the tool's own option of that name (ftk's "fp32", ftk's
         * scalar `data` where LitGPT has a section), then what the alias says of the key */
        if (a && is_null(&e))
            rc = alias_values(L, a, path, NULL, -1, m);
        else if (a && a->action == CONFIG_OPTION && *a->options && mapped(a, v, buf, sizeof buf))
            rc = alias_values(L, a, path, &v, 1, m);
        else if (o)
            rc = set_opt(L, o, path, v, m);
        else if (a)
            rc = alias_values(L, a, path, &v, 1, m);
        else {
            char hint[192] = "";
            if (!strchr(path, '.')) {
                const opt_t *tables[] = {L->s->opts, NULL};
                opts_suggest(tables, path, strlen(path), hint, sizeof hint);
            }
            rc = at(L, m, "%s: not an option of this tool (%s%ssee --help; - and _ are the same)", KEY(path), hint,
                    hint[0] ? "; " : "");
        }
        yaml_event_delete(&e);
        return rc;
    }
    if (e.type == YAML_SEQUENCE_START_EVENT) {
        yaml_event_delete(&e);
        char *vals[8];
        int n = 0;
        while (rc == 0 && (rc = next(L, &e)) == 0) {
            if (e.type == YAML_SEQUENCE_END_EVENT) {
                yaml_event_delete(&e);
                break;
            }
            if (e.type != YAML_SCALAR_EVENT || n == 8)
                rc = at(L, e.start_mark, "%s: a list of values", KEY(path));
            else if (!(vals[n++] = strdup((char *)e.data.scalar.value)))
                rc = -1, n--, ftk_err_set("out of memory");
            yaml_event_delete(&e);
        }
        const config_alias_t *a = find_alias(L, path);
        if (rc == 0)
            rc = a ? alias_values(L, a, path, vals, n, m)
                   : at(L, m, "%s: a list is not a value of this option", KEY(path));
        for (int i = 0; i < n; i++)
            free(vals[i]);
        return rc;
    }
    rc = at(L, e.start_mark, "%s: unexpected YAML here", KEY(path));
    yaml_event_delete(&e);
    return rc;
}

/* A key read (its path, with - for _): refused if empty or given before. */
static int new_key(loader_t *L, const char *key, const char *path, yaml_mark_t m)
{
    if (!*key)
        return at(L, m, "an empty key: a key names an option");
    size_t n = strlen(path);
    char *norm = malloc(n + 1);
    struct key_s *q = norm ? realloc(L->keys, (size_t)(L->n_keys + 1) * sizeof *q) : NULL;
    if (!q) {
        free(norm);
        ftk_err_set("out of memory");
        return -1;
    }
    L->keys = q;
    for (size_t i = 0; i <= n; i++)
        norm[i] = path[i] == '_' ? '-' : path[i];
    for (int i = 0; i < L->n_keys; i++)
        if (!strcmp(L->keys[i].key, norm)) {
            free(norm);
            return at(L, m, "%s: given twice (first at line %zu, column %zu; - and _ are the same)", KEY(path),
                      L->keys[i].m.line + 1, L->keys[i].m.column + 1);
        }
    L->keys[L->n_keys++] = (struct key_s){norm, m};
    if (find_alias(L, path) && (strchr(path, '.') || !find_opt(L->s->opts, path)))
        L->dialect = 1;
    return 0;
}

/* The pairs of a mapping whose start was read, until its end. */
static int load_mapping(loader_t *L, const char *prefix, int depth)
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
            at(L, e.start_mark, "a key (a name) was expected");
            yaml_event_delete(&e);
            return -1;
        }
        char path[256];
        const char *key = (const char *)e.data.scalar.value;
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
        yaml_mark_t m = e.start_mark;
        int rc = n < 0 || n >= (int)sizeof path ? at(L, m, "a key nested too deep") : new_key(L, key, path, m);
        yaml_event_delete(&e);
        if (rc < 0 || load_value(L, path, m, depth) < 0)
            return -1;
    }
}

/* The options a file of the aliases' dialect sets by leaving their keys out. */
static int load_absent(loader_t *L)
{
    yaml_mark_t none = {0, 0, 0};
    for (const config_alias_t *a = L->s->aliases; L->dialect && a && a->key; a++) {
        if (a->action != CONFIG_OPTION || !a->absent || !*a->options)
            continue;
        char names[256];
        snprintf(names, sizeof names, "%s", a->options);
        char *save = NULL, *first = strtok_r(names, " ", &save);
        const opt_t *o = find_opt(L->s->opts, first);
        int given = 0;
        for (int i = 0; o && i < L->n_set && !given; i++)
            given = L->set[i].dest == o->dest;
        if (!o || given)
            continue;
        char what[512];
        snprintf(what, sizeof what, "not given: --%s %s (%s's default)", o->name, a->absent,
                 L->s->dialect ? L->s->dialect : "the file's program");
        if (set_opt(L, o, a->key, a->absent, none) < 0 || note(L, none, a->key, what) < 0)
            return -1;
    }
    return 0;
}

int config_load(const char *path, const config_spec_t *spec, config_args_t *out)
{
    memset(out, 0, sizeof *out);
    /* a regular file of bounded size: not a FIFO (whose open would wait for a writer), not
     * /dev/zero, not a directory; a control file not through a link */
    buf_t text = {0};
    if (buf_read_small(&text, path, CONFIG_MAX_BYTES, spec->flags & CONFIG_CONTROL ? BUF_NOFOLLOW : 0) < 0) {
        buf_free(&text);
        return -1;
    }
    loader_t L = {.path = path, .s = spec, .out = out, .text = &text};
    if (!yaml_parser_initialize(&L.p)) {
        buf_free(&text);
        ftk_err_set("out of memory");
        return -1;
    }
    yaml_parser_set_input_string(&L.p, (const unsigned char *)text.data, text.len);
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
            rc = load_mapping(&L, "", 1);
        } else
            rc = at(&L, m, "expected one mapping of option names to values");
    }
    if (rc == 0)
        rc = load_absent(&L);
    yaml_parser_delete(&L.p);
    buf_free(&text);
    for (int i = 0; i < L.n_keys; i++)
        free(L.keys[i].key);
    free(L.keys);
    free(L.set);
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
