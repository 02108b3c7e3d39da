/* opts.h — one option table per tool; it both parses argv and generates --help.
 *
 * A tool declares its options once:
 *
 *     static const opt_t opts[] = {
 *         {"output", 'o', OPT_STR, &out, "FILE", "output file"},
 *         {"max-len", 0, OPT_INT, &max_len, "N", "longest row in tokens"},
 *         {0}
 *     };
 *
 * and calls opts_parse(). The current value of each destination is its default and is
 * printed in --help, so a default lives in one place. Every tool also gets
 * -h/--help, --version, -q/--quiet (sets ftk_quiet) and --progress (forces the progress
 * display even when stderr is not a terminal).
 *
 * Accepted syntax: --name VALUE, --name=VALUE, -x VALUE, -xVALUE, `--` ends options,
 * a lone `-` is a positional (stdin/stdout).
 */
#ifndef FTK_OPTS_H
#define FTK_OPTS_H

#include <stdint.h>

typedef enum {
    OPT_END = 0,
    OPT_FLAG,     /* int* set to 1 */
    OPT_FLAG_OFF, /* int* set to 0 (the --no-… twin of a flag) */
    OPT_INT,      /* int* */
    OPT_I64,      /* int64_t* */
    OPT_DOUBLE,   /* double* */
    OPT_STR,      /* const char** (points into argv) */
    OPT_STR_OPT   /* const char**, a value that may be left out: --name=VALUE, or --name VALUE where
                   * VALUE is one of the metavar's |-separated words; --name alone sets "" */
} opt_kind_t;

typedef struct {
    const char *name;    /* long name without the dashes */
    char short_name;     /* 0 when none */
    opt_kind_t kind;
    void *dest;
    const char *metavar; /* shown after the name in --help; NULL for flags */
    const char *help;    /* one line */
} opt_t;

typedef struct {
    const char *tool;    /* "ftk-pack" */
    const char *usage;   /* what follows the tool name on the Usage line */
    const char *summary; /* what the tool does, printed under Usage */
    const char *epilog;  /* printed after the options (formats, exit codes); may be NULL */
    const opt_t *opts;   /* terminated by an entry with kind OPT_END */
    int min_pos;         /* bounds on the number of positional arguments */
    int max_pos;         /* -1: unbounded */
} opt_spec_t;

extern int ftk_progress_force;

/* Returns 0 when parsed: *npos positionals are in *pos (an array owned by the parser,
 * pointing into argv). Returns 1 when --help or --version was printed on stdout (the
 * tool exits 0). Returns -1 after printing a usage error on stderr (the tool exits 2). */
int opts_parse(const opt_spec_t *spec, int argc, char **argv, int *npos, char ***pos);

/* A byte size: "5GB" (10^9), "500MB", "2GiB" (2^30), "123" (bytes). 0 or -1. */
int opts_parse_size(const char *s, uint64_t *out);

/* The environment variable name as seconds: unset or empty leaves *out as it is (the
 * default) and returns 0; a number up to 1e7, above 0 (or 0 too with zero_ok: "off"), is
 * stored, 0; anything else is -1 with ftk_err_msg() naming the variable and its value. */
int opts_env_seconds(const char *name, int zero_ok, double *out);

/* Prints the generated help on stdout. */
void opts_help(const opt_spec_t *spec);

#endif
