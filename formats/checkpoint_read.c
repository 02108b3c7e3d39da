/* checkpoint_read.c — reading a checkpoint (checkpoint.h): the manifest, parsed and checked,
 * shard files opened and read, and the state resliced for another shard count. */
#include "checkpoint.h"
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/path.h"
#include "../libcommon/version.h"
#include "h5.h"
#include "json.h"

/* Bounds on what a reader reads whole. A manifest of 99999 shards is about 10 MB. */
#define MANIFEST_MAX BUF_SMALL_MAX
#define CONFIG_MAX ((size_t)1 << 20)

static int get_i64(const json_value_t *o, const char *key, int64_t *v)
{
    const json_value_t *x = json_get(o, key);
    if (!x || json_get_i64(x, v) < 0) {
        ftk_err_set("manifest.json: \"%s\" missing or not an integer", key);
        return -1;
    }
    return 0;
}

static int get_f64(const json_value_t *o, const char *key, double *v)
{
    const json_value_t *x = json_get(o, key);
    if (!x || x->type != JSON_NUMBER) {
        ftk_err_set("manifest.json: \"%s\" missing or not a number", key);
        return -1;
    }
    *v = x->u.num.v;
    return 0;
}

static int get_str(const json_value_t *o, const char *key, char *out, size_t n)
{
    const json_value_t *x = json_get(o, key);
    if (!x || x->type != JSON_STRING || x->u.str.len >= n || memchr(x->u.str.s, 0, x->u.str.len)) {
        ftk_err_set("manifest.json: \"%s\" missing, not a string or too long", key);
        return -1;
    }
    memcpy(out, x->u.str.s, x->u.str.len + 1);
    return 0;
}

static int parse_hex(const char *s, uint64_t *v)
{
    if (strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16)
        return -1;
    *v = strtoull(s, NULL, 16);
    return 0;
}

static int one_of(const char *v, const char *const *names)
{
    for (; *names; names++)
        if (!strcmp(v, *names))
            return 1;
    return 0;
}

/* The manifest's values against each other: the ranges ftk-train accepts for its options,
 * and the invariants of the data order (docs/design.md "Data order"): an epoch takes at
 * least one step, a step consumes at least one row and at most global_batch, so
 * step <= epoch * n_rows + rows_consumed <= step * global_batch. A reader uses no value
 * unchecked and ckpt_commit() writes none a reader refuses. The message names the field
 * as the manifest spells it. */
int ckpt_check_meta(const ckpt_meta_t *m)
{
    static const char *const schedules[] = {"cosine", "linear", "constant", NULL};
    static const char *const strategies[] = {"full", "grad-op", "none", "hybrid", "hpz", NULL};
    const ckpt_train_t *t = &m->train;
#define RANGE(ok, ...)                                                                                               \
    do {                                                                                                             \
        if (!(ok)) {                                                                                                 \
            ftk_err_set(__VA_ARGS__);                                                                                \
            return -1;                                                                                               \
        }                                                                                                            \
    } while (0)
#define LL(x) ((long long)(x))
    RANGE(t->total_steps >= 1, "\"train.total_steps\" is %lld (need >= 1)", LL(t->total_steps));
    RANGE(m->step >= 0 && m->step <= t->total_steps, "\"step\" is %lld, outside [0, train.total_steps = %lld]",
          LL(m->step), LL(t->total_steps));
    RANGE(t->global_batch >= 1, "\"train.global_batch\" is %lld (need >= 1)", LL(t->global_batch));
    RANGE(t->micro_batch >= 1, "\"train.micro_batch\" is %lld (need >= 1)", LL(t->micro_batch));
    RANGE(t->warmup >= 0, "\"train.warmup\" is %lld (need >= 0)", LL(t->warmup));
    RANGE(m->tokens_seen >= 0, "\"tokens_seen\" is %lld (need >= 0)", LL(m->tokens_seen));
    RANGE(m->data_rows >= 1, "\"data.n_rows\" is %lld (need >= 1)", LL(m->data_rows));
    RANGE(m->epoch >= 0 && m->epoch <= m->step, "\"data.epoch\" is %lld, outside [0, step = %lld]", LL(m->epoch),
          LL(m->step));
    RANGE(m->rows_consumed >= 0 && m->rows_consumed <= m->data_rows,
          "\"data.rows_consumed\" is %lld, outside [0, data.n_rows = %lld]", LL(m->rows_consumed), LL(m->data_rows));
    __int128 rows = (__int128)m->epoch * m->data_rows + m->rows_consumed;
    RANGE(rows >= m->step && rows <= (__int128)m->step * t->global_batch,
          "\"data.epoch\" %lld and \"data.rows_consumed\" %lld (of %lld rows an epoch) are not a position %lld steps "
          "of train.global_batch = %lld rows can reach",
          LL(m->epoch), LL(m->rows_consumed), LL(m->data_rows), LL(m->step), LL(t->global_batch));
    RANGE(t->lr > 0 && isfinite(t->lr), "\"train.lr\" is %g (need > 0)", t->lr);
    RANGE(t->min_lr >= 0 && isfinite(t->min_lr), "\"train.min_lr\" is %g (need >= 0)", t->min_lr);
    RANGE(t->beta1 >= 0 && t->beta1 < 1, "\"train.beta1\" is %g (need [0, 1))", t->beta1);
    RANGE(t->beta2 >= 0 && t->beta2 < 1, "\"train.beta2\" is %g (need [0, 1))", t->beta2);
    RANGE(t->eps > 0 && isfinite(t->eps), "\"train.eps\" is %g (need > 0)", t->eps);
    RANGE(t->weight_decay >= 0 && isfinite(t->weight_decay), "\"train.weight_decay\" is %g (need >= 0)",
          t->weight_decay);
    RANGE(t->clip >= 0 && isfinite(t->clip), "\"train.clip\" is %g (need >= 0)", t->clip);
    RANGE(one_of(t->schedule, schedules), "\"train.schedule\" is \"%s\" (cosine, linear or constant)", t->schedule);
    RANGE(one_of(m->strategy, strategies), "\"strategy\" is \"%s\" (full, grad-op, none, hybrid or hpz)", m->strategy);
    RANGE(m->shard_count >= 1 && m->shard_count <= 99999, "\"shard_count\" is %lld, outside [1, 99999]",
          LL(m->shard_count));
    RANGE(m->world_size >= 1 && m->world_size <= INT32_MAX, "\"world_size\" is %lld (need >= 1)", LL(m->world_size));
    if (!strcmp(m->strategy, "hybrid"))
        RANGE(m->world_size % m->shard_count == 0,
              "\"shard_count\" %lld does not divide \"world_size\" %lld (strategy hybrid: one shard group's ranks)",
              LL(m->shard_count), LL(m->world_size));
    else
        RANGE(m->world_size == m->shard_count, "\"shard_count\" %lld is not \"world_size\" %lld (strategy %s)",
              LL(m->shard_count), LL(m->world_size), m->strategy);
    int upk;
    int64_t upa;
    char upc[32];
    RANGE(ckpt_units_policy_parse(m->units_policy, &upk, &upa) == 0, "\"units_policy\" is \"%s\" (block, group:M "
          "or size:BYTES)", m->units_policy);
    /* as written: digits only, no unit suffix, sign or leading zero ("" is what ckpt_commit writes as block) */
    ckpt_units_policy_name(upk, upa, upc);
    RANGE(!m->units_policy[0] || !strcmp(m->units_policy, upc),
          "\"units_policy\" is \"%s\", not as ftk writes it (%s: the number in digits only)", m->units_policy, upc);
#undef LL
#undef RANGE
    return 0;
}

/* The manifest's format and version: an ftk checkpoint manifest this ftk reads. */
static int parse_format(const json_value_t *r)
{
    char fmt[32];
    int64_t ver;
    if (!r || r->type != JSON_OBJECT || get_str(r, "ftk_format", fmt, sizeof fmt) < 0 || strcmp(fmt, CKPT_FORMAT)) {
        ftk_err_set("manifest.json: not an ftk checkpoint manifest (ftk_format is not \"checkpoint\")");
        return -1;
    }
    if (get_i64(r, "ftk_format_version", &ver) < 0)
        return -1;
    if (ver < 1 || ver > CKPT_VERSION) {
        ftk_err_set("manifest.json: checkpoint format version %lld; this ftk reads version %d", (long long)ver,
                    CKPT_VERSION);
        return -1;
    }
    return 0;
}

/* The members every version-1 manifest has: the data order, the initial weights, the
 * training options, the layout, config.json's checksum. */
static int parse_required(const json_value_t *r, const json_value_t *d, const json_value_t *t,
                          const json_value_t *c, const json_value_t *in, ckpt_meta_t *m, uint64_t *config_sum)
{
    char hex[32];
    ckpt_train_t *tr = &m->train;
    const json_value_t *dn = json_get(t, "decay_norms");
    if (get_i64(r, "step", &m->step) < 0 || get_i64(r, "tokens_seen", &m->tokens_seen) < 0 ||
        get_str(d, "file", m->data_file, sizeof m->data_file) < 0 ||
        get_str(d, "set_xxh3", m->data_set_xxh3, sizeof m->data_set_xxh3) < 0 ||
        get_i64(d, "n_rows", &m->data_rows) < 0 || get_i64(d, "epoch", &m->epoch) < 0 ||
        get_i64(d, "rows_consumed", &m->rows_consumed) < 0 ||
        get_str(in, "file", m->init_file, sizeof m->init_file) < 0 ||
        get_str(in, "xxh3", m->init_xxh3, sizeof m->init_xxh3) < 0 || get_f64(t, "lr", &tr->lr) < 0 ||
        get_f64(t, "min_lr", &tr->min_lr) < 0 || get_i64(t, "warmup", &tr->warmup) < 0 ||
        get_str(t, "schedule", tr->schedule, sizeof tr->schedule) < 0 ||
        get_i64(t, "total_steps", &tr->total_steps) < 0 || get_i64(t, "global_batch", &tr->global_batch) < 0 ||
        get_i64(t, "micro_batch", &tr->micro_batch) < 0 || get_f64(t, "beta1", &tr->beta1) < 0 ||
        get_f64(t, "beta2", &tr->beta2) < 0 || get_f64(t, "eps", &tr->eps) < 0 ||
        get_f64(t, "weight_decay", &tr->weight_decay) < 0 || get_f64(t, "clip", &tr->clip) < 0 ||
        get_i64(t, "seed", &tr->seed) < 0 || get_str(r, "strategy", m->strategy, sizeof m->strategy) < 0 ||
        get_str(r, "precision", m->precision, sizeof m->precision) < 0 ||
        get_i64(r, "world_size", &m->world_size) < 0 || get_i64(r, "shard_count", &m->shard_count) < 0 ||
        get_str(c, "xxh3", hex, sizeof hex) < 0 || parse_hex(hex, config_sum) < 0)
        return -1;
    if (!dn || dn->type != JSON_BOOL) {
        ftk_err_set("manifest.json: \"decay_norms\" missing or not true/false");
        return -1;
    }
    tr->decay_norms = dn->u.boolean;
    return 0;
}

/* The members added after version 1's first manifests: absent, they are what those runs
 * did (no compressed gradients, nearest rounding, ftk's warmup, the global mean, ftk's
 * recipe, block units). */
static int parse_later(const json_value_t *r, const json_value_t *t, ckpt_meta_t *m)
{
    ckpt_train_t *tr = &m->train;
    m->compress_grads[0] = 0;
    if (json_get(r, "compress_grads")) {
        if (get_str(r, "compress_grads", m->compress_grads, sizeof m->compress_grads) < 0)
            return -1;
        if (strcmp(m->compress_grads, "bf16")) {
            ftk_err_set("manifest.json: \"compress_grads\" is \"%s\" (need bf16)", m->compress_grads);
            return -1;
        }
    }
    if (!json_get(t, "rounding"))
        snprintf(tr->rounding, sizeof tr->rounding, "nearest");
    else if (get_str(t, "rounding", tr->rounding, sizeof tr->rounding) < 0)
        return -1;
    if (strcmp(tr->rounding, "stochastic") && strcmp(tr->rounding, "nearest")) {
        ftk_err_set("manifest.json: \"rounding\" is \"%s\" (need stochastic or nearest)", tr->rounding);
        return -1;
    }
    static const struct {
        const char *key, *dflt, *a, *b;
        size_t off;
    } opt_str[] = {
        {"warmup_style", "ftk", "ftk", "litgpt", offsetof(ckpt_train_t, warmup_style)},
        {"loss_mean", "global", "global", "micro", offsetof(ckpt_train_t, loss_mean)},
        {"recipe", "ftk", "ftk", "litgpt", offsetof(ckpt_train_t, recipe)},
    };
    for (size_t i = 0; i < sizeof opt_str / sizeof *opt_str; i++) {
        char *v = (char *)tr + opt_str[i].off;
        if (!json_get(t, opt_str[i].key))
            snprintf(v, sizeof tr->recipe, "%s", opt_str[i].dflt);
        else if (get_str(t, opt_str[i].key, v, sizeof tr->recipe) < 0)
            return -1;
        if (strcmp(v, opt_str[i].a) && strcmp(v, opt_str[i].b)) {
            ftk_err_set("manifest.json: \"%s\" is \"%s\" (need %s or %s)", opt_str[i].key, v, opt_str[i].a,
                        opt_str[i].b);
            return -1;
        }
    }
    if (!json_get(r, "units_policy"))
        snprintf(m->units_policy, sizeof m->units_policy, "block");
    else if (get_str(r, "units_policy", m->units_policy, sizeof m->units_policy) < 0)
        return -1;
    else if (!m->units_policy[0]) {
        ftk_err_set("manifest.json: \"units_policy\" is \"\" (block, group:M or size:BYTES)");
        return -1;
    }
    return 0;
}

/* The "shards" array: one entry per shard, in order, each named as ckpt_shard_name() names
 * it. *shards is allocated here (the caller frees it, on failure too). */
static int parse_shards(const json_value_t *sh, const ckpt_meta_t *m, ckpt_shard_sum_t **shards)
{
    char hex[32];
    if (m->shard_count < 1 || m->shard_count > 99999 || sh->u.arr.n != (size_t)m->shard_count) {
        ftk_err_set("manifest.json: %zu entries in \"shards\" for a shard_count of %lld", sh->u.arr.n,
                    (long long)m->shard_count);
        return -1;
    }
    if (!(*shards = calloc((size_t)m->shard_count, sizeof **shards))) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int64_t i = 0; i < m->shard_count; i++) {
        const json_value_t *x = &sh->u.arr.items[i];
        char file[64], want[32];
        int64_t bytes;
        if (get_str(x, "file", file, sizeof file) < 0 || get_i64(x, "bytes", &bytes) < 0 ||
            get_str(x, "xxh3", hex, sizeof hex) < 0 || parse_hex(hex, &(*shards)[i].xxh3) < 0)
            return -1;
        ckpt_shard_name(want, i, m->shard_count);
        if (strcmp(file, want) || bytes < 0) {
            ftk_err_set("manifest.json: shard %lld is \"%s\" (%lld bytes); expected \"%s\"", (long long)i + 1, file,
                        (long long)bytes, want);
            return -1;
        }
        (*shards)[i].bytes = (uint64_t)bytes;
    }
    return 0;
}

static int parse_manifest(const json_value_t *r, ckpt_meta_t *m, ckpt_shard_sum_t **shards, uint64_t *config_sum)
{
    if (parse_format(r) < 0)
        return -1;
    const json_value_t *d = json_get(r, "data"), *t = json_get(r, "train"), *c = json_get(r, "config"),
                       *sh = json_get(r, "shards"), *in = json_get(r, "init");
    if (!d || !t || !c || !sh || !in || d->type != JSON_OBJECT || t->type != JSON_OBJECT ||
        c->type != JSON_OBJECT || in->type != JSON_OBJECT || sh->type != JSON_ARRAY) {
        ftk_err_set("manifest.json: \"data\", \"init\", \"train\", \"config\" or \"shards\" missing or malformed");
        return -1;
    }
    if (parse_required(r, d, t, c, in, m, config_sum) < 0 || parse_later(r, t, m) < 0)
        return -1;
    if (ckpt_state_dtype(m->precision) == DT_INVALID) {
        ftk_err_set("manifest.json: precision \"%s\" is not one this ftk knows (fp32, bf16-mixed or bf16-true)",
                    m->precision);
        return -1;
    }
    if (ckpt_check_meta(m) < 0) {
        ftk_err_prefix("manifest.json: ");
        return -1;
    }
    return parse_shards(sh, m, shards);
}

/* 1 when the manifest ends with its seal and the seal holds, 0 when it has none (written
 * before manifests were sealed), -1 (message set) when the seal is malformed or differs. */
static int check_seal(const char *mpath, const buf_t *b)
{
    size_t kl = strlen(CKPT_SEAL_KEY), tl = kl + 16 + 4; /* key, 16 hex digits, "\"\n}\n" */
    const char *tail = b->len >= tl ? b->data + b->len - tl : NULL;
    char hex[17];
    uint64_t want;
    if (tail && !memcmp(tail, CKPT_SEAL_KEY, kl) && !memcmp(b->data + b->len - 4, "\"\n}\n", 4) && tail > b->data &&
        tail[-1] == '\n') {
        memcpy(hex, tail + kl, 16);
        hex[16] = 0;
        uint64_t got = hash_bytes(b->data, (size_t)(tail - b->data));
        if (parse_hex(hex, &want) < 0) {
            ftk_err_set("%s: \"manifest_xxh3\" is not 16 lowercase hex digits", mpath);
            return -1;
        }
        if (got != want) {
            ftk_err_set("%s: checksum %016llx differs from its manifest_xxh3 %016llx (the manifest was changed or "
                        "damaged after it was written)",
                        mpath, (unsigned long long)got, (unsigned long long)want);
            return -1;
        }
        return 1;
    }
    if (memmem(b->data, b->len, "\"manifest_xxh3\"", 15)) {
        ftk_err_set("%s: \"manifest_xxh3\" is not the last member on a line of its own (damaged?)", mpath);
        return -1;
    }
    return 0;
}

/* A model whose shard map can be computed without overflow: at most 2^20 blocks and 2^40
 * elements a tensor (a 4 TB float32 matrix), so every unit's length and the total fit
 * int64. Bigger than anything trained; what is on disk bounds it further (ckpt_open). */
static int check_model_size(const model_config_t *c)
{
    int64_t dims[] = {c->hidden_size, c->intermediate_size, c->vocab_size, c->num_attention_heads,
                      c->num_key_value_heads};
    int ok = c->num_hidden_layers >= 1 && c->num_hidden_layers <= (1 << 20);
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        ok = ok && dims[i] >= 1 && dims[i] <= (INT64_C(1) << 31);
    ok = ok && c->hidden_size * c->intermediate_size <= (INT64_C(1) << 40) &&
         c->hidden_size * c->vocab_size <= (INT64_C(1) << 40) && c->hidden_size * c->hidden_size <= (INT64_C(1) << 40);
    if (!ok) {
        ftk_err_set("a model too large for a checkpoint (%lld layers of hidden size %lld, intermediate size %lld, "
                    "vocabulary %lld)",
                    (long long)c->num_hidden_layers, (long long)c->hidden_size, (long long)c->intermediate_size,
                    (long long)c->vocab_size);
        return -1;
    }
    return 0;
}

/* The shard map the manifest records ("units") against the one config.json's model gives
 * (man->units): every unit's name, length and padding, every tensor's name, shape and
 * offset. */
static int check_units(const json_value_t *root, const ckpt_manifest_t *man, const char *dir, const char *mpath)
{
    const json_value_t *ju = json_get(root, "units");
    if (!ju || ju->type != JSON_ARRAY || ju->u.arr.n != (size_t)man->n_units) {
        ftk_err_set("%s: \"units\" does not match config.json's model", mpath);
        return -1;
    }
    for (int u = 0; u < man->n_units; u++) {
        const json_value_t *x = &ju->u.arr.items[u];
        const ckpt_unit_t *w = &man->units[u];
        char nm[32];
        int64_t len, pad;
        if (get_str(x, "name", nm, sizeof nm) < 0 || get_i64(x, "length", &len) < 0 ||
            get_i64(x, "padded", &pad) < 0) {
            ftk_err_prefix("%s: ", dir);
            return -1;
        }
        if (strcmp(nm, w->name) || len != w->length || pad != w->padded) {
            ftk_err_set("%s: unit %d (%s, %lld elements) does not match config.json's model (%s, %lld)", mpath, u, nm,
                        (long long)len, w->name, (long long)w->length);
            return -1;
        }
        const json_value_t *jt = json_get(x, "tensors");
        if (!jt || jt->type != JSON_ARRAY || jt->u.arr.n != (size_t)w->n_tensors) {
            ftk_err_set("%s: unit %s: \"tensors\" missing or not the %d of config.json's model", mpath, w->name,
                        w->n_tensors);
            return -1;
        }
        for (int i = 0; i < w->n_tensors; i++) {
            const json_value_t *y = &jt->u.arr.items[i], *js = json_get(y, "shape");
            const ckpt_tensor_t *t = &w->t[i];
            char tn[WEIGHTS_NAME_MAX];
            int64_t off, d0 = -1, d1 = 1;
            if (get_str(y, "name", tn, sizeof tn) < 0 || get_i64(y, "offset", &off) < 0 || !js ||
                js->type != JSON_ARRAY || js->u.arr.n != (size_t)t->rank ||
                json_get_i64(&js->u.arr.items[0], &d0) < 0 || (t->rank == 2 && json_get_i64(&js->u.arr.items[1], &d1) < 0) ||
                strcmp(tn, t->name) || off != t->offset || d0 != t->shape[0] || d1 != t->shape[1]) {
                ftk_err_set("%s: unit %s, tensor %d: name, shape or offset differs from config.json's model (%s %lldx%lld "
                            "at %lld)",
                            mpath, w->name, i, t->name, (long long)t->shape[0], (long long)t->shape[1],
                            (long long)t->offset);
                return -1;
            }
        }
    }
    return 0;
}

/* Each shard holds its slice of every unit, three times, uncompressed: the shard map
 * must fit in the bytes the manifest records (and the file has), which also bounds what
 * a reader allocates by what is on disk. Counted at 2 bytes an element whatever the
 * precision, so that a dataset of the wrong type is named as such when it is read. */
static int check_shard_files(const char *dir, const ckpt_manifest_t *man, int some)
{
    uint64_t slice_bytes = 0;
    for (int u = 0; u < man->n_units; u++)
        slice_bytes += (uint64_t)(man->units[u].padded / man->meta.shard_count);
    slice_bytes *= CKPT_KINDS * 2;
    for (int64_t i = 0; i < man->meta.shard_count; i++) {
        char name[32];
        ckpt_shard_name(name, i, man->meta.shard_count);
        char *sp = ckpt_join(dir, name);
        struct stat sb;
        if (!sp)
            return -1;
        int st = stat(sp, &sb);
        if (st < 0 && some && errno == ENOENT) {
            free(sp);
            continue;
        }
        if (st < 0)
            ftk_err_set("%s: %s", sp, strerror(errno));
        else if (!S_ISREG(sb.st_mode))
            ftk_err_set("%s: not a regular file", sp);
        else if ((uint64_t)sb.st_size != man->shards[i].bytes)
            ftk_err_set("%s: %lld bytes, the manifest says %llu", sp, (long long)sb.st_size,
                        (unsigned long long)man->shards[i].bytes);
        else if (man->shards[i].bytes < slice_bytes)
            ftk_err_set("%s: %llu bytes, too few for the shard map's %llu bytes of arrays (config.json's model)", sp,
                        (unsigned long long)man->shards[i].bytes, (unsigned long long)slice_bytes);
        if (st < 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != man->shards[i].bytes ||
            man->shards[i].bytes < slice_bytes) {
            free(sp);
            return -1;
        }
        free(sp);
    }
    return 0;
}

static int open_manifest(const char *dir, ckpt_manifest_t *man, int some)
{
    int rc = -1;
    uint64_t config_sum = 0;
    buf_t mb = {0}, cb = {0};
    json_doc_t *doc = NULL;
    json_value_t *root;
    char *mpath = ckpt_join(dir, "manifest.json"), *cpath = ckpt_join(dir, "config.json");
    memset(man, 0, sizeof *man);
    if (!mpath || !cpath)
        goto out;
    /* control files ftk writes itself, never as links: a link (to a secret, to another
     * run's) is refused before a byte of its target is read */
    if (buf_read_small(&mb, mpath, MANIFEST_MAX, BUF_NOFOLLOW) < 0)
        goto out;
    if ((man->sealed = check_seal(mpath, &mb)) < 0)
        goto out;
    if (!(doc = json_parse(mb.data, mb.len, NULL, &root))) {
        ftk_err_prefix("%s: ", mpath);
        goto out;
    }
    if (parse_manifest(root, &man->meta, &man->shards, &config_sum) < 0) {
        ftk_err_prefix("%s: ", dir);
        goto out;
    }
    if (buf_read_small(&cb, cpath, CONFIG_MAX, BUF_NOFOLLOW) < 0)
        goto out;
    if (hash_bytes(cb.data, cb.len) != config_sum) {
        ftk_err_set("%s: checksum differs from the manifest's", cpath);
        goto out;
    }
    if (hfconfig_parse(cb.data, cb.len, &man->cfg) < 0) {
        ftk_err_prefix("%s: ", cpath);
        goto out;
    }
    if (check_model_size(&man->cfg) < 0) {
        ftk_err_prefix("%s: ", cpath);
        goto out;
    }
    if (ckpt_units(&man->cfg, man->meta.shard_count, &man->units, &man->n_units) < 0)
        goto out;
    if (check_units(root, man, dir, mpath) < 0 || check_shard_files(dir, man, some) < 0)
        goto out;
    rc = 0;
out:
    if (rc < 0)
        ckpt_manifest_free(man);
    json_free(doc);
    buf_free(&mb);
    buf_free(&cb);
    free(mpath);
    free(cpath);
    return rc;
}

int ckpt_open(const char *dir, ckpt_manifest_t *man) { return open_manifest(dir, man, 0); }
int ckpt_open_some(const char *dir, ckpt_manifest_t *man) { return open_manifest(dir, man, 1); }

int ckpt_is_snapshot(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    if (n - b != 13 || strncmp(dir + b, "step-", 5))
        return 0;
    return (b >= 12 && !strncmp(dir + b - 12, "/rank-", 6)) || (b == 11 && !strncmp(dir, "rank-", 5));
}

char *ckpt_open_path(const char *path, ckpt_manifest_t *man)
{
    char *dir = ckpt_resolve(path);
    if (dir && open_manifest(dir, man, ckpt_is_snapshot(dir)) < 0) {
        free(dir);
        dir = NULL;
    }
    return dir;
}

void ckpt_manifest_free(ckpt_manifest_t *man)
{
    free(man->units);
    free(man->shards);
    memset(man, 0, sizeof *man);
}

ckpt_dataset_t ckpt_shard_dataset(const ckpt_manifest_t *man, int64_t index, const char *path)
{
    const char *rest = path[0] == '/' ? path + 1 : path;
    for (int k = 0; k < CKPT_KINDS; k++) {
        size_t l = strlen(ckpt_kind_names[k]);
        if (!strncmp(rest, ckpt_kind_names[k], l) && rest[l] == '/')
            for (int u = 0; u < man->n_units; u++)
                if (!strcmp(rest + l + 1, man->units[u].name))
                    return CKPT_DS_ARRAY;
    }
    if (ckpt_residual_unit(man, path) >= 0)
        return CKPT_DS_RESIDUAL;
    return !strncmp(rest, "tokenizer/", 10) && index == 0 ? CKPT_DS_TOKENIZER : CKPT_DS_UNEXPECTED;
}

int ckpt_shard_check_dataset(hid_t f, const ckpt_manifest_t *man, ckpt_dataset_t what, const char *path)
{
    if (what == CKPT_DS_ARRAY)
        return 0;
    if (what == CKPT_DS_RESIDUAL)
        return ckpt_shard_read_residual(f, man, ckpt_residual_unit(man, path), NULL);
    if (what == CKPT_DS_UNEXPECTED) {
        ftk_err_set("unexpected dataset %s (not in the shard map)", path);
        return -1;
    }
    uint64_t stored, computed;
    int has, r = h5_verify_dataset(f, path, &stored, &computed, &has);
    if (r > 0)
        ftk_err_set("dataset %s: checksum mismatch (stored %016llx, computed %016llx)", path,
                    (unsigned long long)stored, (unsigned long long)computed);
    return r ? -1 : 0;
}

typedef struct {
    const ckpt_manifest_t *man;
    int64_t index;
    int residuals; /* /grad_residual datasets seen */
} extra_t;

/* ckpt_shard_open()'s walk over a shard's datasets: the first one refused ends it. */
static int check_extra(hid_t f, const char *path, void *p)
{
    extra_t *c = p;
    ckpt_dataset_t what = ckpt_shard_dataset(c->man, c->index, path);
    c->residuals += what == CKPT_DS_RESIDUAL;
    return ckpt_shard_check_dataset(f, c->man, what, path);
}

int ckpt_residual_unit(const ckpt_manifest_t *man, const char *path)
{
    const char *rest = path[0] == '/' ? path + 1 : path;
    if (!man->meta.compress_grads[0] || strncmp(rest, "grad_residual/", 14))
        return -1;
    for (int u = 0; u < man->n_units; u++)
        if (!strcmp(rest + 14, man->units[u].name))
            return u;
    return -1;
}

hid_t ckpt_shard_open(const char *dir, const ckpt_manifest_t *man, int64_t index, int verify)
{
    int64_t S = man->meta.shard_count;
    char name[32], hex[17];
    uint64_t sum;
    if (index < 0 || index >= S) {
        ftk_err_set("internal: shard %lld of %lld", (long long)index, (long long)S);
        return -1;
    }
    ckpt_shard_name(name, index, S);
    char *spath = ckpt_join(dir, name);
    if (!spath)
        return -1;
    if (verify && hash_file(spath, &sum) < 0) {
        free(spath);
        return -1;
    }
    if (verify && sum != man->shards[index].xxh3) {
        ftk_err_set("%s: file checksum %016llx differs from the manifest's %016llx (the shard is damaged or not this "
                    "checkpoint's)",
                    spath, (unsigned long long)sum, (unsigned long long)man->shards[index].xxh3);
        free(spath);
        return -1;
    }
    hid_t f = h5_open(spath, CKPT_SHARD_FORMAT, CKPT_VERSION, NULL, NULL);
    if (f < 0) {
        ftk_err_prefix("%s: ", spath);
        free(spath);
        return -1;
    }
    int64_t si = -1, sc = -1, step = -1;
    char *uh = NULL;
    int rc = h5_attr_get_i64(f, "shard_index", &si) | h5_attr_get_i64(f, "shard_count", &sc) |
             h5_attr_get_i64(f, "step", &step) | h5_attr_get_str(f, "units_xxh3", &uh);
    if (rc == 0 && ckpt_units_hash(man->units, man->n_units, hex) < 0)
        rc = -1;
    else if (rc)
        ftk_err_set("%s: root attributes shard_index, shard_count, step or units_xxh3 missing", spath);
    else if (si != index + 1 || sc != S)
        ftk_err_set("%s: holds shard %lld of %lld, the manifest puts shard %lld of %lld here", spath, (long long)si,
                    (long long)sc, (long long)index + 1, (long long)S);
    else if (step != man->meta.step)
        ftk_err_set("%s: written at step %lld, the manifest is of step %lld (a shard of another checkpoint)", spath,
                    (long long)step, (long long)man->meta.step);
    else if (strcmp(uh, hex))
        ftk_err_set("%s: written for another shard map (units_xxh3 %s, the manifest's is %s)", spath, uh, hex);
    extra_t ex = {man, index, 0};
    if (!(rc || si != index + 1 || sc != S || step != man->meta.step || strcmp(uh, hex)) && verify) {
        if (h5_each_dataset(f, check_extra, &ex) != 0)
            rc = -1;
        else if (man->meta.compress_grads[0] && ex.residuals != man->n_units) {
            ftk_err_set("%d of the %d /grad_residual datasets the manifest's compress_grads asks for", ex.residuals,
                        man->n_units);
            rc = -1;
        }
        if (rc)
            ftk_err_prefix("%s: ", spath);
    }
    if (rc || si != index + 1 || sc != S || step != man->meta.step || strcmp(uh, hex)) {
        h5_close(f);
        f = -1;
    }
    free(uh);
    free(spath);
    return f;
}

/* The type a shard dataset is stored in: float32, or bfloat16 as weights.h stores it;
 * DT_INVALID for anything else (name: what the file says it is, for the message). */
static dtype_t stored_dtype(hid_t d, char *name, size_t n)
{
    h5_type_name(d, name, n);
    dtype_t dt = dtype_parse(name);
    hid_t t = H5Dget_type(d);
    H5T_class_t c = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
    size_t size = t < 0 ? 0 : H5Tget_size(t);
    if (t >= 0)
        H5Tclose(t);
    /* the dtype attribute alone does not make a dataset bfloat16: the bytes must be too */
    if (!((dt == DT_F32 && c == H5T_FLOAT) || (dt == DT_BF16 && c == H5T_INTEGER)) || size != dtype_size(dt))
        return DT_INVALID;
    return dt;
}

/* Whether an element of type dt is zero (either sign; NaN is not). */
static int is_zero(const unsigned char *p, dtype_t dt)
{
    if (dt == DT_F32) {
        float f;
        memcpy(&f, p, 4);
        return f == 0;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7fff) == 0;
}

static int shard_read_at(hid_t f, const ckpt_manifest_t *man, int kind, int unit, int64_t start, int64_t n,
                         int check, dtype_t dt, void *out, int64_t base);

int ckpt_shard_read(hid_t f, const ckpt_manifest_t *man, int kind, int unit, int64_t start, int64_t n, int check,
                    dtype_t dt, void *out)
{
    return shard_read_at(f, man, kind, unit, start, n, check, dt, out, -1);
}

/* Values read per block where a residual is only checked (out NULL): 4 MiB. */
#define RESIDUAL_BLOCK ((int64_t)1 << 20)

int ckpt_shard_read_residual(hid_t f, const ckpt_manifest_t *man, int unit, float *out)
{
    char ds[64], tn[32];
    const ckpt_unit_t *u = &man->units[unit];
    snprintf(ds, sizeof ds, "grad_residual/%s", u->name);
    hsize_t dims[8];
    int rank = h5r_shape(f, ds, dims);
    if (rank < 0) {
        ftk_err_set("dataset /%s: missing (the manifest's compress_grads asks for one per unit)", ds);
        return -1;
    }
    if (rank != 1 || (int64_t)dims[0] != u->padded) {
        char shape[96] = "";
        for (int i = 0, n = 0; i < rank && n < (int)sizeof shape - 24; i++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
        ftk_err_set("dataset /%s: shape [%s], not [%lld] (the unit's padded length)", ds, shape, (long long)u->padded);
        return -1;
    }
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("dataset /%s: cannot open it", ds);
        return -1;
    }
    hid_t t = H5Dget_type(d);
    int is_f32 = t >= 0 && H5Tget_class(t) == H5T_FLOAT && H5Tget_size(t) == 4;
    uint64_t stored = 0;
    int has_sum = h5_attr_get_u64(d, "xxh3_64", &stored) == 0;
    h5_type_name(d, tn, sizeof tn);
    if (t >= 0)
        H5Tclose(t);
    H5Dclose(d);
    if (!is_f32) {
        ftk_err_set("dataset /%s: stored as %s, not float32", ds, tn);
        return -1;
    }
    if (!has_sum) {
        ftk_err_set("dataset /%s: no xxh3_64 checksum attribute", ds);
        return -1;
    }
    /* Read in blocks, hashed and scanned as they come: checking needs no unit-sized buffer. */
    int64_t block = out ? u->padded : (u->padded < RESIDUAL_BLOCK ? u->padded : RESIDUAL_BLOCK);
    float *buf = out ? out : malloc((size_t)(block ? block : 1) * sizeof *buf);
    hash_state_t *h = hash_new();
    int rc = buf && h ? 0 : -1;
    uint64_t nan = 0, inf = 0;
    if (rc < 0)
        ftk_err_set("out of memory");
    for (int64_t at = 0; rc == 0 && at < u->padded; at += block) {
        int64_t n = u->padded - at < block ? u->padded - at : block;
        float *p = out ? out + at : buf;
        if ((rc = h5r_read_rows(f, ds, H5T_NATIVE_FLOAT, (hsize_t)at, (hsize_t)n, p)) == 0) {
            hash_update(h, p, (size_t)n * sizeof *p);
            dtype_count_nonfinite(p, DT_F32, (size_t)n, &nan, &inf);
        }
    }
    uint64_t got = rc == 0 ? hash_digest(h) : stored;
    if (got != stored) {
        ftk_err_set("dataset /%s: checksum mismatch (stored %016llx, computed %016llx)", ds, (unsigned long long)stored,
                    (unsigned long long)got);
        rc = -1;
    } else if (rc == 0 && (nan || inf)) {
        /* a finite gradient leaves a finite residual; the first step after a resume would
         * turn this one into NaN weights */
        ftk_err_set("dataset /%s: %llu NaN and %llu infinite values", ds, (unsigned long long)nan,
                    (unsigned long long)inf);
        rc = -1;
    }
    hash_free(h);
    if (buf != out)
        free(buf);
    return rc;
}

/* ckpt_shard_read(), and with base >= 0 (the unit element where this shard's slice
 * starts) the elements read that lie in the unit's padding checked to be zero, as stored
 * (before a conversion could round a tiny value to zero): the rule ftk-verify applies, so
 * that a tool refuses what it refuses. */
static int shard_read_at(hid_t f, const ckpt_manifest_t *man, int kind, int unit, int64_t start, int64_t n,
                         int check, dtype_t dt, void *out, int64_t base)
{
    char ds[64], tn[32];
    const ckpt_unit_t *u = &man->units[unit];
    int64_t part = u->padded / man->meta.shard_count;
    dtype_t want = ckpt_state_dtype(man->meta.precision);
    snprintf(ds, sizeof ds, "%s/%s", ckpt_kind_names[kind], u->name);
    hsize_t dims[8];
    if (h5r_shape(f, ds, dims) != 1 || (int64_t)dims[0] != part) {
        ftk_err_set("dataset /%s: missing or not %lld values", ds, (long long)part);
        return -1;
    }
    if (start < 0 || n < 0 || start + n > part || (check && (start || n != part)) || dtype_size(dt) == 0) {
        ftk_err_set("internal: elements %lld..%lld of /%s as %s", (long long)start, (long long)(start + n), ds,
                    dtype_name(dt));
        return -1;
    }
    uint64_t stored = 0;
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("dataset /%s: cannot open it", ds);
        return -1;
    }
    dtype_t st = stored_dtype(d, tn, sizeof tn);
    int has_sum = !check || h5_attr_get_u64(d, "xxh3_64", &stored) == 0;
    H5Dclose(d);
    if (st != want) {
        ftk_err_set("dataset /%s: stored as %s, but the manifest's precision %s stores %s", ds, tn,
                    man->meta.precision, dtype_name(want));
        return -1;
    }
    if (!has_sum) {
        ftk_err_set("dataset /%s: no xxh3_64 checksum attribute", ds);
        return -1;
    }
    size_t bytes = (size_t)n * dtype_size(st);
    void *raw = st == dt ? out : malloc(bytes ? bytes : 1);
    if (!raw) {
        ftk_err_set("out of memory");
        return -1;
    }
    int rc = h5r_read_rows(f, ds, weights_h5type(st), (hsize_t)start, (hsize_t)n, raw);
    /* The bytes read against the dataset's xxh3_64 (the stored little-endian layout is
     * the memory layout here), so each byte is read once. */
    uint64_t got = rc == 0 && check ? hash_bytes(raw, bytes) : stored;
    if (got != stored) {
        ftk_err_set("dataset /%s: checksum mismatch (stored %016llx, computed %016llx)", ds,
                    (unsigned long long)stored, (unsigned long long)got);
        rc = -1;
    }
    if (rc == 0 && base >= 0) {
        int64_t nz = 0, from = u->length - base > start ? u->length - base : start;
        for (int64_t e = from; e < start + n; e++)
            nz += !is_zero((const unsigned char *)raw + (size_t)(e - start) * dtype_size(st), st);
        if (nz) {
            ftk_err_set("dataset /%s: %lld padding elements are not zero", ds, (long long)nz);
            rc = -1;
        }
    }
    if (raw != out) {
        if (rc == 0)
            dtype_convert(out, dt, raw, st, (size_t)n);
        free(raw);
    }
    return rc;
}

static char *shard_path(const char *dir, const ckpt_manifest_t *man, int64_t i)
{
    char name[32];
    ckpt_shard_name(name, i, man->meta.shard_count);
    return ckpt_join(dir, name);
}

/* The first `kinds` arrays of st (param, m, v): per unit, a zeroed slice of
 * units[u].padded / S elements of dt. On failure the caller frees st (ckpt_state_free). */
static int state_alloc(ckpt_state_t *st, const ckpt_unit_t *units, int n_units, int64_t S, int kinds, dtype_t dt)
{
    void ***arrays[CKPT_KINDS] = {&st->param, &st->m, &st->v};
    st->dt = dt;
    for (int k = 0; k < kinds; k++) {
        if (!(*arrays[k] = calloc((size_t)n_units, sizeof(void *))))
            goto oom;
        for (int u = 0; u < n_units; u++)
            if (!((*arrays[k])[u] = calloc((size_t)(units[u].padded / S), dtype_size(dt))))
                goto oom;
    }
    return 0;
oom:
    ftk_err_set("out of memory");
    return -1;
}

int ckpt_read_shard(const char *dir, const ckpt_manifest_t *man, int64_t index, int params_only, ckpt_state_t *st)
{
    int rc = -1, n_units = man->n_units;
    int64_t S = man->meta.shard_count;
    memset(st, 0, sizeof *st);
    hid_t f = ckpt_shard_open(dir, man, index, 1);
    if (f < 0)
        return -1;
    void ***arrays[CKPT_KINDS] = {&st->param, &st->m, &st->v};
    int kinds = params_only ? 1 : CKPT_KINDS;
    dtype_t dt = ckpt_state_dtype(man->meta.precision);
    if (state_alloc(st, man->units, n_units, S, kinds, dt) < 0)
        goto out;
    for (int k = 0; k < kinds; k++)
        for (int u = 0; u < n_units; u++)
            if (shard_read_at(f, man, k, u, 0, man->units[u].padded / S, 1, dt, (*arrays[k])[u],
                              index * (man->units[u].padded / S)) < 0)
                goto out;
    rc = 0;
out:
    if (rc < 0) {
        char *p = shard_path(dir, man, index);
        if (p && strncmp(ftk_err_msg(), p, strlen(p)))
            ftk_err_prefix("%s: ", p);
        free(p);
        ckpt_state_free(st, n_units);
    }
    h5_close(f);
    return rc;
}

int ckpt_read_unit(const hid_t *files, const ckpt_manifest_t *man, int kind, int unit, dtype_t dt, void *out)
{
    int64_t S = man->meta.shard_count, part = man->units[unit].padded / S;
    for (int64_t i = 0; i < S; i++)
        if (shard_read_at(files[i], man, kind, unit, 0, part, 1, dt, (char *)out + (size_t)(i * part) * dtype_size(dt),
                          i * part) < 0) {
            char name[32];
            ckpt_shard_name(name, i, S);
            ftk_err_prefix("%s: ", name);
            return -1;
        }
    return 0;
}

hid_t *ckpt_open_shards(const char *dir, const ckpt_manifest_t *man, int verify)
{
    int64_t S = man->meta.shard_count;
    hid_t *f = malloc((size_t)S * sizeof *f);
    if (!f) {
        ftk_err_set("out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < S; i++)
        if ((f[i] = ckpt_shard_open(dir, man, i, verify)) < 0) {
            while (i-- > 0)
                h5_close(f[i]);
            free(f);
            return NULL;
        }
    return f;
}

int ckpt_check_padding(const hid_t *files, const ckpt_manifest_t *man)
{
    int64_t S = man->meta.shard_count;
    dtype_t dt = ckpt_state_dtype(man->meta.precision);
    void *buf = malloc((size_t)S * 4); /* a unit's padding: fewer than S elements */
    int rc = buf ? 0 : -1;
    if (!buf)
        ftk_err_set("out of memory");
    for (int k = 0; k < CKPT_KINDS && rc == 0; k++)
        for (int u = 0; u < man->n_units && rc == 0; u++) {
            const ckpt_unit_t *x = &man->units[u];
            int64_t part = x->padded / S;
            for (int64_t i = x->length / part; i < S && rc == 0; i++) {
                int64_t a = x->length > i * part ? x->length - i * part : 0, n = part - a;
                if (n > S)
                    n = S; /* unreachable for a shard map ckpt_open() accepted */
                if (n > 0 && shard_read_at(files[i], man, k, u, a, n, 0, dt, buf, i * part) < 0) {
                    char name[32];
                    ckpt_shard_name(name, i, S);
                    ftk_err_prefix("%s: ", name);
                    rc = -1;
                }
            }
        }
    free(buf);
    return rc;
}

void ckpt_close_shards(hid_t *files, const ckpt_manifest_t *man)
{
    for (int64_t i = 0; files && i < man->meta.shard_count; i++)
        h5_close(files[i]);
    free(files);
}

int ckpt_read_params(const char *dir, const ckpt_manifest_t *man, dtype_t dt, void **units)
{
    hid_t *f = ckpt_open_shards(dir, man, 1);
    int rc = f ? 0 : -1;
    for (int u = 0; u < man->n_units && rc == 0; u++)
        rc = ckpt_read_unit(f, man, 0, u, dt, units[u]);
    ckpt_close_shards(f, man);
    return rc;
}

struct ckpt_shard_cache {
    char *dir;
    const ckpt_manifest_t *man;
    int max_open;
    int64_t *index; /* max_open slots: the shard open there, or -1 */
    hid_t *f;
    uint64_t *used, clock; /* the slot's last use, for the least recently used */
    unsigned char *checked; /* a bit per shard: its attributes were checked at an open */
};

ckpt_shard_cache_t *ckpt_shard_cache_new(const char *dir, const ckpt_manifest_t *man, int max_open)
{
    ckpt_shard_cache_t *c = calloc(1, sizeof *c);
    if (max_open < 1)
        max_open = 1;
    if (c) {
        c->man = man;
        c->max_open = max_open;
        c->dir = strdup(dir);
        c->index = malloc((size_t)max_open * sizeof *c->index);
        c->f = malloc((size_t)max_open * sizeof *c->f);
        c->used = calloc((size_t)max_open, sizeof *c->used);
        c->checked = calloc((size_t)(man->meta.shard_count / 8 + 1), 1);
    }
    if (!c || !c->dir || !c->index || !c->f || !c->used || !c->checked) {
        ckpt_shard_cache_free(c);
        ftk_err_set("out of memory");
        return NULL;
    }
    for (int i = 0; i < max_open; i++) {
        c->index[i] = -1;
        c->f[i] = -1;
    }
    return c;
}

hid_t ckpt_shard_cache_get(ckpt_shard_cache_t *c, int64_t index)
{
    int slot = 0;
    if (index < 0 || index >= c->man->meta.shard_count) {
        ftk_err_set("internal: shard %lld of %lld", (long long)index, (long long)c->man->meta.shard_count);
        return -1;
    }
    for (int i = 0; i < c->max_open; i++) {
        if (c->index[i] == index) {
            c->used[i] = ++c->clock;
            return c->f[i];
        }
        if (c->used[i] < c->used[slot])
            slot = i; /* a free slot (never used: 0) or the least recently used */
    }
    if (c->f[slot] >= 0)
        h5_close(c->f[slot]);
    c->index[slot] = -1;
    c->used[slot] = 0;
    /* Opened again (a reader sweeping more shards than it keeps open does, once per array):
     * its attributes were checked the first time, so HDF5's open alone, a tenth of the cost. */
    unsigned char bit = (unsigned char)(1u << (index % 8));
    if (c->checked[index / 8] & bit) {
        char *p = shard_path(c->dir, c->man, index);
        c->f[slot] = p ? H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
        if (c->f[slot] < 0 && p)
            ftk_err_set("%s: cannot open it again", p);
        free(p);
    } else {
        c->f[slot] = ckpt_shard_open(c->dir, c->man, index, 0);
    }
    if (c->f[slot] < 0)
        return -1;
    c->checked[index / 8] |= bit;
    c->index[slot] = index;
    c->used[slot] = ++c->clock;
    return c->f[slot];
}

void ckpt_shard_cache_free(ckpt_shard_cache_t *c)
{
    if (!c)
        return;
    for (int i = 0; c->f && i < c->max_open; i++)
        if (c->f[i] >= 0)
            h5_close(c->f[i]);
    free(c->dir);
    free(c->index);
    free(c->f);
    free(c->used);
    free(c->checked);
    free(c);
}

int ckpt_read_range(ckpt_shard_cache_t *c, int kind, int unit, int64_t start, int64_t n, dtype_t dt, void *out)
{
    const ckpt_manifest_t *man = c->man;
    const ckpt_unit_t *x = &man->units[unit];
    int64_t S = man->meta.shard_count, part = x->padded / S, end = start + n;
    size_t es = dtype_size(dt);
    if (start < 0 || n < 0 || end > x->padded || es == 0) {
        ftk_err_set("internal: elements %lld..%lld of unit %s (%lld) as %s", (long long)start, (long long)end,
                    x->name, (long long)x->padded, dtype_name(dt));
        return -1;
    }
    for (int64_t i = n ? start / part : S; i < S && i * part < end; i++) {
        int64_t lo = start > i * part ? start : i * part, hi = end < (i + 1) * part ? end : (i + 1) * part;
        hid_t f = ckpt_shard_cache_get(c, i);
        if (f < 0)
            return -1;
        /* a dataset read whole is checked against its own checksum too */
        int whole = lo == i * part && hi == (i + 1) * part;
        char *dst = (char *)out + (size_t)(lo - start) * es;
        if (shard_read_at(f, man, kind, unit, lo - i * part, hi - lo, whole, dt, dst, i * part) < 0) {
            char *p = shard_path(c->dir, man, i);
            if (p)
                ftk_err_prefix("%s: ", p);
            free(p);
            return -1;
        }
    }
    return 0;
}

int ckpt_read_reslice(ckpt_shard_cache_t *c, int kind, int unit, int64_t a, int64_t b, int last, dtype_t dt,
                      void *out)
{
    int64_t old = c->man->units[unit].padded;
    size_t es = dtype_size(dt);
    /* what this checkpoint holds of [a, b); with last also its padding past b */
    int64_t end = last && old > b ? old : b < old ? b : old;
    if (end > a && ckpt_read_range(c, kind, unit, a, end - a, dt, out) < 0)
        return -1;
    int64_t z = old > a ? old : a; /* past the old padding: zero */
    if (b > z)
        memset((char *)out + (size_t)(z - a) * es, 0, (size_t)(b - z) * es);
    return 0;
}

/* Shards open at once while a rank reads its new slices (ckpt_read_resliced): a few
 * descriptors whatever the old shard count. */
#define RESLICE_OPEN 16

int ckpt_read_resliced(const char *dir, const ckpt_manifest_t *man, int64_t S2, int64_t index2, int params_only,
                       ckpt_state_t *st)
{
    int rc = -1, n_units = man->n_units;
    int64_t S = man->meta.shard_count;
    ckpt_unit_t *u2 = NULL;
    int n2;
    memset(st, 0, sizeof *st);
    ckpt_shard_cache_t *c = ckpt_shard_cache_new(dir, man, RESLICE_OPEN);
    void *pad = malloc((size_t)S * 4); /* a unit's padding: fewer than S elements */
    if (!c || !pad || ckpt_units(&man->cfg, S2, &u2, &n2) < 0) {
        ftk_err_set("out of memory");
        goto out;
    }
    void ***arrays[CKPT_KINDS] = {&st->param, &st->m, &st->v};
    int kinds = params_only ? 1 : CKPT_KINDS;
    dtype_t dt = ckpt_state_dtype(man->meta.precision);
    if (state_alloc(st, u2, n_units, S2, kinds, dt) < 0)
        goto out;
    for (int k = 0; k < kinds; k++) {
        for (int u = 0; u < n_units; u++) {
            int64_t part2 = u2[u].padded / S2, a = index2 * part2; /* this slice, in unit coordinates */
            int64_t old = man->units[u].padded, len = man->units[u].length;
            if (ckpt_read_reslice(c, k, u, a, a + part2, 0, dt, (*arrays[k])[u]) < 0)
                goto out;
            /* the old padding, which the new slices may not cover: zero, as ftk-verify requires */
            if (old > len && ckpt_read_range(c, k, u, len, old - len, dt, pad) < 0)
                goto out;
        }
    }
    rc = 0;
out:
    ckpt_shard_cache_free(c);
    free(pad);
    free(u2);
    if (rc < 0)
        ckpt_state_free(st, n_units);
    return rc;
}

void ckpt_state_free(ckpt_state_t *st, int n_units)
{
    void **a[3] = {st->param, st->m, st->v};
    for (int k = 0; k < 3; k++) {
        for (int u = 0; a[k] && u < n_units; u++)
            free(a[k][u]);
        free(a[k]);
    }
    memset(st, 0, sizeof *st);
}

hid_t ckpt_open_tokenizer(const char *dir, const ckpt_manifest_t *man)
{
    char name[32];
    ckpt_shard_name(name, 0, man->meta.shard_count);
    char *p = ckpt_join(dir, name);
    if (!p)
        return -1;
    hid_t f = h5_open(p, CKPT_SHARD_FORMAT, CKPT_VERSION, NULL, NULL);
    free(p);
    return f;
}
