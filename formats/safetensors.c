#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../libcommon/log.h"
#include "json.h"

static const struct {
    const char *name;
    size_t size;
    dtype_t dt;
} st_dtypes[] = {
    {"BOOL", 1, DT_INVALID}, {"U8", 1, DT_INVALID},   {"I8", 1, DT_INVALID},  {"F8_E5M2", 1, DT_INVALID},
    {"F8_E4M3", 1, DT_INVALID}, {"I16", 2, DT_INVALID}, {"U16", 2, DT_INVALID}, {"F16", 2, DT_F16},
    {"BF16", 2, DT_BF16},    {"I32", 4, DT_INVALID},  {"U32", 4, DT_INVALID}, {"F32", 4, DT_F32},
    {"F64", 8, DT_INVALID},  {"I64", 8, DT_INVALID},  {"U64", 8, DT_INVALID},
};

static const char *st_dtype_of(dtype_t t)
{
    return t == DT_F32 ? "F32" : t == DT_F16 ? "F16" : t == DT_BF16 ? "BF16" : NULL;
}

void st_header_free(st_header_t *h)
{
    for (size_t i = 0; h->tensors && i < h->n; i++)
        free(h->tensors[i].name);
    free(h->tensors);
    memset(h, 0, sizeof *h);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    /* Zero-sized tensors may share an offset with the next one: empty first. */
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A JSON name for messages: at most 200 bytes, so a hostile name cannot flood stderr. */
#define NAME_FMT "\"%.200s\""

static int parse_tensor(const json_member_t *m, uint64_t data_len, st_tensor_t *t)
{
    const json_value_t *v = &m->value;
    if (v->type != JSON_OBJECT) {
        ftk_err_set("tensor " NAME_FMT ": entry is a JSON %s, an object expected", m->key, json_type_name(v->type));
        return -1;
    }
    const json_value_t *dtype = NULL, *shape = NULL, *offs = NULL;
    for (size_t i = 0; i < v->u.obj.n; i++) {
        const json_member_t *f = &v->u.obj.members[i];
        if (strcmp(f->key, "dtype") == 0 && f->key_len == 5)
            dtype = &f->value;
        else if (strcmp(f->key, "shape") == 0 && f->key_len == 5)
            shape = &f->value;
        else if (strcmp(f->key, "data_offsets") == 0 && f->key_len == 12)
            offs = &f->value;
        else {
            ftk_err_set("tensor " NAME_FMT ": unknown key " NAME_FMT, m->key, f->key);
            return -1;
        }
    }
    if (!dtype || !shape || !offs) {
        ftk_err_set("tensor " NAME_FMT ": missing \"%s\"", m->key, !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
        return -1;
    }
    if (dtype->type != JSON_STRING) {
        ftk_err_set("tensor " NAME_FMT ": dtype is not a string", m->key);
        return -1;
    }
    size_t k = 0, nd = sizeof st_dtypes / sizeof st_dtypes[0];
    while (k < nd && !(strcmp(st_dtypes[k].name, dtype->u.str.s) == 0 && strlen(st_dtypes[k].name) == dtype->u.str.len))
        k++;
    if (k == nd) {
        ftk_err_set("tensor " NAME_FMT ": unknown dtype " NAME_FMT, m->key, dtype->u.str.s);
        return -1;
    }
    snprintf(t->dtype, sizeof t->dtype, "%s", st_dtypes[k].name);
    t->dt = st_dtypes[k].dt;
    t->elem_size = st_dtypes[k].size;
    if (shape->type != JSON_ARRAY || shape->u.arr.n > ST_MAX_RANK) {
        ftk_err_set("tensor " NAME_FMT ": shape must be an array of at most %d integers", m->key, ST_MAX_RANK);
        return -1;
    }
    t->rank = (int)shape->u.arr.n;
    uint64_t count = 1;
    int overflow = 0;
    for (int i = 0; i < t->rank; i++) {
        int64_t d;
        if (json_get_i64(&shape->u.arr.items[i], &d) < 0 || d < 0 || d >= (INT64_C(1) << 53)) {
            ftk_err_set("tensor " NAME_FMT ": shape[%d] is not an integer in [0, 2^53)", m->key, i);
            return -1;
        }
        t->shape[i] = d;
        if (d != 0 && count > UINT64_MAX / (uint64_t)d)
            overflow = 1;
        else
            count *= (uint64_t)d;
    }
    for (int i = 0; i < t->rank; i++)
        if (t->shape[i] == 0)
            overflow = 0, count = 0; /* a zero dimension makes any product empty */
    if (overflow || count > UINT64_MAX / t->elem_size) {
        ftk_err_set("tensor " NAME_FMT ": shape's size overflows 64 bits", m->key);
        return -1;
    }
    t->n_elems = count;
    int64_t b, e;
    if (offs->type != JSON_ARRAY || offs->u.arr.n != 2 || json_get_i64(&offs->u.arr.items[0], &b) < 0 ||
        json_get_i64(&offs->u.arr.items[1], &e) < 0 || b < 0 || e < 0) {
        ftk_err_set("tensor " NAME_FMT ": data_offsets must be two non-negative integers", m->key);
        return -1;
    }
    if (b > e) {
        ftk_err_set("tensor " NAME_FMT ": data_offsets [%lld, %lld] end before they begin", m->key, (long long)b,
                    (long long)e);
        return -1;
    }
    if ((uint64_t)e > data_len) {
        ftk_err_set("tensor " NAME_FMT ": data_offsets [%lld, %lld] lie outside the data section (%llu bytes)", m->key,
                    (long long)b, (long long)e, (unsigned long long)data_len);
        return -1;
    }
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    if (count * t->elem_size != t->end - t->begin) {
        char dims[ST_MAX_RANK * 22 + 2] = "";
        size_t k2 = 0;
        for (int i = 0; i < t->rank; i++)
            k2 += (size_t)snprintf(dims + k2, sizeof dims - k2, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        ftk_err_set("tensor " NAME_FMT ": %s shape [%s] needs %llu bytes, data_offsets give %llu", m->key, t->dtype,
                    dims, (unsigned long long)(count * t->elem_size), (unsigned long long)(t->end - t->begin));
        return -1;
    }
    return 0;
}

int st_parse_buffer(const uint8_t *buf, size_t size, st_header_t *out)
{
    memset(out, 0, sizeof *out);
    if (size < 8) {
        ftk_err_set("file of %zu bytes is too short for a safetensors header length", size);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | buf[i];
    if (n > ST_MAX_HEADER) {
        ftk_err_set("header length %llu exceeds the limit of %u bytes", (unsigned long long)n, ST_MAX_HEADER);
        return -1;
    }
    if (n > size - 8) {
        ftk_err_set("header length %llu runs past the end of the file (%zu bytes)", (unsigned long long)n, size);
        return -1;
    }
    if (n < 2 || buf[8] != '{') {
        ftk_err_set("header does not start with a JSON object");
        return -1;
    }
    const char *text = (const char *)buf + 8;
    size_t len = (size_t)n;
    while (len > 0 && text[len - 1] == ' ') /* the padding the format allows */
        len--;
    json_opts_t jo = {.max_depth = 3};
    json_value_t *root = NULL;
    json_doc_t *doc = json_parse(text, len, &jo, &root);
    if (!doc) {
        ftk_err_prefix("header: ");
        return -1;
    }
    int rc = -1;
    if (root->type != JSON_OBJECT) {
        ftk_err_set("header is not a JSON object");
        goto out;
    }
    out->header_len = n;
    out->data_len = size - 8 - n;
    out->tensors = calloc(root->u.obj.n ? root->u.obj.n : 1, sizeof *out->tensors);
    if (!out->tensors) {
        ftk_err_set("out of memory");
        goto out;
    }
    for (size_t i = 0; i < root->u.obj.n; i++) {
        const json_member_t *m = &root->u.obj.members[i];
        if (m->key_len != strlen(m->key)) {
            ftk_err_set("a tensor name holds a NUL byte");
            goto out;
        }
        if (strcmp(m->key, "__metadata__") == 0) {
            if (m->value.type != JSON_OBJECT) {
                ftk_err_set("__metadata__ is not an object");
                goto out;
            }
            for (size_t j = 0; j < m->value.u.obj.n; j++)
                if (m->value.u.obj.members[j].value.type != JSON_STRING) {
                    ftk_err_set("__metadata__ value " NAME_FMT " is not a string", m->value.u.obj.members[j].key);
                    goto out;
                }
            continue;
        }
        if (m->key_len == 0) {
            ftk_err_set("a tensor has an empty name");
            goto out;
        }
        st_tensor_t *t = &out->tensors[out->n];
        if (parse_tensor(m, out->data_len, t) < 0)
            goto out;
        if (!(t->name = strdup(m->key))) {
            ftk_err_set("out of memory");
            goto out;
        }
        out->n++;
    }
    qsort(out->tensors, out->n, sizeof *out->tensors, cmp_begin);
    uint64_t pos = 0;
    for (size_t i = 0; i < out->n; i++) {
        const st_tensor_t *t = &out->tensors[i];
        if (t->begin < pos) {
            ftk_err_set("tensor " NAME_FMT ": data_offsets [%llu, %llu] overlap tensor " NAME_FMT, t->name,
                        (unsigned long long)t->begin, (unsigned long long)t->end, out->tensors[i - 1].name);
            goto out;
        }
        if (t->begin > pos) {
            ftk_err_set("tensor " NAME_FMT ": %llu bytes before it (from offset %llu) belong to no tensor", t->name,
                        (unsigned long long)(t->begin - pos), (unsigned long long)pos);
            goto out;
        }
        pos = t->end;
    }
    if (pos != out->data_len) {
        ftk_err_set("%llu bytes after the last tensor (from offset %llu) belong to no tensor",
                    (unsigned long long)(out->data_len - pos), (unsigned long long)pos);
        goto out;
    }
    rc = 0;
out:
    json_free(doc);
    if (rc < 0)
        st_header_free(out);
    return rc;
}

int st_open(st_file_t *f, const char *path)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        ftk_err_set("%s: not a regular file", path);
        close(fd);
        return -1;
    }
    f->size = (size_t)st.st_size;
    void *map = NULL;
    if (f->size > 0) {
        map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            ftk_err_set("%s: mmap: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
    }
    close(fd);
    f->map = map;
    if (!(f->path = strdup(path)) || st_parse_buffer(f->map ? f->map : (const uint8_t *)"", f->size, &f->h) < 0) {
        if (!f->path)
            ftk_err_set("out of memory");
        ftk_err_prefix("%s: ", path);
        st_close(f);
        return -1;
    }
    if (map)
        madvise(map, f->size, MADV_SEQUENTIAL);
    return 0;
}

void st_close(st_file_t *f)
{
    if (f->map)
        munmap((void *)f->map, f->size);
    st_header_free(&f->h);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor_t *st_find(const st_file_t *f, const char *name)
{
    for (size_t i = 0; i < f->h.n; i++)
        if (strcmp(f->h.tensors[i].name, name) == 0)
            return &f->h.tensors[i];
    return NULL;
}

static int buf_str(buf_t *b, const char *s) { return buf_append(b, s, strlen(s)); }

int st_build_header(buf_t *out, const st_entry_t *e, size_t n, uint64_t *data_len)
{
    buf_t j = {0};
    char tmp[64];
    uint64_t pos = 0;
    int rc = buf_str(&j, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *dt = st_dtype_of(e[i].dt);
        if (!dt || e[i].rank < 0 || e[i].rank > ST_MAX_RANK) {
            ftk_err_set("tensor \"%s\": cannot be written to safetensors", e[i].name);
            rc = -1;
            break;
        }
        uint64_t bytes = dtype_size(e[i].dt);
        for (int d = 0; d < e[i].rank; d++)
            bytes *= (uint64_t)e[i].shape[d];
        rc |= buf_putc(&j, ',') | json_write_string(&j, e[i].name, strlen(e[i].name));
        snprintf(tmp, sizeof tmp, ":{\"dtype\":\"%s\",\"shape\":[", dt);
        rc |= buf_str(&j, tmp);
        for (int d = 0; d < e[i].rank; d++) {
            snprintf(tmp, sizeof tmp, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
            rc |= buf_str(&j, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)pos,
                 (unsigned long long)(pos + bytes));
        rc |= buf_str(&j, tmp);
        pos += bytes;
    }
    rc |= buf_putc(&j, '}');
    while (rc == 0 && (8 + j.len) % 8 != 0)
        rc |= buf_putc(&j, ' ');
    if (rc == 0) {
        uint8_t len8[8];
        for (int i = 0; i < 8; i++)
            len8[i] = (uint8_t)((uint64_t)j.len >> (8 * i));
        rc = buf_append(out, len8, 8) | buf_append(out, j.data, j.len);
    }
    buf_free(&j);
    if (rc == 0 && data_len)
        *data_len = pos;
    return rc ? -1 : 0;
}
