/* pack.c — records to packed token files as a stream (pack.h). */
#include "pack.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/output.h"
#include "../libcommon/progress.h"
#include "../libcommon/rng.h"
#include "../libcommon/version.h"
#include "h5.h"
#include "json.h"
#include "records.h"
#include "tokens.h"

/* One record's sample. Buffers are kept from chunk to chunk (cap tokens each). */
typedef struct {
    int32_t *ids; /* the record rendered by its template, tokenized, cut to max_len */
    uint8_t *mask;
    int64_t n_prompt, len, full_len, cap; /* n_prompt: tokens before the first target */
    int status; /* 0 ok, 1 bad record (err says why), 2 out of memory */
    char err[600];
} sample_t;

/* Per-thread scratch for encode_record(). */
typedef struct {
    chat_enc_t *enc;
    chat_out_t out;
} scratch_t;

/* val_count N > 0: the N kept samples of smallest key so far, a max-heap on (key, record). */
typedef struct {
    uint64_t key;
    int64_t record, len;
    int32_t *ids;
    uint8_t *mask;
} held_t;

struct pack {
    pack_opts_t o;
    chat_template_t tmpl;
    char **names;  /* o.shards outputs */
    char *dir;     /* where the temporary rows go */
    records_t *in;
    sample_t *smp[2]; /* PACK_CHUNK_RECORDS each: the chunk being tokenized, the one before */
    scratch_t *scr;
    int n_scr;
    tokens_spill_t *sp_train, *sp_val;
    tokens_packer_t *train, *val;
    uint64_t threshold; /* val_fraction · 2^64 */
    held_t *held;
    size_t n_held;
    uint64_t src_hash;
    pack_stats_t st;
    char err[700]; /* a chunk's routing failure, set on the routing thread */
};

/* THE per-record step: one record (a parsed JSON value, the idx-th of the input, 0-based)
 * → token ids + loss mask through the template (chat.h), cut to max_len, in s.
 * Returns 0, -1 for a bad record (ftk_err_msg() names line, column and record), -2 when
 * out of memory. */
static int encode_record(const pack_t *p, scratch_t *sc, const json_doc_t *doc, const json_value_t *rec,
                         int64_t idx, sample_t *s)
{
    if (chat_check(doc, rec, (size_t)idx, p->tmpl) < 0)
        return -1;
    if (chat_encode(sc->enc, p->o.tok, p->tmpl, p->o.mask_prompt, doc, rec, (size_t)idx, &sc->out) < 0)
        return -2; /* checked: out of memory */
    const chat_out_t *o = &sc->out;
    s->n_prompt = 0;
    while (s->n_prompt < (int64_t)o->ids.n && !o->mask[s->n_prompt])
        s->n_prompt++;
    s->full_len = (int64_t)o->ids.n;
    s->len = s->full_len < p->o.max_len ? s->full_len : p->o.max_len;
    memcpy(s->ids, o->ids.v, (size_t)s->len * sizeof *s->ids);
    memcpy(s->mask, o->mask, (size_t)s->len);
    return 0;
}

/* Parses and encodes the n records of a chunk; called by every thread of a parallel
 * region, which share the records out (an orphaned `omp for`). Results land in smp[i] for
 * record i, so what follows sees them in input order whatever the thread count. */
static void tokenize_chunk(const pack_t *p, const record_span_t *sp, int64_t n, sample_t *smp)
{
    const int64_t max_len = p->o.max_len;
#pragma omp for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; i++) {
        scratch_t *sc = &p->scr[omp_get_thread_num()];
        sample_t *s = &smp[i];
        s->status = 0;
        if (s->cap < max_len) {
            free(s->ids);
            free(s->mask);
            s->ids = malloc((size_t)max_len * sizeof *s->ids);
            s->mask = malloc((size_t)max_len);
            s->cap = s->ids && s->mask ? max_len : 0;
            if (!s->cap) {
                s->status = 2;
                continue;
            }
        }
        json_opts_t o = {.max_depth = 64, .line0 = sp[i].line, .col0 = sp[i].col};
        json_value_t *root;
        json_doc_t *doc = json_parse(sp[i].text, sp[i].len, &o, &root);
        int e = doc ? encode_record(p, sc, doc, root, sp[i].index, s) : -1;
        if (e < 0) {
            s->status = e == -1 ? 1 : 2;
            snprintf(s->err, sizeof s->err, "%s", e == -1 ? ftk_err_msg() : "out of memory while tokenizing");
        }
        json_free(doc);
    }
}

/* ---- the validation split (pack.h) ---------------------------------------------------------- */

static uint64_t val_key(int64_t seed, int64_t idx)
{
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)idx;
    return rng_splitmix64(&x);
}

static int held_less(const held_t *a, const held_t *b)
{
    return a->key != b->key ? a->key < b->key : a->record < b->record;
}

static void heap_down(held_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && held_less(&h[m], &h[l]))
            m = l;
        if (r < n && held_less(&h[m], &h[r]))
            m = r;
        if (m == i)
            return;
        held_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_up(held_t *h, size_t i)
{
    while (i && held_less(&h[(i - 1) / 2], &h[i])) {
        held_t t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static int by_record(const void *a, const void *b)
{
    const held_t *x = a, *y = b;
    return x->record < y->record ? -1 : x->record > y->record;
}

/* val_count > 0: the sample joins the held set when its key is among the val_count
 * smallest so far; the one it pushes out, or the sample itself, goes to training. */
static int hold_sample(pack_t *p, uint64_t key, int64_t record, const sample_t *s)
{
    held_t h = {key, record, s->len, NULL, NULL};
    held_t *held = p->held;
    if (p->n_held == (size_t)p->o.val_count && !held_less(&h, &held[0])) {
        tokens_sample_t ts = {s->ids, s->mask, s->len, record};
        return tokens_packer_add(p->train, &ts);
    }
    int e = 0;
    if (p->n_held == (size_t)p->o.val_count) { /* the largest key leaves for training */
        tokens_sample_t out = {held[0].ids, held[0].mask, held[0].len, held[0].record};
        e = tokens_packer_add(p->train, &out);
        free(held[0].ids);
        free(held[0].mask);
        held[0] = held[--p->n_held];
        heap_down(held, p->n_held, 0);
    }
    h.ids = malloc((size_t)s->len * sizeof *h.ids);
    h.mask = malloc((size_t)s->len);
    if (!h.ids || !h.mask) {
        free(h.ids);
        free(h.mask);
        ftk_err_set("out of memory");
        return -1;
    }
    memcpy(h.ids, s->ids, (size_t)s->len * sizeof *h.ids);
    memcpy(h.mask, s->mask, (size_t)s->len);
    held[p->n_held++] = h;
    heap_up(held, p->n_held - 1);
    return e;
}

/* A kept sample to its split's packer, or to the held set. */
static int route_sample(pack_t *p, const record_span_t *sp, const sample_t *s)
{
    tokens_sample_t ts = {s->ids, s->mask, s->len, sp->index};
    uint64_t key = val_key(p->o.seed, sp->index);
    if (p->o.val_count < 0) {
        p->st.n_val += key < p->threshold;
        return tokens_packer_add(key < p->threshold ? p->val : p->train, &ts);
    }
    if (p->o.val_count == 0)
        return tokens_packer_add(p->train, &ts);
    return hold_sample(p, key, sp->index, s);
}

/* Takes a tokenized chunk in input order: counts, cut or drop, validation or training.
 * Returns 0, or PACK_BAD_RECORD or -1 with p->err set. */
static int route_chunk(pack_t *p, const record_span_t *sp, int64_t n, sample_t *smp)
{
    pack_stats_t *st = &p->st;
    for (int64_t i = 0; i < n; i++) {
        sample_t *s = &smp[i];
        if (s->status) {
            snprintf(p->err, sizeof p->err, "%s%s%s", s->status == 1 ? p->o.input_name : "",
                     s->status == 1 ? ": " : "", s->err);
            return s->status == 1 ? PACK_BAD_RECORD : -1;
        }
        st->n_records++;
        if (s->full_len > p->o.max_len) {
            if (p->o.drop_long) {
                st->n_dropped++;
                continue;
            }
            st->n_truncated++;
        }
        if (p->o.mask_prompt && s->n_prompt >= s->len)
            st->no_target++;
        st->n_samples++;
        st->n_tokens += s->len;
        if (s->len > st->max_len_seen)
            st->max_len_seen = s->len;
        if (route_sample(p, &sp[i], s) < 0) {
            snprintf(p->err, sizeof p->err, "%s", ftk_err_msg());
            return -1;
        }
    }
    return 0;
}

/* ---- opening ------------------------------------------------------------------------------- */

static char *shard_name(const char *out, int k, int n)
{
    size_t len = strlen(out);
    size_t base = len > 3 && strcmp(out + len - 3, ".h5") == 0 ? len - 3 : len;
    char *s = malloc(base + 32);
    if (s)
        snprintf(s, base + 32, "%.*s-%05d-of-%05d.h5", (int)base, out, k + 1, n);
    return s;
}

/* Every output named and checked before the work: one that may not be written is
 * refused now. */
static int name_outputs(pack_t *p)
{
    const pack_opts_t *o = &p->o;
    p->names = calloc((size_t)o->shards, sizeof *p->names);
    for (int k = 0; p->names && k < o->shards; k++)
        if (!(p->names[k] = o->shards == 1 ? strdup(o->output) : shard_name(o->output, k, o->shards))) {
            ftk_err_set("out of memory");
            return -1;
        }
    if (!p->names) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int k = 0; k < o->shards; k++)
        if (output_check(p->names[k], o->force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0)
            return PACK_REFUSED;
    return 0;
}

/* The buffers, the temporary rows (next to the output: the same file system, and /tmp
 * may be small) and the packers. */
static int make_buffers(pack_t *p)
{
    const pack_opts_t *o = &p->o;
    p->dir = strdup(o->output);
    char *slash = p->dir ? strrchr(p->dir, '/') : NULL;
    if (p->dir && slash)
        *slash = slash == p->dir ? (slash[1] = 0, '/') : 0;
    const char *d = !p->dir ? "." : slash ? p->dir : ".";
    p->smp[0] = calloc(PACK_CHUNK_RECORDS, sizeof *p->smp[0]);
    p->smp[1] = calloc(PACK_CHUNK_RECORDS, sizeof *p->smp[1]);
    p->scr = calloc((size_t)p->n_scr, sizeof *p->scr);
    p->held = o->val_count > 0 ? calloc((size_t)o->val_count, sizeof *p->held) : NULL;
    if (!p->dir || !p->smp[0] || !p->smp[1] || !p->scr || (o->val_count > 0 && !p->held)) {
        ftk_err_set("out of memory");
        return -1;
    }
    for (int i = 0; i < p->n_scr; i++)
        if (!(p->scr[i].enc = chat_enc_new())) {
            ftk_err_set("out of memory");
            return -1;
        }
    int32_t eos = tok_eos_id(o->tok);
    if (!(p->sp_train = tokens_spill_new(d)) || !(p->sp_val = tokens_spill_new(d)) ||
        !(p->train = tokens_packer_new(o->pack, o->max_len, eos, p->sp_train)) ||
        !(p->val = tokens_packer_new(o->pack, o->max_len, eos, p->sp_val)))
        return -1;
    return 0;
}

int pack_open(const pack_opts_t *o, pack_t **out)
{
    *out = NULL;
    pack_t *p = calloc(1, sizeof *p);
    if (!p) {
        ftk_err_set("out of memory");
        return -1;
    }
    p->o = *o;
    p->tmpl = o->tmpl;
    p->n_scr = omp_get_max_threads();
    p->threshold = (uint64_t)ldexp(o->val_fraction, 64);
    int e = name_outputs(p);
    if (!e && !(p->in = records_open(o->input, o->max_record_bytes)))
        e = PACK_REFUSED;
    if (!e)
        e = make_buffers(p);
    if (e) {
        pack_free(p);
        return e;
    }
    *out = p;
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------- */

/* The first record's shape chooses the template (a record that does not parse chooses
 * nothing: the tokenizing reports it). */
static void detect_template(pack_t *p, const record_span_t *first)
{
    json_opts_t o = {.max_depth = 64, .line0 = first->line, .col0 = first->col};
    json_value_t *root;
    json_doc_t *doc = json_parse(first->text, first->len, &o, &root);
    if (doc)
        p->tmpl = chat_template_detect(root);
    json_free(doc);
}

/* A pipeline over chunks: while the threads tokenize chunk k, one of them first routes
 * chunk k-1 (in input order) and reads chunk k+1, then joins the others. */
int pack_read(pack_t *p)
{
    struct stat st_in;
    int64_t in_size = strcmp(p->o.input, "-") != 0 && stat(p->o.input, &st_in) == 0 ? (int64_t)st_in.st_size : 0;
    progress_t prog;
    progress_start(&prog, "reading", in_size, "bytes");
    const record_span_t *sp[2] = {NULL, NULL};
    int64_t n[2] = {0, 0}, got = records_next(p->in, PACK_CHUNK_RECORDS, PACK_CHUNK_BYTES, &sp[0]);
    int cur = 0, have_prev = 0, read_failed = got < 0, route_failed = 0;
    char read_err[700] = "";
    if (read_failed)
        snprintf(read_err, sizeof read_err, "%s", ftk_err_msg());
    n[0] = got > 0 ? got : 0;
    if (p->o.detect_template && n[0] > 0)
        detect_template(p, &sp[0][0]);
    while (n[cur] > 0 || have_prev) {
        int64_t next = 0;
#pragma omp parallel
        {
#pragma omp single nowait
            {
                if (have_prev)
                    route_failed = route_chunk(p, sp[1 - cur], n[1 - cur], p->smp[1 - cur]);
                if (!route_failed && !read_failed && n[cur] > 0) {
                    next = records_next(p->in, PACK_CHUNK_RECORDS, PACK_CHUNK_BYTES, &sp[1 - cur]);
                    if (next < 0) {
                        read_failed = 1;
                        snprintf(read_err, sizeof read_err, "%s", ftk_err_msg());
                        next = 0;
                    }
                }
                progress_update(&prog, (int64_t)records_bytes(p->in));
            }
            /* every thread meets the loop, whatever the routing thread found (a worksharing
             * construct that some threads skip would hang the others) */
            tokenize_chunk(p, sp[cur], n[cur], p->smp[cur]);
        }
        fault_point("pack.chunk");
        if (route_failed) {
            progress_done(&prog);
            ftk_err_set("%s", p->err);
            return route_failed;
        }
        have_prev = n[cur] > 0;
        cur = 1 - cur;
        n[cur] = next;
    }
    progress_done(&prog);
    if (read_failed) { /* after every record before the fault, so errors come in input order */
        ftk_err_set("%s", read_err);
        return PACK_BAD_STREAM;
    }
    p->src_hash = records_hash(p->in);
    if (p->o.val_count >= 0)
        p->st.n_val = (int64_t)p->n_held;
    return 0;
}

const pack_stats_t *pack_stats(const pack_t *p) { return &p->st; }

/* ---- writing ------------------------------------------------------------------------------- */

static int write_meta(hid_t f, const pack_t *p, int k)
{
    const pack_opts_t *o = &p->o;
    const pack_stats_t *m = &p->st;
    char th[17], sh[17];
    hash_hex(o->tok_hash, th);
    hash_hex(p->src_hash, sh);
    return h5_attr_set_str(f, "ftk_version", FTK_VERSION) || h5_attr_set_str(f, "tokenizer_format", tok_format(o->tok)) ||
                   h5_attr_set_str(f, "tokenizer_xxh3", th) ||
                   h5_attr_set_i64(f, "vocab_size", tok_vocab_size(o->tok)) ||
                   h5_attr_set_i64(f, "bos_id", tok_bos_id(o->tok)) || h5_attr_set_i64(f, "eos_id", tok_eos_id(o->tok)) ||
                   h5_attr_set_i64(f, "pad_id", tok_eos_id(o->tok)) ||
                   h5_attr_set_str(f, "template", chat_template_name(p->tmpl)) ||
                   h5_attr_set_i64(f, "mask_prompt", o->mask_prompt) || h5_attr_set_i64(f, "max_len", o->max_len) ||
                   h5_attr_set_i64(f, "packed", o->pack) || h5_attr_set_i64(f, "seed", o->seed) ||
                   h5_attr_set_str(f, "source_name", o->input) || h5_attr_set_str(f, "source_xxh3", sh) ||
                   h5_attr_set_i64(f, "n_records", m->n_records) || h5_attr_set_i64(f, "n_samples", m->n_samples) ||
                   h5_attr_set_i64(f, "n_tokens", m->n_tokens) || h5_attr_set_i64(f, "n_truncated", m->n_truncated) ||
                   h5_attr_set_i64(f, "n_dropped", m->n_dropped) || h5_attr_set_i64(f, "shard_index", k + 1) ||
                   h5_attr_set_i64(f, "shard_count", o->shards)
               ? -1
               : 0;
}

/* Shard k under its temporary name: the attributes and its ranges of both splits'
 * rows; the dataset checksums to sums. */
static int write_shard(const pack_t *p, int k, output_t *af, uint64_t sums[2 * TOKENS_N_DATASETS])
{
    const int shards = p->o.shards;
    h5w_opts_t wo = {.zstd_level = p->o.zstd};
    if (output_begin(af, p->names[k], p->o.force ? OUTPUT_FORCE | OUTPUT_FILE_ONLY : OUTPUT_FILE_ONLY) < 0)
        return -1;
    hid_t f = h5_create(output_tmp_path(af), TOKENS_FORMAT, TOKENS_VERSION);
    if (f < 0)
        return -1;
    int64_t tr_n = tokens_spill_rows(p->sp_train), va_n = tokens_spill_rows(p->sp_val);
    int64_t tr0 = tr_n * k / shards, tr1 = tr_n * (k + 1) / shards;
    int64_t va0 = va_n * k / shards, va1 = va_n * (k + 1) / shards;
    int e = write_meta(f, p, k);
    if (!e)
        e = tokens_spill_write(p->sp_train, f, "train", tr0, tr1, &wo, sums);
    if (!e) /* the shard's file half written: a fault test's "during the write" */
        e = fault_point("pack.write");
    if (!e)
        e = tokens_spill_write(p->sp_val, f, "val", va0, va1, &wo, sums + TOKENS_N_DATASETS);
    if (h5_close(f) < 0 || e) {
        ftk_err_prefix("%s: ", p->names[k]);
        return -1;
    }
    return 0;
}

/* The set hash into a finished shard's temporary file. */
static int finish_shard(const char *tmp_path, const char *name, const char *set_hash)
{
    hid_t f = H5Fopen(tmp_path, H5F_ACC_RDWR, H5P_DEFAULT);
    char why[256];
    int e = 0;
    if (f < 0) {
        ftk_err_set("cannot reopen it: %s", h5_err_reason(why, sizeof why));
        e = -1;
    } else if (h5_attr_set_str(f, "set_xxh3", set_hash) < 0) {
        H5Fclose(f); /* the attribute's message is the one to keep */
        e = -1;
    } else {
        e = h5_close(f);
    }
    if (e < 0)
        ftk_err_prefix("%s: cannot finish the file: ", name);
    return e < 0 ? -1 : 0;
}

/* Writes every shard under a temporary name, then the set hash, then commits them all;
 * on any failure no output appears. */
static int write_shards(const pack_t *p)
{
    const int shards = p->o.shards;
    output_t *af = calloc((size_t)shards, sizeof *af);
    uint64_t(*sums)[2 * TOKENS_N_DATASETS] = calloc((size_t)shards, sizeof *sums);
    int rc = -1;
    if (!af || !sums) {
        ftk_err_set("out of memory");
        goto out;
    }
    progress_t prog;
    progress_start(&prog, "writing", shards, "files");
    for (int k = 0; k < shards; k++) {
        if (write_shard(p, k, &af[k], sums[k]) < 0)
            goto out;
        progress_update(&prog, k + 1);
    }
    progress_done(&prog);
    char sh[17];
    hash_hex(tokens_set_hash((const uint64_t(*)[2 * TOKENS_N_DATASETS])sums, shards), sh);
    for (int k = 0; k < shards; k++)
        if (finish_shard(output_tmp_path(&af[k]), p->names[k], sh) < 0)
            goto out;
    for (int k = 0; k < shards; k++) {
        if (output_commit(&af[k]) < 0)
            goto out;
        /* shards already renamed stay: each is complete and checks on its own */
    }
    rc = 0;
out:
    for (int k = 0; af && k < shards; k++)
        if (af[k].a.tmp_path) /* begun, not committed */
            output_abort(&af[k]);
    free(af);
    free(sums);
    return rc;
}

int pack_write(pack_t *p)
{
    /* Held validation samples, in input order. */
    if (p->n_held)
        qsort(p->held, p->n_held, sizeof *p->held, by_record);
    for (size_t k = 0; k < p->n_held; k++) {
        tokens_sample_t ts = {p->held[k].ids, p->held[k].mask, p->held[k].len, p->held[k].record};
        if (tokens_packer_add(p->val, &ts) < 0)
            return -1;
    }
    if (tokens_packer_finish(p->train) < 0 || tokens_packer_finish(p->val) < 0)
        return -1;
    if (write_shards(p) < 0)
        return -1;
    p->st.train_rows = tokens_spill_rows(p->sp_train);
    p->st.val_rows = tokens_spill_rows(p->sp_val);
    p->st.row_tokens = tokens_spill_tokens(p->sp_train) + tokens_spill_tokens(p->sp_val);
    return 0;
}

const char *pack_output_name(const pack_t *p, int k) { return p->names[k]; }

void pack_free(pack_t *p)
{
    if (!p)
        return;
    if (p->names)
        for (int k = 0; k < p->o.shards; k++)
            free(p->names[k]);
    free(p->names);
    free(p->dir);
    tokens_packer_free(p->train);
    tokens_packer_free(p->val);
    tokens_spill_free(p->sp_train);
    tokens_spill_free(p->sp_val);
    for (size_t k = 0; p->held && k < p->n_held; k++) {
        free(p->held[k].ids);
        free(p->held[k].mask);
    }
    free(p->held);
    for (int b = 0; b < 2; b++) {
        for (int i = 0; p->smp[b] && i < PACK_CHUNK_RECORDS; i++) {
            free(p->smp[b][i].ids);
            free(p->smp[b][i].mask);
        }
        free(p->smp[b]);
    }
    for (int i = 0; p->scr && i < p->n_scr; i++) {
        chat_enc_free(p->scr[i].enc);
        chat_out_free(&p->scr[i].out);
    }
    free(p->scr);
    records_close(p->in);
    free(p);
}
