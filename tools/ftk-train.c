/* ftk-train — full-parameter finetuning: the loop around engine/ (model, data order,
 * schedule, AdamW) and formats/checkpoint (save, resume). One process, CPU backend;
 * the distributed strategies build on this same loop. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../engine/model.h"
#include "../engine/train.h"
#include "../formats/checkpoint.h"
#include "../formats/h5.h"
#include "../formats/tokens.h"
#include "../formats/weights.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/timer.h"

static const char *model_path, *data_path, *out_dir, *resume = "none", *schedule = "cosine", *device = "cpu";
static int64_t steps, epochs = 1, global_batch = 64, micro_batch = 4, warmup = 25, seed = 1337;
static int64_t save_every, keep, eval_every = 25, eval_rows = 400, stop_after;
static double lr = 2e-4, min_lr = 6e-5, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0;
static int decay_norms, recompute, threads;

static const opt_t options[] = {
    {"model", 'm', OPT_STR, &model_path, "FILE.h5", "initial weights (ftk-import-hf, ftk-init) (required)"},
    {"data", 'd', OPT_STR, &data_path, "FILE.h5", "token data from ftk-pack (required)"},
    {"out", 'o', OPT_STR, &out_dir, "DIR", "run directory: checkpoints, latest, metrics.jsonl (required)"},
    {"steps", 0, OPT_I64, &steps, "N", "optimizer steps (0: --epochs worth)"},
    {"epochs", 0, OPT_I64, &epochs, "E", "passes over the training rows when --steps is 0"},
    {"global-batch", 0, OPT_I64, &global_batch, "G", "rows per optimizer step"},
    {"micro-batch", 0, OPT_I64, &micro_batch, "B", "rows per forward/backward pass (gradients accumulate)"},
    {"lr", 0, OPT_DOUBLE, &lr, "LR", "peak learning rate"},
    {"min-lr", 0, OPT_DOUBLE, &min_lr, "LR", "learning rate at the end of the decay"},
    {"warmup", 0, OPT_I64, &warmup, "N", "linear warmup steps"},
    {"schedule", 0, OPT_STR, &schedule, "cosine|linear|constant", "decay after the warmup"},
    {"beta1", 0, OPT_DOUBLE, &beta1, "B1", "AdamW beta1"},
    {"beta2", 0, OPT_DOUBLE, &beta2, "B2", "AdamW beta2"},
    {"eps", 0, OPT_DOUBLE, &eps, "EPS", "AdamW epsilon"},
    {"weight-decay", 0, OPT_DOUBLE, &weight_decay, "WD", "decoupled weight decay"},
    {"decay-norms", 0, OPT_FLAG, &decay_norms, NULL, "also decay the RMSNorm gains (not by default)"},
    {"clip", 0, OPT_DOUBLE, &clip, "NORM", "clip gradients to this global L2 norm (0: off)"},
    {"seed", 0, OPT_I64, &seed, "S", "seed of the data order"},
    {"save-every", 0, OPT_I64, &save_every, "K", "checkpoint every K steps (0: only at the end)"},
    {"keep", 0, OPT_I64, &keep, "N", "keep the newest N checkpoints (0: all)"},
    {"eval-every", 0, OPT_I64, &eval_every, "K", "validation loss every K steps and at the end (0: never)"},
    {"eval-rows", 0, OPT_I64, &eval_rows, "N", "validation rows per evaluation (0: the whole split)"},
    {"recompute", 0, OPT_FLAG, &recompute, NULL, "recompute each block's activations in the backward pass"},
    {"resume", 0, OPT_STR, &resume, "none|auto|DIR", "auto: continue from OUT/latest when there is one"},
    {"stop-after", 0, OPT_I64, &stop_after, "N", "stop after N steps of this run: checkpoint, exit 75"},
    {"device", 0, OPT_STR, &device, "cpu", "compute backend"},
    {"threads", 'j', OPT_INT, &threads, "N", "threads (0: all cores)"},
    {0},
};

static const opt_spec_t spec = {
    .tool = "ftk-train",
    .usage = "--model W.h5 --data D.h5 --out RUN/ [options]",
    .summary =
        "Full-parameter finetuning of a Llama model: AdamW, gradient clipping, warmup + cosine schedule,\n"
        "gradient accumulation to a global batch. Defaults follow LitGPT's Llama-2-7B full finetune\n"
        "(lr 2e-4, betas 0.9/0.95, weight decay 0.1, warmup 25, min lr 6e-5, global batch 64, micro\n"
        "batch 4, one epoch). The loss of a step is the mean over the targets of its global batch.",
    .epilog =
        "Outputs in RUN/: step-NNNNNNNN/ checkpoints (formats/checkpoint.h), `latest`, and metrics.jsonl:\n"
        "one JSON object per step {step, loss, lr, grad_norm, tokens, tokens_seen, tokens_per_s,\n"
        "elapsed_s, epoch} and per evaluation {step, val_loss, val_tokens}. A readable line per step\n"
        "goes to stderr.\n"
        "Resuming (--resume auto|DIR) continues bit for bit: the same options must be given again\n"
        "(a difference is refused, naming the option).\n"
        "Signals: SIGTERM or SIGUSR1 finish the current step, write a checkpoint and exit 75.\n"
        "Exit status: 0 done, 1 runtime failure, 2 bad usage or input, 75 stopped with a checkpoint\n"
        "written (preempted or --stop-after): run the same command with --resume auto.\n",
    .opts = options,
    .min_pos = 0,
    .max_pos = 0,
};

static volatile sig_atomic_t stop_signal;
static void on_stop(int sig) { stop_signal = sig; }

typedef struct {
    hid_t file;
    tokens_split_t train, val;
    int64_t max_len, vocab;
    char set_xxh3[32];
} data_t;

static int open_data(const char *path, data_t *d)
{
    memset(d, 0, sizeof *d);
    d->file = h5_open(path, TOKENS_FORMAT, TOKENS_VERSION, NULL, NULL);
    if (d->file < 0)
        return -1;
    int64_t shards;
    char *set = NULL;
    if (h5_attr_get_i64(d->file, "max_len", &d->max_len) < 0 || h5_attr_get_i64(d->file, "vocab_size", &d->vocab) < 0 ||
        h5_attr_get_i64(d->file, "shard_count", &shards) < 0 || h5_attr_get_str(d->file, "set_xxh3", &set) < 0)
        return -1;
    snprintf(d->set_xxh3, sizeof d->set_xxh3, "%s", set);
    free(set);
    if (shards != 1) {
        ftk_err_set("%s is shard of a set of %lld; train on an unsharded file (ftk-pack without --shards)", path,
                    (long long)shards);
        return -1;
    }
    if (tokens_read_split(d->file, "train", &d->train) < 0 || tokens_read_split(d->file, "val", &d->val) < 0)
        return -1;
    return 0;
}

/* Validation loss over the first eval_rows rows of the val split. */
static int evaluate(model_t *m, const data_t *d, batch_t *b, double *loss, int64_t *n_tgt)
{
    int64_t rows = eval_rows > 0 && eval_rows < d->val.n_rows ? eval_rows : d->val.n_rows;
    double sum = 0;
    int64_t n = 0;
    int64_t *idx = malloc((size_t)micro_batch * sizeof *idx);
    if (!idx) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += micro_batch) {
        int64_t k = rows - r0 < micro_batch ? rows - r0 : micro_batch;
        for (int64_t i = 0; i < k; i++)
            idx[i] = r0 + i;
        batch_clear(b);
        if (batch_add_rows(b, &d->val, idx, k) < 0) {
            free(idx);
            return -1;
        }
        sum += model_step(m, b, 0.0f, NULL);
        n += b->n_tgt;
    }
    free(idx);
    *loss = n ? sum / (double)n : NAN;
    *n_tgt = n;
    return 0;
}

/* Keeps the metrics lines of steps <= step (a resumed run rewrites what came after). */
static int trim_metrics(const char *path, int64_t step)
{
    buf_t in = {0}, out = {0};
    if (buf_read_file(&in, path) < 0) {
        buf_free(&in);
        return 0; /* none yet */
    }
    size_t i = 0;
    while (i < in.len) {
        char *nl = memchr(in.data + i, '\n', in.len - i);
        size_t e = nl ? (size_t)(nl - in.data) + 1 : in.len;
        const char *s = strstr(in.data + i, "\"step\": ");
        long long st = s && s < in.data + e ? atoll(s + 8) : 0;
        if (nl && st <= step)
            buf_append(&out, in.data + i, e - i);
        i = e;
    }
    atomic_file_t a;
    int rc = atomic_begin(&a, path);
    if (rc == 0) {
        FILE *f = fopen(a.tmp_path, "wb");
        if (!f || fwrite(out.data ? out.data : "", 1, out.len, f) != out.len || fclose(f) != 0) {
            ftk_err_set("%s: %s", a.tmp_path, strerror(errno));
            atomic_abort(&a);
            rc = -1;
        } else {
            rc = atomic_commit(&a);
        }
    }
    buf_free(&in);
    buf_free(&out);
    return rc;
}

static int same_config(const model_config_t *a, const model_config_t *b)
{
    return a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
           a->num_hidden_layers == b->num_hidden_layers && a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->vocab_size == b->vocab_size &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->rms_norm_eps == b->rms_norm_eps &&
           a->rope_theta == b->rope_theta;
}

/* The options that define the run must be the checkpoint's. */
static int check_resume_options(const ckpt_train_t *c, const ckpt_train_t *t)
{
#define SAME(field, opt)                                                                                             \
    if (c->field != t->field) {                                                                                      \
        ftk_error("--%s differs from the checkpoint's (%g there, %g here); resume with the same options", opt,       \
                  (double)c->field, (double)t->field);                                                               \
        return -1;                                                                                                   \
    }
    SAME(lr, "lr")
    SAME(min_lr, "min-lr")
    SAME(warmup, "warmup")
    SAME(total_steps, "steps/--epochs (total steps)")
    SAME(global_batch, "global-batch")
    SAME(micro_batch, "micro-batch")
    SAME(beta1, "beta1")
    SAME(beta2, "beta2")
    SAME(eps, "eps")
    SAME(weight_decay, "weight-decay")
    SAME(decay_norms, "decay-norms")
    SAME(clip, "clip")
    SAME(seed, "seed")
#undef SAME
    if (strcmp(c->schedule, t->schedule)) {
        ftk_error("--schedule differs from the checkpoint's (%s there, %s here)", c->schedule, t->schedule);
        return -1;
    }
    return 0;
}

static int save(const char *dir, const ckpt_meta_t *meta, const model_config_t *cfg, model_t *m, optim_t *o,
                hid_t tok_src)
{
    int n;
    const ckpt_unit_t *u = model_units(m, &n);
    const backend_t *be = model_backend(m);
    ckpt_state_t st = {0};
    int rc = 0;
    st.param = calloc((size_t)n, sizeof(float *));
    st.m = calloc((size_t)n, sizeof(float *));
    st.v = calloc((size_t)n, sizeof(float *));
    if (!st.param || !st.m || !st.v)
        rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        size_t bytes = (size_t)u[i].padded * sizeof(float);
        if (!(st.param[i] = malloc(bytes)) || !(st.m[i] = malloc(bytes)) || !(st.v[i] = malloc(bytes))) {
            rc = -1;
            break;
        }
        be->download(st.param[i], model_unit_param(m, i), bytes);
        be->download(st.m[i], o->m[i], bytes);
        be->download(st.v[i], o->v[i], bytes);
    }
    if (rc < 0)
        ftk_err_set("out of memory");
    else
        rc = ckpt_save(dir, meta, cfg, u, n, &st, tok_src, (int)keep);
    ckpt_state_free(&st, n);
    return rc;
}

/* Every exit after the inputs are opened goes through main's `out:`, which frees them. */
#define FAIL(code)                                                                                                   \
    do {                                                                                                             \
        exit_code = (code);                                                                                          \
        goto out;                                                                                                    \
    } while (0)

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-train");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    if (!model_path || !data_path || !out_dir) {
        ftk_error("--model, --data and --out are required (see --help)");
        return FTK_EXIT_USAGE;
    }
    if (strcmp(device, "cpu")) {
        ftk_error("--device %s: this build trains on the CPU only (--device cpu)", device);
        return FTK_EXIT_USAGE;
    }
    if (steps < 0 || epochs < 1 || global_batch < 1 || micro_batch < 1 ||
        warmup < 0 || !(lr > 0) || !(min_lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) ||
        !(eps > 0) || !(weight_decay >= 0) || !(clip >= 0) || save_every < 0 || keep < 0 || eval_every < 0 ||
        eval_rows < 0 || stop_after < 0 || threads < 0) {
        ftk_error("invalid option value: need --global-batch, --micro-batch >= 1, --lr > 0, betas in "
                  "[0, 1), --eps > 0, and the counts >= 0 (see --help)");
        return FTK_EXIT_USAGE;
    }
    if (strcmp(schedule, "cosine") && strcmp(schedule, "linear") && strcmp(schedule, "constant")) {
        ftk_error("--schedule %s: need cosine, linear or constant", schedule);
        return FTK_EXIT_USAGE;
    }
    if (threads > 0)
        omp_set_num_threads(threads);
    if (h5_init() < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    atomic_install_signal_cleanup();
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    int exit_code = FTK_EXIT_OK;
    hid_t wf = -1;
    data_t data = {.file = -1};
    model_t *m = NULL;
    optim_t opt = {0};
    char *ck = NULL;
    FILE *mf = NULL;
    int64_t *perm = NULL, *rows = NULL;
    batch_t b = {0};

    /* Inputs. */
    model_config_t cfg;
    wf = weights_open(model_path, &cfg);
    if (wf < 0) {
        ftk_error("%s", ftk_err_msg());
        FAIL(FTK_EXIT_USAGE);
    }
    if (open_data(data_path, &data) < 0) {
        ftk_error("%s: %s", data_path, ftk_err_msg());
        FAIL(FTK_EXIT_USAGE);
    }
    if (data.vocab > cfg.vocab_size) {
        ftk_error("%s: token ids up to %lld, but the model's vocabulary has %lld entries", data_path,
                  (long long)data.vocab, (long long)cfg.vocab_size);
        FAIL(FTK_EXIT_USAGE);
    }
    if (data.train.n_rows == 0) {
        ftk_error("%s: no training rows", data_path);
        FAIL(FTK_EXIT_USAGE);
    }
    int64_t R = data.train.n_rows;
    int64_t per_epoch = (R + global_batch - 1) / global_batch;
    ckpt_train_t tc = {.lr = lr, .min_lr = min_lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                       .weight_decay = weight_decay, .clip = clip, .warmup = warmup,
                       .total_steps = steps ? steps : epochs * per_epoch, .global_batch = global_batch,
                       .micro_batch = micro_batch, .seed = seed, .decay_norms = decay_norms};
    snprintf(tc.schedule, sizeof tc.schedule, "%s", schedule);

    ckpt_meta_t meta = {0};
    snprintf(meta.data_file, sizeof meta.data_file, "%s", data_path);
    snprintf(meta.data_set_xxh3, sizeof meta.data_set_xxh3, "%s", data.set_xxh3);
    snprintf(meta.strategy, sizeof meta.strategy, "none");
    meta.data_rows = R;
    snprintf(meta.init_file, sizeof meta.init_file, "%s", model_path);
    if (ckpt_init_hash(wf, &cfg, meta.init_xxh3) < 0) {
        ftk_error("%s: %s", model_path, ftk_err_msg());
        FAIL(FTK_EXIT_USAGE);
    }
    meta.world_size = meta.shard_count = 1;
    meta.train = tc;

    if (mkdir(out_dir, 0777) < 0 && errno != EEXIST) {
        ftk_error("%s: %s", out_dir, strerror(errno));
        FAIL(FTK_EXIT_FAIL);
    }
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", out_dir);
    struct stat sb;
    int have_latest = stat(latest, &sb) == 0;
    if (!strcmp(resume, "none")) {
        if (have_latest) {
            ftk_error("%s already holds a run (%s exists): pass --resume auto to continue it, or choose another "
                      "--out", out_dir, latest);
            FAIL(FTK_EXIT_USAGE);
        }
    } else if (strcmp(resume, "auto") || have_latest) {
        if (!(ck = ckpt_resolve(strcmp(resume, "auto") ? resume : out_dir))) {
            ftk_error("--resume: %s", ftk_err_msg());
            FAIL(FTK_EXIT_USAGE);
        }
    }

    const backend_t *be = backend_cpu();
    m = model_new(be, &cfg, 1, micro_batch * data.max_len, recompute);
    if (!m || optim_init(&opt, m) < 0) {
        ftk_error("%s", ftk_err_msg());
        FAIL(FTK_EXIT_FAIL);
    }
    int n_units;
    const ckpt_unit_t *units = model_units(m, &n_units);
    if (ck) {
        ckpt_meta_t cm;
        model_config_t ccfg;
        ckpt_state_t st;
        if (ckpt_load(ck, &cm, &ccfg, &st) < 0) {
            ftk_error("cannot resume: %s", ftk_err_msg());
            FAIL(FTK_EXIT_USAGE);
        }
        if (!same_config(&ccfg, &cfg) || strcmp(cm.init_xxh3, meta.init_xxh3)) {
            ftk_error("cannot resume: %s is a checkpoint of a run started from other weights (%s) than %s", ck,
                      cm.init_file, model_path);
            ckpt_state_free(&st, n_units);
            FAIL(FTK_EXIT_USAGE);
        }
        if (strcmp(cm.data_set_xxh3, data.set_xxh3) || cm.data_rows != R) {
            ftk_error("cannot resume: %s was trained on other data (set %s, %lld rows) than %s (set %s, %lld rows)", ck,
                      cm.data_set_xxh3, (long long)cm.data_rows, data_path, data.set_xxh3, (long long)R);
            ckpt_state_free(&st, n_units);
            FAIL(FTK_EXIT_USAGE);
        }
        if (check_resume_options(&cm.train, &tc) < 0) {
            ckpt_state_free(&st, n_units);
            exit_code = FTK_EXIT_USAGE;
            goto out;
        }
        for (int u = 0; u < n_units; u++) {
            size_t bytes = (size_t)units[u].padded * sizeof(float);
            be->upload(model_unit_param(m, u), st.param[u], bytes);
            be->upload(opt.m[u], st.m[u], bytes);
            be->upload(opt.v[u], st.v[u], bytes);
        }
        ckpt_state_free(&st, n_units);
        meta.step = cm.step;
        meta.tokens_seen = cm.tokens_seen;
        meta.epoch = cm.epoch;
        meta.rows_consumed = cm.rows_consumed;
        ftk_info("resuming from %s (step %lld of %lld)", ck, (long long)cm.step, (long long)tc.total_steps);
    } else if (model_load_weights(m, wf) < 0) {
        ftk_error("%s: %s", model_path, ftk_err_msg());
        FAIL(FTK_EXIT_USAGE);
    }
    free(ck);
    ck = NULL;

    char metrics_path[4096];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", out_dir);
    if (trim_metrics(metrics_path, meta.step) < 0) {
        ftk_error("%s", ftk_err_msg());
        FAIL(FTK_EXIT_FAIL);
    }
    mf = fopen(metrics_path, "a");
    if (!mf) {
        ftk_error("%s: %s", metrics_path, strerror(errno));
        FAIL(FTK_EXIT_FAIL);
    }
    if (meta.step == 0)
        ftk_info("%lld parameters, %lld training rows (%lld steps of %lld rows per epoch), %lld steps",
                 (long long)model_n_params(&cfg), (long long)R, (long long)per_epoch, (long long)global_batch,
                 (long long)tc.total_steps);

    perm = malloc((size_t)R * sizeof *perm);
    rows = malloc((size_t)global_batch * sizeof *rows);
    if (!perm || !rows) {
        ftk_error("out of memory");
        FAIL(FTK_EXIT_FAIL);
    }
    train_order((uint64_t)seed, meta.epoch, R, perm);
    if (meta.step >= tc.total_steps)
        ftk_info("%s: the run is complete (step %lld of %lld); nothing to do", out_dir, (long long)meta.step,
                 (long long)tc.total_steps);
    if (meta.step == 0 && eval_every > 0 && data.val.n_rows > 0) { /* where the run starts from */
        double vl;
        int64_t vt;
        if (evaluate(m, &data, &b, &vl, &vt) < 0) {
            ftk_error("%s", ftk_err_msg());
            FAIL(FTK_EXIT_FAIL);
        }
        fprintf(mf, "{\"step\": 0, \"val_loss\": %.17g, \"val_tokens\": %lld}\n", vl, (long long)vt);
        ftk_info("step 0: validation loss %.4f (%lld targets)", vl, (long long)vt);
    }
    double t0 = time_now();
    int64_t run_steps = 0;
    while (meta.step < tc.total_steps) {
        double ts = time_now();
        /* The next global batch of the data order. */
        if (meta.rows_consumed >= R) {
            meta.epoch++;
            meta.rows_consumed = 0;
            train_order((uint64_t)seed, meta.epoch, R, perm);
        }
        int64_t k = R - meta.rows_consumed < global_batch ? R - meta.rows_consumed : global_batch;
        memcpy(rows, perm + meta.rows_consumed, (size_t)k * sizeof *rows);
        int64_t n_tgt = 0, tokens = 0;
        for (int64_t i = 0; i < k; i++)
            n_tgt += train_row_targets(&data.train, rows[i]);
        float scale = 1.0f / (float)(n_tgt > 0 ? n_tgt : 1);
        model_zero_grad(m);
        double loss_sum = 0;
        for (int64_t r0 = 0; r0 < k; r0 += micro_batch) {
            batch_clear(&b);
            if (batch_add_rows(&b, &data.train, rows + r0, k - r0 < micro_batch ? k - r0 : micro_batch) < 0) {
                ftk_error("%s", ftk_err_msg());
                FAIL(FTK_EXIT_FAIL);
            }
            loss_sum += model_step(m, &b, scale, NULL);
        }
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = data.train.row_samples[rows[i]]; j < data.train.row_samples[rows[i] + 1]; j++)
                tokens += data.train.sample_lengths[j];
        double loss = loss_sum / (double)(n_tgt > 0 ? n_tgt : 1);
        int64_t step = meta.step + 1;
        double cur_lr = train_lr(&tc, step);
        double gnorm = optim_step(&opt, m, &tc, step, cur_lr);
        meta.step = step;
        meta.rows_consumed += k;
        meta.tokens_seen += tokens;
        run_steps++;
        double now = time_now();
        fprintf(mf,
                "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, \"tokens\": %lld, "
                "\"tokens_seen\": %lld, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"epoch\": %lld}\n",
                (long long)step, loss, cur_lr, gnorm, (long long)tokens, (long long)meta.tokens_seen,
                tokens / (now - ts), now - t0, (long long)meta.epoch);
        fflush(mf);
        if (!ftk_quiet)
            fprintf(stderr, "ftk-train: step %lld/%lld  loss %.4f  lr %.3g  grad norm %.3g  %.0f tok/s  %.1f s\n",
                    (long long)step, (long long)tc.total_steps, loss, cur_lr, gnorm, tokens / (now - ts), now - t0);
        if (!isfinite(loss)) {
            ftk_error("step %lld: the loss is %g; stopping without a checkpoint", (long long)step, loss);
            FAIL(FTK_EXIT_FAIL);
        }
        int last = meta.step == tc.total_steps;
        if (eval_every > 0 && data.val.n_rows > 0 && (step % eval_every == 0 || last)) {
            double vl;
            int64_t vt;
            if (evaluate(m, &data, &b, &vl, &vt) < 0) {
                ftk_error("%s", ftk_err_msg());
                FAIL(FTK_EXIT_FAIL);
            }
            fprintf(mf, "{\"step\": %lld, \"val_loss\": %.17g, \"val_tokens\": %lld}\n", (long long)step, vl,
                    (long long)vt);
            fflush(mf);
            ftk_info("step %lld: validation loss %.4f (%lld targets)", (long long)step, vl, (long long)vt);
        }
        int stopping = stop_signal || (stop_after > 0 && run_steps >= stop_after && !last);
        if (last || stopping || (save_every > 0 && step % save_every == 0)) {
            if (save(out_dir, &meta, &cfg, m, &opt, wf) < 0) {
                ftk_error("checkpoint at step %lld: %s", (long long)step, ftk_err_msg());
                FAIL(FTK_EXIT_FAIL);
            }
            ftk_info("checkpoint %s/step-%08lld written", out_dir, (long long)step);
        }
        if (stopping && !last) {
            ftk_info("%s at step %lld; continue with --resume auto", stop_signal ? "stopped by a signal" : "stopped",
                     (long long)step);
            exit_code = FTK_EXIT_PREEMPTED;
            break;
        }
    }
out:
    if (mf)
        fclose(mf);
    free(ck);
    batch_free(&b);
    free(perm);
    free(rows);
    optim_free(&opt);
    model_free(m);
    tokens_split_free(&data.train);
    tokens_split_free(&data.val);
    if (data.file >= 0)
        h5_close(data.file);
    if (wf >= 0)
        h5_close(wf);
    return exit_code;
}
