/* opts.h — one option table per tool; it both parses argv and generates --help.
 *
 * A tool declares its options once:
 *
 *     OPTS_TABLE_BEGIN
 *     static const opt_t opts[] = {
 *         {"output", 'o', OPT_STR, &out, "FILE", "output file"},
 *         {"max-len", 0, OPT_INT, &max_len, "N", "longest row in tokens", "2..1048576"},
 *         {0}
 *     };
 *     OPTS_TABLE_END
 *
 * and calls opts_parse(). The current value of each destination is its default and is
 * printed in --help, so a default lives in one place. Every tool also gets
 * -h/--help, --version, -q/--quiet (sets ftk_quiet) and --progress (forces the progress
 * display even when stderr is not a terminal).
 *
 * Numbers: every OPT_INT, OPT_I64 and OPT_DOUBLE option has a range, and opts_parse() is
 * the one place where a number given on the command line is checked. The range is a
 * string "LO..HI": LO and HI are decimal numbers, inclusive; either may be left out (no
 * bound but the type's own: INT_MIN..INT_MAX for OPT_INT, int64 for OPT_I64, finite for
 * OPT_DOUBLE); a `<` beside the dots excludes that end ("0..<1": 0 <= x < 1, "0<..": x > 0).
 * Integers are read with strtoll (base 10, the whole argument, no overflow); doubles
 * with strtod, NaN, infinities and overflow refused. A value outside its range is a
 * usage error naming the option and the range (the tool exits 2); --help shows each
 * range beside the default. A numeric option without a range, or with one that does not
 * parse, is a programming error: opts_parse() refuses every command line of that tool
 * (exit 2, "internal error"), so that the first test to run it finds it.
 * Thread counts (-j/--threads) are 0 (all cores) .. OPTS_MAX_THREADS.
 *
 * `TOOL --list-options` (not shown in --help) prints one line per option of the tool's
 * table, tab-separated: the long name, the short name (or -), the kind (flag, int, i64,
 * double, str) and the range (empty for non-numbers); tests/cli/numbers.sh feeds every
 * numeric option of every tool from it.
 *
 * Accepted syntax: --name VALUE, --name=VALUE, -x VALUE, -xVALUE, `--` ends options,
 * a lone `-` is a positional (stdin/stdout). In a long name `_` reads as `-` (--global_batch
 * is --global-batch), as in ftk-train's YAML keys and LitGPT's option names. An unknown
 * long option is a usage error that names the nearest options ("did you mean
 * '--micro-batch'?": opts_suggest).
 */
#ifndef FTK_OPTS_H
#define FTK_OPTS_H

#include <stddef.h>
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
    const char *range;   /* numeric kinds: "LO..HI" (above); NULL for the others */
} opt_t;

/* Around a table: its rows leave `range` out where it has none (strings and flags). */
#define OPTS_TABLE_BEGIN                                                                                  \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmissing-field-initializers\"")
#define OPTS_TABLE_END _Pragma("GCC diagnostic pop")

/* The most threads a tool may be asked for: more only exhausts the stacks libgomp maps for
 * them (100000 threads crashed it) or the memory of per-thread buffers. */
#define OPTS_MAX_THREADS 1024
#define OPTS_THREADS_RANGE "0..1024"

/* The bounds of a range string as doubles (unbounded: -/+HUGE_VAL) and whether each end
 * is excluded. Returns 0, or -1 when the string is not a range. */
int opts_range_parse(const char *range, double *lo, int *lo_open, double *hi, int *hi_open);

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
 * pointing into argv). Returns 1 when --help, --version or --list-options was printed on
 * stdout (the tool exits 0). Returns -1 after printing a usage error on stderr (the tool exits 2). */
int opts_parse(const opt_spec_t *spec, int argc, char **argv, int *npos, char ***pos);

/* A byte size: "5GB" (10^9), "500MB", "2GiB" (2^30), "123" (bytes). 0 or -1. */
int opts_parse_size(const char *s, uint64_t *out);

/* The environment variable name as seconds: unset or empty leaves *out as it is (the
 * default) and returns 0; a number up to 1e7, above 0 (or 0 too with zero_ok: "off"), is
 * stored, 0; anything else is -1 with ftk_err_msg() naming the variable and its value. */
int opts_env_seconds(const char *name, int zero_ok, double *out);

/* a · b into *out when it fits in int64 (both >= 0): 0, else -1 (nothing stored). */
int opts_mul_i64(int64_t a, int64_t b, int64_t *out);

/* Starts the OpenMP thread team of n threads (0: all cores) now, at start-up, so that a
 * team that cannot be made fails (libgomp exits 1) before the tool has written anything. */
void opts_start_threads(int n);

/* Prints the generated help on stdout. */
void opts_help(const opt_spec_t *spec);

/* Whether the argument arg is the long option `name` ("--name" or "--name=VALUE", `_` read
 * as `-`): for a tool that looks at its command line beside opts_parse(). */
int opts_long_is(const char *arg, const char *name);

/* The option of table t whose long name is name[0..len) (without dashes, `_` read as `-`,
 * as on the command line and in config files), or NULL. */
const opt_t *opts_find_long(const opt_t *t, const char *name, size_t len);

/* "did you mean '--a'?" (or "'--a' or '--b'", up to 3) for an unknown long option name
 * name[0..len) (without dashes) against the options of the NULL-terminated list of tables:
 * the same words in another order (--lr-min: --min-lr), else those whose name starts with
 * it or it with theirs (at a `-`: --micro, --warmup-steps), else those fewest edits away
 * (case and `_` ignored; 1 edit in a name of up to 4 letters, 2 up to 8, 3 beyond); "" in
 * out when none is near, or more than 3 are equally near. */
void opts_suggest(const opt_t *const *tables, const char *name, size_t len, char *out, size_t n);

#endif
