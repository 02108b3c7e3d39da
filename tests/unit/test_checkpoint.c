/* Unit tests of checkpoint precision (checkpoint.h): the state dtype of each precision,
 * checkpoints written in fp32 and bf16-true with the library's writer and read back in the
 * stored type and converted (widening exact, narrowing to nearest even, on arbitrary bit
 * patterns: NaN, Inf, subnormals, ties), whole, per unit, resliced; refusals. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../engine/precision.h"
#include "../../formats/checkpoint.h"
#include "../../libcommon/log.h"
#include "../../libcommon/rng.h"
#include "test.h"

/* Element e of unit u, kind k: any float32 bit pattern, every 5th a bf16 rounding tie;
 * padding zero. */
static float value(int k, int u, int64_t e, const ckpt_unit_t *x)
{
    if (e >= x->length)
        return 0;
    rng_t r;
    rng_seed(&r, (uint64_t)(k * 1000003 + u * 10007 + e));
    uint32_t bits = (uint32_t)rng_next(&r);
    if (e % 5 == 0)
        bits = (bits & 0xffff0000u) | 0x8000u;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* A step-1 checkpoint of S shards under run, arrays value() in precision's state dtype. */
static int write_ckpt(const char *run, const model_config_t *c, const char *precision, int64_t S)
{
    ckpt_unit_t *units;
    int n_units;
    if (ckpt_units(c, S, &units, &n_units) < 0)
        return -1;
    /* values a reader accepts (one step of one row of a one-row data set) */
    ckpt_meta_t meta = {.step = 1, .data_rows = 1, .rows_consumed = 1, .world_size = S, .shard_count = S,
                        .train = {.lr = 1e-4, .eps = 1e-8, .total_steps = 1, .global_batch = 1, .micro_batch = 1}};
    snprintf(meta.data_set_xxh3, sizeof meta.data_set_xxh3, "0000000000000000");
    snprintf(meta.init_xxh3, sizeof meta.init_xxh3, "0000000000000000");
    snprintf(meta.strategy, sizeof meta.strategy, "full");
    snprintf(meta.precision, sizeof meta.precision, "%s", precision);
    snprintf(meta.train.schedule, sizeof meta.train.schedule, "constant");
    dtype_t dt = ckpt_state_dtype(precision);
    int64_t most = 0;
    for (int u = 0; u < n_units; u++)
        most = units[u].padded > most ? units[u].padded : most;
    float *f = malloc((size_t)most * sizeof *f);
    void *buf = malloc((size_t)most * 4);
    ckpt_shard_writer_t **w = calloc((size_t)S, sizeof *w);
    ckpt_shard_sum_t *sums = calloc((size_t)S, sizeof *sums);
    ckpt_writer_t cw;
    int rc = f && buf && w && sums ? 0 : -1, begun = 0;
    rm_tree(run); /* a previous run's */
    mkdir(run, 0777);
    if (rc == 0)
        rc = ckpt_begin(&cw, run, 1);
    begun = rc == 0;
    for (int64_t j = 0; j < S && rc == 0; j++)
        rc = (w[j] = ckpt_shard_create(cw.dir, &meta, units, n_units, j)) ? 0 : -1;
    for (int k = 0; k < CKPT_KINDS && rc == 0; k++)
        for (int u = 0; u < n_units && rc == 0; u++) {
            int64_t part = units[u].padded / S;
            for (int64_t e = 0; e < units[u].padded; e++)
                f[e] = value(k, u, e, &units[u]);
            dtype_convert(buf, dt, f, DT_F32, (size_t)units[u].padded);
            for (int64_t j = 0; j < S && rc == 0; j++)
                rc = ckpt_shard_put(w[j], k, u, (char *)buf + (size_t)(j * part) * dtype_size(dt));
        }
    for (int64_t j = 0; w && j < S; j++)
        if (w[j] && ckpt_shard_finish(w[j], -1, &sums[j]) < 0)
            rc = -1;
    if (rc == 0)
        rc = ckpt_commit(&cw, &meta, c, units, n_units, sums, 0);
    else if (begun)
        ckpt_abort(&cw);
    if (rc < 0)
        fprintf(stderr, "write_ckpt %s: %s\n", precision, ftk_err_msg());
    free(f);
    free(buf);
    free(w);
    free(sums);
    free(units);
    return rc;
}

/* The unit u of kind k as value() gives it, converted to dt (n elements from element a). */
static void expected(dtype_t dt, int k, int u, const ckpt_unit_t *x, int64_t a, int64_t n, void *out)
{
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t e = 0; e < n; e++)
        f[e] = value(k, u, a + e, x);
    dtype_convert(out, dt, f, DT_F32, (size_t)n);
    free(f);
}

static void test_state_dtype(void)
{
    CHECK(ckpt_state_dtype("fp32") == DT_F32);
    CHECK(ckpt_state_dtype("bf16-mixed") == DT_F32);
    CHECK(ckpt_state_dtype("bf16-true") == DT_BF16);
    CHECK(ckpt_state_dtype("fp16") == DT_INVALID && ckpt_state_dtype("") == DT_INVALID &&
          ckpt_state_dtype("bf16") == DT_INVALID);
    /* the engine's precision table and the checkpoint's agree */
    for (int p = PREC_FP32; p <= PREC_BF16_TRUE; p++)
        CHECK(ckpt_state_dtype(precision_name((precision_t)p)) == precision_dtypes((precision_t)p).state);
}

static void test_rw(const char *work)
{
    model_config_t c;
    CHECK(model_preset("tiny", &c) == 0);
    char r32[1100], r16[1100], bad[1100];
    snprintf(r32, sizeof r32, "%s/ckpt-fp32", work);
    snprintf(r16, sizeof r16, "%s/ckpt-bf16", work);
    snprintf(bad, sizeof bad, "%s/ckpt-bad", work);
    CHECK(write_ckpt(r32, &c, "fp32", 2) == 0);
    CHECK(write_ckpt(r16, &c, "bf16-true", 2) == 0);
    CHECK(write_ckpt(bad, &c, "fp8", 2) < 0 && strstr(ftk_err_msg(), "precision \"fp8\""));

    ckpt_manifest_t m32, m16;
    char *d32 = ckpt_open_path(r32, &m32), *d16 = ckpt_open_path(r16, &m16);
    CHECK(d32 && d16);
    if (!d32 || !d16)
        return;
    CHECK(!strcmp(m32.meta.precision, "fp32") && !strcmp(m16.meta.precision, "bf16-true"));
    int64_t most = 0;
    for (int u = 0; u < m16.n_units; u++)
        most = m16.units[u].padded > most ? m16.units[u].padded : most;
    void *got = malloc((size_t)most * 4 + 8), *want = malloc((size_t)most * 4 + 8);

    /* whole units: stored type as stored, and both conversions */
    hid_t *f32 = ckpt_open_shards(d32, &m32, 1), *f16 = ckpt_open_shards(d16, &m16, 1);
    CHECK(f32 && f16);
    int same_bf = 1, same_widened = 1, same_narrowed = 1, same_f32 = 1;
    for (int k = 0; f32 && f16 && k < CKPT_KINDS; k++)
        for (int u = 0; u < m16.n_units; u++) {
            const ckpt_unit_t *x = &m16.units[u];
            size_t n = (size_t)x->padded;
            uint16_t *bf = want;
            expected(DT_BF16, k, u, x, 0, x->padded, want);
            same_bf &= ckpt_read_unit(f16, &m16, k, u, DT_BF16, got) == 0 && !memcmp(got, want, n * 2);
            same_narrowed &= ckpt_read_unit(f32, &m32, k, u, DT_BF16, got) == 0 && !memcmp(got, want, n * 2);
            /* widening: the bf16 bits, shifted (memcmp: NaN payloads too) */
            uint32_t *wide = malloc(n * 4);
            for (size_t e = 0; e < n; e++)
                wide[e] = (uint32_t)bf[e] << 16;
            same_widened &= ckpt_read_unit(f16, &m16, k, u, DT_F32, got) == 0 && !memcmp(got, wide, n * 4);
            free(wide);
            expected(DT_F32, k, u, x, 0, x->padded, want);
            same_f32 &= ckpt_read_unit(f32, &m32, k, u, DT_F32, got) == 0 && !memcmp(got, want, n * 4);
        }
    CHECK(same_bf);       /* bf16-true read as bf16: the bytes written */
    CHECK(same_narrowed); /* fp32 read as bf16: nearest even, as dtype_convert */
    CHECK(same_widened);  /* bf16-true read as f32: exact */
    CHECK(same_f32);      /* fp32 as before */

    /* a dataset of another type than the manifest's precision is damage */
    snprintf(m16.meta.precision, sizeof m16.meta.precision, "fp32");
    CHECK(ckpt_shard_read(f16[0], &m16, 0, 0, 0, m16.units[0].padded / 2, 1, DT_F32, got) < 0 &&
          strstr(ftk_err_msg(), "/param/embed: stored as bfloat16, but the manifest's precision fp32"));
    snprintf(m16.meta.precision, sizeof m16.meta.precision, "bf16-true");
    ckpt_close_shards(f32, &m32);
    ckpt_close_shards(f16, &m16);

    /* one shard, in the stored type */
    ckpt_state_t st;
    CHECK(ckpt_read_shard(d16, &m16, 1, 0, &st) == 0 && st.dt == DT_BF16);
    int shard_ok = st.dt == DT_BF16;
    for (int u = 0; shard_ok && u < m16.n_units; u++) {
        int64_t part = m16.units[u].padded / 2;
        expected(DT_BF16, 2, u, &m16.units[u], part, part, want);
        shard_ok &= !memcmp(st.v[u], want, (size_t)part * 2);
    }
    CHECK(shard_ok);
    ckpt_state_free(&st, m16.n_units);

    /* resliced for 3 shards: the stored type, zeros past the old padding */
    CHECK(ckpt_read_resliced(d16, &m16, 3, 2, 0, &st) == 0 && st.dt == DT_BF16);
    ckpt_unit_t *u3;
    int n3;
    CHECK(ckpt_units(&c, 3, &u3, &n3) == 0);
    int resliced_ok = st.dt == DT_BF16;
    for (int u = 0; resliced_ok && u < n3; u++) {
        int64_t part = u3[u].padded / 3;
        expected(DT_BF16, 1, u, &u3[u], 2 * part, part, want);
        resliced_ok &= !memcmp(st.m[u], want, (size_t)part * 2);
    }
    CHECK(resliced_ok);
    free(u3);
    ckpt_state_free(&st, m16.n_units);

    /* whole parameters, widened */
    void **units = calloc((size_t)m16.n_units, sizeof *units);
    for (int u = 0; u < m16.n_units; u++)
        units[u] = malloc((size_t)m16.units[u].padded * 4);
    CHECK(ckpt_read_params(d16, &m16, DT_F32, units) == 0);
    int params_ok = 1;
    for (int u = 0; u < m16.n_units; u++) {
        const ckpt_unit_t *x = &m16.units[u];
        expected(DT_BF16, 0, u, x, 0, x->padded, want);
        dtype_convert(got, DT_F32, want, DT_BF16, (size_t)x->padded);
        params_ok &= !memcmp(units[u], got, (size_t)x->padded * 4);
        free(units[u]);
    }
    CHECK(params_ok);
    free(units);
    free(got);
    free(want);
    ckpt_manifest_free(&m32);
    ckpt_manifest_free(&m16);
    free(d32);
    free(d16);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char work[512];
    snprintf(work, sizeof work, "%s/build/test-work", dir);
    mkdir(work, 0755);
    snprintf(work + strlen(work), sizeof work - strlen(work), "/unit-checkpoint");
    mkdir(work, 0755);
    test_state_dtype();
    test_rw(work);
    TEST_END();
}
