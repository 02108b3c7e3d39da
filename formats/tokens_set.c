/* tokens_set.c — token data sets read a few rows at a time (tokens_set.h). */
#include "tokens_set.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"

const char *const tokens_split_names[2] = {"train", "val"};

/* The datasets a row read touches (tokens_dataset_names' order); row_offsets and
 * row_samples are held. */
static const int row_ds[] = {0, 1, 4, 5, 6};
#define N_ROW_DS 5

typedef struct {
    char *path;
    hid_t file;                       /* -1 while closed */
    hid_t ds[2][TOKENS_N_DATASETS];   /* open with the file: row_ds of each split */
    uint64_t used;
    int64_t rows[2], tokens[2], samples[2];
    int64_t *off[2], *rs[2]; /* the row index: row_offsets, row_samples (rows + 1 each) */
} shard_file_t;

struct tokens_set {
    int n;
    shard_file_t *sh;
    int64_t *first[2]; /* [n + 1]: global index of each shard's first row */
    tokens_set_info_t info;
    uint64_t clock;
    int n_open;
};

/* ---- naming ---------------------------------------------------------------------------------- */

/* s is exactly "IIIII-of-NNNNN.h5" (ftk-pack's %05d): 1 with *i, *n set. */
static int parse_suffix(const char *s, int *i, int *n)
{
    if (strlen(s) != 17 || strncmp(s + 5, "-of-", 4) || strcmp(s + 14, ".h5"))
        return 0;
    int a = 0, b = 0;
    for (int k = 0; k < 5; k++) {
        if (s[k] < '0' || s[k] > '9' || s[9 + k] < '0' || s[9 + k] > '9')
            return 0;
        a = a * 10 + (s[k] - '0');
        b = b * 10 + (s[9 + k] - '0');
    }
    *i = a;
    *n = b;
    return 1;
}

static char *shard_name(const char *base, int i, int n)
{
    size_t len = strlen(base) + 32; /* room for two ints of any size */
    char *s = malloc(len);
    if (s)
        snprintf(s, len, "%s-%05d-of-%05d.h5", base, i, n);
    else
        ftk_err_set("out of memory");
    return s;
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

typedef struct {
    int count;      /* the set's N; 0: every N (collect) */
    int counts[2];  /* collect: the first two counts met */
    char *example[2];
    char *extra;    /* a file BASE-k-of-N with k outside 1..N */
} scan_t;

/* Every BASE-IIIII-of-NNNNN.h5 in base's directory. */
static int scan_dir(const char *base, scan_t *sc)
{
    const char *slash = strrchr(base, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - base) + 1 : 1, slash ? base : ".");
    const char *prefix = slash ? slash + 1 : base;
    size_t pl = strlen(prefix);
    DIR *d = opendir(dir);
    if (!d) {
        ftk_err_set("%s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        int i, n;
        if (strncmp(e->d_name, prefix, pl) || e->d_name[pl] != '-' || !parse_suffix(e->d_name + pl + 1, &i, &n))
            continue;
        if (sc->count == 0) {
            for (int k = 0; k < 2; k++) {
                if (sc->counts[k] == n)
                    break;
                if (sc->counts[k] == 0) {
                    sc->counts[k] = n;
                    sc->example[k] = shard_name(base, i, n);
                    break;
                }
            }
        } else if (n == sc->count && (i < 1 || i > n) && !sc->extra) {
            sc->extra = shard_name(base, i, n);
        }
    }
    closedir(d);
    return 0;
}

void tokens_set_free_names(char **names, int n)
{
    for (int k = 0; names && k < n; k++)
        free(names[k]);
    free(names);
}

/* index and count attributes of a tokens file */
static int read_place(const char *path, int64_t *idx, int64_t *cnt)
{
    hid_t f = h5_open(path, TOKENS_FORMAT, TOKENS_VERSION, NULL, NULL);
    if (f < 0)
        return -1;
    int rc = h5_attr_get_i64(f, "shard_index", idx) < 0 || h5_attr_get_i64(f, "shard_count", cnt) < 0 ? -1 : 0;
    h5_close(f);
    if (rc < 0)
        ftk_err_prefix("%s: ", path);
    else if (*cnt < 1 || *cnt > 99999 || *idx < 1 || *idx > *cnt) {
        ftk_err_set("%s: shard_index %lld, shard_count %lld: not a place in a set", path, (long long)*idx,
                    (long long)*cnt);
        rc = -1;
    }
    return rc;
}

int tokens_set_files(const char *path, char ***names, int *n)
{
    *names = NULL;
    *n = 0;
    char base[4096];
    int count = 0;
    if (is_file(path)) {
        int64_t idx, cnt;
        if (read_place(path, &idx, &cnt) < 0)
            return -1;
        if (cnt == 1) {
            if (!(*names = malloc(sizeof **names)) || !((*names)[0] = strdup(path))) {
                free(*names);
                *names = NULL;
                ftk_err_set("out of memory");
                return -1;
            }
            *n = 1;
            return 0;
        }
        size_t len = strlen(path);
        int i, c;
        if (len < 19 || path[len - 18] != '-' || !parse_suffix(path + len - 17, &i, &c)) {
            ftk_err_set("%s is shard %lld of a set of %lld, but its name is not BASE-%05lld-of-%05lld.h5: the other "
                        "shards cannot be found (keep ftk-pack's names)",
                        path, (long long)idx, (long long)cnt, (long long)idx, (long long)cnt);
            return -1;
        }
        if (i != idx || c != cnt) {
            ftk_err_set("%s: its name says shard %d of %d, the file says shard %lld of %lld (renamed?)", path, i, c,
                        (long long)idx, (long long)cnt);
            return -1;
        }
        snprintf(base, sizeof base, "%.*s", (int)(len - 18), path);
        count = c;
    } else {
        size_t len = strlen(path);
        snprintf(base, sizeof base, "%.*s", (int)(len > 3 && !strcmp(path + len - 3, ".h5") ? len - 3 : len), path);
        scan_t sc = {0};
        int rc = 0;
        if (scan_dir(base, &sc) < 0 || !sc.counts[0]) {
            ftk_err_set("%s: no such file, nor a set of shards %s-00001-of-NNNNN.h5", path, base);
            rc = -2;
        } else if (sc.counts[1]) {
            ftk_err_set("%s names several sets (%s, %s, …): give one of the files of the set meant", path,
                        sc.example[0], sc.example[1]);
            rc = -1;
        }
        count = sc.counts[0];
        free(sc.example[0]);
        free(sc.example[1]);
        if (rc < 0)
            return rc;
    }
    scan_t sc = {.count = count};
    if (scan_dir(base, &sc) < 0)
        return -1;
    if (sc.extra) {
        ftk_err_set("%s: extra shard: a set of %d has no shard of that index (a leftover of another pack?)", sc.extra,
                    count);
        free(sc.extra);
        return -1;
    }
    char **v = calloc((size_t)count, sizeof *v);
    if (!v) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int k = 0; k < count; k++) {
        int64_t idx, cnt;
        if (!(v[k] = shard_name(base, k + 1, count)))
            goto fail;
        if (!is_file(v[k])) {
            ftk_err_set("%s: shard %d of %d is missing", v[k], k + 1, count);
            goto fail;
        }
        if (read_place(v[k], &idx, &cnt) < 0)
            goto fail;
        if (idx != k + 1 || cnt != count) {
            ftk_err_set("%s: its name says shard %d of %d, the file says shard %lld of %lld (renamed?)", v[k], k + 1,
                        count, (long long)idx, (long long)cnt);
            goto fail;
        }
    }
    *names = v;
    *n = count;
    return 0;
fail:
    tokens_set_free_names(v, count);
    return -1;
}

/* ---- opening --------------------------------------------------------------------------------- */

/* The attributes every shard must share with the first, in the order they are compared:
 * the ones that say which tokenizer and which rows first, so the message names the cause. */
static const char *const same_str[] = {"tokenizer_xxh3", "template"};
static const char *const same_int[] = {"vocab_size", "bos_id", "eos_id", "pad_id", "mask_prompt", "max_len", "packed"};
static const int int_required[] = {1, 0, 0, 1, 0, 1, 1}; /* the reader's own needs */
#define N_STR 2
#define N_INT 7

typedef struct {
    char *str[N_STR], *set;
    int64_t v[N_INT];
} attrs_t;

static void attrs_free(attrs_t *a)
{
    for (int i = 0; i < N_STR; i++)
        free(a->str[i]);
    free(a->set);
    memset(a, 0, sizeof *a);
}

/* The ones the reader needs are required (vocab_size, pad_id, max_len, packed, set_xxh3);
 * the others, when absent, must be absent in every shard ("(none)", -1). */
static int read_attrs(hid_t f, attrs_t *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 0; i < N_STR; i++)
        if (h5_attr_exists(f, same_str[i]) ? h5_attr_get_str(f, same_str[i], &a->str[i]) < 0
                                           : !(a->str[i] = strdup("(none)")))
            return -1;
    for (int i = 0; i < N_INT; i++) {
        a->v[i] = -1;
        if ((int_required[i] || h5_attr_exists(f, same_int[i])) && h5_attr_get_i64(f, same_int[i], &a->v[i]) < 0)
            return -1;
    }
    return h5_attr_get_str(f, "set_xxh3", &a->set);
}

/* The split's sizes, dataset shapes and checksums, and its row index, checked. */
static int load_split(hid_t f, shard_file_t *h, int sp, const tokens_set_info_t *in,
                      uint64_t sums[TOKENS_N_DATASETS])
{
    const char *group = tokens_split_names[sp];
    if (H5Lexists(f, group, H5P_DEFAULT) <= 0) {
        ftk_err_set("group /%s is missing", group);
        return -1;
    }
    hid_t g = H5Gopen2(f, group, H5P_DEFAULT);
    int64_t R, S, T;
    int rc = -1;
    if (g < 0 || h5_attr_get_i64(g, "n_rows", &R) < 0 || h5_attr_get_i64(g, "n_samples", &S) < 0 ||
        h5_attr_get_i64(g, "n_tokens", &T) < 0)
        goto out;
    if (R < 0 || S < 0 || T < 0 || T > ((int64_t)1 << 40) || R > T + 1 || S > T + 1) {
        ftk_err_set("implausible sizes n_rows=%lld n_samples=%lld n_tokens=%lld", (long long)R, (long long)S,
                    (long long)T);
        goto out;
    }
    const int64_t want[TOKENS_N_DATASETS] = {T, T, R + 1, R + 1, S, S, S};
    for (int j = 0; j < TOKENS_N_DATASETS; j++) {
        hsize_t dims[8];
        const char *name = tokens_dataset_names[j];
        if (h5r_shape(g, name, dims) != 1 || (int64_t)dims[0] != want[j]) {
            ftk_err_set("%s: shape is not [%lld]", name, (long long)want[j]);
            goto out;
        }
        if (h5r_check_type(g, name, tokens_dataset_type(j)) < 0)
            goto out;
        hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
        int e = d < 0 || h5_attr_get_u64(d, "xxh3_64", &sums[j]) < 0;
        if (d >= 0)
            H5Dclose(d);
        if (e) {
            ftk_err_set("dataset %s: no xxh3_64 checksum attribute", name);
            goto out;
        }
    }
    h->rows[sp] = R;
    h->tokens[sp] = T;
    h->samples[sp] = S;
    h->off[sp] = malloc((size_t)(R + 1) * sizeof(int64_t));
    h->rs[sp] = malloc((size_t)(R + 1) * sizeof(int64_t));
    if (!h->off[sp] || !h->rs[sp]) {
        ftk_err_set("out of memory");
        goto out;
    }
    if (h5r_read(g, "row_offsets", H5T_NATIVE_INT64, h->off[sp], (size_t)R + 1) < 0 ||
        h5r_read(g, "row_samples", H5T_NATIVE_INT64, h->rs[sp], (size_t)R + 1) < 0)
        goto out;
    if (h->off[sp][0] != 0 || h->off[sp][R] != T) {
        ftk_err_set("row_offsets must start at 0 and end at %lld (the number of tokens)", (long long)T);
        goto out;
    }
    if (h->rs[sp][0] != 0 || h->rs[sp][R] != S) {
        ftk_err_set("row_samples must start at 0 and end at %lld (the number of samples)", (long long)S);
        goto out;
    }
    tokens_rows_t v = {.row_offsets = h->off[sp], .row_samples = h->rs[sp], .first_row = 0, .n_rows = R};
    if (tokens_check_rows(&v, in->vocab_size, in->max_len, (int)in->packed, (int32_t)in->pad_id))
        goto out;
    rc = 0;
out:
    if (g >= 0)
        H5Gclose(g);
    if (rc < 0)
        ftk_err_prefix("/%s/", group);
    return rc;
}

static void shard_close(shard_file_t *h)
{
    for (int sp = 0; sp < 2; sp++)
        for (int j = 0; j < N_ROW_DS; j++)
            if (h->ds[sp][row_ds[j]] >= 0) {
                H5Dclose(h->ds[sp][row_ds[j]]);
                h->ds[sp][row_ds[j]] = -1;
            }
    if (h->file >= 0)
        h5_close(h->file);
    h->file = -1;
}

void tokens_set_close(tokens_set_t *s)
{
    if (!s)
        return;
    for (int k = 0; k < s->n; k++) {
        shard_file_t *h = &s->sh[k];
        shard_close(h);
        free(h->path);
        for (int sp = 0; sp < 2; sp++) {
            free(h->off[sp]);
            free(h->rs[sp]);
        }
    }
    free(s->sh);
    free(s->first[0]);
    free(s->first[1]);
    free(s);
}

tokens_set_t *tokens_set_open(const char *path)
{
    char **names;
    int n;
    if (tokens_set_files(path, &names, &n))
        return NULL;
    tokens_set_t *s = calloc(1, sizeof *s);
    uint64_t(*sums)[2 * TOKENS_N_DATASETS] = calloc((size_t)n, sizeof *sums);
    attrs_t a0 = {0}, a = {0};
    if (s)
        s->sh = calloc((size_t)n, sizeof *s->sh);
    if (s && s->sh)
        for (int sp = 0; sp < 2; sp++)
            s->first[sp] = calloc((size_t)n + 1, sizeof(int64_t));
    if (!s || !s->sh || !s->first[0] || !s->first[1] || !sums) {
        ftk_err_set("out of memory");
        tokens_set_free_names(names, n);
        goto fail;
    }
    s->n = n;
    for (int k = 0; k < n; k++) {
        s->sh[k].path = names[k];
        s->sh[k].file = -1;
        for (int sp = 0; sp < 2; sp++)
            for (int j = 0; j < TOKENS_N_DATASETS; j++)
                s->sh[k].ds[sp][j] = -1;
    }
    free(names);
    tokens_set_info_t *in = &s->info;
    in->n_shards = n;
    for (int k = 0; k < n; k++) {
        shard_file_t *h = &s->sh[k];
        hid_t f = h5_open(h->path, TOKENS_FORMAT, TOKENS_VERSION, NULL, NULL);
        if (f < 0)
            goto fail;
        attrs_t *at = k ? &a : &a0;
        int bad = read_attrs(f, at) < 0;
        if (bad)
            ftk_err_prefix("%s: ", h->path);
        for (int i = 0; i < N_STR && k && !bad; i++)
            if (strcmp(a.str[i], a0.str[i])) {
                ftk_err_set("%s: %s \"%s\", but %s has \"%s\": a shard of another pack", h->path, same_str[i],
                            a.str[i], s->sh[0].path, a0.str[i]);
                bad = 1;
            }
        for (int i = 0; i < N_INT && k && !bad; i++)
            if (a.v[i] != a0.v[i]) {
                ftk_err_set("%s: %s %lld, but %s has %lld: a shard of another pack", h->path, same_int[i],
                            (long long)a.v[i], s->sh[0].path, (long long)a0.v[i]);
                bad = 1;
            }
        if (k && !bad && strcmp(a.set, a0.set)) {
            ftk_err_set("%s: set_xxh3 %s, but %s has %s: a shard of another set", h->path, a.set, s->sh[0].path,
                        a0.set);
            bad = 1;
        }
        if (!k && !bad) {
            in->vocab_size = a0.v[0];
            in->pad_id = a0.v[3];
            in->max_len = a0.v[5];
            in->packed = a0.v[6];
            in->mask_prompt = a0.v[4];
            snprintf(in->set_xxh3, sizeof in->set_xxh3, "%s", a0.set);
            snprintf(in->tokenizer_xxh3, sizeof in->tokenizer_xxh3, "%s", a0.str[0]);
            if (in->vocab_size < 1 || in->vocab_size > INT32_MAX || in->max_len < 1 || in->pad_id < 0 ||
                in->pad_id >= in->vocab_size) {
                ftk_err_set("%s: attributes vocab_size %lld, max_len %lld, pad_id %lld are not those of a tokens file",
                            h->path, (long long)in->vocab_size, (long long)in->max_len, (long long)in->pad_id);
                bad = 1;
            }
        }
        attrs_free(&a);
        for (int sp = 0; sp < 2 && !bad; sp++)
            if (load_split(f, h, sp, in, sums[k] + sp * TOKENS_N_DATASETS) < 0) {
                ftk_err_prefix("%s: ", h->path);
                bad = 1;
            }
        h5_close(f);
        if (bad)
            goto fail;
        for (int sp = 0; sp < 2; sp++) {
            s->first[sp][k + 1] = s->first[sp][k] + h->rows[sp];
            in->rows[sp] += h->rows[sp];
            in->tokens[sp] += h->tokens[sp];
            in->samples[sp] += h->samples[sp];
        }
    }
    /* Every shard names the same set; the set is the one its datasets make. */
    char hex[17];
    hash_hex(tokens_set_hash((const uint64_t(*)[2 * TOKENS_N_DATASETS])sums, n), hex);
    if (strcmp(hex, in->set_xxh3)) {
        if (n == 1)
            ftk_err_set("%s: set_xxh3 %s, but its datasets' checksums make %s: the file was changed after packing",
                        s->sh[0].path, in->set_xxh3, hex);
        else
            ftk_err_set("%s … %s: set_xxh3 %s, but their datasets' checksums make %s: a shard was changed or replaced "
                        "after packing (ftk-verify names it if its checksums fail)",
                        s->sh[0].path, s->sh[n - 1].path, in->set_xxh3, hex);
        goto fail;
    }
    attrs_free(&a0);
    free(sums);
    return s;
fail:
    attrs_free(&a0);
    attrs_free(&a);
    free(sums);
    tokens_set_close(s);
    return NULL;
}

const tokens_set_info_t *tokens_set_info(const tokens_set_t *s) { return &s->info; }
const char *tokens_set_shard_path(const tokens_set_t *s, int k) { return s->sh[k].path; }
int64_t tokens_set_shard_rows(const tokens_set_t *s, int k, int split) { return s->sh[k].rows[split]; }

int64_t tokens_set_max_segments(const tokens_set_t *s, int split, int64_t k)
{
    /* a row's segments: its samples, and in a packed row the padding after them (counted
     * whether or not the row has any: the samples' lengths are not held) */
    int64_t pad = s->info.packed == 1, most = 1;
    for (int f = 0; f < s->n; f++)
        for (int64_t r = 0; r < s->sh[f].rows[split]; r++)
            if (s->sh[f].rs[split][r + 1] - s->sh[f].rs[split][r] + pad > most)
                most = s->sh[f].rs[split][r + 1] - s->sh[f].rs[split][r] + pad;
    /* the k rows with the most: counted per segment count, taken from the top */
    int64_t *n = calloc((size_t)most + 1, sizeof *n), total = 0;
    if (!n)
        return k * most; /* a bound all the same */
    for (int f = 0; f < s->n; f++)
        for (int64_t r = 0; r < s->sh[f].rows[split]; r++)
            n[s->sh[f].rs[split][r + 1] - s->sh[f].rs[split][r] + pad]++;
    for (int64_t c = most; c > 0 && k > 0; c--) {
        int64_t take = n[c] < k ? n[c] : k;
        total += take * c;
        k -= take;
    }
    free(n);
    return total > 0 ? total : 1;
}

/* ---- reading --------------------------------------------------------------------------------- */

/* Shard k's file, opened if needed (closing the least recently used one past the limit). */
static hid_t shard_file(tokens_set_t *s, int k)
{
    shard_file_t *h = &s->sh[k];
    if (h->file < 0) {
        if (s->n_open >= TOKENS_SET_OPEN_MAX) {
            int lru = -1;
            for (int i = 0; i < s->n; i++)
                if (s->sh[i].file >= 0 && (lru < 0 || s->sh[i].used < s->sh[lru].used))
                    lru = i;
            shard_close(&s->sh[lru]);
            s->n_open--;
        }
        hid_t f = h5_open(h->path, TOKENS_FORMAT, TOKENS_VERSION, NULL, NULL);
        if (f < 0)
            return -1;
        char *set = NULL;
        if (h5_attr_get_str(f, "set_xxh3", &set) < 0 || strcmp(set, s->info.set_xxh3)) {
            ftk_err_set("%s: not the file opened before (set_xxh3 %s, %s expected): replaced during the run?",
                        h->path, set ? set : "missing", s->info.set_xxh3);
            free(set);
            h5_close(f);
            return -1;
        }
        free(set);
        h->file = f;
        s->n_open++;
        /* Row reads are random: a chunk cache would not be hit for tokens and masks
         * (compressed sets), but is for the smaller sample arrays (1 MiB each, HDF5's
         * default): at most 6 MiB per open file. */
        hid_t nocache = H5Pcreate(H5P_DATASET_ACCESS);
        H5Pset_chunk_cache(nocache, 0, 0, 1.0);
        for (int sp = 0; sp < 2; sp++)
            for (int j = 0; j < N_ROW_DS; j++) {
                char name[64];
                snprintf(name, sizeof name, "%s/%s", tokens_split_names[sp], tokens_dataset_names[row_ds[j]]);
                if ((h->ds[sp][row_ds[j]] = H5Dopen2(f, name, j < 2 ? nocache : H5P_DEFAULT)) < 0) {
                    ftk_err_set("%s: cannot open dataset /%s", h->path, name);
                    H5Pclose(nocache);
                    shard_close(h);
                    s->n_open--;
                    return -1;
                }
            }
        H5Pclose(nocache);
    }
    h->used = ++s->clock;
    return h->file;
}

/* The shard holding global row g of split sp. */
static int shard_of(const tokens_set_t *s, int sp, int64_t g)
{
    int lo = 0, hi = s->n - 1; /* first[lo] <= g < first[hi + 1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->first[sp][mid] <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Elements [at, at + n) of an open 1-D dataset. */
static int read_range(hid_t d, hid_t memtype, int64_t at, int64_t n, void *out)
{
    if (n == 0)
        return 0;
    hid_t fs = H5Dget_space(d);
    hsize_t dim = 0, start = (hsize_t)at, count = (hsize_t)n;
    hid_t ms = H5Screate_simple(1, &count, NULL);
    herr_t e = fs < 0 || H5Sget_simple_extent_dims(fs, &dim, NULL) != 1 || start + count > dim ? -1 : 0;
    if (e >= 0)
        e = H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL);
    if (e >= 0)
        e = H5Dread(d, memtype, ms, fs, H5P_DEFAULT, out);
    H5Sclose(ms);
    if (fs >= 0)
        H5Sclose(fs);
    if (e < 0) {
        char name[128] = "?";
        H5Iget_name(d, name, sizeof name);
        ftk_err_set("dataset %s: cannot read elements %lld..%lld (corrupt file, or compressed without the zstd "
                    "filter)",
                    name, (long long)at, (long long)(at + n));
        return -1;
    }
    return 0;
}

/* Rows [r0, r0 + n) of shard k into out at rows R0, tokens T0, samples S0, checked, then
 * rebased. Returns 0, 1 (an invariant), -1 (a read). */
static int read_run(tokens_set_t *s, int sp, int k, int64_t r0, int64_t n, tokens_split_t *out, int64_t R0,
                    int64_t T0, int64_t S0)
{
    const shard_file_t *h = &s->sh[k];
    const int64_t *off = h->off[sp] + r0, *rs = h->rs[sp] + r0;
    int64_t t0 = off[0], nt = off[n] - t0, s0 = rs[0], ns = rs[n] - s0;
    hid_t f = shard_file(s, k);
    if (f < 0)
        return -1;
    hid_t *ds = s->sh[k].ds[sp];
    int rc = read_range(ds[0], H5T_NATIVE_INT32, t0, nt, out->tokens + T0) < 0 ||
                     read_range(ds[1], H5T_NATIVE_UINT8, t0, nt, out->loss_mask + T0) < 0 ||
                     read_range(ds[4], H5T_NATIVE_INT64, s0, ns, out->sample_starts + S0) < 0 ||
                     read_range(ds[5], H5T_NATIVE_INT64, s0, ns, out->sample_lengths + S0) < 0 ||
                     read_range(ds[6], H5T_NATIVE_INT64, s0, ns, out->sample_record + S0) < 0
                 ? -1
                 : 0;
    if (rc == 0) {
        tokens_rows_t v = {out->tokens + T0, out->loss_mask + T0, off, rs, out->sample_starts + S0,
                           out->sample_lengths + S0, out->sample_record + S0, r0, n};
        const tokens_set_info_t *in = &s->info;
        rc = tokens_check_rows(&v, in->vocab_size, in->max_len, (int)in->packed, (int32_t)in->pad_id);
    }
    if (rc) {
        ftk_err_prefix("%s: /%s/", h->path, tokens_split_names[sp]);
        return rc;
    }
    /* Checked: every sample start lies in [t0, t0 + nt). */
    for (int64_t i = 0; i < n; i++) {
        out->row_offsets[R0 + i] = T0 + (off[i] - t0);
        out->row_samples[R0 + i] = S0 + (rs[i] - s0);
    }
    for (int64_t j = S0; j < S0 + ns; j++)
        out->sample_starts[j] += T0 - t0;
    return 0;
}

/* A split of R rows, T tokens and S samples whose offsets end where a split's do. */
static int alloc_rows(tokens_split_t *out, int64_t R, int64_t T, int64_t S)
{
    if (tokens_split_alloc(out, T, R, S) < 0)
        return -1;
    out->row_offsets[R] = T;
    out->row_samples[R] = S;
    return 0;
}

int tokens_set_read(tokens_set_t *s, int split, const int64_t *rows, int64_t k, tokens_split_t *out)
{
    memset(out, 0, sizeof *out);
    const int64_t R = s->info.rows[split];
    int64_t T = 0, S = 0;
    for (int64_t i = 0; i < k; i++) {
        if (rows[i] < 0 || rows[i] >= R) {
            ftk_err_set("row %lld of /%s/ asked for, the set has %lld", (long long)rows[i], tokens_split_names[split],
                        (long long)R);
            return -1;
        }
        const shard_file_t *h = &s->sh[shard_of(s, split, rows[i])];
        int64_t r = rows[i] - s->first[split][h - s->sh];
        T += h->off[split][r + 1] - h->off[split][r];
        S += h->rs[split][r + 1] - h->rs[split][r];
    }
    if (alloc_rows(out, k, T, S) < 0)
        return -1;
    int64_t t = 0, sm = 0;
    for (int64_t i = 0; i < k;) {
        int sh = shard_of(s, split, rows[i]);
        int64_t j = i + 1, end = s->first[split][sh + 1];
        while (j < k && rows[j] == rows[j - 1] + 1 && rows[j] < end)
            j++;
        int64_t r0 = rows[i] - s->first[split][sh];
        const shard_file_t *h = &s->sh[sh];
        if (read_run(s, split, sh, r0, j - i, out, i, t, sm)) {
            tokens_split_free(out);
            return -1;
        }
        t += h->off[split][r0 + (j - i)] - h->off[split][r0];
        sm += h->rs[split][r0 + (j - i)] - h->rs[split][r0];
        i = j;
    }
    return 0;
}

int tokens_set_check(tokens_set_t *s, int split, int64_t r0, int64_t r1)
{
    for (int64_t g = r0; g < r1;) {
        int sh = shard_of(s, split, g);
        const shard_file_t *h = &s->sh[sh];
        int64_t r = g - s->first[split][sh], end = s->first[split][sh + 1] - s->first[split][sh];
        if (r1 - s->first[split][sh] < end)
            end = r1 - s->first[split][sh];
        int64_t e = r + 1; /* at least one row; then up to a block of tokens */
        while (e < end && h->off[split][e + 1] - h->off[split][r] <= TOKENS_SET_BLOCK_TOKENS)
            e++;
        tokens_split_t blk;
        if (alloc_rows(&blk, e - r, h->off[split][e] - h->off[split][r], h->rs[split][e] - h->rs[split][r]) < 0)
            return -1;
        int rc = read_run(s, split, sh, r, e - r, &blk, 0, 0, 0);
        tokens_split_free(&blk);
        if (rc)
            return rc;
        g += e - r;
    }
    return 0;
}
