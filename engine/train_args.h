/* train_args.h — where ftk-train's options come from besides its command line: the options
 * a run keeps (RUN/options.yaml, written at each start, read back by `ftk-train -o RUN
 * --resume auto`), a --config file (ftk's keys, or LitGPT's finetune/full.yaml keys), the
 * check that every rank of a job was given the same arguments, their parsing with one
 * rank's messages, and the values --recipe litgpt gives what the command line does not.
 *
 * The option table is the tool's (libcommon/opts.h); these functions read it and the
 * variables it points to. What a run keeps: every option but where and how this process
 * runs and what this invocation asks for (out, resume, config, extend, plan, ranks, preset,
 * max-len, stop-after, device, threads, report, device-memory). The file format is
 * libcommon/config.h's.
 */
#ifndef FTK_TRAIN_ARGS_H
#define FTK_TRAIN_ARGS_H

#include "../libcommon/opts.h"
#include "comm.h"

typedef struct {
    char kept[4096]; /* the run's options file the list was made with, or "" */
    char **notes;    /* --config's keys ignored ("FILE: line L, column C: KEY: ignored (why)"), to be said */
    int n_notes;
} train_args_t;

/* Makes the argument list the options are parsed from: the run's kept options (with
 * --resume and neither the inputs nor --config on the command line: `ftk-train -o RUN
 * --resume auto [--steps N --extend]`; a full command line is taken as it is, and its
 * differences from the checkpoint refused as ever), or --config's; then the command line,
 * overriding them. *argc and *argv are replaced by a list allocated for the process's life,
 * or left as they are where there is nothing to add. Every rank reads the same files, so
 * makes the same list (train_args_same checks). Returns 0, or an exit code with
 * ftk_err_msg() set: FTK_EXIT_USAGE (a file refused), FTK_EXIT_FAIL (out of memory).
 * *info is filled either way; train_args_free() releases its notes. */
int train_args_expand(const opt_t *options, int *argc, char ***argv, train_args_t *info);
void train_args_free(train_args_t *info);

/* Writes OUT/options.yaml: the options as they stand (rank 0, after the resume). The
 * inputs are written by absolute path (a resume may start in another directory), the
 * event directory relative to the run where it is inside it, else absolute: model_path,
 * data_path and tensorboard_dir are the variables the table points to, changed while the
 * file is written and restored. Returns 0, or -1 with ftk_err_msg() set. */
int train_args_keep(const opt_t *options, const char *out_dir, const char **model_path, const char **data_path,
                    const char **tensorboard_dir);

/* opts_parse() of the argument list; quiet: with this process's stdout and stderr sent to
 * /dev/null meanwhile (the ranks but 0: one --help, one set of messages). Returns
 * opts_parse's answer. */
int train_args_parse(const opt_spec_t *spec, int quiet, int argc, char **argv);

/* --recipe litgpt (docs/litgpt.md): sets its pieces, and LitGPT's values for the options the
 * command line does not give, in the variables the table points to; say: warn (ftk_warn)
 * that a given --min-lr is not used. Nothing for --recipe ftk. */
void train_args_recipe(const opt_t *options, int argc, char **argv, int say);

/* Whether every rank was given the same arguments (a hash of argv compared; collective). */
int train_args_same(comm_t *world, int argc, char **argv);

#endif
