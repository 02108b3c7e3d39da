/* Unit tests of the training job's save and resume protocol (engine/trainer.h), in a world
 * of one (no launcher, no MPI), on a tiny model and data set made here with the library's
 * writers. For each precision mode:
 *  - 2N steps in one go = N steps, save, free, a new trainer resuming "auto", N steps:
 *    the same loss at every step (bit for bit) and the same bytes in the final shard file;
 *  - a save commits step-NNNNNNNN/ with manifest.json (precision recorded), latest names
 *    it, keep prunes the older ones;
 *  - resume "auto" skips a damaged newest checkpoint for the one before (and continues
 *    from it bit for bit); a damaged checkpoint named explicitly is refused, naming the
 *    file; every one damaged is refused;
 *  - other options (--lr, --precision) are refused; a directory holding a run is refused
 *    with resume "none"; a dead writer's hidden directory is removed at start;
 *  - evaluation gives a finite loss; a step whose loss is not finite (NaN weights) fails.
 *
 *   test_trainer [ROOT]     work files under ROOT/build/test-work (else $TMPDIR or /tmp)
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/comm.h"
#include "../../engine/trainer.h"
#include "../../formats/h5.h"
#include "../../formats/tokens.h"
#include "../../formats/weights.h"
#include "../../libcommon/atomic.h"
#include "../../libcommon/buf.h"
#include "../../libcommon/hash.h"
#include "../../libcommon/log.h"
#include "../../libcommon/output.h"
#include "../../libcommon/rng.h"
#include "test.h"

#define N 4           /* steps before the save; the runs are 2N steps */
#define TRAIN_ROWS 10 /* global batch 4: epochs of 3 steps (4, 4, 2 rows), so 2N crosses two */
#define VAL_ROWS 4
#define MAX_LEN 16
#define VOCAB 256

static comm_t *world;
static backend_t *be;

/* ---- inputs ------------------------------------------------------------------------------ */

static model_config_t tiny_config(void)
{
    model_config_t c;
    model_config_defaults(&c);
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.vocab_size = VOCAB;
    c.max_position_embeddings = 64;
    c.tie_word_embeddings = 0;
    c.torch_dtype = DT_F32;
    return c;
}

typedef struct {
    int nan; /* a NaN in model.norm.weight: every logit, hence the loss, is NaN */
} init_t;

static dtype_t init_dtype(void *ctx, size_t i)
{
    (void)ctx, (void)i;
    return DT_F32;
}

static const void *init_rows(void *ctx, size_t i, const weights_spec_t *s, dtype_t dt, int64_t row0, int64_t n,
                             void *scratch)
{
    (void)dt;
    int64_t cols = s->rank == 2 ? s->shape[1] : s->shape[0];
    float *out = scratch;
    for (int64_t r = 0; r < n; r++) {
        rng_t g;
        rng_seed(&g, 1000003u * (i + 1) + (uint64_t)(row0 + r));
        for (int64_t j = 0; j < cols; j++)
            out[r * cols + j] =
                s->is_norm ? 1.0f : (float)((double)(rng_next(&g) >> 11) * 0x1p-53 - 0.5) * 0.2f;
    }
    if (((init_t *)ctx)->nan && !strcmp(s->name, "model.norm.weight"))
        out[0] = NAN;
    return scratch;
}

static int write_weights(const char *path, int nan)
{
    model_config_t c = tiny_config();
    init_t in = {nan};
    weights_source_t src = {.cfg = &c, .source = "test_trainer", .dtype_label = "float32", .ctx = &in,
                            .dtype = init_dtype, .rows = init_rows};
    return weights_write_file(path, OUTPUT_FORCE, &src, NULL);
}

/* n samples of 6 … MAX_LEN tokens: BOS, ids in [3, VOCAB), EOS; the second half targets. */
static int make_split(int n, uint64_t seed, tokens_split_t *out)
{
    int32_t ids[MAX_LEN * 64];
    uint8_t mask[MAX_LEN * 64];
    tokens_sample_t sm[64];
    rng_t g;
    rng_seed(&g, seed);
    for (int k = 0; k < n; k++) {
        int64_t len = 6 + (int64_t)(rng_next(&g) % (MAX_LEN - 5));
        int32_t *x = ids + k * MAX_LEN;
        uint8_t *m = mask + k * MAX_LEN;
        for (int64_t j = 0; j < len; j++) {
            x[j] = j == 0 ? 1 : j == len - 1 ? 2 : 3 + (int32_t)(rng_next(&g) % (VOCAB - 3));
            m[j] = j >= len / 2;
        }
        sm[k] = (tokens_sample_t){x, m, len, k};
    }
    return tokens_build(sm, (size_t)n, 0, MAX_LEN, 0, seed, out);
}

static int write_tokens(const char *path)
{
    tokens_split_t tr, va;
    uint64_t sums[1][2 * TOKENS_N_DATASETS];
    if (make_split(TRAIN_ROWS, 11, &tr) < 0 || make_split(VAL_ROWS, 12, &va) < 0)
        return -1;
    hid_t f = h5_create(path, TOKENS_FORMAT, TOKENS_VERSION);
    h5w_opts_t wo = {0};
    int rc = f < 0 || h5_attr_set_i64(f, "vocab_size", VOCAB) || h5_attr_set_i64(f, "bos_id", 1) ||
                     h5_attr_set_i64(f, "eos_id", 2) || h5_attr_set_i64(f, "pad_id", 0) ||
                     h5_attr_set_i64(f, "mask_prompt", 1) || h5_attr_set_i64(f, "max_len", MAX_LEN) ||
                     h5_attr_set_i64(f, "packed", 0) || h5_attr_set_i64(f, "shard_index", 1) ||
                     h5_attr_set_i64(f, "shard_count", 1) || tokens_write_split(f, "train", &tr, &wo, sums[0]) ||
                     tokens_write_split(f, "val", &va, &wo, sums[0] + TOKENS_N_DATASETS)
                 ? -1
                 : 0;
    char sh[17];
    hash_hex(tokens_set_hash((const uint64_t(*)[2 * TOKENS_N_DATASETS])sums, 1), sh);
    if (rc == 0 && h5_attr_set_str(f, "set_xxh3", sh) < 0)
        rc = -1;
    if (f >= 0 && h5_close(f) < 0)
        rc = -1;
    tokens_split_free(&tr);
    tokens_split_free(&va);
    return rc;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static char weights_path[1100], nan_weights_path[1100], data_path[1100];

static trainer_opts_t opts(const char *out, const char *resume, precision_t p)
{
    trainer_opts_t o = {0};
    o.model_path = weights_path;
    o.data_path = data_path;
    o.out_dir = out;
    o.resume = resume;
    o.train = (ckpt_train_t){.lr = 1e-2, .min_lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                             .weight_decay = 0.1, .clip = 1.0, .warmup = 2, .total_steps = 2 * N,
                             .global_batch = 4, .micro_batch = 2, .seed = 7};
    snprintf(o.train.schedule, sizeof o.train.schedule, "cosine");
    o.epochs = 1;
    o.strategy = STRAT_FULL;
    o.precision = p;
    o.stochastic = 1; /* bf16-true: stochastic rounding must resume bit for bit too */
    return o;
}

/* trainer_new + trainer_resume; NULL with *code (and the message printed) on failure. */
static trainer_t *start(const trainer_opts_t *o, int *code)
{
    trainer_t *t = trainer_new(world, be, o, code);
    if (!t)
        return NULL;
    if ((*code = trainer_resume(t))) {
        trainer_free(t);
        return NULL;
    }
    return t;
}

/* Steps until step `to`, the loss of step s into loss[s - 1]; with save_each a checkpoint
 * after every step. Returns 0 or the first failing code. */
static int steps(trainer_t *t, int64_t to, double *loss, int save_each)
{
    while (trainer_meta(t)->step < to) {
        trainer_step_t st;
        int code = trainer_step(t, NULL, 0, &st);
        if (code) {
            fprintf(stderr, "step: %s\n", ftk_err_msg());
            return code;
        }
        loss[st.step - 1] = st.loss;
        if (save_each && (code = trainer_save(t))) {
            fprintf(stderr, "save: %s\n", ftk_err_msg());
            return code;
        }
    }
    return 0;
}

static int exists(const char *dir, const char *name)
{
    char p[2200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* The bytes of dir/name (empty when unreadable). */
static buf_t slurp(const char *dir, const char *name)
{
    char p[2200];
    buf_t b = {0};
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (buf_read_file(&b, p) < 0)
        buf_free(&b);
    return b;
}

static int same_file(const char *dir1, const char *dir2, const char *name)
{
    buf_t a = slurp(dir1, name), b = slurp(dir2, name);
    int same = a.len > 0 && a.len == b.len && !memcmp(a.data, b.data, a.len);
    buf_free(&a);
    buf_free(&b);
    return same;
}

static int flip_byte(const char *dir, const char *name)
{
    char p[2200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r+b");
    if (!f || fseek(f, 0, SEEK_END) < 0)
        return f ? fclose(f), -1 : -1;
    long at = ftell(f) / 2;
    int c = fseek(f, at, SEEK_SET) == 0 ? fgetc(f) : EOF;
    int rc = c == EOF || fseek(f, at, SEEK_SET) < 0 || fputc(c ^ 0x40, f) == EOF ? -1 : 0;
    return fclose(f) || rc ? -1 : 0;
}

static int same_losses(const double *a, const double *b, int from, int to)
{
    for (int s = from; s <= to; s++)
        if (memcmp(&a[s - 1], &b[s - 1], sizeof *a)) {
            fprintf(stderr, "step %d: loss %.17g, expected %.17g\n", s, b[s - 1], a[s - 1]);
            return 0;
        }
    return 1;
}

#define SHARD "shard-00001-of-00001.h5"
#define STEP(s) "step-0000000" #s

/* ---- the tests, one precision mode ------------------------------------------------------------ */

static void test_mode(const char *work, precision_t p)
{
    const char *pn = precision_name(p);
    char base[1100], run_a[1200], run_b[1200], run_nan[1200], ck_a[1300], ck_b[1300], ck_b4[1300];
    snprintf(base, sizeof base, "%s/%s", work, pn);
    mkdir(base, 0777);
    snprintf(run_a, sizeof run_a, "%s/one-go", base);
    snprintf(run_b, sizeof run_b, "%s/resumed", base);
    snprintf(run_nan, sizeof run_nan, "%s/nan", base);
    snprintf(ck_a, sizeof ck_a, "%s/" STEP(8), run_a);
    snprintf(ck_b, sizeof ck_b, "%s/" STEP(8), run_b);
    snprintf(ck_b4, sizeof ck_b4, "%s/" STEP(4), run_b);
    fprintf(stderr, "--- %s\n", pn);
    int code = 0;
    double loss_a[2 * N], loss_b[2 * N], loss_c[2 * N];
    memset(loss_a, 0, sizeof loss_a);
    memset(loss_b, 0, sizeof loss_b);
    memset(loss_c, 0, sizeof loss_c);

    /* A: 2N steps in one go, saved at the end; evaluation finite */
    trainer_opts_t oa = opts(run_a, "none", p);
    trainer_t *t = start(&oa, &code);
    CHECK(t);
    if (!t) {
        fprintf(stderr, "%s: %s\n", pn, ftk_err_msg());
        return;
    }
    CHECK(trainer_meta(t)->step == 0 && trainer_rows(t) == TRAIN_ROWS && trainer_val_rows(t) == VAL_ROWS);
    double vl = NAN;
    int64_t vt = 0;
    CHECK(trainer_evaluate(t, &vl, &vt) == 0 && isfinite(vl) && vl > 0 && vt > 0);
    double vl0 = vl;
    CHECK(steps(t, 2 * N, loss_a, 0) == 0 && trainer_done(t));
    CHECK(trainer_save(t) == 0);
    CHECK(trainer_evaluate(t, &vl, &vt) == 0 && isfinite(vl) && vl < vl0); /* it learned */
    int finite = 1;
    for (int s = 0; s < 2 * N; s++)
        finite &= isfinite(loss_a[s]) && loss_a[s] > 0;
    CHECK(finite);
    trainer_free(t);

    /* B: N steps saving each (keep 2), free; then a new trainer resuming auto, N steps */
    trainer_opts_t ob = opts(run_b, "none", p);
    ob.keep = 2;
    CHECK((t = start(&ob, &code)) != NULL);
    if (t) {
        CHECK(steps(t, N, loss_b, 1) == 0);
        trainer_free(t);
    }
    CHECK(exists(run_b, STEP(4) "/manifest.json") && exists(run_b, STEP(4) "/" SHARD) &&
          exists(run_b, STEP(4) "/config.json"));
    CHECK(exists(run_b, STEP(3)) && !exists(run_b, STEP(2)) && !exists(run_b, STEP(1))); /* keep 2 */
    buf_t b = slurp(run_b, "latest");
    CHECK(b.len == 14 && !memcmp(b.data, STEP(4) "\n", 14));
    buf_free(&b);
    b = slurp(run_b, STEP(4) "/manifest.json");
    char want[64];
    snprintf(want, sizeof want, "\"precision\": \"%s\"", pn);
    CHECK(b.data && strstr(b.data, want) && strstr(b.data, "\"step\": 4,"));
    buf_free(&b);

    /* a dead writer's leftovers, removed at start */
    char stale[1300];
    snprintf(stale, sizeof stale, "%s/.step-00000005.tmp.4242", run_b);
    mkdir(stale, 0777);
    char stale_file[1400];
    snprintf(stale_file, sizeof stale_file, "%s/" SHARD, stale);
    FILE *f = fopen(stale_file, "wb");
    if (f)
        fwrite("partial", 1, 7, f), fclose(f);
    CHECK(exists(run_b, ".step-00000005.tmp.4242/" SHARD));

    /* a directory holding a run is refused with resume none (and left alone) */
    t = trainer_new(world, be, &ob, &code);
    CHECK(!t && code == FTK_EXIT_USAGE && strstr(ftk_err_msg(), "already holds a run") &&
          strstr(ftk_err_msg(), run_b));
    trainer_free(t);

    trainer_opts_t ob2 = opts(run_b, "auto", p);
    ob2.keep = 2;
    t = trainer_new(world, be, &ob2, &code);
    CHECK(t && !exists(run_b, ".step-00000005.tmp.4242")); /* stale directory removed */
    if (t && (code = trainer_resume(t)))
        fprintf(stderr, "resume: %s\n", ftk_err_msg());
    CHECK(t && code == 0 && trainer_meta(t)->step == N);
    if (t && code == 0) {
        CHECK(steps(t, 2 * N, loss_b, 0) == 0);
        CHECK(trainer_save(t) == 0);
    }
    trainer_free(t);
    CHECK(same_losses(loss_a, loss_b, 1, 2 * N));
    CHECK(same_file(ck_a, ck_b, SHARD));         /* the final state, byte for byte */
    CHECK(same_file(ck_a, ck_b, "manifest.json")); /* and its description */
    CHECK(exists(run_b, STEP(4)) && !exists(run_b, STEP(3)));

    /* other options than the checkpoint's: refused, naming the option */
    trainer_opts_t ol = opts(run_a, "auto", p);
    ol.train.lr = 2e-2;
    t = start(&ol, &code);
    CHECK(!t && code == FTK_EXIT_USAGE && strstr(ftk_err_msg(), "--lr"));
    trainer_free(t);
    trainer_opts_t op = opts(run_a, "auto", (precision_t)((p + 1) % 3));
    t = start(&op, &code);
    CHECK(!t && code == FTK_EXIT_USAGE && strstr(ftk_err_msg(), "--precision") && strstr(ftk_err_msg(), pn));
    trainer_free(t);

    /* the newest checkpoint damaged: auto falls back to the one before and continues from it
     * bit for bit; named explicitly, it is refused */
    CHECK(flip_byte(ck_b, SHARD) == 0);
    t = start(&ob2, &code);
    CHECK(t && code == 0 && trainer_meta(t)->step == N);
    if (t) {
        CHECK(steps(t, 2 * N, loss_c, 0) == 0);
        CHECK(same_losses(loss_a, loss_c, N + 1, 2 * N));
        trainer_free(t);
    }
    trainer_opts_t oe = opts(run_b, ck_b, p);
    t = start(&oe, &code);
    CHECK(!t && code != 0 && strstr(ftk_err_msg(), ck_b) && strstr(ftk_err_msg(), SHARD));
    if (t || !strstr(ftk_err_msg(), SHARD))
        fprintf(stderr, "explicit damaged checkpoint: code %d, %s\n", code, ftk_err_msg());
    trainer_free(t);
    /* every one damaged: auto has nothing to resume from */
    CHECK(flip_byte(ck_b4, SHARD) == 0);
    t = start(&ob2, &code);
    CHECK(!t && code == FTK_EXIT_USAGE && strstr(ftk_err_msg(), "every one is damaged"));
    trainer_free(t);

    /* a non-finite loss fails the step; nothing is written */
    trainer_opts_t on = opts(run_nan, "none", p);
    on.model_path = nan_weights_path;
    t = start(&on, &code);
    CHECK(t != NULL);
    if (t) {
        trainer_step_t st;
        code = trainer_step(t, NULL, 0, &st);
        CHECK(code == FTK_EXIT_FAIL && strstr(ftk_err_msg(), "the loss is") && isnan(st.loss));
        trainer_free(t);
    }
    CHECK(!exists(run_nan, "latest") && !exists(run_nan, STEP(1)));
}

int main(int argc, char **argv)
{
    /* A world of one whatever the environment (comm.c: FTK_MPI=0 wins over launcher
     * variables). */
    setenv("FTK_MPI", "0", 1);
    ftk_set_tool("test_trainer");
    ftk_quiet = 1;
    /* One thread unless told otherwise: the steps are tiny, and on a loaded machine OpenMP
     * teams waiting for each other take 20 times as long as the work (the protocol, not
     * the kernels' threading, is under test here). */
    if (!getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(1);
    char work[1024];
    const char *tmp = getenv("TMPDIR");
    if (argc > 1) {
        snprintf(work, sizeof work, "%s/build/test-work", argv[1]);
        mkdir(work, 0777);
    } else {
        snprintf(work, sizeof work, "%s", tmp && *tmp ? tmp : "/tmp");
    }
    size_t wl = strlen(work);
    snprintf(work + wl, sizeof work - wl, "/unit-trainer.XXXXXX");
    if (!mkdtemp(work)) {
        fprintf(stderr, "test_trainer: %s: %s\n", work, strerror(errno));
        return 1;
    }
    world = comm_init(&argc, &argv);
    CHECK(world && comm_size(world) == 1 && comm_rank(world) == 0);
    CHECK(h5_init() == 0);
    be = backend_cpu_new();
    CHECK(be != NULL);
    if (!world || !be)
        TEST_END();
    snprintf(weights_path, sizeof weights_path, "%s/weights.h5", work);
    snprintf(nan_weights_path, sizeof nan_weights_path, "%s/weights-nan.h5", work);
    snprintf(data_path, sizeof data_path, "%s/data.h5", work);
    int in_ok = write_weights(weights_path, 0) == 0 && write_weights(nan_weights_path, 1) == 0 &&
                write_tokens(data_path) == 0;
    if (!in_ok)
        fprintf(stderr, "inputs: %s\n", ftk_err_msg());
    CHECK(in_ok);
    if (in_ok)
        for (int p = PREC_FP32; p <= PREC_BF16_TRUE; p++)
            test_mode(work, (precision_t)p);
    backend_free(be);
    comm_finalize(world);
    if (!test_bad)
        rm_tree(work);
    else
        fprintf(stderr, "work files kept in %s\n", work);
    TEST_END();
}
