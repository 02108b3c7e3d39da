/* train_args.c — a run's kept options, --config and LitGPT's keys, the ranks' same
 * arguments, their parsing, --recipe litgpt (train_args.h). */
#include "train_args.h"

#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/config.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/path.h"

/* LitGPT's finetune/full.yaml, key by key (every config_hub/finetune/MODEL/full.yaml of litgpt
 * 0.5.11 to 0.5.13, the keys of its finetune_full setup() and the older TrainArgs'
 * learning_rate, weight_decay, beta1, beta2): what ftk sets from it, what does not change a
 * run (ignored, said), what ftk cannot honour (refused, saying how to get it). An empty
 * value (null) is LitGPT's default: the ftk value that default is, or refused where LitGPT
 * refuses it too (an int, a float, epochs: its finetune_full requires them). A LitGPT file
 * without max_norm does not clip (LitGPT's default, None), whatever ftk's default is. */
static const config_alias_t litgpt_keys[] = {
    /* null: LitGPT picks bf16-mixed on a device with bf16 (its get_default_supported_precision) */
    {"precision", CONFIG_OPTION, "precision", "bf16-true=bf16-true|bf16-mixed=bf16-mixed|32-true=fp32|32=fp32",
     "bf16-mixed", NULL},
    {"out_dir", CONFIG_OPTION, "out", NULL, NULL, NULL},
    {"seed", CONFIG_OPTION, "seed", NULL, NULL, NULL},
    {"resume", CONFIG_OPTION, "resume", "false=none|False=none|true=auto|True=auto|auto=auto", NULL, NULL},
    {"train.global_batch_size", CONFIG_OPTION, "global-batch", NULL, NULL, NULL},
    {"train.micro_batch_size", CONFIG_OPTION, "micro-batch", NULL, NULL, NULL},
    {"train.lr_warmup_steps", CONFIG_OPTION, "warmup", NULL, NULL, NULL},
    {"train.epochs", CONFIG_OPTION, "epochs", NULL, NULL, NULL},
    {"train.max_steps", CONFIG_OPTION, "steps", NULL, "0", NULL}, /* null: no limit but the epochs */
    {"train.min_lr", CONFIG_OPTION, "min-lr", NULL, NULL, NULL},
    /* null or left out: LitGPT does not clip (its finetune_full refuses a value; ftk clips to it) */
    {"train.max_norm", CONFIG_OPTION, "clip", NULL, "0", "0"},
    {"train.save_interval", CONFIG_OPTION, "save-every", NULL, "0", NULL}, /* null: only the final save */
    {"train.learning_rate", CONFIG_OPTION, "lr", NULL, NULL, NULL}, /* litgpt 0.3's TrainArgs */
    {"train.weight_decay", CONFIG_OPTION, "weight-decay", NULL, NULL, NULL},
    {"train.beta1", CONFIG_OPTION, "beta1", NULL, NULL, NULL},
    {"train.beta2", CONFIG_OPTION, "beta2", NULL, NULL, NULL},
    {"eval.interval", CONFIG_OPTION, "eval-every", NULL, NULL, NULL},
    {"optimizer.class_path", CONFIG_OPTION, "", "torch.optim.AdamW=AdamW", NULL, NULL},
    {"optimizer.init_args.lr", CONFIG_OPTION, "lr", NULL, NULL, NULL},
    {"optimizer.init_args.weight_decay", CONFIG_OPTION, "weight-decay", NULL, NULL, NULL},
    {"optimizer.init_args.betas", CONFIG_OPTION, "beta1 beta2", NULL, NULL, NULL},
    {"optimizer.init_args.eps", CONFIG_OPTION, "eps", NULL, NULL, NULL},
    {"optimizer", CONFIG_REFUSE, "a bare optimizer name: ftk runs AdamW; write optimizer.init_args", NULL, NULL, NULL},
    {"train.log_interval", CONFIG_IGNORE, "ftk writes every step to metrics.jsonl", NULL, NULL, NULL},
    {"train.max_seq_length", CONFIG_IGNORE, "the data's: ftk-pack --max-len made its rows", NULL, NULL, NULL},
    {"train.tie_embeddings", CONFIG_IGNORE, "the model's config.json decides", NULL, NULL, NULL},
    {"train.max_time", CONFIG_IGNORE,
     "LitGPT's finetune_full does not read it either; a time limit: SIGTERM or SIGUSR1 (a checkpoint, exit 75)", NULL,
     NULL, NULL},
    {"train.max_tokens", CONFIG_REFUSE, "ftk stops by --steps or --epochs", NULL, "", NULL},
    {"train.lr_warmup_fraction", CONFIG_REFUSE, "LitGPT's finetune_full does not take it either: give lr_warmup_steps",
     NULL, "", NULL},
    {"eval.max_iters", CONFIG_IGNORE, "ftk evaluates --eval-rows rows (the recipe's 100 micro-batches of 4 are its "
                                      "default 400)", NULL, NULL, NULL},
    {"eval.max_new_tokens", CONFIG_IGNORE, "ftk-train generates nothing; ftk-generate -n", NULL, NULL, NULL},
    {"eval.initial_validation", CONFIG_IGNORE, "ftk evaluates at step 0 when --eval-every > 0", NULL, NULL, NULL},
    {"eval.final_validation", CONFIG_IGNORE, "ftk evaluates at the end when --eval-every > 0", NULL, NULL, NULL},
    {"eval.evaluate_example", CONFIG_IGNORE, "ftk-train generates nothing; ftk-generate", NULL, NULL, NULL},
    {"checkpoint_dir", CONFIG_IGNORE, "a Hugging Face folder: import it with ftk-import-hf and give --model", NULL, NULL,
     NULL},
    {"data", CONFIG_IGNORE, "the data is --data's, as ftk-pack made it (template, mask, split, seed)", NULL, NULL,
     NULL},
    {"devices", CONFIG_IGNORE, "the launcher's: mpirun -np N or srun", NULL, NULL, NULL},
    {"num_nodes", CONFIG_IGNORE, "the launcher's: mpirun or srun", NULL, NULL, NULL},
    {"logger_name", CONFIG_IGNORE, "ftk writes metrics.jsonl (ftk-plot --csv) and --tensorboard DIR", NULL, NULL, NULL},
    {"log", CONFIG_IGNORE, "no WandB or LitLogger: ftk writes metrics.jsonl and --tensorboard DIR", NULL, NULL, NULL},
    {"quantize", CONFIG_REFUSE, "ftk trains full-precision weights (no bitsandbytes quantization)", NULL, "", NULL},
    {"access_token", CONFIG_IGNORE, "ftk downloads nothing", NULL, NULL, NULL},
    {0},
};

/* What a run keeps of its options (RUN/options.yaml): all but where and how this process
 * runs, and the requests of this invocation. */
static const char *const not_kept[] = {"out",  "resume", "config", "extend", "plan",    "ranks",  "preset",
                                       "max-len", "stop-after", "device", "threads", "report", "device-memory",
                                       "memory-dir", "memory-snapshot-every", NULL};

/* The words train_args_expand() made: allocated for the process's life (the options point
 * into them), reachable from here (volatile: stores the compiler would drop, as nothing
 * reads them, and LeakSanitizer would then report). */
static char **volatile kept_words[2];
static char **volatile kept_argv;

int train_args_expand(const opt_t *options, int *argc, char ***argv, train_args_t *info)
{
    memset(info, 0, sizeof *info);
    const char *cfg = NULL, *out = NULL;
    int resume = 0, inputs = 0, cli_tb = 0;
    for (int i = 1; i < *argc; i++) {
        const char *a = (*argv)[i], *next = i + 1 < *argc ? (*argv)[i + 1] : NULL;
        if (!strcmp(a, "--"))
            break;
        inputs |= !strncmp(a, "-m", 2) || !strncmp(a, "-d", 2) || !strncmp(a, "--model", 7) || !strncmp(a, "--data", 6);
        cli_tb |= !strncmp(a, "--tensorboard", 13);
        if (!strcmp(a, "--config") && next)
            cfg = next;
        else if (!strncmp(a, "--config=", 9))
            cfg = a + 9;
        else if ((!strcmp(a, "-o") || !strcmp(a, "--out")) && next)
            out = next;
        else if (!strncmp(a, "--out=", 6))
            out = a + 6;
        else if (!strncmp(a, "-o", 2) && a[2])
            out = a + 2;
        else if (!strcmp(a, "--resume") && next)
            resume = strcmp(next, "none") != 0;
        else if (!strncmp(a, "--resume=", 9))
            resume = strcmp(a + 9, "none") != 0;
    }
    char *kept = info->kept;
    if (resume && out && !inputs && !cfg)
        snprintf(kept, sizeof info->kept, "%.*s/options.yaml", path_dir_len(out), out);
    struct stat sb;
    if (kept[0] && lstat(kept, &sb) != 0) /* a link is there, and refused */
        kept[0] = 0;
    if (!kept[0] && !cfg)
        return 0;
    /* The run's file is ftk's own, in a directory that may be someone else's: it sets only
     * what a run keeps (what train_args_keep() writes), names no output outside the run
     * unless the command line does, is not read through a link and is never quoted. */
    static const char *const tb_inside[] = {"tensorboard", NULL}, *const not_config[] = {"config", NULL};
    const config_spec_t kspec = {.opts = options,
                                 .skip = not_kept,
                                 .skip_why = "not an option a run keeps (give it on the command line)",
                                 .within = out,
                                 .inside = cli_tb ? NULL : tb_inside,
                                 .flags = CONFIG_CONTROL},
                        cspec = {.opts = options,
                                 .aliases = litgpt_keys,
                                 .dialect = "LitGPT",
                                 .skip = not_config,
                                 .skip_why = "a configuration file cannot name another"};
    config_args_t ka = {0}, ca = {0};
    if ((kept[0] && config_load(kept, &kspec, &ka) < 0) || (cfg && config_load(cfg, &cspec, &ca) < 0)) {
        config_args_free(&ka);
        kept[0] = 0;
        return FTK_EXIT_USAGE;
    }
    info->notes = ca.notes;
    info->n_notes = ca.n_notes;
    int n = *argc + ka.n_words + ca.n_words, k = 0;
    char **v = calloc((size_t)n + 1, sizeof *v);
    if (!v) {
        ftk_err_set("out of memory");
        kept[0] = 0;
        return FTK_EXIT_FAIL;
    }
    v[k++] = (*argv)[0];
    for (int i = 0; i < ka.n_words; i++)
        v[k++] = ka.words[i];
    for (int i = 0; i < ca.n_words; i++)
        v[k++] = ca.words[i];
    for (int i = 1; i < *argc; i++)
        v[k++] = (*argv)[i];
    v[k] = NULL;
    kept_words[0] = ka.words;
    kept_words[1] = ca.words;
    free(ka.notes);
    kept_argv = v;
    *argc = k;
    *argv = v;
    return 0;
}

int train_args_keep(const opt_t *options, const char *out_dir, const char **model_path, const char **data_path,
                    const char **tensorboard_dir)
{
    buf_t b = {0};
    char path[4096], cwd[4096], m_abs[8192], d_abs[8192], t_rel[8192], run_r[PATH_MAX], tb_r[PATH_MAX];
    snprintf(path, sizeof path, "%.*s/options.yaml", path_dir_len(out_dir), out_dir);
    /* the inputs by absolute path: a resume may start in another directory; --tensorboard
     * relative to the run where it is inside it (a resume reads it so, and refuses what
     * leaves the run unless its command line names it), else absolute */
    const char *m0 = *model_path, *d0 = *data_path, *t0 = *tensorboard_dir;
    if (getcwd(cwd, sizeof cwd)) {
        if (*model_path && (*model_path)[0] != '/')
            snprintf(m_abs, sizeof m_abs, "%s/%s", cwd, *model_path), *model_path = m_abs;
        if (*data_path && (*data_path)[0] != '/')
            snprintf(d_abs, sizeof d_abs, "%s/%s", cwd, *data_path), *data_path = d_abs;
    }
    if (*tensorboard_dir && realpath(out_dir, run_r) && realpath(*tensorboard_dir, tb_r)) {
        int n = path_under(tb_r, run_r);
        if (n >= 0)
            snprintf(t_rel, sizeof t_rel, "%s", tb_r[n] && tb_r[n + 1] ? tb_r + n + 1 : "."), *tensorboard_dir = t_rel;
        else
            *tensorboard_dir = tb_r;
    }
    int rc = config_write(&b, options, not_kept,
                          "# ftk-train's options for this run (ftk-train --resume auto -o RUN reads them; the command\n"
                          "# line overrides them). Written at each start.\n");
    *model_path = m0;
    *data_path = d0;
    *tensorboard_dir = t0;
    if (rc == 0)
        rc = atomic_write_file(path, b.data, b.len);
    buf_free(&b);
    return rc;
}


void train_args_free(train_args_t *info)
{
    for (int i = 0; i < info->n_notes; i++)
        free(info->notes[i]);
    free(info->notes);
    info->notes = NULL;
    info->n_notes = 0;
}

int train_args_same(comm_t *world, int argc, char **argv)
{
    buf_t b = {0};
    for (int i = 1; i < argc; i++)
        if (buf_append(&b, argv[i], strlen(argv[i]) + 1) < 0)
            abort(); /* a few hundred bytes */
    int64_t h = (int64_t)(hash_bytes(b.data ? b.data : "", b.len) >> 1), v[2] = {h, -h};
    buf_free(&b);
    comm_allreduce_i64(world, v, 2, COMM_MAX);
    return v[0] == -v[1];
}

int train_args_parse(const opt_spec_t *spec, int quiet, int argc, char **argv)
{
    int saved_out = -1, saved_err = -1;
    if (quiet) {
        fflush(stdout);
        fflush(stderr);
        int nul = open("/dev/null", O_WRONLY);
        saved_out = dup(1);
        saved_err = dup(2);
        if (nul >= 0) {
            dup2(nul, 1);
            dup2(nul, 2);
            close(nul);
        }
    }
    int npos;
    char **pos;
    int rc = opts_parse(spec, argc, argv, &npos, &pos);
    if (quiet) {
        fflush(stdout);
        fflush(stderr);
        if (saved_out >= 0)
            dup2(saved_out, 1), close(saved_out);
        if (saved_err >= 0)
            dup2(saved_err, 2), close(saved_err);
    }
    return rc;
}

/* Whether option --name was on the command line (before a `--`; --min_lr too). */
static int given(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (opts_long_is(argv[i], name))
            return 1;
    return 0;
}

/* The variable the table's option `name` sets (every name asked for is in ftk-train's table). */
static void *var(const opt_t *options, const char *name)
{
    return opts_find_long(options, name, strlen(name))->dest;
}

void train_args_recipe(const opt_t *options, int argc, char **argv, int say)
{
    if (strcmp(*(const char **)var(options, "recipe"), "litgpt"))
        return;
    if (!given(argc, argv, "warmup-style"))
        *(const char **)var(options, "warmup-style") = "litgpt";
    if (!given(argc, argv, "loss-mean"))
        *(const char **)var(options, "loss-mean") = "micro";
    *(int *)var(options, "decay-norms") = 1;
    double *min_lr = var(options, "min-lr");
    if (given(argc, argv, "min-lr") && *min_lr != 0 && say)
        ftk_warn("--recipe litgpt: the cosine decays to 0 as LitGPT's finetune does (it never reads its min_lr); "
                 "--min-lr %g is not used",
                 *min_lr);
    *min_lr = 0;
    if (!given(argc, argv, "clip"))
        *(double *)var(options, "clip") = 0;
    if (!given(argc, argv, "precision"))
        *(const char **)var(options, "precision") = "bf16-true";
    if (!given(argc, argv, "rounding"))
        *(const char **)var(options, "rounding") = "nearest";
    if (!given(argc, argv, "eval-every"))
        *(int64_t *)var(options, "eval-every") = 100;
    int64_t micro_batch = *(int64_t *)var(options, "micro-batch");
    if (!given(argc, argv, "eval-rows")) /* eval.max_iters: 100 micro-batches (0: the whole split) */
        *(int64_t *)var(options, "eval-rows") = micro_batch > 0 && micro_batch <= INT64_MAX / 100 ? 100 * micro_batch : 0;
    if (!given(argc, argv, "save-every") && !*(int *)var(options, "no-save"))
        *(int64_t *)var(options, "save-every") = 200;
}
