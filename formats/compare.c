/* compare.c — two ftk files or two checkpoints compared value by value (compare.h). */
#include "compare.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/dtype.h"
#include "../libcommon/log.h"
#include "checkpoint.h"
#include "h5.h"

/* One comparison: its options, and the values that differed over every tensor. */
typedef struct {
    const compare_opts_t *o;
    uint64_t values_differing;
} cmp_t;

static void say(const cmp_t *c, ckpt_report_t kind, const char *fmt, ...) FTK_PRINTF(3, 4);

static void say(const cmp_t *c, ckpt_report_t kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ckpt_report_vsay(c->o->report, c->o->ctx, kind, fmt, ap);
    va_end(ap);
}

typedef struct {
    double max_abs, max_rel;
    uint64_t n, differ, over;
} diff_t;

static void diff_one(const cmp_t *c, diff_t *d, double x, double y)
{
    d->n++;
    if (x == y || (isnan(x) && isnan(y)))
        return;
    d->differ++;
    double ad = fabs(x - y), rel = y != 0 ? ad / fabs(y) : INFINITY;
    if (isnan(ad))
        ad = rel = INFINITY;
    d->max_abs = ad > d->max_abs ? ad : d->max_abs;
    d->max_rel = rel > d->max_rel ? rel : d->max_rel;
    if (!(ad <= c->o->atol + c->o->rtol * fabs(y)))
        d->over++;
}

/* One line for a tensor; returns 1 when it is outside the tolerances. */
static int diff_report(cmp_t *c, const char *what, const diff_t *d)
{
    c->values_differing += d->differ;
    if (!d->differ)
        say(c, CKPT_REPORT_OK, "%s: identical (%llu values)", what, (unsigned long long)d->n);
    else
        say(c, CKPT_REPORT_OK, "%s: %llu of %llu values differ; max abs difference %.3g, max relative %.3g%s", what,
            (unsigned long long)d->differ, (unsigned long long)d->n, d->max_abs, d->max_rel,
            d->over ? "" : " (within tolerance)");
    return d->over ? 1 : 0;
}

/* The verdict line. */
static void say_verdict(cmp_t *c, const char *a, const char *b, int diff)
{
    say(c, CKPT_REPORT_OK, "%s vs %s: %s", a, b,
        diff ? "DIFFERENT" : c->values_differing ? "equal within tolerance" : "identical");
}

/* ---- checkpoints ---------------------------------------------------------------------------- */

/* The same model and unit layout: 0, or 1 with the refusal reported. */
static int same_model(cmp_t *c, const char *da, const char *db, const ckpt_manifest_t *ma, const ckpt_manifest_t *mb)
{
    if (ma->n_units != mb->n_units || model_n_params(&ma->cfg) != model_n_params(&mb->cfg)) {
        say(c, CKPT_REPORT_ERROR, "%s and %s are checkpoints of different models", da, db);
        return 1;
    }
    for (int u = 0; u < ma->n_units; u++)
        if (ma->units[u].length != mb->units[u].length || ma->units[u].n_tensors != mb->units[u].n_tensors) {
            say(c, CKPT_REPORT_ERROR, "%s and %s are checkpoints of different models (unit %s)", da, db,
                ma->units[u].name);
            return 1;
        }
    return 0;
}

/* The step, tokens, data order, data set and initial weights: how many differ, each said. */
static int compare_meta(cmp_t *c, const char *da, const char *db, const ckpt_meta_t *a, const ckpt_meta_t *b)
{
    int diff = 0;
    const char *names[] = {"step", "tokens_seen", "data.epoch", "data.rows_consumed"};
    int64_t va[] = {a->step, a->tokens_seen, a->epoch, a->rows_consumed},
            vb[] = {b->step, b->tokens_seen, b->epoch, b->rows_consumed};
    for (int i = 0; i < 4; i++)
        if (va[i] != vb[i]) {
            say(c, CKPT_REPORT_OK, "%s: %lld vs %lld", names[i], (long long)va[i], (long long)vb[i]);
            diff++;
        }
    if (strcmp(a->data_set_xxh3, b->data_set_xxh3) || strcmp(a->init_xxh3, b->init_xxh3)) {
        say(c, CKPT_REPORT_OK, "data set or initial weights differ (%s/%s vs %s/%s)", a->data_set_xxh3, a->init_xxh3,
            b->data_set_xxh3, b->init_xxh3);
        diff++;
    }
    if (strcmp(a->precision, b->precision))
        say(c, CKPT_REPORT_OK, "precision: %s is %s, %s is %s; compared by value, each widened to float32", da,
            a->precision, db, b->precision);
    return diff;
}

/* Every tensor of every kind, a unit at a time into ba and bb (room for the larger padded
 * length): how many are outside the tolerances, or -1 with the error reported. */
static int compare_units(cmp_t *c, const hid_t *fa, const hid_t *fb, const ckpt_manifest_t *ma,
                         const ckpt_manifest_t *mb, float *ba, float *bb)
{
    int diff = 0;
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int u = 0; u < ma->n_units; u++) {
            if (ckpt_read_unit(fa, ma, k, u, DT_F32, ba) < 0 || ckpt_read_unit(fb, mb, k, u, DT_F32, bb) < 0) {
                say(c, CKPT_REPORT_ERROR, "%s", ftk_err_msg());
                return -1;
            }
            const ckpt_unit_t *x = &ma->units[u];
            for (int i = 0; i < x->n_tensors; i++) {
                diff_t d = {0};
                for (int64_t e = x->t[i].offset; e < x->t[i].offset + x->t[i].numel; e++)
                    diff_one(c, &d, ba[e], bb[e]);
                char what[160];
                snprintf(what, sizeof what, "%s %s", ckpt_kind_names[k], x->t[i].name);
                diff += diff_report(c, what, &d);
            }
        }
    return diff;
}

static ckpt_verdict_t compare_ckpt(cmp_t *c, const char *pa, const char *pb)
{
    ckpt_manifest_t ma = {0}, mb = {0};
    char *da = ckpt_open_path(pa, &ma), *db = da ? ckpt_open_path(pb, &mb) : NULL;
    ckpt_verdict_t rc = CKPT_VERIFY_REFUSED;
    hid_t *fa = NULL, *fb = NULL;
    float *ba = NULL, *bb = NULL;
    if (!da || !db) {
        say(c, CKPT_REPORT_ERROR, "%s", ftk_err_msg());
        goto out;
    }
    if (same_model(c, da, db, &ma, &mb))
        goto out;
    int diff = compare_meta(c, da, db, &ma.meta, &mb.meta);
    int64_t maxpad = 0;
    for (int u = 0; u < ma.n_units; u++) {
        maxpad = ma.units[u].padded > maxpad ? ma.units[u].padded : maxpad;
        maxpad = mb.units[u].padded > maxpad ? mb.units[u].padded : maxpad;
    }
    ba = malloc((size_t)maxpad * sizeof *ba);
    bb = malloc((size_t)maxpad * sizeof *bb);
    if (!ba || !bb) {
        say(c, CKPT_REPORT_ERROR, "out of memory");
        rc = CKPT_VERIFY_FAILED;
        goto out;
    }
    rc = CKPT_VERIFY_DAMAGED;
    if (!(fa = ckpt_open_shards(da, &ma, 1)) || !(fb = ckpt_open_shards(db, &mb, 1))) {
        say(c, CKPT_REPORT_ERROR, "%s", ftk_err_msg());
        goto out;
    }
    int du = compare_units(c, fa, fb, &ma, &mb, ba, bb);
    if (du < 0)
        goto out;
    diff += du;
    say_verdict(c, da, db, diff);
    rc = diff ? CKPT_VERIFY_DAMAGED : CKPT_VERIFY_OK;
out:
    ckpt_close_shards(fa, &ma);
    ckpt_close_shards(fb, &mb);
    free(ba);
    free(bb);
    ckpt_manifest_free(&ma);
    ckpt_manifest_free(&mb);
    free(da);
    free(db);
    return rc;
}

/* ---- ftk files ------------------------------------------------------------------------------ */

typedef struct {
    cmp_t *c;
    hid_t b;
    const char *pa, *pb;
    int diff, failed;
} files_t;

/* Reads rows [r0, r0+n) of a dataset as doubles (bfloat16 converted by hand). */
static int read_rows_d(hid_t f, const char *path, int bf16, hsize_t r0, hsize_t n, size_t per_row, double *out)
{
    if (!bf16)
        return h5r_read_rows(f, path, H5T_NATIVE_DOUBLE, r0, n, out);
    uint16_t *tmp = (uint16_t *)out; /* converted backwards in place: 2 bytes -> 8 */
    if (h5r_read_rows(f, path, H5T_NATIVE_UINT16, r0, n, tmp) < 0)
        return -1;
    for (size_t i = (size_t)n * per_row; i-- > 0;)
        out[i] = bf16_to_f32(tmp[i]);
    return 0;
}

static int is_bf16(hid_t f, const char *path)
{
    char tn[32];
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (d < 0)
        return 0;
    h5_type_name(d, tn, sizeof tn);
    H5Dclose(d);
    return !strcmp(tn, "bfloat16");
}

/* A scalar dataset of both files. */
static int compare_scalar(hid_t fa, const char *path, files_t *c)
{
    double x, y;
    if (h5r_read(fa, path, H5T_NATIVE_DOUBLE, &x, 1) < 0 || h5r_read(c->b, path, H5T_NATIVE_DOUBLE, &y, 1) < 0) {
        say(c->c, CKPT_REPORT_ERROR, "%s", ftk_err_msg());
        c->failed = 1;
        return 1;
    }
    diff_t d = {0};
    diff_one(c->c, &d, x, y);
    c->diff += diff_report(c->c, path, &d);
    return 0;
}

/* A dataset of both files, of the same shape da (rank ra >= 1), in blocks of rows. */
static int compare_rows(hid_t fa, const char *path, files_t *c, const hsize_t *da, int ra)
{
    size_t per_row = 1;
    for (int i = 1; i < ra; i++)
        per_row *= da[i];
    hsize_t block = per_row >= (1u << 20) ? 1 : (hsize_t)((1u << 20) / (per_row ? per_row : 1));
    double *x = malloc(block * per_row * sizeof *x + 1), *y = malloc(block * per_row * sizeof *y + 1);
    int bfa = is_bf16(fa, path), bfb = is_bf16(c->b, path);
    diff_t d = {0};
    for (hsize_t r = 0; x && y && r < da[0]; r += block) {
        hsize_t n = da[0] - r < block ? da[0] - r : block;
        if (read_rows_d(fa, path, bfa, r, n, per_row, x) < 0 || read_rows_d(c->b, path, bfb, r, n, per_row, y) < 0) {
            say(c->c, CKPT_REPORT_ERROR, "%s: %s", path, ftk_err_msg());
            c->failed = 1;
            break;
        }
        for (size_t i = 0; i < (size_t)n * per_row; i++)
            diff_one(c->c, &d, x[i], y[i]);
    }
    if (!x || !y) {
        say(c->c, CKPT_REPORT_ERROR, "out of memory");
        c->failed = 1;
    }
    free(x);
    free(y);
    if (c->failed)
        return 1;
    c->diff += diff_report(c->c, path, &d);
    return 0;
}

static int compare_dataset(hid_t fa, const char *path, void *p)
{
    files_t *c = p;
    hsize_t da[8], db[8];
    int ra = h5r_shape(fa, path, da), rb = H5Lexists(c->b, path + (path[0] == '/'), H5P_DEFAULT) > 0
                                                ? h5r_shape(c->b, path, db)
                                                : -2;
    if (rb == -2) {
        say(c->c, CKPT_REPORT_OK, "%s: only in %s", path, c->pa);
        c->diff++;
        return 0;
    }
    int same = ra == rb && ra >= 0;
    for (int i = 0; same && i < ra; i++)
        same = da[i] == db[i];
    if (!same) {
        say(c->c, CKPT_REPORT_OK, "%s: shapes differ", path);
        c->diff++;
        return 0;
    }
    return ra == 0 ? compare_scalar(fa, path, c) : compare_rows(fa, path, c, da, ra);
}

static int only_in_b(hid_t fb, const char *path, void *p)
{
    files_t *c = p; /* here c->b is file A */
    if (H5Lexists(c->b, path + (path[0] == '/'), H5P_DEFAULT) <= 0) {
        say(c->c, CKPT_REPORT_OK, "%s: only in %s", path, c->pb);
        c->diff++;
    }
    (void)fb;
    return 0;
}

static ckpt_verdict_t compare_files(cmp_t *cmp, const char *pa, const char *pb)
{
    char *fmta = NULL, *fmtb = NULL;
    hid_t a = h5_open(pa, NULL, 0, &fmta, NULL), b = a >= 0 ? h5_open(pb, NULL, 0, &fmtb, NULL) : -1;
    ckpt_verdict_t rc = CKPT_VERIFY_REFUSED;
    if (a < 0 || b < 0) {
        say(cmp, CKPT_REPORT_ERROR, "%s", ftk_err_msg());
    } else if (strcmp(fmta, fmtb)) {
        say(cmp, CKPT_REPORT_ERROR, "%s is a %s file, %s a %s file: --compare needs two of the same kind", pa, fmta,
            pb, fmtb);
    } else {
        files_t c = {.c = cmp, .b = b, .pa = pa, .pb = pb};
        if (h5_each_dataset(a, compare_dataset, &c) < 0 || c.failed) {
            if (!c.failed)
                say(cmp, CKPT_REPORT_ERROR, "%s: %s", pa, ftk_err_msg());
            rc = CKPT_VERIFY_DAMAGED;
        } else {
            files_t c2 = {.c = cmp, .b = a, .pa = pa, .pb = pb};
            h5_each_dataset(b, only_in_b, &c2);
            c.diff += c2.diff;
            say_verdict(cmp, pa, pb, c.diff);
            rc = c.diff ? CKPT_VERIFY_DAMAGED : CKPT_VERIFY_OK;
        }
    }
    if (a >= 0)
        h5_close(a);
    if (b >= 0)
        h5_close(b);
    free(fmta);
    free(fmtb);
    return rc;
}

ckpt_verdict_t compare_paths(const char *a, const char *b, const compare_opts_t *o)
{
    cmp_t c = {.o = o};
    int ca = ckpt_verify_is_checkpoint(a), cb = ckpt_verify_is_checkpoint(b);
    if (ca != cb) {
        say(&c, CKPT_REPORT_ERROR, "%s and %s are not of the same kind (a checkpoint and a file)", a, b);
        return CKPT_VERIFY_REFUSED;
    }
    return ca ? compare_ckpt(&c, a, b) : compare_files(&c, a, b);
}
