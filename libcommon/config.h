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
 * refused keys, a value of the wrong shape and malformed YAML are errors naming the file,
 * line and column (from 1). Ignored keys are returned as notes for the tool to print.
 *
 * config_write() writes every option of the table with its current value (skipping the
 * names in skip, NULL-terminated, and unset strings) as such a file, so that a run keeps
 * the options it was started with.
 *
 * Ownership: the words and notes are malloc'd; config_args_free() releases them.
 * Returns 0, or -1 with ftk_err_msg() set.
 */
#ifndef FTK_CONFIG_H
#define FTK_CONFIG_H

#include "buf.h"
#include "opts.h"

typedef enum { CONFIG_OPTION, CONFIG_IGNORE, CONFIG_REFUSE } config_action_t;

typedef struct {
    const char *key;         /* dotted path: "optimizer.init_args.lr" */
    config_action_t action;
    const char *options;     /* CONFIG_OPTION: the option(s) it sets, space-separated (one per
                                sequence item), or "" for a key whose value must be one of
                                value_map's and sets nothing; or why it is ignored / refused */
    const char *value_map;   /* "from=to|from=to": values translated (LitGPT's "32-true" is
                                "fp32"); a value not listed is refused; NULL: as written */
} config_alias_t;

typedef struct {
    char **words;
    int n_words;
    char **notes; /* "FILE: line L, column C: KEY: ignored (why)" */
    int n_notes;
} config_args_t;

int config_load(const char *path, const opt_t *opts, const config_alias_t *aliases, config_args_t *out);
void config_args_free(config_args_t *a);
int config_write(buf_t *out, const opt_t *opts, const char *const *skip, const char *header);

#endif
