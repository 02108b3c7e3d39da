/* ckpt_verify.c — a checkpoint and a run directory verified (ckpt_verify.h). */
#include "ckpt_verify.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "checkpoint.h"
#include "h5.h"

static void say(const ckpt_verify_opts_t *o, ckpt_report_t kind, const char *fmt, ...) FTK_PRINTF(3, 4);

void ckpt_report_vsay(ckpt_report_fn report, void *ctx, ckpt_report_t kind, const char *fmt, va_list ap)
{
    char small[1024], *line = small;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= (int)sizeof small && (line = malloc((size_t)n + 1)))
        vsnprintf(line, (size_t)n + 1, fmt, again);
    va_end(again);
    if (report)
        report(ctx, kind, line ? line : small);
    if (line != small)
        free(line);
}

static void say(const ckpt_verify_opts_t *o, ckpt_report_t kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ckpt_report_vsay(o->report, o->ctx, kind, fmt, ap);
    va_end(ap);
}

#define BAD(...)                                                                                        \
    do {                                                                                                \
        say(o, CKPT_REPORT_ERROR, __VA_ARGS__);                                                         \
        bad++;                                                                                          \
    } while (0)

const char *ckpt_verify_file_kind(mode_t m)
{
    return S_ISLNK(m) ? "a symbolic link" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) || S_ISBLK(m) ? "a device"
           : S_ISSOCK(m)                                  ? "a socket"
           : S_ISDIR(m)                                   ? "a directory"
                                                          : "not a regular file";
}

int ckpt_verify_is_checkpoint(const char *p)
{
    const char *base = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
    struct stat sb;
    return stat(p, &sb) == 0 && (S_ISDIR(sb.st_mode) || (S_ISREG(sb.st_mode) && !strcmp(base, "latest")));
}

/* The shard map, checked for what it promises rather than against how ckpt_units() builds
 * it: in every unit the tensors tile [0, length) (each element of each parameter in exactly
 * one place), the padding is a multiple of S less S elements at most, and the units hold
 * as many elements as the model has parameters. */
static int check_coverage(const ckpt_verify_opts_t *o, const char *dir, const ckpt_manifest_t *man)
{
    int bad = 0;
    int64_t S = man->meta.shard_count, total = 0;
    for (int u = 0; u < man->n_units; u++) {
        const ckpt_unit_t *x = &man->units[u];
        int64_t next = 0;
        for (int i = 0; i < x->n_tensors; i++) {
            const ckpt_tensor_t *t = &x->t[i];
            if (t->offset != next)
                BAD("%s/manifest.json: unit %s: tensor %s starts at element %lld, not %lld (%s)", dir, x->name,
                    t->name, (long long)t->offset, (long long)next, t->offset > next ? "a gap" : "an overlap");
            next = t->offset + t->numel;
            total += t->numel;
        }
        if (next != x->length)
            BAD("%s/manifest.json: unit %s: tensors end at %lld, the unit's length is %lld", dir, x->name,
                (long long)next, (long long)x->length);
        if (x->padded % S || x->padded < x->length || x->padded - x->length >= S)
            BAD("%s/manifest.json: unit %s: padded length %lld is not the length %lld rounded up to a multiple of %lld",
                dir, x->name, (long long)x->padded, (long long)x->length, (long long)S);
    }
    if (total != model_n_params(&man->cfg))
        BAD("%s/manifest.json: the units hold %lld elements, the model has %lld parameters", dir, (long long)total,
            (long long)model_n_params(&man->cfg));
    return bad;
}

typedef struct {
    const ckpt_verify_opts_t *o;
    const char *spath;
    const ckpt_manifest_t *man;
    int64_t index;
    int bad, n, residuals;
} extra_ctx_t;

/* Datasets other than the unit arrays (checked with them): every one checked and each
 * finding reported, where ckpt_shard_open() stops at the first. */
static int check_extra(hid_t f, const char *path, void *p)
{
    extra_ctx_t *c = p;
    const ckpt_verify_opts_t *o = c->o;
    int bad = 0;
    ckpt_dataset_t what = ckpt_shard_dataset(c->man, c->index, path);
    c->n += what == CKPT_DS_RESIDUAL || what == CKPT_DS_TOKENIZER;
    c->residuals += what == CKPT_DS_RESIDUAL;
    if (ckpt_shard_check_dataset(f, c->man, what, path) < 0)
        BAD("%s: %s", c->spath, ftk_err_msg());
    c->bad += bad;
    return 0;
}

/* One shard file: size and checksum against the manifest, its attributes, every dataset's
 * checksum and shape, padding zero, with --deep no NaN/Inf. buf: room for one slice. */
static int check_shard(const ckpt_verify_opts_t *o, const char *dir, const ckpt_manifest_t *man, int64_t i, float *buf,
                       int *n_ds)
{
    int bad = 0;
    int64_t S = man->meta.shard_count;
    char name[32], spath[4200];
    ckpt_shard_name(name, i, S);
    snprintf(spath, sizeof spath, "%s/%s", dir, name);
    uint64_t sum;
    if (hash_file(spath, &sum) < 0) {
        BAD("%s", ftk_err_msg());
        return bad;
    }
    hid_t f = ckpt_shard_open(dir, man, i, 0); /* attributes: index, count, step, shard map */
    if (f < 0) {
        BAD("%s", ftk_err_msg());
        if ((f = h5_open(spath, CKPT_SHARD_FORMAT, CKPT_VERSION, NULL, NULL)) < 0)
            return bad; /* not readable as a shard at all: said above */
    }
    int ds_bad = 0;
    for (int k = 0; k < CKPT_KINDS; k++) {
        for (int u = 0; u < man->n_units; u++) {
            const ckpt_unit_t *x = &man->units[u];
            int64_t part = x->padded / S, base = i * part;
            /* as float32 whatever the stored type (bf16 widens exactly, NaN and Inf kept), so
             * padding and values are checked the same way in every precision */
            if (ckpt_shard_read(f, man, k, u, 0, part, 1, DT_F32, buf) < 0) {
                BAD("%s: %s", spath, ftk_err_msg());
                ds_bad++;
                continue;
            }
            (*n_ds)++;
            int64_t nz = 0;
            for (int64_t e = x->length > base ? x->length : base; e < base + part; e++)
                nz += buf[e - base] != 0;
            if (nz)
                BAD("%s: dataset /%s/%s: %lld padding elements are not zero", spath, ckpt_kind_names[k], x->name,
                    (long long)nz);
            if (o->deep) {
                uint64_t nan = 0, inf = 0;
                dtype_count_nonfinite(buf, DT_F32, (size_t)part, &nan, &inf);
                if (nan || inf)
                    BAD("%s: dataset /%s/%s: %llu NaN and %llu infinite values", spath, ckpt_kind_names[k], x->name,
                        (unsigned long long)nan, (unsigned long long)inf);
            }
        }
    }
    extra_ctx_t c = {.o = o, .spath = spath, .man = man, .index = i};
    if (h5_each_dataset(f, check_extra, &c) < 0)
        BAD("%s: %s", spath, ftk_err_msg());
    bad += c.bad;
    *n_ds += c.n;
    if (man->meta.compress_grads[0] && c.residuals != man->n_units)
        BAD("%s: %d of the %d /grad_residual datasets the manifest's compress_grads asks for", spath, c.residuals,
            man->n_units);
    h5_close(f);
    if (sum != man->shards[i].xxh3)
        BAD("%s: file checksum %016llx differs from the manifest's %016llx%s", spath, (unsigned long long)sum,
            (unsigned long long)man->shards[i].xxh3,
            bad || ds_bad ? ""
                          : ", though every dataset verifies (the manifest's entry or the file's metadata is wrong)");
    return bad;
}

/* Whether shard i's file is in dir. */
static int shard_here(const char *dir, const ckpt_manifest_t *man, int64_t i)
{
    char name[32], p[4200];
    struct stat sb;
    ckpt_shard_name(name, i, man->meta.shard_count);
    snprintf(p, sizeof p, "%.4000s/%s", dir, name);
    return lstat(p, &sb) == 0;
}

ckpt_verdict_t ckpt_verify(const char *dir, const ckpt_verify_opts_t *o)
{
    ckpt_manifest_t man;
    int snap = ckpt_is_snapshot(dir);
    if ((snap ? ckpt_open_some(dir, &man) : ckpt_open(dir, &man)) < 0) {
        say(o, CKPT_REPORT_ERROR, "%s", ftk_err_msg());
        return CKPT_VERIFY_DAMAGED;
    }
    if (!man.sealed)
        say(o, CKPT_REPORT_WARN,
            "%s/manifest.json has no manifest_xxh3 (written by an older ftk): its values are range-checked, not "
            "checksummed",
            dir);
    int bad = check_coverage(o, dir, &man), n_ds = 0;
    int64_t S = man.meta.shard_count, maxpart = 0;
    for (int u = 0; u < man.n_units; u++)
        maxpart = man.units[u].padded / S > maxpart ? man.units[u].padded / S : maxpart;
    float *buf = malloc((size_t)maxpart * sizeof *buf);
    if (!buf) {
        say(o, CKPT_REPORT_ERROR, "out of memory");
        ckpt_manifest_free(&man);
        return CKPT_VERIFY_FAILED;
    }
    int64_t here = 0;
    for (int64_t i = 0; i < S && bad < 20; i++)
        if (!snap || shard_here(dir, &man, i)) {
            bad += check_shard(o, dir, &man, i, buf, &n_ds);
            here++;
        }
    if (!bad && snap)
        say(o, CKPT_REPORT_OK,
            "%s: OK (memory snapshot of step %lld: %lld of its %lld shard files here, strategy %s on %lld rank%s, "
            "precision %s, %d datasets; checksums%s verified)",
            dir, (long long)man.meta.step, (long long)here, (long long)S, man.meta.strategy,
            (long long)man.meta.world_size, man.meta.world_size == 1 ? "" : "s", man.meta.precision, n_ds,
            o->deep ? ", padding and values (no NaN/Inf)" : " and padding");
    else if (!bad)
        say(o, CKPT_REPORT_OK,
            "%s: OK (checkpoint of step %lld: %lld shard%s, strategy %s on %lld rank%s, precision %s, %d "
            "datasets; %lld parameters each covered once; checksums%s verified)",
            dir, (long long)man.meta.step, (long long)S, S == 1 ? "" : "s", man.meta.strategy,
            (long long)man.meta.world_size, man.meta.world_size == 1 ? "" : "s", man.meta.precision, n_ds,
            (long long)model_n_params(&man.cfg), o->deep ? ", padding and values (no NaN/Inf)" : " and padding");
    free(buf);
    ckpt_manifest_free(&man);
    return bad ? CKPT_VERIFY_DAMAGED : CKPT_VERIFY_OK;
}

/* A checkpoint directory, RUN/latest, or a run directory (every committed checkpoint,
 * `latest`, and leftovers of writes that did not finish). */
ckpt_verdict_t ckpt_verify_path(const char *path, const ckpt_verify_opts_t *o)
{
    struct stat sb;
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/manifest.json", path);
    if (!(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) || stat(mp, &sb) == 0) {
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (!strcmp(base, "latest") && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
            say(o, CKPT_REPORT_ERROR, "%s: a symbolic link, not the regular file ftk writes: refused", path);
            return CKPT_VERIFY_REFUSED;
        }
        char *dir = ckpt_resolve(path);
        if (!dir) {
            say(o, CKPT_REPORT_ERROR, "%s", ftk_err_msg());
            return CKPT_VERIFY_DAMAGED;
        }
        ckpt_verdict_t r = ckpt_verify(dir, o);
        free(dir);
        return r;
    }
    int bad = 0, n_steps = 0;
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s/manifest.json", path, e->d_name);
        if (!strncmp(e->d_name, ".step-", 6) && strstr(e->d_name, ".tmp."))
            say(o, CKPT_REPORT_WARN,
                "%s/%s: an unfinished checkpoint (its writer died or is still writing; not a checkpoint: "
                "ftk-train --resume removes it)",
                path, e->d_name);
        else if (!strncmp(e->d_name, "step-", 5) && ++n_steps && (stat(p, &sb) < 0 || !S_ISREG(sb.st_mode)))
            BAD("%s/%s: not a committed checkpoint (no manifest.json, or not a regular file)", path, e->d_name);
    }
    if (d)
        closedir(d);
    size_t n;
    snprintf(mp, sizeof mp, "%s/latest", path);
    int has_latest = lstat(mp, &sb) == 0;
    if (has_latest && !S_ISREG(sb.st_mode)) { /* a link, FIFO, device: not one ftk wrote */
        say(o, CKPT_REPORT_ERROR, "%s: %s, not the regular file ftk writes: refused", mp,
            ckpt_verify_file_kind(sb.st_mode));
        return CKPT_VERIFY_REFUSED;
    }
    char **v = ckpt_list(path, &n);
    if (!n && !n_steps && !has_latest) {
        say(o, CKPT_REPORT_ERROR,
            "%s: neither a checkpoint (no manifest.json) nor a run directory (no step-* checkpoints)", path);
        free(v);
        return CKPT_VERIFY_REFUSED;
    }
    if (has_latest) {
        char *l = ckpt_resolve(path);
        int found = 0;
        for (size_t i = 0; l && i < n; i++)
            found |= !strcmp(v[i], l);
        if (!l)
            BAD("%s", ftk_err_msg());
        else if (!found)
            BAD("%s/latest names %s, which is not a committed checkpoint", path, l);
        else if (strcmp(v[0], l))
            say(o, CKPT_REPORT_WARN,
                "%s/latest names %s, but %s is newer: `latest` could not be updated after it was committed (a "
                "full disk?); not damage: ftk-train --resume auto continues from the newest checkpoint that "
                "verifies",
                path, l, v[0]);
        free(l);
    } else if (n) {
        /* latest is replaced after the checkpoint is committed; its failure loses nothing */
        say(o, CKPT_REPORT_WARN,
            "%s: no `latest` file: it could not be written after %s was committed (a full disk?); not damage: "
            "ftk-train --resume auto continues from the newest checkpoint that verifies",
            path, v[0]);
    }
    for (size_t i = 0; i < n; i++) {
        if (ckpt_verify(v[i], o))
            bad++;
        free(v[i]);
    }
    free(v);
    return bad ? CKPT_VERIFY_DAMAGED : CKPT_VERIFY_OK;
}
