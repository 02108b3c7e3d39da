/* config.h — a tool's options from a YAML file (`--config FILE`), and back.
 *
 * The file is a YAML mapping whose keys are the tool's long option names (`lr`,
 * `global-batch`; `global_batch` is the same key) and whose values are scalars: numbers,
 * strings, and true/false for flags (false leaves a flag off). A key may also be a nested
 * path that an alias table maps to options (an option whose value may be left out takes
 * true for "given alone") (LitGPT's `train: {global_batch_size: 64}` is
 * `train.global_batch_size`), or tells why it is ignored or refused. A sequence value is
 * allowed only where an alias takes several options (LitGPT's `betas: [0.9, 0.95]`).
 *
 * config_load() turns the file into command-line words (`--lr`, `2e-4`, …) that the tool
 * puts *before* its own arguments, so the command line overrides the file. Unknown keys,
 * refused keys, a key given twice (`global_batch` beside `global-batch`, or two keys that
 * set one option), an empty key, mappings nested deeper than CONFIG_MAX_DEPTH, a value of
 * the wrong shape and malformed YAML are errors naming the file, line and column (from 1).
 * Ignored keys are returned as notes for the tool to print. The file must be a regular
 * file of at most 1 MiB (not a FIFO, a device, a directory).
 *
 * config_write() writes every option of the table with its current value (skipping the
 * names in skip, NULL-terminated, and unset strings) as such a file, so that a run keeps
 * the options it was started with; config_load() with the same skip list reads it back.
 *
 * Ownership: the words and notes are malloc'd; config_args_free() releases them.
 * Returns 0, or -1 with ftk_err_msg() set.
 */
#ifndef FTK_CONFIG_H
#define FTK_CONFIG_H

#include "buf.h"
#include "opts.h"

/* Deeper mappings are refused (LitGPT's deepest key, optimizer.init_args.betas, is 3):
 * the loader recurses once per level. */
#define CONFIG_MAX_DEPTH 16

typedef enum { CONFIG_OPTION, CONFIG_IGNORE, CONFIG_REFUSE } config_action_t;

typedef struct {
    const char *key;         /* dotted path: "optimizer.init_args.lr" */
    config_action_t action;
    const char *options;     /* CONFIG_OPTION: the option(s) it sets, space-separated (one per
                                sequence item), or "" for a key whose value must be one of
                                value_map's and sets nothing; or why it is ignored / refused */
    const char *value_map;   /* "from=to|from=to": values translated (LitGPT's "32-true" is
                                "fp32"); a value not listed is refused; NULL: as written */
    const char *null_value;  /* an empty value (YAML's null: `key:`, `~`, `null`), which means the
                                source's default: CONFIG_OPTION: that default as the file would
                                write it (through value_map; "": sets nothing); CONFIG_REFUSE:
                                non-NULL: a null asks for nothing and is accepted. NULL: a null is
                                refused (CONFIG_IGNORE: ignored as any value) */
    const char *absent;      /* CONFIG_OPTION: the value the option takes when a file of the
                                aliases' dialect (one with a key only the alias table knows)
                                leaves the key out and sets the option by no other key (said as a
                                note); NULL: the tool's default */
} config_alias_t;

/* A control file the tool wrote itself into a directory that may be someone else's
 * (RUN/options.yaml): a symbolic link is refused (O_NOFOLLOW), and no message quotes the
 * file's text (a link or hard link to a secret must not print it): keys are named by the
 * option they match, or not at all, and values never. */
#define CONFIG_CONTROL 1

typedef struct {
    const opt_t *opts;
    const config_alias_t *aliases; /* NULL: the options' own names only */
    const char *dialect;           /* whose keys the aliases are ("LitGPT"), for messages */
    const char *const *skip;       /* options the file may not set (NULL-terminated; NULL: none) */
    const char *skip_why;          /* said after such an option's name */
    const char *within;            /* with inside: a directory (a run's) */
    const char *const *inside;     /* options whose values are paths that may not leave `within`:
                                      a relative one is taken relative to it (the word is
                                      within/value); refused: a `..` component, an absolute path
                                      outside it, a path that reaches out of it through a
                                      symbolic link (NULL: none) */
    int flags;                     /* CONFIG_CONTROL */
} config_spec_t;

typedef struct {
    char **words;
    int n_words;
    char **notes; /* "FILE: line L, column C: KEY: ignored (why)" */
    int n_notes;
} config_args_t;

int config_load(const char *path, const config_spec_t *spec, config_args_t *out);
void config_args_free(config_args_t *a);
int config_write(buf_t *out, const opt_t *opts, const char *const *skip, const char *header);

#endif
