/* checkpoint.c — the checkpoint directory (checkpoint.h): the shard map, names and hashes of
 * the layout, and the run directory's policy (its lock, stale temporaries, steps, `latest`).
 * Writing is in checkpoint_write.c, reading in checkpoint_read.c. */
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
#include "../libcommon/opts.h"
#include "../libcommon/path.h"
#include "../libcommon/version.h"
#include "h5.h"
#include "json.h"

int ckpt_units(const model_config_t *c, int64_t shard_count, ckpt_unit_t **units, int *n_units)
{
    int n = (int)c->num_hidden_layers + 2;
    ckpt_unit_t *u = calloc((size_t)n, sizeof *u);
    if (!u) {
        ftk_err_set("out of memory");
        return -1;
    }
    size_t nt = weights_n_tensors(c);
    for (size_t i = 0; i < nt; i++) {
        weights_spec_t s;
        weights_tensor_spec(c, i, &s);
        int k;
        if (i == 0)
            k = 0;
        else if (!strncmp(s.name, "model.layers.", 13))
            k = 1 + atoi(s.name + 13);
        else
            k = n - 1;
        ckpt_unit_t *x = &u[k];
        ckpt_tensor_t *t = &x->t[x->n_tensors++];
        memcpy(t->name, s.name, sizeof t->name);
        t->rank = s.rank;
        t->shape[0] = s.shape[0];
        t->shape[1] = s.rank == 2 ? s.shape[1] : 1;
        t->numel = t->shape[0] * t->shape[1];
        t->offset = x->length;
        t->is_norm = s.is_norm;
        x->length += t->numel;
    }
    for (int k = 0; k < n; k++) {
        if (k == 0)
            snprintf(u[k].name, sizeof u[k].name, "embed");
        else if (k == n - 1)
            snprintf(u[k].name, sizeof u[k].name, "head");
        else
            snprintf(u[k].name, sizeof u[k].name, "layer.%d", k - 1);
        u[k].padded = (u[k].length + shard_count - 1) / shard_count * shard_count;
    }
    *units = u;
    *n_units = n;
    return 0;
}

char *ckpt_join(const char *a, const char *b)
{
    size_t l = strlen(a) + strlen(b) + 2;
    char *p = malloc(l);
    if (!p) {
        ftk_err_set("out of memory");
        return NULL;
    }
    snprintf(p, l, "%.*s/%s", path_dir_len(a), a, b);
    return p;
}


int ckpt_units_json(buf_t *b, const ckpt_unit_t *units, int n_units)
{
    int rc = buf_printf(b, "[\n");
    for (int u = 0; u < n_units; u++) {
        const ckpt_unit_t *x = &units[u];
        rc |= buf_printf(b, "    {\"name\": \"%s\", \"length\": %lld, \"padded\": %lld, \"tensors\": [", x->name,
                      (long long)x->length, (long long)x->padded);
        for (int i = 0; i < x->n_tensors; i++) {
            const ckpt_tensor_t *t = &x->t[i];
            if (t->rank == 2)
                rc |= buf_printf(b, "%s\n      {\"name\": \"%s\", \"shape\": [%lld, %lld], \"offset\": %lld}", i ? "," : "",
                              t->name, (long long)t->shape[0], (long long)t->shape[1], (long long)t->offset);
            else
                rc |= buf_printf(b, "%s\n      {\"name\": \"%s\", \"shape\": [%lld], \"offset\": %lld}", i ? "," : "",
                              t->name, (long long)t->shape[0], (long long)t->offset);
        }
        rc |= buf_printf(b, "]}%s\n", u + 1 < n_units ? "," : "");
    }
    rc |= buf_printf(b, "  ]");
    return rc;
}

void ckpt_shard_name(char out[32], int64_t index, int64_t count)
{
    /* counts are at most 99999 (parse_manifest), so this fits */
    snprintf(out, 32, "shard-%05d-of-%05d.h5", (int)((index + 1) % 100000), (int)(count % 100000));
}

const char *const ckpt_kind_names[CKPT_KINDS] = {"param", "adam_m", "adam_v"};

dtype_t ckpt_state_dtype(const char *precision)
{
    if (!strcmp(precision, "fp32") || !strcmp(precision, "bf16-mixed"))
        return DT_F32;
    return !strcmp(precision, "bf16-true") ? DT_BF16 : DT_INVALID;
}

int ckpt_units_policy_parse(const char *text, int *kind, int64_t *arg)
{
    const char *need = "need block, group:M (M in 1..1048576) or size:BYTES (e.g. size:512MiB)";
    char *end;
    if (!*text || !strcmp(text, "block")) {
        *kind = CKPT_UNITS_BLOCK;
        *arg = 1;
        return 0;
    }
    if (!strncmp(text, "group:", 6)) {
        const char *d = text + 6;
        errno = 0;
        long long m = *d >= '0' && *d <= '9' ? strtoll(d, &end, 10) : 0;
        if (errno || *d < '0' || *d > '9' || *end || m < 1 || m > (1 << 20)) {
            ftk_err_set("%s", need);
            return -1;
        }
        *kind = CKPT_UNITS_GROUP;
        *arg = m;
        return 0;
    }
    uint64_t b = 0;
    const char *d = text + 5;
    errno = 0;
    if (!strncmp(text, "size:", 5) && *d >= '0' && *d <= '9' && strspn(d, "0123456789") == strlen(d))
        b = strtoull(d, &end, 10); /* exact: a manifest's digits read back as written */
    else if (!strncmp(text, "size:", 5) && *d >= '0' && *d <= '9' && opts_parse_size(d, &b) < 0)
        b = 0;
    if (!errno && b >= 1 && b <= ((uint64_t)1 << 62)) {
        *kind = CKPT_UNITS_SIZE;
        *arg = (int64_t)b;
        return 0;
    }
    ftk_err_set("%s", need);
    return -1;
}

void ckpt_units_policy_name(int kind, int64_t arg, char out[32])
{
    if (kind == CKPT_UNITS_GROUP)
        snprintf(out, 32, "group:%lld", (long long)arg);
    else if (kind == CKPT_UNITS_SIZE)
        snprintf(out, 32, "size:%lld", (long long)arg);
    else
        snprintf(out, 32, "block");
}

const char *ckpt_warmup_style(const ckpt_train_t *t) { return t->warmup_style[0] ? t->warmup_style : "ftk"; }
const char *ckpt_loss_mean(const ckpt_train_t *t) { return t->loss_mean[0] ? t->loss_mean : "global"; }
const char *ckpt_recipe(const ckpt_train_t *t) { return t->recipe[0] ? t->recipe : "ftk"; }

int ckpt_units_hash(const ckpt_unit_t *units, int n_units, char hex[17])
{
    buf_t ub = {0};
    if (ckpt_units_json(&ub, units, n_units) < 0) {
        buf_free(&ub);
        ftk_err_set("out of memory");
        return -1;
    }
    hash_hex(hash_bytes(ub.data, ub.len), hex);
    buf_free(&ub);
    return 0;
}

int ckpt_init_hash(hid_t weights, const model_config_t *c, char out[17])
{
    size_t nt = weights_n_tensors(c);
    uint64_t *sums = malloc((nt ? nt : 1) * sizeof *sums);
    if (!sums) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (size_t i = 0; i < nt; i++) {
        weights_spec_t s;
        weights_tensor_spec(c, i, &s);
        char path[WEIGHTS_NAME_MAX + 16];
        snprintf(path, sizeof path, "tensors/%s", s.name);
        hid_t d = H5Dopen2(weights, path, H5P_DEFAULT);
        int rc = d < 0 ? -1 : h5_attr_get_u64(d, "xxh3_64", &sums[i]);
        if (d >= 0)
            H5Dclose(d);
        if (rc < 0) {
            ftk_err_set("%s: no xxh3_64 checksum", path);
            free(sums);
            return -1;
        }
    }
    hash_hex(hash_bytes(sums, nt * sizeof *sums), out);
    free(sums);
    return 0;
}

/* ---- the run directory: lock, stale temporaries, steps, latest ------------------------------- */

/* Bound on the `latest` file a reader reads whole. */
#define LATEST_MAX 4096

static int is_file(const char *dir, const char *name)
{
    char *p = ckpt_join(dir, name);
    struct stat sb;
    int r = p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return r;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int64_t ckpt_step_name(const char *path)
{
    const char *b = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (strncmp(b, "step-", 5) || strlen(b) != 13 || strspn(b + 5, "0123456789") != 8)
        return -1;
    return strtoll(b + 5, NULL, 10);
}

/* step-* directories of run_dir, sorted (the 8-digit names sort by step). */
char **ckpt_list_steps(const char *run_dir, size_t *n)
{
    *n = 0;
    DIR *d = opendir(run_dir);
    if (!d)
        return NULL;
    char **v = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (ckpt_step_name(e->d_name) < 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(v, cap * sizeof *p);
            if (!p)
                break;
            v = p;
        }
        if (!(v[*n] = strdup(e->d_name)))
            break;
        (*n)++;
    }
    closedir(d);
    if (v)
        qsort(v, *n, sizeof *v, cmp_str);
    return v;
}

/* Whether process pid runs on this host (a zombie, killed but not yet reaped, does not). */
static int pid_alive(long pid)
{
    if (pid <= 0 || (kill((pid_t)pid, 0) < 0 && errno != EPERM))
        return 0;
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(st, 1, sizeof st - 1, f);
    fclose(f);
    st[n] = 0;
    const char *p = strrchr(st, ')'); /* "PID (COMM) STATE …": COMM may hold anything */
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

int ckpt_remove_stale(const char *run_dir)
{
    DIR *d = opendir(run_dir);
    int n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *tmp = strstr(e->d_name, ".tmp.");
        if (strncmp(e->d_name, ".step-", 6) || !tmp)
            continue;
        /* Every writer holds the lock the caller holds, so the temporary's writer is gone;
         * but a process of that id alive here (a writer that took no lock: an older ftk)
         * keeps it. At worst an unrelated process that reuses the id keeps a leftover. */
        char *end;
        long pid = strtol(tmp + 5, &end, 10);
        if (*end == 0 && pid != (long)getpid() && pid_alive(pid))
            continue;
        char *p = ckpt_join(run_dir, e->d_name);
        if (p && rm_tree(p) == 0)
            n++;
        free(p);
    }
    closedir(d);
    return n;
}

char **ckpt_list(const char *run_dir, size_t *n)
{
    size_t m;
    char **v = ckpt_list_steps(run_dir, &m);
    char **out = calloc(m ? m : 1, sizeof *out);
    *n = 0;
    for (size_t i = m; i-- > 0;) { /* newest first, committed ones only (a manifest) */
        char *p = out ? ckpt_join(run_dir, v[i]) : NULL;
        if (p && is_file(p, "manifest.json"))
            out[(*n)++] = p;
        else
            free(p);
        free(v[i]);
    }
    free(v);
    return out;
}

char *ckpt_resolve(const char *path)
{
    struct stat sb;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    int latest_file = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && strcmp(base, "latest") == 0;
    if (!latest_file && (stat(path, &sb) < 0 || !S_ISDIR(sb.st_mode))) {
        if (stat(path, &sb) < 0) {
            ftk_err_set("%s: %s", path, strerror(errno));
            return NULL;
        }
        /* a weights file given where a checkpoint goes is the usual mix-up: say which it is */
        char *fmt = NULL;
        hid_t f = S_ISREG(sb.st_mode) ? h5_open(path, NULL, 0, &fmt, NULL) : -1;
        ftk_err_set("%s: %s%s%s, not a checkpoint (a step-NNNNNNNN directory, a run directory or its latest file)",
                    path, f >= 0 ? "an ftk " : buf_file_kind(sb.st_mode), f >= 0 ? fmt : "", f >= 0 ? " file" : "");
        if (f >= 0)
            h5_close(f);
        free(fmt);
        return NULL;
    }
    if (!latest_file && is_file(path, "manifest.json"))
        return strdup(path);
    /* RUN/latest itself, or RUN: the checkpoint `latest` names */
    char *run = strdup(path);
    if (!run) {
        ftk_err_set("out of memory");
        return NULL;
    }
    if (latest_file) {
        if (base == path)
            strcpy(run, ".");
        else
            run[base - path - 1 ? base - path - 1 : 1] = 0;
    }
    char *lp = ckpt_join(run, "latest");
    buf_t b = {0};
    /* a control file ftk writes itself as a small regular file: never a link, FIFO or device */
    if (!lp || buf_read_small(&b, lp, LATEST_MAX, BUF_NOFOLLOW) < 0) {
        if (lp && errno == ENOENT)
            ftk_err_set("%s: neither a checkpoint (no manifest.json) nor a run directory with a checkpoint (no "
                        "latest)",
                        path);
        else if (!lp)
            ftk_err_set("out of memory");
        free(lp);
        free(run);
        buf_free(&b);
        return NULL;
    }
    free(lp);
    while (b.len && (b.data[b.len - 1] == '\n' || b.data[b.len - 1] == '\r'))
        b.len--;
    char name[32];
    if (b.len != 13 || strncmp(b.data, "step-", 5) || strspn(b.data + 5, "0123456789") < 8) {
        ftk_err_set("%s/latest: does not name a step-NNNNNNNN directory", run);
        free(run);
        buf_free(&b);
        return NULL;
    }
    memcpy(name, b.data, 13);
    name[13] = 0;
    buf_free(&b);
    char *out = ckpt_join(run, name);
    free(run);
    return out;
}
